"""Report stage, the Nsight Compute panels: speed of light, roofline, the memory chart, warp
stalls, occupancy, every kernel and ncu's rule findings, written once for both kinds of
source and parameterized by what one row is (its grain):

- KERNELS: an imported report, one row per profiled kernel (analysis.ncu.kernel_summary);
- POINTS: a stored run, one row per (variant, dataset) point, the mean launch of its
  lookup kernels (analysis.ncu.per_point), grouped by the ncu collection modes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pandas as pd

from characterize.analysis import ncu
from characterize.report.blocks import (
    CLAMP_NOTE,
    POINT_COLS,
    Cell,
    DetailsBlock,
    Missing,
    NoteBlock,
    PanelOutput,
    _col,
    _figure_block,
    _isnan,
    _order,
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
from characterize.report.layout import (
    _PROFILE_HINT,
    S_MEM,
    S_NCU,
    S_RULES,
    S_SOL,
    S_STALLS,
    Panel,
    _points_missing,
)
from characterize.report.plots import (
    dram_figure,
    hit_rate_figure,
    kernel_occupancy_figure,
    memory_chart_figure,
    roofline_figure,
    sol_figure,
)
from characterize.report.views import memory_spec, stall_blocks

#: an exported report does not record how ncu collected it
NOT_RECORDED = "not recorded in the report (ncu's defaults: --cache-control all, --clock-control base)"
#: memory charts drawn per group (the slowest rows); the rest are in the table
CHARTS = 3


@dataclass(frozen=True)
class Group:
    """Rows collected under one set of ncu modes: the mode text and the frame (one row per
    kernel or point, with `label` and `kernel_id`)."""

    modes: str
    cache_control: str
    frame: pd.DataFrame


@dataclass(frozen=True)
class Grain:
    """What one row of the Nsight Compute panels is, and where a source keeps those rows.

    name: 'kernel' or 'point'; rows: the row noun in captions; lead: the table columns
    that name a row; groups: source -> [Group] (one per collection mode); ranked: source
    -> (ranked findings, their columns, column names, weighted by time); modes: the
    collection modes a panel states; summary_figures: draw hit-rate and DRAM bar charts
    (one bar pair per row: a run's few points, not a report's many kernels)."""

    name: str
    rows: str
    lead: tuple[tuple[str, Callable[[dict], Cell]], ...]
    groups: Callable[[Any], list[Group]]
    ranked: Callable[[Any], tuple[pd.DataFrame, list[Any], dict[Any, str], bool]]
    modes: Callable[[Any], str]
    summary_figures: bool


# ------------------------------------------------------------------- kernels
def _kernel_groups(s: Any) -> list[Group]:
    """Kernels that carry values (a kernel whose profile failed is named in the summary)."""
    k = s.kview
    return [Group(NOT_RECORDED, "all", k.drop(index=ncu.without_data(k).index))]


def _kernel_rules(s: Any) -> tuple[pd.DataFrame, list[Any], dict[Any, str], bool]:
    r = s.rules
    if r.empty:
        return pd.DataFrame(), [], {}, False
    names = dict(zip(s.kview["kernel_id"], s.kview["label"]))
    shares = dict(zip(s.kview["kernel_id"], s.kview["time_share_pct"]))
    weighted = any(not _isnan(v) for v in shares.values())
    return rank_rules(r, "kernel_id", shares if weighted else None), list(s.kview["kernel_id"]), names, weighted


KERNELS = Grain("kernel", "kernel(s)",
                (("kernel", lambda r: Cell(_txt(r.get("label")), "kname", detail=_txt(r.get("kernel_name")))),),
                _kernel_groups, _kernel_rules, lambda s: NOT_RECORDED, summary_figures=False)


# -------------------------------------------------------------------- points
def _point_groups(s: Any) -> list[Group]:
    """Per collection mode, the per-point means of the lookup kernels (computed once per
    source: every panel reads them)."""
    cached = s.__dict__.get("_ncu_groups")
    if cached is None:
        k = s.lookup_view
        if k.empty:
            raise Missing("no lookup kernels among the profiled kernels")
        k = k.copy()
        for c in ("cache_control", "clock_control"):
            if c not in k.columns:
                k[c] = ""
            k[c] = k[c].fillna("").astype(str)
        cached = s.__dict__["_ncu_groups"] = [
            Group(s.ncu_mode(cache or None, clock or None), cache, _order(ncu.per_point(g)))
            for (cache, clock), g in k.groupby(["cache_control", "clock_control"], sort=True)]
    return cached


def _point_rules(s: Any) -> tuple[pd.DataFrame, list[Any], dict[Any, str], bool]:
    """ncu's findings over every point of the run, ranked."""
    r = s.rules
    if r.empty:
        return pd.DataFrame(), [], {}, False
    points = list(dict.fromkeys(_order(r[["variant", "dataset", "point"]].drop_duplicates())["point"]))
    return rank_rules(r, "point"), points, {p: p for p in points}, False


