"""Extract stage, rules: the findings of Nsight Compute's rule engine stored in a report,
and which unit of the GPU each finding's estimated speedup leans on (`rule_unit`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from characterize.errors import ReportError
from characterize.extract.ncu_csv import RULE_TYPES, csv_field, csv_table, parse_number
from characterize.extract.ncu_rep import (
    REPORT_MAGIC,
    CorruptResult,
    checked_utf8,
    existing_file,
    import_ncu_report,
    read_head,
    report_actions,
)
from characterize.extract.read import ZSTD_MAGIC
from characterize.extract.schema import RULE_COLUMNS

# ---------------------------------------------------------------------------
# Rule results
# ---------------------------------------------------------------------------


def _text(value: Any, path: Path, index: int) -> str:
    """A rule's text field: a string that is valid UTF-8, "" when absent."""
    if value is None:
        return ""
    return checked_utf8(str(value), "a rule message", index)


def _enum_name(enum_cls: Any, value: Any, default: str = "") -> str:
    try:
        return enum_cls(int(value)).name
    except (TypeError, ValueError):
        return default


def rule_results(path: str | Path, run: str = "", *, allow_partial: bool = False) -> pd.DataFrame:
    """ncu's rule findings per kernel (OPTIMIZATION/WARNING/... messages, estimated speedups).

    From an ``.ncu-rep`` via the report's rule results (``allow_partial`` as in
    read_report); from a CSV details page via its rule rows. A CSV raw page carries
    no rules and yields an empty frame.
    """
    path = existing_file(path)
    name = path.name.lower()
    is_report = name.endswith((".ncu-rep", ".ncu-repz")) or (
        not name.endswith(".csv") and read_head(path).startswith((REPORT_MAGIC, ZSTD_MAGIC))
    )
    rows: list[dict[str, Any]] = []
    if is_report:
        ncu_report = import_ncu_report()
        actions = report_actions(ncu_report, path, allow_partial)
        demangled = ncu_report.IAction.NameBase_DEMANGLED
        for kernel_id, action, _ in actions:
            try:
                found = []
                kernel_name = checked_utf8(action.name(demangled) or action.name() or "", "the kernel name", kernel_id)
                for result in action.rule_results_as_dicts():
                    message = result.get("rule_message") or {}
                    speedup = result.get("speedup_estimation") or {}
                    found.append(
                        {
                            "kernel_id": kernel_id,
                            "kernel_name": kernel_name,
                            "section": _text(result.get("section_identifier"), path, kernel_id),
                            "rule": _text(result.get("rule_identifier"), path, kernel_id),
                            "rule_name": _text(result.get("name"), path, kernel_id),
                            "message_type": _enum_name(ncu_report.MsgType, message.get("type"), "NONE"),
                            "title": _text(message.get("title"), path, kernel_id),
                            "message": _text(message.get("message"), path, kernel_id),
                            "speedup_type": _enum_name(ncu_report.SpeedupType, speedup.get("type")).lower()
                            if speedup
                            else "",
                            "estimated_speedup": float(speedup["speedup"]) if speedup else math.nan,
                        }
                    )
            except (CorruptResult, TypeError, UnicodeError, ValueError, KeyError, AttributeError) as exc:
                if allow_partial:
                    continue  # a damaged result costs only its own rules
                why = (str(exc) if isinstance(exc, CorruptResult)
                       else f"result {kernel_id + 1} has unreadable rule results")
                raise ReportError(f"{path}: corrupt: {why}; re-copy or re-run the profile") from None
            rows.extend(found)
    else:
        table = csv_table(path)
        header, body = table.header, table.rows
        idx = {h: i for i, h in enumerate(header)}
        if "Rule Name" in idx:
            for row in body:
                rule = csv_field(row, idx["Rule Name"])
                if not rule:
                    continue
                speedup = parse_number(csv_field(row, idx.get("Estimated Speedup")))
                rule_type = csv_field(row, idx.get("Rule Type"))
                rows.append(
                    {
                        "kernel_id": int(csv_field(row, idx["ID"])),
                        "kernel_name": csv_field(row, idx.get("Kernel Name")),
                        "section": csv_field(row, idx.get("Section Name")),
                        "rule": rule,
                        "rule_name": "",
                        "message_type": RULE_TYPES.get(rule_type.upper(), rule_type),
                        "title": "",
                        "message": csv_field(row, idx.get("Rule Description")),
                        "speedup_type": csv_field(row, idx.get("Estimated Speedup Type")).lower(),
                        "estimated_speedup": math.nan if speedup is None else speedup,
                    }
                )
    frame = pd.DataFrame(rows, columns=[c for c in RULE_COLUMNS if c not in ("run", "report")])
    frame.insert(0, "report", path.name)
    frame.insert(0, "run", run)
    frame["kernel_id"] = frame["kernel_id"].astype("int64")
    frame["estimated_speedup"] = frame["estimated_speedup"].astype("float64")
    return frame


# ---------------------------------------------------------------------------
# What a rule's speedup leans on
# ---------------------------------------------------------------------------

#: the units a rule's speedup needs more throughput from (analysis.ncu.cap_speedups caps the
#: estimate by their speed-of-light headroom): "memory" (L1/TEX, L2, DRAM), "compute" (the SMs'
#: issue and pipes), "any" (the same work done sooner: every unit must go faster), "" (the rule
#: cuts work, a unit's traffic or instructions, so its headroom does not bound the gain)
RULE_UNITS = ("memory", "compute", "any", "")

#: WarpStateStats stall findings (by title) that wait on the memory system
_MEMORY_STALLS = ("long scoreboard", "short scoreboard", "lg throttle", "mio throttle", "tex throttle", "drain",
                  "membar", "imc miss")
#: stall findings that wait on the SM itself (its schedulers, pipes and instruction supply)
_COMPUTE_STALLS = ("math pipe", "not selected", "wait", "dispatch", "branch resolving", "no instruction", "selected")
#: sections whose findings cut traffic or instructions (access patterns, compression, fused FP ops)
_CUTS_WORK = ("MemoryWorkloadAnalysis", "SourceCounters", "InstructionStats", "ComputeWorkloadAnalysis")


def rule_unit(section: str, rule: str = "", title: str = "") -> str:
    """The unit a finding's speedup leans on (one of RULE_UNITS).

    Why: ncu estimates each rule's speedup on its own, blind to how close the kernel
    already runs to a unit's peak; a stall removed without removing work must be served
    by the same units, so their headroom bounds the gain. Stalls are told apart by the
    finding's title (ncu's CPIStall rule names the stall reason there)."""
    sec, t = str(section or ""), " ".join(str(title or "").lower().replace("_", " ").split())
    if sec.startswith(("WarpStateStats", "SchedulerStats")):
        if any(k in t for k in _MEMORY_STALLS):
            return "memory"
        if any(k in t for k in _COMPUTE_STALLS) or sec.startswith("SchedulerStats"):
            return "compute"
        return "any"
    if sec.startswith(_CUTS_WORK):
        return ""
    # occupancy, launch configuration (tail effect, small grid), workload imbalance, anything new:
    # the same work sooner
    return "any"
