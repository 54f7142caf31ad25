"""Analysis stage, Nsight Compute views: the first answers a performance engineer looks
for in a profile, derived from the raw metric names of a tidy metrics frame.

Why: a wide table of counters does not say whether a kernel is compute- or
memory-bound, at what share of peak, where its bytes go or which kernel's stalls
cost the most time. These functions compute, per kernel:

- speed of light: SM and memory throughput as % of peak, L1/L2/DRAM throughput and
  the bound they imply (`kernel_summary`);
- the memory chart: requests, sectors, bytes and hit rates from the SM through L1,
  L2 and DRAM, reads and writes apart, hit rates above 100% clamped with a flag and
  "no traffic" told apart from a 0% hit rate (`kernel_summary`);
- the roofline: achieved FLOP/s and bytes/s against the peaks ncu's roofline
  sections record, per precision and memory level (`roofline`);
- warp stalls weighted by the instructions each kernel issued, so the kernel that
  matters is not drowned by short ones (`weighted_stalls`).

Every metric is optional: older GPUs and smaller section sets lack some, and a
missing metric gives NaN (and is named by `missing_metrics`), never an error.
"""

from __future__ import annotations

import math
import re
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from characterize.extract.schema import STALL_REASONS, stall_metric

#: the kernel keys of a tidy frame and the per-kernel fields carried along
KERNEL_KEYS = ("run", "report", "kernel_id")
KERNEL_INFO = ("kernel_name", "function", "nvtx_range", "variant", "dataset", "table", "grid", "block", "device",
               "cache_control", "clock_control")

#: derived column -> raw metric names, first present wins (newer ncu spelling first)
RAW: dict[str, tuple[str, ...]] = {
    "duration_ns": ("gpu__time_duration.sum",),
    # speed of light
    "sm_throughput_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed",),
    "memory_throughput_pct": ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",),
    "l1_throughput_pct": ("l1tex__throughput.avg.pct_of_peak_sustained_active",),
    "l2_throughput_pct": ("lts__throughput.avg.pct_of_peak_sustained_elapsed",),
    "dram_throughput_pct": ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                            "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
    "achieved_occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active",),
    "theoretical_occupancy_pct": ("sm__maximum_warps_per_active_cycle_pct",),
    "registers_per_thread": ("launch__registers_per_thread",),
    "waves_per_sm": ("launch__waves_per_multiprocessor",),
    "inst_issued": ("smsp__inst_issued.sum",),
    # memory chart: SM -> L1/TEX
    "l1_load_requests": ("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",),
    "l1_store_requests": ("l1tex__t_requests_pipe_lsu_mem_global_op_st.sum",),
    "l1_load_sectors": ("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",),
    "l1_store_sectors": ("l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",),
    "l1_atomic_sectors": ("l1tex__t_sectors_pipe_lsu_mem_global_op_atom.sum",),
    "l1_reduction_sectors": ("l1tex__t_sectors_pipe_lsu_mem_global_op_red.sum",),
    "l1_local_load_sectors": ("l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum",),
    "l1_local_store_sectors": ("l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum",),
    "l1_shared_wavefronts": ("l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",),
    "l1_hit_rate_raw_pct": ("l1tex__t_sector_hit_rate.pct",),
    # L1/TEX <-> L2
    "l2_to_l1_bytes": ("l1tex__m_xbar2l1tex_read_bytes.sum",),
    "l1_to_l2_bytes": ("l1tex__m_l1tex2xbar_write_bytes.sum",),
    "l2_read_requests": ("lts__t_requests_srcunit_tex_op_read.sum",),
    "l2_write_requests": ("lts__t_requests_srcunit_tex_op_write.sum",),
    "l2_read_sectors": ("lts__t_sectors_srcunit_tex_op_read.sum",),
    "l2_write_sectors": ("lts__t_sectors_srcunit_tex_op_write.sum",),
    "l2_sectors": ("lts__t_sectors.sum",),
    "l2_hit_rate_raw_pct": ("lts__t_sector_hit_rate.pct",),
    # L2 <-> DRAM
    "dram_bytes_read": ("dram__bytes_read.sum",),
    "dram_bytes_write": ("dram__bytes_write.sum",),
    # roofline (SpeedOfLight_RooflineChart and the hierarchical roofline sections)
    "sm_clock_hz": ("sm__cycles_elapsed.avg.per_second", "gpc__cycles_elapsed.avg.per_second"),
    "dram_clock_hz": ("dram__cycles_elapsed.avg.per_second",),
    "dram_bytes_per_s": ("dram__bytes.sum.per_second",),
    "dram_peak_bytes_per_cycle": ("dram__bytes.sum.peak_sustained",),
    "l2_bytes_per_s": ("lts__t_bytes.sum.per_second",),
    "l2_peak_bytes_per_cycle": ("lts__t_bytes.sum.peak_sustained",),
    "l2_clock_hz": ("lts__cycles_elapsed.avg.per_second",),
    "l1_bytes_per_s": ("l1tex__t_bytes.sum.per_second",),
    "l1_peak_bytes_per_cycle": ("l1tex__t_bytes.sum.peak_sustained",),
    "l1_clock_hz": ("l1tex__cycles_elapsed.avg.per_second",),
    **{f"{op}_per_cycle": (f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum.per_cycle_elapsed",)
       for op in ("dadd", "dmul", "dfma", "fadd", "fmul", "ffma", "hadd", "hmul", "hfma")},
    **{f"{op}_peak_per_cycle": (f"sm__sass_thread_inst_executed_op_{op}_pred_on.sum.peak_sustained",)
       for op in ("dfma", "ffma", "hfma")},
    **{f"stall_{r}": (stall_metric(r),) for r in STALL_REASONS},
}

