"""Workloads stage, traces: generate a dataset from a preset, or read one from a file
(txt, npy/npz, dlrm .pt), with every out-of-range index named by file, table and position.

Memory is estimated before anything is generated or loaded and refused beyond the
host-memory budget (memory.check_memory). Flat streams (.txt, .npy) are read in
chunks: the whole file is range-checked and its largest index found, but only the
lookups the workload takes are kept, so a trace larger than RAM still works.
"""

from __future__ import annotations

import os
import re
import stat
import warnings
import zipfile
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from characterize.config import WorkloadConfig
from characterize.errors import CharacterizeError, ConfigError, MemoryBudgetError, WorkloadError, escape_text
from characterize.files import atomic_output, file_kind
from characterize.memory import check_memory
from characterize.units import format_bytes
from characterize.workloads.presets import Hotness, parse_dataset, sample_indices, table_rng


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


def sampling_bytes(h: Hotness, E: int, n: int) -> int:
    """Peak bytes of `sample_indices` for n lookups over E rows: the output, the sampler's
    temporaries (uniform draws, masks, ranks: ~5 arrays of n) and the row permutation and
    rank CDF (pool x E, with its temporaries)."""
    if h.one_item:
        return 8 * n
    return 42 * n + 8 * E + 32 * int(h.pool * E)


def generation_bytes(h: Hotness, config: WorkloadConfig, tables: int) -> int:
    """Peak bytes of generating `tables` tables: every table's indices and bag offsets
    kept, plus one table's sampling temporaries."""
    n = config.B * config.batches * config.L.max
    return tables * (8 * n + 32 * config.B * config.batches) + sampling_bytes(h, config.E, n)


def generate(spec: str | Hotness, config: WorkloadConfig, tables: Iterable[int] | None = None) -> Dataset:
    """Generate a preset or zipf:ALPHA dataset for `config` (all T tables by default)."""
    h = parse_dataset(spec) if isinstance(spec, str) else spec
    if not isinstance(h, Hotness):
        raise ConfigError(f"{spec} is a file; use load_trace()")
    config.L.validate()
    which = list(range(config.T) if tables is None else tables)
    n = config.B * config.batches * config.L.max
    check_memory(generation_bytes(h, config, len(which)),
                 f"generating {h.name} for {len(which)} table(s) ({n:,} lookups each over E={config.E:,} rows)",
                 "lower B, L, batches or E")
    traces = []
    for t in which:
        rng = table_rng(config.seed, t, h.name)
        lengths = config.L.sample(rng, config.B * config.batches)
        offsets, starts = _bags_from_lengths(lengths, config.batches, config.B)
        traces.append(TableTrace(sample_indices(h, config.E, int(starts[-1]), rng), offsets, starts))
    return Dataset(h.name, h.name, config.E, traces, h.description)


def generate_stream(spec: str | Hotness, E: int, n: int, seed: int = 0, table: int = 0) -> np.ndarray:
    """Just n lookups of one table (for statistics at a chosen trace length)."""
    h = parse_dataset(spec) if isinstance(spec, str) else spec
    if not isinstance(h, Hotness):
        raise ConfigError(f"{spec} is a file, not a generator")
    check_memory(sampling_bytes(h, E, n), f"generating {n:,} {h.name} lookups over E={E:,} rows",
                 "ask for fewer lookups or a smaller E")
    return sample_indices(h, E, n, table_rng(seed, table, h.name))


# ------------------------------------------------------------------- loaders
INT64_MAX = np.iinfo(np.int64).max
#: bytes of a trace file read at once when streaming (.txt, .npy)
CHUNK_BYTES = 16 * 2**20


def _check_range(values: np.ndarray, rows: int | None, path: Path, table: int, base: int = 0) -> int:
    """Rows of the table (given or inferred); out-of-range indices -> WorkloadError."""
    if values.size == 0:
        raise WorkloadError(f"{path}: table {table} has no indices")
    _check_chunk(values, rows, path, table, base)
    return rows if rows is not None else int(values.max()) + 1


