"""Report stage, panels comparing two sources: matched kernels with deltas, timings with
significance, and (between two runs) the static characterization, the SASS hot loops
and the model's predictions.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from characterize.analysis import compare as analyze
from characterize.report.blocks import (
    POINT_COLS,
    Cell,
    DetailsBlock,
    Missing,
    NoteBlock,
    PanelOutput,
    as_text,
    column_cell,
    fmt_ci,
    fmt_num,
    fmt_pct,
    fmt_x,
    is_na,
    ordered_rows,
    table_block,
)
from characterize.report.layout import S_COMPARE, S_NCU, Panel, timing_provenances
from characterize.report.plots import order_datasets, order_variants
from characterize.report.provenance import PROVENANCE
from characterize.report.sources import Pair, RunSource, side_kernels
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
    return "–" if is_na(x) else f"{float(x):+.1f}%"


def _points(x: Any) -> str:
    """A change of a percentage, in percentage points."""
    return "–" if is_na(x) else f"{float(x):+.1f} pt"


def _unmatched(un: pd.DataFrame, keys: Sequence[str], pair: Pair, what: str) -> list[Any]:
    if un is None or un.empty:
        return [NoteBlock(f"Every {what} is present in both.")]
    names = {"a": pair.a.label, "b": pair.b.label}
    spec = [(k, (lambda k: lambda r: Cell(as_text(r.get(k)), "code"))(k)) for k in keys if k in un.columns]
    spec.append(("only in", lambda r: Cell(names.get(r["only_in"], str(r["only_in"])), "")))
    return [table_block(ordered_rows(un), spec, caption=f"Unmatched {what}s ({len(un)}): present on one side only, "
                                                        "listed instead of dropped")]


def _head(c: str, per: str) -> str:
    """A metric's header with its unit: an extensive one says per table or per launch."""
    h = _HEAD.get(c, c)
    if per not in ("table", "launch"):
        return h
    return h.replace(" (", f" per {per} (", 1) if " (" in h else f"{h} per {per}"


def _modes(pair: Pair) -> str:
    out = []
    for side in (pair.a, pair.b):
        if isinstance(side, RunSource):
            out.append(f"{side.label}: " + ("; ".join(side.ncu_mode(st["cache_control"], st["clock_control"])
                                                      for st in side.ncu_settings) or "no profiled points"))
        else:
            out.append(f"{side.label}: " + (side.recorded_modes or "ncu collection modes not recorded in the report"))
    return " | ".join(out)


