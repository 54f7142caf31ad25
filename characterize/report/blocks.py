"""Report stage, page blocks: tables, figures, notes and the number formatters panels
build them with.
"""

from __future__ import annotations

import base64
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from characterize.extract.schema import short_function_name
from characterize.report.plots import order_datasets, order_variants, png
from characterize.report.plots import stamp as put_stamp
from characterize.units import format_bytes


# ============================================================== page elements
@dataclass
class Cell:
    text: str
    cls: str = ""
    title: str = ""
    detail: str = ""  # longer text shown on demand (a collapsed <details> in the cell)


KERNEL_NAME_INLINE = 120  # longer demangled names show the function name, the full name on demand


def kernel_cell(name: Any, function: Any = "") -> Cell:
    """A kernel's demangled name as a cell: in full when short, else its function name
    with the full name behind a disclosure."""
    full = as_text(name) or as_text(function)
    if len(full) <= KERNEL_NAME_INLINE:
        return Cell(full, "kname")

    return Cell(as_text(function) or short_function_name(full), "kname", detail=full)


@dataclass
class TableBlock:
    columns: list[str]
    rows: list[list[Cell]]
    caption: str = ""
    note: str = ""
    kind: str = "table"


@dataclass
class FigureBlock:
    title: str
    data_uri: str
    width: int
    height: int
    alt: str
    caption: str
    kind: str = "figure"


@dataclass
class NoteBlock:
    text: str
    level: str = "info"  # info | warning | prediction
    kind: str = "note"


@dataclass
class DetailsBlock:
    summary: str
    blocks: list[Any]
    open: bool = False
    kind: str = "details"


@dataclass
class FigureRow:
    """Figures side by side (two or more in a row, each its share of the width)."""

    figures: list[FigureBlock]
    kind: str = "figrow"


#: a table longer than this beside a figure is folded (the figure says it; the rows are a click away)
FOLD_ROWS = 6
_COLD = re.compile(r"(\(cold\)$|^cold: |, cold mode)")


def compact(blocks: list[Any]) -> list[Any]:
    """A panel as a reader scans it: the cold-mode repeats of a steady-mode figure or table
    folded into one box at the end, a long table beside a figure folded under its caption,
    and consecutive figures side by side. Nothing is dropped; a panel without a figure is
    left as it is."""
    if not any(isinstance(b, FigureBlock) for b in blocks):
        return blocks

    def cold(b: Any) -> bool:
        return bool(_COLD.search(b.title if isinstance(b, FigureBlock) else
                                 b.caption if isinstance(b, TableBlock) else ""))

    warm = [b for b in blocks if not cold(b)]
    colds = [b for b in blocks if cold(b)]
    if not any(isinstance(b, FigureBlock) for b in warm):   # only cold figures: nothing to fold them behind
        warm, colds = blocks, []
    out: list[Any] = []
    folded: set[int] = set()   # the folded tables (a figure after them still joins the figure before)
    for b in warm:
        if isinstance(b, TableBlock) and len(b.rows) > FOLD_ROWS:
            b = DetailsBlock(f"The numbers: {b.caption or 'table'} ({len(b.rows)} rows)", [b])
            folded.add(id(b))
        if isinstance(b, FigureBlock):
            at = len(out)
            while at and id(out[at - 1]) in folded:
                at -= 1
            if at and (isinstance(out[at - 1], FigureBlock) or
                       (isinstance(out[at - 1], FigureRow) and len(out[at - 1].figures) < 2)):
                prev = out[at - 1]
                out[at - 1] = FigureRow([*(prev.figures if isinstance(prev, FigureRow) else [prev]), b])
                continue
        out.append(b)
    if colds:
        out.append(DetailsBlock("Cold mode (L2 flushed before every table launch): the same figures and tables",
                                compact(colds) if any(isinstance(b, FigureBlock) for b in colds) else colds))
    return out


@dataclass
class PanelOutput:
    """What a builder returns: blocks, and optionally a provenance and mode that refine the panel's."""

    blocks: list[Any]
    provenance: tuple[str, ...] | None = None
    modes: str = ""


EMULATION_STAMP = "CPU EMULATION: NOT GPU PERFORMANCE"
PREDICTION_STAMP = "MODEL PREDICTION"


class Missing(Exception):
    """Raised by a builder when its data is absent; the message says why, for the reader."""


