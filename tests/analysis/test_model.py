"""Model stage: its limits, monotonicity, bandwidth ceilings, calibration on a synthetic
run, the CLI's JSON and the paper-claims table.

Small workloads and a fixed static table (blocks per SM as ptxas gives them with nvcc
13) keep these fast and independent of the compiler and its build cache.
"""

from __future__ import annotations

import json

import click
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
from characterize.analysis.model.scores import gmae
from characterize.cli.base import Group
from characterize.cli.model import PREDICT_KEYS
from characterize.cli.model import calibrate as calibrate_cmd
from characterize.cli.model import predict as predict_cmd
from characterize.config import ExperimentConfig, WorkloadConfig
from characterize.errors import ConfigError, ToolchainNotFound
from characterize.hardware.specs import gpu_spec
from characterize.store import RunDir, load_run

SMALL = WorkloadConfig(T=2, E=50_000, B=256, L=20, batches=3)
VARIANTS = ["base", "optmt", "rpf", "l2p", "l2w", "combined", "warp"]
#: blocks per SM of each lookup kernel (256 threads) as nvcc 13 builds them
BLOCKS = {"sm_80": dict(base=4, optmt=5, rpf=5, l2p=4, l2w=4, combined=5, warp=5),
          "sm_90": dict(base=4, optmt=5, rpf=5, l2p=4, l2w=4, combined=5, warp=4)}


#: hot loops as `characterize sass` reads them from nvcc 13's SASS (D=128): latencies serialized
#: per iteration, lookups per iteration, rows in flight, instructions per lookup
LOOPS = {"sm_80": dict(base=(4.81, 4, 0.83, 32.25), optmt=(4.81, 4, 0.83, 32.75), rpf=(0.944, 2, 2.12, 31.5),
                       l2p=(4.81, 4, 0.83, 32.75), l2w=(4.81, 4, 0.83, 32.25), combined=(0.944, 2, 2.12, 31.5),
                       warp=(0.924, 8, 8.66, 26.25)),
         "sm_90": dict(base=(4.78, 4, 0.84, 37.25), optmt=(4.78, 4, 0.84, 37.75), rpf=(0.946, 2, 2.11, 35.5),
                       l2p=(4.78, 4, 0.84, 37.75), l2w=(4.78, 4, 0.84, 37.25), combined=(0.946, 2, 2.11, 35.5),
                       warp=(0.934, 8, 8.57, 24.75))}


def sass(loops: dict[str, dict[str, tuple]] = LOOPS) -> pd.DataFrame:
    return pd.DataFrame([{"variant": v, "arch": a, "role": "lookup", "latencies_per_iteration": x[0],
                          "lookups_per_iteration": x[1], "rows_in_flight": x[2], "instructions_per_lookup": x[3]}
                         for a, per in loops.items() for v, x in per.items()])


def static(blocks: dict[str, dict[str, int]] = BLOCKS) -> pd.DataFrame:
    return pd.DataFrame([{"variant": v, "arch": a, "role": "lookup", "sweep": False, "blocks_per_sm": b,
                          "registers": 48} for a, per in blocks.items() for v, b in per.items()])


def group() -> click.Group:
    """The commands on a group like characterize's main (domain errors -> messages)."""
    g = Group()
    g.add_command(predict_cmd)
    g.add_command(calibrate_cmd)
    return g


@pytest.fixture(autouse=True)
def no_stored_calibration(tmp_path, monkeypatch):
    monkeypatch.setenv("CHARACTERIZE_CALIBRATION", str(tmp_path / "calibration"))


def test_a_trace_of_one_row_hits_l2():
    df = MP.predict(SMALL, ["one-item"], ["base", "l2p", "warp"], ["sm_80", "sm_90"], static=static(), sass=sass())
    assert (df["l2_hit_rate_pct"] > 99).all()
    assert (df["l1_hit_rate_pct"] > 90).all()   # and mostly the SM's own L1
    assert set(df["constants"]) == {"default"}


