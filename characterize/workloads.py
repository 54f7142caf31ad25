"""Workload stage: index traces (generated or loaded) and their locality statistics.

Generated traces draw each table's lookups from a hotness model: a Zipf-Mandelbrot
law over a hot pool of rows, mixed with a uniform background, with the hot rows
scattered over the table by a seeded permutation (never rows 0..K). The named
presets are calibrated to published production-like traces (see PRESETS). Real
traces load from flat text, numpy .npy/.npz and Meta's dlrm_datasets .pt files.
Locality statistics (unique rows, top-K coverage, reuse distances) explain why a
kernel hits or misses in L2, and feed the performance model.
"""

from __future__ import annotations

import hashlib
import re
import zipfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from .config import WorkloadConfig
from .errors import ConfigError, WorkloadError


# ---------------------------------------------------------------- hotness model
@dataclass(frozen=True)
class Hotness:
    """How one table's lookups are distributed over its E rows.

    A lookup is uniform over all rows with probability `background`; otherwise it
    takes rank r in 1..pool*E with probability proportional to (r + q*E)^-alpha.
    Ranks map to rows through a per-table seeded permutation.
    """

    name: str
    alpha: float = 0.0       # Zipf exponent of the hot part
    q: float = 0.0           # Mandelbrot rank offset, as a fraction of E (flattens the head)
    pool: float = 1.0        # hot pool size as a fraction of E
    background: float = 0.0  # fraction of lookups drawn uniformly over all E rows
    one_item: bool = False   # every lookup hits one row
    description: str = ""

    def probabilities(self, E: int) -> np.ndarray:
        """Probability of each rank 1..pool*E (before the background mix)."""
        n = max(1, int(round(self.pool * E)))
        ranks = np.arange(1, n + 1, dtype=np.float64)
        w = (ranks + self.q * E) ** (-self.alpha)
        return w / w.sum()


PRESETS: dict[str, Hotness] = {h.name: h for h in (
    Hotness("one-item", one_item=True,
            description="every lookup reads the same (randomly chosen) row: the best case for any cache"),
    Hotness("high", alpha=0.9, pool=0.04, background=0.01,
            description="Zipf 0.9 over a 4% hot pool + 1% uniform: the working set fits a 40 MB L2"),
    Hotness("medium", alpha=0.65, pool=0.19, background=0.045,
            description="Zipf 0.65 over a 19% hot pool + 4.5% uniform; calibrated to a production-like "
                        "trace: 430K lookups over 500K rows -> 102K unique, top 60K rows cover 88%"),
    Hotness("low", alpha=0.55, q=0.0006,
            description="Zipf-Mandelbrot 0.55 (offset 0.06% of E) over all rows; calibrated to a "
                        "production-like trace: 380K lookups over 500K rows -> 231K unique, top 60K cover 49%"),
    Hotness("random", background=1.0, description="uniform over all rows: no reuse beyond chance"),
)}

#: published statistics the presets are calibrated against: (lookups, rows, unique, top-60K coverage)
CALIBRATION = {"medium": (430_000, 500_000, 102_000, 0.88), "low": (380_000, 500_000, 231_000, 0.49)}


def parse_dataset(spec: str) -> Hotness | Path:
    """A preset name, 'zipf:ALPHA', or a trace file path (optionally 'file:PATH')."""
    text = spec.strip()
    if text in PRESETS:
        return PRESETS[text]
    m = re.fullmatch(r"zipf:(\d+(?:\.\d+)?)", text)
    if m:
        alpha = float(m.group(1))
        if not 0 < alpha <= 5:
            raise ConfigError(f"zipf exponent must be in (0, 5], got {alpha}")
        return Hotness(text, alpha=alpha, description=f"Zipf {alpha:g} over all rows")
    path = Path(text.removeprefix("file:"))
    if text.startswith("file:") or path.suffix or path.exists():
        return path
    raise ConfigError(f"unknown dataset {spec!r}: use a preset ({', '.join(PRESETS)}), zipf:ALPHA or a trace file")


