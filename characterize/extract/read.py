"""Extract stage, entry points: read any Nsight Compute output by its content, and the
wide (one row per kernel) view of a tidy frame.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from characterize.errors import ReportError
from characterize.extract.ncu_csv import read_csv
from characterize.extract.ncu_rep import (
    REPORT_MAGIC,
    existing_file,
    read_head,
    read_report,
)
from characterize.extract.schema import TIDY_KERNEL_INFO, TIDY_KERNEL_KEYS, WIDE_METRICS

# ---------------------------------------------------------------------------
# Dispatch
# ---------------------------------------------------------------------------

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def read_any(path: str | Path, run: str = "") -> pd.DataFrame:
    """Read an ncu report or CSV export, choosing the reader by extension, then by content."""
    path = existing_file(path)
    name = path.name.lower()
    if name.endswith((".ncu-rep", ".ncu-repz")):
        return read_report(path, run)
    if name.endswith(".csv"):
        return read_csv(path, run)
    head = read_head(path, 4096)
    if head.startswith((REPORT_MAGIC, ZSTD_MAGIC)):
        return read_report(path, run)
    if b'"ID"' in head or head.lstrip().startswith(b"=="):
        return read_csv(path, run)
    raise ReportError(
        f"{path}: neither an Nsight Compute report (.ncu-rep) nor an ncu CSV export; "
        "give a file written by `ncu --export` or `ncu --csv`"
    )


# ---------------------------------------------------------------------------
# Wide view
# ---------------------------------------------------------------------------


def wide(df: pd.DataFrame) -> pd.DataFrame:
    """One row per kernel with the friendly columns of WIDE_METRICS (NaN where a metric is missing)."""
    required = {"kernel_id", "metric", "value"}
    missing = sorted(required - set(df.columns))
    if missing:
        raise ReportError(f"wide() needs a tidy frame from read_report/read_csv; missing columns {missing}")
    keys = [k for k in TIDY_KERNEL_KEYS if k in df.columns]
    info_cols = [c for c in TIDY_KERNEL_INFO if c in df.columns]
    info = df.drop_duplicates(keys)[keys + info_cols].reset_index(drop=True)

    wanted = set(WIDE_METRICS.values())
    subset = df.loc[df["metric"].isin(wanted), keys + ["metric", "value"]]
    values = subset.groupby(keys + ["metric"], sort=False)["value"].first().unstack("metric")
    present = set(values.columns)
    out = info.merge(values, left_on=keys, right_index=True, how="left") if len(values) else info.copy()

    columns = {}
    for column, metric in WIDE_METRICS.items():
        if column.startswith("stall_") and metric not in present:
            continue
        if metric in out.columns:
            columns[column] = out[metric].astype("float64").to_numpy()
        else:
            columns[column] = np.full(len(out), np.nan)
    result = pd.concat([out[keys + info_cols].reset_index(drop=True), pd.DataFrame(columns)], axis=1)
    return result

