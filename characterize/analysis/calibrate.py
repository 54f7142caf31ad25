"""Analysis stage, calibration: fit the model's constants to a measured run, per GPU,
and score predictions against measurements (GMAE).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from characterize.analysis.model.constants import (
    BOUNDS,
    FIT_DEFAULT,
    MODES,
    ModelConstants,
    calibration_path,
)
from characterize.analysis.model.equations import evaluate_point
from characterize.analysis.model.geometry import ModelPoint, prepare_points
from characterize.analysis.model.locality import TraceProfile
from characterize.analysis.model.scores import gmae
from characterize.config import ExperimentConfig
from characterize.errors import ConfigError, RunDirError
from characterize.hardware.specs import GpuSpec, gpu_spec
from characterize.kernels.registry import get_variant
from characterize.progress import Progress
from characterize.store import load_run, write_json


# ---------------------------------------------------------------- calibration
@dataclass
class Calibration:
    """The outcome of fitting the model to one measured run."""

    gpu: GpuSpec
    constants: ModelConstants
    defaults: ModelConstants
    fitted: tuple[str, ...]
    points: int
    hit_points: int
    gmae_default: float
    gmae_fitted: float
    run: str
    path: Path | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu.key, "gpu_name": self.gpu.name, "constants": self.constants.to_dict(),
                "defaults": self.defaults.to_dict(), "fitted": list(self.fitted), "points": self.points,
                "hit_points": self.hit_points, "gmae_default": self.gmae_default, "gmae_fitted": self.gmae_fitted,
                "run": self.run, "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


def _run_gpu(run: Any, gpu: str | None) -> GpuSpec:
    """The run's GPU as the spec table knows it, with the driver's SM count and L2 size."""
    info = run.meta.get("gpu") or {}
    name = gpu or (str(info["name"]) if info.get("name") is not None else None)
    if not name and run.meta.get("backend") == "emulate":
        raise RunDirError(f"{run.path}: its timings were measured by the CPU emulation (backend emulate), not on a "
                          "GPU; calibration needs a run benched on the GPU whose constants it fits")
    if not name:
        raise RunDirError(f"{run.path}: meta.json names no GPU (a run measured without one?); pass --gpu NAME")
    spec = gpu_spec(name)
    if gpu and info.get("name") and gpu_spec(str(info["name"])).key != spec.key:
        raise RunDirError(f"{run.path} was measured on {info['name']}, not on {spec.name} (--gpu {gpu}); constants "
                          "fitted to it would be stored for the wrong GPU")
    changes = {}
    for k in ("sm_count", "l2_bytes"):   # the driver's numbers, when meta.json holds sensible ones
        v = info.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 < v < 2**40:
            changes[k] = int(v)
    return dataclasses.replace(spec, **changes)


def _on_gpu(run: Any, spec: GpuSpec) -> set[tuple[str, str]]:
    """(variant, dataset) of the run's finished bench points that were timed on `spec`'s
    GPU with CUDA events: never the CPU emulation's timings, never another GPU's. A run
    with none is refused, saying what its timings are."""
    meta_gpu = (run.meta.get("gpu") or {}).get("name")
    mine, seen = set(), []
    for pt in run.points("bench"):
        if pt.get("status") != "ok":
            continue
        backend = pt.get("backend") or run.meta.get("backend") or "cuda"
        gpu = pt.get("gpu") or meta_gpu
        seen.append((backend, gpu))
        if backend != "cuda":
            continue
        try:
            same = gpu is None or gpu_spec(str(gpu)).key == spec.key
        except ConfigError:
            same = False
        if same:
            mine.add((pt["variant"], pt["dataset"]))
    if not mine and seen:
        backend, gpu = seen[0]
        what = (f"by the CPU emulation (backend {backend}), not on a GPU" if backend != "cuda" else
                f"on {gpu}, not on {spec.name}")
        raise RunDirError(f"{run.path}: its timings were measured {what}; calibrating {spec.name}'s constants needs "
                          f"a run benched on that GPU (`characterize bench` there)")
    return mine


def timed_gpu(run: Any, gpu: str | None = None) -> GpuSpec:
    """The GPU a run's constants would be fitted for (`gpu`, else the run's own), after
    checking that the run holds timings measured on it (RunDirError otherwise)."""
    spec = _run_gpu(run, gpu)
    _on_gpu(run, spec)
    return spec


def _measured(run: Any, spec: GpuSpec | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(variant, dataset, mode, measured_us, ci95_us) of finished points (timed on `spec`
    when given), and measured L2 hit rates of lookup kernels profiled with
    --cache-control none."""
    bench = run.bench
    if bench.empty or "per_table_us" not in bench.columns:
        raise RunDirError(f"{run.path}: no timings (points/bench); calibration needs a run measured on a GPU")
    b = bench.copy()
    if "status" in b.columns:
        b = b[b["status"].fillna("ok") == "ok"]
    if spec is not None:
        keep = _on_gpu(run, spec)
        b = b[[(v, d) in keep for v, d in zip(b["variant"], b["dataset"])]]
    if "mode" not in b.columns:
        b["mode"] = "steady"
    b = b[b["mode"].isin(MODES) & (b["per_table_us"] > 0)]
    ci = b["ci95_us"] if "ci95_us" in b.columns else np.nan
    times = pd.DataFrame({"variant": b["variant"], "dataset": b["dataset"], "mode": b["mode"],
                          "measured_us": b["per_table_us"].astype(float), "ci95_us": ci})
    k = run.kernels
    hits = pd.DataFrame(columns=["variant", "dataset", "measured_l2_hit_rate_pct"])
    if not k.empty and {"variant", "dataset", "l2_hit_rate_pct"} <= set(k.columns):
        if "cache_control" in k.columns:
            k = k[k["cache_control"].fillna("").astype(str) == "none"]
        name = next((c for c in ("function", "kernel_name") if c in k.columns), None)
        if name:
            k = k[~k[name].fillna("").astype(str).str.contains("l2_pin")]
        k = k.dropna(subset=["l2_hit_rate_pct"])
        if not k.empty:
            hits = (k.groupby(["variant", "dataset"])["l2_hit_rate_pct"].mean().rename("measured_l2_hit_rate_pct")
                    .reset_index())
    return times.reset_index(drop=True), hits


