"""Extract stage, rules: the findings of Nsight Compute's rule engine stored in a report.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from characterize.extract.ncu_csv import _RULE_TYPES, _cell, _csv_table, _parse_number
from characterize.extract.ncu_rep import (
    _REPORT_MAGIC,
    _existing_file,
    _import_ncu_report,
    _read_head,
    _report_actions,
)
from characterize.extract.read import _ZSTD_MAGIC
from characterize.extract.schema import RULE_COLUMNS

# ---------------------------------------------------------------------------
# Rule results
# ---------------------------------------------------------------------------


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
    path = _existing_file(path)
    name = path.name.lower()
    is_report = name.endswith((".ncu-rep", ".ncu-repz")) or (
        not name.endswith(".csv") and _read_head(path).startswith((_REPORT_MAGIC, _ZSTD_MAGIC))
    )
    rows: list[dict[str, Any]] = []
    if is_report:
        ncu_report = _import_ncu_report()
        actions = _report_actions(ncu_report, path, allow_partial)
        demangled = ncu_report.IAction.NameBase_DEMANGLED
        for kernel_id, action, _ in actions:
            kernel_name = action.name(demangled) or action.name() or ""
            for result in action.rule_results_as_dicts():
                message = result.get("rule_message") or {}
                speedup = result.get("speedup_estimation") or {}
                rows.append(
                    {
                        "kernel_id": kernel_id,
                        "kernel_name": kernel_name,
                        "section": result.get("section_identifier") or "",
                        "rule": result.get("rule_identifier") or "",
                        "rule_name": result.get("name") or "",
                        "message_type": _enum_name(ncu_report.MsgType, message.get("type"), "NONE"),
                        "title": message.get("title") or "",
                        "message": message.get("message") or "",
                        "speedup_type": _enum_name(ncu_report.SpeedupType, speedup.get("type")).lower()
                        if speedup
                        else "",
                        "estimated_speedup": float(speedup["speedup"]) if speedup else math.nan,
                    }
                )
    else:
        header, body, _ = _csv_table(path)
        idx = {h: i for i, h in enumerate(header)}
        if "Rule Name" in idx:
            for row in body:
                rule = _cell(row, idx["Rule Name"])
                if not rule:
                    continue
                speedup = _parse_number(_cell(row, idx.get("Estimated Speedup")))
                rule_type = _cell(row, idx.get("Rule Type"))
                rows.append(
                    {
                        "kernel_id": int(_cell(row, idx["ID"])),
                        "kernel_name": _cell(row, idx.get("Kernel Name")),
                        "section": _cell(row, idx.get("Section Name")),
                        "rule": rule,
                        "rule_name": "",
                        "message_type": _RULE_TYPES.get(rule_type.upper(), rule_type),
                        "title": "",
                        "message": _cell(row, idx.get("Rule Description")),
                        "speedup_type": _cell(row, idx.get("Estimated Speedup Type")).lower(),
                        "estimated_speedup": math.nan if speedup is None else speedup,
                    }
                )
    frame = pd.DataFrame(rows, columns=[c for c in RULE_COLUMNS if c not in ("run", "report")])
    frame.insert(0, "report", path.name)
    frame.insert(0, "run", run)
    frame["kernel_id"] = frame["kernel_id"].astype("int64")
    frame["estimated_speedup"] = frame["estimated_speedup"].astype("float64")
    return frame
