"""The training kernels (cuda/embedding_bag_backward.cu) on the CPU emulator against autograd
of torch.nn.functional.embedding_bag and torch's optimizer math, on odd shapes with
duplicate ids and empty bags; the deliberately wrong kernel fails; their SASS keeps the
claims the model reads; on a GPU the same checks run on the device."""

from __future__ import annotations

import ctypes

import pytest
import torch

from characterize.errors import ConfigError, UnsupportedShape
from characterize.kernels import training as tr
from tests.conftest import needs_tools

E, B = 1009, 127


def _bags(seed: int = 0, hot: int = 60) -> tuple[torch.Tensor, torch.Tensor]:
    """B=127 bags of 0..20 lookups (empty ones included) over `hot` rows: many duplicates,
    within bags and across them."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 21, (B,), generator=g)
    lengths[[0, 5, B - 1]] = 0
    idx = torch.randint(0, hot, (int(lengths.sum()),), generator=g) * 13 % E
    off = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)[:-1]])
    return idx, off


def _autograd(idx, off, D, mode="sum", psw=None, padding_idx=None, seed=1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(E, D, generator=g).requires_grad_(True)
    y = torch.nn.functional.embedding_bag(idx, w, off, mode=mode, per_sample_weights=psw, padding_idx=padding_idx)
    grad_out = torch.randn(y.shape, generator=g)
    (grad,) = torch.autograd.grad(y, w, grad_out)
    return grad_out, grad


def _tolerance(idx: torch.Tensor, grad_out: torch.Tensor) -> float:
    """fp32 sums in another order: 1e-6 x the most lookups of one row x the largest term."""
    most = int(torch.bincount(idx).max()) if idx.numel() else 1
    return 1e-6 * most * float(grad_out.abs().max()) + 1e-7


@pytest.mark.parametrize("kernel", ["cuda-atomic", "cuda-sorted"])
@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("D", [33, 12, 128])
def test_backward_is_autograd_of_embedding_bag(kernel, mode, D):
    idx, off = _bags()
    grad_out, expected = _autograd(idx, off, D, mode)
    got = tr.backward(kernel, grad_out, idx, off, E, mode=mode, grid=3)   # 3 blocks: the grid-stride loops
    assert got.shape == expected.shape and got.dtype == torch.float32
    assert float((got - expected).abs().max()) <= _tolerance(idx, grad_out)
    assert float(got[torch.unique(idx)].abs().sum()) > 0   # not vacuous


@pytest.mark.parametrize("kernel", ["cuda-atomic", "cuda-sorted"])
def test_backward_with_per_sample_weights_and_padding(kernel):
    idx, off = _bags(seed=2)
    psw = torch.rand(idx.shape[0], generator=torch.Generator().manual_seed(3)) + 0.5
    grad_out, expected = _autograd(idx, off, 40, "sum", psw=psw)
    got = tr.backward(kernel, grad_out, idx, off, E, per_sample_weights=psw)
    assert float((got - expected).abs().max()) <= _tolerance(idx, grad_out)
    pad = int(idx[7])
    grad_out, expected = _autograd(idx, off, 40, "mean", padding_idx=pad)
    got = tr.backward(kernel, grad_out, idx, off, E, mode="mean", padding_idx=pad)
    assert float(got[pad].abs().max()) == 0.0
    assert float((got - expected).abs().max()) <= _tolerance(idx, grad_out)


@pytest.mark.parametrize("chunk", [None, 4, 7])
def test_the_wrong_kernel_fails_the_check(chunk):
    idx, off = _bags()
    grad_out, expected = _autograd(idx, off, 33)
    got = tr.backward("cuda-wrong", grad_out, idx, off, E, chunk=chunk)
    assert float((got - expected).abs().max()) > 100 * _tolerance(idx, grad_out)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_split_segments_sum_their_chunks_in_order(mode):
    """Segments longer than a chunk are summed by chunks, then by partial rows: the same
    gradient (and, fused, the same update), whatever the chunk, split or not."""
    idx, off = _bags(seed=14, hot=9)   # 9 rows: every segment is long
    grad_out, expected = _autograd(idx, off, 68, mode)
    s = tr.sort_lookups(idx, tr.bag_layout(idx, off), chunk=8)
    assert s.num_chunks > s.num_segments and int((s.chunk_end - s.chunk_begin).max()) == 8
    assert torch.equal(s.segment_partials.diff(), (s.segment_start.diff() + 7) // 8)
    for chunk in (4, 8, 13):
        got = tr.backward("cuda-sorted", grad_out, idx, off, E, mode=mode, chunk=chunk, grid=2)
        assert float((got - expected).abs().max()) <= _tolerance(idx, grad_out)
        assert torch.equal(got, tr.backward("cuda-sorted", grad_out, idx, off, E, mode=mode, chunk=chunk, grid=5))
    w0 = torch.randn(E, 68, generator=torch.Generator().manual_seed(15))
    whole, m_whole = w0.clone(), torch.zeros(E)
    split, m_split = w0.clone(), torch.zeros(E)
    tr.fused_update(whole, grad_out, idx, off, optimizer="rowwise_adagrad", momentum=m_whole, mode=mode, chunk=10**6)
    tr.fused_update(split, grad_out, idx, off, optimizer="rowwise_adagrad", momentum=m_split, mode=mode, chunk=4)
    assert float((whole - split).abs().max()) <= 1e-5
    assert float((m_whole - m_split).abs().max()) <= 1e-5 * float(m_whole.max())
    assert tr.segment_chunk(307_200) == 556 and tr.segment_chunk(1815) == tr.MIN_CHUNK


def test_sorted_kernel_is_deterministic_and_its_segments_are_the_rows():
    idx, off = _bags(seed=4)
    grad_out, _ = _autograd(idx, off, 68)
    a = tr.backward("cuda-sorted", grad_out, idx, off, E, grid=2)
    b = tr.backward("cuda-sorted", grad_out, idx, off, E, grid=7)
    assert torch.equal(a, b)
    s = tr.sort_lookups(idx, tr.bag_layout(idx, off))
    assert torch.equal(s.segment_row, torch.unique(idx))
    assert torch.equal(s.segment_start[1:] - s.segment_start[:-1], torch.bincount(idx)[torch.unique(idx)])
    assert torch.equal(idx[s.sorted_pos], s.segment_row.repeat_interleave(s.segment_start.diff()))


def _rowwise_adagrad(w, m, grad, rows, lr, eps):
    """FBGEMM's row-wise Adagrad on the touched rows, in torch: m += mean(g^2); w -= lr g / (sqrt(m) + eps)."""
    g = grad[rows]
    m[rows] += (g * g).mean(dim=1)
    w[rows] -= lr * g / (m[rows].sqrt() + eps)[:, None]


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad"])
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_fused_update_is_the_optimizer_step_two_steps_running(optimizer, mode):
    D, lr, eps = 33, 0.05, 1e-8
    w0 = torch.randn(E, D, generator=torch.Generator().manual_seed(5))
    mine, m_mine = w0.clone(), torch.zeros(E)
    ref = w0.clone().requires_grad_(True)
    m_ref = torch.zeros(E)
    sgd = torch.optim.SGD([ref], lr=lr)
    for step in range(2):   # the momentum carries over
        idx, off = _bags(seed=10 + step)
        grad_out = torch.randn(B, D, generator=torch.Generator().manual_seed(20 + step))
        tr.fused_update(mine, grad_out, idx, off, optimizer=optimizer, lr=lr, momentum=m_mine, eps=eps, mode=mode,
                        grid=5)
        y = torch.nn.functional.embedding_bag(idx, ref, off, mode=mode)
        (grad,) = torch.autograd.grad(y, ref, grad_out)
        if optimizer == "sgd":
            ref.grad = grad
            sgd.step()
        else:
            with torch.no_grad():
                _rowwise_adagrad(ref, m_ref, grad, torch.unique(idx), lr, eps)
    assert float((mine - ref.detach()).abs().max()) <= 1e-5
    assert float((mine - w0).abs().max()) > 1e-3
    if optimizer == "rowwise_adagrad":
        assert float((m_mine - m_ref).abs().max()) <= 1e-5 * float(m_ref.max())
        assert int((m_mine > 0).sum()) == int((m_ref > 0).sum())


