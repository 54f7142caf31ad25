"""Pipeline, the run: the steps of `characterize run` (static, locality, predict, e2e, bench,
profile, report), each the one place its stage is orchestrated and each writing its results
before the next starts, so an interrupted run keeps what finished and `--resume` continues it.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import os
import shlex
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd

from characterize.analysis.model.host import CACHE_SWEEP
from characterize.analysis.model.locality import shared_profiles
from characterize.config import ExperimentConfig
from characterize.errors import (
    CharacterizeError,
    NamedToolMissing,
    NcuNotFound,
    OutOfTime,
    RunDirError,
    ToolchainNotFound,
    WorkloadError,
    describe_os_error,
)
from characterize.hardware.devices import devices, require_gpu
from characterize.kernels.build import BuildTally, buildable_arch, observe_builds, toolkit_record
from characterize.kernels.diskcache import entry, read_entry, write_entry
from characterize.kernels.library import unavailable
from characterize.kernels.registry import (
    get_variant,
)
from characterize.measure.executor import (
    GPUS_DIR,
    Placement,
    gpu_identity,
    measure_stage,
    require_slurm,
    with_slurm_options,
)
from characterize.measure.ncu import find_ncu
from characterize.measure.runner import (
    open_run,
    pending_points,
    points_failed,
)
from characterize.memory import memory_budget
from characterize.pipeline.dlrm import e2e
from characterize.pipeline.experiment import check_experiment
from characterize.pipeline.facts import CodeFacts, code_facts, reads
from characterize.pipeline.predictions import cache_key, dataset_identity, model_validation, predict
from characterize.progress import Progress, Reporter, Task, as_reporter, folded
from characterize.progress import quiet as _quiet
from characterize.report.render import render_report
from characterize.rundir import artifact
from characterize.store import (
    RunDir,
    environment,
    git_revision,
    kernel_sources_digest,
    list_runs,
    load_run,
    run_fingerprint,
)
from characterize.workloads.locality import coverage_ks, locality_stats, named_ks, shared_reuse
from characterize.workloads.traces import load_dataset, shared_datasets


def _watch_points(run: RunDir, kind: str, points: Sequence[tuple[str, str]], task: Task,
                  stop: threading.Event) -> None:
    """Advance `task` as the workers write finished points (they run in other processes)."""
    done: set = set()
    while not stop.wait(0.5):
        for v, d in points:
            if (v, d) not in done and run.point_path(kind, v, d).is_file():
                done.add((v, d))
                task.advance(1, item=f"{v} {d}")


def follow_points(run: RunDir, kind: str, points: Sequence[tuple[str, str]], task: Task,
                  fn: Callable[[], dict[str, int]]) -> dict[str, int]:
    """Run `fn` (bench or profile points) with `task` following the points it writes."""
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_points, args=(run, kind, points, task, stop), daemon=True)
    watcher.start()
    try:
        counts = fn()
    finally:
        stop.set()
        watcher.join()
    task.finish(f"{counts['ok']} point(s) done, {counts['failed']} failed")
    return counts


def default_run_dir(exp: ExperimentConfig, gpu_key: str | None) -> Path:
    return Path("runs") / f"{exp.name}-{gpu_key or 'nogpu'}"


def run_meta(exp: ExperimentConfig, path: Path, gpu_info, backend: str = "cuda", executor: str = "local") -> dict:
    """meta.json of a new run: identity of the GPU and software, the full config and its
    fingerprint (what every point depends on), the command line."""
    gpu = gpu_identity(gpu_info)
    where = gpu["key"] if gpu else "cpu-emulation" if backend == "emulate" else executor if executor != "local" \
        else None
    return {"name": path.name, "experiment": exp.to_dict(), "command_line": shlex.join(sys.argv),
            "environment": environment(), "backend": backend if gpu_info is not None or backend != "cuda" else None,
            "gpu": gpu, "cache_control": exp.profile.cache_control, "clock_control": exp.profile.clock_control,
            "toolkit": toolkit_record(), "fingerprint": run_fingerprint(exp, backend, where)}


def locality_step(run: RunDir, exp: ExperimentConfig, progress: Reporter | Progress = _quiet, table: int = 0) -> dict:
    """Locality statistics of one table of every dataset (all tables of a generated
    dataset share a distribution). K: the paper's 60K and the rows fitting each
    target architecture's L2 and persisting budget."""
    wl = exp.workload
    # the coverage curve, from K=1 on a log scale, and the K that mean something
    ks = coverage_ks(wl.E) | set(named_ks(wl.row_bytes, exp.archs).values())
    out, failed = {}, {}
    with as_reporter(progress).task("locality", total=len(exp.datasets), unit="datasets") as task:
        def one(ds: str) -> None:
            # kept in the disk cache: the same trace (generated, or a file unchanged) gives the same statistics
            key = cache_key(json.dumps([wl.to_dict(), dataset_identity(ds), table, sorted(ks)], default=str))
            kept = read_entry(entry("locality", key, ".json"), lambda f: json.loads(f.read_text()))
            if isinstance(kept, dict):
                out[ds] = kept
                task.advance(1, item=f"{ds}: {kept.get('unique_rows', 0):,} unique rows (kept from an earlier run)")
                return
            try:
                data = load_dataset(ds, wl, tables=[table])
                stats = locality_stats(data.tables[0].indices, data.rows, wl.row_bytes, sorted(ks),
                                       progress=lambda done, n: task.advance(
                                           0, item=f"{ds}: reuse distances {done / n:.0%}"))
            except CharacterizeError as e:  # one bad dataset costs only itself
                failed[ds] = str(e) if ds in str(e) else f"{ds}: {e}"
                task.advance(1)
                return
            out[ds] = stats.to_json() | {"table": table, "description": data.description}
            write_entry(entry("locality", key, ".json"), json.dumps(out[ds], default=str))
            task.advance(1, item=f"{ds}: {stats.unique_rows:,} unique of {stats.lookups:,} lookups")

        # datasets side by side (the reuse kernel releases the GIL), as many as the memory budget holds at
        # once, each in this run's context (its shared traces)
        n = wl.B * wl.batches * wl.L.max
        one_table = 64 * n + 16 * n + 8 * wl.E    # statistics (locality.STATS_BYTES_PER_LOOKUP), trace, counts
        workers = max(1, min(len(exp.datasets), os.cpu_count() or 1, memory_budget()[0] // max(1, one_table)))
        contexts = [contextvars.copy_context() for _ in exp.datasets]
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda c, d: c.run(one, d), contexts, exp.datasets))
        out = {ds: out[ds] for ds in exp.datasets if ds in out}   # in the experiment's order
        task.finish(f"{len(out)} dataset(s) analyzed" + (f", {len(failed)} failed" if failed else ""))
    run.write("locality", out)
    if failed:
        raise WorkloadError(f"{'; '.join(failed[d] for d in exp.datasets if d in failed)} (the other datasets' "
                            "statistics are in locality.json)")
    return out


