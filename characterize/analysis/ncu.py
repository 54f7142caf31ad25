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
- the bandwidth roofline of a gather: achieved bytes/s of DRAM, L2 and L1, each against
  that level's own peak (`bandwidth`), so bytes an L1 or L2 hit served are never set
  against the DRAM peak;
- warp stalls weighted by the instructions each kernel issued (or its duration when the
  report lacks the count, the same weight for every kernel), so the kernel that matters
  is not drowned by short ones (`weighted_stalls`);
- per table: a batched kernel (one launch covers every table of a batch: tbe, fbgemm)
  has its times, bytes, instructions and stall cycles divided by its tables before it is
  set beside per-table kernels (`per_table`, the one place that does it);
- ncu's rule estimates capped by the headroom the speed of light leaves (`cap_speedups`).

Every metric is optional: older GPUs and smaller section sets lack some, and a
missing metric gives NaN (and is named by `missing_metrics`), never an error.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from characterize.errors import CharacterizeError
from characterize.extract.rules import rule_unit
from characterize.extract.schema import STALL_REASONS, stall_metric
from characterize.hardware.specs import gpu_spec
from characterize.kernels.registry import get_variant

#: the kernel keys of a tidy frame and the per-kernel fields carried along
KERNEL_KEYS = ("run", "report", "kernel_id")
KERNEL_INFO = ("kernel_name", "function", "nvtx_range", "variant", "dataset", "table", "grid", "block", "device",
               "cache_control", "clock_control", "tables_per_launch")

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
    # warp instructions executed (InstructionStats / WarpStateStats): the stall weight when a report
    # lacks the issued count (issued = executed + the rare replays)
    "inst_executed": ("smsp__inst_executed.sum", "inst_executed"),
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
    "l2_bytes": ("lts__t_bytes.sum",),
    # the L2's share of its sector peak (SpeedOfLight's breakdown): its peak bytes/s when the report
    # lacks lts__t_bytes.sum.peak_sustained
    "l2_sectors_pct": ("lts__t_sectors.sum.pct_of_peak_sustained_elapsed",
                       "lts__t_sectors.avg.pct_of_peak_sustained_elapsed"),
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
    "inst_executed": "instructions executed",
    "l1_load_requests": "L1 load requests", "l1_load_sectors": "L1 load sectors",
    "l1_store_sectors": "L1 store sectors", "l1_hit_rate_raw_pct": "L1 hit rate",
    "l2_read_sectors": "L2 read sectors", "l2_write_sectors": "L2 write sectors",
    "l2_hit_rate_raw_pct": "L2 hit rate", "dram_bytes_read": "DRAM bytes read", "dram_bytes_write": "DRAM bytes written",
    "dram_bytes_per_s": "DRAM bandwidth (roofline)", "dram_peak_bytes_per_cycle": "DRAM peak (roofline)",
    "ffma_peak_per_cycle": "FP32 peak (roofline)", "dfma_peak_per_cycle": "FP64 peak (roofline)",
    "l2_bytes": "L2 bytes", "l2_bytes_per_s": "L2 bandwidth", "l2_peak_bytes_per_cycle": "L2 peak",
    "l1_bytes_per_s": "L1 bandwidth", "l1_peak_bytes_per_cycle": "L1 peak", "waves_per_sm": "waves per SM",
}

SOL_COLUMNS = ("sm_throughput_pct", "memory_throughput_pct", "l1_throughput_pct", "l2_throughput_pct",
               "dram_throughput_pct")
MEMORY_COLUMNS = ("l1_load_requests", "l1_load_sectors", "l1_store_sectors", "l1_hit_rate_raw_pct",
                  "l2_read_sectors", "l2_write_sectors", "l2_hit_rate_raw_pct", "dram_bytes_read", "dram_bytes_write")
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


