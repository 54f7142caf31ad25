"""Measure stage, timing: CUDA-event timing of one (variant, dataset) point, with statistics
that say when a measurement is stable.

A repetition is one inference batch: the variant's lookup kernel launched once per
table, in table order (steady mode: what the L2 sees in production, and how the
paper measured), or with L2 flushed before every launch (cold mode).

Steady mode brackets the whole batch of T launches with one event pair and reports
per table = batch / T: an event pair around each launch would add the launch
front-end (1-3 us) to kernels of 8-30 us. Pre-pass variants (l2p, combined) run
their T pre-passes alone behind a second event pair right after, so the pre-pass can
be reported excluded (as the paper did: batch minus pre-passes) and included (the
batch). A few repetitions with one event pair per launch follow, as a diagnostic
(`per_launch_us`, to set beside ncu's gpu__time_duration). Cold mode flushes the L2
before each launch, so each launch is its own unit with its own pair.

Events must bracket device work only. A Python/ctypes launch costs 10-20 us of host
time, as much as a whole table launch on an H100; timed eagerly, that idle time
would count as kernel time. So each unit is queued behind a device-side delay
kernel: the GPU spins while the host enqueues every flush, pre-pass, launch and
event of the unit, then runs them back to back. A repetition counts only when the
host finished enqueueing before the spin ended (host enqueue time < the spin's own
event-measured duration, a sufficient condition); otherwise the delay doubles and
the repetition is recorded as host-bound and left out of the statistics. Nothing that
changes device state runs in a unit: l2w's set-aside and windows are set once per
point (kernels.library.device_state), its launches carry their window.

The cache variant's batch does host work that waits for the device (unique ids, slot
maps, the misses' copy): it is timed as it runs, one event pair around the batch with
no delay kernel, with the cache's own phase split (dedup/map, transfer, lookup).

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
from characterize.errors import MeasurementError
from characterize.kernels.library import BagOutputs, TableKernel

# two-sided 95% Student-t quantiles for 1..30 degrees of freedom; 1.96 beyond
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)

#: timing methods recorded with every point
METHOD_DELAY = "delay-kernel"          # events bracket device work only
METHOD_WALL = "wall-clock-emulation"   # CPU emulation: checks the harness, not a GPU timing
METHOD_CACHE = "cache-as-run"          # the cache variant: its host work inside the batch, no delay kernel

#: what one event pair brackets, recorded with every point
UNIT_BATCH = "batch of T launches"
UNIT_LAUNCH = "one launch after its own L2 flush"

#: batches timed with one event pair per launch after the timed repetitions (steady mode): a diagnostic
PER_LAUNCH_REPS = 3

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

    Warm-up batches are batches[0 .. bench.warmup-1]; repetitions run the batches after
    them in turn (never a warm-up batch while there are others). Returns per-repetition
    times (batch, kernel = batch minus pre-passes, pre-pass; microseconds; each with
    the host's enqueue time, the delay and whether it was host-gap-free), Stats of the
    kernel time per batch over the gap-free repetitions, per-table means (cold: each
    launch's; steady: the batch's share), the per-launch diagnostic, and the timing
    method and unit.
    """
    if mode not in ("steady", "cold"):
        raise ValueError(f"unknown mode {mode}")
    clock = clock or clock_for(kernels[0].weight.device, max_sm_clock_MHz)
    has_prepass = any(getattr(k, "variant", None) is not None and k.variant.l2 == "prefetch"
                      and k.hot_rows is not None and len(k.hot_rows) for k in kernels)
    cached = [getattr(k, "cache", None) for k in kernels]
    has_cache = any(c is not None for c in cached)
    T, n = len(kernels), len(batches)
    outputs = list(outputs) if outputs is not None else preallocate(kernels, batches)
    method = METHOD_CACHE if has_cache and clock.method == METHOD_DELAY else clock.method
    use_delay = method == METHOD_DELAY
    delay_us = FIRST_DELAY_US
    phases = np.zeros(3)   # the cache's dedup/map, transfer, lookup per batch, summed over counted reps

    def batch_index(i: int) -> int:
        return i % n

    def delayed() -> tuple[Any, Any]:
        d0 = clock.mark()
        if use_delay:
            clock.delay(delay_us)
        return d0, clock.mark()

    def steady_batch(b: int) -> dict[str, Any]:
        """One event pair around the batch of T (pre-pass + lookup) launches; the T
        pre-passes alone follow behind a second pair."""
        clock.sync()
        d0, d1 = delayed()
        h0 = clock.host_us()
        e0 = clock.mark()
        for t in range(T):
            kernels[t].prepass()
            kernels[t].launch(*batches[b][t], out=outputs[t])
        e1 = clock.mark()
        if has_prepass:
            for t in range(T):
                kernels[t].prepass()
        e2 = clock.mark()
        h1 = clock.host_us()
        clock.sync()
        spin = clock.elapsed_us(d0, d1) if use_delay else 0.0
        batch_us = clock.elapsed_us(e0, e1)
        pre = clock.elapsed_us(e1, e2) if has_prepass else 0.0
        split = [0.0, 0.0, 0.0]
        for c in cached:
            if c is not None and c.stats:
                last = c.stats[-1]
                split = [split[0] + last.dedup_us, split[1] + last.transfer_us, split[2] + last.lookup_us]
        return {"batch_us": batch_us, "prepass_us": pre, "kernel_us": batch_us - pre, "host_enqueue_us": h1 - h0,
                "spin_us": spin, "gap_free": use_delay and (h1 - h0) < spin, "phases": split,
                "k": [(batch_us - pre) / T] * T, "positive": batch_us - pre > 0}

    def per_launch_batch(b: int, flush: bool) -> dict[str, Any]:
        """Each launch bracketed by its own events (cold mode: after its own flush, each
        table its own unit behind its own delay; steady: the per-launch diagnostic)."""
        k_times, p_times = [0.0] * T, [0.0] * T
        host = spin = gap = 0.0
        gap_free = use_delay
        units = [[t] for t in range(T)] if flush else [list(range(T))]
        for unit in units:
            clock.sync()
            if flush and flusher is not None:
                flusher.reset()
            d0, d1 = delayed()
            h0 = clock.host_us()
            marks = []
            for t in unit:
                f0 = clock.mark()
                if flush and flusher is not None:
                    flusher.flush()
                p0 = clock.mark()
                kernels[t].prepass()
                k0 = clock.mark()
                kernels[t].launch(*batches[b][t], out=outputs[t])
                k1 = clock.mark()
                marks.append((t, f0, p0, k0, k1))
            h1 = clock.host_us()
            clock.sync()
            unit_spin = clock.elapsed_us(d0, d1) if use_delay else 0.0
            work = 0.0
            for t, f0, p0, k0, k1 in marks:
                f, p_times[t], k_times[t] = (clock.elapsed_us(f0, p0), clock.elapsed_us(p0, k0),
                                             clock.elapsed_us(k0, k1))
                work += f + p_times[t] + k_times[t]
            gap += max(clock.elapsed_us(d1, marks[-1][4]) - work, 0.0)
            host += h1 - h0
            spin += unit_spin
            gap_free = gap_free and (h1 - h0) < unit_spin
        kernel = sum(k_times)
        pre = sum(p_times) if has_prepass else 0.0
        return {"batch_us": kernel + pre, "prepass_us": pre, "kernel_us": kernel, "host_enqueue_us": host,
                "spin_us": spin, "gap_free": gap_free, "launch_gap_us": gap, "k": k_times, "phases": [0.0] * 3}

    def one_batch(b: int) -> dict[str, Any]:
        return steady_batch(b) if mode == "steady" else per_launch_batch(b, flush=True)

    for w in range(bench.warmup):
        res = one_batch(batch_index(w))
        if use_delay:
            delay_us = min(MAX_DELAY_US, max(delay_us, 2 * res["host_enqueue_us"] + 50.0))
    reps: list[dict[str, Any]] = []
    per_table, per_table_all = np.zeros(T), np.zeros(T)
    start = time.perf_counter()
    kernel_batch: list[float] = []
    host_bound = 0
    while True:
        r = len(reps)
        b = timed_batch_index(bench.warmup, n, r)
        res = one_batch(b)
        # steady mode with pre-passes subtracts the pre-passes timed alone: a difference at or below
        # zero (the pre-passes alone slower than the batch with them) is noise, never counted
        positive = res.get("positive", True)
        counts = (res["gap_free"] or not use_delay) and positive
        reps.append({"mode": mode, "rep": r, "batch": b, "kernel_us": res["kernel_us"],
                     "prepass_us": res["prepass_us"], "batch_us": res["batch_us"],
                     "host_enqueue_us": res["host_enqueue_us"], "delay_us": delay_us if use_delay else 0.0,
                     "spin_us": res["spin_us"], "gap_free": bool(res["gap_free"]), "counted": bool(counts),
                     **({"launch_gap_us": res["launch_gap_us"]} if "launch_gap_us" in res else {}),
                     **({"dedup_us": res["phases"][0], "transfer_us": res["phases"][1],
                         "lookup_us": res["phases"][2]} if has_cache else {})})
        if positive:
            per_table_all += res["k"]
        if counts:
            per_table += res["k"]
            kernel_batch.append(res["kernel_us"])
            phases += res["phases"]
        elif positive:  # the host was still enqueueing when the spin ended: wait longer next time
            host_bound += 1
            delay_us = min(MAX_DELAY_US, max(2 * delay_us, 2 * res["host_enqueue_us"] + 50.0))
        k = len(kernel_batch)
        if k >= bench.max_reps or len(reps) >= 2 * bench.max_reps:
            break
        if k >= bench.min_reps:
            if summarize(kernel_batch, bench.ci_target).stable or time.perf_counter() - start > bench.budget_s:
                break
        elif len(reps) >= 2 and time.perf_counter() - start > 4 * bench.budget_s:
            break  # a pathologically slow point: keep what we have
    counted = [r for r in reps if r["counted"]]
    gap_free = bool(counted) and use_delay
    if not counted and not any(r["kernel_us"] > 0 for r in reps):
        raise MeasurementError(
            f"{mode} mode: in all {len(reps)} repetition(s) the pre-passes timed alone took at least as long as the "
            f"batch with them (batch minus pre-passes between {min(r['kernel_us'] for r in reps):.1f} and "
            f"{max(r['kernel_us'] for r in reps):.1f} us); the timing noise is larger than the kernel here, so no "
            "latency was recorded. Measure again on a quiet machine, or with more batches per repetition")
    if not counted:  # never gap-free (a host call that synchronizes?): keep the positive reps, flagged
        counted = [r for r in reps if r["kernel_us"] > 0]
        kernel_batch = [r["kernel_us"] for r in counted]
        per_table = per_table_all
    # the per-launch diagnostic: steady mode only (cold mode is timed per launch already)
    if mode == "steady":
        reps_diag = PER_LAUNCH_REPS if clock.method != METHOD_WALL else 1   # the emulator: the harness only
        diag = [per_launch_batch(timed_batch_index(bench.warmup, n, i), flush=False) for i in range(reps_diag)]
        launch_table = list(np.mean([d["k"] for d in diag], axis=0))
        launch_gap = float(np.mean([d["launch_gap_us"] for d in diag]))
    else:
        launch_table = list(per_table / max(len(counted), 1))
        launch_gap = float(np.mean([r.get("launch_gap_us", 0.0) for r in counted])) if counted else float("nan")
    kernel = summarize(kernel_batch, bench.ci_target)
    prepass = summarize([r["prepass_us"] for r in counted], bench.ci_target)
    total = summarize([r["batch_us"] for r in counted], bench.ci_target)
    launches = T * (2 if has_prepass else 1)
    timing = {"method": method, "unit": UNIT_BATCH if mode == "steady" else UNIT_LAUNCH, "gap_free": gap_free,
              "delay_us": delay_us if use_delay else 0.0, "host_bound_reps": host_bound,
              "host_enqueue_per_launch_us": float(np.mean([r["host_enqueue_us"] for r in reps])) / launches,
              "launch_gap_per_launch_us": launch_gap / launches,
              "per_launch_us": float(np.mean(launch_table)),
              "flush_bytes": flusher.bytes if (flusher is not None and mode == "cold") else 0}
    out = {"mode": mode, "tables": T, "repetitions": reps,
           "per_table_mean_us": list(per_table / max(len(counted), 1)), "per_launch_table_us": launch_table,
           "kernel": kernel, "prepass": prepass if has_prepass else None, "with_prepass": total,
           "timing": timing, "seconds": time.perf_counter() - start}
    if has_cache:
        out["phases_per_table_us"] = dict(zip(("dedup", "transfer", "lookup"),
                                              (phases / max(len(counted), 1) / T).tolist()))
    return out


def timed_batch_index(warmup: int, batches: int, rep: int) -> int:
    """The batch repetition `rep` runs: the batches after the warm-up ones, in turn
    (all of them in turn when there are no others)."""
    return warmup + rep % (batches - warmup) if batches > warmup else rep % batches
