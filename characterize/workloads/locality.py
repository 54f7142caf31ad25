"""Workloads stage, locality: what a trace offers a cache (unique rows, top-K coverage,
exact reuse distances), independent of any kernel.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Iterator, Sequence

import numpy as np

from characterize.config import WorkloadConfig
from characterize.errors import ConfigError, WorkloadError, escape_text
from characterize.hardware.specs import DEFAULT_GPU, GPUS
from characterize.memory import check_memory
from characterize.workloads.presets import Hotness, parse_dataset
from characterize.workloads.traces import (
    generate_stream,
    generation_bytes,
    load_dataset,
    load_trace,
    read_table,
    sampling_bytes,
    trace_file_problem,
)


# ----------------------------------------------------------------- statistics
def _reuse_distances_py(idx: np.ndarray, last: np.ndarray, tree: np.ndarray, out: np.ndarray,
                        start: int, stop: int) -> None:
    """Reuse distances of lookups start..stop-1 into `out`, continuing the state
    (`last` use per row, Fenwick `tree` of live markers) of the lookups before them:
    the stream can be walked in chunks, with progress between them."""
    n = len(idx)
    for t in range(start, stop):
        r = idx[t]
        p = last[r]
        if p >= 0:
            # distinct rows used in (p, t) = live markers at positions p+1 .. t-1
            s = 0
            i = t  # prefix sum over positions < t (1-based tree index t covers 0..t-1)
            while i > 0:
                s += tree[i]
                i -= i & -i
            i = p + 1
            while i > 0:
                s -= tree[i]
                i -= i & -i
            out[t] = s
            i = p + 1
            while i <= n:
                tree[i] -= 1
                i += i & -i
        else:
            out[t] = -1
        i = t + 1
        while i <= n:
            tree[i] += 1
            i += i & -i
        last[r] = t


@lru_cache(maxsize=1)
def _reuse_kernel():
    try:
        import numba
    except ImportError:  # pragma: no cover - numba is a dependency
        return _reuse_distances_py
    return numba.njit(cache=True, nogil=True)(_reuse_distances_py)


#: peak bytes per lookup of the statistics: the distances, the Fenwick tree, the last-use
#: table (at most 4 rows per lookup after compaction), and the sorts of quantiles and counts
STATS_BYTES_PER_LOOKUP = 64


def stats_bytes(lookups: int) -> int:
    """Peak bytes of `locality_stats` (and `reuse_distances`) over `lookups` lookups."""
    return STATS_BYTES_PER_LOOKUP * lookups + 8 * 1024


#: lookups walked between two progress reports of `reuse_distances` (~0.3 s each)
REUSE_CHUNK = 1 << 21


_REUSE: ContextVar[dict | None] = ContextVar("shared_reuse", default=None)


@contextmanager
def shared_reuse() -> Iterator[None]:
    """Within the block, `reuse_distances` of one array object is computed once (a run's
    locality step and the model read the same table of the same shared dataset); the
    result is read-only. Reentrant."""
    if _REUSE.get() is not None:
        yield
        return
    token = _REUSE.set({})
    try:
        yield
    finally:
        _REUSE.reset(token)


def reuse_distances(indices: np.ndarray, progress: Callable[[int, int], None] | None = None) -> np.ndarray:
    """For each lookup, the number of distinct other rows read since the previous read of
    the same row (-1 on a first read). An LRU cache of C rows hits iff distance < C.
    O(N log N) with a Fenwick tree over 'last use' markers; `progress(done, total)` is
    called after each chunk of REUSE_CHUNK lookups (big traces take seconds)."""
    memo = _REUSE.get()
    if memo is not None and isinstance(indices, np.ndarray):
        hit = memo.get(id(indices))
        if hit is not None and hit[0] is indices:   # the same array object, kept alive by the memo
            if progress is not None:
                progress(indices.size, indices.size)
            return hit[1]
        out = _reuse_distances(indices, progress)
        out.flags.writeable = False
        memo[id(indices)] = (indices, out)
        return out
    return _reuse_distances(indices, progress)


def _reuse_distances(indices: np.ndarray, progress: Callable[[int, int], None] | None = None) -> np.ndarray:
    idx = np.asarray(indices)
    if idx.ndim != 1:
        raise WorkloadError(f"reuse distances need a flat stream of lookups, got an array of shape {idx.shape}")
    if idx.dtype.kind not in "iu":
        raise WorkloadError(f"lookups must be integer row indices, got dtype {idx.dtype}")
    idx = np.ascontiguousarray(idx, dtype=np.int64)
    if idx.size == 0:
        return np.empty(0, dtype=np.int64)
    if idx.min() < 0:
        raise WorkloadError(f"negative row index {int(idx.min())} at position {int(np.argmin(idx))}")
    check_memory(stats_bytes(idx.size), f"the reuse distances of {idx.size:,} lookups",
                 "analyze fewer lookups")
    if idx.max() >= 4 * idx.size + 1024:  # sparse ids: compact them first
        _, idx = np.unique(idx, return_inverse=True)
        idx = idx.astype(np.int64)
    n = idx.size
    last = np.full(int(idx.max()) + 1, -1, dtype=np.int64)
    tree = np.zeros(n + 1, dtype=np.int64)
    out = np.empty(n, dtype=np.int64)
    kernel = _reuse_kernel()
    for start in range(0, n, REUSE_CHUNK):
        stop = min(n, start + REUSE_CHUNK)
        kernel(idx, last, tree, out, start, stop)
        if progress is not None:
            progress(stop, n)
    return out


#: the paper's hot-row count K: 60K rows of 512 B (~29 MiB) is about an A100's persisting-L2 budget
PAPER_HOT_ROWS = 60_000

def named_ks(row_bytes: int, archs: Sequence[str]) -> dict[str, int]:
    """The K that mean something for top-K coverage, by name: the paper's 60K, and the rows
    of `row_bytes` fitting each target architecture's GPU's whole L2 and its persisting-L2
    budget (the default K of l2p). What locality.json stores, the summary prints and the
    report marks."""
    out = {"paper K": PAPER_HOT_ROWS}
    for arch in archs:
        spec = GPUS[DEFAULT_GPU[arch]]
        out[f"{spec.name} L2"] = spec.rows_in_l2(row_bytes)
        out[f"{spec.name} persisting L2"] = spec.rows_in_persisting_l2(row_bytes)
    return out


def coverage_ks(rows: int, points: int = 33) -> set[int]:
    """K from 1 to `rows`, log-spaced: where a top-K coverage curve is sampled."""
    return {int(k) for k in np.unique(np.geomspace(1, max(rows, 1), points).round())}


QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99)


@dataclass(frozen=True)
class LocalityStats:
    """Locality of one table's trace."""

    lookups: int
    unique_rows: int
    rows: int | None                       # E, when known
    row_bytes: int
    top_k_coverage: dict[int, float]       # K -> fraction of lookups to the K hottest rows
    reuse_distance_quantiles: dict[str, float]  # over re-reads only; "p50" -> distinct rows
    cold_fraction: float                   # first reads / lookups
    bytes_touched: int                     # unique rows x row bytes
    reuse_histogram: tuple[tuple[int, int, float], ...]  # (lo, hi) distinct rows -> fraction of lookups

    def to_json(self) -> dict:
        return {
            "lookups": self.lookups,
            "unique_rows": self.unique_rows,
            "rows": self.rows,
            "row_bytes": self.row_bytes,
            "top_k_coverage": {str(k): v for k, v in self.top_k_coverage.items()},
            "reuse_distance_quantiles": self.reuse_distance_quantiles,
            "cold_fraction": self.cold_fraction,
            "bytes_touched": self.bytes_touched,
            "reuse_histogram": [list(b) for b in self.reuse_histogram],
        }