def dataset_name(spec: str) -> str:
    """A short name for reports and run directories."""
    parsed = parse_dataset(spec)
    return parsed.name if isinstance(parsed, Hotness) else parsed.stem


def _rng(seed: int, table: int, name: str) -> np.random.Generator:
    salt = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")
    return np.random.default_rng(np.random.SeedSequence([seed, table, salt]))


@lru_cache(maxsize=16)
def _cdf(h: Hotness, E: int) -> np.ndarray:
    return np.cumsum(h.probabilities(E))


def sample_indices(h: Hotness, E: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """n lookups into a table of E rows (int64), deterministic for a given rng."""
    if h.one_item:
        return np.full(n, int(rng.integers(E)), dtype=np.int64)
    perm = rng.permutation(E)
    out = np.empty(n, dtype=np.int64)
    uniform = rng.random(n) < h.background if 0 < h.background < 1 else np.full(n, h.background >= 1)
    k = int(uniform.sum())
    out[uniform] = rng.integers(0, E, size=k)
    if k < n:
        cdf = _cdf(h, E)
        ranks = np.searchsorted(cdf, rng.random(n - k) * cdf[-1], side="right")
        out[~uniform] = perm[np.minimum(ranks, len(cdf) - 1)]
    return out


# ------------------------------------------------------------------- traces
@dataclass
class TableTrace:
    """One table's lookups over several batches: batch b is indices[starts[b]:starts[b+1]]
    with bag offsets offsets[b] (relative to the batch's first index, starting at 0)."""

    indices: np.ndarray   # int64
    offsets: np.ndarray   # int64 [batches, B]
    starts: np.ndarray    # int64 [batches + 1]

    @property
    def batches(self) -> int:
        return len(self.starts) - 1

    def batch(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        return self.indices[self.starts[b]:self.starts[b + 1]], self.offsets[b]

    def lengths(self) -> np.ndarray:
        """Bag lengths of every batch, in order (flattened [batches * B])."""
        sizes = (self.starts[1:] - self.starts[:-1])[:, None]
        ends = np.concatenate([self.offsets[:, 1:], sizes], axis=1)
        return (ends - self.offsets).reshape(-1)


@dataclass
class Dataset:
    """Traces for T tables of E rows, with where they came from."""

    name: str
    source: str
    rows: int
    tables: list[TableTrace]
    description: str = ""
    meta: dict = field(default_factory=dict)


def _bags_from_lengths(lengths: np.ndarray, batches: int, B: int) -> tuple[np.ndarray, np.ndarray]:
    """offsets [batches, B] and batch starts from bag lengths [batches*B]."""
    lengths = lengths.reshape(batches, B)
    per_batch = lengths.sum(axis=1)
    starts = np.concatenate([[0], np.cumsum(per_batch)]).astype(np.int64)
    offsets = np.zeros((batches, B), dtype=np.int64)
    offsets[:, 1:] = np.cumsum(lengths[:, :-1], axis=1)
    return offsets, starts


def generate(spec: str | Hotness, config: WorkloadConfig, tables: Iterable[int] | None = None) -> Dataset:
    """Generate a preset or zipf:ALPHA dataset for `config` (all T tables by default)."""
    h = parse_dataset(spec) if isinstance(spec, str) else spec
    if not isinstance(h, Hotness):
        raise ConfigError(f"{spec} is a file; use load_trace()")
    config.L.validate()
    traces = []
    for t in (range(config.T) if tables is None else tables):
        rng = _rng(config.seed, t, h.name)
        lengths = config.L.sample(rng, config.B * config.batches)
        offsets, starts = _bags_from_lengths(lengths, config.batches, config.B)
        traces.append(TableTrace(sample_indices(h, config.E, int(starts[-1]), rng), offsets, starts))
    return Dataset(h.name, h.name, config.E, traces, h.description)


def generate_stream(spec: str | Hotness, E: int, n: int, seed: int = 0, table: int = 0) -> np.ndarray:
    """Just n lookups of one table (for statistics at a chosen trace length)."""
    h = parse_dataset(spec) if isinstance(spec, str) else spec
    if not isinstance(h, Hotness):
        raise ConfigError(f"{spec} is a file, not a generator")
    return sample_indices(h, E, n, _rng(seed, table, h.name))


# ------------------------------------------------------------------- loaders
def _check_range(values: np.ndarray, rows: int | None, path: Path, table: int, base: int = 0) -> int:
    """Rows of the table (given or inferred); out-of-range indices -> WorkloadError."""
    if values.size == 0:
        raise WorkloadError(f"{path}: table {table} has no indices")
    neg = np.flatnonzero(values < 0)
    if neg.size:
        p = int(neg[0])
        raise WorkloadError(f"{path}: table {table}, position {base + p}: negative index {int(values[p])}")
    if rows is None:
        return int(values.max()) + 1
    big = np.flatnonzero(values >= rows)
    if big.size:
        p = int(big[0])
        raise WorkloadError(f"{path}: table {table}, position {base + p}: index {int(values[p])} is out of "
                            f"range for {rows} rows (pass --rows to set the table size)")
    return rows


def _as_int_array(a: object, path: Path, what: str) -> np.ndarray:
    arr = a.numpy() if hasattr(a, "numpy") else np.asarray(a)
    if arr.dtype.kind not in "iu":
        raise WorkloadError(f"{path}: {what} must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _read_text(path: Path) -> np.ndarray:
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise WorkloadError(f"{path}: not a text trace (expected one index per line)") from None
    values = []
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        try:
            values.append(int(s))
        except ValueError:
            raise WorkloadError(f"{path}, line {n}: {s[:40]!r} is not an integer index") from None
    if not values:
        raise WorkloadError(f"{path}: no indices in the file")
    return np.asarray(values, dtype=np.int64)


def _streams_to_dataset(streams: list[np.ndarray], path: Path, config: WorkloadConfig, rows: int | None,
                        tables: int) -> Dataset:
    """Cut flat index streams into batches of B bags, reading circularly (the paper's way):
    table t continues where table t-1 stopped when one stream serves every table."""
    inferred = [_check_range(s, rows, path, i) for i, s in enumerate(streams)]
    E = rows or max(inferred)
    rng = _rng(config.seed, 0, path.name)
    out = []
    cursor = 0
    for t in range(tables):
        stream = streams[t % len(streams)]
        if len(streams) > 1:
            cursor = 0
        lengths = config.L.sample(rng, config.B * config.batches)
        offsets, starts = _bags_from_lengths(lengths, config.batches, config.B)
        n = int(starts[-1])
        take = (cursor + np.arange(n)) % len(stream)
        out.append(TableTrace(stream[take], offsets, starts))
        cursor = (cursor + n) % len(stream)
    return Dataset(path.stem, str(path), E, out, f"trace file {path.name}, read circularly",
                   {"stream_lengths": [int(len(s)) for s in streams]})


def _bagged_to_dataset(per_table: list[tuple[np.ndarray, np.ndarray, int]], path: Path, config: WorkloadConfig,
                       rows: int | None) -> Dataset:
    """Tables given as bags (indices, offsets with a final end, first file position):
    batches of B consecutive bags."""
    out = []
    E = rows
    inferred = []
    for t, (idx, offs, base) in enumerate(per_table):
        inferred.append(_check_range(idx, rows, path, t, base))
        lengths = np.diff(offs)
        nbags = len(lengths)
        if nbags == 0:
            raise WorkloadError(f"{path}: table {t} has no bags")
        batches = max(1, min(config.batches, nbags // config.B)) if nbags >= config.B else 1
        B = min(config.B, nbags)
        picked = lengths[: batches * B]
        offsets, starts = _bags_from_lengths(picked, batches, B)
        out.append(TableTrace(idx[: int(starts[-1])], offsets, starts))
    E = E or max(inferred)
    return Dataset(path.stem, str(path), E, out, f"bagged trace file {path.name}",
                   {"tables_in_file": len(per_table)})


def _split_bagged(indices: np.ndarray, offsets: np.ndarray, tables: int,
                  path: Path) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """dlrm_datasets layout: offsets over T*B bags (+ a final end) of concatenated tables.
    Returns per table (its indices, its offsets from 0, its first position in the file)."""
    if offsets.ndim != 1 or len(offsets) < 2:
        raise WorkloadError(f"{path}: offsets must be 1-D with at least 2 entries")
    if np.any(np.diff(offsets) < 0):
        p = int(np.flatnonzero(np.diff(offsets) < 0)[0])
        raise WorkloadError(f"{path}: offsets decrease at position {p + 1}")
    if offsets[-1] > len(indices) or offsets[0] < 0:
        raise WorkloadError(f"{path}: offsets reach {int(offsets[-1])} but there are only {len(indices)} "
                            "indices (truncated file?)")
    nbags = len(offsets) - 1
    if nbags % tables:
        raise WorkloadError(f"{path}: {nbags} bags do not split into {tables} tables")
    B = nbags // tables
    out = []
    for t in range(tables):
        offs = offsets[t * B: (t + 1) * B + 1]
        out.append((indices[offs[0]:offs[-1]], offs - offs[0], int(offs[0])))
    return out


def load_trace(path: str | Path, config: WorkloadConfig | None = None, rows: int | None = None,
               tables: int | None = None) -> Dataset:
    """Load a trace file: .txt (one index per line), .npy (1-D stream or 2-D [tables, n]),
    .npz (indices+offsets[+lengths], or one array per table), .pt (dlrm_datasets:
    indices, offsets, lengths). `rows` is E (inferred from the largest index if None)."""
    p = Path(path)
    config = config or WorkloadConfig()
    if not p.is_file():
        raise WorkloadError(f"{p}: no such trace file")
    T = tables or config.T
    suffix = p.suffix.lower()
    try:
        if suffix == ".npy":
            arr = _as_int_array(np.load(p, allow_pickle=False), p, "the array")
            streams = [arr] if arr.ndim == 1 else list(arr)
            return _streams_to_dataset(streams, p, config, rows, T)
        if suffix == ".npz":
            with np.load(p, allow_pickle=False) as z:
                keys = list(z.keys())
                if "indices" in keys and ("offsets" in keys or "lengths" in keys):
                    idx = _as_int_array(z["indices"], p, "indices")
                    if "offsets" in keys:
                        offs = _as_int_array(z["offsets"], p, "offsets")
                    else:
                        lens = _as_int_array(z["lengths"], p, "lengths").reshape(-1)
                        offs = np.concatenate([[0], np.cumsum(lens)])
                    if offs[-1] != len(idx) and len(offs) > 0 and offs[-1] < len(idx):
                        offs = np.concatenate([offs, [len(idx)]])
                    ntab = len(z["lengths"]) if "lengths" in keys and z["lengths"].ndim == 2 else 1
                    parts = _split_bagged(idx, offs, ntab, p)
                    return _bagged_to_dataset(parts[:T], p, config, rows)
                streams = [_as_int_array(z[k], p, k).reshape(-1) for k in sorted(keys)]
                if not streams:
                    raise WorkloadError(f"{p}: the archive holds no arrays")
                return _streams_to_dataset(streams, p, config, rows, T)
        if suffix in (".pt", ".pth"):
            import torch

            try:
                obj = torch.load(p, map_location="cpu", weights_only=True)
            except Exception as e:
                raise WorkloadError(f"{p}: cannot read as a torch file ({type(e).__name__}: {e})") from None
            if isinstance(obj, dict):
                obj = tuple(obj.get(k) for k in ("indices", "offsets", "lengths"))
            if not isinstance(obj, (tuple, list)) or len(obj) < 2 or obj[0] is None or obj[1] is None:
                raise WorkloadError(f"{p}: expected (indices, offsets, lengths) tensors as in Meta's dlrm_datasets")
            idx = _as_int_array(obj[0], p, "indices").reshape(-1)
            offs = _as_int_array(obj[1], p, "offsets").reshape(-1)
            ntab = 1
            if len(obj) > 2 and obj[2] is not None and getattr(obj[2], "ndim", 1) == 2:
                ntab = int(obj[2].shape[0])
            parts = _split_bagged(idx, offs, ntab, p)
            if T > len(parts):
                T = len(parts)
            return _bagged_to_dataset(parts[:T], p, config, rows)
        return _streams_to_dataset([_read_text(p)], p, config, rows, T)
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
        raise WorkloadError(f"{p}: cannot read the trace ({type(e).__name__}: {e}); is the file truncated?") from None


def load_dataset(spec: str, config: WorkloadConfig, tables: Iterable[int] | None = None) -> Dataset:
    """A preset/zipf dataset generated for `config`, or a trace file read for it."""
    parsed = parse_dataset(spec)
    if isinstance(parsed, Hotness):
        return generate(parsed, config, tables)
    ds = load_trace(parsed, config, rows=config.E)
    if tables is not None:
        ds.tables = [ds.tables[t % len(ds.tables)] for t in tables]
    return ds


# ----------------------------------------------------------------- statistics
def _reuse_distances_py(idx: np.ndarray, rows: int) -> np.ndarray:
    n = len(idx)
    last = np.full(rows, -1, dtype=np.int64)
    tree = np.zeros(n + 1, dtype=np.int64)
    out = np.empty(n, dtype=np.int64)
    for t in range(n):
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
    return out


@lru_cache(maxsize=1)
def _reuse_kernel():
    try:
        import numba
    except ImportError:  # pragma: no cover - numba is a dependency
        return _reuse_distances_py
    return numba.njit(cache=True, nogil=True)(_reuse_distances_py)


def reuse_distances(indices: np.ndarray) -> np.ndarray:
    """For each lookup, the number of distinct other rows read since the previous read of
    the same row (-1 on a first read). An LRU cache of C rows hits iff distance < C.
    O(N log N) with a Fenwick tree over 'last use' markers."""
    idx = np.ascontiguousarray(indices, dtype=np.int64)
    if idx.size == 0:
        return np.empty(0, dtype=np.int64)
    if idx.max() >= 4 * idx.size + 1024:  # sparse ids: compact them first
        _, idx = np.unique(idx, return_inverse=True)
        idx = idx.astype(np.int64)
    return _reuse_kernel()(idx, int(idx.max()) + 1)


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


def top_k_coverage(indices: np.ndarray, ks: Sequence[int]) -> dict[int, float]:
    """Fraction of lookups that go to the K most frequent rows, for each K."""
    _, counts = np.unique(indices, return_counts=True)
    counts = np.sort(counts)[::-1]
    csum = np.cumsum(counts)
    n = len(indices)
    return {int(k): float(csum[min(k, len(csum)) - 1] / n) if k > 0 else 0.0 for k in ks}


def locality_stats(indices: np.ndarray, rows: int | None = None, row_bytes: int = 512,
                   top_k: Sequence[int] = (60_000,), distances: np.ndarray | None = None) -> LocalityStats:
    """Statistics of one table's lookups (pass precomputed `distances` to reuse them)."""
    idx = np.asarray(indices, dtype=np.int64)
    if idx.size == 0:
        raise WorkloadError("no lookups to analyze")
    d = reuse_distances(idx) if distances is None else distances
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
        top_k_coverage=top_k_coverage(idx, sorted(set(int(k) for k in top_k))),
        reuse_distance_quantiles=quant, cold_fraction=unique / n, bytes_touched=unique * row_bytes,
        reuse_histogram=tuple(hist))


def lru_hit_rate(distances: np.ndarray, capacity_rows: float) -> float:
    """Hit rate of a fully associative LRU cache holding `capacity_rows` rows."""
    if distances.size == 0:
        return 0.0
    return float(np.count_nonzero((distances >= 0) & (distances < capacity_rows)) / distances.size)
