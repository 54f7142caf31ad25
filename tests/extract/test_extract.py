"""Tests of the extract stage against real Nsight Compute reports and hand-written ncu CSVs.

The reports live outside the repository (``../shared/fixtures/ncu`` beside the repo
root, or ``$CHARACTERIZE_NCU_FIXTURES``); tests that need them skip when absent.
The CSV files under ``tests/data/ncu_csv`` reproduce ncu's layouts with values read
from those reports, so the CSV reader is checked against the report reader.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from characterize.errors import ReportError
from characterize.extract.ncu_csv import read_csv
from characterize.extract.ncu_rep import read_report
from characterize.extract.read import read_any, wide
from characterize.extract.rules import rule_results
from characterize.extract.schema import (
    TIDY_COLUMNS,
    WIDE_METRICS,
    _nvtx_fields,
    normalize_unit,
    parse_nvtx_convention,
    report_nvtx_stack,
    short_function_name,
)

FIXTURES = Path(
    os.environ.get("CHARACTERIZE_NCU_FIXTURES") or Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "ncu"
)
CSV_DIR = Path(__file__).resolve().parents[1] / "data" / "ncu_csv"
REPORTS = ("a100_mistic_msdnew", "a100_mistic_msdkt23", "h800_sglang")

needs_fixtures = pytest.mark.skipif(
    not FIXTURES.is_dir(),
    reason=f"real ncu reports not found at {FIXTURES} (set CHARACTERIZE_NCU_FIXTURES to the folder holding them)",
)


def report(name: str) -> Path:
    path = FIXTURES / f"{name}.ncu-rep"
    if not path.is_file():
        pytest.skip(f"fixture report {path} is missing")
    return path


@pytest.fixture(scope="module")
def frames() -> dict[str, pd.DataFrame]:
    if not FIXTURES.is_dir():
        pytest.skip(f"real ncu reports not found at {FIXTURES}")
    return {name: read_report(report(name), run="r1") for name in REPORTS}


def one(df: pd.DataFrame, metric: str, kernel_id: int = 0) -> pd.Series:
    rows = df[(df["metric"] == metric) & (df["kernel_id"] == kernel_id)]
    assert len(rows) == 1, f"{metric} of kernel {kernel_id}: {len(rows)} rows"
    return rows.iloc[0]


def close(a: float, b: float, rel: float = 1e-12, abs_: float = 0.0) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)


# ---------------------------------------------------------------------------
# .ncu-rep reader against the ncu_report API
# ---------------------------------------------------------------------------


@needs_fixtures
@pytest.mark.parametrize("name", REPORTS)
def test_every_metric_of_every_kernel_matches_ncu_report(name: str, frames: dict[str, pd.DataFrame]) -> None:
    import ncu_report

    df = frames[name]
    assert list(df.columns) == list(TIDY_COLUMNS)
    ctx = ncu_report.load_report(str(report(name)))
    ranges = [ctx.range_by_idx(r) for r in range(ctx.num_ranges())]
    actions = [rng.action_by_idx(a) for rng in ranges for a in range(rng.num_actions())]
    assert sorted(df["kernel_id"].unique()) == list(range(len(actions)))
    by_kernel = {k: g for k, g in df.groupby("kernel_id")}
    for kernel_id, action in enumerate(actions):
        rows = by_kernel[kernel_id]
        names = list(action.metric_names())
        assert list(rows["metric"]) == names  # every metric, in the report's order
        assert (rows["kernel_name"] == action.name(ncu_report.IAction.NameBase_DEMANGLED)).all()
        assert (rows["function"] == action.name()).all()
        for row, metric_name in zip(rows.itertuples(index=False), names):
            metric = action[metric_name]
            value = metric.value()
            unit, factor = normalize_unit(metric.unit())
            assert row.unit == unit
            assert row.label == (metric.label() or "")
            if isinstance(value, str):
                assert math.isnan(row.value) and row.value_text == value
            elif value is None:
                assert math.isnan(row.value) and row.value_text == ""
            else:
                assert close(row.value, float(value) * factor), (metric_name, row.value, value)
                assert row.value_text == ""


@needs_fixtures
def test_fixture_units_are_already_canonical(frames: dict[str, pd.DataFrame]) -> None:
    # Real reports store base units, so normalisation must not touch their values.
    units = set(pd.concat(frames.values())["unit"])
    assert {"ns", "byte", "hz", "byte/s", "%"} <= units
    assert all(normalize_unit(u) == (u, 1.0) for u in units)


@needs_fixtures
def test_acceptance_values_a100(frames: dict[str, pd.DataFrame]) -> None:
    df = frames["a100_mistic_msdnew"]
    assert round(one(df, "sm__warps_active.avg.pct_of_peak_sustained_active").value, 2) == 80.59
    assert round(one(df, "lts__t_sector_hit_rate.pct").value, 2) == 54.11
    assert one(df, "launch__registers_per_thread").value == 32
    duration = one(df, "gpu__time_duration.sum")
    assert duration.value == 8261906816 and duration.unit == "ns"
    row = df.iloc[0]
    assert row.device == "NVIDIA A100-PCIE-40GB" and row.grid == "(1024, 1, 1)" and row.block == "(1024, 1, 1)"
    assert row.run == "r1" and row.report == "a100_mistic_msdnew.ncu-rep"
    assert row.nvtx_range == "" and row.variant == "" and pd.isna(row.table)


@needs_fixtures
def test_acceptance_values_h800(frames: dict[str, pd.DataFrame]) -> None:
    df = frames["h800_sglang"]
    assert (df["device"] == "NVIDIA H800").all()
    assert one(df, "device__attribute_display_name").value_text == "NVIDIA H800"
    assert one(df, "sm__maximum_warps_per_active_cycle_pct").value == 75
    assert round(one(df, "lts__t_sector_hit_rate.pct").value, 2) == 96.37
    assert df["kernel_id"].nunique() == 5


@needs_fixtures
def test_kernel_names_are_demangled(frames: dict[str, pd.DataFrame]) -> None:
    kernels = pd.concat(frames.values()).drop_duplicates(["report", "kernel_id"])
    assert not kernels["kernel_name"].str.startswith("_Z").any()
    assert kernels.iloc[0]["kernel_name"].startswith("nodeByPoint(double *, double *,")
    assert set(kernels["function"]) == {
        "nodeByPoint", "nodeByPoint5", "distribution_elementwise_grid_stride_kernel", "flash_fwd_kernel",
    }  # fmt: skip


@needs_fixtures
def test_short_function_name_matches_ncu_function_base(frames: dict[str, pd.DataFrame]) -> None:
    kernels = pd.concat(frames.values()).drop_duplicates(["report", "kernel_id"])
    for name, function in zip(kernels["kernel_name"], kernels["function"]):
        assert short_function_name(name) == function


@pytest.mark.parametrize(
    ("demangled", "function"),
    [
        ("embedding_bag_kernel(float const*, long const*, float*, int)", "embedding_bag_kernel"),
        ("void chz::rpf<4>(float const*, long const*, float*, int)", "rpf"),
        ("void (anonymous namespace)::k<(int)2>(float *)", "k"),
        ("plain_name", "plain_name"),
    ],
)
def test_short_function_name(demangled: str, function: str) -> None:
    assert short_function_name(demangled) == function


# ---------------------------------------------------------------------------
# wide()
# ---------------------------------------------------------------------------

FIXED_WIDE = [c for c in WIDE_METRICS if not c.startswith("stall_")]
ID_COLUMNS = ["run", "report", "kernel_id", "kernel_name", "function", "nvtx_range", "variant", "dataset", "table",
              "grid", "block", "device"]  # fmt: skip


@needs_fixtures
def test_wide_columns_and_values(frames: dict[str, pd.DataFrame]) -> None:
    a100 = wide(frames["a100_mistic_msdnew"])
    stalls_a100 = [f"stall_{r}" for r in (
        "barrier", "branch_resolving", "dispatch_stall", "drain", "imc_miss", "lg_throttle", "long_scoreboard",
        "math_pipe_throttle", "membar", "mio_throttle", "misc", "no_instruction", "not_selected", "selected",
        "short_scoreboard", "sleeping", "tex_throttle", "wait")]  # fmt: skip
    assert list(a100.columns) == ID_COLUMNS + FIXED_WIDE + stalls_a100
    assert FIXED_WIDE == [
        "duration_ns", "achieved_occupancy_pct", "theoretical_occupancy_pct", "registers_per_thread",
        "block_limit_registers", "block_limit_shared_mem", "block_limit_warps", "block_limit_blocks",
        "l1_hit_rate_pct", "l2_hit_rate_pct", "l2_bytes", "dram_bytes_read", "dram_bytes_write",
        "dram_throughput_pct", "sm_throughput_pct",
    ]  # fmt: skip
    row = a100.iloc[0]
    assert len(a100) == 1 and row.duration_ns == 8261906816 and row.registers_per_thread == 32
    assert round(row.achieved_occupancy_pct, 2) == 80.59 and round(row.l2_hit_rate_pct, 2) == 54.11
    assert row.block_limit_registers == 2 and row.theoretical_occupancy_pct == 100
    assert math.isnan(row.l2_bytes)  # lts__t_bytes.sum is not in these reports
    assert round(row.stall_long_scoreboard, 2) == 28.49
    assert all(a100[c].dtype == np.float64 for c in FIXED_WIDE + stalls_a100)

    h800 = wide(frames["h800_sglang"])
    assert "stall_gmma" in h800.columns and len(h800) == 5
    assert h800.loc[0, "theoretical_occupancy_pct"] == 75
    # flash_fwd_kernel was profiled without launch statistics and with NaN values
    assert h800.loc[4, "function"] == "flash_fwd_kernel" and math.isnan(h800.loc[4, "duration_ns"])
    assert math.isnan(h800.loc[4, "registers_per_thread"])


@needs_fixtures
def test_wide_missing_metric_gives_nan_and_keeps_other_columns(frames: dict[str, pd.DataFrame]) -> None:
    df = frames["a100_mistic_msdkt23"]
    full = wide(df)
    trimmed = df[~df["metric"].isin(["gpu__time_duration.sum", "lts__t_sector_hit_rate.pct"])]
    trimmed = trimmed[~((trimmed["kernel_id"] == 2) & (trimmed["metric"] == "launch__registers_per_thread"))]
    partial = wide(trimmed)
    assert list(partial.columns) == list(full.columns) and len(partial) == 4
    assert partial["duration_ns"].isna().all() and partial["l2_hit_rate_pct"].isna().all()
    assert math.isnan(partial.loc[2, "registers_per_thread"]) and partial.loc[1, "registers_per_thread"] == 30
    untouched = [c for c in full.columns if c not in ("duration_ns", "l2_hit_rate_pct", "registers_per_thread")]
    pd.testing.assert_frame_equal(partial[untouched], full[untouched])


def test_wide_of_a_tiny_frame_without_stalls() -> None:
    df = pd.DataFrame(
        {"run": "", "report": "x", "kernel_id": [0, 0, 1], "metric": ["gpu__time_duration.sum", "other", "other"],
         "value": [5.0, 1.0, 2.0]}
    )  # fmt: skip
    out = wide(df)
    assert list(out.columns) == ["run", "report", "kernel_id"] + FIXED_WIDE
    assert out["duration_ns"].tolist()[0] == 5.0 and math.isnan(out["duration_ns"].tolist()[1])
    with pytest.raises(ReportError, match="missing columns"):
        wide(pd.DataFrame({"x": [1]}))


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------


@needs_fixtures
@pytest.mark.parametrize("fraction", [0.1, 0.5])
def test_truncated_report_raises_report_error(tmp_path: Path, fraction: float) -> None:
    data = report("a100_mistic_msdnew").read_bytes()
    cut = tmp_path / "cut.ncu-rep"
    cut.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(ReportError, match=r"cut\.ncu-rep.*(truncated|no profiled kernels)"):
        read_report(cut)


@needs_fixtures
def test_truncated_multi_kernel_report_can_be_read_partially(tmp_path: Path) -> None:
    data = report("a100_mistic_msdkt23").read_bytes()
    cut = tmp_path / "cut.ncu-rep"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ReportError, match="allow_partial=True"):
        read_report(cut)
    partial = read_report(cut, allow_partial=True)
    assert partial["kernel_id"].unique().tolist() == [0]
    assert one(partial, "launch__registers_per_thread").value == 30


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty"),
        (b"hello, this is not a report\n" * 20, "not an Nsight Compute report"),
        (bytes(range(256)) * 20, "not an Nsight Compute report"),
    ],
)
def test_garbage_report_raises_report_error(tmp_path: Path, content: bytes, message: str) -> None:
    bad = tmp_path / "bad.ncu-rep"
    bad.write_bytes(content)
    with pytest.raises(ReportError, match=message):
        read_report(bad)


def test_missing_path_and_directory_raise_report_error(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="no such file"):
        read_report(tmp_path / "nope.ncu-rep")
    with pytest.raises(ReportError, match="no such file"):
        read_any(tmp_path / "nope.csv")
    with pytest.raises(ReportError, match="not a report file"):
        read_report(tmp_path)


@needs_fixtures
def test_missing_ncu_report_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ncu_report", None)  # makes `import ncu_report` raise ImportError
    with pytest.raises(ReportError, match="pip install ncu-report"):
        read_report(report("a100_mistic_msdnew"))


# ---------------------------------------------------------------------------
# CSV reader against the report reader
# ---------------------------------------------------------------------------

CSV_CASES = [
    ("a100_msdkt23_details.csv", "a100_mistic_msdkt23"),
    ("h800_sglang_raw.csv", "h800_sglang"),
    ("a100_msdnew_details_nvtx_old.csv", "a100_mistic_msdnew"),
]


@needs_fixtures
@pytest.mark.parametrize(("csv_name", "report_name"), CSV_CASES)
def test_csv_values_agree_with_report(csv_name: str, report_name: str, frames: dict[str, pd.DataFrame]) -> None:
    from_csv = read_csv(CSV_DIR / csv_name, run="r1")
    assert list(from_csv.columns) == list(TIDY_COLUMNS)
    assert from_csv.dtypes.to_dict() == frames[report_name].dtypes.to_dict()
    rep = frames[report_name].set_index(["kernel_id", "metric"])
    numeric = 0
    for row in from_csv.itertuples(index=False):
        key = (row.kernel_id, row.metric)
        if math.isnan(row.value) and row.value_text in ("", "n/a"):
            # not collected / no value: the report has no such metric or a NaN
            assert key not in rep.index or math.isnan(rep.loc[key, "value"])
            continue
        assert key in rep.index, f"{csv_name}: {row.metric!r} (label {row.label!r}) is not a report metric"
        expected = rep.loc[key]
        assert row.unit == expected.unit, key
        if row.value_text:
            assert row.value_text == expected.value_text
        else:
            numeric += 1
            # ncu prints two decimals in the scaled unit; allow that rounding
            assert close(row.value, expected.value, rel=5e-3, abs_=5e-3), (key, row.value, expected.value)
        same_kernel = frames[report_name][frames[report_name]["kernel_id"] == row.kernel_id].iloc[0]
        assert row.kernel_name == same_kernel.kernel_name and row.function == same_kernel.function
    assert numeric >= 8


@needs_fixtures
def test_csv_details_layout_specifics(frames: dict[str, pd.DataFrame]) -> None:
    df = read_csv(CSV_DIR / "a100_msdkt23_details.csv")
    assert df["kernel_id"].unique().tolist() == [0, 1]
    cycles = one(df, "gpc__cycles_elapsed.max")  # printed "930,346,863"
    assert cycles.value == one(frames["a100_mistic_msdkt23"], "gpc__cycles_elapsed.max").value == 930346863
    assert cycles.label == "Elapsed Cycles" and cycles.unit == "cycle"
    assert one(df, "launch__grid_size").value == 1024
    sm_freq = one(df, "gpc__cycles_elapsed.avg.per_second")  # "Mhz" "734.42"
    assert sm_freq.unit == "hz" and sm_freq.value == pytest.approx(734.42e6)
    assert one(df, "dram__bytes.sum.per_second").unit == "byte/s"  # "GB/s"
    assert one(df, "gpu__time_duration.sum").value == pytest.approx(1.27e9)  # "s" "1.27"
    raw_named = one(df, "dram__bytes_read.sum")  # "Command line profiler metrics" section
    assert raw_named.unit == "byte" and raw_named.value == pytest.approx(10.67e9)
    assert one(df, "launch__func_cache_config").value_text == "CachePreferNone"
    assert set(df["grid"]) == {"(1024, 1, 1)"} and set(df["block"]) == {"(256, 1, 1)"}
    assert set(df["device"]) == {"0"}  # the details page only carries the device index
    assert set(df["run"]) == {""} and set(df["report"]) == {"a100_msdkt23_details.csv"}


def test_csv_raw_layout_specifics() -> None:
    df = read_csv(CSV_DIR / "h800_sglang_raw.csv")
    assert df["kernel_id"].unique().tolist() == [0, 4]
    assert set(df["device"]) == {"NVIDIA H800"}
    first = df[df["kernel_id"] == 0].iloc[0]
    assert first.grid == "(1056, 1, 1)" and first.block == "(256, 1, 1)"
    assert one(df, "gpu__time_duration.sum").value == pytest.approx(16448, rel=1e-3)  # "us" "16.45"
    assert one(df, "dram__bytes_read.sum").unit == "byte"  # "KB"
    assert one(df, "sm__maximum_warps_per_active_cycle_pct").value == 75
    assert one(df, "smsp__average_warps_issue_stalled_gmma_per_issue_active.ratio").unit == "inst"
    flash = one(df, "gpu__time_duration.sum", kernel_id=4)
    assert math.isnan(flash.value) and flash.value_text == "n/a"
    assert "stall_gmma" in wide(df).columns


def test_csv_nvtx_range_and_naming_convention() -> None:
    df = read_csv(CSV_DIR / "a100_msdnew_details_nvtx_old.csv", run="baseline")
    row = df.iloc[0]
    assert row.nvtx_range == "chz/base/medium/3"
    assert (row.variant, row.dataset, row.table) == ("base", "medium", 3)
    assert df["table"].dtype == "Int64" and row.run == "baseline"
    assert one(df, "gpu__time_duration.sum").value == pytest.approx(8.26e9)  # "second" "8.26"
    assert one(df, "dram__cycles_elapsed.avg.per_second").unit == "hz"  # "cycle/nsecond"
    assert one(df, "dram__bytes.sum.per_second").value == pytest.approx(367.14e9)  # "Gbyte/second"
    w = wide(df)
    assert w.loc[0, "variant"] == "base" and w.loc[0, "table"] == 3 and w.loc[0, "achieved_occupancy_pct"] == 80.59


# ---------------------------------------------------------------------------
# CSV robustness (inline files)
# ---------------------------------------------------------------------------

DETAILS_HEADER = (
    '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
    '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value","Rule Name","Rule Type",'
    '"Rule Description","Estimated Speedup Type","Estimated Speedup"'
)
K = (
    '"0","77","bench","host","embedding_bag_kernel(float const*, long const*, float*)",'
    '"1","7","(32, 8, 1)","(1024,1,1)","0","9.0"'
)


def write(tmp_path: Path, text: str, name: str = "x.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_inline_details_with_noise_ragged_rows_and_separators(tmp_path: Path) -> None:
    text = "\n".join(
        [
            "==PROF== Connected to process 77 (/usr/bin/python3)",
            "epoch 0 loss 0.1",
            DETAILS_HEADER,
            K + ',"GPU Speed Of Light Throughput","Duration","msecond","1,234.50",',
            K + ',"GPU Speed Of Light Throughput","Elapsed Cycles","cycle","12,345,678"',
            K + ',"Memory Workload Analysis","Memory Throughput","Tbyte/second","1.50","","","","",""',
            K + ',"Occupancy","Achieved Occupancy","%","n/a"',
            K + ',"Occupancy","Some New Label","","7"',
            K + ',"Occupancy","","","","AchievedOccupancy","OPT","Lower, then ""raise"" it","local","12.5",""',
            K + ',"SpeedOfLight","","","","SOLBottleneck","WRN"',
            "==PROF== Disconnected from process 77",
            "done.",
        ]
    )
    df = read_csv(write(tmp_path, text))
    assert len(df) == 5
    assert one(df, "gpu__time_duration.sum").value == pytest.approx(1234.5e6)
    assert one(df, "gpc__cycles_elapsed.max").value == 12345678
    assert one(df, "dram__bytes.sum.per_second").value == pytest.approx(1.5e12)
    occ = one(df, "sm__warps_active.avg.pct_of_peak_sustained_active")
    assert math.isnan(occ.value) and occ.value_text == "n/a"
    assert one(df, "Some New Label").label == "Some New Label"  # unknown label keeps its name
    assert set(df["grid"]) == {"(1024, 1, 1)"} and set(df["block"]) == {"(32, 8, 1)"}
    assert set(df["function"]) == {"embedding_bag_kernel"}

    rules = rule_results(write(tmp_path, text))
    assert rules["rule"].tolist() == ["AchievedOccupancy", "SOLBottleneck"]
    assert rules["message_type"].tolist() == ["OPTIMIZATION", "WARNING"]
    assert rules.loc[0, "message"] == 'Lower, then "raise" it'
    assert rules.loc[0, "speedup_type"] == "local" and rules.loc[0, "estimated_speedup"] == 12.5
    assert math.isnan(rules.loc[1, "estimated_speedup"]) and rules.loc[1, "section"] == "SpeedOfLight"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("   \n\n", "empty"),
        ("just some program output\nno csv here\n", "no ncu CSV header"),
        (f"{DETAILS_HEADER}\n", "no kernel rows"),
        ("==PROF== Connected\n==ERROR== ERR_NVGPUCTRPERM - The user does not have permission\n", "ERR_NVGPUCTRPERM"),
        ("==PROF== Connected\n==WARNING== No kernels were profiled.\n", "no kernels were profiled"),
    ],
)
def test_bad_csv_raises_report_error(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ReportError, match=message):
        read_csv(write(tmp_path, text))


def test_binary_file_as_csv_raises_report_error(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_bytes(b"NVR\x00\x02\x00\x00\x00" + bytes(200))
    with pytest.raises(ReportError, match="read_report"):
        read_csv(path)


# ---------------------------------------------------------------------------
# read_any, rule_results, units, NVTX helpers
# ---------------------------------------------------------------------------


@needs_fixtures
def test_read_any_dispatches_on_extension_and_content(tmp_path: Path, frames: dict[str, pd.DataFrame]) -> None:
    by_ext = read_any(report("a100_mistic_msdnew"), run="r1")
    pd.testing.assert_frame_equal(by_ext, frames["a100_mistic_msdnew"])
    link = tmp_path / "profile_without_extension"
    link.symlink_to(report("a100_mistic_msdnew"))
    assert len(read_any(link)) == len(by_ext)
    csv_copy = write(tmp_path, (CSV_DIR / "h800_sglang_raw.csv").read_text(), name="export.txt")
    assert len(read_any(csv_copy)) == len(read_csv(CSV_DIR / "h800_sglang_raw.csv"))
    assert len(read_any(CSV_DIR / "h800_sglang_raw.csv")) == 34
    with pytest.raises(ReportError, match="neither an Nsight Compute report"):
        read_any(write(tmp_path, "hello", name="notes.md"))


@needs_fixtures
def test_rule_results_from_report() -> None:
    rules = rule_results(report("h800_sglang"), run="r1")
    assert list(rules.columns) == [
        "run", "report", "kernel_id", "kernel_name", "section", "rule", "rule_name",
        "message_type", "title", "message", "speedup_type", "estimated_speedup",
    ]  # fmt: skip
    assert set(rules["message_type"]) <= {"NONE", "OK", "OPTIMIZATION", "WARNING", "ERROR"}
    assert "OPTIMIZATION" in set(rules["message_type"])
    assert set(rules["kernel_id"]) <= set(range(5)) and 0 in set(rules["kernel_id"])
    sol = rules[(rules["kernel_id"] == 0) & (rules["rule"] == "SOLBottleneck")].iloc[0]
    assert sol.section == "SpeedOfLight" and sol.message
    with_speedup = rules.dropna(subset=["estimated_speedup"])
    assert len(with_speedup) > 0 and set(with_speedup["speedup_type"]) <= {"local", "global"}
    assert (rules.loc[rules["estimated_speedup"].isna(), "speedup_type"] == "").all()


def test_rule_results_from_csv_details() -> None:
    rules = rule_results(CSV_DIR / "a100_msdkt23_details.csv")
    assert rules["rule"].tolist() == ["SOLBottleneck", "HighPipeUtilization", "LaunchConfiguration", "SOLBottleneck"]
    assert rules["kernel_id"].tolist() == [0, 0, 0, 1]
    assert rules["message_type"].tolist() == ["WARNING", "OK", "WARNING", "WARNING"]
    assert 'See "Warp State Statistics", section 2' in rules.loc[1, "message"]
    assert rule_results(CSV_DIR / "h800_sglang_raw.csv").empty  # the raw page has no rules


@pytest.mark.parametrize(
    ("unit", "expected"),
    [
        ("nsecond", ("ns", 1.0)), ("usecond", ("ns", 1e3)), ("msecond", ("ns", 1e6)), ("second", ("ns", 1e9)),
        ("ns", ("ns", 1.0)), ("us", ("ns", 1e3)), ("ms", ("ns", 1e6)), ("s", ("ns", 1e9)),
        ("byte", ("byte", 1.0)), ("Kbyte", ("byte", 1e3)), ("Mbyte", ("byte", 1e6)), ("Gbyte", ("byte", 1e9)),
        ("B", ("byte", 1.0)), ("KB", ("byte", 1e3)), ("MB", ("byte", 1e6)), ("GB", ("byte", 1e9)),
        ("Gbyte/second", ("byte/s", 1e9)), ("GB/s", ("byte/s", 1e9)), ("byte/s", ("byte/s", 1.0)),
        ("cycle/nsecond", ("hz", 1e9)), ("cycle/usecond", ("hz", 1e6)), ("Ghz", ("hz", 1e9)), ("hz", ("hz", 1.0)),
        ("sector/second", ("sector/s", 1.0)), ("Msector/second", ("sector/s", 1e6)), ("1/s", ("1/s", 1.0)),
        ("%", ("%", 1.0)), ("", ("", 1.0)), ("register/thread", ("register/thread", 1.0)),
        ("inst/cycle", ("inst/cycle", 1.0)), ("byte/block", ("byte/block", 1.0)),
    ],
)  # fmt: skip
def test_normalize_unit(unit: str, expected: tuple[str, float]) -> None:
    assert normalize_unit(unit) == expected


class _Domain:
    def __init__(self, name: str, ranges: list[str]) -> None:
        self._name, self._ranges = name, ranges

    def name(self) -> str:
        return self._name

    def push_pop_ranges(self) -> tuple[str, ...]:
        return tuple(self._ranges)


class _State:
    def __init__(self, domains: list[_Domain]) -> None:
        self._domains = domains

    def domains(self) -> tuple[int, ...]:
        return tuple(range(len(self._domains)))

    def domain_by_id(self, i: int) -> _Domain:
        return self._domains[i]


class _Action:
    def __init__(self, state: _State | None) -> None:
        self._state = state

    def nvtx_state(self) -> _State | None:
        return self._state


def test_report_nvtx_stack_uses_innermost_push_pop_range() -> None:
    assert report_nvtx_stack(_Action(None)) == []
    assert report_nvtx_stack(_Action(_State([_Domain("<default domain>", [])]))) == []
    action = _Action(_State([_Domain("<default domain>", ["bench", "chz/rpf/high/11", "gather"])]))
    stack = report_nvtx_stack(action)
    assert _nvtx_fields(stack) == ("gather", "rpf", "high", 11)  # convention found outside the innermost range
    other = _Action(
        _State([_Domain("torch", ["aten::embedding_bag"]), _Domain("<default domain>", ["chz/base/low/0"])])
    )
    assert _nvtx_fields(report_nvtx_stack(other)) == ("chz/base/low/0", "base", "low", 0)


@pytest.mark.parametrize(
    ("name", "fields"),
    [
        ("chz/base/medium/3", ("base", "medium", 3)),
        ("chz/optmt+rpf/zipf-1.05/11", ("optmt+rpf", "zipf-1.05", 11)),
        ("chz/base/medium", ("", "", None)),
        ("chz/base/medium/x", ("", "", None)),
        ("other/base/medium/3", ("", "", None)),
        ("", ("", "", None)),
    ],
)
def test_parse_nvtx_convention(name: str, fields: tuple) -> None:
    assert parse_nvtx_convention(name) == fields
