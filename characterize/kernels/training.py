"""Kernels stage, training: the embedding bag's backward and optimizer kernels of our own
(cuda/embedding_bag_backward.cu), their registry, ctypes bindings and static facts.

Why a second family: the training step's embedding gradient is a scatter (each bag's
gradient row added into every row it looked up), so its cost is atomics or a sort
plus a segmented reduction, and an optimizer pass over the touched rows; FBGEMM fuses
the last two. These kernels make each choice visible in registers, occupancy and SASS
(`characterize sass --training`) and give the model the facts it reads.

Host side (torch): sorting the lookups by row for the sorted and fused kernels
(`sort_lookups`), bag sizes for mean pooling. The same calls drive the CUDA build
(CUDA tensors) and the CPU-emulation build (CPU tensors).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Iterable, NamedTuple

import pandas as pd
import torch

from characterize.config import DEFAULT_ARCHS, DTYPES
from characterize.errors import (
    BuildError,
    ConfigError,
    KernelLaunchError,
    NoCudaDevice,
    UnsupportedShape,
)
from characterize.hardware.specs import ARCHS, normalize_arch
from characterize.kernels.build import TRAINING_SOURCE, BuildResult, BuildSpec, build, build_many
from characterize.kernels.library import TORCH_DTYPES, CudaLibrary
from characterize.kernels.occupancy import theoretical_occupancy
from characterize.kernels.sass import MEMORY_LATENCY, LoopRow, analyze_kernel, kernel_code, kernels_in
from characterize.kernels.static import StaticRow
from characterize.kernels.training_registry import (  # the registry, re-exported for the callers that launch
    BLOCK,
    CUDA_BACKWARDS,  # noqa: F401
    MIN_CHUNK,  # noqa: F401
    OPTIMIZERS,  # noqa: F401
    TRAINING_KERNELS,
    TRAINING_ORDER,
    UPDATE_DTYPES,
    TrainingKernel,
    chunks,
    get_training_kernel,
    kernel_for,
    segment_chunk,
)


# ---------------------------------------------------------------- C interface
class BwdArgs(ctypes.Structure):
    _fields_ = [
        ("grad_output", ctypes.c_void_p), ("num_bags", ctypes.c_int64), ("dim", ctypes.c_int64),
        ("num_rows", ctypes.c_int64), ("indices", ctypes.c_void_p), ("offsets", ctypes.c_void_p),
        ("num_indices", ctypes.c_int64), ("bag_size", ctypes.c_void_p), ("per_sample_weights", ctypes.c_void_p),
        ("mode", ctypes.c_int32), ("dtype", ctypes.c_int32), ("padding_idx", ctypes.c_int64),
        ("sorted_bag", ctypes.c_void_p), ("sorted_pos", ctypes.c_void_p), ("segment_start", ctypes.c_void_p),
        ("segment_row", ctypes.c_void_p), ("state_row", ctypes.c_void_p), ("num_segments", ctypes.c_int64),
        ("grad_weight", ctypes.c_void_p), ("weight", ctypes.c_void_p), ("weight_stride0", ctypes.c_int64),
        ("momentum", ctypes.c_void_p), ("lr", ctypes.c_float), ("eps", ctypes.c_float),
        ("chunk_begin", ctypes.c_void_p), ("chunk_end", ctypes.c_void_p), ("num_chunks", ctypes.c_int64),
        ("segment_partials", ctypes.c_void_p), ("partials", ctypes.c_void_p),
    ]


class TrainingLibrary(CudaLibrary):
    """The training kernels' library."""

    def __init__(self, result: BuildResult):
        super().__init__(result)
        L = self.lib
        for k in TRAINING_KERNELS.values():
            fn = getattr(L, k.entry)
            fn.argtypes = [ctypes.POINTER(BwdArgs), ctypes.c_int, ctypes.c_void_p]
            fn.restype = ctypes.c_int
        L.chz_bwd_chunks.argtypes = [ctypes.c_int64]
        L.chz_bwd_kernel_info.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
                                          ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
        if L.chz_bwd_args_size() != ctypes.sizeof(BwdArgs):
            raise KernelLaunchError(f"{result.library}: chz_bwd_args is {L.chz_bwd_args_size()} bytes in C but "
                                    f"{ctypes.sizeof(BwdArgs)} in Python; rebuild after updating both")

    def kernel_info(self, kernel: str, D: int) -> tuple[int, int]:
        """(resident blocks per SM, registers per thread) as the CUDA runtime reports them."""
        k = get_training_kernel(kernel)
        blocks, regs = ctypes.c_int(), ctypes.c_int()
        self.check(self.lib.chz_bwd_kernel_info(k.kind.encode(), chunks(D), BLOCK, ctypes.byref(blocks),
                                                ctypes.byref(regs)), f"querying {kernel}")
        return blocks.value, regs.value


