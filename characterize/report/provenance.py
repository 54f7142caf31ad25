"""Report stage, provenance: where each number came from (measured, emulated, predicted,
imported) and under which collection mode, so every panel can say so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


# ================================================================= provenance
@dataclass(frozen=True)
class Provenance:
    """Where a number comes from: a short badge and one sentence on how it was obtained."""

    key: str
    label: str
    how: str
    css: str


PROVENANCE: dict[str, Provenance] = {p.key: p for p in (
    Provenance("ncu", "Nsight Compute", "hardware performance counters read by Nsight Compute (ncu) while the "
               "kernel ran under the profiler (kernel replay: later passes can see a warmer L2)", "ncu"),
    Provenance("cuda-events", "CUDA events (GPU)", "GPU time between CUDA events around each table's kernel "
               "launch, at the GPU's normal clocks (not locked), mean over repetitions after warm-up batches, "
               "95% confidence interval from the t distribution", "gpu"),
    Provenance("cpu-emulation", "CPU emulation: NOT GPU performance", "the kernel source compiled for the host "
               "and run serially on the CPU; these timings only check the harness and say nothing about "
               "GPU performance", "emu"),
    Provenance("static", "static analysis", "ptxas resource usage (registers, spills, stack) of each kernel "
               "compiled with nvcc, fed to the occupancy calculator; no GPU involved", "static"),
    Provenance("trace", "trace analysis", "statistics of the index stream of one table of each dataset, "
               "computed on the CPU from the trace", "trace"),
    Provenance("model", "model prediction", "predicted by characterize.analysis.model.constants from trace locality, the static "
               "characterization and the GPU's specifications: a prediction, not a measurement", "model"),
    Provenance("meta", "run metadata", "recorded in the run directory (meta.json, point files) when the run "
               "was made", "meta"),
)}

TIMING_MODES = {
    "steady": "steady mode: L2 warm (batches repeated, tables launched back to back)",
    "cold": "cold mode: L2 flushed before every table launch",
}
_CACHE_CONTROL = {
    "none": "--cache-control none (caches kept between kernels, so L2 pinning is visible)",
    "all": "--cache-control all (caches flushed before each profiled kernel: L2 pinning erased)",
}
_CLOCK_CONTROL = {
    "base": "--clock-control base (clocks locked to base: comparable, slower than normal clocks)",
    "none": "--clock-control none (clocks not locked)",
}


def ncu_mode_text(cache: Any, clock: Any, replay: Any = None) -> str:
    """One line naming the ncu collection modes of a number."""
    def known(v: Any) -> str | None:
        return None if v is None or (isinstance(v, float) and math.isnan(v)) or v == "" else str(v)

    c, k, r = known(cache), known(clock), known(replay)
    parts = [_CACHE_CONTROL.get(c, f"--cache-control {c}") if c else "cache-control not recorded",
             _CLOCK_CONTROL.get(k, f"--clock-control {k}") if k else "clock-control not recorded"]
    if r:
        parts.append(f"--replay-mode {r}")
    return "ncu " + ", ".join(parts)