# ----------------------------------------------------------------- per table
#: per-launch quantities of kernel_summary: times, bytes, instructions, requests, sectors and
#: wavefronts. `per_table` divides them by the tables a launch covers; rates, shares of peak,
#: hit rates, occupancy, waves and cycles per issued instruction describe the launch as it ran
#: and stay as they are (a warp-stall share follows from the divided instructions or duration)
PER_LAUNCH = ("duration_ns", "inst_issued", "inst_executed", "l1_load_requests", "l1_store_requests", "l1_load_sectors",
              "l1_store_sectors", "l1_atomic_sectors", "l1_reduction_sectors", "l1_local_load_sectors",
              "l1_local_store_sectors", "l1_shared_wavefronts", "l2_to_l1_bytes", "l1_to_l2_bytes",
              "l2_read_requests", "l2_write_requests", "l2_read_sectors", "l2_write_sectors", "l2_sectors",
              "l2_bytes", "dram_bytes_read", "dram_bytes_write", "l1_sectors", "l1_load_bytes", "l1_store_bytes",
              "l1_spill_sectors", "l2_read_bytes", "l2_write_bytes", "dram_bytes")


def _batched(variant: object) -> bool:
    """Whether a variant's one launch covers every table of a batch (registry), False for a
    name the registry does not know (a user kernel, an imported report's NVTX range)."""
    try:
        return bool(variant) and get_variant(str(variant)).batched
    except CharacterizeError:
        return False


def _count(v: object) -> float | None:
    """A positive table count, or None."""
    try:
        n = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return n if math.isfinite(n) and n >= 1 else None


def launch_tables(k: pd.DataFrame, points: Iterable[dict] = (), tables: object = None) -> pd.Series:
    """How many tables each kernel row's launch covers.

    First what the row itself carries (`tables_per_launch`), then what its profile point
    recorded (the point's `tables_per_launch`, by variant and dataset), then, for a
    variant the registry calls batched (tbe, fbgemm), the workload's table count
    `tables` (the run experiment's T); 1 otherwise. A batched kernel of unknown T stays
    at 1: its values are then per launch, and `batched_unknown` names such kernels."""
    recorded: dict[tuple[str, str], float] = {}
    for p in points:
        n = _count(p.get("tables_per_launch"))
        if n:
            recorded[(str(p.get("variant", "")), str(p.get("dataset", "")))] = n
    t = _count(tables)
    own = k["tables_per_launch"] if "tables_per_launch" in k.columns else pd.Series(np.nan, index=k.index)
    variants = k["variant"] if "variant" in k.columns else pd.Series("", index=k.index)
    datasets = k["dataset"] if "dataset" in k.columns else pd.Series("", index=k.index)
    out = []
    for mine, v, d in zip(own, variants, datasets):
        v, d = ("" if _nan(v) else str(v)), ("" if _nan(d) else str(d))
        out.append(_count(mine) or recorded.get((v, d)) or (t if t and _batched(v) else None) or 1.0)
    return pd.Series(out, index=k.index, dtype="float64")


def batched_unknown(k: pd.DataFrame, points: Iterable[dict] = (), tables: object = None) -> list[str]:
    """Batched variants among `k` whose tables per launch nothing records (their values stay per launch)."""
    if k.empty or "variant" not in k.columns:
        return []
    n = launch_tables(k, points, tables)
    return sorted({str(v) for v, c in zip(k["variant"], n) if c == 1 and _batched(v)})


def per_table(k: pd.DataFrame, points: Iterable[dict] = (), tables: object = None) -> pd.DataFrame:
    """`k` (kernel_summary rows) with every per-launch quantity (PER_LAUNCH) divided by the
    tables its launch covers (`launch_tables`, kept in `tables_per_launch`).

    Why: one tbe launch gathers all T tables of a batch; beside a per-table kernel its
    duration, bytes and stall cycles are T times too large, and a stall share or a DRAM
    byte count compared per launch says the batched kernel costs more when it costs
    less. Every Nsight Compute panel reads its frames through here; apply it once."""
    if k.empty:
        return k
    n = launch_tables(k, points, tables)
    out = k.copy()
    for c in PER_LAUNCH:
        if c in out.columns:
            out[c] = pd.to_numeric(out[c], errors="coerce") / n
    out["tables_per_launch"] = n
    return out


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


#: a kernel "does FP work worth a roofline" when some precision reaches this share of its peak
#: FLOP/s: an embedding bag's adds (one per element gathered) stay far below it (H200: 0.7%)
FP_WORTH_PCT = 5.0


