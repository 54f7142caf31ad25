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
    full = _txt(name) or _txt(function)
    if len(full) <= KERNEL_NAME_INLINE:
        return Cell(full, "kname")

    return Cell(_txt(function) or short_function_name(full), "kname", detail=full)


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
class PanelOutput:
    """What a builder returns: blocks, and optionally a provenance and mode that refine the panel's."""

    blocks: list[Any]
    provenance: tuple[str, ...] | None = None
    modes: str = ""


EMULATION_STAMP = "CPU EMULATION: NOT GPU PERFORMANCE"
PREDICTION_STAMP = "MODEL PREDICTION"


class Missing(Exception):
    """Raised by a builder when its data is absent; the message says why, for the reader."""


def _figure_block(fig: Any, title: str, caption: str, alt: str | None = None, stamp: str | None = None
                  ) -> FigureBlock:
    if stamp:
        put_stamp(fig, stamp, "#a0521e" if stamp == PREDICTION_STAMP else "#b3261e")
    data = png(fig)
    w, h = (int(round(v)) for v in fig.get_size_inches() * fig.dpi)
    fig.clear()
    return FigureBlock(title, "data:image/png;base64," + base64.b64encode(data).decode("ascii"), w, h,
                       alt or title, caption)


# ------------------------------------------------------------------ formatting
def _isnan(x: Any) -> bool:
    try:
        return x is None or x is pd.NA or (isinstance(x, (float, np.floating)) and math.isnan(x))
    except TypeError:
        return False


def fmt_num(x: Any, digits: int = 3) -> str:
    """A number for a table: thousands separators, about `digits` significant figures."""
    if _isnan(x):
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
    return "–" if _isnan(x) else f"{float(x):.{digits}f}%"


def fmt_x(x: Any, ci: Any = None) -> str:
    if _isnan(x):
        return "–"
    return f"{float(x):.2f}×" + ("" if _isnan(ci) else f" ±{float(ci):.2f}")


def fmt_ci(x: Any, ci: Any) -> str:
    return fmt_num(x) + ("" if _isnan(ci) else f" ± {fmt_num(ci, 2)}")


def fmt_bytes(x: Any) -> str:
    if _isnan(x):
        return "–"
    v = float(x)
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:,.2f} {unit}"
    return f"{v:,.0f} B"


def _txt(x: Any) -> str:
    return "" if _isnan(x) else str(x)


def _table(df: pd.DataFrame | Sequence[dict], spec: Sequence[tuple[str, Callable[[dict], Any]]],
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


def _col(name: str, f: Callable[[Any], str] = fmt_num, cls: str = "num") -> Callable[[dict], Cell]:
    return lambda r: Cell(f(r.get(name)), cls)


def _code(name: str) -> Callable[[dict], Cell]:
    return lambda r: Cell(_txt(r.get(name)), "code")


#: the (variant, dataset) columns that start most tables
POINT_COLS: tuple[tuple[str, Callable[[dict], Cell]], ...] = (
    ("variant", _code("variant")), ("dataset", _code("dataset")))


def _kv(rows: Sequence[tuple[str, Any]], caption: str = "") -> TableBlock:
    return TableBlock(["", ""], [[Cell(k, "key"), Cell(_txt(v), "code" if k in _CODE_KEYS else "")]
                                for k, v in rows if not _isnan(v) and v != ""], caption, kind="kv")


_CODE_KEYS = {"command line", "directory", "git revision", "compiler"}


def _order(df: pd.DataFrame, variant: str = "variant", dataset: str = "dataset") -> pd.DataFrame:
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


def kernel_table(k: pd.DataFrame, caption: str, with_point: bool = True) -> TableBlock:
    spec: list[tuple[str, Callable]] = []
    if with_point:
        spec += [("variant", lambda r: Cell(_txt(r.get("variant")), "code")),
                 ("dataset", lambda r: Cell(_txt(r.get("dataset")), "code")),
                 ("table", lambda r: Cell(_txt(r.get("table")), "num"))]
    spec += [("ID", _col("kernel_id")),
             ("kernel", lambda r: kernel_cell(r.get("kernel_name"), r.get("function"))),
             ("grid / block",
              lambda r: Cell(f"{_txt(r.get('grid')) or '–'} / {_txt(r.get('block')) or '–'}", "code")),
             ("duration (µs)", lambda r: Cell(fmt_num(r.get("duration_ns", np.nan) / 1e3), "num")),
             ("regs", _col("registers_per_thread")),
             ("occupancy achieved / theoretical", lambda r: Cell(
                 f"{fmt_pct(r.get('achieved_occupancy_pct'))} / {fmt_pct(r.get('theoretical_occupancy_pct'))}", "num")),
             ("L1 hit", _col("l1_hit_rate_pct", fmt_pct)), ("L2 hit", _col("l2_hit_rate_pct", fmt_pct)),
             ("DRAM read", _col("dram_bytes_read", fmt_bytes)), ("DRAM busy", _col("dram_throughput_pct", fmt_pct)),
             ("SM busy", _col("sm_throughput_pct", fmt_pct))]
    if with_point:
        spec.append(("ncu modes", lambda r: Cell(f"cache {_txt(r.get('cache_control')) or '?'}, "
                                                 f"clock {_txt(r.get('clock_control')) or '?'}", "")))
    else:
        spec.insert(2, ("NVTX range", lambda r: Cell(_txt(r.get("nvtx_range")), "code")))
        spec.insert(3, ("device", lambda r: Cell(_txt(r.get("device")), "")))
    return _table(k, spec, caption=caption)


_SEVERITY = {"ERROR": 0, "WARNING": 1, "OPTIMIZATION": 2, "INFO": 3, "OK": 4, "NONE": 5}


def rule_blocks(rules: pd.DataFrame) -> list[Any]:
    """One collapsible block per kernel: findings grouped by rule, most severe first."""
    blocks = []
    for (kid, kname), g in rules.groupby(["kernel_id", "kernel_name"], sort=True):
        grouped = []
        for (mtype, rule, title), r in g.groupby(["message_type", "rule_name", "title"], sort=False):
            msgs = list(dict.fromkeys(clean_rule_text(m) for m in r["message"]))
            grouped.append({"type": mtype, "rule": rule or r["rule"].iloc[0], "title": title, "message": msgs[0],
                            "more": len(msgs) - 1, "speedup": r["estimated_speedup"].max(),
                            "speedup_type": next((t for t in r["speedup_type"] if t), "")})
        grouped.sort(key=lambda x: (_SEVERITY.get(x["type"], 9), -(0 if _isnan(x["speedup"]) else x["speedup"])))
        counts = g["message_type"].value_counts()
        summary = ", ".join(f"{n} {t.lower()}" for t, n in counts.items())
        spec = [("type", lambda r: Cell(r["type"], "rule-" + r["type"].lower())),
                ("rule", lambda r: Cell(r["rule"], "")), ("finding", lambda r: Cell(r["title"], "")),
                ("message", lambda r: Cell(r["message"] + (f" (+{r['more']} similar)" if r["more"] else ""), "msg")),
                ("estimated speedup", lambda r: Cell("–" if _isnan(r["speedup"]) else
                                                     f"{r['speedup']:.0f}% ({r['speedup_type'] or '?'})", "num"))]
        shown = kernel_cell(kname).text
        full = [NoteBlock(f"Kernel: {kname}")] if shown != kname else []
        blocks.append(DetailsBlock(f"kernel #{kid} {shown}: {len(g)} finding(s): {summary}",
                                   full + [_table(grouped, spec)],
                                   open=bool(counts.get("ERROR", 0))))
    return blocks
