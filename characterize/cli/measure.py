"""Commands that measure: bench, profile and the main job, run."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable

import click

from characterize.cli.base import (
    TerminalReporter,
    asks,
    csv_list,
    echo,
    echo_err,
    experiment_with,
    main,
    print_answer,
    print_rows,
    trace_options,
    wide_option,
)
from characterize.errors import ConfigError


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
        REMEASURE,
    ]
    for o in reversed(opts):
        f = o(f)
    return f


REMEASURE = click.option("--remeasure", is_flag=True,
                         help="on resume, measure again the finished points measured with other parameters, "
                              "settings, trace contents or toolkit (refused otherwise, naming the difference)")


def executor_options(f: Callable) -> Callable:
    """Where the points run: here, or one Slurm array task each (options over the
    experiment's [slurm] section)."""
    opts = [
        click.option("--executor", type=click.Choice(["local", "slurm"]), default="local", show_default=True,
                     help="slurm: each variant x dataset point is one Slurm array task (submitit)"),
        click.option("--slurm-partition", default=None, help="Slurm partition [the experiment's slurm.partition]"),
        click.option("--slurm-gpus-per-task", type=click.IntRange(min=0), default=None,
                     help="GPUs per array task for the cuda backend [the experiment's: 1]"),
        click.option("--slurm-time", type=click.IntRange(min=1), default=None,
                     help="minutes one point may run before Slurm ends it [the experiment's: 60]"),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _slurm(partition: str | None, gpus_per_task: int | None, time_min: int | None) -> dict[str, Any]:
    return {"partition": partition, "gpus_per_task": gpus_per_task, "time_min": time_min}


def names_first(experiment: str, variants: str | None = None, datasets: str | None = None) -> Any:
    """The experiment with the --variants and --datasets subsets, every name checked before
    anything else (no GPU, ncu or Slurm is looked for before a typo is reported)."""
    import dataclasses

    from characterize.pipeline import check_names, load_experiment

    exp = load_experiment(experiment)
    if variants:
        exp = dataclasses.replace(exp, variants=tuple(csv_list(variants)))
    if datasets:
        exp = dataclasses.replace(exp, datasets=tuple(csv_list(datasets)))
    return check_names(exp)


@main.command()
@experiment_options
@click.option("--modes", default=None, help="steady,cold [the experiment's]")
@click.option("--timeout", type=float, default=None,
              help="seconds a point may take before its worker is stopped and the point recorded as failed "
                   "[the experiment's bench.timeout_s: 900]")
@click.option("--backend", type=click.Choice(["cuda", "emulate"]), default="cuda", show_default=True,
              help="emulate times the CPU emulation: checks the harness, not GPU performance")
@executor_options
@wide_option
def bench(experiment: str, variants: str | None, datasets: str | None, out: Path | None, resume: bool,
          remeasure: bool, modes: str | None, timeout: float | None, backend: str, executor: str,
          slurm_partition: str | None, slurm_gpus_per_task: int | None, slurm_time: int | None) -> None:
    """Time variants x datasets with CUDA events (steady and cold L2)."""
    import dataclasses

    from characterize.analysis.compare import speedups
    from characterize.pipeline import bench_step, load_experiment, open_step, raise_unfinished
    from characterize.store import load_run

    changes = {k: v for k, v in (("modes", tuple(csv_list(modes) or ()) if modes else None),
                                 ("timeout_s", timeout)) if v is not None}
    settings = dataclasses.replace(load_experiment(experiment).bench, **changes).validate() if changes else None
    exp = names_first(experiment, variants, datasets)
    if settings is not None:
        exp = dataclasses.replace(exp, bench=settings)
    with TerminalReporter(indent="") as reporter:
        ctx = open_step(exp, out, "bench", resume, backend=backend, executor=executor, remeasure=remeasure,
                        slurm=_slurm(slurm_partition, slurm_gpus_per_task, slurm_time), reporter=reporter)
        counts = bench_step(ctx, alone=True)
    r = load_run(ctx.run.path)
    for mode in exp.bench.modes:
        s = speedups(r.bench, mode)
        if not s.empty:
            echo(f"\n{mode} mode: latency per table launch (mean +- 95% CI) and speedups:")
            print_rows(s.to_dict("records"), ["variant", "dataset", "latency_us", "latency_ci95_us",
                                              "speedup_vs_base", "speedup_vs_torch", "effective_GBps", "hbm_pct",
                                              "reps", "stable"])
    if not r.failures.empty:
        echo("\nfailed points:")
        print_rows(r.failures.to_dict("records"))
    if backend == "emulate":
        echo("\nnote: CPU-emulation timings check the harness; they say nothing about GPU performance")
    echo(f"\n{counts['ok']} point(s) measured, {counts['failed']} failed; run directory: {ctx.run.path}")
    raise_unfinished(ctx, "bench", counts)


@main.command()
@experiment_options
@click.option("--ncu", "ncu_path", default=None, help="path to the ncu executable")
@click.option("--cache-control", type=click.Choice(["none", "all"]), default=None,
              help="none keeps L2 between kernels (needed for L2 pinning) [the experiment's: none]")
@click.option("--clock-control", type=click.Choice(["base", "none"]), default=None,
              help="none: unlocked, as bench runs (one clock policy); base locks them, and the report then "
                   "flags mixed clocks [the experiment's: none]")
@click.option("--metric-set", default=None, help="default | quick")
@click.option("--timeout", type=float, default=900.0, show_default=True, help="seconds per point")
@executor_options
def profile(experiment: str, variants: str | None, datasets: str | None, out: Path | None, resume: bool,
            remeasure: bool, ncu_path: str | None, cache_control: str | None, clock_control: str | None, metric_set: str | None,
            timeout: float, executor: str, slurm_partition: str | None, slurm_gpus_per_task: int | None,
            slurm_time: int | None) -> None:
    """Profile each point under Nsight Compute (one ncu process per point)."""
    import dataclasses
    import os

    from characterize.pipeline import open_step, profile_step, raise_unfinished

    exp = names_first(experiment, variants, datasets)   # a typo is reported before ncu or a GPU is looked for
    changes = {k: v for k, v in (("cache_control", cache_control), ("clock_control", clock_control),
                                 ("metric_set", metric_set)) if v}
    if changes:
        exp = dataclasses.replace(exp, profile=dataclasses.replace(exp.profile, **changes))
    if not (math.isfinite(timeout) and timeout > 0):
        raise ConfigError(f"--timeout must be a positive number of seconds, got {timeout}")
    with TerminalReporter(indent="") as reporter:
        ctx = open_step(exp, out, "profile", resume, backend=os.environ.get("CHARACTERIZE_BACKEND", "cuda"),
                        executor=executor, remeasure=remeasure, reporter=reporter, ncu=ncu_path, timeout_s=timeout,
                        slurm=_slurm(slurm_partition, slurm_gpus_per_task, slurm_time))
        counts = profile_step(ctx, alone=True)
    echo(f"{counts['ok']} point(s) profiled, {counts['failed']} failed; run directory: {ctx.run.path}")
    raise_unfinished(ctx, "profile", counts)


# ----------------------------------------------------------------------- run
@main.command("run")
@click.argument("experiment", required=False, default="paper")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="run directory [runs/<experiment>-<gpu>]")
@click.option("--resume", is_flag=True, help="continue an interrupted run, keeping finished points")
@REMEASURE
@click.option("--ncu", "ncu_path", default=None, help="path to the ncu executable (profiling on a GPU)")
@click.option("--backend", type=click.Choice(["cuda", "emulate"]), default="cuda", show_default=True,
              help="emulate also times the CPU emulation without a GPU: checks the harness, not GPU performance")
@click.option("--budget", type=click.FloatRange(min=1), default=None,
              help="seconds from the start after which bench and profile stop; what they did not measure is cut "
                   "and left for --resume (the report still runs)")
@executor_options
@trace_options
@wide_option
def run_cmd(experiment: str, out: Path | None, resume: bool, remeasure: bool, ncu_path: str | None, backend: str,
            budget: float | None, executor: str, slurm_partition: str | None, slurm_gpus_per_task: int | None,
            slurm_time: int | None, trace: Path | None, **wl: Any) -> None:
    """The main job: build, characterize, measure (with a GPU) and summarize an experiment
    (a shipped experiment name, e.g. paper or quick, or a TOML file), or the experiment on
    your own trace (--trace FILE). Ends with the answer: the best variant per dataset and
    GPU, by how much, and how sure."""
    from characterize.analysis.answer import answer_run
    from characterize.measure.executor import with_slurm_options
    from characterize.pipeline import run_experiment
    from characterize.store import load_run

    exp = with_slurm_options(experiment_with(experiment, trace, echo_err, asks(), **wl), slurm_partition,
                             slurm_gpus_per_task, slurm_time)
    start = time.perf_counter()
    echo_err(f"experiment {exp.name}: {exp.description}")
    with TerminalReporter() as reporter:
        def early_answer(step: str, path: Path) -> None:
            """The answer as soon as the predictions exist (measurements, if any, come later)."""
            if step == "predict":
                a = answer_run(load_run(path))
                reporter.message(f"predicted answer ({time.perf_counter() - start:.0f} s): {a.summary()}")

        outcome = run_experiment(exp, out, resume=resume, progress=reporter, ncu=ncu_path, backend=backend,
                                 executor=executor, remeasure=remeasure, after_step=early_answer, budget_s=budget)
    r = load_run(outcome.path)
    if not r.static.empty:
        print_static(r.static, exp.workload.dtype)
    if not r.locality.empty:
        from characterize.workloads.locality import named_ks

        # the paper's K and the rows fitting each target GPU's L2 (the report draws the whole curve)
        ks = [k for name, k in named_ks(exp.workload.row_bytes, exp.archs).items() if "persisting" not in name]
        cov = [f"top_{k}_coverage" for k in dict.fromkeys(ks) if f"top_{k}_coverage" in r.locality.columns]
        echo("\ntrace locality (one table per dataset; top-K coverage at the paper's K and the rows fitting "
                   "each target GPU's L2):")
        print_rows(r.locality.to_dict("records"), ["dataset", "lookups", "unique_rows", *cov, "reuse_p50",
                                                   "reuse_p90"], fractions=cov)
    echo("\nsteps: " + "; ".join(f"{k}: {v.splitlines()[0]}" for k, v in outcome.steps.items()))
    echo(f"run directory: {outcome.path}" + (f"; report: {outcome.report}" if outcome.report else ""))
    echo_err(f"finished in {time.perf_counter() - start:.1f} s")
    print_answer(answer_run(r))   # last: what to use
    failed = {k: v.removeprefix("failed: ").splitlines()[0] for k, v in outcome.steps.items() if v.startswith("failed")}
    cut = [k for k, v in outcome.steps.items() if v.startswith("cut")]
    if cut and not failed:
        from characterize.errors import OutOfTime

        raise OutOfTime(f"the time budget ran out: {', '.join(cut)} cut; everything measured is in {outcome.path}, "
                        "and --resume continues")
    if failed:
        from characterize.errors import StepsFailed

        raise StepsFailed(f"{len(failed)} step(s) failed: " + "; ".join(f"{k}: {v}" for k, v in failed.items()) +
                          f"; everything else is in {outcome.path}")




def print_static(static: Any, dtype: str) -> None:
    """The lookup kernels as configured at the workload's dtype, one row per variant and
    the architectures side by side (the other precisions are in static.csv and the report)."""
    view = static[(static["role"] == "lookup") & (~static["sweep"].astype(bool))]
    if "dtype" in view.columns and (view["dtype"] == dtype).any():
        view = view[view["dtype"] == dtype]
    others = sorted(set(static["dtype"].dropna()) - {dtype}) if "dtype" in static.columns else []
    rows: dict[str, dict[str, Any]] = {}
    for r in view.to_dict("records"):
        row = rows.setdefault(str(r["variant"]), {"variant": r["variant"], "cap": r.get("maxrregcount")})
        a = str(r["arch"])
        row[f"{a} regs"] = r["registers"]
        row[f"{a} spills"] = f"{int(r['spill_stores'])}/{int(r['spill_loads'])}"
        row[f"{a} occupancy"] = f"{float(r['theoretical_occupancy_pct']):.1f}%"
    echo(f"\nstatic characterization, {dtype} lookup kernels as configured (cap: maxrregcount; spills: "
         "stores/loads" + (f"; {', '.join(others)} in static.csv and the report" if others else "") + "):")
    print_rows(list(rows.values()), list(dict.fromkeys(k for row in rows.values() for k in row)))


# ------------------------------------------------------------------ selftest
@main.command("selftest")
@click.option("--gpu", "on_gpu", is_flag=True, help="the whole GPU path on this machine's GPU (required)")
@click.option("--budget", type=click.FloatRange(min=10), default=None,
              help="seconds the self-test may take: its plan says what fits, in the order of what each step is "
                   "worth, and what is cut [480]")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="run directory [profiles/<gpu>/selftest]; its archive is written beside it")
