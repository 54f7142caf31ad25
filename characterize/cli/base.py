"""Command line, shared parts: the click group that turns domain errors into one-line
messages and exit codes, option bundles and table printing."""

from __future__ import annotations

from typing import Any, Callable

import click

from characterize.errors import CharacterizeError


class Group(click.Group):
    """Turns domain errors into messages instead of tracebacks."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CharacterizeError as e:
            click.echo(f"error: {e}", err=True)
            ctx.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)


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
def main() -> None:
    """Characterize DLRM embedding-bag kernels on GPUs: build, check, bench, profile,
    extract, model and report."""


