"""Report stage, shared Nsight Compute views: blocks that the run and the imported-report
panels both show (the first answer, memory-chart columns, time-weighted stalls), kept
here so the panel modules stay independent of each other.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from characterize.analysis import ncu
from characterize.report.blocks import (
    column_cell,
    fmt_num,
    hit_cell,
    is_na,
)
from characterize.units import format_bytes


def stall_text(tops: Any) -> str:
    if not isinstance(tops, list) or not tops:
        return "–"
    return "; ".join(f"{r.replace('_', ' ')} {c:.2f} ({share:.0f}%)" for r, c, share in tops)


def first_answer(k: pd.DataFrame, stalls: dict[Any, Any]) -> str:
    """One sentence on the kernel that matters: its share of time, bound and top stall."""
    top = ncu.slowest(k[k["duration_ns"].notna()]) if "duration_ns" in k.columns else k.iloc[0:0]
    if top.empty:
        return ""
    r = top.iloc[0].to_dict()
    text = f"The kernel that matters is {r['label']}: {fmt_num(r['duration_ns'] / 1e3)} µs, " \
           f"{r['time_share_pct']:.1f}% of the profiled time. "
    if r.get("bound") and r["bound"] != "unknown":
        text += f"It is {r['bound']}-bound: {r['bound_why']}. "
    tops = stalls.get(r["kernel_id"])
    if tops:
        reason, cyc, share = tops[0]
        text += f"Its warps stall most on {reason.replace('_', ' ')} ({cyc:.2f} cycles per issued instruction, " \
                f"{share:.0f}% of its stall cycles). "
    reads, writes = r.get("dram_bytes_read"), r.get("dram_bytes_write")
    if not is_na(reads) or not is_na(writes):
        text += f"DRAM: {format_bytes(reads)} read, {format_bytes(writes)} written."
    return text.strip()


def memory_spec() -> list[tuple[str, Any]]:
    """The memory-chart columns as table columns (shared by the memory panel's table)."""
    return [("L1 load requests", column_cell("l1_load_requests")),
            ("sectors / request", column_cell("l1_sectors_per_load_request")),
            ("L1 hit", lambda r: hit_cell(r, "l1")),
            ("L1 store sectors", column_cell("l1_store_sectors")),
            ("L2 read (from L1)", column_cell("l2_read_bytes", format_bytes)),
            ("L2 write (from L1)", column_cell("l2_write_bytes", format_bytes)),
            ("L2 hit", lambda r: hit_cell(r, "l2")),
            ("DRAM read", column_cell("dram_bytes_read", format_bytes)),
            ("DRAM written", column_cell("dram_bytes_write", format_bytes)),
            ("spill sectors (local)", column_cell("l1_spill_sectors"))]


def prediction_gpus(s: Any, p: pd.DataFrame) -> list[str]:
    """GPUs of the predictions `p`, the run's own first (model and host panels)."""
    gpus = list(dict.fromkeys(p["gpu"].astype(str))) if "gpu" in p.columns else [""]
    mine = s.gpu.get("key")
    return sorted(gpus, key=lambda g: (g != mine, gpus.index(g)))


#: predictions.csv columns counted over one launch (times, the model's terms, bytes)
PREDICTED_PER_LAUNCH = ("time_us", "time_us_low", "time_us_high", "floor_us", "latency_us", "dram_us", "l2_us",
                        "l1_us", "issue_us", "dram_bytes", "dram_read_bytes", "dram_write_bytes", "l2_bytes",
                        "l1_bytes")


def predictions_per_table(p: pd.DataFrame) -> pd.DataFrame:
    """Predictions with every per-launch column divided by the tables the launch covers
    (tables_per_launch, then 1). Why: tbe's one launch covers all T tables; beside base's
    launch of one table, its 450 us and 1.6 GiB per launch read as slower and heavier
    when they are 37 us and 140 MiB per table, and against a measurement per table they
    put it 12 times off the diagonal. Rates and hit rates are untouched; idempotent."""
    if p.empty or "tables_per_launch" not in p.columns:
        return p
    per = pd.to_numeric(p["tables_per_launch"], errors="coerce").fillna(1).clip(lower=1)
    if (per == 1).all():
        return p
    return p.assign(**{c: pd.to_numeric(p[c], errors="coerce") / per for c in PREDICTED_PER_LAUNCH
                       if c in p.columns}, tables_per_launch=1)
