"""Measure stage, inside a worker process: the code that touches the GPU.

`python -m characterize.measure.worker bench RUN_DIR --point VARIANT:DATASET ...` times
points and writes each one into the run directory as soon as it is finished;
`python -m characterize.measure.worker profile RUN_DIR --point V:D [--point V2:D2 ...]` (or `--variant V --dataset D ...`)
is the program Nsight Compute launches for the points of a profile: for each, what bench
does before its first timed batch (the device state, the check, the same warm-up
batches and hot rows), then that batch's first tables wrapped in NVTX ranges named
chz/<variant>/<dataset>/<table> inside an outer range "chz-profile" that the ncu command
line selects. Workers are separate processes so that a kernel fault or a kill loses at
most the point in flight (see runner.py). A bench worker dies with the runner that
started it (lifeline.py): the kernel's parent-death signal when the runner is its
direct parent, and under `--supervisor PID` a watchdog on the stdin pipe the runner
holds, so a killed `bench` never leaves a worker measuring.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch

from characterize.config import QUANTIZED, ExperimentConfig, WorkloadConfig
from characterize.errors import (
    CharacterizeError,
    CheckMismatch,
    ConfigError,
    FileSystemError,
    KernelLaunchError,
    describe_os_error,
    escape_text,
)
from characterize.hardware.devices import require_gpu, sample_clocks, throttle_verdict
from characterize.hardware.specs import REFERENCE_ARCH, gpu_spec
from characterize.kernels.check import tolerance
from characterize.kernels.library import (
    BagOutputs,
    QuantizedTable,
    TableBatch,
    TableKernel,
    as_dtype,
    bind,
    bind_tables,
    check_indices,
    close_all,
    dequantize,
    device_state,
)
from characterize.kernels.registry import get_variant, register_user, uvm_mode
from characterize.measure.lifeline import supervise, whole
from characterize.measure.timing import L2Flusher, preallocate, time_point, timed_batch_index
from characterize.memory import check_memory
from characterize.store import RunDir, load_run, point_key
from characterize.units import format_bytes
from characterize.workloads.traces import load_dataset

PROFILE_RANGE = "chz-profile"
#: the kernels ncu profiles (-k regex): ours, PyTorch's embedding-bag kernels (which the
#: correctness check's float64 reference launches too) and FBGEMM's TBE forward (training
#: and inference: split_embedding_codegen_forward_*, nbit::INT8_split_embedding_codegen_forward_*;
#: its bounds-check kernel is timed by bench but not profiled)
KERNEL_FILTER = "chz_|EmbeddingBag|split_embedding_codegen_forward"
#: what torch.nn.functional.embedding_bag launches on the GPU for a forward sum/mean
#: (the torch variant's lookup and the check's float64 reference)
TORCH_EMBEDDING_BAG_KERNEL = "EmbeddingBag_updateOutputKernel_sum_mean"
#: a kernel of one's own in variant_launches: its name is whatever its [variants.NAME] kernel pattern matches
USER_KERNEL_LAUNCH = "<your kernel>"
#: what FBGEMM's TBE forward launches for the lookup (the filter's name for it)
FBGEMM_FORWARD_KERNEL = "split_embedding_codegen_forward"
#: bench never locks clocks: it runs at the GPU's own clocks, sampled by NVML around each
#: point; profile follows the same policy by default (ProfileConfig.clock_control "none")
BENCH_CLOCK_CONTROL = "none"
INFLIGHT = ".inflight"
#: a bench worker's heartbeat file, touched every HEARTBEAT_S seconds (start_heartbeat)
HEARTBEAT = ".heartbeat"
HEARTBEAT_S = 1.0
#: how the profile target starts the line it prints after each point (the runner follows them)
PROFILED = "profiled"
EXIT_CUDA_ERROR = 3  # the CUDA context may be poisoned: the supervisor starts a fresh worker


def nvtx_name(variant: str, dataset: str, table: int) -> str:
    return f"chz/{variant}/{dataset}/{table}"


@contextmanager
def nvtx_range(name: str) -> Iterator[None]:
    """An NVTX push/pop range on the GPU; on the CPU backend the range is printed, so
    orchestration tests can see the scoping."""
    if torch.cuda.is_available():
        torch.cuda.nvtx.range_push(name)
        try:
            yield
        finally:
            torch.cuda.nvtx.range_pop()
    else:
        print(f"NVTX push {name}", flush=True)
        try:
            yield
        finally:
            print(f"NVTX pop {name}", flush=True)


def backend_from_env(explicit: str | None = None) -> str:
    return explicit or os.environ.get("CHARACTERIZE_BACKEND") or ("cuda" if torch.cuda.is_available() else "emulate")


@dataclass
class Session:
    """Tables and traces of one experiment on one device."""

    exp: ExperimentConfig
    workload: WorkloadConfig
    backend: str
    device: torch.device
    tables: list[torch.Tensor]
    gpu: Any  # GpuSpec
    device_index: int | None = None           # the GPU's CUDA index, None on the CPU backend
    identity: dict[str, str] | None = None    # GpuSpec field -> where its value came from
    nvml_index: int | None = None             # the same GPU's NVML index (matched by UUID), for clock samples

    @classmethod
    def open(cls, exp: ExperimentConfig, backend: str, batches: int | None = None) -> "Session":
        for name, kernel in exp.user_kernels.items():   # the experiment's kernels of one's own, as variants
            register_user(name, kernel)
        wl = exp.workload if batches is None else exp.workload.replace(batches=batches)
        index, identity, nvml_index = None, None, None
        if backend == "cuda":
            info = require_gpu()
            gpu, device = info.spec(), torch.device("cuda", info.index)
            index, identity, nvml_index = info.index, info.provenance(), info.nvml_index
        else:
            gpu, device = gpu_spec(exp.archs[0] if exp.archs else REFERENCE_ARCH), torch.device("cpu")
        wl.validate(gpu=gpu if backend == "cuda" else None)
        if device.type == "cpu":  # emulation holds on the host what a GPU would, plus the generator's temporary
            check_memory(wl.device_bytes() + wl.table_bytes,
                         f"emulating {wl.T} table(s) of {format_bytes(wl.table_bytes)} on the CPU", "lower T, E or D")
        elif any(get_variant(v).host != "none" for v in exp.variants):   # cache/uvm keep their tables on the host
            check_memory(wl.T * wl.table_bytes + wl.table_bytes,
                         f"keeping {wl.T} table(s) of {format_bytes(wl.table_bytes)} in host memory (cache, uvm)",
                         "lower T, E or D")
        g = torch.Generator(device=device).manual_seed(wl.seed)
        tables = [as_dtype(torch.rand(wl.E, wl.D, generator=g, device=device) - 0.5, wl.dtype) for _ in range(wl.T)]
        return cls(exp, wl, backend, device, tables, gpu, index, identity, nvml_index)

    def dataset(self, name: str) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
        """batches[b][t] = (indices, offsets) on the device, checked against E."""
        ds = load_dataset(name, self.workload, tables=range(self.workload.T))
        out: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
        for b in range(min(tr.batches for tr in ds.tables)):
            row = []
            for t, tr in enumerate(ds.tables):
                idx, off = tr.batch(b)
                idx_t = torch.from_numpy(idx.copy()).to(self.device)
                check_indices(idx_t, self.workload.E, f"{name} table {t} batch {b}")
                row.append((idx_t, torch.from_numpy(off.copy()).to(self.device)))
            out.append(row)
        return out

    @property
    def warmup(self) -> int:
        """Warm-up batches before anything is measured, the same for bench and profile."""
        return self.exp.bench.warmup

    def bind(self, variant: str, batches: list[list[tuple[torch.Tensor, torch.Tensor]]]):
        """One TableKernel per table. Hot rows (l2p, l2w, combined) and the cache's
        warm-up frequencies come from the warm-up batches only, never from a timed one,
        so bench and profile measure the same hot set."""
        v = get_variant(variant)
        warm = min(self.warmup, len(batches))
        if warm == 0 and (v.l2 != "none" or v.host == "cache"):
            raise ConfigError(f"{variant} takes its hot rows from the warm-up batches, and bench.warmup is 0; "
                              "set bench.warmup to 1 or more")
        kernels: list[TableKernel] = []
        try:
            for t, weight in enumerate(self.tables):
                trace = torch.cat([batches[b][t][0] for b in range(warm)]) if warm else None
                kernels.append(bind(variant, weight, trace=trace, params=self.exp.params_for(variant),
                                    mode=self.workload.mode, backend=self.backend, gpu=self.gpu))
        except BaseException:
            close_all(kernels)   # l2w reorders tables in place: put back what was bound
            raise
        mapped = [[(kernels[t].map_indices(idx), off) for t, (idx, off) in enumerate(row)] for row in batches]
        return kernels, mapped


def bytes_per_table(batches: list[list[tuple[torch.Tensor, torch.Tensor]]], row_bytes: int) -> float:
    """Effective bytes of one table launch, averaged over batches: rows gathered +
    indices + offsets + output (what the kernel must move at least once)."""
    lookups = sum(int(idx.numel()) for row in batches for idx, _ in row) / (len(batches) * len(batches[0]))
    B = int(batches[0][0][1].numel())
    return lookups * row_bytes + lookups * 8 + B * 8 + B * row_bytes


def _rows_read(weight: torch.Tensor, rows: torch.Tensor, dim: int, dtype: str) -> torch.Tensor:
    """The values a kernel reads from `rows` of `weight` (as bound: quantized rows packed),
    widened to fp32 (int8 and fp8 rows dequantized)."""
    if dtype in QUANTIZED:
        return dequantize(QuantizedTable(weight[rows], dim, dtype))
    return weight[rows].float()


def check_point(kernels: list[TableKernel], mapped: list[list[tuple[torch.Tensor, torch.Tensor]]],
                variant: str) -> dict[str, Any]:
    """Check before timing: run the variant (pre-pass + kernel) on the first batch of the
    point's own data, every table, on the device it will be timed on, and compare with
    torch.nn.functional.embedding_bag in float64 over the rows the batch reads. Returns
    {passed, max_abs_err, tolerance, table}: the worst table's numbers."""
    outputs = preallocate(kernels, mapped[:1])

    def tables() -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, str, str]]:
        for t, tk in enumerate(kernels):   # launched one by one: a failed table stops the check
            idx, off = mapped[0][t]
            tk.prepass()
            out = tk.launch(idx, off, out=outputs[t])
            if idx.is_cuda:
                torch.cuda.synchronize(idx.device)
            rows, inverse = torch.unique(idx, return_inverse=True)
            yield out.output, inverse, off, _rows_read(tk.weight, rows, tk.dim, tk.dtype).double(), tk.mode, tk.dtype

    return _worst_table(tables(), variant)


