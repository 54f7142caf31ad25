"""Model constants: the latencies and efficiencies a measured run can calibrate, with the
bounds calibration keeps them in.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from characterize.errors import ConfigError
from characterize.hardware import GpuSpec

Progress = Callable[[str], None]

SECTOR = 32          # bytes: the unit of L1/L2/DRAM traffic
WAVEFRONT = 128      # bytes an L1 request moves per cycle
L1_SAMPLE_SMS = 8    # SMs whose substreams estimate the L1 hit rate
MODES = ("steady", "cold")


# ------------------------------------------------------------------ constants
@dataclass(frozen=True)
class ModelConstants:
    """The model's free constants for one GPU."""

    l1_latency_ns: float
    l2_latency_ns: float
    dram_latency_ns: float
    l2_capacity_factor: float   # f: fraction of L2 that behaves like a fully associative LRU
    hbm_efficiency: float       # eta: achievable fraction of peak DRAM bandwidth
    launch_overhead_us: float

    @classmethod
    def defaults(cls, gpu: GpuSpec) -> "ModelConstants":
        return cls(gpu.l1_latency_ns, gpu.l2_latency_ns, gpu.dram_latency_ns, gpu.l2_effective_capacity,
                   gpu.hbm_efficiency, gpu.launch_overhead_us)

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ModelConstants":
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in data]
        if missing:
            raise ConfigError(f"model constants lack {', '.join(missing)}")
        return cls(**{n: float(data[n]) for n in names})

    def replace(self, **changes: float) -> "ModelConstants":
        return dataclasses.replace(self, **changes)


#: the range calibrate() keeps each constant in
BOUNDS: dict[str, tuple[float, float]] = {
    "l1_latency_ns": (5.0, 120.0),
    "l2_latency_ns": (50.0, 1000.0),
    "dram_latency_ns": (150.0, 2500.0),
    "l2_capacity_factor": (0.05, 1.0),
    "hbm_efficiency": (0.2, 1.0),
    "launch_overhead_us": (0.3, 30.0),
}
FIT_DEFAULT = tuple(BOUNDS)


