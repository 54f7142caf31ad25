"""Commands of the model stage: predict and calibrate."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import click

from characterize.cli.base import echo, main, trace_options, wide_option
from characterize.errors import ConfigError

#: keys of every object `predict --json` prints
PREDICT_KEYS = ("variant", "dtype", "dataset", "arch", "gpu", "mode", "kernel_source", "tables_per_launch",
                "l2_hit_rate_pct", "dram_bytes", "time_us", "time_us_low", "time_us_high", "batch_us", "floor_us",
                "speedup_vs_base", "speedup_vs_torch", "speedup_vs_fbgemm", "bound", "constants", "validated_n",
                "validated_gmae_pct")
#: keys `predict --json` adds for host-resident tables (null on the other variants' rows)
HOST_KEYS = ("cache_ratio", "cache_rows", "cache_hit_rate_pct", "host_bytes", "host_link", "dedup_us", "transfer_us",
             "lookup_us")


def parse_ratios(text: str) -> list[float]:
    """'0.5%,1.5%,5%' or '0.005,0.015' -> shares of E in (0, 1]."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            value = float(part[:-1]) / 100 if part.endswith("%") else float(part)
        except ValueError:
            raise ConfigError(f"bad cache ratio {part!r}: use shares of the table such as 0.5%,1.5%,5% "
                              "(or 0.005,0.015,0.05)") from None
        if not 0 < value <= 1:
            raise ConfigError(f"cache ratio {part} is outside (0, 100%]: it is the share of each table's rows "
                              "the GPU cache holds")
        out.append(value)
    if not out:
        raise ConfigError("--cache-ratio needs at least one share, e.g. 0.5%,1.5%,5%")
    return out


@main.command("predict")
@click.argument("experiment", required=False, default="paper")
@click.option("--arch", "archs", default=None,
              help="comma-separated architectures or GPU names, e.g. sm_80,sm_90 or a100-40gb,h200 "
                   "[the experiment's architectures]")
@click.option("--cache-ratio", "cache_ratio", default=None,
              help="sweep the cache variant's GPU cache size, as shares of each table's rows: 0.5%,1.5%,5%,... "
                   "(rows carry cache_ratio, cache_hit_rate_pct, host_bytes and the time split)")
@click.option("--dtypes", default=None,
              help="also predict these precisions (fp32,fp16,bf16,int8,int8h,fp8; 'all') beside the workload's dtype "
                   "[the experiment's dtypes]")
@click.option("--mode", "mode", type=click.Choice(["steady", "cold", "both"]), default="steady", show_default=True,
              help="steady: tables in turn, as in production; cold: L2 flushed before each launch, as a benchmark "
                   "that flushes it (triton's do_bench) measures")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@trace_options(pooling=("--pooling",))
