"""Report stage, panels of a stored run's static characterization: registers, spills, occupancy,
the register sweep and each hot loop read from its SASS.
"""

from __future__ import annotations

import ast
import json
from typing import Any

import pandas as pd

from characterize.report.blocks import (
    Cell,
    DetailsBlock,
    Missing,
    NoteBlock,
    PanelOutput,
    as_text,
    column_cell,
    figure_block,
    fmt_num,
    fmt_pct,
    is_na,
    ordered_rows,
    table_block,
)
from characterize.report.layout import (
    PROFILE_HINT,
    S_STATIC,
    Panel,
    points_missing,
)
from characterize.report.plots import (
    register_sweep_figure,
    sass_figure,
    static_occupancy_figure,
)
from characterize.report.provenance import PROVENANCE
from characterize.report.sources import RunSource


def _p_static(s: RunSource) -> PanelOutput:
    d = ordered_rows(s.static_config)
    spec = [("variant", lambda r: Cell(str(r["variant"]), "code")), ("arch", column_cell("arch", as_text, "")),
            ("role", column_cell("role", as_text, "")),
            ("cap", lambda r: Cell("none" if is_na(r.get("maxrregcount")) else fmt_num(r["maxrregcount"]), "num")),
            ("kernel", lambda r: Cell(as_text(r.get("kernel")), "code")),
            ("registers", column_cell("registers")), ("spill stores (B)", column_cell("spill_stores")),
            ("spill loads (B)", column_cell("spill_loads")), ("stack (B)", column_cell("stack_frame")),
            ("shared (B)", column_cell("shared_mem")), ("block", column_cell("block_size")),
            ("blocks/SM", column_cell("blocks_per_sm")),
            ("theoretical occupancy", column_cell("theoretical_occupancy_pct", fmt_pct)),
            ("limiter", column_cell("limiter", as_text, ""))]
    blocks: list[Any] = [table_block(d, spec, caption="Kernels as each variant is configured (cap: -maxrregcount)")]
    look = d[d["role"] == "lookup"] if "role" in d.columns else d
    if not look.empty and "theoretical_occupancy_pct" in look.columns:
        blocks.append(figure_block(static_occupancy_figure(look, "Theoretical occupancy of the lookup kernels"),
                                   "Theoretical occupancy", f"{PROVENANCE['static'].label}: ptxas + occupancy "
                                   "calculator; no caches or clocks involved"))
    return PanelOutput(blocks)


def _p_sweep(s: RunSource) -> PanelOutput:
    d = ordered_rows(s.static_sweep)
    fig = register_sweep_figure(d, "Register sweep")
    spec = [("variant", lambda r: Cell(str(r["variant"]), "code")), ("arch", column_cell("arch", as_text, "")),
            ("-maxrregcount", column_cell("maxrregcount")), ("registers", column_cell("registers")),
            ("spill st/ld (B)", lambda r: Cell(f"{fmt_num(r.get('spill_stores'))} / {fmt_num(r.get('spill_loads'))}",
                                               "num")),
            ("blocks/SM", column_cell("blocks_per_sm")),
            ("theoretical occupancy", column_cell("theoretical_occupancy_pct", fmt_pct)),
            ("limiter", column_cell("limiter", as_text, ""))]
    return PanelOutput([
        figure_block(fig, "Register sweep", f"{PROVENANCE['static'].label}: each cap compiled with nvcc; "
                     "no caches or clocks involved"),
        DetailsBlock(f"Register-sweep table ({len(d)} rows)", [table_block(d, spec)])])


def _load_bits_text(v: Any) -> str:
    """'{32: 2, 128: 4}' (or a dict, or JSON) as '4 x 128-bit, 2 x 32-bit'."""
    if is_na(v) or v == "":
        return "–"
    d = v
    if isinstance(v, str):
        try:
            d = json.loads(v.replace("'", '"'))
        except ValueError:
            try:
                d = ast.literal_eval(v)
            except (ValueError, SyntaxError):
                return v
    if isinstance(d, dict):
        items = sorted(((int(k), int(n)) for k, n in d.items()), reverse=True)
        return ", ".join(f"{n} × {b}-bit" for b, n in items) or "none"
    return str(d)


def sass_view(s: RunSource) -> pd.DataFrame:
    """The lookup kernels' hot loops (sass.csv) beside the model's assumption (loads in
    flight, predictions.csv, per variant x arch) and the measured long-scoreboard stall
    (ncu, per variant, where the run's GPU has the row's architecture)."""
    d = s.sass.copy()
    if "role" in d.columns:
        d = d[d["role"].fillna("lookup").astype(str) == "lookup"]
    d["variant"] = d["variant"].astype(str)
    d["arch"] = d["arch"].astype(str)
    p = s.primary_predictions
    if not p.empty and {"variant", "arch", "loads_in_flight"} <= set(p.columns):
        g = p.groupby(["variant", "arch"])["loads_in_flight"]
        m = pd.DataFrame({"model_loads_in_flight": g.median(), "model_lo": g.min(), "model_hi": g.max()}).reset_index()
        m["variant"], m["arch"] = m["variant"].astype(str), m["arch"].astype(str)
        d = d.merge(m, on=["variant", "arch"], how="left")
    k = s.lookup_view
    arch = s.gpu.get("arch")
    if not k.empty and "stall_long_scoreboard" in k.columns and arch:
        ls = k.groupby("variant")["stall_long_scoreboard"].mean().rename("measured_long_scoreboard").reset_index()
        ls["arch"] = str(arch)
        d = d.merge(ls, on=["variant", "arch"], how="left")
    return ordered_rows(d)