_OPEN: dict[str, TrainingLibrary] = {}


def training_spec(backend: str, arch: str | None = None, dtype: str = "fp32", output: str = "library") -> BuildSpec:
    """The training library's build; `output="cubin"`: its device code alone, what the
    static facts and the SASS read (the same kernels and resources, no host compile)."""
    return BuildSpec(backend, arch, None, dtype, source=TRAINING_SOURCE, output=output)


def load_training_library(device: torch.device, dtype: str = "fp32") -> TrainingLibrary:
    """The library for tensors on `device`: the CUDA build for the GPU's architecture,
    or the CPU-emulation build for CPU tensors."""
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise NoCudaDevice("no CUDA device: the CUDA build of the training kernels cannot be loaded here; "
                               "CPU tensors run them through the emulation build")
        major, minor = torch.cuda.get_device_capability(device)
        spec = training_spec("cuda", f"sm_{major}{minor}", dtype)
    else:
        spec = training_spec("emulate", None, dtype)
    result = build(spec)
    key = str(result.library)
    if key not in _OPEN:
        _OPEN[key] = TrainingLibrary(result)
    return _OPEN[key]


# ------------------------------------------------------------------ host side
class BagLayout(NamedTuple):
    """Which bag each lookup belongs to, and each bag's non-padding lookups (mean pooling)."""

    offset2bag: torch.Tensor  # [N] int64
    bag_size: torch.Tensor    # [B] int64


def bag_layout(indices: torch.Tensor, offsets: torch.Tensor, padding_idx: int | None = None) -> BagLayout:
    """torch's 1-D convention: bag b covers [offsets[b], offsets[b+1]), the last bag ends
    at N, offsets[0] counts as 0. Decreasing offsets are refused."""
    N, B = indices.shape[0], offsets.shape[0]
    starts = offsets.clone()
    if B:
        starts[0] = 0
    ends = torch.cat([starts[1:], torch.tensor([N], dtype=starts.dtype, device=starts.device)])
    lengths = ends - starts
    if B and (bool((lengths < 0).any()) or int(starts[-1]) > N):
        raise ConfigError("offsets must be non-decreasing and at most the number of indices")
    o2b = torch.repeat_interleave(torch.arange(B, device=indices.device), lengths)
    keep = indices != padding_idx if padding_idx is not None else torch.ones_like(indices, dtype=torch.bool)
    size = torch.zeros(B, dtype=torch.int64, device=indices.device).index_add_(0, o2b, keep.to(torch.int64))
    return BagLayout(o2b, size)


