"""FBGEMM's TBE as variant fbgemm: its CPU build checked against torch here, its refusals
stated by name, and a missing package explained rather than raised from an import."""

import importlib

import numpy as np
import pytest
import torch

from characterize.config import WorkloadConfig
from characterize.errors import UnsupportedShape
from characterize.kernels import fbgemm
from characterize.kernels.check import check_one, check_variants, make_table
from characterize.kernels.library import run_variant

needs_fbgemm = pytest.mark.skipif(not fbgemm.available(), reason="fbgemm_gpu is not installed (the test extra has "
                                                                 "fbgemm-gpu-cpu on Linux x86_64)")


def odd_batch(B=37, E=1009, max_len=9, seed=5):
    g = np.random.default_rng(seed)
    lengths = g.integers(0, max_len + 1, B)
    lengths[:2] = [0, max_len]
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return torch.from_numpy(g.integers(0, E, int(lengths.sum()))), torch.from_numpy(offsets)


@needs_fbgemm
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "int8h"])
@pytest.mark.parametrize("D", [4, 36, 68])
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_fbgemm_matches_the_dequantized_reference(dtype, D, mode):
    idx, off = odd_batch()
    r = check_one("fbgemm", make_table(dtype, 1009, D, seed=D), idx, off, mode=mode, backend="emulate")
    assert r.passed, r


@needs_fbgemm
def test_fbgemm_with_per_sample_weights():
    idx, off = odd_batch()
    W = torch.randn(1009, 36, generator=torch.Generator().manual_seed(2))
    psw = torch.rand(idx.shape[0], generator=torch.Generator().manual_seed(3))
    out = run_variant("fbgemm", W, idx, off, per_sample_weights=psw, backend="emulate").output
    ref = torch.nn.functional.embedding_bag(idx, W, off, mode="sum", per_sample_weights=psw)
    assert torch.allclose(out, ref, atol=1e-5)


@needs_fbgemm
def test_a_deliberately_wrong_table_fails_the_check():
    """The checker sees FBGEMM's output: a table that differs from the reference's fails."""
    idx, off = odd_batch()
    W = make_table("fp32", 1009, 36)
    good = check_one("fbgemm", W, idx, off, backend="emulate")
    from characterize.kernels import check as check_mod
    real = check_mod.run_variant
    try:
        check_mod.run_variant = lambda v, w, *a, **k: real(v, w * 1.001, *a, **k)
        bad = check_one("fbgemm", W, idx, off, backend="emulate")
    finally:
        check_mod.run_variant = real
    assert good.passed and bad.passed is False and bad.max_abs_err > bad.tolerance


@needs_fbgemm
@pytest.mark.parametrize("dtype,D,pad,why", [("fp32", 37, None, "multiple of 4"), ("fp32", 36, 5, "padding_idx"),
                                             ("bf16", 36, None, "bf16"), ("int8", 36, None, "cannot read int8")])
def test_fbgemm_refusals_are_skips_with_the_reason(dtype, D, pad, why):
    idx, off = odd_batch()
    r = check_one("fbgemm", make_table(dtype, 1009, D), idx, off, padding_idx=pad, backend="emulate")
    assert r.passed is None and why in r.error, r


@needs_fbgemm
def test_check_variants_includes_fbgemm():
    results = check_variants(["fbgemm", "torch"], ["medium"], WorkloadConfig.tiny(), modes=("sum",),
                             backend="emulate", dtypes=["fp32", "fp16", "int8h"])
    assert {(r.variant, r.passed) for r in results} == {("fbgemm", True), ("torch", True)}


def test_a_missing_fbgemm_is_named_with_what_to_install(monkeypatch):
    real = importlib.import_module

    def no_fbgemm(name, *a, **k):
        if name.startswith("fbgemm_gpu"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real(name, *a, **k)

    monkeypatch.setattr(importlib, "import_module", no_fbgemm)
    assert not fbgemm.available()
    with pytest.raises(fbgemm.FbgemmUnavailable, match=r"\.\[fbgemm\]"):
        run_variant("fbgemm", torch.randn(10, 4), torch.tensor([1, 2]), torch.tensor([0]), backend="emulate")
    r = check_one("fbgemm", make_table("fp32", 64, 4), torch.tensor([1, 2]), torch.tensor([0]), backend="emulate")
    assert r.passed is None and "fbgemm" in r.error


def test_fbgemm_refuses_d_not_a_multiple_of_4_before_loading_anything():
    with pytest.raises(UnsupportedShape, match="multiple of 4"):
        run_variant("fbgemm", torch.randn(10, 6), torch.tensor([1]), torch.tensor([0]), backend="emulate")


@needs_fbgemm
@pytest.mark.parametrize("dtype", ["fp32", "int8h"])
def test_every_table_in_one_forward(dtype):
    """bind_tables: one FBGEMM module for T tables, one forward per batch; each table's
    output matches torch on its own table."""
    from characterize.kernels.library import bind_tables, dequantize

    tables = [make_table(dtype, E, 36, seed=E) for E in (1009, 211, 127)]
    batch = []
    for t, W in enumerate(tables):
        idx, off = odd_batch(B=23, E=W.shape[0], seed=t)
        batch.append((idx, off))
    tb = bind_tables("fbgemm", tables, backend="emulate")
    assert tb.T == 3 and tb.launches == 1
    outs = tb.launch(tb.map_batch(batch))
    for W, (idx, off), out in zip(tables, batch, outs):
        ref = torch.nn.functional.embedding_bag(idx, dequantize(W), off, mode="sum")
        assert torch.allclose(out.output, ref, atol=1e-4), dtype
    with pytest.raises(UnsupportedShape, match="same number of bags"):
        tb.map_batch([batch[0], batch[1], (batch[2][0][:5], torch.tensor([0, 2]))])


@needs_fbgemm
def test_a_check_fbgemm_skips_is_said_skipped_not_failed():
    """FBGEMM's CPU forward has no bf16 rows: the check is skipped with the reason, and the
    progress line says so too (a skipped check is not a failure)."""
    lines: list[str] = []
    results = check_variants(["fbgemm", "base"], ["random"], modes=("sum",), dtypes=["bf16"], backend="emulate",
                             progress=lines.append)
    fb = [r for r in results if r.variant == "fbgemm"]
    assert fb and all(r.passed is None for r in fb)
    said = [ln for ln in lines if ln.startswith("fbgemm")]
    assert said and all("skipped" in ln and "FAIL" not in ln for ln in said), said
    assert any(ln.startswith("base") and " ok" in ln for ln in lines)