def fp_worth_roofline(k: pd.DataFrame) -> bool:
    """Whether any kernel's FP work comes near enough its peak for an FP roofline to say
    something (FP_WORTH_PCT); otherwise the bandwidth roofline is the one to read."""
    pts, _ = roofline(k)
    if pts.empty or "peak_flop_per_s" not in pts.columns:
        return False
    share = 100 * pts["flop_per_s"] / pts["peak_flop_per_s"]
    return bool((share >= FP_WORTH_PCT).any())


# ---------------------------------------------------------- bandwidth roofline
#: the memory levels of the bandwidth roofline, outermost first
LEVELS: dict[str, str] = {"dram": "DRAM", "l2": "L2", "l1": "L1"}


def copy_ceiling(device: object) -> tuple[float, str] | None:
    """(bytes/s, where it was measured) of a device's measured copy, or None where unknown."""
    if _nan(device) or not str(device).strip():
        return None
    try:
        spec = gpu_spec(str(device))
    except CharacterizeError:
        return None
    if not spec.copy_GBps:
        return None
    return spec.copy_GBps * 1e9, ("a 2 GiB device-to-device copy, bytes read + written / time (hardware.specs: "
                                  f"{spec.name}'s copy_GBps)")


def _positive(s: pd.Series) -> pd.Series:
    s = pd.to_numeric(s, errors="coerce")
    return s.where(s > 0)


def _get(k: pd.DataFrame, col: str) -> pd.Series:
    return _positive(k[col]) if col in k.columns else pd.Series(np.nan, index=k.index, dtype="float64")


def _level_rates(k: pd.DataFrame, level: str) -> tuple[pd.Series, pd.Series, pd.Series]:
    """(achieved bytes/s, peak bytes/s, where the peak came from) of one memory level per row.

    Achieved: ncu's bytes per second, else the level's bytes / duration. Peak: ncu's
    peak bytes per cycle x the level's clock, else the achieved rate / ncu's own % of
    peak for those bytes (gpu__dram_throughput for DRAM, lts__t_sectors for L2: the
    same ratio ncu computes, read backwards). L1 has no such share: without
    l1tex__t_bytes.sum.peak_sustained its peak is unknown."""
    seconds = _get(k, "duration_ns") / 1e9
    if level == "dram":
        amount, share = _get(k, "dram_bytes"), _get(k, "dram_throughput_pct")
    elif level == "l2":
        amount = _get(k, "l2_bytes").fillna(_get(k, "l2_sectors") * SECTOR_BYTES)
        share = _get(k, "l2_sectors_pct")
    else:
        amount, share = _get(k, "l1_sectors") * SECTOR_BYTES, pd.Series(np.nan, index=k.index)
    achieved = _get(k, f"{level}_bytes_per_s").fillna(amount / seconds)
    counted = _get(k, f"{level}_peak_bytes_per_cycle") * _get(k, f"{level}_clock_hz")
    derived = achieved / (share / 100)
    peak = counted.fillna(derived)
    source = pd.Series(np.where(counted.notna(), "peak counter", np.where(derived.notna(), "ncu's % of peak", "")),
                       index=k.index)
    return achieved, peak, source


