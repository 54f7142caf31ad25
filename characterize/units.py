"""Units: how the toolkit writes sizes and counts for people, defined once.

Bytes are written in binary units (KiB, MiB, GiB, TiB: what `free -h`, nvidia-smi and
the CUDA runtime's sizes use) everywhere: error messages, terminal tables, reports
and charts. Other counts (instructions, requests, sectors, FLOP/s) use SI prefixes.
A missing value (None or NaN) reads "–".
"""

from __future__ import annotations

import math
from typing import Any

MISSING = "–"

_BINARY = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
_SI = (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3))


def _missing(v: Any) -> bool:
    try:
        return v is None or math.isnan(float(v))
    except (TypeError, ValueError):
        return True


def format_bytes(n: Any, digits: int = 1) -> str:
    """2.5e9 -> '2.3 GiB'; below 1 KiB whole bytes ('512 B'); None/NaN -> '–'."""
    if _missing(n):
        return MISSING
    v = float(n)
    for unit, size in _BINARY:
        if abs(v) >= size:
            return f"{v / size:,.{digits}f} {unit}"
    return f"{int(v):,} B"


def format_count(v: Any, unit: str = "") -> str:
    """3.2e6 -> '3.2 M'; with a unit, '3.2 MB/s' style (3 significant digits)."""
    if _missing(v):
        return MISSING
    x = float(v)
    for suffix, f in _SI:
        if abs(x) >= f:
            return f"{x / f:.3g} {suffix}{unit}"
    return f"{x:.3g} {unit}".rstrip()