def _worst_table(tables: Iterable[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, str, str]],
                 variant: str) -> dict[str, Any]:
    """Each table's output against torch in float64 over the rows it reads, given as
    (output, indices into those rows, offsets, the rows widened, pooling mode, dtype); the
    worst table's {passed, max_abs_err, tolerance, table}, stopping at the first failure."""
    worst: dict[str, Any] = {"passed": True, "max_abs_err": 0.0, "tolerance": float("inf"), "table": -1}
    worst_ratio = -1.0
    for t, (output, inverse, off, wide, mode, dtype) in enumerate(tables):
        ref = torch.nn.functional.embedding_bag(inverse, wide, off, mode=mode)
        B = int(off.numel())
        err = float((output[:B].double() - ref).abs().max()) if B and inverse.numel() else 0.0
        lengths = torch.diff(torch.cat([off, torch.tensor([inverse.numel()], device=off.device)]))
        tol = tolerance(dtype, variant, int(lengths.max()) if B else 1,
                        float(wide.abs().max()) if wide.numel() else 0.0)
        if err / tol > worst_ratio:
            worst_ratio = err / tol
            worst = {"passed": err <= tol, "max_abs_err": err, "tolerance": tol, "table": t}
        if err > tol:
            break
    return worst


def bench_point(session: Session, variant: str, dataset: str,
                batches: list[list[tuple[torch.Tensor, torch.Tensor]]]) -> dict[str, Any]:
    """Check, then time one point. The device state it changes is set once, before its
    check, and restored after its last timed batch (device_state)."""
    if get_variant(variant).batched:  # one launch per batch (tbe): see "Batched variants" below
        return bench_batched_point(session, variant, dataset, batches)
    kernels, mapped = session.bind(variant, batches)
    try:
        with device_state(kernels, session.exp.bench.l2_set_aside) as set_aside:
            return _bench_bound(session, variant, dataset, batches, kernels, mapped, set_aside)
    finally:
        close_all(kernels)