POINTS = Grain("point", "point(s)", tuple(POINT_COLS), _point_groups, _point_rules,
               lambda s: "; ".join(g.modes for g in _point_groups(s)), summary_figures=True)


# -------------------------------------------------------------------- panels
def _beside(s: Any, g: Grain, topic: str) -> list[Any]:
    ranked, cols, names, weighted = g.ranked(s)
    return rules_beside(ranked, topic, cols, names, weighted)


def _titled(g: Grain, group: Group, groups: list[Group], text: str) -> str:
    """A caption, naming the collection modes when a run has several."""
    return f"{text} — {group.modes}" if g.name == "point" and len(groups) > 1 else text


def _count_cols(g: Grain) -> list[tuple[str, Callable[[dict], Cell]]]:
    """A point is a mean over launches; a kernel has its share of the report's time."""
    if g.name == "point":
        return [("launches", _col("kernels"))]
    return [("share of time", lambda r: share_cell(r.get("time_share_pct")))]


def sol(s: Any, g: Grain) -> PanelOutput:
    blocks: list[Any] = []
    groups = g.groups(s)
    for grp in groups:
        k = grp.frame[grp.frame[["sm_throughput_pct", "memory_throughput_pct"]].notna().any(axis=1)] \
            if {"sm_throughput_pct", "memory_throughput_pct"} <= set(grp.frame.columns) else grp.frame.iloc[0:0]
        if k.empty:
            blocks.append(NoteBlock(f"No speed-of-light metrics ({grp.modes})."))
            continue
        blocks.append(_figure_block(sol_figure(k, f"Speed of light per {g.name} (% of peak sustained)"),
                                    "Speed of light", f"bars: throughput as % of each unit's peak"
                                    f"{', mean launch per point' if g.name == 'point' else ''}; below "
                                    f"{ncu.BOUND_PCT:.0f}% (dashed) a unit does not limit the kernel"))
        spec = [*g.lead, *_count_cols(g),
                ("duration (µs, under ncu)", lambda r: Cell(fmt_num(r.get("duration_ns", np.nan) / 1e3), "num")),
                ("SM", _col("sm_throughput_pct", fmt_pct)), ("memory", _col("memory_throughput_pct", fmt_pct)),
                ("L1/TEX", _col("l1_throughput_pct", fmt_pct)), ("L2", _col("l2_throughput_pct", fmt_pct)),
                ("DRAM", _col("dram_throughput_pct", fmt_pct)),
                ("bound", lambda r: Cell(_txt(r.get("bound")), "", title=_txt(r.get("bound_why"))))]
        blocks.append(_table(k, spec, caption=_titled(g, grp, groups, f"Throughput as % of peak sustained per {g.name}"),
                             note=f"bound: both SM and memory below {ncu.BOUND_PCT:.0f}% of peak -> latency-bound "
                                  "(warps wait: see the stalls); otherwise the busier of the two, memory naming its "
                                  "busiest unit (ncu's SOLBottleneck rule); hover a bound for why. Durations under "
                                  "the profiler are not latencies."))
        lacking = ncu.missing_metrics(k, ncu.SOL_COLUMNS)
        if lacking:
            blocks.append(NoteBlock("Not in this report (shown as –): " + ", ".join(lacking) + "."))
    return PanelOutput(blocks + _beside(s, g, "sol"), modes=g.modes(s))


