"""Report panels of an imported Nsight Compute file: summary, kernels, figures, stalls, rules.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from characterize.report.blocks import (
    Missing,
    PanelOutput,
    _col,
    _figure_block,
    _kv,
    _table,
    fmt_bytes,
    kernel_cell,
    kernel_table,
    rule_blocks,
)
from characterize.report.layout import S_NCU, S_OVERVIEW, S_RULES, Panel
from characterize.report.plots import (
    kernel_duration_figure,
    kernel_occupancy_figure,
    kernel_stall_figure,
)
from characterize.report.provenance import PROVENANCE
from characterize.report.sources import ImportSource


# -------------------------------------------------------------- import panels
def _i_summary(s: ImportSource) -> PanelOutput:
    w = s.kernels
    devices = sorted({str(d) for d in w.get("device", pd.Series(dtype=str)).dropna() if str(d)})
    rows = [("file", str(s.path)), ("size", fmt_bytes(s.path.stat().st_size)), ("kernels", len(w)),
            ("metric values", len(s.metrics)), ("distinct metrics", s.metrics["metric"].nunique()),
            ("device", ", ".join(devices) or "not recorded"),
            ("collection modes", "not recorded in the exported metrics: ncu's defaults are --cache-control all "
                                 "(caches flushed before each kernel) and --clock-control base (locked clocks) "
                                 "unless the profiler was told otherwise")]
    return PanelOutput([_kv(rows)], modes="ncu collection modes not recorded in the report")


def _i_kernels(s: ImportSource) -> PanelOutput:
    return PanelOutput([kernel_table(s.kernels, "One row per profiled kernel (friendly metric names)",
                                      with_point=False)], modes="ncu collection modes not recorded in the report")


def _i_figures(s: ImportSource) -> PanelOutput:
    w = s.kernels
    blocks: list[Any] = []
    cap = f"{PROVENANCE['ncu'].label}; collection modes not recorded in the report"
    if "duration_ns" in w.columns and w["duration_ns"].notna().any():
        blocks.append(_figure_block(kernel_duration_figure(w, "Duration per kernel"), "Duration", cap))
    if w[["achieved_occupancy_pct", "theoretical_occupancy_pct"]].notna().any().any():
        blocks.append(_figure_block(kernel_occupancy_figure(w, "Occupancy per kernel"), "Occupancy", cap))
    if not blocks:
        raise Missing("the report has neither durations nor occupancy metrics")
    return PanelOutput(blocks, modes="ncu collection modes not recorded in the report")


def _i_stalls(s: ImportSource) -> PanelOutput:
    w = s.kernels
    cols = [c for c in w.columns if c.startswith("stall_")]
    if not cols or not w[cols].fillna(0).to_numpy().any():
        raise Missing("the report has no warp-stall metrics (the WarpStateStats section was not collected)")
    blocks: list[Any] = [_figure_block(kernel_stall_figure(w, "Warp-stall breakdown per kernel"), "Warp stalls",
                                       f"{PROVENANCE['ncu'].label}; collection modes not recorded in the report; "
                                       "cycles per issued instruction")]
    d = w[w[cols].notna().any(axis=1)]
    totals = d[cols].fillna(0).sum().sort_values(ascending=False)
    top = [c for c in totals.index if totals[c] > 0][:6]
    spec = [("ID", _col("kernel_id")), ("kernel", lambda r: kernel_cell(r.get("kernel_name"), r.get("function")))]
    spec += [(c.removeprefix("stall_").replace("_", " "), _col(c)) for c in top]
    blocks.append(_table(d, spec, caption="Stall cycles per issued instruction, largest reasons"))
    return PanelOutput(blocks, modes="ncu collection modes not recorded in the report")


def _i_rules(s: ImportSource) -> PanelOutput:
    r = s.rules
    if r.empty:
        raise Missing(s.errors.get("rules") or "the file holds no rule findings (a CSV raw page carries none)")
    return PanelOutput(rule_blocks(r), modes="ncu collection modes not recorded in the report")


IMPORT_PANELS: tuple[Panel, ...] = (
    Panel("summary", "Report file", S_OVERVIEW, (), ("ncu",),
          "the file as read by extract.read_any (ncu_report for .ncu-rep, the CSV reader for exports)", _i_summary),
    Panel("kernels", "Per-kernel metrics", S_NCU, ("kernels",), ("ncu",),
          "one row per profiled kernel with friendly metric names (extract.wide)", _i_kernels),
    Panel("figures", "Duration and occupancy per kernel", S_NCU, ("kernels",), ("ncu",),
          "gpu__time_duration and achieved/theoretical occupancy of each kernel", _i_figures),
    Panel("stalls", "Warp stalls per kernel", S_NCU, ("kernels",), ("ncu",),
          "WarpStateStats stall reasons in cycles per issued instruction", _i_stalls),
    Panel("rules", "Nsight Compute rule findings", S_RULES, ("kernels",), ("ncu",),
          "ncu's guided-analysis rules stored in the report (extract.rule_results)", _i_rules),
)

