"""Kernels stage, check: every variant against torch.nn.functional.embedding_bag.

Runs each variant (the CUDA build on a GPU, the CPU-emulation build otherwise) on
generated traces and compares the pooled output with torch computed in float64 from the
dequantized table (what the kernel reads, widened), and offset2bag / bag sizes with their
definition, for every table dtype. The deliberately wrong variant must fail here, which
proves the checker can. The cache variant is also run over several batches with a cache
warmed from another table's trace, so that rows are missed, admitted and evicted, and
every batch is compared with torch on the full table and the cache's maps and slots
with the host table. A table-batched variant (tbe) is also run on a batch of tables that
differ in E, D and dtype, in one launch per dtype group, each table compared with torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Iterable

import numpy as np
import torch

from characterize.config import DTYPES, WorkloadConfig
from characterize.errors import (
    CharacterizeError,
    FileSystemError,
    MemoryBudgetError,
    NoCudaDevice,
    ToolchainNotFound,
    UnsupportedShape,
)
from characterize.hardware.devices import require_gpu
from characterize.kernels.fbgemm import FbgemmUnavailable
from characterize.kernels.library import (
    Table,
    as_dtype,
    bind,
    check_indices,
    default_backend,
    dequantize,
    run_tables,
    run_variant,
    table_dtype,
)
from characterize.kernels.registry import built_in, get_variant
from characterize.memory import check_memory
from characterize.workloads.presets import HOTNESS_ORDER, Hotness, parse_dataset
from characterize.workloads.traces import generate, generation_bytes

#: Tolerance per dtype, relative to (longest bag x largest |value|), plus 1e-6 absolute.
#: The reference is computed from the same dequantized values the kernels read, so what
#: is left is fp32 accumulation (1e-5, every dtype, every kernel of ours) and, for torch's
#: own kernel, which returns the table's dtype, the rounding of that output.
ACCUMULATION_TOLERANCE = 1e-5
OUTPUT_ROUNDING = {"fp32": 0.0, "fp16": 2.0**-10, "bf16": 2.0**-7, "int8": 0.0, "int8h": 0.0, "fp8": 0.0}


#: errors that say the machine cannot run a check at all: raised, never a variant's failed check
ENVIRONMENT = (FileSystemError, ToolchainNotFound, NoCudaDevice, MemoryBudgetError)


def tolerance(dtype: str, variant: str, longest_bag: int, largest: float) -> float:
    """The absolute error a correct variant stays within (see OUTPUT_ROUNDING)."""
    rel = ACCUMULATION_TOLERANCE + (OUTPUT_ROUNDING[dtype] if variant == "torch" else 0.0)
    return rel * max(1, longest_bag) * largest + 1e-6


def make_table(dtype: str, E: int, D: int, seed: int = 0, row_align: int = 16) -> Table:
    """A random N(0, 1) table of `dtype`: int8 tables quantized row-wise (rows padded to
    `row_align` bytes, 16 as FBGEMM's TBE pads them, so the warp kernel can read them)."""
    g = torch.Generator().manual_seed(seed)
    return as_dtype(torch.randn(E, D, generator=g, dtype=torch.float32), dtype, row_align)


@dataclass(frozen=True)
class CheckResult:
    variant: str
    dataset: str
    mode: str
    shape: str            # "B=127 D=68 E=1009 L=uniform:0:20"
    backend: str
    max_abs_err: float
    tolerance: float
    offset2bag_ok: bool | None  # None where the variant does not produce it (torch)
    bag_size_ok: bool | None
    passed: bool | None   # None: skipped (the variant refuses this shape by design)
    error: str = ""
    dtype: str = "fp32"
    note: str = ""        # the cache's batches: misses, evictions, hit rate

    def to_dict(self) -> dict:
        return asdict(self)


def expected_bags(offsets: np.ndarray, n: int, indices: np.ndarray, padding_idx: int | None) -> tuple[np.ndarray, np.ndarray]:
    """offset2bag and non-padding bag sizes by definition (torch's 1-D offsets convention)."""
    B = len(offsets)
    ends = np.append(offsets[1:], n)
    starts = offsets.copy()
    if B:
        starts[0] = 0
    offset2bag = np.repeat(np.arange(B), np.maximum(ends - starts, 0))
    keep = np.ones(n, dtype=bool) if padding_idx is None else indices != padding_idx
    sizes = np.bincount(offset2bag[keep[: len(offset2bag)]], minlength=B) if n else np.zeros(B, dtype=np.int64)
    return offset2bag, sizes


def check_one(variant: str, weight: Table, indices: torch.Tensor, offsets: torch.Tensor, *, mode: str = "sum",
              padding_idx: int | None = None, params: dict | None = None, backend: str | None = None,
              dataset: str = "", gpu=None) -> CheckResult:
    """Run one variant on one batch and compare with torch (float64 on the CPU, from the
    dequantized table)."""
    backend = backend or default_backend()
    device = "cuda" if backend == "cuda" else "cpu"
    B, D, E = offsets.shape[0], weight.shape[1], weight.shape[0]
    lengths = np.diff(np.append(offsets.numpy(), indices.shape[0]))
    shape = f"B={B} D={D} E={E} Lmax={int(lengths.max(initial=0))}"
    dtype = table_dtype(weight)
    wide = dequantize(weight).double()
    ref = torch.nn.functional.embedding_bag(indices, wide, offsets, mode=mode, padding_idx=padding_idx)
    tol = tolerance(dtype, variant, int(lengths.max(initial=1)), float(wide.abs().max()))
    try:
        out = run_variant(variant, weight.to(device).clone(), indices.to(device), offsets.to(device), mode=mode,
                          padding_idx=padding_idx, params=params, backend=backend, gpu=gpu)
    except (UnsupportedShape, FbgemmUnavailable) as e:  # refused by design, or a peer not installed here
        return CheckResult(variant, dataset, mode, shape, backend, float("nan"), tol, None, None, None,
                           f"skipped: {e}", dtype)
    except ENVIRONMENT:
        raise   # the machine's problem (no compiler, a broken cache, no GPU), not the kernel failing its check
    except CharacterizeError as e:
        return CheckResult(variant, dataset, mode, shape, backend, float("nan"), tol, None, None, False, str(e),
                           dtype)
    err = float((out.output.double().cpu() - ref).abs().max()) if B else 0.0
    o2b_ok = size_ok = None
    if out.offset2bag.numel() or out.bag_size.numel():
        exp_o2b, exp_size = expected_bags(offsets.numpy(), indices.shape[0], indices.numpy(),
                                          None if padding_idx is None else padding_idx % E)
        o2b_ok = bool(np.array_equal(out.offset2bag.cpu().numpy(), exp_o2b))
        size_ok = bool(np.array_equal(out.bag_size.cpu().numpy(), exp_size))
    passed = err <= tol and o2b_ok is not False and size_ok is not False
    return CheckResult(variant, dataset, mode, shape, backend, err, tol, o2b_ok, size_ok, passed, "", dtype)


def check_tables(variant: str, tables: list[Table], batch: list[tuple[torch.Tensor, torch.Tensor]], *,
                 mode: str = "sum", padding_idx: int | None = None, params: dict | None = None,
                 backend: str | None = None, dataset: str = "", grid: int = 0) -> list[CheckResult]:
    """A batched variant (tbe) on every table of `batch` at once (one launch per dtype group;
    tables may differ in E, D and dtype), each table compared with torch as check_one does;
    one result per table, its shape naming the table's place in the batch."""
    backend = backend or default_backend()
    device = "cuda" if backend == "cuda" else "cpu"
    T = len(tables)
    shapes, tols, refs = [], [], []
    for t, (w, (idx, off)) in enumerate(zip(tables, batch)):
        lengths = np.diff(np.append(off.numpy(), idx.shape[0]))
        wide = dequantize(w).double()
        refs.append(torch.nn.functional.embedding_bag(idx, wide, off, mode=mode, padding_idx=padding_idx))
        tols.append(tolerance(table_dtype(w), variant, int(lengths.max(initial=1)), float(wide.abs().max())))
        shapes.append(f"T={T} table={t} B={off.shape[0]} D={w.shape[1]} E={w.shape[0]} Lmax={int(lengths.max(initial=0))}")
    try:
        outs = run_tables(variant, [w.to(device).clone() for w in tables],
                          [(i.to(device), o.to(device)) for i, o in batch], mode=mode, padding_idx=padding_idx,
                          params=params, backend=backend, grid=grid)
    except (UnsupportedShape, FbgemmUnavailable) as e:  # refused by design, or a peer not installed here
        return [CheckResult(variant, dataset, mode, shapes[t], backend, float("nan"), tols[t], None, None, None,
                            f"skipped: {e}", table_dtype(w)) for t, w in enumerate(tables)]
    except CharacterizeError as e:
        return [CheckResult(variant, dataset, mode, shapes[t], backend, float("nan"), tols[t], None, None, False,
                            str(e), table_dtype(w)) for t, w in enumerate(tables)]
    results = []
    for t, (w, (idx, off), out) in enumerate(zip(tables, batch, outs)):
        B, E = off.shape[0], w.shape[0]
        err = float((out.output.double().cpu() - refs[t]).abs().max()) if B else 0.0
        o2b_ok = size_ok = None   # only where the variant writes them (FBGEMM's forward does not)
        if out.offset2bag.numel() or out.bag_size.numel():
            exp_o2b, exp_size = expected_bags(off.numpy(), idx.shape[0], idx.numpy(),
                                              None if padding_idx is None else padding_idx % E)
            o2b_ok = bool(np.array_equal(out.offset2bag.cpu().numpy(), exp_o2b))
            size_ok = bool(np.array_equal(out.bag_size.cpu().numpy(), exp_size))
        results.append(CheckResult(variant, dataset, mode, shapes[t], backend, err, tols[t], o2b_ok, size_ok,
                                   err <= tols[t] and o2b_ok is not False and size_ok is not False, "",
                                   table_dtype(w)))
    return results


def mixed_tables(config: WorkloadConfig, dtypes: Iterable[str], dataset: str) -> tuple[list[Table],
                                                                                        list[tuple[torch.Tensor, torch.Tensor]]]:
    """A batch whose tables differ: one table per dtype at the config's E and D, then a table of
    a prime E with D + 4 and one of D / 2 rounded to 4 (each with its own trace of `dataset`),
    the shapes a table-batched launch must mix."""
    kinds = list(dtypes) or ["fp32"]
    shapes = [(config.E, config.D, dt) for dt in kinds]
    shapes += [(211, config.D + 4, kinds[0]), (127, max(4, config.D // 8 * 4), kinds[-1])]
    tables, batch = [], []
    for t, (E, D, dt) in enumerate(shapes):
        tables.append(make_table(dt, E, D, config.seed + t))
        idx, off = generate(dataset, config.replace(E=E, D=D), tables=[t]).tables[0].batch(0)
        batch.append((torch.from_numpy(idx.copy()), torch.from_numpy(off.copy())))
    return tables, batch


#: batches the cache variant is checked over (its cache carries over from one to the next)
CACHE_CHECK_BATCHES = 4


def cache_trace(dataset: str, config: WorkloadConfig) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    """CACHE_CHECK_BATCHES batches of table 0 and, to warm the cache, table 1's first batch
    (a different hot set, so the cache must evict what it was warmed with)."""
    ds = generate(dataset, config.replace(batches=max(config.batches, CACHE_CHECK_BATCHES)), tables=[0, 1])
    batches = []
    for b in range(CACHE_CHECK_BATCHES):
        i, o = ds.tables[0].batch(b)
        batches.append((torch.from_numpy(i.copy()), torch.from_numpy(o.copy())))
    return batches, torch.from_numpy(ds.tables[1].batch(0)[0].copy())


def check_cache_batches(variant: str, weight: Table, batches: list[tuple[torch.Tensor, torch.Tensor]],
                        warm: torch.Tensor | None, *, mode: str = "sum", padding_idx: int | None = None,
                        params: dict | None = None, backend: str | None = None, dataset: str = "",
                        gpu=None) -> CheckResult:
    """A host-resident variant over several batches with one cache: each batch against torch
    on the full table, and after each the cache's maps and slots against the host table.
    `warm`: the trace whose frequencies warm the cache (another table's, so rows get evicted)."""
    backend = backend or default_backend()
    device = "cuda" if backend == "cuda" else "cpu"
    E, D = weight.shape
    dtype = table_dtype(weight)
    wide = dequantize(weight).double()
    longest = max((int(np.diff(np.append(o.numpy(), i.shape[0])).max(initial=1)) for i, o in batches), default=1)
    tol = tolerance(dtype, variant, longest, float(wide.abs().max()))
    err, consistent, o2b_ok, size_ok = 0.0, True, True, True
    try:
        for idx, _ in batches:
            check_indices(idx, E)
        tk = bind(variant, weight.clone(), trace=warm, params=params, mode=mode, padding_idx=padding_idx,
                  backend=backend, gpu=gpu)
        try:
            for idx, off in batches:
                ref = torch.nn.functional.embedding_bag(idx, wide, off, mode=mode, padding_idx=padding_idx)
                out = tk.launch(idx.to(device), off.to(device))
                if off.shape[0]:
                    err = max(err, float((out.output.double().cpu() - ref).abs().max()))
                exp_o2b, exp_size = expected_bags(off.numpy(), idx.shape[0], idx.numpy(),
                                                  None if padding_idx is None else padding_idx % E)
                o2b_ok &= bool(np.array_equal(out.offset2bag.cpu().numpy(), exp_o2b))
                size_ok &= bool(np.array_equal(out.bag_size.cpu().numpy(), exp_size))
                if tk.cache is not None:
                    consistent &= tk.cache.consistent()
            stats = tk.cache.stats if tk.cache is not None else []
        finally:
            tk.close()
    except ENVIRONMENT:
        raise
    except CharacterizeError as e:
        return CheckResult(variant, dataset, mode, f"D={D} E={E} batches={len(batches)}", backend, float("nan"), tol,
                           None, None, False, str(e), dtype)
    C = tk.params.get("C", 0)
    shape = f"B={batches[0][1].shape[0]} D={D} E={E} batches={len(batches)} C={C}"
    note = ""
    if stats:
        uniq, hits = sum(s.unique for s in stats), sum(s.hits for s in stats)
        note = (f"{sum(s.misses for s in stats)} misses, {sum(s.admitted for s in stats)} admitted, "
                f"{sum(s.evicted for s in stats)} evicted, hit rate {100 * hits / max(uniq, 1):.0f}% of unique rows")
    passed = err <= tol and consistent and o2b_ok and size_ok
    return CheckResult(variant, dataset, mode, shape, backend, err, tol, o2b_ok, size_ok, passed,
                       "" if consistent else "the cache's maps or slots disagree with the host table", dtype, note)


def _reads(variant: str, D: int, dtype: str) -> bool:
    """Whether `variant` reads tables of D x dtype."""
    try:
        get_variant(variant).check_shape(D, dtype)
    except UnsupportedShape:
        return False
    return True


def check_bytes(config: WorkloadConfig, dtypes: Iterable[str], datasets: Iterable[str] = ()) -> int:
    """Host memory the check needs at most: every dtype's table, the float32 draw and the
    float64 reference of one table, a copy the variant runs on, and one dataset's trace."""
    kinds = list(dtypes) or [config.dtype]
    tables = sum(config.replace(dtype=k).table_bytes for k in kinds if k in DTYPES)
    widest = max((config.replace(dtype=k).table_bytes for k in kinds if k in DTYPES), default=0)
    reference = config.E * config.D * (4 + 4 + 8)
    traces = max((generation_bytes(h, config, 2) for h in (parse_dataset(d) for d in datasets)
                  if isinstance(h, Hotness)), default=0)
    return tables + widest + reference + traces


def _verdict(r: CheckResult) -> str:
    """How a progress line says a check ended: a skipped one (passed None) is not a failure."""
    return "ok" if r.passed else "skipped" if r.passed is None else "FAIL"


def check_variants(variants: Iterable[str] | None = None, datasets: Iterable[str] = HOTNESS_ORDER,
                   config: WorkloadConfig | None = None, modes: Iterable[str] = ("sum", "mean"),
                   backend: str | None = None, params: dict[str, dict] | None = None,
                   progress: Callable[[str], None] | None = None,
                   dtypes: Iterable[str] | None = None, gpu=None) -> list[CheckResult]:
    """Check every variant x dtype x dataset x mode on the first batch of table 0
    (dtypes: the config's, or the given ones). `gpu`: the device's GpuSpec, asked for
    once by the caller (without it, each CUDA check asks the driver again)."""
    config = config or WorkloadConfig.tiny()
    names = list(variants) if variants is not None else built_in()
    params = params or {}
    results = []
    kinds = list(dtypes) if dtypes is not None else [config.dtype]
    for bad in set(kinds) - set(DTYPES):
        get_variant("base").check_dtype(bad)
    if backend == "cuda":
        require_gpu()   # before any work: NoCudaDevice, not a failure deep in torch
    check_memory(check_bytes(config, kinds, datasets),
                 f"checking on tables of E={config.E:,} x D={config.D} ({', '.join(kinds)})",
                 "lower E or D (the check runs at a small odd shape unless --paper-shape or --E/--D say otherwise)")
    tables = {dt: make_table(dt, config.E, config.D, config.seed) for dt in kinds}
    for ds_name in datasets:
        ds = generate(ds_name, config, tables=[0])
        idx_np, off_np = ds.tables[0].batch(0)
        idx, off = torch.from_numpy(idx_np.copy()), torch.from_numpy(off_np.copy())
        if any(get_variant(n).host == "cache" for n in names):   # several batches; warmed from table 1's trace
            cache_batches, cache_warm = cache_trace(ds_name, config)
        for dtype, weight in tables.items():
            for mode in modes:
                for name in names:
                    try:
                        get_variant(name).check_shape(config.D, dtype)
                    except UnsupportedShape as e:
                        results.append(CheckResult(name, ds_name, mode, f"D={config.D}", backend or default_backend(),
                                                   float("nan"), float("nan"), None, None, None, f"skipped: {e}",
                                                   dtype))
                        continue
                    r = check_one(name, weight, idx, off, mode=mode, params=params.get(name), backend=backend,
                                  dataset=ds_name, gpu=gpu)
                    if progress:
                        progress(f"{name:9s} {dtype:5s} {ds_name:9s} {mode:4s} {_verdict(r)}")
                    results.append(r)
                    v = get_variant(name)
                    # a batched variant on several shapes in one launch: ours mixes every dtype, FBGEMM's module
                    # holds one precision (and is skipped where it is not installed or refuses the shape)
                    if v.batched and (dtype == kinds[-1] or v.peer) and r.passed is not None:
                        mixed = [dtype] if v.peer else [d for d in kinds if _reads(name, config.D, d)]
                        tables_, batch_ = mixed_tables(config, mixed, ds_name)
                        for r in check_tables(name, tables_, batch_, mode=mode, params=params.get(name),
                                              backend=backend, dataset=ds_name):
                            if progress:
                                progress(f"{name:9s} {r.dtype:5s} {ds_name:9s} {mode:4s} {_verdict(r)} "
                                         f"({r.shape})")
                            results.append(r)
                    if get_variant(name).host == "cache":
                        r = check_cache_batches(name, weight, cache_batches, cache_warm, mode=mode,
                                                params=params.get(name), backend=backend, dataset=ds_name, gpu=gpu)
                        if progress:
                            progress(f"{name:9s} {dtype:5s} {ds_name:9s} {mode:4s} {_verdict(r)} "
                                     f"over {len(cache_batches)} batches ({r.note})")
                        results.append(r)
    return results
