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

from characterize.kernels.registry import VARIANT_ORDER
from characterize.workloads.presets import HOTNESS_ORDER

__all__ = [
    "DATASET_ORDER", "VARIANT_ORDER", "variant_color", "png", "stamp", "order_variants", "order_datasets",
    "grouped_bars", "latency_figure", "speedup_figure", "bandwidth_figure", "prepass_figure",
    "coverage_figure", "reuse_figure", "register_sweep_figure", "static_occupancy_figure",
    "occupancy_figure", "stall_figure", "hit_rate_figure", "dram_figure",
    "prediction_figure", "predicted_vs_measured_figure",
    "kernel_duration_figure", "kernel_occupancy_figure", "kernel_stall_figure",
]

WIDTH_IN = 8.0   # every figure is this wide; heights follow the data
DPI = 100
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
    with the image when the figure is copied out of the report."""
    fig.text(0.99, 0.985, _text(text, 80), ha="right", va="top", fontsize=FONT, fontweight="bold", color=color,
             bbox={"boxstyle": "round,pad=0.25", "facecolor": "white", "edgecolor": color, "linewidth": 0.8})
    return fig


def _figure(height_in: float) -> tuple[Figure, object]:
    fig = Figure(figsize=(WIDTH_IN, max(1.8, min(height_in, 30.0))), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot(1, 1, 1)


def _text(s: object, limit: int = 40) -> str:
    """Label text safe for matplotlib: no mathtext ($), no control characters, bounded length."""
    t = " ".join(str(s).split()).replace("$", r"\$")
    return t if len(t) <= limit else t[: limit - 1] + "…"


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
                 colors: Mapping[str, str] | None = None, ylim: tuple[float, float] | None = None) -> Figure:
    """Bars of `value` for each `group` (x axis) and `series` (colours), with optional
    error bars (`err`, symmetric) and a horizontal reference line."""
    groups = list(groups) if groups is not None else order_datasets(df[group])
    series_names = list(series_order) if series_order is not None else order_variants(df[series])
    n = max(1, len(series_names))
    fig, ax = _figure(3.4)
    width = 0.8 / n
    x = np.arange(len(groups))
    table = df.set_index([group, series])
    for i, s in enumerate(series_names):
        vals, errs = [], []
        for g in groups:
            row = table.loc[(g, s)] if (g, s) in table.index else None
            if isinstance(row, pd.DataFrame):
                row = row.iloc[0]
            vals.append(float(row[value]) if row is not None and pd.notna(row[value]) else np.nan)
            errs.append(float(row[err]) if (err and row is not None and pd.notna(row[err])) else 0.0)
        color = (colors or {}).get(s) or variant_color(s, series_names)
        ax.bar(x - 0.4 + width * (i + 0.5), vals, width, label=_text(s, 24), color=color,
               yerr=errs if err else None, capsize=2 if err else 0, error_kw={"elinewidth": 0.8})
    if ref is not None and math.isfinite(ref):
        ax.axhline(ref, color="black", linewidth=1.0, linestyle="--", label=_text(ref_label, 50) if ref_label else None)
    ax.set_xticks(x, [_short(g) for g in groups])
    if log:
        ax.set_yscale("log")
    if ylim:
        ax.set_ylim(*ylim)
    _style(ax, title, ylabel)
    _legend(ax, ncols=min(4, n + (1 if ref_label else 0)), loc="upper left", bbox_to_anchor=(0, -0.12))
    return fig


def latency_figure(s: pd.DataFrame, title: str) -> Figure:
    """Per-table latency (mean, 95% CI) per variant x dataset, from analyze.speedups()."""
    return grouped_bars(s, group="dataset", series="variant", value="latency_us", err="latency_ci95_us",
                        title=title, ylabel="latency per table launch (µs)")


def speedup_figure(s: pd.DataFrame, reference: str, title: str) -> Figure:
    """Speedup over `reference` (ratio of means, 95% CI) per variant x dataset; 1 = as fast."""
    col = f"speedup_vs_{reference}"
    d = s[s[col].notna() & (s["variant"] != reference)] if col in s.columns else s.iloc[0:0]
    return grouped_bars(d, group="dataset", series="variant", value=col, err=f"{col}_ci95", title=title,
                        ylabel=f"speedup over {reference} (×)", ref=1.0, ref_label=f"{reference} (1×)")


def bandwidth_figure(s: pd.DataFrame, peak_GBps: float | None, title: str) -> Figure:
    """Effective bandwidth (bytes a table launch must move / its time) against the HBM peak."""
    log = peak_GBps is None or (s["effective_GBps"].max() < 0.02 * peak_GBps if len(s) else False)
    return grouped_bars(s, group="dataset", series="variant", value="effective_GBps", title=title,
                        ylabel="effective bandwidth (GB/s)", ref=peak_GBps,
                        ref_label=f"HBM peak {peak_GBps:,.0f} GB/s" if peak_GBps else None, log=log)


def prepass_figure(p: pd.DataFrame, title: str) -> Figure:
    """Stacked bars: lookup kernel and L2 pre-pass time per table launch, per variant x dataset."""
    labels = [f"{_text(v, 12)}\n{_short(d, 12)}" for v, d in zip(p["variant"], p["dataset"])]
    fig, ax = _figure(3.2)
    x = np.arange(len(p))
    ax.bar(x, p["latency_us"], 0.6, label="lookup kernel", color="#1f77b4")
    ax.bar(x, p["prepass_per_table_us"].fillna(0), 0.6, bottom=p["latency_us"], label="L2 pre-pass",
           color="#ff7f0e")
    ax.set_xticks(x, labels)
    _style(ax, title, "time per table launch (µs)")
    _legend(ax, loc="upper left", bbox_to_anchor=(0, -0.22), ncols=2)
    return fig


# ------------------------------------------------------------------- locality
def _coverage_points(entry: Mapping) -> tuple[np.ndarray, np.ndarray]:
    cov = entry.get("top_k_coverage") or {}
    pts = sorted((int(k), float(v)) for k, v in cov.items())
    unique = entry.get("unique_rows")
    if unique and all(k != int(unique) for k, _ in pts) and (not pts or int(unique) > pts[-1][0]):
        pts.append((int(unique), 1.0))  # every distinct row: full coverage
    return np.array([k for k, _ in pts], dtype=float), np.array([v for _, v in pts], dtype=float)


def coverage_figure(locality: Mapping[str, Mapping], marks: Mapping[str, int] | None = None,
                    title: str = "Top-K coverage") -> Figure:
    """Fraction of lookups served by the K most frequent rows, per dataset (log K)."""
    fig, ax = _figure(3.4)
    names = order_datasets(locality)
    for i, ds in enumerate(names):
        k, v = _coverage_points(locality[ds])
        if len(k):
            ax.plot(k, 100 * v, marker="o", markersize=3.5, linewidth=1.4, label=_short(ds, 24),
                    color=_EXTRA_COLORS[i % len(_EXTRA_COLORS)] if ds not in DATASET_ORDER else
                    ("#d62728", "#ff7f0e", "#2ca02c", "#1f77b4", "#7f7f7f")[DATASET_ORDER.index(ds)])
    for label, k in (marks or {}).items():
        ax.axvline(k, color="#999999", linewidth=0.8, linestyle=":")
        ax.annotate(_text(label, 30), (k, 2), rotation=90, fontsize=FONT - 2, color="#555555",
                    xytext=(2, 0), textcoords="offset points", va="bottom")
    ax.set_xscale("log")
    ax.set_ylim(0, 103)
    _style(ax, title, "lookups covered (%)", "K (most frequent rows)")
    _legend(ax, loc="lower right")
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
    _legend(ax, loc="upper left")
    return fig


# --------------------------------------------------------------------- static
def register_sweep_figure(sweep: pd.DataFrame, title: str = "Register sweep") -> Figure:
    """Theoretical occupancy (solid) and spill bytes per thread (dashed) against the
    -maxrregcount cap, one panel per architecture; variants compiling to the same curve share a line."""
    archs = sorted(sweep["arch"].unique())
    fig = Figure(figsize=(WIDTH_IN, 3.0 * len(archs)), dpi=DPI, layout="constrained")
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
        ax.legend(h1 + h2, l1 + l2, fontsize=FONT - 2, frameon=False, loc="center left", bbox_to_anchor=(1.08, 0.5))
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


def stall_figure(stalls: pd.DataFrame, title: str, top: int = 8) -> Figure:
    """Stacked warp-stall breakdown (cycles per issued instruction) per variant x dataset,
    from analyze.stall_breakdown(); the `top` largest reasons overall, the rest as 'other'."""
    totals = stalls.groupby("reason")["cycles"].sum().sort_values(ascending=False)
    keep = [r for r in totals.index if totals[r] > 0][:top]
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
        ax.barh(y, vals, 0.7, left=left, label=_text(r, 24), color=_STALL_COLORS.get(r, "#7f7f7f"))
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


def dram_figure(k: pd.DataFrame, title: str) -> Figure:
    """DRAM bytes read per profiled lookup kernel (variant x dataset)."""
    fig, ax = _figure(3.2)
    x = np.arange(len(k))
    colors = [variant_color(v, list(k["variant"].unique())) for v in k["variant"]]
    top = float(np.nanmax(k["dram_bytes_read"])) if len(k) and k["dram_bytes_read"].notna().any() else 0.0
    unit, scale = next(((u, f) for u, f in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)) if top >= f),
                       ("B", 1.0))
    ax.bar(x, k["dram_bytes_read"] / scale, 0.6, color=colors)
    ax.set_xticks(x, _point_labels(k), rotation=30, ha="right")
    _style(ax, title, f"DRAM bytes read ({unit})")
    return fig


# ---------------------------------------------------------------------- model
def prediction_figure(pred: pd.DataFrame, gpu: str, title: str) -> Figure:
    """Predicted speedup over base per variant x dataset for one GPU (model predictions)."""
    d = pred[pred["gpu"] == gpu] if "gpu" in pred.columns else pred
    return grouped_bars(d, group="dataset", series="variant", value="speedup_vs_base", title=title,
                        ylabel="predicted speedup over base (×)", ref=1.0, ref_label="base (1×)")


def predicted_vs_measured_figure(df: pd.DataFrame, title: str, measured: str = "measured_us",
                                 predicted: str = "predicted_us", unit: str = "µs") -> Figure:
    """Model prediction against measurement, one point per variant x dataset, log-log, y = x dashed."""
    fig, ax = _figure(4.2)
    variants = order_variants(df["variant"])
    for v in variants:
        d = df[df["variant"] == v]
        ax.scatter(d[measured], d[predicted], s=22, color=variant_color(v, variants), label=_text(v, 20), zorder=3)
    vals = pd.concat([df[measured], df[predicted]]).astype(float)
    vals = vals[np.isfinite(vals) & (vals > 0)]
    if len(vals):
        lo, hi = float(vals.min()) / 1.5, float(vals.max()) * 1.5
        ax.plot([lo, hi], [lo, hi], color="black", linestyle="--", linewidth=0.8, label="prediction = measurement")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xscale("log")
        ax.set_yscale("log")
    _style(ax, title, f"predicted ({unit})", f"measured ({unit})")
    _legend(ax, loc="upper left")
    return fig


# -------------------------------------------------------------- generic kernels
def _kernel_labels(w: pd.DataFrame) -> list[str]:
    return [f"#{int(i)} {_text(f, 34)}" for i, f in zip(w["kernel_id"], w["function"])]


def kernel_duration_figure(w: pd.DataFrame, title: str) -> Figure:
    """Duration per profiled kernel (ncu gpu__time_duration), horizontal bars."""
    d = w[w["duration_ns"].notna()]
    fig, ax = _figure(1.0 + 0.3 * len(d))
    y = np.arange(len(d))[::-1]
    ax.barh(y, d["duration_ns"] / 1e3, 0.7, color="#1f77b4")
    ax.set_yticks(y, _kernel_labels(d))
    ax.set_xscale("log")
    _style(ax, title, None, "duration (µs, log scale)")
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    return fig


def kernel_occupancy_figure(w: pd.DataFrame, title: str) -> Figure:
    """Achieved vs theoretical occupancy per profiled kernel, horizontal bars."""
    d = w[w["achieved_occupancy_pct"].notna() | w["theoretical_occupancy_pct"].notna()]
    fig, ax = _figure(1.0 + 0.4 * len(d))
    y = np.arange(len(d))[::-1]
    ax.barh(y + 0.2, d["theoretical_occupancy_pct"], 0.4, label="theoretical", color="#aec7e8")
    ax.barh(y - 0.2, d["achieved_occupancy_pct"], 0.4, label="achieved", color="#1f77b4")
    ax.set_yticks(y, _kernel_labels(d))
    ax.set_xlim(0, 105)
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
    ax.set_yticks(y, _kernel_labels(d))
    _style(ax, title, None, "stall cycles per issued instruction")
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    _legend(ax, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig
