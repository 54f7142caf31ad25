"""Pipeline: the one place that strings the stages together.

It checks an experiment against the registries (variants, datasets, architectures),
compiles (the only caller of the static characterization besides the `build`
command), feeds static rows to the model, and runs an experiment end to end into a
run directory: static characterization, trace locality, predictions, then on a GPU
timing and Nsight Compute profiling, and finally the report. Each step writes its
results as it finishes, so an interrupted run keeps everything already measured and
`--resume` continues it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import hashlib
import json
import os
import pickle
import shlex
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from characterize.analysis.calibrate import Calibration, fit_run, save_calibration, timed_gpu
from characterize.analysis.claims import CLAIM_ARCH, CLAIM_VARIANTS, paper_claims
from characterize.analysis.model.constants import ModelConstants, calibration_dir, load_calibration
from characterize.analysis.model.e2e import Overheads
from characterize.analysis.model.e2e import predict_step as predict_e2e
from characterize.analysis.model.geometry import _prepare as _prepare_points
from characterize.analysis.model.host import CACHE_SWEEP
from characterize.analysis.model.kernels import peer_dtype
from characterize.analysis.model.locality import shared_profiles
from characterize.analysis.model.predict import predict_experiment as model_predictions
from characterize.analysis.model.validation_error import write_model_error
from characterize.analysis.validation import (
    VALIDATION_CSV,
    VALIDATION_HERE_CSV,
    Validation,
    expressible,
    load_measurements,
    not_expressible,
    validate_here,
    validate_points,
)
from characterize.config import DTYPES, DlrmConfig, ExperimentConfig, WorkloadConfig, read_experiment
from characterize.errors import (
    CharacterizeError,
    GpuMemoryError,
    NamedToolMissing,
    NcuNotFound,
    NcuPermissionError,
    NoCudaDevice,
    OutOfTime,
    RunDirError,
    ToolchainNotFound,
    UnsupportedShape,
    WorkloadError,
    describe_os_error,
)
from characterize.files import one_at_a_time, write_atomic
from characterize.hardware.devices import devices, require_gpu
from characterize.hardware.specs import gpu_spec, normalize_arch
from characterize.kernels.build import buildable_arch, cache_root, reported_builds, toolkit_record
from characterize.kernels.check import CheckResult, check_variants
from characterize.kernels.library import unavailable
from characterize.kernels.registry import (
    HOST_VARIANTS,
    VARIANT_ORDER,
    check_caps,
    default_cache_rows,
    get_variant,
    register_user,
)
from characterize.kernels.static import analyze_variants, prebuild, static_characterization
from characterize.kernels.training import CUDA_BACKWARDS, kernel_for, training_facts
from characterize.kernels.user import sass_rows
from characterize.measure.e2e import check_pipeline, measure_step
from characterize.measure.executor import GPUS_DIR, Placement, gpu_identity, measure_stage, require_slurm
from characterize.measure.ncu import find_ncu
from characterize.measure.runner import (
    open_run,
    pending_points,
    points_failed,
    profile_estimate,
)
from characterize.memory import memory_budget
from characterize.progress import PerMessage, Progress, Reporter, Task, as_reporter
from characterize.progress import quiet as _quiet
from characterize.report.render import render_report
from characterize.rundir import artifact
from characterize.store import RunDir, environment, list_runs, load_run, run_fingerprint
from characterize.workloads.locality import check_dataset, coverage_ks, locality_stats, named_ks, shared_reuse
from characterize.workloads.presets import HOTNESS_ORDER, Hotness, parse_dataset
from characterize.workloads.shape import infer_workload, trace_shape
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


# ------------------------------------------------------------ experiments
def check_experiment(exp: ExperimentConfig, gpu: Any = None) -> ExperimentConfig:
    """`exp.validate(gpu)` plus the names it holds: datasets, variants (and whether
    each can run D), variant parameters and architectures. Empty datasets or variants
    mean all of them, in registry order; the returned experiment lists them. Before any
    work: without a GPU the workload must fit each target architecture's GPU, trace
    files must exist, and one table must fit the host-memory budget. Tables too large
    for the GPU steer an experiment that names no variants to the host-resident ones
    (cache, uvm); one that names GPU-resident variants is refused with that advice.
    Kernels of one's own ([variants.NAME] tables) are registered as variants here."""
    targets = [gpu] if gpu is not None else [gpu_spec(normalize_arch(a)) for a in exp.archs]
    default = VARIANT_ORDER
    if not exp.variants and not all(_fits(exp.workload, g) for g in targets):
        default = HOST_VARIANTS
    exp = dataclasses.replace(exp, datasets=exp.datasets or HOTNESS_ORDER, variants=exp.variants or default)
    exp.validate()
    for name, kernel in exp.user_kernels.items():   # [variants.NAME]: kernels of one's own beside the family
        register_user(name, kernel)
    for v in exp.variants:
        get_variant(v).check_shape(exp.workload.D, exp.workload.dtype)
    for v, p in exp.params.items():
        get_variant(v).resolve_params(p)
    for a in exp.archs:
        normalize_arch(a)
    check_caps(exp.maxrregcount, f"{exp.source or 'the experiment'}: maxrregcount")
    for g in targets:   # without a GPU here the workload must still fit each target architecture's GPU
        try:
            check_fit(exp, g)
        except GpuMemoryError as e:
            if default is not HOST_VARIANTS:
                raise
            try:
                exp.workload.validate(gpu=g)
            except GpuMemoryError as resident:
                raise GpuMemoryError(f"{resident}; kept in host memory it still does not fit: {e}") from None
    for d in exp.datasets:
        check_dataset(d, exp.workload)
    return exp


def check_names(exp: ExperimentConfig) -> ExperimentConfig:
    """The names an experiment holds (variants, datasets, architectures), checked before
    anything else, GPU or no GPU: an unknown one is refused in one line, with the name it
    is closest to. Trace files must exist."""
    for v in exp.variants:
        get_variant(v)
    for a in exp.archs:
        normalize_arch(a)
    for d in exp.datasets:
        if not isinstance(parse_dataset(d), Hotness) and not Path(parse_dataset(d)).is_file():
            check_dataset(d, exp.workload)   # the one-line "no such trace file" refusal
    return exp


def _fits(workload: WorkloadConfig, gpu: Any) -> bool:
    """Whether the tables (and traces) fit the GPU's memory."""
    return workload.device_bytes() <= gpu.memory_bytes