# -------------------------------------------------------------------- panels
def _c_metrics(pair: Pair) -> PanelOutput:
    kp = pair.kernel_pairs()
    a, b, matched, keys = kp.a, kp.b, kp.matched, list(kp.keys)
    deltas = analyze.kernel_deltas(a, b, matched, [c for c, *_ in KERNEL_METRICS])
    blocks: list[Any] = []
    counts = matched["match"].value_counts()
    how = ", ".join(f"{n} by {m}" for m, n in counts.items() if not m.startswith("only"))
    blocks.append(NoteBlock(
        ("Only the kernels given by hand are compared (one source on both sides). " if pair.same else "") +
        f"Kernels matched {'within each ' + ' and '.join(keys) + ', ' if keys else ''}by demangled base name and "
        "launch order, then by a similar name (trailing version digits dropped), after any pair given by hand "
        f"(--pair A=B{': ' + ', '.join(pair.pairs) if pair.pairs else ''}: a variant, variant/dataset, NVTX range, "
        "function name or #ID). " + (f"Pairs: {how}." if how else "No kernel pairs up.")))
    per = dict(zip(deltas["metric"], deltas["per"])) if not deltas.empty else {}
    if deltas.empty:
        blocks.append(NoteBlock("No kernel is on both sides; pair kernels by hand with `--pair A=B` (a variant, "
                                "variant/dataset, NVTX range, function name or #ID).", "warning"))
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
                cls = "num" + ("" if is_na(d) or abs(d) < 5 else " bad" if d > 0 else " good") \
                    if c == "duration_ns" else "num"
                change = _points(y - x) if c.endswith("_pct") else _pct(d)
                return Cell(f"{_FMT[c](x)} → {_FMT[c](y)} ({change})", cls)
            return f

        spec = [(k, (lambda k: lambda r: Cell(as_text(r.get(k)), "code"))(k)) for k in keys]
        spec += [(pair.a.label, lambda r: Cell(as_text(r["a_kernel"]), "kname")),
                 (pair.b.label, lambda r: Cell(as_text(r["b_kernel"]), "kname")),
                 ("matched by", lambda r: Cell(r["match"], ""))]
        spec += [(_head(c, per.get(c, "")), cell(c)) for c, h, _, shown in KERNEL_METRICS
                 if shown and c in deltas["metric"].values]
        blocks.append(table_block(ordered_rows(w) if keys else w, spec,
                                  caption=f"Matched kernels: {pair.a.label} → {pair.b.label} (change in %)",
                                  note="a single profile carries no confidence interval, so no significance is claimed "
                                       "for these deltas; a run's kernels are averaged over its profiled launches" +
                                       ("; durations, bytes and instruction counts per table: a batched launch (tbe's) "
                                        "divided by the tables it covers" if "table" in per.values() else "")))
        lspec = [(k, (lambda k: lambda r: Cell(as_text(r.get(k)), "code"))(k)) for k in keys]
        lspec += [("kernels", lambda r: Cell(f"{as_text(r['a_kernel'])} ↔ {as_text(r['b_kernel'])}", "kname")),
                  ("metric", lambda r: Cell(_head(r["metric"], r["per"]), "")),
                  (pair.a.label, lambda r: Cell(_FMT[r["metric"]](r["a"]), "num")),
                  (pair.b.label, lambda r: Cell(_FMT[r["metric"]](r["b"]), "num")),
                  ("delta (b − a)", lambda r: Cell(_points(r["delta"]) if r["metric"].endswith("_pct") else
                                                   _FMT[r["metric"]](r["delta"]), "num")),
                  ("delta %", lambda r: Cell(_pct(r["delta_pct"]), "num"))]
        blocks.append(DetailsBlock(f"Every compared metric ({len(deltas)} rows)", [table_block(deltas, lspec)]))
    un = kp.unmatched()
    if not un.empty:
        blocks += _unmatched(un, [*keys, "kernel"], pair, "kernel")
    else:
        blocks.append(NoteBlock("Every kernel is matched."))
    return PanelOutput(blocks, modes=_modes(pair))


def _c_bench(pair: Pair) -> PanelOutput:
    a, b = pair.a, pair.b
    both, un = analyze.diff_bench(a.bench, b.bench, pair.pairs, auto=not (pair.same and pair.pairs))
    blocks: list[Any] = []
    if a.timing_provenance != b.timing_provenance:
        blocks.append(NoteBlock(f"{a.label} is {PROVENANCE[a.timing_provenance].label} and {b.label} is "
                                f"{PROVENANCE[b.timing_provenance].label}: their ratios compare different things.",
                                "warning"))
    elif a.emulated:
        blocks.append(NoteBlock("Both sides are CPU emulation: NOT GPU performance.", "warning"))
    spec = [*POINT_COLS, ("mode", column_cell("mode", as_text, "")),
            (f"{a.label} (µs)", lambda r: Cell(fmt_ci(r["per_table_us_a"], r.get("ci95_us_a")), "num")),
            (f"{b.label} (µs)", lambda r: Cell(fmt_ci(r["per_table_us_b"], r.get("ci95_us_b")), "num")),
            ("delta (µs)", column_cell("delta_us")), ("delta %", lambda r: Cell(_pct(r["delta_pct"]), "num")),
            ("significant (95%)", lambda r: Cell("–" if r["significant"] is None else
                                                 "yes" if r["significant"] else "no", "")),
            ("speedup of b over a", lambda r: Cell(fmt_x(r["per_table_us_a"] / r["per_table_us_b"]
                                                         if r["per_table_us_b"] else np.nan), "num"))]
    blocks.append(table_block(ordered_rows(both), spec, caption=f"Latency per table: {a.label} → {b.label}",
                              note="significant: |delta| exceeds the 95% CI of the difference of two independent means "
                                   "(sqrt(ci_a² + ci_b²))"))
    blocks += _unmatched(un, ["variant", "dataset", "mode"], pair, "timed point")
    return PanelOutput(blocks, provenance=timing_provenances(pair),
                       modes="both sides: " + "; ".join(a.timing_mode(m) for m in a.modes))


