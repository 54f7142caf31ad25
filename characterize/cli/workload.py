"""Commands of the workload stage: presets, stats, generate."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from characterize.cli.base import (
    TerminalReporter,
    echo,
    echo_err,
    main,
    print_rows,
    wide_option,
    workload_from,
    workload_options,
)
from characterize.hardware.specs import REFERENCE_ARCH
from characterize.workloads.locality import PAPER_HOT_ROWS
from characterize.workloads.shape import FORMATS


# ------------------------------------------------------------------ workload
@main.group(help="""Generate index traces and measure their locality.

\b
Trace files read (by `workload stats`, `predict --trace`, `run --trace` and experiments' datasets):
""" + "\n".join(f"  {f}" for f in FORMATS) + """

\b
Bag boundaries: a file with offsets or lengths keeps its own bags in predict and bench alike;
a flat stream is cut into bags of L lookups, read circularly, the same way for both.
Negative or out-of-range indices are refused with the file, table and position.""")
def workload() -> None:
    """Generate index traces and measure their locality."""


@workload.command("presets")
@click.option("--json", "as_json", is_flag=True)
@wide_option
def workload_presets(as_json: bool) -> None:
    """The hotness presets and their definitions."""
    from characterize.workloads.presets import PRESETS

    rows = [{"preset": h.name, "alpha": h.alpha, "offset_q_frac_E": h.q, "hot_pool_frac_E": h.pool,
             "uniform_background": h.background, "description": h.description} for h in PRESETS.values()]
    if as_json:
        echo(json.dumps(rows, indent=2))
    else:
        print_rows(rows)


@workload.command("stats")
@click.argument("source")
@click.option("--rows", "E", type=int, default=None, help="rows per table (E); inferred from traces when omitted")
@click.option("--top-k", "top_k", type=int, multiple=True, help=f"K for top-K coverage (repeatable; {PAPER_HOT_ROWS} always)")
@click.option("--gpu", default=REFERENCE_ARCH, show_default=True, help="also report K = rows fitting this GPU's L2")
@click.option("--lookups", type=int, default=None,
              help="presets: a stream of exactly N lookups; files: the first N lookups of the table (at most what "
                   "it holds, or what the bench reads with --as-consumed)")
@click.option("--table", type=int, default=0, show_default=True, help="which table of the dataset")
@click.option("--as-consumed", is_flag=True,
              help="files: what the bench reads instead of the file as it is: batches x B x L lookups, the file "
                   "read circularly (--batches, --B, --L set them)")
@workload_options
@click.option("--json", "as_json", is_flag=True)
def workload_stats(source: str, E: int | None, top_k: tuple[int, ...], gpu: str, lookups: int | None, table: int,
                   as_consumed: bool, as_json: bool, **wl: Any) -> None:
    """Locality of a preset (one-item, high, medium, low, random, zipf:A) or a trace file
    (its own lookups, or with --as-consumed what the bench reads of it)."""
    from characterize.hardware.specs import gpu_spec
    from characterize.workloads.locality import source_locality

    config = workload_from(None, E=E, **wl)
    spec = gpu_spec(gpu)
    start = time.perf_counter()
    l2_rows = spec.rows_in_l2(config.row_bytes)
    with TerminalReporter(indent="", quiet=as_json, summaries=False) as reporter, \
            reporter.task(f"locality of {source}", unit="lookups") as task:   # big traces take seconds
        seen = [0]

        def follow(done: int, total: int) -> None:
            if not seen[0]:
                task.grow(total)
            task.advance(done - seen[0], item="reuse distances")
            seen[0] = done

        res = source_locality(source, config, rows=E, lookups=lookups, table=table, top_k=[*top_k, l2_rows],
                              as_consumed=as_consumed, progress=follow)
        task.finish("done")
    stats, rows = res.stats, res.rows
    elapsed = time.perf_counter() - start
    if as_json:
        out = stats.to_json() | {"source": source, "table": table, "view": res.view,
                                 "file_lookups": res.file_lookups, "tables_in_file": res.tables_in_file,
                                 "l2_rows": {spec.name: l2_rows}, "seconds": elapsed}
        echo(json.dumps(_no_nan(out), indent=2))
        return
    if res.view == "file":
        part = "" if stats.lookups == res.file_lookups else f"the first {stats.lookups:,} of "
        view = f"{part}the file's {res.file_lookups:,} lookups"
    elif res.view == "consumed":
        held = f"; the file holds {res.file_lookups:,}" if res.file_lookups is not None else ""
        view = (f"{stats.lookups:,} lookups as the bench reads them ({config.batches} batches x B={config.B} x "
                f"L={config.L}, read circularly{held})")
    else:
        view = f"{stats.lookups:,} generated lookups"
    echo(f"{source} (table {table}): {view}, over {rows:,} rows of {config.row_bytes} B")
    echo(f"  unique rows        {stats.unique_rows:,} ({stats.unique_rows / rows:.1%} of the table)")
    echo(f"  bytes touched      {stats.bytes_touched / 2**20:,.1f} MiB")
    for k, v in stats.top_k_coverage.items():
        note = f"  (rows fitting the {spec.name} L2)" if k == l2_rows else ""
        echo(f"  top-{k:<8,} coverage {v:.1%}{note}")
    q = "  ".join(f"{k}={v:,.0f}" for k, v in stats.reuse_distance_quantiles.items() if v == v)
    echo(f"  reuse distance     {q}  (distinct rows between re-reads)" if q else
               "  reuse distance     none: no row is read twice, so there is no reuse to measure")
    echo(f"  first reads        {stats.cold_fraction:.1%} of lookups")
    if source_is_file(source) and str(source).lower().endswith(".npz"):
        from characterize.workloads.traces import npz_layout

        echo_err(f"read from {npz_layout(source)}")
    if res.view == "file" and source_is_file(source):
        echo_err("the file as it is; --as-consumed shows what the bench reads of it (batches x B x L, circularly)")
    echo_err(f"analyzed in {elapsed:.2f} s")


def _no_nan(obj: Any) -> Any:
    """JSON without NaN (not JSON at all): a statistic that does not exist is null."""
    if isinstance(obj, dict):
        return {k: _no_nan(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_no_nan(v) for v in obj]
    return None if isinstance(obj, float) and obj != obj else obj


def source_is_file(source: str) -> bool:
    """Whether a dataset name is a trace file rather than a preset."""
    from characterize.workloads.presets import Hotness, parse_dataset

    return not isinstance(parse_dataset(source), Hotness)


@workload.command("generate")
@click.argument("spec")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="an .npz file (indices, offsets, lengths: the dlrm_datasets layout) or .txt (one index per line)")
@workload_options
def workload_generate(spec: str, output: Path, **wl: Any) -> None:
    """Write a generated dataset to a trace file."""
    from characterize.workloads.traces import generate, write_trace

    config = workload_from(None, **wl)
    ds = generate(spec, config)
    write_trace(ds, output)
    echo(f"wrote {output} ({config.T} tables, {sum(len(t.indices) for t in ds.tables):,} lookups)")


