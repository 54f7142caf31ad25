"""Kernels stage, launching: load a built library, bind a variant to one table, launch it.

A variant bound to one table (`TableKernel`) owns what the technique needs beside the
lookup kernel: the hot-row list for L2 pinning, the frequency-sorted table and index
remap for the access-policy window. The same launch code drives the CUDA build (CUDA
tensors) and the CPU-emulation build (CPU tensors), so correctness is checked without a GPU.
"""

from __future__ import annotations

import ctypes
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, NamedTuple, Sequence

import numpy as np
import torch

from characterize.config import DTYPES, QUANTIZED, dtype_spec
from characterize.errors import (
    ConfigError,
    KernelLaunchError,
    NoCudaDevice,
    UnsupportedShape,
)
from characterize.hardware.devices import devices
from characterize.hardware.specs import REFERENCE_ARCH, gpu_spec
from characterize.kernels.build import TBE_SOURCE, BuildResult, BuildSpec, build
from characterize.kernels.cache import HostCache, ManagedTable
from characterize.kernels.fbgemm import INSTALL_HINT as FBGEMM_INSTALL
from characterize.kernels.fbgemm import FbgemmBatch, FbgemmTable
from characterize.kernels.fbgemm import available as fbgemm_available
from characterize.kernels.fbgemm import build_variant as fbgemm_build
from characterize.kernels.order import choose_tables_in_flight, coverage_curve
from characterize.kernels.outputs import BagOutputs
from characterize.kernels.registry import (
    TBE_MAX_TABLES,
    Variant,
    default_cache_rows,
    get_variant,
    uvm_mode,
)
from characterize.kernels.static import resolve_params
from characterize.kernels.user import UserLibrary


# ---------------------------------------------------------------- C interface
class BagArgs(ctypes.Structure):
    _fields_ = [
        ("weight", ctypes.c_void_p), ("num_rows", ctypes.c_int64), ("dim", ctypes.c_int64),
        ("indices", ctypes.c_void_p), ("num_indices", ctypes.c_int64),
        ("offsets", ctypes.c_void_p), ("num_bags", ctypes.c_int64),
        ("output", ctypes.c_void_p), ("offset2bag", ctypes.c_void_p), ("bag_size", ctypes.c_void_p),
        ("mode", ctypes.c_int32), ("dtype", ctypes.c_int32), ("padding_idx", ctypes.c_int64),
        ("weight_stride0", ctypes.c_int64), ("weight_stride1", ctypes.c_int64),
        ("per_sample_weights", ctypes.c_void_p), ("per_sample_weights_stride", ctypes.c_int64),
    ]


class LaunchArgs(ctypes.Structure):
    _fields_ = [("block_x", ctypes.c_int32), ("block_y", ctypes.c_int32), ("grid", ctypes.c_int32),
                ("prefetch_distance", ctypes.c_int32)]


class Window(ctypes.Structure):
    """chz_window: the access-policy window an l2w launch carries (a launch attribute)."""

    _fields_ = [("base", ctypes.c_void_p), ("bytes", ctypes.c_uint64), ("hit_ratio", ctypes.c_float)]


class EmuState(ctypes.Structure):
    _fields_ = [("l2_bytes", ctypes.c_uint64), ("max_persisting_bytes", ctypes.c_uint64),
                ("max_window_bytes", ctypes.c_uint64), ("persisting_limit", ctypes.c_uint64),
                ("persisting_resets", ctypes.c_int64), ("window_base", ctypes.c_uint64),
                ("window_bytes", ctypes.c_uint64), ("window_hit_ratio", ctypes.c_float),
                ("window_hit_prop", ctypes.c_int32), ("window_miss_prop", ctypes.c_int32),
                ("_pad", ctypes.c_int32), ("prefetch_count", ctypes.c_int64),
                ("launch_window_base", ctypes.c_uint64), ("launch_window_bytes", ctypes.c_uint64),
                ("launch_window_hit_ratio", ctypes.c_float), ("_pad2", ctypes.c_int32),
                ("windowed_launches", ctypes.c_int64)]


class CudaLibrary:
    """A built kernel library (CUDA or the CPU emulation) opened with ctypes: what every
    library of ours exports (chz_error_string, chz_dtype) and how its codes become errors."""

    def __init__(self, result: BuildResult):
        self.build = result
        self.emulated = result.spec.target == "emulate"
        try:
            self.lib = ctypes.CDLL(str(result.library))
        except OSError as e:
            raise KernelLaunchError(f"cannot load {result.library}: {e}") from None
        self.lib.chz_error_string.argtypes = [ctypes.c_int]
        self.lib.chz_error_string.restype = ctypes.c_char_p
        self.dtype = next(d.name for d in DTYPES.values() if d.code == self.lib.chz_dtype())

    def check(self, code: int, what: str) -> None:
        if code == 0:
            return
        message = self.lib.chz_error_string(code).decode(errors="replace")
        if code in (10002, 10004):   # CHZ_ERR_UNSUPPORTED, CHZ_ERR_DTYPE: the shape, not a failure
            raise UnsupportedShape(f"{what}: {message}")
        raise KernelLaunchError(f"{what} failed: {message} (code {code})")


