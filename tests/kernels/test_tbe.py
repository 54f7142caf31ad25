"""The table-batched kernel (variant tbe): one launch for every table of a batch, checked on
the CPU through the emulation build against torch.nn.functional.embedding_bag (every dtype,
tables of different E, D and dtype in one launch, empty bags, short and long bags, 32- and
64-bit indices, small grids so that a warp walks several bags and tables), compiled for
sm_80, sm_90 and sm_100, and held to its SASS: no spills, the rows in flight, the index
prefetch."""

import dataclasses

import numpy as np
import pytest
import torch

from characterize.config import DTYPES, Pooling, WorkloadConfig
from characterize.errors import ConfigError, UnsupportedShape
from characterize.hardware.specs import gpu_spec
from characterize.kernels import sass as S
from characterize.kernels.build import TBE_SOURCE, BuildSpec, build, build_many
from characterize.kernels.check import (
    check_one,
    check_tables,
    check_variants,
    make_table,
    mixed_tables,
    tolerance,
)
from characterize.kernels.library import bind_tables, dequantize, load_library, run_tables, table_dtype
from characterize.kernels.order import choose_tables_in_flight, coverage_curve, shared_coverage
from characterize.kernels.registry import (
    TBE_MAX_TABLES,
    get_variant,
    tbe_group,
    tbe_vectors_per_lane,
)
from characterize.kernels.sass import interpolate
from characterize.kernels.static import analyze_variants, static_characterization
from tests.conftest import needs_tools

DTYPE_NAMES = list(DTYPES)


