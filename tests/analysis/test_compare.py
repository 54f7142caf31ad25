import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from characterize.analysis.compare import (
    compare_runs,
    headline,
    slowdown_random_vs_one_item,
    speedups,
)
from characterize.measure.timing import summarize, t95


def test_summarize_small_and_stable_samples():
    s = summarize([10.0, 10.2, 9.8, 10.0], target=0.02)
    assert s.n == 4 and s.mean == pytest.approx(10.0)
    assert s.ci95 == pytest.approx(t95(3) * np.std([10.0, 10.2, 9.8, 10.0], ddof=1) / 2)
    assert s.stable == (s.rel_ci < 0.02)
    assert not summarize([1.0, 2.0, 3.0], 0.02).stable
    assert summarize([5.0]).ci95 == math.inf and summarize([]).n == 0
    assert t95(1) == 12.706 and t95(1000) == 1.96


def bench_frame():
    rows = []
    for v, lat in (("base", 100.0), ("optmt", 80.0), ("torch", 90.0), ("warp", 40.0)):
        for d, scale in (("one-item", 0.5), ("random", 1.5)):
            rows.append({"variant": v, "dataset": d, "status": "ok", "mode": "steady", "per_table_us": lat * scale,
                         "ci95_us": 1.0 * scale, "per_table_incl_prepass_us": lat * scale, "ci95_incl_prepass_us": 1.0,
                         "effective_GBps": 1.0, "hbm_pct": 1.0, "prepass_per_table_us": 0.0, "reps": 10,
                         "stable": True})
    rows.append({**rows[0], "variant": "l2p", "status": "failed"})
    return pd.DataFrame(rows)


def test_speedups_with_delta_method_ci():
    s = speedups(bench_frame())
    r = s[(s["variant"] == "optmt") & (s["dataset"] == "random")].iloc[0]
    assert r["speedup_vs_base"] == pytest.approx(100 / 80)
    rel = math.sqrt((1.5 / 150) ** 2 + (1.5 / 120) ** 2)
    assert r["speedup_vs_base_ci95"] == pytest.approx(100 / 80 * rel)
    assert r["speedup_vs_torch"] == pytest.approx(90 / 80)
    assert "l2p" not in set(s["variant"])  # failed points are not compared
    h = headline(bench_frame())
    assert list(h.columns) == ["one-item", "random"] and h.loc["warp", "random"] == pytest.approx(2.5)
    assert slowdown_random_vs_one_item(bench_frame()) == pytest.approx(3.0)


def test_compare_runs_keeps_unmatched_kernels():
    a = pd.DataFrame({"variant": ["base", "base", "warp"], "dataset": ["m", "m", "m"], "function": ["k", "k", "w"],
                      "metric": ["x", "y", "x"], "value": [1.0, 2.0, 3.0]})
    b = pd.DataFrame({"variant": ["base", "rpf"], "dataset": ["m", "m"], "function": ["k", "r"],
                      "metric": ["x", "x"], "value": [2.0, 5.0]})
    both, unmatched = compare_runs(a, b)
    assert len(both) == 1 and both.iloc[0]["ratio"] == 2.0 and both.iloc[0]["delta"] == 1.0
    assert set(zip(unmatched["variant"], unmatched["only_in"])) == {("warp", "a"), ("rpf", "b")}


def test_compare_command_on_reports(ncu_fixtures):
    import json

    from click.testing import CliRunner

    from characterize.cli import main

    a = ncu_fixtures / "a100_mistic_msdnew.ncu-rep"
    same = CliRunner().invoke(main, ["compare", str(a), str(a), "--json"])
    assert same.exit_code == 0
    data = json.loads(same.output)
    assert len(data["shared"]) > 100 and all(r["ratio"] in (1.0, None) or r["ratio"] == 1.0 for r in data["shared"]
                                             if r["a"] not in (0, None))
    diff = CliRunner().invoke(main, ["compare", str(a), str(ncu_fixtures / "h800_sglang.ncu-rep")])
    assert diff.exit_code == 0 and "present in only one of them" in diff.output and "nodeByPoint" in diff.output


# ------------------------------------------------------------ kernel matching
def kernels(*names, report="r"):
    return pd.DataFrame({"report": report, "kernel_id": range(len(names)), "function": list(names),
                         "kernel_name": [f"void {n}(int)" for n in names]})