def check_fit(exp: ExperimentConfig, gpu: Any, variants: Sequence[str] | None = None) -> None:
    """GpuMemoryError unless each variant's share of the workload fits `gpu`: the tables
    for GPU-resident variants, the caches (cache) or nothing (uvm) for host-resident ones."""
    for host in dict.fromkeys(get_variant(v).host for v in (variants or exp.variants)):
        C = exp.params_for("cache").get("C") or default_cache_rows(exp.workload.E) if host == "cache" else 0
        exp.workload.validate(gpu=gpu, host=host, cache_rows=C)


def load_experiment(name_or_path: str | None = None) -> ExperimentConfig:
    """A shipped experiment by name ('paper', 'quick') or a TOML file, fully checked."""
    return check_experiment(read_experiment(name_or_path))


@dataclass
class TraceExperiment:
    """An experiment made for a trace file (`--trace`): the experiment, and one line per
    choice made for it (what the file said, what was given, what was left out)."""

    experiment: ExperimentConfig
    notes: list[str]


def trace_experiment(path: str | Path, base: str | None = None, **given: Any) -> TraceExperiment:
    """The experiment `base` (default 'paper': every variant, its architectures and bench
    settings) on one dataset, the trace file `path`, with the workload inferred from the
    file (workloads.shape.infer_workload: T, E and the bags from the file, D and a flat
    stream's T from `given`, else MissingInput). Extra precisions are left to --dtypes;
    variants that cannot run the inferred D are left out, and said so."""
    exp = read_experiment(base)
    shape = trace_shape(path)
    inferred = infer_workload(shape, exp.workload, given)
    wl = inferred.workload
    notes = list(inferred.notes)
    runnable = tuple(v for v in exp.variants if _reads(v, wl))
    dropped = [v for v in exp.variants if v not in runnable]
    if dropped:
        notes.append(f"left out: {', '.join(dropped)} (cannot run D={wl.D} {wl.dtype})")
    name = f"trace-{Path(path).stem}"
    exp = dataclasses.replace(exp, name=name, description=f"{exp.name} experiment on the trace {Path(path).name}",
                              datasets=(str(path),), workload=wl, variants=runnable, dtypes=())
    return TraceExperiment(check_experiment(exp), notes)


# ----------------------------------------------------------- static + model
@dataclass(frozen=True)
class CodeFacts:
    """What the compiled code says about the variants at one D, the model's inputs:
    ptxas resources and theoretical occupancy (static) and each kernel's hot loop
    read from its SASS (sass)."""

    D: int
    static: pd.DataFrame
    sass: pd.DataFrame

    def covers(self, variants: Sequence[str], archs: Sequence[str], D: int, dtype: str = "fp32") -> bool:
        """Whether these facts hold every compiled variant's rows on `archs` for `dtype`
        (rows written without a dtype are fp32 builds)."""
        if D != self.D:
            return False
        need = {(v, normalize_arch(a)) for v in variants if get_variant(v).compiled for a in archs}
        for df in (self.static, self.sass):
            if df.empty or not {"variant", "arch"} <= set(df.columns):
                return False
            dt = df["dtype"].astype(object).fillna("fp32") if "dtype" in df.columns else pd.Series("fp32", df.index)
            mine = df[dt == dtype]
            if not need <= set(zip(mine["variant"], mine["arch"])):
                return False
        return True


def sass_frame(variants: Sequence[str], archs: Sequence[str], D: int,
               params: Mapping[str, Any] | None = None, dtype: str = "fp32") -> pd.DataFrame:
    """The SASS hot-loop analysis as a frame (compiles; disassembles with cuobjdump).
    Per-width load counts and prefetch kinds are JSON objects in their cells."""
    rows = [r.to_dict() for r in analyze_variants(list(variants), list(archs), D=D, params=dict(params or {}),
                                                  dtype=dtype)]
    df = pd.DataFrame(rows)
    for col in ("load_bits", "prefetches", "bag_latencies", "bag_instructions"):
        if col in df.columns:
            df[col] = [json.dumps({str(k): v for k, v in d.items()}, sort_keys=True) for d in df[col]]
    return df


def code_facts(variants: Sequence[str], archs: Sequence[str], D: int, params: Mapping[str, Any] | None = None,
               sweep_caps: Sequence[int] = (), dtype: str = "fp32",
               progress: Reporter | Progress | None = None, also_dtypes: Sequence[str] = ()) -> CodeFacts:
    """Compile the variants (builds are cached), read ptxas's resources and the SASS;
    `progress` sees each build, compiled or reused. The builds of `also_dtypes` (the
    experiment's other precisions, characterized later) are compiled in the same parallel
    batches, so nvcc runs on every core from the start."""
    rep = as_reporter(progress)
    try:
        with reported_builds(rep, f"compile for {', '.join(archs)}"):
            prebuild(variants, archs, [dtype, *(d for d in also_dtypes if d != dtype)], sweep_caps, dict(params or {}),
                     D=D)
            rows = static_characterization(list(variants), list(archs), sweep_caps, D=D,
                                           params=dict(params or {}), dtype=dtype)
        with rep.task("SASS hot loops (cuobjdump)") as task:
            sass = sass_frame(variants, archs, D, params, dtype)
            task.finish(f"{len(sass)} kernel(s) analyzed")
    except ToolchainNotFound as e:
        raise type(e)(f"{e}; the model needs each variant's registers, occupancy and hot loop, which "
                                "come from the compiled code (or pass a run's static.csv and sass.csv)") from None
    return CodeFacts(D, pd.DataFrame([r.to_dict() for r in rows]), sass)


def predict(exp: ExperimentConfig, archs: Sequence[str] | None = None, *, code: CodeFacts | None = None,
            progress: Reporter | Progress | None = None, cache_ratios: Sequence[float] | None = None,
            profiles: dict | None = None, mode: str | Sequence[str] = "steady") -> pd.DataFrame:
    """Model predictions for `exp` on `archs` (architectures or GPU names), compiling
    what the model needs unless `code` already covers it; `cache_ratios` sweeps the
    cache variant's size (shares of E). The experiment's extra `dtypes` are predicted
    too (each variant that reads them at D), one row per dtype, for the precision grid.
    `mode`: steady (tables in turn, as in production), cold (L2 flushed before each
    launch, as a benchmark that flushes measures), or both."""
    # each trace read and analyzed once for every precision
    with shared_datasets(), shared_reuse(), shared_profiles():
        return _predict(exp, archs, code=code, progress=progress, cache_ratios=cache_ratios, profiles=profiles,
                        mode=mode)


