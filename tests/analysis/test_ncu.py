"""Nsight Compute views: speed of light and the bound, the memory chart's honest
columns, the roofline, stalls weighted by instructions, and what an older GPU lacks; on
the H200 run's own reports: per-table values of a batched launch, one stall weight for
every kernel, rule estimates capped by the speed of light, the bandwidth roofline."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from characterize.analysis import ncu
from characterize.extract.read import read_any
from characterize.extract.rules import rule_results, rule_unit
from characterize.extract.schema import stall_metric
from characterize.store import load_run


def tidy(kernels: list[dict]) -> pd.DataFrame:
    """A tidy metrics frame: one dict of raw metric -> value per kernel (plus 'function')."""
    rows = []
    for i, k in enumerate(kernels):
        func = k.pop("function", f"k{i}")
        for metric, value in k.items():
            rows.append({"run": "r", "report": "x.ncu-rep", "kernel_id": i, "kernel_name": f"void {func}(int)",
                         "function": func, "variant": "", "dataset": "", "metric": metric, "unit": "",
                         "value": value})
    return pd.DataFrame(rows)


SOL = {"gpu__time_duration.sum": 1000.0, "sm__throughput.avg.pct_of_peak_sustained_elapsed": 25.0,
       "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": 26.0,
       "l1tex__throughput.avg.pct_of_peak_sustained_active": 35.0,
       "lts__throughput.avg.pct_of_peak_sustained_elapsed": 37.0,
       "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": 24.0}


def test_bound_follows_the_speed_of_light():
    k = ncu.kernel_summary(tidy([
        dict(SOL),
        {**SOL, "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": 91.0,
         "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": 90.6},
        {**SOL, "sm__throughput.avg.pct_of_peak_sustained_elapsed": 80.0},
        {**SOL, "sm__throughput.avg.pct_of_peak_sustained_elapsed": 75.0,
         "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": 70.0}]))
    assert list(k["bound"]) == ["latency", "memory (DRAM)", "compute", "compute + memory"]
    assert "neither the SMs (25%) nor memory (26%)" in k["bound_why"][0]
    assert k["time_share_pct"].tolist() == [25.0] * 4


def test_memory_columns_are_honest():
    """A40-like: 28 KB read beside 43 MB written; L2 at 100.1%; no L1 traffic at all."""
    k = ncu.kernel_summary(tidy([{**SOL, "dram__bytes_read.sum": 28e3, "dram__bytes_write.sum": 43e6,
                                  "lts__t_sector_hit_rate.pct": 100.1, "lts__t_sectors.sum": 5e5,
                                  "l1tex__t_sector_hit_rate.pct": 0.0,
                                  "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": 0.0,
                                  "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum": 0.0},
                                 {**SOL, "l1tex__t_sector_hit_rate.pct": 0.0,
                                  "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": 1e6,
                                  "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": 2.5e5}]))
    a, b = k.iloc[0], k.iloc[1]
    assert a["dram_bytes_read"] == 28e3 and a["dram_bytes_write"] == 43e6 and a["dram_bytes"] == 28e3 + 43e6
    assert a["l2_hit_rate_pct"] == 100.0 and a["l2_hit_rate_raw_pct"] == 100.1 and a["l2_hit_rate_clamped"]
    assert a["l1_traffic"] is False or a["l1_traffic"] == False  # noqa: E712 - numpy bools
    assert b["l1_traffic"] and b["l1_hit_rate_pct"] == 0.0 and b["l1_sectors_per_load_request"] == 4.0
    assert pd.isna(b["l2_traffic"])  # no L2 sector metric: unknown, not "no traffic"


def test_an_older_gpu_lacks_metrics_and_nothing_breaks():
    """A Volta-era report with a duration and occupancy only: NaN and named, never a crash."""
    k = ncu.kernel_summary(tidy([{"gpu__time_duration.sum": 5e6, "sm__warps_active.avg.pct_of_peak_sustained_active":
                                  40.0}]))
    assert k["bound"][0] == "unknown" and math.isnan(k["sm_throughput_pct"][0])
    lacking = ncu.missing_metrics(k, ncu.SOL_COLUMNS)
    assert any("sm__throughput" in m for m in lacking) and len(lacking) == 5
    assert ncu.weighted_stalls(k).empty and ncu.roofline(k)[0].empty and not ncu.has_roofline(k)
    # only the DRAM summary: memory throughput falls back to the busiest unit
    k = ncu.kernel_summary(tidy([{"gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": 70.0,
                                  "sm__throughput.avg.pct_of_peak_sustained_elapsed": 10.0}]))
    assert k["memory_throughput_pct"][0] == 70.0 and k["bound"][0] == "memory (DRAM)"


def test_stalls_are_weighted_by_the_instructions_each_kernel_issued():
    """The 4.3 ms kernel's barrier and long-scoreboard stalls must not hide behind ten
    10 µs kernels that stall a lot per instruction."""
    long_kernel = {"function": "big", "gpu__time_duration.sum": 4.3e6, "smsp__inst_issued.sum": 1e9,
                   stall_metric("barrier"): 1.60, stall_metric("long_scoreboard"): 1.05, stall_metric("wait"): 0.2}
    short = [{"function": "small", "gpu__time_duration.sum": 1e4, "smsp__inst_issued.sum": 1e5,
              stall_metric("barrier"): 0.0, stall_metric("long_scoreboard"): 0.1, stall_metric("wait"): 20.0}
             for _ in range(10)]
    k = ncu.kernel_summary(tidy([long_kernel, *short]))
    unweighted = k[[c for c in k.columns if c.startswith("stall_")]].sum().sort_values(ascending=False)
    assert unweighted.index[0] == "stall_wait"  # what a plain sum over kernels picks
    long = ncu.weighted_stalls(k)
    assert ncu.top_reasons(long)[:2] == ["barrier", "long_scoreboard"]
    big = long[long["kernel_id"] == 0]
    assert big["total_share_pct"].sum() > 99 and (long["weight"] == "instructions issued").all()
    tops = ncu.kernel_top_stalls(long)
    assert tops.iloc[0]["top_stalls"][0][0] == "barrier" and tops.iloc[1]["top_stalls"][0][0] == "wait"


def test_labels_stay_distinct():
    k = pd.DataFrame({"kernel_id": [0, 1, 2], "report": ["r"] * 3,
                      "function": ["distribution_elementwise_grid_stride_kernel"] * 2 + ["flash_fwd_kernel"]})
    labels = ncu.kernel_labels(k)
    assert len(set(labels)) == 3 and labels[0].endswith("(1 of 2)") and labels[2] == "#2 flash_fwd_kernel"
    assert "…" in labels[0] and labels[0].startswith("#0 distribution_") and "kernel (1 of 2)" in labels[0]


def test_real_reports(ncu_fixtures):
    k = ncu.kernel_summary(read_any(ncu_fixtures / "a100_mistic_msdnew.ncu-rep"))
    r = k.iloc[0]
    assert r["memory_throughput_pct"] == pytest.approx(25.77, abs=0.01)
    assert r["l2_throughput_pct"] == pytest.approx(36.70, abs=0.01)
    assert r["l1_throughput_pct"] == pytest.approx(34.96, abs=0.01)
    assert r["bound"] == "latency" and r["dram_bytes_write"] == pytest.approx(4.113e9, rel=1e-3)
    pts, roofs = ncu.roofline(k)
    fp64 = pts[pts["precision"] == "FP64"].iloc[0]
    assert fp64["flop_per_s"] == pytest.approx(1.948e11, rel=1e-3)
    dram = roofs[(roofs["kind"] == "bandwidth") & (roofs["name"] == "DRAM")]["peak"].iloc[0]
    assert dram == pytest.approx(1280 * 1.1879e9, rel=1e-3)
    h = ncu.kernel_summary(read_any(ncu_fixtures / "h800_sglang.ncu-rep"))
    assert list(ncu.without_data(h)["function"]) == ["flash_fwd_kernel"]  # profiled by name only
    assert ncu.slowest(h).iloc[0]["kernel_id"] == 3 and np.isclose(h["time_share_pct"].sum(), 100)


def test_per_point_means():
    k = ncu.kernel_summary(tidy([dict(SOL), {**SOL, "sm__throughput.avg.pct_of_peak_sustained_elapsed": 35.0}]))
    k["variant"], k["dataset"] = "base", "medium"
    p = ncu.per_point(k)
    assert len(p) == 1 and p["sm_throughput_pct"][0] == 30.0 and p["kernels"][0] == 2
    assert p["label"][0] == "base · medium" and p["bound"][0] == "latency"


# ------------------------------------------------------- the H200 run's own reports
H200 = Path(__file__).resolve().parents[2] / "profiles" / "h200"


@pytest.fixture(scope="module")
def h200_run() -> tuple[pd.DataFrame, list[dict], int]:
    """The H200 paper run's kernels (base and tbe, profiled), its profile points and its T."""
    run = load_run(H200 / "paper-gpu")
    return ncu.kernel_summary(run.metrics), run.points("profile"), run.meta["experiment"]["workload"]["T"]