@dataclass(frozen=True)
class SortedLookups:
    """The lookups sorted by row (stable, so equal rows keep lookup order), split into
    one segment per unique row; padding lookups left out. Segments longer than `chunk`
    lookups are split into chunks summed by a first pass (their partial rows)."""

    sorted_bag: torch.Tensor     # [M] bag of each sorted lookup
    sorted_pos: torch.Tensor     # [M] its position in lookup order
    segment_start: torch.Tensor  # [U + 1]
    segment_row: torch.Tensor    # [U] unique rows, ascending
    chunk: int = 0               # lookups per chunk (segment_chunk of the longest segment)
    chunk_begin: torch.Tensor | None = None      # [K] first sorted lookup of each chunk
    chunk_end: torch.Tensor | None = None        # [K]
    segment_partials: torch.Tensor | None = None  # [U + 1]: segment s adds partial rows [p[s], p[s+1])

    @property
    def num_chunks(self) -> int:
        return 0 if self.chunk_begin is None else int(self.chunk_begin.shape[0])

    @property
    def num_segments(self) -> int:
        return int(self.segment_row.shape[0])


def sort_lookups(indices: torch.Tensor, layout: BagLayout, padding_idx: int | None = None,
                 chunk: int | None = None) -> SortedLookups:
    """What the sorted and fused kernels walk, sorted by torch (radix sort on a GPU);
    `chunk` (default: segment_chunk of the longest segment) splits long segments."""
    pos = torch.arange(indices.shape[0], device=indices.device)
    if padding_idx is not None:
        pos = pos[indices != padding_idx]
    rows, order = torch.sort(indices[pos], stable=True)
    pos = pos[order]
    unique, counts = torch.unique_consecutive(rows, return_counts=True)
    start = torch.zeros(unique.shape[0] + 1, dtype=torch.int64, device=indices.device)
    torch.cumsum(counts, 0, out=start[1:])
    sorted_bag = layout.offset2bag[pos].contiguous()
    longest = int(counts.max()) if counts.numel() else 0
    chunk = chunk or segment_chunk(longest)
    if longest <= chunk:
        return SortedLookups(sorted_bag, pos.contiguous(), start, unique.contiguous(), chunk)
    pieces = torch.where(counts > chunk, (counts + chunk - 1) // chunk, 0)
    partials = torch.zeros(unique.shape[0] + 1, dtype=torch.int64, device=indices.device)
    torch.cumsum(pieces, 0, out=partials[1:])
    owner = torch.repeat_interleave(torch.arange(unique.shape[0], device=indices.device), pieces)
    begin = start[owner] + (torch.arange(owner.shape[0], device=indices.device) - partials[owner]) * chunk
    end = torch.minimum(begin + chunk, start[owner + 1])
    return SortedLookups(sorted_bag, pos.contiguous(), start, unique.contiguous(), chunk, begin.contiguous(),
                         end.contiguous(), partials)


def _ptr(t: torch.Tensor | None) -> int | None:
    return t.data_ptr() if t is not None else None


def _prepare(grad_output: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, num_rows: int, mode: str,
             per_sample_weights: torch.Tensor | None, padding_idx: int | None) -> tuple[BwdArgs, list, BagLayout]:
    if mode not in ("sum", "mean"):
        raise ConfigError(f"mode must be sum or mean, got {mode!r}")
    if per_sample_weights is not None and mode != "sum":
        raise ConfigError("per-sample weights need sum pooling (as torch.nn.functional.embedding_bag)")
    if grad_output.dtype != torch.float32 or grad_output.dim() != 2 or grad_output.shape[0] != offsets.shape[0]:
        raise ConfigError("grad_output must be an fp32 [bags, D] tensor with one row per offset")
    D = grad_output.shape[1]
    chunks(D)
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= num_rows):
        bad = int(torch.nonzero((indices < 0) | (indices >= num_rows))[0, 0])
        raise UnsupportedShape(f"indices: index {int(indices[bad])} at position {bad} is outside [0, {num_rows})")
    grad_output = grad_output.contiguous()
    indices, offsets = indices.to(torch.int64).contiguous(), offsets.to(torch.int64).contiguous()
    layout = bag_layout(indices, offsets, padding_idx)
    psw = per_sample_weights.to(torch.float32).contiguous() if per_sample_weights is not None else None
    args = BwdArgs(grad_output=grad_output.data_ptr(), num_bags=offsets.shape[0], dim=D, num_rows=num_rows,
                   indices=indices.data_ptr(), offsets=offsets.data_ptr(), num_indices=indices.shape[0],
                   bag_size=layout.bag_size.data_ptr(), per_sample_weights=_ptr(psw),
                   mode=1 if mode == "mean" else 0, dtype=DTYPES["fp32"].code,
                   padding_idx=-1 if padding_idx is None else padding_idx)
    return args, [grad_output, indices, offsets, layout, psw], layout


