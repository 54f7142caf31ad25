"""Workloads stage, a trace file's shape: what the file itself says about the workload
(how many tables, how many rows, where its bags begin and end) and what it cannot say
(the embedding dimension D; the number of tables of a flat stream), so that
`characterize predict --trace FILE` and `run --trace FILE` infer the rest and ask for the
remainder.

Bag boundaries: a bagged file (an .npz with indices and offsets or lengths, a dlrm .pt)
keeps its own bags, in the model and in the bench alike (both read it through
`traces.load_dataset`): batches are its consecutive bags, B of them each. A flat stream
(.txt, .npy, an .npz of one array per table) has no bags: bags of L lookups are cut from
it, read circularly, the same way for both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from characterize.config import Pooling, WorkloadConfig
from characterize.errors import ConfigError, MissingInput
from characterize.workloads.traces import (
    checked_trace_file,
    file_streams,
    npz_contents,
    pt_parts,
    reading_trace,
    scan_chunks,
)

#: what `characterize workload --help` lists as accepted trace files
FORMATS = (
    ".txt: one row index per line (# comments and blank lines skipped): one stream of lookups",
    ".npy: a 1-D stream of lookups, or 2-D with one row per table",
    ".npz: indices with offsets (or lengths; 2-D lengths [tables, bags] give the tables), the dlrm_datasets "
    "layout `characterize workload generate` writes; or one array per table",
    ".pt / .pth: Meta's dlrm_datasets (indices, offsets, lengths) tensors, saved with torch.save",
)


@dataclass(frozen=True)
class TraceShape:
    """What a trace file holds, as it is: `tables` (None: one flat stream serving every
    table), whether it has bag boundaries (`bagged`), `rows` (largest index + 1), per
    table its `lookups` and, when bagged, its `bags`, the mean and largest bag length."""

    path: Path
    kind: str
    tables: int | None
    bagged: bool
    rows: int
    lookups: tuple[int, ...]
    bags: tuple[int, ...] = ()
    mean_bag: float | None = None
    max_bag: int | None = None

    @property
    def min_bags(self) -> int:
        return min(self.bags) if self.bags else 0


def trace_shape(path: str | Path) -> TraceShape:
    """Read a trace file once and say what it holds (every index range-checked)."""
    p = checked_trace_file(path)
    suffix = p.suffix.lower()
    with reading_trace(p):
        if suffix in (".npz", ".pt", ".pth"):
            if suffix == ".npz":
                parts, arrays = npz_contents(p)
            else:
                parts, arrays = pt_parts(p), []
            if parts is not None:
                lengths = [np.diff(offs) for _, offs, _ in parts]
                every = np.concatenate(lengths) if lengths else np.empty(0, dtype=np.int64)
                largest = max((int(idx.max()) for idx, _, _ in parts if idx.size), default=-1)
                kind = "dlrm .pt (indices, offsets, lengths)" if suffix != ".npz" else "npz with bag offsets"
                return TraceShape(p, kind, len(parts), True, largest + 1, tuple(int(i.size) for i, _, _ in parts),
                                  tuple(len(x) for x in lengths), float(every.mean()) if every.size else None,
                                  int(every.max()) if every.size else None)
            largest = max((int(a.max()) for a in arrays if a.size), default=-1)
            return TraceShape(p, "npz, one array per table", len(arrays), False, largest + 1,
                              tuple(int(a.size) for a in arrays))
        streams = file_streams(p)
        scans = [scan_chunks(read(), 0, None, p, t) for t, (_, read) in enumerate(streams)]
        largest = max(s.largest for s in scans)
        if suffix == ".npy" and len(scans) > 1:
            return TraceShape(p, "npy, one row per table", len(scans), False, largest + 1,
                              tuple(s.length for s in scans))
        return TraceShape(p, "one stream of lookups" + (" (.npy)" if suffix == ".npy" else " (text)"), None, False,
                          largest + 1, tuple(s.length for s in scans))


@dataclass
class InferredWorkload:
    """A workload for a trace file: the config and, per field, where its value came from."""

    workload: WorkloadConfig
    notes: list[str] = field(default_factory=list)


def _missing(shape: TraceShape, given: Mapping[str, Any]) -> list[str]:
    """The fields the file cannot tell and nobody gave: D always, T for a flat stream."""
    need = ["D"] + (["T"] if shape.tables is None else [])
    return [n for n in need if given.get(n) is None]


def infer_workload(shape: TraceShape, base: WorkloadConfig, given: Mapping[str, Any] | None = None,
                   ) -> InferredWorkload:
    """The workload to predict and bench `shape`'s file with: T and E from the file (unless
    given; E must hold its largest index), B and L from the file's own bags when it has
    them (a flat stream takes `base`'s, or what is given), D and a flat stream's T from
    `given` or MissingInput naming them. `given`: T, E, D, B, L, batches, mode, seed (None
    = not given). Each choice is written into `notes`, one line each."""
    given = {k: v for k, v in (given or {}).items() if v is not None}
    missing = _missing(shape, given)
    if missing:
        what = {"D": "the embedding dimension D (elements per row)",
                "T": "how many tables T (a flat stream of lookups serves every table, each continuing where the "
                     "previous stopped)"}
        raise MissingInput(f"{shape.path}: the file does not say {' or '.join(what[m] for m in missing)}; pass "
                           + " ".join(f"--{m} N" for m in missing) + " (for example " +
                           " ".join(f"--{m} {base.D if m == 'D' else base.T}" for m in missing) + ")", missing)
    notes = [f"{shape.path.name}: {shape.kind}"]
    changes: dict[str, Any] = {}
    # tables
    if "T" in given:
        changes["T"] = int(given["T"])
        if shape.tables is not None and changes["T"] > shape.tables:
            notes.append(f"T={changes['T']} (given; the file holds {shape.tables} table(s), read again in turn)")
        else:
            notes.append(f"T={changes['T']} (given)")
    else:
        changes["T"] = shape.tables
        notes.append(f"T={shape.tables} (the tables in the file)")
    # rows
    if "E" in given:
        if int(given["E"]) < shape.rows:
            raise ConfigError(f"{shape.path}: --E {int(given['E']):,} is too small: the file reads row "
                              f"{shape.rows - 1:,}; pass at least --E {shape.rows:,} or leave E out")
        changes["E"] = int(given["E"])
        notes.append(f"E={changes['E']:,} (given)")
    else:
        changes["E"] = shape.rows
        notes.append(f"E={shape.rows:,} (the largest index in the file + 1)")
    changes["D"] = int(given["D"])
    notes.append(f"D={changes['D']} (given)")
    # bags
    if shape.bagged:
        bags = shape.min_bags
        # at most base's B, and at least two batches when the file allows: the first one warms the L2
        B = int(given.get("B", min(base.B, max(1, bags // 2) if bags > 1 else 1)))
        if B > bags:
            raise ConfigError(f"{shape.path}: --B {B:,} asks for more bags than a table of the file holds "
                              f"({bags:,}); pass at most --B {bags:,}")
        batches = int(given.get("batches", max(1, min(base.batches, bags // B))))
        if batches * B > bags:
            raise ConfigError(f"{shape.path}: --batches {batches} x B={B:,} bags is more than a table of the file "
                              f"holds ({bags:,}); pass at most --batches {bags // B}")
        changes.update(B=B, batches=batches, L=Pooling("fixed", float(max(1, round(shape.mean_bag or 1)))))
        notes.append(f"B={B:,}{' (given)' if 'B' in given else ''}, {batches} batch(es): the first {B * batches:,} "
                     f"of the {bags:,} bags per table" + ("" if "batches" in given or batches * B == bags else
                                                          " (--batches uses more)"))
        notes.append(f"bags: the file's own boundaries, kept by predict and bench alike (mean length "
                     f"{shape.mean_bag:.1f}, longest {shape.max_bag:,})" +
                     ("; the L given is not used" if "L" in given else ""))
    else:
        for name in ("B", "batches"):
            if name in given:
                changes[name] = int(given[name])
        if "L" in given:
            changes["L"] = Pooling.parse(given["L"])
        wl = base.replace(**changes)
        notes.append(f"B={wl.B:,}{' (given)' if 'B' in given else ''}, L={wl.L}{' (given)' if 'L' in given else ''}, "
                     f"{wl.batches} batch(es): the file has no bag boundaries, so bags of L lookups are cut from its "
                     "stream, read circularly, by predict and bench alike")
    for name in ("mode", "seed"):
        if name in given:
            changes[name] = given[name]
    return InferredWorkload(base.replace(**changes).validate(), notes)
