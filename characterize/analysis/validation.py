"""Analysis stage, validation: the model against public measurements it was not fitted to.

Why: a performance model is only as good as its error on data it has not seen. The
corpus (analysis/model/measurements.csv, its sources in docs/measurements.md) holds measured
embedding-kernel times from pull requests, benchmark result files and a paper
artifact, one row per measurement with its provenance; rows the model cannot express
stay in the file with the reason (`why_not`). `characterize validate` predicts every
expressible row and scores it here: per-row errors, MAPE and GMAE per source and
overall, and how many measurements fall inside their band. Constants fitted on the
corpus are scored by leave-one-source-out cross-validation only: each source is
predicted with constants fitted on the others, so no figure here is in-sample.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from characterize.analysis.calibrate import least_squares
from characterize.analysis.model.constants import BAND, BOUNDS, ModelConstants
from characterize.analysis.model.equations import _evaluate
from characterize.analysis.model.scores import coverage, gmae, mape
from characterize.analysis.model.validation_error import ModelError
from characterize.config import Pooling, WorkloadConfig
from characterize.errors import ConfigError

MEASUREMENTS = Path(__file__).resolve().parent / "model" / "measurements.csv"
#: per-row results of the last `characterize validate --write`, beside model_error.json
VALIDATION_CSV = Path(__file__).resolve().parent / "model" / "validation.csv"
#: the constants cross-validation refits on the other sources, as one multiplier each over
#: every GPU's value, kept inside the constant's published range (BAND)
CV_CONSTANTS = ("dram_latency_ns", "l2_latency_ns", "hbm_efficiency", "write_efficiency", "launch_overhead_us")
#: the band covers this central share of the cross-validated ratios measured / predicted
BAND_SHARE = 0.8


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One expressible row of the corpus, as the model takes it."""

    id: str
    source: str
    gpu: str
    variant: str
    workload: WorkloadConfig
    dataset: str
    mode: str
    params: dict
    set_aside: bool
    measured_us: float
    assumptions: str
    proxy: bool = False


def load_measurements(path: Path = MEASUREMENTS) -> pd.DataFrame:
    """The whole corpus as stored (every column; `expressible` yes or no)."""
    if not path.is_file():
        raise ConfigError(f"{path}: the corpus of public measurements is missing")
    return pd.read_csv(path, dtype=str, keep_default_na=False)


def _params(text: str) -> dict:
    out: dict = {}
    for item in filter(None, (t.strip() for t in text.split(";"))):
        k, _, v = item.partition("=")
        out[k.strip()] = int(v)
    return out


def expressible(df: pd.DataFrame, kinds: Sequence[str] = ("yes", "proxy")) -> list[Measurement]:
    """The rows the model can express, as Measurements (batches=2: one warm-up, one
    scored): `yes`, a kernel whose own code the model reads; `proxy`, a kernel whose code
    no one can read (a paper's patched build) stood in for by our implementation of the
    same design: scored apart, never in the model's figure."""
    out = []
    for r in df[df["expressible"].isin(list(kinds))].itertuples():
        wl = WorkloadConfig(T=int(r.T), E=int(r.E), D=int(r.D), B=int(r.B), L=Pooling.parse(r.L), dtype=r.dtype,
                            mode="mean" if r.pooling == "mean" else "sum", batches=2)
        params = {r.variant: _params(r.params)} if r.params else {}
        out.append(Measurement(r.id, r.source, r.gpu_key, r.variant, wl, r.dataset, r.mode, params,
                               r.set_aside.lower() != "false", float(r.measured_us), r.assumptions,
                               r.expressible == "proxy"))
    return out


def summarize(scored: pd.DataFrame, low: str = "time_us_low", high: str = "time_us_high") -> pd.DataFrame:
    """Per source and overall: rows, MAPE, GMAE (fractions) and the share inside the band.
    `scored` has source, predicted_us, measured_us and the band columns."""
    rows = []
    for source, g in [*scored.groupby("source"), ("all", scored)]:
        rows.append({"source": source, "n": len(g), "gpus": ", ".join(sorted(set(g["gpu"]))),
                     "mape": mape(g["predicted_us"], g["measured_us"]), "gmae": gmae(g["predicted_us"], g["measured_us"]),
                     "inside_band": coverage(g[low], g[high], g["measured_us"])})
    return pd.DataFrame(rows)


