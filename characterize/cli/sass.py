"""Command `sass`: what the compiled hot loop of each variant does, read from the
machine code (no GPU needed)."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from characterize.cli.base import (
    TerminalReporter,
    csv_list,
    echo,
    echo_err,
    main,
    print_rows,
    wide_option,
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
              help="table element type: fp32, fp16, bf16, int8 (fp32 scale/bias), int8h (fp16 scale/bias) or fp8 (e4m3, fp32 scale; tbe)")
@click.option("--training", is_flag=True,
              help="the training step's kernels instead (backward and fused optimizer: cuda-atomic, cuda-sorted, "
                   "cuda-fused-*), with their registers, spills and occupancy")
@click.option("--binary", "binary", default=None, metavar="PATH",
              help="analyze any CUDA binary instead of our variants: a shared library (libtorch_cuda.so, FBGEMM's "
                   "extension, yours), an executable, a cubin or a fatbin")
@click.option("--kernel", "kernel", default=".", show_default=True, metavar="REGEX",
              help="with --binary: the functions whose demangled name matches this regular expression")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@wide_option
def sass(archs: str, variants: str | None, D: int, params: tuple[str, ...], dtype: str, training: bool,
         binary: str | None, kernel: str, as_json: bool) -> None:
    """Disassemble each variant's hot loop: loads by kind and width, spills, shuffles,
    L2 prefetches and the rows each warp keeps in flight (in-order replay), in the hot
    loop and over the whole loop nest (tile index loads and per-bag work counted).
    With --binary, the same for the matching functions of any CUDA binary."""
    from characterize.hardware.specs import parse_archs
    from characterize.kernels.build import reported_builds
    from characterize.kernels.sass import MEMORY_LATENCY, REFERENCE_L, find_cuobjdump
    from characterize.kernels.static import analyze_variants

    start = time.perf_counter()
    if binary is not None:
        _binary(binary, kernel, archs, dtype, as_json)
        echo_err(f"done in {time.perf_counter() - start:.1f} s")
        return
    arch_list = parse_archs(archs)
    if training:
        _training(arch_list, csv_list(variants), D, dtype, as_json)
        return
    tool = find_cuobjdump()
    with TerminalReporter(indent="", quiet=as_json) as reporter, \
            reported_builds(reporter, f"building and disassembling with {tool.path} ({tool.version})") as tally:
        rows = analyze_variants(csv_list(variants), arch_list, D=D, params=parse_param_overrides(params),
                                dtype=dtype)
        tally.note = f"{len(rows)} kernel(s) disassembled"
    if as_json:
        echo(json.dumps([r.to_dict() for r in rows], indent=2))
        return
    table = []
    for r in rows:
        d = r.to_dict()
        d["load_bits"] = _counts(r.load_bits, "b")
        d["prefetches"] = _counts(r.prefetches)
        table.append(d)
    print_rows(table, ["variant", "dtype", "arch", "maxrregcount", "role", "kernel", "loop", "registers", "instructions",
                       "lookups_per_iteration", "row_loads", "index_loads", "load_bits", "local_mem_ops", "shuffles",
                       "prefetches", "latencies_per_iteration", "rows_in_flight", "nest_rows_in_flight",
                       "bytes_in_flight_per_warp"])
    echo(f"\nrows in flight per warp = row loads / memory latencies serialized per iteration "
               f"(in-order replay, {MEMORY_LATENCY}-cycle global loads); nest_rows_in_flight: the same over the whole "
               f"loop nest for bags of {REFERENCE_L} lookups (index tiles, per-bag loads and bounds checks counted); "
               "local_mem_ops are spills inside the loop")
    echo_err(f"done in {time.perf_counter() - start:.1f} s")


def _sm(text: str) -> list[str]:
    """'sm_80,90,sm_90a' -> ['sm_80', 'sm_90', 'sm_90a']: any architecture a binary may hold."""
    import re

    from characterize.errors import ConfigError

    out = []
    for part in (p.strip().lower() for p in text.split(",") if p.strip()):
        m = re.fullmatch(r"(?:sm_?|compute_)?(\d{2,3}[a-z]?)", part.replace(".", ""))
        if not m:
            raise ConfigError(f"unknown architecture {part!r}: use sm_80, sm_90, sm_90a, sm_100 ...")
        out.append(f"sm_{m.group(1)}")
    if not out:
        raise ConfigError("no architecture given")
    return list(dict.fromkeys(out))


def _binary(path: str, kernel: str, archs: str, dtype: str, as_json: bool) -> None:
    """`sass --binary`: every matching function of any CUDA binary, per architecture."""
    from characterize.kernels.binary import analyze_binary
    from characterize.kernels.sass import REFERENCE_L, interpolate

    rows = analyze_binary(path, kernel, _sm(archs), dtype=dtype)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in rows], indent=2, default=str))
        return
    table = []
    for r in rows:
        d = {"arch": r.asked_arch, "code": r.kernel.arch, "kernel": r.kernel.name.split("(")[0][:70],
             "registers": r.kernel.registers, "local_bytes": r.kernel.local, "shared_mem": r.kernel.shared}
        if r.loop is not None:
            lp = r.loop
            per_lookup = interpolate(lp.bag_latencies, REFERENCE_L)
            bags = 32 // max(1, lp.lanes_per_bag)
            ins = interpolate(lp.bag_instructions, REFERENCE_L)
            d.update(loads=_counts(lp.load_bits, "b"), row_loads=lp.row_loads, index_loads=lp.index_loads,
                     spills_in_loop=lp.local_mem_ops, lanes_per_bag=lp.lanes_per_bag,
                     rows_in_flight=lp.rows_in_flight, nest_rows_in_flight=lp.nest_rows_in_flight,
                     latencies_per_lookup=per_lookup / (REFERENCE_L * bags) if per_lookup else None,
                     instructions_per_lookup=ins / (REFERENCE_L * bags) if ins else None)
        table.append(d)
    print_rows(table, ["arch", "code", "kernel", "registers", "local_bytes", "shared_mem", "loads", "row_loads",
                       "index_loads", "spills_in_loop", "lanes_per_bag", "rows_in_flight", "nest_rows_in_flight",
                       "latencies_per_lookup", "instructions_per_lookup"])
    click.echo(f"\n{rows[0].binary} (sha256 {rows[0].sha256[:16]}...): rows in flight per warp in the hot loop and "
               f"over the whole loop nest at bags of {REFERENCE_L}; per-lookup figures over the nest; functions "
               "without a lookup loop have empty columns")


def _training(archs: list[str], kernels: list[str] | None, D: int, dtype: str, as_json: bool) -> None:
    """`sass --training`: each training kernel's static row and hot loop, joined."""
    from characterize.kernels.training import training_facts

    start = time.perf_counter()
    facts = training_facts(kernels, archs, D=D, dtype=dtype)
    if as_json:
        echo(json.dumps(facts.to_dict("records"), indent=2, default=str))
        return
    print_rows(facts.to_dict("records"), ["kernel", "arch", "role", "registers", "spill_stores", "spill_loads",
                                          "blocks_per_sm", "theoretical_occupancy_pct", "instructions",
                                          "lookups_per_iteration", "row_loads", "index_loads", "atomics",
                                          "atomic_bits", "local_mem_ops", "latencies_per_iteration",
                                          "rows_in_flight"])
    echo("\nper hot-loop iteration: row loads gather bag-gradient rows (32 lanes x 32 bits each); atomics are "
               "global REDs/ATOMs (atomic_bits: what one lane updates); `characterize e2e --backward cuda-*` "
               "models each kernel from its lookups, instructions, latencies and atomics per iteration and its "
               "blocks per SM")
    echo_err(f"done in {time.perf_counter() - start:.1f} s")
