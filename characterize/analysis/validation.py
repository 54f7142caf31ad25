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
from characterize.analysis.model.equations import evaluate_point
from characterize.analysis.model.scores import coverage, gmae, mape
from characterize.analysis.model.validation_error import REGIMES, ModelError, regime_of
from characterize.config import ExperimentConfig, Pooling, WorkloadConfig
from characterize.errors import ConfigError
from characterize.kernels.registry import get_variant

MEASUREMENTS = Path(__file__).resolve().parent / "model" / "measurements.csv"
#: our own measured runs (profiles/<gpu>/...), as corpus rows with their provenance: `validate
#: --add-run RUN_DIR` appends a run's bench points; scored beside the public corpus, apart from it
MEASURED_HERE = Path(__file__).resolve().parent / "model" / "measured_here.csv"
#: per-row results of the last `characterize validate --write`, beside model_error.json
VALIDATION_CSV = Path(__file__).resolve().parent / "model" / "validation.csv"
#: the same for our own runs' points (held out by dataset and by shape, with their regime)
VALIDATION_HERE_CSV = Path(__file__).resolve().parent / "model" / "validation_here.csv"
#: the constants cross-validation refits on the other sources, as one multiplier each over
#: every GPU's value, kept inside the constant's published range (BAND)
CV_CONSTANTS = ("dram_latency_ns", "l2_latency_ns", "hbm_efficiency", "write_efficiency", "launch_overhead_us")
#: the band covers this central share of the cross-validated ratios measured / predicted
BAND_SHARE = 0.8
#: a fold's fit stops when a step lowers its cost by less than this share: the steps after it move
#: held-out predictions far less than their error, and took 3/4 of validate's time (35 fits, 20 nested)
FIT_TOL = 1e-4


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
    origin: str = "public"     # public: a published measurement; here: one of our own runs (profiles/<gpu>)


def load_measurements(path: Path = MEASUREMENTS, here: Path | None = MEASURED_HERE) -> pd.DataFrame:
    """The whole corpus as stored (every column; `expressible` yes or no), the public rows
    (origin "public") and, where `here` exists, our own measured runs (origin "here")."""
    if not path.is_file():
        raise ConfigError(f"{path}: the corpus of public measurements is missing")
    public = pd.read_csv(path, dtype=str, keep_default_na=False).assign(origin="public")
    if here is None or not here.is_file():
        return public
    ours = pd.read_csv(here, dtype=str, keep_default_na=False).assign(origin="here")
    return pd.concat([public, ours], ignore_index=True)


#: the corpus columns, in order (measurements.csv's header)
CORPUS_COLUMNS = ("id", "source", "citation", "url", "gpu", "gpu_key", "kernel", "kernel_version", "variant", "params",
                  "set_aside", "T", "E", "D", "B", "L", "dtype", "pooling", "distribution", "dataset", "mode",
                  "tables_per_launch", "measured_us", "time_scope", "timing_method", "expressible", "why_not",
                  "assumptions", "notes")


def run_corpus_rows(run: object, source: str, citation: str) -> list[dict[str, str]]:
    """A measured run's bench points (finished, on a GPU) as corpus rows, one per point and
    mode: the time of one launch (a batched variant's covers every table), the point's own
    parameters (tbe's work order as its launch recorded it), the run's workload and GPU.
    `run` is a store.Run; `source` names it in the corpus, `citation` says where it is kept."""
    meta = run.meta   # type: ignore[attr-defined]
    exp = ExperimentConfig.from_dict(meta["experiment"])
    wl, gpu = exp.workload, meta.get("gpu") or {}
    revision = (meta.get("environment") or {}).get("git_revision", "")
    rows = []
    for pt in run.points("bench"):   # type: ignore[attr-defined]
        if pt.get("status") != "ok" or pt.get("backend") != "cuda":
            continue
        v = get_variant(pt["variant"])
        tpl = wl.T if v.batched else 1
        params = {k: val for k, val in (pt.get("params") or {}).items() if isinstance(val, int)}
        if v.name == "tbe":   # the work order it ran: its phases, or every table at once (before phases existed)
            phases = [p for launch in (pt.get("launch") or {}).values() for p in (launch.get("phases") or [])]
            params["tables_in_flight"] = int(phases[0]) if phases else tpl
        for s in pt.get("summary", []):
            rows.append({
                "id": f"{source}:{pt['variant']}:{pt['dataset']}:{s['mode']}", "source": source,
                "citation": citation, "url": "", "gpu": gpu.get("name", ""), "gpu_key": gpu.get("key", ""),
                "kernel": v.description.split(":")[0], "kernel_version": f"characterize {revision}",
                "variant": pt["variant"], "params": ";".join(f"{k}={val}" for k, val in sorted(params.items())),
                "set_aside": str(exp.bench.l2_set_aside).lower(), "T": str(wl.T), "E": str(wl.E), "D": str(wl.D),
                "B": str(wl.B), "L": str(wl.L), "dtype": wl.dtype, "pooling": wl.mode,
                "distribution": f"preset {pt['dataset']} (workloads.presets), seed {wl.seed}",
                "dataset": pt["dataset"], "mode": s["mode"], "tables_per_launch": str(tpl),
                "measured_us": f"{s['per_table_us'] * tpl:.4f}",
                "time_scope": "one kernel launch (a batched variant's covers every table)",
                "timing_method": "CUDA events around each batch behind a delay kernel (bench), mean over repetitions",
                "expressible": "yes", "why_not": "", "assumptions": "",
                "notes": f"95% CI +-{s.get('ci95_us', float('nan')) * tpl:.3g} us over {s.get('reps')} repetitions"})
    return rows


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
                               r.expressible == "proxy", getattr(r, "origin", "public")))
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


