"""Model stage: its limits, monotonicity, bandwidth ceilings and floor, the structure the
hardware argues for (SMs take blocks as others retire, L2 shared by every stream, one
launch for all tables, L=1), calibration on a synthetic run, and the paper-claims table.

The kernels' facts are the committed no-GPU run's (profiles/static-paper: ptxas's
resources and the loop-nest replay of nvcc 13's SASS for fp32, fp16 and int8): real
facts, with no compiler call, so these tests stay fast. Where a test needs another
occupancy or more rows in flight it changes those facts the way a different kernel
would have them (registers; latencies per bag).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from characterize import pipeline
from characterize.analysis import calibrate as C
from characterize.analysis import claims as CL
from characterize.analysis.model import locality as LOC
from characterize.analysis.model import predict as MP
from characterize.analysis.model.constants import ModelConstants, load_calibration
from characterize.analysis.model.equations import norm
from characterize.analysis.model.scores import gmae
from characterize.cli.base import Group
from characterize.cli.model import calibrate as calibrate_cmd
from characterize.cli.model import predict as predict_cmd
from characterize.config import ExperimentConfig, Pooling, WorkloadConfig
from characterize.errors import ConfigError, ToolchainNotFound, UnsupportedShape
from characterize.hardware.specs import gpu_spec
from characterize.store import RunDir, load_run

PAPER_RUN = Path(__file__).parents[2] / "profiles" / "static-paper"
SMALL = WorkloadConfig(T=2, E=50_000, B=256, L=20, batches=3)
VARIANTS = ["base", "optmt", "rpf", "l2p", "l2w", "combined", "warp"]


def static(registers: dict[str, int] | None = None) -> pd.DataFrame:
    """The committed run's static rows; `registers` overrides a variant's (all archs)."""
    df = pd.read_csv(PAPER_RUN / "static.csv")
    for v, r in (registers or {}).items():
        df.loc[df["variant"] == v, "registers"] = r
    return df


def sass(scale: dict[str, float] | None = None, instructions: dict[str, float] | None = None) -> pd.DataFrame:
    """The committed run's SASS rows; `scale` divides a variant's latencies per bag (as a
    kernel keeping that many times more rows in flight would wait), `instructions`
    multiplies its instructions per bag."""
    df = pd.read_csv(PAPER_RUN / "sass.csv")
    for col, changes, op in (("bag_latencies", scale, lambda x, f: x / f),
                             ("bag_instructions", instructions, lambda x, f: x * f)):
        for v, f in (changes or {}).items():
            rows = df["variant"] == v
            df.loc[rows, col] = [json.dumps({k: op(x, f) for k, x in json.loads(c).items()}) for c in df.loc[rows, col]]
    return df


@pytest.fixture(autouse=True)
def no_stored_calibration(tmp_path, monkeypatch):
    monkeypatch.setenv("CHARACTERIZE_CALIBRATION", str(tmp_path / "calibration"))


def test_the_committed_facts_cover_what_these_tests_read():
    s, k = static(), sass()
    for df in (s, k):
        assert {"sm_80", "sm_90"} <= set(df["arch"]) and {"fp32", "fp16", "int8"} <= set(df["dtype"])
        assert set(VARIANTS) <= set(df["variant"])
    lookups = k[k["role"] == "lookup"]
    assert lookups["bag_latencies"].map(lambda c: len(json.loads(c)) >= 5).all()


def test_a_trace_of_one_row_hits_l2():
    df = MP.predict(SMALL, ["one-item"], ["base", "l2p", "warp"], ["sm_80", "sm_90"], static=static(), sass=sass())
    assert (df["l2_hit_rate_pct"] > 99).all()
    assert (df["l1_hit_rate_pct"] > 90).all()   # and mostly the SM's own L1
    assert set(df["constants"]) == {"default"}


def test_uniform_trace_over_a_table_100x_the_l2_misses():
    E = 100 * gpu_spec("sm_80").l2_bytes // 512
    df = MP.predict(SMALL.replace(E=E, batches=2), ["random"], ["base"], ["sm_80"], static=static(), sass=sass())
    assert df["l2_hit_rate_pct"].iloc[0] < 1


def test_more_resident_warps_or_rows_in_flight_never_slower_when_latency_bound():
    wl = SMALL.replace(E=500_000, B=2048, L=150, batches=2)
    times, blocks = [], []
    for regs in (128, 96, 72, 64, 56, 48, 40, 32):
        r = MP.predict(wl, ["random"], ["base"], ["sm_80"], static=static({"base": regs}), sass=sass()).iloc[0]
        times.append(r["time_us"])
        blocks.append(r["blocks_per_sm"])
    assert blocks == sorted(blocks) and blocks[-1] > blocks[0]
    assert all(later <= earlier + 1e-9 for earlier, later in zip(times, times[1:])) and times[-1] < times[0]
    wl = wl.replace(E=5_000_000)
    rows = [MP.predict(wl, ["random"], ["rpf"], ["sm_80"], static=static(), sass=sass({"rpf": f})).iloc[0]
            for f in (0.25, 0.5, 1, 2, 4, 8, 16)]
    assert rows[0]["bound"] == "latency" and rows[-1]["bound"] == "dram"   # rows in flight reach the roofline
    for column in ("latency_us", "time_us"):
        values = [r[column] for r in rows]
        assert all(later <= earlier + 1e-9 for earlier, later in zip(values, values[1:])), column
    busy = MP.predict(wl, ["random"], ["rpf"], ["sm_80"], static=static(),
                      sass=sass({"rpf": 16}, {"rpf": 8})).iloc[0]
    assert busy["bound"] == "issue"   # unless the loops issue too many instructions


def test_occupancy_counts_in_whole_rounds_of_blocks_on_the_busiest_sm():
    """1024 blocks of 8 warps on 132 SMs: the busiest SM gets 8 blocks, and whether 4, 5, 6 or 7
    of them fit at once it runs two rounds (blocks of equal work retire together), so the
    latency term is the same; at 8 resident blocks, one round. Measured on an H200 (profiles/
    h200): base, optmt and l2p with 4-6 resident blocks averaged 30-31 warps per SM in ncu, and
    the register cap bought optmt 1-2%, not the 16% a fractional wave predicts."""
    wl = SMALL.replace(E=5_000_000, B=2048, L=150, T=1, batches=2)
    by_blocks = {}
    for regs in (64, 56, 48, 40, 32):
        r = MP.predict(wl, ["random"], ["base"], ["h100-sxm"], static=static({"base": regs}), sass=sass()).iloc[0]
        by_blocks[int(r["blocks_per_sm"])] = r
    assert len(by_blocks) >= 4 and max(by_blocks) == 8
    two = [by_blocks[k] for k in sorted(by_blocks) if k < 8]
    assert all(r["waves"] == 2 and r["latency_us"] == pytest.approx(two[0]["latency_us"]) for r in two)
    assert by_blocks[8]["waves"] == 1 and by_blocks[8]["latency_us"] == pytest.approx(two[0]["latency_us"] / 2)
    assert all(r["resident_warps"] == pytest.approx(1024 * 8 / 132 / r["waves"]) for r in by_blocks.values())


def test_a_grid_smaller_than_the_gpu_issues_and_reads_l1_on_the_sms_it_holds():
    """warp gives each bag a warp, 8 to a block: 256 or 512 bags make 32 or 64 blocks, one per SM
    on 132 SMs, so each SM that holds a block does the same work and the issue and L1 terms
    stay (the other SMs idle); from 132 blocks on, the busiest SM's share of them sets them.
    (Measured on an H200, profiles/h200 shape d: warp's 64 blocks of int8 rows took 19-21 us,
    predicted 9-11 us while the issue term spread their instructions over all 132 SMs.)"""
    wl = SMALL.replace(E=500_000, L=60, T=1, batches=2)
    rows = {B: MP.predict(wl.replace(B=B), ["random"], ["warp"], ["h100-sxm"], static=static(),
                          sass=sass()).iloc[0] for B in (256, 512, 132 * 8, 264 * 8)}
    for term in ("issue_us", "l1_us"):
        assert rows[256][term] == pytest.approx(rows[512][term], rel=0.02)
        assert rows[512][term] == pytest.approx(rows[132 * 8][term], rel=0.02)
        assert rows[264 * 8][term] == pytest.approx(2 * rows[132 * 8][term], rel=0.02)


def test_pcie_and_sxm_differ_by_their_resources_not_by_a_wave():
    wl = SMALL.replace(E=5_000_000, B=2048, L=150, T=1, batches=2)
    df = MP.predict(wl, ["random"], ["torch"], ["h100-sxm", "h100-pcie"], static=static(), sass=sass())
    t = df.set_index("gpu")["time_us"]
    assert 1.0 < t["h100-pcie"] / t["h100-sxm"] < 1.5


def test_bandwidth_bound_predictions_never_exceed_the_peaks_nor_beat_the_floor():
    wl = SMALL.replace(E=2_000_000, B=2048, L=50, batches=2)
    df = MP.predict(wl, ["random", "high"], VARIANTS + ["torch", "fbgemm"], ["sm_80", "sm_90"], static=static(),
                    sass=sass())
    assert (df["bound"] == "dram").any()
    for row in df.itertuples():
        gpu = gpu_spec(row.gpu)
        ns = (row.time_us - 0) * 1000
        assert row.dram_bytes / ns <= gpu.hbm_GBps and row.l2_bytes / ns <= gpu.l2_GBps
        assert row.time_us >= row.floor_us and row.time_us_low >= row.floor_us


def test_the_output_and_index_streams_share_l2_with_the_rows():
    """Rows reused after many bags: the indices and outputs streamed in between push them
    out. A batch 8x wider streams 8x the output bytes between two reads of a row at the
    same row distance, so fewer rows survive."""
    narrow = SMALL.replace(E=2_000, B=128, L=Pooling("fixed", 1.0), D=512, batches=2)
    wide = narrow.replace(B=1024, E=16_000)
    hits = [float(MP.predict(w, ["random"], ["base"], ["sm_80"], static=static(), sass=sass())
                  ["l2_hit_rate_pct"].iloc[0]) for w in (narrow, wide)]
    assert hits[1] < hits[0]


def test_writes_have_their_own_efficiency_and_dominate_at_L_1():
    wl = SMALL.replace(E=5_000_000, B=65536, L=Pooling("fixed", 1.0), T=1, batches=2)
    c = ModelConstants.defaults(gpu_spec("h100-sxm"))
    r = MP.predict(wl, ["random"], ["base"], ["h100-sxm"], static=static(), sass=sass(), constants=c).iloc[0]
    assert r["dram_write_bytes"] >= 0.8 * r["dram_read_bytes"]   # L=1: one output row per row read
    slow = MP.predict(wl, ["random"], ["base"], ["h100-sxm"], static=static(), sass=sass(),
                      constants=c.replace(write_efficiency=0.4)).iloc[0]
    assert slow["dram_us"] > r["dram_us"]


def test_one_launch_for_all_tables_is_predicted_as_one():
    wl = SMALL.replace(T=8, batches=2)
    df = MP.predict(wl, ["medium"], ["base", "fbgemm", "torch"], ["sm_90"], static=static(), sass=sass())
    r = df.set_index("variant")
    assert r.loc["fbgemm", "tables_per_launch"] == 8 and r.loc["base", "tables_per_launch"] == 1
    assert r.loc["fbgemm", "batch_us"] == pytest.approx(r.loc["fbgemm", "time_us"])
    assert r.loc["fbgemm", "time_per_table_us"] == pytest.approx(r.loc["fbgemm", "time_us"] / 8)
    assert r.loc["base", "batch_us"] == pytest.approx(8 * r.loc["base", "time_us"])
    # speedups compare whole batches: a kernel covering every table is not 8x slower
    assert r.loc["fbgemm", "speedup_vs_base"] == pytest.approx(r.loc["base", "batch_us"] / r.loc["fbgemm", "batch_us"])
    assert r.loc["torch", "speedup_vs_torch"] == pytest.approx(1.0)
    assert "fbgemm 1.8.0" in r.loc["fbgemm", "kernel_source"] and "torch 2.13.0" in r.loc["torch", "kernel_source"]


def test_no_pooling_and_short_bags_are_predicted():
    for L in ("1", "2", "uniform:0:3"):
        wl = SMALL.replace(L=Pooling.parse(L) if hasattr(Pooling, "parse") else L, batches=2)
        df = MP.predict(wl, ["high", "random"], ["base", "warp", "torch", "fbgemm"], ["sm_80"], static=static(),
                        sass=sass())
        assert len(df) == 8 and (df["time_us"] > 0).all() and df["time_us"].notna().all(), L


def test_cold_mode_is_never_faster_than_steady():
    df = MP.predict(SMALL, ["high", "medium"], VARIANTS + ["torch"], ["sm_80"], static=static(), sass=sass(),
                    mode=["steady", "cold"])
    t = df.set_index(["variant", "dataset", "mode"])["time_us"]
    for v in VARIANTS + ["torch"]:
        for d in ("high", "medium"):
            assert t[(v, d, "cold")] >= t[(v, d, "steady")] - 1e-9, (v, d)


def test_the_terms_overlap_as_a_k_norm():
    assert norm([3.0, 4.0], 2.0) == pytest.approx(5.0)
    assert norm([3.0, 4.0], 1.0) == pytest.approx(7.0)
    assert norm([3.0, 4.0], 64.0) == pytest.approx(4.0, rel=1e-3)
    assert norm([0.0, 0.0], 2.0) == 0.0


def test_pinning_never_lowers_the_hit_rate():
    """l2p/combined prefetch the hot rows before every launch, in a set-aside or not.
    (l2w is not pinning: its window is re-aimed at each table, so hot rows miss on their
    first read per launch and its carve-out shrinks the rest of L2.)"""
    wl = SMALL.replace(E=500_000, B=1024, L=40)
    for K, mode, aside in ((2000, "steady", True), (None, "steady", True), (None, "cold", True),
                           (2000, "steady", False)):
        params = {} if K is None else {"l2p": {"K": K}, "combined": {"K": K}}
        df = MP.predict(wl, ["one-item", "high", "medium", "low", "random"], ["base", "l2p", "combined"],
                        ["sm_80", "sm_90"], static=static(), sass=sass(), params=params, mode=mode, set_aside=aside)
        hit = df.set_index(["variant", "dataset", "gpu"])["l2_hit_rate_pct"]
        for (v, d, g), h in hit.items():
            assert h >= hit[("base", d, g)] - 1e-9, (K, mode, aside, v, d, g)
    assert (df[df["variant"] == "l2p"]["prepass_us"] > 0).all() and df[df["variant"] == "base"]["prepass_us"].isna().all()


def test_a_pinned_row_hits_with_a_calibratable_probability_not_for_certain():
    from characterize.analysis.model.constants import BOUNDS, FIT_DEFAULT

    gpu = gpu_spec("a100-80gb")
    base = ModelConstants.defaults(gpu)
    assert base.pinned_hit == gpu.pinned_hit_probability < 1.0 and "pinned_hit" in FIT_DEFAULT
    assert BOUNDS["pinned_hit"][1] == 1.0
    hits = {}
    # twelve tables of 1 GB between two batches: a hot row survives only if its pin holds
    wl = SMALL.replace(T=12, E=2_000_000, B=1024, L=40)
    for p in (0.5, base.pinned_hit, 1.0):
        df = MP.predict(wl, ["medium"], ["l2p"], [gpu], static=static(), sass=sass(), params={"l2p": {"K": 30000}},
                        constants=base.replace(pinned_hit=p))
        hits[p] = float(df["l2_hit_rate_pct"].iloc[0])
    assert hits[0.5] < hits[base.pinned_hit] < hits[1.0]
    # a calibration stored before the constant existed still loads, with the default
    old = {k: v for k, v in base.to_dict().items() if k not in ("pinned_hit", "overlap", "write_efficiency",
                                                                  "request_overhead_bytes")}
    assert ModelConstants.from_dict(old).pinned_hit == gpu.pinned_hit_probability


def test_sectors_and_capacities():
    assert LOC.sectors_per_row(512) == 16
    assert LOC.sectors_per_row(272) == 9          # D=68: 8.5 sectors, rows straddle
    assert LOC.sectors_per_row(4) == 1


def test_distances_read_as_hit_rates_count_first_and_sort_when_read_often():
    """A few capacities are counted on the unsorted distances; past SORT_AFTER reads they are
    sorted once; either way the hit rate is the sorted array's (infinite distances miss)."""
    rng = np.random.default_rng(0)
    values = rng.exponential(1e6, 10_000)
    values[::7] = np.inf
    d, ordered = LOC.Distances(values), np.sort(values)
    caps = rng.uniform(0, 3e6, 3 * LOC.Distances.SORT_AFTER).tolist() + [0.0, float(values[3]), np.inf]
    for cap in caps:
        assert LOC.hit_fraction(d, cap) == LOC.hit_fraction(ordered, cap)
    assert d.ordered is not None and LOC.hit_fraction(LOC.Distances(np.empty(0)), 1.0) == 0.0


