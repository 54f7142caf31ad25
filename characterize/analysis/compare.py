"""Analysis stage, comparisons: derived metrics and comparisons over stored runs.

Every function takes tidy DataFrames (from store.Run) and returns tidy DataFrames,
with units in derived column names. Speedup confidence intervals use the delta
method on the two means' relative CIs (independent samples).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from characterize.analysis.ncu import kernel_summary
from characterize.errors import ConfigError, RunDirError, escape_text
from characterize.extract.read import read_any
from characterize.extract.schema import short_function_name
from characterize.store import Run, load_run
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


#: the SM clock a profiled kernel ran at (ncu's SpeedOfLight "SM Frequency", in every metric set), in Hz
SM_CLOCK_METRIC = "gpc__cycles_elapsed.avg.per_second"


def bench_vs_ncu(run: Run, mode: str = "steady") -> pd.DataFrame:
    """Bench's durations beside Nsight Compute's, per (variant, dataset, table) of a run
    that was benched and profiled. Columns: variant, dataset, table; bench_per_table_us
    (one event pair around the batch of T launches, / T), bench_per_launch_us (the
    per-launch diagnostic: one event pair around this table's launch, the launch
    front-end included); ncu_duration_us (gpu__time_duration of the table's lookup
    kernel, at the profile's clock policy); sm_frequency_MHz (ncu's SM clock for it);
    ncu_over_bench (x, ncu / bench per table). Empty when either side is missing."""
    points = [p for p in run.points("bench") if p.get("status") == "ok"]
    k = run.kernels
    if not points or k.empty or "duration_ns" not in k.columns:
        return pd.DataFrame()
    look = lookup_kernels(k)
    m = run.metrics
    clock = m[m["metric"] == SM_CLOCK_METRIC] if not m.empty and "metric" in m.columns else pd.DataFrame()
    rows = []
    for p in points:
        row = next((r for r in p.get("summary", []) if r.get("mode") == mode), None)
        if row is None:
            continue
        per_launch = (p.get("per_launch_table_us") or {}).get(mode) or []
        mine = look[(look["variant"] == p["variant"]) & (look["dataset"] == p["dataset"])]
        for t, g in mine.groupby("table"):
            ncu_us = float(g["duration_ns"].mean()) / 1e3
            mine_clock = clock[clock["kernel_id"].isin(g["kernel_id"])] if not clock.empty else clock
            freq = float(mine_clock["value"].mean()) / 1e6 if not mine_clock.empty else float("nan")
            rows.append({"variant": p["variant"], "dataset": p["dataset"], "table": int(t),
                         "bench_per_table_us": row["per_table_us"],
                         "bench_per_launch_us": per_launch[int(t)] if int(t) < len(per_launch) else float("nan"),
                         "ncu_duration_us": ncu_us, "sm_frequency_MHz": freq,
                         "ncu_over_bench": ncu_us / row["per_table_us"] if row["per_table_us"] else float("nan")})
    return pd.DataFrame(rows)


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


# ------------------------------------------------------------ kernel matching
MATCH_EXACT = "name + launch order"
MATCH_MANUAL = "manual (--pair)"
MATCH_SIMILAR = "similar name + launch order"

_TRAILING = re.compile(r"(?:[_\-.]?v?\d+)+$", re.IGNORECASE)


def similar_name(name: str) -> str:
    """A kernel's base name without trailing version digits and case (nodeByPoint5 ->
    nodebypoint), for pairing kernels an application renamed between two reports."""
    n = short_function_name(str(name or ""))
    return _TRAILING.sub("", n).lower() or n.lower()


def parse_pairs(pairs: Iterable[str] | Mapping[str, str] | None) -> list[tuple[str, str]]:
    """`A=B` strings (or a mapping) as (a, b) name pairs; refuses anything else."""
    if not pairs:
        return []
    if isinstance(pairs, Mapping):
        return [(str(a), str(b)) for a, b in pairs.items()]
    out = []
    for p in pairs:
        if isinstance(p, tuple):
            out.append((str(p[0]), str(p[1])))
            continue
        a, sep, b = str(p).partition("=")
        if not sep or not a.strip() or not b.strip():
            raise ConfigError(f"--pair {p!r}: give KERNEL_A=KERNEL_B (function names, demangled names, or #ID)")
        out.append((a.strip(), b.strip()))
    return out


def _matches(k: pd.DataFrame, name: str) -> pd.Series:
    """Kernels of `k` that `name` designates: '#3' / '3' (kernel ID), a function name, or a demangled name."""
    n = name.strip()
    ids = k["kernel_id"] if "kernel_id" in k.columns else pd.Series(-1, index=k.index)
    if re.fullmatch(r"#?\d+", n):
        return ids.astype("Int64") == int(n.lstrip("#"))
    func = k["function"].astype(str) if "function" in k.columns else pd.Series("", index=k.index)
    full = k["kernel_name"].astype(str) if "kernel_name" in k.columns else pd.Series("", index=k.index)
    return (func == n) | (full == n) | (func.map(short_function_name) == short_function_name(n))


def check_pairs(pairs: Iterable[str] | Mapping[str, str] | None, a: Sequence[pd.DataFrame],
                b: Sequence[pd.DataFrame], a_name: str = "the first source", b_name: str = "the other sources") -> None:
    """ConfigError for a --pair A=B whose A designates no kernel of `a` (one-row-per-kernel
    frames) or whose B none of `b`: a pair that matches nothing would be silently ignored."""
    for x, y in parse_pairs(pairs):
        for name, frames, where in ((x, a, a_name), (y, b, b_name)):
            if not any(not f.empty and _matches(f, name).any() for f in frames):
                have = sorted({str(v) for f in frames if not f.empty and "function" in f.columns
                               for v in f["function"].dropna()})
                listed = ", ".join(escape_text(h) for h in have[:8]) + (" ..." if len(have) > 8 else "")
                raise ConfigError(f"--pair {escape_text(x)}={escape_text(y)}: no kernel of {escape_text(where)} is "
                                  f"{escape_text(name)!r} (its kernels: {listed or 'none profiled'}); name a kernel by "
                                  "function name, demangled name or #ID")


def match_kernels(a: pd.DataFrame, b: pd.DataFrame, keys: Sequence[str] = (),
                  pairs: Iterable[str] | Mapping[str, str] | None = None) -> pd.DataFrame:
    """Pair the kernels of two one-row-per-kernel frames.

    Within each group of `keys` (e.g. variant, dataset for two runs): first the manual
    `pairs` (A=B), then the same demangled base name, then a similar name (trailing
    version digits dropped: nodeByPoint5 ~ nodeByPoint); inside each name the i-th
    launch of A pairs with the i-th of B. Returns one row per pair or leftover kernel:
    a_index / b_index (row labels of `a` / `b`, <NA> on the side that lacks it),
    `match` (how it was paired, or 'only in a' / 'only in b') and the keys.
    """
    keys = [k for k in keys if k in a.columns and k in b.columns]
    manual = parse_pairs(pairs)
    a_left = a.sort_values([c for c in ("report", "kernel_id") if c in a.columns], kind="stable")
    b_left = b.sort_values([c for c in ("report", "kernel_id") if c in b.columns], kind="stable")
    rows: list[dict] = []

    def pair_up(ga: pd.DataFrame, gb: pd.DataFrame, how: str, key_vals: dict) -> None:
        for ia, ib in zip(ga.index, gb.index):
            rows.append({**key_vals, "a_index": ia, "b_index": ib, "match": how})

    def groups(df: pd.DataFrame) -> dict[tuple, pd.DataFrame]:
        if not keys:
            return {(): df}
        return {(k if isinstance(k, tuple) else (k,)): g for k, g in df.groupby(keys, sort=False, dropna=False)}

    ga_all, gb_all = groups(a_left), groups(b_left)
    for key in list(dict.fromkeys(list(ga_all) + list(gb_all))):
        ga = ga_all.get(key, a_left.iloc[0:0])
        gb = gb_all.get(key, b_left.iloc[0:0])
        kv = dict(zip(keys, key))
        used_a: set = set()
        used_b: set = set()
        for x, y in manual:
            sa = ga[_matches(ga, x) & ~ga.index.isin(used_a)]
            sb = gb[_matches(gb, y) & ~gb.index.isin(used_b)]
            pair_up(sa, sb, MATCH_MANUAL, kv)
            used_a |= set(sa.index[:len(sb)])
            used_b |= set(sb.index[:len(sa)])
        for how, name in ((MATCH_EXACT, lambda s: s), (MATCH_SIMILAR, similar_name)):
            ra, rb = ga[~ga.index.isin(used_a)], gb[~gb.index.isin(used_b)]
            if ra.empty or rb.empty:
                break
            na = ra["function"].astype(str).map(name) if "function" in ra.columns else pd.Series("", index=ra.index)
            nb = rb["function"].astype(str).map(name) if "function" in rb.columns else pd.Series("", index=rb.index)
            for n in dict.fromkeys(na):
                sa, sb = ra[na == n], rb[nb == n]
                if sb.empty:
                    continue
                pair_up(sa, sb, how, kv)
                used_a |= set(sa.index[:len(sb)])
                used_b |= set(sb.index[:len(sa)])
        for i in ga.index[~ga.index.isin(used_a)]:
            rows.append({**kv, "a_index": i, "b_index": pd.NA, "match": "only in a"})
        for i in gb.index[~gb.index.isin(used_b)]:
            rows.append({**kv, "a_index": pd.NA, "b_index": i, "match": "only in b"})
    out = pd.DataFrame(rows, columns=[*keys, "a_index", "b_index", "match"])
    out["a_index"] = out["a_index"].astype("Int64")
    out["b_index"] = out["b_index"].astype("Int64")
    return out


#: per-kernel columns compared between two sources, in reading order
KERNEL_DELTA_COLUMNS: tuple[str, ...] = (
    "duration_ns", "time_share_pct", "sm_throughput_pct", "memory_throughput_pct", "l1_throughput_pct",
    "l2_throughput_pct", "dram_throughput_pct", "achieved_occupancy_pct", "registers_per_thread",
    "l1_hit_rate_pct", "l2_hit_rate_pct", "dram_bytes_read", "dram_bytes_write", "inst_issued",
    "stall_long_scoreboard", "stall_barrier", "stall_wait", "stall_not_selected", "stall_math_pipe_throttle",
)


def kernel_deltas(a: pd.DataFrame, b: pd.DataFrame, matched: pd.DataFrame,
                  columns: Sequence[str] = KERNEL_DELTA_COLUMNS) -> pd.DataFrame:
    """Long table over matched kernel pairs: metric, a, b, delta (b - a) and delta_pct.
    Single profiles carry no confidence interval, so `significant` is left empty."""
    rows = []
    pairs = matched[matched["a_index"].notna() & matched["b_index"].notna()]
    keys = [c for c in matched.columns if c not in ("a_index", "b_index", "match")]
    for pair_no, m in enumerate(pairs.to_dict("records")):
        ra, rb = a.loc[m["a_index"]], b.loc[m["b_index"]]
        for c in columns:
            if c not in a.columns or c not in b.columns:
                continue
            va, vb = ra.get(c), rb.get(c)
            if pd.isna(va) and pd.isna(vb):
                continue
            va, vb = float(va) if pd.notna(va) else np.nan, float(vb) if pd.notna(vb) else np.nan
            rows.append({**{k: m[k] for k in keys}, "pair": pair_no, "match": m["match"],
                         "a_kernel": ra.get("label", ra.get("function")), "b_kernel": rb.get("label", rb.get("function")),
                         "metric": c, "a": va, "b": vb, "delta": vb - va,
                         "delta_pct": 100 * (vb - va) / abs(va) if va else np.nan})
    return pd.DataFrame(rows)


# ------------------------------------------------------------- table diffs
def significant(delta: float, ci_a: float, ci_b: float) -> bool | None:
    """Whether a difference of two independent means exceeds its 95% CI (None without CIs)."""
    if any(pd.isna(x) for x in (delta, ci_a, ci_b)) or math.isinf(ci_a) or math.isinf(ci_b):
        return None
    return bool(abs(delta) > math.hypot(ci_a, ci_b))


def diff_bench(a: pd.DataFrame, b: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Timed points of two runs joined on (variant, dataset, mode): per-table latency on
    both sides with CIs, delta (µs, %) and whether it is significant (95%)."""
    def ok(d: pd.DataFrame) -> pd.DataFrame:
        if d.empty or "status" not in d.columns:
            return pd.DataFrame(columns=["variant", "dataset", "mode", "per_table_us", "ci95_us"])
        d = d[d["status"] == "ok"]
        return d[[c for c in ("variant", "dataset", "mode", "per_table_us", "ci95_us") if c in d.columns]]

    keys = ["variant", "dataset", "mode"]
    m = ok(a).merge(ok(b), on=keys, how="outer", suffixes=("_a", "_b"), indicator=True)
    both = m[m["_merge"] == "both"].drop(columns="_merge").reset_index(drop=True)
    both["delta_us"] = both["per_table_us_b"] - both["per_table_us_a"]
    both["delta_pct"] = 100 * both["delta_us"] / both["per_table_us_a"]
    both["significant"] = [significant(d, x, y) for d, x, y in
                           zip(both["delta_us"], both.get("ci95_us_a", np.nan), both.get("ci95_us_b", np.nan))]
    un = m[m["_merge"] != "both"][keys + ["_merge"]].rename(columns={"_merge": "only_in"})
    un["only_in"] = un["only_in"].map({"left_only": "a", "right_only": "b"})
    return both, un.reset_index(drop=True)