def _predict(exp: ExperimentConfig, archs: Sequence[str] | None = None, *, code: CodeFacts | None = None,
             progress: Reporter | Progress | None = None, cache_ratios: Sequence[float] | None = None,
             profiles: dict | None = None, mode: str | Sequence[str] = "steady") -> pd.DataFrame:
    targets = list(archs or exp.archs)
    if cache_ratios and "cache" not in exp.variants:   # a cache-size sweep is about the cache variant
        exp = dataclasses.replace(exp, variants=(*exp.variants, "cache"))
    for t in targets:  # a prediction for a GPU the workload cannot fit is refused, not made up
        check_fit(exp, gpu_spec(t))
    gpu_archs = list(dict.fromkeys(gpu_spec(a).arch for a in targets))
    # host-resident variants run base's kernel: base's code facts are theirs (and every row's reference,
    # where base reads the tables: not fp8, which tbe alone reads)
    ref = ["base"] if _reads("base", exp.workload) else []
    names = list(dict.fromkeys([*ref, *(v for v in exp.variants if get_variant(v).host == "none")]))
    dtype = exp.workload.dtype
    if code is None or not code.covers(names, gpu_archs, exp.workload.D, dtype):
        # an architecture this nvcc cannot build (CUDA 13: Volta) is modelled from the closest one it can
        code_archs = list(dict.fromkeys(buildable_arch(a) for a in gpu_archs))
        if code is None or not code.covers(names, code_archs, exp.workload.D, dtype):
            code = code_facts(names, code_archs, exp.workload.D, exp.params, dtype=dtype, progress=progress,
                              also_dtypes=exp.dtypes)
    rep = as_reporter(progress)
    custom = user_sass(exp, gpu_archs, rep)
    key = None
    if profiles is None:   # the whole experiment (every precision): kept in the build cache
        key = _predictions_key(exp, targets, code, custom, cache_ratios, mode)
        kept = _kept_predictions(key)
        if kept is not None:
            with rep.task(f"predictions for {', '.join(targets)}") as task:
                task.finish(f"{len(kept)} point(s), kept from an earlier run of the same inputs")
            return kept
    with rep.task(f"predictions for {', '.join(targets)}", total=len(exp.datasets), unit="datasets") as task:
        per = PerMessage(task, len(exp.datasets))
        profiles = {} if profiles is None else profiles   # the traces' locality, shared by every dtype
        df = model_predictions(exp, targets, static=code.static, sass=code.sass, progress=per,
                               cache_ratios=cache_ratios, profiles=profiles, custom=custom, mode=mode)
        per.close()
        task.finish(f"{len(df)} point(s) predicted")
    for dt in dict.fromkeys(exp.dtypes):
        if dt == exp.workload.dtype:
            continue
        wl = exp.workload.replace(dtype=dt)
        other = dataclasses.replace(exp, workload=wl, dtypes=(), variants=tuple(v for v in exp.variants
                                                                                if _reads(v, wl)))
        if not other.variants:   # none of the experiment's variants reads this dtype (fp8: tbe alone)
            continue
        df = pd.concat([df, predict(other, targets, code=code, progress=progress, cache_ratios=cache_ratios,
                                    profiles=profiles, mode=mode)],
                       ignore_index=True)
    return df if key is None else _keep_predictions(key, df)


def _predictions_key(exp: ExperimentConfig, targets: Sequence[str], code: CodeFacts, custom: Mapping[str, Any],
                     cache_ratios: Sequence[float] | None, mode: str | Sequence[str]) -> str:
    """Everything an experiment's predictions depend on, digested: the experiment, the
    targets, the kernels' facts, the package's code and data, the stored calibrations and
    each trace file's identity (path, size, modification time)."""
    parts = [json.dumps([exp.to_dict(), list(targets), list(cache_ratios or []), mode, custom, pd.__version__,
                         np.__version__], sort_keys=True, default=str).encode()]
    parts += [b"|" + (frame.to_csv(index=False).encode() if frame is not None else b"")
              for frame in (code.static, code.sass)]
    for spec in exp.datasets:
        parsed = parse_dataset(spec)
        if not isinstance(parsed, Hotness):
            with contextlib.suppress(OSError):
                st = Path(parsed).stat()
                parts.append(f"{Path(parsed).resolve()}:{st.st_size}:{st.st_mtime_ns}".encode())
    return _inputs_digest(parts)


def _kept_predictions(key: str) -> pd.DataFrame | None:
    """Predictions an earlier run stored under `key`, or None (a damaged entry is None).
    Pickled, as the in-memory frame is (empty notes stay empty strings, attrs stay): the
    build cache is trusted like the libraries it holds, which are loaded as they are."""
    try:
        df = pd.read_pickle(cache_root() / "predictions" / f"{key}.pkl")
    except Exception:   # noqa: BLE001 - truncated, foreign or from another pandas: computed again
        return None
    return df if isinstance(df, pd.DataFrame) else None


def _keep_predictions(key: str, df: pd.DataFrame) -> pd.DataFrame:
    """Store `df` under `key` (a read-only cache keeps nothing; the predictions stand)."""
    with contextlib.suppress(OSError, ValueError):   # OutputError is a ValueError
        write_atomic(cache_root() / "predictions" / f"{key}.pkl", pickle.dumps(df, protocol=pickle.HIGHEST_PROTOCOL))
    return df


def user_sass(exp: ExperimentConfig, archs: Sequence[str], progress: Reporter) -> dict[str, dict[str, dict]]:
    """The SASS rows of the experiment's kernels of one's own, per architecture (each
    built from its source, or read from its binary)."""
    out: dict[str, dict[str, dict]] = {}
    for name in exp.variants:
        v = get_variant(name)
        if v.peer != "user":
            continue
        with progress.task(f"your kernel {name}: SASS ({', '.join(archs)})") as task:
            out[name] = sass_rows(v.user, archs, exp.workload.dtype)
            nest = [r.get("nest_rows_in_flight") for r in out[name].values()]
            task.finish(f"{', '.join(f'{a}: {n} rows in flight' for a, n in zip(out[name], nest))}")
    return out


def predict_experiment(exp: ExperimentConfig, archs: Sequence[str] | None = None, **kwargs: Any) -> pd.DataFrame:
    """The same as `predict` (compiling what the model reads), under the name notebooks use."""
    return predict(exp, archs, **kwargs)


def _reads(variant: str, wl: WorkloadConfig) -> bool:
    """Whether a variant reads tables of the workload's dtype at its D (a peer: the
    dtype its users run for it, FBGEMM's int8 rows for an int8 table)."""
    v = get_variant(variant)
    try:
        v.check_shape(wl.D, peer_dtype(v.peer, wl.dtype) if v.peer else wl.dtype)
    except UnsupportedShape:
        return False
    return True


