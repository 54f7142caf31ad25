"""Fuzzed trace readers (issue 13): malformed traces of every supported format (.txt,
.npy 1-D and 2-D, .npz bagged and per table, dlrm .pt), byte-mutated and hand-made.
The only acceptable outcomes are a dataset whose every index is in range and whose bags
are consistent, or a one-line CharacterizeError. Seeded, a few seconds;
`python benchmarks/fuzz_readers.py` runs the same generators for longer."""

from __future__ import annotations

import random
import warnings
from collections import Counter
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest
import torch

from characterize.config import Pooling, WorkloadConfig
from characterize.errors import CharacterizeError
from characterize.workloads.locality import locality_stats
from characterize.workloads.traces import Dataset, generate, load_trace, write_trace

CONFIG = WorkloadConfig(T=2, E=1009, D=8, B=16, L=Pooling.parse("uniform:0:6"), batches=2, seed=3)


def valid_traces(d: Path) -> list[Path]:
    """One small, valid trace per supported format."""
    ds = generate("medium", CONFIG)
    write_trace(ds, d / "bagged.npz")
    idx = np.concatenate([t.indices for t in ds.tables])
    np.savetxt(d / "stream.txt", idx, fmt="%d")
    np.save(d / "stream.npy", idx)
    np.save(d / "per_table.npy", np.stack([t.indices[:40] for t in ds.tables]).astype(np.int32))
    np.savez(d / "per_table.npz", a=ds.tables[0].indices, b=ds.tables[1].indices.astype(np.uint16))
    z = np.load(d / "bagged.npz")
    torch.save((torch.from_numpy(z["indices"]), torch.from_numpy(z["offsets"]), torch.from_numpy(z["lengths"])),
               d / "dlrm.pt")
    return [d / n for n in ("stream.txt", "stream.npy", "per_table.npy", "bagged.npz", "per_table.npz", "dlrm.pt")]


def trace_mutants(d: Path, seed: int, n: int) -> Iterator[tuple[str, Path]]:
    """(format:how, mutant) for n byte-mutated copies of the valid traces."""
    rng = random.Random(seed)
    sources = valid_traces(d)
    for i in range(n):
        src = rng.choice(sources)
        b = bytearray(src.read_bytes())
        how = rng.choice(["flip", "flip", "truncate", "zero", "header"])
        if how == "flip":
            for _ in range(rng.choice([1, 2, 8, 32])):
                b[rng.randrange(len(b))] = rng.randrange(256)
        elif how == "truncate":
            b = b[: rng.randrange(len(b))]
        elif how == "zero":
            start = rng.randrange(len(b))
            b[start:start + rng.randrange(1, 256)] = bytes(len(b[start:start + 256]))
        else:  # the first 128 bytes hold the npy/zip/pickle headers
            for _ in range(rng.choice([1, 2, 4])):
                b[rng.randrange(min(128, len(b)))] = rng.randrange(256)
        p = d / f"m{seed}-{i}{src.suffix}"
        p.write_bytes(bytes(b))
        yield f"{src.name}:{how}", p


def check_dataset(ds: Dataset, rows: int | None) -> None:
    """What a read trace must satisfy: indices in range, bags inside their batch."""
    assert ds.tables and ds.rows >= 1
    for t in ds.tables:
        assert t.indices.dtype == np.int64
        if t.indices.size:
            assert 0 <= t.indices.min() and t.indices.max() < (rows or ds.rows)
        assert np.all(np.diff(t.starts) >= 0) and t.starts[-1] == len(t.indices)
        sizes = np.diff(t.starts)
        assert np.all(t.offsets >= 0) and np.all(t.offsets <= sizes[:, None])
        assert (t.lengths() >= 0).all()
    if ds.tables[0].indices.size:
        locality_stats(ds.tables[0].indices, ds.rows, 32, [10])


