"""Precision as a workload dimension: every variant reads fp32, fp16, bf16 and row-wise
int8 (fp32 or fp16 scale and bias) tables, tbe also fp8 (e4m3) rows with an fp32 scale,
pools in fp32, and is checked on the CPU against torch computed in float64 from the
dequantized table."""

import numpy as np
import pytest
import torch

from characterize.config import DTYPES, WorkloadConfig
from characterize.errors import ConfigError, UnsupportedShape
from characterize.kernels.build import BuildSpec
from characterize.kernels.check import OUTPUT_ROUNDING, check_one, check_variants, make_table, tolerance
from characterize.kernels.library import (
    bind,
    dequantize,
    load_library,
    quantize_rowwise,
    run_variant,
    table_dtype,
)
from characterize.kernels.registry import VARIANTS, get_variant, warp_group
from tests.conftest import HAS_GPU, assert_checks_pass

#: every variant but FBGEMM's, whose binding tests/kernels/test_fbgemm.py checks (it needs fbgemm_gpu)
PUBLIC = [n for n, v in VARIANTS.items() if not v.test_only and v.peer != "fbgemm"]


def odd_batch(B=37, E=1009, max_len=9, seed=3):
    """B bags of 0..max_len lookups (empty bags included) over E rows."""
    g = np.random.default_rng(seed)
    lengths = g.integers(0, max_len + 1, B)
    lengths[:3] = [0, max_len, 0]
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    indices = g.integers(0, E, int(lengths.sum())).astype(np.int64)
    return torch.from_numpy(indices), torch.from_numpy(offsets)


def runs(variant, dtype, D):
    """Whether the variant reads this dtype at this D (warp: D must fill 16-byte vectors)."""
    try:
        get_variant(variant).check_shape(D, dtype)
        return True
    except UnsupportedShape:
        return False


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("D", [68, 36, 80])
def test_every_variant_matches_the_dequantized_reference(dtype, D):
    idx, off = odd_batch()
    W = make_table(dtype, 1009, D, seed=D)
    checked = 0
    for v in PUBLIC:
        if not runs(v, dtype, D):
            continue
        for mode, pad in (("sum", 5), ("mean", None)):
            r = check_one(v, W, idx, off, mode=mode, padding_idx=pad, backend="emulate")
            assert r.passed and r.dtype == dtype, r
            checked += 1
    # every variant reads every dtype but fp8, which tbe alone reads; warp needs whole 16-byte
    # vectors (D=80 fills them for every dtype)
    readers = [v for v in PUBLIC if dtype in get_variant(v).dtypes]
    assert readers == (["tbe"] if dtype == "fp8" else PUBLIC)
    assert checked == 2 * (len(readers) - (0 if "warp" not in readers or runs("warp", dtype, D) else 1))
    if D == 80:
        assert runs("warp", dtype, D) == ("warp" in readers)


@pytest.mark.parametrize("dtype", list(get_variant("wrong").dtypes))
def test_the_wrong_variant_still_fails(dtype):
    idx, off = odd_batch()
    r = check_one("wrong", make_table(dtype, 1009, 36), idx, off, backend="emulate")
    assert r.passed is False and r.max_abs_err > r.tolerance


def test_check_variants_covers_every_dtype():
    results = check_variants(PUBLIC, ["medium"], WorkloadConfig.tiny(), modes=("sum",), backend="emulate",
                             dtypes=list(DTYPES))
    assert {r.dtype for r in results} == set(DTYPES)
    assert not [r for r in results if r.passed is False]
    skipped = {(r.variant, r.dtype) for r in results if r.passed is None}
    assert skipped == ({("warp", d) for d in ("fp16", "bf16", "int8", "int8h")}   # D=68
                       | {(v, "fp8") for v in PUBLIC if v != "tbe"})            # tbe alone reads fp8