def test_kernels_match_by_base_name_and_launch_order():
    from characterize.analysis.compare import MATCH_EXACT, MATCH_MANUAL, MATCH_SIMILAR, match_kernels

    a = kernels("gemm", "relu", "gemm", "softmax")
    b = kernels("relu", "gemm", "gemm", "gemm", "layernorm")
    m = match_kernels(a, b)
    pairs = {(int(x), int(y), h) for x, y, h in zip(m["a_index"], m["b_index"], m["match"])
             if pd.notna(x) and pd.notna(y)}
    assert pairs == {(0, 1, MATCH_EXACT), (2, 2, MATCH_EXACT), (1, 0, MATCH_EXACT)}  # i-th launch with i-th
    only = {(r["match"], int(r["a_index"]) if pd.notna(r["a_index"]) else int(r["b_index"]))
            for r in m.to_dict("records") if r["match"].startswith("only")}
    assert only == {("only in a", 3), ("only in b", 3), ("only in b", 4)}
    # renamed between two reports: nodeByPoint5 ~ nodeByPoint, first launch with first launch
    m = match_kernels(kernels("nodeByPoint"), kernels(*["nodeByPoint5"] * 4))
    assert m.iloc[0]["match"] == MATCH_SIMILAR and m.iloc[0]["b_index"] == 0 and (m["match"] == "only in b").sum() == 3
    # by hand: --pair nodeByPoint=#2, and by demangled name
    m = match_kernels(kernels("nodeByPoint"), kernels(*["nodeByPoint5"] * 4), pairs=["nodeByPoint=#2"])
    assert m.iloc[0]["match"] == MATCH_MANUAL and m.iloc[0]["b_index"] == 2
    m = match_kernels(kernels("x"), kernels("y"), pairs={"void x(int)": "y"})
    assert m.iloc[0]["match"] == MATCH_MANUAL
    # within each point of two runs only
    a = kernels("k", "k").assign(variant=["base", "warp"], dataset="medium")
    b = kernels("k").assign(variant="warp", dataset="medium")
    m = match_kernels(a, b, keys=("variant", "dataset"))
    assert set(zip(m["variant"], m["match"])) == {("base", "only in a"), ("warp", MATCH_EXACT)}


def test_a_malformed_pair_is_refused():
    from characterize.analysis.compare import parse_pairs
    from characterize.errors import ConfigError

    assert parse_pairs(["a=b", " x = #3 "]) == [("a", "b"), ("x", "#3")]
    with pytest.raises(ConfigError, match="KERNEL_A=KERNEL_B"):
        parse_pairs(["nodeByPoint"])


def test_timings_diff_with_significance():
    from characterize.analysis.compare import diff_bench

    a = bench_frame()
    b = a.copy()
    b.loc[b["variant"] == "warp", "per_table_us"] *= 0.9  # 40 -> 36 µs: CIs of 1 µs, significant
    b.loc[b["variant"] == "optmt", "per_table_us"] += 0.5  # within the CIs
    both, un = diff_bench(a, b)
    r = both.set_index(["variant", "dataset"])
    assert r.loc[("warp", "one-item"), "significant"] and r.loc[("warp", "one-item"), "delta_pct"] == pytest.approx(-10)
    assert r.loc[("optmt", "random"), "significant"] is False or not r.loc[("optmt", "random"), "significant"]
    assert un.empty


def test_static_and_prediction_diffs_of_two_runs():
    from characterize.analysis.compare import diff_predictions, diff_static

    s = pd.DataFrame({"variant": ["base", "rpf"], "arch": "sm_80", "role": "lookup", "maxrregcount": [None, 48.0],
                      "sweep": False, "registers": [54, 48], "spill_stores": [0, 76], "spill_loads": [0, 120]})
    t = s.copy()
    t.loc[1, "spill_loads"] = 12
    changed, un, same = diff_static(s, t)
    assert same == 1 and un.empty and changed.to_dict("records")[0] | {} == {
        "variant": "rpf", "arch": "sm_80", "role": "lookup", "maxrregcount": "48", "sweep": "false",
        "column": "spill_loads", "a": 120, "b": 12, "delta": -108}
    p = pd.DataFrame({"variant": ["base", "rpf"], "dataset": "medium", "gpu": "a100-80gb", "mode": "steady",
                      "time_us": [100.0, 50.0], "time_us_low": [90.0, 45.0], "time_us_high": [120.0, 60.0]})
    q = p.copy()
    q.loc[1, ["time_us", "time_us_low", "time_us_high"]] = [70.0, 63.0, 84.0]  # leaves the old band
    q.loc[0, "time_us"] = 101.0
    both, un = diff_predictions(p, q)
    r = both.set_index("variant")
    assert r.loc["rpf", "outside_band"] and not r.loc["base", "outside_band"]
    assert r.loc["rpf", "delta_pct"] == pytest.approx(40)
    assert diff_predictions(p.drop(columns=["time_us_low", "time_us_high"]), q)[0]["outside_band"].isna().all()