def figure_block(fig: Any, title: str, caption: str, alt: str | None = None, stamp: str | None = None
                 ) -> FigureBlock:
    """A matplotlib figure as a page block (a PNG inline, optionally stamped); clears the figure."""
    if stamp:
        put_stamp(fig, stamp, "#a0521e" if stamp == PREDICTION_STAMP else "#b3261e")
    data = png(fig)
    w, h = (int(round(v)) for v in fig.get_size_inches() * fig.dpi)
    fig.clear()
    return FigureBlock(title, "data:image/png;base64," + base64.b64encode(data).decode("ascii"), w, h,
                       alt or title, caption)


# ------------------------------------------------------------------ formatting
def is_na(x: Any) -> bool:
    """True for None, pd.NA and NaN, which tables show as '–' (no error on other types)."""
    try:
        return x is None or x is pd.NA or (isinstance(x, (float, np.floating)) and math.isnan(x))
    except TypeError:
        return False


def fmt_num(x: Any, digits: int = 3) -> str:
    """A number for a table: thousands separators, about `digits` significant figures."""
    if is_na(x):
        return "–"
    if isinstance(x, (bool, np.bool_)):
        return "yes" if x else "no"
    try:
        v = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isinf(v):
        return "∞" if v > 0 else "-∞"
    if v == int(v) and abs(v) < 1e15:
        return f"{int(v):,}"
    a = abs(v)
    if a >= 10 ** (digits - 1):
        return f"{v:,.0f}"
    if a >= 1:
        return f"{v:,.{max(0, digits - 1 - int(math.floor(math.log10(a))))}f}"
    if a == 0:
        return "0"
    return f"{v:.{digits}g}"


def fmt_pct(x: Any, digits: int = 1) -> str:
    return "–" if is_na(x) else f"{float(x):.{digits}f}%"


def fmt_x(x: Any, ci: Any = None) -> str:
    if is_na(x):
        return "–"
    return f"{float(x):.2f}×" + ("" if is_na(ci) else f" ±{float(ci):.2f}")


def fmt_ci(x: Any, ci: Any) -> str:
    return fmt_num(x) + ("" if is_na(ci) else f" ± {fmt_num(ci, 2)}")


def as_text(x: Any) -> str:
    """A value as cell text: '' for a missing value (is_na), else str()."""
    return "" if is_na(x) else str(x)


def table_block(df: pd.DataFrame | Sequence[dict], spec: Sequence[tuple[str, Callable[[dict], Any]]],
                caption: str = "", note: str = "") -> TableBlock:
    """TableBlock from records; each spec item is (header, row -> str | Cell)."""
    records = df.to_dict("records") if isinstance(df, pd.DataFrame) else list(df)
    rows = []
    for r in records:
        cells = []
        for _, fn in spec:
            v = fn(r)
            cells.append(v if isinstance(v, Cell) else Cell(str(v)))
        rows.append(cells)
    return TableBlock([h for h, _ in spec], rows, caption, note)


def column_cell(name: str, f: Callable[[Any], str] = fmt_num, cls: str = "num") -> Callable[[dict], Cell]:
    """A table_block column: row -> Cell of row[name] formatted by `f` (numbers by default)."""
    return lambda r: Cell(f(r.get(name)), cls)


def code_cell(name: str) -> Callable[[dict], Cell]:
    """A table_block column: row -> row[name] as code-styled text (variant, dataset, GPU names)."""
    return lambda r: Cell(as_text(r.get(name)), "code")


#: the (variant, dataset) columns that start most tables
POINT_COLS: tuple[tuple[str, Callable[[dict], Cell]], ...] = (
    ("variant", code_cell("variant")), ("dataset", code_cell("dataset")))


def kv_table(rows: Sequence[tuple[str, Any]], caption: str = "") -> TableBlock:
    """A key/value table of (label, value) pairs, leaving out missing and empty values."""
    return TableBlock(["", ""], [[Cell(k, "key"), Cell(as_text(v), "code" if k in _CODE_KEYS else "")]
                                for k, v in rows if not is_na(v) and v != ""], caption, kind="kv")


_CODE_KEYS = {"command line", "directory", "git revision", "compiler"}


