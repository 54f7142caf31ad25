"""Hardware stage, specs: the per-architecture and per-GPU spec table, with sources.

Every hardware fact the toolkit uses (occupancy limits, L2 and persisting-L2 sizes,
HBM bandwidth, latencies for the model) lives in the tables below, never inline in
analysis code. `ARCHS` holds streaming-multiprocessor facts shared by every GPU of a
compute capability; `GPUS` holds one representative product per architecture plus
named products (A100 40 GB, H200, ...). What a present GPU reports about itself is
read by hardware.devices and overlaid on these entries.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Iterable

from characterize.errors import ConfigError, did_you_mean

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
        # Volta: no persisting L2; nvcc 13 no longer builds sm_70, so its predictions read sm_80 code
        ArchSpec("sm_70", (7, 0), 64, 32, 1024, 65536, 65536, 256, 255, 24, 96 * KiB, 96 * KiB, 0, 256),
        ArchSpec("sm_80", (8, 0), 64, 32, 1024, 65536, 65536, 256, 255, 24, 164 * KiB, 163 * KiB, 1 * KiB, 128),
        ArchSpec("sm_86", (8, 6), 48, 16, 1024, 65536, 65536, 256, 255, 24, 100 * KiB, 99 * KiB, 1 * KiB, 128),
        ArchSpec("sm_89", (8, 9), 48, 24, 1024, 65536, 65536, 256, 255, 24, 100 * KiB, 99 * KiB, 1 * KiB, 128),
        ArchSpec("sm_90", (9, 0), 64, 32, 1024, 65536, 65536, 256, 255, 24, 228 * KiB, 227 * KiB, 1 * KiB, 128),
        # compute capability 10.0 (B200): the per-SM limits of Hopper (CUDA C++ Programming Guide, table
        # "Technical Specifications per Compute Capability", 10.0 column; nvcc 13 compiles for sm_100)
        ArchSpec("sm_100", (10, 0), 64, 32, 1024, 65536, 65536, 256, 255, 24, 228 * KiB, 227 * KiB, 1 * KiB, 128),
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
    "figure, 0.8-1.0 assumed until calibrated; reachable issue rate 2.7 warp instructions per cycle per SM (of "
    "the 4 schedulers' 4): the family's and PyTorch's kernels at the paper's one-row trace on this project's "
    "H200 (profiles/h200), where issue bounds them, ran 2.5-2.85 (bench time against the SASS instruction "
    "count, and ncu's sm__inst_issued per active cycle); row gathers reach half the L1's 128 B/clk: tbe at the "
    "one-row trace, bound by L1, ran at 116 us for 12 tables where 128 B/clk gives 57 (the same run)"
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
    issue_ipc: float = 2.7              # warp instructions an SM issues per cycle in a gather's hot loop (of 4)
    l1_efficiency: float = 0.5          # share of l1_bytes_per_clk row gathers reach (16-byte vectors of distinct rows)
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
    copy_GBps: float = 0.0              # a measured device-to-device copy, read + written, GB/s (0: not measured)

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
    HostLink("PCIe 3.0 x16", 12.0, 10.0, 30.0,
             "PCIe 3.0 x16: 15.75 GB/s per direction raw, ~12 GB/s achieved by pinned host-to-device copies (CUDA "
             "bandwidthTest on V100 PCIe systems: 11-13 GB/s); latency as PCIe 4.0; " + _FAULT_SRC),
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

_B200_SRC = (
    "NVIDIA B200 (HGX/DGX B200, SXM, 1000 W): 148 SMs enabled (two dies of 80 physical SMs, 74 enabled on "
    "each: Chips and Cheese, 'Nvidia's B200: Keeping the CUDA Juggernaut Rolling', 2025, which also measured "
    "L1/shared 256 KB per SM as on H100 and clocks similar to H100 SXM); 192 GB HBM3e in 8 stacks, 8 TB/s "
    "(NVIDIA DGX B200 datasheet: 1,440 GB of GPU memory over 8 GPUs, i.e. 180 GB usable each, 64 TB/s "
    "aggregate); L2 126 MB (2.5x H100's: 'The Evolution of NVIDIA Blackwell GPU Memory Architecture', "
    "freeCodeCamp, 2025; some third-party tables list other sizes, the driver reports the real value); boost "
    "clock 1980 MHz (hmc-tech B200 specification table), base clock assumed equal to H100 SXM's 1590 MHz (no "
    "published figure); persisting L2 assumed 75% of L2 as on A100/H100; latencies assumed H100's until "
    "calibrated; sustained L2 bandwidth assumed 1.6x H100's 7,500 GB/s (no published figure); dense peaks (HGX B200 at 1000 W, NVIDIA figures quoted by Glenn Lockwood's B200 notes): FP32 "
    "80, TF32 1100, FP16 2250 TFLOP/s; hosted by PCIe 5.0 x16 CPUs"
)

GPUS: dict[str, GpuSpec] = {}


def _add(spec: GpuSpec) -> None:
    GPUS[spec.key] = spec


_add(GpuSpec("v100", "Tesla V100-SXM2-32GB", "sm_70", 80, 6 * MiB, 0, 32 * GiB,
             900.0, 2150.0, 1530, 1290, 180.0, 430.0,
             "NVIDIA Tesla V100 GPU Architecture whitepaper (2017): 80 SMs, 6 MB L2, HBM2 900 GB/s, boost 1530 MHz; "
             "V100 SXM2 datasheet: 32 GB, FP32 15.7, FP16 tensor 125 TFLOP/s; no persisting L2 (Ampere added it); "
             "latencies: Jia et al., 'Dissecting the NVIDIA Volta GPU Architecture via Microbenchmarking' (2018): L2 "
             "hit ~193 cycles, global memory ~375 ns at 1.38 GHz; L2 bandwidth ~2.1 TB/s (the same paper); "
             "PCIe 3.0 x16 host link (~12 GB/s achieved)", ("sm_70", "tesla-v100", "v100-sxm2"),
             l1_data_bytes=96 * KiB, l1_latency_ns=21.0, fp32_TFLOPS=15.7, tf32_TFLOPS=15.7, fp16_TFLOPS=125.0,
             pcie_GBps=12.0, host_link="PCIe 3.0 x16", host_latency_us=10.0))
_add(GpuSpec("a100-80gb", "NVIDIA A100-SXM4-80GB", "sm_80", 108, 40 * MiB, 30 * MiB, 80 * GiB,
             2039.0, 5120.0, 1410, 1095, 200.0, 480.0, _A100_SRC, ("a100-sxm4-80gb", "sm_80")))
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
_add(GpuSpec("l40s", "NVIDIA L40S", "sm_89", 142, 96 * MiB, 72 * MiB, 48 * GiB,
             864.0, 5000.0, 2520, 1110, 230.0, 560.0,
             "NVIDIA L40S datasheet (2023): 142 SMs (18,176 CUDA cores), 48 GB GDDR6 at 864 GB/s, boost 2520 MHz, FP32 "
             "91.6, FP16 tensor 362 TFLOP/s dense; NVIDIA Ada Lovelace architecture whitepaper: AD102 with 96 MB L2; "
             "persisting L2 75% of L2 (assumed); latencies as L4 (the same Ada memory hierarchy); PCIe 4.0 x16",
             ("ad102",), l1_data_bytes=96 * KiB, l1_latency_ns=18.0,
             fp32_TFLOPS=91.6, tf32_TFLOPS=183.0, fp16_TFLOPS=362.0))
_add(GpuSpec("h100-sxm", "NVIDIA H100 80GB HBM3", "sm_90", 132, 50 * MiB, int(37.5 * MiB), 80 * GiB,
             3350.0, 7500.0, 1980, 1590, 260.0, 480.0, _H100_SRC, ("h100-sxm5", "sm_90"),
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
_add(GpuSpec("h200", "NVIDIA H200", "sm_90", 132, 60 * MiB, 45 * MiB, 141 * 10**9,
             4800.0, 7500.0, 1980, 1590, 260.0, 470.0,
             _H100_SRC + "; L2 60 MiB as the device reports it (cudaDevAttrL2CacheSize 62,914,560 bytes on the "
             "H200 of profiles/h200, 2026-11-27; the H100 SXM's is 50 MB); persisting L2 75% of it (assumed); "
             "achievable DRAM bandwidth 0.88 of peak: a 2 GiB device-to-device copy moved 4,214 GB/s (read + "
             "written) on that H200 (profiles/h200/logs/micro.json)", (),
             l1_data_bytes=224 * KiB, l1_latency_ns=20.0, hbm_efficiency=0.88, copy_GBps=4214.3,
             fp32_TFLOPS=67.0, tf32_TFLOPS=494.7, fp16_TFLOPS=989.4, pcie_GBps=50.0, host_link="PCIe 5.0 x16"))

_H20_SRC = ("NVIDIA publishes no datasheet for the H20; the figures are those reported publicly: 78 SMs (Geekbench 6 "
            "listing reported by Wccftech, 2024), 60 MB L2, 96 GB HBM3 at 4.0 TB/s over a 6144-bit bus, FP32 44, TF32 "
            "74, FP16 148 TFLOP/s dense (reseller and press specification pages); Hopper latencies as H100; clocks as "
            "H100 SXM (assumed)")
_add(GpuSpec("h20", "NVIDIA H20", "sm_90", 78, 60 * MiB, 45 * MiB, 96 * GiB,
             4000.0, 4400.0, 1980, 1590, 260.0, 480.0, _H20_SRC, (),
             l1_data_bytes=224 * KiB, l1_latency_ns=20.0,
             fp32_TFLOPS=44.0, tf32_TFLOPS=74.0, fp16_TFLOPS=148.0, pcie_GBps=50.0, host_link="PCIe 5.0 x16"))
# the H20 with HBM3e: the same chip with 141 GB at 4.8 TB/s (as reported; no datasheet)
_add(dataclasses.replace(GPUS["h20"], key="h20-3e", name="NVIDIA H20-3e", memory_bytes=141 * 10**9, hbm_GBps=4800.0,
                         sources=_H20_SRC + "; H20-3e: 141 GB HBM3e at 4.8 TB/s as reported", aliases=("h20 3e",)))

#: names that stand for several products of different speed: asked for, not guessed
AMBIGUOUS = {
    "h100": ("h100-sxm", "h100-pcie", "h100-nvl"),
    "nvidia h100": ("h100-sxm", "h100-pcie", "h100-nvl"),
    "a100": ("a100-80gb", "a100-40gb", "a100-pcie-40gb", "a100-pcie-80gb"),
    "nvidia a100": ("a100-80gb", "a100-40gb", "a100-pcie-40gb", "a100-pcie-80gb"),
}

_add(GpuSpec("b200", "NVIDIA B200", "sm_100", 148, 126 * MiB, int(94.5 * MiB), 180 * GiB,
             8000.0, 12000.0, 1980, 1590, 260.0, 480.0, _B200_SRC, ("sm_100",),
             l1_data_bytes=224 * KiB, l1_latency_ns=20.0,
             fp32_TFLOPS=80.0, tf32_TFLOPS=1100.0, fp16_TFLOPS=2250.0, pcie_GBps=50.0, host_link="PCIe 5.0 x16"))

#: the paper's GPU (A100): what CPU emulation sizes its L2 after and the claims are checked on
REFERENCE_ARCH = "sm_80"

#: the representative GPU for each architecture key
DEFAULT_GPU = {"sm_70": "v100", "sm_80": "a100-80gb", "sm_86": "a10", "sm_89": "l4", "sm_90": "h100-sxm",
               "sm_100": "b200"}


def normalize_arch(text: str) -> str:
    """'sm_80', '80', '8.0', 'sm80', 'compute_80' -> 'sm_80' ('sm_100', '100', '10.0' -> 'sm_100');
    unknown -> ConfigError."""
    t = text.strip().lower()
    m = re.fullmatch(r"(?:sm_?|compute_)?(\d{1,2}?)\.?(\d)", t)
    if not m:
        raise ConfigError(f"unknown architecture {text!r}: use one of {', '.join(ARCHS)}." + did_you_mean(t, list(ARCHS)))
    arch = f"sm_{m.group(1)}{m.group(2)}"
    if arch not in ARCHS:
        raise ConfigError(f"architecture {arch} is not in the spec table; known: {', '.join(ARCHS)}."
                          + did_you_mean(arch, list(ARCHS)))
    return arch


def compute_capability(arch: str) -> tuple[int, int]:
    """(major, minor) of 'sm_XY' or 'sm_XYZ' (sm_100: (10, 0)), known to the table or not."""
    if arch in ARCHS:
        return ARCHS[arch].compute_capability
    m = re.fullmatch(r"sm_(\d+)(\d)a?", arch)
    if not m:
        raise ConfigError(f"not an architecture name: {arch!r}")
    return int(m.group(1)), int(m.group(2))


def nearest_arch(available: Iterable[str], arch: str) -> str | None:
    """The architecture of `available` whose code stands in for `arch` where there is none
    of its own: itself, else the closest of the same major version (same SM design), else
    the closest overall; None when `available` is empty."""
    have = list(dict.fromkeys(available))
    if arch in have:
        return arch
    if not have:
        return None
    cc = compute_capability(arch)

    def distance(a: str) -> tuple[int, int]:
        c = compute_capability(a)
        return (0 if c[0] == cc[0] else 1, abs((c[0] * 10 + c[1]) - (cc[0] * 10 + cc[1])))

    return min(have, key=distance)


def gpu_spec(name: str) -> GpuSpec:
    """Look up a GPU by table key, alias, architecture or driver name. A name that stands
    for products of different speed ("H100": SXM, PCIe or NVL move answers by 1.5x) is
    refused with the choices instead of guessed."""
    t = name.strip().lower()
    if t in GPUS:
        return GPUS[t]
    if t in AMBIGUOUS:
        choices = AMBIGUOUS[t]
        described = "; ".join(f"{k} ({GPUS[k].sm_count} SMs, {GPUS[k].hbm_GBps:,.0f} GB/s)" for k in choices)
        raise ConfigError(f"GPU {name!r} is ambiguous: it names products that differ in speed; choose one of "
                          f"{described}")
    for spec in GPUS.values():
        if t in spec.aliases or t == spec.name.lower():
            return spec
    try:
        return GPUS[DEFAULT_GPU[normalize_arch(t)]]
    except ConfigError:
        pass
    # driver names such as "NVIDIA H100 PCIe" or "NVIDIA A100-PCIE-40GB"
    for key, pattern in (("b200", r"\bb200\b"), ("h200", "h200"), ("h800", "h800"), ("h20-3e", r"h20-?3e"), ("h20", r"\bh20\b"),
                         ("h100-nvl", r"h100.*nvl"), ("h100-pcie", r"h100.*pcie"), ("h100-sxm", r"h100.*(hbm3|sxm)"),
                         ("a100-pcie-80gb", r"a100.*(80.*pcie|pcie.*80)"), ("a100-pcie-40gb", r"a100.*pcie"),
                         ("a100-40gb", r"a100.*40"), ("a100-80gb", r"a100.*(80|sxm)"), ("v100", r"v100"),
                         ("l40s", r"\bl40s\b"), ("a10", r"\ba10\b"), ("l4", r"\bl4\b")):
        if re.search(pattern, t):
            return GPUS[key]
    known = sorted(set(GPUS) | {a for s in GPUS.values() for a in s.aliases})
    # a typo of an ambiguous name is pointed at it: its own refusal then lists the products it names
    raise ConfigError(f"unknown GPU {name!r}; known: {', '.join(known)}." + did_you_mean(t, [*known, *ARCHS,
                                                                                            *AMBIGUOUS]))


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


def markdown_table(measured: dict[str, str] | None = None) -> str:
    """docs/gpu.md's supported-GPU table, one row per entry of GPUS (a GPU added to the
    table appears when docs/gpu.md is regenerated; a test keeps the two in step):
    architecture, SMs, L2 and its persisting share, memory, DRAM peak, host link, and
    whether a measured run of it is committed (`measured`: GPU key -> run directory);
    every other number about it is the model's prediction until one is."""
    measured = measured or {}
    lines = ["| GPU | `--arch` | SM | SMs | L2 (persisting) | memory | DRAM peak | host link | measured here |",
             "|---|---|---|---|---|---|---|---|---|"]
    default = {v: k for k, v in DEFAULT_GPU.items()}
    for key, g in GPUS.items():
        names = [f"`{key}`"] + [f"`{a}`" for a in g.aliases]
        arch = g.arch + (" (default)" if default.get(key) == g.arch else "")
        where = f"yes: `{measured[key]}`" if key in measured else "no: predicted only"
        lines.append(f"| {g.name} | {', '.join(names)} | {arch} | {g.sm_count} | {g.l2_bytes / MiB:g} MiB "
                     f"({g.max_persisting_l2_bytes / MiB:g} MiB) | {g.memory_bytes / GiB:.0f} GiB | "
                     f"{g.hbm_GBps:,.0f} GB/s | {g.host_link} | {where} |")
    return "\n".join(lines)
