"""Command line, shared parts: the click group that turns domain errors into one-line
messages and exit codes, option bundles and table printing."""

from __future__ import annotations

import contextlib
import contextvars
import linecache
import math
import numbers
import os
import re
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import click

from characterize.errors import CharacterizeError, FileSystemError, describe_os_error, escape_text
from characterize.units import format_bytes

#: the exit code of a refused file operation (disk full, read-only, a file where a directory belongs, ...)
FILE_SYSTEM_EXIT = FileSystemError.exit_code


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised like Ctrl-C so that workers are stopped, temporaries
    removed and finished points kept on the way out."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _terminate(signum: int, _frame: object) -> None:
    raise Terminated(signum)


class Group(click.Group):
    """Turns domain errors into messages instead of tracebacks, file-system errors into
    one line naming the path and the operation, and termination signals into an orderly
    exit. Messages are escaped: a file or kernel name cannot split the line or drive the
    terminal."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.ClickException as e:
            raise _escaped(e) from None

    def invoke(self, ctx: click.Context) -> Any:
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                previous[sig] = signal.signal(sig, _terminate)
        try:
            try:
                os.getcwd()
            except OSError:   # before anything resolves a relative path or loads a library against it
                click.echo("error: the working directory no longer exists (it was deleted or moved); cd to an "
                           "existing directory and run the command again", err=True)
                ctx.exit(FILE_SYSTEM_EXIT)
            result = super().invoke(ctx)
            sys.stdout.flush()   # output held in a buffer fails here, not silently at exit
            return result
        except CharacterizeError as e:
            for line in str(getattr(e, "detail", "") or "").splitlines():
                click.echo(f"  {escape_text(line)}", err=True)
            click.echo(f"error: {escape_text(str(e))}", err=True)
            ctx.exit(e.exit_code)
        except click.ClickException as e:   # a usage error naming a value from outside (a path, say)
            raise _escaped(e) from None
        except BrokenPipeError:
            raise   # stdout closed by its reader (`| head`): click exits quietly
        except OSError as e:
            op = _operation(e)
            if op == "write to standard output":
                _silence_stdout()
            click.echo(f"error: {describe_os_error(e, op)}", err=True)
            ctx.exit(FILE_SYSTEM_EXIT)
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


#: the call on the failing line of code -> the operation a message names
_CALLS = (("mkstemp", "create a temporary file in"), ("makedirs", "create the directory"),
          ("mkdir", "create the directory"), ("replace", "move into place"), ("rename", "move into place"),
          ("rmtree", "remove"), ("unlink", "remove"), ("fsync", "write"), ("write", "write"), ("flock", "lock"),
          ("read", "read"), ("open", "open"), ("chmod", "change the permissions of"), ("stat", "inspect"),
          ("iterdir", "list"), ("glob", "list"), ("copy", "copy"), ("getcwd", "find the working directory"),
          ("cwd", "find the working directory"), ("resolve", "resolve"), ("flush", "write"))


def _operation(e: OSError) -> str:
    """What the failing code was doing: the tag a library function gave the error, else
    standard output when that is what broke, else the call on the innermost line of code."""
    if getattr(e, "operation", None):
        return str(e.operation)
    tb = e.__traceback__
    line = ""
    while tb is not None:
        frame = tb.tb_frame
        line = linecache.getline(frame.f_code.co_filename, tb.tb_lineno) or line
        if e.filename is None and (_is_stdout(frame.f_locals.get("file")) or "sys.stdout" in line):
            return "write to standard output"   # click.echo's stream, or our own flush of it
        tb = tb.tb_next
    for call, op in _CALLS:
        if f"{call}(" in line:
            return op
    return "use"


def _escaped(e: click.ClickException) -> click.ClickException:
    """A click error whose message has its outside text escaped (a file name holding a
    newline or an escape sequence stays one line of plain text)."""
    original = e.format_message
    e.format_message = lambda: escape_text(original())  # type: ignore[method-assign]
    return e


def _plain_markup(text: str) -> str:
    """Outside text (a dataset's or kernel's name) for a rich progress bar: control
    characters escaped and rich's [markup] taken literally."""
    from rich.markup import escape

    return escape(escape_text(str(text)))


