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

import ctypes
import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

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
    "back-to-back launch (launch gap plus ramp-up and drain, 2-4 us in CUDA-event timings of small kernels); "
    "pinned-row hit probability 0.9: the CUDA programming guide gives persisting (evict_last) lines priority "
    "within the set-aside only, and set conflicts and the other tables' traffic still evict some; no published "
    "figure, 0.8-1.0 assumed until calibrated"
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
    pinned_hit_probability: float = 0.9  # a row pinned in the persisting set-aside hits (evict_last is a priority, not a lock)
    model_sources: str = _MODEL_SRC
    # dense peak arithmetic (TFLOP/s, no sparsity) and host link, for the end-to-end model
    fp32_TFLOPS: float = 19.5           # CUDA cores
    tf32_TFLOPS: float = 156.0          # tensor cores: what fp32 matmuls use with TF32 enabled
    fp16_TFLOPS: float = 312.0          # tensor cores
    pcie_GBps: float = 25.0             # achievable host-to-device copy bandwidth of the host link, GB/s
    # the CPU-GPU link host-resident tables cross (values and sources: HOST_LINKS[host_link])
    host_link: str = "PCIe 4.0 x16"
    host_latency_us: float = 10.0       # one batched host-to-device copy before bytes flow
    uvm_fault_batch_us: float = 30.0    # the UVM driver servicing one batch of GPU page faults

    def rows_in_l2(self, row_bytes: int) -> int:
        """Table rows of `row_bytes` that fit the whole L2."""
        return self.l2_bytes // row_bytes

    def rows_in_persisting_l2(self, row_bytes: int) -> int:
        """Table rows that fit the persisting-L2 set-aside: the default hot-row count K."""
        return max(1, self.max_persisting_l2_bytes // row_bytes)

    @property
    def archspec(self) -> ArchSpec:
        return ARCHS[self.arch]

    @property
    def host_link_source(self) -> str:
        """Where the host link's bandwidth and latency come from."""
        link = HOST_LINKS.get(self.host_link)
        return link.source if link else "no published figure in the spec table"


@dataclass(frozen=True)
class HostLink:
    """A CPU-GPU link: what a batched copy of host rows and a UVM page migration cross."""

    name: str
    GBps: float               # achievable host-to-device bandwidth (pinned memory, large copies)
    latency_us: float         # one batched copy before bytes flow
    uvm_fault_batch_us: float  # one batch of GPU page faults serviced by the UVM driver
    source: str


_FAULT_SRC = ("UVM fault service: Allen and Ge, 'In-Depth Analyses of Unified Virtual Memory System for GPU "
              "Accelerated Computing', SC 2021: faults are serviced in batches (nvidia-uvm uvm_perf_fault_batch_count "
              "= 256) and one batch costs tens of microseconds on PCIe (30 us assumed)")
#: the host links of the GPUs in the table, by name
HOST_LINKS: dict[str, HostLink] = {link.name: link for link in (
    HostLink("PCIe 4.0 x16", 25.0, 10.0, 30.0,
             "PCIe 4.0 x16: 31.5 GB/s per direction raw, ~25 GB/s achieved by pinned host-to-device copies "
             "(CUDA bandwidthTest on A100 systems: 24-26 GB/s); ~10 us per batched cudaMemcpyAsync before bytes "
             "flow (copy-engine launch plus the PCIe round trip); " + _FAULT_SRC),
    HostLink("PCIe 5.0 x16", 50.0, 10.0, 30.0,
             "PCIe 5.0 x16: 63 GB/s per direction raw, ~50 GB/s achieved by pinned host-to-device copies on H100 "
             "PCIe/SXM hosts (NVIDIA H100 whitepaper: PCIe Gen5 128 GB/s bidirectional); latency as PCIe 4.0; "
             + _FAULT_SRC),
    HostLink("NVLink-C2C", 450.0, 5.0, 10.0,
             "NVLink-C2C (GH200): 900 GB/s bidirectional, 450 GB/s per direction (NVIDIA Grace Hopper Superchip "
             "Architecture whitepaper, 2023); copies still pay a launch (~5 us assumed); the GPU reaches host "
             "memory through the coherent link and address translation, so page-fault batches are cheaper "
             "(10 us assumed)"),
)}

#: managed memory: the UVM driver migrates 64 KiB blocks on a GPU fault and services faults in
#: batches of up to 256 (nvidia-uvm's uvm_perf_fault_batch_count; Allen and Ge, SC 2021)
UVM_PAGE_BYTES = 64 * KiB
UVM_FAULT_BATCH = 256
#: a host gathering scattered rows of a few hundred bytes into a pinned buffer (torch index_select):
#: ~10 GB/s assumed, a fraction of a server socket's 100-200 GB/s DRAM bandwidth since the rows are
#: random accesses and the copy writes them again
HOST_ROW_GATHER_GBps = 10.0


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
             1555.0, 5120.0, 1410, 1095, 200.0, 480.0, _A100_SRC, ("a100-sxm4-40gb",)))