def test_compare_two_runs_without_a_gpu(tmp_path):
    """Two no-GPU runs (two commits) compare on their static tables and predictions; exit 0."""
    import shutil
    from pathlib import Path

    from click.testing import CliRunner

    from characterize.cli import main

    paper = Path(__file__).parents[2] / "profiles" / "static-paper"
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(paper, a)
    shutil.copytree(paper, b)
    s = pd.read_csv(b / "static.csv")
    s.loc[s["variant"] == "rpf", "spill_loads"] += 8
    s.to_csv(b / "static.csv", index=False)
    p = pd.read_csv(b / "predictions.csv")
    p.loc[p["variant"] == "warp", "time_us"] *= 1.2
    p.to_csv(b / "predictions.csv", index=False)
    r = CliRunner().invoke(main, ["compare", str(a), str(b)])
    assert r.exit_code == 0, r.output
    assert "Static characterization: changed values" in r.output and "spill_loads" in r.output
    assert "Model predictions (PREDICTED" in r.output and "warp" in r.output
    j = CliRunner().invoke(main, ["compare", str(a), str(b), "--json"])
    data = json.loads(j.output)
    assert len(data["static"]) > 0 and len(data["predictions"]) == len(p)


def test_compare_command_pairs_by_hand(ncu_fixtures):
    from click.testing import CliRunner

    from characterize.cli import main

    a, b = ncu_fixtures / "a100_mistic_msdnew.ncu-rep", ncu_fixtures / "a100_mistic_msdkt23.ncu-rep"
    r = CliRunner().invoke(main, ["compare", str(a), str(b)], env={"COLUMNS": "250"})
    assert r.exit_code == 0 and "similar name + launch order" in r.output and "#0 nodeByPoint5 (1 of 4)" in r.output
    # a percentage moves by percentage points, bytes in binary units, never scientific notation
    sm = next(ln for ln in r.output.splitlines() if "sm_throughput_pct" in ln).split()
    assert sm[-4:] == ["33.5%", "+8.4", "pp", "+33.6%"] and sm[-5] == "25.1%"
    dram = next(ln for ln in r.output.splitlines() if "dram_bytes_read" in ln)
    assert "2.8 TiB" in dram and "9.9 GiB" in dram and "e+" not in r.output
    r = CliRunner().invoke(main, ["compare", str(a), str(b), "--pair", "nodeByPoint=#2", "--json"])
    data = json.loads(r.output)
    assert {x["b_kernel"] for x in data["kernels"]} == {"#2 nodeByPoint5 (3 of 4)"}
    assert {x["match"] for x in data["kernels"]} == {"manual (--pair)"}
    bad = CliRunner().invoke(main, ["compare", str(a), str(b), "--pair", "nodeByPoint"])
    assert bad.exit_code != 0 and "KERNEL_A=KERNEL_B" in bad.output


def test_bench_beside_ncu_per_table():
    """A run's bench figures (per table from the batch, and the per-launch diagnostic)
    beside ncu's gpu__time_duration of each table's lookup kernel, the pre-pass left out."""
    from types import SimpleNamespace

    from characterize.analysis.compare import bench_vs_ncu

    point = {"variant": "l2p", "dataset": "medium", "status": "ok",
             "summary": [{"mode": "steady", "per_table_us": 10.0}], "per_launch_table_us": {"steady": [12.0, 11.5]}}
    kernels = pd.DataFrame({"variant": ["l2p"] * 4, "dataset": ["medium"] * 4, "table": [0, 0, 1, 1],
                            "kernel_name": ["chz_l2_pin_kernel", "chz_base_kernel", "chz_l2_pin_kernel",
                                            "chz_base_kernel"],
                            "function": ["chz_l2_pin_kernel", "chz_base_kernel", "chz_l2_pin_kernel",
                                         "chz_base_kernel"],
                            "duration_ns": [3000.0, 9000.0, 3000.0, 9500.0], "kernel_id": [0, 1, 2, 3]})
    metrics = pd.DataFrame({"kernel_id": [0, 1, 2, 3], "metric": ["gpc__cycles_elapsed.avg.per_second"] * 4,
                            "unit": ["hz"] * 4, "value": [1.41e9, 1.98e9, 1.41e9, 1.98e9]})
    run = SimpleNamespace(points=lambda kind: [point] if kind == "bench" else [], kernels=kernels, metrics=metrics)
    out = bench_vs_ncu(run)
    assert list(out["table"]) == [0, 1] and list(out["ncu_duration_us"]) == [9.0, 9.5]
    assert list(out["bench_per_launch_us"]) == [12.0, 11.5] and list(out["ncu_over_bench"]) == [0.9, 0.95]
    assert out["sm_frequency_MHz"].iloc[0] == pytest.approx(1980.0)