def roofline(s: Any, g: Grain) -> PanelOutput:
    blocks: list[Any] = []
    groups = g.groups(s)
    for grp in groups:
        pts, roofs = ncu.roofline(grp.frame)
        if pts.empty:
            continue
        blocks.append(_figure_block(roofline_figure(pts, roofs, f"Roofline per {g.name}"), "Roofline",
                                    "ceilings from ncu's own peak counters at the clocks the kernels ran at; FLOP/s = "
                                    "(add + mul + 2 fma) thread instructions per cycle x SM clock"))
        levels = [lv for lv in ("dram", "l2", "l1") if f"{lv}_intensity_flop_per_byte" in pts.columns]
        spec = [(g.name, lambda r: Cell(_txt(r["label"]), "kname")), ("precision", _col("precision", _txt, "")),
                ("achieved GFLOP/s", _col("flop_per_s", lambda v: fmt_num(v / 1e9))),
                ("% of peak", lambda r: Cell(fmt_pct(100 * r["flop_per_s"] / r["peak_flop_per_s"])
                                             if not _isnan(r.get("peak_flop_per_s")) else "–", "num"))]
        for lv in levels:
            spec += [(f"{lv.upper()} intensity (FLOP/B)", _col(f"{lv}_intensity_flop_per_byte")),
                     (f"{lv.upper()} bandwidth (GB/s)", _col(f"{lv}_bytes_per_s", lambda v: fmt_num(v / 1e9)))]
        blocks.append(_table(pts, spec, caption=_titled(g, grp, groups, "Achieved work and arithmetic intensity")))
        missing = [lv.upper() for lv in ("l1", "l2") if f"{lv}_intensity_flop_per_byte" not in pts.columns]
        if missing:
            blocks.append(NoteBlock(f"Only the DRAM level is drawn: the report lacks the hierarchical roofline "
                                    f"counters for {' and '.join(missing)} (l1tex__t_bytes / lts__t_bytes peaks, "
                                    "collected by the SpeedOfLight_Hierarchical*RooflineChart sections)."))
    if not blocks:
        raise Missing(f"no {g.name} executed floating-point work the roofline counters saw")
    return PanelOutput(blocks, modes=g.modes(s))


