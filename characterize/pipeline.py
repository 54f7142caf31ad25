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

import dataclasses
import json
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from characterize.analysis.calibrate import Calibration, fit_run, load_calibration, save_calibration
from characterize.analysis.claims import CLAIM_ARCH, CLAIM_VARIANTS, paper_claims
from characterize.analysis.model.constants import ModelConstants
from characterize.analysis.model.e2e import Overheads
from characterize.analysis.model.e2e import predict_step as predict_e2e
from characterize.analysis.model.predict import predict_experiment
from characterize.config import DlrmConfig, ExperimentConfig, WorkloadConfig, read_experiment
from characterize.errors import CharacterizeError, NcuNotFound, ToolchainNotFound, WorkloadError
from characterize.hardware import DEFAULT_GPU, GPUS, devices, gpu_spec, normalize_arch
from characterize.kernels.registry import VARIANT_ORDER, get_variant
from characterize.kernels.static import analyze_variants, static_characterization
from characterize.measure.e2e import check_pipeline, measure_step
from characterize.measure.ncu import find_ncu
from characterize.measure.runner import (
    ProfileSettings,
    bench_points,
    open_run,
    pending_points,
    profile_points,
)
from characterize.report.render import render_report
from characterize.store import RunDir, environment, load_run, write_json
from characterize.workloads.locality import PAPER_HOT_ROWS, check_dataset, coverage_ks, locality_stats
from characterize.workloads.presets import HOTNESS_ORDER
from characterize.workloads.traces import load_dataset

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


# ------------------------------------------------------------ experiments
def check_experiment(exp: ExperimentConfig, gpu: Any = None) -> ExperimentConfig:
    """`exp.validate(gpu)` plus the names it holds: datasets, variants (and whether
    each can run D), variant parameters and architectures. Empty datasets or variants
    mean all of them, in registry order; the returned experiment lists them. Before any
    work: without a GPU the workload must fit each target architecture's GPU, trace
    files must exist, and one table must fit the host-memory budget."""
    exp = dataclasses.replace(exp, datasets=exp.datasets or HOTNESS_ORDER, variants=exp.variants or VARIANT_ORDER)
    exp.validate(gpu=gpu)
    for v in exp.variants:
        get_variant(v).check_shape(exp.workload.D, exp.workload.dtype)
    for v, p in exp.params.items():
        get_variant(v).resolve_params(p)
    for a in exp.archs:
        normalize_arch(a)
    if gpu is None:  # no GPU here: the workload must still fit each target architecture's GPU
        for a in exp.archs:
            exp.workload.validate(gpu=gpu_spec(a))
    for d in exp.datasets:
        check_dataset(d, exp.workload)
    return exp


def load_experiment(name_or_path: str | None = None) -> ExperimentConfig:
    """A shipped experiment by name ('paper', 'quick') or a TOML file, fully checked."""
    return check_experiment(read_experiment(name_or_path))


# ----------------------------------------------------------- static + model
@dataclass(frozen=True)
class CodeFacts:
    """What the compiled code says about the variants at one D, the model's inputs:
    ptxas resources and theoretical occupancy (static) and each kernel's hot loop
    read from its SASS (sass)."""

    D: int
    static: pd.DataFrame
    sass: pd.DataFrame

    def covers(self, variants: Sequence[str], archs: Sequence[str], D: int) -> bool:
        if D != self.D:
            return False
        need = {(v, normalize_arch(a)) for v in variants if get_variant(v).compiled for a in archs}
        for df in (self.static, self.sass):
            if df.empty or not {"variant", "arch"} <= set(df.columns) or not need <= set(zip(df["variant"], df["arch"])):
                return False
        return True


def sass_frame(variants: Sequence[str], archs: Sequence[str], D: int,
               params: Mapping[str, Any] | None = None, dtype: str = "fp32") -> pd.DataFrame:
    """The SASS hot-loop analysis as a frame (compiles; disassembles with cuobjdump).
    Per-width load counts and prefetch kinds are JSON objects in their cells."""
    rows = [r.to_dict() for r in analyze_variants(list(variants), list(archs), D=D, params=dict(params or {}),
                                                  dtype=dtype)]
    df = pd.DataFrame(rows)
    for col in ("load_bits", "prefetches"):
        if col in df.columns:
            df[col] = [json.dumps({str(k): v for k, v in d.items()}, sort_keys=True) for d in df[col]]
    return df