def _bench_bound(session: Session, variant: str, dataset: str, batches: list, kernels: list[TableKernel],
                 mapped: list, set_aside: dict[str, int]) -> dict[str, Any]:
    check = check_point(kernels, mapped, variant)
    if not check["passed"]:
        err = CheckMismatch(f"{variant} does not match torch on {dataset} (table {check['table']}, batch 0): "
                            f"max |error| {check['max_abs_err']:.3g} > tolerance {check['tolerance']:.3g}; "
                            "not timed")
        err.check = check  # type: ignore[attr-defined]
        raise err
    library = kernels[0].library
    flusher = L2Flusher(session.device, session.gpu.l2_bytes, library) if "cold" in session.exp.bench.modes else None
    eff_bytes = bytes_per_table(batches, session.workload.row_bytes)
    outputs = preallocate(kernels, mapped)
    summary, reps, per_table, per_launch = [], [], {}, {}
    clocks = {"before": sample_clocks(session.nvml_index)}
    timed = [(mode, time_point(kernels, mapped, mode, session.exp.bench, flusher, outputs=outputs,
                               max_sm_clock_MHz=session.gpu.boost_clock_MHz))
             for mode in session.exp.bench.modes]
    for mode, res in timed:
        T = res["tables"]
        k, p, w = res["kernel"], res["prepass"], res["with_prepass"]
        per_table_us = k.mean / T
        tm = res["timing"]
        row = {"mode": mode, "per_batch_us": k.mean, "per_table_us": per_table_us, "ci95_us": k.ci95 / T,
               "rel_ci": k.rel_ci, "rel_std": k.rel_std, "stable": k.stable, "reps": k.n,
               "median_per_table_us": k.median / T, "min_per_table_us": k.min / T,
               "prepass_per_table_us": p.mean / T if p else 0.0,
               "per_table_incl_prepass_us": w.mean / T, "ci95_incl_prepass_us": w.ci95 / T,
               "per_launch_us": tm["per_launch_us"], "timed_unit": tm["unit"],
               "bytes_per_table": eff_bytes, "effective_GBps": eff_bytes / per_table_us / 1e3,
               "hbm_pct": 100 * eff_bytes / per_table_us / 1e3 / session.gpu.hbm_GBps,
               "timing_method": tm["method"], "gap_free": tm["gap_free"],
               "host_bound_reps": tm["host_bound_reps"],
               "host_launch_us": tm["host_enqueue_per_launch_us"],
               "launch_gap_us": tm["launch_gap_per_launch_us"], "flush_bytes": tm["flush_bytes"],
               "seconds": res["seconds"]}
        if "phases_per_table_us" in res:
            row["cache_phases_per_table_us"] = res["phases_per_table_us"]
        summary.append(row)
        reps += res["repetitions"]
        per_table[mode] = res["per_table_mean_us"]
        per_launch[mode] = res["per_launch_table_us"]
    clocks["after"] = sample_clocks(session.nvml_index)
    first = kernels[0]
    return {"status": "ok", "backend": session.backend, "gpu": session.gpu.name, "params": first.params,
            "hot_rows": 0 if first.hot_rows is None else int(len(first.hot_rows)), "window": first.window,
            "hot_rows_from": f"warm-up batches 0..{session.warmup - 1}" if session.warmup else "none",
            "warmup_batches": session.warmup, "check": check, "clock_control": BENCH_CLOCK_CONTROL,
            "clocks": clocks, "throttle": throttle_verdict(clocks), "l2_set_aside": set_aside,
            "identity": session.identity, "summary": summary, "repetitions": reps,
            "per_table_mean_us": per_table, "per_launch_table_us": per_launch,
            **({"uvm": first.managed.describe() if first.managed is not None else
                {"mode": uvm_mode(first.params), "advice": ["none: the CPU backend reads the table itself"]}}
               if first.variant.host == "uvm" else {})}


