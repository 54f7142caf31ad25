"""Analysis stage, the answer: per dataset (and GPU), which variant to use, by how much,
what limits it, what it does to the whole DLRM step, and how sure the number is.

One function, `answer`, computes it from whatever a run holds: measured timings when
there are GPU timings, the model's predictions otherwise (each row says which). The
summaries `characterize run` and `characterize predict` print, the report's first box
and the notebook all show its rows, so they cannot disagree.

    import characterize as chz
    a = chz.answer_run(chz.load_run("profiles/static-paper"))
    a.rows            # the tidy frame (columns below)
    print("\\n".join(a.lines()))

Speedups are taken from the rows present, never assumed: the speedup over `torch` is
torch's own row (predicted from its own code, or measured) over the best variant's,
and the speedup over `fbgemm` is shown only where such a row exists.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from characterize.analysis.claims import measured_claims
from characterize.analysis.compare import speedups
from characterize.analysis.model.predict import primary_predictions
from characterize.analysis.model.validation_error import model_error
from characterize.analysis.ncu import kernel_summary
from characterize.errors import ConfigError
from characterize.hardware.specs import gpu_spec
from characterize.kernels.registry import HOST_VARIANTS, VARIANT_ORDER, get_variant
from characterize.workloads.presets import HOTNESS_ORDER

#: the references a best variant's speedup is stated against, when their rows exist
REFERENCES = ("torch", "base", "fbgemm")
#: variants never proposed as the answer (test-only)
NEVER_BEST = ("wrong",)

#: columns of Answer.rows, documented as every public frame is
COLUMNS: dict[str, str] = {
    "gpu": "GPU (hardware.specs key) the row is about",
    "dataset": "hotness preset or trace file",
    "dtype": "table element type",
    "source": "measured (CUDA events on a GPU), ncu (a profiled run's kernel durations) or predicted (the model)",
    "best": "the fastest variant on this dataset and GPU",
    "time_us": "its time per table (us): measured mean or predicted (a launch covering every table: its time / T)",
    "time_us_low": "fast end of its band (us): 95% CI when measured, the model's band when predicted",
    "time_us_high": "slow end of its band (us)",
    **{f"speedup_vs_{r}{end}": f"{r}'s time over the best's{what} (x; NaN without a {r} row)"
       for r in REFERENCES for end, what in (("", ""), ("_low", ", low end of the band"),
                                             ("_high", ", high end of the band"))},
    "batch_us": "its time per batch of every table (us): time_us x T",
    "bound": "what limits the best variant: latency, dram, l2, l1, issue (model), or host link",
    "bound_why": "the bound in numbers: ncu's share of peak (and of the device's copy bandwidth for DRAM) or "
                 "the top stall reason; the model's term otherwise",
    "bound_source": "where the bound comes from: model (predictions.csv) or ncu (the profile)",
    "close": "other variants the bands cannot tell from the best (the speedup's band reaches 1x; for measured "
             "times the confidence intervals overlap)",
    "e2e_speedup": "base's DLRM inference step over the best variant's (x; e2e.csv; NaN without it)",
    "embedding_share": "the embedding stage's share of the best variant's inference step (fraction)",
}


@dataclass(frozen=True)
class ModelValidation:
    """How far the model is from measurements it was not fitted to: `n` measured points
    (from `source`), the geometric-mean absolute error `gmae` and mean absolute
    percentage error `mape` (fractions: 0.1 = 10%) and the share of measurements inside
    the predicted band `coverage` (fraction)."""

    n: int
    gmae: float
    mape: float
    coverage: float
    source: str = "public measurements"
    #: the same on our own measured runs (n, gmae, coverage as model_error.json's `here`), if any
    here: tuple[int, float, float] | None = None

    def sentence(self) -> str:
        text = (f"the model's GMAE is {100 * self.gmae:.0f}% on {self.n} {self.source}, "
                f"{100 * self.coverage:.0f}% of them inside its band")
        if self.here:
            n, gmae, coverage = self.here
            text += (f", and {100 * gmae:.0f}% on {n} points of our own GPU runs (held out dataset by dataset), "
                     f"{100 * coverage:.0f}% inside their regime's band")
        return text


NOT_VALIDATED = "the model is not yet validated against measurements"


@dataclass(frozen=True)
class Answer:
    """The answer per dataset and GPU: `rows` (columns: COLUMNS), how sure the model is
    (`validation`, None until it is known), and how many of the paper's published
    claims the model reproduces (`claims`: (agree, of), None when not checked)."""

    rows: pd.DataFrame
    validation: ModelValidation | None = None
    claims: tuple[int, int] | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: the paper's claims on the measured GPU (analysis.claims.measured_claims), empty without timings
    measured_claims: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def empty(self) -> bool:
        return self.rows.empty

    @property
    def sources(self) -> list[str]:
        return list(dict.fromkeys(self.rows["source"])) if not self.rows.empty else []

    def how(self) -> str:
        """One sentence: how the numbers were obtained and how sure they are."""
        parts = []
        if "measured" in self.sources:
            parts.append("MEASURED with CUDA events on the GPU (band: 95% confidence interval)")
        if "ncu" in self.sources:
            parts.append("MEASURED by Nsight Compute's kernel durations (the run was profiled, not benched: one "
                         "launch under the profiler, no confidence interval)")
        if "predicted" in self.sources:
            text = "PREDICTED by the model, not measured (band: what the model's constants allow)"
            text += "; " + (self.validation.sentence() if self.validation else NOT_VALIDATED)
            if self.claims:
                text += f"; it reproduces {self.claims[0]} of the paper's {self.claims[1]} published claims"
            parts.append(text)
        return ". ".join(parts) + "." if parts else "nothing measured or predicted yet."

    def references(self) -> list[str]:
        """The references with at least one speedup to show, in REFERENCES order."""
        return [r for r in REFERENCES if f"speedup_vs_{r}" in self.rows.columns
                and self.rows[f"speedup_vs_{r}"].notna().any()]

    def display_rows(self) -> list[dict[str, str]]:
        """The rows as text cells (GPU, dataset, best, vs <reference> with its band,
        bound, end to end, source): what the terminal, the report and the notebook show."""
        out = []
        refs = self.references()
        e2e = "e2e_speedup" in self.rows.columns and self.rows["e2e_speedup"].notna().any()
        for r in self.rows.to_dict("records"):
            row = {"GPU": str(r["gpu"]), "dataset": str(r["dataset"]), "best": str(r["best"]),
                   "us/table": _us(r.get("time_us")), "us/batch": _us(r.get("batch_us"))}
            for ref in refs:
                row[f"vs {ref}"] = _speedup(r, ref)
            bound = "" if _nan_or_empty(r.get("bound")) else str(r["bound"])
            why = "" if _nan_or_empty(r.get("bound_why")) else str(r["bound_why"])
            row["bound"] = (why or bound or "–") + (" (model)" if bound and r.get("bound_source") == "model"
                                                    and r["source"] == "measured" else "")
            if e2e:
                row["end to end"] = band_text(r.get("e2e_speedup"))
            row["tied within the band"] = str(r.get("close") or "–")
            if len(self.sources) > 1:
                row["source"] = str(r["source"])
            out.append(row)
        return out

    def summary(self) -> str:
        """One sentence: the best variant per GPU and the datasets it wins."""
        if self.rows.empty:
            return "No answer yet: nothing was measured or predicted."
        parts = []
        for gpu, g in self.rows.groupby("gpu", sort=False):
            wins = {}
            for r in g.to_dict("records"):
                wins.setdefault(r["best"], []).append(str(r["dataset"]))
            picks = [f"{v} ({', '.join(ds)})" if len(wins) > 1 else f"{v} on every dataset" for v, ds in wins.items()]
            parts.append(f"{gpu}: use " + " or ".join(picks) + ".")
        return " ".join(parts)

    def lines(self) -> list[str]:
        """A plain-text summary: one sentence per GPU naming what to use, then how sure."""
        if self.rows.empty:
            return ["no answer yet: nothing was measured or predicted"]
        out = []
        for gpu, g in self.rows.groupby("gpu", sort=False):
            picks = []
            for r in g.to_dict("records"):
                vs = ", ".join(f"{_speedup(r, ref)} over {ref}" for ref in self.references()
                               if not _nan(r.get(f"speedup_vs_{ref}")))
                picks.append(f"{r['dataset']}: {r['best']}" + (f" ({vs})" if vs else ""))
            out.append(f"{gpu}: " + "; ".join(picks))
        out.append(self.how())
        out += self.claim_lines()
        out += list(self.notes)
        return out

    def claim_lines(self) -> list[str]:
        """The paper's claims on the measured GPU, one sentence each: reproduced or not."""
        out = []
        for r in self.measured_claims.to_dict("records"):
            verdict = "reproduced" if r["reproduced"] else "not reproduced"
            out.append(f"paper's claim on {r['gpu']}, {r['claim']}: {r['paper']} on an A100, measured {r['measured']}: "
                       f"{verdict}")
        return out


