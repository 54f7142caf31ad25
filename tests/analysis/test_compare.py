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