def start_heartbeat(path: Path, every_s: float = HEARTBEAT_S) -> None:
    """Touch `path` every `every_s` seconds from a thread of its own, for as long as this
    process runs: a worker that is stopped (SIGSTOP, a debugger, a frozen driver call holding
    the whole process) stops beating, which the runner sees long before the point's timeout."""
    def beat() -> None:
        while True:
            try:
                path.touch()
            except OSError:
                pass
            time.sleep(every_s)

    threading.Thread(target=beat, name="heartbeat", daemon=True).start()


def run_bench(run_dir: Path, points: list[tuple[str, str]], backend: str) -> int:
    """Time `points` in order, writing each as it finishes; returns the exit status."""
    (run_dir / "points" / "bench").mkdir(parents=True, exist_ok=True)
    start_heartbeat(run_dir / "points" / "bench" / HEARTBEAT)
    run = load_run(run_dir)
    exp = ExperimentConfig.from_dict(run.meta["experiment"])
    writer = RunDir(run_dir)
    session = Session.open(exp, backend)
    inflight = run_dir / "points" / "bench" / INFLIGHT
    inflight.parent.mkdir(parents=True, exist_ok=True)
    by_dataset: dict[str, list[str]] = {}
    for v, d in points:
        by_dataset.setdefault(d, []).append(v)
    done = 0
    for dataset, variants in by_dataset.items():
        try:
            batches = session.dataset(dataset)
        except CharacterizeError as e:
            for v in variants:
                writer.write_point("bench", v, dataset, {"status": "failed", "error": str(e)})
                writer.log(f"bench {v} {dataset}: failed: {e}")
                done += 1
            continue
        for v in variants:
            inflight.write_text(point_key(v, dataset))
            done += 1
            try:
                record = bench_point(session, v, dataset, batches)
            except CharacterizeError as e:
                failed = {"status": "failed", "error": str(e)}
                if getattr(e, "check", None) is not None:
                    failed["check"] = e.check  # type: ignore[attr-defined]
                with whole():
                    writer.write_point("bench", v, dataset, failed)
                    writer.log(f"bench {v} {dataset}: failed: {e}")
                print(escape_text(f"[{done}/{len(points)}] {v} {dataset}: FAILED: {e}"), file=sys.stderr, flush=True)
                if isinstance(e, KernelLaunchError) and backend == "cuda":
                    inflight.unlink(missing_ok=True)
                    return EXIT_CUDA_ERROR
                continue
            steady = record["summary"][0]
            msg = (f"[{done}/{len(points)}] {v} {dataset}: {steady['mode']} {steady['per_table_us']:.1f} us/table "
                   f"+-{100 * steady['rel_ci']:.1f}% ({steady['reps']} reps)")
            with whole():
                writer.write_point("bench", v, dataset, record)
                writer.log(f"bench {msg}")
            print(escape_text(msg), file=sys.stderr, flush=True)
        inflight.unlink(missing_ok=True)
    return 0