def test_tolerances_are_stated_per_dtype():
    assert set(OUTPUT_ROUNDING) == set(DTYPES)
    # our kernels pool in fp32 from exact dequantized values: fp32's tolerance for every dtype
    assert {tolerance(d, "base", 10, 1.0) for d in DTYPES} == {tolerance("fp32", "base", 10, 1.0)}
    assert tolerance("bf16", "torch", 10, 1.0) > tolerance("fp16", "torch", 10, 1.0) > tolerance("fp32", "torch", 10, 1.0)


@pytest.mark.parametrize("dtype", ["int8", "int8h"])
@pytest.mark.parametrize("row_align", [1, 16])
def test_quantize_round_trip(dtype, row_align):
    w = torch.randn(257, 36, generator=torch.Generator().manual_seed(1))
    q = quantize_rowwise(w, dtype, row_align)
    assert q.data.dtype == torch.uint8 and q.shape == (257, 36) and table_dtype(q) == dtype
    assert q.data.shape[1] == -(-(36 + DTYPES[dtype].qparam_bytes) // row_align) * row_align
    back = dequantize(q)
    scale, _ = q.qparams()
    # within half a quantization step (plus the fp16 qparams' rounding)
    step = scale[:, None]
    slack = 0.5 if dtype == "int8" else 0.5 + 2 ** -9 * 255
    assert bool(((back - w).abs() <= step * slack + 1e-6).all())
    # row extremes survive: min -> 0, max -> 255
    assert int(q.data[:, :36].min()) == 0 and int(q.data[:, :36].max()) == 255


@pytest.mark.parametrize("row_align", [1, 16])
def test_fp8_round_trip(row_align):
    """e4m3 keeps 3 mantissa bits: within half a step (2^-4 relative) of the fp32 value, or
    half the smallest subnormal step (2^-10 x the row's scale) near zero; each row's largest
    magnitude lands on 448, e4m3's largest value, so none saturates."""
    w = torch.randn(257, 36, generator=torch.Generator().manual_seed(1))
    w[3, :] = 0.0
    w[5, 7] = 1e-6
    q = quantize_rowwise(w, "fp8", row_align)
    assert q.data.dtype == torch.uint8 and q.shape == (257, 36) and table_dtype(q) == "fp8"
    assert q.data.shape[1] == -(-(36 + 4) // row_align) * row_align
    scale, bias = q.qparams()
    assert bool((bias == 0).all()) and float(scale[3]) == 1.0    # a zero row: scale 1, values 0
    back = dequantize(q)
    assert bool(((back - w).abs() <= w.abs() * 2 ** -4 + scale[:, None] * 2 ** -10).all())
    values = q.data[:, :36].contiguous().view(torch.float8_e4m3fn).float()
    assert float(values.abs().max()) == 448.0 and not bool(values.isnan().any())


def test_constant_rows_quantize_without_dividing_by_zero():
    w = torch.full((4, 16), 0.25)
    q = quantize_rowwise(w)
    assert torch.allclose(dequantize(q), w)


def test_packed_int8_rows_run_the_scalar_variants_and_warp_refuses_them():
    idx, off = odd_batch()
    w = torch.randn(1009, 48, generator=torch.Generator().manual_seed(2))
    packed = quantize_rowwise(w, "int8", row_align=1)           # 56-byte rows, as FBGEMM's fused 8-bit rowwise
    assert packed.data.stride(0) == 56
    for v in ("base", "rpf", "l2p", "l2w", "combined"):
        assert check_one(v, packed, idx, off, backend="emulate").passed, v
    with pytest.raises(UnsupportedShape, match="variant warp"):
        run_variant("warp", packed, idx, off, backend="emulate")
    padded = quantize_rowwise(w, "int8", row_align=16)
    assert check_one("warp", padded, idx, off, backend="emulate").passed


def test_unaligned_int8_scale_is_refused_with_the_variant_name():
    idx, off = odd_batch()
    q = quantize_rowwise(torch.randn(1009, 33), "int8")        # the fp32 scale would sit at an odd address
    with pytest.raises(UnsupportedShape, match="variant base"):
        run_variant("base", q, idx, off, backend="emulate")


def test_unsupported_dtypes_are_named():
    with pytest.raises(ConfigError, match="float64"):
        bind("base", torch.zeros(4, 8, dtype=torch.float64), backend="emulate")
    with pytest.raises(ConfigError, match="int4"):
        get_variant("base").check_shape(128, "int4")
    with pytest.raises(ConfigError, match="dtype 'int4'"):
        WorkloadConfig(dtype="int4").validate()


def test_a_library_refuses_another_dtypes_table():
    idx, off = odd_batch()
    tk = bind("base", torch.randn(1009, 36), backend="emulate")
    tk.dtype = "fp16"        # a table of one dtype launched through another dtype's library
    with pytest.raises(UnsupportedShape, match="dtype"):
        tk.launch(idx, off)


@pytest.mark.parametrize("dtype", list(get_variant("warp").dtypes))
@pytest.mark.parametrize("D", [16, 48, 128, 256, 1024])
def test_warp_group_mirrors_the_cuda_source(dtype, D):
    lib = load_library(BuildSpec("emulate", dtype=dtype))
    assert lib.dtype == dtype
    assert lib.lib.chz_warp_group(D) == warp_group(D, dtype)


def test_warp_kernel_names_follow_the_vector_width():
    warp = get_variant("warp")
    assert warp.kernel_name({}, 128, "fp32") == "chz_warp_kernel<1, 8>"     # 32 float4 -> 32 lanes
    assert warp.kernel_name({}, 128, "fp16") == "chz_warp_kernel<1, 8>"     # 16 vectors -> 16 lanes
    assert warp.kernel_name({}, 1024, "int8") == "chz_warp_kernel<2, 4>"    # 64 vectors -> 32 lanes x 2
    assert warp_group(128, "int8") == 8 and warp_group(128, "fp16") == 16


def test_row_bytes_carry_the_scale_and_bias():
    wl = WorkloadConfig()
    assert [wl.replace(dtype=d).row_bytes for d in DTYPES] == [512, 256, 256, 136, 132, 132]


def test_l2_pinning_covers_an_int8_rows_scale_and_bias():
    E, D = 300, 64
    q = quantize_rowwise(torch.randn(E, D), "int8", row_align=16)    # 80-byte rows: values, scale, bias, pad
    trace = torch.tensor([7, 7, 7, 100, 100, 3], dtype=torch.int64)
    tk = bind("l2p", q, trace=trace, params={"K": 2}, backend="emulate")
    tk.library.emu_configure(40 << 20, 30 << 20)
    before = len(tk.library.emu_prefetches())
    tk.prepass()
    got = set(int(a) for a in tk.library.emu_prefetches()[before:])
    base = q.data.data_ptr()
    want = set()
    for r in (7, 100):
        start, end = base + r * 80, base + r * 80 + D + 8
        want |= {a for a in range(start & ~31, end, 32)}
    assert got == want


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_every_variant_and_dtype_on_the_gpu(dtype):
    results = check_variants(PUBLIC, ["medium", "random"], WorkloadConfig.tiny().replace(D=80), backend="cuda",
                             dtypes=[dtype])
    # a variant that does not read this dtype (fp8: every one but tbe) is skipped with the reason
    assert_checks_pass(results, [v for v in PUBLIC if runs(v, dtype, 80)])
    idx, off = odd_batch()
    W = make_table(dtype, 1009, 36)
    for v in PUBLIC:
        if runs(v, dtype, 36):
            r = check_one(v, W, idx, off, backend="cuda")   # moves the table and batch to the GPU
            assert r.passed, r


def test_check_command_covers_every_dtype():
    from click.testing import CliRunner

    from characterize.cli import main

    r = CliRunner().invoke(main, ["check", "--dtypes", "all", "--variants", "base,warp", "--datasets", "medium",
                                  "--D", "80", "--backend", "emulate", "--mode", "sum"])
    assert r.exit_code == 0, r.output
    assert "all 10 checks passed" in r.output and "int8h" in r.output
    bad = CliRunner().invoke(main, ["check", "--dtypes", "fp8", "--variants", "base", "--datasets", "medium",
                                    "--backend", "emulate"])
    assert bad.exit_code != 0 and "fp8" in bad.output and "Traceback" not in bad.output