def bags(E: int, B: int, low: int, high: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """B bags of uniform length in [low, high] over E rows."""
    g = np.random.default_rng(seed)
    lengths = g.integers(low, high + 1, size=B)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return torch.from_numpy(g.integers(0, E, size=int(lengths.sum()))), torch.from_numpy(offsets)


def passed(results) -> None:
    bad = [r for r in results if not r.passed]
    assert results and not bad, bad


# ------------------------------------------------------------- the emulation
def test_one_launch_for_tables_of_every_dtype_and_shape():
    """Every dtype (fp8 included) and three shapes (D = 68, 72, 32; E = 1009, 211, 127) in one batch: one
    launch per dtype group, every table against torch, in sum and mean, with a grid small
    enough that warps walk several bags and cross tables."""
    config = WorkloadConfig.tiny()
    tables, batch = mixed_tables(config, DTYPE_NAMES, "medium")
    for mode in ("sum", "mean"):
        passed(check_tables("tbe", tables, batch, mode=mode, backend="emulate", grid=2))
    tb = bind_tables("tbe", tables, backend="emulate")
    assert tb.launches == len(DTYPE_NAMES)
    tb.launch(tb.map_batch(batch))
    fp32 = tb.last_launch()["fp32"]
    assert fp32["path"] == "long" and fp32["index_bits"] == 32 and fp32["row_bits"] == 32
    assert fp32["groups"] == [32, 32]  # D=68 and D=72: 17 and 18 vectors, one lane each


@pytest.mark.parametrize("pooling, path", [("1", "short"), ("uniform:0:3", "short"), ("uniform:0:20", "long"),
                                           ("uniform:100:300", "long")])
def test_short_and_long_bags_on_either_path(pooling, path):
    """The path is chosen per launch from the bags' mean length; both are right for any length
    (forced), with every K of bags per run the short path may use."""
    tables = [make_table("fp32", 1009, 128, 1), make_table("int8", 211, 64, 2)]
    B = 129 if _range(pooling)[1] < 100 else 13  # long bags: fewer of them (the emulator runs every lane)
    batch = [bags(1009, B, *_range(pooling), 3), bags(211, B - 2, *_range(pooling), 4)]
    tb = bind_tables("tbe", tables, backend="emulate")
    tb.launch(tb.map_batch(batch))
    assert {r["path"] for r in tb.last_launch().values()} == {path}
    for params in ({"short": 0}, {"short": 1}, {"short": 1, "bags_per_run": 3}, {"short": 1, "bags_per_run": 32}):
        passed(check_tables("tbe", tables, batch, mode="mean", padding_idx=7, params=params, backend="emulate",
                            grid=3))


def _range(pooling: str) -> tuple[int, int]:
    p = Pooling.parse(pooling)
    return (int(p.mean), int(p.mean)) if p.kind == "fixed" else (p.low, p.high)


def test_index_widths_and_row_numbers():
    """int32 and int64 indices as given, the 32-bit launch for int64 traces (converted once), and
    the 64-bit row-number instance (forced: tables of 2^31 rows are not made for a test)."""
    tables = [make_table("fp32", 1009, 68, 1), make_table("int8", 211, 128, 2)]
    batch = [bags(1009, 127, 0, 20, 3), bags(211, 61, 0, 20, 4)]
    passed(check_tables("tbe", tables, [(i.int(), o.int()) for i, o in batch], backend="emulate"))
    passed(check_tables("tbe", tables, batch, params={"index_bits": 64}, backend="emulate", grid=2))
    for short in (0, 1):
        outs = run_tables("tbe", tables, batch, params={"index_bits": 64, "short": short}, backend="emulate",
                          grid=2, row_bits=64)
        for w, (i, o), out in zip(tables, batch, outs):
            wide = dequantize(w).double()
            want = torch.nn.functional.embedding_bag(i, wide, o, mode="sum")
            tol = tolerance(table_dtype(w), "tbe", 20, float(wide.abs().max()))
            assert float((out.output.double() - want).abs().max()) <= tol
    tb = bind_tables("tbe", tables, params={"index_bits": 64}, backend="emulate")
    tb.row_bits = 64
    tb.launch(tb.map_batch(batch))
    assert tb.last_launch()["fp32"]["row_bits"] == 64 and tb.last_launch()["int8"]["index_bits"] == 64
    with pytest.raises(ConfigError, match="32 or 64"):
        bind_tables("tbe", tables, params={"index_bits": 48}, backend="emulate")


def test_phased_work_orders_match_torch():
    """Tables walked in phases (tables_in_flight 1, 2 and 3 of 5 tables, so the last phase is short): every
    order gives torch's bags, with grids that leave warps idle in a phase and grids that give a warp several
    tasks of it, on both paths."""
    tables = [make_table("fp32", 1009, 68, 1), make_table("fp32", 211, 128, 2), make_table("fp32", 127, 32, 3),
              make_table("fp32", 331, 36, 4), make_table("fp32", 97, 64, 5)]
    for pooling in ("uniform:0:20", "uniform:0:3"):
        lo, hi = _range(pooling)
        batch = [bags(w.shape[0], 37 + 11 * t, lo, hi, 10 + t) for t, w in enumerate(tables)]
        for flight in (1, 2, 3):
            for grid in (1, 3, 40):
                passed(check_tables("tbe", tables, batch, params={"tables_in_flight": flight}, backend="emulate",
                                    grid=grid))
        tb = bind_tables("tbe", tables, params={"tables_in_flight": 2}, backend="emulate")
        tb.launch(tb.map_batch(batch))
        assert tb.last_launch()["fp32"]["phases"] == [2, 2, 1]
    with pytest.raises(ConfigError, match="tables_in_flight"):
        bind_tables("tbe", tables, params={"tables_in_flight": 0}, backend="emulate")


def test_the_work_order_follows_the_hot_rows():
    """kernels.order: the plain order when every table's hot rows fit the L2 together (one row each), one
    table at a time when even one table's rows overflow it (uniform over many rows), and in between the
    most tables whose shares of the L2 still hold their hot pools; bind_tables takes it from the traces
    unless tables_in_flight is given."""
    g = torch.Generator().manual_seed(3)
    E, T, rb, l2 = 10_000, 8, 512, 1000 * 512          # an L2 of 1,000 rows
    one_row = [torch.full((4000,), t) for t in range(T)]
    uniform = [torch.randint(0, E, (4000,), generator=g) for _ in range(T)]
    pools = [torch.randint(0, 200, (4000,), generator=g) for _ in range(T)]   # 200 hot rows each: 5 fit together
    curves = {name: [coverage_curve(tr, E) for tr in traces]
              for name, traces in (("one_row", one_row), ("uniform", uniform), ("pools", pools))}
    assert choose_tables_in_flight(curves["one_row"], [rb] * T, l2) == 0
    assert choose_tables_in_flight(curves["uniform"], [rb] * T, l2) == 1
    assert choose_tables_in_flight(curves["pools"], [rb] * T, l2) == 5
    assert shared_coverage(curves["pools"], [rb] * T, l2, 5) == pytest.approx(1.0)
    assert 125 / 200 < shared_coverage(curves["pools"], [rb] * T, l2, 8) < 0.8   # the most frequent 125 of 200
    tables = [make_table("fp32", E, 128, t) for t in range(T)]   # rows of 512 bytes, as above
    gpu = dataclasses.replace(gpu_spec("h100-sxm"), l2_bytes=l2, l2_effective_capacity=1.0)
    assert bind_tables("tbe", tables, backend="emulate", gpu=gpu, traces=pools).tables_in_flight == 5
    assert bind_tables("tbe", tables, backend="emulate", gpu=gpu, traces=one_row).tables_in_flight == 0
    assert bind_tables("tbe", tables, backend="emulate", gpu=gpu).tables_in_flight == 0   # no traces: plain
    assert bind_tables("tbe", tables, backend="emulate", gpu=gpu, traces=pools,
                       params={"tables_in_flight": 3}).tables_in_flight == 3


@pytest.mark.parametrize("D", [4, 12, 36, 260, 1024])
def test_odd_dimensions_one_table(D):
    """One table through the per-table interface (bind, run_variant): 1 to 8 vectors per lane."""
    i, o = bags(211, 61, 0, 20, 5)
    for dtype in ("fp32", "int8"):
        assert check_one("tbe", make_table(dtype, 211, D), i, o, backend="emulate").passed, (D, dtype)


def test_group_and_vectors_mirror_the_cuda_source():
    lib = load_library(BuildSpec("emulate", source=TBE_SOURCE)).lib
    for D in (4, 8, 12, 68, 128, 256, 260, 512, 1024):
        V = tbe_vectors_per_lane(D)
        assert lib.chz_tbe_vectors_per_lane(D) == V
        for v in (1, 2, 4, 8):
            assert lib.chz_tbe_group(D, v) == tbe_group(D, v), (D, v)
    assert (tbe_group(128, 1), tbe_group(16, 1), tbe_group(512, 4), tbe_group(4, 8)) == (32, 8, 32, 1)


def test_every_public_variant_check_includes_the_mixed_batch():
    results = check_variants(["tbe"], ["one-item", "random"], WorkloadConfig.tiny(), modes=("sum",),
                             backend="emulate", dtypes=["fp16", "int8h"])
    batched = [r for r in results if r.shape.startswith("T=")]
    assert len(batched) == 2 * 4 and {r.dtype for r in batched} == {"fp16", "int8h"}
    passed(results)


def test_the_batched_checker_can_fail():
    """The checker is not fooled by a launch that runs: tables swapped against their batches fail."""
    tables = [make_table("fp32", 1009, 68, 1), make_table("fp32", 1009, 68, 2)]
    batch = [bags(1009, 127, 1, 20, 3), bags(1009, 127, 1, 20, 4)]
    passed(check_tables("tbe", tables, batch, backend="emulate"))
    tb = bind_tables("tbe", tables[::-1], backend="emulate")
    outs = tb.launch(tb.map_batch(batch))
    ref = torch.nn.functional.embedding_bag(batch[0][0], tables[0].double(), batch[0][1], mode="sum")
    assert float((outs[0].output.double() - ref).abs().max()) > 1.0
    wrong = check_variants(["wrong"], ["medium"], WorkloadConfig.tiny(), modes=("sum",), backend="emulate")
    assert wrong and not any(r.passed for r in wrong)
    # fp8 rows: the same swap fails against the dequantized reference
    fp8 = [make_table("fp8", 1009, 68, 1), make_table("fp8", 1009, 68, 2)]
    passed(check_tables("tbe", fp8, batch, backend="emulate"))
    tb = bind_tables("tbe", fp8[::-1], backend="emulate")
    outs = tb.launch(tb.map_batch(batch))
    ref = torch.nn.functional.embedding_bag(batch[0][0], dequantize(fp8[0]).double(), batch[0][1], mode="sum")
    assert float((outs[0].output.double() - ref).abs().max()) > 1.0


def test_more_tables_than_one_launch_holds():
    """Past TBE_MAX_TABLES a dtype group takes one launch per TBE_MAX_TABLES tables."""
    T = TBE_MAX_TABLES + 1
    tables = [make_table("fp32", 97, 8, s) for s in range(T)]
    batch = [bags(97, 9, 0, 4, s) for s in range(T)]
    tb = bind_tables("tbe", tables, backend="emulate")
    assert tb.launches == 2
    passed(check_tables("tbe", tables, batch, backend="emulate"))


def test_empty_tables_and_bad_input():
    tables = [make_table("fp32", 1009, 68, 1), make_table("fp32", 211, 68, 2), make_table("fp32", 97, 68, 3)]
    empty = (torch.empty(0, dtype=torch.int64), torch.zeros(7, dtype=torch.int64))  # 7 empty bags
    none = (torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64))   # no bags at all
    passed(check_tables("tbe", tables, [bags(1009, 127, 0, 20, 3), empty, none], backend="emulate"))
    i, o = bags(211, 61, 0, 20, 4)
    i[17] = 211
    with pytest.raises(UnsupportedShape, match="table 1: index 211 at position 17"):
        run_tables("tbe", tables[:2], [bags(1009, 127, 0, 20, 3), (i, o)], backend="emulate")
    with pytest.raises(UnsupportedShape, match="multiple of 4"):
        bind_tables("tbe", [make_table("fp32", 97, 66)], backend="emulate")
    with pytest.raises(ConfigError, match="one table at a time"):
        bind_tables("warp", tables, backend="emulate")
    with pytest.raises(ConfigError, match="padding_idx 500"):
        bind_tables("tbe", tables, padding_idx=500, backend="emulate")


