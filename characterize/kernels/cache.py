"""Kernels stage, host-resident tables: a frequency-aware GPU cache of a table kept in
(pinned) host memory, after Fang et al. 2022 (ColossalAI's CachedEmbeddingBag), and the
managed-memory (UVM) alternative.

The cache holds C rows of the table in a device buffer, an index map row -> slot and
slot -> row, and a priority per row: the larger of the frequency statistics it was
warmed from and the lookups counted since (statistics of the same trace keep the C most
frequent rows in place; rows the statistics missed climb as they are read). Per batch:

1. dedup/map: the batch's unique ids and, through the map, which are cached (hits) and
   which are not (misses);
2. eviction: misses sorted by priority (highest first) meet the cached rows this batch
   does not use, sorted by priority (lowest first, empty slots before any row); a miss
   takes the slot of its partner when it is strictly more frequent. Misses that lose
   are staged after the C slots for this batch only, so a batch with more unique rows
   than C still runs;
3. transfer: the missed rows are gathered on the host into a pinned buffer and copied
   in one batched copy (host bytes = misses x row bytes), then written to their slots;
4. lookup: an existing kernel of the family runs on the cache buffer with the batch's
   indices mapped to slots.

`CachePolicy` is the bookkeeping alone (no table data), so the model replays it on a
trace to predict hit rates and host bytes; `HostCache` adds the data and the timing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Callable

import numpy as np
import torch

from characterize.errors import ConfigError, KernelLaunchError, NoCudaDevice


@dataclass(frozen=True)
class BatchStats:
    """One batch through the cache: what it found, moved and how long each part took."""

    batch: int
    lookups: int
    unique: int          # distinct rows of the batch
    hits: int            # unique rows found in the cache
    misses: int          # unique rows copied from the host
    admitted: int        # misses that took a cache slot (the rest were staged for this batch)
    evicted: int         # cached rows those admissions replaced
    host_bytes: int      # bytes copied host -> device (misses x row bytes)
    lookup_hits: int     # lookups whose row was cached before the batch
    dedup_us: float      # unique ids, slot map, eviction decisions
    transfer_us: float   # host gather + batched copy + writing the slots
    lookup_us: float     # the lookup kernel on cache slots
    timer: str           # "cuda events" or "host clock" (CPU emulation: not a GPU time)

    @property
    def hit_rate(self) -> float:
        """Share of the batch's unique rows served by the cache."""
        return self.hits / self.unique if self.unique else 1.0

    def to_dict(self) -> dict:
        return asdict(self) | {"hit_rate": self.hit_rate}


@dataclass(frozen=True)
class Decision:
    """What the policy decided for one batch (tensors on the policy's device)."""

    unique: torch.Tensor      # sorted unique rows of the batch
    inverse: torch.Tensor     # position of each lookup's row in `unique`
    slots: torch.Tensor       # slot of each unique row (staged misses: C, C+1, ...)
    miss_rows: torch.Tensor   # rows to copy from the host, in the order of `miss_slots`
    miss_slots: torch.Tensor  # where each copied row goes
    hits: int
    admitted: int
    evicted: int
    lookup_hits: int


