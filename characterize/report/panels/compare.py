"""Report stage, panels comparing two sources: matched kernels with deltas, timings with
significance, and (between two runs) the static characterization, the SASS hot loops
and the model's predictions.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from characterize.analysis import compare as analyze
from characterize.analysis import ncu
from characterize.report.blocks import (
    POINT_COLS,
    Cell,
    DetailsBlock,
    NoteBlock,
    PanelOutput,
    _col,
    _isnan,
    _order,
    _table,
    _txt,
    fmt_ci,
    fmt_num,
    fmt_pct,
    fmt_x,
)
from characterize.report.layout import S_COMPARE, Panel, _timing_prov
from characterize.report.provenance import PROVENANCE
from characterize.report.sources import Pair, RunSource
from characterize.units import format_bytes

# ------------------------------------------------------------------ helpers
_US = lambda v: fmt_num(v / 1e3)  # noqa: E731 - ns -> µs for a table cell

#: compared per-kernel columns: (column, header with its unit, formatter, shown in the summary table)
KERNEL_METRICS: tuple[tuple[str, str, Callable[[Any], str], bool], ...] = (
    ("duration_ns", "duration (µs)", _US, True),
    ("sm_throughput_pct", "SM throughput", fmt_pct, True),
    ("memory_throughput_pct", "memory throughput", fmt_pct, True),
    ("l1_throughput_pct", "L1/TEX throughput", fmt_pct, False),
    ("l2_throughput_pct", "L2 throughput", fmt_pct, False),
    ("dram_throughput_pct", "DRAM throughput", fmt_pct, True),
    ("achieved_occupancy_pct", "achieved occupancy", fmt_pct, False),
    ("registers_per_thread", "registers/thread", fmt_num, False),
    ("l1_hit_rate_pct", "L1 hit rate", fmt_pct, False),
    ("l2_hit_rate_pct", "L2 hit rate", fmt_pct, True),
    ("dram_bytes_read", "DRAM read", format_bytes, True),
    ("dram_bytes_write", "DRAM written", format_bytes, True),
    ("inst_issued", "instructions issued", fmt_num, False),
    ("stall_long_scoreboard", "long-scoreboard stall (cycles/inst)", fmt_num, True),
    ("stall_barrier", "barrier stall (cycles/inst)", fmt_num, False),
    ("stall_wait", "wait stall (cycles/inst)", fmt_num, False),
)
_FMT = {c: f for c, _, f, _ in KERNEL_METRICS}
_HEAD = {c: h for c, h, _, _ in KERNEL_METRICS}


def _pct(x: Any) -> str:
    return "–" if _isnan(x) else f"{float(x):+.1f}%"


def _points(x: Any) -> str:
    """A change of a percentage, in percentage points."""
    return "–" if _isnan(x) else f"{float(x):+.1f} pt"


def _unmatched(un: pd.DataFrame, keys: Sequence[str], pair: Pair, what: str) -> list[Any]:
    if un is None or un.empty:
        return [NoteBlock(f"Every {what} is present in both.")]
    names = {"a": pair.a.label, "b": pair.b.label}
    spec = [(k, (lambda k: lambda r: Cell(_txt(r.get(k)), "code"))(k)) for k in keys if k in un.columns]
    spec.append(("only in", lambda r: Cell(names.get(r["only_in"], str(r["only_in"])), "")))
    return [_table(_order(un), spec, caption=f"Unmatched {what}s ({len(un)}): present on one side only, "
                                             "listed instead of dropped")]


def _sides(pair: Pair) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """One row per kernel on each side, ready to match: a run's launches are averaged per
    (variant, dataset, function); keys are variant and dataset when both sides carry them."""
    def prepare(src: Any) -> pd.DataFrame:
        k = src.kview
        if isinstance(src, RunSource):
            k = ncu.per_point(k, ("variant", "dataset", "function"))
            k["label"] = [f"{f} ({v} · {d})" for v, d, f in zip(k["variant"], k["dataset"], k["function"])]
        return k.reset_index(drop=True)

    a, b = prepare(pair.a), prepare(pair.b)
    keys = [c for c in ("variant", "dataset") if all(c in x.columns and x[c].fillna("").astype(str).ne("").any()
                                                     for x in (a, b))]
    return a, b, keys


def _modes(pair: Pair) -> str:
    out = []
    for side in (pair.a, pair.b):
        if isinstance(side, RunSource):
            out.append(f"{side.label}: " + ("; ".join(side.ncu_mode(st["cache_control"], st["clock_control"])
                                                      for st in side.ncu_settings) or "no profiled points"))
        else:
            out.append(f"{side.label}: ncu collection modes not recorded in the report")
    return " | ".join(out)


# -------------------------------------------------------------------- panels
def _c_metrics(pair: Pair) -> PanelOutput:
    a, b, keys = _sides(pair)
    matched = analyze.match_kernels(a, b, keys, pair.pairs)
    deltas = analyze.kernel_deltas(a, b, matched, [c for c, *_ in KERNEL_METRICS])
    blocks: list[Any] = []
    counts = matched["match"].value_counts()
    how = ", ".join(f"{n} by {m}" for m, n in counts.items() if not m.startswith("only"))
    blocks.append(NoteBlock(
        f"Kernels matched {'within each ' + ' and '.join(keys) + ', ' if keys else ''}by demangled base name and "
        "launch order, then by a similar name (trailing version digits dropped), after any pair given by hand "
        f"(--pair A=B{': ' + ', '.join(pair.pairs) if pair.pairs else ''}). " + (f"Pairs: {how}." if how else
                                                                                    "No kernel pairs up.")))
    if deltas.empty:
        blocks.append(NoteBlock("No kernel is on both sides; pair kernels by hand with `--pair A=B` (function "
                                "names, demangled names or #IDs).", "warning"))
    else:
        wide = []
        for pno, g in deltas.groupby("pair", sort=True):
            first = g.iloc[0]
            row = {k: first.get(k) for k in keys} | {"a_kernel": first["a_kernel"], "b_kernel": first["b_kernel"],
                                                     "match": first["match"]}
            for r in g.to_dict("records"):
                row[r["metric"]] = (r["a"], r["b"], r["delta_pct"])
            wide.append(row)
        w = pd.DataFrame(wide)

        def cell(c: str) -> Callable[[dict], Cell]:
            def f(r: dict) -> Cell:
                v = r.get(c)
                if not isinstance(v, tuple):
                    return Cell("–", "num")
                x, y, d = v
                cls = "num" + ("" if _isnan(d) or abs(d) < 5 else " bad" if d > 0 else " good") \
                    if c == "duration_ns" else "num"
                change = _points(y - x) if c.endswith("_pct") else _pct(d)
                return Cell(f"{_FMT[c](x)} → {_FMT[c](y)} ({change})", cls)
            return f

        spec = [(k, (lambda k: lambda r: Cell(_txt(r.get(k)), "code"))(k)) for k in keys]
        spec += [(pair.a.label, lambda r: Cell(_txt(r["a_kernel"]), "kname")),
                 (pair.b.label, lambda r: Cell(_txt(r["b_kernel"]), "kname")),
                 ("matched by", lambda r: Cell(r["match"], ""))]
        spec += [(h, cell(c)) for c, h, _, shown in KERNEL_METRICS if shown and c in deltas["metric"].values]
        blocks.append(_table(_order(w) if keys else w, spec,
                             caption=f"Matched kernels: {pair.a.label} → {pair.b.label} (change in %)",
                             note="a single profile carries no confidence interval, so no significance is claimed "
                                  "for these deltas; a run's kernels are averaged over its profiled launches"))
        lspec = [(k, (lambda k: lambda r: Cell(_txt(r.get(k)), "code"))(k)) for k in keys]
        lspec += [("kernels", lambda r: Cell(f"{_txt(r['a_kernel'])} ↔ {_txt(r['b_kernel'])}", "kname")),
                  ("metric", lambda r: Cell(_HEAD.get(r["metric"], r["metric"]), "")),
                  (pair.a.label, lambda r: Cell(_FMT[r["metric"]](r["a"]), "num")),
                  (pair.b.label, lambda r: Cell(_FMT[r["metric"]](r["b"]), "num")),
                  ("delta (b − a)", lambda r: Cell(_points(r["delta"]) if r["metric"].endswith("_pct") else
                                                   _FMT[r["metric"]](r["delta"]), "num")),
                  ("delta %", lambda r: Cell(_pct(r["delta_pct"]), "num"))]
        blocks.append(DetailsBlock(f"Every compared metric ({len(deltas)} rows)", [_table(deltas, lspec)]))
    un = matched[matched["match"].str.startswith("only")]
    if not un.empty:
        rows = [{**{k: r.get(k) for k in keys},
                 "kernel": (a.loc[r["a_index"], "label"] if pd.notna(r["a_index"]) else b.loc[r["b_index"], "label"]),
                 "only_in": r["match"][-1]} for r in un.to_dict("records")]
        blocks += _unmatched(pd.DataFrame(rows), [*keys, "kernel"], pair, "kernel")
    else:
        blocks.append(NoteBlock("Every kernel is matched."))
    return PanelOutput(blocks, modes=_modes(pair))


def _c_bench(pair: Pair) -> PanelOutput:
    a, b = pair.a, pair.b
    both, un = analyze.diff_bench(a.bench, b.bench)
    blocks: list[Any] = []
    if a.timing_provenance != b.timing_provenance:
        blocks.append(NoteBlock(f"{a.label} is {PROVENANCE[a.timing_provenance].label} and {b.label} is "
                                f"{PROVENANCE[b.timing_provenance].label}: their ratios compare different things.",
                                "warning"))
    elif a.emulated:
        blocks.append(NoteBlock("Both sides are CPU emulation: NOT GPU performance.", "warning"))
    spec = [*POINT_COLS, ("mode", _col("mode", _txt, "")),
            (f"{a.label} (µs)", lambda r: Cell(fmt_ci(r["per_table_us_a"], r.get("ci95_us_a")), "num")),
            (f"{b.label} (µs)", lambda r: Cell(fmt_ci(r["per_table_us_b"], r.get("ci95_us_b")), "num")),
            ("delta (µs)", _col("delta_us")), ("delta %", lambda r: Cell(_pct(r["delta_pct"]), "num")),
            ("significant (95%)", lambda r: Cell("–" if r["significant"] is None else
                                                 "yes" if r["significant"] else "no", "")),
            ("speedup of b over a", lambda r: Cell(fmt_x(r["per_table_us_a"] / r["per_table_us_b"]
                                                         if r["per_table_us_b"] else np.nan), "num"))]
    blocks.append(_table(_order(both), spec, caption=f"Latency per table launch: {a.label} → {b.label}",
                         note="significant: |delta| exceeds the 95% CI of the difference of two independent means "
                              "(sqrt(ci_a² + ci_b²))"))
    blocks += _unmatched(un, ["variant", "dataset", "mode"], pair, "timed point")
    return PanelOutput(blocks, provenance=_timing_prov(pair),
                       modes="both sides: " + "; ".join(a.timing_mode(m) for m in a.modes))


def _diff_blocks(changed: pd.DataFrame, un: pd.DataFrame, same: int, keys: Sequence[str], pair: Pair,
                 what: str) -> list[Any]:
    blocks: list[Any] = []
    keys = [k for k in keys if k in changed.columns or k in un.columns]
    if changed.empty:
        blocks.append(NoteBlock(f"No {what} changed ({same} row(s) identical on both sides)."))
    else:
        spec = [(k, (lambda k: lambda r: Cell(_txt(r.get(k)), "code"))(k)) for k in keys]
        spec += [("column", lambda r: Cell(r["column"], "code")),
                 (pair.a.label, lambda r: Cell(_txt(r["a"]) if not isinstance(r["a"], float) else fmt_num(r["a"]),
                                               "num")),
                 (pair.b.label, lambda r: Cell(_txt(r["b"]) if not isinstance(r["b"], float) else fmt_num(r["b"]),
                                               "num")),
                 ("delta", lambda r: Cell(fmt_num(r["delta"]), "num"))]
        blocks.append(_table(_order(changed), spec, caption=f"{len(changed)} changed value(s) in "
                                                            f"{changed[keys].drop_duplicates().shape[0]} row(s); "
                                                            f"{same} row(s) unchanged"))
    blocks += _unmatched(un, keys, pair, f"{what} row")
    return blocks


def _c_static(pair: Pair) -> PanelOutput:
    changed, un, same = analyze.diff_static(pair.a.static, pair.b.static)
    return PanelOutput(_diff_blocks(changed, un, same, analyze.STATIC_KEYS, pair, "static characterization"))


def _c_sass(pair: Pair) -> PanelOutput:
    changed, un, same = analyze.diff_sass(pair.a.sass, pair.b.sass)
    return PanelOutput(_diff_blocks(changed, un, same, analyze.SASS_KEYS, pair, "SASS hot-loop"))


def _c_predictions(pair: Pair) -> PanelOutput:
    both, un = analyze.diff_predictions(pair.a.predictions, pair.b.predictions)
    blocks: list[Any] = [NoteBlock("Model predictions of both runs, not measurements.", "prediction")]
    if both.empty:
        blocks.append(NoteBlock("No (variant, dataset, GPU, mode) is predicted on both sides."))
    else:
        moved = both[both["delta_pct"].abs() > 0.05].copy()
        moved["_abs"] = moved["delta_pct"].abs()
        moved = moved.sort_values("_abs", ascending=False, kind="stable")
        keys = [k for k in analyze.PREDICTION_KEYS if k in both.columns]
        spec = [(k, (lambda k: lambda r: Cell(_txt(r.get(k)), "code"))(k)) for k in keys]

        def band(r: dict, side: str) -> str:
            lo, hi = r.get(f"time_us_low_{side}"), r.get(f"time_us_high_{side}")
            return "" if _isnan(lo) or _isnan(hi) else f" [{fmt_num(lo)}–{fmt_num(hi)}]"
        spec += [(f"{pair.a.label} (µs)", lambda r: Cell(fmt_num(r["time_us_a"]) + band(r, "a"), "num")),
                 (f"{pair.b.label} (µs)", lambda r: Cell(fmt_num(r["time_us_b"]) + band(r, "b"), "num")),
                 ("delta (µs)", _col("delta_us")), ("delta %", lambda r: Cell(_pct(r["delta_pct"]), "num")),
                 ("outside the band", lambda r: Cell("–" if r["outside_band"] is None else
                                                     "yes" if r["outside_band"] else "no", "")),
                 ("bound", lambda r: Cell(f"{_txt(r.get('bound_a'))} → {_txt(r.get('bound_b'))}"
                                          if "bound_a" in r else "", ""))]
        if moved.empty:
            blocks.append(NoteBlock(f"All {len(both)} shared predictions are unchanged (within 0.05%)."))
        else:
            blocks.append(_table(moved, spec, caption=f"{len(moved)} of {len(both)} shared predictions changed, "
                                                      "largest change first",
                                 note="in brackets: the model's band (time_us_low–time_us_high); outside the band: "
                                      "one side's time lies outside the other side's band (– without bands)"))
    blocks += _unmatched(un, [k for k in analyze.PREDICTION_KEYS if k in un.columns], pair, "prediction")
    return PanelOutput(blocks)


COMPARE_PANELS: tuple[Panel, ...] = (
    Panel("bench", "Timing comparison", S_COMPARE, ("bench",), _timing_prov,
          "analyze.diff_bench on the timed points of both runs, matched on variant, dataset and mode; delta with "
          "its significance from both confidence intervals", _c_bench),
    Panel("metrics", "Kernels matched and compared (Nsight Compute)", S_COMPARE, ("kview-both",), ("ncu",),
          "analyze.match_kernels (base name and launch order, --pair, similar names) and analyze.kernel_deltas "
          "on the per-kernel views of both sides; kernels on one side only are listed", _c_metrics),
    Panel("static", "Static characterization: what changed", S_COMPARE, ("runs", "static-both"), ("static",),
          "analyze.diff_static on static.csv of both runs (per variant, arch, role, cap, sweep)", _c_static),
    Panel("sass", "SASS hot loops: what changed", S_COMPARE, ("runs", "sass-both"), ("static",),
          "analyze.diff_sass on sass.csv of both runs (per variant, arch, role, kernel)", _c_sass),
    Panel("predictions", "Model predictions: what changed", S_COMPARE, ("runs", "predictions-both"), ("model",),
          "analyze.diff_predictions on predictions.csv of both runs (per variant, dataset, GPU, mode), against "
          "the model's bands", _c_predictions),
)