#: what a reader calls each derived column (for "not in this report" notes)
LABELS: dict[str, str] = {
    "duration_ns": "duration", "sm_throughput_pct": "SM throughput", "memory_throughput_pct": "memory throughput",
    "l1_throughput_pct": "L1/TEX throughput", "l2_throughput_pct": "L2 throughput",
    "dram_throughput_pct": "DRAM throughput", "inst_issued": "instructions issued",
    "l1_load_requests": "L1 load requests", "l1_load_sectors": "L1 load sectors",
    "l1_store_sectors": "L1 store sectors", "l1_hit_rate_raw_pct": "L1 hit rate",
    "l2_read_sectors": "L2 read sectors", "l2_write_sectors": "L2 write sectors",
    "l2_hit_rate_raw_pct": "L2 hit rate", "dram_bytes_read": "DRAM bytes read", "dram_bytes_write": "DRAM bytes written",
    "dram_bytes_per_s": "DRAM bandwidth (roofline)", "dram_peak_bytes_per_cycle": "DRAM peak (roofline)",
    "ffma_peak_per_cycle": "FP32 peak (roofline)", "dfma_peak_per_cycle": "FP64 peak (roofline)",
}

SOL_COLUMNS = ("sm_throughput_pct", "memory_throughput_pct", "l1_throughput_pct", "l2_throughput_pct",
               "dram_throughput_pct")
MEMORY_COLUMNS = ("l1_load_requests", "l1_load_sectors", "l1_store_sectors", "l1_hit_rate_raw_pct",
                  "l2_read_sectors", "l2_write_sectors", "l2_hit_rate_raw_pct", "dram_bytes_read", "dram_bytes_write")
ROOFLINE_COLUMNS = ("sm_clock_hz", "dram_bytes_per_s", "dram_peak_bytes_per_cycle", "dram_clock_hz")
#: the bandwidth roofline of a gather: achieved bytes per second of each level against its peak
BANDWIDTH_COLUMNS = ("dram_bytes_per_s", "dram_peak_bytes_per_cycle", "dram_clock_hz", "l2_bytes_per_s",
                     "l2_peak_bytes_per_cycle", "l2_clock_hz", "l1_bytes_per_s", "l1_peak_bytes_per_cycle",
                     "l1_clock_hz")
