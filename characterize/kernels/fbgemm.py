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
from typing import Any

import torch

from characterize.errors import ToolchainNotFound, UnsupportedShape

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


class FbgemmTable:
    """One table inside one FBGEMM TBE module (T=1), pooled in fp32 as our kernels pool.

    The module holds its own copy of the rows (FBGEMM allocates its weights), written
    once from ours: a run with this variant needs the table's memory twice."""

    def __init__(self, weight: torch.Tensor, dim: int, dtype: str, mode: str) -> None:
        root, training, inference, common, configs = _modules()
        on_gpu = weight.is_cuda
        if on_gpu and build_variant() == "cpu":
            raise FbgemmUnavailable("the CPU build of FBGEMM (fbgemm-gpu-cpu) is installed; timing FBGEMM on "
                                    f"the GPU needs the CUDA build: {INSTALL_HINT}")
        if dim % 4:
            raise UnsupportedShape(f"FBGEMM's TBE needs D to be a multiple of 4; D={dim}")
        if dtype == "bf16" and not on_gpu:
            raise UnsupportedShape("FBGEMM's CPU forward has no bf16 rows (its GPU forward does)")
        Sparse, Pool, Loc = configs.SparseType, common.PoolingMode, common.EmbeddingLocation
        pooling = Pool.MEAN if mode == "mean" else Pool.SUM
        E = weight.shape[0]
        self.quantized = dtype == "int8h"
        self._offsets_key: tuple[int, ...] | None = None
        self._offsets: torch.Tensor | None = None
        if self.quantized:
            device = weight.device if on_gpu else "cpu"
            self.module = inference.IntNBitTableBatchedEmbeddingBagsCodegen(
                embedding_specs=[("t0", E, dim, Sparse.INT8, Loc.DEVICE if on_gpu else Loc.HOST)],
                device=device, pooling_mode=pooling, output_dtype=Sparse.FP32)
            self.module.initialize_weights()
            values = weight[:, :dim].contiguous()
            scale_bias = weight[:, dim:dim + 4].contiguous()   # two fp16, as FBGEMM keeps them
            self.module.assign_embedding_weights([(values, scale_bias)])
        else:
            precision = {"fp32": Sparse.FP32, "fp16": Sparse.FP16, "bf16": Sparse.BF16}[dtype]
            self.module = training.SplitTableBatchedEmbeddingBagsCodegen(
                embedding_specs=[(E, dim, Loc.DEVICE if on_gpu else Loc.HOST,
                                  training.ComputeDevice.CUDA if on_gpu else training.ComputeDevice.CPU)],
                weights_precision=precision, pooling_mode=pooling, optimizer=configs.EmbOptimType.EXACT_SGD,
                device=weight.device)
            with torch.no_grad():
                self.module.split_embedding_weights()[0].copy_(weight[:, :dim])
        self.module.eval()
        self.version = getattr(root, "__version__", "?")

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