def _apply(base: Mapping[str, ModelConstants], scale: Sequence[float],
           names: Sequence[str] = CV_CONSTANTS) -> dict[str, ModelConstants]:
    """Every GPU's constants with `names` multiplied by `scale`, clamped to BOUNDS."""
    out = {}
    for key, c in base.items():
        changes = {}
        for name, m in zip(names, scale):
            lo, hi = BOUNDS[name]
            changes[name] = min(max(getattr(c, name) * m, lo), hi)
        out[key] = c.replace(**changes)
    return out


def fit_scale(predict_rows: Callable[[Mapping[str, ModelConstants]], np.ndarray], measured: np.ndarray,
              base: Mapping[str, ModelConstants], names: Sequence[str] = CV_CONSTANTS,
              start: np.ndarray | None = None) -> np.ndarray:
    """Multipliers of `names` (CV_CONSTANTS) minimizing the squared log error of
    `predict_rows`, each kept inside its constant's published range (BAND). `start`: the
    multipliers to search from (a fit on most of the same rows converges in a few steps);
    the weak pull stays towards the published values."""
    lo = np.array([BAND.get(n, (0.8, 1.25))[0] for n in names])
    hi = np.array([BAND.get(n, (0.8, 1.25))[1] for n in names])

    def scale(z: np.ndarray) -> np.ndarray:   # any real z maps inside the band; z = 0 near 1
        return lo + (hi - lo) / (1 + np.exp(-z))

    def unscale(m: np.ndarray) -> np.ndarray:
        f = np.clip((np.asarray(m, dtype=float) - lo) / (hi - lo), 1e-6, 1 - 1e-6)
        return np.log(f / (1 - f))

    z0 = unscale(np.ones(len(names)))   # scale(z0) == 1

    def residuals(z: np.ndarray) -> np.ndarray:
        pred = predict_rows(_apply(base, scale(z), names))
        r = np.log(np.where(pred > 0, pred, 1e-9) / measured)
        return np.concatenate([r, 0.05 * (z - z0)])   # a weak pull to the published values

    return scale(least_squares(residuals, z0.copy() if start is None else unscale(start), tol=FIT_TOL))


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
    here: "HereValidation | None" = None   # our own measured runs (measured_here.csv), scored apart


def validate_points(measurements: Sequence[Measurement], points: Sequence[object], consts: Mapping[str, ModelConstants]
                    ) -> Validation:
    """Score prepared points (model.geometry.ModelPoint, one per measurement) against the
    measurements: with the published constants, then under leave-one-source-out
    cross-validation of CV_CONSTANTS, with bands widened by the other sources' error."""
    measured = np.array([m.measured_us for m in measurements])
    sources = [m.source for m in measurements]
    own = np.array([not m.proxy for m in measurements])

    def predict_rows(c: Mapping[str, ModelConstants], idx: Sequence[int] | None = None) -> np.ndarray:
        idx = range(len(points)) if idx is None else idx
        return np.array([evaluate_point(points[i], c[points[i].gpu.key])["time_us"] for i in idx])

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