def ordered_rows(df: pd.DataFrame, variant: str = "variant", dataset: str = "dataset") -> pd.DataFrame:
    """Rows in family order of variants, then hotness order of datasets."""
    if df.empty:
        return df
    d = df.copy()
    if variant in d.columns:
        vo = {v: i for i, v in enumerate(order_variants(d[variant].astype(str)))}
        d["_vo"] = d[variant].astype(str).map(vo)
    else:
        d["_vo"] = 0
    if dataset in d.columns:
        do = {v: i for i, v in enumerate(order_datasets(d[dataset].astype(str)))}
        d["_do"] = d[dataset].astype(str).map(do)
    else:
        d["_do"] = 0
    return d.sort_values(["_vo", "_do"], kind="stable").drop(columns=["_vo", "_do"]).reset_index(drop=True)


_MARKUP = re.compile(r"@(section|url|source|[a-z]+):([^@]*)@")


def clean_rule_text(text: str) -> str:
    """ncu rule messages carry '@section:Id:Name@' / '@url:Text:URL@' markup: plain text instead."""
    def repl(m: re.Match) -> str:
        kind, body = m.group(1), m.group(2)
        if kind == "url":
            label, _, url = body.partition(":")
            return f"{label} ({url})" if url else label
        return body.rsplit(":", 1)[-1] if kind != "section" else body.split(":", 1)[-1]
    return _MARKUP.sub(repl, text or "")


def _dims(x: Any) -> str:
    """'(1024, 1, 1)' as '1024x1x1' (short enough to stay on one line)."""
    t = as_text(x)
    nums = re.findall(r"\d+", t)
    return "x".join(nums) if len(nums) == 3 else (t or "–")


def hit_cell(r: dict, level: str) -> Cell:
    """A hit rate that tells 'no traffic' from 0% and marks a rate ncu reported above 100%
    (shown clamped, the raw value on hover and in the table note)."""
    traffic, rate, raw = r.get(f"{level}_traffic"), r.get(f"{level}_hit_rate_pct"), r.get(f"{level}_hit_rate_raw_pct")
    if traffic is False or (isinstance(traffic, (bool, np.bool_)) and not traffic):
        return Cell("no traffic", "num muted", title="no sectors went through this cache: a hit rate means nothing")
    if is_na(rate):
        return Cell("–", "num")
    if r.get(f"{level}_hit_rate_clamped") is True or (not is_na(raw) and float(raw) > 100):
        return Cell(f"{float(rate):.1f}%*", "num", title=f"ncu reported {float(raw):.2f}%")
    return Cell(fmt_pct(rate), "num")


CLAMP_NOTE = ("* ncu reported a hit rate above 100% (shown on hover): an artifact of its sector accounting, not "
              "more hits than accesses; shown clamped at 100%. 'no traffic': no sector went through that cache, "
              "which a 0% hit rate would hide.")


def clamped_any(k: pd.DataFrame) -> bool:
    return any(c in k.columns and k[c].fillna(False).astype(bool).any()
               for c in ("l1_hit_rate_clamped", "l2_hit_rate_clamped"))


def share_cell(x: Any) -> Cell:
    return Cell("–" if is_na(x) else f"{float(x):.1f}%", "num")