def _is_stdout(stream: object) -> bool:
    try:
        return stream is not None and stream.fileno() == sys.__stdout__.fileno()  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return False


def _silence_stdout() -> None:
    """Standard output failed (a full device, say): point it at /dev/null, so the
    interpreter's last flush does not fail a second time with a traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def echo_err(msg: str) -> None:
    """A line (or lines) on stderr, outside text escaped (see echo)."""
    click.echo(safe_lines(msg), err=True)


def echo(msg: str = "") -> None:
    """A line (or lines) on stdout with control characters from outside text escaped:
    the line breaks of `msg` stay, a kernel name's escape sequence does not."""
    click.echo(safe_lines(msg))


def safe_lines(msg: str) -> str:
    """`msg` with control characters escaped inside each of its lines."""
    return "\n".join(escape_text(part) for part in str(msg).split("\n"))


def _is_number(v: object) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def plain_number(v: float, significant: int = 4) -> str:
    """A number with `significant` digits and never in scientific notation: 0.0001234,
    1,234.5, -6,995,128,416."""
    x = float(v)
    if x == 0 or not math.isfinite(x):
        return "0" if x == 0 else str(x)
    decimals = min(12, max(0, significant - 1 - math.floor(math.log10(abs(x)))))
    return f"{x:,.{decimals}f}"


def _is_bytes(name: str) -> bool:
    return name.endswith("_bytes") or name.startswith("bytes_") or name == "bytes"


def _format_column(name: str, values: list[object], floatfmt: str | None,
                   fraction: bool = False) -> tuple[list[str], bool]:
    """Cells of one column and whether it is numeric (right-aligned). Percent columns
    (`*_pct`, or fractions when `fraction`) read 62.5%, byte columns (`*_bytes`) 41.0 MiB,
    integral columns print without decimals and with thousands separators, other numbers
    with one number of decimals per column (4 significant digits of its largest value),
    so that decimal points line up, unless that would show a non-zero value as 0: then 4
    significant digits each. Never scientific notation; a missing value is empty. Text
    cells that start with a number (a value with its unit or band) are right-aligned too."""
    nums = [v for v in values if _is_number(v) and v == v]
    texts = [v for v in values if isinstance(v, str) and v]
    numeric = (bool(nums) and all(_is_number(v) or v is None or v == "" or v != v for v in values)) or \
        (bool(texts) and not nums and all(_NUMERIC_TEXT.match(t) for t in texts))
    integral = bool(nums) and all(float(v).is_integer() for v in nums)
    largest = max((abs(float(v)) for v in nums if v not in (float("inf"), float("-inf"))), default=0.0)
    decimals = min(6, max(0, 3 - math.floor(math.log10(largest)))) if largest > 0 else 2
    smallest = min((abs(float(v)) for v in nums if v != 0), default=largest)
    # a value the column's decimals would show as 0 (an error beside a failure, say): 4 digits each
    significant = largest < 1e-3 or smallest < 0.5 * 10.0 ** -decimals
    pct = name.endswith("_pct") or name.endswith("%")
    cells = []
    for v in values:
        if v is None or (isinstance(v, float) and v != v) or (_is_number(v) and v != v):
            cells.append("")   # NaN: nothing to show
        elif isinstance(v, bool) or not _is_number(v):
            cells.append(escape_text(str(v)))
        elif fraction:
            cells.append(f"{100 * float(v):.1f}%")
        elif pct:
            cells.append(f"{float(v):.1f}%")
        elif _is_bytes(name):
            cells.append(format_bytes(v))
        elif integral:
            cells.append(f"{int(v):,}")
        elif floatfmt is not None:
            cells.append(floatfmt.format(v))
        elif significant:
            cells.append(plain_number(v))
        else:
            cells.append(f"{float(v):,.{decimals}f}")
    return cells, numeric


_NUMERIC_TEXT = re.compile(r"^([-+]?[\d.,]+|–|\[)")

#: --wide: every column of every table, whatever the terminal's width
_WIDE: contextvars.ContextVar[bool] = contextvars.ContextVar("wide_tables", default=False)