#: every column the report's Nsight Compute panels read: the default profile must collect each
#: (tests/measure/test_ncu.py holds measure.ncu's default set to it)
PANEL_COLUMNS = tuple(dict.fromkeys(
    ("duration_ns", "achieved_occupancy_pct", "theoretical_occupancy_pct", "registers_per_thread", "waves_per_sm",
     "inst_issued", "sm_clock_hz", *SOL_COLUMNS, *MEMORY_COLUMNS, *BANDWIDTH_COLUMNS,
     *(f"stall_{r}" for r in STALL_REASONS if r != "gmma"))))

#: a unit below this share of its peak is not what limits the kernel (ncu's SOLBottleneck rule uses 60%)
BOUND_PCT = 60.0
#: both units above BOUND_PCT and within this many points of each other: balanced
BALANCED_PCT = 10.0
SECTOR_BYTES = 32


# ------------------------------------------------------------------- kernels
def _present(metrics: pd.DataFrame) -> set[str]:
    return set(metrics["metric"].unique()) if not metrics.empty else set()


def _pivot(metrics: pd.DataFrame) -> pd.DataFrame:
    """One row per kernel: keys, info and the raw metrics of RAW (NaN when absent). A
    kernel is (run, report, kernel_id), and its point (variant, dataset) when the frame
    has one, so two points read from one report stay apart."""
    keys = [k for k in (*KERNEL_KEYS, "variant", "dataset") if k in metrics.columns]
    m = metrics.copy()
    for k in keys:
        if m[k].dtype == object:
            m[k] = m[k].fillna("")
    info = [c for c in KERNEL_INFO if c in m.columns and c not in keys]
    base = m.drop_duplicates(keys)[keys + info].reset_index(drop=True)
    wanted = {n for names in RAW.values() for n in names}
    sub = m.loc[m["metric"].isin(wanted), keys + ["metric", "value"]]
    if sub.empty:
        return base
    values = sub.groupby(keys + ["metric"], sort=False, dropna=False)["value"].first().unstack("metric")
    return base.merge(values, left_on=keys, right_index=True, how="left")


def _column(raw: pd.DataFrame, names: Sequence[str]) -> pd.Series:
    """The first of `names` that has a value, per row (NaN when none has)."""
    out = pd.Series(np.nan, index=raw.index, dtype="float64")
    for n in names:
        if n in raw.columns:
            out = out.fillna(pd.to_numeric(raw[n], errors="coerce"))
    return out


def _bound(sm: float, mem: float, l1: float, l2: float, dram: float) -> tuple[str, str]:
    """(bound, why) from the speed-of-light percentages, after ncu's SOLBottleneck rule."""
    if _nan(sm) and _nan(mem):
        return "unknown", "no speed-of-light metrics for this kernel"
    s, m = (0.0 if _nan(sm) else sm), (0.0 if _nan(mem) else mem)
    units = {"L1/TEX": l1, "L2": l2, "DRAM": dram}
    known = {k: v for k, v in units.items() if not _nan(v)}
    unit = max(known, key=known.get) if known else ""
    if max(s, m) < BOUND_PCT:
        return "latency", (f"neither the SMs ({s:.0f}%) nor memory ({m:.0f}%) reach {BOUND_PCT:.0f}% of peak: "
                           "warps wait (see the stalls) or the grid is too small")
    if s >= BOUND_PCT and m >= BOUND_PCT and abs(s - m) <= BALANCED_PCT:
        return "compute + memory", f"SMs at {s:.0f}% and memory at {m:.0f}% of peak"
    if s >= m:
        return "compute", f"SMs at {s:.0f}% of peak (memory {m:.0f}%)"
    return (f"memory ({unit})" if unit else "memory"), \
        f"memory at {m:.0f}% of peak" + (f", busiest unit {unit} at {known[unit]:.0f}%" if unit else "")


