"""Analysis stage, model locality: per-table hit rates from reuse distances, computed once per dataset
and shared by every variant and GPU.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from functools import lru_cache
from typing import Callable, Iterable, Iterator

import numpy as np

from characterize.analysis.model.constants import L1_SAMPLE_SMS, MODES, SECTOR
from characterize.config import WorkloadConfig
from characterize.errors import ConfigError
from characterize.kernels.order import coverage_curve
from characterize.workloads.locality import reuse_distances
from characterize.workloads.traces import TableTrace, load_dataset


# ------------------------------------------------------------------- locality
def sectors_per_row(row_bytes: int) -> float:
    """Mean 32-byte sectors a row touches, over the alignments rows take in a table."""
    step = math.gcd(row_bytes, SECTOR)
    return float(np.mean([-(-(o + row_bytes) // SECTOR) for o in range(0, SECTOR, step)]))


class Distances:
    """Reuse distances read as hit rates at a few capacities, sorted only when read at many.

    Why: a prediction asks each array at three capacities (its constants and its band's two
    ends), where counting the distances below each costs about 1/250 of a sort; a fit asks
    at hundreds, where one sort and a binary search per capacity is cheaper. The first
    SORT_AFTER reads count; the next sorts once."""

    SORT_AFTER = 16
    __slots__ = ("values", "reads", "ordered")

    def __init__(self, values: np.ndarray):
        self.values = values
        self.reads = 0
        self.ordered: np.ndarray | None = None

    @property
    def size(self) -> int:
        return int(self.values.size)

    def below(self, capacity: float) -> int:
        """How many distances are below `capacity` (as a sorted searchsorted, side left)."""
        if self.ordered is None:
            self.reads += 1
            if self.reads <= self.SORT_AFTER:
                return int(np.count_nonzero(self.values < capacity))
            self.ordered = np.sort(self.values)
        return int(np.searchsorted(self.ordered, capacity, side="left"))


def hit_fraction(sorted_distances: "np.ndarray | Distances", capacity_rows: float) -> float:
    """Fraction of lookups whose distance is below the capacity (an LRU of that many rows hits).
    `sorted_distances`: sorted distances, or a Distances (sorted when it has been read often)."""
    if sorted_distances.size == 0:
        return 0.0
    if isinstance(sorted_distances, Distances):
        return sorted_distances.below(capacity_rows) / sorted_distances.size
    return float(np.searchsorted(sorted_distances, capacity_rows, side="left") / sorted_distances.size)


def _previous_read_py(idx: np.ndarray, rows: int) -> np.ndarray:
    last = np.full(rows, -1, dtype=np.int64)
    out = np.empty(idx.size, dtype=np.int64)
    for t in range(idx.size):
        r = idx[t]
        out[t] = last[r]
        last[r] = t
    return out


@lru_cache(maxsize=1)
def _previous_kernel() -> Callable[[np.ndarray, int], np.ndarray]:
    import numba

    return numba.njit(cache=True, nogil=True)(_previous_read_py)


def _previous_read(idx: np.ndarray, rows: int) -> np.ndarray:
    """Position of the previous read of the same row (ids < rows), -1 on a first read."""
    return _previous_kernel()(np.ascontiguousarray(idx, dtype=np.int64), rows)


def _hot_ranks(indices: np.ndarray, rows: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows among the k most frequent of a trace (ties by row id: the set
    kernels.hot_rows_by_frequency gives the runner, from a bincount instead of a sort),
    and each row's rank among them (0: the hottest; k for the others)."""
    counts = np.bincount(indices, minlength=rows)
    seen = np.flatnonzero(counts)
    hot = seen[np.lexsort((seen, -counts[seen]))[:k]]
    mask = np.zeros(rows, dtype=bool)
    mask[hot] = True
    rank = np.full(rows, k, dtype=np.int64)
    rank[hot] = np.arange(hot.size)
    return mask, rank