_add(GpuSpec("a100-pcie-40gb", "NVIDIA A100-PCIE-40GB", "sm_80", 108, 40 * MiB, 30 * MiB, 40 * GiB,
             1555.0, 5120.0, 1410, 765, 200.0, 480.0,
             _A100_SRC + "; A100 PCIe datasheet: 40 GB HBM2 1555 GB/s, base 765 MHz, 250 W", ()))
_add(GpuSpec("a100-pcie-80gb", "NVIDIA A100 80GB PCIe", "sm_80", 108, 40 * MiB, 30 * MiB, 80 * GiB,
             1935.0, 5120.0, 1410, 1065, 200.0, 480.0,
             _A100_SRC + "; A100 80GB PCIe datasheet: HBM2e 1935 GB/s, base 1065 MHz, 300 W", ()))
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
             fp32_TFLOPS=67.0, tf32_TFLOPS=494.7, fp16_TFLOPS=989.4, pcie_GBps=50.0, host_link="PCIe 5.0 x16"))
_add(GpuSpec("h100-pcie", "NVIDIA H100 PCIe", "sm_90", 114, 50 * MiB, int(37.5 * MiB), 80 * GiB,
             2039.0, 6000.0, 1755, 1125, 260.0, 480.0,
             _H100_SRC + "; H100 PCIe datasheet: 114 SMs, 80 GB HBM2e 2.0 TB/s (NVML: 1593 MHz x 5120 bits), "
             "FP32 51.2, TF32 378, FP16 756 TFLOP/s dense", (),
             l1_data_bytes=224 * KiB, l1_latency_ns=20.0,
             fp32_TFLOPS=51.2, tf32_TFLOPS=378.0, fp16_TFLOPS=756.0, pcie_GBps=50.0, host_link="PCIe 5.0 x16"))
_add(GpuSpec("h100-nvl", "NVIDIA H100 NVL", "sm_90", 132, 50 * MiB, int(37.5 * MiB), 94 * GiB,
             3938.0, 7500.0, 1785, 1080, 260.0, 480.0,
             _H100_SRC + "; H100 NVL product brief: 94 GB HBM3 3.9 TB/s (NVML: 2619 MHz x 6016 bits), "
             "FP32 60, TF32 417.5, FP16 835.5 TFLOP/s dense", (),
             l1_data_bytes=224 * KiB, l1_latency_ns=20.0,
             fp32_TFLOPS=60.0, tf32_TFLOPS=417.5, fp16_TFLOPS=835.5, pcie_GBps=50.0, host_link="PCIe 5.0 x16"))
