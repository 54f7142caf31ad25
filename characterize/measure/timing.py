"""Measure stage, timing: CUDA-event timing of one (variant, dataset) point, with statistics
that say when a measurement is stable.

A repetition is one inference batch: the variant's lookup kernel launched once per
table, in table order (steady mode: what the L2 sees in production, and how the
paper measured), or with L2 flushed before every launch (cold mode). Each launch
and each pinning pre-pass is bracketed by its own CUDA events, so pre-pass time can
be reported excluded (as the paper did) and included.

Events must bracket device work only. A Python/ctypes launch costs 10-20 us of host
time, as much as a whole table launch on an H100; timed eagerly, that idle time
would count as kernel time. So each batch is queued behind a device-side delay
kernel: the GPU spins while the host enqueues every flush, pre-pass, launch and
event of the batch, then runs them back to back. A repetition counts only when the
host finished enqueueing before the spin ended (host enqueue time < the spin's own
event-measured duration, a sufficient condition); otherwise the delay doubles and
the repetition is recorded as host-bound and left out of the statistics. Launch
overhead is reported apart: the host's enqueue time per launch and the device's
gap between consecutive operations.

Repetitions continue until the 95% confidence half-width of the batch time is under
the target fraction of the mean, within a time budget. On the CPU-emulation backend
the same loop runs with wall-clock timers and no delay (the emulator runs kernels
synchronously); those numbers check the harness, they are not GPU timings.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Protocol, Sequence

import numpy as np
import torch

from characterize.config import BenchConfig
from characterize.kernels.library import BagOutputs, TableKernel

# two-sided 95% Student-t quantiles for 1..30 degrees of freedom; 1.96 beyond
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)

#: timing methods recorded with every point
METHOD_DELAY = "delay-kernel"          # events bracket device work only
METHOD_WALL = "wall-clock-emulation"   # CPU emulation: checks the harness, not a GPU timing

#: the first delay before the host's enqueue time is known, and the longest one allowed
FIRST_DELAY_US = 200.0
MAX_DELAY_US = 1e6


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


class DeviceClock(Protocol):
    """What timing needs from a device: stream-ordered marks, a device-side delay, the
    host's own clock, and a way to wait for the device."""

    method: str

    def mark(self) -> Any: ...                       # enqueue a timestamp (an event) on the stream
    def elapsed_us(self, start: Any, end: Any) -> float: ...
    def delay(self, us: float) -> None: ...          # enqueue device work lasting about `us`
    def host_us(self) -> float: ...                  # the host's clock, microseconds
    def sync(self) -> None: ...


class CudaClock:
    """CUDA events on the current stream; the delay is torch's spin kernel
    (`torch.cuda._sleep`, cycles at the SM's highest clock, so it lasts at least `us`)."""

    method = METHOD_DELAY

    def __init__(self, device: torch.device, max_sm_clock_MHz: float | None = None):
        self.device = device
        self.cycles_per_us = float(max_sm_clock_MHz or 2100.0)

    def mark(self) -> Any:
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def elapsed_us(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) * 1e3

    def delay(self, us: float) -> None:
        torch.cuda._sleep(int(us * self.cycles_per_us))

    def host_us(self) -> float:
        return time.perf_counter() * 1e6

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)


class WallClock:
    """perf_counter for the CPU emulation, whose kernels run synchronously: no delay."""

    method = METHOD_WALL

    def mark(self) -> Any:
        return time.perf_counter()

    def elapsed_us(self, start: Any, end: Any) -> float:
        return (end - start) * 1e6

    def delay(self, us: float) -> None:
        pass

    def host_us(self) -> float:
        return time.perf_counter() * 1e6

    def sync(self) -> None:
        pass


def clock_for(device: torch.device, max_sm_clock_MHz: float | None = None) -> DeviceClock:
    return CudaClock(device, max_sm_clock_MHz) if device.type == "cuda" else WallClock()