def _apply(base: Mapping[str, ModelConstants], scale: Sequence[float]) -> dict[str, ModelConstants]:
    """Every GPU's constants with the CV_CONSTANTS multiplied by `scale`, clamped to BOUNDS."""
    out = {}
    for key, c in base.items():
        changes = {}
        for name, m in zip(CV_CONSTANTS, scale):
            lo, hi = BOUNDS[name]
            changes[name] = min(max(getattr(c, name) * m, lo), hi)
        out[key] = c.replace(**changes)
    return out


def fit_scale(predict_rows: Callable[[Mapping[str, ModelConstants]], np.ndarray], measured: np.ndarray,
              base: Mapping[str, ModelConstants]) -> np.ndarray:
    """Multipliers of CV_CONSTANTS minimizing the squared log error of `predict_rows`,
    each kept inside its constant's published range (BAND)."""
    lo = np.array([BAND.get(n, (0.8, 1.25))[0] for n in CV_CONSTANTS])
    hi = np.array([BAND.get(n, (0.8, 1.25))[1] for n in CV_CONSTANTS])

    def scale(z: np.ndarray) -> np.ndarray:   # any real z maps inside the band; z = 0 near 1
        return lo + (hi - lo) / (1 + np.exp(-z))

    z0 = -np.log((hi - lo) / (1.0 - lo) - 1)   # scale(z0) == 1

    def residuals(z: np.ndarray) -> np.ndarray:
        pred = predict_rows(_apply(base, scale(z)))
        r = np.log(np.where(pred > 0, pred, 1e-9) / measured)
        return np.concatenate([r, 0.05 * (z - z0)])   # a weak pull to the published values

    return scale(least_squares(residuals, z0.copy()))


def cross_validate(sources: Sequence[str], predict_rows: Callable[[Mapping[str, ModelConstants], Sequence[int]],
                                                                   np.ndarray],
                   measured: np.ndarray, base: Mapping[str, ModelConstants]) -> tuple[np.ndarray, dict[str, list]]:
    """Leave-one-source-out: each source's rows predicted with CV_CONSTANTS refitted on
    the other sources' rows. Returns the held-out predictions and each fold's multipliers."""
    src = np.asarray(sources)
    held = np.full(len(src), np.nan)
    fits: dict[str, list] = {}
    for s in dict.fromkeys(sources):
        train = np.flatnonzero(src != s)
        test = np.flatnonzero(src == s)
        if len(train) == 0:
            held[test] = predict_rows(base, test)
            continue
        x = fit_scale(lambda c: predict_rows(c, train), measured[train], base)
        fits[s] = [round(float(v), 4) for v in x]
        held[test] = predict_rows(_apply(base, x), test)
    return held, fits


def band_from_residuals(ratios: np.ndarray, share: float = BAND_SHARE) -> tuple[float, float]:
    """(low, high) multipliers of a prediction: exp(-/+ e), with e the `share` quantile of
    |log(measured / predicted)|. Symmetric: with a few sources, the sign of their errors
    says little about the next one's, their size says how far to trust the model."""
    r = np.asarray(ratios, dtype=float)
    r = r[np.isfinite(r) & (r > 0)]
    if r.size == 0:
        return 1.0, 1.0
    e = float(np.quantile(np.abs(np.log(r)), share))
    return math.exp(-e), math.exp(e)


