"""Command line: a click group of thin commands over the library.

Library errors (CharacterizeError) become one clear message on stderr and the
error's exit code; nothing here computes, it parses options, calls the stage
functions and prints.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import click

from .errors import CharacterizeError


class Group(click.Group):
    """Turns domain errors into messages instead of tracebacks."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CharacterizeError as e:
            click.echo(f"error: {e}", err=True)
            ctx.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)


def echo_err(msg: str) -> None:
    click.echo(msg, err=True)


def print_rows(rows: list[dict], columns: list[str] | None = None, floatfmt: str = "{:.4g}") -> None:
    """A plain aligned text table."""
    if not rows:
        click.echo("(nothing)")
        return
    cols = columns or list(rows[0])
    cells = [[c for c in cols]]
    for r in rows:
        line = []
        for c in cols:
            v = r.get(c, "")
            if isinstance(v, float):
                v = "" if v != v else floatfmt.format(v)  # NaN: nothing to show
            line.append("" if v is None else str(v))
        cells.append(line)
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    for j, row in enumerate(cells):
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if j == 0:
            click.echo("  ".join("-" * w for w in widths))


def workload_options(f: Callable) -> Callable:
    """The workload in the field's vocabulary (FBGEMM-style reusable option bundle)."""
    opts = [
        click.option("--T", "T", type=int, default=None, help="embedding tables [12]"),
        click.option("--E", "E", type=int, default=None, help="rows per table [500000]"),
        click.option("--D", "D", type=int, default=None, help="embedding dimension [128]"),
        click.option("--B", "B", type=int, default=None, help="batch size (bags per table) [2048]"),
        click.option("--L", "L", default=None, help="pooling factor: N, uniform:LO:HI or poisson:MEAN [150]"),
        click.option("--mode", type=click.Choice(["sum", "mean"]), default=None, help="pooling mode [sum]"),
        click.option("--batches", type=int, default=None, help="batches per generated trace [8]"),
        click.option("--seed", type=int, default=None, help="seed of generated data [0]"),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def workload_from(base: Any = None, **kw: Any) -> Any:
    from .config import WorkloadConfig

    base = base or WorkloadConfig()
    changes = {k: v for k, v in kw.items() if k in ("T", "E", "D", "B", "L", "mode", "batches", "seed") and v is not None}
    return base.replace(**changes).validate() if changes else base.validate()


def csv_list(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="characterize")
def main() -> None:
    """Characterize DLRM embedding-bag kernels on GPUs: build, check, bench, profile,
    extract, model and report."""


# ------------------------------------------------------------------- devices
@main.command()
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def devices(as_json: bool) -> None:
    """List visible GPUs (NVML and torch), or say that there is none."""
    from dataclasses import asdict

    from .hardware import devices as list_devices

    found = list_devices()
    if as_json:
        click.echo(json.dumps([asdict(d) | {"arch": d.arch} for d in found], indent=2))
        return
    if not found:
        click.echo("No CUDA GPU is visible on this machine (NVML and torch found none).\n"
                   "Without a GPU you can still run: characterize build, check, workload stats, predict, "
                   "import, report, run (static + locality + model).")
        return
    rows = [{"#": d.index, "name": d.name, "arch": d.arch, "SMs": d.sm_count, "L2_MiB": round(d.l2_bytes / 2**20, 1),
             "memory_GiB": round(d.memory_bytes / 2**30, 1), "sm_clock_MHz": d.sm_clock_MHz,
             "max_sm_clock_MHz": d.max_sm_clock_MHz, "mem_clock_MHz": d.memory_clock_MHz, "driver": d.driver,
             "cuda": d.cuda_runtime, "source": d.source} for d in found]
    print_rows(rows)


# --------------------------------------------------------------------- build
@main.command()
@click.option("--arch", "archs", default="sm_80,sm_90", show_default=True, help="comma-separated architectures")
@click.option("--variants", default=None, help="comma-separated variants [all compiled ones]")
@click.option("--maxrregcount", "caps", default=None, help="register sweep caps, e.g. 32,40,42,48,64")
@click.option("--D", "D", type=int, default=128, show_default=True, help="embedding dimension (picks the warp kernel)")
@click.option("--param", "params", multiple=True, metavar="VARIANT.NAME=VALUE", help="variant parameter, e.g. rpf.P=4")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def build(archs: str, variants: str | None, caps: str | None, D: int, params: tuple[str, ...], as_json: bool) -> None:
    """Compile every variant per architecture; registers, spills and theoretical occupancy."""
    from .hardware import parse_archs
    from .static import default_register_cap, static_characterization

    arch_list = parse_archs(archs)
    cap_list = [int(c) for c in csv_list(caps) or []]
    start = time.perf_counter()
    if not as_json:
        echo_err(f"compiling the kernel family for {', '.join(arch_list)} (cached builds are reused) ...")
    rows = static_characterization(csv_list(variants), arch_list, cap_list, D=D, params=parse_params(params))
    elapsed = time.perf_counter() - start
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in rows], indent=2))
        return
    configured = [r.to_dict() for r in rows if not r.sweep]
    cols = ["variant", "arch", "maxrregcount", "role", "kernel", "registers", "spill_stores", "spill_loads",
            "stack_frame", "block_size", "blocks_per_sm", "theoretical_occupancy_pct", "limiter"]
    print_rows(configured, cols)
    sweep = [r.to_dict() for r in rows if r.sweep and r.variant in ("base", "rpf", "warp")]
    if sweep:
        click.echo("\nregister sweep (lookup kernels):")
        print_rows(sweep, ["variant", "arch", "maxrregcount", "registers", "spill_stores", "spill_loads",
                           "blocks_per_sm", "theoretical_occupancy_pct", "limiter"])
    caps_used = ", ".join(f"{a}: {default_register_cap(a)}" for a in arch_list)
    click.echo(f"\ndefault register cap (optmt/rpf/combined) {caps_used}; compiler: {rows[0].compiler if rows else '-'}")
    echo_err(f"done in {elapsed:.1f} s")


