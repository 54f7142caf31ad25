"""Kernels stage, fbgemm: FBGEMM's table-batched embedding forward (TBE) as a variant.

TorchRec runs FBGEMM's TBE, not torch's embedding_bag, so a comparison without it
misses the kernel most production DLRMs use. This binds one of our tables to FBGEMM's
own Python modules (fbgemm-gpu 1.8.0, which pairs with torch 2.13): the training TBE
for fp32/fp16/bf16 rows and the inference TBE for int8 rows with fp16 scale and bias
(our int8h, FBGEMM's INT8 layout). The CPU build (fbgemm-gpu-cpu) checks the binding
here; the CUDA build (fbgemm-gpu) is what a GPU run times and profiles.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any, Sequence

import torch

from characterize.errors import ToolchainNotFound, UnsupportedShape
from characterize.kernels.outputs import BagOutputs

#: the release whose SASS the model reads (kernels/peers.csv) and that pairs with torch 2.13
FBGEMM_VERSION = "1.8.0"
INSTALL_HINT = ("pip install -e '.[fbgemm]' (fbgemm-gpu==1.8.0, for torch 2.13 with CUDA); "
                "the test extra carries the CPU build, fbgemm-gpu-cpu==1.8.0")


class FbgemmUnavailable(ToolchainNotFound):
    """fbgemm-gpu is not installed here, or not a build this device can run."""


def _modules() -> tuple[Any, Any, Any, Any, Any]:
    """FBGEMM's TBE modules, or a clear error naming what to install."""
    try:
        with warnings.catch_warnings():  # its CPU build lists, on import, the GPU-only optimizers it lacks
            warnings.simplefilter("ignore", DeprecationWarning)
            training = importlib.import_module("fbgemm_gpu.split_table_batched_embeddings_ops_training")
            inference = importlib.import_module("fbgemm_gpu.split_table_batched_embeddings_ops_inference")
            common = importlib.import_module("fbgemm_gpu.split_table_batched_embeddings_ops_common")
            configs = importlib.import_module("fbgemm_gpu.split_embedding_configs")
            root = importlib.import_module("fbgemm_gpu")
    except ModuleNotFoundError as e:
        raise FbgemmUnavailable(f"variant fbgemm needs FBGEMM's Python package, which is not installed: "
                                f"{INSTALL_HINT}") from e
    except (ImportError, OSError, RuntimeError) as e:  # a build for another torch fails to load its ops
        raise FbgemmUnavailable(f"fbgemm_gpu is installed but does not load with torch {torch.__version__} "
                                f"({type(e).__name__}: {str(e).splitlines()[0][:200]}); fbgemm-gpu 1.N pairs "
                                f"with torch 2.(N+5): {INSTALL_HINT}") from e
    return root, training, inference, common, configs


def available() -> bool:
    """True where FBGEMM's modules import (either build)."""
    try:
        _modules()
    except FbgemmUnavailable:
        return False
    return True


def build_variant() -> str:
    """'cuda' or 'cpu': which FBGEMM build is installed (the CPU one cannot run on a GPU)."""
    root = _modules()[0]
    return "cpu" if getattr(root, "__variant__", "") == "cpu" else "cuda"


def _module(weights: Sequence[torch.Tensor], dims: Sequence[int], dtype: str, mode: str,
            bounds_check: bool = True) -> Any:
    """One FBGEMM TBE module holding every table (FBGEMM allocates its own weights; ours
    are copied in once): the training TBE for fp32/fp16/bf16, the inference TBE for int8
    rows with an fp16 scale and bias. `bounds_check`: FBGEMM's default check of every index,
    a kernel of its own before the lookup (BoundsCheckMode.WARNING), or none."""
    root, training, inference, common, configs = _modules()
    on_gpu = weights[0].is_cuda
    if on_gpu and build_variant() == "cpu":
        raise FbgemmUnavailable("the CPU build of FBGEMM (fbgemm-gpu-cpu) is installed; timing FBGEMM on "
                                f"the GPU needs the CUDA build: {INSTALL_HINT}")
    for D in dims:
        if D % 4:
            raise UnsupportedShape(f"FBGEMM's TBE needs D to be a multiple of 4; D={D}")
    if dtype == "bf16" and not on_gpu:
        raise UnsupportedShape("FBGEMM's CPU forward has no bf16 rows (its GPU forward does)")
    Sparse, Pool, Loc = configs.SparseType, common.PoolingMode, common.EmbeddingLocation
    pooling = Pool.MEAN if mode == "mean" else Pool.SUM
    where = Loc.DEVICE if on_gpu else Loc.HOST
    check = common.BoundsCheckMode.WARNING if bounds_check else common.BoundsCheckMode.NONE
    if dtype == "int8h":
        module = inference.IntNBitTableBatchedEmbeddingBagsCodegen(
            embedding_specs=[(f"t{t}", w.shape[0], D, Sparse.INT8, where) for t, (w, D) in enumerate(zip(weights, dims))],
            device=weights[0].device if on_gpu else "cpu", pooling_mode=pooling, output_dtype=Sparse.FP32,
            bounds_check_mode=check)
        module.initialize_weights()
        # our int8h rows: D values, then the fp16 scale and bias, as FBGEMM keeps them
        module.assign_embedding_weights([(w[:, :D].contiguous(), w[:, D:D + 4].contiguous())
                                         for w, D in zip(weights, dims)])
    else:
        precision = {"fp32": Sparse.FP32, "fp16": Sparse.FP16, "bf16": Sparse.BF16}[dtype]
        module = training.SplitTableBatchedEmbeddingBagsCodegen(
            embedding_specs=[(w.shape[0], D, where, training.ComputeDevice.CUDA if on_gpu else
                              training.ComputeDevice.CPU) for w, D in zip(weights, dims)],
            weights_precision=precision, pooling_mode=pooling, optimizer=configs.EmbOptimType.EXACT_SGD,
            device=weights[0].device, bounds_check_mode=check)
        with torch.no_grad():
            for mine, w, D in zip(module.split_embedding_weights(), weights, dims):
                mine.copy_(w[:, :D])
    module.eval()
    return module