def compare_to_measured(pred: pd.DataFrame, run: Any) -> pd.DataFrame:
    """Predicted against measured per (variant, dataset, mode) of the run's GPU: absolute
    and relative errors of time, and L2 hit rates where ncu measured them."""
    times, hits = _measured(run)
    gpu = _run_gpu(run, None).key
    mine = pred[pred["gpu"] == gpu] if "gpu" in pred.columns else pred
    if mine.empty:
        raise ConfigError(f"the predictions hold no rows for the run's GPU ({gpu}); predict for it first")
    on = ["variant", "dataset"] + (["mode"] if "mode" in mine.columns else [])
    cols = on + ["time_per_table_us", "l2_hit_rate_pct", "constants"]   # per table, as bench measures
    df = times.merge(mine[[c for c in cols if c in mine.columns]], on=on, how="inner")
    df = df.rename(columns={"time_per_table_us": "predicted_us", "l2_hit_rate_pct": "predicted_l2_hit_rate_pct"})
    df["abs_error_us"] = (df["predicted_us"] - df["measured_us"]).abs()
    df["rel_error"] = df["predicted_us"] / df["measured_us"] - 1
    df = df.merge(hits, on=["variant", "dataset"], how="left")
    df.insert(2, "gpu", gpu)
    return df


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def least_squares(residuals: Callable[[np.ndarray], np.ndarray], x0: np.ndarray, iterations: int = 60,
                  tol: float = 1e-12) -> np.ndarray:
    """Levenberg-Marquardt with central-difference Jacobians (a few parameters only); stops when
    a step lowers the cost by less than `tol` of it."""
    x, r = x0.copy(), residuals(x0)
    cost, lam, h = float(r @ r), 1e-2, 1e-3
    for _ in range(iterations):
        J = np.empty((r.size, x.size))
        for j in range(x.size):
            e = np.zeros_like(x)
            e[j] = h
            J[:, j] = (residuals(x + e) - residuals(x - e)) / (2 * h)
        A, g = J.T @ J, J.T @ r
        improved = False
        while lam < 1e10:
            step = np.linalg.solve(A + lam * (np.diag(np.diag(A)) + 1e-9 * np.eye(x.size)), -g)
            r_new = residuals(x + step)
            c_new = float(r_new @ r_new)
            if c_new < cost:
                improved = cost - c_new > tol * max(cost, 1e-30)
                x, r, cost, lam = x + step, r_new, c_new, max(lam / 3, 1e-9)
                break
            lam *= 4
        if not improved:
            break
    return x


def _ran_with(run: Any, exp: ExperimentConfig) -> dict[str, dict[str, Any]]:
    """The parameters the run's points ran with, per variant: the experiment's, and tbe's work
    order as its points recorded it (every table at once where they record none: the order
    before phases existed)."""
    params = {v: dict(p) for v, p in exp.params.items()}
    for pt in run.points("bench"):
        if pt.get("variant") == "tbe" and pt.get("status") == "ok":
            phases = [n for launch in (pt.get("launch") or {}).values() for n in (launch.get("phases") or [])]
            params.setdefault("tbe", {}).setdefault("tables_in_flight", phases[0] if phases else exp.workload.T)
    return params