def _diff_blocks(changed: pd.DataFrame, un: pd.DataFrame, same: int, keys: Sequence[str], pair: Pair,
                 what: str) -> list[Any]:
    blocks: list[Any] = []
    keys = [k for k in keys if k in changed.columns or k in un.columns]
    if changed.empty:
        blocks.append(NoteBlock(f"No {what} changed ({same} row(s) identical on both sides)."))
    else:
        spec = [(k, (lambda k: lambda r: Cell(as_text(r.get(k)), "code"))(k)) for k in keys]
        spec += [("column", lambda r: Cell(r["column"], "code")),
                 (pair.a.label, lambda r: Cell(as_text(r["a"]) if not isinstance(r["a"], float) else fmt_num(r["a"]),
                                               "num")),
                 (pair.b.label, lambda r: Cell(as_text(r["b"]) if not isinstance(r["b"], float) else fmt_num(r["b"]),
                                               "num")),
                 ("delta", lambda r: Cell(fmt_num(r["delta"]), "num"))]
        blocks.append(table_block(ordered_rows(changed), spec,
                                  caption=f"{len(changed)} changed value(s) in "
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
        spec = [(k, (lambda k: lambda r: Cell(as_text(r.get(k)), "code"))(k)) for k in keys]

        def band(r: dict, side: str) -> str:
            lo, hi = r.get(f"time_us_low_{side}"), r.get(f"time_us_high_{side}")
            return "" if is_na(lo) or is_na(hi) else f" [{fmt_num(lo)}–{fmt_num(hi)}]"
        spec += [(f"{pair.a.label} (µs)", lambda r: Cell(fmt_num(r["time_us_a"]) + band(r, "a"), "num")),
                 (f"{pair.b.label} (µs)", lambda r: Cell(fmt_num(r["time_us_b"]) + band(r, "b"), "num")),
                 ("delta (µs)", column_cell("delta_us")), ("delta %", lambda r: Cell(_pct(r["delta_pct"]), "num")),
                 ("outside the band", lambda r: Cell("–" if r["outside_band"] is None else
                                                     "yes" if r["outside_band"] else "no", "")),
                 ("bound", lambda r: Cell(f"{as_text(r.get('bound_a'))} → {as_text(r.get('bound_b'))}"
                                          if "bound_a" in r else "", ""))]
        if moved.empty:
            blocks.append(NoteBlock(f"All {len(both)} shared predictions are unchanged (within 0.05%)."))
        else:
            blocks.append(table_block(
                moved, spec, caption=f"{len(moved)} of {len(both)} shared predictions changed, largest change first",
                note="in brackets: the model's band (time_us_low–time_us_high); outside the band: "
                     "one side's time lies outside the other side's band (– without bands)"))
    blocks += _unmatched(un, [k for k in analyze.PREDICTION_KEYS if k in un.columns], pair, "prediction")
    return PanelOutput(blocks)


# ------------------------------------------------------- each technique vs base
#: the variant every technique is diffed against in a run's report
REFERENCE = "base"


def _vs_cell(c: str, r: dict | None, reference: bool) -> Cell:
    """The reference's value, or a technique's with its change (percentages in points;
    a shorter duration is marked good)."""
    if r is None:
        return Cell("–", "num")
    v = r["a"] if reference else r["b"]
    text = _FMT[c](v)
    if reference:
        return Cell(text, "num")
    d = r["delta_pct"]
    change = _points(r["b"] - r["a"]) if c.endswith("_pct") else _pct(d)
    cls = "num" + ("" if c != "duration_ns" or is_na(d) or abs(d) < 5 else " bad" if d > 0 else " good")
    return Cell(f"{text} ({change})", cls)


def _vs_base(src: RunSource) -> PanelOutput:
    d = analyze.versus_reference(side_kernels(src), REFERENCE)
    if d.empty:
        done = sorted({str(p.get("variant")) for p in src.profile_points if p.get("status") == "ok"})
        raise Missing(f"{REFERENCE} was not profiled on any dataset another variant was (profiled: "
                      f"{', '.join(done) or 'none'}); profile {REFERENCE} with them to diff each technique against it")
    d = d[d["pair"] == d.groupby(["technique", "dataset"])["pair"].transform("min")]   # one kernel pair per point
    metrics = [c for c in analyze.VERSUS_COLUMNS if c in _FMT and c in set(d["metric"])]
    per = dict(zip(d["metric"], d["per"]))
    rows: list[dict] = []
    for ds in order_datasets(d["dataset"].astype(str)):
        g = d[d["dataset"].astype(str) == ds]
        first = {r["metric"]: r for r in g.to_dict("records")}
        rows.append({"dataset": ds, "variant": REFERENCE, "cells": [_vs_cell(c, first.get(c), True) for c in metrics]})
        for t in order_variants(g["technique"].astype(str)):
            mine = {r["metric"]: r for r in g[g["technique"] == t].to_dict("records")}
            rows.append({"dataset": ds, "variant": t, "cells": [_vs_cell(c, mine.get(c), False) for c in metrics]})
    spec = [("dataset", lambda r: Cell(r["dataset"], "code")), ("variant", lambda r: Cell(r["variant"], "code"))]
    spec += [(_head(c, per.get(c, "")), (lambda i: lambda r: r["cells"][i])(i)) for i, c in enumerate(metrics)]
    techniques = len(set(d["technique"]))
    note = ("mean lookup launch per point, the L2 pinning pre-pass left out (as bench's per-table latency leaves it "
            "out); durations and bytes per table: a batched launch (tbe) divided by the tables it covers; changes "
            "relative to base (percentages: in points); one profile each, so no significance is claimed")
    return PanelOutput([table_block(rows, spec, caption=f"{techniques} technique(s) against {REFERENCE}, dataset by "
                                                        "dataset", note=note)], modes=_modes_of(src))


def _modes_of(src: RunSource) -> str:
    return "; ".join(src.ncu_mode(st["cache_control"], st["clock_control"]) for st in src.ncu_settings)


def _vs_applies(src: Any) -> bool:
    """A run that profiled more than one variant (else there is nothing to diff)."""
    return isinstance(src, RunSource) and len({p.get("variant") for p in src.profile_points
                                               if p.get("status") == "ok"}) > 1


COMPARE_PANELS: tuple[Panel, ...] = (
    Panel("bench", "Timing comparison", S_COMPARE, ("bench",), timing_provenances,
          "analyze.diff_bench on the timed points of both runs, matched on variant, dataset and mode (after the "
          "--pair variants); delta with its significance from both confidence intervals", _c_bench),
    Panel("metrics", "Kernels matched and compared (Nsight Compute)", S_COMPARE, ("kview-both",), ("ncu",),
          "analyze.pair_kernels (--pair selectors, base name and launch order, similar names; a run's launches "
          "averaged and per table) and analyze.kernel_deltas on the per-kernel views of both sides; kernels on "
          "one side only are listed", _c_metrics),
    Panel("static", "Static characterization: what changed", S_COMPARE, ("runs", "static-both"), ("static",),
          "analyze.diff_static on static.csv of both runs (per variant, arch, role, cap, sweep)", _c_static),
    Panel("sass", "SASS hot loops: what changed", S_COMPARE, ("runs", "sass-both"), ("static",),
          "analyze.diff_sass on sass.csv of both runs (per variant, arch, role, kernel)", _c_sass),
    Panel("predictions", "Model predictions: what changed", S_COMPARE, ("runs", "predictions-both"), ("model",),
          "analyze.diff_predictions on predictions.csv of both runs (per variant, dataset, GPU, mode), against "
          "the model's bands", _c_predictions),
)

#: a run's own diff: each profiled technique against base, dataset by dataset (RUN_PANELS)
VS_BASE_PANELS: tuple[Panel, ...] = (
    Panel("vs-base", f"Each technique against {REFERENCE} (per table)", S_NCU, ("profile",), ("ncu",),
          "analyze.versus_reference: each variant's lookup kernels paired with base's on the same dataset "
          "(analyze.pair_kernels, --pair VARIANT/DATASET), their mean launch compared by analyze.kernel_deltas, "
          "durations and bytes divided by the tables a launch covers", _vs_base, applies=_vs_applies),
)
