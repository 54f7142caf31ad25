"""Report stage, panels of a stored run's timings: latency, speedups, effective bandwidth and the
L2 pre-pass.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from characterize.analysis import compare as analyze
from characterize.report.blocks import (
    POINT_COLS,
    Cell,
    DetailsBlock,
    Missing,
    NoteBlock,
    PanelOutput,
    column_cell,
    figure_block,
    fmt_ci,
    fmt_num,
    fmt_pct,
    fmt_x,
    ordered_rows,
    table_block,
)
from characterize.report.layout import (
    S_TIMING,
    Panel,
    asked_for,
    timing_provenances,
)
from characterize.report.plots import (
    bandwidth_figure,
    latency_figure,
    prepass_figure,
    speedup_figure,
)
from characterize.report.provenance import PROVENANCE
from characterize.report.sources import RunSource


def _p_latency(s: RunSource) -> PanelOutput:
    blocks: list[Any] = []
    prov = PROVENANCE[s.timing_provenance].label
    for mode in s.modes:
        sp = ordered_rows(analyze.speedups(s.bench_ok, mode))
        if sp.empty:
            continue
        blocks.append(figure_block(latency_figure(sp, f"Latency per table, {mode}"),
                                   f"Latency ({mode})", f"{prov}; {s.timing_mode(mode)}; error bars: 95% CI",
                                   stamp=s.timing_stamp))
        spec = [*POINT_COLS,
                ("latency (µs)", lambda r: Cell(fmt_ci(r["latency_us"], r["latency_ci95_us"]), "num")),
                ("reps", column_cell("reps")), ("stable", lambda r: Cell(fmt_num(r.get("stable")), "")),
                ("vs base", lambda r: Cell(fmt_x(r.get("speedup_vs_base"), r.get("speedup_vs_base_ci95")), "num")),
                ("vs torch", lambda r: Cell(fmt_x(r.get("speedup_vs_torch"), r.get("speedup_vs_torch_ci95")), "num"))]
        blocks.append(table_block(sp, spec, caption=f"{mode}: latency per table (mean ± 95% CI; a batched launch's "
                                                    f"time over its tables) and speedups (> 1: faster) — {prov}",
                                  note="stable: the CI is within the experiment's target"))
    if s.emulated:
        blocks.insert(0, NoteBlock("CPU-emulation timings: they check the harness, NOT GPU performance.", "warning"))
    elif s.throttled_points:
        blocks.insert(0, NoteBlock(f"Throttled while timed (power or thermal limit, NVML): "
                                   f"{'; '.join(s.throttled_points)}. These points ran below the GPU's normal "
                                   "clocks; compare them with care, or bench them again once the GPU is cool.",
                                   "warning"))
    return PanelOutput(blocks, modes="; ".join(s.timing_mode(m) for m in s.modes))


def _p_speedup(s: RunSource) -> PanelOutput:
    blocks: list[Any] = []
    prov = PROVENANCE[s.timing_provenance].label
    for mode in s.modes:
        sp = ordered_rows(analyze.speedups(s.bench_ok, mode))
        for ref in ("base", "torch"):
            col = f"speedup_vs_{ref}"
            if sp.empty or col not in sp.columns or sp[col].notna().sum() == 0:
                blocks.append(NoteBlock(f"{mode}: no speedup over {ref}: {ref} was not timed in this mode."))
                continue
            blocks.append(figure_block(speedup_figure(sp, ref, f"Speedup over {ref}, {mode}"),
                                       f"Speedup over {ref} ({mode})",
                                       f"{prov}; {s.timing_mode(mode)}; ratio of means, error bars: 95% CI "
                                       "(delta method)", stamp=s.timing_stamp))
    return PanelOutput(blocks, modes="; ".join(s.timing_mode(m) for m in s.modes))


def _p_bandwidth(s: RunSource) -> PanelOutput:
    peak = s.gpu.get("hbm_GBps")
    blocks: list[Any] = []
    if peak:
        blocks.append(NoteBlock(f"HBM peak of {s.gpu.get('name') or s.gpu.get('key') or 'the GPU'}: "
                                f"{fmt_num(peak)} GB/s (vendor figure from the spec table). The bytes here are the "
                                "ones a launch requests (every lookup's row), not the ones DRAM moves: on a cold, "
                                "spread trace they meet the peak only when the gather is bandwidth-bound, so the "
                                "gap shows how latency-bound it is; on a hot trace repeated rows hit in L2 and the "
                                "rate passes the HBM peak (L2 served them). The Nsight Compute bandwidth roofline "
                                "sets the DRAM bytes actually moved against the peak."))
    else:
        blocks.append(NoteBlock("No GPU peak bandwidth is recorded for this run (meta.json has no GPU), so the "
                                "effective bandwidth is shown without the HBM peak line."))
    prov = PROVENANCE[s.timing_provenance].label
    for mode in s.modes:
        sp = ordered_rows(analyze.speedups(s.bench_ok, mode))
        if sp.empty or "effective_GBps" not in sp.columns:
            continue
        sp = sp.copy()
        sp["peak_pct"] = 100 * sp["effective_GBps"] / peak if peak else np.nan
        blocks.append(figure_block(bandwidth_figure(sp, peak, f"Effective bandwidth against the HBM peak, {mode}"),
                                   f"Effective bandwidth ({mode})",
                                   f"{prov}; {s.timing_mode(mode)}; effective bandwidth = bytes a table launch must "
                                   "move (rows gathered + indices + offsets + output) / its mean time",
                                   stamp=s.timing_stamp))
        spec = [*POINT_COLS,
                ("effective GB/s", column_cell("effective_GBps")),
                ("requested / HBM peak", lambda r: Cell(fmt_pct(r.get("peak_pct")), "num"))]
        blocks.append(DetailsBlock(f"{mode}: effective bandwidth table", [table_block(sp, spec)]))
    return PanelOutput(blocks, modes="; ".join(s.timing_mode(m) for m in s.modes))


PREPASS_VARIANTS = ("l2p", "l2w", "combined")


def _p_prepass(s: RunSource) -> PanelOutput:
    b = s.bench_ok
    if not (b["variant"] == "base").any():
        raise Missing("base was not timed, so there is no speedup over base")
    if not b["variant"].isin(PREPASS_VARIANTS).any():
        raise Missing("no variant with an L2 pre-pass or window (l2p, l2w, combined) was timed in this run")
    blocks: list[Any] = []
    prov = PROVENANCE[s.timing_provenance].label
    for mode in s.modes:
        ex = analyze.speedups(b, mode, against=("base",))
        inc = analyze.speedups(b, mode, against=("base",), include_prepass=True)
        if ex.empty:
            continue
        m = ex.merge(inc[["variant", "dataset", "latency_us", "latency_ci95_us", "speedup_vs_base",
                          "speedup_vs_base_ci95"]], on=["variant", "dataset"], suffixes=("", "_incl"))
        m = ordered_rows(m[m["variant"].isin(PREPASS_VARIANTS + ("base",))])
        if "prepass_per_table_us" not in m.columns:
            m["prepass_per_table_us"] = np.nan
        spec = [*POINT_COLS,
                ("kernel (µs)", lambda r: Cell(fmt_ci(r["latency_us"], r["latency_ci95_us"]), "num")),
                ("pre-pass (µs)", column_cell("prepass_per_table_us")),
                ("kernel + pre-pass (µs)",
                 lambda r: Cell(fmt_ci(r["latency_us_incl"], r["latency_ci95_us_incl"]), "num")),
                ("vs base, pre-pass excluded",
                 lambda r: Cell(fmt_x(r["speedup_vs_base"], r["speedup_vs_base_ci95"]), "num")),
                ("vs base, pre-pass included", lambda r: Cell(fmt_x(r["speedup_vs_base_incl"],
                                                                    r["speedup_vs_base_ci95_incl"]), "num"))]
        pm = m[m["variant"].isin(PREPASS_VARIANTS)]
        blocks.append(figure_block(prepass_figure(pm, f"Lookup kernel and L2 pre-pass per table launch, {mode}"),
                                   f"Pre-pass ({mode})", f"{prov}; {s.timing_mode(mode)}",
                                   stamp=s.timing_stamp))
        blocks.append(table_block(m, spec, caption=f"{mode}: pre-pass excluded (as the paper reports) and included "
                                                   f"— {prov}"))
    return PanelOutput(blocks, modes="; ".join(s.timing_mode(m) for m in s.modes))


PANELS: tuple[Panel, ...] = (
    Panel("latency", "Latency per variant and dataset", S_TIMING, ("bench",), timing_provenances,
          "mean per-table latency with its 95% CI, per timing mode (analyze.speedups)", _p_latency),
    Panel("speedup", "Speedup over base and over torch", S_TIMING, ("bench",), timing_provenances,
          "ratio of means with a 95% CI by the delta method (analyze.speedups)", _p_speedup),
    Panel("bandwidth", "Effective bandwidth against the GPU's peak", S_TIMING, ("bench",), timing_provenances,
          "bytes a table launch must move / mean latency, against the HBM peak of the run's GPU "
          "(meta.json gpu.hbm_GBps)", _p_bandwidth),
    Panel("prepass", "L2 pre-pass included and excluded", S_TIMING, ("bench",), timing_provenances,
          "lookup-kernel time and the time of the L2 pre-pass before it, timed separately with events; speedups "
          "with the pre-pass excluded (as the paper counts) and included", _p_prepass,
          applies=lambda s: asked_for(s, PREPASS_VARIANTS) or (not s.bench_ok.empty and
                                                               s.bench_ok["variant"].isin(PREPASS_VARIANTS).any())),
)