@dataclass(frozen=True)
class ReuseStream:
    """Reuse of one lookup stream: per scored lookup, distance, batches crossed, the
    lookups since the previous read of its row, and its position in its launch."""

    distances: np.ndarray   # float64 distinct rows read since the previous read, inf on a first read
    crossed: np.ndarray     # int64 batch boundaries since the previous read
    unique_per_launch: float
    gaps: np.ndarray = dataclass_field(default_factory=lambda: np.empty(0))   # lookups since the previous read
    positions: np.ndarray = dataclass_field(default_factory=lambda: np.empty(0))  # index in the launch
    per_launch: float = 0.0  # lookups per launch

    @classmethod
    def of(cls, idx: np.ndarray, batch: np.ndarray, rows: int, batches: int | None = None) -> "ReuseStream":
        """`batch`: each lookup's batch; lookups of batch 0 are history only when the trace
        has more than one (`batches`, the whole trace's count: a subset of its lookups, such
        as the hot rows', may have none past batch 0 and must not score its history then)."""
        if idx.size == 0:
            return cls(np.empty(0), np.empty(0, dtype=np.int64), 0.0)
        d = reuse_distances(idx).astype(np.float64)
        prev = _previous_read(idx, rows)
        crossed = np.where(prev >= 0, batch - batch[np.maximum(prev, 0)], 0)
        d[prev < 0] = np.inf
        gap = np.where(prev >= 0, np.arange(idx.size) - prev, np.inf).astype(np.float64)
        nb = int(batch.max()) + 1
        starts = np.searchsorted(batch, np.arange(nb))
        pos = (np.arange(idx.size) - starts[batch]).astype(np.float64)
        unique = np.count_nonzero((prev < 0) | (crossed > 0)) / nb   # first reads of each launch
        scored = batch >= 1 if max(nb, batches or 0) > 1 else np.ones(idx.size, dtype=bool)
        return cls(d[scored], crossed[scored], unique, gap[scored], pos[scored], idx.size / nb)

    def effective(self, tables: int, mode: str) -> np.ndarray:
        """Distances the shared L2 sees, in lookup order: T-1 other launches per boundary
        crossed (steady), or no reuse across launches at all (cold: L2 flushed before each)."""
        if mode == "cold":
            return np.where(self.crossed > 0, np.inf, self.distances)
        return self.distances + self.crossed * (tables - 1) * self.unique_per_launch

    def bytes_between(self, tables: int, mode: str, row_sector_bytes: float, stream_bytes: float,
                      in_flight: int = 1) -> np.ndarray:
        """What the L2 holds between two reads of a row, in bytes: the distinct rows read in
        between (their sectors), every byte the kernel streams through L2 meanwhile (its
        indices, offsets, output and offset2bag: `stream_bytes` per lookup), and per
        batch boundary crossed the other T-1 tables' launches (their distinct rows and
        streams); infinite across launches in cold mode (L2 flushed before each). With
        `in_flight` tables gathered at once (one launch walking several), each of the others
        reads as much in the meantime: the distance within a launch is that many times the
        table's own, and a batch boundary adds the launches of the tables not in flight."""
        within = self.distances * row_sector_bytes + np.where(np.isfinite(self.gaps), self.gaps, 0.0) * stream_bytes
        within = within * in_flight
        if mode == "cold":
            return np.where(self.crossed > 0, np.inf, within)
        launch = self.unique_per_launch * row_sector_bytes + self.per_launch * stream_bytes
        return within + self.crossed * max(tables - in_flight, 0) * launch


def _compact(traces: list[TableTrace], rows: int) -> tuple[list[TableTrace], int]:
    """Traces over a table much larger than they read, renumbered to their distinct rows
    (order kept, so ties by row id break alike): per-row arrays then scale with the trace,
    not with E, and a table of tens of millions of rows is analyzed in bounded memory."""
    if rows <= COMPACT_ROWS_PER_LOOKUP * max(tr.indices.size for tr in traces):
        return traces, rows
    out, most = [], 1
    for tr in traces:
        uniq, inverse = np.unique(tr.indices, return_inverse=True)
        out.append(TableTrace(inverse.astype(np.int64).reshape(-1), tr.offsets, tr.starts))
        most = max(most, int(uniq.size))
    return out, most


#: a table with more rows than this many per lookup of its trace is analyzed on its trace's distinct rows
COMPACT_ROWS_PER_LOOKUP = 4


_PROFILES: ContextVar[dict | None] = ContextVar("shared_trace_profiles", default=None)


@contextmanager
def shared_profiles() -> Iterator[None]:
    """Within the block, `trace_profile` analyzes each trace once, whatever the precision,
    D or GPU asked for (none of them changes a trace's reuse): a run's predictions of every
    precision and the model's check against the paper share them. Reentrant."""
    if _PROFILES.get() is not None:
        yield
        return
    token = _PROFILES.set({})
    try:
        yield
    finally:
        _PROFILES.reset(token)


def trace_profile(dataset: str, workload: WorkloadConfig, tables: int = 1) -> "TraceProfile":
    """The TraceProfile of `dataset` under `workload`, shared inside `shared_profiles`."""
    cache = _PROFILES.get()
    key = (dataset, workload.T, workload.E, workload.B, workload.L, workload.batches, workload.seed, tables)
    if cache is not None and key in cache:
        return cache[key]
    prof = TraceProfile(dataset, workload, tables)
    if cache is not None:
        cache[key] = prof
    return prof