def kernel_filter(exp: ExperimentConfig) -> str:
    """The ncu -k filter for an experiment: ours, torch's and FBGEMM's kernels
    (KERNEL_FILTER), and the gathering kernel of each kernel of one's own it names."""
    own = [k.kernel for k in exp.user_kernels.values()]
    return "|".join([KERNEL_FILTER, *(f"(?:{r})" for r in own)])


def variant_launches(variant: str) -> list[str]:
    """The kernels one table of one batch launches, in order (what ncu's -k filter sees;
    a kernel of one's own: one launch of the kernel its table names)."""
    v = get_variant(variant)
    if v.peer == "user":
        return [USER_KERNEL_LAUNCH]
    if v.peer == "fbgemm":
        return [FBGEMM_FORWARD_KERNEL]
    if v.entry is None:
        return [TORCH_EMBEDDING_BAG_KERNEL]
    return (["chz_l2_pin_kernel"] if v.l2 == "prefetch" else []) + [v.kernel or v.entry]


def matching_launches(variant: str, kernel_filter: str = KERNEL_FILTER) -> int:
    """Launches per table and batch that the kernel filter matches (a batched variant's: per
    batch, one launch covering every table; a kernel of one's own: its one, which
    kernel_filter adds)."""
    return sum(name == USER_KERNEL_LAUNCH or bool(re.search(kernel_filter, name)) for name in variant_launches(variant))


def profiled_launches(variant: str, profile_tables: int, tables: int) -> int:
    """Launches one point's profiled range holds: each profiled table's, or a batched
    variant's one launch covering them all."""
    if get_variant(variant).batched:
        return matching_launches(variant)
    return min(profile_tables, tables) * matching_launches(variant)


def launches_before_profiled(variant: str, tables: int, warmup: int, kernel_filter: str = KERNEL_FILTER) -> int:
    """Kernel launches matching the filter that the profile target makes before its
    profiled ones, in order: the correctness check (each table: the variant's launches,
    then the float64 reference, torch's embedding_bag on the device), then `warmup`
    batches of every table. What `ncu --launch-skip` must skip when NVTX cannot scope."""
    reference = int(bool(re.search(kernel_filter, TORCH_EMBEDDING_BAG_KERNEL)))
    per_launch = matching_launches(variant, kernel_filter)
    if get_variant(variant).batched:   # one launch for every table; the check's references are per table
        return per_launch + tables * reference + warmup * per_launch
    return tables * (per_launch + reference) + warmup * tables * per_launch


