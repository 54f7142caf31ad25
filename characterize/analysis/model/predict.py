"""Analysis stage, model predictions: every variant x dataset x GPU of an experiment as a tidy frame.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from characterize.analysis.model.constants import MODES, ModelConstants, load_calibration
from characterize.analysis.model.equations import evaluate_point
from characterize.analysis.model.geometry import ModelPoint, prepare_points
from characterize.analysis.model.locality import warm
from characterize.analysis.model.validation_error import model_error, regime_of
from characterize.config import ExperimentConfig, WorkloadConfig
from characterize.errors import ConfigError
from characterize.hardware.specs import GpuSpec, gpu_spec
from characterize.kernels.registry import VARIANTS
from characterize.progress import Progress
from characterize.rundir import artifact

#: the columns of predictions.csv, declared in characterize.rundir
COLUMNS = artifact("predictions").column_names


#: the references every prediction is compared with: what the paper started from, what users run
REFERENCES = ("base", "torch", "fbgemm")


def _frame(points: Sequence[ModelPoint], consts: Mapping[str, tuple[ModelConstants, str]],
           keep: Sequence[str]) -> pd.DataFrame:
    error = model_error()
    rows = []
    for p in points:
        c, label = consts[p.gpu.key]
        fast, slow = c.band()
        out = evaluate_point(p, c)
        lo, hi = evaluate_point(p, fast)["time_us"], evaluate_point(p, slow)["time_us"]
        t = out["time_us"]
        regime = regime_of(p.host, p.lookups / max(p.bags, 1), out["bound"])
        if error is not None:   # the model's own error in this regime, beside the constants' ranges
            a, b = error.band(regime)
            lo, hi = min(lo, t * a), max(hi, t * b)
        lo = max(lo, out["floor_us"] + c.launch_overhead_us)
        k = p.kernel
        per_bag = p.lookups / max(p.bags, 1)   # a task gathers every lookup of its bag (or of 32 / lanes bags)
        per_task = per_bag * (32 // max(1, k.lanes_per_bag) * max(1, k.run_bags) if k.work == "bag" else 1)
        rows.append({"variant": p.variant, "dtype": p.dtype, "dataset": p.dataset, "arch": p.gpu.arch,
                     "gpu": p.gpu.key, "mode": p.mode, "constants": label, "kernel_source": k.source,
                     "code_arch": k.code_arch, "tables_per_launch": p.tables_per_launch,
                     "blocks_per_sm": k.blocks_per_sm, "registers": k.registers, "resident_warps": p.resident_warps,
                     "loads_in_flight": per_task / max(p.task_latencies, 1e-9),
                     "latencies_per_lookup": p.task_latencies / max(per_task, 1e-9),
                     "instructions_per_lookup": p.task_instructions / max(per_task, 1e-9),
                     "waves": p.waves, "pinned_rows": p.pinned_rows, "note": p.note, "cache_ratio": p.cache_ratio,
                     "host_link": p.gpu.host_link if p.host != "none" else "", "regime": regime,
                     "tables_in_flight": p.tables_in_flight, **out,
                     "time_us_low": lo, "time_us_high": hi,
                     "time_per_table_us": t / p.tables_per_launch, "batch_us": t * p.launches,
                     "validated_n": error.n if error else 0,
                     "validated_gmae_pct": 100 * error.gmae if error else float("nan")})
    if not rows:   # no variant asked for reads these tables
        return pd.DataFrame(columns=COLUMNS)
    df = pd.DataFrame(rows)
    for ref in REFERENCES:
        col = f"speedup_vs_{ref}"
        have = df[df["variant"] == ref].set_index(["dataset", "gpu"])["batch_us"] if not df.empty else pd.Series()
        df[col] = [have[(d, g)] / t if (d, g) in have.index and t > 0 else float("nan")
                   for d, g, t in zip(df["dataset"], df["gpu"], df["batch_us"])]
    return df[df["variant"].isin(keep)].reindex(columns=COLUMNS).reset_index(drop=True)


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
            mode: str | Sequence[str] = "steady", static: Any = None, sass: Any = None,
            progress: Progress | None = None, cache_ratios: Sequence[float] | None = None,
            set_aside: bool = True, custom: Mapping[str, Mapping[str, Any]] | None = None,
            profiles: dict | None = None) -> pd.DataFrame:
    """Predicted time, hit rates, traffic and the intermediate quantities, one row per
    (variant, dataset, GPU, mode); columns as characterize.rundir declares predictions.csv.

    `archs_or_gpus`: 'sm_80', 'h200', a driver name or GpuSpec objects. `params`:
    per-variant overrides ({'rpf': {'P': 4}}). `constants`: one ModelConstants for all
    GPUs or a dict by GPU key; by default a stored calibration, else GpuSpec defaults.
    `tables`: how many of each dataset's tables to analyze (generated tables share a
    distribution; a trace file may differ per table). `mode`: 'steady' (tables in
    turn, as in production), 'cold' (L2 flushed before each launch), or both. `static`
    and `sass`: the static characterization and SASS rows of our variants (a run's
    static.csv and sass.csv); PyTorch's and FBGEMM's kernels come from their own SASS
    (kernels.peers), a user's kernel (an experiment's [variants.NAME]) from its SASS rows per
    architecture in `custom` (kernels.user.sass_rows); the model never compiles.
    `set_aside`: l2p/combined pin their rows inside a persisting-L2 set-aside (False: the
    pre-pass only warms L2, as without cudaLimitPersistingL2CacheSize). `cache_ratios`:
    cache sizes as shares of E for the cache variant, one row each. Every row carries
    its speedups over base, torch and fbgemm (whole batches of all T tables: a kernel
    covering every table in one launch is compared fairly), the traffic floor no kernel
    beats, and the model's validation figure (validated_n, validated_gmae_pct). A
    variant without kernel facts on a GPU (a peer without code for it) is left out; the
    reasons are in `df.attrs["skipped"]`. `profiles`: a dict kept across calls to reuse
    the traces' locality (predicting other dtypes of one workload computes it once).
    """
    workload.validate()
    modes = [mode] if isinstance(mode, str) else list(mode)
    for m in modes:
        if m not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {m!r}")
    gpus = _gpus(archs_or_gpus)
    wanted = list(variants)
    names = list(dict.fromkeys([*wanted, *(r for r in REFERENCES if r in VARIANTS)]))
    skipped: list[str] = []
    profiles = {} if profiles is None else profiles
    consts = _constants_for(gpus, constants)
    # base is every row's reference, required unless it cannot read the tables (fp8: tbe's alone)
    reads_base = workload.dtype in VARIANTS["base"].dtypes
    frames = []
    for m in modes:
        points = prepare_points(workload, list(datasets), names, gpus, params or {}, static, sass, tables, m, profiles,
                                progress, cache_ratios, set_aside=set_aside, custom=custom, skipped=skipped,
                                optional=[n for n in names if n not in wanted and (n != "base" or not reads_base)])
        needs: dict[int, set[tuple[int, str]]] = {}   # what the points will read of each trace, side by side
        for p in points:
            if p.l2 != "none" and (p.pinned_rows or p.prepass_rows):
                needs.setdefault(id(p.profile), set()).add((p.pinned_rows or p.prepass_rows, p.mode))
        warm([p.profile for p in points], needs, {p.mode for p in points})
        frames.append(_frame(points, consts, wanted))
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)
    df.attrs["skipped"] = [s for s in dict.fromkeys(skipped) if s.split(" on ")[0] in wanted]
    return df


def predict_experiment(exp: ExperimentConfig, archs: Iterable[str] | None = None,
                       progress: Progress | None = None, *, static: Any = None, sass: Any = None,
                       cache_ratios: Sequence[float] | None = None, mode: str | Sequence[str] = "steady",
                       custom: Mapping[str, Mapping[str, Any]] | None = None, profiles: dict | None = None
                       ) -> pd.DataFrame:
    """predict() over an experiment's matrix (its architectures unless `archs` is given),
    with its bench.l2_set_aside deciding how l2p/combined pin."""
    return predict(exp.workload, exp.datasets, exp.variants, list(archs or exp.archs), params=exp.params,
                   static=static, sass=sass, progress=progress, cache_ratios=cache_ratios, mode=mode,
                   set_aside=exp.bench.l2_set_aside, custom=custom, profiles=profiles)


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
    the geometric mean over datasets of base's time per table at the reference precision over
    the variant's per table at its own (steady mode; GPU-resident variants; a launch covering
    every table counts its time / T). Columns: gpu, dtype, variant, speedup_vs_fp32_base,
    datasets (how many entered the mean). Empty when the predictions hold one precision only
    or none at the reference."""
    cols = ["gpu", "dtype", "variant", "speedup_vs_fp32_base", "datasets"]
    need = {"variant", "dtype", "dataset", "gpu", "time_us"}
    if pred.empty or not need <= set(pred.columns) or pred["dtype"].nunique() < 2:
        return pd.DataFrame(columns=cols)
    p = pred[pred["mode"] == "steady"] if "mode" in pred.columns else pred
    if "cache_ratio" in p.columns:
        p = p[p["cache_ratio"].isna()]      # host-resident rows have their own panels
    per = pd.to_numeric(p["tables_per_launch"], errors="coerce").fillna(1).clip(lower=1) \
        if "tables_per_launch" in p.columns else 1
    p = p.assign(time_us=p["time_us"] / per)   # per table: a batched launch's time / the tables it covers
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