def model_validation(code: CodeFacts | None = None, progress: Reporter | Progress | None = None) -> pd.DataFrame:
    """The model against the paper's A100 claims, at the paper's configuration. The same for
    every experiment, and seconds of trace analysis at the paper's size: kept in the build
    cache, keyed by everything it depends on (the claims' kernels' facts, the package's
    code and data, the stored calibrations); a damaged entry is computed again."""
    wl = WorkloadConfig.paper()
    if code is None or not code.covers(CLAIM_VARIANTS, [CLAIM_ARCH], wl.D):
        code = code_facts(CLAIM_VARIANTS, [CLAIM_ARCH], wl.D, progress=progress)
    key = _claims_key(code)
    path = cache_root() / "claims" / f"{key}.csv"
    with one_at_a_time(cache_root() / "locks" / f"claims-{key}.lock"):   # runs started together compute it once
        try:
            return pd.read_csv(path)
        except (OSError, ValueError):
            pass
        claims = paper_claims(wl, CLAIM_ARCH, static=code.static, sass=code.sass)
        try:
            write_atomic(path, claims.to_csv(index=False))
            return pd.read_csv(path)   # as a later run reads it back, so both runs write the same file
        except (OSError, ValueError):   # OutputError is a ValueError
            return claims


def _claims_key(code: CodeFacts) -> str:
    """What the paper claims' check depends on, digested."""
    return _inputs_digest(frame[frame["variant"].isin(CLAIM_VARIANTS) & (frame["arch"] == CLAIM_ARCH)]
                          .to_csv(index=False).encode()
                          for frame in (code.static, code.sass)
                          if frame is not None and not frame.empty and {"variant", "arch"} <= set(frame.columns))


def _inputs_digest(parts: Iterable[bytes]) -> str:
    """A cache key: the package's code and data, `parts`, then the stored calibrations (the
    model's constants per GPU), digested."""
    h = hashlib.sha256(_package_digest().encode())
    for part in parts:
        h.update(part)
    folder = calibration_dir()
    for f in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        with contextlib.suppress(OSError):
            h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()[:24]


@functools.lru_cache(maxsize=1)
def _package_digest() -> str:
    """The package's code and data (the model, its corpus, the presets, the spec table)."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for f in sorted(root.rglob("*")):
        if f.suffix in (".py", ".csv", ".json", ".toml") and "__pycache__" not in f.parts:
            h.update(str(f.relative_to(root)).encode() + f.read_bytes())
    return h.hexdigest()


def calibrate(run_dir: str | Path, gpu: str | None = None, progress: Progress | None = None) -> Calibration:
    """Fit the model to a measured run (compiling what the model needs for its GPU if
    the run lacks it) and store the constants for that GPU."""
    run = load_run(run_dir)
    arch = timed_gpu(run, gpu).arch   # before compiling anything: timings of that GPU, not the CPU emulation's
    exp = ExperimentConfig.from_dict(run.meta.get("experiment") or {})
    code = CodeFacts(exp.workload.D, run.static, run.sass)
    names = list(dict.fromkeys(["base", *exp.variants]))
    if not code.covers(names, [arch], exp.workload.D):
        code = code_facts(names, [arch], exp.workload.D, exp.params, dtype=exp.workload.dtype)
    cal = fit_run(run, gpu, static=code.static, sass=code.sass, progress=progress)
    save_calibration(cal)
    return cal


# ------------------------------------------------------------ run directories
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
    """static.csv (with the register sweep) and sass.csv of the experiment's variants, at
    the workload's dtype and at each of the precision grid's (the facts its predictions
    read, so that the run directory says where every prediction came from)."""
    archs = list(dict.fromkeys(buildable_arch(a) for a in exp.archs))   # CUDA 13 builds no Volta: its stand-in
    code = code_facts(exp.variants, archs, exp.workload.D, exp.params, exp.maxrregcount, exp.workload.dtype,
                      progress=progress, also_dtypes=exp.dtypes)
    statics, sasses = [code.static], [code.sass]
    for dt in dict.fromkeys(exp.dtypes):
        if dt == exp.workload.dtype:
            continue
        wl = exp.workload.replace(dtype=dt)
        names = [v for v in dict.fromkeys(["base", *exp.variants]) if get_variant(v).compiled and _reads(v, wl)]
        more = code_facts(names, archs, exp.workload.D, exp.params, dtype=dt, progress=progress)
        statics.append(more.static)
        sasses.append(more.sass)
    code = CodeFacts(exp.workload.D, pd.concat(statics, ignore_index=True), pd.concat(sasses, ignore_index=True))
    run.write("static", code.static)
    run.write("sass", code.sass)
    return code


def _read_code(run: RunDir, exp: ExperimentConfig) -> CodeFacts | None:
    """What the static step wrote, if it ran (the model then needs no compiler)."""
    stored = load_run(run.path)
    if stored.static.empty or stored.sass.empty:
        return None
    return CodeFacts(exp.workload.D, stored.static, stored.sass)


def predict_step(run: RunDir, exp: ExperimentConfig, code: CodeFacts | None = None,
                 progress: Reporter | Progress = _quiet) -> pd.DataFrame:
    """Model predictions for every variant x dataset x architecture (and the run's GPU)."""
    archs = list(exp.archs)
    gpu = load_run(run.path).meta.get("gpu") or {}
    if gpu.get("key") and gpu["key"] not in archs:
        archs.append(gpu["key"])
    sweep = CACHE_SWEEP if "cache" in exp.variants and "C" not in exp.params_for("cache") else None
    df = predict(exp, archs, code=code, progress=progress, cache_ratios=sweep)
    run.write("predictions", df)
    with as_reporter(progress).task("the model against the paper's claims") as task:
        claims = model_validation(code, progress=progress)
        task.finish(f"{len(claims)} claim(s) checked")
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


def _e2e_embedding(predictions: pd.DataFrame | None, variants: Sequence[str], targets: Sequence[str],
                   dtype: str) -> pd.DataFrame | None:
    """The embedding stage's rows from earlier predictions, or None unless they cover
    every variant on every target at the workload's precision."""
    if predictions is None or predictions.empty or not {"variant", "gpu", "arch"} <= set(predictions.columns):
        return None
    if "cache_ratio" in predictions.columns and predictions["cache_ratio"].notna().any():
        return None   # a cache-size sweep: the step takes the configured cache, predicted afresh
    df = predictions
    if "dtype" in df.columns:
        df = df[df["dtype"] == dtype]
    for t in targets:
        spec = gpu_spec(t)
        have = set(df.loc[df["gpu"] == spec.key, "variant"])
        if not set(variants) <= have:
            return None
    return df[df["gpu"].isin([gpu_spec(t).key for t in targets])]


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


def _bench(ctx: StepContext) -> None:
    exp = _measurable(ctx, "bench")
    points = pending_points(ctx.run, "bench", exp, say=ctx.reporter.message)
    where = "CUDA events" if ctx.backend == "cuda" else "CPU emulation"
    with ctx.reporter.task(f"bench ({where}{', Slurm' if ctx.executor == 'slurm' else ''})", total=len(points),
                           unit="points") as task:
        counts = follow_points(ctx.run, "bench", points, task, lambda: measure_stage(
            ctx.run, "bench", exp, Placement(ctx.executor, ctx.backend, deadline=ctx.deadline),
            ctx.reporter.message))
    _cut_or_failed(ctx, "bench", counts)


def _cut_or_failed(ctx: StepContext, kind: str, counts: dict[str, int]) -> None:
    """The error a measuring step ends with: its failed points, or the points its budget cut."""
    if (failed := points_failed(ctx.run, kind, counts)) is not None:
        raise failed
    if counts.get("cut"):
        raise OutOfTime(f"{counts['ok']} {kind} point(s) measured, {counts['cut']} cut when the time budget ran out; "
                        f"--resume measures them")


def _profile(ctx: StepContext) -> None:
    # through Slurm, --ncu names ncu on the nodes; without it, ncu must be found here too
    tool = ctx.ncu if ctx.executor == "slurm" and ctx.ncu else str(find_ncu(ctx.ncu))
    exp = _measurable(ctx, "profile")
    points = pending_points(ctx.run, "profile", exp, say=ctx.reporter.message)
    placement = Placement(ctx.executor, ctx.backend, tool if ctx.executor == "local" or ctx.ncu else None,
                          deadline=ctx.deadline)
    with ctx.reporter.task(f"profile ({tool})", total=len(points), unit="points") as task:
        counts = follow_points(ctx.run, "profile", points, task, lambda: measure_stage(
            ctx.run, "profile", exp, placement, ctx.reporter.message))
    _cut_or_failed(ctx, "profile", counts)


def _report(ctx: StepContext) -> None:
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
         lambda c: predict_step(c.run, c.exp, _read_code(c.run, c.exp), c.reporter),
         "the model's time per variant x dataset x GPU, with bands"),
    Step("e2e", ("e2e",), False, lambda c: e2e_step(c.run, c.exp, _read_code(c.run, c.exp), c.reporter),
         "the DLRM step around each variant"),
    Step("bench", ("bench", "gpus", "jobs"), True, _bench, "each point checked, then timed with CUDA events"),
    Step("profile", ("profile", "ncu"), True, _profile, "each point under Nsight Compute"),
    Step("report", ("report",), False, _report, "the HTML report"),
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
    why = f"measured on {gpu.get('name') or gpu.get('key')}, kept as measured (this machine has no GPU)"
    with shared_datasets(), shared_reuse(), shared_profiles():
        for step in STEPS:
            if step.measures:
                outcome.steps[step.name] = f"skipped: {why}"
                continue
            start = time.perf_counter()
            try:
                step.run(ctx)
            except CharacterizeError as e:
                outcome.steps[step.name] = f"failed: {e}"
                reporter.message(f"{step.name} failed: {e}")
            else:
                outcome.steps[step.name] = "done"
                if after_step is not None:
                    after_step(step.name, run.path)
            run.log(f"{step.name}: {outcome.steps[step.name]} ({time.perf_counter() - start:.1f} s)")
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
                after_step(step.name, run.path)
        run.log(f"{step.name}: {outcome.steps[step.name]} ({time.perf_counter() - start:.1f} s)")


