"""Check stage: every variant against torch.nn.functional.embedding_bag.

Runs each variant (the CUDA build on a GPU, the CPU-emulation build otherwise) on
generated traces and compares the pooled output with torch computed in float64, and
offset2bag / bag sizes with their definition. The deliberately wrong variant must
fail here, which proves the checker can.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Iterable

import numpy as np
import torch

from characterize.config import WorkloadConfig
from characterize.errors import CharacterizeError, UnsupportedShape
from characterize.kernels.library import default_backend, run_variant
from characterize.kernels.registry import VARIANTS, get_variant
from characterize.workloads.presets import HOTNESS_ORDER
from characterize.workloads.traces import generate


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

    def to_dict(self) -> dict:
        return asdict(self)


def expected_bags(offsets: np.ndarray, n: int, indices: np.ndarray, padding_idx: int | None) -> tuple[np.ndarray, np.ndarray]:
    """offset2bag and non-padding bag sizes by definition (torch's 1-D offsets convention)."""
    B = len(offsets)
    ends = np.append(offsets[1:], n)
    starts = offsets.copy()
    starts[0] = 0
    offset2bag = np.repeat(np.arange(B), np.maximum(ends - starts, 0))
    keep = np.ones(n, dtype=bool) if padding_idx is None else indices != padding_idx
    sizes = np.bincount(offset2bag[keep[: len(offset2bag)]], minlength=B) if n else np.zeros(B, dtype=np.int64)
    return offset2bag, sizes


def check_one(variant: str, weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, *, mode: str = "sum",
              padding_idx: int | None = None, params: dict | None = None, backend: str | None = None,
              dataset: str = "", gpu=None) -> CheckResult:
    """Run one variant on one batch and compare with torch (float64 on the CPU)."""
    backend = backend or default_backend()
    device = "cuda" if backend == "cuda" else "cpu"
    B, D, E = offsets.shape[0], weight.shape[1], weight.shape[0]
    lengths = np.diff(np.append(offsets.numpy(), indices.shape[0]))
    shape = f"B={B} D={D} E={E} Lmax={int(lengths.max(initial=0))}"
    ref = torch.nn.functional.embedding_bag(indices, weight.double(), offsets, mode=mode, padding_idx=padding_idx)
    tol = 1e-5 * max(1, int(lengths.max(initial=1))) * float(weight.abs().max()) + 1e-6
    try:
        out = run_variant(variant, weight.to(device).clone(), indices.to(device), offsets.to(device), mode=mode,
                          padding_idx=padding_idx, params=params, backend=backend, gpu=gpu)
    except CharacterizeError as e:
        return CheckResult(variant, dataset, mode, shape, backend, float("nan"), tol, None, None, False, str(e))
    err = float((out.output.double().cpu() - ref).abs().max()) if B else 0.0
    o2b_ok = size_ok = None
    if out.offset2bag.numel() or out.bag_size.numel():
        exp_o2b, exp_size = expected_bags(offsets.numpy(), indices.shape[0], indices.numpy(),
                                          None if padding_idx is None else padding_idx % E)
        o2b_ok = bool(np.array_equal(out.offset2bag.cpu().numpy(), exp_o2b))
        size_ok = bool(np.array_equal(out.bag_size.cpu().numpy(), exp_size))
    passed = err <= tol and o2b_ok is not False and size_ok is not False
    return CheckResult(variant, dataset, mode, shape, backend, err, tol, o2b_ok, size_ok, passed)


def check_variants(variants: Iterable[str] | None = None, datasets: Iterable[str] = HOTNESS_ORDER,
                   config: WorkloadConfig | None = None, modes: Iterable[str] = ("sum", "mean"),
                   backend: str | None = None, params: dict[str, dict] | None = None,
                   progress: Callable[[str], None] | None = None) -> list[CheckResult]:
    """Check every variant x dataset x mode on the first batch of table 0."""
    config = config or WorkloadConfig.tiny()
    names = list(variants) if variants is not None else [n for n, v in VARIANTS.items() if not v.test_only]
    params = params or {}
    results = []
    g = torch.Generator().manual_seed(config.seed)
    weight = torch.randn(config.E, config.D, generator=g, dtype=torch.float32)
    for ds_name in datasets:
        ds = generate(ds_name, config, tables=[0])
        idx_np, off_np = ds.tables[0].batch(0)
        idx, off = torch.from_numpy(idx_np.copy()), torch.from_numpy(off_np.copy())
        for mode in modes:
            for name in names:
                try:
                    get_variant(name).check_shape(config.D)
                except UnsupportedShape as e:
                    results.append(CheckResult(name, ds_name, mode, f"D={config.D}", backend or default_backend(),
                                               float("nan"), float("nan"), None, None, None, f"skipped: {e}"))
                    continue
                r = check_one(name, weight, idx, off, mode=mode, params=params.get(name), backend=backend,
                              dataset=ds_name)
                if progress:
                    progress(f"{name:9s} {ds_name:9s} {mode:4s} {'ok' if r.passed else 'FAIL'}")
                results.append(r)
    return results