def static_step(run: RunDir, exp: ExperimentConfig, progress: Reporter | Progress = _quiet) -> CodeFacts:
    """static.csv and sass.csv of the experiment's variants at the workload's dtype, as
    configured: what the first answer's predictions read, and no more (the register sweep
    and the other precisions come in the sweeps step, after the answer). One progress line."""
    archs = list(dict.fromkeys(buildable_arch(a) for a in exp.archs))   # CUDA 13 builds no Volta: its stand-in
    tally = BuildTally()
    with folded(progress, f"static ({exp.workload.dtype} on {', '.join(archs)})", unit="builds") as fold, \
            observe_builds(tally):
        code = code_facts(exp.variants, archs, exp.workload.D, exp.params, dtype=exp.workload.dtype, progress=fold)
        fold.step.finish(f"{tally.summary()}; {len(code.sass)} hot loop(s) read")
    for part in fold.parts:
        run.log(f"static: {part}")
    run.write("static", code.static)
    run.write("sass", code.sass)
    return code


def other_dtypes(exp: ExperimentConfig) -> list[str]:
    """The precisions the experiment predicts beside its workload's (the precision grid)."""
    return [d for d in dict.fromkeys(exp.dtypes) if d != exp.workload.dtype]


def sweeps_step(run: RunDir, exp: ExperimentConfig, progress: Reporter | Progress = _quiet) -> CodeFacts:
    """After the first answer, what the report's sweeps read: the register sweep at the
    workload's dtype (static.csv) and the precision grid, each other dtype's builds, static
    facts, hot loops (sass.csv) and predictions (predictions.csv), added to what the static
    and predict steps wrote. The workload dtype's hot loops are not read again."""
    archs = list(dict.fromkeys(buildable_arch(a) for a in exp.archs))
    more = other_dtypes(exp)
    first = stored_code(run, exp)
    tally = BuildTally()
    what = ", ".join([*(["register sweep"] if exp.maxrregcount else []), *more]) or "nothing to add"
    with folded(progress, f"sweeps ({what} on {', '.join(archs)})", unit="builds") as fold, observe_builds(tally):
        label = f"{exp.workload.dtype}: "
        code = code_facts(exp.variants, archs, exp.workload.D, exp.params, exp.maxrregcount, exp.workload.dtype,
                          progress=fold, also_dtypes=more, label=label, hot_loops=first is None)
        statics, sasses = [code.static], [code.sass if first is None else of_dtype(first.sass, exp.workload.dtype)]
        for dt in more:
            wl = exp.workload.replace(dtype=dt)
            names = [v for v in dict.fromkeys(["base", *exp.variants]) if get_variant(v).compiled and reads(v, wl)]
            extra = code_facts(names, archs, exp.workload.D, exp.params, dtype=dt, progress=fold, label=f"{dt}: ")
            statics.append(extra.static)
            sasses.append(extra.sass)
        code = CodeFacts(exp.workload.D, pd.concat(statics, ignore_index=True), pd.concat(sasses, ignore_index=True))
        fold.step.finish(f"{tally.summary()}; {len(code.sass)} hot loop(s) in all")
    for part in fold.parts:
        run.log(f"sweeps: {part}")
    run.write("static", code.static)
    run.write("sass", code.sass)
    if more:
        _predict_more(run, exp, code, more, progress)
    return code


