"""Measure stage, inside a worker process: the code that touches the GPU.

`python -m characterize.measure.worker bench RUN_DIR --point VARIANT:DATASET ...` times
points and writes each one into the run directory as soon as it is finished;
`python -m characterize.measure.worker profile RUN_DIR --variant V --dataset D` is the
program Nsight Compute launches for one point: warm-up batches, then a few launches
wrapped in NVTX ranges named chz/<variant>/<dataset>/<table> inside an outer range
"chz-profile" that the ncu command line selects. Workers are separate processes so
that a kernel fault or a kill loses at most the point in flight (see runner.py).
Run as a program, a worker dies with its parent (lifeline.py): the kernel's
parent-death signal and, under `--supervisor PID`, a watchdog on the stdin pipe the
supervisor holds, so a killed `bench` never leaves a worker measuring.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from characterize.config import ExperimentConfig, WorkloadConfig
from characterize.errors import (
    CharacterizeError,
    CheckMismatch,
    FileSystemError,
    KernelLaunchError,
    describe_os_error,
    escape_text,
)
from characterize.hardware.devices import require_gpu, sample_clocks, throttle_verdict
from characterize.hardware.specs import REFERENCE_ARCH, gpu_spec
from characterize.kernels.check import tolerance
from characterize.kernels.library import QuantizedTable, TableKernel, as_dtype, bind, check_indices, dequantize
from characterize.kernels.registry import get_variant
from characterize.measure.lifeline import EXIT_ORPHANED, die_with_parent, watch_pipe
from characterize.measure.timing import L2Flusher, preallocate, time_point
from characterize.memory import check_memory
from characterize.store import RunDir, load_run, point_key
from characterize.units import format_bytes
from characterize.workloads.traces import load_dataset

PROFILE_RANGE = "chz-profile"
#: bench never locks clocks: it runs at the GPU's own clocks, sampled by NVML around each
#: point; profile follows the same policy by default (ProfileConfig.clock_control "none")
BENCH_CLOCK_CONTROL = "none"
INFLIGHT = ".inflight"
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
    device_index: int | None = None           # the GPU's index, None on the CPU backend
    identity: dict[str, str] | None = None    # GpuSpec field -> where its value came from

    @classmethod
    def open(cls, exp: ExperimentConfig, backend: str, batches: int | None = None) -> "Session":
        wl = exp.workload if batches is None else exp.workload.replace(batches=batches)
        index, identity = None, None
        if backend == "cuda":
            info = require_gpu()
            gpu, device = info.spec(), torch.device("cuda", info.index)
            index, identity = info.index, info.provenance()
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
        return cls(exp, wl, backend, device, tables, gpu, index, identity)

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

    def bind(self, variant: str, batches: list[list[tuple[torch.Tensor, torch.Tensor]]]):
        """One TableKernel per table, hot rows from that table's whole trace."""
        kernels = []
        for t, weight in enumerate(self.tables):
            trace = torch.cat([batches[b][t][0] for b in range(len(batches))])
            kernels.append(bind(variant, weight, trace=trace, params=self.exp.params_for(variant),
                                mode=self.workload.mode, backend=self.backend, gpu=self.gpu))
        mapped = [[(kernels[t].map_indices(idx), off) for t, (idx, off) in enumerate(row)] for row in batches]
        return kernels, mapped


def bytes_per_table(batches: list[list[tuple[torch.Tensor, torch.Tensor]]], row_bytes: int) -> float:
    """Effective bytes of one table launch, averaged over batches: rows gathered +
    indices + offsets + output (what the kernel must move at least once)."""
    lookups = sum(int(idx.numel()) for row in batches for idx, _ in row) / (len(batches) * len(batches[0]))
    B = int(batches[0][0][1].numel())
    return lookups * row_bytes + lookups * 8 + B * 8 + B * row_bytes


def _rows_read(tk: TableKernel, rows: torch.Tensor) -> torch.Tensor:
    """The values a kernel reads from `rows`, widened to fp32 (int8 rows dequantized)."""
    if tk.dtype in ("int8", "int8h"):
        return dequantize(QuantizedTable(tk.weight[rows], tk.dim, tk.dtype))
    return tk.weight[rows].float()


