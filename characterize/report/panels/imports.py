"""Report stage, panels of an imported Nsight Compute file: where the time goes, speed of light
and roofline, the memory chart, time-weighted warp stalls, occupancy, every kernel and
ncu's rule findings ranked.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from characterize.analysis import ncu
from characterize.report.blocks import (
    CLAMP_NOTE,
    Cell,
    DetailsBlock,
    Missing,
    NoteBlock,
    PanelOutput,
    _col,
    _figure_block,
    _isnan,
    _kv,
    _table,
    _txt,
    clamped_any,
    fmt_num,
    fmt_pct,
    kernel_table,
    rank_rules,
    rule_matrix,
    rule_texts,
    rules_beside,
    share_cell,
)
from characterize.report.layout import S_MEM, S_NCU, S_OVERVIEW, S_RULES, S_SOL, S_STALLS, Panel
from characterize.report.plots import (
    kernel_duration_figure,
    kernel_occupancy_figure,
    memory_chart_figure,
    roofline_figure,
    sol_figure,
)
from characterize.report.sources import ImportSource
from characterize.report.views import first_answer, memory_spec, stall_blocks, stall_text
from characterize.units import format_bytes

MODES = "ncu collection modes are not recorded in an exported report: ncu's defaults are --cache-control all " \
        "(caches flushed before each kernel) and --clock-control base (locked clocks) unless the profiler was " \
        "told otherwise"
NOT_RECORDED = "not recorded in the report (ncu's defaults: --cache-control all, --clock-control base)"
#: memory charts drawn in full (the slowest kernels); the rest are in the table
CHARTS = 3


# ------------------------------------------------------------------ helpers
def _measured(s: ImportSource) -> pd.DataFrame:
    """Kernels that carry values (a kernel whose profile failed is named in the summary)."""
    k = s.kview
    return k.drop(index=ncu.without_data(k).index)


def _ranked_rules(s: ImportSource) -> tuple[pd.DataFrame, dict[Any, str], bool]:
    r = s.rules
    if r.empty:
        return pd.DataFrame(), {}, False
    names = dict(zip(s.kview["kernel_id"], s.kview["label"]))
    shares = dict(zip(s.kview["kernel_id"], s.kview["time_share_pct"]))
    weighted = any(not _isnan(v) for v in shares.values())
    return rank_rules(r, "kernel_id", shares if weighted else None), names, weighted


def _beside(s: ImportSource, topic: str) -> list[Any]:
    ranked, names, weighted = _ranked_rules(s)
    return rules_beside(ranked, topic, list(s.kview["kernel_id"]), names, weighted)


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
            ("device", ", ".join(devices) or "not recorded"), ("collection modes", MODES)]
    blocks: list[Any] = [_kv(rows)]
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
    blocks.append(_figure_block(kernel_duration_figure(k, "Where the time goes: duration per kernel"),
                                "Duration per kernel", "linear axis: bar length is time; labels: share of the "
                                "summed kernel duration"))
    d = ncu.slowest(k, len(k))
    spec = [("kernel", lambda r: Cell(r["label"], "kname", detail=_txt(r.get("kernel_name")))),
            ("duration (µs)", lambda r: Cell(fmt_num(r.get("duration_ns", np.nan) / 1e3), "num")),
            ("share of time", lambda r: share_cell(r.get("time_share_pct"))),
            ("bound", lambda r: Cell(_txt(r.get("bound")), "", title=_txt(r.get("bound_why")))),
            ("SM / memory (% of peak)", lambda r: Cell(f"{fmt_pct(r.get('sm_throughput_pct'))} / "
                                                       f"{fmt_pct(r.get('memory_throughput_pct'))}", "num")),
            ("top stalls (cycles per issued instruction, share of its stalls)",
             lambda r: Cell(stall_text(stalls.get(r["kernel_id"])), "")),
            ("DRAM read", _col("dram_bytes_read", format_bytes)), ("DRAM written", _col("dram_bytes_write", format_bytes))]
    blocks.append(_table(d, spec, caption="Kernels by time, longest first"))
    return PanelOutput(blocks)


def _i_sol(s: ImportSource) -> PanelOutput:
    k = _measured(s)
    k = k[k[["sm_throughput_pct", "memory_throughput_pct"]].notna().any(axis=1)]
    blocks: list[Any] = [_figure_block(sol_figure(k, "Speed of light per kernel (% of peak sustained)"),
                                       "Speed of light", f"bars: throughput as % of each unit's peak; below "
                                       f"{ncu.BOUND_PCT:.0f}% (dashed) a unit does not limit the kernel")]
    spec = [("kernel", lambda r: Cell(r["label"], "kname", detail=_txt(r.get("kernel_name")))),
            ("share of time", lambda r: share_cell(r.get("time_share_pct"))),
            ("SM", _col("sm_throughput_pct", fmt_pct)), ("memory", _col("memory_throughput_pct", fmt_pct)),
            ("L1/TEX", _col("l1_throughput_pct", fmt_pct)), ("L2", _col("l2_throughput_pct", fmt_pct)),
            ("DRAM", _col("dram_throughput_pct", fmt_pct)),
            ("bound", lambda r: Cell(_txt(r.get("bound")), "")), ("why", lambda r: Cell(_txt(r.get("bound_why")), ""))]
    blocks.append(_table(k, spec, caption="Throughput as % of peak sustained, and the bound it implies",
                         note=f"bound: both SM and memory below {ncu.BOUND_PCT:.0f}% of peak -> latency (warps wait: "
                              "see the stalls); otherwise the busier of the two, memory naming its busiest unit "
                              "(ncu's SOLBottleneck rule)."))
    lacking = ncu.missing_metrics(k, ncu.SOL_COLUMNS)
    if lacking:
        blocks.append(NoteBlock("Not in this report (shown as –): " + ", ".join(lacking) + "."))
    return PanelOutput(blocks + _beside(s, "sol"))


def _i_roofline(s: ImportSource) -> PanelOutput:
    pts, roofs = ncu.roofline(_measured(s))
    blocks: list[Any] = [_figure_block(roofline_figure(pts, roofs, "Roofline per kernel"), "Roofline",
                                       "ceilings from ncu's own peak counters at the clocks the kernels ran at; "
                                       "FLOP/s = (add + mul + 2 fma) thread instructions per cycle x SM clock")]
    levels = [lv for lv in ("dram", "l2", "l1") if f"{lv}_intensity_flop_per_byte" in pts.columns]
    spec = [("kernel", lambda r: Cell(_txt(r["label"]), "kname")), ("precision", _col("precision", _txt, "")),
            ("achieved FLOP/s", _col("flop_per_s", lambda v: fmt_num(v / 1e9) + " G")),
            ("% of peak", lambda r: Cell(fmt_pct(100 * r["flop_per_s"] / r["peak_flop_per_s"])
                                         if not _isnan(r.get("peak_flop_per_s")) else "–", "num"))]
    for lv in levels:
        spec += [(f"{lv.upper()} intensity (FLOP/B)", _col(f"{lv}_intensity_flop_per_byte")),
                 (f"{lv.upper()} bandwidth (GB/s)", _col(f"{lv}_bytes_per_s", lambda v: fmt_num(v / 1e9)))]
    blocks.append(_table(pts, spec, caption="Achieved work and arithmetic intensity"))
    missing = [lv.upper() for lv in ("l1", "l2") if f"{lv}_intensity_flop_per_byte" not in pts.columns]
    if missing:
        blocks.append(NoteBlock(f"Only the DRAM level is drawn: this report lacks the hierarchical roofline counters "
                                f"for {' and '.join(missing)} (l1tex__t_bytes / lts__t_bytes peaks, collected by the "
                                "SpeedOfLight_Hierarchical*RooflineChart sections)."))
    return PanelOutput(blocks)


def _i_memory(s: ImportSource) -> PanelOutput:
    k = _measured(s)
    top = ncu.slowest(k, CHARTS)
    blocks: list[Any] = []
    charts = [_figure_block(memory_chart_figure(r, f"Memory chart: {r['label']} ({fmt_pct(r.get('time_share_pct'))} "
                                                   "of the time)"),
                            f"Memory chart of {r['label']}", "requests, sectors (32 B) and bytes between the units, "
                            "reads above, writes below; hit rates in the caches")
              for r in top.to_dict("records")]
    blocks.append(charts[0])
    if len(charts) > 1:
        blocks.append(DetailsBlock(f"Memory charts of the next {len(charts) - 1} kernel(s) by time", charts[1:]))
    spec = [("kernel", lambda r: Cell(r["label"], "kname", detail=_txt(r.get("kernel_name")))),
            ("share of time", lambda r: share_cell(r.get("time_share_pct")))] + memory_spec()
    blocks.append(_table(ncu.slowest(k, len(k)), spec, caption="Memory workload per kernel, longest first",
                         note=CLAMP_NOTE if clamped_any(k) else
                         "'no traffic': no sector went through that cache (not a 0% hit rate)."))
    lacking = ncu.missing_metrics(k, ncu.MEMORY_COLUMNS)
    if lacking:
        blocks.append(NoteBlock("Not in this report (shown as –): " + ", ".join(lacking) + "."))
    return PanelOutput(blocks + _beside(s, "memory"))


def _i_stalls(s: ImportSource) -> PanelOutput:
    return PanelOutput(stall_blocks(_measured(s), "Warp stalls weighted by instructions issued") +
                       _beside(s, "stalls"))


def _i_occupancy(s: ImportSource) -> PanelOutput:
    w = _measured(s)
    if w[["achieved_occupancy_pct", "theoretical_occupancy_pct"]].isna().all().all():
        raise Missing("the report has no occupancy metrics (the Occupancy section was not collected)")
    return PanelOutput([_figure_block(kernel_occupancy_figure(w, "Occupancy per kernel"), "Occupancy",
                                      "achieved (sm__warps_active) against theoretical (occupancy calculator)")] +
                       _beside(s, "occupancy"))


def _i_kernels(s: ImportSource) -> PanelOutput:
    return PanelOutput([kernel_table(s.kview, "One row per profiled kernel", with_point=False)])


def _i_rules(s: ImportSource) -> PanelOutput:
    r = s.rules
    if r.empty:
        raise Missing(s.errors.get("rules") or "the file holds no rule findings (a CSV raw page carries none)")
    ranked, names, weighted = _ranked_rules(s)
    if ranked.empty:
        return PanelOutput([NoteBlock(f"ncu's {len(r)} rule result(s) hold no finding (all OK or informational).")])
    ids = [i for i in s.kview["kernel_id"] if any(i in c for c in ranked["cells"])]
    other = int((~r["message_type"].isin(("ERROR", "WARNING", "OPTIMIZATION"))).sum())
    blocks: list[Any] = [rule_matrix(ranked, ids, names, f"{len(ranked)} finding(s) x {len(ids)} kernel(s), "
                                                          "ranked", weighted)]
    if other:
        blocks.append(NoteBlock(f"{other} result(s) of type OK or informational are not findings and are left out."))
    blocks.append(rule_texts(ranked, names))
    return PanelOutput(blocks)


def _modes(builder: Any) -> Any:
    """Every panel of an imported report says the same about collection modes."""
    def wrapped(s: ImportSource) -> PanelOutput:
        out = builder(s)
        out.modes = out.modes or NOT_RECORDED
        return out
    return wrapped


IMPORT_PANELS: tuple[Panel, ...] = (
    Panel("summary", "Report file", S_OVERVIEW, (), ("ncu",),
          "the file as read by extract.read_any (ncu_report for .ncu-rep, the CSV reader for exports)", _modes(_i_summary)),
    Panel("time", "Where the time goes", S_OVERVIEW, ("kernels",), ("ncu",),
          "gpu__time_duration per kernel, its share of the summed duration, the bound from the speed of light and "
          "each kernel's largest stall (analysis.ncu)", _modes(_i_time)),
    Panel("sol", "Speed of light", S_SOL, ("kernels", "sol"), ("ncu",),
          "sm__throughput, gpu__compute_memory_throughput, l1tex__throughput, lts__throughput and "
          "gpu__dram_throughput as % of peak sustained; the bound after ncu's SOLBottleneck rule", _modes(_i_sol)),
    Panel("roofline", "Roofline", S_SOL, ("kernels", "roofline"), ("ncu",),
          "ncu's roofline counters (FP thread instructions per cycle, peak FP and memory bandwidth per cycle, "
          "clocks) as achieved and peak FLOP/s and bytes/s", _modes(_i_roofline)),
    Panel("memory", "Memory chart", S_MEM, ("kernels", "memory"), ("ncu",),
          "l1tex__t_requests/sectors (global loads and stores, local spills), l1tex__m_* bytes to and from L2, "
          "lts__t_sectors_srcunit_tex reads and writes, dram__bytes_read/write and the sector hit rates", _modes(_i_memory)),
    Panel("stalls", "Warp stalls weighted by time", S_STALLS, ("kernels", "stalls"), ("ncu",),
          "WarpStateStats stall reasons (cycles per issued instruction) x smsp__inst_issued.sum: warp-cycles "
          "stalled per reason and kernel (analysis.ncu.weighted_stalls)", _modes(_i_stalls)),
    Panel("occupancy", "Occupancy", S_STALLS, ("kernels",), ("ncu",),
          "achieved and theoretical occupancy of each kernel", _modes(_i_occupancy)),
    Panel("kernels", "Per-kernel metrics", S_NCU, ("kernels",), ("ncu",),
          "one row per profiled kernel (analysis.ncu.kernel_summary over the tidy metrics)", _modes(_i_kernels)),
    Panel("rules", "Nsight Compute rule findings, ranked", S_RULES, ("kernels",), ("ncu",),
          "ncu's guided-analysis rules stored in the report (extract.rule_results) as a finding x kernel matrix",
          _modes(_i_rules)),
)
