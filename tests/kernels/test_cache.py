"""Host-resident tables: the frequency-aware GPU row cache (checked on the CPU through the
emulation build, batch after batch, against torch on the full table and against an
independent replay of its policy) and the managed-memory variant."""

from collections import Counter

import numpy as np
import pytest
import torch

from characterize.config import WorkloadConfig
from characterize.errors import ConfigError, UnsupportedShape
from characterize.kernels.cache import CachePolicy, HostCache
from characterize.kernels.check import cache_trace, check_cache_batches, check_variants, make_table
from characterize.kernels.library import bind, dequantize, run_variant
from characterize.kernels.registry import (
    HOST_VARIANTS,
    VARIANT_ORDER,
    default_cache_rows,
    get_variant,
)
from tests.conftest import HAS_GPU


def odd_batches(n=5, B=37, E=1009, max_len=11, seed=5, hot=60):
    """n batches of B bags (empty ones included) over E rows, most lookups on a hot set
    that drifts from batch to batch (so the cache must evict), with duplicate ids."""
    g = np.random.default_rng(seed)
    out = []
    for b in range(n):
        lengths = g.integers(0, max_len + 1, B)
        lengths[:2] = [0, max_len]
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        pool = (np.arange(hot) * 7 + 13 * b) % E
        k = int(lengths.sum())
        idx = np.where(g.random(k) < 0.8, pool[g.integers(0, hot, k)], g.integers(0, E, k)).astype(np.int64)
        out.append((torch.from_numpy(idx), torch.from_numpy(offsets)))
    return out


def reference_policy(E, C, warm, batches):
    """The cache's policy written out independently: per batch (hits, misses, admitted,
    evicted), and the rows cached at the end."""
    stats = Counter(int(r) for r in warm)
    seen = Counter()
    prio = Counter(stats)
    ranked = sorted((r for r in range(E) if prio[r] > 0), key=lambda r: (-prio[r], r))[:C]
    slots = [None] * C
    where = {}
    for s, r in enumerate(ranked):
        slots[s], where[r] = r, s
    steps = []
    for idx in batches:
        ids = [int(r) for r in idx]
        uniq = sorted(set(ids))
        hits = [r for r in uniq if r in where]
        for r in ids:
            seen[r] += 1
            prio[r] = max(stats[r], seen[r])
        misses = sorted((r for r in uniq if r not in where), key=lambda r: (-prio[r], r))
        used = {where[r] for r in hits}
        free = sorted((s for s in range(C) if s not in used),
                      key=lambda s: (prio[slots[s]] if slots[s] is not None else -1, s))
        admitted = evicted = 0
        for r, s in zip(misses, free):
            old = slots[s]
            if prio[r] <= (prio[old] if old is not None else -1):
                break
            if old is not None:
                del where[old]
                evicted += 1
            slots[s], where[r] = r, s
            admitted += 1
        steps.append((len(hits), len(misses), admitted, evicted))
    return steps, set(where)


def test_host_variants_stand_apart_from_the_kernel_family():
    assert set(HOST_VARIANTS) == {"cache", "uvm"} and not set(HOST_VARIANTS) & set(VARIANT_ORDER)
    for name in HOST_VARIANTS:   # each reuses base's lookup kernel: no new code to build or analyze
        v = get_variant(name)
        assert (v.entry, v.kernel) == (get_variant("base").entry, get_variant("base").kernel)
    assert default_cache_rows(500_000) == 7_500 and default_cache_rows(1009) == 15 and default_cache_rows(10) == 1


@pytest.mark.parametrize("C", [1, 16, 45, 2000])
def test_policy_matches_an_independent_replay(C):
    E = 1009
    batches = odd_batches()
    warm = batches[0][0][:50]
    policy = CachePolicy(E, C, "cpu", np.bincount(warm.numpy(), minlength=E))
    got = []
    for idx, _ in batches:
        d = policy.step(idx)
        got.append((d.hits, int(d.miss_rows.numel()), d.admitted, d.evicted))
    want, cached = reference_policy(E, min(C, E), warm.numpy(), [i.numpy() for i, _ in batches])
    assert got == want
    assert set(policy.cached().tolist()) == cached
    if C in (16, 45):
        assert sum(s[3] for s in got) > 0    # the drifting hot set makes it evict


@pytest.mark.parametrize("dtype", list(get_variant("cache").dtypes))
@pytest.mark.parametrize("C", [3, 37])
def test_cache_variant_batch_after_batch_matches_torch_on_the_full_table(dtype, C):
    W = make_table(dtype, 1009, 36, seed=11)
    batches = odd_batches(seed=C)
    r = check_cache_batches("cache", W, batches, batches[0][0][:40], params={"C": C}, padding_idx=13,
                            backend="emulate")
    assert r.passed, r
    assert f"C={C}" in r.shape and "evicted" in r.note
    assert int(r.note.split(" evicted")[0].split(", ")[-1]) > 0


