"""Progress: how the library says what it is doing without printing.

Every stage that takes a while (builds, disassembly, reuse distances, predictions,
bench and profile points, rendering) reports to a `Reporter`: a line worth keeping
(`message`), or a step of known or growing size (`task`). The CLI implements it with
progress bars on a terminal and one line per step otherwise
(characterize.cli.base.TerminalReporter); notebooks and tests pass nothing (silent) or
a plain `(str) -> None` callback (one line per step). It sits on the bottom floor so
that every stage can take a reporter without importing the one above it.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, ContextManager, Iterator, Protocol

#: the plain form of progress: one line of text at a time
Progress = Callable[[str], None]


def quiet(_: str) -> None:
    """A Progress that says nothing."""


class Task(Protocol):
    """One step's progress as a user interface shows it (a bar, or one line)."""

    def grow(self, n: int = 1) -> None:
        """More work found: the total rises by `n` (the total may be unknown at first)."""

    def advance(self, n: int = 1, item: str = "") -> None:
        """`n` units finished; `item` names what is worked on now."""

    def finish(self, summary: str) -> None:
        """What the step did, in one line (counts; the interface adds the time)."""


class Reporter(Protocol):
    """Where the library says what it is doing; it never prints. The CLI passes a
    terminal reporter (bars on a TTY, plain lines otherwise); the default is silent."""

    def message(self, text: str) -> None:
        """A line worth keeping in the output (a skipped or failed step, a path)."""

    def task(self, title: str, total: int | None = None, unit: str = "") -> ContextManager[Task]:
        """A step that takes a while, of `total` units (None: not known yet)."""


class SilentTask:
    """A task nobody watches."""

    def grow(self, n: int = 1) -> None:
        pass

    def advance(self, n: int = 1, item: str = "") -> None:
        pass

    def finish(self, summary: str) -> None:
        pass


class _LineTask(SilentTask):
    def __init__(self, title: str) -> None:
        self.title, self.summary, self.start = title, "", time.perf_counter()

    def finish(self, summary: str) -> None:
        self.summary = summary


class Quiet:
    """The default reporter: says nothing."""

    def message(self, text: str) -> None:
        pass

    @contextmanager
    def task(self, title: str, total: int | None = None, unit: str = "") -> Iterator[Task]:
        yield SilentTask()


class Lines:
    """A reporter over a plain `(str) -> None` callback: messages, and one line per
    finished step with its time."""

    def __init__(self, say: Progress) -> None:
        self.say = say

    def message(self, text: str) -> None:
        self.say(text)

    @contextmanager
    def task(self, title: str, total: int | None = None, unit: str = "") -> Iterator[Task]:
        t = _LineTask(title)
        yield t
        self.say(f"{title}: {t.summary or 'done'} ({time.perf_counter() - t.start:.1f} s)")


def as_reporter(progress: "Reporter | Progress | None") -> Reporter:
    """A Reporter from what a caller passed: a reporter, a plain callback, or nothing."""
    if progress is None:
        return Quiet()
    if hasattr(progress, "task") and hasattr(progress, "message"):
        return progress  # type: ignore[return-value]
    return Lines(progress)  # type: ignore[arg-type]


class PerMessage:
    """A Progress callback for stages that say "starting X" once per unit: each message
    after the first finishes one unit of `task`; `close` finishes the rest (units with
    nothing to say, such as reuse distances already computed)."""

    def __init__(self, task: Task, total: int) -> None:
        self.task, self.total, self.done, self.started = task, total, 0, False

    def __call__(self, text: str) -> None:
        if self.started:
            self.task.advance(1)
            self.done += 1
        self.task.advance(0, item=text)
        self.started = True

    def close(self) -> None:
        self.task.advance(max(0, self.total - self.done))



class _PartTask(SilentTask):
    """A part of a folded step: its progress moves the step's one bar, and its summary
    is kept as one of the step's parts instead of a line of its own."""

    def __init__(self, fold: "Folded", title: str) -> None:
        self.fold, self.title = fold, title

    def grow(self, n: int = 1) -> None:
        self.fold.step.grow(n)

    def advance(self, n: int = 1, item: str = "") -> None:
        self.fold.step.advance(n, item=f"{self.title}: {item}" if item else self.title)

    def finish(self, summary: str) -> None:
        self.fold.parts.append(f"{self.title}: {summary}")


class Folded:
    """A Reporter for the parts of one step (each precision's builds, disassembly and
    predictions): one bar and one finished line for the whole step, which is what a
    terminal should show; `parts` keeps each part's own summary for the run's log."""

    def __init__(self, reporter: Reporter, step: Task) -> None:
        self.reporter, self.step = reporter, step
        self.parts: list[str] = []

    def message(self, text: str) -> None:
        self.reporter.message(text)

    @contextmanager
    def task(self, title: str, total: int | None = None, unit: str = "") -> Iterator[Task]:
        if total:
            self.step.grow(total)
        yield _PartTask(self, title)


@contextmanager
def folded(progress: "Reporter | Progress | None", title: str, unit: str = "") -> Iterator[Folded]:
    """One step made of parts (see Folded); the caller ends it with `fold.step.finish(...)`."""
    reporter = as_reporter(progress)
    with reporter.task(title, unit=unit) as step:
        yield Folded(reporter, step)