class KernelLibrary(CudaLibrary):
    """The lookup kernels' libchz.so."""

    def __init__(self, result: BuildResult):
        super().__init__(result)
        L = self.lib
        for name in ("chz_forward_base", "chz_forward_rpf", "chz_forward_warp", "chz_forward_wrong"):
            fn = getattr(L, name)
            fn.argtypes = [ctypes.POINTER(BagArgs), ctypes.POINTER(LaunchArgs), ctypes.c_void_p]
            fn.restype = ctypes.c_int
        L.chz_forward_base_window.argtypes = [ctypes.POINTER(BagArgs), ctypes.POINTER(LaunchArgs), ctypes.c_void_p,
                                              ctypes.POINTER(Window)]
        L.chz_forward_base_window.restype = ctypes.c_int
        L.chz_l2_window_plan.argtypes = [ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_float)]
        L.chz_l2_window_plan.restype = ctypes.c_int
        L.chz_l2_pin.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                 ctypes.c_int64, ctypes.c_void_p]
        L.chz_l2_pin.restype = ctypes.c_int
        L.chz_l2_state_size.restype = ctypes.c_int
        L.chz_l2_window_save.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        L.chz_l2_window_apply.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64,
                                          ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                                          ctypes.POINTER(ctypes.c_float)]
        L.chz_l2_window_restore.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        L.chz_warp_group.argtypes = [ctypes.c_int64]
        L.chz_l2_reset.restype = ctypes.c_int
        L.chz_l2_set_aside.argtypes = [ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64)]
        L.chz_l2_set_aside_restore.argtypes = [ctypes.c_uint64]
        L.chz_kernel_info.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                                      ctypes.POINTER(ctypes.c_int)]
        if self.emulated:
            L.chz_emu_get_state.argtypes = [ctypes.POINTER(EmuState)]
            L.chz_emu_configure.argtypes = [ctypes.c_uint64] * 3
            L.chz_emu_prefetch_log.argtypes = [ctypes.c_void_p, ctypes.c_int64]
            L.chz_emu_prefetch_log.restype = ctypes.c_int64

    def l2_set_aside(self, nbytes: int) -> tuple[int, int]:
        """Set the persisting-L2 set-aside for `nbytes` of pinned rows (capped by the
        device); returns (granted, previous) bytes. Restore with l2_set_aside_restore."""
        granted, previous = ctypes.c_uint64(), ctypes.c_uint64()
        self.check(self.lib.chz_l2_set_aside(nbytes, ctypes.byref(granted), ctypes.byref(previous)),
                   "setting the persisting-L2 set-aside")
        return granted.value, previous.value

    def l2_set_aside_restore(self, previous: int) -> None:
        """Demote persisting lines and put the set-aside back to `previous` bytes."""
        self.check(self.lib.chz_l2_set_aside_restore(previous), "restoring the persisting-L2 set-aside")

    def l2_save(self, stream: int | None) -> ctypes.Array:
        """The persisting-L2 limit and the stream's access-policy window, as they are now."""
        state = ctypes.create_string_buffer(self.lib.chz_l2_state_size())
        self.check(self.lib.chz_l2_window_save(stream, state), "saving the L2 state")
        return state

    def l2_restore(self, stream: int | None, state: ctypes.Array) -> None:
        """Put back what l2_save read: the stream's window, then (persisting lines demoted) the limit."""
        self.check(self.lib.chz_l2_window_restore(stream, state), "restoring the L2 state")

    def l2_window_plan(self, nbytes: int) -> tuple[int, float]:
        """(window bytes, hit ratio) for `nbytes` of hot rows under the current set-aside."""
        size, ratio = ctypes.c_uint64(), ctypes.c_float()
        self.check(self.lib.chz_l2_window_plan(nbytes, ctypes.byref(size), ctypes.byref(ratio)),
                   "planning the L2 access-policy window")
        return size.value, ratio.value

    def kernel_info(self, which: str, block: int) -> tuple[int, int]:
        """(resident blocks per SM, registers per thread) as the CUDA runtime reports them."""
        blocks, regs = ctypes.c_int(), ctypes.c_int()
        self.check(self.lib.chz_kernel_info(which.encode(), block, ctypes.byref(blocks), ctypes.byref(regs)),
                   f"querying {which}")
        return blocks.value, regs.value

    # ---- emulator introspection (tests) ----
    def emu_configure(self, l2_bytes: int, max_persisting: int, max_window: int = 128 << 20) -> None:
        self.lib.chz_emu_configure(l2_bytes, max_persisting, max_window)

    def emu_state(self) -> EmuState:
        s = EmuState()
        self.lib.chz_emu_get_state(ctypes.byref(s))
        return s

    def emu_prefetches(self) -> np.ndarray:
        n = self.lib.chz_emu_prefetch_log(None, 0)
        out = np.zeros(n, dtype=np.uint64)
        self.lib.chz_emu_prefetch_log(out.ctypes.data, n)
        return out


_OPEN: dict[Path, CudaLibrary] = {}


def load_library(spec: BuildSpec) -> Any:
    """Build (or reuse) and open the library for `spec`: the per-table family (KernelLibrary)
    or the table-batched kernel (TbeLibrary, spec.source == TBE_SOURCE). A CUDA build needs a GPU."""
    if spec.target == "cuda" and not torch.cuda.is_available():
        raise NoCudaDevice("no CUDA device: the CUDA build of the kernels cannot be loaded here. "
                           "Use backend 'emulate' (`characterize check`) to check kernel logic on the "
                           "CPU, or `characterize build` for static characterization.")
    result = build(spec)
    if result.library not in _OPEN:  # one handle per library file (a source edit gives a new file)
        _OPEN[result.library] = TbeLibrary(result) if spec.source == TBE_SOURCE else KernelLibrary(result)
    return _OPEN[result.library]


def default_backend() -> str:
    return "cuda" if torch.cuda.is_available() else "emulate"


