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

from characterize.analysis.calibrate import Calibration, fit_run, save_calibration
from characterize.analysis.claims import CLAIM_ARCH, CLAIM_VARIANTS, paper_claims
from characterize.analysis.model.predict import predict_experiment
from characterize.config import ExperimentConfig, WorkloadConfig, read_experiment
from characterize.errors import CharacterizeError, NcuNotFound, ToolchainNotFound
from characterize.hardware import DEFAULT_GPU, GPUS, devices, gpu_spec, normalize_arch
from characterize.kernels.registry import VARIANT_ORDER, get_variant
from characterize.kernels.static import static_characterization
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
from characterize.workloads.locality import PAPER_HOT_ROWS, locality_stats
from characterize.workloads.presets import HOTNESS_ORDER, parse_dataset
from characterize.workloads.traces import load_dataset

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


# ------------------------------------------------------------ experiments
def check_experiment(exp: ExperimentConfig, gpu: Any = None) -> ExperimentConfig:
    """`exp.validate(gpu)` plus the names it holds: datasets, variants (and whether
    each can run D), variant parameters and architectures. Empty datasets or variants
    mean all of them, in registry order; the returned experiment lists them."""
    exp = dataclasses.replace(exp, datasets=exp.datasets or HOTNESS_ORDER, variants=exp.variants or VARIANT_ORDER)
    exp.validate(gpu=gpu)
    for d in exp.datasets:
        parse_dataset(d)
    for v in exp.variants:
        get_variant(v).check_shape(exp.workload.D)
    for v, p in exp.params.items():
        get_variant(v).resolve_params(p)
    for a in exp.archs:
        normalize_arch(a)
    return exp


def load_experiment(name_or_path: str | None = None) -> ExperimentConfig:
    """A shipped experiment by name ('paper', 'quick') or a TOML file, fully checked."""
    return check_experiment(read_experiment(name_or_path))


# ----------------------------------------------------------- static + model
def static_frame(variants: Sequence[str], archs: Sequence[str], D: int, params: Mapping[str, Any] | None = None,
                 sweep_caps: Sequence[int] = ()) -> pd.DataFrame:
    """The static characterization as a frame (compiles with nvcc; builds are cached)."""
    try:
        rows = static_characterization(list(variants), list(archs), sweep_caps, D=D, params=dict(params or {}))
    except ToolchainNotFound as e:
        raise ToolchainNotFound(f"{e}\nThe model needs each variant's registers and occupancy, which come from "
                                "ptxas; or pass a run's static.csv.") from None
    return pd.DataFrame([r.to_dict() for r in rows])


def _covers(static: pd.DataFrame | None, variants: Sequence[str], archs: Sequence[str]) -> bool:
    if static is None or static.empty or not {"variant", "arch"} <= set(static.columns):
        return False
    have = set(zip(static["variant"], static["arch"]))
    return all((v, normalize_arch(a)) in have for v in variants if get_variant(v).compiled for a in archs)


def predict(exp: ExperimentConfig, archs: Sequence[str] | None = None, *, static: pd.DataFrame | None = None,
            progress: Progress | None = None) -> pd.DataFrame:
    """Model predictions for `exp` on `archs` (architectures or GPU names), compiling
    the static rows the model needs unless `static` already covers them."""
    targets = list(archs or exp.archs)
    gpu_archs = list(dict.fromkeys(gpu_spec(a).arch for a in targets))
    names = list(dict.fromkeys(["base", *exp.variants]))
    if not _covers(static, names, gpu_archs):
        static = static_frame(names, gpu_archs, exp.workload.D, exp.params)
    return predict_experiment(exp, targets, static=static, progress=progress)


def model_validation(static: pd.DataFrame | None = None) -> pd.DataFrame:
    """The model against the paper's A100 claims, at the paper's configuration."""
    wl = WorkloadConfig.paper()
    if not (_covers(static, CLAIM_VARIANTS, [CLAIM_ARCH]) and wl.D == _static_D(static)):
        static = static_frame(CLAIM_VARIANTS, [CLAIM_ARCH], wl.D)
    return paper_claims(wl, CLAIM_ARCH, static=static)


def _static_D(static: pd.DataFrame | None) -> int | None:
    return int(static.attrs["D"]) if static is not None and "D" in static.attrs else None


def calibrate(run_dir: str | Path, gpu: str | None = None, progress: Progress | None = None) -> Calibration:
    """Fit the model to a measured run (compiling static rows for its GPU if the run
    has none) and store the constants for that GPU."""
    run = load_run(run_dir)
    spec = gpu_spec(gpu) if gpu else None
    static = run.static
    exp = ExperimentConfig.from_dict(run.meta.get("experiment") or {})
    arch = spec.arch if spec else (run.meta.get("gpu") or {}).get("arch")
    if arch and not _covers(static, exp.variants, [arch]):
        static = static_frame(list(dict.fromkeys(["base", *exp.variants])), [arch], exp.workload.D, exp.params)
    cal = fit_run(run, gpu, static=static, progress=progress)
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
    ks = {PAPER_HOT_ROWS}
    for arch in exp.archs:
        spec = GPUS[DEFAULT_GPU[arch]]
        ks |= {spec.rows_in_l2(wl.row_bytes), spec.rows_in_persisting_l2(wl.row_bytes)}
    out = {}
    for ds in exp.datasets:
        start = time.perf_counter()
        data = load_dataset(ds, wl, tables=[table])
        stats = locality_stats(data.tables[0].indices, data.rows, wl.row_bytes, sorted(ks))
        out[ds] = stats.to_json() | {"table": table, "description": data.description}
        progress(f"locality {ds}: {stats.unique_rows:,} unique of {stats.lookups:,} lookups "
                 f"({time.perf_counter() - start:.1f} s)")
    write_json(run.path / "locality.json", out)
    return out


def static_step(run: RunDir, exp: ExperimentConfig, progress: Progress = _quiet) -> pd.DataFrame:
    progress(f"static characterization for {', '.join(exp.archs)} (nvcc; cached builds reused)")
    df = static_frame(exp.variants, exp.archs, exp.workload.D, exp.params, exp.maxrregcount)
    run.write_table("static", df)
    return df


def _read_static(run: RunDir) -> pd.DataFrame | None:
    """The static table the static step wrote, if it ran (the model then skips compiling)."""
    p = run.path / "static.csv"
    return pd.read_csv(p) if p.is_file() else None


def predict_step(run: RunDir, exp: ExperimentConfig, static: pd.DataFrame | None = None,
                 progress: Progress = _quiet) -> pd.DataFrame:
    """Model predictions for every variant x dataset x architecture (and the run's GPU)."""
    archs = list(exp.archs)
    gpu = json.loads((run.path / "meta.json").read_text()).get("gpu") or {}
    if gpu.get("key") and gpu["key"] not in archs:
        archs.append(gpu["key"])
    start = time.perf_counter()
    if static is not None:
        static.attrs["D"] = exp.workload.D
    df = predict(exp, archs, static=static)
    run.write_table("predictions", df)
    run.write_table("model_validation", model_validation(static))
    progress(f"model predictions for {', '.join(archs)} and the paper-claims check "
             f"({time.perf_counter() - start:.1f} s)")
    return df


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
    step("predict", lambda: predict_step(run, exp, _read_static(run), progress))
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