# the export-compliant H100 SXM: the same chip, memory and clocks (only NVLink is slower)
_add(dataclasses.replace(GPUS["h100-sxm"], key="h800", name="NVIDIA H800", aliases=()))
_add(GpuSpec("h200", "NVIDIA H200", "sm_90", 132, 50 * MiB, int(37.5 * MiB), 141 * 10**9,
             4800.0, 7500.0, 1980, 1590, 260.0, 470.0, _H100_SRC, (),
             l1_data_bytes=224 * KiB, l1_latency_ns=20.0,
             fp32_TFLOPS=67.0, tf32_TFLOPS=494.7, fp16_TFLOPS=989.4, pcie_GBps=50.0, host_link="PCIe 5.0 x16"))

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
    for key, pattern in (("h200", "h200"), ("h800", "h800"), ("h100-nvl", r"h100.*nvl"), ("h100-pcie", r"h100.*pcie"),
                         ("h100-sxm", "h100"), ("a100-pcie-80gb", r"a100.*(80.*pcie|pcie.*80)"),
                         ("a100-pcie-40gb", r"a100.*pcie"), ("a100-40gb", r"a100.*40"), ("a100-80gb", "a100"),
                         ("a10", r"\ba10\b"), ("l4", r"\bl4\b")):
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
    max_memory_clock_MHz: int | None = None   # NVML: the memory clock's top (HBM: the bus clock, x2 per transfer)
    memory_bus_width_bits: int | None = None  # NVML (or torch's device properties)

    @property
    def arch(self) -> str:
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"

    @property
    def hbm_GBps(self) -> float | None:
        """Peak DRAM bandwidth from the device: 2 transfers per memory clock x bus width
        (A100 80 GB SXM: 2 x 1593 MHz x 5120 bits = 2039 GB/s)."""
        if not self.max_memory_clock_MHz or not self.memory_bus_width_bits:
            return None
        return 2 * self.max_memory_clock_MHz * 1e6 * self.memory_bus_width_bits / 8 / 1e9

    def _table_entry(self) -> GpuSpec:
        try:
            return gpu_spec(self.name)
        except ConfigError:
            return GPUS[DEFAULT_GPU.get(self.arch, "h100-sxm")]

    def _measured(self) -> dict[str, tuple[object, str]]:
        """GpuSpec fields the device answered, with the API that answered."""
        rt = "torch" if "torch" in self.source else "nvml"
        found: dict[str, tuple[object, str]] = {"name": (self.name, rt)}
        if self.arch in ARCHS:
            found["arch"] = (self.arch, rt)
        for key, value, api in (("sm_count", self.sm_count, "cuda runtime (torch)"),
                                ("l2_bytes", self.l2_bytes, "cuda runtime (torch)"),
                                ("memory_bytes", self.memory_bytes, rt),
                                ("max_persisting_l2_bytes", self.max_persisting_l2_bytes,
                                 "cuda runtime (cudaDevAttrMaxPersistingL2CacheSize)"),
                                ("hbm_GBps", self.hbm_GBps, "nvml (max memory clock x bus width)"),
                                ("boost_clock_MHz", self.max_sm_clock_MHz, "nvml (max SM clock)")):
            if value:
                found[key] = (value, api)
        return found

    def spec(self) -> GpuSpec:
        """The table entry for this GPU with the device's own numbers overlaid."""
        return dataclasses.replace(self._table_entry(), **{k: v for k, (v, _) in self._measured().items()})

    def provenance(self) -> dict[str, str]:
        """Where each identity field of spec() came from: the API that answered, or the
        spec table entry it fell back to."""
        entry = self._table_entry()
        found = self._measured()
        fields = ("name", "arch", "sm_count", "l2_bytes", "memory_bytes", "max_persisting_l2_bytes", "hbm_GBps",
                  "boost_clock_MHz", "base_clock_MHz", "l2_GBps")
        return {"table_entry": entry.key,
                **{f: found[f][1] if f in found else f"spec table ({entry.key})" for f in fields}}


#: NVML's clock-throttle reason bits (nvml.h, nvmlClocksEventReasons), named
THROTTLE_REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
                    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
                    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting"}


def throttle_names(mask: int) -> list[str]:
    """The reasons set in an NVML throttle mask (idle is not a slowdown of a running kernel)."""
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