@click.option("--ncu", "ncu_path", default=None, help="path to the ncu executable")
@click.option("--resume", is_flag=True, help="continue an interrupted self-test: steps done are kept, the rest "
                                             "runs under a new budget")
@click.option("--experiment", default="selftest", show_default=True, help="the experiment it measures")
@click.option("--backend", type=click.Choice(["cuda", "emulate"]), default="cuda", show_default=True,
              help="emulate rehearses the self-test on the CPU emulation (its times say nothing about a GPU)")
def selftest(on_gpu: bool, budget: float | None, out: Path | None, ncu_path: str | None, resume: bool,
             experiment: str, backend: str) -> None:
    """The whole GPU path within a time budget: its plan first (what fits, what is cut and
    why), then every variant checked on the device, the experiment benched, every variant
    profiled, the DLRM step timed and the report, into one run directory with a record of
    what ran and one archive of it (profiles/<gpu>/selftest, the reference run to commit)."""
    from characterize.errors import StepsFailed
    from characterize.pipeline import SELFTEST_BUDGET_S, selftest_gpu

    if not on_gpu:
        raise click.UsageError("the self-test measures on a GPU: pass --gpu (without one, `characterize check` "
                               "and `characterize run quick` test the CPU path)")
    with TerminalReporter() as reporter:
        result = selftest_gpu(out, ncu=ncu_path, resume=resume, progress=reporter,
                              budget_s=budget or SELFTEST_BUDGET_S, experiment=experiment, backend=backend)
    echo("steps: " + "; ".join(f"{k}: {v.splitlines()[0]}" for k, v in result.run.steps.items()))
    echo(f"run directory: {result.run.path}")
    if result.archive is not None:
        echo(f"archive: {result.archive}")
    if result.run.report:
        echo(f"report: {result.run.report}")
    echo_err(f"self-test finished in {result.seconds:.0f} s (budget {budget or SELFTEST_BUDGET_S:.0f} s)")
    if result.problems:
        raise StepsFailed(f"{len(result.problems)} problem(s): " + "; ".join(result.problems[:8]) +
                          (" ..." if len(result.problems) > 8 else "") + f"; what finished is in {result.run.path}")
    echo("self-test passed: every variant matched torch on the device, and every step ran within the budget")