def _row(k: pd.DataFrame, variant: str, dataset: str) -> pd.Series:
    return k[(k["variant"] == variant) & (k["dataset"] == dataset)].iloc[0]


def test_a_batched_launch_is_divided_by_its_tables(h200_run):
    """One tbe launch gathers all 12 tables: 484 us and 1.8 GiB of DRAM per launch are 40 us
    and 150 MiB per table, beside base's 145 us and 133 MiB for its one table."""
    k, points, T = h200_run
    assert T == 12 and not any("tables_per_launch" in p for p in points)   # the run predates the field
    t = ncu.per_table(k, points, T)
    tbe, base = _row(t, "tbe", "random"), _row(t, "base", "random")
    raw = _row(k, "tbe", "random")
    assert tbe["tables_per_launch"] == 12 and base["tables_per_launch"] == 1
    assert tbe["duration_ns"] == pytest.approx(484032 / 12) and raw["duration_ns"] == pytest.approx(484032)
    assert tbe["dram_bytes_read"] == pytest.approx(raw["dram_bytes_read"] / 12)
    assert tbe["inst_executed"] == pytest.approx(raw["inst_executed"] / 12)
    assert tbe["dram_bytes"] < 1.2 * base["dram_bytes"] < 12 * tbe["dram_bytes"]
    # rates and shares of peak describe the launch as it ran: left alone
    for col in ("dram_throughput_pct", "dram_bytes_per_s", "l2_hit_rate_pct", "waves_per_sm", "stall_long_scoreboard"):
        assert tbe[col] == raw[col], col
    assert base["duration_ns"] == _row(k, "base", "random")["duration_ns"]
    # a point that records its tables wins over the registry; without T a batched kernel stays per launch
    recorded = [{**p, "tables_per_launch": 6} if p["variant"] == "tbe" else p for p in points]
    assert _row(ncu.per_table(k, recorded, T), "tbe", "random")["tables_per_launch"] == 6
    assert ncu.batched_unknown(k, points, None) == ["tbe"] and ncu.batched_unknown(k, points, T) == []
    assert (ncu.launch_tables(k.assign(variant="my_kernel"), (), T) == 1).all()   # a name the registry lacks


