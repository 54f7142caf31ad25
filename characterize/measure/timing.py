"""Timing stage: CUDA-event timing of one (variant, dataset) point, with statistics
that say when a measurement is stable.

A repetition is one inference batch: the variant's lookup kernel launched once per
table, in table order (steady mode: what the L2 sees in production, and how the
paper measured), or with L2 flushed before every launch (cold mode). Each launch
and each pinning pre-pass is bracketed by its own CUDA events, so pre-pass time can
be reported excluded (as the paper did) and included. Repetitions continue until
the 95% confidence half-width of the batch time is under the target fraction of the
mean, within a time budget. On the CPU-emulation backend the same loop runs with
wall-clock timers; those numbers check the harness, they are not GPU timings.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np
import torch

from characterize.config import BenchConfig
from characterize.kernels.library import BagOutputs, TableKernel

# two-sided 95% Student-t quantiles for 1..30 degrees of freedom; 1.96 beyond
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)


def t95(df: int) -> float:
    return _T95[df - 1] if 1 <= df <= len(_T95) else 1.96


@dataclass(frozen=True)
class Stats:
    """Mean of a sample with its spread and a stability verdict."""

    n: int
    mean: float
    std: float
    ci95: float      # half-width of the 95% confidence interval of the mean
    rel_std: float   # std / mean
    rel_ci: float    # ci95 / mean
    stable: bool     # rel_ci below the target
    median: float
    min: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(samples: Sequence[float], target: float = 0.02) -> Stats:
    x = np.asarray(samples, dtype=np.float64)
    n = len(x)
    if n == 0:
        nan = float("nan")
        return Stats(0, nan, nan, nan, nan, nan, False, nan, nan)
    mean = float(x.mean())
    std = float(x.std(ddof=1)) if n > 1 else float("nan")
    ci = t95(n - 1) * std / math.sqrt(n) if n > 1 else float("inf")
    rel_ci = ci / mean if mean > 0 else float("inf")
    return Stats(n, mean, std, ci, std / mean if mean > 0 else float("nan"), rel_ci, rel_ci < target,
                 float(np.median(x)), float(x.min()))


class Clock:
    """Brackets work with CUDA events (GPU) or perf_counter (CPU emulation)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def elapsed_us(self, start: Any, end: Any) -> float:
        if self.cuda:
            return start.elapsed_time(end) * 1e3
        return (end - start) * 1e6

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


class L2Flusher:
    """Evicts L2 before a cold launch: demotes persisting lines, then writes a buffer
    twice the L2 size through it."""

    def __init__(self, device: torch.device, l2_bytes: int, library: Any = None):
        self.buffer = torch.empty(max(1, 2 * l2_bytes // 4), dtype=torch.float32, device=device)
        self.library = library

    def __call__(self) -> None:
        if self.library is not None and not self.library.emulated:
            self.library.check(self.library.lib.chz_l2_reset(), "resetting persisting L2 lines")
        self.buffer.zero_()


Batch = tuple[torch.Tensor, torch.Tensor]  # (mapped indices, offsets) of one table


def time_point(kernels: Sequence[TableKernel], batches: Sequence[Sequence[Batch]], mode: str, bench: BenchConfig,
               flusher: L2Flusher | None = None, outputs: Sequence[BagOutputs | None] | None = None) -> dict[str, Any]:
    """Time `kernels` (one per table) over `batches[b][t]` in `mode` ('steady' or 'cold').

    Returns per-repetition batch times (kernel and pre-pass, microseconds), per-table
    means, and Stats of the batch time.
    """
    if mode not in ("steady", "cold"):
        raise ValueError(f"unknown mode {mode}")
    device = kernels[0].weight.device
    clock = Clock(device)
    has_prepass = any(k.hot_rows is not None and len(k.hot_rows) for k in kernels)
    T = len(kernels)
    outputs = outputs or [None] * T

    def one_batch(b: int) -> list[tuple[Any, Any, Any, Any]]:
        marks = []
        for t, tk in enumerate(kernels):
            idx, off = batches[b % len(batches)][t]
            if mode == "cold" and flusher is not None:
                flusher()
            p0 = clock.mark() if has_prepass else None
            tk.prepass()
            p1 = clock.mark() if has_prepass else None
            k0 = clock.mark()
            tk.launch(idx, off, out=outputs[t])
            k1 = clock.mark()
            marks.append((p0, p1, k0, k1))
        return marks

    for b in range(bench.warmup):
        one_batch(b)
    clock.sync()
    reps: list[dict[str, Any]] = []
    per_table = np.zeros(T)
    start = time.perf_counter()
    kernel_batch: list[float] = []
    while True:
        r = len(kernel_batch)
        marks = one_batch(bench.warmup + r)
        clock.sync()
        k_times = [clock.elapsed_us(k0, k1) for _, _, k0, k1 in marks]
        p_times = [clock.elapsed_us(p0, p1) for p0, p1, _, _ in marks] if has_prepass else [0.0] * T
        per_table += k_times
        kernel_batch.append(sum(k_times))
        reps.append({"mode": mode, "rep": r, "kernel_us": sum(k_times), "prepass_us": sum(p_times)})
        n = len(kernel_batch)
        if n >= bench.max_reps:
            break
        if n >= bench.min_reps:
            if summarize(kernel_batch, bench.ci_target).stable or time.perf_counter() - start > bench.budget_s:
                break
        elif n >= 2 and time.perf_counter() - start > 4 * bench.budget_s:
            break  # a pathologically slow point: keep what we have
    kernel = summarize(kernel_batch, bench.ci_target)
    prepass = summarize([r["prepass_us"] for r in reps], bench.ci_target)
    total = summarize([r["kernel_us"] + r["prepass_us"] for r in reps], bench.ci_target)
    return {"mode": mode, "tables": T, "repetitions": reps, "per_table_mean_us": list(per_table / len(reps)),
            "kernel": kernel, "prepass": prepass if has_prepass else None, "with_prepass": total,
            "seconds": time.perf_counter() - start}