def profile_point(session: Session, variant: str, dataset: str,
                  batches: list[list[tuple[torch.Tensor, torch.Tensor]]]) -> int:
    """One point as bench sees it before its first timed batch, then that batch's first
    tables under NVTX: the device state set as bench sets it, the check (not a warm-up),
    the same warm-up batches with the same hot rows, then the profiled launches.
    Returns how many tables were profiled."""
    if get_variant(variant).batched:  # one launch per batch (tbe, fbgemm): see "Batched variants" below
        return profile_batched_point(session, variant, dataset, batches)
    prof = session.exp.profile
    kernels, mapped = session.bind(variant, batches)
    try:
        with device_state(kernels, session.exp.bench.l2_set_aside) as set_aside:
            check = check_point(kernels, mapped, variant)
            if not check["passed"]:
                raise CheckMismatch(f"{variant} does not match torch on {dataset} (table {check['table']}, batch 0): "
                                    f"max |error| {check['max_abs_err']:.3g} > tolerance "
                                    f"{check['tolerance']:.3g}; not profiled")
            outputs = preallocate(kernels, mapped)
            for w in range(session.warmup):
                for t, tk in enumerate(kernels):
                    tk.prepass()
                    tk.launch(*mapped[w % len(mapped)][t], out=outputs[t])
            first_timed = mapped[timed_batch_index(session.warmup, len(mapped), 0)]
            n = min(prof.tables, len(kernels))
            with nvtx_range(PROFILE_RANGE):
                for t in range(n):
                    with nvtx_range(nvtx_name(variant, dataset, t)):
                        kernels[t].prepass()
                        kernels[t].launch(*first_timed[t], out=outputs[t])
            if session.device.type == "cuda":
                torch.cuda.synchronize()
        if set_aside:
            print(f"persisting-L2 set-aside: {set_aside['granted_bytes']} of {set_aside['requested_bytes']} "
                  "bytes requested", flush=True)
    finally:
        close_all(kernels)
    return n


def run_profile_target(run_dir: Path, points: list[tuple[str, str]], backend: str) -> int:
    """What ncu launches: each point in turn (profile_point), in one process, in the order
    given; each dataset's batches are loaded once, when its first point comes."""
    run = load_run(run_dir)
    exp = ExperimentConfig.from_dict(run.meta["experiment"])
    session = Session.open(exp, backend)   # the workload's batches, as bench loads them
    loaded: dict[str, Any] = {}
    for variant, dataset in points:
        if dataset not in loaded:
            loaded = {dataset: session.dataset(dataset)}   # one dataset's batches on the device at a time
        n = profile_point(session, variant, dataset, loaded[dataset])
        print(f"{PROFILED} {variant} {dataset}: {n} table launch(es) after {session.warmup} warm-up batch(es)",
              flush=True)
    return 0


# ------------------------------------------------------------------ batched variants
# A variant whose one launch covers every table of a batch (tbe). A per-table variant is timed
# as T launches per batch, each between its own events; a batched variant's batch is one launch
# (one per dtype group), so it is timed as one launch per batch (CUDA events around the batch,
# behind the same delay kernel, through measure.timing.time_point unchanged) and its per-table
# figures are the batch's / T. The rest follows the per-table path: checked against torch on
# the point's first batch before anything is timed, the same warm-up, modes, clocks and record.
Batches = list[list[tuple[torch.Tensor, torch.Tensor]]]


class BatchLauncher:
    """A whole batch as one `time_point` unit: `launch(b, ...)` runs prepared batch b of
    every table (outputs allocated once, before timing); nothing runs before it."""

    hot_rows = None
    library = None   # time_point then leaves the outputs to this launcher

    def __init__(self, tb: TableBatch, mapped: list[list[tuple[torch.Tensor, torch.Tensor]]]):
        self.tb, self.mapped = tb, mapped
        self.weight = tb.weights[0]      # time_point takes its device from here
        # one buffer per table for the largest batch; each batch writes a prefix of it
        largest = [(max(int(row[t][0].numel()) for row in mapped), max(int(row[t][1].numel()) for row in mapped))
                   for t in range(tb.T)]
        dev = self.weight.device
        full = [BagOutputs(torch.empty(B, D, dtype=torch.float32, device=dev), torch.empty(N, dtype=torch.int64, device=dev),
                           torch.empty(B, dtype=torch.int64, device=dev)) for (N, B), D in zip(largest, tb.dims)]
        self.outputs = [[BagOutputs(f.output[:off.numel()], f.offset2bag[:idx.numel()], f.bag_size[:off.numel()])
                         for f, (idx, off) in zip(full, row)] for row in mapped]

    def prepass(self) -> None:
        """No pre-pass: the launch changes no device state."""

    def launch(self, b: int, _offsets: Any = None, out: Any = None) -> list[BagOutputs]:
        return self.tb.launch(self.mapped[b], self.outputs[b])


