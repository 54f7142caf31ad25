"""Analysis stage, model scores: how far predictions are from measurements, as the DLRM performance-model
literature reports it (GMAE) and as a user reads it (MAPE), and whether measurements fall
inside the predicted bands. Used by calibration, validation and the end-to-end step.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def gmae(predicted: Sequence[float] | np.ndarray, measured: Sequence[float] | np.ndarray,
         floor: float = 1e-4) -> float:
    """Geometric-mean absolute error: exp(mean(log(max(|pred/meas - 1|, floor)))), as a
    fraction (0.1 = 10%). The floor (0.01% by default) keeps one exact point from
    sending the mean to zero."""
    p, m = np.asarray(predicted, dtype=float), np.asarray(measured, dtype=float)
    ok = np.isfinite(p) & np.isfinite(m) & (m > 0)
    if not ok.any():
        return math.nan
    return float(np.exp(np.mean(np.log(np.maximum(np.abs(p[ok] / m[ok] - 1), floor)))))


def mape(predicted: Sequence[float] | np.ndarray, measured: Sequence[float] | np.ndarray) -> float:
    """Mean absolute percentage error |pred/meas - 1|, as a fraction (0.3 = 30%)."""
    p, m = np.asarray(predicted, dtype=float), np.asarray(measured, dtype=float)
    ok = np.isfinite(p) & np.isfinite(m) & (m > 0)
    return float(np.mean(np.abs(p[ok] / m[ok] - 1))) if ok.any() else math.nan


def coverage(low: Sequence[float] | np.ndarray, high: Sequence[float] | np.ndarray,
             measured: Sequence[float] | np.ndarray) -> float:
    """Share of the measurements inside their band [low, high]."""
    lo, hi, m = (np.asarray(x, dtype=float) for x in (low, high, measured))
    ok = np.isfinite(lo) & np.isfinite(hi) & np.isfinite(m)
    return float(np.mean((lo[ok] <= m[ok]) & (m[ok] <= hi[ok]))) if ok.any() else math.nan