def honest_bands(sources: Sequence[str], predicted: np.ndarray, measured: np.ndarray,
                 low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's band widened by the ratio spread of the *other* sources' held-out
    predictions (so a row's own error never sets its band)."""
    src = np.asarray(sources)
    ratio = measured / predicted
    lo_out, hi_out = low.copy(), high.copy()
    for s in dict.fromkeys(sources):
        mine = src == s
        a, b = band_from_residuals(ratio[~mine]) if (~mine).any() else (1.0, 1.0)
        lo_out[mine] = np.minimum(low[mine], predicted[mine] * a)
        hi_out[mine] = np.maximum(high[mine], predicted[mine] * b)
    return lo_out, hi_out


def model_error_of(scored: pd.DataFrame) -> ModelError:
    """The figure predictions carry: cross-validated GMAE and MAPE, coverage of the honest
    bands, and the band multipliers from every held-out ratio."""
    lo, hi = band_from_residuals(scored["measured_us"] / scored["predicted_us"])
    return ModelError(n=len(scored), sources=scored["source"].nunique(),
                      gmae=gmae(scored["predicted_us"], scored["measured_us"]),
                      mape=mape(scored["predicted_us"], scored["measured_us"]),
                      coverage=coverage(scored["band_low_us"], scored["band_high_us"], scored["measured_us"]),
                      low=lo, high=hi, cv="leave-one-source-out",
                      generated=_dt.datetime.now(_dt.timezone.utc).date().isoformat())


def not_expressible(df: pd.DataFrame) -> pd.DataFrame:
    """The rows left out, with why (they stay in the corpus)."""
    return df.loc[df["expressible"] == "no", ["id", "source", "gpu", "kernel", "why_not"]].reset_index(drop=True)


def log_ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(np.asarray(a, dtype=float) / np.asarray(b, dtype=float))


def finite(x: float) -> float:
    return x if isinstance(x, float) and math.isfinite(x) else float("nan")


# --------------------------------------------------------------- the whole run
@dataclasses.dataclass
class Validation:
    """`characterize validate`: every expressible measurement scored, and the figures."""

    rows: pd.DataFrame          # id, source, gpu, variant, dataset, measured_us, predicted_us (defaults),
                                # cv_predicted_us (held out), band_low_us, band_high_us, error_pct, cv_error_pct,
                                # proxy (an implementation of the design stands in for the measured kernel)
    summary: pd.DataFrame       # per source and all: n, gpus, mape, gmae, inside_band (cross-validated; no proxies)
    proxies: pd.DataFrame       # the same for the proxy rows, apart
    default_summary: pd.DataFrame   # the same for the published constants, untouched by the corpus
    left_out: pd.DataFrame      # the corpus rows the model cannot express, with why
    error: ModelError
    folds: dict[str, list]      # each held-out source's fitted multipliers of CV_CONSTANTS


def validate_points(measurements: Sequence[Measurement], points: Sequence[object], consts: Mapping[str, ModelConstants]
                    ) -> Validation:
    """Score prepared points (model.geometry._Point, one per measurement) against the
    measurements: with the published constants, then under leave-one-source-out
    cross-validation of CV_CONSTANTS, with bands widened by the other sources' error."""
    measured = np.array([m.measured_us for m in measurements])
    sources = [m.source for m in measurements]
    own = np.array([not m.proxy for m in measurements])

    def predict_rows(c: Mapping[str, ModelConstants], idx: Sequence[int] | None = None) -> np.ndarray:
        idx = range(len(points)) if idx is None else idx
        return np.array([_evaluate(points[i], c[points[i].gpu.key])["time_us"] for i in idx])

    default = predict_rows(consts)
    fast = {k: c.band()[0] for k, c in consts.items()}
    slow = {k: c.band()[1] for k, c in consts.items()}
    lo, hi = predict_rows(fast), predict_rows(slow)
    mine = np.flatnonzero(own)
    held = default.copy()
    held_own, folds = cross_validate([sources[i] for i in mine], lambda c, idx=None: predict_rows(
        c, [mine[j] for j in (range(len(mine)) if idx is None else idx)]), measured[mine], consts)
    held[mine] = held_own
    band_lo, band_hi = honest_bands(sources, held, measured, lo * held / default, hi * held / default)
    rows = pd.DataFrame({
        "id": [m.id for m in measurements], "source": sources, "gpu": [m.gpu for m in measurements],
        "variant": [m.variant for m in measurements], "dataset": [m.dataset for m in measurements],
        "mode": [m.mode for m in measurements], "measured_us": measured, "predicted_us": default,
        "cv_predicted_us": held, "band_low_us": band_lo, "band_high_us": band_hi,
        "error_pct": 100 * (default / measured - 1), "cv_error_pct": 100 * (held / measured - 1),
        "proxy": ~own, "assumptions": [m.assumptions for m in measurements]})
    cv = rows.assign(predicted_us=rows["cv_predicted_us"])
    summary = summarize(cv[own], "band_low_us", "band_high_us")
    proxies = summarize(cv[~own], "band_low_us", "band_high_us") if (~own).any() else pd.DataFrame()
    plain = summarize(rows[own].assign(band_low_us=lo[own], band_high_us=hi[own]), "band_low_us", "band_high_us")
    return Validation(rows, summary, proxies, plain, pd.DataFrame(), model_error_of(cv[own]), folds)