def check_point(kernels: list[TableKernel], mapped: list[list[tuple[torch.Tensor, torch.Tensor]]],
                variant: str) -> dict[str, Any]:
    """Check before timing: run the variant (pre-pass + kernel) on the first batch of the
    point's own data, every table, on the device it will be timed on, and compare with
    torch.nn.functional.embedding_bag in float64 over the rows the batch reads. Returns
    {passed, max_abs_err, tolerance, table}: the worst table's numbers."""
    worst: dict[str, Any] = {"passed": True, "max_abs_err": 0.0, "tolerance": float("inf"), "table": -1}
    worst_ratio = -1.0
    outputs = preallocate(kernels, mapped[:1])
    for t, tk in enumerate(kernels):
        idx, off = mapped[0][t]
        tk.prepass()
        out = tk.launch(idx, off, out=outputs[t])
        if idx.is_cuda:
            torch.cuda.synchronize(idx.device)
        rows, inverse = torch.unique(idx, return_inverse=True)
        wide = _rows_read(tk, rows).double()
        ref = torch.nn.functional.embedding_bag(inverse, wide, off, mode=tk.mode)
        B = int(off.numel())
        err = float((out.output[:B].double() - ref).abs().max()) if B and idx.numel() else 0.0
        lengths = torch.diff(torch.cat([off, torch.tensor([idx.numel()], device=off.device)]))
        tol = tolerance(tk.dtype, variant, int(lengths.max()) if B else 1,
                        float(wide.abs().max()) if wide.numel() else 0.0)
        if err / tol > worst_ratio:
            worst_ratio = err / tol
            worst = {"passed": err <= tol, "max_abs_err": err, "tolerance": tol, "table": t}
        if err > tol:
            break
    return worst


@contextmanager
def l2_set_aside(kernels: list[TableKernel], enabled: bool) -> Iterator[dict[str, int]]:
    """l2p/combined: the persisting-L2 set-aside their evict_last pre-pass needs (the
    CUDA guide gives persisting accesses priority only within it), sized for the largest
    table's hot rows and capped by the device, then restored with the persisting lines
    demoted. Yields what was requested and granted ({} when not applicable or disabled)."""
    first = kernels[0]
    if (not enabled or first.library is None or first.variant.l2 != "prefetch"
            or not any(k.hot_rows is not None and len(k.hot_rows) for k in kernels)):
        yield {}
        return
    hot = max(len(k.hot_rows) * k.weight.stride(0) * k.weight.element_size()
              for k in kernels if k.hot_rows is not None)
    granted, previous = first.library.l2_set_aside(hot)
    try:
        yield {"requested_bytes": int(hot), "granted_bytes": int(granted), "previous_bytes": int(previous)}
    finally:
        first.library.l2_set_aside_restore(previous)


def bench_point(session: Session, variant: str, dataset: str,
                batches: list[list[tuple[torch.Tensor, torch.Tensor]]]) -> dict[str, Any]:
    kernels, mapped = session.bind(variant, batches)
    try:
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
        summary, reps, per_table = [], [], {}
        clocks = {"before": sample_clocks(session.device_index)}
        with l2_set_aside(kernels, session.exp.bench.l2_set_aside) as set_aside:
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
                   "bytes_per_table": eff_bytes, "effective_GBps": eff_bytes / per_table_us / 1e3,
                   "hbm_pct": 100 * eff_bytes / per_table_us / 1e3 / session.gpu.hbm_GBps,
                   "timing_method": tm["method"], "gap_free": tm["gap_free"],
                   "host_bound_reps": tm["host_bound_reps"],
                   "host_launch_us": tm["host_enqueue_per_launch_us"],
                   "launch_gap_us": tm["launch_gap_per_launch_us"], "flush_bytes": tm["flush_bytes"],
                   "seconds": res["seconds"]}
            summary.append(row)
            reps += res["repetitions"]
            per_table[mode] = res["per_table_mean_us"]
        clocks["after"] = sample_clocks(session.device_index)
        first = kernels[0]
        return {"status": "ok", "backend": session.backend, "gpu": session.gpu.name, "params": first.params,
                "hot_rows": 0 if first.hot_rows is None else int(len(first.hot_rows)), "window": first.window,
                "check": check, "clock_control": BENCH_CLOCK_CONTROL, "clocks": clocks,
                "throttle": throttle_verdict(clocks), "l2_set_aside": set_aside,
                "identity": session.identity, "summary": summary, "repetitions": reps,
                "per_table_mean_us": per_table}
    finally:
        for k in kernels:
            k.close()


