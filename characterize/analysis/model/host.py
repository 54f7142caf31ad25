"""Analysis stage, model of host-resident tables: the `cache` variant (a frequency-aware GPU cache of C rows
of a table in host memory) and the `uvm` variant (the table in managed memory), per
table launch, from the trace and the host link of the GPU (hardware.HOST_LINKS).

cache
  The hit rate is derived by replaying the cache's policy (kernels.cache.CachePolicy,
  restated here in numpy so the model needs no torch; a test holds the two equal) on the
  table's trace: warmed from the trace's frequencies, C rows, batch after batch (batch 0
  is warm-up when there are several). Per launch, U unique rows, of them M
  missed (hit rate = 1 - M/U, over unique rows: what decides the copies):
      dedup_us    = (SORT_BYTES_PER_ID N + MAP_BYTES_PER_ROW U + SORT_BYTES_PER_ID C [when M > 0])
                    / (eta BW_hbm) + CACHE_OPS t_launch + CACHE_SYNCS t_link
      transfer_us = t_link + M R / BW_link + M R / HOST_GATHER_GBps   (host gather, then one batched copy)
      lookup_us   = base's kernel on the cache slots (the same trace: the slot stream
                    reuses rows exactly as the row stream does)
      time_us     = dedup_us + transfer_us + lookup_us   (the three run one after another)
  host_bytes = M R per launch. speedup_vs_base = the share of all-GPU speed reached.

uvm
  GPU memory acts as a cache of 64 KiB pages (the UVM driver's migration unit) shared by
  the T tables: capacity = free GPU memory / T / page. A lookup hits when its page's
  reuse distance (with the other tables' pages in between, as for L2) is below it;
  each miss migrates a page, faults are serviced in batches of UVM_FAULT_BATCH:
      transfer_us = ceil(page misses / UVM_FAULT_BATCH) t_fault + page misses x 64 KiB / BW_link
      time_us     = transfer_us + lookup_us (base's kernel reading the migrated pages)
  A table that fits the GPU pays only first touches after warm-up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from characterize.analysis.model.locality import ReuseStream, TraceProfile, hit_fraction
from characterize.config import INDEX_BYTES
from characterize.hardware.specs import UVM_FAULT_BATCH, UVM_PAGE_BYTES, GpuSpec, HOST_ROW_GATHER_GBps

#: bytes moved per id by torch.unique on the GPU: a radix sort of 64-bit keys with 64-bit
#: positions (8 passes of 8-bit digits, each reading and writing 16 bytes) plus the unique
#: pass and the inverse scatter
SORT_BYTES_PER_ID = 8 * 2 * 16 + 3 * INDEX_BYTES
#: bytes per unique row of the map lookups and priority updates (three 8-byte random
#: accesses, a 32-byte sector each)
MAP_BYTES_PER_ROW = 3 * 32
#: small kernels and copies one batch of the cache issues (unique, map gathers, priority
#: update, masks, the eviction sort, scatters of the maps and slots, the gather on slots)
CACHE_OPS = 24
#: device-to-host synchronizations per batch (the miss count, the missed rows' ids)
CACHE_SYNCS = 2
#: cache sizes (shares of E) a run predicts for the cache variant: around the 1.5% headline
CACHE_SWEEP = (0.005, 0.015, 0.05, 0.15, 0.5)


@dataclass(frozen=True)
class CacheReplay:
    """The cache's policy replayed on a table's trace, per launch (scored batches)."""

    rows: int                 # C
    unique: float             # unique rows per launch
    misses: float             # of them not cached
    admitted: float
    evicted: float
    lookup_hit_rate: float    # lookups whose row was cached

    @property
    def hit_rate(self) -> float:
        return 1 - self.misses / self.unique if self.unique else 1.0


class _Policy:
    """kernels.cache.CachePolicy's decisions in numpy: C slots warmed with the most
    frequent rows; priority = max(frequency statistics, lookups counted since); a miss
    takes the slot of the least frequent cached row the batch does not use when it is
    strictly more frequent (empty slots first), otherwise it is staged for the batch."""

    def __init__(self, rows: int, capacity: int, frequencies: np.ndarray):
        self.C = int(min(capacity, rows))
        self.stats = frequencies.astype(np.int64)
        self.counted = np.zeros(rows, dtype=np.int64)
        self.priority = self.stats.copy()
        self.row_slot = np.full(rows, -1, dtype=np.int64)
        self.slot_row = np.full(self.C, -1, dtype=np.int64)
        seen = np.flatnonzero(self.priority > 0)
        warm = seen[np.argsort(-self.priority[seen], kind="stable")[: self.C]]
        self.row_slot[warm] = np.arange(warm.size)
        self.slot_row[: warm.size] = warm

    def step(self, indices: np.ndarray) -> tuple[int, int, int, int, int]:
        """(unique rows, misses, admitted, evicted, lookups that hit) of one batch."""
        unique, counts = np.unique(indices, return_counts=True)
        slots = self.row_slot[unique]
        hit = slots >= 0
        lookup_hits = int(counts[hit].sum())
        self.counted[unique] += counts
        self.priority[unique] = np.maximum(self.stats[unique], self.counted[unique])
        miss = unique[~hit]
        admitted = evicted = 0
        if miss.size:
            miss = miss[np.argsort(-self.priority[miss], kind="stable")]
            used = np.zeros(self.C, dtype=bool)
            used[slots[hit]] = True
            free = np.flatnonzero(~used)
            owner = self.slot_row[free]
            prio = np.where(owner >= 0, self.priority[np.maximum(owner, 0)], -1)
            order = np.argsort(prio, kind="stable")
            free, owner, prio = free[order], owner[order], prio[order]
            n = min(miss.size, free.size)
            admitted = int(np.count_nonzero(self.priority[miss[:n]] > prio[:n]))
            victims, old = free[:admitted], owner[:admitted]
            gone = old[old >= 0]
            evicted = int(gone.size)
            self.row_slot[gone] = -1
            self.row_slot[miss[:admitted]] = victims
            self.slot_row[victims] = miss[:admitted]
        return int(unique.size), int(miss.size), admitted, evicted, lookup_hits


class HostProfile:
    """What the host-resident variants need from a dataset's trace, computed on demand
    and memoized per cache size and page geometry."""

    def __init__(self, profile: TraceProfile):
        self.profile = profile
        self._cache: dict[int, CacheReplay] = {}
        self._pages: dict[tuple[int, int], list[ReuseStream]] = {}

    def cache(self, C: int) -> CacheReplay:
        """Replay the policy with C rows on every analyzed table (compacted ids: rows the
        trace never reads can never be cached, so they do not matter)."""
        if C not in self._cache:
            prof = self.profile
            tot = np.zeros(5)
            for tr in prof._traces:
                policy = _Policy(prof.rows, C, np.bincount(tr.indices, minlength=prof.rows))
                scored = range(1, tr.batches) if tr.batches > 1 else range(tr.batches)
                for b in range(tr.batches):
                    unique, misses, admitted, evicted, hits = policy.step(tr.batch(b)[0])
                    if b in scored:
                        lookups = tr.starts[b + 1] - tr.starts[b]
                        tot += [unique, misses, admitted, evicted, hits / max(lookups, 1)]
            n = max(1, sum(max(tr.batches - 1, 1) for tr in prof._traces))
            u, m, a, e, lh = tot / n
            self._cache[C] = CacheReplay(C, u, m, a, e, lh)
        return self._cache[C]

    def pages(self, row_bytes: int, page_bytes: int = UVM_PAGE_BYTES) -> list[ReuseStream]:
        """Per table, the reuse of its pages of managed memory (rows of `row_bytes` laid
        out in order)."""
        key = (row_bytes, page_bytes)
        if key not in self._pages:
            prof = self.profile
            out = []
            for ids, batch in zip(prof.original, prof._batch):
                pages = (ids * row_bytes) // page_bytes
                uniq, dense = np.unique(pages, return_inverse=True)
                out.append(ReuseStream.of(dense.astype(np.int64).reshape(-1), batch, int(uniq.size)))
            self._pages[key] = out
        return self._pages[key]


def cache_terms(replay: CacheReplay, gpu: GpuSpec, row_bytes: int, lookups: float, hbm_efficiency: float,
                launch_overhead_us: float, lookup_us: float) -> dict[str, float]:
    """The cache's time split and traffic for one launch (module docstring)."""
    sort_ids = lookups * SORT_BYTES_PER_ID + replay.unique * MAP_BYTES_PER_ROW
    if replay.misses > 0:
        sort_ids += replay.rows * SORT_BYTES_PER_ID
    dedup = sort_ids / (hbm_efficiency * gpu.hbm_GBps) / 1e3 + CACHE_OPS * launch_overhead_us \
        + CACHE_SYNCS * gpu.host_latency_us
    host_bytes = replay.misses * row_bytes
    transfer = (gpu.host_latency_us + host_bytes / gpu.pcie_GBps / 1e3 + host_bytes / HOST_ROW_GATHER_GBps / 1e3
                if replay.misses > 0 else 0.0)
    return {"cache_rows": replay.rows, "cache_hit_rate_pct": 100 * replay.hit_rate,
            "cache_lookup_hit_rate_pct": 100 * replay.lookup_hit_rate, "host_bytes": host_bytes,
            "dedup_us": dedup, "transfer_us": transfer, "lookup_us": lookup_us,
            "time_us": dedup + transfer + lookup_us}


def uvm_terms(streams: list[ReuseStream], gpu: GpuSpec, capacity_pages: float, tables: int, mode: str,
              lookups: float, lookup_us: float) -> dict[str, float]:
    """Managed memory for one launch: page hits against the GPU memory's share of this
    table, the faults and migrations of the misses (module docstring)."""
    d = np.sort(np.concatenate([s.effective(tables, mode) for s in streams])) if streams else np.empty(0)
    hit = hit_fraction(d, capacity_pages)
    misses = (1 - hit) * lookups
    host_bytes = misses * UVM_PAGE_BYTES
    transfer = math.ceil(misses / UVM_FAULT_BATCH) * gpu.uvm_fault_batch_us + host_bytes / gpu.pcie_GBps / 1e3
    return {"cache_hit_rate_pct": 100 * hit, "cache_lookup_hit_rate_pct": 100 * hit, "host_bytes": host_bytes,
            "dedup_us": 0.0, "transfer_us": transfer, "lookup_us": lookup_us, "time_us": transfer + lookup_us}