def memory(s: Any, g: Grain) -> PanelOutput:
    blocks: list[Any] = []
    groups = g.groups(s)
    for grp in groups:
        k = grp.frame
        if g.name == "point" and grp.cache_control != "none":
            blocks.append(NoteBlock(f"{grp.modes}: L2 pinning is invisible under this mode: caches were flushed "
                                    "before each kernel."))
        top = ncu.slowest(k, CHARTS).to_dict("records")
        mean = " (mean launch)" if g.name == "point" else ""
        charts = [_figure_block(memory_chart_figure(r, f"Memory chart: {r['label']}{mean}" + (
            f" ({fmt_pct(r.get('time_share_pct'))} of the time)" if g.name == "kernel" else "")),
            f"Memory chart of {r['label']}", "requests, sectors (32 B) and bytes between the units, reads above, "
            "writes below; hit rates in the caches") for r in top]
        if charts:
            blocks.append(charts[0])
        if len(charts) > 1:
            blocks.append(DetailsBlock(f"Memory charts of the next {len(charts) - 1} {g.rows} by duration",
                                       charts[1:]))
        if g.summary_figures:
            rates = ["l1_hit_rate_pct", "l2_hit_rate_pct"]
            if set(rates) <= set(k.columns) and k[rates].notna().any().any():
                blocks.append(_figure_block(hit_rate_figure(k, "L1 and L2 hit rates (lookup kernels)"), "Hit rates",
                                            "sector hit rates, mean launch per point"))
            if {"dram_bytes_read", "dram_bytes_write"} <= set(k.columns) and \
                    k[["dram_bytes_read", "dram_bytes_write"]].notna().any().any():
                blocks.append(_figure_block(dram_figure(k, "DRAM bytes read and written (lookup kernels)"),
                                            "DRAM bytes", "per launch, mean over the profiled launches"))
        spec = [*g.lead, *_count_cols(g)] + memory_spec() + [
            ("duration (µs, under ncu)", lambda r: Cell(fmt_num(r.get("duration_ns", np.nan) / 1e3), "num"))]
        blocks.append(_table(ncu.slowest(k, len(k)), spec,
                             caption=_titled(g, grp, groups, f"Memory workload per {g.name}, longest first"),
                             note=CLAMP_NOTE if clamped_any(k) else
                             "'no traffic': no sector went through that cache (not a 0% hit rate)."))
        lacking = ncu.missing_metrics(k, ncu.MEMORY_COLUMNS)
        if lacking:
            blocks.append(NoteBlock("Not in this report (shown as –): " + ", ".join(lacking) + "."))
    return PanelOutput(blocks + _beside(s, g, "memory"), modes=g.modes(s))


def stalls(s: Any, g: Grain) -> PanelOutput:
    blocks: list[Any] = []
    for grp in g.groups(s):
        try:
            blocks += stall_blocks(grp.frame, f"Warp stalls weighted by instructions issued ({g.rows})")
        except Missing:
            blocks.append(NoteBlock(f"No warp-stall metrics ({grp.modes}): the WarpStateStats section was not "
                                    "collected."))
    return PanelOutput(blocks + _beside(s, g, "stalls"), modes=g.modes(s))


def occupancy(s: Any, g: Grain) -> PanelOutput:
    blocks: list[Any] = []
    groups = g.groups(s)
    for grp in groups:
        k = grp.frame
        if k[["achieved_occupancy_pct", "theoretical_occupancy_pct"]].isna().all().all():
            blocks.append(NoteBlock(f"No occupancy metrics ({grp.modes}): the Occupancy section was not collected."))
            continue
        blocks.append(_figure_block(kernel_occupancy_figure(k, f"Occupancy per {g.name}"), "Occupancy",
                                    "achieved (sm__warps_active) against theoretical (occupancy calculator)" +
                                    (", mean over the profiled launches of each point" if g.name == "point" else "")))
        spec = [*g.lead, *_count_cols(g), ("registers/thread", _col("registers_per_thread")),
                ("theoretical", _col("theoretical_occupancy_pct", fmt_pct)),
                ("achieved", _col("achieved_occupancy_pct", fmt_pct))]
        blocks.append(_table(k, spec, caption=_titled(g, grp, groups, f"Occupancy per {g.name}")))
    return PanelOutput(blocks + _beside(s, g, "occupancy"), modes=g.modes(s))


def kernels(s: Any, g: Grain) -> PanelOutput:
    if g.name == "point":
        return PanelOutput([kernel_table(_order(s.kview), "Every profiled kernel (lookup kernels and L2 pre-pass "
                                         "kernels)")], modes=g.modes(s))
    return PanelOutput([kernel_table(s.kview, "One row per profiled kernel", with_point=False)], modes=g.modes(s))