def _us(x: Any) -> str:
    return "–" if _nan(x) else f"{float(x):,.1f}"


def _speedup(row: dict, ref: str) -> str:
    return band_text(row.get(f"speedup_vs_{ref}"), row.get(f"speedup_vs_{ref}_low"), row.get(f"speedup_vs_{ref}_high"))


def band_text(x: Any, low: Any = None, high: Any = None) -> str:
    """'2.60x [2.05-3.14]' (the band when it is a band), '–' for nothing: never 'nan'."""
    if _nan(x):
        return "–"
    text = f"{float(x):.2f}x"
    if not _nan(low) and not _nan(high) and (round(float(low), 2), round(float(high), 2)) != (round(float(x), 2),) * 2:
        text += f" [{float(low):.2f}-{float(high):.2f}]"
    return text


def _nan_or_empty(x: Any) -> bool:
    return x is None or (isinstance(x, str) and not x) or (not isinstance(x, str) and _nan(x))


def _nan(x: Any) -> bool:
    try:
        return x is None or x is pd.NA or math.isnan(float(x))
    except (TypeError, ValueError):
        return True


# ------------------------------------------------------------------ predicted
def per_table(pred: pd.DataFrame) -> pd.DataFrame:
    """Predictions with a launch covering every table (tbe, fbgemm) restated per table it
    covers (time, band / tables_per_launch, which becomes 1): how variants that launch
    once per table and once per batch compare. Idempotent."""
    if "tables_per_launch" not in pred.columns:
        return pred
    per = pd.to_numeric(pred["tables_per_launch"], errors="coerce").fillna(1).clip(lower=1)
    if (per == 1).all():
        return pred
    return pred.assign(**{c: pred[c] / per for c in ("time_us", "time_us_low", "time_us_high") if c in pred.columns},
                       tables_per_launch=1)