def fit_run(run: Any, gpu: str | None = None, *, static: Any = None, sass: Any = None,
            fit: Sequence[str] = FIT_DEFAULT, prior_weight: float = 0.02,
            hit_weight: float = 1.0, progress: Progress | None = None) -> Calibration:
    """Fit the constants named in `fit` to a measured run (store.load_run() or a path).

    Residuals: log(predicted / measured) of each timed (variant, dataset, mode) point
    (ours, PyTorch's and FBGEMM's: each is modelled from its own SASS), plus
    hit_weight x (predicted - measured L2 hit rate) / 100 for lookup kernels ncu
    profiled with --cache-control none (the model's all-reads L2 hit rate; writes are
    not counted), plus prior_weight x log(value / default) per constant so that
    constants the data cannot see stay at their defaults.
    """
    run = load_run(run) if isinstance(run, (str, Path)) else run
    unknown = set(fit) - set(BOUNDS)
    if unknown or not fit:
        raise ConfigError(f"fit names constants from {', '.join(BOUNDS)}; got {', '.join(sorted(unknown)) or 'none'}")
    spec = _run_gpu(run, gpu)
    if not run.meta.get("experiment"):
        raise RunDirError(f"{run.path}: meta.json holds no experiment; the model needs the workload it measured")
    exp = ExperimentConfig.from_dict(run.meta["experiment"])
    times, hits = _measured(run, spec)
    # ours and the peers', each modelled from its own machine code
    times = times[times["variant"].map(lambda v: get_variant(v).compiled or bool(get_variant(v).peer))]
    if times.empty:
        raise RunDirError(f"{run.path}: no finished timings of modelled variants to calibrate on")
    if static is None:
        static = run.static
        if static.empty or "arch" not in static.columns or spec.arch not in set(static["arch"]):
            raise RunDirError(f"{run.path}: static.csv has no rows for {spec.arch}; the model needs them "
                              "(`characterize calibrate` compiles them)")
    if sass is None:
        sass = run.sass
        if sass.empty or "arch" not in sass.columns or spec.arch not in set(sass["arch"]):
            raise RunDirError(f"{run.path}: sass.csv has no rows for {spec.arch}; the model needs them "
                              "(`characterize calibrate` disassembles the builds)")
    profiles: dict[str, TraceProfile] = {}
    index: dict[tuple[str, str, str], ModelPoint] = {}
    params = _ran_with(run, exp)
    for mode, sub in times.groupby("mode"):
        pts = prepare_points(exp.workload, sorted(sub["dataset"].unique()), sorted(sub["variant"].unique()), [spec],
                             params, static, sass, 1, mode, profiles, progress)
        index.update({(p.variant, p.dataset, mode): p for p in pts})
    # bench measures per table; a batched variant's launch covers every table
    timed = [(p, r.measured_us * p.tables_per_launch) for r in times.itertuples()
             for p in [index[(r.variant, r.dataset, r.mode)]]]
    steady = {(p.variant, p.dataset): p for (v, d, m), p in index.items() if m == "steady"}
    hit_pts = [(steady[(r.variant, r.dataset)], r.measured_l2_hit_rate_pct) for r in hits.itertuples()
               if (r.variant, r.dataset) in steady]
    defaults = ModelConstants.defaults(spec)
    names = [n for n in BOUNDS if n in fit]
    lo = np.array([BOUNDS[n][0] for n in names])
    hi = np.array([BOUNDS[n][1] for n in names])
    start = np.clip([getattr(defaults, n) for n in names], lo + 1e-6 * (hi - lo), hi - 1e-6 * (hi - lo))
    x0 = np.log((start - lo) / (hi - start))
    base_values = np.array([getattr(defaults, n) for n in names])

    def constants_at(x: np.ndarray) -> ModelConstants:
        return defaults.replace(**{n: float(v) for n, v in zip(names, lo + (hi - lo) * _sigmoid(x))})

    def residuals(x: np.ndarray) -> np.ndarray:
        c = constants_at(x)
        r = [math.log(evaluate_point(p, c)["time_us"] / m) for p, m in timed]
        r += [hit_weight * (evaluate_point(p, c)["l2_hit_rate_pct"] - m) / 100 for p, m in hit_pts]
        values = lo + (hi - lo) * _sigmoid(x)
        r += list(prior_weight * np.log(values / base_values))
        return np.asarray(r)

    if progress:
        progress(f"fitting {', '.join(names)} to {len(timed)} timings and {len(hit_pts)} L2 hit rates")
    fitted = constants_at(least_squares(residuals, x0))
    meas = [m for _, m in timed]
    return Calibration(spec, fitted, defaults, tuple(names), len(timed), len(hit_pts),
                       gmae([evaluate_point(p, defaults)["time_us"] for p, _ in timed], meas),
                       gmae([evaluate_point(p, fitted)["time_us"] for p, _ in timed], meas), str(run.path))


def save_calibration(cal: Calibration) -> Path:
    """Store the fitted constants where load_calibration() finds them."""
    path = calibration_path(cal.gpu)
    write_json(path, cal.to_dict())
    cal.path = path
    return path


def calibrate(run: Any, gpu: str | None = None) -> ModelConstants:
    """Fit the model's constants to a measured run and store them for its GPU; later
    predictions for that GPU use them (column constants = 'calibrated')."""
    cal = fit_run(run, gpu)
    save_calibration(cal)
    return cal.constants


