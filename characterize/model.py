"""Model stage: kernel time, L2 hit rate and memory traffic of every variant on any GPU
in the spec table, predicted from the trace and the static characterization alone,
with a handful of constants that a measured run can calibrate.

Per table launch (B bags, N lookups, L = N/B per bag, rows of R bytes covering s
32-byte sectors, R_s = 32 s):

Locality, computed once per dataset and shared by every variant and GPU
  d_i   reuse distance of lookup i in its table's own multi-batch trace (distinct rows
        read since the previous read of the same row; workloads.reuse_distances)
  k_i   batch boundaries crossed since that previous read
  U     distinct rows per launch
  The T tables are launched in turn, so each boundary brings T-1 other launches of U
  distinct rows each: d*_i = d_i + k_i (T-1) U (cold mode, L2 flushed before every
  launch: d*_i = inf when k_i > 0). Batch 0 is warm-up (it has no history); hit rates
  are scored over the later batches.
  L2 = a fully associative LRU of C2 = f L2_bytes / R_s rows: h2 = P(d* < C2). The real
  L2 is sectored, set-associative and split in two partitions that each hold a copy
  of lines read from both sides; f (l2_capacity_factor, default from GpuSpec) is the
  fraction of it that behaves like the ideal LRU.
  l2p/combined: the K_r = min(K, rows the trace reads, persisting budget / R_s)
  hottest rows (by frequency over the table's trace, as the runner picks them) are
  prefetched with evict_last before each launch: they hit. The other lookups compete,
  with their own distances d*_c over the non-hot substream, for
  C2' = f (L2_bytes - K_r R_s) / R_s rows:  h2 = p_hot + (1 - p_hot) P(d*_c < C2').
  l2w: nothing is prefetched; hot rows become persisting on use and the carve-out of
  K_r rows is re-aimed at each table, so a hot lookup is kept when its distance among
  hot rows d*_h < K_r (a first read per launch is not, unless the hot sets of all T
  tables fit); a hot lookup not kept competes in C2' with its full distance d*. The
  other lookups as for l2p. (So l2w can lose to plain L2 in steady state.)
  L1 (per SM, invalidated between kernels): the lookups of the bags one SM runs
  (blocks dealt round-robin), reuse within the launch against C1 = L1_data / R_s rows:
  l1. A lookup is served by L1 (phi1 = l1), L2 (phi2 = max(h2 - l1, 0)) or DRAM
  (phiD = 1 - max(h2, l1)); l2_hit_rate_pct = phi2 / (phi2 + phiD), the rate of row
  requests reaching L2.

Latency (lambda1, lambda2, lambdaD: L1, L2, DRAM load-to-use)
  t_row = phi1 lambda1 + phi2 lambda2 + phiD lambdaD.
  Thread per (bag, feature) kernels (base, optmt, l2p, l2w, rpf, combined; torch is
  modelled as base): each iteration loads an 8-byte index, then the row element it
  addresses. Four indices share a 32-byte sector that is new every launch, so
  t_idx = 3/4 lambda1 + 1/4 lambdaD. With P rows prefetched (rpf/combined; 0 for base)
  the index->row chain overlaps P+1 ways while index loads stay serial:
      t_iter = max(t_idx, (t_idx + t_row) / (P + 1)),
  and a warp's task, one (bag, 32-feature chunk), takes L t_iter.
  warp: per tile of G indices one coalesced index load (lambdaD), then steps of U
  independent full-row loads consumed together, each costing the expected slowest
      E[max] = lambda1 phi1^U + lambda2 ((phi1+phi2)^U - phi1^U) + lambdaD (1 - (phi1+phi2)^U).
  Blocks carry equal work, so they run in waves: waves = ceil(blocks with work /
  (blocks_per_sm SMs)), rounds = tasks per warp, and t_lat = waves rounds task. With
  full waves this is requests x latency / parallelism, parallelism = resident warps x
  rows in flight per warp (1 for base, P+1 for rpf, U for warp).

Bandwidth
  DRAM bytes = N phiD R_s + N 8 (indices, streamed once) + B 8 (offsets) + B R (output)
               + N 8 (offset2bag) + B 8 (bag sizes)
  L2 bytes   = N (1 - phi1) R_s + the same streams
  L1 bytes   = 128-byte wavefronts issued (row loads and index loads)
  time = max(t_lat, DRAM / (eta BW_hbm), L2 / BW_l2, L1 / BW_l1) + t_launch; `bound`
  names the largest term. The l2p pre-pass (K rows from DRAM) is reported apart, in
  prepass_us, as the paper and the runner report it.

Constants (ModelConstants): lambda1, lambda2, lambdaD, f, eta and t_launch per GPU,
defaults from hardware.GpuSpec (with sources there); `calibrate()` fits them to a
measured run by least squares on log time (and on L2 hit rates where ncu measured
them with --cache-control none) and stores them per GPU; predictions use them when
present (column `constants`).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from .config import INDEX_BYTES, ExperimentConfig, WorkloadConfig
from .errors import ConfigError, RunDirError, ToolchainNotFound
from .hardware import GpuSpec, gpu_spec
from .kernels import Variant, get_variant, warp_group
from .workloads import load_dataset, reuse_distances

Progress = Callable[[str], None]

SECTOR = 32          # bytes: the unit of L1/L2/DRAM traffic
WAVEFRONT = 128      # bytes an L1 request moves per cycle
L1_SAMPLE_SMS = 8    # SMs whose substreams estimate the L1 hit rate
MODES = ("steady", "cold")


# ------------------------------------------------------------------ constants
@dataclass(frozen=True)
class ModelConstants:
    """The model's free constants for one GPU."""

    l1_latency_ns: float
    l2_latency_ns: float
    dram_latency_ns: float
    l2_capacity_factor: float   # f: fraction of L2 that behaves like a fully associative LRU
    hbm_efficiency: float       # eta: achievable fraction of peak DRAM bandwidth
    launch_overhead_us: float

    @classmethod
    def defaults(cls, gpu: GpuSpec) -> "ModelConstants":
        return cls(gpu.l1_latency_ns, gpu.l2_latency_ns, gpu.dram_latency_ns, gpu.l2_effective_capacity,
                   gpu.hbm_efficiency, gpu.launch_overhead_us)

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ModelConstants":
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in data]
        if missing:
            raise ConfigError(f"model constants lack {', '.join(missing)}")
        return cls(**{n: float(data[n]) for n in names})

    def replace(self, **changes: float) -> "ModelConstants":
        return dataclasses.replace(self, **changes)