def predicted_speedups(pred: pd.DataFrame, reference: str = "base") -> pd.DataFrame:
    """`pred` with speedup, speedup_low and speedup_high over `reference` per (gpu, mode,
    dataset, dtype): the reference's time over each row's, both taken at the same end of
    the band (the constants move both), the band spanning the speedups at the low end,
    the middle and the high end. NaN where the reference has no row."""
    pred = per_table(pred)
    keys = [c for c in ("gpu", "mode", "dataset", "dtype") if c in pred.columns]
    out = pred.copy()
    ref = pred[pred["variant"] == reference] if "variant" in pred.columns else pred.iloc[0:0]
    if ref.empty or "time_us" not in pred.columns:
        out["speedup"] = out["speedup_low"] = out["speedup_high"] = np.nan
        return out
    cols = [c for c in ("time_us", "time_us_low", "time_us_high") if c in pred.columns]
    ref = ref.drop_duplicates(keys)[keys + cols].rename(columns={c: f"{c}_ref" for c in cols})
    m = out.merge(ref, on=keys, how="left")
    m["speedup"] = m["time_us_ref"] / m["time_us"]
    if {"time_us_low", "time_us_high"} <= set(pred.columns):
        ends = pd.concat([m["time_us_low_ref"] / m["time_us_low"], m["speedup"],
                          m["time_us_high_ref"] / m["time_us_high"]], axis=1)
        m["speedup_low"], m["speedup_high"] = ends.min(axis=1, skipna=False), ends.max(axis=1, skipna=False)
    else:
        m["speedup_low"] = m["speedup_high"] = np.nan
    return m.drop(columns=[f"{c}_ref" for c in cols])


