"""Report stage, figures: one function per figure of the HTML report.

Every builder takes tidy DataFrames (or the plain dicts a run stores) and returns a
matplotlib ``Figure``; :func:`png` turns a figure into PNG bytes. Figures are made
with ``matplotlib.figure.Figure`` on the Agg canvas directly, never through pyplot,
so nothing here touches global state (no current figure, no rcParams, no backend
switch) and building figures from several threads or a notebook is safe.

Figures are deterministic: fixed widths, heights that depend only on the data, fixed
colours per variant and stall reason, and PNGs written without a timestamp or
software tag, so the same data gives the same bytes.

Builders do not decide whether a figure makes sense; the report's panels check the
data first and only call a builder with something to draw.
"""

from __future__ import annotations

import io
import math
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from characterize.kernels.registry import VARIANT_ORDER
from characterize.units import format_bytes, format_count
from characterize.workloads.presets import HOTNESS_ORDER

__all__ = [
    "DATASET_ORDER", "VARIANT_ORDER", "variant_color", "png", "stamp", "order_variants", "order_datasets",
    "grouped_bars", "latency_figure", "speedup_figure", "bandwidth_figure", "prepass_figure",
    "coverage_figure", "reuse_figure", "register_sweep_figure", "static_occupancy_figure",
    "occupancy_figure", "stall_figure", "hit_rate_figure", "dram_figure",
    "prediction_figure", "predicted_vs_measured_figure",
    "kernel_duration_figure", "kernel_occupancy_figure", "kernel_stall_figure", "weighted_stall_figure",
    "sol_figure", "memory_chart_figure", "roofline_figure", "bandwidth_roofline_figure", "sass_figure",
    "precision_grid_figure", "cache_hit_figure", "host_time_figure", "host_bytes_figure", "why_figure", "format_rate",
]

#: a figure is 800 px wide and shown at about 540 (two per row, or in a card half a row wide);
#: drawn on a canvas SCALE times as large in inches at 1/SCALE the DPI, its text keeps about
#: 10 px when shown, where 800 px of 8 inches at 100 DPI shrank 9 pt labels to 8 px
SCALE = 0.8
WIDTH_IN = 8.0 * SCALE   # every figure is this wide; heights follow the data (in the 8-inch units, times SCALE)
DPI = 100 / SCALE
#: the two figures drawn across a whole row (memory chart, warp stalls): shown at their own size, so unscaled
ROW_WIDTH_IN, ROW_DPI = 10.0, 100
FONT = 9

#: presentation order of the technique family and of the hotness levels
DATASET_ORDER = HOTNESS_ORDER  # datasets are ordered like the hotness presets