def parse_params(items: tuple[str, ...] | list[str]) -> dict[str, dict[str, int]]:
    """['rpf.P=4', 'optmt.maxrregcount=42'] -> {'rpf': {'P': 4}, 'optmt': {'maxrregcount': 42}}."""
    from .errors import ConfigError

    out: dict[str, dict[str, int]] = {}
    for item in items:
        try:
            key, value = item.split("=", 1)
            variant, name = key.split(".", 1)
            out.setdefault(variant.strip(), {})[name.strip()] = int(value)
        except ValueError:
            raise ConfigError(f"bad --param {item!r}: use VARIANT.NAME=INTEGER, e.g. rpf.P=4") from None
    return out


# --------------------------------------------------------------------- check
@main.command()
@click.option("--variants", default=None, help="comma-separated variants [all]")
@click.option("--datasets", default="one-item,high,medium,low,random", show_default=True)
@click.option("--backend", type=click.Choice(["auto", "cuda", "emulate"]), default="auto", show_default=True,
              help="cuda runs on the GPU; emulate runs the same source on the CPU")
@click.option("--paper-shape", is_flag=True, help="check at the paper's shape instead of the tiny odd one")
@click.option("--param", "params", multiple=True, metavar="VARIANT.NAME=VALUE")
@workload_options
@click.option("--json", "as_json", is_flag=True)
def check(variants: str | None, datasets: str, backend: str, paper_shape: bool, params: tuple[str, ...],
          as_json: bool, **wl: Any) -> None:
    """Check every variant against torch.nn.functional.embedding_bag."""
    from .check import check_variants
    from .config import WorkloadConfig
    from .kernels import default_backend

    base = WorkloadConfig(batches=1) if paper_shape else WorkloadConfig.tiny()
    config = workload_from(base, **wl)
    chosen = default_backend() if backend == "auto" else backend
    modes = [config.mode] if wl.get("mode") else ["sum", "mean"]
    if not as_json:
        echo_err(f"checking on backend {chosen} (B={config.B} D={config.D} E={config.E} L={config.L}) ...")
    results = check_variants(csv_list(variants), csv_list(datasets) or [], config, modes, chosen,
                             parse_params(params), progress=None if as_json else echo_err)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in results], indent=2))
    else:
        print_rows([r.to_dict() for r in results], ["variant", "dataset", "mode", "backend", "max_abs_err",
                                                     "tolerance", "offset2bag_ok", "bag_size_ok", "passed", "error"])
    failed = [r for r in results if r.passed is False]
    ran = [r for r in results if r.passed is not None]
    skipped = len(results) - len(ran)
    note = f" ({skipped} skipped: shape not supported by the variant)" if skipped else ""
    if failed:
        echo_err(f"{len(failed)} of {len(ran)} checks failed{note}")
        sys.exit(1)
    if not ran:
        echo_err(f"nothing was checked{note}")
        sys.exit(1)
    if not as_json:
        echo_err(f"all {len(ran)} checks passed{note}")


# ------------------------------------------------------------------ workload
@main.group()
def workload() -> None:
    """Generate index traces and measure their locality."""


@workload.command("presets")
@click.option("--json", "as_json", is_flag=True)
def workload_presets(as_json: bool) -> None:
    """The hotness presets and their definitions."""
    from .workloads import PRESETS

    rows = [{"preset": h.name, "alpha": h.alpha, "offset_q_frac_E": h.q, "hot_pool_frac_E": h.pool,
             "uniform_background": h.background, "description": h.description} for h in PRESETS.values()]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        print_rows(rows)