def _set_sorted(args: BwdArgs, s: SortedLookups, keep: list) -> None:
    args.sorted_bag, args.sorted_pos = s.sorted_bag.data_ptr(), s.sorted_pos.data_ptr()
    args.segment_start, args.segment_row = s.segment_start.data_ptr(), s.segment_row.data_ptr()
    args.num_segments = s.num_segments
    if s.num_chunks:
        partials = torch.empty(s.num_chunks, args.dim, dtype=torch.float32, device=s.sorted_bag.device)
        keep += [s, partials]
        args.chunk_begin, args.chunk_end, args.num_chunks = (s.chunk_begin.data_ptr(), s.chunk_end.data_ptr(),
                                                             s.num_chunks)
        args.segment_partials, args.partials = s.segment_partials.data_ptr(), partials.data_ptr()


def _stream(device: torch.device) -> int | None:
    return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else None


@dataclass
class BoundKernel:
    """A training kernel with its inputs prepared (bags laid out, lookups sorted): `launch`
    only launches, so a GPU timing brackets the kernel alone."""

    kernel: TrainingKernel
    library: TrainingLibrary
    args: BwdArgs
    device: torch.device
    keep: list                              # the tensors the args point into
    grad: torch.Tensor | None = None        # the dense gradient (atomic, sorted)
    sorted: SortedLookups | None = None

    def launch(self, grid: int = 0) -> None:
        code = getattr(self.library.lib, self.kernel.entry)(ctypes.byref(self.args), grid, _stream(self.device))
        self.library.check(code, self.kernel.name)


def bind_backward(kernel: str, grad_output: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                  num_rows: int, *, mode: str = "sum", per_sample_weights: torch.Tensor | None = None,
                  padding_idx: int | None = None, chunk: int | None = None) -> BoundKernel:
    """`kernel` (cuda-atomic, cuda-sorted, or the test-only cuda-wrong) ready to write the
    dense fp32 gradient [num_rows, D] into its zeroed `grad`."""
    k = get_training_kernel(kernel)
    if k.optimizer:
        raise ConfigError(f"{kernel} updates the table; call fused_update")
    args, keep, layout = _prepare(grad_output, indices, offsets, num_rows, mode, per_sample_weights, padding_idx)
    grad = torch.zeros(num_rows, grad_output.shape[1], dtype=torch.float32, device=grad_output.device)
    args.grad_weight = grad.data_ptr()
    s = None
    if k.sorted:
        s = sort_lookups(keep[1], layout, padding_idx, chunk)
        _set_sorted(args, s, keep)
    return BoundKernel(k, load_training_library(grad_output.device), args, grad_output.device, keep, grad, s)


def backward(kernel: str, grad_output: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, num_rows: int, *,
             mode: str = "sum", per_sample_weights: torch.Tensor | None = None, padding_idx: int | None = None,
             grid: int = 0, chunk: int | None = None) -> torch.Tensor:
    """The dense fp32 gradient [num_rows, D] of an embedding bag's table, as autograd of
    torch.nn.functional.embedding_bag gives it, by `kernel` (cuda-atomic, cuda-sorted,
    or the test-only cuda-wrong). `grid`: blocks (0: one warp per bag or segment);
    `chunk`: lookups per chunk of a split segment (default: segment_chunk)."""
    b = bind_backward(kernel, grad_output, indices, offsets, num_rows, mode=mode,
                      per_sample_weights=per_sample_weights, padding_idx=padding_idx, chunk=chunk)
    b.launch(grid)
    return b.grad