def _candidates(d: pd.DataFrame) -> pd.DataFrame:
    """The variants that may be the answer: GPU-resident ones when there are any (a
    host-resident row's speedup is a share of the all-GPU speed), never test-only ones."""
    d = d[~d["variant"].isin(NEVER_BEST)]
    resident = d[~d["variant"].isin(HOST_VARIANTS)]
    return resident if not resident.empty else d


def _pick(d: pd.DataFrame) -> pd.Series:
    """The fastest row; ties go to the narrower band, then to family order."""
    rank = {v: i for i, v in enumerate(VARIANT_ORDER)}
    d = d.assign(_hi=d["time_us_high"] if "time_us_high" in d.columns else d["time_us"],
                 _fam=d["variant"].map(lambda v: rank.get(v, len(rank))))
    return d.sort_values(["time_us", "_hi", "_fam"], kind="stable").iloc[0]


def _close(d: pd.DataFrame, best: pd.Series, independent: bool = False) -> str:
    """Other variants the bands cannot tell from the best. Predicted times move together
    with the model's constants, so they are compared at the same end (the speedup's own
    band, the one the answer prints, reaches 1x); measured times carry independent
    confidence intervals, which then overlap."""
    others = d[d["variant"] != best["variant"]]
    if others.empty:
        return ""
    t = others["time_us"].astype(float)
    lo = others["time_us_low"].astype(float) if "time_us_low" in others.columns else t
    hi = others["time_us_high"].astype(float) if "time_us_high" in others.columns else t
    lo, hi = lo.fillna(t), hi.fillna(t)
    b, b_lo, b_hi = float(best["time_us"]), best.get("time_us_low"), best.get("time_us_high")
    b_lo = b if _nan(b_lo) else float(b_lo)
    b_hi = b if _nan(b_hi) else float(b_hi)
    if independent:
        near = lo <= b_hi + 1e-9
    else:
        near = pd.concat([lo / b_lo, t / b, hi / b_hi], axis=1).min(axis=1) <= 1.0 + 1e-9
    return ", ".join(others[near].sort_values("time_us")["variant"].astype(str))