def test_registry_entry():
    v = get_variant("tbe")
    assert v.batched and v.tables_per_launch == 0 and v.source == TBE_SOURCE
    assert not get_variant("warp").batched and get_variant("warp").tables_per_launch == 1
    assert v.kernel_name({}, 128, "fp32") == "chz_tbe_kernel<1, int, unsigned int, false>"
    assert v.kernel_name({"short": 1, "index_bits": 64}, 512, "int8") == "chz_tbe_kernel<4, long, unsigned int, true>"
    assert v.build_spec("cuda", "sm_90", {}, "int8") == BuildSpec("cuda", "sm_90", None, "int8", source=TBE_SOURCE)
    shaped = dataclasses.replace(v, max_dim=64)
    with pytest.raises(UnsupportedShape, match="D <= 64"):
        shaped.check_shape(128)


# ------------------------------------------------------------ nvcc and SASS
ARCHS = ["sm_80", "sm_90", "sm_100"]
#: registers the launch bounds allow the one-vector instances: 3 blocks of 256 threads for fp32,
#: 4 for the narrower dtypes
BUDGET = {"fp32": 80, "fp16": 64, "bf16": 64, "int8": 64, "int8h": 64, "fp8": 64}


def _instances(V: int, short: bool) -> list[str]:
    s = "true" if short else "false"
    return [f"chz_tbe_kernel<{V}, {i}, {r}, {s}>" for i, r in
            (("int", "unsigned int"), ("long", "unsigned int"), ("long", "unsigned long"))]


