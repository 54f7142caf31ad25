"""Report stage, panels of an imported Nsight Compute file that a run does not have: the file
itself and where its time goes (the first answer). Its speed of light, roofline, memory
chart, stalls, occupancy, kernels and rule findings are the Nsight Compute panels
(panels.nsight, at the grain of one kernel).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from characterize.analysis import ncu
from characterize.report.blocks import (
    Cell,
    Missing,
    NoteBlock,
    PanelOutput,
    as_text,
    column_cell,
    figure_block,
    fmt_num,
    fmt_pct,
    kv_table,
    share_cell,
    table_block,
)
from characterize.report.layout import S_OVERVIEW, Panel
from characterize.report.plots import (
    kernel_duration_figure,
)
from characterize.report.sources import ImportSource
from characterize.report.views import first_answer, stall_text
from characterize.units import format_bytes

MODES = "ncu collection modes are not recorded in an exported report: ncu's defaults are --cache-control all " \
        "(caches flushed before each kernel) and --clock-control base (locked clocks) unless the profiler was " \
        "told otherwise"
NOT_RECORDED = "not recorded in the report (ncu's defaults: --cache-control all, --clock-control base)"


# ------------------------------------------------------------------ helpers
def _measured(s: ImportSource) -> pd.DataFrame:
    """Kernels that carry values (a kernel whose profile failed is named in the summary), per
    table when the run's points beside the report say what each launch covered."""
    return s.kview_per_table.drop(index=ncu.without_data(s.kview).index)


def _scope(s: ImportSource) -> str:
    """What a time or byte count of the report is counted over."""
    return "per table" if s.per_table else "per launch"


def _top_stalls(s: ImportSource) -> dict[Any, Any]:
    long = ncu.weighted_stalls(s.kview)
    tops = ncu.kernel_top_stalls(long)
    return dict(zip(tops["kernel_id"], tops["top_stalls"])) if not tops.empty else {}


# -------------------------------------------------------------------- panels
def _i_summary(s: ImportSource) -> PanelOutput:
    w = s.kernels
    devices = sorted({str(d) for d in w.get("device", pd.Series(dtype=str)).dropna() if str(d)})
    rows = [("file", str(s.path)), ("size", format_bytes(s.path.stat().st_size)), ("kernels", len(w)),
            ("metric values", len(s.metrics)), ("distinct metrics", s.metrics["metric"].nunique()),
            ("device", ", ".join(devices) or "not recorded"), ("collection modes", s.recorded_modes or MODES)]
    blocks: list[Any] = [kv_table(rows)]
    empty = ncu.without_data(s.kview)
    if not empty.empty:
        blocks.append(NoteBlock("Named in the report but holding no values (ncu did not finish profiling them; "
                                "their rule results are errors): " + ", ".join(empty["label"]) +
                                ". They are left out of the figures.", "warning"))
    return PanelOutput(blocks)


def _i_time(s: ImportSource) -> PanelOutput:
    k = _measured(s)
    if "duration_ns" not in k.columns or k["duration_ns"].isna().all():
        raise Missing("no kernel has a duration (gpu__time_duration): the SpeedOfLight section was not collected")
    stalls = _top_stalls(s)
    blocks: list[Any] = []
    answer = first_answer(k, stalls)
    if answer:
        blocks.append(NoteBlock(answer))
    scope = _scope(s)
    blocks.append(figure_block(kernel_duration_figure(k, f"Where the time goes: duration per kernel, {scope}"),
                               "Duration per kernel", f"linear axis: bar length is time {scope}; labels: share of "
                               "the summed kernel duration"))
    d = ncu.slowest(k, len(k))
    spec = [("kernel", lambda r: Cell(r["label"], "kname", detail=as_text(r.get("kernel_name")))),
            (f"duration {scope} (µs)", lambda r: Cell(fmt_num(r.get("duration_ns", np.nan) / 1e3), "num")),
            ("share of time", lambda r: share_cell(r.get("time_share_pct"))),
            ("bound", lambda r: Cell(as_text(r.get("bound")), "", title=as_text(r.get("bound_why")))),
            ("SM / memory (% of peak)", lambda r: Cell(f"{fmt_pct(r.get('sm_throughput_pct'))} / "
                                                       f"{fmt_pct(r.get('memory_throughput_pct'))}", "num")),
            ("top stalls (cycles per issued instruction, share of its stalls)",
             lambda r: Cell(stall_text(stalls.get(r["kernel_id"])), "")),
            (f"DRAM read {scope}", column_cell("dram_bytes_read", format_bytes)),
            (f"DRAM written {scope}", column_cell("dram_bytes_write", format_bytes))]
    blocks.append(table_block(d, spec, caption="Kernels by time, longest first"))
    many = k[k["tables_per_launch"] > 1] if "tables_per_launch" in k.columns else k[:0]
    if not many.empty:
        blocks.append(NoteBlock("Per table: " + ", ".join(dict.fromkeys(
            f"{r['label']} ({r['tables_per_launch']:.0f} tables per launch)" for r in many.to_dict("records"))) +
            " divided by their tables, as the run's points beside the report record them; shares of time are of "
            "the summed durations per table."))
    return PanelOutput(blocks)


def _modes(builder: Any) -> Any:
    """Every panel of an imported report says the same about collection modes."""
    def wrapped(s: ImportSource) -> PanelOutput:
        out = builder(s)
        out.modes = out.modes or s.recorded_modes or NOT_RECORDED
        return out
    return wrapped


PANELS: tuple[Panel, ...] = (
    Panel("summary", "Report file", S_OVERVIEW, (), ("ncu",),
          "the file as read by extract.read_any (ncu_report for .ncu-rep, the CSV reader for exports)", _modes(_i_summary)),
    Panel("time", "Where the time goes", S_OVERVIEW, ("kernels",), ("ncu",),
          "gpu__time_duration per kernel (per table when the run's points beside the report say what a launch "
          "covered: analysis.ncu.per_table), its share of the summed duration, the bound from the speed of light "
          "and each kernel's largest stall (analysis.ncu)", _modes(_i_time)),
)
