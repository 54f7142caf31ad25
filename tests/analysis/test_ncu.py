"""Nsight Compute views: speed of light and the bound, the memory chart's honest
columns, the roofline, stalls weighted by instructions, and what an older GPU lacks."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from characterize.analysis import ncu
from characterize.extract.read import read_any
from characterize.extract.schema import stall_metric


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