def _predicted_rows(pred: pd.DataFrame, gpus: Sequence[str] | None) -> list[dict[str, Any]]:
    p = pred
    if "mode" in p.columns and (p["mode"] == "steady").any():
        p = p[p["mode"] == "steady"]
    p = per_table(p)
    if p.empty or not {"variant", "dataset", "time_us"} <= set(p.columns):
        return []
    if "gpu" not in p.columns:
        p = p.assign(gpu="")
    per_ref = {r: predicted_speedups(p, r).set_index(["gpu", "dataset", "variant"]) for r in REFERENCES}
    rows = []
    for (gpu, ds), d in p.groupby(["gpu", "dataset"], sort=False):
        if gpus is not None and gpu not in gpus:
            continue
        cand = _candidates(d)
        if cand.empty:
            continue
        b = _pick(cand)
        row = {"gpu": gpu, "dataset": ds, "dtype": b.get("dtype", ""), "source": "predicted", "best": b["variant"],
               "time_us": b["time_us"], "time_us_low": b.get("time_us_low", np.nan),
               "time_us_high": b.get("time_us_high", np.nan), "bound": b.get("bound", ""),
               "bound_source": "model", "close": _close(cand, b)}
        for ref, s in per_ref.items():
            key = (gpu, ds, b["variant"])
            got = s.loc[key] if key in s.index else None
            if isinstance(got, pd.DataFrame):
                got = got.iloc[0]
            for end in ("", "_low", "_high"):
                row[f"speedup_vs_{ref}{end}"] = float(got[f"speedup{end}"]) if got is not None else np.nan
        rows.append(row)
    return rows


# ------------------------------------------------------------------- measured
def ncu_bounds(summary: pd.DataFrame, copy_fraction: float | None = None) -> dict[tuple[str, str], tuple[str, str]]:
    """(variant, dataset) -> (bound, why in numbers) of the profiled lookup kernels
    (analysis.ncu.kernel_summary rows; the L2 pre-pass left out): DRAM or L2 with its share of
    peak (DRAM also of the device's copy bandwidth, `copy_fraction` of peak), issue with the
    SMs' share, or latency with the stall reason that holds the warps most."""
    if summary.empty or not {"variant", "dataset", "bound"} <= set(summary.columns):
        return {}
    k = summary
    name = next((c for c in ("function", "kernel_name") if c in k.columns), None)
    if name:
        k = k[~k[name].fillna("").astype(str).str.contains("l2_pin")]
    stalls = [c for c in k.columns if c.startswith("stall_") and c != "stall_selected"]
    out = {}
    for (v, d), g in k.groupby(["variant", "dataset"]):
        m = g.mean(numeric_only=True)
        bound = str(g["bound"].mode().iloc[0])
        dram, l2, sm = (float(m.get(c, np.nan)) for c in ("dram_throughput_pct", "l2_throughput_pct",
                                                            "sm_throughput_pct"))
        if bound.startswith("memory"):
            dram_text = "" if _nan(dram) else f"DRAM {dram:.0f}% of peak" + (
                f" ({dram / copy_fraction:.0f}% of the copy bandwidth)" if copy_fraction else "")
            l2_text = "" if _nan(l2) else f"L2 {l2:.0f}%"
            if "DRAM" in bound or (not _nan(dram) and (_nan(l2) or dram >= l2)):
                out[(str(v), str(d))] = ("dram", ", ".join(t for t in (dram_text, l2_text and l2_text + " of peak")
                                                           if t))
            else:
                out[(str(v), str(d))] = ("l2", ", ".join(t for t in (l2_text and l2_text + " of peak", dram_text)
                                                         if t))
        elif bound.startswith("compute"):
            out[(str(v), str(d))] = ("issue", f"SMs {sm:.0f}% of peak")
        elif stalls:
            shares = m[stalls].astype(float)
            total = float(shares.sum())
            top = shares.idxmax() if total > 0 else None
            why = (f"latency: {top.removeprefix('stall_').replace('_', ' ')} {100 * shares[top] / total:.0f}% of "
                   "stalls") if top else "latency"
            out[(str(v), str(d))] = ("latency", why)
    return out


