"""Report panels comparing two sources: timings and metrics of matched points and kernels.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from characterize.analysis import compare as analyze
from characterize.report.blocks import (
    POINT_COLS,
    Cell,
    NoteBlock,
    PanelOutput,
    _col,
    _order,
    _table,
    _txt,
    fmt_bytes,
    fmt_num,
    fmt_pct,
    fmt_x,
    kernel_cell,
)
from characterize.report.layout import Panel, _timing_prov
from characterize.report.provenance import PROVENANCE
from characterize.report.sources import Pair, RunSource

# ------------------------------------------------------------- compare panels
_COMPARE_METRICS = {
    "gpu__time_duration.sum": ("duration", lambda v: fmt_num(v / 1e3) + " µs"),
    "sm__warps_active.avg.pct_of_peak_sustained_active": ("achieved occupancy", fmt_pct),
    "sm__maximum_warps_per_active_cycle_pct": ("theoretical occupancy", fmt_pct),
    "launch__registers_per_thread": ("registers/thread", fmt_num),
    "l1tex__t_sector_hit_rate.pct": ("L1 hit rate", fmt_pct),
    "lts__t_sector_hit_rate.pct": ("L2 hit rate", fmt_pct),
    "dram__bytes_read.sum": ("DRAM bytes read", fmt_bytes),
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio": ("long-scoreboard stall", fmt_num),
}


def _unmatched_table(un: pd.DataFrame, keys: Sequence[str], pair: Pair, what: str) -> list[Any]:
    if un.empty:
        return [NoteBlock(f"Every {what} is present in both.")]
    names = {"a": pair.a.label, "b": pair.b.label}
    spec = [(k, (lambda k: lambda r: Cell(_txt(r.get(k)), "code"))(k)) for k in keys]
    spec.append(("only in", lambda r: Cell(names.get(r["only_in"], str(r["only_in"])), "")))
    return [_table(_order(un), spec, caption=f"Unmatched {what}s ({len(un)}): present on one side only, "
                                             "listed instead of dropped")]


def _c_bench(pair: Pair) -> PanelOutput:
    a, b = pair.a, pair.b

    def tidy(src: RunSource) -> pd.DataFrame:
        d = src.bench_ok
        cols = [c for c in ("per_table_us", "effective_GBps") if c in d.columns]
        return d.melt(id_vars=["variant", "dataset", "mode"], value_vars=cols, var_name="metric", value_name="value")

    both, un = analyze.compare_runs(tidy(a), tidy(b), keys=("variant", "dataset", "mode"))
    blocks: list[Any] = []
    if a.timing_provenance != b.timing_provenance:
        blocks.append(NoteBlock(f"{a.label} is {PROVENANCE[a.timing_provenance].label} and {b.label} is "
                                f"{PROVENANCE[b.timing_provenance].label}: their ratios compare different things.",
                                "warning"))
    elif a.emulated:
        blocks.append(NoteBlock("Both sides are CPU emulation: NOT GPU performance.", "warning"))
    lat = _order(both[both["metric"] == "per_table_us"])
    spec = [*POINT_COLS,
            ("mode", _col("mode", _txt, "")), (f"{a.label} (µs)", _col("a")), (f"{b.label} (µs)", _col("b")),
            ("speedup of b over a", lambda r: Cell(fmt_x(r["a"] / r["b"] if r["b"] else np.nan), "num"))]
    blocks.append(_table(lat, spec, caption="Latency per table launch on both sides (b: " + b.label + ")"))
    blocks += _unmatched_table(un, ["variant", "dataset", "mode"], pair, "timed point")
    return PanelOutput(blocks, provenance=_timing_prov(pair),
                       modes="both sides: " + "; ".join(a.timing_mode(m) for m in a.modes))


def _c_metrics(pair: Pair) -> PanelOutput:
    a, b = pair.a, pair.b

    def labelled(side: Any) -> bool:
        m = side.metrics
        return "variant" in m.columns and m["variant"].fillna("").astype(str).ne("").any()

    # a report of another application has no variant/dataset: match its kernels by function only
    keys = ("variant", "dataset", "function") if labelled(a) and labelled(b) else ("function",)
    both, un = analyze.compare_runs(a.metrics, b.metrics, keys=keys)
    both = both[both["metric"].isin(_COMPARE_METRICS)].copy()
    keys_present = [k for k in keys if k in both.columns or k in un.columns]
    blocks: list[Any] = []
    if keys == ("function",):
        blocks.append(NoteBlock("One side carries no variant/dataset labels, so kernels are matched by function "
                                "name only; several kernels with one name are averaged."))
    if not both.empty:
        both["_m"] = both["metric"].map(list(_COMPARE_METRICS).index)
        both = _order(both.sort_values("_m", kind="stable"))
        spec = [(k, (lambda k: lambda r: kernel_cell(r.get(k)) if k == "function" else Cell(_txt(r.get(k)), "code"))(k))
                for k in keys_present]
        spec += [("metric", lambda r: Cell(_COMPARE_METRICS[r["metric"]][0], "")),
                 (pair.a.label, lambda r: Cell(_COMPARE_METRICS[r["metric"]][1](r["a"]), "num")),
                 (pair.b.label, lambda r: Cell(_COMPARE_METRICS[r["metric"]][1](r["b"]), "num")),
                 ("b / a", lambda r: Cell(fmt_num(r["ratio"]), "num"))]
        blocks.append(_table(both, spec, caption="Key Nsight Compute metrics of the kernels both sides profiled"))
    else:
        blocks.append(NoteBlock("No kernel is present on both sides under the same " + ", ".join(keys) + "."))
    blocks += _unmatched_table(un, keys_present, pair, "kernel")
    modes = []
    for side in (a, b):
        if isinstance(side, RunSource):
            modes.append(f"{side.label}: " + "; ".join(side.ncu_mode(st["cache_control"], st["clock_control"])
                                                       for st in side.ncu_settings))
        else:
            modes.append(f"{side.label}: ncu collection modes not recorded in the report")
    return PanelOutput(blocks, modes=" | ".join(modes))


COMPARE_PANELS: tuple[Panel, ...] = (
    Panel("bench", "Timing comparison", "Comparison", ("bench",), _timing_prov,
          "analyze.compare_runs on the timed points of both runs (per-table latency, effective bandwidth), "
          "matched on variant, dataset and mode", _c_bench),
    Panel("metrics", "Nsight Compute metrics comparison", "Comparison", ("profile",), ("ncu",),
          "analyze.compare_runs on the tidy ncu metrics of both sides, matched on variant, dataset and kernel "
          "function; kernels on one side only are listed", _c_metrics),
)


