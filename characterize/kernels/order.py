"""Kernels stage, tbe's work order: how many tables one launch walks at a time.

One tbe launch covers every table of a batch. Walked all at once (the plain order), the
tables' hot rows share the L2: with T tables in flight each keeps about 1/T of it. Walked in
phases of m tables (kernels/tbe.cu, `tables_in_flight`), each keeps about 1/m, and a phase
costs the warps one start-up of their pipeline (offsets, then the first index tile, then the
rows: measured on an H200 at 0.05 us per table and phase, 6% of a one-row table). So: the
plain order when every table's hot rows fit the L2 together, else the fewest tables at a
time whose share of the L2 still holds what one table alone would keep.

What a table keeps in a share of the L2 is read from its trace: the share of its lookups
that go to its most frequent rows fitting that share (coverage), from the warm-up batches,
as the hot rows of l2p are (never from a timed batch). The L2 counts as
`GpuSpec.l2_effective_capacity` of its size, the part that behaves like an LRU of rows.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

#: coverage a phase may give up against one table alone in the whole L2 (a fraction of lookups):
#: below it, more tables at a time cost more in hits than their fewer phase start-ups save
COVERAGE_SLACK = 0.005


def coverage_curve(indices: Any, rows: int) -> np.ndarray:
    """c[k] = share of `indices`' lookups that go to their k most frequent rows (c[0] = 0),
    for k up to the number of distinct rows; beyond it every lookup is covered. `indices`:
    a numpy array or a tensor (read back to the host; numpy alone here, so the model and the
    report that import this never load torch)."""
    idx = indices.cpu().numpy() if hasattr(indices, "cpu") else np.asarray(indices)
    idx = idx.reshape(-1).astype(np.int64, copy=False)
    if idx.size == 0:
        return np.zeros(1)
    counts = np.bincount(idx, minlength=rows)
    counts = np.sort(counts[counts > 0])[::-1].astype(np.float64)
    return np.concatenate([[0.0], np.cumsum(counts) / counts.sum()])


def covered(curve: np.ndarray, rows: float) -> float:
    """Share of lookups the `rows` most frequent rows serve (linear between whole rows)."""
    if rows >= len(curve) - 1:
        return float(curve[-1])
    k = int(rows)
    return float(curve[k] + (rows - k) * (curve[k + 1] - curve[k]))


def shared_coverage(curves: Sequence[np.ndarray], row_bytes: Sequence[int], l2_rows_bytes: float,
                    in_flight: int) -> float:
    """Mean share of lookups served from the L2 when `in_flight` tables share `l2_rows_bytes`
    of it equally, each keeping its most frequent rows."""
    share = l2_rows_bytes / max(1, in_flight)
    return float(np.mean([covered(c, share / rb) for c, rb in zip(curves, row_bytes)]))


def choose_tables_in_flight(curves: Sequence[np.ndarray], row_bytes: Sequence[int], l2_rows_bytes: float,
                            slack: float = COVERAGE_SLACK) -> int:
    """Tables a tbe launch should walk at a time: 0 (the plain order, every table at once) when
    the tables' hot rows fit the L2 together, else the most tables at a time that keep within
    `slack` of what one table alone keeps (at least 1)."""
    T = len(curves)
    if T <= 1:
        return 0
    alone = shared_coverage(curves, row_bytes, l2_rows_bytes, 1)
    if shared_coverage(curves, row_bytes, l2_rows_bytes, T) >= alone - slack:
        return 0
    best = 1
    for m in range(2, T):
        if shared_coverage(curves, row_bytes, l2_rows_bytes, m) >= alone - slack:
            best = m
        else:
            break
    return best