def warm(profiles: Iterable["TraceProfile"], needs: dict[int, set[tuple[int, str]]], modes: Iterable[str]) -> None:
    """Compute the costly part of what the points will read of each profile (for each pinned
    K, the hot/cold split's reuse distances and the window), one thread per profile: the
    reuse-distance kernel releases the GIL, so traces are analyzed side by side."""
    modes = list(modes)

    def one(prof: "TraceProfile") -> None:
        for k, mode in sorted(needs.get(id(prof), ())):
            prof.pinned(k)
            if mode in modes:
                prof.window(k, mode)

    todo = list(dict.fromkeys(profiles))
    if len(todo) < 2:
        for p in todo:
            one(p)
        return
    with ThreadPoolExecutor(min(len(todo), os.cpu_count() or 1)) as pool:
        list(pool.map(one, todo))


class TraceProfile:
    """Locality of one dataset under one workload: everything the model needs from the
    trace, computed once and shared by every variant, GPU, mode and constant set."""

    def __init__(self, dataset: str, workload: WorkloadConfig, tables: int = 1):
        if not 1 <= tables <= workload.T:
            raise ConfigError(f"tables must be in 1..T={workload.T}, got {tables}")
        data = load_dataset(dataset, workload, tables=range(tables))
        self.dataset = dataset
        self.E = data.rows                        # rows of the table (the trace may read far fewer)
        self.T = workload.T
        #: each table's row ids as the trace has them (page numbers of managed memory come from these)
        self.original = [tr.indices for tr in data.tables]
        self._traces, self.rows = _compact(data.tables, data.rows)
        self._batch = [np.repeat(np.arange(tr.batches), np.diff(tr.starts)) for tr in data.tables]
        self._streams = {"all": [ReuseStream.of(tr.indices, b, self.rows, tr.batches)
                                 for tr, b in zip(self._traces, self._batch)]}
        self.lookups_per_launch = float(np.mean([tr.starts[-1] / tr.batches for tr in self._traces]))
        self.bags = int(self._traces[0].offsets.shape[1])
        self.unique_per_launch = float(np.mean([s.unique_per_launch for s in self._streams["all"]]))
        # the most rows a pre-pass can pin: the distinct rows of the warm-up batch its hot set comes from
        self.unique_rows = max(int(np.count_nonzero(np.bincount(
            tr.indices[b < 1] if tr.batches > 1 else tr.indices, minlength=self.rows)))
            for tr, b in zip(self._traces, self._batch))
        lengths = np.concatenate([tr.lengths().reshape(tr.batches, -1)[1 if tr.batches > 1 else 0:].reshape(-1)
                                  for tr in self._traces])
        #: the scored bags' lengths (their distribution decides what each task costs)
        self.bag_lengths = lengths.astype(np.float64)
        self._hot_fraction: dict[int, float] = {}
        self._hot_scored: dict[int, list[np.ndarray]] = {}
        self._hot_rank: dict[int, list[np.ndarray]] = {}
        self._sorted: dict[tuple[str, str], np.ndarray] = {}
        self._lazy: dict[tuple, Distances] = {}
        self._window: dict[tuple[int, str], tuple[float, np.ndarray]] = {}
        self._l1: dict[tuple[int, int, int], np.ndarray] = {}
        self._cache: dict[str, np.ndarray] = {}

    def distances(self, mode: str, subset: str = "all") -> np.ndarray:
        """Sorted effective L2 distances of the scored lookups ('all', or 'hot:K' /
        'cold:K' after pinned(K))."""
        if mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        key = (subset, mode)
        if key not in self._sorted:
            self._sorted[key] = np.sort(np.concatenate([s.effective(self.T, mode) for s in self._streams[subset]]))
        return self._sorted[key]

    def byte_distances(self, mode: str, row_sector_bytes: float, stream_bytes: float,
                       subset: str = "all", in_flight: int = 1) -> Distances:
        """L2 distances in bytes of the scored lookups (ReuseStream.bytes_between), with
        `in_flight` tables gathered at once, for hit_fraction."""
        key = ("bytes", subset, mode, round(row_sector_bytes, 3), round(stream_bytes, 3), in_flight)
        if key not in self._lazy:
            self._lazy[key] = Distances(np.concatenate(
                [s.bytes_between(self.T, mode, row_sector_bytes, stream_bytes, in_flight)
                 for s in self._streams[subset]]))
        return self._lazy[key]

    def coverage_curve(self) -> np.ndarray:
        """Share of the warm-up batch's lookups its k most frequent rows serve, per k
        (kernels.order.coverage_curve: what tbe's launcher chooses its work order from)."""
        if "coverage" not in self._cache:
            tr, batch = self._traces[0], self._batch[0]
            warm = tr.indices[batch < 1] if tr.batches > 1 else tr.indices
            self._cache["coverage"] = coverage_curve(warm, self.rows)
        return self._cache["coverage"]

    def warm_start(self, k: int, mode: str, row_sector_bytes: float, stream_bytes: float) -> np.ndarray:
        """l2p without a set-aside: the pre-pass reads the k hottest rows just before each
        launch, with no more priority than any line, so a hot row's first read in a launch
        finds it as if last read at the pre-pass: the hot rows prefetched after it, and
        what the launch has streamed and gathered so far, lie in between. Sorted byte
        distances of the hot lookups (the others are as without the pre-pass)."""
        key = ("warm", k, mode, round(row_sector_bytes, 3), round(stream_bytes, 3))
        if key not in self._sorted:
            self.pinned(k)
            parts = []
            for s, hot, rank in zip(self._streams["all"], self._hot_scored[k], self._hot_rank[k]):
                d = s.bytes_between(self.T, mode, row_sector_bytes, stream_bytes)[hot]
                first = (s.crossed[hot] > 0) | ~np.isfinite(s.distances[hot])
                launch_rate = row_sector_bytes * self.unique_per_launch / max(s.per_launch, 1.0) + stream_bytes
                since = (k - 1 - rank) * row_sector_bytes + s.positions[hot] * launch_rate
                parts.append(np.where(first, since, d))
            self._sorted[key] = np.sort(np.concatenate(parts)) if parts else np.empty(0)
        return self._sorted[key]

    def window(self, k: int, mode: str) -> tuple[float, np.ndarray]:
        """l2w: the fraction of hot lookups the persisting carve-out of k rows keeps
        (distance among hot rows < k), and the sorted full-stream distances of the hot
        lookups it does not keep: those compete in the normal part of L2 like any row."""
        if (k, mode) not in self._window:
            self.pinned(k)
            kept, rest = [], []
            for all_, hot_, mask in zip(self._streams["all"], self._streams[f"hot:{k}"], self._hot_scored[k]):
                inside = hot_.effective(self.T, mode) < k
                kept.append(inside)
                rest.append(all_.effective(self.T, mode)[mask][~inside])
            kept_all = np.concatenate(kept)
            self._window[(k, mode)] = (float(kept_all.mean()) if kept_all.size else 0.0, np.sort(np.concatenate(rest)))
        return self._window[(k, mode)]

    def pinned(self, k: int) -> float:
        """Split the lookups into the K hottest rows of each table and the rest (their
        distances become subsets 'hot:K' and 'cold:K'); returns the hot fraction."""
        if k not in self._hot_fraction:
            hot_n, n = 0, 0
            self._streams[f"hot:{k}"], self._streams[f"cold:{k}"], self._hot_scored[k] = [], [], []
            self._hot_rank[k] = []
            for tr, batch in zip(self._traces, self._batch):
                # the hot set as the runner picks it: by frequency over the warm-up batch, never a scored one
                warm = tr.indices[batch < 1] if tr.batches > 1 else tr.indices
                mask, rank_of = _hot_ranks(warm, self.rows, k)
                hot = mask[tr.indices]
                scored = batch >= 1 if tr.batches > 1 else np.ones(hot.size, dtype=bool)
                self._hot_scored[k].append(hot[scored])
                self._hot_rank[k].append(rank_of[tr.indices][scored & hot].astype(np.float64))
                hot_n += int(np.count_nonzero(hot & scored))
                n += int(np.count_nonzero(scored))
                for name, sel in ((f"hot:{k}", hot), (f"cold:{k}", ~hot)):
                    self._streams[name].append(ReuseStream.of(tr.indices[sel], batch[sel], self.rows,
                                                              tr.batches))
            self._hot_fraction[k] = hot_n / max(n, 1)
        return self._hot_fraction[k]

    def l1_distances(self, sms: int, block_num: int, block_den: int) -> np.ndarray:
        """Sorted within-launch distances seen by the L1 of a few SMs. Bag b runs in
        block (b * block_num) // block_den and blocks are dealt to SMs round-robin."""
        key = (sms, block_num, block_den)
        if key not in self._l1:
            sample = min(sms, L1_SAMPLE_SMS)
            parts = []
            for tr, batch in zip(self._traces, self._batch):
                lengths = tr.lengths()
                bag = np.repeat(np.tile(np.arange(self.bags), tr.batches), lengths)
                sm = (bag * block_num // block_den) % sms
                keep = (sm < sample) & (batch >= 1 if tr.batches > 1 else True)
                group = batch[keep] * sample + sm[keep]   # one L1 per (launch, SM)
                order = np.argsort(group, kind="stable")
                keyed = (group[order] * self.rows + tr.indices[keep][order]).astype(np.int64)
                d = reuse_distances(keyed).astype(np.float64)
                d[d < 0] = np.inf
                parts.append(d)
            self._l1[key] = np.sort(np.concatenate(parts)) if parts else np.empty(0)
        return self._l1[key]