def wide_option(f: Callable) -> Callable:
    """--wide on a command that prints tables: all columns, not only those that fit."""
    def remember(ctx: click.Context, param: click.Parameter, value: bool) -> None:
        if value:
            _WIDE.set(True)
    return click.option("--wide", is_flag=True, expose_value=False, callback=remember,
                        help="print every column of the tables (by default they fit the terminal's width)")(f)


def table_width() -> int | None:
    """The width tables must fit: $COLUMNS, else the terminal's; None (no limit) with
    --wide or when stdout is not a terminal (a pipe or a file gets every column)."""
    if _WIDE.get():
        return None
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    if sys.stdout.isatty():
        return shutil.get_terminal_size((120, 24)).columns
    return None


def format_table(rows: list[dict], columns: list[str] | None = None, floatfmt: str | None = None,
                 fractions: Iterable[str] = (), width: int | None = None) -> list[str]:
    """Lines of a plain aligned text table: text left-aligned, numbers right-aligned;
    the `fractions` columns (0..1) shown as percentages. With a `width`, the columns that
    do not fit are left out from the right (the first two always stay) and a last line
    names them."""
    if not rows:
        return ["(nothing)"]
    cols = list(columns or list(rows[0]))
    frac = set(fractions)
    formatted = [_format_column(c, [r.get(c) for r in rows], floatfmt, c in frac) for c in cols]
    widths = [max(len(escape_text(str(c))), *(len(x) for x in cells)) for c, (cells, _) in zip(cols, formatted)]
    shown = len(cols)
    if width is not None:
        while shown > 2 and sum(widths[:shown]) + 2 * (shown - 1) > width:
            shown -= 1

    def line(cells: list[str]) -> str:
        return "  ".join(cell.rjust(w) if numeric else cell.ljust(w)
                         for cell, w, (_, numeric) in zip(cells[:shown], widths, formatted)).rstrip()

    out = [line([escape_text(str(c)) for c in cols]), "  ".join("-" * w for w in widths[:shown])]
    for i in range(len(rows)):
        out.append(line([cells[i] for cells, _ in formatted]))
    if shown < len(cols):
        out.append(f"({len(cols) - shown} more column(s) not shown to fit {width} characters: "
                   f"{', '.join(cols[shown:])}; --wide shows every column)")
    return out


def print_rows(rows: list[dict], columns: list[str] | None = None, floatfmt: str | None = None,
               fractions: Iterable[str] = ()) -> None:
    """Print a plain aligned text table (see format_table) that fits the terminal (table_width)."""
    for ln in format_table(rows, columns, floatfmt, fractions, width=table_width()):
        click.echo(ln)


def print_answer(a: Any, title: str = "the answer") -> None:
    """The answer (analysis.answer.Answer) as `run` and `predict` end with it: per GPU and
    dataset the variant, its time and speedups with their bands and what limits it, the
    paper's claims on the measured GPU, how sure, and last the one sentence to act on (the
    provenance notes are in the run directory and the report, not in the terminal's tail)."""
    if not a.empty:
        click.echo("")
        rows = a.display_rows()
        first = [c for c in ("GPU", "dataset", "best", "us/table", "vs base", "bound", "tied within the band")
                 if c in rows[0]]   # what a narrow terminal keeps: the rest is cut from the right
        print_rows(rows, [*first, *(c for c in rows[0] if c not in first)])
        for line in (*a.claim_lines(), a.how()):
            click.echo(line)
    click.echo(f"\n{title}: {a.summary()}")


# ---------------------------------------------------------------- progress
def bars_wanted() -> bool:
    """Progress bars only on a terminal: piped or logged output gets one line per step."""
    return sys.stderr.isatty() and os.environ.get("TERM", "") != "dumb"