# ------------------------------------------- any two kernels side by side (H200)
H200 = Path(__file__).resolve().parents[2] / "profiles" / "h200"
PAPER, PROFILED = H200 / "paper-gpu", H200 / "paper-gpu-profile"


def by_metric(kernels, metric):
    return kernels[kernels["metric"] == metric].set_index("dataset")


def test_base_beside_tbe_within_one_run_per_table():
    """base=tbe in one run: dataset by dataset, tbe's one launch over 12 tables divided by
    12 (duration and bytes; rates as they are), base's two launches averaged; nothing else
    of the run is compared with itself."""
    from characterize.analysis.compare import compare_all

    parts = compare_all(PAPER, PAPER, ["base=tbe"])
    k = parts["kernels"]
    assert set(k["variant"]) == {"base → tbe"} and set(k["match"]) == {"manual (--pair)"}
    d = by_metric(k, "duration_ns")
    assert d.loc["random", "a"] == pytest.approx((144576 + 145088) / 2)
    assert d.loc["random", "b"] == pytest.approx(484032 / 12) and d.loc["random", "per"] == "table"
    assert d.loc["medium", "b"] == pytest.approx(399200 / 12)
    assert d.loc["random", "delta_pct"] == pytest.approx(-72.15, abs=0.01)
    assert by_metric(k, "dram_bytes_read").loc["random", "b"] == pytest.approx(1.884230e9 / 12, rel=1e-5)
    occ = by_metric(k, "achieved_occupancy_pct")
    assert occ.loc["random", "per"] == "" and 30 < occ.loc["random", "b"] < 40   # a rate is not divided
    assert "chz_tbe_kernel (1 launch, 12 tables)" in set(k["b_kernel"]) and parts["unmatched_kernels"].empty
    b = parts["bench"]   # bench's latency is already per table
    assert len(b) == 10 and set(b["variant"]) == {"base → tbe"} and (b["delta_pct"] < -60).all()
    assert "static" not in parts and parts["unmatched_points"].empty


def test_pairs_by_variant_dataset_nvtx_range_and_kernel_id_across_runs():
    from characterize.analysis.compare import compare_all

    k = compare_all(PAPER, PROFILED, ["base/random=combined/random", "tbe=rpf"])["kernels"]
    d = k[k["metric"] == "duration_ns"].set_index("variant")
    # combined's lookup kernel is rpf's: paired with base's by time, its pre-pass left alone
    assert d.loc["base → combined", "b_kernel"] == "chz_rpf_kernel (mean of 2 launches)"
    assert d.loc["base → combined", "b"] == pytest.approx((93760 + 93664) / 2)
    assert d.loc["tbe → rpf", "a"] == pytest.approx(484032 / 12) and d.loc["tbe → rpf", "dataset"] == "random"
    parts = compare_all(PROFILED, PROFILED, ["chz/warp/random/1=warp#0", "rpf=combined"])
    d = parts["kernels"][parts["kernels"]["metric"] == "duration_ns"].set_index("variant")
    assert list(d.loc["warp", ["a", "b"]]) == [40992.0, 41216.0]   # one table's launch each
    assert d.loc["rpf → combined", "match"] == "manual (--pair)"
    assert list(parts["unmatched_kernels"]["kernel"]) == ["chz_l2_pin_kernel (mean of 2 launches)"]