@needs_tools
@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_builds_for_every_arch_within_its_register_budget(dtype):
    """Every instance compiles for sm_80, sm_90 and sm_100; the one-vector long-bag instances
    (D <= 128) stay within the budget their launch bounds set, without spilling. The device
    code alone (nvcc -cubin: the library's ptxas report; the library itself is built below)."""
    results = build_many([BuildSpec("cuda", a, None, dtype, source=TBE_SOURCE, output="cubin") for a in ARCHS])
    for spec, result in results.items():
        names = {n.split("(")[0].removeprefix("void ") for n in result.kernels}
        assert {k for V in (1, 2, 4, 8) for sh in (False, True) for k in _instances(V, sh)} <= names
        for kernel in _instances(1, False):
            res = result.resources(kernel)
            assert res.registers <= BUDGET[dtype], (spec.arch, kernel, res)
        main = result.resources(_instances(1, False)[0])  # what a batch of int32/int64 traces runs
        assert main.spill_stores == main.spill_loads == 0, (spec.arch, main)


@needs_tools
@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "int8h", "fp8"])
def test_other_dtypes_build_for_every_arch(dtype):
    results = build_many([BuildSpec("cuda", a, None, dtype, source=TBE_SOURCE, output="cubin") for a in ARCHS])
    for spec, result in results.items():
        main = result.resources(_instances(1, False)[0])
        assert main.registers <= BUDGET[dtype] and main.spill_stores == 0, (spec.arch, main)