def add_run(run: object, source: str | None = None, citation: str | None = None,
            path: Path = MEASURED_HERE) -> tuple[str, int]:
    """Append a measured run's bench points to our corpus (`path`), replacing the rows of the
    same source: (the source's name, rows written). `run` is a store.Run."""
    meta = run.meta   # type: ignore[attr-defined]
    gpu = (meta.get("gpu") or {}).get("key") or ""
    if not gpu:
        raise ConfigError(f"{run.path}: the run records no GPU; only a run measured on a GPU can join the corpus")  # type: ignore[attr-defined]
    source = source or f"{gpu}-{run.name}"   # type: ignore[attr-defined]
    rows = run_corpus_rows(run, source, citation or f"{run.path} (a run measured by characterize)")  # type: ignore[attr-defined]
    if not rows:
        raise ConfigError(f"{run.path}: no finished bench point measured on a GPU")   # type: ignore[attr-defined]
    kept = pd.read_csv(path, dtype=str, keep_default_na=False) if path.is_file() else pd.DataFrame(
        columns=list(CORPUS_COLUMNS))
    kept = kept[kept["source"] != source]
    out = pd.concat([kept, pd.DataFrame(rows)], ignore_index=True).reindex(columns=list(CORPUS_COLUMNS))
    out.to_csv(path, index=False)
    return source, len(rows)


# ------------------------------------------------------- our own measured runs
#: the constants each fold refits on the rows it trains on (as CV_CONSTANTS), our rows being many
HERE_CV_CONSTANTS = (*CV_CONSTANTS, "issue_ipc", "l1_efficiency", "l2_capacity_factor")
#: the share of held-out points a band is meant to hold: each band's tail (the quantiles of its
#: regime's held-out residuals it spans) is the narrowest of BAND_TAILS that held at least this
#: share of the points of datasets it was not chosen on (nested leave-one-dataset-out)
BAND_NOMINAL = 0.9
#: the tails a band may cut off each side, narrowest first: the 5th to 95th percentile ... the whole range
BAND_TAILS = (0.05, 0.04, 0.03, 0.02, 0.01, 0.0)
#: the quantiles of a regime's held-out residuals its band spans when no tail is chosen (the narrowest)
REGIME_BAND = (BAND_TAILS[0], 1 - BAND_TAILS[0])


def regime_band(log_residuals: np.ndarray, tail: float = REGIME_BAND[0]) -> tuple[float, float]:
    """(low, high) multipliers of a prediction from held-out log(measured / predicted): their
    `tail` and 1 - `tail` quantiles (asymmetric, so a bias the regime has stays in its band)."""
    r = np.asarray(log_residuals, dtype=float)
    r = r[np.isfinite(r)]
    if r.size == 0:
        return 1.0, 1.0
    lo, hi = np.quantile(r, (tail, 1 - tail))
    return float(math.exp(min(lo, 0.0))), float(math.exp(max(hi, 0.0)))


@dataclasses.dataclass
class HereValidation:
    """Our own measured runs scored: held out by dataset and by shape (run), with bands from
    the held-out residuals of the same regime in the other folds."""

    rows: pd.DataFrame        # id, source, variant, dataset, mode, regime, measured_us, predicted_us,
                              # cv_dataset_us, cv_shape_us, band_low_us, band_high_us (the dataset fold's)
    by: dict[str, pd.DataFrame]   # "source", "regime", "variant": n, gmae, mape, inside_band (dataset fold)
    shapes: pd.DataFrame      # leave-one-shape-out: per held-out run n, gmae, mape
    best: pd.DataFrame        # per (source, dataset, mode): measured best, predicted best, right
    bands: dict[str, tuple[float, float, int]]   # regime -> (low, high, n) from every held-out residual
    tail: float = REGIME_BAND[0]   # the quantile each side `bands` cut off (chosen as choose_tail says)
    tails: dict[str, float] = dataclasses.field(default_factory=dict)   # dataset -> the tail its rows' bands cut


def band_pool(regimes: np.ndarray, pool: np.ndarray, regime: str) -> np.ndarray:
    """The rows a band of `regime` is drawn from: that regime's rows within `pool`, or all of
    `pool` where the regime has fewer than five there."""
    mine = pool & (regimes == regime)
    return mine if mine.sum() >= 5 else pool