def _measured_rows(bench: pd.DataFrame, gpu: str, pred: pd.DataFrame,
                   profiled: dict[tuple[str, str], tuple[str, str]] | None = None) -> list[dict[str, Any]]:
    s = speedups(bench, "steady", against=REFERENCES)
    if s.empty:
        return []
    bounds = {}
    if not pred.empty and {"variant", "dataset", "bound"} <= set(pred.columns):
        pg = pred[pred["gpu"] == gpu] if "gpu" in pred.columns else pred
        if "mode" in pg.columns:
            pg = pg[pg["mode"] == "steady"]
        bounds = {(v, d): b for v, d, b in zip(pg["variant"], pg["dataset"], pg["bound"])}
    profiled = profiled or {}
    rows = []
    for ds, d in s.groupby("dataset", sort=False):
        d = d.assign(time_us=d["latency_us"], time_us_low=d["latency_us"] - d["latency_ci95_us"],
                     time_us_high=d["latency_us"] + d["latency_ci95_us"])
        cand = _candidates(d)
        if cand.empty:
            continue
        b = _pick(cand)
        row = {"gpu": gpu, "dataset": ds, "dtype": "", "source": "measured", "best": b["variant"],
               "time_us": b["time_us"], "time_us_low": b["time_us_low"], "time_us_high": b["time_us_high"],
               "bound": bounds.get((b["variant"], ds), ""), "bound_why": "",
               "bound_source": "model" if bounds else "", "close": _close(cand, b, independent=True)}
        if (b["variant"], ds) in profiled:
            row["bound"], row["bound_why"] = profiled[(b["variant"], ds)]
            row["bound_source"] = "ncu"
        for ref in REFERENCES:
            x, ci = b.get(f"speedup_vs_{ref}", np.nan), b.get(f"speedup_vs_{ref}_ci95", np.nan)
            row[f"speedup_vs_{ref}"] = x
            row[f"speedup_vs_{ref}_low"] = x - ci if not _nan(ci) else np.nan
            row[f"speedup_vs_{ref}_high"] = x + ci if not _nan(ci) else np.nan
        rows.append(row)
    return rows


def ncu_times(summary: pd.DataFrame, tables: int | None) -> pd.DataFrame:
    """Per (variant, dataset) the lookup kernel's ncu duration per table (us; the L2 pre-pass
    left out, as bench times it apart; a batched launch's duration / `tables`): what a run
    that was profiled but not benched answers from. Columns: variant, dataset, time_us."""
    if summary.empty or not {"variant", "dataset", "duration_ns"} <= set(summary.columns):
        return pd.DataFrame(columns=["variant", "dataset", "time_us"])
    k = summary
    name = next((c for c in ("function", "kernel_name") if c in k.columns), None)
    if name:
        k = k[~k[name].fillna("").astype(str).str.contains("l2_pin")]
    t = k.groupby(["variant", "dataset"])["duration_ns"].mean().reset_index()

    def per_table(v: str) -> int:
        try:
            return int(tables or 1) if get_variant(v).batched else 1
        except ConfigError:   # a kernel of one's own no longer registered: one table per launch
            return 1

    t["time_us"] = t["duration_ns"] / 1e3 / t["variant"].map(per_table)
    return t[["variant", "dataset", "time_us"]]


def _ncu_rows(times: pd.DataFrame, gpu: str, profiled: dict[tuple[str, str], tuple[str, str]]
              ) -> list[dict[str, Any]]:
    """Answer rows from ncu's durations (a profile-only run): the fastest variant per dataset,
    its speedups from the references' own durations, its bound from the same profile."""
    rows = []
    for ds, d in times.groupby("dataset", sort=False):
        d = d.assign(time_us_low=d["time_us"], time_us_high=d["time_us"])
        cand = _candidates(d)
        if cand.empty:
            continue
        b = _pick(cand)
        bound, why = profiled.get((b["variant"], ds), ("", ""))
        row = {"gpu": gpu, "dataset": ds, "dtype": "", "source": "ncu", "best": b["variant"], "time_us": b["time_us"],
               "time_us_low": np.nan, "time_us_high": np.nan, "bound": bound, "bound_why": why,
               "bound_source": "ncu" if bound else "", "close": ""}
        ref_t = dict(zip(d["variant"], d["time_us"]))
        for ref in REFERENCES:
            x = ref_t[ref] / b["time_us"] if ref in ref_t and b["time_us"] > 0 else np.nan
            row[f"speedup_vs_{ref}"], row[f"speedup_vs_{ref}_low"], row[f"speedup_vs_{ref}_high"] = x, np.nan, np.nan
        rows.append(row)
    return rows