def bind_batch(session: Session, variant: str, batches: Batches) -> tuple[TableBatch, Batches]:
    """The variant bound to every table of the session, and every batch mapped once (indices
    and offsets in the launch's index type)."""
    warm = min(session.warmup, len(batches))
    traces = [torch.cat([batches[b][t][0] for b in range(warm)]) for t in range(len(session.tables))] if warm else None
    tb = bind_tables(variant, session.tables, params=session.exp.params_for(variant), mode=session.workload.mode,
                     backend=session.backend, gpu=session.gpu, traces=traces)
    return tb, [tb.map_batch(row) for row in batches]


def check_batch(tb: TableBatch, mapped: Batches, variant: str) -> dict[str, Any]:
    """Check before timing, as worker.check_point does per table: the first batch, every table,
    in one launch per dtype group, compared with torch in float64 over the rows it reads.
    Returns {passed, max_abs_err, tolerance, table}: the worst table's numbers."""
    outs = tb.launch(mapped[0])
    if mapped[0] and mapped[0][0][0].is_cuda:
        torch.cuda.synchronize(mapped[0][0][0].device)

    def tables() -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, str, str]]:
        for t, ((idx, off), out) in enumerate(zip(mapped[0], outs)):
            rows, inverse = torch.unique(idx.long(), return_inverse=True)
            wide = _rows_read(tb.weights[t], rows, tb.dims[t], tb.dtypes[t]).double()
            yield out.output, inverse, off.long(), wide, tb.mode, tb.dtypes[t]

    return _worst_table(tables(), variant)


def _mismatch(variant: str, dataset: str, check: dict[str, Any], what: str) -> CheckMismatch:
    err = CheckMismatch(f"{variant} does not match torch on {dataset} (table {check['table']}, batch 0): "
                        f"max |error| {check['max_abs_err']:.3g} > tolerance {check['tolerance']:.3g}; not {what}")
    err.check = check  # type: ignore[attr-defined]
    return err


def bench_batched_point(session: Session, variant: str, dataset: str, batches: Batches) -> dict[str, Any]:
    """worker.bench_point for a batched variant: the same record, its batch one launch."""
    tb, mapped = bind_batch(session, variant, batches)
    check = check_batch(tb, mapped, variant)
    if not check["passed"]:
        raise _mismatch(variant, dataset, check, "timed")
    library = next(iter(tb.libraries.values()), None)   # FBGEMM's batch has no library of ours
    flusher = L2Flusher(session.device, session.gpu.l2_bytes, library) if "cold" in session.exp.bench.modes else None
    eff_bytes = bytes_per_table(batches, session.workload.row_bytes)
    launcher = BatchLauncher(tb, mapped)
    units = [[(b, None)] for b in range(len(mapped))]   # time_point's batch b: one launcher, one unit
    clocks = {"before": sample_clocks(session.nvml_index)}
    timed = [(mode, time_point([launcher], units, mode, session.exp.bench, flusher, outputs=[None],
                               max_sm_clock_MHz=session.gpu.boost_clock_MHz))
             for mode in session.exp.bench.modes]
    clocks["after"] = sample_clocks(session.nvml_index)
    T = tb.T
    summary, reps, per_table = [], [], {}
    for mode, res in timed:
        k, tm = res["kernel"], res["timing"]
        per_table_us = k.mean / T
        summary.append({
            "mode": mode, "per_batch_us": k.mean, "per_table_us": per_table_us, "ci95_us": k.ci95 / T,
            "rel_ci": k.rel_ci, "rel_std": k.rel_std, "stable": k.stable, "reps": k.n,
            "median_per_table_us": k.median / T, "min_per_table_us": k.min / T, "prepass_per_table_us": 0.0,
            "per_table_incl_prepass_us": per_table_us, "ci95_incl_prepass_us": k.ci95 / T,
            "bytes_per_table": eff_bytes, "effective_GBps": eff_bytes / per_table_us / 1e3,
            "hbm_pct": 100 * eff_bytes / per_table_us / 1e3 / session.gpu.hbm_GBps,
            "timing_method": tm["method"], "gap_free": tm["gap_free"], "host_bound_reps": tm["host_bound_reps"],
            "host_launch_us": tm["host_enqueue_per_launch_us"], "launch_gap_us": tm["launch_gap_per_launch_us"],
            "flush_bytes": tm["flush_bytes"], "seconds": res["seconds"], "launches_per_batch": tb.launches,
            "per_launch_us": tm["per_launch_us"], "timed_unit": tm["unit"]})
        reps += res["repetitions"]
        per_table[mode] = [k.mean / T] * T   # one launch: no per-table split exists
    return {"status": "ok", "backend": session.backend, "gpu": session.gpu.name, "params": tb.params,
            "hot_rows": 0, "window": {}, "check": check, "clock_control": BENCH_CLOCK_CONTROL, "clocks": clocks,
            "throttle": throttle_verdict(clocks), "l2_set_aside": {}, "identity": session.identity,
            "summary": summary, "repetitions": reps, "per_table_mean_us": per_table,
            "launch": tb.last_launch()}