# -------------------------------------------------------------- validation
def measured_points(rows: Sequence[Any], progress: Reporter | Progress | None = None
                    ) -> tuple[list[Any], list[Any], list[dict[str, str]]]:
    """The model's prepared point of each corpus row (analysis.validation.Measurement): the
    rows it could prepare, their points, and the rows it could not, with why. Code facts and
    trace profiles are shared by the rows that have the same."""
    rep = as_reporter(progress)
    facts: dict[tuple, CodeFacts] = {}
    profiles: dict[tuple, Any] = {}
    points, kept, left = [], [], []
    with rep.task("predicting the measurements", total=len(rows), unit="rows") as task:
        for m in rows:
            task.advance(0, item=f"{m.id} {m.variant} on {m.gpu}")
            try:
                gpu = gpu_spec(m.gpu)
                v = get_variant(m.variant)
                static = sass = None
                if v.compiled or v.host != "none":   # a host-resident table is gathered by base's kernel
                    arch = buildable_arch(gpu.arch)
                    names = [m.variant] if v.host == "none" else ["base"]
                    key = (*names, arch, m.workload.D, m.workload.dtype, json.dumps(m.params, sort_keys=True))
                    if key not in facts:
                        facts[key] = code_facts(names, [arch], m.workload.D, m.params, dtype=m.workload.dtype)
                    static, sass = facts[key].static, facts[key].sass
                pts = _prepare_points(m.workload, [m.dataset], [m.variant], [gpu], m.params, static, sass, 1, m.mode,
                                      profiles, None, set_aside=m.set_aside, with_base=False)
                points.append(next(p for p in pts if p.variant == m.variant))
                kept.append(m)
            except CharacterizeError as e:
                left.append({"id": m.id, "source": m.source, "gpu": m.gpu, "kernel": m.variant,
                             "why_not": f"not predictable here: {e}"})
            task.advance(1)
        task.finish(f"{len(kept)} of {len(rows)} expressible row(s) predicted")
    return kept, points, left


