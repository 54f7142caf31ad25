"""Commands over stored results: import, report, compare."""

from __future__ import annotations

import json
from pathlib import Path

import click

from characterize.cli.base import TerminalReporter, echo, echo_err, main, plain_number, print_rows, wide_option
from characterize.units import format_bytes


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

    if output is not None and output.suffix not in (".csv", ".parquet"):
        raise ConfigError(f"output must end in .csv or .parquet, got {output.name}")
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
    from characterize.files import atomic_output

    blocked = next((d for d in output.parents if d.exists() and not d.is_dir()), None)
    if blocked is not None:
        raise ConfigError(f"cannot write {output}: {blocked} is a file, not a directory; choose another -o")
    with atomic_output(output, [report]) as f:   # a missing directory is created, like `report -o`
        if output.suffix == ".csv":
            f.write(table.to_csv(index=False).encode())
        else:
            table.to_parquet(f, index=False)
    echo(f"wrote {output} ({table.shape[0]} rows)")


# -------------------------------------------------------------------- report
@main.command()
@click.argument("sources", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("report.html"), show_default=True,
              help="the HTML file (a directory gets report.html inside)")
@click.option("--title", default=None, help="page title")
@click.option("--no-compare", is_flag=True, help="several sources side by side, without comparison sections")
@click.option("--pair", "pairs", multiple=True, metavar="A=B",
              help="pair A of the first source with B of another in comparisons, or of a single source with "
                   "itself: a variant (base), variant/dataset, NVTX range, function or demangled name, or #ID "
                   "(repeatable)")
def report(sources: tuple[Path, ...], output: Path, title: str | None, no_compare: bool,
           pairs: tuple[str, ...]) -> None:
    """Self-contained HTML report of run directories and/or .ncu-rep / CSV files
    (with two or more, later ones are also compared with the first)."""
    from characterize.analysis.compare import parse_pairs
    from characterize.report.render import render_report

    parse_pairs(pairs)  # a malformed --pair is one clear line, before any work
    with TerminalReporter(indent="") as reporter, reporter.task(f"rendering {len(sources)} source(s)") as task:
        path = render_report(list(sources), output, title=title, compare=not no_compare, pairs=pairs)
        task.finish("rendered")
    echo(f"report: {path}")


# ------------------------------------------------------------------- compare
_KERNEL_COLS = ("variant", "dataset", "a_kernel", "b_kernel", "match", "metric", "per", "a", "b", "delta",
                "change")


def metric_cells(metric: str, a: float, b: float, delta: float, rel: float) -> tuple[str, str, str, str]:
    """a, b, b - a and the relative change of one metric, in its unit: a percentage moves by
    percentage points (25.1% -> 33.5%: +8.4 pp, +33.6%), bytes in binary units, durations
    in us; never scientific notation, nothing for a missing value."""
    def num(v: float, unit: str = "", sign: bool = False) -> str:
        if v != v:
            return ""
        plus = "+" if sign and v > 0 else ""
        if unit == "B":
            return plus + format_bytes(v)
        if unit in ("%", " pp"):
            return f"{plus}{v:.1f}{unit}"
        return plus + (f"{int(v):,}" if float(v).is_integer() else plain_number(v)) + unit

    change = "" if rel != rel else f"{rel:+.1f}%"
    if metric.endswith("_pct"):
        return num(a, "%"), num(b, "%"), num(delta, " pp", True), change
    if metric.endswith("_bytes") or "_bytes_" in metric:
        return num(a, "B"), num(b, "B"), num(delta, "B", True), change
    if metric.endswith("_ns"):
        return num(a / 1e3, " us"), num(b / 1e3, " us"), num(delta / 1e3, " us", True), change
    return num(a), num(b), num(delta, "", True), change


def _section(title: str, frame, columns=None, top: int | None = None) -> None:  # noqa: ANN001 - a DataFrame
    echo(f"\n{title}")
    if frame is None or frame.empty:
        echo("(nothing)")
        return
    rows = frame.head(top).to_dict("records") if top else frame.to_dict("records")
    cols = [c for c in (columns or frame.columns) if c in frame.columns]
    print_rows(rows, cols)
    if top and len(frame) > top:
        echo(f"... {len(frame) - top} more (--top)")


@main.command()
@click.argument("a", type=click.Path(exists=True, path_type=Path))
@click.argument("b", type=click.Path(exists=True, path_type=Path))
@click.option("--top", type=click.IntRange(min=1), default=40, show_default=True, help="rows to show per table")
@click.option("--metric", "metric_filter", default=None,
              help="also list every raw ncu metric containing this text, matched kernel by matched kernel")
@click.option("--pair", "pairs", multiple=True, metavar="A=B",
              help="put kernels A of the first beside kernels B of the second: a variant (base=tbe), "
                   "variant/dataset (rpf/random=combined/random), NVTX range, function or demangled name, or #ID "
                   "(tbe#0 where reports share IDs); repeatable. A and B may be one run: then only the pairs compare")