_VARIANT_COLORS = {
    "torch": "#7f7f7f", "base": "#1f77b4", "optmt": "#ff7f0e", "rpf": "#2ca02c", "l2p": "#d62728",
    "l2w": "#9467bd", "combined": "#8c564b", "warp": "#e377c2",
}
_EXTRA_COLORS = ("#17becf", "#bcbd22", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd")
_STALL_COLORS = {
    "long_scoreboard": "#d62728", "wait": "#1f77b4", "short_scoreboard": "#ff9896", "lg_throttle": "#ff7f0e",
    "mio_throttle": "#ffbb78", "math_pipe_throttle": "#2ca02c", "not_selected": "#98df8a", "selected": "#9467bd",
    "branch_resolving": "#c5b0d5", "no_instruction": "#8c564b", "dispatch_stall": "#c49c94",
    "barrier": "#e377c2", "membar": "#f7b6d2", "drain": "#bcbd22", "imc_miss": "#dbdb8d", "tex_throttle": "#17becf",
    "sleeping": "#9edae5", "misc": "#c7c7c7", "gmma": "#393b79", "other": "#7f7f7f",
}


# ---------------------------------------------------------------------- helpers
def png(fig: Figure) -> bytes:
    """PNG bytes of a figure (Agg canvas, no metadata, so identical data gives identical bytes)."""
    canvas = FigureCanvasAgg(fig)
    buf = io.BytesIO()
    canvas.print_png(buf, metadata={"Software": None})
    return buf.getvalue()


def stamp(fig: Figure, text: str, color: str = "#b3261e") -> Figure:
    """Write a provenance warning into the figure itself (top right), so that it stays
    with the image when the figure is copied out of the report. It is the figure's
    suptitle, so the layout keeps a line for it above the title instead of drawing it over
    a long one."""
    fig.suptitle(_text(text, 80), x=0.99, ha="right", fontsize=FONT, fontweight="bold", color=color,
                 bbox={"boxstyle": "round,pad=0.25", "facecolor": "white", "edgecolor": color, "linewidth": 0.8})
    return fig


def _figure(height_in: float) -> tuple[Figure, object]:
    fig = Figure(figsize=(WIDTH_IN, SCALE * max(1.8, min(height_in, 30.0))), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot(1, 1, 1)


def _text(s: object, limit: int = 40) -> str:
    """Label text safe for matplotlib: no mathtext ($), no control characters, bounded length."""
    t = " ".join(str(s).split()).replace("$", r"\$")
    return t if len(t) <= limit else t[: limit - 1] + "…"


def format_rate(v: object) -> str:
    """Bytes per second in the binary units of characterize.units ('3.7 TiB/s')."""
    text = format_bytes(v)
    return text if text == "–" else text + "/s"


def _style(ax, title: str | None = None, ylabel: str | None = None, xlabel: str | None = None) -> None:
    if title:
        ax.set_title(_text(title, 110), fontsize=FONT + 1, loc="left")
    if ylabel:
        ax.set_ylabel(_text(ylabel, 80), fontsize=FONT)
    if xlabel:
        ax.set_xlabel(_text(xlabel, 80), fontsize=FONT)
    ax.tick_params(labelsize=FONT - 1)
    ax.grid(axis="y", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _legend(ax, **kw) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(fontsize=FONT - 1, frameon=False, **kw)


def order_variants(names: Iterable[str]) -> list[str]:
    """Variants in family order, unknown ones after, alphabetically."""
    names = list(dict.fromkeys(str(n) for n in names))
    known = [v for v in VARIANT_ORDER if v in names]
    return known + sorted(n for n in names if n not in VARIANT_ORDER)


def order_datasets(names: Iterable[str]) -> list[str]:
    """Hotness levels from hottest to coldest, other datasets after, alphabetically."""
    names = list(dict.fromkeys(str(n) for n in names))
    known = [d for d in DATASET_ORDER if d in names]
    return known + sorted(n for n in names if n not in DATASET_ORDER)


def variant_color(name: str, others: Sequence[str] = ()) -> str:
    """The fixed colour of a variant; unknown names get a stable colour by their rank in `others`."""
    if name in _VARIANT_COLORS:
        return _VARIANT_COLORS[name]
    extra = sorted(n for n in others if n not in _VARIANT_COLORS)
    i = extra.index(name) if name in extra else sum(map(ord, name))
    return _EXTRA_COLORS[i % len(_EXTRA_COLORS)]


def _short(name: str, limit: int = 18) -> str:
    """A dataset label for an axis: a trace path becomes its file name."""
    s = str(name)
    if "/" in s:
        s = s.rstrip("/").rsplit("/", 1)[-1]
    return _text(s, limit)


# ----------------------------------------------------------------- bar charts
def grouped_bars(df: pd.DataFrame, *, group: str, series: str, value: str, err: str | None = None,
                 title: str = "", ylabel: str = "", ref: float | None = None, ref_label: str | None = None,
                 log: bool = False, groups: Sequence[str] | None = None, series_order: Sequence[str] | None = None,
                 colors: Mapping[str, str] | None = None, ylim: tuple[float, float] | None = None,
                 band: tuple[str, str] | None = None) -> Figure:
    """Bars of `value` for each `group` (x axis) and `series` (colours), with optional
    error bars (`err`, symmetric; or `band`, the columns of its low and high ends) and a
    horizontal reference line."""
    groups = list(groups) if groups is not None else order_datasets(df[group])
    series_names = list(series_order) if series_order is not None else order_variants(df[series])
    n = max(1, len(series_names))
    fig, ax = _figure(3.4)
    width = 0.8 / n
    x = np.arange(len(groups))
    table = df.set_index([group, series])
    for i, s in enumerate(series_names):
        vals, errs, below, above = [], [], [], []
        for g in groups:
            row = table.loc[(g, s)] if (g, s) in table.index else None
            if isinstance(row, pd.DataFrame):
                row = row.iloc[0]
            v = float(row[value]) if row is not None and pd.notna(row[value]) else np.nan
            vals.append(v)
            errs.append(float(row[err]) if (err and row is not None and pd.notna(row[err])) else 0.0)
            if band:
                lo, hi = (float(row[c]) if row is not None and pd.notna(row[c]) else v for c in band)
                below.append(max(0.0, v - lo) if np.isfinite(v) else 0.0)
                above.append(max(0.0, hi - v) if np.isfinite(v) else 0.0)
        color = (colors or {}).get(s) or variant_color(s, series_names)
        yerr = [below, above] if band else errs if err else None
        ax.bar(x - 0.4 + width * (i + 0.5), vals, width, label=_text(s, 24), color=color,
               yerr=yerr, capsize=2 if yerr is not None else 0, error_kw={"elinewidth": 0.8})
    if ref is not None and math.isfinite(ref):
        ax.axhline(ref, color="black", linewidth=1.0, linestyle="--", label=_text(ref_label, 50) if ref_label else None)
    ax.set_xticks(x, [_short(g) for g in groups])
    if log:
        ax.set_yscale("log")
    if ylim:
        ax.set_ylim(*ylim)
    _style(ax, title, ylabel)
    wide_label = max((len(x) for x in [*series_names, ref_label or ""]), default=0) > 16   # keep the legend inside
    _legend(ax, ncols=min(3 if wide_label else 4, n + (1 if ref_label else 0)), loc="upper left",
            bbox_to_anchor=(0, -0.12))
    return fig


def latency_figure(s: pd.DataFrame, title: str) -> Figure:
    """Per-table latency (mean, 95% CI) per variant x dataset, from analyze.speedups()."""
    return grouped_bars(s, group="dataset", series="variant", value="latency_us", err="latency_ci95_us",
                        title=title, ylabel="latency per table (µs)")


def speedup_figure(s: pd.DataFrame, reference: str, title: str) -> Figure:
    """Speedup over `reference` (ratio of means, 95% CI) per variant x dataset; 1 = as fast."""
    col = f"speedup_vs_{reference}"
    d = s[s[col].notna() & (s["variant"] != reference)] if col in s.columns else s.iloc[0:0]
    return grouped_bars(d, group="dataset", series="variant", value=col, err=f"{col}_ci95", title=title,
                        ylabel=f"speedup over {reference} (×)", ref=1.0, ref_label=f"{reference} (1×)")


def bandwidth_figure(s: pd.DataFrame, peak_GBps: float | None, title: str) -> Figure:
    """Effective bandwidth (bytes a table launch requests / its time) beside the HBM peak.
    Requested bytes that an L1 or L2 hit served never reached DRAM, so a hot trace's bars
    pass the HBM line without beating it: the labels say so (the Nsight Compute bandwidth
    roofline sets each level's bytes against its own peak)."""
    log = peak_GBps is None or (s["effective_GBps"].max() < 0.02 * peak_GBps if len(s) else False)
    return grouped_bars(s, group="dataset", series="variant", value="effective_GBps", title=title,
                        ylabel="requested bytes / time (GB/s)", ref=peak_GBps,
                        ref_label=f"HBM peak {peak_GBps:,.0f} GB/s (bounds DRAM bytes only)" if peak_GBps else None,
                        log=log)


def prepass_figure(p: pd.DataFrame, title: str) -> Figure:
    """Stacked horizontal bars: lookup kernel and L2 pre-pass time per table launch, one bar
    per variant x dataset, the variants apart by a gap. Horizontal so that 'combined ·
    one-item' stays one readable label however many points there are (vertical bars
    squeezed fifteen two-line labels into each other)."""
    variants = list(p["variant"].astype(str))
    gaps = np.cumsum([0] + [1 if a != b else 0 for a, b in zip(variants, variants[1:])])
    y = -(np.arange(len(p)) + 0.6 * gaps)
    fig, ax = _figure(1.3 + 0.27 * len(p) + 0.15 * (gaps[-1] if len(gaps) else 0))
    kernel = p["latency_us"].to_numpy(dtype=float)
    pre = p["prepass_per_table_us"].fillna(0).to_numpy(dtype=float) if "prepass_per_table_us" in p.columns \
        else np.zeros(len(p))
    ax.barh(y, kernel, 0.7, label="lookup kernel", color="#1f77b4")
    ax.barh(y, pre, 0.7, left=kernel, label="L2 pre-pass", color="#ff7f0e")
    ax.set_yticks(y, [f"{_text(v, 12)} · {_short(d, 14)}" for v, d in zip(p["variant"], p["dataset"])])
    _style(ax, title, None, "time per table launch (µs)")
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.grid(axis="y", visible=False)
    _legend(ax, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=2)
    ax.set_title(_text(title, 110), fontsize=FONT + 1, loc="left", pad=20)
    return fig


# ------------------------------------------------------------------- locality
def _coverage_points(entry: Mapping) -> tuple[np.ndarray, np.ndarray]:
    """The stored (K, coverage) points, plus K = unique rows at full coverage (every
    distinct row: exact, not an estimate)."""
    cov = entry.get("top_k_coverage") or {}
    pts = sorted((int(k), float(v)) for k, v in cov.items())
    unique = entry.get("unique_rows")
    if unique and all(k != int(unique) for k, _ in pts):
        pts.append((int(unique), 1.0))
        pts.sort()
    # K beyond the distinct rows covers everything, whatever was stored
    pts = [(k, 1.0 if unique and k >= int(unique) else v) for k, v in pts]
    return np.array([k for k, _ in pts], dtype=float), np.array([v for _, v in pts], dtype=float)


_DATASET_COLORS = ("#d62728", "#ff7f0e", "#2ca02c", "#1f77b4", "#7f7f7f")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _dataset_color(ds: str, i: int) -> str:
    return _DATASET_COLORS[DATASET_ORDER.index(ds)] if ds in DATASET_ORDER else _EXTRA_COLORS[i % len(_EXTRA_COLORS)]


def coverage_figure(locality: Mapping[str, Mapping], marks: Mapping[str, int] | None = None,
                    title: str = "Top-K coverage") -> Figure:
    """Fraction of lookups served by the K most frequent rows, per dataset, on a log
    axis from K = 1. Points: the K values locality.json stores, plus K = unique rows
    (100%, exact), which puts a one-row trace at K = 1. Below the smallest stored K
    nothing is known and the axis says so (shaded). Each dataset has its own marker and
    lines drawn later are thinner, so coinciding curves stay visible. GPU L2
    capacities are vertical lines named in the legend, clear of the data."""
    fig, ax = _figure(3.6)
    names = order_datasets(locality)
    top = max([float(e.get("rows") or 0) for e in locality.values()] + [10.0])
    stored = [int(k) for e in locality.values() for k in (e.get("top_k_coverage") or {})]
    first = min(stored) if stored else None
    if first and first > 1:
        ax.axvspan(1, first, color="#f0f0f0", zorder=0, linewidth=0)
        ax.text(math.sqrt(first), 50, f"coverage below K = {first:,}\nnot stored by the locality step", ha="center",
                va="center", fontsize=FONT - 1, color="#777777", zorder=1)
    n = len(names)
    for i, ds in enumerate(names):
        k, v = _coverage_points(locality[ds])
        if not len(k):
            continue
        width = 1.2 + 2.0 * (n - 1 - i) / max(1, n - 1)
        xs, ys = (np.concatenate([k, [top]]), np.concatenate([v, [1.0]])) if v[-1] >= 1 and k[-1] < top else (k, v)
        ax.plot(xs, 100 * ys, marker=_MARKERS[i % len(_MARKERS)], markevery=list(range(len(k))), markersize=4.5,
                linewidth=width, color=_dataset_color(ds, i), alpha=0.9, label=_short(ds, 24), zorder=3)
    styles = ("--", ":", "-.", (0, (5, 1, 1, 1)))
    for j, (label, kk) in enumerate((marks or {}).items()):
        ax.axvline(kk, color="#555555", linewidth=0.9, linestyle=styles[j % len(styles)], zorder=2,
                   label=_text(f"{label} ({kk:,} rows)", 40))
    ax.set_xscale("log")
    ax.set_xlim(1, top * 1.3)
    ax.set_ylim(0, 103)
    _style(ax, title, "lookups covered (%)", "K (most frequent rows), log scale")
    _legend(ax, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def reuse_figure(locality: Mapping[str, Mapping], title: str = "Reuse-distance distribution") -> Figure:
    """Fraction of lookups per reuse-distance bin (distinct rows since the previous read of
    the row; log2 bins); first reads are given in the legend."""
    fig, ax = _figure(3.4)
    names = order_datasets(locality)
    for i, ds in enumerate(names):
        hist = locality[ds].get("reuse_histogram") or []
        first = sum(f for lo, hi, f in hist if lo < 0)
        bins = sorted((lo, hi, f) for lo, hi, f in hist if lo >= 0)
        if not bins:
            continue
        # [lo, hi) bins of powers of two; distance 0 (re-read with nothing between) is drawn from 0.5
        xs, ys = [], []
        for lo, hi, f in bins:
            if xs and max(lo, 0.5) > xs[-1]:  # an empty bin between two others
                xs += [xs[-1], max(lo, 0.5)]
                ys += [0.0, 0.0]
            xs += [max(lo, 0.5), max(hi, 1)]
            ys += [100 * f, 100 * f]
        color = (("#d62728", "#ff7f0e", "#2ca02c", "#1f77b4", "#7f7f7f")[DATASET_ORDER.index(ds)]
                 if ds in DATASET_ORDER else _EXTRA_COLORS[i % len(_EXTRA_COLORS)])
        ax.plot(xs, ys, linewidth=1.3, color=color, label=f"{_short(ds, 20)} (first reads {100 * first:.1f}%)")
    ax.set_xscale("log", base=2)
    _style(ax, title, "lookups (%)", "reuse distance (distinct rows between two reads of a row)")
    _legend(ax, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


# --------------------------------------------------------------------- static
def register_sweep_figure(sweep: pd.DataFrame, title: str = "Register sweep") -> Figure:
    """Theoretical occupancy (solid) and spill bytes per thread (dashed) against the
    -maxrregcount cap, one panel per architecture; variants compiling to the same curve share a line."""
    archs = sorted(sweep["arch"].unique())
    fig = Figure(figsize=(WIDTH_IN, SCALE * 3.9 * len(archs)), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    for a_i, arch in enumerate(archs):
        ax = fig.add_subplot(len(archs), 1, a_i + 1)
        ax2 = ax.twinx()
        d = sweep[sweep["arch"] == arch].copy()
        d["spill_bytes"] = d["spill_stores"] + d["spill_loads"]
        curves: dict[tuple, list[str]] = {}
        for v in order_variants(d["variant"]):
            dv = d[d["variant"] == v].sort_values("maxrregcount")
            key = (tuple(dv["maxrregcount"]), tuple(dv["theoretical_occupancy_pct"]), tuple(dv["spill_bytes"]))
            curves.setdefault(key, []).append(v)
        n = len(curves)
        for i, (key, variants) in enumerate(curves.items()):
            caps, occ, spills = key
            color = variant_color(variants[0], list(d["variant"].unique()))
            label = _text("/".join(variants), 40)
            width = 1.4 + 2.2 * (n - 1 - i) / max(1, n - 1)  # earlier curves wider: coinciding ones stay visible
            ax.plot(caps, occ, marker="o", markersize=2.5 + width, linewidth=width, color=color, alpha=0.85,
                    label=f"{label} occupancy")
            ax2.plot(caps, spills, marker="x", markersize=3 + width, linewidth=width, linestyle="--", color=color,
                     alpha=0.85, label=f"{label} spills")
        ax.set_ylim(0, 105)
        _style(ax, f"{title}: {arch}", "theoretical occupancy (%)", "-maxrregcount")
        ax2.set_ylabel("spill stores + loads (B/thread)", fontsize=FONT)
        ax2.tick_params(labelsize=FONT - 1)
        ax2.spines["top"].set_visible(False)
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize=FONT - 2, frameon=False, loc="upper left", bbox_to_anchor=(0.0, -0.2),
                  ncols=2)
    return fig


def static_occupancy_figure(static: pd.DataFrame, title: str = "Theoretical occupancy") -> Figure:
    """Theoretical occupancy per variant (as configured), one bar group per architecture."""
    d = static.copy()
    d["label"] = d["variant"]
    return grouped_bars(d, group="arch", series="variant", value="theoretical_occupancy_pct", title=title,
                        ylabel="theoretical occupancy (%)", groups=sorted(d["arch"].unique()), ylim=(0, 105))


# ------------------------------------------------------------------------ ncu
def _point_labels(df: pd.DataFrame) -> list[str]:
    return [f"{_text(v, 14)} · {_short(d, 14)}" for v, d in zip(df["variant"], df["dataset"])]


def _paired_bars(k: pd.DataFrame, title: str, ylabel: str, bars: tuple[tuple[str, str, str], ...],
                 height: float = 3.4) -> Figure:
    """Two bars per profiled lookup kernel (variant x dataset): (column, label, color) each."""
    fig, ax = _figure(height)
    x = np.arange(len(k))
    for offset, (col, label, color) in zip((-0.2, 0.2), bars):
        ax.bar(x + offset, k[col], 0.4, label=label, color=color)
    ax.set_xticks(x, _point_labels(k), rotation=30, ha="right")
    ax.set_ylim(0, 105)
    _style(ax, title, ylabel)
    _legend(ax, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncols=2)
    return fig


def occupancy_figure(k: pd.DataFrame, title: str) -> Figure:
    """Achieved vs theoretical occupancy per profiled lookup kernel (variant x dataset)."""
    return _paired_bars(k, title, "occupancy (% of max warps per SM)",
                        (("theoretical_occupancy_pct", "theoretical", "#aec7e8"),
                         ("achieved_occupancy_pct", "achieved", "#1f77b4")))


def stall_figure(stalls: pd.DataFrame, title: str, top: int = 8, keep: Sequence[str] | None = None) -> Figure:
    """Stacked warp-stall breakdown (cycles per issued instruction) per variant x dataset
    (long: variant, dataset, reason, cycles); the reasons in `keep` (else the `top`
    largest by their plain sum), the rest as 'other'."""
    if keep is None:
        totals = stalls.groupby("reason")["cycles"].sum().sort_values(ascending=False)
        keep = [r for r in totals.index if totals[r] > 0][:top]
    keep = list(keep)
    d = stalls.copy()
    d["reason"] = d["reason"].where(d["reason"].isin(keep), "other")
    pivot = d.pivot_table(index=["variant", "dataset"], columns="reason", values="cycles", aggfunc="sum",
                          fill_value=0.0)
    rows = [(v, ds) for v in order_variants(pivot.index.get_level_values(0))
            for ds in order_datasets(pivot.index.get_level_values(1)) if (v, ds) in pivot.index]
    pivot = pivot.loc[rows]
    reasons = keep + (["other"] if "other" in pivot.columns and pivot["other"].sum() > 0 else [])
    fig, ax = _figure(1.2 + 0.28 * len(rows))
    y = np.arange(len(rows))[::-1]
    left = np.zeros(len(rows))
    for r in reasons:
        vals = pivot[r].to_numpy() if r in pivot.columns else np.zeros(len(rows))
        ax.barh(y, vals, 0.7, left=left, label=_text(r.replace("_", " "), 24), color=_STALL_COLORS.get(r, "#7f7f7f"))
        left += vals
    ax.set_yticks(y, [f"{_text(v, 14)} · {_short(ds, 14)}" for v, ds in rows])
    _style(ax, title, None, "stall cycles per issued instruction")
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    _legend(ax, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def hit_rate_figure(k: pd.DataFrame, title: str) -> Figure:
    """L1 and L2 sector hit rates per profiled lookup kernel (variant x dataset)."""
    return _paired_bars(k, title, "sector hit rate (%)", (("l1_hit_rate_pct", "L1/TEX hit rate", "#98df8a"),
                                                          ("l2_hit_rate_pct", "L2 hit rate", "#2ca02c")))


def _byte_scale(top: float) -> tuple[str, float]:
    """The binary unit (characterize.units) an axis of bytes up to `top` is drawn in."""
    return next(((u, f) for u, f in (("TiB", 2.0**40), ("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10))
                 if top >= f), ("B", 1.0))


def dram_figure(k: pd.DataFrame, title: str, scope: str = "") -> Figure:
    """DRAM bytes read and written per profiled lookup kernel (variant x dataset), in binary
    units; `scope` ('per table') goes into the axis label."""
    fig, ax = _figure(3.4)
    x = np.arange(len(k))
    cols = [c for c in ("dram_bytes_read", "dram_bytes_write") if c in k.columns]
    top = float(np.nanmax(k[cols].to_numpy(dtype=float))) if len(k) and k[cols].notna().any().any() else 0.0
    unit, scale = _byte_scale(top)
    for offset, (col, label, color) in zip((-0.2, 0.2), (("dram_bytes_read", "read", "#1f77b4"),
                                                          ("dram_bytes_write", "written", "#ff7f0e"))):
        if col in k.columns:
            ax.bar(x + offset, k[col] / scale, 0.4, label=label, color=color)
    ax.set_xticks(x, _point_labels(k), rotation=30, ha="right")
    _style(ax, title, f"DRAM bytes{' ' + scope if scope else ''} ({unit})")
    _legend(ax, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncols=2)
    return fig


# ---------------------------------------------------------------------- model
def prediction_figure(pred: pd.DataFrame, gpu: str, title: str) -> Figure:
    """Predicted speedup over base per variant x dataset for one GPU (model predictions);
    with the columns speedup, speedup_low and speedup_high (analysis.answer.predicted_speedups)
    the bars carry the model's band as error bars."""
    d = pred[pred["gpu"] == gpu] if "gpu" in pred.columns else pred
    if {"speedup", "speedup_low", "speedup_high"} <= set(d.columns):
        d = d[d["variant"] != "base"]
        return grouped_bars(d, group="dataset", series="variant", value="speedup", title=title,
                            ylabel="predicted speedup over base (×)", ref=1.0, ref_label="base (1×)",
                            band=("speedup_low", "speedup_high"))
    return grouped_bars(d, group="dataset", series="variant", value="speedup_vs_base", title=title,
                        ylabel="predicted speedup over base (×)", ref=1.0, ref_label="base (1×)")


#: the model's time terms (predictions.csv columns) and how the "why" chart names and colours them
WHY_TERMS = (("latency_us", "latency (memory waits)", "#d62728"), ("dram_us", "DRAM bandwidth", "#08519c"),
             ("l2_us", "L2 bandwidth", "#6baed6"), ("l1_us", "L1 bandwidth", "#9edae5"),
             ("issue_us", "instruction issue", "#2ca02c"))


def why_figure(rows: pd.DataFrame, title: str) -> Figure:
    """The model's "why" per variant for one GPU and dataset: each term the predicted time
    is the largest of (latency, DRAM, L2, L1 bandwidth, issue, in µs per table),
    the term that sets the time drawn solid and the others faint, with the predicted L1
    and L2 hit rates beside each variant."""
    terms = [t for t in WHY_TERMS if t[0] in rows.columns]
    variants = order_variants(rows["variant"])
    d = rows.drop_duplicates("variant").set_index("variant")
    n = max(1, len(terms))
    fig, ax = _figure(1.1 + 0.12 * n * len(variants))
    step = n * 0.18 + 0.3
    y0 = np.arange(len(variants))[::-1] * step
    top = 0.0
    for i, (col, label, color) in enumerate(terms):
        vals = np.array([float(d.loc[v, col]) if v in d.index and pd.notna(d.loc[v, col]) else 0.0 for v in variants])
        top = max(top, float(vals.max()) if len(vals) else 0.0)
        binding = np.array([v in d.index and vals[j] > 0 and vals[j] >= max(
            float(d.loc[v, c]) if pd.notna(d.loc[v, c]) else 0.0 for c, _, _ in terms) - 1e-9
            for j, v in enumerate(variants)])
        y = y0 + (n / 2 - i - 0.5) * 0.18
        ax.barh(y[~binding], vals[~binding], 0.16, color=color, alpha=0.35,
                label=None if binding.any() else label)
        if binding.any():
            ax.barh(y[binding], vals[binding], 0.16, color=color, edgecolor="black", linewidth=0.6, label=label)
    for v, y in zip(variants, y0):
        hits = []
        for col, name in (("l1_hit_rate_pct", "L1"), ("l2_hit_rate_pct", "L2")):
            if col in d.columns and v in d.index and pd.notna(d.loc[v, col]):
                hits.append(f"{name} hit {float(d.loc[v, col]):.0f}%")
        if hits:
            ax.annotate(", ".join(hits), (top * 1.02, y), va="center", fontsize=FONT - 2, color="#333333")
    ax.set_yticks(y0, [_text(v, 16) for v in variants])
    ax.set_xlim(0, top * 1.32 if top > 0 else 1)
    _style(ax, title, None, "predicted µs per table (the time is the largest term + launch overhead)")
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.grid(axis="y", visible=False)
    _legend(ax, loc="upper left", bbox_to_anchor=(0, -0.14), ncols=3)
    return fig


def e2e_stage_figure(rows: pd.DataFrame, stages: Sequence[str], title: str) -> Figure:
    """One stacked horizontal bar per variant: its batch time split by stage (the stage's
    kernels plus the idle time before them), in execution order."""
    variants = order_variants(rows["variant"].unique())
    table = rows.pivot_table(index="variant", columns="stage", values="time_us", aggfunc="mean")
    # the bars, or (few variants) the title, prediction stamp, axis label and the stages' legend below
    legend_rows = math.ceil(sum(st in table.columns for st in stages) / 3)
    fig, ax = _figure(max(0.9 + 0.32 * len(variants), 2.4 + 0.3 * legend_rows))
    left = np.zeros(len(variants))
    colors = ("#7f7f7f", "#9467bd", "#d62728", "#2ca02c", "#1f77b4", "#8c564b", "#17becf", "#bcbd22", "#ff7f0e",
              "#e377c2")
    for i, st in enumerate(stages):   # colours follow the stage, whichever stages a chart has
        if st not in table.columns:
            continue
        vals = np.array([float(table.loc[v, st]) if v in table.index and pd.notna(table.loc[v, st]) else 0.0
                         for v in variants]) / 1000.0
        ax.barh(range(len(variants)), vals, left=left, color=colors[i % len(colors)], label=st.replace("_", " "))
        left += vals
    ax.set_yticks(range(len(variants)), variants)
    ax.invert_yaxis()
    _style(ax, title, xlabel="time per batch (ms)")
    _legend(ax, ncols=3, loc="upper left", bbox_to_anchor=(0, -0.18))
    return fig


def predicted_vs_measured_figure(df: pd.DataFrame, title: str, measured: str = "measured_us",
                                 predicted: str = "predicted_us", unit: str = "µs") -> Figure:
    """Model prediction against measurement, one point per variant x dataset, log-log, y = x dashed."""
    fig, ax = _figure(4.2)
    variants = order_variants(df["variant"])
    for v in variants:
        d = df[df["variant"] == v]
        ax.scatter(d[measured], d[predicted], s=22, color=variant_color(v, variants), label=_text(v, 20), zorder=3)
    _log_log_diagonal(ax, pd.concat([df[measured], df[predicted]]))
    _style(ax, title, f"predicted ({unit})", f"measured ({unit})")
    _legend(ax, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def _log_log_diagonal(ax, values: pd.Series) -> None:
    """Square log-log axes around the positive `values`, with the line prediction = measurement."""
    vals = values.astype(float)
    vals = vals[np.isfinite(vals) & (vals > 0)]
    if len(vals):
        lo, hi = float(vals.min()) / 1.5, float(vals.max()) * 1.5
        ax.plot([lo, hi], [lo, hi], color="black", linestyle="--", linewidth=0.8, label="prediction = measurement")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xscale("log")
        ax.set_yscale("log")


def trust_figure(rows: pd.DataFrame, title: str) -> Figure:
    """The model against public measurements it was not fitted to, log-log: each held-out
    prediction with its band as an error bar, one marker colour per source; proxies (our
    implementation standing in for a kernel no one can read) hollow and grey."""
    fig, ax = _figure(4.4)
    own = rows[~rows["proxy"].astype(str).str.lower().isin(("true", "1"))]
    sources = list(dict.fromkeys(own["source"]))
    palette = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"]
    for i, src in enumerate(sources):
        d = own[own["source"] == src]
        y = d["cv_predicted_us"].astype(float)
        err = [y - d["band_low_us"].astype(float), d["band_high_us"].astype(float) - y]
        ax.errorbar(d["measured_us"].astype(float), y, yerr=err, fmt="o", ms=4, capsize=2, lw=0.8,
                    color=palette[i % len(palette)], label=_text(f"{src} ({len(d)})", 34), zorder=3)
    proxies = rows[~rows.index.isin(own.index)]
    if not proxies.empty:
        ax.scatter(proxies["measured_us"].astype(float), proxies["cv_predicted_us"].astype(float), s=26,
                   facecolors="none", edgecolors="#7f7f7f", label=f"proxies ({len(proxies)})", zorder=2)
    _log_log_diagonal(ax, pd.concat([rows["measured_us"], rows["band_low_us"], rows["band_high_us"]]))
    _style(ax, title, "predicted, held out (µs)", "measured (µs)")
    _legend(ax, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


# -------------------------------------------------------------- generic kernels
def _labels(w: pd.DataFrame) -> list[str]:
    """Distinct kernel labels: the 'label' column when present (analysis.ncu.kernel_labels)."""
    if "label" in w.columns:
        return [_text(x, 48) for x in w["label"]]
    return [f"#{int(i)} {_text(f, 34)}" for i, f in zip(w["kernel_id"], w["function"])]


def kernel_duration_figure(w: pd.DataFrame, title: str) -> Figure:
    """Duration per profiled kernel on a linear axis (bar length = time), each bar
    labelled with its share of the total; longest first."""
    d = w[w["duration_ns"].notna()].sort_values("duration_ns", ascending=False, kind="stable")
    fig, ax = _figure(1.3 + 0.32 * len(d))
    y = np.arange(len(d))[::-1]
    top = float(d["duration_ns"].max()) if len(d) else 0.0
    unit, scale = next(((u, f) for u, f in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)) if top >= 10 * f), ("ns", 1.0))
    vals = d["duration_ns"].to_numpy(dtype=float) / scale
    ax.barh(y, vals, 0.65, color="#1f77b4", label=f"duration ({unit})")
    total = float(d["duration_ns"].sum())
    for yy, v, ns in zip(y, vals, d["duration_ns"]):
        ax.annotate(f"{100 * ns / total:.1f}%", (v, yy), xytext=(3, 0), textcoords="offset points", va="center",
                    fontsize=FONT - 2, color="#333333")
    ax.set_yticks(y, _labels(d))
    ax.set_xlim(0, (vals.max() if len(vals) else 1) * 1.15)
    _style(ax, title, None, f"duration ({unit}, linear); labels: share of the summed duration")
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.grid(axis="y", visible=False)   # the axis label names the bars: no legend to crowd the title
    return fig


def kernel_occupancy_figure(w: pd.DataFrame, title: str) -> Figure:
    """Achieved vs theoretical occupancy per profiled kernel, horizontal bars, with the
    launch's waves per SM (launch__waves_per_multiprocessor) written beside each pair when
    known: a launch of under one wave leaves SMs idle whatever its occupancy."""
    d = w[w["achieved_occupancy_pct"].notna() | w["theoretical_occupancy_pct"].notna()]
    fig, ax = _figure(1.2 + 0.4 * len(d))
    y = np.arange(len(d))[::-1]
    ax.barh(y + 0.2, d["theoretical_occupancy_pct"], 0.4, label="theoretical", color="#aec7e8")
    ax.barh(y - 0.2, d["achieved_occupancy_pct"], 0.4, label="achieved", color="#1f77b4")
    ax.set_yticks(y, _labels(d))
    waves = d["waves_per_sm"] if "waves_per_sm" in d.columns else pd.Series(np.nan, index=d.index)
    ax.set_xlim(0, 135 if waves.notna().any() else 105)   # room for the waves beside the bars
    ax.set_xticks(range(0, 101, 20))
    for yy, wv in zip(y, waves):
        if pd.notna(wv):
            ax.annotate(f"{float(wv):.2f} waves/SM", (102, yy), va="center", fontsize=FONT - 2, color="#333333")
    _style(ax, title, None, "occupancy (% of max warps per SM)")
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    _legend(ax, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def kernel_stall_figure(w: pd.DataFrame, title: str, top: int = 8) -> Figure:
    """Stacked warp stalls per profiled kernel (cycles per issued instruction)."""
    cols = [c for c in w.columns if c.startswith("stall_")]
    d = w[w[cols].notna().any(axis=1)]
    long = d.melt(id_vars=["kernel_id", "function"], value_vars=cols, var_name="reason", value_name="cycles")
    long["reason"] = long["reason"].str.removeprefix("stall_")
    long["cycles"] = long["cycles"].fillna(0.0)
    totals = long.groupby("reason")["cycles"].sum().sort_values(ascending=False)
    keep = [r for r in totals.index if totals[r] > 0][:top]
    fig, ax = _figure(1.2 + 0.3 * len(d))
    y = np.arange(len(d))[::-1]
    left = np.zeros(len(d))
    for r in keep + ["other"]:
        if r == "other":
            vals = d[[c for c in cols if c.removeprefix("stall_") not in keep]].fillna(0).sum(axis=1).to_numpy()
            if not vals.any():
                continue
        else:
            vals = d[f"stall_{r}"].fillna(0).to_numpy()
        ax.barh(y, vals, 0.7, left=left, label=_text(r, 24), color=_STALL_COLORS.get(r, "#7f7f7f"))
        left += vals
    ax.set_yticks(y, _labels(d))
    _style(ax, title, None, "stall cycles per issued instruction")
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    _legend(ax, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def weighted_stall_figure(long: pd.DataFrame, reasons: Sequence[str], title: str, rows: str = "kernels") -> Figure:
    """Two views of warp stalls per kernel (analysis.ncu.weighted_stalls). Left: each
    kernel's stall cycles as a share of all `rows`' stall cycles (cycles per issued
    instruction x the weight `long['weight']` names, the same for every row), so a long
    kernel's stalls weigh what they cost. Right: each kernel's own mix (100% per
    kernel). Reasons: `reasons` (largest weighted first), the rest as 'other'."""
    weight = str(long["weight"].iloc[0]) if "weight" in long.columns and len(long) else "none"
    key = [c for c in ("run", "report", "kernel_id") if c in long.columns]
    kernels = long.drop_duplicates(key)
    order = kernels.assign(_w=long.groupby(key, sort=False)["stall_cycles"].transform("sum").loc[kernels.index])
    order = order.sort_values("_w", ascending=False, kind="stable")
    fig = Figure(figsize=(ROW_WIDTH_IN, max(2.2, 1.3 + 0.34 * len(order))), dpi=ROW_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, sharey=True, width_ratios=(3, 2))
    y = np.arange(len(order))[::-1]
    shown = list(reasons) + ["other"]
    for panel, ax in enumerate(axes):
        left = np.zeros(len(order))
        for r in shown:
            vals = []
            for kr in order.to_dict("records"):
                g = long[(long[key] == pd.Series({c: kr[c] for c in key})).all(axis=1)]
                sel = g[~g["reason"].isin(reasons)] if r == "other" else g[g["reason"] == r]
                vals.append(float(sel["total_share_pct" if panel == 0 else "kernel_share_pct"].fillna(0).sum()))
            vals = np.array(vals)
            if r == "other" and not vals.any():
                continue
            ax.barh(y, vals, 0.7, left=left, color=_STALL_COLORS.get(r, "#7f7f7f"),
                    label=_text(r.replace("_", " "), 24) if panel == 0 else None)
            left += vals
        ax.grid(axis="x", color="#dddddd", linewidth=0.6)
        ax.set_axisbelow(True)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
        ax.tick_params(labelsize=FONT - 1)
        if panel == 0:
            ax.set_yticks(y, _labels(order))
            ax.set_xlabel(_text(f"share of all {rows}' stall cycles (%), weighted by {weight}", 80)
                          if weight != "none" else f"share of all {rows}' stall cycles per instruction (%)",
                          fontsize=FONT)
            ax.set_title(_text(title, 80), fontsize=FONT + 1, loc="left")
        else:
            ax.set_xlim(0, 100)
            ax.set_xlabel(f"each {rows.rstrip('s')}'s own stall mix (%)", fontsize=FONT)
    fig.legend(*axes[0].get_legend_handles_labels(), fontsize=FONT - 1, frameon=False, loc="outside lower center",
               ncols=min(5, len(shown)))
    return fig


_SOL_BARS = (("sm_throughput_pct", "SM (compute)", "#2ca02c"), ("memory_throughput_pct", "memory", "#1f77b4"),
             ("l1_throughput_pct", "L1/TEX", "#9edae5"), ("l2_throughput_pct", "L2", "#6baed6"),
             ("dram_throughput_pct", "DRAM", "#08519c"))


def sol_figure(k: pd.DataFrame, title: str, bound_pct: float = 60.0, detail: bool = True) -> Figure:
    """Speed of light per kernel: SM and memory throughput as % of peak (and, with
    `detail`, L1/TEX, L2 and DRAM). A unit below `bound_pct` (dashed) does not limit
    the kernel; both below it means latency-bound. Rows: `label` (or variant · dataset)."""
    bars = [b for b in (_SOL_BARS if detail else _SOL_BARS[:2]) if b[0] in k.columns]
    n = len(bars)
    fig, ax = _figure(1.5 + (0.11 * n + 0.1) * len(k))
    y = np.arange(len(k))[::-1] * (n * 0.2 + 0.3)
    for i, (col, label, color) in enumerate(bars):
        ax.barh(y + (n / 2 - i - 0.5) * 0.2, k[col].fillna(0).to_numpy(), 0.18, label=label, color=color)
    labels = list(k["label"]) if "label" in k.columns else _point_labels(k)
    ax.set_yticks(y, [_text(x, 48) for x in labels])
    ax.axvline(bound_pct, color="#b3261e", linewidth=1.0, linestyle="--", label=f"{bound_pct:.0f}%")
    ax.set_xlim(0, 105)
    _style(ax, title, None, "throughput (% of peak sustained)")
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.grid(axis="y", visible=False)
    ncols = min(n + 1, 4)
    _legend(ax, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=ncols)
    rows = -(-(n + 1) // ncols)   # the legend's rows above the axes, under the title
    ax.set_title(_text(title, 110), fontsize=FONT + 1, loc="left", pad=8 + 13 * rows)
    return fig


def memory_chart_figure(r: Mapping, title: str) -> Figure:
    """ncu's Memory Workload Analysis chart for one kernel: the SM, L1/TEX, L2 and DRAM
    as boxes with hit rates; arrows carry requests, sectors and bytes, reads above and
    writes below. Missing values read '–'; a level without traffic says so."""
    fig = Figure(figsize=(ROW_WIDTH_IN, 2.7), dpi=ROW_DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0, 0, 1, 0.9))
    ax.set_xlim(0, 10)
    ax.set_ylim(0.35, 3.45)
    ax.axis("off")
    fig.text(0.01, 0.97, _text(title, 120), fontsize=FONT + 1, va="top")

    def hit(level: str) -> str:
        traffic, rate = r.get(f"{level}_traffic"), r.get(f"{level}_hit_rate_pct")
        if traffic is False:
            return "no traffic"
        if rate is None or (isinstance(rate, float) and math.isnan(rate)):
            return "hit rate –"
        mark = "*" if r.get(f"{level}_hit_rate_clamped") else ""
        return f"hit {rate:.1f}%{mark}"

    inst, what = r.get("inst_issued"), "inst"
    if inst is None or (isinstance(inst, float) and math.isnan(inst)):
        inst, what = r.get("inst_executed"), "inst executed"
    boxes = [(0.2, "SM", f"{format_count(inst)} {what}"),
             (3.0, "L1/TEX", hit("l1")), (5.8, "L2", hit("l2")), (8.4, "DRAM", "")]
    for x, name, sub in boxes:
        ax.add_patch(FancyBboxPatch((x, 1.3), 1.4, 1.4, boxstyle="round,pad=0.05", facecolor="#eef2f5",
                                    edgecolor="#55606b", linewidth=1.0))
        ax.text(x + 0.7, 2.15, name, ha="center", va="center", fontsize=FONT + 1, fontweight="bold")
        if sub:
            ax.text(x + 0.7, 1.65, sub, ha="center", va="center", fontsize=FONT - 1)

    def arrow(x0: float, x1: float, yy: float, text: str, above: bool) -> None:
        ax.add_patch(FancyArrowPatch((x0, yy), (x1, yy), arrowstyle="-|>", mutation_scale=12, color="#1f5fa8",
                                     linewidth=1.2))
        ax.text((x0 + x1) / 2, yy + (0.12 if above else -0.12), text, ha="center", va="bottom" if above else "top",
                fontsize=FONT - 2, linespacing=1.15)

    def sec(v: object) -> str:
        return format_count(v)

    def byt(v: object) -> str:
        return format_bytes(v)

    spr = r.get("l1_sectors_per_load_request")
    arrow(1.7, 2.95, 2.45, f"loads: {sec(r.get('l1_load_requests'))} req\n{sec(r.get('l1_load_sectors'))} sectors"
          + (f" ({spr:.1f}/req)" if spr is not None and not (isinstance(spr, float) and math.isnan(spr)) else ""),
          True)
    arrow(1.7, 2.95, 1.55, f"stores: {sec(r.get('l1_store_requests'))} req\n{sec(r.get('l1_store_sectors'))} sectors",
          False)
    arrow(5.75, 4.45, 2.45, f"to L1: {byt(r.get('l2_to_l1_bytes'))}\nL2 reads {sec(r.get('l2_read_sectors'))} sectors",
          True)
    arrow(4.45, 5.75, 1.55, f"from L1: {byt(r.get('l1_to_l2_bytes'))}\nL2 writes {sec(r.get('l2_write_sectors'))} "
          "sectors", False)
    arrow(8.35, 7.25, 2.45, f"DRAM read\n{byt(r.get('dram_bytes_read'))}", True)
    arrow(7.25, 8.35, 1.55, f"DRAM written\n{byt(r.get('dram_bytes_write'))}", False)
    spills = r.get("l1_spill_sectors")
    if spills is not None and not (isinstance(spills, float) and math.isnan(spills)) and spills > 0:
        ax.text(3.7, 0.55, f"local memory (spills): {sec(spills)} sectors", ha="center", fontsize=FONT - 2,
                color="#b3261e")
    shared = r.get("l1_shared_wavefronts")
    if shared is not None and not (isinstance(shared, float) and math.isnan(shared)) and shared > 0:
        ax.text(3.7, 3.25, f"shared memory: {sec(shared)} wavefronts", ha="center", fontsize=FONT - 2)
    return fig


def roofline_figure(points: pd.DataFrame, roofs: pd.DataFrame, title: str) -> Figure:
    """A hierarchical roofline (log-log): FLOP/s against arithmetic intensity. Ceilings:
    each precision's peak (horizontal) and each memory level's bandwidth (diagonal),
    from ncu's roofline counters; one marker per kernel x memory level with a bandwidth."""
    fig, ax = _figure(4.4)
    levels = [lv for lv in ("l1", "l2", "dram") if f"{lv}_intensity_flop_per_byte" in points.columns]
    xs = pd.concat([points[f"{lv}_intensity_flop_per_byte"] for lv in levels]).dropna() if levels else pd.Series()
    lo = float(min(xs.min(), 0.01)) / 4 if len(xs) else 0.01
    hi = float(max(xs.max(), 100.0)) * 4 if len(xs) else 1e4
    grid = np.geomspace(lo, hi, 200)
    compute = roofs[roofs["kind"] == "compute"] if not roofs.empty else roofs
    bandwidth = roofs[roofs["kind"] == "bandwidth"] if not roofs.empty else roofs
    pk_max = float(compute["peak"].max()) if len(compute) else float(points["flop_per_s"].max()) * 10
    styles = {"FP64": ":", "FP32": "-", "FP16": "-."}
    for r in compute.to_dict("records"):
        ax.axhline(r["peak"], color="#555555", linewidth=1.0, linestyle=styles.get(r["name"], "--"),
                   label=f"{r['name']} peak {format_count(r['peak'], 'FLOP/s')}")
    bw_colors = {"DRAM": "#08519c", "L2": "#6baed6", "L1": "#9edae5"}
    for r in bandwidth.to_dict("records"):
        ax.plot(grid, np.minimum(grid * r["peak"], pk_max), color=bw_colors.get(r["name"], "#777777"),
                linewidth=1.4, label=f"{r['name']} bandwidth {format_rate(r['peak'])}")
    markers = {"dram": "o", "l2": "s", "l1": "^"}
    kernels = list(dict.fromkeys(points["label"]))
    for i, lab in enumerate(kernels):
        d = points[points["label"] == lab]
        color = _EXTRA_COLORS[i % len(_EXTRA_COLORS)] if i else "#d62728"
        for lv in levels:
            ax.scatter(d[f"{lv}_intensity_flop_per_byte"], d["flop_per_s"], s=36, marker=markers[lv], color=color,
                       edgecolor="black", linewidth=0.5, zorder=4,
                       label=_text(f"{lab} ({', '.join(d['precision'])}, {lv.upper()})", 56))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ymin = float(points["flop_per_s"].min()) / 20 if len(points) else 1e6
    ax.set_ylim(ymin, pk_max * 3)
    _style(ax, title, "FLOP/s", "arithmetic intensity (FLOP per byte)")
    _legend(ax, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


_LEVEL_COLORS = {"DRAM": "#08519c", "L2": "#6baed6", "L1": "#9edae5"}


def _rate_scale(top: float) -> tuple[str, float]:
    """The binary unit per second an axis of byte rates up to `top` is drawn in."""
    return next(((u, f) for u, f in (("TiB/s", 2.0**40), ("GiB/s", 2.0**30), ("MiB/s", 2.0**20)) if top >= f),
                ("B/s", 1.0))


def bandwidth_roofline_figure(points: pd.DataFrame, roofs: pd.DataFrame, title: str) -> Figure:
    """The bandwidth roofline of a gather (analysis.ncu.bandwidth): per row (kernel or
    point), one bar per memory level for the bytes per second it served, each ending
    against its own roof: a black tick at that level's peak for this row (ncu's peak
    counters, or its own % of peak read backwards) and, on DRAM, a dashed red tick at the
    device's measured copy ceiling. The share of the level's peak is written at the bar's
    end. Bytes in binary units (TiB/s = 2^40 bytes per second)."""
    labels = list(dict.fromkeys(points["label"].astype(str)))
    levels = [lv for lv in ("DRAM", "L2", "L1") if (points["level"] == lv).any()]
    n = max(1, len(levels))
    copies = roofs[roofs["level"] == "DRAM copy"] if not roofs.empty else roofs
    copy = float(copies["peak"].max()) if len(copies) else None
    top = float(np.nanmax(np.concatenate([points["bytes_per_s"].to_numpy(dtype=float),
                                          points["peak_bytes_per_s"].to_numpy(dtype=float), [copy or 0.0]])))
    unit, scale = _rate_scale(top)
    step = n * 0.22 + 0.35
    fig, ax = _figure(1.6 + step * 0.62 * len(labels))
    y0 = np.arange(len(labels))[::-1] * step
    for i, lv in enumerate(levels):
        d = points[points["level"] == lv].drop_duplicates("label").set_index("label")
        ys = y0 + (n / 2 - i - 0.5) * 0.22
        for lab, yy in zip(labels, ys):
            if lab not in d.index:
                continue
            r = d.loc[lab]
            v, pk = float(r["bytes_per_s"]) / scale, r["peak_bytes_per_s"]
            color = _LEVEL_COLORS.get(lv, "#777777")
            if pd.notna(pk):   # the level's roof as a faint track, so each bar reads against its own
                ax.barh(yy, float(pk) / scale, 0.2, color=color, alpha=0.15, linewidth=0)
            ax.barh(yy, v, 0.2, color=color, label=lv if lab == next(x for x in labels if x in d.index) else None)
            if pd.notna(pk):
                ax.plot([float(pk) / scale] * 2, [yy - 0.12, yy + 0.12], color="black", linewidth=1.6,
                        label="peak of that level" if i == 0 and lab == labels[0] else None)
            if lv == "DRAM" and copy:
                ax.plot([copy / scale] * 2, [yy - 0.12, yy + 0.12], color="#b3261e", linewidth=1.3, linestyle="--",
                        label="measured copy ceiling" if lab == labels[0] else None)
            note = f"{r['pct_of_peak']:.0f}% of peak" if pd.notna(r["pct_of_peak"]) else "peak not in the report"
            ax.annotate(note, (max(v, float(pk) / scale if pd.notna(pk) else 0.0), yy), xytext=(4, 0),
                        textcoords="offset points", va="center", fontsize=FONT - 2, color="#333333")
    ax.set_yticks(y0, [_text(x, 40) for x in labels])
    ax.set_xlim(0, top / scale * 1.22)
    _style(ax)
    ax.set_xlabel(f"bytes served per second ({unit})\neach bar against its own level's peak", fontsize=FONT)
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.grid(axis="y", visible=False)
    _legend(ax, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=5)
    ax.set_title(_text(title, 110), fontsize=FONT + 1, loc="left", pad=22)
    return fig


def sass_figure(d: pd.DataFrame, title: str) -> Figure:
    """Rows in flight per warp in each variant's hot loop (SASS replay) beside the
    model's assumption (loads in flight), one panel per architecture."""
    archs = sorted(d["arch"].astype(str).unique())
    fig = Figure(figsize=(WIDTH_IN, SCALE * (2.9 * len(archs) + 0.5)), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    for i, arch in enumerate(archs):
        ax = fig.add_subplot(len(archs), 1, i + 1)
        g = d[d["arch"].astype(str) == arch]
        variants = order_variants(g["variant"])
        g = g.set_index("variant").loc[variants]
        x = np.arange(len(variants))
        ax.bar(x - 0.2, g["rows_in_flight"].astype(float), 0.4, color="#1f77b4", label="SASS: rows in flight per warp")
        if "model_loads_in_flight" in g.columns:
            ax.bar(x + 0.2, g["model_loads_in_flight"].astype(float), 0.4, color="#ff9f4a",
                   label="model: loads in flight (assumed)")
        ax.set_xticks(x, [_text(v, 14) for v in variants])
        _style(ax, f"{title}: {arch}", "rows in flight per warp")
    handles, labels = fig.axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=FONT - 1, frameon=False, loc="outside lower center", ncols=2)
    return fig


# ------------------------------------------------------- precision and host-resident tables
def precision_grid_figure(grid: pd.DataFrame, title: str) -> Figure:
    """Heat map of the predicted speedup over fp32 base per precision (rows) x variant
    (columns) of one GPU (analysis.model.predict.precision_grid), the value in each cell."""
    dtypes = list(dict.fromkeys(grid["dtype"]))
    variants = order_variants(grid["variant"])
    values = np.full((len(dtypes), len(variants)), np.nan)
    for r in grid.itertuples():
        values[dtypes.index(r.dtype), variants.index(r.variant)] = r.speedup_vs_fp32_base
    fig, ax = _figure(1.2 + 0.45 * len(dtypes))
    finite = values[np.isfinite(values)]
    top = float(max(finite.max(), 1.0 / max(finite.min(), 1e-9))) if finite.size else 2.0
    norm_top = math.log(max(top, 1.01))
    ax.imshow(np.log(np.where(np.isfinite(values), values, 1.0)), cmap="RdBu", vmin=-norm_top, vmax=norm_top,
              aspect="auto")
    for i in range(len(dtypes)):
        for j in range(len(variants)):
            v = values[i, j]
            dark = np.isfinite(v) and abs(math.log(max(v, 1e-9))) > 0.6 * norm_top
            ax.text(j, i, "–" if not np.isfinite(v) else f"{v:.2f}×", ha="center", va="center", fontsize=FONT - 1,
                    color="white" if dark else "black")
    ax.set_xticks(range(len(variants)), [_text(v, 12) for v in variants])
    ax.set_yticks(range(len(dtypes)), [_text(d, 8) for d in dtypes])
    _style(ax, title, "table precision")
    ax.grid(False)
    return fig


def cache_hit_figure(rows: pd.DataFrame, title: str) -> Figure:
    """Predicted cache hit rate (of a batch's unique rows) against the cache size as a
    share of the table, one line per dataset (cache variant rows)."""
    fig, ax = _figure(3.2)
    for i, ds in enumerate(order_datasets(rows["dataset"])):
        d = rows[rows["dataset"] == ds].sort_values("cache_ratio")
        ax.plot(100 * d["cache_ratio"], d["cache_hit_rate_pct"], marker=_MARKERS[i % len(_MARKERS)], markersize=4.5,
                linewidth=1.6, color=_dataset_color(ds, i), label=_short(ds, 24))
    _percent_axis(ax, rows["cache_ratio"])
    ax.set_ylim(0, 103)
    _style(ax, title, "cache hit rate, unique rows (%)", "GPU cache size, % of the table's rows (log scale)")
    _legend(ax, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def _percent_axis(ax, ratios: pd.Series) -> None:
    """A log x axis ticked at the swept shares, labelled in percent."""
    ax.set_xscale("log")
    ticks = sorted(set(100 * ratios.dropna().astype(float)))
    ax.set_xticks(ticks, [f"{t:.3g}%" for t in ticks])
    ax.minorticks_off()


_SPLIT = (("dedup_us", "dedup / map", "#9467bd"), ("transfer_us", "host transfer", "#d62728"),
          ("lookup_us", "lookup kernel", "#1f77b4"))


def host_time_figure(rows: pd.DataFrame, title: str) -> Figure:
    """Per table launch of the host-resident variants: the time split into dedup/map,
    host transfer and the lookup kernel, stacked, one bar per (variant, dataset, size)."""
    labels = [f"{r.variant} {_short(r.dataset, 12)} {100 * r.cache_ratio:.3g}%" for r in rows.itertuples()]
    fig, ax = _figure(1.0 + 0.28 * len(rows))
    y = np.arange(len(rows))
    left = np.zeros(len(rows))
    for col, label, color in _SPLIT:
        vals = rows[col].fillna(0.0).to_numpy(dtype=float)
        ax.barh(y, vals, left=left, color=color, label=label, height=0.7)
        left += vals
    ax.set_yticks(y, [_text(t, 36) for t in labels])
    ax.invert_yaxis()
    _style(ax, title, None, "time per table launch (µs)")
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    _legend(ax, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def host_bytes_figure(rows: pd.DataFrame, budget: Mapping[str, float], title: str) -> Figure:
    """Host bytes per table launch against the cache size, one line per dataset; each
    dataset's dashed line is what its host link moves in the time of the all-GPU lookup
    kernel (link bandwidth x base's time): above it, the link, not the GPU, sets the pace."""
    fig, ax = _figure(3.2)
    for i, ds in enumerate(order_datasets(rows["dataset"])):
        d = rows[rows["dataset"] == ds].sort_values("cache_ratio")
        color = _dataset_color(ds, i)
        moved = d["host_bytes"].where(d["host_bytes"] > 0)    # a cache that holds every row moves none: no point
        ax.plot(100 * d["cache_ratio"], moved, marker=_MARKERS[i % len(_MARKERS)],
                markersize=4.5, linewidth=1.6, color=color, label=f"{_short(ds, 16)}: host bytes")
        if ds in budget and budget[ds] > 0:
            ax.axhline(budget[ds], color=color, linewidth=0.9, linestyle="--",
                       label=_text(f"{_short(ds, 16)}: link x all-GPU time", 40))
    _percent_axis(ax, rows["cache_ratio"])
    ax.set_yscale("log")
    _style(ax, title, "bytes per table launch (log)", "GPU cache size, % of the table's rows (log scale)")
    _legend(ax, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig
