"""Kernels stage, training registry: the training step's kernels of our own
(cuda/embedding_bag_backward.cu) once, with what each computes and its name in the
compiled code; the `e2e --backward` choices they add. Free of torch, so the model and
the report can name them (kernels.training binds and launches them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from characterize.errors import ConfigError, UnsupportedShape

#: threads per block of every training kernel (8 warps; one warp per bag or segment)
BLOCK = 256
#: table element types the fused update reads and writes (gradients are fp32 for all)
UPDATE_DTYPES = ("fp32", "fp16", "bf16")
#: the optimizers of the table rows (the MLPs always take plain SGD)
OPTIMIZERS = ("sgd", "rowwise_adagrad")


@dataclass(frozen=True)
class TrainingKernel:
    """One training kernel: what it computes and where it lives in the build."""

    name: str
    description: str
    entry: str                  # exported C entry point
    kind: str                   # chz_bwd_kernel_info's name, and the kernel template: see kernel_name
    sorted: bool                # needs the lookups sorted by row (sort_lookups)
    deterministic: bool         # the same sums in the same order on every run
    optimizer: str | None = None  # the update a fused kernel applies
    test_only: bool = False

    @property
    def role(self) -> str:
        return "update" if self.optimizer else "backward"

    def kernel_name(self, D: int) -> str:
        """The kernel's short name in ptxas and SASS output for embedding dimension D."""
        C = chunks(D)   # the sum-pooling instance (scale 0), what DLRMs and the paper run
        if self.kind == "atomic":
            return f"chz_bwd_atomic_kernel<{C}, 0>"
        if self.kind in ("sorted", "wrong"):
            return f"chz_bwd_sorted_kernel<{C}, 0, {'true' if self.kind == 'wrong' else 'false'}>"
        return f"chz_bwd_fused_kernel<{C}, {OPTIMIZERS.index(self.optimizer or 'sgd')}, 0>"


TRAINING_KERNELS: dict[str, TrainingKernel] = {k.name: k for k in (
    TrainingKernel("cuda-atomic", "warp per bag: the bag's gradient row scattered into a dense fp32 gradient with "
                                  "atomicAdd (RED), 4 lookups' ids loaded together", "chz_bwd_atomic", "atomic",
                   sorted=False, deterministic=False),
    TrainingKernel("cuda-sorted", "lookups sorted by row on the host; warp per unique row sums its segment "
                                  "(4 bag-gradient rows in flight), one write per row, no atomics",
                   "chz_bwd_sorted", "sorted", sorted=True, deterministic=True),
    TrainingKernel("cuda-fused-sgd", "cuda-sorted with the SGD step in place of the gradient write",
                   "chz_bwd_fused_sgd", "fused_sgd", sorted=True, deterministic=True, optimizer="sgd"),
    TrainingKernel("cuda-fused-rowwise_adagrad", "cuda-sorted fused with row-wise Adagrad as FBGEMM keeps it: "
                   "momentum += mean(g^2) by a warp reduction, row -= lr g / (sqrt(momentum) + eps)",
                   "chz_bwd_fused_rowwise_adagrad", "fused_rowwise_adagrad", sorted=True, deterministic=True,
                   optimizer="rowwise_adagrad"),
    TrainingKernel("cuda-wrong", "cuda-sorted dropping each segment's last lookup (test-only: the checker must fail)",
                   "chz_bwd_wrong", "wrong", sorted=True, deterministic=True, test_only=True),
)}
#: the public training kernels in registry order
TRAINING_ORDER: tuple[str, ...] = tuple(n for n, k in TRAINING_KERNELS.items() if not k.test_only)
#: the `e2e --backward` choices these kernels add: atomic, sorted, and sorted fused with the optimizer
CUDA_BACKWARDS = ("cuda-atomic", "cuda-sorted", "cuda-fused")


def get_training_kernel(name: str) -> TrainingKernel:
    try:
        return TRAINING_KERNELS[name]
    except KeyError:
        raise ConfigError(f"unknown training kernel {name!r}; known: {', '.join(TRAINING_ORDER)}") from None


def kernel_for(backward: str, optimizer: str = "sgd") -> TrainingKernel:
    """The kernel behind an `e2e --backward` choice (cuda-fused takes the optimizer's)."""
    if backward == "cuda-fused":
        if optimizer not in OPTIMIZERS:
            raise ConfigError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
        return TRAINING_KERNELS[f"cuda-fused-{optimizer}"]
    if backward not in CUDA_BACKWARDS:
        raise ConfigError(f"backward {backward!r} is not one of our kernels ({', '.join(CUDA_BACKWARDS)})")
    return TRAINING_KERNELS[backward]


def chunks(D: int) -> int:
    """Features each lane owns: the smallest of 1, 2, 4, 8 covering D / 32 (mirrors
    chz_bwd_chunks; a test keeps them in step)."""
    need = -(-D // 32)
    for c in (1, 2, 4, 8):
        if need <= c:
            return c
    raise UnsupportedShape(f"the training kernels keep a row in one warp's registers: D <= 256, got D={D}")


#: the shortest chunk a split segment is cut into (lookups)
MIN_CHUNK = 64


def segment_chunk(longest: float) -> int:
    """Lookups per chunk when the longest segment has `longest` lookups: about its square
    root (the chunk pass and the pass adding a segment's partial rows then take about the
    same time on its warp), a multiple of 4 (the kernels' lookup group), at least MIN_CHUNK.
    Segments no longer than it are not split."""
    root = int(math.isqrt(max(int(longest), 0)))
    return max(MIN_CHUNK, -(-root // 4) * 4)