@wide_option
def predict(experiment: str, archs: str | None, cache_ratio: str | None, dtypes: str | None, mode: str,
            as_json: bool, trace: Path | None, **wl: Any) -> None:
    """Model predictions for an experiment (a shipped experiment name or a TOML file), or for
    your own trace (--trace FILE): kernel time per launch with its band, speedups over base,
    PyTorch's and FBGEMM's kernels, L2 hit rate and DRAM traffic, without a GPU; every
    row says how the model did on public measurements; for host-resident tables (cache,
    uvm) the hit rate, host bytes and the time split. Ends with the answer: the best
    variant per dataset and GPU."""
    from characterize.analysis.answer import answer, band_text, predicted_speedups
    from characterize.analysis.model.predict import precision_grid
    from characterize.cli.base import (
        TerminalReporter,
        asks,
        csv_list,
        echo_err,
        experiment_with,
        print_answer,
        print_rows,
    )
    from characterize.config import DTYPES
    from characterize.kernels.registry import HOST_VARIANTS
    from characterize.pipeline import predict

    ratios = parse_ratios(cache_ratio) if cache_ratio is not None else None
    exp = experiment_with(experiment, trace, lambda m: None if as_json else echo_err(m), asks(as_json), **wl)
    if dtypes is not None:
        exp = dataclasses.replace(exp, dtypes=tuple(DTYPES) if dtypes == "all" else tuple(csv_list(dtypes))).validate()
    start = time.perf_counter()
    with TerminalReporter(indent="", quiet=as_json) as reporter:
        df = predict(exp, csv_list(archs), progress=reporter, cache_ratios=ratios,
                     mode=["steady", "cold"] if mode == "both" else mode)
    host = df["variant"].isin(HOST_VARIANTS)
    if as_json:
        keys = list(PREDICT_KEYS) + (list(HOST_KEYS) if host.any() else [])
        rows = df[keys].astype(object).where(df[keys].notna(), None).to_dict("records")
        echo(json.dumps(rows, indent=2))
        return
    sp = predicted_speedups(df)
    view = df.assign(band_us=[f"{lo:,.1f}-{hi:,.1f}" if lo == lo and hi == hi else "" for lo, hi in
                              zip(df["time_us_low"], df["time_us_high"])],
                     speedup_vs_base=[band_text(x, lo, hi) for x, lo, hi in zip(sp["speedup"], sp["speedup_low"],
                                                                        sp["speedup_high"])])
    view = view.assign(tables=view["tables_per_launch"], vs_torch=view["speedup_vs_torch"],
                       vs_fbgemm=view["speedup_vs_fbgemm"])
    print_rows(view.to_dict("records"), ["variant", "dtype", "dataset", "gpu", *(["mode"] if mode == "both" else []),
                                         "time_us", "band_us", "tables", "speedup_vs_base", "vs_torch", "vs_fbgemm",
                                         "bound", "l1_hit_rate_pct", "l2_hit_rate_pct", "dram_bytes",
                                         "resident_warps", "loads_in_flight", "arch", "constants"])
    echo("\ntime_us: one launch, covering `tables` tables; speedups compare whole batches of every table "
         "(torch: PyTorch 2.13's kernel, fbgemm: FBGEMM 1.8's TBE, each read from its own SASS)")
    grid = precision_grid(df)
    if not grid.empty:
        echo("\nprecision x variant: predicted speedup over fp32 base (geometric mean over datasets):")
        wide = grid.pivot_table(index=["gpu", "dtype"], columns="variant", values="speedup_vs_fp32_base",
                                sort=False).reset_index()
        print_rows(wide.to_dict("records"), [str(c) for c in wide.columns])
    if host.any():
        h = df[host]
        echo("\nhost-resident tables (per table launch; cache_hit_rate_pct: of a batch's unique rows; "
                   "uvm: GPU memory as a cache of 64 KiB pages; pct_of_all_gpu: base's time / this time):")
        row_bytes = h["dtype"].map(lambda dt: exp.workload.replace(dtype=dt).row_bytes)
        sweep = h.assign(cache_pct=100 * h["cache_ratio"], cache_bytes=h["cache_rows"] * row_bytes,
                         share_of_all_gpu_pct=100 * h["speedup_vs_base"])
        print_rows(sweep.to_dict("records"), ["variant", "dtype", "dataset", "gpu", "cache_pct", "cache_bytes",
                                              "cache_hit_rate_pct", "host_bytes", "host_link", "dedup_us",
                                              "transfer_us", "lookup_us", "time_us", "share_of_all_gpu_pct"])
    notes = sorted(set(df["note"]) - {""})
    for n in notes:
        echo(f"note: {n}")
    used = ", ".join(f"{g}: {c}" for g, c in df.groupby("gpu")["constants"].first().items())
    echo(f"\nconstants: {used} (`characterize calibrate RUN_DIR` fits them to a measured run)")
    print_answer(answer(df, dtype=exp.workload.dtype))
    echo_err(f"predicted {len(df)} points in {time.perf_counter() - start:.1f} s")


