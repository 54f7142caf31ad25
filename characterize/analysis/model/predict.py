"""Analysis stage, model predictions: every variant x dataset x GPU of an experiment as a tidy frame.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from characterize.analysis.model.constants import MODES, ModelConstants, load_calibration
from characterize.analysis.model.equations import _evaluate
from characterize.analysis.model.geometry import _Point, _prepare
from characterize.analysis.model.locality import warm
from characterize.config import ExperimentConfig, WorkloadConfig
from characterize.errors import ConfigError
from characterize.hardware.specs import GpuSpec, gpu_spec
from characterize.progress import Progress
from characterize.rundir import artifact

#: the columns of predictions.csv, declared in characterize.rundir
COLUMNS = artifact("predictions").column_names


def _frame(points: Sequence[_Point], consts: Mapping[str, tuple[ModelConstants, str]],
           keep: Sequence[str]) -> pd.DataFrame:
    rows = []
    for p in points:
        c, label = consts[p.gpu.key]
        fast, slow = c.band()
        par = p.resident_warps * p.rows_in_flight
        rows.append({"variant": p.variant, "dtype": p.dtype, "dataset": p.dataset, "arch": p.gpu.arch, "gpu": p.gpu.key,
                     "mode": p.mode, "constants": label, "blocks_per_sm": p.blocks_per_sm,
                     "registers": p.registers, "resident_warps": p.resident_warps, "loads_in_flight": p.rows_in_flight,
                     "latencies_per_lookup": p.latencies_per_lookup,
                     "instructions_per_lookup": p.instructions_per_lookup,
                     "bytes_per_load": p.bytes_per_load, "parallelism": par,
                     "bytes_in_flight_per_sm": par * p.bytes_per_load, "waves": p.waves,
                     "pinned_rows": p.pinned_rows, "note": p.note, "cache_ratio": p.cache_ratio,
                     "host_link": p.gpu.host_link if p.host != "none" else "", **_evaluate(p, c),
                     "time_us_low": _evaluate(p, fast)["time_us"], "time_us_high": _evaluate(p, slow)["time_us"]})
    df = pd.DataFrame(rows)
    base = df[df["variant"] == "base"].set_index(["dataset", "gpu"])["time_us"]
    df["speedup_vs_base"] = [base[(d, g)] / t for d, g, t in zip(df["dataset"], df["gpu"], df["time_us"])]
    return df[df["variant"].isin(keep)][COLUMNS].reset_index(drop=True)


def _gpus(archs_or_gpus: Iterable[str | GpuSpec] | str | GpuSpec) -> list[GpuSpec]:
    items = [archs_or_gpus] if isinstance(archs_or_gpus, (str, GpuSpec)) else list(archs_or_gpus)
    out = [g if isinstance(g, GpuSpec) else gpu_spec(g) for g in items]
    if not out:
        raise ConfigError("no architecture or GPU to predict for")
    return list({g.key: g for g in out}.values())


def _constants_for(gpus: Sequence[GpuSpec], constants: ModelConstants | Mapping[str, ModelConstants] | None
                   ) -> dict[str, tuple[ModelConstants, str]]:
    """Per GPU: given constants ('given'), else a stored calibration ('calibrated'),
    else the spec table's defaults ('default')."""
    out = {}
    for g in gpus:
        if isinstance(constants, ModelConstants):
            out[g.key] = (constants, "given")
        elif isinstance(constants, Mapping) and g.key in constants:
            out[g.key] = (constants[g.key], "given")
        else:
            cal = load_calibration(g)
            out[g.key] = (cal, "calibrated") if cal is not None else (ModelConstants.defaults(g), "default")
    return out