def test_one_kernel_stands_in_several_pairs():
    """--pair base=tbe --pair base=warp: base is the reference of both (not taken by the first)."""
    from characterize.analysis.compare import diff_bench, match_kernels
    from characterize.store import load_run

    bench = load_run(PAPER).bench
    both, un = diff_bench(bench, bench, ["base=tbe", "base=warp"], auto=False)
    assert sorted(both["variant"].value_counts().items()) == [("base → tbe", 10), ("base → warp", 10)] and un.empty
    a = kernels("k", "k").assign(variant=["base", "warp"], dataset="medium")
    m = match_kernels(a, a, ("variant", "dataset"), ["base=warp", "base=base"], auto=False)
    assert list(zip(m["variant"], m["a_index"], m["b_index"])) == [("base → warp", 0, 1), ("base", 0, 0)]


def test_a_wrong_pair_is_refused_naming_what_matched_nothing():
    from click.testing import CliRunner

    from characterize.analysis.compare import compare_all
    from characterize.cli import main
    from characterize.errors import ConfigError

    with pytest.raises(ConfigError, match=r"--pair bse=tbe: no kernel of .*paper-gpu is 'bse' .*variants: base, "
                                          r"combined.* Did you mean 'base'"):
        compare_all(PAPER, PAPER, ["bse=tbe"])
    with pytest.raises(ConfigError, match=r"'#1' is kernel ID 1 of 5 reports of .*paper-gpu-profile .*say which"):
        compare_all(PROFILED, PROFILED, ["#1=warp"])
    with pytest.raises(ConfigError, match="is 'nvtx:chz/tbe'"):   # forced reading: an NVTX range, none in b
        compare_all(PAPER, PROFILED, ["base=nvtx:chz/tbe"])
    r = CliRunner().invoke(main, ["compare", str(PAPER), str(PAPER), "--pair", "base=tbe/nosuch"])
    assert r.exit_code == 2 and "no kernel of" in r.output and "is 'tbe/nosuch'" in r.output


