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