def kernel_table(k: pd.DataFrame, caption: str, with_point: bool = True) -> TableBlock:
    """One row per kernel (analysis.ncu.kernel_summary): time and its share, the bound,
    occupancy, hit rates that say 'no traffic', DRAM read and written."""
    spec: list[tuple[str, Callable]] = []
    if with_point:
        spec += [("variant", lambda r: Cell(as_text(r.get("variant")), "code")),
                 ("dataset", lambda r: Cell(as_text(r.get("dataset")), "code")),
                 ("table", lambda r: Cell(as_text(r.get("table")), "num"))]
    spec += [("ID", column_cell("kernel_id")),
             ("kernel", lambda r: kernel_cell(r.get("kernel_name"), r.get("function"))),
             ("grid / block", lambda r: Cell(f"{_dims(r.get('grid'))} / {_dims(r.get('block'))}", "code nw")),
             ("duration (µs)", lambda r: Cell(fmt_num(r.get("duration_ns", np.nan) / 1e3), "num")),
             ("share of time", lambda r: share_cell(r.get("time_share_pct"))),
             ("bound", lambda r: Cell(as_text(r.get("bound")), "", title=as_text(r.get("bound_why")))),
             ("regs", column_cell("registers_per_thread")),
             ("occupancy achieved / theoretical", lambda r: Cell(
                 f"{fmt_pct(r.get('achieved_occupancy_pct'))} / {fmt_pct(r.get('theoretical_occupancy_pct'))}", "num")),
             ("L1 hit", lambda r: hit_cell(r, "l1")), ("L2 hit", lambda r: hit_cell(r, "l2")),
             ("DRAM read", column_cell("dram_bytes_read", format_bytes)),
             ("DRAM written", column_cell("dram_bytes_write", format_bytes)),
             ("DRAM busy", column_cell("dram_throughput_pct", fmt_pct)),
             ("SM busy", column_cell("sm_throughput_pct", fmt_pct))]
    if with_point:
        spec.append(("ncu modes", lambda r: Cell(f"cache {as_text(r.get('cache_control')) or '?'}, "
                                                 f"clock {as_text(r.get('clock_control')) or '?'}", "")))
    else:
        if "nvtx_range" in k.columns and k["nvtx_range"].fillna("").astype(str).ne("").any():
            spec.insert(2, ("NVTX range", lambda r: Cell(as_text(r.get("nvtx_range")), "code")))
        if "device" in k.columns and k["device"].dropna().astype(str).nunique() > 1:
            spec.insert(2, ("device", lambda r: Cell(as_text(r.get("device")), "")))
    note = "share of time: of the summed duration of the kernels in the same report. " + \
        (CLAMP_NOTE if clamped_any(k) else "'no traffic': no sector went through that cache (not a 0% hit rate).")
    return table_block(k, spec, caption=caption, note=note)


_SEVERITY = {"ERROR": 0, "WARNING": 1, "OPTIMIZATION": 2, "INFO": 3, "OK": 4, "NONE": 5}
_FINDINGS = ("ERROR", "WARNING", "OPTIMIZATION")
_SHORT_TYPE = {"ERROR": "error", "WARNING": "warn", "OPTIMIZATION": "opt"}

#: report topics and the ncu rule sections (identifier prefixes) that concern them
RULE_TOPICS: dict[str, tuple[str, ...]] = {
    "sol": ("SpeedOfLight", "ComputeWorkloadAnalysis", "InstructionStats"),
    "memory": ("MemoryWorkloadAnalysis", "SourceCounters"),
    "stalls": ("WarpStateStats", "SchedulerStats"),
    "occupancy": ("Occupancy", "LaunchStats"),
}


def rule_topic(section: str) -> str:
    for topic, prefixes in RULE_TOPICS.items():
        if any(str(section).startswith(p) for p in prefixes):
            return topic
    return "other"


def rule_label(r: dict) -> str:
    """A rule finding's label: its rule name, and its title when that says more."""
    name = as_text(r.get("rule_name")) or as_text(r.get("rule"))
    title = as_text(r.get("title"))
    return f"{name}: {title}" if title and title != name else name


def rank_rules(rules: pd.DataFrame, column: str, weights: dict[Any, float] | None = None) -> pd.DataFrame:
    """One row per finding (rule and title) with its worst severity, the estimated
    speedup (largest, and weighted by each column's share of time when `weights`
    are given) and one cell per value of `column` (a kernel or a point); ranked by the
    weighted speedup, then the largest, then severity. OK/INFO results are not findings."""
    f = rules[rules["message_type"].isin(_FINDINGS)].copy()
    if f.empty:
        return pd.DataFrame()
    f["finding"] = [rule_label(r) for r in f.to_dict("records")]
    rows = []
    for (section, finding), g in f.groupby(["section", "finding"], sort=False):
        worst = min(g["message_type"], key=lambda t: _SEVERITY.get(t, 9))
        cells: dict[Any, tuple[str, float]] = {}
        for col, h in g.groupby(column, sort=False):
            t = min(h["message_type"], key=lambda t: _SEVERITY.get(t, 9))
            cells[col] = (t, float(h["estimated_speedup"].max()) if h["estimated_speedup"].notna().any() else np.nan)
        best = max((v for _, v in cells.values() if not is_na(v)), default=np.nan)
        weighted = np.nan
        if weights:
            vals = [v * weights.get(c, np.nan) / 100 for c, (_, v) in cells.items()
                    if not is_na(v) and not is_na(weights.get(c, np.nan))]
            weighted = sum(vals) if vals else np.nan
        msgs = list(dict.fromkeys(clean_rule_text(m) for m in g["message"] if m))
        rows.append({"section": section, "topic": rule_topic(section), "finding": finding, "severity": worst,
                     "cells": cells, "best_speedup_pct": best, "weighted_speedup_pct": weighted,
                     "speedup_type": next((t for t in g["speedup_type"] if t), ""), "messages": msgs,
                     "where": {m: sorted({c for c, h in g.groupby(column) if m in {clean_rule_text(x)
                                                                                  for x in h["message"]}},
                                         key=str) for m in msgs}})
    out = pd.DataFrame(rows)
    out["_w"] = out["weighted_speedup_pct"].fillna(-1)
    out["_b"] = out["best_speedup_pct"].fillna(-1)
    out["_s"] = out["severity"].map(lambda t: _SEVERITY.get(t, 9))
    out = out.sort_values(["_w", "_b", "_s"], ascending=[False, False, True], kind="stable")
    return out.drop(columns=["_w", "_b", "_s"]).reset_index(drop=True)