def bind_update(weight: torch.Tensor, grad_output: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, *,
                optimizer: str = "sgd", lr: float = 0.05, momentum: torch.Tensor | None = None, eps: float = 1e-8,
                mode: str = "sum", per_sample_weights: torch.Tensor | None = None, padding_idx: int | None = None,
                table_rows: torch.Tensor | None = None, chunk: int | None = None) -> BoundKernel:
    """The fused backward + update of `fused_update`, ready to launch (each launch updates
    the table again)."""
    k = kernel_for("cuda-fused", optimizer)
    dtype = next((n for n in UPDATE_DTYPES if TORCH_DTYPES[n] == weight.dtype), None)
    if dtype is None or weight.dim() != 2 or weight.stride(1) != 1:
        raise UnsupportedShape(f"the fused update reads and writes {', '.join(UPDATE_DTYPES)} tables with "
                               f"contiguous rows; got {weight.dtype} with strides {tuple(weight.stride())}")
    if weight.device != grad_output.device:
        raise ConfigError("the table and the gradient must be on the same device")
    if optimizer == "rowwise_adagrad":
        if momentum is None or momentum.dtype != torch.float32 or momentum.shape != (weight.shape[0],) or \
                not momentum.is_contiguous():
            raise ConfigError("row-wise Adagrad needs a contiguous fp32 momentum with one value per table row")
    if grad_output.shape[1:] != weight.shape[1:]:
        raise ConfigError(f"grad_output has D={grad_output.shape[1]} but the table D={weight.shape[1]}")
    args, keep, layout = _prepare(grad_output, indices, offsets, weight.shape[0], mode, per_sample_weights,
                                  padding_idx)
    s = sort_lookups(keep[1], layout, padding_idx, chunk)
    _set_sorted(args, s, keep)
    if table_rows is not None:   # the segments' rows in the table's order; the momentum keeps the original ids
        mapped = table_rows[s.segment_row].contiguous()
        keep.append(mapped)
        args.state_row, args.segment_row = s.segment_row.data_ptr(), mapped.data_ptr()
        if padding_idx is not None:
            args.padding_idx = int(table_rows[padding_idx])
    args.weight, args.weight_stride0, args.dtype = weight.data_ptr(), weight.stride(0), DTYPES[dtype].code
    args.momentum = _ptr(momentum)
    args.lr, args.eps = lr, eps
    keep += [weight, momentum]
    return BoundKernel(k, load_training_library(weight.device, dtype), args, weight.device, keep, None, s)


def fused_update(weight: torch.Tensor, grad_output: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, *,
                 optimizer: str = "sgd", lr: float = 0.05, momentum: torch.Tensor | None = None, eps: float = 1e-8,
                 mode: str = "sum", per_sample_weights: torch.Tensor | None = None,
                 padding_idx: int | None = None, table_rows: torch.Tensor | None = None, grid: int = 0,
                 chunk: int | None = None) -> None:
    """The backward fused with the table's update, in place: SGD, or row-wise Adagrad
    (`momentum`: one fp32 per row, indexed by the original row ids). `table_rows` maps an
    original row id to its row in `weight` when the table is kept reordered (l2w)."""
    bind_update(weight, grad_output, indices, offsets, optimizer=optimizer, lr=lr, momentum=momentum, eps=eps,
                mode=mode, per_sample_weights=per_sample_weights, padding_idx=padding_idx,
                table_rows=table_rows, chunk=chunk).launch(grid)


# ------------------------------------------------------------- static facts
def _kernels(names: Iterable[str] | None) -> list[TrainingKernel]:
    return [get_training_kernel(n) for n in (TRAINING_ORDER if names is None else names)]