def run_bench(run_dir: Path, points: list[tuple[str, str]], backend: str) -> int:
    """Time `points` in order, writing each as it finishes; returns the exit status."""
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
                writer.write_point("bench", v, dataset, failed)
                writer.log(f"bench {v} {dataset}: failed: {e}")
                print(escape_text(f"[{done}/{len(points)}] {v} {dataset}: FAILED: {e}"), file=sys.stderr, flush=True)
                if isinstance(e, KernelLaunchError) and backend == "cuda":
                    inflight.unlink(missing_ok=True)
                    return EXIT_CUDA_ERROR
                continue
            writer.write_point("bench", v, dataset, record)
            steady = record["summary"][0]
            msg = (f"[{done}/{len(points)}] {v} {dataset}: {steady['mode']} {steady['per_table_us']:.1f} us/table "
                   f"+-{100 * steady['rel_ci']:.1f}% ({steady['reps']} reps)")
            writer.log(f"bench {msg}")
            print(escape_text(msg), file=sys.stderr, flush=True)
        inflight.unlink(missing_ok=True)
    return 0


def run_profile_target(run_dir: Path, variant: str, dataset: str, backend: str) -> int:
    """What ncu launches: warm-up (not profiled), then the profiled NVTX ranges."""
    run = load_run(run_dir)
    exp = ExperimentConfig.from_dict(run.meta["experiment"])
    prof = exp.profile
    session = Session.open(exp, backend, batches=prof.warmup_batches + 1)
    batches = session.dataset(dataset)
    kernels, mapped = session.bind(variant, batches)
    try:
        # the check is the first warm-up batch (same launches), so launch order is unchanged
        check = check_point(kernels, mapped, variant)
        if not check["passed"]:
            raise CheckMismatch(f"{variant} does not match torch on {dataset} (table {check['table']}, batch 0): "
                              f"max |error| {check['max_abs_err']:.3g} > tolerance {check['tolerance']:.3g}; "
                              "not profiled")
        with l2_set_aside(kernels, prof.l2_set_aside) as set_aside:
            for b in range(1, prof.warmup_batches):
                for t, tk in enumerate(kernels):
                    tk.prepass()
                    tk.launch(*mapped[b][t])
            last = mapped[prof.warmup_batches]
            with nvtx_range(PROFILE_RANGE):
                for t in range(min(prof.tables, len(kernels))):
                    with nvtx_range(nvtx_name(variant, dataset, t)):
                        kernels[t].prepass()
                        kernels[t].launch(*last[t])
            if session.device.type == "cuda":
                torch.cuda.synchronize()
        if set_aside:
            print(f"persisting-L2 set-aside: {set_aside['granted_bytes']} of {set_aside['requested_bytes']} "
                  "bytes requested", flush=True)
    finally:
        for k in kernels:
            k.close()
    print(f"profiled {variant} {dataset}: {min(prof.tables, len(kernels))} table launch(es) after "
          f"{prof.warmup_batches} warm-up batch(es)", flush=True)
    return 0


#: seconds an orphaned worker gets to stop cleanly (finish writing a point file) before it is ended hard
ORPHAN_GRACE_S = 2.0


def _stop(signum: int, _frame: object) -> None:
    """SIGTERM (the parent-death signal): unwind, so temporaries are removed and kernels closed."""
    raise SystemExit(EXIT_ORPHANED)


def _orphaned() -> None:
    """The supervisor's pipe closed: stop like on SIGTERM, and hard after a grace period
    (the main thread may be inside a long native call)."""
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(ORPHAN_GRACE_S)


def supervise(supervisor: int | None) -> None:
    """Tie this worker process to its parent: the parent-death signal, and with the
    supervisor's pid, a check that it is still the parent plus the stdin-pipe watchdog."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop)
    die_with_parent(signal.SIGTERM, parent=supervisor)
    if supervisor is not None:
        watch_pipe(0, on_close=_orphaned)


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
    p.add_argument("--variant", required=True)
    p.add_argument("--dataset", required=True)
    p.add_argument("--backend", default=None)
    args = ap.parse_args(argv)
    if supervised:
        supervise(getattr(args, "supervisor", None))
    backend = backend_from_env(args.backend)
    try:
        if args.cmd == "bench":
            points = [tuple(p.split(":", 1)) for p in args.point]
            return run_bench(args.run_dir, points, backend)  # type: ignore[arg-type]
        return run_profile_target(args.run_dir, args.variant, args.dataset, backend)
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