def test_stalls_weigh_every_kernel_alike_and_per_table(h200_run):
    """The H200 reports lack smsp__inst_issued.sum: every kernel is weighed by the
    instructions it executed, per table, so tbe's stalls are not its 12 tables' stalls."""
    k, points, T = h200_run
    per_launch = ncu.weighted_stalls(ncu.per_point(k))
    points_ = ncu.per_point(ncu.per_table(k, points, T))
    long = ncu.weighted_stalls(points_)
    assert set(long["weight"]) == {"instructions executed"} == {ncu.stall_weight(points_)}
    share = ncu.kernel_top_stalls(long).set_index("label")["total_share_pct"]
    before = ncu.kernel_top_stalls(per_launch).set_index("label")["total_share_pct"]
    # per launch tbe took 41% of the stall cycles, 2.7x base's; per table a fifth of base's
    assert before["tbe · random"] > 2.5 * before["base · random"]
    assert share["tbe · random"] < share["base · random"] / 4
    assert share.sum() == pytest.approx(100)
    # one kernel without an instruction count: every kernel falls back to its duration, never a mix
    mixed = points_.copy()
    mixed.loc[0, "inst_executed"] = np.nan
    assert set(ncu.weighted_stalls(mixed)["weight"]) == {"duration"}


def test_rule_estimates_are_capped_by_the_speed_of_light_headroom(h200_run):
    """ncu's 93% long-scoreboard estimate for tbe, whose L2 runs at 91% of peak and DRAM at
    83%, cannot hold: at most 9% of its time can go while the memory units do the same
    work. base, latency-bound at 30% of L2, keeps most of its estimate; a rule that cuts
    work (fusing FP instructions) is not capped."""
    k, _, _ = h200_run
    rules = pd.concat([rule_results(H200 / "paper-gpu" / "ncu" / f"{v}.ncu-rep", run="paper") for v in ("tbe", "base")])
    capped = ncu.cap_speedups(rules, k)
    tbe = capped[(capped["report"] == "tbe.ncu-rep") & (capped["kernel_id"] == 0)].set_index("title")
    long_sb = tbe.loc["Long Scoreboard Stalls"]
    l2 = _row(k, "tbe", "random")["l2_throughput_pct"]
    assert long_sb["ncu_speedup"] == pytest.approx(92.76, abs=0.01) and long_sb["capped"]
    assert long_sb["estimated_speedup"] == pytest.approx(100 - l2) and long_sb["cap_why"] == "L2 at 91% of peak"
    assert 9 < long_sb["estimated_speedup"] < 100 / 0.834 - 100   # tighter than DRAM's 100/x - 1 alone
    tail = capped[(capped["report"] == "base.ncu-rep") & (capped["title"] == "Tail Effect")]
    assert not tail["capped"].any() and (tail["estimated_speedup"] == 50).all()
    assert rule_unit("InstructionStats", "FPInstructions", "FP32 Non-Fused Instructions") == ""
    assert rule_unit("WarpStateStats", "CPIStall", "Not Selected Stalls") == "compute"
    assert rule_unit("Occupancy", "TheoreticalOccupancy", "") == "any"