def _check_ks(ks: Sequence[int]) -> list[int]:
    bad = [k for k in ks if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1]
    if bad:
        raise ConfigError(f"top-K coverage needs K >= 1 (rows), got {', '.join(map(str, bad))}")
    return sorted(set(int(k) for k in ks))


def top_k_coverage(indices: np.ndarray, ks: Sequence[int]) -> dict[int, float]:
    """Fraction of lookups that go to the K most frequent rows, for each K."""
    ks = _check_ks(ks)
    _, counts = np.unique(indices, return_counts=True)
    counts = np.sort(counts)[::-1]
    csum = np.cumsum(counts)
    n = len(indices)
    return {k: float(csum[min(k, len(csum)) - 1] / n) for k in ks}


def locality_stats(indices: np.ndarray, rows: int | None = None, row_bytes: int = 512,
                   top_k: Sequence[int] = (PAPER_HOT_ROWS,), distances: np.ndarray | None = None,
                   progress: Callable[[int, int], None] | None = None) -> LocalityStats:
    """Statistics of one table's lookups (pass precomputed `distances` to reuse them;
    `progress(done, total)` follows the reuse distances, see `reuse_distances`)."""
    ks = _check_ks(top_k)
    idx = np.asarray(indices)
    if idx.size == 0:
        raise WorkloadError("no lookups to analyze")
    d = reuse_distances(idx, progress) if distances is None else distances
    idx = idx.astype(np.int64, copy=False)
    unique = int(np.count_nonzero(d < 0))
    reused = d[d >= 0]
    if reused.size:
        qs = np.quantile(reused, QUANTILES)
        quant = {f"p{int(q * 100)}": float(v) for q, v in zip(QUANTILES, qs)}
    else:
        quant = {f"p{int(q * 100)}": float("nan") for q in QUANTILES}
    edges = [0] + [2**i for i in range(0, 40) if 2**i < max(2, int(d.max()) + 2) * 2]
    hist = []
    n = idx.size
    hist.append((-1, -1, unique / n))
    for lo, hi in zip(edges[:-1], edges[1:]):
        c = int(np.count_nonzero((d >= lo) & (d < hi)))
        if c:
            hist.append((lo, hi, c / n))
    return LocalityStats(
        lookups=int(n), unique_rows=unique, rows=rows, row_bytes=row_bytes,
        top_k_coverage=top_k_coverage(idx, ks),
        reuse_distance_quantiles=quant, cold_fraction=unique / n, bytes_touched=unique * row_bytes,
        reuse_histogram=tuple(hist))


