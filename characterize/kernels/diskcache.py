"""Kernels stage, the disk cache: what the toolkit keeps on disk so that it is worked out once.

The cache folder ($CHARACTERIZE_CACHE, else ~/.cache/characterize) holds the compiled
libraries (build/, whose entries kernels.build keys, locks and verifies itself) and,
beside them, what is costly to work out again: the SASS text of each library (sass/),
the loop-nest replays (sass/nest/), cuobjdump's listings of binaries we did not build
(binary/), an experiment's predictions (predictions/) and the model's check of the
paper's claims (claims/). Each of these is one file per entry, named by its kind (a
folder) and a digest of everything it depends on:

- `entry_key(*parts)`: a key, the first 24 hex digits of the SHA-256 of the parts in turn;
- `entry(kind, key, suffix)`: the entry's path;
- `read_entry(path, read)`: the entry read back, or MISSING where there is none or it
  is damaged (torn, foreign, from another version, unreadable);
- `write_entry(path, data)`: an atomic write, best effort: a cache that cannot be
  written (read-only, full, a file where its folder belongs) keeps nothing, and the
  work is done again next time;
- `get_or_compute(kind, key, compute, read, write)`: all of it; with `lock`, processes
  that ask for the same entry at once (a Slurm array on a shared cache) compute it once.

Not to be confused with kernels.cache, the GPU cache of host-resident tables.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

from characterize.errors import OutputError
from characterize.files import one_at_a_time, write_atomic

T = TypeVar("T")

#: hex digits of a key
KEY_DIGITS = 24


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


#: what read_entry gives for an entry that is not there or cannot be read back
MISSING: Any = _Missing()


def cache_root() -> Path:
    """The cache folder: built libraries and everything kept beside them.
    $CHARACTERIZE_CACHE, else the user cache dir."""
    env = os.environ.get("CHARACTERIZE_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "characterize"


def entry_key(*parts: str | bytes) -> str:
    """A key: the SHA-256 of `parts` one after the other (text as UTF-8), cut to KEY_DIGITS."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
    return h.hexdigest()[:KEY_DIGITS]


def source_digest(root: Path, suffixes: Iterable[str] = (".py",)) -> str:
    """The files under `root` ending in `suffixes` (each one's path below `root`, then its
    content, in path order; __pycache__ left out), digested: a part of a key that
    changes with the code that made the entry."""
    wanted = tuple(suffixes)
    h = hashlib.sha256()
    for f in sorted(root.rglob("*")):
        if f.suffix in wanted and "__pycache__" not in f.parts:
            h.update(str(f.relative_to(root)).encode() + f.read_bytes())
    return h.hexdigest()


def entry(kind: str, key: str, suffix: str = "") -> Path:
    """Where the entry `key` of `kind` (a folder of the cache, e.g. "sass/nest") lives."""
    return cache_root() / kind / f"{key}{suffix}"


def read_entry(path: Path, read: Callable[[Path], T]) -> T:
    """`read(path)`, or MISSING where that fails in any way: an entry that is not there
    and one that is damaged are the same to a cache (its value is worked out again)."""
    try:
        return read(path)
    except Exception:   # noqa: BLE001 - missing, torn, foreign or from another version
        return MISSING


def write_entry(path: Path, data: str | bytes) -> bool:
    """Write an entry atomically (readers see the old entry or the new one, never half);
    whether it was written: a cache that cannot be written keeps nothing, nothing else."""
    try:
        write_atomic(path, data)
    except (OSError, OutputError):
        return False
    return True


def get_or_compute(kind: str, key: str, compute: Callable[[], T], read: Callable[[Path], T] = Path.read_text,
                   write: Callable[[T], str | bytes] = lambda value: value, *, suffix: str = "",
                   lock: bool = False, force: bool = False) -> T:
    """The entry `key` of `kind` read back, else `compute()` written there (`write` gives
    its bytes or text, `read` reads them back; both default to text as it is). What is
    returned is what a later call will read, the entry read back, unless it could not be
    written. `lock`: processes asking for the same missing entry at once compute it once,
    the others wait and read it. `force`: computed and written again whatever is there."""
    path = entry(kind, key, suffix)
    if not force and (found := read_entry(path, read)) is not MISSING:
        return found
    held = one_at_a_time(cache_root() / "locks" / f"{kind.replace('/', '-')}-{key}.lock") if lock \
        else contextlib.nullcontext()
    with held:
        if lock and not force and (found := read_entry(path, read)) is not MISSING:
            return found   # another process computed it while this one waited
        value = compute()
        if write_entry(path, write(value)) and (back := read_entry(path, read)) is not MISSING:
            return back
        return value