#: the range calibrate() keeps each constant in
BOUNDS: dict[str, tuple[float, float]] = {
    "l1_latency_ns": (5.0, 120.0),
    "l2_latency_ns": (50.0, 1000.0),
    "dram_latency_ns": (150.0, 2500.0),
    "l2_capacity_factor": (0.05, 1.0),
    "hbm_efficiency": (0.2, 1.0),
    "launch_overhead_us": (0.3, 30.0),
}
FIT_DEFAULT = tuple(BOUNDS)


# ------------------------------------------------------------------- locality
def sectors_per_row(row_bytes: int) -> float:
    """Mean 32-byte sectors a row touches, over the alignments rows take in a table."""
    step = math.gcd(row_bytes, SECTOR)
    return float(np.mean([-(-(o + row_bytes) // SECTOR) for o in range(0, SECTOR, step)]))


def _hit_fraction(sorted_distances: np.ndarray, capacity_rows: float) -> float:
    """Fraction of lookups whose distance is below the capacity (an LRU of that many rows hits)."""
    if sorted_distances.size == 0:
        return 0.0
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


def _hot_mask(indices: np.ndarray, rows: int, k: int) -> np.ndarray:
    """Rows among the k most frequent of a trace (ties by row id): the set
    kernels.hot_rows_by_frequency gives the runner, from a bincount instead of a sort."""
    counts = np.bincount(indices, minlength=rows)
    seen = np.flatnonzero(counts)
    hot = seen[np.lexsort((seen, -counts[seen]))[:k]]
    mask = np.zeros(rows, dtype=bool)
    mask[hot] = True
    return mask


@dataclass(frozen=True)
class _Stream:
    """Reuse of one lookup stream: per scored lookup, distance and batches crossed."""

    distances: np.ndarray   # float64, inf on a first read
    crossed: np.ndarray     # int64 batch boundaries since the previous read
    unique_per_launch: float

    @classmethod
    def of(cls, idx: np.ndarray, batch: np.ndarray, rows: int) -> "_Stream":
        """`batch`: each lookup's batch; lookups of batch 0 are history only."""
        if idx.size == 0:
            return cls(np.empty(0), np.empty(0, dtype=np.int64), 0.0)
        d = reuse_distances(idx).astype(np.float64)
        prev = _previous_read(idx, rows)
        crossed = np.where(prev >= 0, batch - batch[np.maximum(prev, 0)], 0)
        d[prev < 0] = np.inf
        nb = int(batch.max()) + 1
        unique = np.count_nonzero((prev < 0) | (crossed > 0)) / nb   # first reads of each launch
        scored = batch >= 1 if nb > 1 else np.ones(idx.size, dtype=bool)
        return cls(d[scored], crossed[scored], unique)

    def effective(self, tables: int, mode: str) -> np.ndarray:
        """Distances the shared L2 sees, in lookup order: T-1 other launches per boundary
        crossed (steady), or no reuse across launches at all (cold: L2 flushed before each)."""
        if mode == "cold":
            return np.where(self.crossed > 0, np.inf, self.distances)
        return self.distances + self.crossed * (tables - 1) * self.unique_per_launch


class TraceProfile:
    """Locality of one dataset under one workload: everything the model needs from the
    trace, computed once and shared by every variant, GPU, mode and constant set."""

    def __init__(self, dataset: str, workload: WorkloadConfig, tables: int = 1):
        if not 1 <= tables <= workload.T:
            raise ConfigError(f"tables must be in 1..T={workload.T}, got {tables}")
        data = load_dataset(dataset, workload, tables=range(tables))
        self.dataset = dataset
        self.rows = data.rows
        self.T = workload.T
        self._traces = data.tables
        self._batch = [np.repeat(np.arange(tr.batches), np.diff(tr.starts)) for tr in data.tables]
        self._streams = {"all": [_Stream.of(tr.indices, b, self.rows) for tr, b in zip(self._traces, self._batch)]}
        self.lookups_per_launch = float(np.mean([tr.starts[-1] / tr.batches for tr in self._traces]))
        self.bags = int(self._traces[0].offsets.shape[1])
        self.unique_per_launch = float(np.mean([s.unique_per_launch for s in self._streams["all"]]))
        self.unique_rows = max(int(np.count_nonzero(np.bincount(tr.indices, minlength=self.rows)))
                               for tr in self._traces)   # the most rows a pre-pass can pin
        self._hot_fraction: dict[int, float] = {}
        self._hot_scored: dict[int, list[np.ndarray]] = {}
        self._sorted: dict[tuple[str, str], np.ndarray] = {}
        self._window: dict[tuple[int, str], tuple[float, np.ndarray]] = {}
        self._l1: dict[tuple[int, int, int], np.ndarray] = {}

    def distances(self, mode: str, subset: str = "all") -> np.ndarray:
        """Sorted effective L2 distances of the scored lookups ('all', or 'hot:K' /
        'cold:K' after pinned(K))."""
        if mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        key = (subset, mode)
        if key not in self._sorted:
            self._sorted[key] = np.sort(np.concatenate([s.effective(self.T, mode) for s in self._streams[subset]]))
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
            for tr, batch in zip(self._traces, self._batch):
                hot = _hot_mask(tr.indices, self.rows, k)[tr.indices]
                scored = batch >= 1 if tr.batches > 1 else np.ones(hot.size, dtype=bool)
                self._hot_scored[k].append(hot[scored])
                hot_n += int(np.count_nonzero(hot & scored))
                n += int(np.count_nonzero(scored))
                for name, sel in ((f"hot:{k}", hot), (f"cold:{k}", ~hot)):
                    self._streams[name].append(_Stream.of(tr.indices[sel], batch[sel], self.rows))
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


# ------------------------------------------------------------- kernel shapes
@dataclass(frozen=True)
class _Point:
    """One (variant, dataset, GPU): everything that does not depend on the constants."""

    variant: str
    dataset: str
    gpu: GpuSpec
    family: str             # chunk (thread per bag x feature) | warp (sub-warp per bag)
    l2: str                 # none | prefetch | window
    prefetch: int           # P rows prefetched ahead (chunk family)
    rows_per_step: int      # U (warp family)
    blocks_per_sm: int
    registers: int
    warps_per_block: int
    blocks: int             # blocks that have work
    rounds: int             # tasks per warp
    lookups: float          # N per launch
    bags: int
    per_bag: float          # L
    row_bytes: int
    row_sector_bytes: float
    chunks: int             # 32-feature chunks per bag (chunk family)
    group: int              # lanes per bag (warp family)
    bytes_per_load: int     # per warp-level row load
    pinned_rows: int        # K_r: hot rows resident (0 without pinning)
    prepass_rows: int       # hot rows the pre-pass prefetches (l2p/combined): K, at most the rows the trace reads
    profile: TraceProfile
    mode: str               # steady | cold
    l1: np.ndarray          # sorted L1 distances
    note: str = ""

    @property
    def waves(self) -> int:
        return -(-self.blocks // max(1, self.blocks_per_sm * self.gpu.sm_count))

    @property
    def resident_warps(self) -> int:
        """Warps resident per SM: the occupancy limit, or fewer when the work runs out."""
        return min(self.blocks_per_sm, -(-self.blocks // self.gpu.sm_count)) * self.warps_per_block

    @property
    def rows_in_flight(self) -> int:
        """Independent row loads a warp keeps in flight."""
        return self.prefetch + 1 if self.family == "chunk" else self.rows_per_step * (32 // self.group)


def _geometry(v: Variant, wl: WorkloadConfig, bags: int) -> dict[str, Any]:
    """Launch geometry of the lookup kernel as the launchers in embedding_bag.cu set it."""
    warps_per_block = v.block_size // 32
    if v.name == "warp":
        group = warp_group(wl.D)
        per_lane = -(-(wl.D // 4) // group)
        vec = next((x for x in (1, 2, 4, 8) if per_lane <= x), 8)   # float4s per lane; U = 8 / V
        bags_per_block = warps_per_block * (32 // group)
        blocks = -(-bags // bags_per_block)
        return dict(family="warp", chunks=1, group=group, rows_per_step=8 // vec, warps_per_block=warps_per_block,
                    blocks=blocks, rounds=1, bytes_per_load=wl.row_bytes * (32 // group),
                    block_num=1, block_den=bags_per_block)
    chunks = -(-wl.D // v.block[0])
    tasks = bags * chunks
    grid = v.grid or -(-tasks // warps_per_block)
    blocks = min(grid, -(-tasks // warps_per_block))
    rounds = -(-tasks // (grid * warps_per_block))
    return dict(family="chunk", chunks=chunks, group=32, rows_per_step=1, warps_per_block=warps_per_block,
                blocks=blocks, rounds=rounds, bytes_per_load=min(v.block[0], wl.D) * 4,
                block_num=chunks, block_den=warps_per_block)


def _static_table(static: Any) -> dict[tuple[str, str], tuple[int, int]]:
    """(variant, arch) -> (blocks per SM, registers) of each lookup kernel as configured."""
    df = pd.DataFrame([r.to_dict() for r in static]) if isinstance(static, list) else pd.DataFrame(static)
    need = {"variant", "arch", "blocks_per_sm", "registers"}
    if df.empty or not need <= set(df.columns):
        raise ConfigError(f"static rows need columns {', '.join(sorted(need))}")
    if "role" in df.columns:
        df = df[df["role"] == "lookup"]
    if "sweep" in df.columns:
        df = df[~df["sweep"].astype(str).str.lower().isin(["true", "1"])]
    return {(r.variant, r.arch): (int(r.blocks_per_sm), int(r.registers)) for r in df.itertuples()}


def _static_rows(variants: Sequence[str], archs: Sequence[str], wl: WorkloadConfig,
                 params: Mapping[str, dict[str, Any]]) -> dict[tuple[str, str], tuple[int, int]]:
    from .static import static_characterization

    compiled = [v for v in variants if get_variant(v).compiled]
    try:
        rows = static_characterization(compiled, archs, D=wl.D, params=dict(params))
    except ToolchainNotFound as e:
        raise ToolchainNotFound(
            f"{e}\nThe model needs each variant's registers and occupancy, which come from ptxas. Install "
            "a CUDA compiler, or pass static= rows from a run directory's static.csv.") from None
    return _static_table(rows)


def _prepare(workload: WorkloadConfig, datasets: Sequence[str], variants: Sequence[str], gpus: Sequence[GpuSpec],
             params: Mapping[str, dict[str, Any]], static: Any, tables: int, mode: str,
             profiles: dict[str, TraceProfile], progress: Progress | None) -> list[_Point]:
    names = list(dict.fromkeys(["base", *variants]))
    for v in names:
        get_variant(v).check_shape(workload.D)
    archs = list(dict.fromkeys(g.arch for g in gpus))
    table = _static_table(static) if static is not None else _static_rows(names, archs, workload, params)
    points = []
    for ds in datasets:
        if ds not in profiles:
            if progress:
                progress(f"model: reuse distances of {ds}")
            profiles[ds] = TraceProfile(ds, workload, tables)
        prof = profiles[ds]
        per_bag = prof.lookups_per_launch / prof.bags
        for gpu in gpus:
            for name in names:
                v = get_variant(name)
                stand_in = name if v.compiled else "base"
                if (stand_in, gpu.arch) not in table:
                    raise ConfigError(f"no static characterization of {stand_in} for {gpu.arch}")
                blocks_per_sm, registers = table[(stand_in, gpu.arch)]
                model_v = v if v.compiled else get_variant("base")
                p = v.resolve_params(params.get(name), None, gpu=gpu, row_bytes=workload.row_bytes)
                geo = _geometry(model_v, workload, prof.bags)
                rs = sectors_per_row(workload.row_bytes) * SECTOR
                k = min(p.get("K", 0), prof.unique_rows) if v.l2 != "none" else 0
                k_res = min(k, int(gpu.max_persisting_l2_bytes // rs))
                points.append(_Point(
                    variant=name, dataset=ds, gpu=gpu, family=geo["family"], l2=v.l2,
                    prefetch=p.get("P", 0),
                    rows_per_step=geo["rows_per_step"], blocks_per_sm=blocks_per_sm, registers=registers,
                    warps_per_block=geo["warps_per_block"], blocks=geo["blocks"], rounds=geo["rounds"],
                    lookups=prof.lookups_per_launch, bags=prof.bags, per_bag=per_bag, row_bytes=workload.row_bytes,
                    row_sector_bytes=rs, chunks=geo["chunks"], group=geo["group"], bytes_per_load=geo["bytes_per_load"],
                    pinned_rows=k_res, prepass_rows=k if v.l2 == "prefetch" else 0, profile=prof, mode=mode,
                    l1=prof.l1_distances(gpu.sm_count, geo["block_num"], geo["block_den"]),
                    note="" if v.compiled else "PyTorch's kernel, modelled as base (same algorithm and launch)"))
    return points


# ------------------------------------------------------------------ evaluation
def _evaluate(p: _Point, c: ModelConstants) -> dict[str, Any]:
    """The model's equations (module docstring) for one point and one constant set."""
    gpu, prof, rs = p.gpu, p.profile, p.row_sector_bytes
    f = c.l2_capacity_factor
    if p.l2 == "none" or p.pinned_rows == 0:
        h2 = _hit_fraction(prof.distances(p.mode), f * gpu.l2_bytes / rs)
    else:
        k = p.pinned_rows
        hot = prof.pinned(k)
        rest = f * max(gpu.l2_bytes - k * rs, 0.0) / rs
        if p.l2 == "prefetch":
            hot_hit = 1.0
        else:
            kept, unkept = prof.window(k, p.mode)
            hot_hit = kept + (1 - kept) * _hit_fraction(unkept, rest)
        h2 = hot * hot_hit + (1 - hot) * _hit_fraction(prof.distances(p.mode, f"cold:{k}"), rest)
    l1 = _hit_fraction(p.l1, gpu.l1_data_bytes / rs)
    phi1, phi2, phid = l1, max(h2 - l1, 0.0), 1.0 - max(h2, l1)
    lam1, lam2, lamd = c.l1_latency_ns, c.l2_latency_ns, c.dram_latency_ns
    t_row = phi1 * lam1 + phi2 * lam2 + phid * lamd
    N, B = p.lookups, p.bags
    if p.family == "chunk":
        miss = INDEX_BYTES / SECTOR
        t_idx = (1 - miss) * lam1 + miss * lamd
        step = max(t_idx, (t_idx + t_row) / (p.prefetch + 1))
        task_ns = p.per_bag * step
        requests = N * p.chunks
        l1_bytes = 2 * N * p.chunks * WAVEFRONT      # a row-chunk and an index request per iteration
    else:
        U, G = p.rows_per_step, p.group
        a, b = phi1 ** U, (phi1 + phi2) ** U
        step = lam1 * a + lam2 * (b - a) + lamd * (1 - b)
        t_idx = lamd
        L = max(int(round(p.per_bag)), 0)
        tiles = -(-L // G)
        steps = (L // G) * -(-G // U) + -(-(L % G) // U)
        task_ns = tiles * t_idx + steps * step
        requests = N / (32 // G)
        l1_bytes = N * math.ceil(p.row_bytes / WAVEFRONT) * WAVEFRONT + N * INDEX_BYTES
    streams = N * INDEX_BYTES + B * INDEX_BYTES + B * p.row_bytes + N * INDEX_BYTES + B * INDEX_BYTES
    dram = N * phid * rs + streams
    l2_bytes = N * (1 - phi1) * rs + streams
    l2_reads = N * (1 - phi1) * rs + N * INDEX_BYTES + B * INDEX_BYTES
    terms_ns = {
        "latency": p.waves * p.rounds * task_ns,
        "dram": dram / (c.hbm_efficiency * gpu.hbm_GBps),          # GB/s == bytes/ns
        "l2": l2_bytes / gpu.l2_GBps,
        "l1": l1_bytes / (gpu.l1_bytes_per_clk * gpu.sm_count * gpu.boost_clock_MHz / 1000),
    }
    bound = max(terms_ns, key=terms_ns.get)
    time_us = terms_ns[bound] / 1000 + c.launch_overhead_us
    prepass = (p.prepass_rows * rs / (c.hbm_efficiency * gpu.hbm_GBps) / 1000 + c.launch_overhead_us
               if p.prepass_rows else math.nan)
    return {
        "time_us": time_us, "bound": bound,
        "l1_hit_rate_pct": 100 * l1,
        "l2_hit_rate_pct": 100 * (phi2 / (phi2 + phid) if phi2 + phid > 0 else h2),
        "l2_hit_rate_all_pct": 100 * N * phi2 * rs / l2_reads if l2_reads else math.nan,
        "dram_bytes": dram, "l2_bytes": l2_bytes, "l1_bytes": l1_bytes,
        "latency_ns": t_row, "index_latency_ns": t_idx, "step_ns": step, "requests": requests,
        "latency_us": terms_ns["latency"] / 1000, "dram_us": terms_ns["dram"] / 1000,
        "l2_us": terms_ns["l2"] / 1000, "l1_us": terms_ns["l1"] / 1000, "prepass_us": prepass,
    }


COLUMNS = ["variant", "dataset", "arch", "gpu", "mode", "constants", "time_us", "speedup_vs_base", "bound",
           "l1_hit_rate_pct", "l2_hit_rate_pct", "l2_hit_rate_all_pct", "dram_bytes", "l2_bytes", "l1_bytes",
           "blocks_per_sm", "registers", "resident_warps", "loads_in_flight", "bytes_per_load", "parallelism",
           "bytes_in_flight_per_sm", "requests", "latency_ns", "index_latency_ns", "step_ns", "waves",
           "latency_us", "dram_us", "l2_us", "l1_us", "prepass_us", "pinned_rows", "note"]


def _frame(points: Sequence[_Point], consts: Mapping[str, tuple[ModelConstants, str]],
           keep: Sequence[str]) -> pd.DataFrame:
    rows = []
    for p in points:
        c, label = consts[p.gpu.key]
        par = p.resident_warps * p.rows_in_flight
        rows.append({"variant": p.variant, "dataset": p.dataset, "arch": p.gpu.arch, "gpu": p.gpu.key,
                     "mode": p.mode, "constants": label, "blocks_per_sm": p.blocks_per_sm,
                     "registers": p.registers, "resident_warps": p.resident_warps, "loads_in_flight": p.rows_in_flight,
                     "bytes_per_load": p.bytes_per_load, "parallelism": par,
                     "bytes_in_flight_per_sm": par * p.bytes_per_load, "waves": p.waves,
                     "pinned_rows": p.pinned_rows, "note": p.note, **_evaluate(p, c)})
    df = pd.DataFrame(rows)
    base = df[df["variant"] == "base"].set_index(["dataset", "gpu"])["time_us"]
    df["speedup_vs_base"] = [base[(d, g)] / t for d, g, t in zip(df["dataset"], df["gpu"], df["time_us"])]
    return df[df["variant"].isin(keep)][COLUMNS].reset_index(drop=True)


def _gpus(archs_or_gpus: Iterable[str | GpuSpec] | str | GpuSpec) -> list[GpuSpec]:
    items = [archs_or_gpus] if isinstance(archs_or_gpus, (str, GpuSpec)) else list(archs_or_gpus)
    out = [g if isinstance(g, GpuSpec) else gpu_spec(g) for g in items]
    if not out:
        raise ConfigError("no architecture or GPU to predict for")
    return list({g.key: g for g in out}.values())


def _constants_for(gpus: Sequence[GpuSpec], constants: ModelConstants | Mapping[str, ModelConstants] | None
                   ) -> dict[str, tuple[ModelConstants, str]]:
    """Per GPU: given constants ('given'), else a stored calibration ('calibrated'),
    else the spec table's defaults ('default')."""
    out = {}
    for g in gpus:
        if isinstance(constants, ModelConstants):
            out[g.key] = (constants, "given")
        elif isinstance(constants, Mapping) and g.key in constants:
            out[g.key] = (constants[g.key], "given")
        else:
            cal = load_calibration(g)
            out[g.key] = (cal, "calibrated") if cal is not None else (ModelConstants.defaults(g), "default")
    return out


def predict(workload: WorkloadConfig, datasets: Sequence[str], variants: Sequence[str],
            archs_or_gpus: Iterable[str | GpuSpec] | str | GpuSpec, *,
            params: Mapping[str, dict[str, Any]] | None = None,
            constants: ModelConstants | Mapping[str, ModelConstants] | None = None, tables: int = 1,
            mode: str = "steady", static: Any = None, progress: Progress | None = None) -> pd.DataFrame:
    """Predicted time, hit rates, traffic and the intermediate quantities, one row per
    (variant, dataset, GPU).

    `archs_or_gpus`: 'sm_80', 'h200', a driver name or GpuSpec objects. `params`:
    per-variant overrides ({'rpf': {'P': 4}}). `constants`: one ModelConstants for all
    GPUs or a dict by GPU key; by default a stored calibration, else GpuSpec defaults.
    `tables`: how many of each dataset's tables to analyze (generated tables share a
    distribution; a trace file may differ per table). `mode`: 'steady' (tables in
    turn, as in production) or 'cold' (L2 flushed before each launch). `static`: rows
    of a static characterization (e.g. a run's static.csv) instead of compiling.
    """
    workload.validate()
    if mode not in MODES:
        raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    gpus = _gpus(archs_or_gpus)
    points = _prepare(workload, list(datasets), list(variants), gpus, params or {}, static, tables, mode, {},
                      progress)
    return _frame(points, _constants_for(gpus, constants), list(variants))


def predict_experiment(exp: ExperimentConfig, archs: Iterable[str] | None = None,
                       progress: Progress | None = None, *, static: Any = None) -> pd.DataFrame:
    """predict() over an experiment's matrix (its architectures unless `archs` is given;
    `static`: a run's static rows, to skip compiling)."""
    return predict(exp.workload, exp.datasets, exp.variants, list(archs or exp.archs), params=exp.params,
                   static=static, progress=progress)


# ---------------------------------------------------------------- calibration
def calibration_dir() -> Path:
    """$CHARACTERIZE_CALIBRATION, else ~/.config/characterize/calibration."""
    env = os.environ.get("CHARACTERIZE_CALIBRATION")
    return Path(env) if env else Path.home() / ".config" / "characterize" / "calibration"


def calibration_path(gpu: str | GpuSpec) -> Path:
    spec = gpu if isinstance(gpu, GpuSpec) else gpu_spec(gpu)
    return calibration_dir() / f"{spec.key}.json"


def load_calibration(gpu: str | GpuSpec) -> ModelConstants | None:
    """The stored calibrated constants of a GPU, or None when it was never calibrated."""
    path = calibration_path(gpu)
    if not path.is_file():
        return None
    try:
        return ModelConstants.from_dict(json.loads(path.read_text())["constants"])
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path}: not a calibration file ({e}); delete it or run `characterize calibrate`") from None


@dataclass
class Calibration:
    """The outcome of fitting the model to one measured run."""

    gpu: GpuSpec
    constants: ModelConstants
    defaults: ModelConstants
    fitted: tuple[str, ...]
    points: int
    hit_points: int
    gmae_default: float
    gmae_fitted: float
    run: str
    path: Path | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu.key, "gpu_name": self.gpu.name, "constants": self.constants.to_dict(),
                "defaults": self.defaults.to_dict(), "fitted": list(self.fitted), "points": self.points,
                "hit_points": self.hit_points, "gmae_default": self.gmae_default, "gmae_fitted": self.gmae_fitted,
                "run": self.run, "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


def _run_gpu(run: Any, gpu: str | None) -> GpuSpec:
    """The run's GPU as the spec table knows it, with the driver's SM count and L2 size."""
    info = run.meta.get("gpu") or {}
    name = gpu or info.get("name")
    if not name:
        raise RunDirError(f"{run.path}: meta.json names no GPU (a run measured without one?); pass --gpu NAME")
    spec = gpu_spec(name)
    changes = {k: int(info[k]) for k in ("sm_count", "l2_bytes") if info.get(k)}
    return dataclasses.replace(spec, **changes)


def _measured(run: Any) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(variant, dataset, mode, measured_us, ci95_us) of finished points, and measured L2
    hit rates of lookup kernels profiled with --cache-control none."""
    bench = run.bench
    if bench.empty or "per_table_us" not in bench.columns:
        raise RunDirError(f"{run.path}: no timings (points/bench); calibration needs a run measured on a GPU")
    b = bench.copy()
    if "status" in b.columns:
        b = b[b["status"].fillna("ok") == "ok"]
    if "mode" not in b.columns:
        b["mode"] = "steady"
    b = b[b["mode"].isin(MODES) & (b["per_table_us"] > 0)]
    ci = b["ci95_us"] if "ci95_us" in b.columns else np.nan
    times = pd.DataFrame({"variant": b["variant"], "dataset": b["dataset"], "mode": b["mode"],
                          "measured_us": b["per_table_us"].astype(float), "ci95_us": ci})
    k = run.kernels
    hits = pd.DataFrame(columns=["variant", "dataset", "measured_l2_hit_rate_pct"])
    if not k.empty and {"variant", "dataset", "l2_hit_rate_pct"} <= set(k.columns):
        if "cache_control" in k.columns:
            k = k[k["cache_control"].fillna("").astype(str) == "none"]
        name = next((c for c in ("function", "kernel_name") if c in k.columns), None)
        if name:
            k = k[~k[name].fillna("").astype(str).str.contains("l2_pin")]
        k = k.dropna(subset=["l2_hit_rate_pct"])
        if not k.empty:
            hits = (k.groupby(["variant", "dataset"])["l2_hit_rate_pct"].mean().rename("measured_l2_hit_rate_pct")
                    .reset_index())
    return times.reset_index(drop=True), hits


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


def compare_to_measured(pred: pd.DataFrame, run: Any) -> pd.DataFrame:
    """Predicted against measured per (variant, dataset, mode) of the run's GPU: absolute
    and relative errors of time, and L2 hit rates where ncu measured them."""
    times, hits = _measured(run)
    gpu = _run_gpu(run, None).key
    mine = pred[pred["gpu"] == gpu] if "gpu" in pred.columns else pred
    if mine.empty:
        raise ConfigError(f"the predictions hold no rows for the run's GPU ({gpu}); predict for it first")
    on = ["variant", "dataset"] + (["mode"] if "mode" in mine.columns else [])
    cols = on + ["time_us", "l2_hit_rate_all_pct", "constants"]
    df = times.merge(mine[[c for c in cols if c in mine.columns]], on=on, how="inner")
    df = df.rename(columns={"time_us": "predicted_us", "l2_hit_rate_all_pct": "predicted_l2_hit_rate_pct"})
    df["abs_error_us"] = (df["predicted_us"] - df["measured_us"]).abs()
    df["rel_error"] = df["predicted_us"] / df["measured_us"] - 1
    df = df.merge(hits, on=["variant", "dataset"], how="left")
    df.insert(2, "gpu", gpu)
    return df


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def _least_squares(residuals: Callable[[np.ndarray], np.ndarray], x0: np.ndarray, iterations: int = 60
                   ) -> np.ndarray:
    """Levenberg-Marquardt with central-difference Jacobians (a few parameters only)."""
    x, r = x0.copy(), residuals(x0)
    cost, lam, h = float(r @ r), 1e-2, 1e-3
    for _ in range(iterations):
        J = np.empty((r.size, x.size))
        for j in range(x.size):
            e = np.zeros_like(x)
            e[j] = h
            J[:, j] = (residuals(x + e) - residuals(x - e)) / (2 * h)
        A, g = J.T @ J, J.T @ r
        improved = False
        while lam < 1e10:
            step = np.linalg.solve(A + lam * (np.diag(np.diag(A)) + 1e-9 * np.eye(x.size)), -g)
            r_new = residuals(x + step)
            c_new = float(r_new @ r_new)
            if c_new < cost:
                improved = cost - c_new > 1e-12 * max(cost, 1e-30)
                x, r, cost, lam = x + step, r_new, c_new, max(lam / 3, 1e-9)
                break
            lam *= 4
        if not improved:
            break
    return x


def fit_run(run: Any, gpu: str | None = None, *, fit: Sequence[str] = FIT_DEFAULT, prior_weight: float = 0.02,
            hit_weight: float = 1.0, progress: Progress | None = None) -> Calibration:
    """Fit the constants named in `fit` to a measured run (store.load_run() or a path).

    Residuals: log(predicted / measured) of each timed (variant, dataset, mode) point
    (torch is left out: the model describes our kernels, not PyTorch's), plus
    hit_weight x (predicted - measured L2 hit rate) / 100 for lookup kernels ncu
    profiled with --cache-control none (the model's all-reads L2 hit rate; writes are
    not counted), plus prior_weight x log(value / default) per constant so that
    constants the data cannot see stay at their defaults.
    """
    from .store import load_run

    run = load_run(run) if isinstance(run, (str, Path)) else run
    unknown = set(fit) - set(BOUNDS)
    if unknown or not fit:
        raise ConfigError(f"fit names constants from {', '.join(BOUNDS)}; got {', '.join(sorted(unknown)) or 'none'}")
    spec = _run_gpu(run, gpu)
    if not run.meta.get("experiment"):
        raise RunDirError(f"{run.path}: meta.json holds no experiment; the model needs the workload it measured")
    exp = ExperimentConfig.from_dict(run.meta["experiment"])
    times, hits = _measured(run)
    times = times[times["variant"].map(lambda v: get_variant(v).compiled)]
    if times.empty:
        raise RunDirError(f"{run.path}: no finished timings of compiled variants to calibrate on")
    static = run.static
    if static.empty or "arch" not in static.columns or spec.arch not in set(static["arch"]):
        static = None   # compile instead
    profiles: dict[str, TraceProfile] = {}
    index: dict[tuple[str, str, str], _Point] = {}
    for mode, sub in times.groupby("mode"):
        pts = _prepare(exp.workload, sorted(sub["dataset"].unique()), sorted(sub["variant"].unique()), [spec],
                       exp.params, static, 1, mode, profiles, progress)
        index.update({(p.variant, p.dataset, mode): p for p in pts})
    timed = [(index[(r.variant, r.dataset, r.mode)], r.measured_us) for r in times.itertuples()]
    steady = {(p.variant, p.dataset): p for (v, d, m), p in index.items() if m == "steady"}
    hit_pts = [(steady[(r.variant, r.dataset)], r.measured_l2_hit_rate_pct) for r in hits.itertuples()
               if (r.variant, r.dataset) in steady]
    defaults = ModelConstants.defaults(spec)
    names = [n for n in BOUNDS if n in fit]
    lo = np.array([BOUNDS[n][0] for n in names])
    hi = np.array([BOUNDS[n][1] for n in names])
    start = np.clip([getattr(defaults, n) for n in names], lo + 1e-6 * (hi - lo), hi - 1e-6 * (hi - lo))
    x0 = np.log((start - lo) / (hi - start))
    base_values = np.array([getattr(defaults, n) for n in names])

    def constants_at(x: np.ndarray) -> ModelConstants:
        return defaults.replace(**{n: float(v) for n, v in zip(names, lo + (hi - lo) * _sigmoid(x))})

    def residuals(x: np.ndarray) -> np.ndarray:
        c = constants_at(x)
        r = [math.log(_evaluate(p, c)["time_us"] / m) for p, m in timed]
        r += [hit_weight * (_evaluate(p, c)["l2_hit_rate_all_pct"] - m) / 100 for p, m in hit_pts]
        values = lo + (hi - lo) * _sigmoid(x)
        r += list(prior_weight * np.log(values / base_values))
        return np.asarray(r)

    if progress:
        progress(f"fitting {', '.join(names)} to {len(timed)} timings and {len(hit_pts)} L2 hit rates")
    fitted = constants_at(_least_squares(residuals, x0))
    meas = [m for _, m in timed]
    return Calibration(spec, fitted, defaults, tuple(names), len(timed), len(hit_pts),
                       gmae([_evaluate(p, defaults)["time_us"] for p, _ in timed], meas),
                       gmae([_evaluate(p, fitted)["time_us"] for p, _ in timed], meas), str(run.path))


def save_calibration(cal: Calibration) -> Path:
    """Store the fitted constants where load_calibration() finds them."""
    from .store import write_json

    path = calibration_path(cal.gpu)
    write_json(path, cal.to_dict())
    cal.path = path
    return path


def calibrate(run: Any, gpu: str | None = None) -> ModelConstants:
    """Fit the model's constants to a measured run and store them for its GPU; later
    predictions for that GPU use them (column constants = 'calibrated')."""
    cal = fit_run(run, gpu)
    save_calibration(cal)
    return cal.constants


# ------------------------------------------------------------ paper's claims
def paper_claims(workload: WorkloadConfig | None = None, gpu: str | GpuSpec = "sm_80",
                 constants: ModelConstants | None = None, static: Any = None) -> pd.DataFrame:
    """The model against the MICRO 2024 paper's A100 claims (paper config on sm_80 by
    default). A ratio claim agrees when the model's gain (ratio - 1) is within 25% of
    the paper's; an 'up to' claim takes the model's best dataset."""
    wl = workload or WorkloadConfig.paper()
    order = ["one-item", "high", "medium", "low", "random"]
    df = predict(wl, order, ["base", "optmt", "l2p", "combined"], [gpu], constants=constants, static=static)
    t = df.pivot(index="dataset", columns="variant", values="time_us")
    s = df.pivot(index="dataset", columns="variant", values="speedup_vs_base")

    def close(model: float, paper: float) -> bool:
        return abs((model - 1) / (paper - 1) - 1) <= 0.25

    slow = t.loc["random", "base"] / t.loc["one-item", "base"]
    best = {v: (s[v].idxmax(), float(s[v].max())) for v in ("optmt", "combined")}
    hot = ["random", "low", "medium", "high"]
    gains = [float(s.loc[d, "l2p"]) for d in hot]
    monotone = all(b >= a - 1e-9 for a, b in zip(gains, gains[1:]))
    rows = [
        {"claim": "embedding stage slowdown, random vs one-item (base)", "paper": "up to 3.2x",
         "model": f"{slow:.2f}x", "agrees": close(slow, 3.2)},
        {"claim": "OptMT (register cap) speedup over base", "paper": "up to +53%",
         "model": f"+{100 * (best['optmt'][1] - 1):.0f}% ({best['optmt'][0]})", "agrees": close(best["optmt"][1], 1.53)},
        {"claim": "combined (rpf + l2p, capped) speedup over base", "paper": "up to +103%",
         "model": f"+{100 * (best['combined'][1] - 1):.0f}% ({best['combined'][0]})",
         "agrees": close(best["combined"][1], 2.03)},
        {"claim": "L2 pinning helps more on hotter traces", "paper": "gain grows with hotness",
         "model": ", ".join(f"{d} {g:.2f}x" for d, g in zip(hot, gains)), "agrees": monotone},
    ]
    out = pd.DataFrame(rows)
    out["gpu"] = df["gpu"].iloc[0]
    out["constants"] = df["constants"].iloc[0]
    return out