def test_gmae_definition():
    assert gmae([1.1, 0.9], [1.0, 1.0]) == pytest.approx(0.1)
    assert gmae([1.2, 1.0], [1.0, 1.0]) == pytest.approx(np.sqrt(0.2 * 1e-4))  # exact points floored at 0.01%


def test_the_model_never_compiles_and_the_pipeline_says_what_is_missing(monkeypatch):
    with pytest.raises(ConfigError, match="static="):
        MP.predict(SMALL, ["high"], ["base"], ["sm_80"])
    with pytest.raises(ConfigError, match="sass="):
        MP.predict(SMALL, ["high"], ["base"], ["sm_80"], static=static())

    def no_nvcc(*a, **k):
        raise ToolchainNotFound("no nvcc")

    monkeypatch.setattr(pipeline.facts, "static_characterization", no_nvcc)
    exp = pipeline.check_experiment(ExperimentConfig(workload=SMALL, datasets=("high",), variants=("base",)))
    with pytest.raises(ToolchainNotFound, match="sass.csv"):
        pipeline.predict(exp, ["sm_80"])


def test_peers_need_no_compiler_and_are_left_out_with_a_reason_where_they_cannot_run():
    # FBGEMM's TBE needs D to be a multiple of 4: as a reference it is left out, not an error
    df = MP.predict(SMALL.replace(D=66), ["high"], ["base"], ["sm_80"], static=static(), sass=sass())
    assert df["speedup_vs_fbgemm"].isna().all() and df["speedup_vs_torch"].notna().all()
    with pytest.raises(UnsupportedShape, match="multiple of 4"):
        MP.predict(SMALL.replace(D=66), ["high"], ["fbgemm"], ["sm_80"], static=static(), sass=sass())