def _nan(x: object) -> bool:
    try:
        return x is None or (isinstance(x, float) and math.isnan(x)) or bool(pd.isna(x))
    except (TypeError, ValueError):
        return False


def _sum_present(df: pd.DataFrame, cols: Iterable[str]) -> pd.Series:
    """Row sums of the columns that exist, NaN where every one of them is NaN."""
    cols = [c for c in cols if c in df.columns]
    if not cols:
        return pd.Series(np.nan, index=df.index)
    return df[cols].sum(axis=1, min_count=1)


def kernel_summary(metrics: pd.DataFrame, share_within: Sequence[str] = ("run", "report")) -> pd.DataFrame:
    """One row per kernel with speed-of-light, memory-chart and stall columns (units in
    the names), its share of the total time within `share_within`, the bound and a
    distinct label. NaN where the report lacks a metric."""
    if metrics.empty or "metric" not in metrics.columns:
        return pd.DataFrame()
    raw = _pivot(metrics)
    keys = [k for k in KERNEL_KEYS if k in raw.columns]
    info = [c for c in KERNEL_INFO if c in raw.columns]
    out = raw[keys + info].copy()
    for col, names in RAW.items():
        if col.startswith("stall_") and not any(n in raw.columns for n in names):
            continue  # stall reasons this GPU does not have (gmma before Hopper)
        out[col] = _column(raw, names).to_numpy()
    group = [k for k in share_within if k in out.columns]
    total = out.groupby(group, dropna=False)["duration_ns"].transform("sum") if group else out["duration_ns"].sum()
    out["time_share_pct"] = np.where(total > 0, 100 * out["duration_ns"] / total, np.nan)
    # speed of light: memory throughput falls back to its busiest unit when the report lacks the summary
    mem_units = out[["l1_throughput_pct", "l2_throughput_pct", "dram_throughput_pct"]].max(axis=1, skipna=True)
    out["memory_throughput_pct"] = out["memory_throughput_pct"].fillna(mem_units)
    bounds = [_bound(*r) for r in out[list(SOL_COLUMNS)].itertuples(index=False, name=None)]
    out["bound"] = [b for b, _ in bounds]
    out["bound_why"] = [w for _, w in bounds]
    # memory chart: bytes, sectors per request, traffic, clamped hit rates
    out["l1_sectors"] = _sum_present(out, ("l1_load_sectors", "l1_store_sectors", "l1_atomic_sectors",
                                           "l1_reduction_sectors", "l1_local_load_sectors", "l1_local_store_sectors"))
    out["l1_load_bytes"] = out["l1_load_sectors"] * SECTOR_BYTES
    out["l1_store_bytes"] = out["l1_store_sectors"] * SECTOR_BYTES
    out["l1_sectors_per_load_request"] = out["l1_load_sectors"] / out["l1_load_requests"].where(
        out["l1_load_requests"] > 0)
    out["l1_spill_sectors"] = _sum_present(out, ("l1_local_load_sectors", "l1_local_store_sectors"))
    out["l2_read_bytes"] = out["l2_read_sectors"] * SECTOR_BYTES
    out["l2_write_bytes"] = out["l2_write_sectors"] * SECTOR_BYTES
    l2_total = out["l2_sectors"].fillna(_sum_present(out, ("l2_read_sectors", "l2_write_sectors")))
    for level, traffic in (("l1", out["l1_sectors"]), ("l2", l2_total)):
        rate = out[f"{level}_hit_rate_raw_pct"]
        out[f"{level}_traffic"] = np.where(traffic.isna(), None, traffic > 0)
        out[f"{level}_hit_rate_clamped"] = rate > 100
        out[f"{level}_hit_rate_pct"] = rate.clip(upper=100.0)
    out["dram_bytes"] = _sum_present(out, ("dram_bytes_read", "dram_bytes_write"))
    out["label"] = kernel_labels(out)
    out = out.reset_index(drop=True)
    out["kid"] = range(len(out))  # one key per kernel row, whatever identifies it upstream
    return out


