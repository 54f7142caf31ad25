"""Command `sass`: what the compiled hot loop of each variant does, read from the
machine code (no GPU needed)."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from characterize.cli.base import (
    csv_list,
    echo_err,
    main,
    print_rows,
)
from characterize.config import DEFAULT_ARCHS, parse_param_overrides


def _counts(counts: dict[Any, int], suffix: str = "") -> str:
    """{32: 4, 64: 4} as '32b x4, 64b x4' for the table."""
    return ", ".join(f"{k}{suffix} x{n}" for k, n in sorted(counts.items(), key=lambda kv: str(kv[0]))) or "-"


@main.command()
@click.option("--arch", "archs", default=",".join(DEFAULT_ARCHS), show_default=True, help="comma-separated architectures")
@click.option("--variants", default=None, help="comma-separated variants [all compiled ones]")
@click.option("--D", "D", type=int, default=128, show_default=True, help="embedding dimension (picks the warp kernel)")
@click.option("--param", "params", multiple=True, metavar="VARIANT.NAME=VALUE", help="variant parameter, e.g. rpf.P=4")
@click.option("--dtype", default="fp32", show_default=True,
              help="table element type: fp32, fp16, bf16, int8 (fp32 scale/bias) or int8h (fp16 scale/bias)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def sass(archs: str, variants: str | None, D: int, params: tuple[str, ...], dtype: str, as_json: bool) -> None:
    """Disassemble each variant's hot loop: loads by kind and width, spills, shuffles,
    L2 prefetches and the rows each warp keeps in flight (in-order replay)."""
    from characterize.hardware import parse_archs
    from characterize.kernels.sass import MEMORY_LATENCY, find_cuobjdump
    from characterize.kernels.static import analyze_variants

    arch_list = parse_archs(archs)
    start = time.perf_counter()
    if not as_json:
        tool = find_cuobjdump()
        echo_err(f"building (cached builds are reused) and disassembling with {tool.path} ({tool.version}) ...")
    rows = analyze_variants(csv_list(variants), arch_list, D=D, params=parse_param_overrides(params), dtype=dtype)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in rows], indent=2))
        return
    table = []
    for r in rows:
        d = r.to_dict()
        d["load_bits"] = _counts(r.load_bits, "b")
        d["prefetches"] = _counts(r.prefetches)
        table.append(d)
    print_rows(table, ["variant", "dtype", "arch", "maxrregcount", "role", "kernel", "loop", "registers", "instructions",
                       "lookups_per_iteration", "row_loads", "index_loads", "load_bits", "local_mem_ops", "shuffles",
                       "prefetches", "latencies_per_iteration", "rows_in_flight", "bytes_in_flight_per_warp"])
    click.echo(f"\nrows in flight per warp = row loads / memory latencies serialized per iteration "
               f"(in-order replay, {MEMORY_LATENCY}-cycle global loads); local_mem_ops are spills inside the loop")
    echo_err(f"done in {time.perf_counter() - start:.1f} s")