def test_compare_command_prints_the_pair_per_table():
    from click.testing import CliRunner

    from characterize.cli import main

    r = CliRunner().invoke(main, ["compare", str(PAPER), str(PAPER), "--pair", "base=tbe"], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    dur = next(ln for ln in r.output.splitlines() if "duration_ns" in ln and "random" in ln).split()
    assert dur[:3] == ["base", "→", "tbe"] and "table" in dur
    assert dur[-5:] == ["40.34", "us", "-104.5", "us", "-72.1%"]
    assert "only the --pair kernels and points are compared" in r.output and "Static" not in r.output


def test_bench_beside_ncu_divides_a_batched_launch_by_its_tables():
    """tbe's one launch covers the 12 tables: per table it agrees with bench (ratio was 12.08)."""
    from characterize.analysis.compare import bench_vs_ncu, per_table_kernels
    from characterize.store import load_run

    run = load_run(PAPER)
    k = per_table_kernels(run.kernels, run)   # derived: the committed points predate tables_per_launch
    assert dict(zip(k["variant"], k["tables_per_launch"])) == {"base": 1, "tbe": 12} and set(k["per"]) == {"table"}
    out = bench_vs_ncu(run).set_index(["variant", "dataset", "table"])
    assert out.loc[("tbe", "random", 0), "tables_per_launch"] == 12
    assert out.loc[("tbe", "random", 0), "ncu_over_bench"] == pytest.approx(484.032 / 12 / 40.076, rel=1e-3)
    assert out["ncu_over_bench"].between(0.9, 1.1).all()


def test_each_technique_against_base_per_dataset():
    from characterize.analysis.compare import per_table_kernels, versus_reference
    from characterize.analysis.ncu import kernel_summary
    from characterize.store import MergedRun, load_run

    run = MergedRun([load_run(PAPER), load_run(PROFILED)])
    v = versus_reference(per_table_kernels(kernel_summary(run.metrics), run))
    d = v[v["metric"] == "duration_ns"].set_index(["technique", "dataset"])
    assert set(d.index) == {("tbe", "random"), ("tbe", "medium"), ("warp", "random"), ("rpf", "random"),
                            ("l2p", "random"), ("combined", "random"), ("torch", "random")}
    assert d.loc[("l2p", "random"), "b"] == pytest.approx((144352 + 143520) / 2)   # the pre-pass left out
    assert d.loc[("tbe", "random"), "delta_pct"] == pytest.approx(-72.15, abs=0.01)
    alone = load_run(PROFILED)   # base not profiled: nothing to diff against
    assert versus_reference(per_table_kernels(kernel_summary(alone.metrics), alone)).empty


def bench_copy(tmp_path, name, scale=None, ci=None):
    """A copy of the H200 run's timings, base/random steady slowed by `scale` (its CI set to `ci`)."""
    import shutil

    out = tmp_path / name
    (out / "points").mkdir(parents=True)
    shutil.copy(PAPER / "meta.json", out / "meta.json")
    shutil.copytree(PAPER / "points" / "bench", out / "points" / "bench")
    if scale is not None:
        f = out / "points" / "bench" / "base__random.json"
        p = json.loads(f.read_text())
        row = next(r for r in p["summary"] if r["mode"] == "steady")
        row["per_table_us"] *= scale
        row["ci95_us"] = ci if ci is not None else row["ci95_us"]
        f.write_text(json.dumps(p))
    return out


def test_regression_gate_fails_beyond_the_threshold_and_both_cis(tmp_path):
    from click.testing import CliRunner

    from characterize.analysis.compare import SlowdownGate, diff_bench
    from characterize.cli import main
    from characterize.errors import ConfigError, RunDirError, SlowerThanBaseline
    from characterize.store import load_run

    a, slow = bench_copy(tmp_path, "a"), bench_copy(tmp_path, "slow", 1.08)
    noisy = bench_copy(tmp_path, "noisy", 1.06, 5.0)
    both, _ = diff_bench(load_run(a).bench, load_run(slow).bench)
    with pytest.raises(SlowerThanBaseline, match=r"1 of 90 timed point\(s\) .* more than 5% slower .*base, random, "
                                                 r"steady: \+8\.0% \(144\.2 → 155\.8 µs per table"):
        SlowdownGate(5).check(both, "a", "slow")
    assert SlowdownGate(10).check(both, "a", "slow")["slower"].sum() == 0
    noisy_diff, _ = diff_bench(load_run(a).bench, load_run(noisy).bench)   # 6% slower, but a CI of 5 µs
    assert not SlowdownGate(5).judge(noisy_diff)["slower"].any()
    with pytest.raises(RunDirError, match="share no timed point"):
        SlowdownGate(5).check(both.iloc[0:0], "a", "b")
    with pytest.raises(ConfigError, match="give a percentage"):
        SlowdownGate(-1)
    r = CliRunner().invoke(main, ["compare", str(a), str(slow), "--fail-if-slower", "5"])
    assert r.exit_code == SlowerThanBaseline.exit_code == 15 and "base, random, steady: +8.0%" in r.stderr
    assert r.stderr.count("\nerror:") + r.stderr.startswith("error:") == 1
    r = CliRunner().invoke(main, ["compare", str(a), str(slow), "--fail-if-slower", "10"])
    assert r.exit_code == 0 and "none of 90 timed point(s) is more than 10% slower" in r.output


def test_compare_warns_when_the_runs_measured_different_workloads_or_gpus(tmp_path):
    """Two H200 runs of different shapes: the CLI says so first, on stderr; the same shape
    on another GPU too; one run against itself says nothing."""
    import shutil

    from click.testing import CliRunner

    from characterize.analysis.compare import setup_differences
    from characterize.cli import main

    h200 = Path(__file__).resolve().parents[2] / "profiles" / "h200"
    (d,) = setup_differences(h200 / "paper-gpu", h200 / "shapes" / "shape-a")
    assert "T 12 -> 8" in d and "D 128 -> 64" in d and "seed" not in d
    other = tmp_path / "other-gpu"
    shutil.copytree(h200 / "paper-gpu", other)
    meta = json.loads((other / "meta.json").read_text())
    meta["gpu"]["name"] = "NVIDIA H100 80GB HBM3"
    (other / "meta.json").write_text(json.dumps(meta))
    assert setup_differences(h200 / "paper-gpu", other) == [
        "the two runs ran on different GPUs (NVIDIA H200 -> NVIDIA H100 80GB HBM3): every delta mixes the GPU's "
        "change with the code's"]
    assert setup_differences(h200 / "paper-gpu", h200 / "paper-gpu") == []
    r = CliRunner().invoke(main, ["compare", str(h200 / "paper-gpu"), str(h200 / "shapes" / "shape-a"), "--json"])
    assert r.exit_code == 0, r.output
    assert "warning: the two runs measured different workloads" in r.stderr
    json.loads(r.stdout)   # the JSON stays clean