def of_dtype(frame: pd.DataFrame, dtype: str) -> pd.DataFrame:
    """The rows of `frame` for tables of `dtype` (rows written without a dtype are fp32's)."""
    if "dtype" not in frame.columns:
        return frame if dtype == "fp32" else frame.iloc[0:0]
    return frame[frame["dtype"].astype(object).fillna("fp32") == dtype]


def _predict_more(run: RunDir, exp: ExperimentConfig, code: CodeFacts, more: Sequence[str],
                  progress: Reporter | Progress) -> None:
    """The other precisions' predictions, added to the workload dtype's in predictions.csv."""
    targets = prediction_targets(run, exp)
    sweep = cache_sweep(exp)
    stored = load_run(run.path).predictions
    if "dtype" in stored.columns:   # a resumed run: its earlier grid is replaced, not doubled
        stored = stored[~stored["dtype"].isin(more)]
    frames = [stored] if not stored.empty else []
    with folded(progress, f"predict ({', '.join(more)} on {', '.join(targets)})", unit="datasets") as fold:
        for dt in more:
            wl = exp.workload.replace(dtype=dt)
            other = dataclasses.replace(exp, workload=wl, dtypes=(), variants=tuple(v for v in exp.variants
                                                                                    if reads(v, wl)))
            if other.variants:   # none of the experiment's variants reads this dtype (fp8: tbe alone)
                frames.append(predict(other, targets, code=code, progress=fold, cache_ratios=sweep))
        df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        fold.step.finish(f"{len(df) - len(stored)} point(s) added")
    for part in fold.parts:
        run.log(f"sweeps: {part}")
    run.write("predictions", df)


