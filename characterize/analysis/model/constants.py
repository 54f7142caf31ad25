"""Analysis stage, model constants: the latencies and efficiencies a measured run can calibrate, with the
bounds calibration keeps them in.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from characterize.errors import ConfigError
from characterize.hardware.specs import GpuSpec, gpu_spec

SECTOR = 32          # bytes: the unit of L1/L2/DRAM traffic
#: k of the time terms' k-norm: terms that overlap in time (a warp waits on memory while others
#: issue; DRAM and L2 serve the same requests) cost about the largest, plus a little when a second
#: is close (k = 4: two equal terms take 1.19 x either, a term at half the largest adds 3%)
OVERLAP = 4.0
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
    pinned_hit: float = GpuSpec.pinned_hit_probability  # a row pinned in the persisting set-aside hits
    write_efficiency: float = 0.9   # achievable fraction of peak DRAM bandwidth for streamed writes (the output)
    overlap: float = OVERLAP        # k: how the time terms combine, (sum of t_i^k)^(1/k) (large k: the largest)
    request_overhead_bytes: float = 32.0  # s0: a random read of s contiguous bytes runs at s / (s + s0) of the rate
    issue_ipc: float = GpuSpec.issue_ipc          # warp instructions an SM issues per cycle in a hot loop
    l1_efficiency: float = GpuSpec.l1_efficiency  # share of the L1's peak bytes per cycle row gathers reach

    @classmethod
    def defaults(cls, gpu: GpuSpec) -> "ModelConstants":
        return cls(gpu.l1_latency_ns, gpu.l2_latency_ns, gpu.dram_latency_ns, gpu.l2_effective_capacity,
                   gpu.hbm_efficiency, gpu.launch_overhead_us, gpu.pinned_hit_probability,
                   issue_ipc=gpu.issue_ipc, l1_efficiency=gpu.l1_efficiency)

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ModelConstants":
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in data and n not in OPTIONAL]
        if missing:
            raise ConfigError(f"model constants lack {', '.join(missing)}")
        return cls(**{n: float(data[n]) for n in names if n in data})

    def replace(self, **changes: float) -> "ModelConstants":
        return dataclasses.replace(self, **changes)

    def band(self) -> tuple["ModelConstants", "ModelConstants"]:
        """(fast, slow) ends of the constants' published ranges (BAND) around these
        values; the model's time is monotone in each constant, so these bound it."""
        fast, slow = {}, {}
        for name, (lo, hi) in BAND.items():
            value = getattr(self, name)
            a, b = value * lo, value * hi
            if name in FASTER_WHEN_LARGER:
                a, b = b, a
            clamp = BOUNDS[name]
            fast[name], slow[name] = (min(max(x, clamp[0]), clamp[1]) for x in (a, b))
        return self.replace(**fast), self.replace(**slow)


#: relative spread of each constant over its published range (sources in hardware.GpuSpec):
#: L1 33-40 cycles; L2 near vs far partition (~200-260 ns); DRAM load-to-use 450-500 ns
#: idle, more under load; effective L2 capacity between 0.5 and 1 of the L2 (0.6 assumed);
#: gathers reach 75-92% of peak HBM bandwidth; 2-4 us per back-to-back launch.
BAND: dict[str, tuple[float, float]] = {
    "l1_latency_ns": (0.85, 1.2),
    "l2_latency_ns": (0.85, 1.3),
    "dram_latency_ns": (0.9, 1.25),
    "l2_capacity_factor": (0.83, 1.5),
    "hbm_efficiency": (0.88, 1.08),
    "launch_overhead_us": (0.67, 1.33),
    "pinned_hit": (0.89, 1.12),
    "write_efficiency": (0.9, 1.08),
    "issue_ipc": (0.92, 1.06),
    "l1_efficiency": (0.85, 1.2),
}
#: constants whose larger values make a kernel faster (the band's fast end takes the top)
FASTER_WHEN_LARGER = frozenset({"l2_capacity_factor", "hbm_efficiency", "pinned_hit", "write_efficiency",
                                "issue_ipc", "l1_efficiency"})
#: constants added after calibrations were first stored: a stored set without them keeps the default
OPTIONAL = frozenset({"pinned_hit", "write_efficiency", "overlap", "request_overhead_bytes", "issue_ipc",
                      "l1_efficiency"})


#: the range calibrate() keeps each constant in
BOUNDS: dict[str, tuple[float, float]] = {
    "l1_latency_ns": (5.0, 120.0),
    "l2_latency_ns": (50.0, 1000.0),
    "dram_latency_ns": (150.0, 2500.0),
    "l2_capacity_factor": (0.05, 1.0),
    "hbm_efficiency": (0.2, 1.0),
    "launch_overhead_us": (0.3, 30.0),
    "pinned_hit": (0.3, 1.0),
    "write_efficiency": (0.3, 1.0),
    "overlap": (1.0, 16.0),
    "request_overhead_bytes": (0.0, 256.0),
    "issue_ipc": (1.0, 4.0),
    "l1_efficiency": (0.2, 1.0),
}
FIT_DEFAULT = tuple(BOUNDS)


# ----------------------------------------------------------- stored calibrations
def calibration_dir() -> Path:
    """$CHARACTERIZE_CALIBRATION, else ~/.config/characterize/calibration."""
    env = os.environ.get("CHARACTERIZE_CALIBRATION")
    return Path(env) if env else Path.home() / ".config" / "characterize" / "calibration"


def calibration_path(gpu: str | GpuSpec) -> Path:
    """Where `characterize calibrate` stores a GPU's fitted constants."""
    spec = gpu if isinstance(gpu, GpuSpec) else gpu_spec(gpu)
    return calibration_dir() / f"{spec.key}.json"


def load_calibration(gpu: str | GpuSpec) -> ModelConstants | None:
    """The stored calibrated constants of a GPU, or None when it was never calibrated.
    A file that is not a calibration, or holds a constant that is not a finite number
    inside the range calibrate() keeps it in (BOUNDS), is refused with its path."""
    path = calibration_path(gpu)
    if not path.is_file():
        return None
    fix = "delete it or run `characterize calibrate` again"
    try:
        data = json.loads(path.read_text())
        consts = ModelConstants.from_dict(data["constants"])
    except (OSError, ValueError, KeyError, TypeError, ConfigError) as e:
        raise ConfigError(f"{path}: not a calibration file ({e}); {fix}") from None
    for name, (lo, hi) in BOUNDS.items():
        v = getattr(consts, name)
        if not math.isfinite(v) or not lo <= v <= hi:
            raise ConfigError(f"{path}: constant {name} = {v!r} is outside its range {lo:g}..{hi:g}; {fix}")
    return consts