def outcome(fn: Callable[[], object]) -> str:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn()
    except CharacterizeError as e:
        assert "\n" not in str(e) and str(e).strip(), repr(str(e))
        return type(e).__name__
    return "ok"


def read_and_check(p: Path, rows: int | None) -> None:
    check_dataset(load_trace(p, CONFIG, rows=rows), rows)


@pytest.fixture(autouse=True)
def small_budget(monkeypatch):
    """A damaged header may promise terabytes: refused by the budget, never allocated."""
    monkeypatch.setenv("CHARACTERIZE_MEMORY_BUDGET", "256M")


def test_the_valid_traces_read(tmp_path):
    for p in valid_traces(tmp_path):
        assert outcome(lambda: read_and_check(p, CONFIG.E)) == "ok", p


def test_byte_mutated_traces_of_every_format_read_correctly_or_fail_in_one_line(tmp_path):
    counts = Counter()
    for name, p in trace_mutants(tmp_path, seed=13, n=300):
        for rows in (CONFIG.E, None):
            counts[f"{name.split(':')[0]}:{outcome(lambda: read_and_check(p, rows))}"] += 1
    formats = {k.split(":")[0] for k in counts}
    assert formats == {"stream.txt", "stream.npy", "per_table.npy", "bagged.npz", "per_table.npz", "dlrm.pt"}
    assert sum(v for k, v in counts.items() if k.endswith(":ok")) and \
        sum(v for k, v in counts.items() if not k.endswith(":ok")), counts


def _npy_promising(p: Path, shape: tuple[int, ...]) -> None:
    """A real .npy header that promises `shape`, followed by 64 bytes of data."""
    with open(p, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<i8", "fortran_order": False, "shape": shape})
        f.write(bytes(64))


@pytest.mark.parametrize("name, make, message", [
    ("floats.npy", lambda p: np.save(p, np.array([1.5, 2.0])), "must hold integers, got dtype float64"),
    ("objects.npy", lambda p: np.save(p, np.array([1, "x"], dtype=object), allow_pickle=True), "must hold integers"),
    ("cube.npy", lambda p: np.save(p, np.zeros((2, 2, 2), dtype=np.int64)), "got shape (2, 2, 2)"),
    ("scalar.npy", lambda p: np.save(p, np.int64(7)), "got shape ()"),
    ("huge-header.npy", lambda p: _npy_promising(p, (10**10,)), "truncated: its header promises shape (10000000000,)"),
    ("big.txt", lambda p: p.write_text("1\n99999999999999999999\n"), "line 2: index 99999999999999999999 does not fit"),
    ("two.txt", lambda p: p.write_text("1\n2 3\n"), "line 2: '2 3' is not an integer index"),
    ("binary.txt", lambda p: p.write_bytes(b"\x00\xff" * 40), "is not an integer index"),
    ("noline.txt", lambda p: p.write_bytes(b"1" * 40_000_000), "without a line break"),
    ("neg-lengths.npz", lambda p: np.savez(p, indices=np.arange(4), lengths=np.array([3, -1, 2])),
     "negative bag length"),
    ("down.npz", lambda p: np.savez(p, indices=np.arange(9), offsets=np.array([0, 5, 3, 9])), "offsets decrease"),
    ("u64.npz", lambda p: np.savez(p, a=np.array([2**64 - 1], dtype=np.uint64)), "does not fit 64-bit"),
    ("empty.npz", lambda p: np.savez(p), "holds no arrays"),
    ("strings.pt", lambda p: torch.save(("a", "b"), p), "expected (indices, offsets, lengths) tensors"),
    ("floats.pt", lambda p: torch.save((torch.rand(4), torch.tensor([0, 4])), p), "must be integers"),
])
def test_hand_made_malformed_traces(tmp_path, name, make, message):
    p = tmp_path / name
    make(p)
    with pytest.raises(CharacterizeError) as e:
        read_and_check(p, None)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert "truncated?" not in str(e.value) or "truncated" in message