def choose_tail(log_residuals: np.ndarray, regimes: np.ndarray, datasets: np.ndarray,
                nominal: float = BAND_NOMINAL, tails: Sequence[float] = BAND_TAILS) -> float:
    """The narrowest of `tails` whose bands hold at least `nominal` of the points when each
    dataset's are drawn from the other datasets' residuals of their regime (the widest where
    none does). Why: the datasets are few and unlike, so a quantile of the others' errors
    holds fewer of a new dataset's points than its level says; how many fewer is measured
    here, on the datasets given, never on the one the band is then used for."""
    r, reg, ds = np.asarray(log_residuals, dtype=float), np.asarray(regimes), np.asarray(datasets)
    known = np.isfinite(r)
    keys = list(dict.fromkeys(ds[known]))
    if len(keys) < 2:
        return tails[-1]
    for t in tails:
        inside = []
        for d in keys:
            test = known & (ds == d)
            for regime in dict.fromkeys(reg[test]):
                a, b = regime_band(r[band_pool(reg, known & (ds != d), regime)], t)
                x = np.exp(r[test & (reg == regime)])
                inside.extend((x >= a) & (x <= b))
        if np.mean(inside) >= nominal:
            return t
    return tails[-1]


def _fold_cv(keys: Sequence[str], predict_rows: Callable[[Mapping[str, ModelConstants], Sequence[int]], np.ndarray],
             measured: np.ndarray, base: Mapping[str, ModelConstants], names: Sequence[str]
             ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Each fold's rows predicted with `names` refitted (as multipliers in their BAND) on
    the other folds' rows: the held-out predictions and each fold's multipliers."""
    k = np.asarray(keys)
    held = np.full(len(k), np.nan)
    fits: dict[str, np.ndarray] = {}
    for key in dict.fromkeys(keys):
        train, test = np.flatnonzero(k != key), np.flatnonzero(k == key)
        if len(train) == 0:
            held[test] = predict_rows(base, test)
            continue
        fits[key] = fit_scale(lambda c: predict_rows(c, train), measured[train], base, names)
        held[test] = predict_rows(_apply(base, fits[key], names), test)
    return held, fits


def nested_residuals(keys: Sequence[str], predict_rows: Callable[[Mapping[str, ModelConstants], Sequence[int]],
                                                                 np.ndarray],
                     measured: np.ndarray, base: Mapping[str, ModelConstants], names: Sequence[str],
                     starts: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Per fold d: log(measured / predicted) of every row outside d, each fold's rows predicted
    with `names` refitted on the rows of neither d nor that fold (nan on d's rows). A band for
    d's rows drawn from these has seen nothing of d, not even through the constants the other
    folds' predictions were refitted with. `starts`: each d's own fold fit, to search from."""
    k = np.asarray(keys)
    out: dict[str, np.ndarray] = {}
    for d in dict.fromkeys(keys):
        r = np.full(len(k), np.nan)
        for d2 in dict.fromkeys(keys):
            if d2 == d:
                continue
            train, test = np.flatnonzero((k != d) & (k != d2)), np.flatnonzero(k == d2)
            consts = base
            if len(train):
                x = fit_scale(lambda c: predict_rows(c, train), measured[train], base, names,
                              start=(starts or {}).get(d))
                consts = _apply(base, x, names)
            r[test] = np.log(measured[test] / predict_rows(consts, test))
        out[d] = r
    return out


def validate_here(measurements: Sequence[Measurement], points: Sequence[object],
                  consts: Mapping[str, ModelConstants]) -> HereValidation:
    """Our rows (origin "here") scored under leave-one-dataset-out (every run's rows of one
    dataset held out together) and leave-one-shape-out (one run held out) cross-validation
    of HERE_CV_CONSTANTS. Each row's band comes from the same regime's residuals in the other
    datasets, predicted by constants refitted without the row's dataset (nested_residuals),
    cutting the tail that held BAND_NOMINAL of those datasets' points (choose_tail): neither
    the band's width nor its residuals saw the row's dataset, so the share inside is a
    held-out coverage."""
    measured = np.array([m.measured_us for m in measurements])
    outs = [evaluate_point(p, consts[p.gpu.key]) for p in points]

    def predict_rows(c: Mapping[str, ModelConstants], idx: Sequence[int] | None = None) -> np.ndarray:
        idx = range(len(points)) if idx is None else idx
        return np.array([evaluate_point(points[i], c[points[i].gpu.key])["time_us"] for i in idx])

    default = np.array([o["time_us"] for o in outs])
    datasets = [m.dataset for m in measurements]
    sources = [m.source for m in measurements]
    by_dataset, fits = _fold_cv(datasets, predict_rows, measured, consts, HERE_CV_CONSTANTS)
    by_shape, _ = _fold_cv(sources, predict_rows, measured, consts, HERE_CV_CONSTANTS)
    regimes = [regime_of(p.host, p.lookups / max(p.bags, 1), o["bound"]) for p, o in zip(points, outs)]
    resid = np.log(measured / by_dataset)
    lo, hi = np.empty(len(points)), np.empty(len(points))
    reg, ds = np.asarray(regimes), np.asarray(datasets)
    # each dataset's bands: from residuals of fits that never saw it, cutting the tail that held
    # BAND_NOMINAL of the other datasets' points (choose_tail on them alone)
    nested = nested_residuals(datasets, predict_rows, measured, consts, HERE_CV_CONSTANTS, fits)
    tails: dict[str, float] = {}
    for d, r_d in nested.items():
        others = ds != d
        tails[d] = choose_tail(r_d[others], reg[others], ds[others])
        for regime in dict.fromkeys(reg[ds == d]):
            rows = (ds == d) & (reg == regime)
            a, b = regime_band(r_d[band_pool(reg, others, regime)], tails[d])
            lo[rows], hi[rows] = by_dataset[rows] * a, by_dataset[rows] * b
    rows = pd.DataFrame({
        "id": [m.id for m in measurements], "source": sources, "gpu": [m.gpu for m in measurements],
        "variant": [m.variant for m in measurements], "dataset": datasets, "mode": [m.mode for m in measurements],
        "regime": regimes, "tables_per_launch": [p.tables_per_launch for p in points],
        "measured_us": measured, "predicted_us": default, "cv_dataset_us": by_dataset,
        "cv_shape_us": by_shape, "band_low_us": lo, "band_high_us": hi})
    scored = rows.assign(predicted_us=rows["cv_dataset_us"])

    def table(col: str) -> pd.DataFrame:
        out = []
        for key, g in [*scored.groupby(col), ("all", scored)]:
            out.append({col: key, "n": len(g), "gmae": gmae(g["predicted_us"], g["measured_us"]),
                        "mape": mape(g["predicted_us"], g["measured_us"]),
                        "inside_band": coverage(g["band_low_us"], g["band_high_us"], g["measured_us"])})
        return pd.DataFrame(out)

    shapes = pd.DataFrame([{"source": s, "n": len(g), "gmae": gmae(g["cv_shape_us"], g["measured_us"]),
                            "mape": mape(g["cv_shape_us"], g["measured_us"])}
                           for s, g in [*rows.groupby("source"), ("all", rows)]])
    best = []
    for (s, d, mode), g in scored.groupby(["source", "dataset", "mode"]):
        g = g.drop_duplicates("variant")   # (one order of tbe per group: the first the run lists)
        if len(g) < 2:
            continue
        measured_t, predicted_t = (g[c] / g["tables_per_launch"] for c in ("measured_us", "predicted_us"))
        m_best, p_best = measured_t.idxmin(), predicted_t.idxmin()
        # how far apart the two sides put them: the runner-up over the winner (a miss: the
        # measured winner over the predicted one, as each side has it)
        runner_up = (lambda t, i: float(t.drop(i).min() / t[i] - 1))
        best.append({"source": s, "dataset": d, "mode": mode, "measured_best": g.loc[m_best, "variant"],
                     "predicted_best": g.loc[p_best, "variant"], "right": m_best == p_best,
                     "measured_margin_pct": 100 * (runner_up(measured_t, m_best) if m_best == p_best else
                                                   float(measured_t[p_best] / measured_t[m_best] - 1)),
                     "predicted_margin_pct": 100 * (runner_up(predicted_t, p_best) if m_best == p_best else
                                                    float(predicted_t[m_best] / predicted_t[p_best] - 1))})
    # the bands predictions carry: every held-out residual of the regime, cutting the tail the same
    # rule picks on all the datasets (its coverage on a new dataset is what the nested folds measured)
    tail = choose_tail(resid, reg, ds)
    bands = {}
    for r in REGIMES:
        sel = reg == r
        if sel.any():
            a, b = regime_band(resid[sel], tail)
            bands[r] = (a, b, int(sel.sum()))
    return HereValidation(rows, {c: table(c) for c in ("source", "regime", "variant")}, shapes,
                          pd.DataFrame(best), bands, tail, tails)