def stored_code(run: RunDir, exp: ExperimentConfig) -> CodeFacts | None:
    """What the static step wrote, if it ran (the model then needs no compiler)."""
    stored = load_run(run.path)
    if stored.static.empty or stored.sass.empty:
        return None
    return CodeFacts(exp.workload.D, stored.static, stored.sass)


def prediction_targets(run: RunDir, exp: ExperimentConfig) -> list[str]:
    """The architectures predicted: the experiment's, and the run's GPU when it has one."""
    archs = list(exp.archs)
    gpu = load_run(run.path).meta.get("gpu") or {}
    if gpu.get("key") and gpu["key"] not in archs:
        archs.append(gpu["key"])
    return archs


def cache_sweep(exp: ExperimentConfig) -> Sequence[float] | None:
    """The cache variant's sizes to sweep, when it is run without a size of its own."""
    return CACHE_SWEEP if "cache" in exp.variants and "C" not in exp.params_for("cache") else None


def predict_step(run: RunDir, exp: ExperimentConfig, code: CodeFacts | None = None,
                 progress: Reporter | Progress = _quiet) -> pd.DataFrame:
    """Model predictions for every variant x dataset x architecture (and the run's GPU) at the
    workload's dtype, and the model against the paper's claims: the first answer (the other
    precisions are predicted in the sweeps step)."""
    archs = prediction_targets(run, exp)
    with folded(progress, f"predict ({exp.workload.dtype} on {', '.join(archs)})", unit="datasets") as fold:
        df = predict(dataclasses.replace(exp, dtypes=()), archs, code=code, progress=fold,
                     cache_ratios=cache_sweep(exp))
        run.write("predictions", df)
        with fold.task("the model against the paper's claims") as task:
            claims = model_validation(code, progress=fold)
            task.finish(f"{len(claims)} claim(s) checked")
        fold.step.finish(f"{len(df)} point(s); the paper's {len(claims)} claim(s) checked against the model")
    for part in fold.parts:
        run.log(f"predict: {part}")
    run.write("model_validation", claims)
    return df


def e2e_step(run: RunDir, exp: ExperimentConfig, code: CodeFacts | None = None,
             progress: Reporter | Progress = _quiet) -> pd.DataFrame:
    """e2e.csv: the DLRM step around each variant, predicted per stage (measured too
    when `run` has a GPU; `characterize e2e` also checks it against autograd)."""
    earlier = load_run(run.path).predictions   # the predict step's, when it ran
    earlier = None if earlier.empty else earlier
    with as_reporter(progress).task("end-to-end DLRM step") as task:
        out = e2e(exp, code=code, check=False, predictions=earlier)
        task.finish(f"{len(out.rows)} stage row(s)")
    run.write("e2e", out.rows)
    return out.rows


def open_experiment_run(exp: ExperimentConfig, out: Path | None, stage: str, resume: bool, gpu_info,
                        backend: str = "cuda", executor: str = "local", remeasure: bool = False) -> RunDir:
    """Validate `exp` for the GPU (if any) and open its run directory for `stage`
    (default path runs/<experiment>-<gpu>; -slurm when Slurm's nodes hold the GPU).
    Finished points measured otherwise are refused, or measured again with `remeasure`
    (measure.runner.open_run)."""
    exp = check_experiment(exp, gpu=gpu_info.spec() if gpu_info else None)
    key = gpu_info.spec().key if gpu_info else ("cpu-emulation" if backend == "emulate" else
                                                "slurm" if executor == "slurm" else None)
    path = out or default_run_dir(exp, key)
    return open_run(path, exp, run_meta(exp, path, gpu_info, backend, executor), stage, resume, remeasure)