def predict(workload: WorkloadConfig, datasets: Sequence[str], variants: Sequence[str],
            archs_or_gpus: Iterable[str | GpuSpec] | str | GpuSpec, *,
            params: Mapping[str, dict[str, Any]] | None = None,
            constants: ModelConstants | Mapping[str, ModelConstants] | None = None, tables: int = 1,
            mode: str = "steady", static: Any = None, sass: Any = None,
            progress: Progress | None = None, cache_ratios: Sequence[float] | None = None) -> pd.DataFrame:
    """Predicted time, hit rates, traffic and the intermediate quantities, one row per
    (variant, dataset, GPU).

    `archs_or_gpus`: 'sm_80', 'h200', a driver name or GpuSpec objects. `params`:
    per-variant overrides ({'rpf': {'P': 4}}). `constants`: one ModelConstants for all
    GPUs or a dict by GPU key; by default a stored calibration, else GpuSpec defaults.
    `tables`: how many of each dataset's tables to analyze (generated tables share a
    distribution; a trace file may differ per table). `mode`: 'steady' (tables in
    turn, as in production) or 'cold' (L2 flushed before each launch). `static` and
    `sass`: the static characterization and SASS hot-loop rows of the variants (a
    run's static.csv and sass.csv); the model never compiles. `cache_ratios`: cache
    sizes as shares of E for the cache variant, one row each (C = ratio x E); its rows
    carry cache_ratio, cache_rows, cache_hit_rate_pct (of the unique rows of a batch),
    host_bytes (per launch) and the time split dedup_us, transfer_us, lookup_us; uvm
    rows the share of the table GPU memory holds, the page hit rate and the migrated bytes.
    Every other row has host_bytes 0 and NaN in the cache columns.
    """
    workload.validate()
    if mode not in MODES:
        raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    gpus = _gpus(archs_or_gpus)
    points = _prepare(workload, list(datasets), list(variants), gpus, params or {}, static, sass, tables, mode, {},
                      progress, cache_ratios)
    needs: dict[int, set[tuple[int, str]]] = {}
    for p in points:
        if p.l2 != "none" and p.pinned_rows:
            needs.setdefault(id(p.profile), set()).add((p.pinned_rows, p.mode))
    warm([p.profile for p in points], needs, {p.mode for p in points})
    return _frame(points, _constants_for(gpus, constants), list(variants))


def predict_experiment(exp: ExperimentConfig, archs: Iterable[str] | None = None,
                       progress: Progress | None = None, *, static: Any = None, sass: Any = None,
                       cache_ratios: Sequence[float] | None = None) -> pd.DataFrame:
    """predict() over an experiment's matrix (its architectures unless `archs` is given)."""
    return predict(exp.workload, exp.datasets, exp.variants, list(archs or exp.archs), params=exp.params,
                   static=static, sass=sass, progress=progress, cache_ratios=cache_ratios)




def primary_predictions(pred: pd.DataFrame, dtype: str | None = None, cache_ratio: float = 0.015) -> pd.DataFrame:
    """One row per variant x dataset x GPU x mode: the rows at the workload's precision
    `dtype` (the first one predicted when None), and of a cache-size sweep the size
    closest to `cache_ratio`. What headlines, tables and predicted-vs-measured compare;
    the precision grid and the cache panels read every row."""
    if pred.empty:
        return pred
    p = pred
    if "dtype" in p.columns:   # rows written without a dtype are fp32 (runs from before the precision grid)
        dt = p["dtype"].astype(object).fillna("fp32")
        p = p[dt == (dtype if dtype in set(dt) else dt.iloc[0])]
    if "cache_ratio" in p.columns and p["cache_ratio"].notna().any():
        swept = p["cache_ratio"].notna()
        ratios = p.loc[swept, "cache_ratio"].astype(float)
        closest = float(ratios.iloc[(ratios - cache_ratio).abs().argsort().iloc[0]])
        p = p[~swept | np.isclose(p["cache_ratio"].astype(float), closest)]
    return p.reset_index(drop=True)


def precision_grid(pred: pd.DataFrame, reference: str = "fp32") -> pd.DataFrame:
    """Predicted speedup of each (dtype, variant) over `reference`-precision base, per GPU:
    the geometric mean over datasets of base's time at the reference precision over the
    variant's time at its own (steady mode; GPU-resident variants). Columns: gpu, dtype,
    variant, speedup_vs_fp32_base, datasets (how many entered the mean). Empty when the
    predictions hold one precision only or none at the reference."""
    cols = ["gpu", "dtype", "variant", "speedup_vs_fp32_base", "datasets"]
    need = {"variant", "dtype", "dataset", "gpu", "time_us"}
    if pred.empty or not need <= set(pred.columns) or pred["dtype"].nunique() < 2:
        return pd.DataFrame(columns=cols)
    p = pred[pred["mode"] == "steady"] if "mode" in pred.columns else pred
    if "cache_ratio" in p.columns:
        p = p[p["cache_ratio"].isna()]      # host-resident rows have their own panels
    ref = p[(p["variant"] == "base") & (p["dtype"] == reference)].set_index(["dataset", "gpu"])["time_us"]
    if ref.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for (gpu, dtype, variant), g in p.groupby(["gpu", "dtype", "variant"], sort=False):
        ratios = [ref[(d, gpu)] / t for d, t in zip(g["dataset"], g["time_us"]) if (d, gpu) in ref.index and t > 0]
        if ratios:
            rows.append({"gpu": gpu, "dtype": dtype, "variant": variant,
                         "speedup_vs_fp32_base": float(np.exp(np.mean(np.log(ratios)))), "datasets": len(ratios)})
    return pd.DataFrame(rows, columns=cols)
