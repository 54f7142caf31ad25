"""Command line, shared parts: the click group that turns domain errors into one-line
messages and exit codes, option bundles and table printing."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any, Callable

import click

from characterize.errors import CharacterizeError


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised like Ctrl-C so that workers are stopped, temporaries
    removed and finished points kept on the way out."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _terminate(signum: int, _frame: object) -> None:
    raise Terminated(signum)


class Group(click.Group):
    """Turns domain errors into messages instead of tracebacks, and termination signals
    into an orderly exit."""

    def invoke(self, ctx: click.Context) -> Any:
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                previous[sig] = signal.signal(sig, _terminate)
        try:
            return super().invoke(ctx)
        except CharacterizeError as e:
            click.echo(f"error: {e}", err=True)
            ctx.exit(e.exit_code)
        except Terminated as e:
            click.echo(f"terminated by {signal.Signals(e.signum).name}; finished work is kept (--resume continues a "
                       "run)", err=True)
            ctx.exit(128 + e.signum)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


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
    from characterize.config import WorkloadConfig

    base = base or WorkloadConfig()
    changes = {k: v for k, v in kw.items() if k in ("T", "E", "D", "B", "L", "mode", "batches", "seed") and v is not None}
    return base.replace(**changes).validate() if changes else base.validate()


def csv_list(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="characterize")
@click.option("--memory-budget", default=None, metavar="SIZE",
              help="host memory that generating, loading and analyzing traces may use: 8G, 512MiB, or a share of "
                   "the available memory such as 50% [60%, or $CHARACTERIZE_MEMORY_BUDGET]")
def main(memory_budget: str | None) -> None:
    """Characterize DLRM embedding-bag kernels on GPUs: build, check, bench, profile,
    extract, model and report."""
    if memory_budget:
        from characterize.config import MEMORY_BUDGET_ENV, parse_memory

        parse_memory(memory_budget)
        previous = os.environ.get(MEMORY_BUDGET_ENV)
        os.environ[MEMORY_BUDGET_ENV] = memory_budget  # the environment carries it into worker processes

        def restore() -> None:
            if previous is None:
                os.environ.pop(MEMORY_BUDGET_ENV, None)
            else:
                os.environ[MEMORY_BUDGET_ENV] = previous

        click.get_current_context().call_on_close(restore)