@needs_tools
def test_the_library_a_gpu_loads_builds_with_the_device_code_the_other_tests_read():
    """The shared library (host code and launch wrappers around the same device code) links,
    and ptxas reports the same kernels and resources in it as in the device-code-only build."""
    lib = build(BuildSpec("cuda", "sm_90", None, "fp32", source=TBE_SOURCE))
    cubin = build(BuildSpec("cuda", "sm_90", None, "fp32", source=TBE_SOURCE, output="cubin"))
    assert lib.library.suffix == ".so" and lib.library.stat().st_size > 0
    assert set(lib.kernels) == set(cubin.kernels) and len(lib.kernels) >= 16
    main = _instances(1, False)[0]
    assert lib.resources(main) == cubin.resources(main)


def _nest(result, kernel):
    """The hot loop (a step: 8 vector loads per lane) and the tile loop around it."""
    code = S.kernel_code(result, kernel)
    hot = S.hot_loop(code)
    around = [lp for lp in S.find_loops(code) if hot.header in lp.blocks and lp.header != hot.header]
    return hot, min(around, key=lambda lp: len(lp.blocks))


@needs_tools
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", ["fp32", "int8", "fp8"])
def test_the_loop_nest_keeps_its_rows_in_flight(arch, dtype):
    """Read from the SASS at D=128: the step loads 8 rows per lane back to back with no spills;
    the tile loop around it loads the next tile's index before the step's rows and reads it only
    after them (the prefetch); over a whole bag of 150 (long path) and a run of 31 one-row bags
    (short path), index and offset loads counted, the warp keeps >= 8 rows in flight (fp32) and
    >= 6 (int8). The device code alone, as the build tests above read it."""
    result = build(BuildSpec("cuda", arch, None, dtype, source=TBE_SOURCE, output="cubin"))
    kernel = get_variant("tbe").kernel_name({}, 128, dtype)
    hot, tile = _nest(result, kernel)
    cls = S.classify(hot.path)
    width = {"fp32": 128, "int8": 32, "fp8": 32}[dtype]
    assert len(cls.row_loads) == 8 and {i.width_bits for i in hot.path if i.address in cls.row_loads} == {width}
    assert not any(i.opcode in ("LDL", "STL") for i in hot.path + tile.path)
    assert 8 / S.replay(hot.path).latencies_per_iteration >= 8
    # the index prefetch: an index load in the tile loop, issued before the step's row loads,
    # its value read only after the last of them (at the tile's end or the next tile's start)
    tile_cls = S.classify(tile.path)
    index_loads = [i for i in tile.path if i.address in tile_cls.index_loads]
    assert index_loads, "no index load in the tile loop"
    first_row = min(k for k, i in enumerate(tile.path) if i.address in cls.row_loads)
    last_row = max(k for k, i in enumerate(tile.path) if i.address in cls.row_loads)
    prefetch = [(k, i) for k, i in enumerate(tile.path) if i in index_loads and k < first_row]
    assert prefetch, "the tile's index load does not issue before its rows"
    k0, load = prefetch[-1]
    readers = [k for k, i in enumerate(tile.path) if set(load.dests) & set(i.srcs)]
    assert readers and not [k for k in readers if k0 < k <= last_row], "the prefetched index is read before the rows"
    # over whole bags (kernels.sass's loop-nest replay: index tiles, offsets and output stores
    # counted; a partial step as that fraction of a step): a bag of 150 on the long path, and on the short path a run of 31 one-row bags,
    # gathered as one stream; warp, whose tile index load is exposed, keeps about 6.4 and 0.3
    (long,) = analyze_variants(["tbe"], [arch], dtype=dtype)
    (short,) = analyze_variants(["tbe"], [arch], params={"tbe": {"short": 1}}, dtype=dtype)
    (warp,) = analyze_variants(["warp"], [arch], dtype=dtype) if dtype == "fp32" else [None]
    assert long.nest_rows_in_flight >= (8 if dtype == "fp32" else 6), (arch, dtype, long)
    # the switch to the next table of a warp's slice (the loop around the loop over bags: its
    # descriptor, first offsets and first tile) waits once per table a warp meets, not per bag
    assert 0 < long.setup_latencies < 3, (arch, dtype, long)
    assert 31 / interpolate(short.bag_latencies, 31) >= 5, (arch, dtype, short)
    if warp is not None:   # one loop over bags, nothing around it
        assert long.nest_rows_in_flight > warp.nest_rows_in_flight + 1 and warp.setup_latencies == 0


