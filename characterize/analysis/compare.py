"""Analyze stage: derived metrics and comparisons over stored runs.

Every function takes tidy DataFrames (from store.Run) and returns tidy DataFrames,
with units in derived column names. Speedup confidence intervals use the delta
method on the two means' relative CIs (independent samples).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from characterize.errors import RunDirError
from characterize.extract.read import read_any
from characterize.store import load_run
from characterize.workloads.presets import HOTNESS_ORDER


def speedups(bench: pd.DataFrame, mode: str = "steady", against: Iterable[str] = ("base", "torch"),
             include_prepass: bool = False) -> pd.DataFrame:
    """Per (variant, dataset): per-table latency with its CI and the speedup over each
    reference variant (ratio of means; > 1 is faster), with a 95% CI."""
    if bench.empty:
        return pd.DataFrame()
    ok = bench[(bench["status"] == "ok") & (bench["mode"] == mode)].copy()
    t = "per_table_incl_prepass_us" if include_prepass else "per_table_us"
    ci = "ci95_incl_prepass_us" if include_prepass else "ci95_us"
    ok["latency_us"] = ok[t]
    ok["latency_ci95_us"] = ok[ci]
    cols = ["variant", "dataset", "mode", "latency_us", "latency_ci95_us", "effective_GBps", "hbm_pct",
            "prepass_per_table_us", "reps", "stable"]
    out = ok[[c for c in cols if c in ok.columns]].reset_index(drop=True)
    for ref in against:
        r = ok[ok["variant"] == ref][["dataset", "latency_us", "latency_ci95_us"]]
        r = r.rename(columns={"latency_us": "_ref", "latency_ci95_us": "_ref_ci"})
        m = out.merge(r, on="dataset", how="left")
        ratio = m["_ref"] / m["latency_us"]
        rel = np.sqrt((m["_ref_ci"] / m["_ref"]) ** 2 + (m["latency_ci95_us"] / m["latency_us"]) ** 2)
        out[f"speedup_vs_{ref}"] = ratio.values
        out[f"speedup_vs_{ref}_ci95"] = (ratio * rel).values
    return out


def headline(bench: pd.DataFrame, mode: str = "steady", reference: str = "base") -> pd.DataFrame:
    """Technique x hotness -> speedup over `reference` (rows: variants, columns: datasets)."""
    s = speedups(bench, mode, against=(reference,))
    if s.empty:
        return s
    table = s.pivot(index="variant", columns="dataset", values=f"speedup_vs_{reference}")
    order = [d for d in HOTNESS_ORDER if d in table.columns]
    return table[order + [c for c in table.columns if c not in order]]


def slowdown_random_vs_one_item(bench: pd.DataFrame, variant: str = "base", mode: str = "steady") -> float:
    """How much slower random access is than one-item for a variant (paper: up to 3.2x)."""
    s = bench[(bench["variant"] == variant) & (bench["mode"] == mode) & (bench["status"] == "ok")]
    by = dict(zip(s["dataset"], s["per_table_us"]))
    if "random" in by and "one-item" in by and by["one-item"] > 0:
        return float(by["random"] / by["one-item"])
    return math.nan


STALL_PREFIX = "stall_"


def stall_breakdown(kernels: pd.DataFrame) -> pd.DataFrame:
    """Long table: variant, dataset, reason, cycles per issued instruction (lookup kernels)."""
    if kernels.empty:
        return pd.DataFrame()
    stall_cols = [c for c in kernels.columns if c.startswith(STALL_PREFIX)]
    k = lookup_kernels(kernels)
    long = k.melt(id_vars=["variant", "dataset"], value_vars=stall_cols, var_name="reason", value_name="cycles")
    long["reason"] = long["reason"].str.removeprefix(STALL_PREFIX)
    return long.groupby(["variant", "dataset", "reason"], as_index=False)["cycles"].mean()


def lookup_kernels(kernels: pd.DataFrame) -> pd.DataFrame:
    """Profiled lookup kernels only (not the L2 pinning pre-pass)."""
    if kernels.empty or "function" not in kernels.columns:
        return kernels
    return kernels[~kernels["function"].astype(str).str.contains("l2_pin")]


def compare_runs(a: pd.DataFrame, b: pd.DataFrame, keys: Iterable[str] = ("variant", "dataset", "function"),
                 value: str = "value", metric: str = "metric") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Metric-by-metric comparison of two tidy metric tables on the metrics they share.
    Returns (joined rows with a, b, delta and ratio; rows present on one side only)."""
    keys = [k for k in keys if k in a.columns and k in b.columns]
    agg_a = a.groupby(keys + [metric], dropna=False)[value].mean().rename("a")
    agg_b = b.groupby(keys + [metric], dropna=False)[value].mean().rename("b")
    joined = pd.concat([agg_a, agg_b], axis=1)
    both = joined.dropna(how="any").reset_index()
    both["delta"] = both["b"] - both["a"]
    both["ratio"] = both["b"] / both["a"].replace(0, np.nan)
    ka = a[keys].drop_duplicates()
    kb = b[keys].drop_duplicates()
    m = ka.merge(kb, how="outer", indicator=True)
    unmatched = m[m["_merge"] != "both"].rename(columns={"_merge": "only_in"})
    unmatched["only_in"] = unmatched["only_in"].map({"left_only": "a", "right_only": "b"})
    return both, unmatched.reset_index(drop=True)


def comparable_metrics(source: str | Path) -> pd.DataFrame:
    """Tidy metrics of a run directory (ncu metrics plus bench latencies as metrics named
    'bench.<mode>.per_table_us') or of any .ncu-rep / ncu CSV file."""
    p = Path(source)
    if p.is_dir():
        run = load_run(p)
        frames = []
        m = run.metrics
        if not m.empty:
            frames.append(m[["variant", "dataset", "function", "metric", "unit", "value"]])
        b = run.bench
        if not b.empty:
            ok = b[b["status"] == "ok"]
            frames.append(pd.DataFrame({"variant": ok["variant"], "dataset": ok["dataset"], "function": "(bench)",
                                        "metric": "bench." + ok["mode"] + ".per_table_us", "unit": "us",
                                        "value": ok["per_table_us"]}))
        if not frames:
            raise RunDirError(f"{p} has neither ncu metrics nor timings to compare")
        return pd.concat(frames, ignore_index=True)
    df = read_any(p)
    return df[["variant", "dataset", "function", "metric", "unit", "value"]]


def compare_sources(a: str | Path, b: str | Path, metric_filter: str | None = None
                    ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`compare_runs` of two runs or reports on the metrics they share (those whose
    name contains `metric_filter`, if given), largest relative change first. Returns
    (shared, unmatched) as `compare_runs` documents them."""
    ma, mb = comparable_metrics(a), comparable_metrics(b)
    if metric_filter:
        ma = ma[ma["metric"].str.contains(metric_filter, regex=False)]
        mb = mb[mb["metric"].str.contains(metric_filter, regex=False)]
    both, unmatched = compare_runs(ma, mb)
    order = (both["ratio"] - 1).abs().sort_values(ascending=False, kind="stable").index
    return both.loc[order].reset_index(drop=True), unmatched