def test_uniform_trace_over_a_table_100x_the_l2_misses():
    E = 100 * gpu_spec("sm_80").l2_bytes // 512
    df = MP.predict(SMALL.replace(E=E, batches=2), ["random"], ["base"], ["sm_80"], static=static(), sass=sass())
    assert df["l2_hit_rate_pct"].iloc[0] < 1


def test_more_resident_warps_or_prefetch_never_slower_when_latency_bound():
    wl = SMALL.replace(E=500_000, B=2048, batches=2)
    times = []
    for b in range(1, 9):
        df = MP.predict(wl, ["random"], ["base"], ["sm_80"], static=static({"sm_80": {"base": b}}), sass=sass())
        assert df["bound"].iloc[0] == "latency"
        times.append(df["time_us"].iloc[0])
    assert all(later <= earlier for earlier, later in zip(times, times[1:])) and times[-1] < times[0]
    def loops(rif: float, per_lookup: float = 4.0) -> dict:   # rif rows in flight: one latency per rif lookups
        return {"sm_80": {"base": LOOPS["sm_80"]["base"], "rpf": (1.0, rif, rif, per_lookup)}}

    rows = [MP.predict(wl, ["medium"], ["rpf"], ["sm_80"], static=static(), sass=sass(loops(r))).iloc[0]
            for r in (1, 2, 4, 8, 16)]
    assert rows[0]["bound"] == "latency" and rows[-1]["bound"] == "dram"   # rows in flight reach the roofline
    busy = MP.predict(wl, ["medium"], ["rpf"], ["sm_80"], static=static(), sass=sass(loops(16, 60.0))).iloc[0]
    assert busy["bound"] == "issue"   # unless the loop issues too many instructions per lookup
    for column in ("latency_us", "time_us"):
        values = [r[column] for r in rows]
        assert all(later <= earlier for earlier, later in zip(values, values[1:])), column


def test_bandwidth_bound_predictions_never_exceed_the_peaks():
    wl = SMALL.replace(E=2_000_000, B=2048, L=50, batches=2)
    df = MP.predict(wl, ["random", "high"], VARIANTS, ["sm_80", "sm_90"], static=static(), sass=sass())
    assert (df["bound"] == "dram").any()
    for row in df.itertuples():
        gpu = gpu_spec(row.gpu)
        ns = row.time_us * 1000
        assert row.dram_bytes / ns <= gpu.hbm_GBps and row.l2_bytes / ns <= gpu.l2_GBps


def test_pinning_never_lowers_the_hit_rate():
    """l2p/combined prefetch the hot rows before every launch. (l2w is not pinning: its
    window is re-aimed at each table, so hot rows miss on their first read per launch
    and its carve-out shrinks the rest of L2; it may lose to plain LRU in steady state.)"""
    wl = SMALL.replace(E=500_000, B=1024, L=40)
    for K, mode in ((2000, "steady"), (None, "steady"), (None, "cold")):
        params = {} if K is None else {"l2p": {"K": K}, "combined": {"K": K}}
        df = MP.predict(wl, ["one-item", "high", "medium", "low", "random"], ["base", "l2p", "combined"],
                       ["sm_80", "sm_90"], static=static(), sass=sass(), params=params, mode=mode)
        hit = df.set_index(["variant", "dataset", "gpu"])["l2_hit_rate_pct"]
        for (v, d, g), h in hit.items():
            assert h >= hit[("base", d, g)] - 1e-9, (K, mode, v, d, g)
    assert (df[df["variant"] == "l2p"]["prepass_us"] > 0).all() and df[df["variant"] == "base"]["prepass_us"].isna().all()


def test_sectors_and_capacities():
    assert LOC.sectors_per_row(512) == 16
    assert LOC.sectors_per_row(272) == 9          # D=68: 8.5 sectors, rows straddle
    assert LOC.sectors_per_row(4) == 1


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

    monkeypatch.setattr(pipeline, "static_characterization", no_nvcc)
    exp = pipeline.check_experiment(ExperimentConfig(workload=SMALL, datasets=("high",), variants=("base",)))
    with pytest.raises(ToolchainNotFound, match="sass.csv"):
        pipeline.predict(exp, ["sm_80"])


