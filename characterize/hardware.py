"""Hardware stage: the per-architecture spec table and live device queries.

Every hardware fact the toolkit uses (occupancy limits, L2 and persisting-L2 sizes,
HBM bandwidth, latencies for the model) lives in the two tables below, never inline
in analysis code. `ARCHS` holds streaming-multiprocessor facts shared by every GPU of
a compute capability; `GPUS` holds one representative product per architecture plus
named products (A100 40 GB, H200, ...). When a GPU is present, `devices()` reads
what the driver reports (SM count, L2 size, memory, clocks) and `DeviceInfo.spec()`
overlays it on the table entry.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from characterize.errors import ConfigError, NoCudaDevice

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


@dataclass(frozen=True)
class ArchSpec:
    """Per-SM limits of one compute capability (CUDA C++ Programming Guide, table
    "Technical Specifications per Compute Capability", and cuda_occupancy.h)."""

    arch: str                   # "sm_80"
    compute_capability: tuple[int, int]
    max_warps_per_sm: int
    max_blocks_per_sm: int
    max_threads_per_block: int
    regs_per_sm: int            # 32-bit registers in the register file
    regs_per_block: int         # most registers one block may hold
    reg_alloc_unit: int         # registers are allocated per warp in units of this
    max_regs_per_thread: int
    min_maxrregcount: int       # ptxas raises smaller -maxrregcount values to this (24, nvcc 13, sm_80..sm_90)
    smem_per_sm: int            # bytes of shared memory (largest carve-out)
    max_smem_per_block: int     # bytes a block may opt in to
    smem_reserved_per_block: int  # bytes the runtime reserves per resident block
    smem_alloc_unit: int
    sub_partitions: int = 4     # SM sub-partitions; registers are split among them
    warp_size: int = 32


ARCHS: dict[str, ArchSpec] = {
    a.arch: a
    for a in (
        ArchSpec("sm_80", (8, 0), 64, 32, 1024, 65536, 65536, 256, 255, 24, 164 * KiB, 163 * KiB, 1 * KiB, 128),
        ArchSpec("sm_86", (8, 6), 48, 16, 1024, 65536, 65536, 256, 255, 24, 100 * KiB, 99 * KiB, 1 * KiB, 128),
        ArchSpec("sm_89", (8, 9), 48, 24, 1024, 65536, 65536, 256, 255, 24, 100 * KiB, 99 * KiB, 1 * KiB, 128),
        ArchSpec("sm_90", (9, 0), 64, 32, 1024, 65536, 65536, 256, 255, 24, 228 * KiB, 227 * KiB, 1 * KiB, 128),
    )
}


_MODEL_SRC = (
    "performance-model defaults (characterize.analysis.model.constants; `characterize calibrate` replaces them per GPU): "
    "L1 data = unified L1/shared per SM (A100 192 KB, H100 256 KB, GA10x/AD10x 128 KB; NVIDIA whitepapers) "
    "minus the 32 KiB shared-memory carve-out that ncu reports (launch__shared_mem_config_size) for kernels "
    "without shared memory on A100 and H800; L1 hit ~33-40 cycles at boost clock (Jia et al. 2018 Volta "
    "microbenchmarks: 28 cycles; Abdelkhalik et al. 2022 Ampere microbenchmarks: ~33); L1 throughput 128 B/clk "
    "per SM (H100 whitepaper: 33 TB/s over 132 SMs at 1.98 GHz); L2 effective capacity 0.6: the L2 is two "
    "partitions that each cache data for the SMs of their own GPCs, so a line read from both sides is held "
    "twice (A100 whitepaper; GTC 2021 'Dissecting the Ampere GPU architecture through microbenchmarking'), and "
    "replacement is set-associative rather than true LRU: between 0.5 and 1, 0.6 assumed; HBM efficiency 0.85: "
    "stream benchmarks reach ~90% of peak, gathers of 128-512 B rows somewhat less; launch overhead 3 us per "
    "back-to-back launch (launch gap plus ramp-up and drain, 2-4 us in CUDA-event timings of small kernels)"
)


@dataclass(frozen=True)
class GpuSpec:
    """One GPU product: its architecture plus chip-level facts and model constants.

    Bandwidths are vendor peak figures; latencies are load-to-use figures from
    published microbenchmarks (see `sources`) and are the model's defaults until a
    calibration on the real GPU replaces them.
    """

    key: str                      # table key, e.g. "a100-80gb"
    name: str                     # marketing name as the driver reports it
    arch: str                     # key into ARCHS
    sm_count: int
    l2_bytes: int
    max_persisting_l2_bytes: int  # cudaDevAttrMaxPersistingL2CacheSize
    memory_bytes: int
    hbm_GBps: float               # peak DRAM bandwidth, GB/s (1e9 bytes)
    l2_GBps: float                # sustained L2 read bandwidth, GB/s
    boost_clock_MHz: int
    base_clock_MHz: int
    l2_latency_ns: float          # L2 hit, load-to-use
    dram_latency_ns: float        # L2 miss served by DRAM, load-to-use
    sources: str = ""
    aliases: tuple[str, ...] = field(default=())
    # model constants (see model_sources); A100 values unless a product overrides them
    l1_data_bytes: int = 160 * KiB      # L1 data cache per SM for a kernel without shared memory
    l1_latency_ns: float = 25.0         # L1 hit, load-to-use
    l1_bytes_per_clk: int = 128         # L1 throughput per SM
    l2_effective_capacity: float = 0.6  # fraction of l2_bytes that behaves like a fully associative LRU
    hbm_efficiency: float = 0.85        # achievable fraction of hbm_GBps for row gathers
    launch_overhead_us: float = 3.0     # per back-to-back kernel launch
    model_sources: str = _MODEL_SRC
    # dense peak arithmetic (TFLOP/s, no sparsity) and host link, for the end-to-end model
    fp32_TFLOPS: float = 19.5           # CUDA cores
    tf32_TFLOPS: float = 156.0          # tensor cores: what fp32 matmuls use with TF32 enabled
    fp16_TFLOPS: float = 312.0          # tensor cores
    pcie_GBps: float = 25.0             # achievable host-to-device copy bandwidth (PCIe 4.0 x16)

    def rows_in_l2(self, row_bytes: int) -> int:
        """Table rows of `row_bytes` that fit the whole L2."""
        return self.l2_bytes // row_bytes

    def rows_in_persisting_l2(self, row_bytes: int) -> int:
        """Table rows that fit the persisting-L2 set-aside: the default hot-row count K."""
        return max(1, self.max_persisting_l2_bytes // row_bytes)

    @property
    def archspec(self) -> ArchSpec:
        return ARCHS[self.arch]


_A100_SRC = (
    "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): 108 SMs, 40 MB L2, "
    "HBM2e 2039 GB/s (80 GB SXM) / 1555 GB/s (40 GB); persisting L2 up to 30 MB per "
    "CUDA C++ Best Practices Guide; latencies: Chips and Cheese / Jia et al. "
    "microbenchmarks (L2 ~200 ns, DRAM ~450-500 ns); dense peaks (A100 datasheet): FP32 19.5, "
    "TF32 156, FP16 312 TFLOP/s; PCIe 4.0 x16 host link"
)
_H100_SRC = (
    "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): SXM5 132 SMs, 50 MB "
    "L2, HBM3 3.35 TB/s; H200 product brief: 141 GB HBM3e 4.8 TB/s; persisting L2 "
    "assumed 75% of L2 as on A100 (the driver reports the real value); latencies: "
    "Chips and Cheese H100 microbenchmarks (L2 ~260 ns far partition, DRAM ~480 ns); dense peaks "
    "(H100 SXM datasheet): FP32 67, TF32 494.7, FP16 989.4 TFLOP/s (half the sparse figures); "
    "PCIe 5.0 x16 host link"
)

GPUS: dict[str, GpuSpec] = {}


def _add(spec: GpuSpec) -> None:
    GPUS[spec.key] = spec


_add(GpuSpec("a100-80gb", "NVIDIA A100-SXM4-80GB", "sm_80", 108, 40 * MiB, 30 * MiB, 80 * GiB,
             2039.0, 5120.0, 1410, 1095, 200.0, 480.0, _A100_SRC, ("a100", "sm_80")))
_add(GpuSpec("a100-40gb", "NVIDIA A100-SXM4-40GB", "sm_80", 108, 40 * MiB, 30 * MiB, 40 * GiB,
             1555.0, 5120.0, 1410, 1095, 200.0, 480.0, _A100_SRC, ("a100-pcie-40gb",)))
_add(GpuSpec("a10", "NVIDIA A10", "sm_86", 72, 6 * MiB, int(4.5 * MiB), 24 * GiB,
             600.0, 2000.0, 1695, 885, 220.0, 520.0,
             "NVIDIA A10 datasheet: 72 SMs, 6 MB L2, GDDR6 600 GB/s; persisting L2 75% of L2 (assumed)",
             ("sm_86",), l1_data_bytes=96 * KiB, l1_latency_ns=22.0,
             fp32_TFLOPS=31.2, tf32_TFLOPS=62.5, fp16_TFLOPS=125.0))
_add(GpuSpec("l4", "NVIDIA L4", "sm_89", 58, 48 * MiB, 36 * MiB, 24 * GiB,
             300.0, 2500.0, 2040, 795, 230.0, 560.0,
             "NVIDIA L4 datasheet: 58 SMs, 48 MB L2, GDDR6 300 GB/s; persisting L2 75% of L2 (assumed)",
             ("sm_89",), l1_data_bytes=96 * KiB, l1_latency_ns=18.0,
             fp32_TFLOPS=30.3, tf32_TFLOPS=60.0, fp16_TFLOPS=121.0))
_add(GpuSpec("h100-sxm", "NVIDIA H100 80GB HBM3", "sm_90", 132, 50 * MiB, int(37.5 * MiB), 80 * GiB,
             3350.0, 7500.0, 1980, 1590, 260.0, 480.0, _H100_SRC, ("h100", "sm_90"),
             l1_data_bytes=224 * KiB, l1_latency_ns=20.0,
             fp32_TFLOPS=67.0, tf32_TFLOPS=494.7, fp16_TFLOPS=989.4, pcie_GBps=50.0))
_add(GpuSpec("h800", "NVIDIA H800", "sm_90", 132, 50 * MiB, int(37.5 * MiB), 80 * GiB,
             3350.0, 7500.0, 1980, 1590, 260.0, 480.0, _H100_SRC, (),
             l1_data_bytes=224 * KiB, l1_latency_ns=20.0,
             fp32_TFLOPS=67.0, tf32_TFLOPS=494.7, fp16_TFLOPS=989.4, pcie_GBps=50.0))
_add(GpuSpec("h200", "NVIDIA H200", "sm_90", 132, 50 * MiB, int(37.5 * MiB), 141 * 10**9,
             4800.0, 7500.0, 1980, 1590, 260.0, 470.0, _H100_SRC, (),
             l1_data_bytes=224 * KiB, l1_latency_ns=20.0,
             fp32_TFLOPS=67.0, tf32_TFLOPS=494.7, fp16_TFLOPS=989.4, pcie_GBps=50.0))

#: the paper's GPU (A100): what CPU emulation sizes its L2 after and the claims are checked on
REFERENCE_ARCH = "sm_80"

#: the representative GPU for each architecture key
DEFAULT_GPU = {"sm_80": "a100-80gb", "sm_86": "a10", "sm_89": "l4", "sm_90": "h100-sxm"}


def normalize_arch(text: str) -> str:
    """'sm_80', '80', '8.0', 'sm80', 'compute_80' -> 'sm_80'; unknown -> ConfigError."""
    t = text.strip().lower()
    m = re.fullmatch(r"(?:sm_?|compute_)?(\d)\.?(\d)", t)
    if not m:
        raise ConfigError(f"unknown architecture {text!r}: use sm_80, sm_86, sm_89 or sm_90")
    arch = f"sm_{m.group(1)}{m.group(2)}"
    if arch not in ARCHS:
        raise ConfigError(f"architecture {arch} is not in the spec table; known: {', '.join(ARCHS)}")
    return arch


def gpu_spec(name: str) -> GpuSpec:
    """Look up a GPU by table key, alias, architecture or driver name."""
    t = name.strip().lower()
    if t in GPUS:
        return GPUS[t]
    for spec in GPUS.values():
        if t in spec.aliases or t == spec.name.lower():
            return spec
    try:
        return GPUS[DEFAULT_GPU[normalize_arch(t)]]
    except ConfigError:
        pass
    # driver names such as "NVIDIA H100 PCIe" or "NVIDIA A100-PCIE-40GB"
    for key, pattern in (("h200", "h200"), ("h800", "h800"), ("h100-sxm", "h100"),
                         ("a100-40gb", r"a100.*40"), ("a100-80gb", "a100"), ("a10", r"\ba10\b"), ("l4", r"\bl4\b")):
        if re.search(pattern, t):
            return GPUS[key]
    known = sorted(set(GPUS) | {a for s in GPUS.values() for a in s.aliases})
    raise ConfigError(f"unknown GPU {name!r}; known: {', '.join(known)}")


def parse_archs(text: str) -> list[str]:
    """'sm_80,sm_90' -> ['sm_80', 'sm_90'] (deduplicated, order kept)."""
    out: list[str] = []
    for part in text.split(","):
        if part.strip():
            a = normalize_arch(part)
            if a not in out:
                out.append(a)
    if not out:
        raise ConfigError("no architecture given")
    return out


# ----------------------------------------------------------------- live devices
@dataclass(frozen=True)
class DeviceInfo:
    """What the driver reports about one visible GPU."""

    index: int
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    l2_bytes: int
    memory_bytes: int
    max_persisting_l2_bytes: int | None
    sm_clock_MHz: int | None
    max_sm_clock_MHz: int | None
    memory_clock_MHz: int | None
    driver: str | None
    cuda_runtime: str | None
    source: str  # which APIs answered: "nvml+torch", "torch", "nvml"

    @property
    def arch(self) -> str:
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"

    def spec(self) -> GpuSpec:
        """The table entry for this GPU with the driver's numbers overlaid."""
        try:
            base = gpu_spec(self.name)
        except ConfigError:
            base = GPUS[DEFAULT_GPU.get(self.arch, "h100-sxm")]
        changes = dict(name=self.name, sm_count=self.sm_count, l2_bytes=self.l2_bytes,
                       memory_bytes=self.memory_bytes)
        if self.arch in ARCHS:
            changes["arch"] = self.arch
        if self.max_persisting_l2_bytes:
            changes["max_persisting_l2_bytes"] = self.max_persisting_l2_bytes
        return dataclasses.replace(base, **changes)


