"""Commands that measure: bench, profile and the main job, run."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import click

from characterize.cli.base import csv_list, echo_err, main, print_rows


# ------------------------------------------------------------ bench, profile
def experiment_options(f: Callable) -> Callable:
    """Which experiment and which part of it, plus where the run directory is."""
    opts = [
        click.argument("experiment", required=False, default="paper"),
        click.option("--variants", default=None, help="comma-separated subset of the experiment's variants"),
        click.option("--datasets", default=None, help="comma-separated subset of the experiment's datasets"),
        click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
                     help="run directory [runs/<experiment>-<gpu>]"),
        click.option("--resume", is_flag=True, help="continue an interrupted run, keeping finished points"),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _prepare(experiment: str, out: Path | None, stage: str, resume: bool, backend: str,
             variants: str | None = None, datasets: str | None = None, **overrides: Any):
    """Load and validate the experiment, open the run directory for `stage`."""
    import dataclasses

    from characterize.hardware import require_gpu
    from characterize.pipeline import load_experiment, open_experiment_run

    exp = load_experiment(experiment)
    if overrides:
        exp = dataclasses.replace(exp, **overrides)
    if variants:
        exp = dataclasses.replace(exp, variants=tuple(csv_list(variants)))
    if datasets:
        exp = dataclasses.replace(exp, datasets=tuple(csv_list(datasets)))
    info = require_gpu() if backend == "cuda" else None
    return exp, open_experiment_run(exp, out, stage, resume, info, backend)


@main.command()
@experiment_options
@click.option("--modes", default=None, help="steady,cold [the experiment's]")
@click.option("--backend", type=click.Choice(["cuda", "emulate"]), default="cuda", show_default=True,
              help="emulate times the CPU emulation: checks the harness, not GPU performance")
def bench(experiment: str, variants: str | None, datasets: str | None, out: Path | None, resume: bool,
          modes: str | None, backend: str) -> None:
    """Time variants x datasets with CUDA events (steady and cold L2)."""
    import dataclasses

    from characterize.analysis.compare import speedups
    from characterize.measure.runner import bench_points, pending_points
    from characterize.pipeline import load_experiment
    from characterize.store import load_run

    overrides = {}
    if modes:
        overrides["bench"] = dataclasses.replace(load_experiment(experiment).bench, modes=tuple(csv_list(modes)))
    exp, run = _prepare(experiment, out, "bench", resume, backend, variants, datasets, **overrides)
    points = pending_points(run, "bench", exp)
    echo_err(f"bench {exp.name}: {len(points)} point(s) to time into {run.path} (backend {backend})")
    counts = bench_points(run, points, backend, progress=echo_err)
    r = load_run(run.path)
    for mode in exp.bench.modes:
        s = speedups(r.bench, mode)
        if not s.empty:
            click.echo(f"\n{mode} mode: latency per table launch (mean +- 95% CI) and speedups:")
            print_rows(s.to_dict("records"), ["variant", "dataset", "latency_us", "latency_ci95_us",
                                              "speedup_vs_base", "speedup_vs_torch", "effective_GBps", "hbm_pct",
                                              "reps", "stable"])
    if not r.failures.empty:
        click.echo("\nfailed points:")
        print_rows(r.failures.to_dict("records"))
    if backend == "emulate":
        click.echo("\nnote: CPU-emulation timings check the harness; they say nothing about GPU performance")
    click.echo(f"\n{counts['ok']} point(s) measured, {counts['failed']} failed; run directory: {run.path}")


@main.command()
@experiment_options
@click.option("--ncu", "ncu_path", default=None, help="path to the ncu executable")
@click.option("--cache-control", type=click.Choice(["none", "all"]), default=None,
              help="none keeps L2 between kernels (needed for L2 pinning) [the experiment's: none]")
@click.option("--clock-control", type=click.Choice(["base", "none"]), default=None,
              help="base locks clocks for comparable numbers [the experiment's: base]")
@click.option("--metric-set", default=None, help="default | quick")
@click.option("--timeout", type=float, default=900.0, show_default=True, help="seconds per point")
def profile(experiment: str, variants: str | None, datasets: str | None, out: Path | None, resume: bool,
            ncu_path: str | None, cache_control: str | None, clock_control: str | None, metric_set: str | None,
            timeout: float) -> None:
    """Profile each point under Nsight Compute (one ncu process per point)."""
    import dataclasses
    import os

    from characterize.measure.ncu import find_ncu
    from characterize.measure.runner import (
        ProfileSettings,
        pending_points,
        profile_points,
    )
    from characterize.pipeline import load_experiment

    ncu = find_ncu(ncu_path)
    backend = os.environ.get("CHARACTERIZE_BACKEND", "cuda")
    base = load_experiment(experiment).profile
    changes = {k: v for k, v in (("cache_control", cache_control), ("clock_control", clock_control),
                                 ("metric_set", metric_set)) if v}
    overrides = {"profile": dataclasses.replace(base, **changes)} if changes else {}
    exp, run = _prepare(experiment, out, "profile", resume, backend, variants, datasets, **overrides)
    points = pending_points(run, "profile", exp)
    echo_err(f"profile {exp.name}: {len(points)} point(s) with {ncu} (cache-control {exp.profile.cache_control}, "
             f"clock-control {exp.profile.clock_control}, metric set {exp.profile.metric_set})")
    counts = profile_points(run, exp, points, ProfileSettings(ncu, timeout, None if backend == "cuda" else backend),
                            progress=echo_err)
    click.echo(f"{counts['ok']} point(s) profiled, {counts['failed']} failed; run directory: {run.path}")


# ----------------------------------------------------------------------- run
@main.command("run")
@click.argument("experiment", required=False, default="paper")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="run directory [runs/<experiment>-<gpu>]")
@click.option("--resume", is_flag=True, help="continue an interrupted run, keeping finished points")
@click.option("--ncu", "ncu_path", default=None, help="path to the ncu executable (profiling on a GPU)")
def run_cmd(experiment: str, out: Path | None, resume: bool, ncu_path: str | None) -> None:
    """The main job: build, characterize, measure (with a GPU) and summarize an experiment
    (a shipped experiment name, e.g. paper or quick, or a TOML file)."""
    from characterize.pipeline import load_experiment, run_experiment

    exp = load_experiment(experiment)
    start = time.perf_counter()
    echo_err(f"experiment {exp.name}: {exp.description}")
    outcome = run_experiment(exp, out, resume=resume, progress=lambda m: echo_err(f"  {m}"), ncu=ncu_path)
    from characterize.store import load_run

    r = load_run(outcome.path)
    if not r.static.empty:
        click.echo("\nstatic characterization (lookup kernels as configured):")
        view = r.static[(r.static["role"] == "lookup") & (~r.static["sweep"])]
        print_rows(view.to_dict("records"), ["variant", "arch", "maxrregcount", "registers", "spill_stores",
                                             "spill_loads", "blocks_per_sm", "theoretical_occupancy_pct", "limiter"])
    if not r.locality.empty:
        click.echo("\ntrace locality (one table per dataset):")
        cols = ["dataset", "lookups", "unique_rows"] + [c for c in r.locality.columns if c.startswith("top_")] + \
            ["reuse_p50", "reuse_p90"]
        print_rows(r.locality.to_dict("records"), cols)
    click.echo("\nsteps: " + "; ".join(f"{k}: {v.splitlines()[0]}" for k, v in outcome.steps.items()))
    click.echo(f"run directory: {outcome.path}")
    if outcome.report:
        click.echo(f"report: {outcome.report}")
    echo_err(f"finished in {time.perf_counter() - start:.1f} s")
    failed = {k: v.removeprefix("failed: ").splitlines()[0] for k, v in outcome.steps.items() if v.startswith("failed")}
    if failed:
        from characterize.errors import StepsFailed

        raise StepsFailed(f"{len(failed)} step(s) failed: " + "; ".join(f"{k}: {v}" for k, v in failed.items()) +
                          f"; everything else is in {outcome.path}")