@dataclass
class RunOutcome:
    path: Path
    steps: dict[str, str] = field(default_factory=dict)  # step -> "done" | "skipped: why" | "failed: why"
    report: Path | None = None


@dataclass
class StepContext:
    """What every step of a run sees: the experiment, its run directory, where points are
    measured, and where progress goes."""

    exp: ExperimentConfig
    run: RunDir
    reporter: Reporter
    backend: str = "cuda"
    executor: str = "local"
    ncu: str | None = None
    gpu: Any = None              # the local GPU (DeviceInfo), or None
    outcome: RunOutcome | None = None
    deadline: float | None = None   # time.monotonic() at which measuring stops (--budget); the rest is cut
    timeout_s: float = 900.0        # profile: seconds one point may take under ncu

    @property
    def cannot_measure(self) -> str | None:
        """Why bench and profile cannot run here, or None when they can."""
        if self.gpu is None and self.backend == "cuda" and self.executor == "local":
            return "no CUDA GPU on this machine"
        return None


def measurable(exp: ExperimentConfig, backend: str, kind: str, say: Callable[[str], None],
               run: RunDir | None = None) -> ExperimentConfig:
    """The experiment without the variants that cannot run here (FBGEMM not installed),
    each said in one line (and in the run's log): their predictions stand, their points
    are not attempted."""
    drop = {v: why for v in exp.variants if (why := unavailable(v, backend))}
    for v, why in drop.items():
        say(f"{kind}: {v} skipped: {why}")
        if run is not None:
            run.log(f"{kind} {v}: skipped: {why}")
    return dataclasses.replace(exp, variants=tuple(v for v in exp.variants if v not in drop))


def _measurable(ctx: StepContext, kind: str) -> ExperimentConfig:
    return measurable(ctx.exp, ctx.backend, kind, ctx.reporter.message, ctx.run)


def open_step(exp: ExperimentConfig, out: Path | None, stage: str, resume: bool = False, *, backend: str = "cuda",
              executor: str = "local", slurm: dict[str, Any] | None = None, remeasure: bool = False,
              reporter: Reporter | Progress | None = None, ncu: str | None = None,
              timeout_s: float = 900.0) -> StepContext:
    """The context of bench or profile run as its own command: what the stage needs is
    looked for first (ncu for profile, then Slurm, then the GPU), so that the first thing
    missing is what is said, before any run directory is made."""
    if stage == "profile":
        _ncu_tool(executor, ncu)
    if executor == "slurm":
        require_slurm()
    exp = with_slurm_options(exp, **(slurm or {}))
    info = require_gpu() if backend == "cuda" and executor == "local" else None
    run = open_experiment_run(exp, out, stage, resume, info, backend, executor, remeasure)
    return StepContext(exp, run, as_reporter(reporter), backend, executor, ncu, info, timeout_s=timeout_s)


def bench_step(ctx: StepContext, alone: bool = False) -> dict[str, int]:
    """Time the points not yet measured; their counts (ok, failed, cut). `alone` (`characterize
    bench`): says what it times, and leaves raise_unfinished to the command, which first prints
    what was measured."""
    exp = _measurable(ctx, "bench")
    points = pending_points(ctx.run, "bench", exp, say=ctx.reporter.message)
    where = "CUDA events" if ctx.backend == "cuda" else "CPU emulation"
    title = f"bench ({where}{', Slurm' if ctx.executor == 'slurm' else ''})"
    if alone:
        ctx.reporter.message(f"bench {exp.name}: {len(points)} point(s) to time into {ctx.run.path} "
                             f"(backend {ctx.backend})")
        title = "bench"
    with ctx.reporter.task(title, total=len(points), unit="points") as task:
        counts = follow_points(ctx.run, "bench", points, task, lambda: measure_stage(
            ctx.run, "bench", exp, Placement(ctx.executor, ctx.backend, deadline=ctx.deadline),
            ctx.reporter.message))
    if not alone:
        raise_unfinished(ctx, "bench", counts)
    return counts


