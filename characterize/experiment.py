"""Experiment stage: one experiment end to end into a run directory.

`characterize run` calls `run_experiment`: build (static characterization), trace
locality and the model's predictions, then on a GPU timing and Nsight Compute
profiling, and finally the report. Each step writes its results into the run
directory as it finishes, so an interrupted run keeps everything already measured
and `--resume` continues it.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd

from .config import ExperimentConfig
from .store import RunDir, environment, write_json

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


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
    from .hardware import DEFAULT_GPU, GPUS
    from .workloads import load_dataset, locality_stats

    wl = exp.workload
    ks = {60_000}
    for arch in exp.archs:
        spec = GPUS[DEFAULT_GPU[arch]]
        ks |= {spec.l2_bytes // wl.row_bytes, spec.max_persisting_l2_bytes // wl.row_bytes}
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
    from .static import static_characterization

    progress(f"static characterization for {', '.join(exp.archs)} (nvcc; cached builds reused)")
    rows = static_characterization([v for v in exp.variants], exp.archs, exp.maxrregcount, D=exp.workload.D,
                                   params=exp.params)
    df = pd.DataFrame([r.to_dict() for r in rows])
    run.write_table("static", df)
    return df


def _read_static(run: RunDir) -> pd.DataFrame | None:
    """The static table the static step wrote, if it ran (the model then skips compiling)."""
    p = run.path / "static.csv"
    return pd.read_csv(p) if p.is_file() else None


def predict_step(run: RunDir, exp: ExperimentConfig, static: pd.DataFrame | None = None,
                 progress: Progress = _quiet) -> pd.DataFrame:
    """Model predictions for every variant x dataset x architecture (and the run's GPU)."""
    from .model import paper_claims, predict_experiment

    archs = list(exp.archs)
    gpu = json.loads((run.path / "meta.json").read_text()).get("gpu") or {}
    if gpu.get("key") and gpu["key"] not in archs:
        archs.append(gpu["key"])
    start = time.perf_counter()
    df = predict_experiment(exp, archs, static=static)
    run.write_table("predictions", df)
    # the model against the paper's published A100 claims (paper configuration, sm_80)
    run.write_table("model_validation", paper_claims(static=static))
    progress(f"model predictions for {', '.join(archs)} and the paper-claims check "
             f"({time.perf_counter() - start:.1f} s)")
    return df


def open_experiment_run(exp: ExperimentConfig, out: Path | None, stage: str, resume: bool, gpu_info,
                        backend: str = "cuda") -> RunDir:
    """Validate `exp` for the GPU (if any) and open its run directory for `stage`
    (default path runs/<experiment>-<gpu>)."""
    from .runner import open_run

    exp.validate(gpu=gpu_info.spec() if gpu_info else None)
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
    from .errors import CharacterizeError, NcuNotFound, ToolchainNotFound
    from .hardware import devices
    from .runner import ProfileSettings, bench_points, pending_points, profile_points

    found = devices()
    info = found[0] if found else None
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
            from .ncu import find_ncu

            settings = ProfileSettings(find_ncu(ncu))
            points = pending_points(run, "profile", exp)
            progress(f"profile: {len(points)} point(s) under {settings.ncu}")
            profile_points(run, exp, points, settings, progress)

        step("bench", bench)
        step("profile", profile)
    run.update_meta(steps=outcome.steps)

    def report() -> None:
        from .report import render_report

        outcome.report = render_report([path], path / "report.html")
        progress(f"report written to {outcome.report}")

    step("report", report)
    return outcome