def kernel_labels(k: pd.DataFrame, limit: int = 36) -> list[str]:
    """Labels that stay distinct: '#ID function', the function shortened in the middle,
    and '(i of n)' when one function was launched several times."""
    if k.empty:
        return []
    funcs = [str(f) if not _nan(f) and str(f) else str(n) for f, n in
             zip(k.get("function", pd.Series([""] * len(k))), k.get("kernel_name", pd.Series([""] * len(k))))]
    ids = k["kernel_id"].tolist() if "kernel_id" in k.columns else list(range(len(k)))
    scope = k["report"].astype(str).tolist() if "report" in k.columns else [""] * len(k)
    counts: dict[tuple[str, str], int] = {}
    for s, f in zip(scope, funcs):
        counts[(s, f)] = counts.get((s, f), 0) + 1
    seen: dict[tuple[str, str], int] = {}
    out = []
    for s, f, i in zip(scope, funcs, ids):
        seen[(s, f)] = seen.get((s, f), 0) + 1
        n = counts[(s, f)]
        tail = f" ({seen[(s, f)]} of {n})" if n > 1 else ""
        out.append(f"#{int(i)} {middle(f, limit - len(tail))}{tail}" if not _nan(i) else middle(f, limit) + tail)
    return out


def middle(text: str, limit: int) -> str:
    """Shorten in the middle, so both the start and the end of a long name stay readable."""
    t = " ".join(str(text).split())
    if len(t) <= limit or limit < 8:
        return t
    head = (limit - 1) * 3 // 5
    return t[:head] + "…" + t[len(t) - (limit - 1 - head):]


def missing_metrics(k: pd.DataFrame, columns: Iterable[str]) -> list[str]:
    """Labels of the derived columns no kernel of `k` has a value for."""
    out = []
    for c in columns:
        if c not in k.columns or k[c].isna().all():
            out.append(f"{LABELS.get(c, c)} ({RAW[c][0]})" if c in RAW else LABELS.get(c, c))
    return out


def without_data(k: pd.DataFrame) -> pd.DataFrame:
    """Kernels the report names but holds no values for (a failed or skipped profile)."""
    cols = [c for c in ("duration_ns", "sm_throughput_pct", "memory_throughput_pct", "inst_issued") if c in k.columns]
    return k[k[cols].isna().all(axis=1)] if cols else k.iloc[0:0]


def slowest(k: pd.DataFrame, n: int = 1) -> pd.DataFrame:
    """The `n` kernels with the longest duration (those without a duration last)."""
    if k.empty:
        return k
    return k.sort_values("duration_ns", ascending=False, na_position="last", kind="stable").head(n)


# ------------------------------------------------------------------ roofline
_PRECISIONS = {"FP64": ("dadd", "dmul", "dfma"), "FP32": ("fadd", "fmul", "ffma"), "FP16": ("hadd", "hmul", "hfma")}