def _synthetic_run(tmp_path, truth: ModelConstants) -> RunDir:
    """A run directory whose 'measured' times are the model's own with `truth` constants."""
    exp = ExperimentConfig(name="synthetic", workload=WorkloadConfig(T=2, E=400_000, B=1024, L=40, batches=3),
                           datasets=("one-item", "medium", "random"), variants=("torch", *VARIANTS))
    run = RunDir.create(tmp_path / "run", {"experiment": exp.to_dict(),
                                           "gpu": {"name": "NVIDIA A100-SXM4-80GB", "arch": "sm_80"}})
    run.write("static", static())
    run.write("sass", sass())
    frames = [MP.predict(exp.workload, exp.datasets, exp.variants, ["sm_80"], constants=truth, static=static(),
                         sass=sass(), mode=m) for m in ("steady", "cold")]
    for (v, d), g in pd.concat(frames).groupby(["variant", "dataset"]):
        summary = [{"mode": r.mode, "per_table_us": r.time_us, "ci95_us": 0.01 * r.time_us} for r in g.itertuples()]
        run.write_point("bench", v, d, {"status": "ok", "summary": summary})
    return run


def group():
    """The model's commands on a group like characterize's main (domain errors -> messages)."""
    g = Group()
    g.add_command(predict_cmd)
    g.add_command(calibrate_cmd)
    return g


