"""Commands that need no GPU measurement: devices, build, check."""

from __future__ import annotations

import json
import sys
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
    workload_from,
    workload_options,
)
from characterize.config import DEFAULT_ARCHS, WorkloadConfig, parse_param_overrides
from characterize.workloads.presets import HOTNESS_ORDER


# ------------------------------------------------------------------- devices
@main.command()
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def devices(as_json: bool) -> None:
    """List visible GPUs (NVML and torch), or say that there is none."""
    from dataclasses import asdict

    from characterize.hardware.devices import devices as list_devices

    found = list_devices()
    if as_json:
        echo(json.dumps([asdict(d) | {"arch": d.arch} for d in found], indent=2))
        return
    if not found:
        echo("No CUDA GPU is visible on this machine (NVML and torch found none).\n"
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
@click.option("--arch", "archs", default=",".join(DEFAULT_ARCHS), show_default=True, help="comma-separated architectures")
@click.option("--variants", default=None, help="comma-separated variants [all compiled ones]")
@click.option("--maxrregcount", "caps", default=None, help="register sweep caps, e.g. 32,40,42,48,64")
@click.option("--D", "D", type=int, default=128, show_default=True, help="embedding dimension (picks the warp kernel)")
@click.option("--param", "params", multiple=True, metavar="VARIANT.NAME=VALUE", help="variant parameter, e.g. rpf.P=4")
@click.option("--dtype", default="fp32", show_default=True,
              help="table element type: fp32, fp16, bf16, int8 (fp32 scale/bias), int8h (fp16 scale/bias) or fp8 (e4m3, fp32 scale; tbe)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@wide_option
def build(archs: str, variants: str | None, caps: str | None, D: int, params: tuple[str, ...], dtype: str,
          as_json: bool) -> None:
    """Compile every variant per architecture; registers, spills and theoretical occupancy."""
    from characterize.hardware.specs import parse_archs
    from characterize.kernels.build import reported_builds
    from characterize.kernels.registry import check_caps
    from characterize.kernels.static import static_characterization

    arch_list = parse_archs(archs)
    cap_list = check_caps(csv_list(caps) or [])
    start = time.perf_counter()
    with TerminalReporter(indent="", quiet=as_json) as reporter, \
            reported_builds(reporter, f"compiling the kernel family ({dtype}) for {', '.join(arch_list)}"):
        rows = static_characterization(csv_list(variants), arch_list, cap_list, D=D,
                                       params=parse_param_overrides(params), dtype=dtype)
    elapsed = time.perf_counter() - start
    if as_json:
        echo(json.dumps([r.to_dict() for r in rows], indent=2))
        return
    configured = [r.to_dict() for r in rows if not r.sweep]
    cols = ["variant", "dtype", "arch", "maxrregcount", "role", "kernel", "registers", "spill_stores", "spill_loads",
            "stack_frame", "block_size", "blocks_per_sm", "theoretical_occupancy_pct", "limiter"]
    print_rows(configured, cols)
    sweep = [r.to_dict() for r in rows if r.sweep and r.variant in ("base", "rpf", "warp")]
    if sweep:
        echo("\nregister sweep (lookup kernels):")
        print_rows(sweep, ["variant", "arch", "maxrregcount", "registers", "spill_stores", "spill_loads",
                           "blocks_per_sm", "theoretical_occupancy_pct", "limiter"])
    capped = {(r.variant, r.arch): r.maxrregcount for r in rows if not r.sweep and r.role == "lookup"
              and r.maxrregcount is not None}
    caps_used = ", ".join(f"{v} {a}: {c}" for (v, a), c in capped.items()) or "-"
    echo(f"\nregister caps of the capped variants (chosen per kernel unless given): {caps_used}; "
               f"compiler: {rows[0].compiler if rows else '-'}")
    echo_err(f"done in {elapsed:.1f} s")


# --------------------------------------------------------------------- check
@main.command()
@click.option("--variants", default=None, help="comma-separated variants [all]")
@click.option("--datasets", default=",".join(HOTNESS_ORDER), show_default=True)
@click.option("--backend", type=click.Choice(["auto", "cuda", "emulate"]), default="auto", show_default=True,
              help="cuda runs on the GPU; emulate runs the same source on the CPU")
@click.option("--paper-shape", is_flag=True, help="check at the paper's shape instead of the tiny odd one")
@click.option("--param", "params", multiple=True, metavar="VARIANT.NAME=VALUE")
@click.option("--dtypes", default=None,
              help="table element types to check, comma-separated, or 'all' (fp32, fp16, bf16, int8 with fp32 "
                   "scale/bias, int8h with fp16 scale/bias, fp8 e4m3 with an fp32 scale: tbe) [the workload's dtype]")
@click.option("--experiment", "experiment", default=None, metavar="NAME|TOML",
              help="check an experiment's variants, its kernels of one's own ([variants.NAME] tables) among them "
                   "[every built-in variant]")
@workload_options
@click.option("--json", "as_json", is_flag=True)
@wide_option
def check(variants: str | None, datasets: str, backend: str, paper_shape: bool, params: tuple[str, ...],
          dtypes: str | None, experiment: str | None, as_json: bool, **wl: Any) -> None:
    """Check every variant against torch.nn.functional.embedding_bag."""
    from characterize.config import DTYPES
    from characterize.kernels.check import check_variants
    from characterize.kernels.library import default_backend

    if experiment is not None:   # registers its kernels of one's own; its variants are the default
        from characterize.pipeline import load_experiment

        variants = variants or ",".join(load_experiment(experiment).variants)

    base = WorkloadConfig(batches=1) if paper_shape else WorkloadConfig.tiny()
    config = workload_from(base, **wl)
    chosen = default_backend() if backend == "auto" else backend
    modes = [config.mode] if wl.get("pooling") else ["sum", "mean"]
    if not as_json:
        echo_err(f"checking on backend {chosen} (B={config.B} D={config.D} E={config.E} L={config.L}) ...")
    results = check_variants(csv_list(variants), csv_list(datasets) or [], config, modes, chosen,
                             parse_param_overrides(params), progress=None if as_json else echo_err,
                             dtypes=list(DTYPES) if dtypes == "all" else csv_list(dtypes))
    if as_json:
        echo(json.dumps([r.to_dict() for r in results], indent=2))
    else:
        print_rows([r.to_dict() for r in results], ["variant", "dtype", "dataset", "mode", "backend", "max_abs_err",
                                                     "tolerance", "offset2bag_ok", "bag_size_ok", "passed", "error", "note"])
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