def code_facts(variants: Sequence[str], archs: Sequence[str], D: int, params: Mapping[str, Any] | None = None,
               sweep_caps: Sequence[int] = (), dtype: str = "fp32") -> CodeFacts:
    """Compile the variants (builds are cached), read ptxas's resources and the SASS."""
    try:
        rows = static_characterization(list(variants), list(archs), sweep_caps, D=D, params=dict(params or {}),
                                       dtype=dtype)
        sass = sass_frame(variants, archs, D, params, dtype)
    except ToolchainNotFound as e:
        raise ToolchainNotFound(f"{e}\nThe model needs each variant's registers, occupancy and hot loop, which "
                                "come from the compiled code; or pass a run's static.csv and sass.csv.") from None
    return CodeFacts(D, pd.DataFrame([r.to_dict() for r in rows]), sass)


def predict(exp: ExperimentConfig, archs: Sequence[str] | None = None, *, code: CodeFacts | None = None,
            progress: Progress | None = None) -> pd.DataFrame:
    """Model predictions for `exp` on `archs` (architectures or GPU names), compiling
    what the model needs unless `code` already covers it."""
    targets = list(archs or exp.archs)
    for t in targets:  # a prediction for a GPU the workload cannot fit is refused, not made up
        exp.workload.validate(gpu=gpu_spec(t))
    gpu_archs = list(dict.fromkeys(gpu_spec(a).arch for a in targets))
    names = list(dict.fromkeys(["base", *exp.variants]))
    if code is None or not code.covers(names, gpu_archs, exp.workload.D):
        code = code_facts(names, gpu_archs, exp.workload.D, exp.params, dtype=exp.workload.dtype)
    return predict_experiment(exp, targets, static=code.static, sass=code.sass, progress=progress)


def model_validation(code: CodeFacts | None = None) -> pd.DataFrame:
    """The model against the paper's A100 claims, at the paper's configuration."""
    wl = WorkloadConfig.paper()
    if code is None or not code.covers(CLAIM_VARIANTS, [CLAIM_ARCH], wl.D):
        code = code_facts(CLAIM_VARIANTS, [CLAIM_ARCH], wl.D)
    return paper_claims(wl, CLAIM_ARCH, static=code.static, sass=code.sass)


def calibrate(run_dir: str | Path, gpu: str | None = None, progress: Progress | None = None) -> Calibration:
    """Fit the model to a measured run (compiling what the model needs for its GPU if
    the run lacks it) and store the constants for that GPU."""
    run = load_run(run_dir)
    spec = gpu_spec(gpu) if gpu else None
    exp = ExperimentConfig.from_dict(run.meta.get("experiment") or {})
    code = CodeFacts(exp.workload.D, run.static, run.sass)
    arch = spec.arch if spec else (run.meta.get("gpu") or {}).get("arch")
    names = list(dict.fromkeys(["base", *exp.variants]))
    if arch and not code.covers(names, [arch], exp.workload.D):
        code = code_facts(names, [arch], exp.workload.D, exp.params, dtype=exp.workload.dtype)
    cal = fit_run(run, gpu, static=code.static, sass=code.sass, progress=progress)
    save_calibration(cal)
    return cal


# ------------------------------------------------------------ run directories
def default_run_dir(exp: ExperimentConfig, gpu_key: str | None) -> Path:
    return Path("runs") / f"{exp.name}-{gpu_key or 'nogpu'}"


def run_meta(exp: ExperimentConfig, path: Path, gpu_info, backend: str = "cuda") -> dict:
    """meta.json of a new run: identity of the GPU and software, the full config, the
    command line."""
    gpu = None
    if gpu_info is not None:
        spec = gpu_info.spec()
        gpu = {"name": gpu_info.name, "key": spec.key, "arch": gpu_info.arch, "sm_count": gpu_info.sm_count,
               "l2_bytes": gpu_info.l2_bytes, "memory_bytes": gpu_info.memory_bytes, "driver": gpu_info.driver,
               "cuda_runtime": gpu_info.cuda_runtime, "sm_clock_MHz": gpu_info.sm_clock_MHz,
               "max_sm_clock_MHz": gpu_info.max_sm_clock_MHz, "memory_clock_MHz": gpu_info.memory_clock_MHz,
               "hbm_GBps": spec.hbm_GBps}
    return {"name": path.name, "experiment": exp.to_dict(), "command_line": shlex.join(sys.argv),
            "environment": environment(), "backend": backend if gpu_info is not None or backend != "cuda" else None,
            "gpu": gpu, "cache_control": exp.profile.cache_control, "clock_control": exp.profile.clock_control}