def test_statistics_per_batch():
    W = torch.randn(1009, 33, generator=torch.Generator().manual_seed(2))
    batches = odd_batches(n=3)
    tk = bind("cache", W, trace=batches[0][0], params={"C": 29}, backend="emulate")
    for idx, off in batches:
        out = tk.launch(idx, off)
        ref = torch.nn.functional.embedding_bag(idx, W, off, mode="sum")
        assert torch.allclose(out.output, ref, atol=1e-5)
    stats = tk.cache.stats
    assert [s.batch for s in stats] == [0, 1, 2]
    for s, (idx, _) in zip(stats, batches):
        assert s.unique == len(set(idx.tolist())) and s.hits + s.misses == s.unique
        assert s.host_bytes == s.misses * 33 * 4            # whole stored rows cross the link
        assert 0 <= s.lookup_hits <= s.lookups == idx.numel()
        assert min(s.dedup_us, s.transfer_us, s.lookup_us) >= 0 and s.timer == "host clock"
        assert s.admitted <= s.misses and s.evicted <= s.admitted
    # warmed from batch 0's own frequencies with C below its unique rows: its hottest rows hit
    assert stats[0].hits == 29
    assert tk.cache.consistent() and tk.cache.policy.C == 29


def test_warm_cache_holds_the_most_frequent_rows():
    trace = torch.tensor([5, 5, 5, 9, 9, 2, 7, 7, 7, 7, 100])
    policy = CachePolicy(1009, 3, "cpu", np.bincount(trace.numpy(), minlength=1009))
    assert policy.cached().tolist() == [7, 5, 9]


def test_a_batch_larger_than_the_cache_still_runs_through_staging():
    W = torch.randn(211, 12)
    idx = torch.arange(211).flip(0).repeat(2)     # every row twice, more unique rows than slots
    off = torch.tensor([0, 5, 5, 200], dtype=torch.int64)
    out = run_variant("cache", W, idx, off, params={"C": 4}, backend="emulate")
    assert torch.allclose(out.output, torch.nn.functional.embedding_bag(idx, W, off, mode="sum"), atol=1e-5)


def test_default_cache_size_and_bad_sizes():
    W = torch.randn(1009, 8)
    tk = bind("cache", W, trace=torch.arange(50), backend="emulate")
    assert tk.params["C"] == default_cache_rows(1009) == 15
    with pytest.raises(ConfigError, match="C must be an integer"):
        bind("cache", W, params={"C": 0}, backend="emulate")
    with pytest.raises(ConfigError, match="one count per row"):
        CachePolicy(10, 2, "cpu", np.ones(3))
    with pytest.raises(ConfigError, match="C >= 1"):
        HostCache(torch.randn(10, 4), 0, "cpu", None, 16)


def test_out_of_range_indices_are_refused_before_the_cache_sees_them():
    with pytest.raises(UnsupportedShape, match="outside"):
        run_variant("cache", torch.randn(50, 8), torch.tensor([3, 50]), torch.tensor([0]), backend="emulate")


def test_check_variants_runs_the_cache_over_several_batches_with_eviction():
    results = check_variants(["cache", "uvm"], ["medium"], WorkloadConfig.tiny(), modes=("sum",), backend="emulate",
                             dtypes=["fp32", "int8"])
    assert all(r.passed for r in results), results
    multi = [r for r in results if "batches=" in r.shape]
    assert {r.dtype for r in multi} == {"fp32", "int8"}
    assert all(int(r.note.split(" evicted")[0].split(", ")[-1]) > 0 for r in multi)
    batches, warm = cache_trace("medium", WorkloadConfig.tiny())
    assert len(batches) >= 4 and warm.numel()


def test_uvm_on_the_cpu_is_the_table_itself():
    W = make_table("bf16", 1009, 36, seed=3)
    idx, off = odd_batches(n=1)[0]
    tk = bind("uvm", W, backend="emulate")
    assert tk.managed is None and tk.cache is None and tk.weight is W
    out = tk.launch(idx, off)
    ref = torch.nn.functional.embedding_bag(idx, dequantize(W), off, mode="sum")
    assert torch.allclose(out.output, ref, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU: pinned host memory, CUDA-event timing, managed memory")
@pytest.mark.parametrize("variant", HOST_VARIANTS)
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "int8"])
def test_host_variants_on_the_gpu(variant, dtype):
    W = make_table(dtype, 1009, 36, seed=4)
    batches = odd_batches(seed=9)
    r = check_cache_batches(variant, W, batches, batches[0][0][:40], params={"C": 37} if variant == "cache" else None,
                            backend="cuda")
    assert r.passed, r
    if variant == "cache":
        tk = bind("cache", W, trace=batches[0][0], backend="cuda")
        assert tk.cache.host.is_pinned() and tk.cache.rows.is_cuda
        for idx, off in batches:
            tk.launch(idx.cuda(), off.cuda())
        assert all(s.timer == "cuda events" for s in tk.cache.stats)
        assert tk.cache.consistent()
