"""Host memory: the budget that generating, loading and analyzing traces stay within.

Before a large allocation the bytes it needs are estimated and refused beyond the
budget: a one-line error instead of swapping for minutes or being killed. The budget
is a share of the memory available now (MemAvailable, capped by a cgroup limit), or
$CHARACTERIZE_MEMORY_BUDGET / `characterize --memory-budget`, read on every call so
that worker processes inherit what the CLI set.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from characterize.errors import ConfigError, MemoryBudgetError
from characterize.units import format_bytes

#: environment variable overriding the host-memory budget: bytes ("8G", "512MiB", "2e9") or a share ("50%")
MEMORY_BUDGET_ENV = "CHARACTERIZE_MEMORY_BUDGET"
#: share of the available memory (MemAvailable, or the cgroup's headroom) the toolkit may use by default
DEFAULT_MEMORY_SHARE = 0.6

#: the largest budget that means anything (2^62 bytes, 4 EiB)
MAX_BUDGET = 2.0**62

_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 2**10, "m": 1e6, "mb": 1e6, "mib": 2**20, "g": 1e9,
          "gb": 1e9, "gib": 2**30, "t": 1e12, "tb": 1e12, "tib": 2**40}


def available_memory() -> int | None:
    """Bytes this process can still allocate without swapping: MemAvailable, capped by
    a cgroup v2 memory limit when one is set (containers, CI runners); None if unknown."""
    avail: int | None = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
            avail = min(avail, max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return avail


def parse_memory(text: str) -> tuple[float | None, float | None]:
    """'8G' -> (8e9, None); '40%' -> (None, 0.4). ConfigError for anything else."""
    t = str(text).strip().lower().replace(" ", "")
    m = re.fullmatch(r"(\d+(?:\.\d*)?)%", t)
    if m and 0 < float(m.group(1)) <= 100:
        return None, float(m.group(1)) / 100
    m = re.fullmatch(r"(\d+(?:\.\d*)?(?:e\d+)?)([a-z]*)", t)
    if m and m.group(2) in _UNITS and float(m.group(1)) > 0:
        value = float(m.group(1)) * _UNITS[m.group(2)]
        if value >= 1:
            if value > MAX_BUDGET:   # 1e400 is infinity, and no machine has 2^63 bytes
                raise ConfigError(f"memory budget {text!r} is beyond any machine's memory (at most 2^62 "
                                  "bytes); give a size such as 64G or a share such as 80%")
            return value, None
    raise ConfigError(f"bad memory budget {text!r}: use bytes with a unit (8G, 512MiB, 2e9) or a share of the "
                      "available memory (50%)")


def memory_budget() -> tuple[int, str]:
    """(bytes, where the number comes from): $CHARACTERIZE_MEMORY_BUDGET, else a share of
    the available memory. Read on every call, so a budget set by the CLI reaches workers."""
    env = os.environ.get(MEMORY_BUDGET_ENV, "").strip()
    absolute, share = parse_memory(env) if env else (None, DEFAULT_MEMORY_SHARE)
    if absolute is not None:
        return int(absolute), f"{MEMORY_BUDGET_ENV}={env}"
    avail = available_memory()
    if avail is None:
        return 2**62, "no limit: the available memory is unknown"
    return int(avail * share), f"{share:.0%} of the {format_bytes(avail)} available"


def check_memory(need: float, what: str, hint: str) -> None:
    """Refuse work whose estimated host memory `need` exceeds the budget, before allocating
    it: a clear error instead of swapping for minutes or a MemoryError traceback."""
    budget, how = memory_budget()
    if need > budget:
        raise MemoryBudgetError(f"{what} would need about {format_bytes(need)} of memory, more than the budget of "
                                f"{format_bytes(budget)} ({how}); {hint}, or set {MEMORY_BUDGET_ENV} "
                                "(e.g. 32G) or --memory-budget to allow more")