def lru_hit_rate(distances: np.ndarray, capacity_rows: float) -> float:
    """Hit rate of a fully associative LRU cache holding `capacity_rows` rows."""
    if distances.size == 0:
        return 0.0
    return float(np.count_nonzero((distances >= 0) & (distances < capacity_rows)) / distances.size)


def check_dataset(spec: str, config: WorkloadConfig) -> None:
    """Refuse, before any work, a dataset that cannot be used: a trace file that does not
    exist, or a table whose generation and statistics exceed the host-memory budget."""
    parsed = parse_dataset(spec)
    if isinstance(parsed, Hotness):
        n = config.B * config.batches * config.L.max
        check_memory(generation_bytes(parsed, config, 1) + stats_bytes(n),
                     f"dataset {spec} (one table: {n:,} lookups over E={config.E:,} rows, and its statistics)",
                     "lower B, L, batches or E")
    elif (problem := trace_file_problem(parsed)) is not None:
        raise WorkloadError(f"dataset {escape_text(spec)}: {problem.replace('; check the path', '')}; fix the path "
                            "or remove it from the experiment's datasets")


@dataclass(frozen=True)
class SourceLocality:
    """Locality of one table of a preset or trace file, with the table size it was read at
    and which view of it: "file" (the file's own lookups), "consumed" (what the bench
    reads: batches of B bags, streams read circularly) or "generated" (a preset)."""

    source: str
    table: int
    rows: int
    row_bytes: int
    stats: LocalityStats
    view: str = "generated"
    file_lookups: int | None = None   # lookups the table holds in the file (trace files)
    tables_in_file: int | None = None


def source_locality(source: str, config: WorkloadConfig, *, rows: int | None = None, lookups: int | None = None,
                    table: int = 0, top_k: Sequence[int] = (), as_consumed: bool = False,
                    progress: Callable[[int, int], None] | None = None) -> SourceLocality:
    """Locality of `source`. A preset: its generated dataset, or a stream of exactly
    `lookups`. A trace file: the table as the file holds it (its first `lookups` when
    given; more than it holds is refused), or with `as_consumed` what the bench reads
    of it for `config` (batches x B x L, the file read circularly; `lookups` then takes
    the first of those). E is inferred unless `rows` is given. K defaults to the
    paper's; callers add more (rows fitting an L2, say) through `top_k`. `progress(done,
    total)` follows the reuse distances."""
    parsed = parse_dataset(source)
    ks = _check_ks([*top_k, PAPER_HOT_ROWS])
    if lookups is not None and lookups < 1:
        raise ConfigError(f"lookups must be a positive number, got {lookups}")
    if table < 0:
        raise ConfigError(f"table must be 0 or more, got {table}")
    if isinstance(parsed, Hotness):
        E = config.E
        # refuse before generating: the trace plus the statistics over it
        n = lookups or config.B * config.batches * config.L.max
        gen = sampling_bytes(parsed, E, n) if lookups else generation_bytes(parsed, config, 1)
        check_memory(gen + stats_bytes(n), f"the locality statistics of {source} (table {table}: {n:,} lookups "
                     f"over E={E:,} rows)", "lower B, L, batches or E, or analyze a stream of fewer lookups (--lookups)")
        if lookups:
            indices = generate_stream(parsed, E, lookups, seed=config.seed, table=table)
        else:
            indices = load_dataset(source, config, tables=[table]).tables[0].indices
        return SourceLocality(source, table, E, config.row_bytes,
                              locality_stats(indices, E, config.row_bytes, ks, progress=progress))
    if not as_consumed:
        ft = read_table(parsed, table, rows=rows, lookups=lookups)
        return SourceLocality(source, table, ft.rows, config.row_bytes,
                              locality_stats(ft.indices, ft.rows, config.row_bytes, ks, progress=progress), "file",
                              ft.file_lookups,
                              ft.tables)
    if table >= config.T:
        raise ConfigError(f"table {table} is not among the experiment's T={config.T} tables")
    ds = load_trace(parsed, config, rows=rows, tables=table + 1)
    if table >= len(ds.tables):   # a bagged file holds fewer tables than asked for
        raise ConfigError(f"table {table} not in {source} ({len(ds.tables)} tables)")
    indices = ds.tables[table].indices
    if lookups is not None:
        if lookups > len(indices):
            raise ConfigError(f"the bench reads {len(indices):,} lookups of table {table} of {source} "
                              f"({config.batches} batches x B={config.B} x L={config.L}); --lookups "
                              f"{lookups:,} asks for more: raise --batches, --B or --L instead")
        indices = indices[:lookups]
    lengths = ds.meta.get("stream_lengths")
    held = lengths[table % len(lengths)] if lengths else None
    return SourceLocality(source, table, ds.rows, config.row_bytes,
                          locality_stats(indices, ds.rows, config.row_bytes, ks, progress=progress), "consumed", held,
                          ds.meta.get("tables_in_file", len(lengths) if lengths else None))