@main.command("calibrate")
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--gpu", default=None, help="GPU the run was measured on [the run's meta.json]")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@wide_option
def calibrate(run_dir: Path, gpu: str | None, as_json: bool) -> None:
    """Fit the model's constants to a measured run and store them for its GPU; later
    predictions for that GPU use them."""
    from characterize.cli.base import echo_err, print_rows
    from characterize.pipeline import calibrate as fit_and_store

    cal = fit_and_store(run_dir, gpu, progress=None if as_json else echo_err)
    path = cal.path
    if as_json:
        echo(json.dumps(cal.to_dict() | {"path": str(path)}, indent=2))
        return
    fitted, default = cal.constants.to_dict(), cal.defaults.to_dict()
    rows = [{"constant": k, "default": default[k], "fitted": fitted[k], "fitted/default": fitted[k] / default[k],
             "free": k in cal.fitted} for k in fitted]
    print_rows(rows)
    echo(f"\n{cal.gpu.name}: {cal.points} timed points, {cal.hit_points} L2 hit rates; geometric-mean "
               f"absolute error {100 * cal.gmae_default:.1f}% with the defaults, {100 * cal.gmae_fitted:.1f}% fitted")
    echo(f"stored in {path}")


@main.command("validate")
@click.option("--write", is_flag=True,
              help="store the cross-validated error every prediction then carries (analysis/model/model_error.json) "
                   "and the per-row results (validation.csv)")
@click.option("--add-run", "add_runs", multiple=True, type=click.Path(file_okay=False, path_type=Path),
              help="first add a measured run's bench points to our own corpus (measured_here.csv), as a source "
                   "of its own (repeatable)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def validate(write: bool, add_runs: tuple[Path, ...], as_json: bool) -> None:
    """The model against public measured kernel times (pull requests, benchmark result files,
    a paper's artifact; analysis/model/measurements.csv): each row's error, MAPE and GMAE
    per source and overall, the share inside the band, all under leave-one-source-out
    cross-validation; the published constants' errors beside them. Then our own GPU runs
    (measured_here.csv, `--add-run` appends one): per run, regime and variant, each dataset
    and each run held out, the fastest variant per group, and the bands per regime."""
    from characterize.analysis.validation import BAND_NOMINAL
    from characterize.cli.base import TerminalReporter, echo_err, print_rows
    from characterize.pipeline import validate as run_validate

    start = time.perf_counter()
    for path in add_runs:
        from characterize.analysis.validation import add_run
        from characterize.store import load_run

        source, n = add_run(load_run(path))
        echo_err(f"{path}: {n} point(s) added to our own corpus as source {source}")
    with TerminalReporter(indent="", quiet=as_json) as reporter:
        result = run_validate(write=write, progress=reporter)
    here = result.here
    if as_json:
        echo(json.dumps({"rows": result.rows.to_dict("records"), "summary": result.summary.to_dict("records"),
                               "proxies": result.proxies.to_dict("records"),
                               "default_summary": result.default_summary.to_dict("records"),
                               "error": result.error.to_dict(), "folds": result.folds,
                               "left_out": result.left_out.to_dict("records"),
                               "here": None if here is None else {
                                   "rows": here.rows.to_dict("records"),
                                   **{f"by_{k}": v.to_dict("records") for k, v in here.by.items()},
                                   "shapes": here.shapes.to_dict("records"), "best": here.best.to_dict("records"),
                                   "bands": here.bands, "band_tail": here.tail,
                                   "band_tails": here.tails}}, indent=2, default=str))
        return
    echo("each measurement, predicted with the published constants and held out (constants refitted on the "
               "other sources):")
    print_rows(result.rows.to_dict("records"), ["id", "source", "gpu", "variant", "dataset", "mode", "measured_us",
                                                "predicted_us", "error_pct", "cv_predicted_us", "cv_error_pct",
                                                "band_low_us", "band_high_us"])
    echo("\nleave-one-source-out cross-validation (bands widened by the other sources' errors):")
    print_rows(result.summary.to_dict("records"), ["source", "n", "gpus", "mape", "gmae", "inside_band"],
               fractions=["mape", "gmae", "inside_band"])
    if not result.proxies.empty:
        echo("\nproxy rows (a paper's kernel no one can read, stood in for by our implementation of its design; "
                   "not in the figures above):")
        print_rows(result.proxies.to_dict("records"), ["source", "n", "gpus", "mape", "gmae", "inside_band"],
                   fractions=["mape", "gmae", "inside_band"])
    echo("\nthe published constants, untouched by the corpus:")
    print_rows(result.default_summary.to_dict("records"), ["source", "n", "mape", "gmae", "inside_band"],
               fractions=["mape", "gmae", "inside_band"])
    if here is not None:
        echo("\nour own GPU runs (analysis/model/measured_here.csv), each dataset held out (constants refitted on "
             "the others; bands from the same regime's errors in the other datasets, predicted by fits without the "
             "held-out one, cutting the tail that held "
             f"{100 * BAND_NOMINAL:.0f}% of those datasets' points):")
        for key in ("source", "regime", "variant"):
            print_rows(here.by[key].to_dict("records"), [key, "n", "gmae", "mape", "inside_band"],
                       fractions=["gmae", "mape", "inside_band"])
            echo("")
        echo("each run (shape) held out:")
        print_rows(here.shapes.to_dict("records"), ["source", "n", "gmae", "mape"], fractions=["gmae", "mape"])
        if not here.best.empty:
            wrong = here.best[~here.best["right"]]
            echo(f"\nthe fastest variant per run x dataset x mode: {int(here.best['right'].sum())} of {len(here.best)} "
                 "predicted right (held out by dataset)" + (":" if len(wrong) else ""))
            if len(wrong):
                rows = [{**r, "predicted best, measured": f"{r['measured_margin_pct']:+.1f}%",
                         "measured best, predicted": f"{r['predicted_margin_pct']:+.1f}%"}
                        for r in wrong.to_dict("records")]
                print_rows(rows, ["source", "dataset", "mode", "measured_best", "predicted_best",
                                  "predicted best, measured", "measured best, predicted"])
                echo("(the predicted winner's measured time over the measured winner's; the measured winner's "
                     "predicted time over the predicted winner's)")
            right = here.best[here.best["right"]]
            if len(right):
                echo(f"where right, the runner-up measured {right['measured_margin_pct'].min():.1f}% slower at the "
                     f"closest (median {right['measured_margin_pct'].median():.1f}%)")
        span = (f"{100 * here.tail:g}th to {100 - 100 * here.tail:g}th percentile" if here.tail > 0 else
                "the whole range")
        echo(f"\nbands per regime (multipliers of a prediction, {span} of held-out errors; the narrowest span that "
             f"held {100 * BAND_NOMINAL:.0f}% of the datasets it was not chosen on, or the whole range): " +
             "; ".join(f"{r} x{a:.2f}-{b:.2f} (n={n})" for r, (a, b, n) in here.bands.items()))
    echo(f"\n{len(result.left_out)} corpus row(s) the model cannot express stay in the file with why "
               "(`--json` lists them); " + result.error.sentence())
    if write:
        echo("stored: every prediction now carries this figure and its band")
    echo_err(f"done in {time.perf_counter() - start:.1f} s")