def profile_batched_point(session: Session, variant: str, dataset: str, batches: Batches) -> int:
    """worker.profile_point for a batched variant: the check (not a warm-up), the same
    warm-up batches as bench, then the first timed batch's one launch (per dtype group)
    inside the profiled range, named as table 0 (it covers every table). Returns the
    tables that launch covered."""
    tb, mapped = bind_batch(session, variant, batches)
    try:
        check = check_batch(tb, mapped, variant)
        if not check["passed"]:
            raise _mismatch(variant, dataset, check, "profiled")
        for w in range(session.warmup):
            tb.launch(mapped[w % len(mapped)])
        with nvtx_range(PROFILE_RANGE):
            with nvtx_range(nvtx_name(variant, dataset, 0)):
                tb.launch(mapped[timed_batch_index(session.warmup, len(mapped), 0)])
        if session.device.type == "cuda":
            torch.cuda.synchronize()
    finally:
        tb.close()
    return tb.T


def main(argv: list[str] | None = None, *, supervised: bool = False) -> int:
    ap = argparse.ArgumentParser(prog="python -m characterize.measure.worker")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench")
    b.add_argument("run_dir", type=Path)
    b.add_argument("--point", action="append", default=[], help="VARIANT:DATASET")
    b.add_argument("--backend", default=None)
    b.add_argument("--supervisor", type=int, default=None,
                   help="pid of the supervising process; exit when it is gone or closes our stdin")
    p = sub.add_parser("profile")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--point", action="append", default=[], help="VARIANT:DATASET, repeated: the points in order")
    p.add_argument("--variant", help="with --dataset: that variant's points")
    p.add_argument("--dataset", action="append", default=[], help="repeat for several points in one process")
    p.add_argument("--backend", default=None)
    args = ap.parse_args(argv)
    if supervised:
        supervise(getattr(args, "supervisor", None))
    backend = backend_from_env(args.backend)
    try:
        if args.cmd == "bench":
            points = [tuple(p.split(":", 1)) for p in args.point]
            return run_bench(args.run_dir, points, backend)  # type: ignore[arg-type]
        points = [tuple(p.split(":", 1)) for p in args.point]
        points += [(args.variant, d) for d in args.dataset] if args.variant else []
        if not points or any(len(p) != 2 for p in points):
            raise ConfigError("profile target: give --point VARIANT:DATASET, or --variant V with --dataset D")
        return run_profile_target(args.run_dir, points, backend)  # type: ignore[arg-type]
    except CharacterizeError as e:
        print(f"error: {escape_text(str(e))}", file=sys.stderr, flush=True)
        return e.exit_code
    except OSError as e:   # a full disk, say: one line, as the CLI says it; the supervisor records the point
        print(f"error: {describe_os_error(e)}", file=sys.stderr, flush=True)
        return FileSystemError.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return 130
    except Exception:  # a bug: keep the traceback for the log, the supervisor marks the point failed
        traceback.print_exc()
        return 1


def _run_as_program() -> None:
    """The worker as its own process. A bench worker skips the interpreter's teardown
    (about a second for torch and numba): its points are already written, and an
    orphaned worker must be gone at once. The profile target exits normally, since
    ncu's injected library finishes its report in exit handlers."""
    try:
        code = main(supervised=True)
    except SystemExit as e:  # SIGTERM: finally-blocks have run by now
        code = e.code if isinstance(e.code, int) else 1
    if sys.argv[1:2] == ["bench"]:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    _run_as_program()