@needs_tools
def test_the_loop_nest_replay_finds_warps_exposed_index_load():
    """warp's tile index load is waited on: about 6.4 rows in flight over a bag of 150 on
    sm_80, against 8.66 in its hot loop alone."""
    (warp,) = analyze_variants(["warp"], ["sm_80"])
    assert warp.nest_rows_in_flight < 7 < 8.5 < warp.rows_in_flight


@needs_tools
def test_static_and_sass_rows_name_the_tbe_library():
    rows = static_characterization(["tbe", "warp"], ["sm_100"])
    tbe = next(r for r in rows if r.variant == "tbe")
    assert tbe.kernel == "chz_tbe_kernel<1, int, unsigned int, false>" and tbe.registers <= 80
    assert tbe.blocks_per_sm >= 3 and tbe.spill_stores == 0
    (loop,) = analyze_variants(["tbe"], ["sm_80"])
    assert loop.row_loads == 8 and loop.load_bits == {128: 8} and loop.local_mem_ops == 0
    assert loop.rows_in_flight >= 8
    (short,) = analyze_variants(["tbe"], ["sm_80"], params={"tbe": {"short": 1}})
    assert short.kernel.endswith("true>") and short.row_loads == 8 and short.local_mem_ops == 0


@pytest.mark.gpu
def test_on_a_gpu_one_launch_matches_torch_and_the_static_table():
    """The CUDA build on the device: tables of every dtype and shape in one launch per dtype
    group against torch, both paths, and the runtime's registers and blocks per SM against ptxas's."""
    from characterize.kernels.library import default_backend

    config = WorkloadConfig.tiny()
    tables, batch = mixed_tables(config, DTYPE_NAMES, "medium")
    for params in ({}, {"short": 1}):
        passed(check_tables("tbe", tables, batch, params=params, backend=default_backend()))
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    lib = load_library(BuildSpec("cuda", arch, None, "fp32", source=TBE_SOURCE))
    blocks, regs = lib.kernel_info("tbe1_32_32_long")
    res = lib.build.resources("chz_tbe_kernel<1, int, unsigned int, false>")
    assert regs == res.registers and blocks >= 3