def validate(*, write: bool = False, progress: Reporter | Progress | None = None) -> Validation:
    """The model against the corpus (analysis.validation): each expressible row predicted
    from the code facts of its kernel (ours compiled here, the peers' from their SASS). The
    public measurements are scored with the published constants and under leave-one-source-
    out cross-validation; our own measured runs (measured_here.csv) under leave-one-dataset-
    out and leave-one-shape-out, with bands per regime from held-out residuals. `write`
    stores the figures and bands every later prediction carries (model_error.json) and the
    per-row results."""
    rep = as_reporter(progress)
    corpus = load_measurements()
    kept, points, left = measured_points(expressible(corpus), rep)
    public = [i for i, m in enumerate(kept) if m.origin != "here"]
    ours = [i for i, m in enumerate(kept) if m.origin == "here"]
    consts = {p.gpu.key: ModelConstants.defaults(p.gpu) for p in points}   # published: no machine's calibration
    with rep.task("leave-one-source-out cross-validation") as task:
        result = validate_points([kept[i] for i in public], [points[i] for i in public], consts)
        task.finish(f"{result.error.n} measurements, {result.error.sources} sources")
    if ours:
        with rep.task("our runs: leave-one-dataset-out and leave-one-shape-out") as task:
            here = validate_here([kept[i] for i in ours], [points[i] for i in ours], consts)
            task.finish(f"{len(ours)} points, {len(here.bands)} regimes")
        result.here = here
        overall = here.by["source"].set_index("source").loc["all"]
        result.error = dataclasses.replace(
            result.error, here={"n": int(overall["n"]), "gmae": float(overall["gmae"]), "mape": float(overall["mape"]),
                                "coverage": float(overall["inside_band"]), "cv": "leave-one-dataset-out"},
            regimes={r: [round(a, 4), round(b, 4), n] for r, (a, b, n) in here.bands.items()})
    result.left_out = pd.concat([not_expressible(corpus), pd.DataFrame(left)], ignore_index=True)
    if write:
        write_model_error(result.error)
        result.rows.to_csv(VALIDATION_CSV, index=False)
        if result.here is not None:
            result.here.rows.to_csv(VALIDATION_HERE_CSV, index=False)
    return result


# -------------------------------------------------------------- end to end
@dataclass
class E2EOutcome:
    """`characterize e2e`: the stage table and the CPU correctness checks."""

    rows: pd.DataFrame    # variant, dataset, gpu, arch, phase, stage, time_us(_low/_high), source, speedups
    checks: pd.DataFrame  # variant, phase, backward, optimizer, max_abs_error, ok
    training: pd.DataFrame = field(default_factory=pd.DataFrame)  # our backward's facts (kernels.training)


def e2e(exp: ExperimentConfig, variants: Sequence[str] | None = None, archs: Sequence[str] | None = None, *,
        dlrm: DlrmConfig | None = None, backward: str = "sort", optimizer: str = "sgd",
        overheads: Overheads | None = None, check: bool = True, code: CodeFacts | None = None,
        predictions: pd.DataFrame | None = None, progress: Reporter | Progress | None = None,
        datasets: Sequence[str] | None = None, reps: int = 20, measure: bool = True) -> E2EOutcome:
    """The DLRM step around each variant: checked on the CPU (or the GPU) at a small
    size, predicted stage by stage for every target GPU, and measured when a GPU is here
    (and `measure`; `datasets` of the experiment's, `reps` timed steps each). `predictions`
    (a run's, covering the variants and targets) spare predicting the embedding stage
    again; the step runs at the workload's own precision. A variant that cannot run here
    (FBGEMM not installed) is predicted but neither checked nor measured, said in one line."""
    reporter = as_reporter(progress)
    say = reporter.message
    dlrm = (dlrm or DlrmConfig.for_dim(exp.workload.D)).validate(exp.workload.D)
    overheads = (overheads or Overheads()).validate()
    exp = check_experiment(exp)
    names = list(dict.fromkeys(["base", *(variants or exp.variants)]))   # base: the speedups' reference
    exp = dataclasses.replace(exp, variants=tuple(names))
    found = devices()
    backend = "cuda" if found else "emulate"
    skipped = {v: why for v in names if (why := unavailable(v, backend))}
    for v, why in skipped.items():
        say(f"e2e: {v} predicted only, not checked or measured: {why}")
    runnable = [v for v in names if v not in skipped]
    checks = pd.DataFrame()
    if check:
        say(f"checking the DLRM step of {len(runnable)} variant(s) against torch autograd "
            f"({'GPU' if found else 'CPU emulation'})")
        checks = pd.DataFrame(check_pipeline(runnable, backend=backend))
    targets = list(archs or exp.archs)
    emb = _e2e_embedding(predictions, names, targets, exp.workload.dtype)
    if emb is None:
        emb = predict(dataclasses.replace(exp, dtypes=()), targets, code=code, progress=reporter)
    emb = emb[emb["mode"] == "steady"]
    gpus = [gpu_spec(t) for t in targets]
    constants = {g.key: load_calibration(g) or ModelConstants.defaults(g) for g in gpus}
    unique, hottest = {}, {}
    for ds in exp.datasets:
        first, _ = load_dataset(ds, exp.workload, tables=[0]).tables[0].batch(0)
        counts = pd.Series(first).value_counts()
        unique[ds], hottest[ds] = float(len(counts)), float(counts.max()) if len(counts) else 0.0
    training = pd.DataFrame()
    if backward in CUDA_BACKWARDS:   # our backward: modelled from its static and SASS facts
        kernel = kernel_for(backward, optimizer).name
        say(f"reading {kernel}'s registers, occupancy and hot loop for {', '.join(targets)}")
        training = training_facts([kernel], list(dict.fromkeys(g.arch for g in gpus)), D=exp.workload.D,
                                  dtype=exp.workload.dtype)
    rows = predict_e2e(exp.workload, dlrm, emb, gpus, constants, unique, backward=backward, optimizer=optimizer,
                       overheads=overheads, training=training, hottest=hottest)
    if found and measure:
        timed = list(datasets or exp.datasets)
        estimate = e2e_estimate(exp.workload, len(runnable), len(timed), reps)
        say(f"timing the DLRM step on the GPU: {len(runnable)} variant(s) x {len(timed)} dataset(s), inference and "
            f"training, {reps} steps each; about {estimate:.0f} s")
        measured = pd.DataFrame(measure_step(exp.workload, dlrm, runnable, timed, backward=backward,
                                             optimizer=optimizer, params=exp.params, reps=reps, progress=say))
        info = found[0].spec()
        rows = pd.concat([rows, measured.assign(gpu=info.key, arch=info.arch)], ignore_index=True)
    return E2EOutcome(rows, checks, training)


@dataclass(frozen=True)
class E2ECosts:
    """What timing the DLRM step costs, as planned before it starts (upper bounds until a
    GPU run's log replaces them): building the model, loading a dataset, binding a variant,
    and one step at the paper's shape."""

    model_s: float = 5.0             # the model's tables and MLPs on the device
    lookups_per_s: float = 7e6       # a dataset's trace generated and copied (as profile's)
    bind_s: float = 1.0              # a variant bound to every table (hot rows, reordering)
    step_s_per_Mlookup: float = 0.01  # one inference + one training step per million lookups of a batch