class FbgemmTable:
    """One table inside one FBGEMM TBE module (T=1), pooled in fp32 as our kernels pool.

    The module holds its own copy of the rows (FBGEMM allocates its weights), written
    once from ours: a run with this variant needs the table's memory twice."""

    def __init__(self, weight: torch.Tensor, dim: int, dtype: str, mode: str, bounds_check: bool = True) -> None:
        self.quantized = dtype == "int8h"
        self._offsets_key: tuple[int, ...] | None = None
        self._offsets: torch.Tensor | None = None
        self.module = _module([weight], [dim], dtype, mode, bounds_check)

    def indices(self, indices: torch.Tensor) -> torch.Tensor:
        """Indices in the type the module takes (int32 for the inference TBE), once per trace."""
        return indices.to(torch.int32) if self.quantized else indices

    def _full_offsets(self, offsets: torch.Tensor, n: int) -> torch.Tensor:
        """FBGEMM's B+1 offsets (the end included), built once per offsets tensor so that
        a timed launch is FBGEMM's forward alone."""
        key = (offsets.data_ptr(), offsets.shape[0], offsets._version, n)
        if key != self._offsets_key:
            end = torch.tensor([n], dtype=offsets.dtype, device=offsets.device)
            full = torch.cat([offsets, end])
            self._offsets = full.to(torch.int32) if self.quantized else full.to(torch.int64)
            self._offsets_key = key
        return self._offsets

    def forward(self, indices: torch.Tensor, offsets: torch.Tensor,
                per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
        """The pooled [B, D] fp32 output of one TBE forward."""
        full = self._full_offsets(offsets, indices.shape[0])
        with torch.no_grad():
            if per_sample_weights is not None:
                return self.module(indices, full, per_sample_weights=per_sample_weights.float())
            return self.module(indices, full)


class _Packed(list):
    """A batch's per-table (indices, offsets), with the one (indices, offsets) FBGEMM takes
    for all tables packed once beside them (outside the timed launch)."""

    packed: tuple[torch.Tensor, torch.Tensor]


class FbgemmBatch:
    """Variant fbgemm bound to every table of a batch: one TBE module, one forward for all
    T tables, as TorchRec runs it; the interface of kernels.library.TableBatch, so bench,
    profile and the check treat it as they treat tbe. Every table shares B (FBGEMM's TBE
    without variable batch sizes)."""

    def __init__(self, variant: Any, weights: Sequence[torch.Tensor], dims: Sequence[int], dtype: str,
                 mode: str, params: dict[str, int] | None = None) -> None:
        self.variant, self.params, self.mode = variant, dict(params or {}), mode
        self.weights, self.dims, self.dtypes = list(weights), list(dims), [dtype] * len(weights)
        self.libraries: dict[str, Any] = {}   # nothing of ours is loaded
        self.quantized = dtype == "int8h"
        self.module = _module(self.weights, self.dims, dtype, mode, bool(self.params.get("bounds_check", 1)))

    @property
    def T(self) -> int:
        return len(self.weights)

    @property
    def launches(self) -> int:
        """FBGEMM's forward launches per batch that do the lookup (its bounds check aside)."""
        return 1

    def map_batch(self, batch: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The batch as each table's (indices, offsets), with the packed form FBGEMM takes:
        every table's indices in turn, and T*B+1 offsets into them."""
        if len(batch) != self.T:
            raise UnsupportedShape(f"a batch of {len(batch)} tables for {self.T} bound tables")
        Bs = {int(o.numel()) for _, o in batch}
        if len(Bs) != 1:
            raise UnsupportedShape(f"FBGEMM's TBE needs every table to have the same number of bags; got {sorted(Bs)}")
        kind = torch.int32 if self.quantized else torch.int64
        starts, parts, n = [], [], 0
        for idx, off in batch:
            starts.append(off.to(torch.int64) + n)
            parts.append(idx.to(kind))
            n += int(idx.numel())
        device = batch[0][0].device
        offsets = torch.cat([*starts, torch.tensor([n], dtype=torch.int64, device=device)]).to(kind)
        out = _Packed((i, o) for i, o in batch)
        out.packed = (torch.cat(parts) if parts else torch.empty(0, dtype=kind, device=device), offsets)
        return out

    def outputs(self, batch: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> list[Any]:
        return [None] * self.T   # FBGEMM allocates its own output

    def launch(self, batch: Sequence[tuple[torch.Tensor, torch.Tensor]], outs: Any = None) -> list[Any]:
        """One forward of every table; each table's [B, D] output is a view of FBGEMM's [B, T*D]."""
        packed = batch.packed if isinstance(batch, _Packed) else self.map_batch(batch).packed
        with torch.no_grad():
            y = self.module(*packed)
        empty = torch.empty(0, dtype=torch.int64, device=y.device)
        cuts = [0]
        for D in self.dims:
            cuts.append(cuts[-1] + D)
        return [BagOutputs(y[:, a:b], empty, empty) for a, b in zip(cuts, cuts[1:])]

    def last_launch(self) -> dict[str, Any]:
        return {"fbgemm": {"tables": self.T, "version": FBGEMM_VERSION}}

    def close(self) -> None:
        """Nothing to restore: FBGEMM's forward changes no device state."""
