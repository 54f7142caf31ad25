"""Report stage, panels of a stored run's model predictions: the predictions with their bands, the
whole DLRM step, predictions against measurements and the precision grid.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from characterize.analysis import compare as analyze
from characterize.analysis.answer import predicted_speedups
from characterize.analysis.claims import PAPER_CLAIMS
from characterize.analysis.model.e2e import INFERENCE_STAGES, TRAINING_STAGES, stage_gmae
from characterize.analysis.model.predict import precision_grid
from characterize.analysis.model.scores import gmae
from characterize.analysis.model.validation_error import model_error
from characterize.analysis.validation import VALIDATION_CSV, summarize
from characterize.report.blocks import (
    POINT_COLS,
    PREDICTION_STAMP,
    Cell,
    DetailsBlock,
    Missing,
    NoteBlock,
    PanelOutput,
    TableBlock,
    as_text,
    code_cell,
    column_cell,
    figure_block,
    fmt_ci,
    fmt_num,
    fmt_pct,
    fmt_x,
    is_na,
    ordered_rows,
    table_block,
)
from characterize.report.layout import (
    S_MODEL,
    Panel,
    experiment_of,
    is_paper,
)
from characterize.report.plots import (
    WHY_TERMS,
    e2e_stage_figure,
    order_datasets,
    precision_grid_figure,
    predicted_vs_measured_figure,
    prediction_figure,
    trust_figure,
    why_figure,
)
from characterize.report.provenance import PROVENANCE
from characterize.report.sources import RunSource
from characterize.report.views import prediction_gpus, predictions_per_table
from characterize.units import format_bytes


def _claims(s: RunSource) -> dict[str, str]:
    """The paper's claims, for the paper's configuration only."""
    return {k: c.text for k, c in PAPER_CLAIMS.items()} if is_paper(s) else {}


def _predicted_headline(d: pd.DataFrame, gpu: str, claims: dict[str, str]) -> TableBlock:
    """Technique x hotness -> predicted speedup over base (beside the paper's claims, for its configuration)."""
    table = d.pivot_table(index="variant", columns="dataset", values="speedup_vs_base", aggfunc="mean")
    datasets = order_datasets(table.columns)
    rows = []
    for v in ordered_rows(pd.DataFrame({"variant": table.index}))["variant"]:
        vals = [table.loc[v, ds] for ds in datasets]
        best = max((x for x in vals if not is_na(x)), default=np.nan)
        rows.append([Cell(v, "code")] + [Cell(fmt_x(x), "num") for x in vals] +
                    [Cell("–" if is_na(best) else f"{100 * (best - 1):+.0f}%", "num")] +
                    ([Cell(claims.get(v, ""), "claim")] if claims else []))
    return TableBlock(["variant"] + datasets + ["best over base"] + (["paper (A100, embedding stage)"] if claims
                                                                      else []), rows,
                      caption=f"PREDICTED speedup over base{' on ' + gpu if gpu else ''} (model, not a measurement)")


def _p_e2e(s: RunSource) -> PanelOutput:
    e = s.run.e2e
    gpus = list(dict.fromkeys(e["gpu"].astype(str)))
    mine = s.gpu.get("key")
    gpus.sort(key=lambda g: (g != mine, g))
    datasets = order_datasets(e["dataset"].unique())
    ds = "medium" if "medium" in datasets else datasets[0]
    blocks: list[Any] = []
    for i, gpu in enumerate(gpus[:2]):
        figs: list[Any] = []
        for phase, stages in (("inference", INFERENCE_STAGES), ("training", TRAINING_STAGES)):
            d = e[(e["gpu"].astype(str) == gpu) & (e["phase"] == phase) & (e["dataset"] == ds)]
            if d.empty:
                continue
            src = "measured" if (d["source"] == "measured").any() else "predicted"
            d = d[d["source"] == src]
            fig = e2e_stage_figure(d, stages, f"DLRM {phase} step per variant, {ds}, {gpu} ({src})")
            figs.append(figure_block(fig, f"{phase.capitalize()} step ({gpu})",
                                     f"time per batch split by stage ({src}; {ds}); a stage includes the idle "
                                     "time before its kernels", stamp=PREDICTION_STAMP if src == "predicted"
                                     else None))
        if figs:   # the run's own GPU (or the first) open, another behind a disclosure
            blocks += figs if i == 0 else [DetailsBlock(f"The DLRM step on {gpu}", figs)]
    tot = e[(e["stage"] == "total") & (e["dataset"] == ds)]
    rows = []
    for r in ordered_rows(tot).to_dict("records"):
        rows.append([Cell(r["variant"], "code"), Cell(str(r["gpu"])), Cell(r["phase"]), Cell(r["source"]),
                     Cell(fmt_num(r["time_us"]), "num"),
                     Cell(f"{fmt_num(r.get('time_us_low'))}–{fmt_num(r.get('time_us_high'))}", "num"),
                     Cell(fmt_pct(100 * r["embedding_share"]) if not is_na(r.get("embedding_share")) else "–", "num"),
                     Cell(fmt_x(r.get("speedup_e2e")), "num"), Cell(fmt_x(r.get("speedup_embedding")), "num")])
    paper = (f"; the paper (A100): up to {PAPER_CLAIMS['end_to_end'].ratio:.2f}x end to end, "
             f"{PAPER_CLAIMS['combined'].ratio:.2f}x for the embedding stage") if is_paper(s) else ""
    blocks.append(DetailsBlock(f"Step times and speedups ({ds}, {len(rows)} rows)", [TableBlock(
        ["variant", "GPU", "phase", "source", "batch (µs)", "band (µs)", "embedding share", "speedup end to end",
         "speedup embedding only"], rows, caption=f"{ds}{paper}")], open=len(rows) <= 12))
    errors = stage_gmae(e)
    if not errors.empty:
        blocks.append(table_block(errors, [("phase", column_cell("phase", as_text, "")),
                                           ("stage", column_cell("stage", as_text, "")),
                                           ("points", column_cell("points")),
                                           ("GMAE", column_cell("gmae", lambda x: fmt_pct(100 * x)))],
                                  caption="the model against the measured step, per stage "
                                          "(geometric-mean absolute error)"))
    return PanelOutput(blocks)


def _p_predictions(s: RunSource) -> PanelOutput:
    p = s.primary_predictions.copy()
    lacking = sorted({"variant", "dataset"} - set(p.columns))
    if lacking:
        raise Missing(f"predictions.csv lacks the column(s) {', '.join(lacking)}")
    blocks: list[Any] = [NoteBlock("Model predictions, not measurements.", "prediction")]
    if "mode" in p.columns:
        p = p[p["mode"].fillna("steady") == "steady"] if (p["mode"] == "steady").any() else p
    claims = _claims(s)
    # with nothing measured the headline already draws these; beside measurements they are the model's view
    for gpu in (prediction_gpus(s, p)[:2] if not s.bench_ok.empty else []):
        d = predicted_speedups(ordered_rows(p[p["gpu"].astype(str) == gpu] if gpu else p))
        if d["speedup"].notna().any():
            fig = prediction_figure(d, gpu, f"Predicted speedup over base{', ' + gpu if gpu else ''}")
            blocks.append(figure_block(fig,
                                       f"Predicted speedup ({gpu})", f"{PROVENANCE['model'].label} (PREDICTION), "
                                       "steady mode (L2 warm); error bars: the model's band", stamp=PREDICTION_STAMP))
            blocks.append(_predicted_headline(d, gpu, claims))
    spec = list(POINT_COLS)
    for col, head, f in (("gpu", "GPU", as_text), ("arch", "arch", as_text),
                         ("time_us", "predicted time per table (µs)", fmt_num),
                         ("time_us_low", "band low (µs)", fmt_num), ("time_us_high", "band high (µs)", fmt_num),
                         ("speedup_vs_base", "predicted vs base", fmt_x),
                         ("l2_hit_rate_pct", "predicted L2 hit", fmt_pct),
                         ("dram_bytes", "predicted DRAM bytes per table", format_bytes),
                         ("l2_bytes", "predicted L2 bytes per table", format_bytes),
                         ("bound", "bound by", as_text), ("constants", "constants", as_text),
                         ("note", "note", as_text)):
        if col in p.columns:
            spec.append((head, column_cell(col, f, "num" if f is not as_text else "")))
    blocks.append(DetailsBlock(f"Prediction table ({len(p)} rows)", [table_block(
        ordered_rows(predictions_per_table(p)), spec, caption="PREDICTED by the model; the band spans the latency "
        "and bandwidth constants over their published ranges; times and bytes per table (a launch covering every "
        "table, tbe's, divided by the tables)")]))
    v = s.run.model_validation
    if not v.empty and claims:
        vspec = [(c, column_cell(c, as_text, "")) for c in ("claim", "paper", "model", "agrees", "gpu", "constants")
                 if c in v.columns]
        blocks.append(table_block(v, vspec, caption="The model against the MICRO 2024 paper's A100 claims (paper "
                                                    "configuration on sm_80; model PREDICTIONS vs published "
                                                    "measurements)"))
    return PanelOutput(blocks)


def _p_why(s: RunSource) -> PanelOutput:
    """Per variant, the model's terms (latency, DRAM, L2, L1, issue) and hit rates: why it
    takes the time it does, for each GPU and dataset."""
    p = s.primary_predictions
    terms = [c for c, _, _ in WHY_TERMS if c in p.columns]
    if p.empty or not terms:
        raise Missing("predictions.csv has none of the model's terms (latency_us, dram_us, l2_us, l1_us, issue_us); "
                      "predict again with this version")
    if "mode" in p.columns and (p["mode"] == "steady").any():
        p = p[p["mode"] == "steady"]
    if "cache_ratio" in p.columns:
        p = p[p["cache_ratio"].isna()]   # host-resident rows have their own split (host panels)
    p = predictions_per_table(p)
    datasets = order_datasets(p["dataset"].unique())
    first = "medium" if "medium" in datasets else datasets[len(datasets) // 2]
    blocks: list[Any] = [NoteBlock("Model predictions, not measurements: the predicted time of a table is its largest "
                                   "term (solid bar) plus the launch overhead; the faint bars are the terms that do "
                                   "not limit it (a launch covering every table, tbe's, divided by the tables).",
                                   "prediction")]
    for i, gpu in enumerate(prediction_gpus(s, p)[:2]):   # one dataset drawn; every one in the table below
        g = p[p["gpu"].astype(str) == gpu] if gpu else p
        fig = figure_block(why_figure(g[g["dataset"] == first], f"Why: the model's terms, {first}, {gpu}"),
                           f"Why ({first}, {gpu})", f"{PROVENANCE['model'].label} (PREDICTION), steady mode",
                           stamp=PREDICTION_STAMP)
        blocks.append(fig if i == 0 else DetailsBlock(f"The same on {gpu}", [fig]))
    spec = [*POINT_COLS, ("GPU", code_cell("gpu")), ("bound", column_cell("bound", as_text, ""))] + \
        [(c.removesuffix("_us") + " (µs)", column_cell(c)) for c in terms] + \
        [(f"{lv} hit", column_cell(f"{lv.lower()}_hit_rate_pct", fmt_pct)) for lv in ("L1", "L2")
         if f"{lv.lower()}_hit_rate_pct" in p.columns]
    blocks.append(DetailsBlock(f"The terms as numbers, every dataset ({len(p)} rows)", [table_block(
        ordered_rows(p), spec, caption="PREDICTED, per table")]))
    return PanelOutput(blocks)


def _p_predicted_vs_measured(s: RunSource) -> PanelOutput:
    if s.emulated:
        raise Missing("the timings are CPU emulation; predictions of GPU time are compared with GPU measurements "
                      "only")
    key = s.gpu.get("key")
    p = s.primary_predictions
    if not {"variant", "dataset", "time_us"} <= set(p.columns):
        raise Missing("predictions.csv has no variant/dataset/time_us columns to compare")
    if not key:
        raise Missing("the run records no GPU, so there is no measurement to compare predictions with")
    if "gpu" in p.columns:
        p = p[p["gpu"].astype(str) == key]
    if p.empty:
        raise Missing(f"predictions.csv has no rows for this run's GPU ({key})")
    p = predictions_per_table(p)   # the measurements are per table, tbe's launch divided by its tables
    blocks: list[Any] = []
    for mode in s.modes:
        meas = analyze.speedups(s.bench_ok, mode, against=())
        pm = p[p["mode"] == mode] if "mode" in p.columns else (p if mode == "steady" else p.iloc[0:0])
        m = meas.merge(pm[["variant", "dataset", "time_us"]], on=["variant", "dataset"], how="inner")
        if m.empty:
            continue
        m = ordered_rows(m.rename(columns={"latency_us": "measured_us", "time_us": "predicted_us"}))
        m["error_pct"] = 100 * (m["predicted_us"] - m["measured_us"]) / m["measured_us"]
        blocks.append(figure_block(predicted_vs_measured_figure(m, f"Predicted vs measured time, {mode}"),
                                   f"Predicted vs measured ({mode})",
                                   f"x: {PROVENANCE[s.timing_provenance].label} ({s.timing_mode(mode)}); "
                                   f"y: {PROVENANCE['model'].label} (PREDICTION)", stamp=PREDICTION_STAMP))
        gm = 100 * gmae(m["predicted_us"], m["measured_us"])
        spec = [*POINT_COLS,
                ("measured (µs)", lambda r: Cell(fmt_ci(r["measured_us"], r["latency_ci95_us"]), "num")),
                ("predicted (µs)", column_cell("predicted_us")), ("error", column_cell("error_pct", fmt_pct))]
        # both per table: a launch covering every table (tbe's) divided by the tables, measured and predicted
        blocks.append(table_block(m, spec, caption=f"{mode}: prediction against measurement",
                                  note=f"geometric mean of |relative error| (GMAE, model.gmae): {gm:.1f}%"))
    k = s.lookup
    if not k.empty and "l2_hit_rate_pct" in p.columns and "l2_hit_rate_pct" in k.columns:
        kk = k[k.get("cache_control", pd.Series("", index=k.index)).astype(str) == "none"]
        if not kk.empty:
            meas = kk.groupby(["variant", "dataset"], as_index=False)["l2_hit_rate_pct"].mean()
            pm = p[p["mode"] == "steady"] if "mode" in p.columns else p
            m = meas.merge(pm[["variant", "dataset", "l2_hit_rate_pct"]], on=["variant", "dataset"],
                           suffixes=("_measured", "_predicted"))
            if not m.empty:
                spec = [("variant", lambda r: Cell(str(r["variant"]), "code")),
                        ("dataset", lambda r: Cell(str(r["dataset"]), "code")),
                        ("measured L2 hit (ncu)", column_cell("l2_hit_rate_pct_measured", fmt_pct)),
                        ("predicted L2 hit (model)", column_cell("l2_hit_rate_pct_predicted", fmt_pct))]
                gm = 100 * gmae(m["l2_hit_rate_pct_predicted"], m["l2_hit_rate_pct_measured"])
                blocks.append(table_block(ordered_rows(m), spec, caption="L2 hit rate: Nsight Compute with "
                                          "--cache-control none against the model's PREDICTION",
                                          note=f"geometric mean of |relative error| (GMAE): {gm:.1f}%"))
    if not blocks:
        raise Missing("no (variant, dataset) point has both a prediction and a measurement")
    return PanelOutput(blocks)


def _p_trust(s: RunSource) -> PanelOutput:
    """The model against public measurements of other projects (characterize validate)."""
    err = model_error()
    if err is None or not VALIDATION_CSV.is_file():
        raise Missing("the model has not been validated in this installation: run `characterize validate --write`")
    rows = pd.read_csv(VALIDATION_CSV)
    own = rows[~rows["proxy"].astype(str).str.lower().isin(("true", "1"))]
    held = own.assign(predicted_us=own["cv_predicted_us"])
    summary = summarize(held, "band_low_us", "band_high_us")
    blocks: list[Any] = [NoteBlock(
        f"Every prediction in this report is a PREDICTION. Against {err.n} public measurements from {err.sources} "
        f"sources that it was not fitted to (each predicted with the constants refitted on the other sources), the "
        f"model's GMAE is {100 * err.gmae:.1f}% (MAPE {100 * err.mape:.1f}%) and {100 * err.coverage:.0f}% of the "
        "measured times fall inside its band; the bands of this report's predictions carry that error. The "
        "measurements, their sources and what they do not say: docs/measurements.md; `characterize validate` "
        "reproduces these figures.", "prediction")]
    blocks.append(figure_block(trust_figure(rows, "Public measurements against the model (held out)"),
                               "How far to trust the model", "x: measured by other projects (pull requests, "
                               "benchmark result files; docs/measurements.md); y: the model, its constants fitted "
                               "on the other sources (PREDICTION), with its band", stamp=PREDICTION_STAMP))
    spec = [("source", code_cell("source")), ("rows", column_cell("n", fmt_num)),
            ("GPUs", lambda r: Cell(str(r["gpus"]))),
            ("GMAE", column_cell("gmae", lambda v: fmt_pct(100 * v))),
            ("MAPE", column_cell("mape", lambda v: fmt_pct(100 * v))),
            ("inside the band", column_cell("inside_band", lambda v: fmt_pct(100 * v)))]
    blocks.append(table_block(summary, spec, caption="leave-one-source-out cross-validation, per source"))
    return PanelOutput(blocks)


def _p_precision(s: RunSource) -> PanelOutput:
    grid = precision_grid(s.predictions)
    if grid.empty:
        raise Missing("the run predicted one precision only; list more in the experiment (dtypes = [\"fp16\", "
                      "\"bf16\", \"int8\"]) or run `characterize predict EXP --dtypes all`")
    blocks: list[Any] = [NoteBlock("Model predictions, not measurements: each cell is base's predicted time on fp32 "
                                   "tables over the variant's predicted time on that precision (geometric mean over "
                                   "datasets).", "prediction")]
    for gpu in prediction_gpus(s, grid)[:2]:
        g = grid[grid["gpu"] == gpu]
        blocks.append(figure_block(precision_grid_figure(g, f"Predicted speedup over fp32 base, {gpu}"),
                                   f"Precision x variant ({gpu})", f"{PROVENANCE['model'].label} (PREDICTION), "
                                   "steady mode", stamp=PREDICTION_STAMP))
    spec = [("GPU", code_cell("gpu")), ("dtype", code_cell("dtype")), ("variant", code_cell("variant")),
            ("predicted speedup over fp32 base", column_cell("speedup_vs_fp32_base", fmt_x)),
            ("datasets", column_cell("datasets", fmt_num))]
    blocks.append(DetailsBlock(f"Precision grid ({len(grid)} rows)", [table_block(grid, spec, caption="PREDICTED")]))
    return PanelOutput(blocks)


def _several_precisions(s: RunSource) -> bool:
    """The precision grid appears when the experiment lists precisions or the predictions hold several."""
    p = s.predictions
    return bool(experiment_of(s).get("dtypes")) or ("dtype" in p.columns and p["dtype"].nunique() > 1)


PANELS: tuple[Panel, ...] = (
    Panel("predictions", "Model predictions", S_MODEL, ("predictions",), ("model",),
          "predictions.csv written by the model step; predictions, not measurements", _p_predictions),
    Panel("why", "Why: the model's time split per variant", S_MODEL, ("predictions",), ("model",),
          "predictions.csv latency_us, dram_us, l2_us, l1_us and issue_us (the model's terms; the time is the "
          "largest plus the launch overhead) and the predicted L1 and L2 hit rates", _p_why),
    Panel("e2e", "The whole DLRM step", S_MODEL, ("e2e",), ("model",),
          "e2e.csv: the DLRM step (bottom MLP, embedding stage, interaction, top MLP; training adds backward and "
          "optimizer) per variant, predicted per stage by analysis.model.e2e (measured on a GPU)", _p_e2e),
    Panel("predicted-vs-measured", "Predicted vs measured", S_MODEL, ("predictions", "bench"),
          lambda s: ("model", s.timing_provenance),
          "predictions for the run's GPU joined with the measured points (and ncu L2 hit rates collected with "
          "--cache-control none)", _p_predicted_vs_measured),
    Panel("trust", "How far to trust the model", S_MODEL, (), ("model",),
          "analysis/model/validation.csv and model_error.json, written by `characterize validate --write`: public "
          "measured kernel times predicted under leave-one-source-out cross-validation", _p_trust),
    Panel("precision", "Precision x variant: predicted speedup over fp32 base", S_MODEL, ("predictions",), ("model",),
          "predictions.csv rows of every precision the experiment lists (dtypes), base at fp32 as the reference "
          "(analysis.model.predict.precision_grid)", _p_precision, applies=_several_precisions),
)