def _synthetic_run(tmp_path, truth: ModelConstants) -> RunDir:
    """A run directory whose 'measured' times are the model's own with `truth` constants."""
    exp = ExperimentConfig(name="synthetic", workload=WorkloadConfig(T=2, E=400_000, B=1024, L=40, batches=3),
                           datasets=("one-item", "medium", "random"), variants=tuple(VARIANTS))
    run = RunDir.create(tmp_path / "run", {"experiment": exp.to_dict(),
                                           "gpu": {"name": "NVIDIA A100-SXM4-80GB", "arch": "sm_80"}})
    run.write("static", static())
    run.write("sass", sass())
    frames = [MP.predict(exp.workload, exp.datasets, exp.variants, ["sm_80"], constants=truth, static=static(), sass=sass(), mode=m)
              for m in ("steady", "cold")]
    for (v, d), g in pd.concat(frames).groupby(["variant", "dataset"]):
        summary = [{"mode": r.mode, "per_table_us": r.time_us, "ci95_us": 0.01 * r.time_us} for r in g.itertuples()]
        run.write_point("bench", v, d, {"status": "ok", "summary": summary})
    return run


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
    for name, want in truth.to_dict().items():
        nudged = times(truth.replace(**{name: want * 1.1}))
        if np.max(np.abs(nudged / base - 1)) < 0.005:
            continue   # no timed point moves with this constant: the data cannot see it
        seen += 1
        assert getattr(cal.constants, name) == pytest.approx(want, rel=0.05), name
    assert seen >= 4
    assert cal.gmae_fitted < 0.01 < cal.gmae_default

    res = CliRunner().invoke(group(), ["calibrate", str(run.path), "--json"])
    assert res.exit_code == 0, res.output
    stored = json.loads(res.output)
    assert stored["gpu"] == "a100-80gb" and set(stored["constants"]) == set(truth.to_dict())
    assert load_calibration("sm_80") == ModelConstants.from_dict(stored["constants"])
    exp = ExperimentConfig.from_dict(load_run(run.path).meta["experiment"])
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