def _nvml_devices() -> tuple[dict[int, dict], str | None]:
    try:
        import pynvml
    except ImportError:
        return {}, None
    try:
        pynvml.nvmlInit()
    except Exception:
        return {}, None
    out: dict[int, dict] = {}
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            info: dict = {"name": name.decode() if isinstance(name, bytes) else name}
            info["memory_bytes"] = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
            for key, clock in (("sm_clock_MHz", pynvml.NVML_CLOCK_SM), ("memory_clock_MHz", pynvml.NVML_CLOCK_MEM)):
                try:
                    info[key] = int(pynvml.nvmlDeviceGetClockInfo(h, clock))
                except Exception:
                    pass
            try:
                info["max_sm_clock_MHz"] = int(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM))
            except Exception:
                pass
            try:
                info["compute_capability"] = tuple(pynvml.nvmlDeviceGetCudaComputeCapability(h))
            except Exception:
                pass
            out[i] = info
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return out, driver


def devices() -> list[DeviceInfo]:
    """Every visible CUDA GPU, from NVML and torch together; [] when there is none."""
    nvml, driver = _nvml_devices()
    torch_props: dict[int, object] = {}
    runtime = None
    try:
        import torch

        if torch.cuda.is_available():
            runtime = torch.version.cuda
            for i in range(torch.cuda.device_count()):
                torch_props[i] = torch.cuda.get_device_properties(i)
    except Exception:
        pass
    out = []
    for i in sorted(set(nvml) | set(torch_props)):
        n = nvml.get(i, {})
        p = torch_props.get(i)
        cc = (p.major, p.minor) if p is not None else n.get("compute_capability", (0, 0))
        out.append(DeviceInfo(
            index=i,
            name=getattr(p, "name", None) or n.get("name", "unknown GPU"),
            compute_capability=tuple(cc),
            sm_count=int(getattr(p, "multi_processor_count", 0) or 0),
            l2_bytes=int(getattr(p, "L2_cache_size", 0) or 0),
            memory_bytes=int(getattr(p, "total_memory", 0) or n.get("memory_bytes", 0)),
            max_persisting_l2_bytes=None,
            sm_clock_MHz=n.get("sm_clock_MHz"),
            max_sm_clock_MHz=n.get("max_sm_clock_MHz"),
            memory_clock_MHz=n.get("memory_clock_MHz"),
            driver=driver,
            cuda_runtime=runtime,
            source="+".join(s for s, ok in (("nvml", bool(n)), ("torch", p is not None)) if ok),
        ))
    return out


def require_gpu() -> DeviceInfo:
    """The first GPU, or NoCudaDevice pointing to what works without one."""
    found = [d for d in devices() if d.sm_count > 0]
    if not found:
        raise NoCudaDevice(
            "no CUDA device is visible (torch.cuda.is_available() is False). Commands that "
            "work without a GPU: `characterize build` (static registers/occupancy), "
            "`characterize workload stats`, `characterize predict`, `characterize check` "
            "(kernel logic on the CPU), `characterize import`, `characterize report`.")
    return found[0]
