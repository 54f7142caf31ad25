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

from characterize.config import DTYPES, dtype_spec
from characterize.errors import (
    ConfigError,
    KernelLaunchError,
    NoCudaDevice,
    UnsupportedShape,
)
from characterize.hardware.devices import devices
from characterize.hardware.specs import REFERENCE_ARCH, gpu_spec
from characterize.kernels.build import BuildResult, BuildSpec, build
from characterize.kernels.cache import HostCache, ManagedTable
from characterize.kernels.fbgemm import FbgemmTable
from characterize.kernels.registry import (
    Variant,
    default_cache_rows,
    get_variant,
    uvm_mode,
)
from characterize.kernels.static import resolve_params


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


_OPEN: dict[Path, KernelLibrary] = {}


def load_library(spec: BuildSpec) -> KernelLibrary:
    """Build (or reuse) and open the library for `spec`. A CUDA build needs a GPU."""
    if spec.target == "cuda" and not torch.cuda.is_available():
        raise NoCudaDevice("no CUDA device: the CUDA build of the kernels cannot be loaded here. "
                           "Use backend 'emulate' (`characterize check`) to check kernel logic on the "
                           "CPU, or `characterize build` for static characterization.")
    result = build(spec)
    if result.library not in _OPEN:  # one handle per library file (a source edit gives a new file)
        _OPEN[result.library] = KernelLibrary(result)
    return _OPEN[result.library]


def default_backend() -> str:
    return "cuda" if torch.cuda.is_available() else "emulate"


# ---------------------------------------------------------------- precision
#: torch element types of the unquantized dtypes
TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class QuantizedTable:
    """A row-wise int8 table as FBGEMM stores it: each row holds D uint8 values, then its
    scale and bias (fp32 for dtype int8, fp16 for int8h), padded to the row stride;
    value = q x scale + bias. The kernels read `data` ([E, row stride] uint8) directly."""

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
        """(scale, bias) per row as fp32."""
        raw = self.data[:, self.dim:self.dim + DTYPES[self.dtype].qparam_bytes].contiguous()
        q = raw.view(torch.float32 if self.dtype == "int8" else torch.float16).float()
        return q[:, 0], q[:, 1]

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
                      "quantize_rowwise() for int8")


def quantize_rowwise(weight: torch.Tensor, dtype: str = "int8", row_align: int = 1) -> QuantizedTable:
    """Quantize an fp32 table row by row to uint8 with a per-row scale and bias (the row's
    min and (max - min) / 255), packed after the values; `row_align` pads each row to a
    multiple of that many bytes (16 for the warp kernel's 16-byte loads, as FBGEMM's TBE pads)."""
    if dtype not in ("int8", "int8h"):
        raise ConfigError(f"quantize_rowwise makes int8 or int8h tables, not {dtype!r}")
    if weight.dim() != 2 or row_align < 1:
        raise ConfigError("quantize_rowwise needs a 2-D table and row_align >= 1")
    w = weight.detach().float()
    E, D = w.shape
    lo, hi = w.min(dim=1).values, w.max(dim=1).values
    scale = (hi - lo) / 255.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    qtype = torch.float32 if dtype == "int8" else torch.float16
    scale, bias = scale.to(qtype), lo.to(qtype)   # quantize with the stored (rounded) qparams
    q = torch.round((w - bias.float()[:, None]) / scale.float()[:, None]).clamp(0, 255).to(torch.uint8)
    extra = DTYPES[dtype].qparam_bytes
    stride = -(-(D + extra) // row_align) * row_align
    data = torch.zeros(E, stride, dtype=torch.uint8, device=w.device)
    data[:, :D] = q
    data[:, D:D + extra] = torch.stack([scale, bias], dim=1).contiguous().view(torch.uint8)
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
    """The fp32 table a kernel reads: int8 rows as q x scale + bias, fp16/bf16 widened."""
    if isinstance(table, QuantizedTable):
        scale, bias = table.qparams()
        return table.data[:, :table.dim].float() * scale[:, None] + bias[:, None]
    return table.float()


# ---------------------------------------------------------------- launching
class BagOutputs(NamedTuple):
    output: torch.Tensor      # [B, D]
    offset2bag: torch.Tensor  # [N] (empty for torch)
    bag_size: torch.Tensor    # [B] (empty for torch)


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
        """Indices as this variant's table layout needs them (l2w remaps, once per trace)."""
        if self.peer is not None:
            return self.peer.indices(indices)
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
        return TableKernel(v, {}, weight, None, None, mode, None, dtype, D, peer=FbgemmTable(weight, D, dtype, mode))
    if v.entry is None:
        return TableKernel(v, {}, weight, None, None, mode, padding_idx, dtype, D)
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
    p = resolve_params(v, params, arch, gpu, DTYPES[dtype].element_bytes * D + DTYPES[dtype].qparam_bytes, dtype=dtype)
    library = load_library(v.build_spec(backend, arch, p, dtype))
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