@click.option("--fail-if-slower", "fail_pct", type=float, default=None, metavar="PCT",
              help="regression gate: exit 15, naming the points, when a timed point of B is more than PCT%% slower "
                   "than A's beyond both 95%% CIs")
@click.option("--json", "as_json", is_flag=True)
@wide_option
def compare(a: Path, b: Path, top: int, metric_filter: str | None, pairs: tuple[str, ...], fail_pct: float | None,
            as_json: bool) -> None:
    """Compare two runs or reports, or kernels of one run (--pair base=tbe), as Nsight
    Compute's baseline does: kernels matched by --pair, base name and launch order, with
    every metric's delta, per table (a batched launch divided by the tables it covers);
    between two runs also timings with significance, the static characterization, SASS hot
    loops and model predictions."""
    from characterize.analysis.compare import (
        SlowdownGate,
        compare_all,
        compare_sources,
        parse_pairs,
        setup_differences,
    )

    parse_pairs(pairs)
    for difference in setup_differences(a, b):   # said first, on stderr (JSON stays clean)
        echo_err(f"warning: {difference}")
    gate = SlowdownGate(fail_pct) if fail_pct is not None else None   # a bad PCT is refused before any work
    parts = compare_all(a, b, pairs)
    if gate is not None and "bench" not in parts:
        from characterize.errors import ConfigError

        raise ConfigError(f"--fail-if-slower judges timed points: {a if Path(a).is_file() else b} is a report, "
                          "not a run; give two run directories")
    if as_json or metric_filter:  # every raw metric of every matched kernel: only when asked for
        both, unmatched = compare_sources(a, b, metric_filter, pairs)
    if as_json:
        out = {k: v.to_dict("records") for k, v in parts.items()}
        out |= {"shared": both.to_dict("records"), "unmatched": unmatched.to_dict("records")}
        echo(json.dumps(out, indent=1, default=str))
        if gate is not None:
            judged = gate.check(parts["bench"], str(a), str(b))
            echo_err(f"--fail-if-slower {fail_pct:g}: none of {len(judged)} timed point(s) is slower")
        return
    echo(f"A = {a}\nB = {b}")
    same = Path(a).resolve() == Path(b).resolve()
    if same and pairs:
        echo("(one source on both sides: only the --pair kernels and points are compared)")
    k = parts.get("kernels")
    if k is not None:
        kk = k.copy()
        if not kk.empty:
            cells = [metric_cells(*r) for r in zip(kk["metric"], kk["a"], kk["b"], kk["delta"], kk["delta_pct"])]
            kk["a"], kk["b"], kk["delta"], kk["change"] = (list(c) for c in zip(*cells))
        _section("Matched kernels (--pair, base name + launch order, similar names): b - a; per: the unit of "
                 "durations, bytes and counts (per table: a batched launch divided by the tables it covers); "
                 "percentages change by percentage points (pp), change: relative", kk, _KERNEL_COLS, top)
        un = parts.get("unmatched_kernels")
        if un is not None and not un.empty:
            _section(f"{len(un)} kernel(s) present in only one of them (not compared; pair them with --pair A=B):",
                     un)
    if "bench" in parts:
        _section("Timed points (per-table latency, µs; significant: |delta| > 95% CI of the difference)",
                 parts["bench"], ("variant", "dataset", "mode", "per_table_us_a", "ci95_us_a", "per_table_us_b",
                                  "ci95_us_b", "delta_us", "delta_pct", "significant"), top)
    if "static" in parts:
        _section("Static characterization: changed values", parts["static"],
                 ("variant", "arch", "role", "maxrregcount", "sweep", "column", "a", "b", "delta"), top)
        echo(f"({int(parts['static_unchanged']['rows'].iloc[0])} static row(s) unchanged)")
        _section("SASS hot loops: changed values", parts["sass"],
                 ("variant", "arch", "role", "kernel", "column", "a", "b", "delta"), top)
        p = parts["predictions"]
        if not p.empty:
            p = p.reindex(p["delta_pct"].abs().sort_values(ascending=False, kind="stable").index)
        _section("Model predictions (PREDICTED time per table launch, µs), largest change first", p,
                 ("variant", "dataset", "gpu", "mode", "time_us_a", "time_us_b", "delta_us", "delta_pct",
                  "outside_band"), top)
    if metric_filter:
        _section(f"Raw metrics containing {metric_filter!r}, largest relative change first (per: the unit of a "
                 "launch's .sum totals)", both,
                 ("variant", "dataset", "function", "a_kernel", "b_kernel", "metric", "per", "a", "b", "delta",
                  "ratio"), top)
    if gate is not None:
        judged = gate.check(parts["bench"], str(a), str(b))
        echo(f"\n--fail-if-slower {fail_pct:g}: none of {len(judged)} timed point(s) is more than {fail_pct:g}% "
             "slower beyond the 95% CIs")