#: the reasons that slow a running kernel (idle, application clocks, sync boost and the
#: display clock do not)
SLOWDOWN_REASONS = ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                    "hw_power_brake_slowdown")


def throttle_verdict(clocks: Mapping[str, Any]) -> dict:
    """Whether a point ran throttled, from the NVML samples taken around it
    (`{"before": {...}, "after": {...}}`): a slowdown reason in any sample, or power or
    thermal violation time that grew between the first and the last sample. Clocks
    sampled only around a point can miss a short slowdown; the violation counters
    cannot, which is why both are read. `throttled` is None when nothing was sampled."""
    samples = [v for v in clocks.values() if isinstance(v, Mapping) and v]
    reasons = sorted({r for v in samples for r in v.get("throttle_reasons", ()) if r in SLOWDOWN_REASONS})
    grown = {}
    for key, name in (("power_violation_ns", "power"), ("thermal_violation_ns", "thermal")):
        vals = [v[key] for v in samples if isinstance(v.get(key), (int, float))]
        if len(vals) >= 2 and vals[-1] > vals[0]:
            grown[name] = (vals[-1] - vals[0]) / 1e6
    temps = [v["temperature_C"] for v in samples if isinstance(v.get("temperature_C"), (int, float))]
    return {"throttled": bool(reasons or grown) if samples else None, "reasons": reasons,
            "violation_ms": grown, "max_temperature_C": max(temps) if temps else None}


def _nvml_query(h: object, calls: dict[str, object]) -> dict:
    """Each NVML call that answers (older GPUs and drivers lack some)."""
    out: dict = {}
    for key, call in calls.items():
        try:
            out[key] = call(h)  # type: ignore[operator]
        except Exception:
            pass
    return out


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
    n = pynvml
    try:
        driver = n.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        for i in range(n.nvmlDeviceGetCount()):
            h = n.nvmlDeviceGetHandleByIndex(i)
            name = n.nvmlDeviceGetName(h)
            info: dict = {"name": name.decode() if isinstance(name, bytes) else name}
            info.update(_nvml_query(h, {
                "memory_bytes": lambda h: int(n.nvmlDeviceGetMemoryInfo(h).total),
                "sm_clock_MHz": lambda h: int(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
                "memory_clock_MHz": lambda h: int(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)),
                "max_sm_clock_MHz": lambda h: int(n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_SM)),
                "max_memory_clock_MHz": lambda h: int(n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_MEM)),
                "memory_bus_width_bits": lambda h: int(n.nvmlDeviceGetMemoryBusWidth(h)),
                "compute_capability": lambda h: list(n.nvmlDeviceGetCudaComputeCapability(h)),
            }))
            out[i] = info
    finally:
        try:
            n.nvmlShutdown()
        except Exception:
            pass
    return out, driver