# --------------------------------------------------------------------- answer
def _with_e2e(rows: pd.DataFrame, e2e: pd.DataFrame | None) -> pd.DataFrame:
    rows = rows.assign(e2e_speedup=np.nan, embedding_share=np.nan)
    if e2e is None or e2e.empty or not {"variant", "dataset", "stage", "phase", "speedup_e2e"} <= set(e2e.columns):
        return rows
    tot = e2e[(e2e["stage"] == "total") & (e2e["phase"] == "inference")]
    for i, r in rows.iterrows():
        m = tot[(tot["variant"] == r["best"]) & (tot["dataset"] == r["dataset"])]
        if "gpu" in m.columns:
            m = m[m["gpu"].astype(str) == str(r["gpu"])]
        if "source" in m.columns and len(m):
            same = m[m["source"] == r["source"]]
            m = same if len(same) else m[m["source"] == "predicted"]
        if len(m):
            rows.at[i, "e2e_speedup"] = float(m["speedup_e2e"].iloc[0])
            rows.at[i, "embedding_share"] = float(m["embedding_share"].iloc[0]) if "embedding_share" in m else np.nan
    return rows


def _ordered(rows: pd.DataFrame, gpus: Sequence[str]) -> pd.DataFrame:
    order = {d: i for i, d in enumerate(HOTNESS_ORDER)}
    g_order = {g: i for i, g in enumerate(gpus)}
    return rows.assign(_g=rows["gpu"].map(lambda g: g_order.get(g, len(g_order))),
                       _d=rows["dataset"].map(lambda d: order.get(d, len(order)))) \
        .sort_values(["_g", "_d"], kind="stable").drop(columns=["_g", "_d"]).reset_index(drop=True)