def test_calibration_recovers_known_constants(tmp_path):
    """Checks the fitting procedure, not the model's truth: the 'measured' run is the
    model itself with perturbed constants, which the fit must find again."""
    defaults = ModelConstants.defaults(gpu_spec("sm_80"))
    truth = defaults.replace(l1_latency_ns=32.0, l2_latency_ns=170.0, dram_latency_ns=600.0,
                             l2_capacity_factor=0.75, hbm_efficiency=0.7, launch_overhead_us=4.5)
    run = _synthetic_run(tmp_path, truth)
    cal = C.fit_run(load_run(run.path))
    exp = ExperimentConfig.from_dict(load_run(run.path).meta["experiment"])

    def times(c: ModelConstants) -> np.ndarray:
        return np.concatenate([MP.predict(exp.workload, exp.datasets, exp.variants, ["sm_80"], constants=c,
                                          static=static(), sass=sass(), mode=m)["time_us"].to_numpy()
                               for m in ("steady", "cold")])

    base = times(truth)
    seen = 0
    for name in ("l1_latency_ns", "l2_latency_ns", "dram_latency_ns", "l2_capacity_factor", "hbm_efficiency",
                 "launch_overhead_us"):
        want = getattr(truth, name)
        nudged = times(truth.replace(**{name: want * 1.1}))
        if np.max(np.abs(nudged / base - 1)) < 0.005:
            continue   # no timed point moves with this constant: the data cannot see it
        seen += 1
        assert getattr(cal.constants, name) == pytest.approx(want, rel=0.1), name
    assert seen >= 3
    assert cal.gmae_fitted < 0.01 < cal.gmae_default

    res = CliRunner().invoke(group(), ["calibrate", str(run.path), "--json"])
    assert res.exit_code == 0, res.output
    stored = json.loads(res.output)
    assert stored["gpu"] == "a100-80gb" and set(stored["constants"]) == set(truth.to_dict())
    assert load_calibration("sm_80") == ModelConstants.from_dict(stored["constants"])
    pred = MP.predict(exp.workload, exp.datasets, exp.variants, ["sm_80"], static=static(), sass=sass())
    assert set(pred["constants"]) == {"calibrated"}
    cmp = C.compare_to_measured(pred, load_run(run.path))
    assert {"predicted_us", "measured_us", "abs_error_us", "rel_error"} <= set(cmp.columns)
    assert gmae(cmp["predicted_us"], cmp["measured_us"]) < 0.02