def roofline(k: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(points, roofs) of a hierarchical roofline from ncu's roofline counters.

    points: one row per kernel x precision with FP work: achieved FLOP/s and, per
    memory level with a bandwidth counter, the arithmetic intensity (FLOP/byte).
    roofs: one row per kernel's device and ceiling (peak FLOP/s per precision, peak
    bytes/s per memory level). FLOP/s = (add + mul + 2 fma) thread instructions per
    cycle x SM clock, as ncu's SpeedOfLight_RooflineChart computes it.
    """
    pts, roofs = [], []
    if k.empty or "sm_clock_hz" not in k.columns:
        return pd.DataFrame(), pd.DataFrame()
    for r in k.to_dict("records"):
        clock = r.get("sm_clock_hz")
        if _nan(clock) or not clock:
            continue
        levels = {}
        for level in ("l1", "l2", "dram"):
            bw = r.get(f"{level}_bytes_per_s")
            peak, lclock = r.get(f"{level}_peak_bytes_per_cycle"), r.get(f"{level}_clock_hz")
            if not _nan(peak) and peak and not _nan(lclock) and lclock:
                roofs.append({"device": r.get("device", ""), "kind": "bandwidth", "name": level.upper() if level != "l1"
                              else "L1", "peak": float(peak) * float(lclock), "unit": "byte/s"})
            if not _nan(bw) and bw:
                levels[level] = float(bw)
        for prec, (add, mul, fma) in _PRECISIONS.items():
            peak = r.get(f"{fma}_peak_per_cycle")
            if not _nan(peak) and peak:
                roofs.append({"device": r.get("device", ""), "kind": "compute", "name": prec,
                              "peak": 2 * float(peak) * float(clock), "unit": "FLOP/s"})
            vals = [r.get(f"{op}_per_cycle") for op in (add, mul, fma)]
            if all(_nan(v) for v in vals):
                continue
            a, m, f = (0.0 if _nan(v) else float(v) for v in vals)
            flops = (a + m + 2 * f) * float(clock)
            if flops <= 0:
                continue
            row = {"kernel_id": r.get("kernel_id"), "label": r.get("label"), "report": r.get("report", ""),
                   "device": r.get("device", ""), "precision": prec, "flop_per_s": flops,
                   "peak_flop_per_s": 2 * float(peak) * float(clock) if not _nan(peak) and peak else np.nan}
            for level, bw in levels.items():
                row[f"{level}_intensity_flop_per_byte"] = flops / bw
                row[f"{level}_bytes_per_s"] = bw
            pts.append(row)
    roofs_df = pd.DataFrame(roofs)
    if not roofs_df.empty:
        roofs_df = roofs_df.groupby(["device", "kind", "name", "unit"], as_index=False)["peak"].median()
    return pd.DataFrame(pts), roofs_df


def has_roofline(k: pd.DataFrame) -> bool:
    """True when the kernels carry ncu's roofline counters (some FP work and a memory bandwidth)."""
    pts, roofs = roofline(k)
    return not pts.empty and not roofs.empty and any(c.endswith("_intensity_flop_per_byte") for c in pts.columns)


# -------------------------------------------------------------------- stalls
def stall_columns(k: pd.DataFrame) -> list[str]:
    return [c for c in k.columns if c.startswith("stall_")]


def weighted_stalls(k: pd.DataFrame, exclude: Sequence[str] = ("selected",)) -> pd.DataFrame:
    """Long table, one row per kernel x stall reason: cycles per issued instruction,
    warp-cycles stalled (x instructions issued, or x duration when the report has no
    instruction count: `weight` says which), the reason's share of the kernel's stall
    cycles and of every kernel's stall cycles together.

    `selected` (a warp issuing, not waiting) is left out by default.
    """
    cols = [c for c in stall_columns(k) if c.removeprefix("stall_") not in exclude]
    if k.empty or not cols:
        return pd.DataFrame()
    if "kid" not in k.columns:
        k = k.assign(kid=range(len(k)))
    ids = [c for c in ("kid", "run", "report", "kernel_id", "label", "duration_ns", "time_share_pct", "inst_issued",
                       "variant", "dataset") if c in k.columns]
    d = k[k[cols].notna().any(axis=1)]
    if d.empty:
        return pd.DataFrame()
    long = d.melt(id_vars=ids, value_vars=cols, var_name="reason", value_name="cycles_per_issue")
    long["reason"] = long["reason"].str.removeprefix("stall_")
    long["cycles_per_issue"] = long["cycles_per_issue"].fillna(0.0)
    inst = long["inst_issued"] if "inst_issued" in long.columns else pd.Series(np.nan, index=long.index)
    dur = long["duration_ns"] if "duration_ns" in long.columns else pd.Series(np.nan, index=long.index)
    by_inst = inst.notna() & (inst > 0)
    long["weight"] = np.where(by_inst, "instructions issued", np.where(dur.notna(), "duration", "none"))
    long["stall_cycles"] = np.where(by_inst, long["cycles_per_issue"] * inst,
                                    np.where(dur.notna(), long["cycles_per_issue"] * dur, long["cycles_per_issue"]))
    per_kernel = long.groupby("kid")["stall_cycles"].transform("sum")
    long["kernel_share_pct"] = np.where(per_kernel > 0, 100 * long["stall_cycles"] / per_kernel, np.nan)
    total = long["stall_cycles"].sum()
    long["total_share_pct"] = 100 * long["stall_cycles"] / total if total > 0 else np.nan
    return long