def locality_step(run: RunDir, exp: ExperimentConfig, progress: Progress = _quiet, table: int = 0) -> dict:
    """Locality statistics of one table of every dataset (all tables of a generated
    dataset share a distribution). K: the paper's 60K and the rows fitting each
    target architecture's L2 and persisting budget."""
    wl = exp.workload
    ks = {PAPER_HOT_ROWS} | coverage_ks(wl.E)   # the coverage curve, from K=1 on a log scale
    for arch in exp.archs:
        spec = GPUS[DEFAULT_GPU[arch]]
        ks |= {spec.rows_in_l2(wl.row_bytes), spec.rows_in_persisting_l2(wl.row_bytes)}
    out, failed = {}, []
    for ds in exp.datasets:
        start = time.perf_counter()
        try:
            data = load_dataset(ds, wl, tables=[table])
            stats = locality_stats(data.tables[0].indices, data.rows, wl.row_bytes, sorted(ks))
        except CharacterizeError as e:  # one bad dataset costs only itself
            failed.append(str(e) if ds in str(e) else f"{ds}: {e}")
            continue
        out[ds] = stats.to_json() | {"table": table, "description": data.description}
        progress(f"locality {ds}: {stats.unique_rows:,} unique of {stats.lookups:,} lookups "
                 f"({time.perf_counter() - start:.1f} s)")
    write_json(run.path / "locality.json", out)
    if failed:
        raise WorkloadError(f"{'; '.join(failed)} (the other datasets' statistics are in locality.json)")
    return out


def static_step(run: RunDir, exp: ExperimentConfig, progress: Progress = _quiet) -> CodeFacts:
    """static.csv (with the register sweep) and sass.csv of the experiment's variants."""
    progress(f"static characterization and SASS analysis for {', '.join(exp.archs)} (nvcc, cuobjdump; "
             "cached builds reused)")
    code = code_facts(exp.variants, exp.archs, exp.workload.D, exp.params, exp.maxrregcount, exp.workload.dtype)
    run.write_table("static", code.static)
    run.write_table("sass", code.sass)
    return code


def _read_code(run: RunDir, exp: ExperimentConfig) -> CodeFacts | None:
    """What the static step wrote, if it ran (the model then needs no compiler)."""
    static, sass = run.path / "static.csv", run.path / "sass.csv"
    if not (static.is_file() and sass.is_file()):
        return None
    return CodeFacts(exp.workload.D, pd.read_csv(static), pd.read_csv(sass))


def predict_step(run: RunDir, exp: ExperimentConfig, code: CodeFacts | None = None,
                 progress: Progress = _quiet) -> pd.DataFrame:
    """Model predictions for every variant x dataset x architecture (and the run's GPU)."""
    archs = list(exp.archs)
    gpu = json.loads((run.path / "meta.json").read_text()).get("gpu") or {}
    if gpu.get("key") and gpu["key"] not in archs:
        archs.append(gpu["key"])
    start = time.perf_counter()
    df = predict(exp, archs, code=code)
    run.write_table("predictions", df)
    run.write_table("model_validation", model_validation(code))
    progress(f"model predictions for {', '.join(archs)} and the paper-claims check "
             f"({time.perf_counter() - start:.1f} s)")
    return df


def e2e_step(run: RunDir, exp: ExperimentConfig, code: CodeFacts | None = None,
             progress: Progress = _quiet) -> pd.DataFrame:
    """e2e.csv: the DLRM step around each variant, predicted per stage (measured too
    when `run` has a GPU; `characterize e2e` also checks it against autograd)."""
    start = time.perf_counter()
    out = e2e(exp, code=code, check=False)
    run.write_table("e2e", out.rows)
    progress(f"end-to-end step predicted ({time.perf_counter() - start:.1f} s)")
    return out.rows


def open_experiment_run(exp: ExperimentConfig, out: Path | None, stage: str, resume: bool, gpu_info,
                        backend: str = "cuda") -> RunDir:
    """Validate `exp` for the GPU (if any) and open its run directory for `stage`
    (default path runs/<experiment>-<gpu>)."""
    exp = check_experiment(exp, gpu=gpu_info.spec() if gpu_info else None)
    key = gpu_info.spec().key if gpu_info else ("cpu-emulation" if backend == "emulate" else None)
    path = out or default_run_dir(exp, key)
    return open_run(path, exp, run_meta(exp, path, gpu_info, backend), stage, resume)


@dataclass
class RunOutcome:
    path: Path
    steps: dict[str, str] = field(default_factory=dict)  # step -> "done" | "skipped: why" | "failed: why"
    report: Path | None = None


