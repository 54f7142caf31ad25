"""Report stage, panels of a stored run's model predictions: the predictions with their bands, the
whole DLRM step, predictions against measurements and the precision grid.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from characterize.analysis import compare as analyze
from characterize.analysis.claims import PAPER_CLAIMS
from characterize.analysis.model.e2e import INFERENCE_STAGES, TRAINING_STAGES, stage_gmae
from characterize.analysis.model.predict import precision_grid
from characterize.analysis.model.scores import gmae
from characterize.report.blocks import (
    POINT_COLS,
    PREDICTION_STAMP,
    Cell,
    DetailsBlock,
    Missing,
    NoteBlock,
    PanelOutput,
    TableBlock,
    _code,
    _col,
    _figure_block,
    _isnan,
    _order,
    _table,
    _txt,
    fmt_ci,
    fmt_num,
    fmt_pct,
    fmt_x,
)
from characterize.report.layout import (
    S_MODEL,
    Panel,
)
from characterize.report.plots import (
    e2e_stage_figure,
    order_datasets,
    precision_grid_figure,
    predicted_vs_measured_figure,
    prediction_figure,
)
from characterize.report.provenance import PROVENANCE
from characterize.report.sources import RunSource
from characterize.report.views import prediction_gpus
from characterize.units import format_bytes


def _predicted_headline(d: pd.DataFrame, gpu: str) -> TableBlock:
    """Technique x hotness -> predicted speedup over base, beside the paper's claims."""
    table = d.pivot_table(index="variant", columns="dataset", values="speedup_vs_base", aggfunc="mean")
    datasets = order_datasets(table.columns)
    rows = []
    for v in _order(pd.DataFrame({"variant": table.index}))["variant"]:
        vals = [table.loc[v, ds] for ds in datasets]
        best = max((x for x in vals if not _isnan(x)), default=np.nan)
        rows.append([Cell(v, "code")] + [Cell(fmt_x(x), "num") for x in vals] +
                    [Cell("–" if _isnan(best) else f"{100 * (best - 1):+.0f}%", "num"),
                     Cell(PAPER_CLAIMS[v].text if v in PAPER_CLAIMS else "", "claim")])
    return TableBlock(["variant"] + datasets + ["best over base", "paper (A100, embedding stage)"], rows,
                      caption=f"PREDICTED speedup over base{' on ' + gpu if gpu else ''} (model, not a measurement)")


def _p_e2e(s: RunSource) -> PanelOutput:
    e = s.run.e2e
    gpus = list(dict.fromkeys(e["gpu"].astype(str)))
    mine = s.gpu.get("key")
    gpus.sort(key=lambda g: (g != mine, g))
    datasets = order_datasets(e["dataset"].unique())
    ds = "medium" if "medium" in datasets else datasets[0]
    blocks: list[Any] = []
    for gpu in gpus[:2]:
        for phase, stages in (("inference", INFERENCE_STAGES), ("training", TRAINING_STAGES)):
            d = e[(e["gpu"].astype(str) == gpu) & (e["phase"] == phase) & (e["dataset"] == ds)]
            if d.empty:
                continue
            src = "measured" if (d["source"] == "measured").any() else "predicted"
            d = d[d["source"] == src]
            fig = e2e_stage_figure(d, stages, f"DLRM {phase} step per variant, {ds}, {gpu} ({src})")
            blocks.append(_figure_block(fig, f"{phase.capitalize()} step ({gpu})",
                                        f"time per batch split by stage ({src}; {ds}); a stage includes the idle "
                                        "time before its kernels", stamp=PREDICTION_STAMP if src == "predicted"
                                        else None))
    tot = e[(e["stage"] == "total") & (e["dataset"] == ds)]
    rows = []
    for r in _order(tot).to_dict("records"):
        rows.append([Cell(r["variant"], "code"), Cell(str(r["gpu"])), Cell(r["phase"]), Cell(r["source"]),
                     Cell(fmt_num(r["time_us"]), "num"),
                     Cell(f"{fmt_num(r.get('time_us_low'))}–{fmt_num(r.get('time_us_high'))}", "num"),
                     Cell(fmt_pct(100 * r["embedding_share"]) if not _isnan(r.get("embedding_share")) else "–", "num"),
                     Cell(fmt_x(r.get("speedup_e2e")), "num"), Cell(fmt_x(r.get("speedup_embedding")), "num")])
    blocks.append(TableBlock(["variant", "GPU", "phase", "source", "batch (µs)", "band (µs)", "embedding share",
                              "speedup end to end", "speedup embedding only"], rows,
                             caption=f"{ds}; the paper (A100): up to {PAPER_CLAIMS['end_to_end'].ratio:.2f}x end to "
                                     f"end, {PAPER_CLAIMS['combined'].ratio:.2f}x for the embedding stage"))
    errors = stage_gmae(e)
    if not errors.empty:
        blocks.append(_table(errors, [("phase", _col("phase", _txt, "")), ("stage", _col("stage", _txt, "")),
                                      ("points", _col("points")), ("GMAE", _col("gmae", lambda x: fmt_pct(100 * x)))],
                             caption="the model against the measured step, per stage (geometric-mean absolute error)"))
    return PanelOutput(blocks)