class CachePolicy:
    """Slots, maps and priorities of a frequency-aware cache of C rows over E rows."""

    def __init__(self, rows: int, capacity: int, device: torch.device | str = "cpu",
                 frequencies: np.ndarray | torch.Tensor | None = None):
        if capacity < 1 or rows < 1:
            raise ConfigError(f"a row cache needs C >= 1 and E >= 1, got C={capacity}, E={rows}")
        self.E, self.C = int(rows), int(min(capacity, rows))
        self.device = torch.device(device)
        self.stats = torch.zeros(self.E, dtype=torch.int64, device=self.device)
        if frequencies is not None:
            freq = frequencies if isinstance(frequencies, torch.Tensor) else torch.as_tensor(np.asarray(frequencies))
            if freq.shape != (self.E,):
                raise ConfigError(f"frequency statistics must give one count per row ({self.E}), "
                                  f"got {tuple(freq.shape)}")
            self.stats += freq.to(self.device, torch.int64)
        self.counted = torch.zeros(self.E, dtype=torch.int64, device=self.device)   # lookups since warming
        self.priority = self.stats.clone()
        self.row_slot = torch.full((self.E,), -1, dtype=torch.int64, device=self.device)
        self.slot_row = torch.full((self.C,), -1, dtype=torch.int64, device=self.device)
        self.warm()

    def warm(self) -> torch.Tensor:
        """Fill the slots with the C most frequent rows (ties by row id; rows never
        read stay out); returns the rows in slot order."""
        seen = torch.nonzero(self.priority > 0).flatten()
        order = torch.argsort(-self.priority[seen], stable=True)[: self.C]
        rows = seen[order]
        self.row_slot.fill_(-1)
        self.slot_row.fill_(-1)
        slots = torch.arange(len(rows), device=self.device)
        self.row_slot[rows] = slots
        self.slot_row[: len(rows)] = rows
        return rows

    def cached(self) -> torch.Tensor:
        """Rows in the cache, in slot order (empty slots left out)."""
        return self.slot_row[self.slot_row >= 0]

    def step(self, indices: torch.Tensor) -> Decision:
        """Decide one batch: count its lookups, find hits, admit or stage its misses."""
        unique, inverse, counts = torch.unique(indices, return_inverse=True, return_counts=True)
        slots = self.row_slot[unique]
        hit = slots >= 0
        lookup_hits = int(counts[hit].sum())
        self.counted[unique] += counts
        self.priority[unique] = torch.maximum(self.stats[unique], self.counted[unique])
        miss_rows = unique[~hit]
        m = int(miss_rows.numel())
        admitted = evicted = 0
        miss_slots = torch.empty(0, dtype=torch.int64, device=self.device)
        if m:
            # misses, most frequent first (ties: lower row first)
            miss_rows = miss_rows[torch.argsort(-self.priority[miss_rows], stable=True)]
            # eviction candidates: slots this batch does not use, least frequent first (empty slots first)
            used = torch.zeros(self.C, dtype=torch.bool, device=self.device)
            used[slots[hit]] = True
            free = torch.nonzero(~used).flatten()
            owner = self.slot_row[free]
            prio = torch.where(owner >= 0, self.priority[owner.clamp(min=0)], torch.full_like(owner, -1))
            order = torch.argsort(prio, stable=True)
            free, owner, prio = free[order], owner[order], prio[order]
            n = min(m, int(free.numel()))
            # misses descend and candidates ascend, so the admitted pairs are a prefix
            admit = self.priority[miss_rows[:n]] > prio[:n]
            admitted = int(admit.sum())
            victims, old = free[:admitted], owner[:admitted]
            gone = old[old >= 0]
            evicted = int(gone.numel())
            self.row_slot[gone] = -1
            new = miss_rows[:admitted]
            self.row_slot[new] = victims
            self.slot_row[victims] = new
            staged = torch.arange(self.C, self.C + m - admitted, device=self.device)
            miss_slots = torch.cat([victims, staged])
            where = torch.searchsorted(unique, miss_rows)
            slots = slots.clone()
            slots[where] = miss_slots
        return Decision(unique, inverse, slots, miss_rows, miss_slots, int(hit.sum()), admitted, evicted, lookup_hits)


class HostCache:
    """A host-resident table behind a `CachePolicy`: the device buffer of C slots (plus
    staging for a batch's non-admitted misses), pinned host staging for the copies, and
    per-batch statistics with the time split dedup/map, transfer, lookup."""

    def __init__(self, host: torch.Tensor, capacity: int, device: torch.device | str,
                 frequencies: np.ndarray | torch.Tensor | None, row_bytes: int):
        if host.is_cuda:
            raise ConfigError("a host-resident table must be in host memory")
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.host = host.pin_memory() if self.cuda and not host.is_pinned() else host
        self.row_bytes = int(row_bytes)
        self._staging: torch.Tensor | None = None
        self.policy = CachePolicy(host.shape[0], capacity, self.device, frequencies)
        C = self.policy.C
        self.rows = torch.empty((C, host.shape[1]), dtype=host.dtype, device=self.device)
        warm = self.policy.cached()
        if warm.numel():
            self.rows[: warm.numel()] = self._fetch(warm.cpu())
        self.stats: list[BatchStats] = []

    def _fetch(self, rows_host: torch.Tensor) -> torch.Tensor:
        """Gather host rows into pinned staging and copy them to the device in one batched
        copy. The staging is reused: each batch ends synchronized (its timing events), and
        the policy's host reads synchronize before the next gather."""
        if not self.cuda:
            return self.host.index_select(0, rows_host)
        n = int(rows_host.numel())
        if self._staging is None or self._staging.shape[0] < n:
            size = max(n, 2 * (0 if self._staging is None else self._staging.shape[0]))
            self._staging = torch.empty((size, self.host.shape[1]), dtype=self.host.dtype).pin_memory()
        staged = self._staging[:n]
        torch.index_select(self.host, 0, rows_host, out=staged)
        return staged.to(self.device, non_blocking=True)

    def _buffer(self, slots: int) -> torch.Tensor:
        """The device buffer with room for `slots` rows (C plus this batch's staged misses)."""
        if slots > self.rows.shape[0]:
            grown = torch.empty((slots, self.rows.shape[1]), dtype=self.rows.dtype, device=self.device)
            grown[: self.rows.shape[0]] = self.rows
            self.rows = grown
        return self.rows

    def forward(self, indices: torch.Tensor, lookup: Callable[[torch.Tensor, torch.Tensor, int], object],
                padding_row: int | None = None) -> object:
        """One batch: dedup/map, transfer the misses, then `lookup(buffer, slot_indices,
        padding slot)` (-1 when the padding row is not in the batch, so none is skipped)."""
        clock = _Clock(self.device)
        clock.mark()
        d = self.policy.step(indices)
        mapped = d.slots[d.inverse]
        pad = -1
        if padding_row is not None and d.unique.numel():
            at = int(torch.searchsorted(d.unique, torch.tensor([padding_row], device=d.unique.device)))
            if at < d.unique.numel() and int(d.unique[at]) == padding_row:
                pad = int(d.slots[at])
        clock.mark()
        m = int(d.miss_rows.numel())
        buf = self._buffer(self.policy.C + m - d.admitted)
        if m:
            buf[d.miss_slots] = self._fetch(d.miss_rows.cpu())
        clock.mark()
        out = lookup(buf, mapped, pad)
        clock.mark()
        dedup, transfer, look = clock.split_us()
        self.stats.append(BatchStats(len(self.stats), int(indices.numel()), int(d.unique.numel()), d.hits, m,
                                     d.admitted, d.evicted, m * self.row_bytes, d.lookup_hits, dedup, transfer,
                                     look, clock.kind))
        return out

    def consistent(self) -> bool:
        """The maps agree with each other and every cached slot holds its row's host bytes."""
        rows = self.policy.slot_row
        filled = torch.nonzero(rows >= 0).flatten()
        if not bool((self.policy.row_slot[rows[filled]] == filled).all()):
            return False
        if int((self.policy.row_slot >= 0).sum()) != int(filled.numel()):
            return False
        held = self.rows[filled].cpu()
        return bool(torch.equal(held, self.host[rows[filled].cpu()]))