def answer(predictions: pd.DataFrame | None = None, bench: pd.DataFrame | None = None,
           e2e: pd.DataFrame | None = None, *, gpu: str | None = None, dtype: str | None = None,
           validation: ModelValidation | None = None, model_validation: pd.DataFrame | None = None,
           gpus: Iterable[str] | None = None, tables: int | None = None,
           profiled: dict[tuple[str, str], tuple[str, str]] | None = None,
           durations: pd.DataFrame | None = None) -> Answer:
    """The best variant per dataset and GPU, with its speedups and bands (see COLUMNS).

    predictions: predictions.csv rows (the workload's precision `dtype` is kept, or the
    first one predicted); bench: a run's timings (store.Run.bench) measured on `gpu`,
    which then answer for that GPU instead of the prediction; e2e: e2e.csv rows, for
    the end-to-end effect; validation: the model's error on measurements it was not
    fitted to (None: said to be not yet validated); model_validation: the model against
    the paper's claims (model_validation.csv), counted in the answer's `claims`; gpus:
    which GPUs to answer for, in this order (default: all, the measured one first); tables:
    T, for the time per batch; profiled: the bound of each profiled (variant, dataset) from
    ncu (ncu_bounds), which a measured row states instead of the model's; durations: ncu's
    per-table durations (ncu_times), which answer for `gpu` when there are no timings (a run
    profiled but not benched; source "ncu")."""
    pred = primary_predictions(predictions, dtype) if predictions is not None and not predictions.empty \
        else pd.DataFrame()
    rows: list[dict[str, Any]] = []
    measured_gpu = None
    if bench is not None and not bench.empty and "status" in bench.columns and gpu:
        rows += _measured_rows(bench[bench["status"] == "ok"], gpu, pred, profiled)
        measured_gpu = gpu if rows else None
    if not rows and durations is not None and not durations.empty and gpu:
        rows += _ncu_rows(durations, gpu, profiled or {})
        measured_gpu = gpu if rows else None
    wanted = list(gpus) if gpus is not None else None
    predicted = _predicted_rows(pred, wanted)
    rows += [r for r in predicted if r["gpu"] != measured_gpu]
    columns = ["gpu", "dataset", "dtype", "source", "best", "time_us", "time_us_low", "time_us_high", "batch_us",
               *[f"speedup_vs_{r}{e}" for r in REFERENCES for e in ("", "_low", "_high")], "bound", "bound_why",
               "bound_source", "close"]
    frame = pd.DataFrame(rows, columns=columns)
    frame["batch_us"] = frame["time_us"] * tables if tables else np.nan
    if not frame.empty:
        frame["dtype"] = frame["dtype"].replace("", pred["dtype"].iloc[0] if "dtype" in pred.columns and len(pred)
                                                else "")
    frame = _with_e2e(frame, e2e)
    order = wanted or list(dict.fromkeys(([measured_gpu] if measured_gpu else []) +
                                         (list(pred["gpu"].astype(str)) if "gpu" in pred.columns else [])))
    frame = _ordered(frame, order) if not frame.empty else frame
    claims = None
    if model_validation is not None and not model_validation.empty and "agrees" in model_validation.columns:
        agrees = model_validation["agrees"].astype(str).str.lower().isin(("true", "1", "yes"))
        claims = (int(agrees.sum()), len(agrees))
    notes = []
    if not frame.empty and (frame["source"] == "predicted").any() and "note" in pred.columns:
        refs = pred[pred["variant"].isin([r for r in REFERENCES if r != "base"])]
        for v, n in dict.fromkeys(zip(refs["variant"], refs["note"].astype(object).fillna(""))):
            if n:
                notes.append(f"{v}: {n}")
    measured = measured_claims(bench, measured_gpu) if measured_gpu and bench is not None else pd.DataFrame()
    return Answer(frame, validation or stored_validation(), claims, tuple(notes), measured)


def stored_validation() -> ModelValidation | None:
    """The model's error on the public corpus as `characterize validate --write` stored it
    (analysis/model/model_error.json): what every predicted answer says about itself."""
    err = model_error()
    if err is None:
        return None
    here = err.here or {}
    ours = (int(here["n"]), float(here["gmae"]), float(here["coverage"])) \
        if {"n", "gmae", "coverage"} <= set(here) and here["n"] else None
    return ModelValidation(err.n, err.gmae, err.mape, err.coverage,
                           f"public measurements from {err.sources} sources (held out source by source)", ours)


def answer_run(run: Any, validation: ModelValidation | None = None) -> Answer:
    """`answer` over a stored run (store.Run): its GPU timings when it has some (CPU
    emulation timings are not GPU performance and never answer), else its predictions."""
    meta = run.meta or {}
    gpu = (meta.get("gpu") or {}).get("key")
    emulated = meta.get("backend") == "emulate" or any(p.get("backend") == "emulate" for p in run.points("bench"))
    dtype = ((meta.get("experiment") or {}).get("workload") or {}).get("dtype")
    bench = None if emulated else run.bench
    workload = (meta.get("experiment") or {}).get("workload") or {}
    profiled = {}
    if not emulated and gpu and run.points("profile"):
        try:
            copy = gpu_spec(gpu).hbm_efficiency
        except ConfigError:   # a GPU the spec table lacks: no copy ceiling to state
            copy = None
        summary = kernel_summary(run.metrics)
        profiled = ncu_bounds(summary, copy)
        durations = ncu_times(summary, workload.get("T"))
    else:
        durations = None
    return answer(run.predictions, bench, run.e2e, gpu=gpu, dtype=dtype, validation=validation,
                  model_validation=run.model_validation, tables=workload.get("T"), profiled=profiled,
                  durations=durations)