STATIC_KEYS = ("variant", "arch", "role", "maxrregcount", "sweep")
STATIC_VALUES = ("kernel", "registers", "spill_stores", "spill_loads", "stack_frame", "shared_mem", "blocks_per_sm",
                 "theoretical_occupancy_pct", "limiter")


def _table_diff(a: pd.DataFrame, b: pd.DataFrame, keys: Sequence[str], values: Sequence[str]
                ) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """(rows whose values differ: key, column, a, b; rows on one side only; rows unchanged)."""
    keys = [k for k in keys if k in a.columns and k in b.columns]
    values = [v for v in values if v in a.columns and v in b.columns]
    if a.empty or b.empty or not keys:
        return pd.DataFrame(), pd.DataFrame(), 0

    def norm(d: pd.DataFrame) -> pd.DataFrame:
        d = d[keys + values].copy()
        for k in keys:
            d[k] = d[k].astype(str).str.lower().replace({"nan": "", "none": "", "1.0": "1", "0.0": "0"})
            d[k] = d[k].str.replace(r"\.0$", "", regex=True)
        return d.drop_duplicates(keys)

    m = norm(a).merge(norm(b), on=keys, how="outer", suffixes=("_a", "_b"), indicator=True)
    both = m[m["_merge"] == "both"]
    changed, same = [], 0
    for r in both.to_dict("records"):
        diffs = [(v, r[f"{v}_a"], r[f"{v}_b"]) for v in values if not _same(r[f"{v}_a"], r[f"{v}_b"])]
        if not diffs:
            same += 1
        for v, x, y in diffs:
            changed.append({**{k: r[k] for k in keys}, "column": v, "a": x, "b": y,
                            "delta": (y - x) if _numeric(x) and _numeric(y) else np.nan})
    un = m[m["_merge"] != "both"][keys + ["_merge"]].rename(columns={"_merge": "only_in"})
    un["only_in"] = un["only_in"].map({"left_only": "a", "right_only": "b"})
    return pd.DataFrame(changed), un.reset_index(drop=True), same