class _Clock:
    """Marks between the phases of a batch: CUDA events on a GPU (device time), the
    host clock otherwise (CPU emulation, labelled as such)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.kind = "cuda events" if self.cuda else "host clock"
        self.marks: list = []

    def mark(self) -> None:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append(e)
        else:
            self.marks.append(time.perf_counter())

    def split_us(self) -> tuple[float, ...]:
        if self.cuda:
            self.marks[-1].synchronize()
            return tuple(1e3 * a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:]))
        return tuple(1e6 * (b - a) for a, b in zip(self.marks, self.marks[1:]))


# ------------------------------------------------------------------ managed memory
@lru_cache(maxsize=1)
def _cudart() -> ctypes.CDLL:
    """The CUDA runtime torch loaded (its soname resolves to the same library)."""
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", ctypes.util.find_library("cudart")):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.cudaMallocManaged.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
        lib.cudaFree.argtypes = [ctypes.c_void_p]
        return lib
    raise NoCudaDevice("no CUDA runtime library (libcudart) found for managed memory; the uvm variant needs a "
                       "CUDA build of torch")


class ManagedTable:
    """A copy of a table in CUDA managed memory (cudaMallocManaged, attached globally),
    placed by `mode`: "zero-copy" (default, what FBGEMM's UVM tables use) advises the
    driver that the pages live on the host and the GPU accesses them, so the GPU reads
    host memory over the bus and nothing migrates; "migrate" gives no advice, and the
    pages the GPU touches move to it (a table that fits ends up read like `base`'s)."""

    MODES = ("zero-copy", "migrate")

    def __init__(self, table: torch.Tensor, mode: str = "zero-copy", library: object = None):
        if not torch.cuda.is_available():
            raise NoCudaDevice("no CUDA device: managed memory (the uvm variant's GPU path) needs one; on the "
                               "CPU backend the uvm variant reads the table directly")
        if mode not in self.MODES:
            raise ConfigError(f"managed-memory mode must be one of {', '.join(self.MODES)}, got {mode!r}")
        src = table.detach().contiguous().cpu()
        self.nbytes = src.numel() * src.element_size()
        self.shape, self.dtype, self.mode = tuple(src.shape), src.dtype, mode
        self.ptr = ctypes.c_void_p()
        lib = _cudart()
        code = lib.cudaMallocManaged(ctypes.byref(self.ptr), max(1, self.nbytes), 1)   # cudaMemAttachGlobal
        if code != 0:
            raise KernelLaunchError(f"cudaMallocManaged of {self.nbytes:,} bytes failed (code {code})")
        torch.cuda.synchronize()
        ctypes.memmove(self.ptr.value, src.data_ptr(), self.nbytes)   # host writes: pages start on the host
        if library is not None:   # the advice, through the kernel library (its runtime's own signature)
            fn = library.lib.chz_managed_advise
            fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int, ctypes.c_int]
            library.check(fn(self.ptr, self.nbytes, self.MODES.index(mode), torch.cuda.current_device()),
                          f"advising managed memory ({mode})")

    @property
    def data_ptr(self) -> int:
        return int(self.ptr.value or 0)

    def describe(self) -> dict:
        """What a point records about its managed table."""
        advice = (["preferred location: host", "accessed by: the GPU"] if self.mode == "zero-copy"
                  else ["none: pages migrate on first touch"])
        return {"mode": self.mode, "bytes": self.nbytes, "advice": advice}

    def close(self) -> None:
        if self.ptr.value:
            torch.cuda.synchronize()
            _cudart().cudaFree(self.ptr)
            self.ptr = ctypes.c_void_p()
