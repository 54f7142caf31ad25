"""Timing methodology without a GPU: a simulated in-order device stream shows that the
events bracket device work only (the host's launch cost never lands between them), and
the emulation backend runs the same loop end to end with a clean-L2 flush."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch

from characterize.config import BenchConfig
from characterize.errors import MeasurementError
from characterize.kernels.library import bind
from characterize.measure.timing import FIRST_DELAY_US, METHOD_DELAY, METHOD_WALL, L2Flusher, time_point


class SimulatedStream:
    """One CUDA stream on a simulated clock. Host calls cost host time; enqueued work
    starts once it is submitted and everything before it is done; an event's timestamp
    is when the stream reaches it. After a kernel and its closing event the stream idles
    `gap_us` (the device's turnaround between launches); a kernel that follows an event
    (not a kernel) waits `front_us` more (the launch front-end, hidden behind a kernel
    queued right before it). `spins` False models a device whose delay does not delay
    (eager timing)."""

    method = METHOD_DELAY

    def __init__(self, gap_us: float = 0.0, call_us: float = 2.0, spins: bool = True, front_us: float = 0.0):
        self.host = 0.0
        self.free = 0.0
        self.gap_us, self.call_us, self.spins, self.front_us = gap_us, call_us, spins, front_us
        self.log: list[str] = []   # what reached the device, in order

    def _submit(self, what: str, duration: float) -> float:
        turnaround = self.log[-2:] == ["kernel", "event"]
        # the launch front-end: hidden behind a kernel queued right before, exposed after an event
        front = self.front_us if what == "kernel" and self.log[-1:] != ["kernel"] else 0.0
        start = max(self.host, self.free + (self.gap_us if turnaround else 0.0)) + front
        self.free = start + duration
        self.log.append(what)
        return start

    def mark(self) -> float:
        self.host += self.call_us
        return self._submit("event", 0.0)

    def elapsed_us(self, start: float, end: float) -> float:
        return end - start

    def delay(self, us: float) -> None:
        self.host += self.call_us
        self._submit("delay", us if self.spins else 0.0)

    def host_us(self) -> float:
        return self.host

    def sync(self) -> None:
        self.host = max(self.host, self.free)

    def kernel(self, host_us: float, device_us: float) -> None:
        self.host += host_us        # Python + ctypes + argument marshalling
        self._submit("kernel", device_us)


class SimulatedKernel:
    """A table launch as the timing loop sees it: host cost, then device work."""

    def __init__(self, stream: SimulatedStream, device_us: float, host_us: float = 18.0):
        self.stream, self.device_us, self.host_us = stream, device_us, host_us
        self.hot_rows, self.library, self.weight = None, None, torch.empty(0)

    def prepass(self) -> None:
        pass

    def launch(self, idx, off, out=None) -> None:
        self.stream.kernel(self.host_us, self.device_us)


DEVICE_US = [7.0, 9.5, 11.0, 8.0, 6.5]
BATCHES = [[(torch.zeros(1), torch.zeros(1))] * len(DEVICE_US)]
BENCH = BenchConfig(warmup=1, min_reps=3, max_reps=5, ci_target=0.5, budget_s=5.0, modes=("steady",))


def _time(stream: SimulatedStream, bench: BenchConfig = BENCH, host_us: float = 18.0, T: int | None = None):
    kernels = [SimulatedKernel(stream, us, host_us) for us in (DEVICE_US if T is None else [DEVICE_US[0]] * T)]
    return time_point(kernels, [[(torch.zeros(1), torch.zeros(1))] * len(kernels)], "steady", bench,
                      outputs=[None] * len(kernels), clock=stream)


def test_events_bracket_device_work_only_although_each_launch_costs_more_host_time():
    res = _time(SimulatedStream(gap_us=1.0))
    # 18 us of host time per launch, 6.5-11 us on the device: one event pair around the
    # batch sees the device time of the T launches exactly; per table is its share
    T = len(DEVICE_US)
    assert res["kernel"].mean == pytest.approx(sum(DEVICE_US))
    assert res["per_table_mean_us"] == pytest.approx([sum(DEVICE_US) / T] * T)
    tm = res["timing"]
    assert tm["method"] == METHOD_DELAY and tm["gap_free"] and tm["host_bound_reps"] == 0
    assert tm["unit"] == "batch of T launches"
    assert all(r["gap_free"] and r["counted"] for r in res["repetitions"])
    # launch overhead apart: the host's enqueue cost (T launches and 3 events per batch) and,
    # from the per-launch diagnostic, each table's own time and the device's gap between kernels
    assert tm["host_enqueue_per_launch_us"] == pytest.approx(18.0 + 3 * 2.0 / T)
    assert res["per_launch_table_us"] == pytest.approx(DEVICE_US)
    assert tm["launch_gap_per_launch_us"] == pytest.approx(1.0 * (T - 1) / T)


def test_one_event_pair_per_batch_exposes_the_launch_front_end_once_not_once_per_launch():
    T = len(DEVICE_US)
    res = _time(SimulatedStream(front_us=2.0))
    assert res["kernel"].mean / T == pytest.approx(sum(DEVICE_US) / T + 2.0 / T)   # once per batch
    assert res["per_launch_table_us"] == pytest.approx([d + 2.0 for d in DEVICE_US])   # the diagnostic: each


def test_without_a_delay_host_gaps_inflate_the_times_and_are_caught():
    res = _time(SimulatedStream(spins=False))
    assert not res["timing"]["gap_free"] and res["timing"]["host_bound_reps"] == len(res["repetitions"])
    # what an eager harness would have reported: host time counted as kernel time
    assert res["kernel"].mean > sum(DEVICE_US) + 10 * len(DEVICE_US)


class SimulatedCache:
    """A cache's bookkeeping as the timing loop sees it: its phases of the last batch."""

    def __init__(self):
        from types import SimpleNamespace

        self.stats = [SimpleNamespace(dedup_us=3.0, transfer_us=5.0, lookup_us=7.0)]


class SimulatedCachedKernel(SimulatedKernel):
    """The cache variant: host work that waits for the device before its lookup."""

    def __init__(self, stream: SimulatedStream, device_us: float):
        super().__init__(stream, device_us)
        self.cache = SimulatedCache()

    def launch(self, idx, off, out=None) -> None:
        self.stream.sync()           # unique ids and slot maps read back on the host
        self.stream.host += 30.0     # the host's share of the batch
        self.stream.kernel(self.host_us, self.device_us)


def test_the_cache_is_timed_as_it_runs_without_a_delay_kernel():
    stream = SimulatedStream()
    kernels = [SimulatedCachedKernel(stream, d) for d in DEVICE_US]
    res = time_point(kernels, BATCHES, "steady", BENCH, outputs=[None] * len(kernels), clock=stream)
    tm = res["timing"]
    assert tm["method"] == "cache-as-run" and tm["delay_us"] == 0 and tm["host_bound_reps"] == 0
    assert all(r["counted"] and r["delay_us"] == 0 for r in res["repetitions"])
    assert "delay" not in stream.log   # never a spin to wait out, let alone a doubled one
    assert res["kernel"].mean > sum(DEVICE_US) + 30 * len(DEVICE_US)   # the host work is part of its cost
    assert res["phases_per_table_us"] == {"dedup": 3.0, "transfer": 5.0, "lookup": 7.0}


def test_a_delay_too_short_for_the_host_is_doubled_and_its_repetitions_left_out():
    bench = BenchConfig(warmup=0, min_reps=3, max_reps=6, ci_target=0.5, budget_s=5.0, modes=("steady",))
    res = _time(SimulatedStream(), bench, T=20)   # 20 x 26 us of host time > the first 200 us delay
    reps = res["repetitions"]
    assert reps[0]["delay_us"] == FIRST_DELAY_US and not reps[0]["counted"]
    assert res["timing"]["host_bound_reps"] >= 1 and res["timing"]["gap_free"]
    counted = [r for r in reps if r["counted"]]
    assert len(counted) >= 3 and all(r["delay_us"] > r["host_enqueue_us"] for r in counted)
    assert res["kernel"].n == len(counted) and res["kernel"].mean == pytest.approx(20 * DEVICE_US[0])


class PrepassKernel(SimulatedKernel):
    """An l2p table: a 1 us pre-pass before each launch in the batch; the pre-pass timed
    alone afterwards takes the next of `alone_us` (a noisy device makes it slower)."""

    def __init__(self, stream: SimulatedStream, device_us: float, alone_us):
        super().__init__(stream, device_us)
        self.variant, self.hot_rows = SimpleNamespace(l2="prefetch"), [0]
        self.calls, self.alone = 0, alone_us

    def prepass(self) -> None:
        self.calls += 1
        self.stream.kernel(2.0, 1.0 if self.calls % 2 else next(self.alone))


def _time_prepass(alone_us) -> dict:
    stream = SimulatedStream()
    return time_point([PrepassKernel(stream, 7.0, alone_us)], [[(torch.zeros(1), torch.zeros(1))]], "steady", BENCH,
                      outputs=[None], clock=stream)


def test_a_repetition_whose_prepass_alone_outlasts_its_batch_is_not_counted():
    res = _time_prepass(itertools.cycle([1.0, 500.0]))   # every other pre-pass alone: 500 us of noise
    reps = res["repetitions"]
    assert any(r["kernel_us"] < 0 and not r["counted"] for r in reps)
    assert res["kernel"].mean == pytest.approx(7.0) and res["per_table_mean_us"] == pytest.approx([7.0])


def test_a_point_whose_every_subtraction_is_negative_is_an_error_not_a_negative_latency():
    with pytest.raises(MeasurementError, match="pre-passes timed alone took at least as long as the batch"):
        _time_prepass(itertools.repeat(500.0))


def test_emulated_bench_runs_cold_mode_with_a_write_then_read_flush():
    g = torch.Generator().manual_seed(3)
    weight = torch.rand(1009, 68, generator=g)
    idx = torch.randint(0, 1009, (301,), generator=g)
    off = torch.tensor([0, 5, 5, 120, 233])
    kernels = [bind("base", weight.clone(), trace=idx, backend="emulate") for _ in range(2)]
    flusher = L2Flusher(torch.device("cpu"), 64 * 1024)
    bench = BenchConfig(warmup=1, min_reps=2, max_reps=3, ci_target=0.5, budget_s=5.0, modes=("cold",))
    res = time_point(kernels, [[(idx, off), (idx, off)]], "cold", bench, flusher)
    assert res["timing"]["method"] == METHOD_WALL and not res["timing"]["gap_free"]
    assert res["timing"]["flush_bytes"] == 2 * 64 * 1024 and res["kernel"].n >= 2
    assert all(r["counted"] for r in res["repetitions"])


def test_the_cold_flush_writes_then_reads_twice_the_l2_so_no_dirty_line_is_left():
    flusher = L2Flusher(torch.device("cpu"), 4096)
    flusher.buffer.zero_()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        flusher.flush()
    ops = [(e.name, e.input_shapes[0]) for e in prof.events() if e.cpu_parent is None]
    n = flusher.buffer.numel()
    assert ops == [("aten::fill_", [n]), ("aten::sum", [n])], ops   # the whole buffer, the read last
    assert flusher.bytes == 2 * 4096 and float(flusher.sink) == flusher.buffer.numel()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the delay kernel and events run there")
def test_on_a_gpu_every_counted_repetition_is_free_of_host_gaps():
    from characterize.hardware.devices import devices

    g = torch.Generator(device="cuda").manual_seed(3)
    weight = torch.rand(100_003, 128, generator=g, device="cuda")
    idx = torch.randint(0, 100_003, (127 * 20,), generator=g, device="cuda")
    off = torch.arange(0, 127 * 20, 20, device="cuda")
    kernels = [bind(v, weight.clone(), trace=idx, backend="cuda") for v in ("base", "l2p", "warp")]
    bench = BenchConfig(warmup=2, min_reps=5, max_reps=20, ci_target=0.05, budget_s=5.0, modes=("steady", "cold"))
    flusher = L2Flusher(weight.device, devices()[0].l2_bytes, kernels[0].library)
    for mode in bench.modes:
        res = time_point(kernels, [[(idx, off)] * 3], mode, bench, flusher)
        assert res["timing"]["method"] == METHOD_DELAY and res["timing"]["gap_free"], res["timing"]
        counted = [r for r in res["repetitions"] if r["counted"]]
        assert counted and all(r["host_enqueue_us"] < r["spin_us"] for r in counted)
        assert res["timing"]["host_enqueue_per_launch_us"] > 0 and all(t > 0 for t in res["per_table_mean_us"])
