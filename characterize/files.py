"""Files: the one safe writer of everything the toolkit writes (run directories, reports,
tables, traces, calibrations).

A write is atomic (a temporary file in the same directory, flushed, then renamed over
the target), so a reader sees the old content or the new one, never half. It replaces
only a regular file: a directory, a device node (/dev/full, /dev/null), a FIFO or a
socket at the output path is refused, since renaming over it would destroy it (as root,
a device), and so is an output that is one of the command's own inputs. A symbolic
link is followed, as the shell's `>` does. Operating-system errors carry the operation
they interrupted (`operation`), for the one-line message the CLI prints.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import time
from pathlib import Path
from typing import IO, Iterable, Iterator

from characterize.errors import OutputError, escape_text

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no locking
    fcntl = None  # type: ignore[assignment]

#: seconds a process waits for another one's `one_at_a_time` block before doing the work itself
ONE_AT_A_TIME_WAIT_S = 900.0

_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def file_kind(mode: int) -> str:
    """'a regular file', 'a directory', 'a character device', ... for an st_mode."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def tagged(e: OSError, operation: str) -> OSError:
    """`e` with the operation it interrupted, unless a deeper caller already said it."""
    if not getattr(e, "operation", None):
        e.operation = operation  # type: ignore[attr-defined]
    return e


def check_output(path: str | Path, inputs: Iterable[str | Path] = ()) -> Path:
    """The file a write to `path` would replace (symbolic links followed), after refusing
    one that is not a regular file or that is one of `inputs`. OutputError names it."""
    p = Path(path)
    shown = escape_text(str(p))
    try:
        st = os.stat(p)   # through symbolic links: /dev/stdout is whatever fd 1 is
    except FileNotFoundError:
        return Path(os.path.realpath(p)) if p.is_symlink() else p
    except OSError as e:
        raise tagged(e, "inspect") from None
    target = Path(os.path.realpath(p)) if p.is_symlink() else p
    if not stat.S_ISREG(st.st_mode):
        via = " (through a symbolic link)" if p.is_symlink() else ""
        raise OutputError(f"cannot write {shown}{via}: it is {file_kind(st.st_mode)}, not a regular file, and "
                          "would be destroyed; write the output to a file path (choose another -o or --out)")
    for src in inputs:
        try:
            other = os.stat(src)
        except OSError:
            continue
        if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
            raise OutputError(f"cannot write {shown}: it is also an input of this command "
                              f"({escape_text(str(src))}), which the output would replace; choose another -o")
    return target


@contextlib.contextmanager
def atomic_output(path: str | Path, inputs: Iterable[str | Path] = ()) -> Iterator[IO[bytes]]:
    """A binary file whose content replaces `path` when the block ends without an error
    (never half-written; see check_output for what is refused)."""
    target = check_output(path, inputs)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise tagged(e, "create the directory") from None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    except OSError as e:
        e.filename = str(target.parent)
        raise tagged(e, f"create a temporary file for {escape_text(target.name)} in") from None
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; run directories and reports are meant to be shared
        check_output(target)  # something else may have appeared meanwhile
        os.replace(tmp, target)
    except OSError as e:
        e.filename = e.filename if e.filename and str(e.filename) != tmp else str(target)
        raise tagged(e, "write") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def write_atomic(path: str | Path, data: str | bytes, inputs: Iterable[str | Path] = ()) -> None:
    """Write a file so that readers see the old content or the new one, never half; only
    a regular file (or nothing) is replaced, never one of `inputs`."""
    with atomic_output(path, inputs) as f:
        f.write(data.encode() if isinstance(data, str) else data)


@contextlib.contextmanager
def one_at_a_time(lock: Path, wait_s: float = ONE_AT_A_TIME_WAIT_S) -> Iterator[bool]:
    """Across processes, one at a time inside the block (flock on `lock`, created with its
    folder): work that several processes would otherwise all do at once (the same library
    compiled by every task of a Slurm array on a shared cache) is done by the first while
    the others wait, then find its result. Best effort: where the lock cannot be taken (no
    flock, a read-only folder, `wait_s` passed) the block runs anyway; yields whether it
    holds the lock."""
    fd = None
    if fcntl is not None:
        try:
            lock.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError:
            fd = None
    held = False
    try:
        deadline = time.monotonic() + wait_s
        while fd is not None and not held:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.05)
            except OSError:   # no locks on this file system
                break
        yield held
    finally:
        if fd is not None:
            os.close(fd)   # releases the lock