def test_cli_predict_json_and_table(tmp_path, monkeypatch):
    # no compile: fast and cache-free
    monkeypatch.setattr(pipeline, "code_facts", lambda v, a, D, *r, **k: pipeline.CodeFacts(D, static(), sass()))
    toml = tmp_path / "tiny.toml"
    toml.write_text('name = "tiny"\ndatasets = ["high", "random"]\nvariants = ["torch", "base", "rpf", "warp"]\n'
                    'archs = ["sm_80"]\n[workload]\nT = 2\nE = 50000\nB = 256\nL = "20"\nbatches = 2\n')
    res = CliRunner().invoke(group(), ["predict", str(toml), "--arch", "sm_80,h200", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert len(rows) == 2 * 4 * 2 and all(set(r) == set(PREDICT_KEYS) for r in rows)
    assert {r["gpu"] for r in rows} == {"a100-80gb", "h200"}
    table = CliRunner().invoke(group(), ["predict", str(toml)])
    assert table.exit_code == 0 and "speedup_vs_base" in table.output and "modelled as base" in table.output
    bad = CliRunner().invoke(group(), ["predict", str(toml), "--arch", "sm_70"])
    assert bad.exit_code == 2 and "sm_70" in bad.output and "Traceback" not in bad.output
    missing = CliRunner().invoke(group(), ["calibrate", str(tmp_path / "nowhere")])
    assert missing.exit_code == 8 and "no such run directory" in missing.output


def test_paper_claims_table():
    claims = CL.paper_claims(WorkloadConfig(batches=2), static=static(), sass=sass())
    assert list(claims.columns[:4]) == ["claim", "paper", "model", "agrees"] and len(claims) == 4
    assert claims["agrees"].map(type).eq(bool).all()
    assert claims["gpu"].iloc[0] == "a100-80gb"


def test_every_prediction_carries_a_band_around_it():
    df = MP.predict(SMALL, ["random", "high"], VARIANTS, ["sm_80", "sm_90"], static=static(), sass=sass())
    assert (df["time_us_low"] <= df["time_us"] + 1e-9).all() and (df["time_us"] <= df["time_us_high"] + 1e-9).all()
    assert (df["time_us_high"] > df["time_us_low"]).all()
    fast, slow = ModelConstants.defaults(gpu_spec("sm_80")).band()
    assert fast.dram_latency_ns < slow.dram_latency_ns and fast.hbm_efficiency > slow.hbm_efficiency


# ------------------------------------------------------------------- precision
def _with_dtype(df: pd.DataFrame, dtype: str) -> pd.DataFrame:
    return df.assign(dtype=dtype)


def test_rows_carry_the_dtype_and_bytes_per_row_follow_it():
    frames = {}
    for dtype in ("fp32", "fp16", "bf16", "int8", "int8h"):
        wl = SMALL.replace(dtype=dtype)
        frames[dtype] = MP.predict(wl, ["random"], ["base", "warp"], ["sm_80"],
                                   static=_with_dtype(static(), dtype), sass=_with_dtype(sass(), dtype))
        assert set(frames[dtype]["dtype"]) == {dtype}
    base = {d: f[f.variant == "base"].iloc[0] for d, f in frames.items()}
    # a warp-level load of the chunk kernels covers 32 elements of the dtype
    assert [int(base[d].bytes_per_load) for d in ("fp32", "fp16", "int8")] == [128, 64, 32]
    # random lookups are DRAM-bound on row bytes: fewer bytes per row, less DRAM traffic
    assert base["fp32"].dram_bytes > base["fp16"].dram_bytes > base["int8"].dram_bytes
    assert base["int8h"].dram_bytes <= base["int8"].dram_bytes


def test_sectors_per_row_include_the_int8_scale_and_bias():
    wl = WorkloadConfig()
    assert LOC.sectors_per_row(wl.replace(dtype="fp16").row_bytes) == 8.0
    assert LOC.sectors_per_row(wl.replace(dtype="int8").row_bytes) > 128 / 32   # 136 bytes: 5 sectors (4.75 avg)


def test_the_model_uses_only_the_workloads_dtype_rows():
    both = pd.concat([_with_dtype(static(), "fp32"), _with_dtype(static({"sm_80": dict(base=1)}), "fp16")])
    sa = pd.concat([_with_dtype(sass(), "fp32"), _with_dtype(sass(), "fp16")])
    r16 = MP.predict(SMALL.replace(dtype="fp16"), ["random"], ["base"], ["sm_80"], static=both, sass=sa).iloc[0]
    r32 = MP.predict(SMALL, ["random"], ["base"], ["sm_80"], static=both, sass=sa).iloc[0]
    assert r16.blocks_per_sm == 1 and r32.blocks_per_sm == 4
    with pytest.raises(ConfigError, match="int8"):
        MP.predict(SMALL.replace(dtype="int8"), ["random"], ["base"], ["sm_80"], static=both, sass=sa)


def test_a_pinned_row_hits_with_a_calibratable_probability_not_for_certain():
    from characterize.analysis.model.constants import BOUNDS, FIT_DEFAULT

    gpu = gpu_spec("a100-80gb")
    base = ModelConstants.defaults(gpu)
    assert base.pinned_hit == gpu.pinned_hit_probability < 1.0 and "pinned_hit" in FIT_DEFAULT
    assert BOUNDS["pinned_hit"][1] == 1.0
    hits = {}
    for p in (0.5, base.pinned_hit, 1.0):
        df = MP.predict(SMALL, ["medium"], ["l2p"], [gpu], static=static(), sass=sass(), params={"l2p": {"K": 300}},
                        constants=base.replace(pinned_hit=p))
        hits[p] = float(df["l2_hit_rate_pct"].iloc[0])
    assert hits[0.5] < hits[base.pinned_hit] < hits[1.0]
    # a calibration stored before the constant existed still loads, with the default
    old = {k: v for k, v in base.to_dict().items() if k != "pinned_hit"}
    assert ModelConstants.from_dict(old).pinned_hit == gpu.pinned_hit_probability