def _p_predictions(s: RunSource) -> PanelOutput:
    p = s.primary_predictions.copy()
    lacking = sorted({"variant", "dataset"} - set(p.columns))
    if lacking:
        raise Missing(f"predictions.csv lacks the column(s) {', '.join(lacking)}")
    blocks: list[Any] = [NoteBlock("Model predictions, not measurements.", "prediction")]
    if "mode" in p.columns:
        p = p[p["mode"].fillna("steady") == "steady"] if (p["mode"] == "steady").any() else p
    gpus = list(dict.fromkeys(p["gpu"].astype(str))) if "gpu" in p.columns else [""]
    mine = s.gpu.get("key")
    gpus.sort(key=lambda g: (g != mine, g))
    for gpu in gpus[:4]:
        d = _order(p[p["gpu"].astype(str) == gpu] if gpu else p)
        if "speedup_vs_base" in d.columns and d["speedup_vs_base"].notna().any():
            fig = prediction_figure(d, gpu, f"Predicted speedup over base{', ' + gpu if gpu else ''}")
            blocks.append(_figure_block(fig,
                                        f"Predicted speedup ({gpu})", f"{PROVENANCE['model'].label} (PREDICTION), "
                                        "steady mode (L2 warm)", stamp=PREDICTION_STAMP))
            blocks.append(_predicted_headline(d, gpu))
    spec = list(POINT_COLS)
    for col, head, f in (("gpu", "GPU", _txt), ("arch", "arch", _txt), ("time_us", "predicted time (µs)", fmt_num),
                         ("time_us_low", "band low (µs)", fmt_num), ("time_us_high", "band high (µs)", fmt_num),
                         ("speedup_vs_base", "predicted vs base", fmt_x),
                         ("l2_hit_rate_pct", "predicted L2 hit", fmt_pct),
                         ("dram_bytes", "predicted DRAM bytes", format_bytes),
                         ("l2_bytes", "predicted L2 bytes", format_bytes),
                         ("bound", "bound by", _txt), ("constants", "constants", _txt), ("note", "note", _txt)):
        if col in p.columns:
            spec.append((head, _col(col, f, "num" if f is not _txt else "")))
    blocks.append(DetailsBlock(f"Prediction table ({len(p)} rows)", [_table(_order(p), spec,
                                                                            caption="PREDICTED by the model; the band "
                                                                            "spans the latency and bandwidth constants "
                                                                            "over their published ranges")]))
    v = s.run.model_validation
    if not v.empty:
        vspec = [(c, _col(c, _txt)) for c in ("claim", "paper", "model", "agrees", "gpu", "constants") if c in v.columns]
        blocks.append(_table(v, vspec, caption="The model against the MICRO 2024 paper's A100 claims (paper "
                                               "configuration on sm_80; model PREDICTIONS vs published measurements)"))
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
    blocks: list[Any] = []
    for mode in s.modes:
        meas = analyze.speedups(s.bench_ok, mode, against=())
        pm = p[p["mode"] == mode] if "mode" in p.columns else (p if mode == "steady" else p.iloc[0:0])
        m = meas.merge(pm[["variant", "dataset", "time_us"]], on=["variant", "dataset"], how="inner")
        if m.empty:
            continue
        m = _order(m.rename(columns={"latency_us": "measured_us", "time_us": "predicted_us"}))
        m["error_pct"] = 100 * (m["predicted_us"] - m["measured_us"]) / m["measured_us"]
        blocks.append(_figure_block(predicted_vs_measured_figure(m, f"Predicted vs measured time, {mode}"),
                                    f"Predicted vs measured ({mode})",
                                    f"x: {PROVENANCE[s.timing_provenance].label} ({s.timing_mode(mode)}); "
                                    f"y: {PROVENANCE['model'].label} (PREDICTION)", stamp=PREDICTION_STAMP))
        gm = 100 * gmae(m["predicted_us"], m["measured_us"])
        spec = [*POINT_COLS,
                ("measured (µs)", lambda r: Cell(fmt_ci(r["measured_us"], r["latency_ci95_us"]), "num")),
                ("predicted (µs)", _col("predicted_us")), ("error", _col("error_pct", fmt_pct))]
        blocks.append(_table(m, spec, caption=f"{mode}: prediction against measurement",
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
                        ("measured L2 hit (ncu)", _col("l2_hit_rate_pct_measured", fmt_pct)),
                        ("predicted L2 hit (model)", _col("l2_hit_rate_pct_predicted", fmt_pct))]
                gm = 100 * gmae(m["l2_hit_rate_pct_predicted"], m["l2_hit_rate_pct_measured"])
                blocks.append(_table(_order(m), spec, caption="L2 hit rate: Nsight Compute with "
                                     "--cache-control none against the model's PREDICTION",
                                     note=f"geometric mean of |relative error| (GMAE): {gm:.1f}%"))
    if not blocks:
        raise Missing("no (variant, dataset) point has both a prediction and a measurement")
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
        blocks.append(_figure_block(precision_grid_figure(g, f"Predicted speedup over fp32 base, {gpu}"),
                                    f"Precision x variant ({gpu})", f"{PROVENANCE['model'].label} (PREDICTION), "
                                    "steady mode", stamp=PREDICTION_STAMP))
    spec = [("GPU", _code("gpu")), ("dtype", _code("dtype")), ("variant", _code("variant")),
            ("predicted speedup over fp32 base", _col("speedup_vs_fp32_base", fmt_x)),
            ("datasets", _col("datasets", fmt_num))]
    blocks.append(DetailsBlock(f"Precision grid ({len(grid)} rows)", [_table(grid, spec, caption="PREDICTED")]))
    return PanelOutput(blocks)


PANELS: tuple[Panel, ...] = (
    Panel("predictions", "Model predictions", S_MODEL, ("predictions",), ("model",),
          "predictions.csv written by the model step; predictions, not measurements", _p_predictions),
    Panel("e2e", "The whole DLRM step", S_MODEL, ("e2e",), ("model",),
          "e2e.csv: the DLRM step (bottom MLP, embedding stage, interaction, top MLP; training adds backward and "
          "optimizer) per variant, predicted per stage by analysis.model.e2e (measured on a GPU)", _p_e2e),
    Panel("predicted-vs-measured", "Predicted vs measured", S_MODEL, ("predictions", "bench"),
          lambda s: ("model", s.timing_provenance),
          "predictions for the run's GPU joined with the measured points (and ncu L2 hit rates collected with "
          "--cache-control none)", _p_predicted_vs_measured),
    Panel("precision", "Precision x variant: predicted speedup over fp32 base", S_MODEL, ("predictions",), ("model",),
          "predictions.csv rows of every precision the experiment lists (dtypes), base at fp32 as the reference "
          "(analysis.model.predict.precision_grid)", _p_precision),
)