def rules(s: Any, g: Grain) -> PanelOutput:
    blocks: list[Any] = []
    if g.name == "point":
        if not any(p.get("status") == "ok" and p.get("report") for p in s.profile_points):
            raise Missing(_points_missing(s, "profile", _PROFILE_HINT))
        blocks += [NoteBlock(e, "warning") for e in s.rule_errors]
    r = s.rules
    if r.empty:
        if g.name == "kernel":
            raise Missing(s.errors.get("rules") or "the file holds no rule findings (a CSV raw page carries none)")
        return PanelOutput(blocks + [NoteBlock("The reports hold no rule findings.")], modes=g.modes(s))
    ranked, cols, names, weighted = g.ranked(s)
    if ranked.empty:
        blocks.append(NoteBlock(f"ncu's {len(r)} rule result(s) hold no finding (all OK or informational)."))
        return PanelOutput(blocks, modes=g.modes(s))
    used = [c for c in cols if any(c in cells for cells in ranked["cells"])]
    what = "kernel(s)" if g.name == "kernel" else "point(s)"
    blocks.append(rule_matrix(ranked, used, names, f"{len(ranked)} finding(s) x {len(used)} {what}, ranked" +
                              (" (each point: every kernel of its report)" if g.name == "point" else ""), weighted))
    other = int((~r["message_type"].isin(("ERROR", "WARNING", "OPTIMIZATION"))).sum())
    if other:
        blocks.append(NoteBlock(f"{other} result(s) of type OK or informational are not findings and are left out."))
    blocks.append(rule_texts(ranked, names))
    return PanelOutput(blocks, modes=g.modes(s))


# ----------------------------------------------------------- the panel list
def ncu_panels(g: Grain) -> tuple[Panel, ...]:
    """The Nsight Compute panels for rows of grain `g` (needs differ: a run checks it was
    profiled; a report, which section it carries)."""
    base = ("profile",) if g.name == "point" else ("kernels",)
    rows = "the lookup kernels, mean launch per point" if g.name == "point" else "each kernel"

    def panel(pid: str, title: str, section: str, needs: tuple[str, ...], how: str,
              build: Callable[[Any, Grain], PanelOutput]) -> Panel:
        return Panel(pid, title, section, base + needs, ("ncu",), how, lambda s: build(s, g))

    return (
        panel("sol", "Speed of light", S_SOL, ("sol",),
              f"sm__throughput, gpu__compute_memory_throughput, l1tex__throughput, lts__throughput and "
              f"gpu__dram_throughput as % of peak sustained of {rows}; the bound after ncu's SOLBottleneck rule", sol),
        panel("roofline", "Roofline", S_SOL, ("roofline",),
              f"ncu's roofline counters (FP thread instructions per cycle, peak FP and memory bandwidth per cycle, "
              f"clocks) of {rows} as achieved and peak FLOP/s and bytes/s", roofline),
        panel("memory", "Memory chart, hit rates and DRAM traffic", S_MEM, ("memory",) if g.name == "kernel" else (),
              f"l1tex__t_requests/sectors (global loads and stores, local spills), l1tex__m_* bytes to and from L2, "
              f"lts__t_sectors_srcunit_tex reads and writes, dram__bytes_read/write and the sector hit rates "
              f"(clamped at 100%, 'no traffic' apart) of {rows}", memory),
        panel("stalls", "Warp stalls weighted by time", S_STALLS, ("stalls",) if g.name == "kernel" else (),
              f"WarpStateStats stall reasons (cycles per issued instruction) x smsp__inst_issued.sum: warp-cycles "
              f"stalled per reason of {rows} (analysis.ncu.weighted_stalls)", stalls),
        panel("occupancy", "Achieved vs theoretical occupancy", S_STALLS, (),
              f"sm__warps_active (achieved) and sm__maximum_warps_per_active_cycle_pct (theoretical) of {rows}",
              occupancy),
        panel("kernels", "Every profiled kernel", S_NCU, (),
              "one row per profiled kernel (analysis.ncu.kernel_summary over the tidy metrics)", kernels),
        panel("rules", "Nsight Compute rule findings, ranked", S_RULES, (),
              "ncu's own guided-analysis rules stored in each report (extract.rule_results) as a finding x "
              f"{g.name} matrix", rules),
    )