class _PlainTask:
    """A step without a bar: silent until its one-line summary, except that a long one
    says where it is at most every PLAIN_EVERY_S seconds (a cold nvcc build takes minutes)."""

    PLAIN_EVERY_S = 15.0

    def __init__(self, say: Callable[[str], None] | None = None, title: str = "", total: int | None = None,
                 unit: str = "") -> None:
        self.summary = ""
        self.say, self.title, self.total, self.unit, self.done = say, title, total, unit, 0
        self.last = time.perf_counter()

    def grow(self, n: int = 1) -> None:
        self.total = (self.total or 0) + n

    def advance(self, n: int = 1, item: str = "") -> None:
        self.done += n
        now = time.perf_counter()
        if self.say is not None and n and now - self.last >= self.PLAIN_EVERY_S:
            self.last = now
            count = f"{self.done}/{self.total} {self.unit}" if self.total else f"{self.done} {self.unit} so far"
            self.say(f"{self.title}: {count.rstrip()}" + (f" ({item})" if item else "") + " ...")

    def finish(self, summary: str) -> None:
        self.summary = summary


class _BarTask(_PlainTask):
    """One rich task; "done/total unit" is shown only once a total is known."""

    def __init__(self, progress: Any, task_id: Any, total: int | None, unit: str) -> None:
        super().__init__(None, "", total, unit)
        self.progress, self.id = progress, task_id
        self._show()

    def _show(self, **fields: Any) -> None:
        count = f"{self.done}/{self.total} {self.unit}" if self.total else f"{self.done} {self.unit}" if self.done else ""
        self.progress.update(self.id, total=self.total, completed=self.done, count=count.rstrip(), **fields)

    def grow(self, n: int = 1) -> None:
        self.total = (self.total or 0) + n
        self._show()

    def advance(self, n: int = 1, item: str = "") -> None:
        self.done += n
        self._show(**({"item": _plain_markup(item)} if item else {}))


class TerminalReporter:
    """The CLI's reporter (characterize.progress.Reporter): a rich progress bar per step
    on stderr when it is a terminal, replaced by the step's one-line summary when it
    ends; without a terminal only those lines, plus where a long step is every
    _PlainTask.PLAIN_EVERY_S seconds. Use it as a context manager."""

    def __init__(self, indent: str = "  ", bars: bool | None = None, quiet: bool = False,
                 summaries: bool = True) -> None:
        self.indent = indent
        self.quiet = quiet          # machine-readable output (--json): nothing on stderr
        self.summaries = summaries  # a line per finished step (off where the command says it itself)
        self.bars = not quiet and (bars_wanted() if bars is None else bars)
        self.progress: Any = None

    def __enter__(self) -> "TerminalReporter":
        if self.bars:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                     TextColumn("{task.fields[count]}"), TimeElapsedColumn(),
                                     TextColumn("{task.fields[item]}"),
                                     console=Console(file=sys.stderr), transient=True)
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def message(self, text: str) -> None:
        line = f"{self.indent}" + "\n".join(escape_text(part) for part in str(text).split("\n"))
        if self.quiet:
            return
        if self.progress is not None:
            self.progress.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            echo_err(line)

    @contextlib.contextmanager
    def task(self, title: str, total: int | None = None, unit: str = "") -> Iterator[_PlainTask]:
        start = time.perf_counter()
        if self.progress is None:
            task = _PlainTask(self.message if self.summaries else None, title, total, unit)
            yield task
        else:
            task_id = self.progress.add_task(self.indent + _plain_markup(title), total=total, item="", count="")
            task = _BarTask(self.progress, task_id, total, unit)
            try:
                yield task
            finally:
                self.progress.remove_task(task_id)
                self.progress.refresh()
        if self.summaries:
            self.message(f"{title}: {task.summary or 'done'} ({time.perf_counter() - start:.1f} s)")


