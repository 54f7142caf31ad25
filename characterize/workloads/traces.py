"""Workload stage, traces: generate a dataset from a preset, or read one from a file
(txt, npy/npz, dlrm .pt), with every out-of-range index named by file, table and position.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np

from characterize.config import WorkloadConfig
from characterize.errors import ConfigError, WorkloadError
from characterize.workloads.presets import Hotness, _rng, parse_dataset, sample_indices


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




def write_trace(ds: Dataset, path: str | Path) -> Path:
    """Write `ds` where `load_trace` reads it back: .txt holds table 0's indices, one
    per line; anything else an .npz in the dlrm_datasets layout (indices, offsets and
    lengths of shape T x batches*B)."""
    path = Path(path)
    if path.suffix == ".txt":
        np.savetxt(path, ds.tables[0].indices, fmt="%d")
        return path
    lengths = np.stack([tr.lengths() for tr in ds.tables])
    offsets = np.concatenate([[0], np.cumsum(lengths.reshape(-1))])
    with path.open("wb") as f:   # a file object keeps numpy from appending .npz to other suffixes
        np.savez(f, indices=np.concatenate([tr.indices for tr in ds.tables]), offsets=offsets, lengths=lengths)
    return path