def e2e_estimate(wl: WorkloadConfig, variants: int, datasets: int, reps: int, costs: E2ECosts = E2ECosts()) -> float:
    """Seconds timing the DLRM step of `variants` x `datasets` should take (warm-up included)."""
    lookups = wl.T * wl.lookups_per_batch
    steps = (reps + 3) * 2   # warm-up and timed, inference and training
    return (costs.model_s + datasets * wl.T * wl.batches * wl.lookups_per_batch / costs.lookups_per_s
            + variants * datasets * (costs.bind_s + steps * costs.step_s_per_Mlookup * lookups / 1e6))


# --------------------------------------------------------------- self-test
SELFTEST_EXPERIMENT = "selftest"
#: what the self-test checks on the device: every variant x dtype once (sum), and every variant in mean mode
SELFTEST_CHECK_DATASET = "medium"
#: the self-test's default time budget: a short loan of a GPU or a cluster job's limit
SELFTEST_BUDGET_S = 480.0
#: timed DLRM steps per variant in the self-test (the `e2e` command takes 20)
SELFTEST_E2E_REPS = 10


@dataclass(frozen=True)
class SelftestCosts:
    """Seconds each unit of the self-test costs, as planned (upper bounds; the profile's and
    the DLRM step's own estimates come from measure.runner.ProfileCosts and E2ECosts)."""

    build_s: float = 15.0           # one nvcc build of the family, one core (a cold cache; a warm one costs ~0)
    check_s: float = 0.5            # one device check at the tiny shape (B=127), library already loaded
    worker_start_s: float = 10.0    # a bench worker: python, torch and CUDA context, tables generated
    point_overhead_s: float = 2.0   # a bench point's bind, check and warm-up batches
    report_s: float = 30.0          # the static step's builds and SASS reading, locality, predictions, the report


@dataclass(frozen=True)
class PlannedStep:
    """One step of the self-test as planned: its estimate, and whether the budget holds it."""

    name: str
    units: int
    seconds: float
    what: str
    fits: bool = True
    why: str = ""      # why it was cut, when it does not fit


@dataclass(frozen=True)
class SelftestPlan:
    """What `selftest --gpu` will do, in the order of what it is worth, and what the budget cuts."""

    steps: tuple[PlannedStep, ...]
    budget_s: float = SELFTEST_BUDGET_S

    @property
    def seconds(self) -> float:
        """Seconds the steps that fit should take."""
        return sum(st.seconds for st in self.steps if st.fits)

    def step(self, name: str) -> PlannedStep:
        return next(st for st in self.steps if st.name == name)

    def lines(self) -> list[str]:
        cut = [st.name for st in self.steps if not st.fits]
        out = [f"self-test plan: about {self.seconds:.0f} s of a {self.budget_s:.0f} s budget"
               + (f" ({', '.join(cut)} cut)" if cut else "")]
        for st in self.steps:
            tail = st.what if st.fits else f"CUT: {st.why}"
            out.append(f"  {st.name:8s} {st.units:4d} x  {st.seconds:6.0f} s  {tail}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"budget_s": self.budget_s, "seconds": self.seconds,
                "steps": [dataclasses.asdict(st) for st in self.steps]}


def selftest_checks() -> list[tuple[str, str]]:
    """(mode, dtype) groups the device check covers: every dtype in sum mode, fp32 in mean mode."""
    return [("sum", dt) for dt in DTYPES] + [("mean", "fp32")]


def selftest_plan(exp: ExperimentConfig, cores: int = 16, costs: SelftestCosts = SelftestCosts(),
                  budget_s: float = SELFTEST_BUDGET_S) -> SelftestPlan:
    """The self-test's steps in the order of what each is worth, each with its estimate, and
    which the budget holds: the device check of every variant x dtype (builds included), bench
    of the experiment in its modes, ncu of every variant on its first dataset (one process
    and the cache counters), the DLRM step timed on that dataset, and the report (static
    facts, locality, predictions), whose time is kept aside first: it always runs."""
    names = [n for n in VARIANT_ORDER + HOST_VARIANTS if not get_variant(n).test_only]
    check_runs = len(names) * len(selftest_checks())
    builds = len(DTYPES) * 2   # each dtype: uncapped and at the cap
    check_s = costs.build_s * builds / max(1, min(cores, builds)) + check_runs * costs.check_s
    points = len(exp.variants) * len(exp.datasets)
    per_point = costs.point_overhead_s + len(exp.bench.modes) * (exp.bench.budget_s + 1.0)
    bench_s = costs.worker_start_s + points * per_point
    first = exp.datasets[:1]
    profiled = profile_estimate(exp, [(v, d) for d in first for v in exp.variants])
    e2e_variants = len(dict.fromkeys(["base", *exp.variants]))
    e2e_s = e2e_estimate(exp.workload, e2e_variants, len(first), SELFTEST_E2E_REPS)
    planned = [
        ("check", check_runs, check_s, f"each variant x dtype once on the device ({SELFTEST_CHECK_DATASET}, sum), "
                                       "and in mean mode"),
        ("bench", points, bench_s, f"{len(exp.variants)} variants x {len(exp.datasets)} datasets, modes "
                                   f"{', '.join(exp.bench.modes)}, {exp.bench.budget_s:g} s budget each"),
        ("profile", len(exp.variants), profiled.seconds, f"every variant on {', '.join(first)} under one ncu "
                                                         f"process, then its cache counters ({profiled.describe()})"),
        ("e2e", e2e_variants, e2e_s, f"the DLRM step timed around each variant on {', '.join(first)}, inference and "
                                     f"training, {SELFTEST_E2E_REPS} steps each"),
    ]
    left = budget_s - costs.report_s
    steps = []
    for name, units, seconds, what in planned:
        fits = seconds <= left
        why = "" if fits else f"would take about {seconds:.0f} s, {max(0.0, left):.0f} s of the budget left"
        left -= seconds if fits else 0.0
        steps.append(PlannedStep(name, units, seconds, what, fits, why))
    steps.append(PlannedStep("report", 1, costs.report_s, "static facts and SASS, locality, predictions, the HTML "
                                                          "report (always: its time is kept aside first)"))
    return SelftestPlan(tuple(steps), budget_s)


@dataclass
class SelftestOutcome:
    checks: list[CheckResult]
    run: RunOutcome
    seconds: float
    problems: list[str]   # empty: the whole GPU path works on this GPU (or every cut is said)
    plan: SelftestPlan | None = None
    archive: Path | None = None


#: the self-test's own record in its run directory: the plan, each step's outcome and time, the checks
SELFTEST_RECORD = "selftest.json"