def test_fused_update_of_a_reordered_table_keeps_the_momentum_by_original_id():
    D = 12
    idx, off = _bags(seed=6)
    grad_out = torch.randn(B, D, generator=torch.Generator().manual_seed(7))
    w0 = torch.randn(E, D, generator=torch.Generator().manual_seed(8))
    order = torch.randperm(E, generator=torch.Generator().manual_seed(9))   # row order[k] lives at k
    where = torch.empty_like(order)
    where[order] = torch.arange(E)
    plain, m_plain = w0.clone(), torch.zeros(E)
    tr.fused_update(plain, grad_out, idx, off, optimizer="rowwise_adagrad", momentum=m_plain)
    moved, m_moved = w0[order].clone(), torch.zeros(E)
    tr.fused_update(moved, grad_out, idx, off, optimizer="rowwise_adagrad", momentum=m_moved, table_rows=where)
    assert torch.equal(moved[where], plain) and torch.equal(m_moved, m_plain)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_update_of_half_tables_rounds_the_fp32_step(dtype):
    D = 33
    idx, off = _bags(seed=12)
    w0 = torch.randn(E, D, generator=torch.Generator().manual_seed(13)).to(dtype)
    grad_out, _ = _autograd(idx, off, D)
    ref = w0.float().requires_grad_(True)
    (grad,) = torch.autograd.grad(torch.nn.functional.embedding_bag(idx, ref, off, mode="sum"), ref, grad_out)
    rows = torch.unique(idx)
    expected = w0.clone()
    expected[rows] = (w0.float()[rows] - 0.05 * grad[rows]).to(dtype)   # one rounding of the fp32 result
    mine = w0.clone()
    tr.fused_update(mine, grad_out, idx, off, optimizer="sgd", lr=0.05)
    diff = (mine.float() - expected.float()).abs()
    assert int((diff > 0).sum()) <= rows.numel() * D // 50   # a few last-bit ties from summation order
    assert float(diff.max()) <= float(expected.float().abs().max()) * 2 ** -7


