"""Command `e2e`: the whole DLRM step around each embedding variant."""

from __future__ import annotations

import json
import time

import click

from characterize.analysis.model.e2e import BACKWARDS, OPTIMIZERS
from characterize.cli.base import TerminalReporter, csv_list, echo, echo_err, main, print_rows, wide_option

#: keys of every object `e2e --json` prints (more follow where they apply)
E2E_KEYS = ("variant", "dataset", "phase", "stage", "time_us", "time_us_low", "time_us_high", "source")


@main.command()
@click.argument("experiment", required=False, default="paper")
@click.option("--variants", default=None, help="comma-separated variants [the experiment's]; base is always added")
@click.option("--arch", "archs", default=None, help="architectures or GPU names to predict [the experiment's]")
@click.option("--bottom", default=None, help="bottom MLP: dense features-...-D [256-128-D, the paper's at D=128]")
@click.option("--top", default="128-64-1", show_default=True, help="top MLP widths after the interaction")
@click.option("--backward", type=click.Choice(BACKWARDS), default="sort", show_default=True,
              help="embedding gradient: PyTorch's sort-based backward, its index_add_ scatter, or our kernels: "
                   "cuda-atomic (atomicAdd scatter), cuda-sorted (warp per unique row, no atomics), cuda-fused "
                   "(cuda-sorted with the --optimizer update fused in); emulated on the CPU without a GPU")
@click.option("--optimizer", type=click.Choice(OPTIMIZERS), default="sgd", show_default=True)
@click.option("--dispatch-us", type=float, default=None, help="host dispatch per operator, µs [8]")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@wide_option
def e2e(experiment: str, variants: str | None, archs: str | None, bottom: str | None, top: str, backward: str,
        optimizer: str, dispatch_us: float | None, as_json: bool) -> None:
    """The DLRM step (bottom MLP, embedding stage, interaction, top MLP; training adds
    backward and optimizer) around each variant: checked against torch autograd,
    predicted per stage, and measured on a GPU."""
    from characterize.analysis.model.e2e import Overheads
    from characterize.config import DlrmConfig
    from characterize.pipeline import e2e as run_e2e
    from characterize.pipeline import load_experiment

    exp = load_experiment(experiment)
    paper = DlrmConfig.for_dim(exp.workload.D)
    dlrm = DlrmConfig(DlrmConfig.parse_dims(bottom) if bottom else paper.bottom, DlrmConfig.parse_dims(top))
    overheads = Overheads() if dispatch_us is None else Overheads(dispatch_us=dispatch_us)
    start = time.perf_counter()
    # progress goes to stderr with --json too (stdout holds the JSON): timing the step takes minutes
    with TerminalReporter(indent="", bars=False if as_json else None) as reporter:
        out = run_e2e(exp, csv_list(variants), csv_list(archs), dlrm=dlrm, backward=backward, optimizer=optimizer,
                      overheads=overheads, progress=reporter)
    bad = out.checks[~out.checks["ok"]] if not out.checks.empty else out.checks
    if as_json:
        keep = [c for c in out.rows.columns if c in E2E_KEYS or c in ("gpu", "speedup_e2e", "speedup_embedding",
                                                                       "embedding_share")]
        echo(json.dumps(out.rows[keep].to_dict("records"), indent=1, default=str))
    else:
        totals = out.rows[out.rows["stage"] == "total"]
        cols = ["variant", "dataset", "gpu", "phase", "source", "time_us", "time_us_low", "time_us_high",
                "embedding_share", "speedup_e2e", "speedup_embedding"]
        print_rows(totals[[c for c in cols if c in totals.columns]].to_dict("records"))
        echo("\ntime per batch; speedups over base end to end and of the embedding stage alone "
                   "(paper, A100: up to 1.77x end to end, 2.03x embedding). Predicted rows are the model's.")
        if not out.training.empty:
            echo(f"\n{backward}'s kernel as the model reads it (static occupancy, hot loop from the SASS; "
                       "`characterize sass --training` for all):")
            print_rows(out.training.to_dict("records"), ["kernel", "arch", "registers", "blocks_per_sm",
                                                         "lookups_per_iteration", "instructions",
                                                         "latencies_per_iteration", "atomics", "atomic_bits"])
        failed = ", ".join(sorted(set(bad["variant"])))
        echo(f"CPU check of every step against torch autograd: {'FAILED for ' + failed if failed else 'all match'}")
    echo_err(f"done in {time.perf_counter() - start:.1f} s")
    if not bad.empty:
        raise SystemExit(1)