@workload.command("stats")
@click.argument("source")
@click.option("--rows", "E", type=int, default=None, help="rows per table (E); inferred from traces when omitted")
@click.option("--top-k", "top_k", type=int, multiple=True, help="K for top-K coverage (repeatable) [60000]")
@click.option("--gpu", default="sm_80", show_default=True, help="also report K = rows fitting this GPU's L2")
@click.option("--lookups", type=int, default=None, help="presets: analyze a stream of exactly N lookups")
@click.option("--table", type=int, default=0, show_default=True, help="which table of the dataset")
@workload_options
@click.option("--json", "as_json", is_flag=True)
def workload_stats(source: str, E: int | None, top_k: tuple[int, ...], gpu: str, lookups: int | None, table: int,
                   as_json: bool, **wl: Any) -> None:
    """Locality of a preset (one-item, high, medium, low, random, zipf:A) or a trace file."""
    from .errors import ConfigError
    from .hardware import gpu_spec
    from .workloads import Hotness, generate_stream, load_dataset, locality_stats, parse_dataset

    config = workload_from(None, E=E, **wl)
    spec = gpu_spec(gpu)
    parsed = parse_dataset(source)
    start = time.perf_counter()
    if isinstance(parsed, Hotness):
        rows = config.E
        if lookups:
            indices = generate_stream(parsed, rows, lookups, seed=config.seed, table=table)
        else:
            indices = load_dataset(source, config, tables=[table]).tables[0].indices
    else:
        from .workloads import load_trace

        ds = load_trace(parsed, config, rows=E)
        if not 0 <= table < len(ds.tables):
            raise ConfigError(f"table {table} not in {source} ({len(ds.tables)} tables)")
        rows, indices = ds.rows, ds.tables[table].indices
    l2_rows = spec.l2_bytes // config.row_bytes
    ks = list(top_k) or [60_000]
    stats = locality_stats(indices, rows, config.row_bytes, ks + [l2_rows])
    elapsed = time.perf_counter() - start
    if as_json:
        out = stats.to_json() | {"source": source, "table": table, "l2_rows": {spec.name: l2_rows}, "seconds": elapsed}
        click.echo(json.dumps(out, indent=2))
        return
    click.echo(f"{source} (table {table}): {stats.lookups:,} lookups over {rows:,} rows of {config.row_bytes} B")
    click.echo(f"  unique rows        {stats.unique_rows:,} ({stats.unique_rows / rows:.1%} of the table)")
    click.echo(f"  bytes touched      {stats.bytes_touched / 2**20:,.1f} MiB")
    for k, v in stats.top_k_coverage.items():
        note = f"  (rows fitting the {spec.name} L2)" if k == l2_rows else ""
        click.echo(f"  top-{k:<8,} coverage {v:.1%}{note}")
    q = "  ".join(f"{k}={v:,.0f}" for k, v in stats.reuse_distance_quantiles.items())
    click.echo(f"  reuse distance     {q}  (distinct rows between re-reads)")
    click.echo(f"  first reads        {stats.cold_fraction:.1%} of lookups")
    echo_err(f"analyzed in {elapsed:.2f} s")


@workload.command("generate")
@click.argument("spec")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="an .npz file (indices, offsets, lengths: the dlrm_datasets layout) or .txt (one index per line)")
@workload_options
def workload_generate(spec: str, output: Path, **wl: Any) -> None:
    """Write a generated dataset to a trace file."""
    import numpy as np

    from .workloads import generate

    config = workload_from(None, **wl)
    ds = generate(spec, config)
    if output.suffix == ".txt":
        np.savetxt(output, ds.tables[0].indices, fmt="%d")
    else:
        lengths = np.stack([tr.lengths() for tr in ds.tables])
        offsets = np.concatenate([[0], np.cumsum(lengths.reshape(-1))])
        np.savez(output, indices=np.concatenate([tr.indices for tr in ds.tables]), offsets=offsets, lengths=lengths)
    click.echo(f"wrote {output} ({config.T} tables, {sum(len(t.indices) for t in ds.tables):,} lookups)")


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

    from .config import load_experiment
    from .experiment import open_experiment_run
    from .hardware import require_gpu

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

    from .analyze import speedups
    from .config import load_experiment
    from .runner import bench_points, pending_points
    from .store import load_run

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

    from .config import load_experiment
    from .ncu import find_ncu
    from .runner import ProfileSettings, pending_points, profile_points

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