def _check_chunk(values: np.ndarray, rows: int | None, path: Path, table: int, base: int) -> None:
    """Negative or (with `rows`) out-of-range indices of one chunk -> WorkloadError with the position."""
    neg = np.flatnonzero(values < 0)
    if neg.size:
        p = int(neg[0])
        raise WorkloadError(f"{path}: table {table}, position {base + p}: negative index {int(values[p])}; "
                            "row indices start at 0")
    if rows is not None:
        big = np.flatnonzero(values >= rows)
        if big.size:
            p = int(big[0])
            raise WorkloadError(f"{path}: table {table}, position {base + p}: index {int(values[p])} is out of "
                                f"range for {rows} rows (pass --rows to set the table size)")


def _as_int_array(a: object, path: Path, what: str, base: int = 0, table: int = 0) -> np.ndarray:
    """int64 view or copy of an integer array; unsigned values beyond int64 are refused by
    position instead of wrapping around to negative numbers."""
    arr = a.numpy() if hasattr(a, "numpy") else np.asarray(a)
    if arr.dtype.kind not in "iu":
        raise WorkloadError(f"{path}: {what} must be integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.dtype.itemsize == 8 and arr.size:
        flat = arr.reshape(-1)
        over = np.flatnonzero(flat > INT64_MAX)
        if over.size:
            p = int(over[0])
            raise WorkloadError(f"{path}: table {table}, position {base + p}: {what} value {int(flat[p])} does not "
                                "fit 64-bit signed indexing (larger than 2^63-1); check the array's dtype")
    return arr.astype(np.int64, copy=False)


@dataclass
class _Scan:
    """One pass over an index stream: its length, its largest index, its first `keep` values."""

    length: int
    largest: int
    head: np.ndarray


def scan_chunks(chunks: Iterator[np.ndarray], keep: int, rows: int | None, path: Path, table: int) -> _Scan:
    """Range-check every chunk of a stream and keep only its first `keep` values, so the
    memory held is `keep` values plus one chunk whatever the file's size."""
    kept: list[np.ndarray] = []
    have = 0
    largest = -1
    pos = 0
    for chunk in chunks:
        if chunk.size == 0:
            continue
        _check_chunk(chunk, rows, path, table, pos)
        largest = max(largest, int(chunk.max()))
        if have < keep:
            part = chunk if len(chunk) <= keep - have else chunk[: keep - have].copy()
            kept.append(part)
            have += len(part)
        pos += len(chunk)
    if pos == 0:
        raise WorkloadError(f"{path}: table {table} has no indices")
    head = np.concatenate(kept) if kept else np.empty(0, dtype=np.int64)
    return _Scan(pos, largest, head)


def _parse_lines(block: bytes, first_line: int, path: Path) -> np.ndarray:
    """The careful parser: one integer per line, blank lines and # comments skipped,
    every problem named by its line."""
    values: list[int] = []
    for n, raw in enumerate(block.split(b"\n"), first_line):
        s = raw.strip()
        if not s or s.startswith(b"#"):
            continue
        try:
            v = int(s)
        except ValueError:
            text = s[:40].decode("utf-8", "replace")
            raise WorkloadError(f"{path}, line {n}: {text!r} is not an integer index; a text trace holds one "
                                "row index per line") from None
        if not -INT64_MAX - 1 <= v <= INT64_MAX:
            raise WorkloadError(f"{path}, line {n}: index {s[:40].decode()} does not fit 64 bits; "
                                "row indices must be below 2^63")
        values.append(v)
    return np.asarray(values, dtype=np.int64)


def _parse_block(block: bytes, first_line: int, path: Path) -> np.ndarray:
    """Indices of a block of whole lines. A fast C parser takes blocks that are plainly
    one integer per line; anything else (comments, junk, a value numpy would clamp,
    two values on a line) goes through the careful parser for an exact message."""
    if b"#" not in block:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                values = np.fromstring(block, dtype=np.int64, sep=" ")
        except (ValueError, DeprecationWarning):
            values = None
        lines = block.count(b"\n")
        if values is not None and len(values) == lines and not (
                values.size and (values.max() == INT64_MAX or values.min() == -INT64_MAX - 1)):
            return values
    return _parse_lines(block, first_line, path)


def _text_chunks(path: Path) -> Iterator[np.ndarray]:
    """A text trace, CHUNK_BYTES at a time, cut at line ends."""
    line = 1
    rest = b""
    with open(path, "rb") as f:
        while True:
            data = f.read(CHUNK_BYTES)
            if not data:
                break
            data = rest + data
            cut = data.rfind(b"\n")
            if cut < 0:
                if len(data) > CHUNK_BYTES:
                    raise WorkloadError(f"{path}, line {line}: longer than {format_bytes(CHUNK_BYTES)} without a "
                                        "line break; not a text trace (one row index per line)")
                rest = data
                continue
            block, rest = data[: cut + 1], data[cut + 1:]
            yield _parse_block(block, line, path)
            line += block.count(b"\n")
    if rest.strip():
        yield _parse_block(rest + b"\n", line, path)


def _npy_header(f, path: Path) -> tuple[tuple[int, ...], np.dtype, bool]:
    """(shape, dtype, fortran_order) of an open .npy file, checked against its size."""
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    except Exception as e:  # noqa: BLE001 - numpy raises assorted types on a damaged header
        raise WorkloadError(f"{path}: not a readable .npy array ({type(e).__name__}: {str(e).splitlines()[0]}); "
                            "is the file truncated or not a numpy file?") from None
    if dtype.kind not in "iu" or dtype.hasobject:
        raise WorkloadError(f"{path}: the array must hold integers, got dtype {dtype}")
    if len(shape) not in (1, 2):
        raise WorkloadError(f"{path}: a .npy trace is 1-D (one stream) or 2-D (one row per table); got shape "
                            f"{shape}")
    need = int(np.prod(shape, dtype=object)) * dtype.itemsize
    have = os.fstat(f.fileno()).st_size - f.tell()
    if have < need:
        raise WorkloadError(f"{path}: truncated: its header promises shape {shape} ({format_bytes(need)}) but "
                            f"only {format_bytes(have)} of data follow")
    return tuple(int(x) for x in shape), dtype, bool(fortran)


def _npy_chunks(path: Path, offset: int, count: int, dtype: np.dtype, table: int) -> Iterator[np.ndarray]:
    """`count` values of `dtype` from byte `offset`, as int64 chunks."""
    per = max(1, CHUNK_BYTES // dtype.itemsize)
    done = 0
    with open(path, "rb") as f:
        f.seek(offset)
        while done < count:
            part = np.fromfile(f, dtype=dtype, count=min(per, count - done))
            if part.size == 0:
                raise WorkloadError(f"{path}: ends after {done} of {count} values of table {table}; truncated?")
            yield _as_int_array(part, path, "index", base=done, table=table)
            done += part.size


def _npy_streams(path: Path) -> list[tuple[int, Callable[[], Iterator[np.ndarray]]]]:
    """(length, chunk reader) for each stream of a .npy trace, without loading it."""
    with open(path, "rb") as f:
        shape, dtype, fortran = _npy_header(f, path)
        data = f.tell()
    if len(shape) == 1:
        return [(shape[0], lambda: _npy_chunks(path, data, shape[0], dtype, 0))]
    rows, n = shape
    if fortran:  # column-major: a table's row is strided; read the array whole
        arr = np.load(path, allow_pickle=False, mmap_mode="r")
        return [(n, lambda r=r: iter([_as_int_array(np.array(arr[r]), path, "index", table=r)]))
                for r in range(rows)]
    return [(n, lambda r=r: _npy_chunks(path, data + r * n * dtype.itemsize, n, dtype, r)) for r in range(rows)]


def file_streams(p: Path) -> list[tuple[int | None, Callable[[], Iterator[np.ndarray]]]]:
    """(length or None, chunk reader) for each index stream of a .npy or text trace file."""
    if p.suffix.lower() == ".npy":
        return list(_npy_streams(p))
    return [(None, lambda: _text_chunks(p))]


def _streams_to_dataset(streams: list[tuple[int | None, Callable[[], Iterator[np.ndarray]]]], path: Path,
                        config: WorkloadConfig, rows: int | None, tables: int) -> Dataset:
    """Cut flat index streams into batches of B bags, reading circularly (the paper's way):
    table t continues where table t-1 stopped when one stream serves every table.
    Every stream is read once in chunks and range-checked whole, but only the lookups
    the tables take are kept (bag lengths are drawn first, so that number is known)."""
    rng = table_rng(config.seed, 0, path.name)
    lengths = [config.L.sample(rng, config.B * config.batches) for _ in range(tables)]
    sizes = [int(x.sum()) for x in lengths]
    if len(streams) == 1:
        keep = [sum(sizes)]
    else:
        keep = [max([sizes[t] for t in range(tables) if t % len(streams) == i], default=0)
                for i in range(len(streams))]
    check_memory(16 * sum(sizes) + 8 * sum(keep),
                 f"reading {sum(sizes):,} lookups of {path.name} for {tables} table(s)", "lower B, L, batches or T")
    scans = [scan_chunks(read(), k, rows, path, i) for i, ((_, read), k) in enumerate(zip(streams, keep))]
    E = rows or max(s.largest for s in scans) + 1
    out = []
    cursor = 0
    for t in range(tables):
        scan = scans[t % len(scans)]
        if len(scans) > 1:
            cursor = 0
        offsets, starts = _bags_from_lengths(lengths[t], config.batches, config.B)
        n = int(starts[-1])
        # only positions below `keep` are ever taken, unless the whole stream was kept
        take = (cursor + np.arange(n)) % scan.length
        out.append(TableTrace(scan.head[take], offsets, starts))
        cursor = (cursor + n) % scan.length
    return Dataset(path.stem, str(path), E, out, f"trace file {path.name}, read circularly",
                   {"stream_lengths": [s.length for s in scans]})


def _bagged_to_dataset(per_table: list[tuple[np.ndarray, np.ndarray, int]], path: Path, config: WorkloadConfig,
                       rows: int | None) -> Dataset:
    """Tables given as bags (indices, offsets with a final end, first file position):
    batches of B consecutive bags."""
    out = []
    E = rows
    inferred = []
    for t, (idx, offs, base) in enumerate(per_table):   # every index checked first, then the bags
        inferred.append(_check_range(idx, rows, path, t, base))
    for t, (idx, offs, base) in enumerate(per_table):
        lengths = np.diff(offs)
        nbags = len(lengths)
        if nbags == 0:
            raise WorkloadError(f"{path}: table {t} has no bags")
        if nbags < config.B:   # a smaller batch would measure another workload than the one asked for
            raise WorkloadError(f"{path}: table {t} holds {nbags:,} bags, fewer than one batch of B={config.B:,}; "
                                f"set B to at most {nbags:,} (--B, workload.B) or use a trace with more bags")
        batches = max(1, min(config.batches, nbags // config.B))
        picked = lengths[: batches * config.B]
        offsets, starts = _bags_from_lengths(picked, batches, config.B)
        out.append(TableTrace(idx[: int(starts[-1])], offsets, starts))
    E = E or max(inferred)
    held = min(t.batches for t in out)
    fewer = f"; it holds {held} batch(es) of B={config.B:,}, fewer than the {config.batches} asked for" \
        if held < config.batches else ""
    return Dataset(path.stem, str(path), E, out, f"bagged trace file {path.name}{fewer}",
                   {"tables_in_file": len(per_table), "batches_in_file": held})


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
    if tables < 1:
        raise WorkloadError(f"{path}: lengths say {tables} tables")
    nbags = len(offsets) - 1
    if nbags % tables:
        raise WorkloadError(f"{path}: {nbags} bags do not split into {tables} tables")
    B = nbags // tables
    out = []
    for t in range(tables):
        offs = offsets[t * B: (t + 1) * B + 1]
        out.append((indices[offs[0]:offs[-1]], offs - offs[0], int(offs[0])))
    return out


def _npz_bytes(p: Path) -> int:
    """Bytes the arrays of an .npz need once loaded, from the member headers (nothing is
    decompressed); a member whose header promises more than it holds is refused."""
    total = 0
    with zipfile.ZipFile(p) as z:
        for info in z.infolist():
            if not info.filename.endswith(".npy"):   # numpy would read it whole as bytes, however large
                raise WorkloadError(f"{p}: member {escape_text(info.filename)!r} is not a .npy array (it would "
                                    f"inflate to {format_bytes(info.file_size)}); a trace .npz holds only arrays, "
                                    "as numpy.savez writes them")
            with z.open(info) as f:
                version = np.lib.format.read_magic(f)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                    np.lib.format.read_array_header_2_0
                shape, _, dtype = read(f)
                need = int(np.prod(shape, dtype=object)) * dtype.itemsize
                if need > info.file_size:
                    raise WorkloadError(f"{p}: member {info.filename} promises {format_bytes(need)} of data but "
                                        f"holds {format_bytes(info.file_size)}; the archive is corrupt")
                total += need
    return total


def npz_contents(p: Path) -> tuple[list[tuple[np.ndarray, np.ndarray, int]] | None, list[np.ndarray]]:
    """An .npz trace as bagged tables (indices, offsets, first position) or, failing
    that layout, as one flat array per table (sorted by name)."""
    check_memory(3 * _npz_bytes(p), f"loading {p.name}", "use a smaller trace, or split it into one array per table")
    with np.load(p, allow_pickle=False) as z:
        keys = list(z.keys())
        bagged = [k for k in ("offsets", "lengths") if k in keys]
        if bagged and "indices" not in keys:
            raise WorkloadError(f"{p}: has {' and '.join(bagged)} but no indices (keys found: "
                                f"{', '.join(escape_text(k) for k in keys)}); a bagged trace holds indices with "
                                "offsets and/or lengths (the dlrm_datasets layout), a flat one only index arrays")
        if "indices" in keys and bagged:
            idx = _as_int_array(z["indices"], p, "indices").reshape(-1)
            if "offsets" in keys:
                offs = _as_int_array(z["offsets"], p, "offsets")
            else:
                offs = _as_int_array(z["lengths"], p, "lengths").reshape(-1)
                if offs.size and offs.min() < 0:
                    raise WorkloadError(f"{p}: negative bag length at position {int(np.argmax(offs < 0))}")
                offs = np.concatenate([[0], np.cumsum(offs)])
            if len(offs) > 0 and offs.ndim == 1 and offs[-1] < len(idx):
                offs = np.concatenate([offs, [len(idx)]])
            ntab = len(z["lengths"]) if "lengths" in keys and z["lengths"].ndim == 2 else 1
            return _split_bagged(idx, offs, ntab, p), []
        bags = [k for k in keys if _BAG_LIKE.fullmatch(k)]
        if bags:
            raise WorkloadError(f"{p}: keys {', '.join(escape_text(k) for k in keys)}: {', '.join(bags)} look like bag "
                                "offsets or lengths, but a bagged trace names them indices with offsets and/or "
                                "lengths (the dlrm_datasets layout); without those names every array would be read "
                                "as one table's indices. Rename the arrays (np.savez(f, indices=..., offsets=...))")
        arrays = [_as_int_array(z[k], p, k).reshape(-1) for k in sorted(keys)]
    if not arrays:
        raise WorkloadError(f"{p}: the archive holds no arrays")
    return None, arrays


#: .npz keys that name bags, not indices: refused unless the layout's own names (offsets, lengths) are used
_BAG_LIKE = re.compile(r"(?i)(off|offs|offset|offsets_?\w*|len|lens|length|lengths_?\w*|bag_?sizes?|bags?|"
                       r"per_sample_weights)")


def _load_npz(p: Path, config: WorkloadConfig, rows: int | None, T: int) -> Dataset:
    parts, arrays = npz_contents(p)
    if parts is not None:
        ds = _bagged_to_dataset(parts[:T], p, config, rows)
    else:
        ds = _streams_to_dataset([(len(a), lambda a=a: iter([a])) for a in arrays], p, config, rows, T)
    ds.description += f" ({npz_layout(p)})"
    return ds


def npz_layout(path: str | Path) -> str:
    """Which keys of an .npz trace are read, and as what (said wherever one is read, so a
    file whose arrays were named otherwise is never misread in silence)."""
    with np.load(path, allow_pickle=False) as z:
        keys = sorted(z.keys())
    bagged = [k for k in ("offsets", "lengths") if k in keys]
    if "indices" in keys and bagged:
        return f"keys indices and {' and '.join(bagged)}: bagged tables, the dlrm_datasets layout"
    return f"keys {', '.join(escape_text(k) for k in keys)}: one table's index array each, in that order"


def _pt_bytes(p: Path) -> int:
    """Bytes torch.load will hold for a .pt file: a zip archive's members as they inflate
    (their recorded sizes; a deflated member can be 1000x its stored size), else the file."""
    if not zipfile.is_zipfile(p):
        return p.stat().st_size
    with zipfile.ZipFile(p) as z:
        return sum(info.file_size for info in z.infolist())


def pt_parts(p: Path) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """The tables of a dlrm_datasets .pt file: (indices, offsets, first position) each."""
    import torch

    check_memory(3 * _pt_bytes(p), f"loading {p.name}", "use a smaller trace")
    try:
        obj = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises assorted types, with pages of advice
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        if "weights_only" in str(e) or "Unsupported global" in str(e):
            raise WorkloadError(f"{p}: holds Python objects, not plain tensors; save the trace as "
                                "torch.save((indices, offsets, lengths)) as in Meta's dlrm_datasets, "
                                "or convert it to .npz") from None
        raise WorkloadError(f"{p}: cannot read as a torch file ({type(e).__name__}: {first[:200]})") from None
    if isinstance(obj, dict):
        obj = tuple(obj.get(k) for k in ("indices", "offsets", "lengths"))
    if not isinstance(obj, (tuple, list)) or len(obj) < 2 or obj[0] is None or obj[1] is None or \
            not all(hasattr(o, "numpy") or isinstance(o, np.ndarray) for o in obj[:2]):
        raise WorkloadError(f"{p}: expected (indices, offsets, lengths) tensors as in Meta's dlrm_datasets")
    idx = _as_int_array(obj[0], p, "indices").reshape(-1)
    offs = _as_int_array(obj[1], p, "offsets").reshape(-1)
    ntab = 1
    if len(obj) > 2 and obj[2] is not None and getattr(obj[2], "ndim", 1) == 2:
        ntab = int(obj[2].shape[0])
    return _split_bagged(idx, offs, ntab, p)


def _load_pt(p: Path, config: WorkloadConfig, rows: int | None, T: int) -> Dataset:
    parts = pt_parts(p)
    return _bagged_to_dataset(parts[: min(T, len(parts))], p, config, rows)


def _table_streams(p: Path) -> list[tuple[int | None, Callable[[], Iterator[np.ndarray]]]]:
    """(length, chunk reader) of each table of a trace file, in the file's order."""
    suffix = p.suffix.lower()
    if suffix == ".npz":
        parts, arrays = npz_contents(p)
        arrays = [idx for idx, _, _ in parts] if parts is not None else arrays
    elif suffix in (".pt", ".pth"):
        arrays = [idx for idx, _, _ in pt_parts(p)]
    else:
        return file_streams(p)
    return [(len(a), lambda a=a: iter([a])) for a in arrays]


def trace_file_problem(path: str | Path) -> str | None:
    """Why `path` cannot be read as a trace file (it does not exist, or it is a directory,
    a device, a FIFO or a socket: reading one would hang or read nothing), or None."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        try:
            where = "" if p.is_absolute() else f" (relative to {Path.cwd()})"
        except OSError:
            where = " (and the working directory no longer exists)"
        return f"no such trace file{where}; check the path"
    except OSError as e:
        return f"cannot be read ({e.strerror or type(e).__name__})"
    if not stat.S_ISREG(st.st_mode):
        return f"is {file_kind(st.st_mode)}, not a trace file; give a .txt, .npy, .npz or .pt file"
    return None


def checked_trace_file(path: str | Path) -> Path:
    """`path` as a Path, or WorkloadError naming why it is not a readable trace file."""
    p = Path(path)
    problem = trace_file_problem(p)
    if problem:
        raise WorkloadError(f"{escape_text(str(p))}: {problem}")
    return p


@contextmanager
def reading_trace(p: Path) -> Iterator[None]:
    """Reading trace file `p`: running out of memory, or any damage numpy, zipfile and
    zlib report in their own exception types, becomes one domain error naming the file."""
    try:
        yield
    except CharacterizeError:
        raise
    except MemoryError:
        raise MemoryBudgetError(f"{p}: ran out of memory while loading; lower the memory budget's share or "
                                "use a smaller trace") from None
    except Exception as e:  # noqa: BLE001 - numpy, zipfile and zlib raise assorted types on damaged files
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise WorkloadError(f"{p}: cannot read the trace ({type(e).__name__}: {first}); the file is damaged, "
                            "truncated or not in a supported format") from None


def load_trace(path: str | Path, config: WorkloadConfig | None = None, rows: int | None = None,
               tables: int | None = None) -> Dataset:
    """Load a trace file: .txt (one index per line), .npy (1-D stream or 2-D [tables, n]),
    .npz (indices+offsets[+lengths], or one array per table), .pt (dlrm_datasets:
    indices, offsets, lengths). `rows` is E (inferred from the largest index if None).
    Any damage is a WorkloadError naming the file; memory is checked before loading."""
    p = checked_trace_file(path)
    config = config or WorkloadConfig()
    T = tables or config.T
    suffix = p.suffix.lower()
    with reading_trace(p):
        if suffix == ".npz":
            return _load_npz(p, config, rows, T)
        if suffix in (".pt", ".pth"):
            return _load_pt(p, config, rows, T)
        return _streams_to_dataset(file_streams(p), p, config, rows, T)


@dataclass
class FileTable:
    """One table's lookups as a trace file holds them: no batching, no circular reading."""

    indices: np.ndarray   # int64: the table's first `lookups` indices (all of them by default)
    rows: int             # E: given, or the largest index of the table + 1
    file_lookups: int     # lookups the table holds in the file
    tables: int           # tables in the file (a flat stream is one)


def read_table(path: str | Path, table: int = 0, rows: int | None = None, lookups: int | None = None) -> FileTable:
    """Table `table` of a trace file as the file holds it: its own lookups, in order,
    the first `lookups` of them when given (more than the table holds is refused). Flat
    streams (.txt, 1-D .npy) are one table, read in chunks: only `lookups` are kept, but
    the whole stream is range-checked and counted. What the bench reads (batches of B
    bags, streams read circularly) is `load_trace`."""
    p = checked_trace_file(path)
    if table < 0:
        raise ConfigError(f"table must be 0 or more, got {table}")
    if lookups is not None and lookups < 1:
        raise ConfigError(f"lookups must be a positive number, got {lookups}")
    with reading_trace(p):
        streams = _table_streams(p)
        if table >= len(streams):
            one = " (one stream of lookups)" if len(streams) == 1 else ""
            raise ConfigError(f"{p}: table {table} is not in the file, which holds {len(streams)} table(s){one}; "
                              "--as-consumed reads a stream as the bench does, each table continuing where the "
                              "previous one stopped")
        length, read = streams[table]
        if lookups is None:  # the whole table; a text line holds at least 2 bytes, so at most size/2 lookups
            n = length if length is not None else p.stat().st_size // 2
            check_memory(8 * n, f"reading table {table} of {p.name} ({n:,} lookups)",
                         "analyze the first N lookups (--lookups N)")
        keep = lookups if lookups is not None else (length if length is not None else 1 << 62)
        scan = scan_chunks(read(), keep, rows, p, table)
    if lookups is not None and lookups > scan.length:
        raise ConfigError(f"{p}: table {table} holds {scan.length:,} lookups; --lookups {lookups:,} asks for more. "
                          f"Ask for at most {scan.length:,}, or pass --as-consumed to read the file circularly "
                          "as the bench does")
    return FileTable(scan.head, rows if rows is not None else scan.largest + 1, scan.length, len(streams))


_SHARED: ContextVar[dict | None] = ContextVar("shared_datasets", default=None)


@contextmanager
def shared_datasets() -> Iterator[None]:
    """Within the block, `load_dataset` returns one Dataset per (dataset, what generating or
    reading it depends on, tables): a run's locality, model (every precision) and end-to-end
    steps read each trace once. Callers treat the datasets as read-only. Reentrant."""
    if _SHARED.get() is not None:
        yield
        return
    token = _SHARED.set({})
    try:
        yield
    finally:
        _SHARED.reset(token)


def load_dataset(spec: str, config: WorkloadConfig, tables: Iterable[int] | None = None) -> Dataset:
    """A preset/zipf dataset generated for `config`, or a trace file read for it (one per
    run inside `shared_datasets`: the dtype, D and pooling mode do not change the trace)."""
    cache = _SHARED.get()
    which = None if tables is None else tuple(tables)
    key = (spec, config.T, config.E, config.B, config.L, config.batches, config.seed, which)
    if cache is not None and key in cache:
        return cache[key]
    ds = _load_dataset(spec, config, which)
    if cache is not None:
        cache[key] = ds
    return ds


def _load_dataset(spec: str, config: WorkloadConfig, tables: Iterable[int] | None = None) -> Dataset:
    parsed = parse_dataset(spec)
    if isinstance(parsed, Hotness):
        return generate(parsed, config, tables)
    ds = load_trace(parsed, config, rows=config.E)
    if tables is not None:
        ds.tables = [ds.tables[t % len(ds.tables)] for t in tables]
    return ds




def write_trace(ds: Dataset, path: str | Path, inputs: Iterable[str | Path] = ()) -> Path:
    """Write `ds` where `load_trace` reads it back: .txt holds table 0's indices, one
    per line; anything else an .npz in the dlrm_datasets layout (indices, offsets and
    lengths of shape T x batches*B). Written atomically over a regular file only (never
    over a device, a FIFO or one of `inputs`, such as the trace it was read from)."""
    path = Path(path)
    blocked = next((d for d in path.parents if d.exists() and not d.is_dir()), None)
    if blocked is not None:
        raise WorkloadError(f"cannot write {path}: {blocked} is a file, not a directory; choose another output path")
    try:
        with atomic_output(path, inputs) as f:   # a file object keeps numpy from appending .npz to other suffixes
            if path.suffix == ".txt":
                np.savetxt(f, ds.tables[0].indices, fmt="%d")
                return path
            lengths = np.stack([tr.lengths() for tr in ds.tables])
            offsets = np.concatenate([[0], np.cumsum(lengths.reshape(-1))])
            np.savez(f, indices=np.concatenate([tr.indices for tr in ds.tables]), offsets=offsets, lengths=lengths)
    except OSError as e:
        raise WorkloadError(f"cannot write {path}: {e.strerror or e}; choose another output path") from None
    return path