def _numeric(x: object) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) and not pd.isna(x)


def _same(x: object, y: object) -> bool:
    if pd.isna(x) and pd.isna(y):
        return True
    if _numeric(x) and _numeric(y):
        return math.isclose(float(x), float(y), rel_tol=1e-9, abs_tol=1e-12)
    return str(x) == str(y)


def diff_static(a: pd.DataFrame, b: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """Static characterizations of two runs (two commits, two compilers): per (variant,
    arch, role, cap, sweep) the columns that changed, rows on one side only, rows unchanged."""
    return _table_diff(a, b, STATIC_KEYS, STATIC_VALUES)


SASS_KEYS = ("variant", "arch", "role", "kernel")
SASS_VALUES = ("instructions", "row_loads", "index_loads", "load_bits", "local_mem_ops", "latencies_per_iteration",
               "rows_in_flight", "bytes_in_flight_per_warp")


def diff_sass(a: pd.DataFrame, b: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """SASS hot-loop tables of two runs: the columns that changed per (variant, arch, role, kernel)."""
    return _table_diff(a, b, SASS_KEYS, SASS_VALUES)


#: a prediction is one variant x dataset x GPU x mode at one precision (and, for the
#: cache variant, one cache size)
PREDICTION_KEYS = ("variant", "dtype", "dataset", "gpu", "mode", "cache_ratio")


def diff_predictions(a: pd.DataFrame, b: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Model predictions of two runs joined on PREDICTION_KEYS: predicted
    time on both sides, delta (µs, %), and whether the change leaves the model's band
    (`outside_band`: b's time outside a's [time_us_low, time_us_high] or the reverse;
    None when either side has no band)."""
    keys = [k for k in PREDICTION_KEYS if k in a.columns and k in b.columns]
    if a.empty or b.empty or "time_us" not in a.columns or "time_us" not in b.columns or not keys:
        return pd.DataFrame(), pd.DataFrame()
    vals = [c for c in ("time_us", "time_us_low", "time_us_high", "speedup_vs_base", "l2_hit_rate_pct", "dram_bytes",
                        "bound", "loads_in_flight") if c in a.columns or c in b.columns]
    aa = a.reindex(columns=keys + vals).drop_duplicates(keys)
    bb = b.reindex(columns=keys + vals).drop_duplicates(keys)
    m = aa.merge(bb, on=keys, how="outer", suffixes=("_a", "_b"), indicator=True)
    both = m[m["_merge"] == "both"].drop(columns="_merge").reset_index(drop=True)
    both["delta_us"] = both["time_us_b"] - both["time_us_a"]
    both["delta_pct"] = 100 * both["delta_us"] / both["time_us_a"]

    def outside(r: dict) -> bool | None:
        bands = [r.get(c) for c in ("time_us_low_a", "time_us_high_a", "time_us_low_b", "time_us_high_b")]
        if any(pd.isna(x) for x in bands):
            return None
        lo_a, hi_a, lo_b, hi_b = (float(x) for x in bands)
        return bool(not (lo_a <= r["time_us_b"] <= hi_a) or not (lo_b <= r["time_us_a"] <= hi_b))
    both["outside_band"] = [outside(r) for r in both.to_dict("records")]
    un = m[m["_merge"] != "both"][keys + ["_merge"]].rename(columns={"_merge": "only_in"})
    un["only_in"] = un["only_in"].map({"left_only": "a", "right_only": "b"})
    return both, un.reset_index(drop=True)


# -------------------------------------------------------------- two sources
def _sass_of(run: Run) -> pd.DataFrame:
    """The run's SASS hot-loop table."""
    return run.sass


def _open(source: str | Path) -> tuple[Run | None, pd.DataFrame]:
    """(the run or None, tidy ncu metrics) of a run directory or report file."""
    p = Path(source)
    if p.is_dir():
        run = load_run(p)
        return run, run.metrics
    return None, read_any(p, run=p.stem)


def comparable_metrics(source: str | Path) -> pd.DataFrame:
    """Tidy metrics of a run directory (ncu metrics plus bench latencies as metrics named
    'bench.<mode>.per_table_us') or of any .ncu-rep / ncu CSV file."""
    run, m = _open(source)
    frames = []
    if not m.empty:
        frames.append(m)
    if run is not None and not run.bench.empty:
        ok = run.bench[run.bench["status"] == "ok"]
        frames.append(pd.DataFrame({"variant": ok["variant"], "dataset": ok["dataset"], "function": "(bench)",
                                    "kernel_id": -1, "metric": "bench." + ok["mode"] + ".per_table_us", "unit": "us",
                                    "value": ok["per_table_us"]}))
    if not frames:
        return pd.DataFrame(columns=["variant", "dataset", "function", "kernel_id", "metric", "unit", "value"])
    return pd.concat(frames, ignore_index=True)


def _point_keys(ka: pd.DataFrame, kb: pd.DataFrame) -> list[str]:
    """variant/dataset when both sides carry them (two runs), else none (any report)."""
    def labelled(k: pd.DataFrame, c: str) -> bool:
        return c in k.columns and k[c].fillna("").astype(str).ne("").any()
    return [c for c in ("variant", "dataset") if labelled(ka, c) and labelled(kb, c)]


def compare_sources(a: str | Path, b: str | Path, metric_filter: str | None = None,
                    pairs: Iterable[str] | Mapping[str, str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Metric-by-metric comparison of the kernels two runs or reports share, largest
    relative change first. Kernels are paired by `match_kernels` (base name and launch
    order, `pairs`, similar names). Returns (shared: one row per kernel pair x raw
    metric with a, b, delta, ratio; unmatched kernels)."""
    ma, mb = comparable_metrics(a), comparable_metrics(b)
    if metric_filter:
        ma = ma[ma["metric"].str.contains(metric_filter, regex=False)]
        mb = mb[mb["metric"].str.contains(metric_filter, regex=False)]
    kcols = [c for c in ("variant", "dataset", "report", "kernel_id", "function", "kernel_name")]
    ka = ma.reindex(columns=kcols).drop_duplicates(["variant", "dataset", "report", "kernel_id", "function"])
    kb = mb.reindex(columns=kcols).drop_duplicates(["variant", "dataset", "report", "kernel_id", "function"])
    ka, kb = ka.reset_index(drop=True), kb.reset_index(drop=True)
    keys = _point_keys(ka, kb)
    matched = match_kernels(ka, kb, keys, pairs)
    frames = []
    ident = ["report", "kernel_id", "function"]
    for m in matched[matched["a_index"].notna() & matched["b_index"].notna()].to_dict("records"):
        ra, rb = ka.loc[m["a_index"]], kb.loc[m["b_index"]]
        sa = _rows(ma, ra, ident + keys)[["metric", "value"]].groupby("metric")["value"].mean().rename("a")
        sb = _rows(mb, rb, ident + keys)[["metric", "value"]].groupby("metric")["value"].mean().rename("b")
        j = pd.concat([sa, sb], axis=1).dropna(how="any").reset_index()
        for k in keys:
            j.insert(0, k, m[k])
        j.insert(len(keys), "function", ra["function"] if ra["function"] == rb["function"]
                 else f"{ra['function']} ~ {rb['function']}")
        j.insert(len(keys) + 1, "a_kernel", ra["kernel_id"])
        j.insert(len(keys) + 2, "b_kernel", rb["kernel_id"])
        j.insert(len(keys) + 3, "match", m["match"])
        frames.append(j)
    both = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=[*keys, "function", "a_kernel", "b_kernel", "match", "metric", "a", "b"])
    both["delta"] = both["b"] - both["a"]
    both["ratio"] = both["b"] / both["a"].replace(0, np.nan)
    order = (both["ratio"] - 1).abs().sort_values(ascending=False, kind="stable").index
    un = matched[matched["a_index"].isna() | matched["b_index"].isna()]
    unmatched = pd.DataFrame([{**{k: r[k] for k in keys},
                               **({"function": ka.loc[r["a_index"], "function"], "kernel_id": ka.loc[r["a_index"],
                                                                                                   "kernel_id"]}
                                  if pd.notna(r["a_index"]) else
                                  {"function": kb.loc[r["b_index"], "function"],
                                   "kernel_id": kb.loc[r["b_index"], "kernel_id"]}),
                               "only_in": "a" if pd.notna(r["a_index"]) else "b"} for r in un.to_dict("records")])
    return both.loc[order].reset_index(drop=True), unmatched


def _rows(m: pd.DataFrame, r: pd.Series, cols: Sequence[str]) -> pd.DataFrame:
    mask = pd.Series(True, index=m.index)
    for c in cols:
        if c in m.columns:
            v = r.get(c)
            mask &= (m[c] == v) | (m[c].isna() & pd.isna(v))
    return m[mask]


def compare_all(a: str | Path, b: str | Path, pairs: Iterable[str] | Mapping[str, str] | None = None
                ) -> dict[str, pd.DataFrame]:
    """Everything two sources (runs or reports) can be compared on, as named frames:
    kernels (key per-kernel metrics of matched kernels), unmatched_kernels, bench,
    unmatched_points, static, static_unmatched, predictions, predictions_unmatched,
    sass, sass_unmatched. Raises RunDirError when the two share nothing comparable."""
    run_a, ma = _open(a)
    run_b, mb = _open(b)
    out: dict[str, pd.DataFrame] = {}
    ka, kb = kernel_summary(ma), kernel_summary(mb)
    check_pairs(pairs, [ka], [kb], str(a), str(b))
    if not ka.empty and not kb.empty:
        keys = _point_keys(ka, kb)
        matched = match_kernels(ka, kb, keys, pairs)
        out["kernels"] = kernel_deltas(ka, kb, matched)
        un = matched[matched["a_index"].isna() | matched["b_index"].isna()]
        out["unmatched_kernels"] = pd.DataFrame(
            [{**{k: r[k] for k in keys}, "kernel": (ka.loc[r["a_index"], "label"] if pd.notna(r["a_index"])
                                                    else kb.loc[r["b_index"], "label"]), "only_in": r["match"][-1]}
             for r in un.to_dict("records")])
    if run_a is not None and run_b is not None:
        out["bench"], out["unmatched_points"] = diff_bench(run_a.bench, run_b.bench)
        out["static"], out["static_unmatched"], same = diff_static(run_a.static, run_b.static)
        out["static_unchanged"] = pd.DataFrame({"rows": [same]})
        out["predictions"], out["predictions_unmatched"] = diff_predictions(run_a.predictions, run_b.predictions)
        out["sass"], out["sass_unmatched"], same = diff_sass(_sass_of(run_a), _sass_of(run_b))
        out["sass_unchanged"] = pd.DataFrame({"rows": [same]})
    compared = [k for k in ("kernels", "unmatched_kernels", "bench", "predictions")
                if not out.get(k, pd.DataFrame()).empty]
    compared += [k for k in ("static", "sass") if not out.get(k, pd.DataFrame()).empty
                 or int(out.get(f"{k}_unchanged", pd.DataFrame({"rows": [0]}))["rows"].iloc[0]) > 0]
    if not compared:
        raise RunDirError(f"{a} and {b} hold nothing to compare: no profiled kernel on either side, and no "
                          "timed point, static row, SASS row or prediction on both sides")
    return out
