"""Commands of the model stage: predict and calibrate."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from characterize.cli.base import main

#: keys of every object `predict --json` prints
PREDICT_KEYS = ("variant", "dtype", "dataset", "arch", "gpu", "l2_hit_rate_pct", "dram_bytes", "time_us", "time_us_low",
                "time_us_high", "speedup_vs_base",
                "bound", "constants")


@main.command("predict")
@click.argument("experiment", required=False, default="paper")
@click.option("--arch", "archs", default=None,
              help="comma-separated architectures or GPU names, e.g. sm_80,sm_90 or a100-40gb,h200 "
                   "[the experiment's architectures]")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def predict(experiment: str, archs: str | None, as_json: bool) -> None:
    """Model predictions for an experiment (a shipped experiment name or a TOML file): kernel
    time per table launch, speedup over base, L2 hit rate and DRAM traffic, without a GPU."""
    from characterize.cli.base import csv_list, echo_err, print_rows
    from characterize.pipeline import load_experiment, predict

    exp = load_experiment(experiment)
    start = time.perf_counter()
    df = predict(exp, csv_list(archs), progress=None if as_json else echo_err)
    if as_json:
        click.echo(json.dumps(df[list(PREDICT_KEYS)].to_dict("records"), indent=2))
        return
    view = df.assign(dram_MB=df["dram_bytes"] / 1e6)
    print_rows(view.to_dict("records"), ["variant", "dataset", "arch", "gpu", "time_us", "speedup_vs_base", "bound",
                                         "l1_hit_rate_pct", "l2_hit_rate_pct", "dram_MB", "resident_warps",
                                         "loads_in_flight", "constants"])
    notes = sorted(set(df["note"]) - {""})
    for n in notes:
        click.echo(f"note: {n}")
    used = ", ".join(f"{g}: {c}" for g, c in df.groupby("gpu")["constants"].first().items())
    click.echo(f"\nconstants: {used} (`characterize calibrate RUN_DIR` fits them to a measured run)")
    echo_err(f"predicted {len(df)} points in {time.perf_counter() - start:.1f} s")


@main.command("calibrate")
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--gpu", default=None, help="GPU the run was measured on [the run's meta.json]")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def calibrate(run_dir: Path, gpu: str | None, as_json: bool) -> None:
    """Fit the model's constants to a measured run and store them for its GPU; later
    predictions for that GPU use them."""
    from characterize.cli.base import echo_err, print_rows
    from characterize.pipeline import calibrate as fit_and_store

    cal = fit_and_store(run_dir, gpu, progress=None if as_json else echo_err)
    path = cal.path
    if as_json:
        click.echo(json.dumps(cal.to_dict() | {"path": str(path)}, indent=2))
        return
    fitted, default = cal.constants.to_dict(), cal.defaults.to_dict()
    rows = [{"constant": k, "default": default[k], "fitted": fitted[k], "fitted/default": fitted[k] / default[k],
             "free": k in cal.fitted} for k in fitted]
    print_rows(rows)
    click.echo(f"\n{cal.gpu.name}: {cal.points} timed points, {cal.hit_points} L2 hit rates; geometric-mean "
               f"absolute error {100 * cal.gmae_default:.1f}% with the defaults, {100 * cal.gmae_fitted:.1f}% fitted")
    click.echo(f"stored in {path}")
