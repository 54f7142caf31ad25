"""Report stage, panels of a stored run's host-resident tables (cache, uvm): hit rate against the
cache size, the time split per batch and the host bytes against the link.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from characterize.hardware.specs import HOST_LINKS
from characterize.kernels.registry import HOST_VARIANTS
from characterize.report.blocks import (
    POINT_COLS,
    PREDICTION_STAMP,
    DetailsBlock,
    Missing,
    NoteBlock,
    PanelOutput,
    code_cell,
    column_cell,
    figure_block,
    fmt_num,
    fmt_pct,
    is_na,
    ordered_rows,
    table_block,
)
from characterize.report.layout import (
    S_MODEL,
    Panel,
    asked_for,
)
from characterize.report.plots import (
    cache_hit_figure,
    host_bytes_figure,
    host_time_figure,
)
from characterize.report.provenance import PROVENANCE
from characterize.report.sources import RunSource
from characterize.report.views import prediction_gpus
from characterize.units import format_bytes


def _host_rows(s: RunSource, variants: tuple[str, ...] = HOST_VARIANTS) -> pd.DataFrame:
    p = s.predictions
    if not {"variant", "cache_ratio", "dataset"} <= set(p.columns):
        raise Missing("the predictions hold no host-resident variant (cache, uvm): name them in the experiment's "
                      "variants, or run `characterize predict EXP --cache-ratio 0.5%,1.5%,5%`")
    h = p[p["variant"].isin(variants) & p["cache_ratio"].notna()]
    if "mode" in h.columns and (h["mode"] == "steady").any():
        h = h[h["mode"] == "steady"]
    if "dtype" in h.columns and len(h):   # the workload's precision (predicted first); extra ones feed the grid
        h = h[h["dtype"] == p["dtype"].iloc[0]] if (h["dtype"] == p["dtype"].iloc[0]).any() else h
    if h.empty:
        raise Missing(f"the predictions hold no {' or '.join(variants)} rows: name "
                      f"{'it' if len(variants) == 1 else 'them'} in the experiment's variants")
    return h


def _host_prov(s: RunSource) -> str:
    return f"{PROVENANCE['model'].label} (PREDICTION) from the trace and the GPU's host link (hardware.HOST_LINKS)"


def _p_cache_ratio(s: RunSource) -> PanelOutput:
    h = _host_rows(s, ("cache",))
    blocks: list[Any] = [NoteBlock("Model predictions, not measurements: the cache's policy replayed on each "
                                   "dataset's trace (warmed from its frequencies).", "prediction")]
    gpu = prediction_gpus(s, h)[0]
    d = h[h["gpu"].astype(str) == gpu] if gpu else h
    blocks.append(figure_block(cache_hit_figure(d, f"Predicted cache hit rate vs cache size ({gpu})"),
                               "Cache hit rate vs cache ratio", _host_prov(s), stamp=PREDICTION_STAMP))
    spec = [("dataset", code_cell("dataset")), ("GPU", code_cell("gpu")),
            ("cache (% of E)", column_cell("cache_ratio", fmt_pct100)),
            ("C (rows)", column_cell("cache_rows", fmt_num)),
            ("predicted hit rate (unique rows)", column_cell("cache_hit_rate_pct", fmt_pct)),
            ("predicted hit rate (lookups)", column_cell("cache_lookup_hit_rate_pct", fmt_pct)),
            ("share of all-GPU speed", column_cell("speedup_vs_base", fmt_pct100))]
    blocks.append(DetailsBlock(f"Cache sizes ({len(h)} rows)", [table_block(
        ordered_rows(h), spec, caption=f"PREDICTED for {h['dtype'].iloc[0] if 'dtype' in h.columns else 'the'} tables: "
        "the cache sizes the run swept; share of all-GPU speed = base's time (tables in GPU memory) / this time")]))
    return PanelOutput(blocks)


def fmt_pct100(v: Any) -> str:
    """A share (0..1) as a percentage."""
    return fmt_pct(100 * v) if not is_na(v) else "–"


def _p_host_time(s: RunSource) -> PanelOutput:
    h = _host_rows(s)
    gpu = prediction_gpus(s, h)[0]
    d = ordered_rows(h[h["gpu"].astype(str) == gpu] if gpu else h)
    blocks: list[Any] = [NoteBlock("Model predictions, not measurements: the parts run one after another "
                                   "(dedup/map: unique ids and the slot map on the GPU; transfer: the missed rows "
                                   "gathered on the host and copied in one batch, or managed pages migrated; "
                                   "lookup: base's kernel on the cache slots).", "prediction")]
    blocks.append(figure_block(host_time_figure(d, f"Predicted time per table launch, split ({gpu})"),
                               "Time breakdown per batch", _host_prov(s), stamp=PREDICTION_STAMP))
    spec = [*POINT_COLS, ("cache (% of E)", column_cell("cache_ratio", fmt_pct100)),
            ("dedup/map (µs)", column_cell("dedup_us")), ("transfer (µs)", column_cell("transfer_us")),
            ("lookup (µs)", column_cell("lookup_us")), ("total (µs)", column_cell("time_us"))]
    blocks.append(DetailsBlock(f"Time split ({len(d)} rows)", [table_block(d, spec, caption="PREDICTED, per table "
                                                                           "launch; a batch is T of them")]))
    return PanelOutput(blocks)


def _p_host_bytes(s: RunSource) -> PanelOutput:
    h = _host_rows(s)
    gpu = prediction_gpus(s, h)[0]
    d = h[h["gpu"].astype(str) == gpu] if gpu else h
    cache = d[d["variant"] == "cache"]
    link = HOST_LINKS.get(str(d["host_link"].iloc[0])) if "host_link" in d.columns else None
    if cache.empty or link is None:
        raise Missing("no cache rows with a known host link to set against its bandwidth")
    budget = {ds: link.GBps * 1e3 * float(g["lookup_us"].iloc[0]) for ds, g in cache.groupby("dataset")}
    blocks: list[Any] = [NoteBlock(f"Model predictions, not measurements. {link.name}: {link.GBps:g} GB/s "
                                   f"({link.source.split(';')[0]}).", "prediction")]
    blocks.append(figure_block(host_bytes_figure(cache, budget, f"Predicted host bytes vs {link.name} ({gpu})"),
                               "Host bytes against link bandwidth", _host_prov(s), stamp=PREDICTION_STAMP))
    spec = [*POINT_COLS, ("cache (% of E)", column_cell("cache_ratio", fmt_pct100)),
            ("host bytes per launch", column_cell("host_bytes", format_bytes)), ("link", code_cell("host_link")),
            ("transfer (µs)", column_cell("transfer_us"))]
    blocks.append(DetailsBlock(f"Host traffic ({len(d)} rows)", [table_block(
        ordered_rows(d), spec, caption="PREDICTED; uvm migrates whole 64 KiB pages")]))
    return PanelOutput(blocks)


def _host_asked(s: RunSource) -> bool:
    """Host-resident panels appear when the experiment names cache or uvm, or the predictions
    hold their rows (a cache-size sweep)."""
    p = s.predictions
    return asked_for(s, HOST_VARIANTS) or ("cache_ratio" in p.columns and p["cache_ratio"].notna().any())


PANELS: tuple[Panel, ...] = (
    Panel("cache-ratio", "Host-resident tables: cache hit rate vs cache size", S_MODEL, ("predictions",), ("model",),
          "predictions.csv rows of the cache variant at each cache size the run swept (analysis.model.host: the "
          "cache's policy replayed on the trace)", _p_cache_ratio, applies=_host_asked),
    Panel("host-time", "Host-resident tables: time per batch, split", S_MODEL, ("predictions",), ("model",),
          "predictions.csv dedup_us, transfer_us and lookup_us of the cache and uvm rows (analysis.model.host)",
          _p_host_time, applies=_host_asked),
    Panel("host-bytes", "Host-resident tables: host bytes against the link", S_MODEL, ("predictions",), ("model",),
          "predictions.csv host_bytes of the cache rows against the host link's bandwidth (hardware.HOST_LINKS) "
          "times the lookup kernel's predicted time", _p_host_bytes, applies=_host_asked),
)