def raise_unfinished(ctx: StepContext, kind: str, counts: dict[str, int]) -> None:
    """The error a measuring step ends with: its failed points, or the points its budget cut."""
    if (failed := points_failed(ctx.run, kind, counts)) is not None:
        raise failed
    if counts.get("cut"):
        raise OutOfTime(f"{counts['ok']} {kind} point(s) measured, {counts['cut']} cut when the time budget ran out; "
                        f"--resume measures them")


def _ncu_tool(executor: str, ncu: str | None) -> str:
    """The ncu to run: through Slurm, --ncu names ncu on the nodes; without it, ncu must be found here too."""
    return ncu if executor == "slurm" and ncu else str(find_ncu(ncu))


def profile_step(ctx: StepContext, alone: bool = False) -> dict[str, int]:
    """Profile the points not yet profiled; their counts (ok, failed, cut). `alone`
    (`characterize profile`): as in bench_step."""
    tool = _ncu_tool(ctx.executor, ctx.ncu)
    exp = _measurable(ctx, "profile")
    points = pending_points(ctx.run, "profile", exp, say=ctx.reporter.message)
    placement = Placement(ctx.executor, ctx.backend, tool if ctx.executor == "local" or ctx.ncu else None,
                          ctx.timeout_s, deadline=ctx.deadline)
    title = f"profile ({tool})"
    if alone:
        ctx.reporter.message(f"profile {exp.name}: {len(points)} point(s) with {tool} (cache-control "
                             f"{exp.profile.cache_control}, clock-control {exp.profile.clock_control}, metric set "
                             f"{exp.profile.metric_set})")
        title = "profile"
    with ctx.reporter.task(title, total=len(points), unit="points") as task:
        counts = follow_points(ctx.run, "profile", points, task, lambda: measure_stage(
            ctx.run, "profile", exp, placement, ctx.reporter.message))
    if not alone:
        raise_unfinished(ctx, "profile", counts)
    return counts


def report_step(ctx: StepContext) -> None:
    with ctx.reporter.task("report") as task:
        # several GPU types (slurm.gpus): their runs side by side, compared with the first
        path = ctx.run.path
        out = render_report(list_runs(path / GPUS_DIR) or [path], path / artifact("report").path)
        if ctx.outcome is not None:
            ctx.outcome.report = out
        task.finish(f"written to {out}")


@dataclass(frozen=True)
class Step:
    """One step of `characterize run` (and of `selftest --gpu`, which runs the same list):
    what it writes into the run directory (characterize.rundir keys) and whether it
    measures (bench and profile need a GPU, an emulated backend or Slurm's nodes)."""

    name: str
    writes: tuple[str, ...]
    measures: bool
    run: Callable[[StepContext], object]
    what: str


#: the steps of a run, in order; each writes what it finished before the next starts
STEPS: tuple[Step, ...] = (
    Step("static", ("static", "sass"), False, lambda c: static_step(c.run, c.exp, c.reporter),
         "compile every variant: registers, spills, occupancy, each hot loop's SASS"),
    Step("locality", ("locality",), False, lambda c: locality_step(c.run, c.exp, c.reporter),
         "trace statistics: unique rows, top-K coverage, reuse distances"),
    Step("predict", ("predictions", "model_validation"), False,
         lambda c: predict_step(c.run, c.exp, stored_code(c.run, c.exp), c.reporter),
         "the model's time per variant x dataset x GPU, with bands"),
    Step("e2e", ("e2e",), False, lambda c: e2e_step(c.run, c.exp, stored_code(c.run, c.exp), c.reporter),
         "the DLRM step around each variant"),
    Step("bench", ("bench", "gpus", "jobs"), True, bench_step, "each point checked, then timed with CUDA events"),
    Step("profile", ("profile", "ncu"), True, profile_step, "each point under Nsight Compute"),
    Step("sweeps", ("static", "sass", "predictions"), False, lambda c: sweeps_step(c.run, c.exp, c.reporter),
         "after the answer: the register sweep, and each other precision's builds, hot loops and predictions"),
    Step("report", ("report",), False, report_step, "the HTML report"),
)


def run_experiment(exp: ExperimentConfig, out: Path | None = None, *, resume: bool = False,
                   progress: Reporter | Progress | None = None, ncu: str | None = None, backend: str = "cuda",
                   executor: str = "local", remeasure: bool = False,
                   after_step: Callable[[str, Path], None] | None = None,
                   budget_s: float | None = None) -> RunOutcome:
    """Run `exp` into `out`, step by step (STEPS); steps that cannot run here are recorded
    as skipped, with why. `progress` (a Reporter, or a plain callback for one line per
    step) follows each step; `after_step(name, run directory)` is called when a step has
    finished and written its results (the CLI streams the answer once predictions exist).
    backend emulate times the CPU emulation; executor slurm measures each point as one
    Slurm array task (the GPU is then the nodes', not this machine's). `remeasure`
    measures again the finished points whose fingerprint differs (changed parameters,
    settings or trace files) instead of refusing the resume. `budget_s`: seconds from now
    after which bench and profile stop; what they did not measure is cut, left for --resume."""
    deadline = None if budget_s is None else time.monotonic() + budget_s
    reporter = as_reporter(progress)
    if executor == "slurm":
        require_slurm()  # before any work: one line when Slurm cannot be reached from here
    found = devices() if backend == "cuda" and executor == "local" else []
    info = found[0] if found else None
    exp = check_experiment(exp, gpu=info.spec() if info else None)
    measured = _measured_elsewhere(out, resume, info, backend, executor)
    if measured is not None:   # a run measured on a GPU, analyzed here without one
        return _analyze_measured(exp, measured, reporter, after_step)
    run = open_experiment_run(exp, out, "bench", resume, info, backend, executor, remeasure)
    outcome = RunOutcome(run.path)
    ctx = StepContext(exp, run, reporter, backend, executor, ncu, info, outcome, deadline)
    run.log(f"run {exp.name} ({'GPU ' + info.name if info else 'no GPU'})")
    # the locality step, every precision's predictions and the DLRM step read and analyze each trace once
    with shared_datasets(), shared_reuse(), shared_profiles():
        _run_steps(ctx, after_step)
    return outcome


def _measured_elsewhere(out: Path | None, resume: bool, info: Any, backend: str, executor: str) -> Path | None:
    """The run directory to analyze without measuring: `--resume` of a run measured on a GPU,
    on a machine with none (its points stay as measured; nothing here could add to them)."""
    if not resume or out is None or info is not None or backend != "cuda" or executor != "local":
        return None
    if not (Path(out) / "meta.json").is_file():
        return None
    gpu = (load_run(out).meta.get("gpu") or {}).get("key")
    return Path(out) if gpu else None


def _analyze_measured(exp: ExperimentConfig, path: Path, reporter: Reporter,
                      after_step: Callable[[str, Path], None] | None) -> RunOutcome:
    """What a machine without the run's GPU can add to it: the static facts, trace locality,
    the model's predictions (for the run's GPU too) and the DLRM step's, and the report, so
    that its measured points stand beside predictions ("Predicted vs measured"). The run's
    experiment, GPU and fingerprint stay as measured; bench and profile are not run."""
    stored = load_run(path)
    gpu = stored.meta.get("gpu") or {}
    experiment = ExperimentConfig.from_dict(stored.meta["experiment"])
    if experiment.name != exp.name or experiment.workload != exp.workload:
        raise RunDirError(f"{path} holds a run of {experiment.name} ({experiment.workload}), not of {exp.name}; "
                          "analyze it with its own experiment, or choose another --out")
    run = RunDir.create(path, {}, resume=True)
    outcome = RunOutcome(run.path)
    ctx = StepContext(experiment, run, reporter, "cuda", "local", None, None, outcome)
    run.log(f"run {experiment.name}: analyzed without a GPU (measured on {gpu.get('name', gpu.get('key'))}); "
            "its points are kept as measured")
    # the static facts and predictions describe this checkout's kernels: say so when they are not the ones measured
    measured = ((stored.meta.get("fingerprint") or {}).get("toolkit") or {}).get("kernels")
    now = kernel_sources_digest()
    run.update_meta(analyzed={"at": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()), "kernels": now,
                              "git_revision": git_revision(), "measured_kernels": measured,
                              "same_kernels": measured == now if measured else None})
    if measured and measured != now:
        why = (f"the kernel sources changed since this run was measured ({measured} then, {now} now): its static "
               "facts and predictions describe today's kernels, its measurements the ones it ran")
        reporter.message(f"note: {why}")
        run.log(f"note: {why}")
    why = f"measured on {gpu.get('name') or gpu.get('key')}, kept as measured (this machine has no GPU)"
    with shared_datasets(), shared_reuse(), shared_profiles():
        for step in STEPS:
            if step.measures:
                outcome.steps[step.name] = f"skipped: {why}"
                continue
            run_step(ctx, step, after_step)
    return outcome


def _run_steps(ctx: StepContext, after_step: Callable[[str, Path], None] | None) -> None:
    run, outcome, say = ctx.run, ctx.outcome, ctx.reporter.message
    for step in STEPS:
        if step.name == "report":
            try:
                run.update_meta(steps=outcome.steps)
            except OSError as e:   # the outcomes are still printed and returned
                say(f"the steps' outcomes could not be recorded: {describe_os_error(e)}")
        if step.measures and ctx.cannot_measure:
            outcome.steps[step.name] = f"skipped: {ctx.cannot_measure}"
            continue
        if step.measures and ctx.deadline is not None and time.monotonic() >= ctx.deadline:
            outcome.steps[step.name] = "cut: the time budget ran out before it started; --resume runs it"
            say(f"{step.name} {outcome.steps[step.name]}")
            continue
        run_step(ctx, step, after_step)


def run_step(ctx: StepContext, step: Step, after_step: Callable[[str, Path], None] | None) -> None:
    """Run one step and record its outcome (in ctx.outcome, on the terminal, in the log):
    what it raised fails or cuts that step only, so the run goes on to the next."""
    outcome, say = ctx.outcome, ctx.reporter.message
    start = time.perf_counter()
    try:
        step.run(ctx)
    except OutOfTime as e:
        outcome.steps[step.name] = f"cut: {e}"
        say(f"{step.name} cut: {e}")
    except (ToolchainNotFound, NcuNotFound) as e:
        # a tool that is not installed skips its step; one named by the user and missing is an error
        verdict = "failed" if isinstance(e, NamedToolMissing) else "skipped"
        outcome.steps[step.name] = f"{verdict}: {e}"
        say(f"{step.name} {verdict}: {e}")
    except CharacterizeError as e:
        outcome.steps[step.name] = f"failed: {e}"
        say(f"{step.name} failed: {e}")
    except OSError as e:   # disk full, read-only, permissions: the step fails, the run goes on
        outcome.steps[step.name] = f"failed: {describe_os_error(e)}"
        say(f"{step.name} failed: {describe_os_error(e)}")
    else:
        outcome.steps[step.name] = "done"
        if after_step is not None:
            after_step(step.name, ctx.run.path)
    ctx.run.log(f"{step.name}: {outcome.steps[step.name]} ({time.perf_counter() - start:.1f} s)")