def _sass_verdict(r: dict) -> str:
    notes = []
    sass, model = r.get("rows_in_flight"), r.get("model_loads_in_flight")
    if not is_na(sass) and not is_na(model) and float(sass) > 0:
        ratio = float(model) / float(sass)
        if ratio > 1.25:
            notes.append(f"the model assumes {ratio:.1f}x the rows in flight the SASS keeps")
        elif ratio < 0.8:
            notes.append(f"the SASS keeps {1 / ratio:.1f}x the rows in flight the model assumes")
        else:
            notes.append("model and SASS agree")
    spills = r.get("local_mem_ops")
    if not is_na(spills) and float(spills) > 0:
        notes.append(f"{int(spills)} spill access(es) (LDL/STL) per iteration")
    return "; ".join(notes) or "–"


def _sass_prov(s: RunSource) -> tuple[str, ...]:
    prov: tuple[str, ...] = ("static",)
    if not s.predictions.empty and "loads_in_flight" in s.predictions.columns:
        prov += ("model",)
    if not s.lookup_view.empty:
        prov += ("ncu",)
    return prov


def _p_sass(s: RunSource) -> PanelOutput:
    d = sass_view(s)
    if d.empty:
        raise Missing("sass.csv has no lookup-kernel rows")
    lacking = [c for c in ("rows_in_flight", "row_loads", "local_mem_ops") if c not in d.columns]
    blocks: list[Any] = []
    if "rows_in_flight" in d.columns and d["rows_in_flight"].notna().any():
        blocks.append(figure_block(sass_figure(d, "Rows in flight per warp in the hot loop"), "Rows in flight",
                                   "blue: read from the SASS by an in-order replay of the hot loop (static "
                                   "analysis)" + ("; orange: what the model assumes (model prediction input)"
                                                  if "model_loads_in_flight" in d.columns else "")))
    spec = [("variant", lambda r: Cell(str(r["variant"]), "code")), ("arch", column_cell("arch", as_text, "")),
            ("rows in flight (SASS)", column_cell("rows_in_flight")),
            ("model assumes", lambda r: Cell(
                fmt_num(r.get("model_loads_in_flight")) + (
                    f" ({fmt_num(r['model_lo'])}–{fmt_num(r['model_hi'])})"
                    if not is_na(r.get("model_lo")) and r.get("model_lo") != r.get("model_hi") else ""), "num")),
            ("long-scoreboard (ncu, cycles/inst)", column_cell("measured_long_scoreboard")),
            ("reading", lambda r: Cell(_sass_verdict(r), "txt")),
            ("spills in loop (LDL/STL)", column_cell("local_mem_ops")),
            ("loads by width", lambda r: Cell(_load_bits_text(r.get("load_bits")), "num")),
            ("row / index loads", lambda r: Cell(f"{fmt_num(r.get('row_loads'))} / {fmt_num(r.get('index_loads'))}",
                                                 "num")),
            ("latencies / iteration", column_cell("latencies_per_iteration")),
            ("instructions / iteration", column_cell("instructions")),
            ("kernel", lambda r: Cell(as_text(r.get("kernel")), "code"))]
    blocks.append(table_block(
        d, spec, caption="Hot loop of each lookup kernel (sass.csv)",
        note="rows in flight per warp = row loads per iteration / memory latencies serialized per "
             "iteration (in-order replay of the loop's SASS); model assumes: loads_in_flight of "
             "predictions.csv; long-scoreboard: measured on the run's GPU when profiled, mean over "
             "its datasets (– when not measured or another architecture)"))
    if "model_loads_in_flight" not in d.columns:
        blocks.append(NoteBlock("predictions.csv has no loads_in_flight column, so the model's assumption cannot be "
                                "shown beside the SASS."))
    if s.lookup_view.empty:
        blocks.append(NoteBlock("Not measured: no Nsight Compute profile in this run, so no long-scoreboard stall "
                                "to set beside the SASS. " + points_missing(s, "profile", PROFILE_HINT)))
    if lacking:
        blocks.append(NoteBlock("sass.csv lacks the column(s) " + ", ".join(lacking) + "."))
    return PanelOutput(blocks)


PANELS: tuple[Panel, ...] = (
    Panel("static", "Registers, spills and theoretical occupancy", S_STATIC, ("static",), ("static",),
          "each variant compiled with nvcc per architecture as configured; ptxas -v resources into the occupancy "
          "calculator (static.csv rows with sweep = False)", _p_static),
    Panel("sweep", "Register sweep", S_STATIC, ("sweep",), ("static",),
          "the lookup kernels recompiled with each -maxrregcount of the experiment (static.csv rows with "
          "sweep = True)", _p_sweep),
    Panel("sass", "SASS hot loop: rows in flight, load widths, spills", S_STATIC, ("sass",), _sass_prov,
          "the hot loop of each lookup kernel read from its SASS (sass.csv: loads by width, spills, memory "
          "latencies serialized per iteration, rows in flight), beside the model's loads_in_flight "
          "(predictions.csv) and the measured long-scoreboard stall (ncu)", _p_sass),
)
