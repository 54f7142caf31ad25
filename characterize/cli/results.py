"""Commands over stored results: import, report, compare."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from characterize.cli.base import echo_err, main, print_rows


# -------------------------------------------------------------------- import
@main.command("import")
@click.argument("report", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write the tidy table to .csv or .parquet")
@click.option("--wide", "as_wide", is_flag=True, help="one row per kernel with friendly columns instead")
@click.option("--run-name", default="", help="value of the run column")
def import_cmd(report: Path, output: Path | None, as_wide: bool, run_name: str) -> None:
    """Turn any .ncu-rep or ncu CSV export into a tidy table."""
    from characterize.errors import ConfigError
    from characterize.extract.read import read_any, wide

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
    from characterize.report.render import render_report

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
    from characterize.analysis.compare import compare_sources

    both, unmatched = compare_sources(a, b, metric_filter)
    if as_json:
        click.echo(json.dumps({"shared": both.to_dict("records"),
                               "unmatched": unmatched.to_dict("records")}, indent=1, default=str))
        return
    click.echo(f"A = {a}\nB = {b}\n{len(both)} shared (kernel, metric) values; largest relative changes:")
    cols = [c for c in ("variant", "dataset", "function", "metric", "a", "b", "delta", "ratio") if c in both.columns]
    print_rows(both.head(top).to_dict("records"), cols)
    if not unmatched.empty:
        click.echo(f"\n{len(unmatched)} kernel(s) present in only one of them (not compared):")
        print_rows(unmatched.to_dict("records"))