def rule_matrix(ranked: pd.DataFrame, columns: Sequence[Any], names: dict[Any, str], caption: str,
                weighted: bool) -> TableBlock:
    """The ranked findings as a finding x kernel (or point) matrix; a cell gives the
    finding's type and its estimated speedup (ncu's own estimate) for that column."""
    def cell(r: dict, c: Any) -> Cell:
        if c not in r["cells"]:
            return Cell("", "")
        t, v = r["cells"][c]
        return Cell(_SHORT_TYPE.get(t, t.lower()) + ("" if is_na(v) else f" {v:.0f}%"),
                    "num rule-" + t.lower(), title=t)

    spec: list[tuple[str, Callable]] = [
        ("finding", lambda r: Cell(r["finding"], "")), ("section", lambda r: Cell(r["section"], "code"))]
    if weighted:
        spec.append(("est. speedup, time-weighted", lambda r: Cell(
            "–" if is_na(r["weighted_speedup_pct"]) else f"{r['weighted_speedup_pct']:.1f}%", "num")))
    spec.append(("largest est. speedup", lambda r: Cell(
        "–" if is_na(r["best_speedup_pct"]) else f"{r['best_speedup_pct']:.0f}% ({r['speedup_type'] or '?'})",
        "num wrap")))   # may wrap: one column per kernel or point follows, each as wide as it must be
    spec += [(names.get(c, str(c)), (lambda c: lambda r: cell(r, c))(c)) for c in columns]
    note = ("cells: finding type (error, warn, opt) and ncu's estimated speedup for that column; empty: no finding. "
            "Ranked by " + ("the speedup weighted by each kernel's share of time, then " if weighted else "") +
            "the largest estimated speedup, then severity. ncu estimates 'global' speedups on the whole kernel and "
            "'local' ones on the part the rule concerns.")
    return table_block(ranked, spec, caption=caption, note=note)


def rule_texts(ranked: pd.DataFrame, names: dict[Any, str]) -> DetailsBlock:
    """The full text of each finding, once per distinct message, with where it applies."""
    blocks: list[Any] = []
    for r in ranked.to_dict("records"):
        inner = []
        for m in r["messages"]:
            where = ", ".join(names.get(c, str(c)) for c in r["where"].get(m, []))
            inner.append(NoteBlock(f"[{where}] {m}" if where else m))
        blocks.append(DetailsBlock(f"{r['severity'].lower()}: {r['finding']} ({r['section']})", inner))
    return DetailsBlock(f"Full text of the {len(ranked)} finding(s)", blocks)


def rules_beside(ranked: pd.DataFrame, topic: str, columns: Sequence[Any], names: dict[Any, str],
                 weighted: bool) -> list[Any]:
    """The findings about one topic, as a collapsed matrix to sit in the panel they concern."""
    if ranked is None or ranked.empty:
        return []
    r = ranked[ranked["topic"] == topic]
    if r.empty:
        return []
    best = r["best_speedup_pct"].max()
    head = f"ncu rule findings on this: {len(r)}" + ("" if is_na(best) else
                                                     f", largest estimated speedup {best:.0f}%")
    used = [c for c in columns if any(c in cells for cells in r["cells"])]
    return [DetailsBlock(head, [rule_matrix(r, used, names, "", weighted), rule_texts(r, names)])]