def run_experiment(exp: ExperimentConfig, out: Path | None = None, *, resume: bool = False,
                   progress: Progress = _quiet, ncu: str | None = None) -> RunOutcome:
    """Run `exp` into `out`; steps that cannot run here are recorded as skipped, with why."""
    found = devices()
    info = found[0] if found else None
    exp = check_experiment(exp, gpu=info.spec() if info else None)
    run = open_experiment_run(exp, out, "bench", resume, info)
    path = run.path
    outcome = RunOutcome(path)
    run.log(f"run {exp.name} ({'GPU ' + info.name if info else 'no GPU'})")

    def step(name: str, fn: Callable[[], object]) -> None:
        start = time.perf_counter()
        try:
            fn()
        except (ToolchainNotFound, NcuNotFound) as e:
            outcome.steps[name] = f"skipped: {e}"
            progress(f"{name} skipped: {e}")
        except CharacterizeError as e:
            outcome.steps[name] = f"failed: {e}"
            progress(f"{name} failed: {e}")
        else:
            outcome.steps[name] = "done"
        run.log(f"{name}: {outcome.steps[name]} ({time.perf_counter() - start:.1f} s)")

    step("static", lambda: static_step(run, exp, progress))
    step("locality", lambda: locality_step(run, exp, progress))
    step("predict", lambda: predict_step(run, exp, _read_code(run, exp), progress))
    step("e2e", lambda: e2e_step(run, exp, _read_code(run, exp), progress))
    if info is None:
        for s in ("bench", "profile"):
            outcome.steps[s] = "skipped: no CUDA GPU on this machine"
    else:
        def bench() -> None:
            points = pending_points(run, "bench", exp)
            progress(f"bench: {len(points)} point(s)")
            bench_points(run, points, "cuda", progress)

        def profile() -> None:
            settings = ProfileSettings(find_ncu(ncu))
            points = pending_points(run, "profile", exp)
            progress(f"profile: {len(points)} point(s) under {settings.ncu}")
            profile_points(run, exp, points, settings, progress)

        step("bench", bench)
        step("profile", profile)
    run.update_meta(steps=outcome.steps)

    def report() -> None:
        outcome.report = render_report([path], path / "report.html")
        progress(f"report written to {outcome.report}")

    step("report", report)
    return outcome


# -------------------------------------------------------------- end to end
@dataclass
class E2EOutcome:
    """`characterize e2e`: the stage table and the CPU correctness checks."""

    rows: pd.DataFrame    # variant, dataset, gpu, arch, phase, stage, time_us(_low/_high), source, speedups
    checks: pd.DataFrame  # variant, phase, backward, optimizer, max_abs_error, ok


def e2e(exp: ExperimentConfig, variants: Sequence[str] | None = None, archs: Sequence[str] | None = None, *,
        dlrm: DlrmConfig | None = None, backward: str = "sort", optimizer: str = "sgd",
        overheads: Overheads | None = None, check: bool = True, code: CodeFacts | None = None,
        progress: Progress | None = None) -> E2EOutcome:
    """The DLRM step around each variant: checked on the CPU (or the GPU) at a small
    size, predicted stage by stage for every target GPU, and measured when a GPU is here."""
    say = progress or _quiet
    dlrm = (dlrm or DlrmConfig.for_dim(exp.workload.D)).validate(exp.workload.D)
    overheads = (overheads or Overheads()).validate()
    exp = check_experiment(exp)
    names = list(dict.fromkeys(["base", *(variants or exp.variants)]))   # base: the speedups' reference
    exp = dataclasses.replace(exp, variants=tuple(names))
    found = devices()
    checks = pd.DataFrame()
    if check:
        say(f"checking the DLRM step of {len(names)} variant(s) against torch autograd "
            f"({'GPU' if found else 'CPU emulation'})")
        checks = pd.DataFrame(check_pipeline(names, backend="cuda" if found else "emulate"))
    targets = list(archs or exp.archs)
    say(f"predicting the kernels of {', '.join(targets)}")
    emb = predict(exp, targets, code=code, progress=say)
    emb = emb[emb["mode"] == "steady"]
    gpus = [gpu_spec(t) for t in targets]
    constants = {g.key: load_calibration(g) or ModelConstants.defaults(g) for g in gpus}
    unique = {}
    for ds in exp.datasets:
        first, _ = load_dataset(ds, exp.workload, tables=[0]).tables[0].batch(0)
        unique[ds] = float(len(set(first.tolist())))
    rows = predict_e2e(exp.workload, dlrm, emb, gpus, constants, unique, backward=backward, optimizer=optimizer,
                       overheads=overheads)
    if found:
        say("timing the DLRM step on the GPU")
        measured = pd.DataFrame(measure_step(exp.workload, dlrm, names, exp.datasets, backward=backward,
                                             optimizer=optimizer, params=exp.params))
        info = found[0].spec()
        rows = pd.concat([rows, measured.assign(gpu=info.key, arch=info.arch)], ignore_index=True)
    return E2EOutcome(rows, checks)
