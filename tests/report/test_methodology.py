"""The report states how a run was measured: timing method and launch overhead, the check
before timing, the clock policy (mixed clocks flagged), each metric's replay mode and
where the GPU's identity came from."""

from __future__ import annotations

from characterize.report.blocks import Cell
from characterize.report.panels.overview import _methodology_rows
from characterize.report.sources import RunSource
from characterize.store import RunDir, load_run
from tests.report.test_report import _summary, make_gpu_run

IDENTITY = {"table_entry": "h100-pcie", "name": "torch", "sm_count": "cuda runtime (torch)",
            "hbm_GBps": "nvml (max memory clock x bus width)", "base_clock_MHz": "spec table (h100-pcie)"}
MODES = {"default": "kernel", "lts__t_sector_hit_rate.pct": "application", "dram__bytes_read.sum": "application"}


def _run(tmp_path, profile_clock: str):
    path = make_gpu_run(tmp_path / "run", tmp_path, variants=("base",), datasets=("medium",), modes=("steady",),
                        predictions=False, static=False, locality=False, failed_profile=None)
    run = RunDir(path)
    summary = {**_summary("base", "medium", "steady"), "timing_method": "delay-kernel", "gap_free": True,
               "host_bound_reps": 0, "host_launch_us": 17.5, "launch_gap_us": 1.25, "flush_bytes": 0}
    run.write_point("bench", "base", "medium", {
        "status": "ok", "backend": "cuda", "summary": [summary], "repetitions": [], "per_table_mean_us": {},
        "check": {"passed": True, "max_abs_err": 1e-6, "tolerance": 1e-4, "table": 0}, "clock_control": "none",
        "clocks": {"before": {"sm_clock_MHz": 1755, "throttle_reasons": ["gpu_idle"]},
                   "after": {"sm_clock_MHz": 1620, "throttle_reasons": ["sw_power_cap"]}},
        "identity": IDENTITY})
    run.write_point("profile", "base", "medium", {"status": "ok", "clock_control": profile_clock,
                                                   "cache_control": "none", "replay_mode": "kernel",
                                                   "replay_modes": MODES})
    return RunSource(load_run(path), 0)


def test_the_report_says_how_each_number_was_measured(tmp_path):
    s = _run(tmp_path, "none")
    rows = dict(_methodology_rows(s))
    assert s.mixed_clocks is None and rows["clock policy"] == "bench: --clock-control none; profile: --clock-control none"
    assert "delay-kernel; 1 of 1 timed mode(s) free of host gaps" in rows["timing method"]
    assert "host enqueue 17.5 us per launch" in rows["timing method"] and "device gap 1.25 us" in rows["timing method"]
    assert rows["checked before timing"].startswith("1 point(s)") and "0 mismatch" in rows["checked before timing"]
    assert rows["clocks sampled (NVML, around each point)"] == "SM 1620-1755 MHz; throttle reasons: sw_power_cap"
    assert rows["ncu replay mode per metric"] == ("kernel metrics: kernel replay; lts__t_sector_hit_rate.pct: "
                                                  "application replay, dram__bytes_read.sum: application replay")
    assert rows["GPU identity"] == ("from the device: name, sm_count, hbm_GBps; from the spec table (h100-pcie): "
                                    "base_clock_MHz")


def test_mixed_clocks_are_flagged(tmp_path):
    s = _run(tmp_path, "base")
    row = dict(_methodology_rows(s))["clock policy"]
    assert isinstance(row, Cell) and row.cls == "missing"
    assert "mixed clocks: bench at none; profile at base" in row.text and "not comparable" in row.text


def test_throttled_points_are_marked(tmp_path):
    s = _run(tmp_path, "none")   # the point's last NVML sample says sw_power_cap
    rows = dict(_methodology_rows(s))
    assert s.throttled_points == ["base medium (sw_power_cap)"]
    assert isinstance(rows["throttled points"], Cell) and rows["throttled points"].cls == "missing"
    assert rows["throttled points"].text == "1 of 1: base medium (sw_power_cap)"