def sample_clocks(index: int | None) -> dict:
    """SM and memory clocks, temperature and throttle reasons of GPU `index` now (NVML);
    {} without NVML or a GPU. Recorded around each measured point (one clock policy:
    unlocked clocks, sampled)."""
    if index is None:
        return {}
    try:
        import pynvml as n
    except ImportError:
        return {}
    try:
        n.nvmlInit()
    except Exception:
        return {}
    try:
        h = n.nvmlDeviceGetHandleByIndex(index)
        out = _nvml_query(h, {
            "sm_clock_MHz": lambda h: int(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
            "memory_clock_MHz": lambda h: int(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)),
            "temperature_C": lambda h: int(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
            "throttle_mask": lambda h: int(n.nvmlDeviceGetCurrentClocksThrottleReasons(h)),
            # cumulative time the clocks were held down by the power or thermal limit since
            # the driver loaded: what grows between two samples happened during the point
            "power_violation_ns": lambda h: int(n.nvmlDeviceGetViolationStatus(
                h, n.NVML_PERF_POLICY_POWER).violationTime),
            "thermal_violation_ns": lambda h: int(n.nvmlDeviceGetViolationStatus(
                h, n.NVML_PERF_POLICY_THERMAL).violationTime),
        })
    except Exception:
        out = {}
    finally:
        try:
            n.nvmlShutdown()
        except Exception:
            pass
    if "throttle_mask" in out:
        out["throttle_reasons"] = throttle_names(out["throttle_mask"])
    return out


#: cudaDeviceAttr values (driver_types.h) read through the CUDA runtime
CUDA_ATTR_MAX_PERSISTING_L2 = 108   # cudaDevAttrMaxPersistingL2CacheSize


def _cuda_attribute(index: int, attr: int) -> int | None:
    """cudaDeviceGetAttribute through the CUDA runtime torch has loaded (found in
    /proc/self/maps, so the same library and context); None when it cannot be asked."""
    try:
        maps = open("/proc/self/maps", encoding="utf-8").read()
    except OSError:
        return None
    paths = sorted({line.split()[-1] for line in maps.splitlines() if "libcudart" in line and "/" in line})
    for path in paths:
        try:
            value = ctypes.c_int()
            if ctypes.CDLL(path).cudaDeviceGetAttribute(ctypes.byref(value), attr, index) == 0:
                return int(value.value)
        except (OSError, AttributeError):
            continue
    return None


def device_from_dump(index: int, nvml: dict, props: dict | None, cuda: dict | None = None,
                     driver: str | None = None, runtime: str | None = None) -> DeviceInfo:
    """A DeviceInfo from what NVML, torch's device properties and the CUDA runtime
    answered (dicts, as recorded in tests/data/gpus/*.json or queried live)."""
    p, n, c = props or {}, nvml or {}, cuda or {}
    cc = (p["major"], p["minor"]) if "major" in p else tuple(n.get("compute_capability", (0, 0)))
    return DeviceInfo(
        index=index,
        name=p.get("name") or n.get("name", "unknown GPU"),
        compute_capability=(int(cc[0]), int(cc[1])),
        sm_count=int(p.get("multi_processor_count", 0) or 0),
        l2_bytes=int(p.get("L2_cache_size", 0) or 0),
        memory_bytes=int(p.get("total_memory", 0) or n.get("memory_bytes", 0)),
        max_persisting_l2_bytes=c.get("max_persisting_l2_bytes"),
        sm_clock_MHz=n.get("sm_clock_MHz"),
        max_sm_clock_MHz=n.get("max_sm_clock_MHz"),
        memory_clock_MHz=n.get("memory_clock_MHz"),
        driver=driver,
        cuda_runtime=runtime,
        source="+".join(s for s, ok in (("nvml", bool(n)), ("torch", bool(p))) if ok),
        max_memory_clock_MHz=n.get("max_memory_clock_MHz"),
        memory_bus_width_bits=n.get("memory_bus_width_bits") or p.get("memory_bus_width"),
    )


_PROPS = ("name", "major", "minor", "multi_processor_count", "L2_cache_size", "total_memory", "memory_bus_width")


def devices() -> list[DeviceInfo]:
    """Every visible CUDA GPU, from NVML, torch and the CUDA runtime together; [] when there is none."""
    nvml, driver = _nvml_devices()
    torch_props: dict[int, dict] = {}
    cuda: dict[int, dict] = {}
    runtime = None
    try:
        import torch

        if torch.cuda.is_available():
            runtime = torch.version.cuda
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                torch_props[i] = {k: getattr(p, k) for k in _PROPS if hasattr(p, k)}
                persisting = _cuda_attribute(i, CUDA_ATTR_MAX_PERSISTING_L2)
                cuda[i] = {"max_persisting_l2_bytes": persisting} if persisting else {}
    except Exception:
        pass
    return [device_from_dump(i, nvml.get(i, {}), torch_props.get(i), cuda.get(i), driver, runtime)
            for i in sorted(set(nvml) | set(torch_props))]


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
