"""Measure stage, process hygiene: child processes that die with the process that started them.

A bench worker or an ncu process left running after its supervisor was killed keeps
measuring into the run directory (and on a GPU would time the device beside a resumed
run). Two independent mechanisms end such an orphan:

* the kernel's parent-death signal (Linux `prctl(PR_SET_PDEATHSIG)`, through ctypes on
  libc), set in the child, so the kernel kills it the moment its parent exits, even
  when the parent was SIGKILLed; and
* a pipe watchdog: the supervisor holds the write end of the child's stdin and never
  writes; when the supervisor is gone the pipe reads end-of-file and a thread in the
  child exits the process. This also works where prctl does not (other systems).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from typing import Callable, Iterator

PR_SET_PDEATHSIG = 1
#: exit status of a child that found its supervisor gone (nobody reads it; for logs and tests)
EXIT_ORPHANED = 70


def _prctl() -> Callable[..., int] | None:
    """libc's prctl, or None off Linux or when libc cannot be loaded."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_int
    return fn


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> bool:
    """Have the kernel send `sig` to this process when its parent exits. If the parent
    is already gone (the child was reparented before this ran) the process exits at
    once. Returns whether the parent-death signal is in place."""
    prctl = _prctl()
    armed = prctl is not None and prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    if parent is not None and os.getppid() != parent:
        os._exit(EXIT_ORPHANED)
    return armed


def parent_death_preexec(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` for subprocess.Popen that arms the parent-death signal in the child
    before it execs (for programs we do not write, such as ncu). prctl is looked up here,
    in the parent, so the forked child only makes the system call."""
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died between fork and prctl
            os._exit(EXIT_ORPHANED)

    return arm


def watch_pipe(fd: int = 0, on_close: Callable[[], None] | None = None) -> threading.Thread:
    """Start a daemon thread that waits for end-of-file on `fd` (the read end of a pipe
    whose write end the parent holds) and then ends the process: the parent closed it
    or died."""

    def watch() -> None:
        try:
            while os.read(fd, 4096):
                pass
        except OSError:
            pass
        if on_close is not None:
            on_close()
        os._exit(EXIT_ORPHANED)

    thread = threading.Thread(target=watch, name="parent-watchdog", daemon=True)
    thread.start()
    return thread


#: seconds an orphaned worker gets to stop cleanly (finish writing a point file) before it is ended hard
ORPHAN_GRACE_S = 2.0


def _stop(signum: int, _frame: object) -> None:
    """SIGTERM (the parent-death signal): unwind, so temporaries are removed and kernels closed."""
    raise SystemExit(EXIT_ORPHANED)


def _orphaned() -> None:
    """The supervisor's pipe closed: stop like on SIGTERM, and hard after a grace period
    (the main thread may be inside a long native call)."""
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(ORPHAN_GRACE_S)


@contextlib.contextmanager
def whole() -> Iterator[None]:
    """A stop (SIGTERM) asked for inside the block takes effect when it ends: what the block
    records (a point file and its log line) is recorded whole, never the file without the
    line, which would look to a resume like a point finished but never measured."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    asked: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: asked.append(signum))
    try:
        yield
    finally:   # a handler installed outside Python reads as None: the default one stands in for it
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    if asked:
        if callable(previous):
            previous(signal.SIGTERM, None)
        else:
            signal.raise_signal(signal.SIGTERM)


def supervise(supervisor: int | None) -> None:
    """Tie a worker process to the runner that started it, and only to it. With the
    supervisor's pid: the parent-death signal when the supervisor is its direct parent
    (armed, then the parent checked again, so a parent that died in between is seen),
    and the stdin-pipe watchdog in any case. Without one (the profile target, which ncu
    forks: its parent is ncu's, whose exit is no reason to stop) nothing is armed; the
    runner ends ncu's whole process group instead. SIGTERM unwinds the process either way."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop)
    if supervisor is None:
        return
    if os.getppid() == supervisor:
        die_with_parent(signal.SIGTERM, parent=supervisor)
    watch_pipe(0, on_close=_orphaned)