def selftest_gpu(out: Path | None = None, *, ncu: str | None = None, resume: bool = False,
                 progress: Reporter | Progress | None = None, budget_s: float = SELFTEST_BUDGET_S,
                 experiment: str = SELFTEST_EXPERIMENT, backend: str = "cuda") -> SelftestOutcome:
    """The whole GPU path on this machine's first GPU within `budget_s`: the plan first (what
    fits, what is cut and why), then each step that fits under the time left, in the order
    of what it is worth (selftest_plan), into one run directory (profiles/<gpu>/selftest) with
    its record (selftest.json: the plan, each step's outcome and seconds, the checks) and one
    archive of it beside it (<run>.tar.gz), written after every step. `resume` continues: the
    steps done are kept, the rest runs under a new budget. Raises NoCudaDevice without a GPU
    (backend "emulate" rehearses it on the CPU emulation). Nothing is hidden: a failed check,
    a failed or cut step, or a failed point is a problem."""
    import os
    import shutil

    rep = as_reporter(progress)
    exp = load_experiment(experiment)
    plan = selftest_plan(exp, os.cpu_count() or 1, budget_s=budget_s)
    for line in plan.lines():
        rep.message(line)
    gpu = require_gpu() if backend == "cuda" else None
    key = gpu.spec().key if gpu is not None else "cpu-emulation"
    path = out or Path("profiles") / key / "selftest"
    start = time.monotonic()
    deadline = start + budget_s
    run = open_experiment_run(exp, path, "bench", resume, gpu, backend)
    record_path = run.path / SELFTEST_RECORD
    record = json.loads(record_path.read_text()) if resume and record_path.is_file() else {}
    done = {k for k, v in record.get("steps", {}).items() if v.get("status") == "done"}
    record = {"plan": plan.to_dict(), "steps": {k: v for k, v in record.get("steps", {}).items() if k in done},
              "checks": record.get("checks", []), "backend": backend, "resumed": bool(done)}
    outcome = RunOutcome(run.path)
    ctx = StepContext(exp, run, rep, backend, "local", ncu, gpu, outcome, deadline)
    checks: list[CheckResult] = []
    archive = run.path.parent / f"{run.path.name}.tar.gz"

    def keep(name: str, status: str, seconds: float, note: str = "") -> None:
        record["steps"][name] = {"status": status, "seconds": round(seconds, 1),
                                 "planned_s": round(plan.step(name).seconds, 1), "note": note}
        outcome.steps[name] = status if not note else f"{status}: {note}"
        run.log(f"selftest {name}: {status} in {seconds:.1f} s (planned {plan.step(name).seconds:.0f} s)"
                + (f": {note}" if note else ""))
        write_atomic(record_path, json.dumps(record, indent=1, default=str))
        try:
            shutil.make_archive(str(archive).removesuffix(".tar.gz"), "gztar", root_dir=run.path.parent,
                                base_dir=run.path.name)
        except OSError as e:   # the run directory stands; only the archive is missing
            rep.message(f"the self-test's archive could not be written: {describe_os_error(e)}")

    def check() -> None:
        spec = gpu.spec() if gpu is not None else gpu_spec(exp.archs[0])
        with rep.task("check every variant x dtype once on the device") as task:
            for mode, dtype in selftest_checks():
                if time.monotonic() >= deadline:
                    raise OutOfTime(f"checks of {mode}/{dtype} and after were not run")
                checks.extend(check_variants(None, [SELFTEST_CHECK_DATASET], WorkloadConfig.tiny(), (mode,),
                                             backend, dtypes=[dtype], gpu=spec))
            task.finish(f"{sum(c.passed is True for c in checks)} passed, "
                        f"{sum(c.passed is False for c in checks)} failed, {sum(c.passed is None for c in checks)} "
                        "skipped by design")
        record["checks"] = [dataclasses.asdict(c) for c in checks]

    def profile() -> None:
        ctx.exp = dataclasses.replace(exp, datasets=exp.datasets[:1])
        try:
            _profile(ctx)
        finally:
            ctx.exp = exp

    def dlrm() -> None:
        out_e2e = e2e(exp, datasets=exp.datasets[:1], reps=SELFTEST_E2E_REPS, check=False, progress=rep,
                      predictions=None if load_run(run.path).predictions.empty else load_run(run.path).predictions)
        run.write("e2e", out_e2e.rows)

    def report() -> None:
        code = static_step(run, exp, rep)
        locality_step(run, exp, rep)
        predict_step(run, exp, code, rep)
        _report(ctx)

    actions = {"check": check, "bench": lambda: _bench(ctx), "profile": profile, "e2e": dlrm, "report": report}
    with shared_datasets(), shared_reuse(), shared_profiles():
        for st in plan.steps:
            if st.name in done:
                rep.message(f"{st.name}: done in the run resumed, kept")
                continue
            if not st.fits:
                keep(st.name, "cut", 0.0, st.why)
                continue
            if st.name != "report" and time.monotonic() >= deadline:
                keep(st.name, "cut", 0.0, "the time budget ran out before it started")
                continue
            begun = time.monotonic()
            try:
                actions[st.name]()
            except OutOfTime as e:
                keep(st.name, "cut", time.monotonic() - begun, str(e))
            except CharacterizeError as e:
                keep(st.name, "failed", time.monotonic() - begun, str(e).splitlines()[0])
                if isinstance(e, (NoCudaDevice, NcuPermissionError)):
                    rep.message(f"{st.name} failed: {e}")
            except OSError as e:
                keep(st.name, "failed", time.monotonic() - begun, describe_os_error(e))
            else:
                keep(st.name, "done", time.monotonic() - begun)
    seconds = time.monotonic() - start
    record["seconds"] = round(seconds, 1)
    write_atomic(record_path, json.dumps(record, indent=1, default=str))
    shutil.make_archive(str(archive).removesuffix(".tar.gz"), "gztar", root_dir=run.path.parent, base_dir=run.path.name)
    bad = [c for c in checks if c.passed is False]
    problems = [f"check {c.variant} {c.dtype} {c.dataset} {c.mode}: max error {c.max_abs_err:.3g} over "
                f"{c.tolerance:.3g}{' (' + c.error + ')' if c.error else ''}" for c in bad]
    problems += [f"{name}: {v['status']}{': ' + v['note'] if v['note'] else ''}"
                 for name, v in record["steps"].items() if v["status"] != "done"]
    failures = load_run(run.path).failures
    problems += [f"{r.get('kind', '?')} {r.get('variant', '?')} {r.get('dataset', '?')}: {r.get('error', '')}"
                 for r in failures.to_dict("records")]
    if seconds > budget_s:
        rep.message(f"the self-test took {seconds:.0f} s, over its budget of {budget_s:.0f} s: see "
                    f"{record_path.name} for which step")
    return SelftestOutcome(checks, outcome, seconds, problems, plan, archive)