class L2Flusher:
    """Leaves a cold, clean L2 before a cold launch.

    Persisting lines are demoted first (`cudaCtxResetPersistingL2Cache`), so pinned rows
    can be evicted; then a buffer twice the L2 size is written and read back. The write
    evicts everything else (dirty lines of earlier kernels are written back during it);
    the read streams twice the L2 through it again, so the write's own dirty lines are
    evicted, and written back, during the read, before the cold launch's first event,
    and the L2 is left holding clean lines of the buffer. What stays dirty is the
    reduction's few KiB of partial sums (and, with replacement that is not LRU, the
    few written lines the read happens to hit), against the L2-sized write-back that a
    write-only flush (`zero_`) leaves to land inside the timed kernel.
    """

    def __init__(self, device: torch.device, l2_bytes: int, library: Any = None):
        self.buffer = torch.empty(max(1, 2 * l2_bytes // 4), dtype=torch.float32, device=device)
        self.sink = torch.empty((), dtype=torch.float32, device=device)
        self.library = library

    @property
    def bytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def reset(self) -> None:
        """Demote persisting lines (a host call: done before a unit's delay)."""
        if self.library is not None and not self.library.emulated:
            self.library.check(self.library.lib.chz_l2_reset(), "resetting persisting L2 lines")

    def flush(self) -> None:
        """Stream-ordered device work: write, then read, a buffer twice the L2 size."""
        self.buffer.fill_(1.0)                                       # write: evicts every other line
        torch.sum(self.buffer, dim=0, out=self.sink)                 # read: evicts the dirty lines

    def __call__(self) -> None:
        self.reset()
        self.flush()


Batch = tuple[torch.Tensor, torch.Tensor]  # (mapped indices, offsets) of one table


def preallocate(kernels: Sequence[TableKernel], batches: Sequence[Sequence[Batch]]) -> list[BagOutputs | None]:
    """Output buffers per table, sized for the largest batch, so no allocation happens
    while a batch is enqueued (torch's own kernel allocates its output itself)."""
    out: list[BagOutputs | None] = []
    for t, tk in enumerate(kernels):
        if getattr(tk, "library", None) is None:
            out.append(None)
            continue
        dev = tk.weight.device
        B = max(int(row[t][1].numel()) for row in batches)
        N = max(int(row[t][0].numel()) for row in batches)
        out.append(BagOutputs(torch.empty(B, tk.dim, dtype=torch.float32, device=dev),
                              torch.empty(N, dtype=torch.int64, device=dev), torch.empty(B, dtype=torch.int64, device=dev)))
    return out


def time_point(kernels: Sequence[TableKernel], batches: Sequence[Sequence[Batch]], mode: str, bench: BenchConfig,
               flusher: L2Flusher | None = None, outputs: Sequence[BagOutputs | None] | None = None,
               clock: DeviceClock | None = None, max_sm_clock_MHz: float | None = None) -> dict[str, Any]:
    """Time `kernels` (one per table) over `batches[b][t]` in `mode` ('steady' or 'cold').

    Returns per-repetition batch times (kernel and pre-pass, microseconds; each with
    the host's enqueue time, the device's launch gaps, the delay and whether it was
    host-gap-free), per-table means, Stats of the batch time over the gap-free
    repetitions, and the timing method.
    """
    if mode not in ("steady", "cold"):
        raise ValueError(f"unknown mode {mode}")
    clock = clock or clock_for(kernels[0].weight.device, max_sm_clock_MHz)
    has_prepass = any(k.hot_rows is not None and len(k.hot_rows) for k in kernels)
    T = len(kernels)
    outputs = list(outputs) if outputs is not None else preallocate(kernels, batches)
    delay_us = FIRST_DELAY_US

    # steady: the whole batch is one unit behind one delay (tables back to back); cold:
    # each launch is its own unit, the persisting-line reset (a host call) before its delay
    units = [list(range(T))] if mode == "steady" else [[t] for t in range(T)]

    def one_batch(b: int) -> dict[str, Any]:
        """Enqueue each unit of one batch behind a delay; wait; read its events."""
        k_times, p_times, f_times = [0.0] * T, [0.0] * T, [0.0] * T
        host = spin = gap = 0.0
        gap_free = clock.method == METHOD_DELAY
        for unit in units:
            clock.sync()
            if mode == "cold" and flusher is not None:
                flusher.reset()
            d0 = clock.mark()
            clock.delay(delay_us)
            d1 = clock.mark()
            h0 = clock.host_us()
            marks = []
            for t in unit:
                idx, off = batches[b % len(batches)][t]
                f0 = clock.mark()
                if mode == "cold" and flusher is not None:
                    flusher.flush()
                p0 = clock.mark()
                kernels[t].prepass()
                k0 = clock.mark()
                kernels[t].launch(idx, off, out=outputs[t])
                k1 = clock.mark()
                marks.append((t, f0, p0, k0, k1))
            h1 = clock.host_us()
            clock.sync()
            unit_spin = clock.elapsed_us(d0, d1)
            work = 0.0
            for t, f0, p0, k0, k1 in marks:
                f_times[t], p_times[t], k_times[t] = (clock.elapsed_us(f0, p0), clock.elapsed_us(p0, k0),
                                                      clock.elapsed_us(k0, k1))
                work += f_times[t] + p_times[t] + k_times[t]
            gap += max(clock.elapsed_us(d1, marks[-1][4]) - work, 0.0)
            host += h1 - h0
            spin += unit_spin
            gap_free = gap_free and (h1 - h0) < unit_spin
        return {"k": k_times, "p": p_times if has_prepass else [0.0] * T, "host_enqueue_us": host,
                "spin_us": spin, "launch_gap_us": gap, "gap_free": gap_free}

    for b in range(bench.warmup):
        w = one_batch(b)
        delay_us = min(MAX_DELAY_US, max(delay_us, 2 * w["host_enqueue_us"] + 50.0))
    reps: list[dict[str, Any]] = []
    per_table, per_table_all = np.zeros(T), np.zeros(T)
    start = time.perf_counter()
    kernel_batch: list[float] = []
    host_bound = 0
    while True:
        r = len(reps)
        res = one_batch(bench.warmup + r)
        counts = res["gap_free"] or clock.method == METHOD_WALL
        reps.append({"mode": mode, "rep": r, "kernel_us": sum(res["k"]), "prepass_us": sum(res["p"]),
                     "host_enqueue_us": res["host_enqueue_us"], "launch_gap_us": res["launch_gap_us"],
                     "delay_us": delay_us, "spin_us": res["spin_us"], "gap_free": bool(res["gap_free"]),
                     "counted": bool(counts)})
        per_table_all += res["k"]
        if counts:
            per_table += res["k"]
            kernel_batch.append(sum(res["k"]))
        else:  # the host was still enqueueing when the spin ended: wait longer next time
            host_bound += 1
            delay_us = min(MAX_DELAY_US, max(2 * delay_us, 2 * res["host_enqueue_us"] + 50.0))
        n = len(kernel_batch)
        if n >= bench.max_reps or len(reps) >= 2 * bench.max_reps:
            break
        if n >= bench.min_reps:
            if summarize(kernel_batch, bench.ci_target).stable or time.perf_counter() - start > bench.budget_s:
                break
        elif len(reps) >= 2 and time.perf_counter() - start > 4 * bench.budget_s:
            break  # a pathologically slow point: keep what we have
    counted = [r for r in reps if r["counted"]]
    gap_free = bool(counted) and clock.method == METHOD_DELAY
    if not counted:  # never gap-free (a host call that synchronizes?): keep the reps, flagged
        counted = reps
        kernel_batch = [r["kernel_us"] for r in reps]
        per_table = per_table_all
    kernel = summarize(kernel_batch, bench.ci_target)
    prepass = summarize([r["prepass_us"] for r in counted], bench.ci_target)
    total = summarize([r["kernel_us"] + r["prepass_us"] for r in counted], bench.ci_target)
    launches = T * (2 if has_prepass else 1)
    timing = {"method": clock.method, "gap_free": gap_free, "delay_us": delay_us, "host_bound_reps": host_bound,
              "host_enqueue_per_launch_us": float(np.mean([r["host_enqueue_us"] for r in reps])) / launches,
              "launch_gap_per_launch_us": (float(np.mean([r["launch_gap_us"] for r in counted])) / launches
                                           if counted else float("nan")),
              "flush_bytes": flusher.bytes if (flusher is not None and mode == "cold") else 0}
    return {"mode": mode, "tables": T, "repetitions": reps,
            "per_table_mean_us": list(per_table / max(len(counted), 1)),
            "kernel": kernel, "prepass": prepass if has_prepass else None, "with_prepass": total,
            "timing": timing, "seconds": time.perf_counter() - start}
