"""Report stage, the Nsight Compute panels: speed of light, the bandwidth roofline (and the
FP roofline where kernels do FP work worth one), the memory chart, warp stalls, occupancy,
every kernel and ncu's rule findings, written once for both kinds of source and
parameterized by what one row is (its grain):

- KERNELS: an imported report, one row per profiled kernel (analysis.ncu.kernel_summary);
- POINTS: a stored run, one row per (variant, dataset) point, the mean launch of its
  lookup kernels (analysis.ncu.per_point), grouped by the ncu collection modes.

Every time, byte, instruction and stall quantity is per table (analysis.ncu.per_table: a
batched launch such as tbe's is divided by the tables it covers) and its column says so;
an exported report records no table count, so its values are per launch, while a report
that a run's profile points sit beside (runs/x/ncu/R.ncu-rep) is per table like the run
(KERNELS_PER_TABLE). Bytes are
written in binary units (KiB, MiB, GiB, TiB; bandwidths in GiB/s and TiB/s), as
characterize.units.format_bytes writes them everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
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
    TableBlock,
    as_text,
    clamped_any,
    column_cell,
    figure_block,
    fmt_num,
    fmt_pct,
    is_na,
    kernel_table,
    ordered_rows,
    rank_rules,
    rule_label,
    rule_matrix,
    rule_texts,
    rules_beside,
    share_cell,
    table_block,
)
from characterize.report.layout import (
    PROFILE_HINT,
    S_MEM,
    S_NCU,
    S_RULES,
    S_SOL,
    S_STALLS,
    Panel,
    points_missing,
)
from characterize.report.plots import (
    bandwidth_roofline_figure,
    dram_figure,
    format_rate,
    hit_rate_figure,
    kernel_occupancy_figure,
    memory_chart_figure,
    roofline_figure,
    sol_figure,
    weighted_stall_figure,
)
from characterize.report.views import memory_spec, stall_text

#: the byte convention of these panels, said once where bytes are shown
BYTES_NOTE = "Bytes in binary units: KiB, MiB, GiB, TiB = 2^10, 2^20, 2^30, 2^40 bytes (bandwidths in GiB/s, TiB/s)."
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
    scope: str = "per table"   # what a time, byte, instruction or stall quantity is counted over


# ------------------------------------------------------------ per table
def _tables(s: Any) -> tuple[list[dict], Any]:
    """What tells a source's tables per launch: its profile points and its workload's T
    (the run's meta.json experiment; for a report inside a run directory, the points beside
    it and their workload); an exported report has neither."""
    points = list(getattr(s, "profile_points", None) or [])
    meta = getattr(s, "meta", None) or {}
    return points, ((meta.get("experiment") or {}).get("workload") or {}).get("T") or \
        getattr(s, "workload_tables", None)


def _per_table(s: Any, k: pd.DataFrame) -> pd.DataFrame:
    """The kernels of a source, per table (analysis.ncu.per_table)."""
    points, tables = _tables(s)
    return ncu.per_table(k, points, tables)


def _per_launch_note(s: Any, k: pd.DataFrame) -> list[Any]:
    """Say which kernels stay per launch: batched variants whose table count nothing records."""
    points, tables = _tables(s)
    left = ncu.batched_unknown(k, points, tables)
    return [NoteBlock(f"{', '.join(left)}: one launch covers every table of a batch, and this source records no "
                      "table count, so its values are per launch, not per table.", "warning")] if left else []


def _batched_note(k: pd.DataFrame, g: "Grain") -> list[Any]:
    """Name the rows whose launch covers several tables and what they were divided by."""
    if g.name != "point" or "tables_per_launch" not in k.columns:
        return []
    many = k[pd.to_numeric(k["tables_per_launch"], errors="coerce") > 1]
    if many.empty:
        return []
    names = ", ".join(dict.fromkeys(f"{r['label']} ({r['tables_per_launch']:.0f} tables)"
                                    for r in many.to_dict("records")))
    return [NoteBlock(f"Batched launches divided by their tables: {names}. Their times, bytes, instructions and "
                      "stall cycles are per table, like every other row; rates and % of peak are the launch's.")]


# ------------------------------------------------------------------- kernels
def _kernel_groups(s: Any) -> list[Group]:
    """Kernels that carry values (a kernel whose profile failed is named in the summary)."""
    k = s.kview
    return [Group(getattr(s, "recorded_modes", None) or NOT_RECORDED, "all",
                  _per_table(s, k.drop(index=ncu.without_data(k).index)))]


def _capped_rules(s: Any) -> pd.DataFrame:
    """The source's rule findings, each estimate capped by its kernel's speed-of-light
    headroom (analysis.ncu.cap_speedups), computed once per source."""
    cached = s.__dict__.get("_ncu_capped_rules")
    if cached is None:
        r = s.rules
        cached = s.__dict__["_ncu_capped_rules"] = ncu.cap_speedups(r, s.kview) if not r.empty else r
    return cached


def _kernel_rules(s: Any) -> tuple[pd.DataFrame, list[Any], dict[Any, str], bool]:
    r = _capped_rules(s)
    if r.empty:
        return pd.DataFrame(), [], {}, False
    names = dict(zip(s.kview["kernel_id"], s.kview["label"]))
    shares = dict(zip(s.kview["kernel_id"], s.kview["time_share_pct"]))
    weighted = any(not is_na(v) for v in shares.values())
    ranked = rank_rules(r, "kernel_id", shares if weighted else None)
    return _mark_ranked(ranked, r, "kernel_id"), list(s.kview["kernel_id"]), names, weighted


KERNELS = Grain("kernel", "kernel(s)",
                (("kernel", lambda r: Cell(as_text(r.get("label")), "kname", detail=as_text(r.get("kernel_name")))),),
                _kernel_groups, _kernel_rules, lambda s: getattr(s, "recorded_modes", None) or NOT_RECORDED,
                summary_figures=False, scope="per launch")
#: a report inside a run directory: its points say what each launch covered, so per table like the run
KERNELS_PER_TABLE = replace(KERNELS, scope="per table")


# -------------------------------------------------------------------- points
def _point_groups(s: Any) -> list[Group]:
    """Per collection mode, the per-point means of the lookup kernels (computed once per
    source: every panel reads them)."""
    cached = s.__dict__.get("_ncu_groups")
    if cached is None:
        k = s.lookup_view
        if k.empty:
            raise Missing("no lookup kernels among the profiled kernels")
        k = _per_table(s, k)
        for c in ("cache_control", "clock_control"):
            if c not in k.columns:
                k[c] = ""
            k[c] = k[c].fillna("").astype(str)
        cached = s.__dict__["_ncu_groups"] = [
            Group(s.ncu_mode(cache or None, clock or None), cache, ordered_rows(ncu.per_point(g)))
            for (cache, clock), g in k.groupby(["cache_control", "clock_control"], sort=True)]
    return cached


def _own_kernels(r: pd.DataFrame, k: pd.DataFrame) -> pd.DataFrame:
    """The findings of each point's own kernels: points that share one report (one ncu
    process profiled a variant's datasets) each read every kernel's rules; a kernel the
    profiled kernels place under another point is dropped here (one not among them stays)."""
    cols = ["report", "kernel_id", "variant", "dataset"]
    if r.empty or k.empty or not set(cols) <= set(k.columns) or not set(cols) <= set(r.columns):
        return r
    mine = set(map(tuple, k[cols].astype(str).to_numpy()))
    placed = {t[:2] for t in mine}
    keep = [(rep, kid) not in placed or (rep, kid, v, d) in mine
            for rep, kid, v, d in r[cols].astype(str).to_numpy()]
    return r[keep]


def _point_rules(s: Any) -> tuple[pd.DataFrame, list[Any], dict[Any, str], bool]:
    """ncu's findings over every point of the run (each point's own kernels), capped, ranked."""
    r = _own_kernels(_capped_rules(s), s.kview)
    if r.empty:
        return pd.DataFrame(), [], {}, False
    points = list(dict.fromkeys(ordered_rows(r[["variant", "dataset", "point"]].drop_duplicates())["point"]))
    return _mark_ranked(rank_rules(r, "point"), r, "point"), points, {p: p for p in points}, False


# ------------------------------------------------------------- capped estimates
def _caps(r: pd.DataFrame, column: str) -> dict[tuple[str, str, Any], tuple[float, float, str]]:
    """(section, finding, column) -> (ncu's largest estimate, the capped one shown, why)
    where a cap lowered what the matrix shows."""
    if r.empty or "capped" not in r.columns or not r["capped"].any():
        return {}
    f = r.assign(_finding=[rule_label(x) for x in r.to_dict("records")])
    out = {}
    for (section, finding, col), g in f.groupby(["section", "_finding", column], sort=False):
        if not g["capped"].any():
            continue
        raw, shown = g["ncu_speedup"].max(), g["estimated_speedup"].max()
        if not is_na(raw) and raw > shown + 0.5:
            out[(section, finding, col)] = (float(raw), float(shown), str(g.loc[g["capped"], "cap_why"].iloc[0]))
    return out


def _cap_title(raw: float, shown: float, why: str) -> str:
    gain = 100 * (100 / (100 - shown) - 1) if shown < 100 else float("inf")
    return (f"ncu estimated {raw:.0f}%; capped at {shown:.0f}%: {why}, so the kernel can save at most {shown:.0f}% "
            f"of its time (at most {gain:.0f}% faster) while doing the same work")


def _mark_ranked(ranked: pd.DataFrame, r: pd.DataFrame, column: str) -> pd.DataFrame:
    """The ranked findings with their capped cells kept (`caps`) and the largest estimate's
    type saying when it was capped."""
    if ranked.empty:
        return ranked
    caps = _caps(r, column)
    ranked = ranked.copy()
    ranked["caps"] = [{c: v for (sec, fnd, c), v in caps.items() if sec == x["section"] and fnd == x["finding"]}
                      for x in ranked.to_dict("records")]
    types = []
    for x in ranked.to_dict("records"):
        best = x["best_speedup_pct"]
        hit = [raw for c, (raw, shown, _) in x["caps"].items() if not is_na(best) and abs(shown - best) < 0.5]
        t = x["speedup_type"] or "?"
        types.append(f"{t}, capped from {max(hit):.0f}%" if hit else x["speedup_type"])
    ranked["speedup_type"] = types
    return ranked


def _marked(blocks: list[Any], ranked: pd.DataFrame, names: dict[Any, str]) -> list[Any]:
    """Mark every capped cell of the rule matrices in `blocks` (nested ones too) with '†'
    and ncu's own figure on hover, and add a note under each matrix that has one."""
    if ranked is None or ranked.empty or "caps" not in ranked.columns:
        return blocks
    caps = {(x["section"], x["finding"]): x["caps"] for x in ranked.to_dict("records") if x["caps"]}
    header = {v: c for c, v in names.items()}
    out: list[Any] = []
    for b in blocks:
        if isinstance(b, DetailsBlock):
            b.blocks = _marked(b.blocks, ranked, names)
        out.append(b)
        if not (isinstance(b, TableBlock) and "largest est. speedup" in b.columns and caps):
            continue
        marked = 0
        for row in b.rows:
            mine = caps.get((row[1].text, row[0].text), {})
            for j, h in enumerate(b.columns):
                if h in header and header[h] in mine and row[j].text:
                    row[j].text += " †"
                    row[j].title = _cap_title(*mine[header[h]])
                    marked += 1
        if marked:
            out.append(NoteBlock("† capped: ncu estimates each rule alone, blind to how close the kernel already is "
                                 "to a unit's peak. A kernel at x% of a unit's peak can run at most 100/x times as "
                                 "fast while that unit does the same work (a gain of 100/x - 1), so it can save at "
                                 "most 100 - x% of its time, the unit of ncu's estimates; each estimate is capped by "
                                 "the busiest unit its rule leans on (memory stalls: L1/TEX, L2, DRAM; issue "
                                 "stalls: the SMs; occupancy and launch shape: every unit). Rules that cut work "
                                 "(access patterns, instruction mix) are not capped. Hover a cell for ncu's own "
                                 "figure."))
    return out


POINTS = Grain("point", "point(s)", tuple(POINT_COLS), _point_groups, _point_rules,
               lambda s: "; ".join(g.modes for g in _point_groups(s)), summary_figures=True)


# -------------------------------------------------------------------- panels
def _beside(s: Any, g: Grain, topic: str) -> list[Any]:
    ranked, cols, names, weighted = g.ranked(s)
    return _marked(rules_beside(ranked, topic, cols, names, weighted), ranked, names)


def _titled(g: Grain, group: Group, groups: list[Group], text: str) -> str:
    """A caption, naming the collection modes when a run has several."""
    return f"{text} — {group.modes}" if g.name == "point" and len(groups) > 1 else text


def _count_cols(g: Grain) -> list[tuple[str, Callable[[dict], Cell]]]:
    """A point is a mean over launches, each covering some tables; a kernel has its share of
    the report's time."""
    if g.name == "point":
        return [("launches", column_cell("kernels")), ("tables / launch", column_cell("tables_per_launch"))]
    return [("share of time", lambda r: share_cell(r.get("time_share_pct")))]


def _duration(g: Grain) -> tuple[str, Callable[[dict], Cell]]:
    return (f"duration {g.scope} (µs, under ncu)",
            lambda r: Cell(fmt_num(r.get("duration_ns", np.nan) / 1e3), "num"))


def sol(s: Any, g: Grain) -> PanelOutput:
    blocks: list[Any] = []
    groups = g.groups(s)
    for grp in groups:
        k = grp.frame[grp.frame[["sm_throughput_pct", "memory_throughput_pct"]].notna().any(axis=1)] \
            if {"sm_throughput_pct", "memory_throughput_pct"} <= set(grp.frame.columns) else grp.frame.iloc[0:0]
        if k.empty:
            blocks.append(NoteBlock(f"No speed-of-light metrics ({grp.modes})."))
            continue
        blocks.append(figure_block(sol_figure(k, f"Speed of light per {g.name} (% of peak sustained)"),
                                   "Speed of light", f"bars: throughput as % of each unit's peak"
                                   f"{', mean launch per point' if g.name == 'point' else ''}; below "
                                   f"{ncu.BOUND_PCT:.0f}% (dashed) a unit does not limit the kernel"))
        bw, _ = ncu.bandwidth(k)
        dram = dict(zip(bw.loc[bw["level"] == "DRAM", "kid"], bw.loc[bw["level"] == "DRAM", "bytes_per_s"])) \
            if not bw.empty else {}
        spec = [*g.lead, *_count_cols(g), _duration(g),
                ("SM", column_cell("sm_throughput_pct", fmt_pct)),
                ("memory", column_cell("memory_throughput_pct", fmt_pct)),
                ("L1/TEX", column_cell("l1_throughput_pct", fmt_pct)),
                ("L2", column_cell("l2_throughput_pct", fmt_pct)),
                ("DRAM", column_cell("dram_throughput_pct", fmt_pct)),
                ("DRAM bandwidth", lambda r: Cell(format_rate(dram.get(r.get("kid"))), "num")),
                ("bound", lambda r: Cell(as_text(r.get("bound")), "", title=as_text(r.get("bound_why"))))]
        blocks.append(table_block(
            k, spec, caption=_titled(g, grp, groups, f"Throughput as % of peak sustained per {g.name}"),
            note=f"bound: both SM and memory below {ncu.BOUND_PCT:.0f}% of peak -> latency-bound "
                 "(warps wait: see the stalls); otherwise the busier of the two, memory naming its "
                 "busiest unit (ncu's SOLBottleneck rule); hover a bound for why. Durations under "
                 f"the profiler are not latencies; they are {g.scope}, the % of peak and the DRAM "
                 "bandwidth (bytes read + written per second, dram__bytes.sum.per_second) are the "
                 "launch's. " + BYTES_NOTE))
        blocks += _batched_note(k, g)
        lacking = ncu.missing_metrics(k, ncu.SOL_COLUMNS)
        if lacking:
            blocks.append(NoteBlock("Not in this report (shown as –): " + ", ".join(lacking) + "."))
    return PanelOutput(blocks + _per_launch_note(s, s.kview) + _beside(s, g, "sol"), modes=g.modes(s))


def _bandwidth_blocks(g: Grain, grp: Group, groups: list[Group], device: Any) -> list[Any]:
    """The bandwidth roofline of one group: the figure, its table and what it lacks."""
    pts, roofs = ncu.bandwidth(grp.frame, device)
    if pts.empty:
        return [NoteBlock(f"No DRAM, L2 or L1 byte counts ({grp.modes}): no bandwidth roofline.")]
    copy = roofs[roofs["level"] == "DRAM copy"] if not roofs.empty else roofs
    ceilings = "; ".join(f"{r['level']} {format_rate(r['peak'])} ({r['source']})"
                         for r in roofs.to_dict("records") if r["level"] != "DRAM copy")
    caption = (f"Bytes each memory level served per second against that level's own peak ({ceilings or 'no peak'}"
               + (f"; dashed: the measured copy ceiling, {format_rate(copy['peak'].iloc[0])}: "
                  f"{copy['source'].iloc[0]}" if len(copy) else "") +
               "). An L1 or L2 hit's bytes never cross the DRAM interface, so each level is read against its own "
               "roof, never the DRAM one. " + BYTES_NOTE)
    blocks: list[Any] = [figure_block(bandwidth_roofline_figure(pts, roofs, f"Bandwidth roofline per {g.name}"),
                                      "Bandwidth roofline", caption)]
    wide = pts.pivot_table(index="kid", columns="level", values=["bytes_per_s", "pct_of_peak"], aggfunc="first")
    rows = []
    for r in grp.frame.to_dict("records"):
        if r["kid"] not in wide.index:
            continue
        row = {**r}
        for lv in ncu.LEVELS.values():
            for what in ("bytes_per_s", "pct_of_peak"):
                row[f"{lv}_{what}"] = wide.loc[r["kid"], (what, lv)] if (what, lv) in wide.columns else np.nan
        rows.append(row)
    spec = [*g.lead]
    for lv in ncu.LEVELS.values():
        if (pts["level"] == lv).any():
            spec += [(f"{lv} bytes/s", (lambda lv: lambda r: Cell(format_rate(r.get(f"{lv}_bytes_per_s")), "num"))(lv)),
                     (f"{lv} % of its peak", column_cell(f"{lv}_pct_of_peak", fmt_pct))]
    if len(copy) and (pts["level"] == "DRAM").any():
        cp = float(copy["peak"].iloc[0])
        spec.append(("DRAM % of copy ceiling", lambda r: Cell(fmt_pct(100 * r["DRAM_bytes_per_s"] / cp)
                                                              if not is_na(r.get("DRAM_bytes_per_s")) else "–",
                                                              "num")))
    blocks.append(table_block(
        rows, spec, caption=_titled(g, grp, groups, f"Bandwidth per memory level per {g.name}"),
        note="DRAM: dram__bytes.sum.per_second (read + written); L2: lts__t_bytes.sum / duration "
             "(every L2 request: L1 misses, writes, DRAM fills); L1: the L1/TEX sectors of global "
             "and local loads and stores x 32 B / duration. Peaks: ncu's peak bytes per cycle x "
             "the level's clock, or, where the report lacks them, the achieved rate / ncu's own "
             "% of peak for those bytes (gpu__dram_throughput, lts__t_sectors)."))
    missing = [lv for lv in ncu.LEVELS.values() if not (pts["level"] == lv).any()]
    no_peak = [lv for lv in ncu.LEVELS.values() if lv in set(pts.loc[pts["peak_bytes_per_s"].isna(), "level"])]
    if missing or no_peak:
        blocks.append(NoteBlock(
            ("Not drawn, no byte counts in the report: " + "; ".join(f"{lv} ({_COUNTS[lv]})" for lv in missing) +
             ". " if missing else "") +
            ("Peak unknown, so no share of it: " + "; ".join(f"{lv} ({_PEAKS[lv]})" for lv in no_peak) + "."
             if no_peak else "")))
    return blocks


#: what a bandwidth-roofline level needs: its bytes, and its peak when ncu's % of peak cannot give it
_COUNTS = {"DRAM": "dram__bytes_read/write.sum", "L2": "lts__t_bytes.sum or lts__t_sectors.sum",
           "L1": "the L1/TEX global and local sector counters of the MemoryWorkloadAnalysis_Chart section"}
_PEAKS = {"DRAM": "dram__bytes.sum.peak_sustained or gpu__dram_throughput",
          "L2": "lts__t_bytes.sum.peak_sustained or lts__t_sectors.sum.pct_of_peak_sustained_elapsed",
          "L1": "l1tex__t_bytes.sum.peak_sustained, in the default metric set of newer profiles"}


def roofline(s: Any, g: Grain) -> PanelOutput:
    """The bandwidth roofline for every source; the FP roofline beside it for an imported
    report with FP work, and for a run only where its kernels' FP work is worth one (an
    embedding gather's adds, one per element read, never are)."""
    blocks: list[Any] = []
    groups = g.groups(s)
    device = (getattr(s, "gpu", None) or {}).get("name")
    for grp in groups:
        fp = ncu.has_roofline(grp.frame) if g.name == "kernel" else ncu.fp_worth_roofline(grp.frame)
        if fp:
            blocks += _fp_roofline_blocks(g, grp, groups)
        blocks += _bandwidth_blocks(g, grp, groups, device)
    if not blocks:
        raise Missing(f"no {g.name} has DRAM or L2 byte counts")
    if g.name == "point" and not any(ncu.fp_worth_roofline(grp.frame) for grp in groups):
        blocks.append(NoteBlock(f"No FP roofline: the lookup kernels' floating-point work (one add per element "
                                f"gathered) stays below {ncu.FP_WORTH_PCT:.0f}% of any FP peak, so bytes, not "
                                "FLOP/s, are what bound them."))
    return PanelOutput(blocks, modes=g.modes(s))


def _fp_roofline_blocks(g: Grain, grp: Group, groups: list[Group]) -> list[Any]:
    pts, roofs = ncu.roofline(grp.frame)
    if pts.empty:
        return []
    blocks: list[Any] = [figure_block(roofline_figure(pts, roofs, f"FP roofline per {g.name}"), "FP roofline",
                                      "ceilings from ncu's own peak counters at the clocks the kernels ran at; "
                                      "FLOP/s = (add + mul + 2 fma) thread instructions per cycle x SM clock")]
    levels = [lv for lv in ("dram", "l2", "l1") if f"{lv}_intensity_flop_per_byte" in pts.columns]
    spec = [(g.name, lambda r: Cell(as_text(r["label"]), "kname")),
            ("precision", column_cell("precision", as_text, "")),
            ("achieved GFLOP/s", column_cell("flop_per_s", lambda v: fmt_num(v / 1e9))),
            ("% of peak", lambda r: Cell(fmt_pct(100 * r["flop_per_s"] / r["peak_flop_per_s"])
                                         if not is_na(r.get("peak_flop_per_s")) else "–", "num"))]
    for lv in levels:
        spec += [(f"{lv.upper()} intensity (FLOP/B)", column_cell(f"{lv}_intensity_flop_per_byte")),
                 (f"{lv.upper()} bandwidth", column_cell(f"{lv}_bytes_per_s", format_rate))]
    blocks.append(table_block(pts, spec, caption=_titled(g, grp, groups, "Achieved work and arithmetic intensity")))
    missing = [lv.upper() for lv in ("l1", "l2") if f"{lv}_intensity_flop_per_byte" not in pts.columns]
    if missing:
        blocks.append(NoteBlock(f"Only the DRAM level is drawn: the report lacks the hierarchical roofline "
                                f"counters for {' and '.join(missing)} (l1tex__t_bytes / lts__t_bytes peaks, "
                                "collected by the SpeedOfLight_Hierarchical*RooflineChart sections)."))
    return blocks


def _scoped_spec(g: Grain) -> list[tuple[str, Callable[[dict], Cell]]]:
    """The memory-chart columns (report.views.memory_spec), each count of requests,
    sectors or bytes labelled with the grain's scope ('per table')."""
    rates = ("sectors / request", "L1 hit", "L2 hit")
    return [(h if h in rates else f"{h} {g.scope}", fn) for h, fn in memory_spec()]


def memory(s: Any, g: Grain) -> PanelOutput:
    blocks: list[Any] = []
    groups = g.groups(s)
    for grp in groups:
        k = grp.frame
        if g.name == "point" and grp.cache_control != "none":
            blocks.append(NoteBlock(f"{grp.modes}: L2 pinning is invisible under this mode: caches were flushed "
                                    "before each kernel."))
        top = ncu.slowest(k, CHARTS).to_dict("records")
        mean = " (per table, mean launch)" if g.name == "point" else ""
        charts = [figure_block(memory_chart_figure(r, f"Memory chart: {r['label']}{mean}" + (
            f" ({fmt_pct(r.get('time_share_pct'))} of the time)" if g.name == "kernel" else "")),
            f"Memory chart of {r['label']}", f"requests, sectors (32 B) and bytes between the units {g.scope}, "
            "reads above, writes below; hit rates in the caches. " + BYTES_NOTE) for r in top]
        if charts:
            blocks.append(charts[0])
        if len(charts) > 1:
            blocks.append(DetailsBlock(f"Memory charts of the next {len(charts) - 1} {g.rows} by duration "
                                       f"{g.scope}", charts[1:]))
        if g.summary_figures:
            rates = ["l1_hit_rate_pct", "l2_hit_rate_pct"]
            if set(rates) <= set(k.columns) and k[rates].notna().any().any():
                blocks.append(figure_block(hit_rate_figure(k, "L1 and L2 hit rates (lookup kernels)"), "Hit rates",
                                           "sector hit rates, mean launch per point"))
            if {"dram_bytes_read", "dram_bytes_write"} <= set(k.columns) and \
                    k[["dram_bytes_read", "dram_bytes_write"]].notna().any().any():
                blocks.append(figure_block(dram_figure(k, f"DRAM bytes read and written {g.scope} (lookup kernels)",
                                                       g.scope),
                                           "DRAM bytes", f"{g.scope}: a batched launch's bytes divided by its "
                                           "tables; mean over the profiled launches. " + BYTES_NOTE))
        spec = [*g.lead, *_count_cols(g)] + _scoped_spec(g) + [_duration(g)]
        blocks.append(table_block(ncu.slowest(k, len(k)), spec,
                                  caption=_titled(g, grp, groups, f"Memory workload per {g.name}, longest first"),
                                  note=(CLAMP_NOTE if clamped_any(k) else
                                        "'no traffic': no sector went through that cache (not a 0% hit rate).") + " " +
                                  BYTES_NOTE))
        blocks += _batched_note(k, g)
        lacking = ncu.missing_metrics(k, ncu.MEMORY_COLUMNS)
        if lacking:
            blocks.append(NoteBlock("Not in this report (shown as –): " + ", ".join(lacking) + "."))
    return PanelOutput(blocks + _per_launch_note(s, s.kview) + _beside(s, g, "memory"), modes=g.modes(s))


def _stall_blocks(k: pd.DataFrame, g: Grain) -> list[Any]:
    """The weighted stall figure and one row per kernel or point: its top reasons and its
    share of every row's stall cycles, the weight named in the title, axis, caption and note."""
    long = ncu.weighted_stalls(k)
    if long.empty:
        raise Missing("no kernel has warp-stall values")
    reasons = ncu.top_reasons(long, 7)
    tops = ncu.kernel_top_stalls(long)
    firsts = [t[0][0] for t in tops["top_stalls"] if t]  # every row's own largest
    reasons += [r for r in dict.fromkeys(firsts) if r not in reasons][:3]
    weight = str(long["weight"].iloc[0])
    rows = "points" if g.name == "point" else "kernels"
    title = f"Warp stalls {g.scope}, weighted by {weight}" if weight != "none" else "Warp stalls, unweighted"
    blocks: list[Any] = [figure_block(
        weighted_stall_figure(long, reasons, f"{title}, one row per {g.name}", rows), "Warp stalls",
        f"left: {ncu.WEIGHT_TEXT[weight]}, {g.scope}, as a share of all {rows}' stall cycles; right: each "
        f"{g.name}'s own mix. Reasons picked by their weighted total, so a long {g.name}'s stalls are never hidden "
        "in 'other'; 'selected' (issuing) is not a stall")]
    info = k.set_index("kid")
    d = tops.assign(label=[info.loc[i, "label"] if i in info.index else "" for i in tops["kid"]],
                    duration_ns=[info.loc[i, "duration_ns"] if i in info.index and "duration_ns" in info.columns
                                 else np.nan for i in tops["kid"]],
                    time_share_pct=[info.loc[i, "time_share_pct"] if i in info.index and "time_share_pct" in
                                    info.columns else np.nan for i in tops["kid"]])
    d = d.sort_values("stall_cycles", ascending=False, kind="stable")
    spec = [(g.name, lambda r: Cell(as_text(r["label"]), "kname"))]
    spec += [_duration(g)] if g.name == "point" else [("share of time", lambda r: share_cell(r.get("time_share_pct")))]
    spec += [(f"share of all stall cycles, weighted by {weight}" if weight != "none" else "share of all stall cycles",
              lambda r: share_cell(r.get("total_share_pct"))),
             ("top stalls (cycles per issued instruction, share of its stalls)",
              lambda r: Cell(stall_text(r["top_stalls"]), ""))]
    blocks.append(table_block(
        d, spec, caption=f"Each {g.name}'s stalls, by its share of all stall cycles {g.scope}",
        note=f"weight: {ncu.WEIGHT_TEXT[weight]}, {g.scope}; a {g.name}'s top reasons are its own "
             "largest"))
    return blocks


def stalls(s: Any, g: Grain) -> PanelOutput:
    blocks: list[Any] = []
    for grp in g.groups(s):
        try:
            blocks += _stall_blocks(grp.frame, g)
        except Missing:
            blocks.append(NoteBlock(f"No warp-stall metrics ({grp.modes}): the WarpStateStats section was not "
                                    "collected."))
    return PanelOutput(blocks + _per_launch_note(s, s.kview) + _beside(s, g, "stalls"), modes=g.modes(s))


def occupancy(s: Any, g: Grain) -> PanelOutput:
    blocks: list[Any] = []
    groups = g.groups(s)
    for grp in groups:
        k = grp.frame
        if k[["achieved_occupancy_pct", "theoretical_occupancy_pct"]].isna().all().all():
            blocks.append(NoteBlock(f"No occupancy metrics ({grp.modes}): the Occupancy section was not collected."))
            continue
        blocks.append(figure_block(kernel_occupancy_figure(k, f"Occupancy per {g.name}"), "Occupancy",
                                   "achieved (sm__warps_active) against theoretical (occupancy calculator)" +
                                   (", mean over the profiled launches of each point" if g.name == "point" else "")
                                   + "; beside each: the launch's waves per SM (launch__waves_per_multiprocessor)"))
        spec = [*g.lead, *_count_cols(g), ("registers/thread", column_cell("registers_per_thread")),
                ("theoretical", column_cell("theoretical_occupancy_pct", fmt_pct)),
                ("achieved", column_cell("achieved_occupancy_pct", fmt_pct)),
                ("waves per SM", column_cell("waves_per_sm", lambda v: "–" if is_na(v) else f"{float(v):.2f}"))]
        blocks.append(table_block(k, spec, caption=_titled(g, grp, groups, f"Occupancy and launch per {g.name}"),
                                  note="waves per SM: the launch's blocks over what all SMs hold at once at this "
                                       "occupancy; below 1 some SMs get no block, a fraction above a whole number is a "
                                       "partial last wave (ncu's Tail Effect rule). A batched launch's waves are the "
                                       "launch's, not per table."))
    return PanelOutput(blocks + _beside(s, g, "occupancy"), modes=g.modes(s))


#: kernel_table's per-launch columns and what they become per table
_KERNEL_SCOPED = ("duration (µs)", "DRAM read", "DRAM written")


def _scoped_table(t: TableBlock, g: Grain) -> TableBlock:
    """kernel_table with its per-launch columns labelled by scope ('duration per table (µs)')."""
    t.columns = [(h.replace(" (", f" {g.scope} (", 1) if "(" in h else f"{h} {g.scope}") if h in _KERNEL_SCOPED
                 else h for h in t.columns]
    return t


def kernels(s: Any, g: Grain) -> PanelOutput:
    k = _per_table(s, s.kview)
    if g.name == "point":
        # the points' panels above say what each kernel did; the launches themselves are a reference, folded
        table = _scoped_table(kernel_table(ordered_rows(k), "Every profiled kernel (lookup kernels and L2 pre-pass "
                                                            "kernels)"), g)
        blocks: list[Any] = [DetailsBlock(f"Every profiled launch: {len(table.rows)} kernel(s) of "
                                          f"{k[['variant', 'dataset']].drop_duplicates().shape[0]} point(s)",
                                          [table])]
        many = k[pd.to_numeric(k.get("tables_per_launch"), errors="coerce") > 1] if "tables_per_launch" in k else k[:0]
        if not many.empty:
            blocks.append(NoteBlock("Durations and DRAM bytes are per table: " + ", ".join(
                dict.fromkeys(f"{r['variant']} ({r['tables_per_launch']:.0f} tables per launch)"
                              for r in many.to_dict("records"))) + " divided by its tables; share of time, "
                              "DRAM busy and SM busy are the launch's. " + BYTES_NOTE))
        return PanelOutput(blocks + _per_launch_note(s, s.kview), modes=g.modes(s))
    return PanelOutput([_scoped_table(kernel_table(k, "One row per profiled kernel", with_point=False), g)]
                       + _per_launch_note(s, s.kview), modes=g.modes(s))


def rules(s: Any, g: Grain) -> PanelOutput:
    blocks: list[Any] = []
    if g.name == "point":
        if not any(p.get("status") == "ok" and p.get("report") for p in s.profile_points):
            raise Missing(points_missing(s, "profile", PROFILE_HINT))
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
    blocks += _marked([rule_matrix(ranked, used, names, f"{len(ranked)} finding(s) x {len(used)} {what}, ranked, "
                                   "estimates capped by the speed-of-light headroom" +
                                   (" (each point: its own kernels)" if g.name == "point" else ""), weighted)],
                      ranked, names)
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
              f"gpu__dram_throughput as % of peak sustained of {rows}; the bound after ncu's SOLBottleneck rule; "
              f"durations {g.scope} (analysis.ncu.per_table)", sol),
        panel("roofline", "Roofline: bytes per second against each memory level's peak", S_SOL, ("bandwidth",),
              f"DRAM, L2 and L1 bytes per second of {rows}, each against its own level's peak from ncu's peak "
              f"counters (or its % of peak), and the device's measured copy ceiling (analysis.ncu.bandwidth); the "
              f"FP roofline (FP thread instructions per cycle x SM clock against ncu's FP peaks) beside it where "
              f"the kernels do FP work", roofline),
        panel("memory", "Memory chart, hit rates and DRAM traffic", S_MEM, ("memory",) if g.name == "kernel" else (),
              f"l1tex__t_requests/sectors (global loads and stores, local spills), l1tex__m_* bytes to and from L2, "
              f"lts__t_sectors_srcunit_tex reads and writes, dram__bytes_read/write and the sector hit rates "
              f"(clamped at 100%, 'no traffic' apart) of {rows}, {g.scope}", memory),
        panel("stalls", "Warp stalls weighted by time", S_STALLS, ("stalls",) if g.name == "kernel" else (),
              f"WarpStateStats stall reasons (cycles per issued instruction) x smsp__inst_issued.sum (or the "
              f"instructions executed, or the duration, when a report lacks it: the panel names the weight): "
              f"stall cycles per reason of {rows}, {g.scope} (analysis.ncu.weighted_stalls)", stalls),
        panel("occupancy", "Achieved vs theoretical occupancy and waves per SM", S_STALLS, (),
              f"sm__warps_active (achieved), sm__maximum_warps_per_active_cycle_pct (theoretical) and "
              f"launch__waves_per_multiprocessor of {rows}", occupancy),
        panel("kernels", "Every profiled kernel", S_NCU, (),
              f"one row per profiled kernel (analysis.ncu.kernel_summary over the tidy metrics), {g.scope}", kernels),
        panel("rules", "Nsight Compute rule findings, ranked", S_RULES, (),
              "ncu's own guided-analysis rules stored in each report (extract.rule_results) as a finding x "
              f"{g.name} matrix, each estimated speedup capped by the headroom the kernel's speed of light leaves "
              "(analysis.ncu.cap_speedups)", rules),
    )