@pytest.mark.parametrize("value", ["NaN", "0", "-5", "1e9", '"fast"'])
def test_a_stored_calibration_out_of_its_range_is_refused_with_its_path(tmp_path, monkeypatch, value):
    monkeypatch.setenv("CHARACTERIZE_CALIBRATION", str(tmp_path))
    good = ModelConstants.defaults(gpu_spec("sm_80")).to_dict()
    text = json.dumps({"constants": good}).replace(f'"l2_latency_ns": {good["l2_latency_ns"]}',
                                                   f'"l2_latency_ns": {value}')
    (tmp_path / "a100-80gb.json").write_text(text)
    with pytest.raises(ConfigError, match=r"a100-80gb\.json: .*(l2_latency_ns|not a calibration)"):
        load_calibration("sm_80")
    (tmp_path / "a100-80gb.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="not a calibration file"):
        load_calibration("sm_80")


def test_paper_claims_table():
    claims = CL.paper_claims(WorkloadConfig(batches=2), static=static(), sass=sass())
    assert list(claims.columns[:4]) == ["claim", "paper", "model", "agrees"] and len(claims) == 4
    assert claims["agrees"].map(type).eq(bool).all()
    assert claims["gpu"].iloc[0] == "a100-80gb"


def test_every_prediction_carries_a_band_and_the_models_record():
    df = MP.predict(SMALL, ["random", "high"], VARIANTS, ["sm_80", "sm_90"], static=static(), sass=sass())
    assert (df["time_us_low"] <= df["time_us"] + 1e-9).all() and (df["time_us"] <= df["time_us_high"] + 1e-9).all()
    assert (df["time_us_high"] > df["time_us_low"]).all()
    fast, slow = ModelConstants.defaults(gpu_spec("sm_80")).band()
    assert fast.dram_latency_ns < slow.dram_latency_ns and fast.hbm_efficiency > slow.hbm_efficiency
    assert (df["validated_n"] >= 10).all() and df["validated_gmae_pct"].between(0.1, 50).all()


# ------------------------------------------------------------------- precision
def test_rows_carry_the_dtype_and_bytes_follow_it():
    frames = {}
    for dtype in ("fp32", "fp16", "int8"):
        wl = SMALL.replace(dtype=dtype)
        frames[dtype] = MP.predict(wl, ["random"], ["base", "warp"], ["sm_80"], static=static(), sass=sass())
        assert set(frames[dtype]["dtype"]) == {dtype}
    base = {d: f[f.variant == "base"].iloc[0] for d, f in frames.items()}
    # random lookups read every row from DRAM: fewer bytes per row, less DRAM traffic
    assert base["fp32"].dram_bytes > base["fp16"].dram_bytes > base["int8"].dram_bytes


def test_sectors_per_row_include_the_int8_scale_and_bias():
    wl = WorkloadConfig()
    assert LOC.sectors_per_row(wl.replace(dtype="fp16").row_bytes) == 8.0
    assert LOC.sectors_per_row(wl.replace(dtype="int8").row_bytes) > 128 / 32   # 136 bytes: 5 sectors (4.75 avg)


def test_the_model_uses_only_the_workloads_dtype_rows():
    s = static()
    s.loc[(s["dtype"] == "fp16") & (s["variant"] == "base"), "registers"] = 255
    r16 = MP.predict(SMALL.replace(dtype="fp16"), ["random"], ["base"], ["sm_80"], static=s, sass=sass()).iloc[0]
    r32 = MP.predict(SMALL, ["random"], ["base"], ["sm_80"], static=s, sass=sass()).iloc[0]
    assert r16.blocks_per_sm == 1 and r32.blocks_per_sm == 4
    with pytest.raises(ConfigError, match="bf16"):
        MP.predict(SMALL.replace(dtype="bf16"), ["random"], ["base"], ["sm_80"], static=s, sass=sass())


def test_hot_rows_never_read_again_after_the_warm_up_batch_are_a_window_that_keeps_nothing():
    """The hot set comes from the warm-up batch; on a random trace of a large table none of
    it may be read in the scored batch. The hot subset then has lookups in batch 0 only,
    and is still scored as the whole trace is (batch 0 is history), not as a one-batch trace."""
    wl = WorkloadConfig(T=1, E=100_003, D=8, B=7, L=Pooling("fixed", 1.0), batches=2, seed=3)
    prof = LOC.TraceProfile("random", wl)
    assert prof.pinned(5) == 0.0
    kept, rest = prof.window(5, "steady")
    assert kept == 0.0 and rest.size == 0
    assert prof.warm_start(5, "steady", 32.0, 8.0).size == 0


def test_tbe_waits_for_its_table_switch_once_per_run_of_bags_not_once_per_bag():
    """tbe's loop over the tables of a warp's slice (a descriptor, the first offsets and
    tile: `setup_latencies` in its SASS row) costs each warp once per table it meets: every
    bag when there are fewer bags than warps, a small share of a bag when each warp
    gathers many; walked one table at a time, once per phase more."""
    def per_lookup(B: int, setup: float | None, flight: int = 3) -> float:
        rows = sass()
        if setup is not None:
            rows.loc[rows["variant"] == "tbe", "setup_latencies"] = setup
        wl = WorkloadConfig(T=3, E=50_000, B=B, L=20, batches=2)
        df = MP.predict(wl, ["random"], ["tbe"], ["sm_80"], static=static(), sass=rows,
                        params={"tbe": {"tables_in_flight": flight}})
        return float(df[df["variant"] == "tbe"]["latencies_per_lookup"].iloc[0])

    assert (sass()[sass()["variant"] == "tbe"]["setup_latencies"] > 0).all()
    few = per_lookup(97, 2.0) - per_lookup(97, 0.0)          # 291 bags on 2,592 warps: one table each
    many = per_lookup(40_000, 2.0) - per_lookup(40_000, 0.0)  # 120,000 bags: ~46 per warp
    assert few == pytest.approx(2.0 / 20, rel=0.02)
    assert many == pytest.approx(2.0 / 20 * (2_592 + 2) / 120_000, rel=0.05)
    phased = per_lookup(40_000, 2.0, 1) - per_lookup(40_000, 0.0, 1)   # three phases: a slice of each per warp
    assert phased == pytest.approx(2.0 / 20 * (3 * 2_592 + 2) / 120_000, rel=0.05)


def test_tbe_tables_in_flight_share_the_l2():
    """One tbe launch over T tables walked all at once keeps each table's rows in about 1/T of
    the L2; walked one table at a time, in all of it: on a skewed trace the hit rate is far
    higher and the time lower, on a uniform one it hardly moves. Measured on an H200
    (profiles/h200/tbe-order): medium 32.6 -> 23.3 us per table, random 40.1 -> 38.0."""
    wl = WorkloadConfig(T=12, E=2_000_000, D=128, B=2048, L=50, batches=2)
    got = {}
    for flight in (12, 1):
        df = MP.predict(wl, ["medium", "random"], ["tbe"], ["h200"], static=static(), sass=sass(),
                        params={"tbe": {"tables_in_flight": flight}})
        got[flight] = df[df["variant"] == "tbe"].set_index("dataset")
    assert (got[12]["tables_in_flight"] == 12).all() and (got[1]["tables_in_flight"] == 1).all()
    assert got[1].loc["medium", "l2_hit_rate_pct"] > got[12].loc["medium", "l2_hit_rate_pct"] + 10
    assert got[1].loc["medium", "time_us"] < 0.9 * got[12].loc["medium", "time_us"]
    assert got[1].loc["random", "time_us"] == pytest.approx(got[12].loc["random", "time_us"], rel=0.05)


def test_tables_in_flight_leave_each_sms_l1_whole():
    """An SM's L1 hit rate is the same however many tables a tbe launch walks at once: measured on
    an H200 (profiles/h200/tbe-order, high), 1 to 12 tables at a time took 160-172 us, flat, and
    ncu read the same L1 hits over random for tbe on medium as for base."""
    wl = WorkloadConfig(T=12, E=500_000, D=128, B=2048, L=150, batches=2)
    hits = [MP.predict(wl, ["high"], ["tbe"], ["h200"], static=static(), sass=sass(),
                       params={"tbe": {"tables_in_flight": flight}}).set_index("variant").loc["tbe", "l1_hit_rate_pct"]
            for flight in (1, 3, 12)]
    assert hits[0] > 10 and hits == pytest.approx([hits[0]] * 3)


def test_the_precision_grid_compares_per_table():
    """tbe's one launch covers every table: the grid takes its time per table, so it reads as
    faster than base (as the answer says), not 12 times slower."""
    wl = WorkloadConfig(T=12, E=50_000, D=128, B=512, L=40, batches=2)
    rows = [MP.predict(wl.replace(dtype=dt), ["medium"], ["base", "tbe"], ["h100-sxm"], static=static(),
                       sass=sass()) for dt in ("fp32", "fp16")]
    grid = MP.precision_grid(pd.concat(rows, ignore_index=True)).set_index(["dtype", "variant"])
    assert grid.loc[("fp32", "base"), "speedup_vs_fp32_base"] == pytest.approx(1.0)
    assert grid.loc[("fp32", "tbe"), "speedup_vs_fp32_base"] > 1.5
