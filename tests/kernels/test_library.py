"""Every variant's logic, checked on the CPU through the emulation build of the same
CUDA source, against torch.nn.functional.embedding_bag."""

import dataclasses

import numpy as np
import pytest
import torch

from characterize.config import Pooling, WorkloadConfig
from characterize.errors import ConfigError, NoCudaDevice, UnsupportedShape
from characterize.kernels.build import BuildSpec
from characterize.kernels.check import check_one, check_variants, expected_bags
from characterize.kernels.library import (
    bind,
    device_state,
    hot_rows_by_frequency,
    load_library,
    run_variant,
    unavailable,
)
from characterize.kernels.registry import VARIANTS, get_variant, warp_group
from characterize.workloads.traces import generate
from tests.conftest import HAS_GPU, assert_checks_pass

PUBLIC = [n for n, v in VARIANTS.items() if not v.test_only]
PRESETS = ["one-item", "high", "medium", "low", "random"]


def batch(config, preset="medium", table=0):
    ds = generate(preset, config, tables=[table])
    idx, off = ds.tables[0].batch(0)
    return torch.from_numpy(idx.copy()), torch.from_numpy(off.copy())


def table(config, seed=0):
    return torch.randn(config.E, config.D, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("preset", PRESETS)
def test_every_variant_matches_torch_on_odd_shapes(preset):
    results = check_variants(PUBLIC, [preset], WorkloadConfig.tiny(), modes=("sum", "mean"), backend="emulate")
    # one batch per variant and mode, plus the cache over several batches (eviction) and the
    # table-batched variant on a batch of three tables of different shapes (one launch)
    single = [r for r in results if "batches=" not in r.shape and not r.shape.startswith("T=")]
    assert len(single) == 2 * len(PUBLIC)
    assert len([r for r in results if "batches=" in r.shape]) == 2
    # ours mixes dtypes in one launch; FBGEMM (where installed) holds one precision per module
    batched = [v for v in PUBLIC if get_variant(v).batched and unavailable(v, "emulate") is None]
    assert len([r for r in results if r.shape.startswith("T=3 ")]) == 2 * 3 * len(batched)
    bad = [r for r in results if not r.passed]
    assert not bad, bad


def test_the_wrong_variant_fails_the_checker():
    results = check_variants(["wrong"], ["medium", "random"], WorkloadConfig.tiny(), backend="emulate")
    assert results and not any(r.passed for r in results)
    assert all(r.max_abs_err > r.tolerance for r in results)


@pytest.mark.parametrize("D", [4, 12, 36, 128, 260, 1024])
def test_warp_group_sizes(D):
    c = WorkloadConfig.tiny().replace(D=D, E=211)
    idx, off = batch(c)
    r = check_one("warp", table(c), idx, off, backend="emulate")
    assert r.passed, r
    lib = load_library(BuildSpec("emulate"))
    assert lib.lib.chz_warp_group(D) == warp_group(D)


def test_scalar_variants_take_any_D_and_warp_refuses():
    c = WorkloadConfig.tiny().replace(D=33)
    idx, off = batch(c)
    W = table(c)
    for v in ("base", "optmt", "rpf", "l2p", "l2w", "combined"):
        assert check_one(v, W, idx, off, backend="emulate").passed
    with pytest.raises(UnsupportedShape, match="multiple of 4"):
        run_variant("warp", W, idx, off, backend="emulate")


@pytest.mark.parametrize("P", [1, 3, 8])
def test_prefetch_distances(P):
    c = WorkloadConfig.tiny().replace(L=Pooling.parse("uniform:0:30"))
    idx, off = batch(c, "low")
    assert check_one("rpf", table(c), idx, off, params={"P": P}, backend="emulate").passed


def test_grid_stride_with_a_small_grid():
    c = WorkloadConfig.tiny()
    idx, off = batch(c)
    W = table(c)
    ref = torch.nn.functional.embedding_bag(idx, W, off, mode="sum")
    for name in ("base", "rpf", "warp"):
        small = dataclasses.replace(get_variant(name), grid=3)
        out = run_variant(small, W, idx, off, backend="emulate")
        assert torch.allclose(out.output, ref, atol=1e-5)


def test_padding_idx_and_per_sample_weights():
    c = WorkloadConfig.tiny()
    idx, off = batch(c, "high")
    W = table(c)
    pad = int(idx[3])
    for v in ("base", "rpf", "warp", "l2w", "combined"):
        for mode in ("sum", "mean"):
            assert check_one(v, W, idx, off, mode=mode, padding_idx=pad, backend="emulate").passed, (v, mode)
    psw = torch.rand(idx.shape[0], generator=torch.Generator().manual_seed(1))
    ref = torch.nn.functional.embedding_bag(idx, W, off, mode="sum", per_sample_weights=psw)
    out = run_variant("base", W, idx, off, per_sample_weights=psw, backend="emulate")
    assert torch.allclose(out.output, ref, atol=1e-5)
    with pytest.raises(UnsupportedShape, match="per-sample"):
        run_variant("rpf", W, idx, off, per_sample_weights=psw, backend="emulate")


def test_empty_batch_and_all_empty_bags():
    c = WorkloadConfig.tiny()
    W = table(c)
    off = torch.zeros(5, dtype=torch.int64)
    idx = torch.empty(0, dtype=torch.int64)
    for v in PUBLIC:
        out = run_variant(v, W, idx, off, backend="emulate")
        assert out.output.shape == (5, c.D) and float(out.output.abs().sum()) == 0.0


def test_out_of_range_indices_are_refused_before_launch():
    c = WorkloadConfig.tiny()
    idx, off = batch(c)
    idx[17] = c.E
    with pytest.raises(UnsupportedShape, match="position 17"):
        run_variant("base", table(c), idx, off, backend="emulate")


def test_l2_pinning_prefetches_exactly_the_hot_rows_sectors():
    c = WorkloadConfig.tiny()
    idx, off = batch(c)
    W = table(c)
    tk = bind("l2p", W, trace=idx, params={"K": 40}, backend="emulate")
    lib = tk.library
    lib.emu_configure(40 << 20, 30 << 20)
    tk.prepass()
    got = set(int(a) for a in lib.emu_prefetches())
    row_bytes = c.D * 4
    base = W.data_ptr()
    hot = hot_rows_by_frequency(idx, 40)
    want = set()
    for r in hot:
        start, end = base + int(r) * row_bytes, base + (int(r) + 1) * row_bytes
        want |= set(range(start & ~31, end, 32))
    assert got == want and len(tk.hot_rows) == 40
    assert list(tk.hot_rows[:3].numpy()) == list(hot[:3])


def test_l2_pinning_follows_the_row_and_element_strides():
    c = WorkloadConfig.tiny()
    idx, off = batch(c)
    wide = table(c.replace(D=c.D + 5))
    for W in (wide[:, 2:2 + c.D], table(c).t().contiguous().t()):  # rows D+5 apart; elements E apart
        tk = bind("l2p", W, trace=idx, params={"K": 40}, backend="emulate")
        tk.library.emu_configure(40 << 20, 30 << 20)
        tk.prepass()
        got = set(int(a) for a in tk.library.emu_prefetches())
        s0, s1 = W.stride()
        want = set()
        for r in hot_rows_by_frequency(idx, 40):
            first = W.data_ptr() + int(r) * s0 * 4
            if s1 * 4 >= 32:  # elements a sector or more apart: one prefetch each
                want |= {first + k * s1 * 4 for k in range(c.D)}
            else:
                want |= set(range(first & ~31, first + ((c.D - 1) * s1 + 1) * 4, 32))
        assert got == want, W.stride()
        out = run_variant("l2p", W, idx, off, params={"K": 40}, backend="emulate")
        assert torch.allclose(out.output, torch.nn.functional.embedding_bag(idx, W, off, mode="sum"), atol=1e-5)


def test_hot_rows_default_to_the_persisting_budget():
    c = WorkloadConfig.tiny()
    idx, off = batch(c)
    tk = bind("l2p", table(c), trace=idx, backend="emulate")
    # A100: 30 MiB persisting / 272-byte rows -> far more than the 1009 rows: every used row
    assert tk.params["K"] == (30 << 20) // (c.D * 4)
    assert len(tk.hot_rows) == len(np.unique(idx.numpy()))


def test_l2_window_is_applied_then_device_and_stream_state_restored():
    """The set-aside is set once for the point, the window travels with each launch (a
    launch attribute: the stream's own window never changes), and the state is put back."""
    c = WorkloadConfig.tiny()
    idx, off = batch(c)
    W = table(c)
    original = W.clone()
    tk = bind("l2w", W, trace=idx, params={"K": 100}, backend="emulate")
    lib = tk.library
    lib.emu_configure(1 << 20, 16 << 10, 1 << 20)  # small L2 so the carve-out is the binding limit
    mapped = tk.map_indices(idx)
    assert torch.equal(W[mapped], original[idx])  # reordered table, remapped indices: same rows
    hot_bytes = 100 * c.D * 4
    with device_state([tk]) as granted:
        assert granted == {"requested_bytes": hot_bytes, "granted_bytes": 16 << 10, "previous_bytes": 0}
        tk.prepass()   # nothing to do: no pre-pass kernel, no stream attribute
        s = lib.emu_state()
        assert s.persisting_limit == 16 << 10 and s.window_bytes == 0 and s.windowed_launches == 0
        out = tk.launch(mapped, off)
        s = lib.emu_state()
        assert s.windowed_launches == 1 and s.window_bytes == 0   # the stream's window is untouched
        assert s.launch_window_base == W.data_ptr() and s.launch_window_bytes == hot_bytes
        assert s.launch_window_hit_ratio == pytest.approx((16 << 10) / hot_bytes)
        assert tk.window == {"carveout_bytes": 16 << 10, "window_bytes": hot_bytes,
                             "hit_ratio": pytest.approx((16 << 10) / hot_bytes)}
    assert torch.allclose(out.output, torch.nn.functional.embedding_bag(idx, original, off, mode="sum"), atol=1e-5)
    tk.close()
    s = lib.emu_state()
    assert s.window_bytes == 0 and s.persisting_limit == 0 and s.persisting_resets == 1
    assert torch.equal(W, original)


def test_parameter_validation():
    with pytest.raises(ConfigError, match="P must be"):
        get_variant("rpf").resolve_params({"P": 9})
    with pytest.raises(ConfigError, match="no parameter"):
        get_variant("base").resolve_params({"P": 2})
    with pytest.raises(ConfigError, match="unknown variant"):
        get_variant("fastest")


def test_expected_bags_definition():
    o2b, sizes = expected_bags(np.array([0, 2, 2, 5]), 6, np.array([1, 9, 3, 9, 4, 5]), padding_idx=9)
    assert list(o2b) == [0, 0, 2, 2, 2, 3] and list(sizes) == [1, 0, 2, 1]


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU path")
def test_cuda_build_without_gpu_is_a_clear_error():
    with pytest.raises(NoCudaDevice, match="emulate"):
        load_library(BuildSpec("cuda", "sm_80"))


@pytest.mark.gpu
@pytest.mark.parametrize("preset", PRESETS)
def test_every_variant_on_the_gpu(preset):
    for config in (WorkloadConfig.tiny(), WorkloadConfig.tiny().replace(D=128, B=129, E=4099)):
        results = check_variants(PUBLIC, [preset], config, backend="cuda")
        # FBGEMM where its CUDA build is installed; without it, skipped with the reason
        assert_checks_pass(results, [v for v in PUBLIC if not unavailable(v, "cuda")])
    wrong = check_variants(["wrong"], [preset], WorkloadConfig.tiny(), backend="cuda")
    assert wrong and not any(r.passed for r in wrong)


@pytest.mark.gpu
def test_runtime_occupancy_matches_static():
    from characterize.hardware.specs import ARCHS
    from characterize.kernels.build import build
    from characterize.kernels.occupancy import theoretical_occupancy

    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    if arch not in ARCHS:
        pytest.skip(f"{arch} is not in the spec table")
    spec = BuildSpec("cuda", arch)
    lib, static = load_library(spec), build(spec)
    for which, kernel, block in (("base", "chz_base_kernel<false>", 256), ("rpf2", "chz_rpf_kernel<2>", 256),
                                 ("warp1", "chz_warp_kernel<1, 8>", 256), ("l2_pin", "chz_l2_pin_kernel", 256)):
        blocks, regs = lib.kernel_info(which, block)
        res = static.resources(kernel)
        assert regs == res.registers
        assert blocks == theoretical_occupancy(ARCHS[arch], block, res.registers, res.shared_mem).blocks_per_sm