# ---------------------------------------------------------------- precision
#: torch element types of the unquantized dtypes
TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class QuantizedTable:
    """A row-wise quantized table. int8 as FBGEMM stores it: each row holds D uint8 values,
    then its scale and bias (fp32 for dtype int8, fp16 for int8h), value = q x scale + bias;
    fp8: D e4m3 values, then an fp32 scale, value = e4m3 x scale. Rows are padded to the row
    stride; the kernels read `data` ([E, row stride] uint8) directly."""

    data: torch.Tensor
    dim: int
    dtype: str = "int8"

    @property
    def shape(self) -> tuple[int, int]:
        return (self.data.shape[0], self.dim)

    @property
    def row_bytes(self) -> int:
        """Bytes a lookup reads (values + scale + bias), without the padding."""
        return self.dim + DTYPES[self.dtype].qparam_bytes

    def qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(scale, bias) per row as fp32 (an fp8 row's bias is 0)."""
        raw = self.data[:, self.dim:self.dim + DTYPES[self.dtype].qparam_bytes].contiguous()
        q = raw.view(torch.float16 if self.dtype == "int8h" else torch.float32).float()
        return q[:, 0], (torch.zeros_like(q[:, 0]) if self.dtype == "fp8" else q[:, 1])

    def to(self, device: Any) -> "QuantizedTable":
        return QuantizedTable(self.data.to(device), self.dim, self.dtype)

    def clone(self) -> "QuantizedTable":
        return QuantizedTable(self.data.clone(), self.dim, self.dtype)


Table = torch.Tensor | QuantizedTable


def table_dtype(table: Table) -> str:
    """The dtype name of a table (fp32, fp16, bf16, int8, int8h)."""
    if isinstance(table, QuantizedTable):
        return table.dtype
    for name, dt in TORCH_DTYPES.items():
        if table.dtype == dt:
            return name
    raise ConfigError(f"tables of {table.dtype} are not supported; use float32, float16, bfloat16 or "
                      "quantize_rowwise() for int8 and fp8")


def quantize_rowwise(weight: torch.Tensor, dtype: str = "int8", row_align: int = 1) -> QuantizedTable:
    """Quantize an fp32 table row by row: int8/int8h to uint8 with a per-row scale and bias
    (the row's min and (max - min) / 255), fp8 to e4m3 with a per-row scale (the row's largest
    magnitude / 448, e4m3's largest value), packed after the values; `row_align` pads each row
    to a multiple of that many bytes (16 for the warp kernel's 16-byte loads, as FBGEMM's TBE pads)."""
    if dtype not in QUANTIZED:
        raise ConfigError(f"quantize_rowwise makes int8, int8h or fp8 tables, not {dtype!r}")
    if weight.dim() != 2 or row_align < 1:
        raise ConfigError("quantize_rowwise needs a 2-D table and row_align >= 1")
    w = weight.detach().float()
    E, D = w.shape
    if dtype == "fp8":
        amax = w.abs().max(dim=1).values
        scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
        values = (w / scale[:, None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
        return _pack_rows(values, scale[:, None].contiguous().view(torch.uint8), D, dtype, row_align)
    lo, hi = w.min(dim=1).values, w.max(dim=1).values
    scale = (hi - lo) / 255.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    qtype = torch.float32 if dtype == "int8" else torch.float16
    scale, bias = scale.to(qtype), lo.to(qtype)   # quantize with the stored (rounded) qparams
    q = torch.round((w - bias.float()[:, None]) / scale.float()[:, None]).clamp(0, 255).to(torch.uint8)
    return _pack_rows(q, torch.stack([scale, bias], dim=1).contiguous().view(torch.uint8), D, dtype, row_align)


def _pack_rows(values: torch.Tensor, qparams: torch.Tensor, D: int, dtype: str, row_align: int) -> QuantizedTable:
    """Rows of D value bytes, then the row's qparam bytes, padded to `row_align`."""
    extra = DTYPES[dtype].qparam_bytes
    stride = -(-(D + extra) // row_align) * row_align
    data = torch.zeros(values.shape[0], stride, dtype=torch.uint8, device=values.device)
    data[:, :D] = values
    data[:, D:D + extra] = qparams
    return QuantizedTable(data, D, dtype)


def as_dtype(weight: torch.Tensor, dtype: str, row_align: int = 16) -> Table:
    """An fp32 table stored as `dtype`: fp16/bf16 converted, int8 quantized row-wise with
    rows padded to `row_align` bytes (16: what the warp kernel's 16-byte loads need)."""
    dtype_spec(dtype)
    if dtype == "fp32":
        return weight
    if dtype in TORCH_DTYPES:
        return weight.to(TORCH_DTYPES[dtype])
    return quantize_rowwise(weight, dtype, row_align)


def dequantize(table: Table) -> torch.Tensor:
    """The fp32 table a kernel reads: int8 rows as q x scale + bias, fp8 rows as e4m3 x scale,
    fp16/bf16 widened."""
    if isinstance(table, QuantizedTable):
        scale, bias = table.qparams()
        values = table.data[:, :table.dim]
        if table.dtype == "fp8":
            return values.contiguous().view(torch.float8_e4m3fn).float() * scale[:, None]
        return values.float() * scale[:, None] + bias[:, None]
    return table.float()


# ---------------------------------------------------------------- launching
def hot_rows_by_frequency(indices: np.ndarray | torch.Tensor, k: int) -> np.ndarray:
    """The k most frequent rows of a trace, hottest first (ties by row id)."""
    idx = indices.cpu().numpy() if isinstance(indices, torch.Tensor) else np.asarray(indices)
    rows, counts = np.unique(idx, return_counts=True)
    order = np.lexsort((rows, -counts))[:k]
    return rows[order].astype(np.int64)


def _stream_handle(device: torch.device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.current_stream(device).cuda_stream
    return None


@dataclass
class TableKernel:
    """A variant bound to one table: hot rows, reordering and buffers live here."""

    variant: Variant
    params: dict[str, int]
    weight: torch.Tensor
    library: KernelLibrary | None = None     # None for torch
    hot_rows: torch.Tensor | None = None     # l2p/combined: rows to pin; l2w: the hot set
    mode: str = "sum"
    padding_idx: int | None = None
    dtype: str = "fp32"                      # fp32 | fp16 | bf16 | int8 | int8h
    dim: int = 0                             # D (0: the weight's columns; int8 rows are wider)
    _remap: torch.Tensor | None = field(default=None, repr=False)
    _order: torch.Tensor | None = field(default=None, repr=False)
    _window: Window | None = field(default=None, repr=False)       # l2w: the window its launches carry
    _dequantized: torch.Tensor | None = field(default=None, repr=False)  # torch on int8: fp32, made once
    window: dict[str, float] = field(default_factory=dict)
    cache: HostCache | None = None           # cache: the GPU row cache of the host-resident table
    managed: ManagedTable | None = None      # uvm on a GPU: the table in managed memory
    peer: Any = None                         # fbgemm: the FbgemmTable that runs FBGEMM's own forward

    def __post_init__(self) -> None:
        self.dim = self.dim or self.weight.shape[1]
        self.variant.check_shape(self.dim, self.dtype)
        if self.variant.l2 == "window":
            self._reorder_table()
        if self.library is None and DTYPES[self.dtype].qparam_bytes:
            # torch has no row-wise int8 lookup: the table is dequantized once here, never in a timed launch
            self._dequantized = dequantize(QuantizedTable(self.weight, self.dim, self.dtype))

    @property
    def hot_bytes(self) -> int:
        """Bytes of the hot rows this variant pins or windows (row strides included)."""
        if self.hot_rows is None:
            return 0
        return len(self.hot_rows) * self.weight.stride(0) * self.weight.element_size()

    # -- l2w: the hot set becomes rows 0..K-1 of the (in-place reordered) table --
    def _reorder_table(self) -> None:
        E = self.weight.shape[0]
        hot = self.hot_rows if self.hot_rows is not None else torch.empty(0, dtype=torch.int64)
        hot = hot.to(self.weight.device)
        rest = torch.ones(E, dtype=torch.bool, device=self.weight.device)
        rest[hot] = False
        order = torch.cat([hot, torch.nonzero(rest).flatten()])
        remap = torch.empty_like(order)
        remap[order] = torch.arange(E, device=order.device)
        self.weight.copy_(self.weight[order])
        self._order, self._remap = order, remap

    def map_indices(self, indices: torch.Tensor) -> torch.Tensor:
        """Indices as this variant's table layout needs them (l2w remaps, once per trace; tbe
        reads them as int32 when every table has fewer than 2^31 rows; FBGEMM's inference TBE
        takes int32)."""
        if self.peer is not None:
            return self.peer.indices(indices)
        if self.variant.batched:
            return indices.to(index_dtype(self.params))
        return self._remap[indices] if self._remap is not None else indices

    def map_padding(self) -> int:
        """padding_idx in this variant's layout, -1 for none."""
        if self.padding_idx is None:
            return -1
        return int(self._remap[self.padding_idx]) if self._remap is not None else self.padding_idx

    def prepass(self) -> None:
        """Work done before the lookup kernel: pin the hot rows (l2p, combined). l2w has
        none: its launches carry the window planned once per point (device_state)."""
        if self.library is None or self.hot_rows is None or not len(self.hot_rows) or self.variant.l2 != "prefetch":
            return
        stream = _stream_handle(self.weight.device)
        code = self.library.lib.chz_l2_pin(self.weight.data_ptr(), self.dim, self.weight.stride(0),
                                           self.weight.stride(1), self.hot_rows.data_ptr(), len(self.hot_rows),
                                           stream)
        self.library.check(code, "L2 pinning pre-pass")

    def plan_window(self, carveout: int) -> None:
        """l2w: this table's access-policy window under the set-aside now in force
        (`carveout` bytes), planned once per point, outside any timed unit."""
        if self.variant.l2 != "window" or self.library is None or not self.hot_bytes:
            return
        nbytes, ratio = self.library.l2_window_plan(self.hot_bytes)
        self._window = Window(self.weight.data_ptr(), nbytes, ratio)
        self.window = {"carveout_bytes": int(carveout), "window_bytes": int(nbytes), "hit_ratio": float(ratio)}

    def forget_window(self) -> None:
        """Launch without a window again (the set-aside it was planned for is gone)."""
        self._window = None

    def launch(self, indices: torch.Tensor, offsets: torch.Tensor, per_sample_weights: torch.Tensor | None = None,
               out: BagOutputs | None = None) -> BagOutputs:
        """One lookup-kernel launch on already mapped indices (no pre-pass); with a row
        cache, the batch is first mapped to cache slots and its misses copied from the host."""
        if self.cache is not None:
            return self.cache.forward(indices, lambda rows, slots, pad: self._launch(
                rows, slots, offsets, per_sample_weights, out, pad), self.padding_idx)
        return self._launch(self.weight, indices, offsets, per_sample_weights, out, self.map_padding())

    def _launch(self, weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                per_sample_weights: torch.Tensor | None, out: BagOutputs | None, padding: int) -> BagOutputs:
        B, D = offsets.shape[0], self.dim
        if self.peer is not None:
            y = self.peer.forward(indices, offsets, per_sample_weights)
            empty = torch.empty(0, dtype=torch.int64, device=y.device)
            return BagOutputs(y, empty, empty)
        if self.library is None:
            pad = self.padding_idx
            if self._dequantized is not None:  # int8: the table torch reads, dequantized at bind
                weight = self._dequantized
            y = torch.nn.functional.embedding_bag(indices, weight, offsets, mode=self.mode, padding_idx=pad,
                                                  per_sample_weights=per_sample_weights)
            empty = torch.empty(0, dtype=torch.int64, device=weight.device)
            return BagOutputs(y, empty, empty)
        if per_sample_weights is not None and not self.variant.per_sample_weights:
            raise UnsupportedShape(f"variant {self.variant.name} does not support per-sample weights")
        if self.variant.batched:  # a one-table batch of the table-batched kernel
            entry = TbeEntry(weight, self.dim, self.dtype, indices, offsets, out)
            return self.library.launch([entry], self.mode, padding, self.params,
                                       _stream_handle(indices.device))[0]
        if out is None:
            dev = indices.device
            out = BagOutputs(torch.empty(B, D, dtype=torch.float32, device=dev),   # pooled in fp32
                             torch.empty(indices.shape[0], dtype=torch.int64, device=dev),
                             torch.empty(B, dtype=torch.int64, device=dev))
        args = BagArgs(
            weight=self.managed.data_ptr if self.managed is not None else weight.data_ptr(),
            num_rows=weight.shape[0], dim=D,
            indices=indices.data_ptr(), num_indices=indices.shape[0], offsets=offsets.data_ptr(), num_bags=B,
            output=out.output.data_ptr(), offset2bag=out.offset2bag.data_ptr(), bag_size=out.bag_size.data_ptr(),
            mode=1 if self.mode == "mean" else 0, dtype=DTYPES[self.dtype].code, padding_idx=padding,
            weight_stride0=weight.stride(0), weight_stride1=weight.stride(1),
            per_sample_weights=per_sample_weights.data_ptr() if per_sample_weights is not None else None,
            per_sample_weights_stride=per_sample_weights.stride(0) if per_sample_weights is not None else 0)
        bx, by = self.variant.block
        launch = LaunchArgs(bx, by, self.variant.grid, self.params.get("P", 2))
        stream = _stream_handle(indices.device)
        if self._window is not None:   # l2w: the window travels with the launch (a launch attribute)
            code = self.library.lib.chz_forward_base_window(ctypes.byref(args), ctypes.byref(launch), stream,
                                                            ctypes.byref(self._window))
        else:
            code = getattr(self.library.lib, self.variant.entry)(ctypes.byref(args), ctypes.byref(launch), stream)
        self.library.check(code, f"variant {self.variant.name}")
        if not self.variant.offset2bag:   # a kernel that writes the pooled output alone (a user's)
            empty = torch.empty(0, dtype=torch.int64, device=out.output.device)
            return BagOutputs(out.output, empty, empty)
        return out

    def close(self) -> None:
        """Restore the table's row order and free managed memory (the device state a point
        changed is device_state's to restore)."""
        self._window = None
        if self.managed is not None:
            self.managed.close()
            self.managed = None
        if self._order is not None:
            restored = torch.empty_like(self.weight)
            restored[self._order] = self.weight
            self.weight.copy_(restored)
            self._order = self._remap = None


def close_all(kernels: Sequence[TableKernel]) -> None:
    """Close a point's kernels last bound first; every one is closed even if one fails."""
    error: Exception | None = None
    for k in reversed(list(kernels)):
        try:
            k.close()
        except Exception as e:  # noqa: BLE001 - the first failure is raised once all are closed
            error = error or e
    if error is not None:
        raise error


@contextmanager
def device_state(kernels: Sequence[TableKernel], set_aside: bool = True) -> Iterator[dict[str, int]]:
    """The device state one point of `kernels` (one per table) runs in, set up once and
    put back once. Before the first change the persisting-L2 limit and the stream's
    access-policy window are saved; when the block ends, after every table and whatever
    failed, they are restored (persisting lines demoted first), so the next point, the
    next variant or the next process sees the device as it was, however many tables ran.

    l2p/combined get a set-aside sized for the largest table's pinned rows (`set_aside`
    False: measured without one); l2w gets one for the largest hot set and each table's
    window is planned against it, carried by its launches (no stream attribute changes
    between tables). Yields {requested_bytes, granted_bytes, previous_bytes}, or {} when
    the variant changes nothing on the device."""
    owners = [k for k in kernels if k.library is not None and k.variant.l2 != "none" and k.hot_bytes]
    if not owners or (owners[0].variant.l2 == "prefetch" and not set_aside):
        yield {}
        return
    lib = owners[0].library
    stream = _stream_handle(owners[0].weight.device)
    saved = lib.l2_save(stream)
    try:
        hot = max(k.hot_bytes for k in owners)
        granted, previous = lib.l2_set_aside(hot)
        for k in owners:
            k.plan_window(granted)
        yield {"requested_bytes": int(hot), "granted_bytes": int(granted), "previous_bytes": int(previous)}
    finally:
        for k in reversed(owners):
            k.forget_window()
        lib.l2_restore(stream, saved)


def unavailable(variant: str | Variant, backend: str) -> str | None:
    """Why a variant cannot run on this backend here (a peer whose package is missing, or
    its CPU build on a GPU), or None: bench and profile skip it in one line instead of
    failing each of its points."""
    v = get_variant(variant) if isinstance(variant, str) else variant
    if v.peer != "fbgemm":
        return None
    if not fbgemm_available():
        return f"FBGEMM is not installed ({FBGEMM_INSTALL})"
    if backend == "cuda" and fbgemm_build() == "cpu":
        return f"only FBGEMM's CPU build is installed ({FBGEMM_INSTALL})"
    return None


def check_indices(indices: torch.Tensor, rows: int, where: str = "indices") -> None:
    """Out-of-range indices would fault on the GPU: refuse them with their position."""
    if indices.numel() == 0:
        return
    bad = (indices < 0) | (indices >= rows)
    if bool(bad.any()):
        pos = int(torch.nonzero(bad)[0, 0])
        raise UnsupportedShape(f"{where}: index {int(indices[pos])} at position {pos} is outside [0, {rows})")


def bind(variant: str | Variant, weight: Table, *, trace: torch.Tensor | None = None,
         params: dict[str, Any] | None = None, mode: str = "sum", padding_idx: int | None = None,
         backend: str | None = None, gpu: Any = None) -> TableKernel:
    """Bind a variant to a table. `trace` (indices) gives the hot rows for l2p/l2w/combined;
    `backend` is 'cuda' (weight must be on the GPU) or 'emulate' (CPU); `gpu` is the
    GpuSpec whose persisting-L2 budget sets K by default. `weight` is an fp32, fp16 or
    bf16 tensor or a QuantizedTable (int8, int8h); pooling is fp32 for every dtype."""
    v = get_variant(variant) if isinstance(variant, str) else variant
    dtype = dtype_spec(table_dtype(weight)).name
    E, D = weight.shape
    if isinstance(weight, QuantizedTable):
        weight = weight.data
    backend = backend or ("cuda" if weight.is_cuda else "emulate")
    if backend == "cuda" and not weight.is_cuda and v.host == "none":
        raise ConfigError("backend 'cuda' needs the table on the GPU (host-resident tables: variants cache, uvm)")
    if backend == "emulate" and weight.is_cuda:
        raise ConfigError("backend 'emulate' runs on the CPU; move the table to the CPU")
    if mode not in ("sum", "mean"):
        raise ConfigError(f"mode must be sum or mean, got {mode!r}")
    v.check_shape(D, dtype)
    if padding_idx is not None:
        padding_idx = padding_idx + E if padding_idx < 0 else padding_idx
        if not 0 <= padding_idx < E:
            raise ConfigError(f"padding_idx {padding_idx} outside the table's {E} rows")
    if v.peer == "fbgemm":
        if padding_idx is not None:
            raise UnsupportedShape("FBGEMM's TBE has no padding_idx (it prunes rows with index remapping instead)")
        p = v.resolve_params(params)
        return TableKernel(v, p, weight, None, None, mode, None, dtype, D,
                           peer=FbgemmTable(weight, D, dtype, mode, bool(p.get("bounds_check", 1))))
    if v.entry is None:
        return TableKernel(v, {}, weight, None, None, mode, padding_idx, dtype, D)
    if v.peer == "user" and padding_idx is not None:
        raise UnsupportedShape(f"variant {v.name}: a kernel of one's own is checked without padding_idx")
    arch = None
    device = weight.device
    if backend == "cuda":
        if not torch.cuda.is_available():
            raise NoCudaDevice("no CUDA device: backend 'cuda' needs one; use backend 'emulate' on the CPU")
        device = weight.device if weight.is_cuda else torch.device("cuda", torch.cuda.current_device())
        major, minor = torch.cuda.get_device_capability(device)
        arch = f"sm_{major}{minor}"
        if gpu is None:
            found = [d for d in devices() if d.index == (device.index or 0)]
            gpu = found[0].spec() if found else None
    gpu = gpu or gpu_spec(REFERENCE_ARCH)
    if v.peer == "user":   # a kernel of one's own, through its entry point or callable
        return TableKernel(v, {}, weight, UserLibrary(v.user, v.entry, backend, arch, dtype), None, mode, None,
                           dtype, D)
    p = resolve_params(v, params, arch, gpu, DTYPES[dtype].element_bytes * D + DTYPES[dtype].qparam_bytes, dtype=dtype)
    library = load_library(v.build_spec(backend, arch, p, dtype))
    if v.batched:
        p = tbe_params(p, [E])
        if library.emulated:
            library.emu_set_sm_count(gpu.sm_count)
        return TableKernel(v, p, weight, library, None, mode, padding_idx, dtype, D)
    if library.emulated:   # one emulated device per process: resized only for another GPU, never reset between binds
        s = library.emu_state()
        if (s.l2_bytes, s.max_persisting_bytes) != (gpu.l2_bytes, gpu.max_persisting_l2_bytes):
            library.emu_configure(gpu.l2_bytes, gpu.max_persisting_l2_bytes)
    hot = None
    if v.l2 != "none":
        k = p.get("K", 0)
        hot_np = hot_rows_by_frequency(trace, k) if trace is not None else np.empty(0, dtype=np.int64)
        hot = torch.from_numpy(hot_np).to(weight.device)
    if v.host == "cache":   # the table stays on the host; the GPU (or, emulated, the CPU) holds C rows of it
        host = weight.detach().cpu()
        freq = np.bincount(trace.detach().cpu().numpy(), minlength=E) if trace is not None and len(trace) else None
        p["C"] = min(E, p.get("C") or default_cache_rows(E))
        cache = HostCache(host, p["C"], device, freq, host.shape[1] * host.element_size())
        # `weight` stays the table as given (what a reference reads); the kernel reads the cache's slots
        return TableKernel(v, p, weight, library, None, mode, padding_idx, dtype, D, cache=cache)
    if v.host == "uvm" and backend == "cuda":   # on the CPU backend the uvm variant reads the table itself
        table = weight.detach().contiguous()    # the layout the kernel reads its managed copy with
        return TableKernel(v, p, table, library, None, mode, padding_idx, dtype, D,
                           managed=ManagedTable(table, uvm_mode(p), library))
    return TableKernel(v, p, weight, library, hot, mode, padding_idx, dtype, D)


def run_variant(variant: str | Variant, weight: Table, indices: torch.Tensor, offsets: torch.Tensor, *,
                mode: str = "sum", padding_idx: int | None = None, per_sample_weights: torch.Tensor | None = None,
                params: dict[str, Any] | None = None, backend: str | None = None, gpu: Any = None) -> BagOutputs:
    """One complete forward (pre-pass, kernel, restore) in the table's original row order."""
    check_indices(indices, weight.shape[0])
    tk = bind(variant, weight, trace=indices, params=params, mode=mode, padding_idx=padding_idx,
              backend=backend, gpu=gpu)
    try:
        with device_state([tk]):
            mapped = tk.map_indices(indices)
            tk.prepass()
            out = tk.launch(mapped, offsets, per_sample_weights)
            if out.output.is_cuda:
                torch.cuda.synchronize(out.output.device)
        return out
    finally:
        tk.close()


# ------------------------------------------------------ table-batched launches (tbe)
# The tbe variant's one launch covers every table of a batch (kernels/tbe.cu). Its descriptors
# mirror chz_tbe_table / chz_tbe_args; the launcher fills the second half of each (lanes per
# group, bags per run, warp tasks) and the launch's choices (path, vectors per lane, grid).
class TbeTableArgs(ctypes.Structure):
    _fields_ = [
        ("weight", ctypes.c_void_p), ("indices", ctypes.c_void_p), ("offsets", ctypes.c_void_p),
        ("output", ctypes.c_void_p), ("offset2bag", ctypes.c_void_p), ("bag_size", ctypes.c_void_p),
        ("num_rows", ctypes.c_int64), ("padding_idx", ctypes.c_int64), ("num_indices", ctypes.c_int64),
        ("num_bags", ctypes.c_int64), ("row_bytes", ctypes.c_int64), ("output_stride", ctypes.c_int64),
        ("dim", ctypes.c_int32), ("dtype", ctypes.c_int32), ("group", ctypes.c_int32),
        ("bags_per_run", ctypes.c_int32), ("first_task", ctypes.c_int32), ("tasks", ctypes.c_int32),
    ]


class TbeArgs(ctypes.Structure):
    _fields_ = [
        ("num_tables", ctypes.c_int32), ("mode", ctypes.c_int32), ("index_bits", ctypes.c_int32),
        ("path", ctypes.c_int32), ("bags_per_run", ctypes.c_int32), ("vectors_per_lane", ctypes.c_int32),
        ("row_bits", ctypes.c_int32), ("grid", ctypes.c_int32), ("total_tasks", ctypes.c_int32),
        ("tasks_per_warp", ctypes.c_int32), ("extra_tasks", ctypes.c_int32),
        ("num_phases", ctypes.c_int32), ("phase_tables", ctypes.c_int32 * TBE_MAX_TABLES),
        ("phase_first_table", ctypes.c_int32 * TBE_MAX_TABLES),
        ("phase_first_task", ctypes.c_int32 * (TBE_MAX_TABLES + 1)),
        ("phase_rotation", ctypes.c_int32 * TBE_MAX_TABLES),
        ("tables", TbeTableArgs * TBE_MAX_TABLES),
    ]


#: chz_tbe_path: how a launch walks its bags
TBE_PATHS = {0: "auto", 1: "long", 2: "short"}


class TbeEntry(NamedTuple):
    """One table of a tbe launch: its rows as the kernel reads them (int8: the packed rows), its
    batch (indices and offsets of the launch's index type) and where the bags go (None: allocated)."""

    weight: torch.Tensor
    dim: int
    dtype: str
    indices: torch.Tensor
    offsets: torch.Tensor
    out: BagOutputs | None = None


def index_dtype(params: dict[str, int]) -> torch.dtype:
    """The index (and offset) type a tbe launch reads."""
    return torch.int32 if params.get("index_bits", 64) == 32 else torch.int64


def tbe_params(params: dict[str, int], rows: Sequence[int]) -> dict[str, int]:
    """`params` with index_bits chosen: 32 when every table has fewer than 2^31 rows (the
    traces are then converted once, outside timing), else 64; a given 32 for a larger table
    is refused."""
    out = dict(params)
    bits = out.get("index_bits")
    fits = max(rows, default=0) < 2**31
    if bits is None:
        out["index_bits"] = 32 if fits else 64
    elif bits not in (32, 64):
        raise ConfigError(f"variant tbe: index_bits must be 32 or 64, got {bits}")
    elif bits == 32 and not fits:
        raise ConfigError("variant tbe: index_bits=32 needs every table to have fewer than 2^31 rows")
    return out


def tbe_phases(tables: int, tables_in_flight: int) -> list[int]:
    """Tables per phase of a tbe launch over `tables` tables walked `tables_in_flight` at a time
    (0, or as many as the launch has: one phase, the plain order, given as [])."""
    if tables_in_flight <= 0 or tables_in_flight >= tables:
        return []
    return [min(tables_in_flight, tables - s) for s in range(0, tables, tables_in_flight)]


class TbeLibrary(CudaLibrary):
    """The table-batched kernel's library (kernels/tbe.cu, one per dtype)."""

    def __init__(self, result: BuildResult):
        super().__init__(result)
        L = self.lib
        L.chz_tbe_forward.argtypes = [ctypes.POINTER(TbeArgs), ctypes.POINTER(LaunchArgs), ctypes.c_void_p]
        L.chz_tbe_forward.restype = ctypes.c_int
        L.chz_tbe_group.argtypes = [ctypes.c_int64, ctypes.c_int]
        L.chz_tbe_vectors_per_lane.argtypes = [ctypes.c_int64]
        L.chz_tbe_bags_per_run.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
        L.chz_tbe_short_path.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
        L.chz_tbe_kernel_info.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
        L.chz_l2_reset.restype = ctypes.c_int
        if L.chz_tbe_args_size() != ctypes.sizeof(TbeArgs) or L.chz_tbe_max_tables() != TBE_MAX_TABLES:
            raise KernelLaunchError(f"{result.library}: chz_tbe_args is {L.chz_tbe_args_size()} bytes in C but "
                                    f"{ctypes.sizeof(TbeArgs)} in Python; rebuild after updating both")
        if self.emulated:
            L.chz_emu_set_sm_count.argtypes = [ctypes.c_int]
        self.last: dict[str, Any] = {}   # what the last launch chose (path, V, grid, per-table groups and runs)

    def emu_set_sm_count(self, sms: int) -> None:
        """The emulated device's SM count, which sizes an automatic grid."""
        self.lib.chz_emu_set_sm_count(int(sms))

    def kernel_info(self, which: str) -> tuple[int, int]:
        """(resident blocks per SM, registers per thread) of an instance as the CUDA runtime
        reports them; `which` is tbe<V>_<index bits>_<row bits>_<long|short>."""
        blocks, regs = ctypes.c_int(), ctypes.c_int()
        self.check(self.lib.chz_tbe_kernel_info(which.encode(), ctypes.byref(blocks), ctypes.byref(regs)),
                   f"querying {which}")
        return blocks.value, regs.value

    def launch(self, entries: Sequence[TbeEntry], mode: str, padding: int, params: dict[str, int],
               stream: int | None, grid: int = 0, row_bits: int = 0, tables_in_flight: int = 0) -> list[BagOutputs]:
        """One launch for up to TBE_MAX_TABLES tables of this library's dtype (more: one per 64).
        `padding` is the padding row of every table (-1: none); `params` holds index_bits and
        optionally short (0/1; absent: chosen per launch) and bags_per_run; `row_bits` 64 forces
        the 64-bit row-number instance (tests: tables of 2^31 rows are not made for them);
        `tables_in_flight` > 0 walks the tables in phases of that many (0: one phase, the plain order)."""
        outs: list[BagOutputs] = []
        for start in range(0, len(entries), TBE_MAX_TABLES):
            outs += self._launch(entries[start:start + TBE_MAX_TABLES], mode, padding, params, stream, grid, row_bits,
                                 tables_in_flight)
        return outs

    def _launch(self, entries: Sequence[TbeEntry], mode: str, padding: int, params: dict[str, int],
                stream: int | None, grid: int, row_bits: int, tables_in_flight: int) -> list[BagOutputs]:
        idx_type = index_dtype(params)
        args = TbeArgs(num_tables=len(entries), mode=1 if mode == "mean" else 0,
                       index_bits=32 if idx_type == torch.int32 else 64, row_bits=row_bits,
                       path={None: 0, 0: 1, 1: 2}[params.get("short")], bags_per_run=params.get("bags_per_run", 0))
        phases = tbe_phases(len(entries), tables_in_flight)
        args.num_phases = len(phases)
        for p, n in enumerate(phases):
            args.phase_tables[p] = n
        keep: list[torch.Tensor] = []   # converted batches live until the launch returns (the emulator runs it)
        outs = []
        for i, e in enumerate(entries):
            if e.dtype != self.dtype:
                raise UnsupportedShape(f"a {e.dtype} table in the {self.dtype} library's launch")
            idx = e.indices if e.indices.dtype == idx_type else e.indices.to(idx_type)
            off = e.offsets if e.offsets.dtype == idx_type else e.offsets.to(idx_type)
            keep += [idx.contiguous(), off.contiguous()]
            idx, off = keep[-2], keep[-1]
            B, N, dev = off.shape[0], idx.shape[0], idx.device
            out = e.out or BagOutputs(torch.empty(B, e.dim, dtype=torch.float32, device=dev),
                                      torch.empty(N, dtype=torch.int64, device=dev),
                                      torch.empty(B, dtype=torch.int64, device=dev))
            outs.append(out)
            w = e.weight
            if w.dim() != 2 or w.stride(1) != 1:
                raise UnsupportedShape("variant tbe reads rows of contiguous elements (a table with stride(1) == 1)")
            args.tables[i] = TbeTableArgs(
                weight=w.data_ptr(), indices=idx.data_ptr() if N else None, offsets=off.data_ptr() if B else None,
                output=out.output.data_ptr(), offset2bag=out.offset2bag.data_ptr() if N else None,
                bag_size=out.bag_size.data_ptr() if B else None, num_rows=w.shape[0], padding_idx=padding,
                num_indices=N, num_bags=B, row_bytes=w.stride(0) * w.element_size(),
                output_stride=out.output.stride(0), dim=e.dim, dtype=DTYPES[e.dtype].code)
        launch = LaunchArgs(256, 1, grid, 0)
        self.check(self.lib.chz_tbe_forward(ctypes.byref(args), ctypes.byref(launch), stream), "variant tbe")
        self.last = {"path": TBE_PATHS[args.path], "vectors_per_lane": args.vectors_per_lane, "grid": args.grid,
                     "index_bits": args.index_bits, "row_bits": args.row_bits, "warp_tasks": args.total_tasks,
                     "phases": list(phases) or [len(entries)],
                     "groups": [args.tables[i].group for i in range(len(entries))],
                     "bags_per_run": [args.tables[i].bags_per_run for i in range(len(entries))]}
        return outs


@dataclass
class TableBatch:
    """A batched variant (one launch per batch) bound to every table of a batch: each dtype's
    tables go to that dtype's library, one launch per dtype group (and per TBE_MAX_TABLES
    tables), back to back on the stream. Tables may differ in E, D and dtype."""

    variant: Variant
    params: dict[str, int]
    weights: list[torch.Tensor]           # each table as the kernel reads it (int8: the packed rows)
    dims: list[int]
    dtypes: list[str]
    libraries: dict[str, TbeLibrary]
    mode: str = "sum"
    padding_idx: int | None = None
    grid: int = 0                         # blocks per launch; 0: SMs x resident blocks (tests set a few)
    row_bits: int = 0                     # 64 forces 64-bit row numbers (tests); 0: chosen per launch
    tables_in_flight: int = 0             # tables walked at a time (phases); 0: every table at once

    @property
    def T(self) -> int:
        return len(self.weights)

    @property
    def launches(self) -> int:
        """Kernel launches per batch: one per dtype group and per TBE_MAX_TABLES tables of it."""
        return sum(-(-self.dtypes.count(dt) // TBE_MAX_TABLES) for dt in self.libraries)

    def map_batch(self, batch: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A batch's (indices, offsets) per table in the type the launch reads, converted once
        (outside the timed launches)."""
        t = index_dtype(self.params)
        if len(batch) != self.T:
            raise ConfigError(f"a batch of {len(batch)} tables for {self.T} bound tables")
        return [(i.to(t).contiguous(), o.to(t).contiguous()) for i, o in batch]

    def outputs(self, batch: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> list[BagOutputs]:
        """Output buffers for a batch (allocated once, before timing)."""
        out = []
        for D, (idx, off) in zip(self.dims, batch):
            dev = idx.device
            out.append(BagOutputs(torch.empty(off.shape[0], D, dtype=torch.float32, device=dev),
                                  torch.empty(idx.shape[0], dtype=torch.int64, device=dev),
                                  torch.empty(off.shape[0], dtype=torch.int64, device=dev)))
        return out

    def launch(self, batch: Sequence[tuple[torch.Tensor, torch.Tensor]],
               outs: Sequence[BagOutputs] | None = None) -> list[BagOutputs]:
        """Every table of `batch` (mapped with map_batch) in one launch per dtype group."""
        result: list[BagOutputs | None] = [None] * self.T
        stream = _stream_handle(batch[0][0].device) if batch else None
        padding = -1 if self.padding_idx is None else self.padding_idx
        for dtype, lib in self.libraries.items():
            which = [t for t in range(self.T) if self.dtypes[t] == dtype]
            entries = [TbeEntry(self.weights[t], self.dims[t], dtype, *batch[t], outs[t] if outs else None)
                       for t in which]
            for t, o in zip(which, lib.launch(entries, self.mode, padding, self.params, stream, self.grid,
                                              self.row_bits, self.tables_in_flight)):
                result[t] = o
        return result  # type: ignore[return-value]

    def last_launch(self) -> dict[str, dict[str, Any]]:
        """What each dtype group's last launch chose (path, vectors per lane, grid, ...)."""
        return {dt: lib.last for dt, lib in self.libraries.items()}

    def close(self) -> None:
        """Nothing to restore: the launch changes no device state."""


def bind_tables(variant: str | Variant, weights: Sequence[Table], *, params: dict[str, Any] | None = None,
                mode: str = "sum", padding_idx: int | None = None, backend: str | None = None,
                gpu: Any = None, traces: Sequence[torch.Tensor] | None = None) -> TableBatch:
    """Bind a batched variant (tbe) to every table of a batch: fp32, fp16 or bf16 tensors or
    QuantizedTables (int8, int8h), each with its own E, D and dtype. `traces` (per table, the
    indices of the warm-up batches) choose tbe's work order when tables_in_flight is not given
    (kernels.order); without them the launch walks every table at once."""
    v = get_variant(variant) if isinstance(variant, str) else variant
    if not v.batched:
        raise ConfigError(f"variant {v.name} launches one table at a time; bind() each table instead")
    if not weights:
        raise ConfigError("bind_tables needs at least one table")
    if mode not in ("sum", "mean"):
        raise ConfigError(f"mode must be sum or mean, got {mode!r}")
    dtypes = [dtype_spec(table_dtype(w)).name for w in weights]
    dims = [w.shape[1] for w in weights]
    rows = [w.shape[0] for w in weights]
    raw = [w.data if isinstance(w, QuantizedTable) else w for w in weights]
    for D, dt in zip(dims, dtypes):
        v.check_shape(D, dt)
    if v.peer == "fbgemm":   # FBGEMM's own module: one forward for every table
        if padding_idx is not None:
            raise UnsupportedShape("FBGEMM's TBE has no padding_idx (it prunes rows with index remapping instead)")
        if len(set(dtypes)) != 1:
            raise UnsupportedShape("one FBGEMM TBE module holds tables of one precision; got " + ", ".join(
                sorted(set(dtypes))))
        return FbgemmBatch(v, raw, dims, dtypes[0], mode, v.resolve_params(params))  # type: ignore[return-value]
    if padding_idx is not None and not all(0 <= padding_idx < E for E in rows):
        raise ConfigError(f"padding_idx {padding_idx} outside some table's rows")
    on_gpu = {w.is_cuda for w in raw}
    if len(on_gpu) != 1:
        raise ConfigError("bind_tables: the tables must all be on the GPU or all on the CPU")
    backend = backend or ("cuda" if raw[0].is_cuda else "emulate")
    if (backend == "cuda") != raw[0].is_cuda:
        raise ConfigError(f"backend {backend!r} needs the tables " + ("on the GPU" if backend == "cuda" else "on the CPU"))
    arch = None
    if backend == "cuda":
        if not torch.cuda.is_available():
            raise NoCudaDevice("no CUDA device: backend 'cuda' needs one; use backend 'emulate' on the CPU")
        major, minor = torch.cuda.get_device_capability(raw[0].device)
        arch = f"sm_{major}{minor}"
    gpu = gpu or gpu_spec(arch or REFERENCE_ARCH)
    p = tbe_params(v.resolve_params(params), rows)
    libraries: dict[str, TbeLibrary] = {}
    for dt in dict.fromkeys(dtypes):
        lib = load_library(v.build_spec(backend, arch, p, dt))
        if lib.emulated:
            lib.emu_set_sm_count(gpu.sm_count)
        libraries[dt] = lib
    flight = p.get("tables_in_flight")
    if flight is None and traces is not None:
        if len(traces) != len(raw):
            raise ConfigError(f"bind_tables: {len(traces)} traces for {len(raw)} tables")
        curves = [coverage_curve(tr, E) for tr, E in zip(traces, rows)]
        flight = choose_tables_in_flight(curves, [w.stride(0) * w.element_size() for w in raw],
                                         gpu.l2_bytes * gpu.l2_effective_capacity)
    return TableBatch(v, p, raw, dims, dtypes, libraries, mode, padding_idx, tables_in_flight=flight or 0)


def run_tables(variant: str | Variant, weights: Sequence[Table], batch: Sequence[tuple[torch.Tensor, torch.Tensor]],
               *, mode: str = "sum", padding_idx: int | None = None, params: dict[str, Any] | None = None,
               backend: str | None = None, gpu: Any = None, grid: int = 0, row_bits: int = 0) -> list[BagOutputs]:
    """One complete batched forward: every table's (indices, offsets) of `batch` in one launch
    per dtype group; outputs per table, in the tables' order."""
    for t, (w, (idx, _)) in enumerate(zip(weights, batch)):
        check_indices(idx, w.shape[0], f"table {t}")
    tb = bind_tables(variant, weights, params=params, mode=mode, padding_idx=padding_idx, backend=backend, gpu=gpu)
    tb.grid, tb.row_bits = grid, row_bits
    outs = tb.launch(tb.map_batch(batch))
    if outs and outs[0].output.is_cuda:
        torch.cuda.synchronize(outs[0].output.device)
    return outs