def top_reasons(long: pd.DataFrame, n: int = 8) -> list[str]:
    """Reasons ordered by their weighted stall cycles over all kernels (the ones that cost time)."""
    if long.empty:
        return []
    tot = long.groupby("reason")["stall_cycles"].sum().sort_values(ascending=False)
    return [r for r in tot.index if tot[r] > 0][:n]


def kernel_top_stalls(long: pd.DataFrame, n: int = 3) -> pd.DataFrame:
    """Per kernel (kid): its `n` largest reasons by its own cycles per issued instruction
    as (reason, cycles per issue, share of its stall cycles), its stall cycles and their
    share of every kernel's."""
    if long.empty:
        return pd.DataFrame()
    rows = []
    for kid, g in long.groupby("kid", sort=False):
        top = g[g["cycles_per_issue"] > 0].sort_values("cycles_per_issue", ascending=False).head(n)
        first = g.iloc[0]
        rows.append({"kid": kid, **{c: first[c] for c in ("run", "report", "kernel_id", "label") if c in g.columns},
                     "top_stalls": list(zip(top["reason"], top["cycles_per_issue"], top["kernel_share_pct"])),
                     "stall_cycles": float(g["stall_cycles"].sum()),
                     "total_share_pct": float(g["total_share_pct"].sum())})
    return pd.DataFrame(rows)


def reason_label(reason: str) -> str:
    return re.sub(r"_", " ", reason)


# ------------------------------------------------------------------- points
def per_point(k: pd.DataFrame, keys: Sequence[str] = ("variant", "dataset")) -> pd.DataFrame:
    """Kernels of a run averaged per point (one row per `keys`): means of the numeric
    columns (a mean launch), the bound recomputed from the means, traffic when any
    launch had some, a clamped flag when any was clamped; `kernels` counts the launches.
    Rows get a running kernel_id and a 'variant · dataset' label."""
    keys = [c for c in keys if c in k.columns]
    if k.empty or not keys:
        return pd.DataFrame()
    num = [c for c in k.columns if c not in keys and c not in (*KERNEL_KEYS, "kid")
           and pd.api.types.is_numeric_dtype(k[c])
           and not pd.api.types.is_bool_dtype(k[c])]
    g = k.groupby(keys, sort=False, dropna=False)
    out = g[num].mean().reset_index()
    out["kernels"] = g.size().to_numpy()
    for level in ("l1", "l2"):
        t = k[f"{level}_traffic"].map(lambda v: np.nan if v is None else float(bool(v)))
        out[f"{level}_traffic"] = [None if pd.isna(v) else bool(v) for v in t.groupby(
            [k[c] for c in keys], sort=False, dropna=False).max().to_numpy()]
        out[f"{level}_hit_rate_clamped"] = k[f"{level}_hit_rate_clamped"].fillna(False).astype(bool).groupby(
            [k[c] for c in keys], sort=False, dropna=False).any().to_numpy()
    bounds = [_bound(*r) for r in out[list(SOL_COLUMNS)].itertuples(index=False, name=None)]
    out["bound"] = [b for b, _ in bounds]
    out["bound_why"] = [w for _, w in bounds]
    out["kernel_id"] = range(len(out))
    out["kid"] = range(len(out))
    out["label"] = [" · ".join(str(r[c]) for c in keys) for r in out.to_dict("records")]
    return out