def test_chunks_mirror_the_c_dispatch():
    lib = tr.load_training_library(torch.device("cpu"))
    for D in range(1, 300):
        c = lib.lib.chz_bwd_chunks(ctypes.c_int64(D))
        if D <= 256:
            assert c == tr.chunks(D)
        else:
            assert c == 0
            with pytest.raises(UnsupportedShape, match="D <= 256"):
                tr.chunks(D)


def test_bad_input_is_refused_with_a_domain_error():
    idx, off = _bags()
    g = torch.randn(B, 12)
    with pytest.raises(ConfigError, match="sum pooling"):
        tr.backward("cuda-atomic", g, idx, off, E, mode="mean", per_sample_weights=torch.ones(idx.shape[0]))
    with pytest.raises(UnsupportedShape, match="outside"):
        tr.backward("cuda-sorted", g, idx, off, 100)
    with pytest.raises(ConfigError, match="non-decreasing"):
        tr.backward("cuda-sorted", g, idx, off.flip(0), E)
    with pytest.raises(UnsupportedShape, match="D <= 256"):
        tr.backward("cuda-atomic", torch.randn(B, 300), idx, off, E)
    with pytest.raises(ConfigError, match="momentum"):
        tr.fused_update(torch.randn(E, 12), g, idx, off, optimizer="rowwise_adagrad")
    with pytest.raises(UnsupportedShape, match="fp32, fp16, bf16"):
        tr.fused_update(torch.zeros(E, 12, dtype=torch.float64), g, idx, off)
    with pytest.raises(ConfigError, match="unknown training kernel"):
        tr.get_training_kernel("cuda-magic")
    assert tr.kernel_for("cuda-fused", "rowwise_adagrad").name == "cuda-fused-rowwise_adagrad"


# ------------------------------------------------------------ static, SASS


@needs_tools
def test_hot_loops_keep_their_claims_on_sm80_and_sm90():
    """At D=128 (4 features per lane): the atomic kernel scatters 4 lookups x 4 fp32 REDs per
    iteration and never waits on them; the sorted and fused kernels keep a group of 4
    bag-gradient rows in flight (16 row loads, about one latency per group); no spills."""
    facts = tr.training_facts(archs=["sm_80", "sm_90"]).set_index(["kernel", "arch"])
    for arch in ("sm_80", "sm_90"):
        a = facts.loc[("cuda-atomic", arch)]
        assert (a["atomics"], a["atomic_bits"], a["row_loads"], a["lookups_per_iteration"]) == (16, 512, 0, 4)
        assert a["latencies_per_iteration"] < 0.5
        for k in ("cuda-sorted", "cuda-fused-sgd", "cuda-fused-rowwise_adagrad"):
            r = facts.loc[(k, arch)]
            assert (r["row_loads"], r["index_loads"], r["atomics"], r["lookups_per_iteration"]) == (16, 4, 0, 4)
            assert r["latencies_per_iteration"] < 1.2
        assert (facts["local_mem_ops"] == 0).all() and (facts["spill_stores"] == 0).all()
        assert (facts["blocks_per_sm"] >= 4).all()


@needs_tools
def test_the_static_facts_read_the_device_code_of_the_library_a_gpu_loads():
    """The facts come from a device-code build (no host compile); the library a GPU loads,
    host side linked, holds the same kernels with the same resources."""
    from characterize.kernels.build import build

    lib = build(tr.training_spec("cuda", "sm_80"))
    dev = build(tr.training_spec("cuda", "sm_80", output="cubin"))
    assert lib.library.suffix == ".so" and dev.library.name.endswith(".cubin")
    assert lib.kernels == dev.kernels and len(lib.kernels) > 10


@needs_tools
def test_the_atomic_loop_is_found_by_its_scatters():
    """The SASS analysis counts atomics and takes a loop that only scatters as a hot loop."""
    (row,) = tr.training_sass(["cuda-atomic"], archs=["sm_80"], D=33)
    assert row.kernel == "chz_bwd_atomic_kernel<2, 0>" and row.atomics == 8 and row.index_loads == 4


# ------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["cuda-atomic", "cuda-sorted"])
def test_backward_on_the_gpu_is_autograd(kernel):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine")
    idx, off = _bags()
    grad_out, expected = _autograd(idx, off, 128)
    got = tr.backward(kernel, grad_out.cuda(), idx.cuda(), off.cuda(), E)
    assert float((got.cpu() - expected).abs().max()) <= _tolerance(idx, grad_out)


@pytest.mark.gpu
def test_runtime_occupancy_matches_the_static_rows():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine")
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    lib = tr.load_training_library(torch.device("cuda"))
    for row in tr.training_static(archs=[arch]):
        assert lib.kernel_info(row.variant, 128) == (row.blocks_per_sm, row.registers)