class Count(click.ParamType):
    """An integer as people write large ones: 500000, 500_000 or 5e5 (exactly integral;
    2.5, nan and 1e400 are not counts). Ranges are the workload's to check."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        text = str(value).strip().replace("_", "")
        try:
            return int(text)
        except ValueError:
            pass
        try:
            number = float(text)
        except ValueError:
            number = math.nan
        if math.isfinite(number) and number.is_integer() and abs(number) < 2**63:
            return int(number)
        self.fail(f"{escape_text(str(value))!r} is not a whole number (write 500000, 500_000 or 5e5)", param, ctx)


COUNT = Count()


def workload_options(f: Callable | None = None, *, pooling: tuple[str, ...] = ("--mode", "--pooling")) -> Callable:
    """The workload in the field's vocabulary (FBGEMM-style reusable option bundle).
    `pooling`: the flags of the pooling mode (predict keeps --mode for its L2 mode)."""
    def bundle(f: Callable) -> Callable:
        opts = [
            click.option("--T", "T", type=COUNT, default=None, help="embedding tables [12]"),
            click.option("--E", "E", type=COUNT, default=None, help="rows per table [500000]"),
            click.option("--D", "D", type=COUNT, default=None, help="embedding dimension [128]"),
            click.option("--B", "B", type=COUNT, default=None, help="batch size (bags per table) [2048]"),
            click.option("--L", "L", default=None, help="pooling factor: N, uniform:LO:HI or poisson:MEAN [150]"),
            click.option(*pooling, "pooling", type=click.Choice(["sum", "mean"]), default=None,
                         help="pooling mode [sum]"),
            click.option("--batches", type=COUNT, default=None, help="batches per generated trace [8]"),
            click.option("--seed", type=int, default=None, help="seed of generated data [0]"),
        ]
        for o in reversed(opts):
            f = o(f)
        return f
    return bundle(f) if f is not None else bundle


def workload_from(base: Any = None, **kw: Any) -> Any:
    from characterize.config import WorkloadConfig

    base = base or WorkloadConfig()
    kw = {("mode" if k == "pooling" else k): v for k, v in kw.items()}   # the option is named for the field
    changes = {k: v for k, v in kw.items() if k in ("T", "E", "D", "B", "L", "mode", "batches", "seed") and v is not None}
    return base.replace(**changes).validate() if changes else base.validate()


def trace_options(f: Callable | None = None, *, pooling: tuple[str, ...] = ("--mode", "--pooling")) -> Callable:
    """--trace FILE and the workload in the field's vocabulary: the experiment on your own
    trace, T, E and its bags read from the file, the rest given here (or asked for)."""
    def bundle(f: Callable) -> Callable:
        f = workload_options(f, pooling=pooling)
        return click.option("--trace", type=click.Path(dir_okay=False, path_type=Path), default=None,
                            help="your own trace file (.txt, .npy, .npz, .pt; see `characterize workload --help`): "
                                 "the experiment on it alone, with T, E and the bags read from the file and D (and a "
                                 "flat stream's T) given with --D/--T or asked for")(f)
    return bundle(f) if f is not None else bundle


def experiment_with(experiment: str, trace: Path | None, say: Callable[[str], None], interactive: bool,
                    **wl: Any) -> Any:
    """The experiment a command runs: `experiment` as it is, or with the workload options
    given (--T, --D, ...), or with --trace the experiment on that file alone
    (pipeline.trace_experiment), each inference said once through `say`; on a terminal a
    value the file cannot tell is asked for, elsewhere it is refused in one line."""
    import dataclasses

    from characterize.errors import MissingInput
    from characterize.pipeline import check_experiment, load_experiment, trace_experiment

    given = {("mode" if k == "pooling" else k): v for k, v in wl.items() if v is not None}
    if trace is None:
        exp = load_experiment(experiment)
        if given:
            exp = check_experiment(dataclasses.replace(exp, workload=workload_from(exp.workload, **given)))
        return exp
    while True:
        try:
            made = trace_experiment(trace, experiment, **given)
            break
        except MissingInput as e:
            if not interactive or not e.names:
                raise
            for name in e.names:
                given[name] = click.prompt(f"{trace.name}: {name} (the file does not say)", type=click.IntRange(min=1),
                                           err=True)
    for note in made.notes:
        say(f"trace {note}")
    return made.experiment


def asks(as_json: bool = False) -> bool:
    """Whether a missing value may be asked for: a person at a terminal, not --json."""
    return not as_json and sys.stdin.isatty() and sys.stderr.isatty()


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
        from characterize.memory import MEMORY_BUDGET_ENV, parse_memory

        parse_memory(memory_budget)
        previous = os.environ.get(MEMORY_BUDGET_ENV)
        os.environ[MEMORY_BUDGET_ENV] = memory_budget  # the environment carries it into worker processes

        def restore() -> None:
            if previous is None:
                os.environ.pop(MEMORY_BUDGET_ENV, None)
            else:
                os.environ[MEMORY_BUDGET_ENV] = previous

        click.get_current_context().call_on_close(restore)