def test_bandwidth_roofline_sets_each_level_against_its_own_peak(h200_run):
    """tbe moves 4.0 TB/s of DRAM bytes: 83% of the DRAM peak ncu's own share implies
    (4.81 TB/s, the peak counter of the full probe agrees), 95% of the 4,214 GB/s the
    H200's copy moved; its L2 bytes are set against the L2's peak, never the DRAM's."""
    k, points, T = h200_run
    pts, roofs = ncu.bandwidth(ncu.per_point(ncu.per_table(k, points, T)))
    tbe = pts[pts["label"] == "tbe · random"].set_index("level")
    assert tbe.loc["DRAM", "bytes_per_s"] == pytest.approx(4.0155e12, rel=1e-3)
    assert tbe.loc["DRAM", "pct_of_peak"] == pytest.approx(_row(k, "tbe", "random")["dram_throughput_pct"])
    assert 30 < tbe.loc["L2", "pct_of_peak"] < 50 and tbe.loc["L2", "peak_bytes_per_s"] > 3 * 4.8e12
    assert (pts["pct_of_peak"].dropna() <= 100).all() and set(pts["level"]) == {"DRAM", "L2"}  # no L1 sectors here
    roof = roofs.set_index("level")["peak"]
    assert roof["DRAM"] == pytest.approx(4.81e12, rel=2e-3) and roof["DRAM copy"] == pytest.approx(4214.3e9, rel=1e-4)
    full = ncu.kernel_summary(read_any(H200 / "ncu-probe" / "full.ncu-rep"))
    fpts, froofs = ncu.bandwidth(full)
    assert froofs.set_index("level").loc["DRAM", "source"] == "peak counter"
    assert froofs.set_index("level").loc["DRAM", "peak"] == pytest.approx(roof["DRAM"], rel=2e-3)
    assert set(fpts["level"]) == {"DRAM", "L2", "L1"} and fpts.set_index("level").loc["L1", "pct_of_peak"] != 0
    assert ncu.copy_ceiling("NVIDIA A100-SXM4-80GB") is None and ncu.copy_ceiling("") is None
    # the gather's FP adds are no roofline's business; an FP application's are
    assert ncu.has_roofline(full) and not ncu.fp_worth_roofline(full)
    assert ncu.has_bandwidth(full) and not ncu.has_bandwidth(full.drop(columns=["dram_bytes_per_s", "dram_bytes"]).iloc[0:0])
