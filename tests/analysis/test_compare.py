import json
import math

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