# -------------------------------------------------------------------- import
@main.command("import")
@click.argument("report", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write the tidy table to .csv or .parquet")
@click.option("--wide", "as_wide", is_flag=True, help="one row per kernel with friendly columns instead")
@click.option("--run-name", default="", help="value of the run column")
def import_cmd(report: Path, output: Path | None, as_wide: bool, run_name: str) -> None:
    """Turn any .ncu-rep or ncu CSV export into a tidy table."""
    from .errors import ConfigError
    from .extract import read_any, wide

    df = read_any(report, run=run_name or report.stem)
    table = wide(df) if as_wide else df
    if output is None:
        w = wide(df)
        echo_err(f"{report}: {w.shape[0]} kernel(s), {df.shape[0]} metric values")
        cols = [c for c in ("kernel_id", "function", "nvtx_range", "device", "duration_ns", "achieved_occupancy_pct",
                            "theoretical_occupancy_pct", "registers_per_thread", "l2_hit_rate_pct",
                            "dram_bytes_read") if c in w.columns]
        print_rows(w[cols].to_dict("records"))
        return
    if output.suffix == ".csv":
        table.to_csv(output, index=False)
    elif output.suffix == ".parquet":
        table.to_parquet(output, index=False)
    else:
        raise ConfigError(f"output must end in .csv or .parquet, got {output.name}")
    click.echo(f"wrote {output} ({table.shape[0]} rows)")


# -------------------------------------------------------------------- report
@main.command()
@click.argument("sources", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("report.html"), show_default=True,
              help="the HTML file (a directory gets report.html inside)")
@click.option("--title", default=None, help="page title")
@click.option("--no-compare", is_flag=True, help="several sources side by side, without comparison sections")
def report(sources: tuple[Path, ...], output: Path, title: str | None, no_compare: bool) -> None:
    """Self-contained HTML report of run directories and/or .ncu-rep / CSV files
    (with two or more, later ones are also compared with the first)."""
    from .report import render_report

    start = time.perf_counter()
    path = render_report(list(sources), output, title=title, compare=not no_compare)
    echo_err(f"rendered in {time.perf_counter() - start:.1f} s")
    click.echo(f"report: {path}")


# ------------------------------------------------------------------- compare
@main.command()
@click.argument("a", type=click.Path(exists=True, path_type=Path))
@click.argument("b", type=click.Path(exists=True, path_type=Path))
@click.option("--top", type=int, default=40, show_default=True, help="rows to show, largest relative change first")
@click.option("--metric", "metric_filter", default=None, help="only metrics containing this text")
@click.option("--json", "as_json", is_flag=True)
def compare(a: Path, b: Path, top: int, metric_filter: str | None, as_json: bool) -> None:
    """Metric-by-metric comparison of two runs or reports on the metrics they share."""
    from .analyze import comparable_metrics, compare_runs

    ma, mb = comparable_metrics(a), comparable_metrics(b)
    if metric_filter:
        ma = ma[ma["metric"].str.contains(metric_filter, regex=False)]
        mb = mb[mb["metric"].str.contains(metric_filter, regex=False)]
    both, unmatched = compare_runs(ma, mb)
    both = both.assign(rel_change=(both["ratio"] - 1).abs()).sort_values("rel_change", ascending=False)
    if as_json:
        click.echo(json.dumps({"shared": both.drop(columns="rel_change").to_dict("records"),
                               "unmatched": unmatched.to_dict("records")}, indent=1, default=str))
        return
    click.echo(f"A = {a}\nB = {b}\n{len(both)} shared (kernel, metric) values; largest relative changes:")
    cols = [c for c in ("variant", "dataset", "function", "metric", "a", "b", "delta", "ratio") if c in both.columns]
    print_rows(both.head(top).to_dict("records"), cols)
    if not unmatched.empty:
        click.echo(f"\n{len(unmatched)} kernel(s) present in only one of them (not compared):")
        print_rows(unmatched.to_dict("records"))


# ----------------------------------------------------------------------- run
@main.command("run")
@click.argument("experiment", required=False, default="paper")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="run directory [runs/<experiment>-<gpu>]")
@click.option("--resume", is_flag=True, help="continue an interrupted run, keeping finished points")
@click.option("--ncu", "ncu_path", default=None, help="path to the ncu executable (profiling on a GPU)")
def run_cmd(experiment: str, out: Path | None, resume: bool, ncu_path: str | None) -> None:
    """The main job: build, characterize, measure (with a GPU) and summarize an experiment
    (a name under profiles/, e.g. paper or quick, or a TOML file)."""
    from .config import load_experiment
    from .experiment import run_experiment

    exp = load_experiment(experiment)
    start = time.perf_counter()
    echo_err(f"experiment {exp.name}: {exp.description}")
    outcome = run_experiment(exp, out, resume=resume, progress=lambda m: echo_err(f"  {m}"), ncu=ncu_path)
    from .store import load_run

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


from .cli_model import calibrate, predict  # noqa: E402  (model-stage commands)

main.add_command(predict)
main.add_command(calibrate)

if __name__ == "__main__":  # pragma: no cover
    main()