def bandwidth(k: pd.DataFrame, device: object = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(points, roofs) of the bandwidth roofline of a gather.

    points: one row per kernel (or point) x memory level with bytes served: achieved
    bytes/s, that level's peak bytes/s for this kernel and the share of it. Each level
    is set against its own peak, never the DRAM one: bytes an L1 or L2 hit served
    did not cross the DRAM interface, so requested bytes / time can exceed the DRAM
    peak without beating anything. roofs: per device and level, the peak (median over
    its kernels; `source` says where it came from), plus the device's measured copy
    ceiling (`copy_ceiling`) as level 'DRAM copy' where known. `device` names the GPU
    when `k` has no device column (per_point keeps it)."""
    if k.empty:
        return pd.DataFrame(), pd.DataFrame()
    if "kid" not in k.columns:
        k = k.assign(kid=range(len(k)))
    devices = k["device"] if "device" in k.columns else pd.Series(device, index=k.index)
    devices = devices.where(devices.notna() & (devices.astype(str) != ""), device).fillna("")
    pts, roofs = [], []
    ids = pd.DataFrame({"kid": k["kid"], "kernel_id": k.get("kernel_id", pd.Series(np.nan, index=k.index)),
                        "label": k.get("label", pd.Series("", index=k.index)), "device": devices.astype(str)})
    for level, name in LEVELS.items():
        achieved, peak, source = _level_rates(k, level)
        has = achieved.notna()
        pts.append(ids[has].assign(level=name, bytes_per_s=achieved[has], peak_bytes_per_s=peak[has],
                                   pct_of_peak=100 * achieved[has] / peak[has], peak_from=source[has]))
        known = peak.notna()
        roofs.append(pd.DataFrame({"device": ids["device"][known], "level": name, "peak": peak[known],
                                   "source": source[known]}))
    points = pd.concat(pts, ignore_index=True)
    points = points if not points.empty else pd.DataFrame()
    roofs_df = pd.concat(roofs, ignore_index=True)
    if not roofs_df.empty:
        roofs_df = roofs_df.groupby(["device", "level"], as_index=False, sort=False).agg(
            peak=("peak", "median"), source=("source", lambda s: ", ".join(sorted(set(s)))))
    copies = [{"device": d, "level": "DRAM copy", "peak": c[0], "source": c[1]}
              for d in dict.fromkeys(devices.astype(str)) if (c := copy_ceiling(d))]
    if copies and not points.empty and (points["level"] == "DRAM").any():
        roofs_df = pd.concat([roofs_df, pd.DataFrame(copies)], ignore_index=True)
    return points, roofs_df


def has_bandwidth(k: pd.DataFrame) -> bool:
    """True when some kernel has a DRAM or L2 byte rate and that level's peak."""
    if k is None or k.empty:
        return False
    pts, _ = bandwidth(k)
    return not pts.empty and pts["peak_bytes_per_s"].notna().any()


# -------------------------------------------------------------------- stalls
def stall_columns(k: pd.DataFrame) -> list[str]:
    return [c for c in k.columns if c.startswith("stall_")]


#: stall weights, best first: (column, name)
_WEIGHTS = (("inst_issued", "instructions issued"), ("inst_executed", "instructions executed"),
            ("duration_ns", "duration"))


def stall_weight(k: pd.DataFrame) -> str:
    """What `weighted_stalls` weighs every kernel of `k` by: 'instructions issued' when each
    kernel with stall values has smsp__inst_issued.sum, else 'instructions executed', else
    'duration', else 'none'. One weight for all: shares mixing two weights compare nothing."""
    cols = stall_columns(k)
    d = k[k[cols].notna().any(axis=1)] if cols and not k.empty else k.iloc[0:0]
    if d.empty:
        return "none"
    for col, name in _WEIGHTS:
        if col in d.columns and (pd.to_numeric(d[col], errors="coerce") > 0).all():
            return name
    return "none"


#: how each weight turns cycles per issued instruction into stall time, for captions
WEIGHT_TEXT = {"instructions issued": "cycles per issued instruction x instructions issued (smsp__inst_issued.sum): "
                                      "warp-cycles stalled",
               "instructions executed": "cycles per issued instruction x warp instructions executed (these "
                                        "reports lack smsp__inst_issued.sum; issued = executed + rare replays): "
                                        "warp-cycles stalled",
               "duration": "cycles per issued instruction x duration (gpu__time_duration; these reports lack an "
                           "instruction count): stall time only as far as the kernels issue at like rates",
               "none": "cycles per issued instruction, unweighted (no instruction count or duration for every "
                       "kernel)"}


def weighted_stalls(k: pd.DataFrame, exclude: Sequence[str] = ("selected",)) -> pd.DataFrame:
    """Long table, one row per kernel x stall reason: cycles per issued instruction,
    warp-cycles stalled (x instructions issued, or x duration when some kernel has no
    instruction count, the same weight for all: `weight` says which, `stall_weight`),
    the reason's share of the kernel's stall cycles and of every kernel's together.

    `selected` (a warp issuing, not waiting) is left out by default. Give per-table
    rows (`per_table`) so that a batched kernel's share is not its T tables' share.
    """
    cols = [c for c in stall_columns(k) if c.removeprefix("stall_") not in exclude]
    if k.empty or not cols:
        return pd.DataFrame()
    if "kid" not in k.columns:
        k = k.assign(kid=range(len(k)))
    ids = [c for c in ("kid", "run", "report", "kernel_id", "label", "duration_ns", "time_share_pct", "inst_issued",
                       "inst_executed", "variant", "dataset") if c in k.columns]
    d = k[k[cols].notna().any(axis=1)]
    if d.empty:
        return pd.DataFrame()
    long = d.melt(id_vars=ids, value_vars=cols, var_name="reason", value_name="cycles_per_issue")
    long["reason"] = long["reason"].str.removeprefix("stall_")
    long["cycles_per_issue"] = long["cycles_per_issue"].fillna(0.0)
    weight = stall_weight(d)
    col = {name: c for c, name in _WEIGHTS}.get(weight)
    factor = pd.to_numeric(long[col], errors="coerce") if col else 1.0
    long["weight"] = weight
    long["stall_cycles"] = long["cycles_per_issue"] * factor
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


# ------------------------------------------------------------ rule estimates
#: the speed-of-light columns of each unit a rule can lean on (extract.rules.rule_unit)
_UNIT_SOL = {"memory": (("memory", "memory_throughput_pct"), ("L1/TEX", "l1_throughput_pct"),
                        ("L2", "l2_throughput_pct"), ("DRAM", "dram_throughput_pct")),
             "compute": (("SM", "sm_throughput_pct"),)}
_UNIT_SOL["any"] = _UNIT_SOL["compute"] + _UNIT_SOL["memory"]


def headroom(row: dict, unit: str) -> tuple[float, str]:
    """(busiest % of peak, its name) among the units `unit` covers, (NaN, '') when unknown."""
    vals = [(float(row[c]), name) for name, c in _UNIT_SOL.get(unit, ()) if c in row and not _nan(row[c])]
    return max(vals) if vals else (np.nan, "")


def cap_speedups(rules: pd.DataFrame, k: pd.DataFrame, on: Sequence[str] = ("report", "kernel_id")) -> pd.DataFrame:
    """`rules` (extract.rule_results) with each estimated speedup capped by the headroom its
    kernel's speed of light leaves on the units the rule leans on.

    Why: ncu estimates each rule alone. A kernel at x% of a unit's peak can run at most
    100/x times as fast (gain 100/x - 1) while that unit does the same work, so it can
    save at most 100 - x% of its time, the unit ncu's estimates are in (a share of the
    runtime; ncu's "Runtime Improvement" is duration x estimate). A 93% estimate for
    a kernel whose L2 already runs at 91% of peak is capped at 9%. Rules that cut work
    (access patterns, compression, instruction mix: rule_unit '') are not capped.

    Added columns: ncu_speedup (ncu's own estimate), speedup_cap (% of the time that
    can be saved), cap_why ('L2 at 91% of peak'), capped (the estimate exceeded the
    cap); estimated_speedup becomes the capped value. Rows are joined to `k` on `on`."""
    if rules.empty:
        return rules
    out = rules.copy()
    keys = [c for c in on if c in out.columns and c in k.columns]
    sol = {}
    if keys and not k.empty:
        cols = [c for c in SOL_COLUMNS if c in k.columns]
        for r in k[keys + cols].drop_duplicates(keys).to_dict("records"):
            sol[tuple(str(r[c]) for c in keys)] = r
    caps, whys = [], []
    for r in out.to_dict("records"):
        unit = rule_unit(r.get("section", ""), r.get("rule", ""), r.get("title", ""))
        row = sol.get(tuple(str(r[c]) for c in keys)) if keys else None
        pct, name = headroom(row, unit) if row and unit else (np.nan, "")
        caps.append(max(0.0, 100.0 - pct) if not _nan(pct) else np.nan)
        whys.append(f"{name} at {pct:.0f}% of peak" if name else "")
    est = pd.to_numeric(out["estimated_speedup"], errors="coerce")
    cap_s = pd.Series(caps, index=out.index, dtype="float64")
    out["ncu_speedup"] = est
    out["speedup_cap"] = cap_s
    out["cap_why"] = whys
    out["capped"] = (est > cap_s).fillna(False).astype(bool)
    out["estimated_speedup"] = est.where(~out["capped"], cap_s)
    return out


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
    if "device" in k.columns:   # the GPU a point ran on (its copy ceiling, its peaks)
        out["device"] = g["device"].first().to_numpy()
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