def training_static(kernels: Iterable[str] | None = None, archs: Iterable[str] = DEFAULT_ARCHS, D: int = 128,
                    dtype: str = "fp32") -> list[StaticRow]:
    """Registers, spills and theoretical occupancy of each training kernel per
    architecture (256-thread blocks), from ptxas as the forward's static rows."""
    chosen = _kernels(kernels)
    arch_list = [normalize_arch(a) for a in archs]
    results = build_many([training_spec("cuda", a, dtype, "cubin") for a in arch_list])
    rows = []
    for a in arch_list:
        result = results[training_spec("cuda", a, dtype, "cubin")]
        for k in chosen:
            res = result.resources(k.kernel_name(D))
            occ = theoretical_occupancy(ARCHS[a], BLOCK, res.registers, res.shared_mem)
            rows.append(StaticRow(k.name, a, None, k.kernel_name(D), k.role, res.registers, res.spill_stores,
                                  res.spill_loads, res.stack_frame, res.shared_mem, BLOCK, occ.blocks_per_sm,
                                  occ.occupancy_pct, occ.limiter, False, result.compiler, dtype))
    return rows


def training_sass(kernels: Iterable[str] | None = None, archs: Iterable[str] = DEFAULT_ARCHS, D: int = 128,
                  dtype: str = "fp32", *, memory_latency: int = MEMORY_LATENCY) -> list[LoopRow]:
    """The hot loop of each training kernel per architecture: row loads (bag-gradient
    gathers), index loads, atomics, spills, latencies serialized per iteration."""
    chosen = _kernels(kernels)
    arch_list = [normalize_arch(a) for a in archs]
    results = build_many([training_spec("cuda", a, dtype, "cubin") for a in arch_list])
    rows = []
    for a in arch_list:
        result = results[training_spec("cuda", a, dtype, "cubin")]
        kernels_in(result.library)
        for k in chosen:
            name = k.kernel_name(D)
            row = analyze_kernel(kernel_code(result, name), nest=False, variant=k.name, arch=a, role=k.role,
                                 registers=result.resources(name).registers, memory_latency=memory_latency,
                                 dtype=dtype)
            if row is None:
                raise BuildError(f"no loop gathering or scattering rows found in {name} ({result.spec.label()})")
            rows.append(row)
    return rows


def training_facts(kernels: Iterable[str] | None = None, archs: Iterable[str] = DEFAULT_ARCHS, D: int = 128,
                   dtype: str = "fp32") -> pd.DataFrame:
    """One row per (kernel, arch): the static row and the hot loop joined, the inputs of
    the training-stage model (analysis.model.e2e). Columns: kernel, arch, role,
    registers, spill_stores, spill_loads, blocks_per_sm, theoretical_occupancy_pct,
    warps_per_block, instructions, lookups_per_iteration, row_loads, index_loads,
    atomics, atomic_bits, local_mem_ops, latencies_per_iteration, rows_in_flight."""
    names = list(kernels) if kernels is not None else list(TRAINING_ORDER)
    static = {(r.variant, r.arch): r for r in training_static(names, archs, D, dtype)}
    out = []
    for r in training_sass(names, archs, D, dtype):
        s = static[(r.variant, r.arch)]
        out.append({"kernel": r.variant, "arch": r.arch, "role": r.role, "registers": s.registers,
                    "spill_stores": s.spill_stores, "spill_loads": s.spill_loads, "blocks_per_sm": s.blocks_per_sm,
                    "theoretical_occupancy_pct": s.theoretical_occupancy_pct, "warps_per_block": BLOCK // 32,
                    "instructions": r.instructions, "lookups_per_iteration": r.lookups_per_iteration,
                    "row_loads": r.row_loads, "index_loads": r.index_loads, "atomics": r.atomics,
                    "atomic_bits": r.atomic_bits, "local_mem_ops": r.local_mem_ops,
                    "latencies_per_iteration": r.latencies_per_iteration, "rows_in_flight": r.rows_in_flight})
    return pd.DataFrame(out)
