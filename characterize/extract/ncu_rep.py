"""Extract stage, `.ncu-rep` reader: Nsight Compute's binary reports through NVIDIA's
`ncu_report` module, into the tidy schema.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from characterize.errors import ReportError
from characterize.extract.schema import (
    _dims_from_values,
    _frame,
    _Kernel,
    _report_nvtx_stack,
    normalize_unit,
)

# ---------------------------------------------------------------------------
# .ncu-rep reader
# ---------------------------------------------------------------------------

_REPORT_MAGIC = b"NVR\x00"


def _import_ncu_report() -> Any:
    try:
        import ncu_report  # noqa: PLC0415 - optional dependency, imported on use
    except (ImportError, OSError) as exc:
        raise ReportError(
            f"reading .ncu-rep files needs NVIDIA's ncu_report Python package, which could not be imported "
            f"({exc}); install it with `pip install ncu-report`, or export the report to CSV with "
            "`ncu --import report.ncu-rep --csv --page raw` and use read_csv()"
        ) from None
    return ncu_report


def _existing_file(path: str | Path) -> Path:
    p = Path(path).expanduser()
    if not p.exists():
        raise ReportError(f"{p}: no such file; check the path (profile runs keep the report in the run directory)")
    if not p.is_file():
        raise ReportError(f"{p}: is a directory or special file, not a report file")
    return p


def _read_head(path: Path, n: int = 64) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(n)
    except OSError as exc:
        raise ReportError(f"{path}: cannot be read ({exc})") from None


def _report_actions(ncu_report: Any, path: Path, allow_partial: bool) -> list[tuple[int, Any, tuple[str, ...]]]:
    """(kernel_id, action, metric names) of every result, in range then action order, checked for truncation.

    ncu_report.load_report does not raise on bad input: garbage or a heavily truncated
    file loads as an empty context, and a file cut inside a result loads with a final
    action that has no name and no metrics. Both are turned into ReportError here.
    kernel_id is the running index over all results, so it stays ncu's "ID" even when
    allow_partial drops an incomplete result.
    """
    head = _read_head(path)
    if not head:
        raise ReportError(f"{path}: the file is empty (0 bytes); the profile run probably failed, see its ncu log")
    try:
        context = ncu_report.load_report(str(path))
    except Exception as exc:  # noqa: BLE001 - the library raises assorted types
        raise ReportError(f"{path}: ncu_report could not load it ({type(exc).__name__}: {exc})") from None
    if context is None:
        raise ReportError(f"{path}: ncu_report returned nothing; the file is not a readable Nsight Compute report")
    actions = []
    for r in range(context.num_ranges()):
        rng = context.range_by_idx(r)
        for a in range(rng.num_actions()):
            actions.append(rng.action_by_idx(a))
    if not actions:
        if not head.startswith(_REPORT_MAGIC) and not path.name.endswith(".ncu-repz"):
            raise ReportError(
                f"{path}: not an Nsight Compute report (no report signature, no results); "
                "pass a .ncu-rep written by `ncu --export`, or a CSV export to read_csv()"
            )
        raise ReportError(
            f"{path}: holds no profiled kernels; the file is truncated or corrupt, or ncu profiled nothing "
            "(check the NVTX filter and the ncu log of that run)"
        )
    complete = []
    for index, action in enumerate(actions):
        names = tuple(action.metric_names())
        if action.name() is None or not names:
            if allow_partial:
                continue
            raise ReportError(
                f"{path}: truncated or corrupt: result {index + 1} of {len(actions)} has no kernel name and no "
                f"metrics ({index} complete result(s) before it). Re-copy or re-run the profile; "
                "read_report(..., allow_partial=True) returns the complete results only"
            )
        complete.append((index, action, names))
    if not complete:
        raise ReportError(f"{path}: truncated or corrupt: no complete kernel result in the file")
    return complete


def _report_dims(action: Any, prefix: str) -> str:
    """'(x, y, z)' from the launch__{grid,block}_dim_{x,y,z} metrics, "" when absent."""
    values = []
    for axis in "xyz":
        metric = action.metric_by_name(f"{prefix}_{axis}")
        value = None if metric is None else metric.value()
        values.append(None if value is None or isinstance(value, str) else float(value))
    return _dims_from_values(*values)


def read_report(path: str | Path, run: str = "", *, allow_partial: bool = False) -> pd.DataFrame:
    """Every metric of every kernel in an ``.ncu-rep`` / ``.ncu-repz`` file, as a tidy frame.

    ``run`` fills the ``run`` column. A truncated file raises ReportError unless
    ``allow_partial`` is set, in which case incomplete trailing results are skipped.
    """
    path = _existing_file(path)
    ncu_report = _import_ncu_report()
    actions = _report_actions(ncu_report, path, allow_partial)

    IMetric = ncu_report.IMetric  # noqa: N806 - class alias for fast dispatch
    doubles = {IMetric.ValueKind_DOUBLE, IMetric.ValueKind_FLOAT}
    integers = {IMetric.ValueKind_UINT32, IMetric.ValueKind_UINT64}
    string_kind = IMetric.ValueKind_STRING
    as_double, as_uint64, as_string = IMetric.as_double, IMetric.as_uint64, IMetric.as_string
    get_kind, get_unit, get_label = IMetric.kind, IMetric.unit, IMetric.label
    demangled = ncu_report.IAction.NameBase_DEMANGLED
    nan = math.nan
    units: dict[str, tuple[str, float]] = {}

    metrics: list[str] = []
    labels: list[str] = []
    unit_col: list[str] = []
    values: list[float] = []
    texts: list[str] = []
    kernels: list[_Kernel] = []
    counts: list[int] = []

    for kernel_id, action, names in actions:
        by_name = action.metric_by_name
        for name in names:
            m = by_name(name)
            kind = get_kind(m)
            raw_unit = get_unit(m)
            norm = units.get(raw_unit)
            if norm is None:
                norm = units[raw_unit] = normalize_unit(raw_unit)
            if kind in doubles:
                value = as_double(m) * norm[1]
                text = ""
            elif kind in integers:
                value = as_uint64(m) * norm[1]
                text = ""
            elif kind == string_kind:
                value = nan
                text = as_string(m) or ""
            else:  # no value recorded (ValueKind_UNKNOWN / ANY)
                value = nan
                text = ""
            metrics.append(name)
            labels.append(get_label(m) or "")
            unit_col.append(norm[0])
            values.append(value)
            texts.append(text)
        counts.append(len(names))

        display = by_name("device__attribute_display_name")
        kernels.append(
            _Kernel(
                kernel_id=kernel_id,
                kernel_name=action.name(demangled) or action.name() or "",
                function=action.name() or "",
                nvtx_stack=tuple(_report_nvtx_stack(action)),
                grid=_report_dims(action, "launch__grid_dim"),
                block=_report_dims(action, "launch__block_dim"),
                device=(display.as_string() or "") if display is not None else "",
            )
        )

    cols = {"metric": metrics, "label": labels, "unit": unit_col, "value": values, "value_text": texts}
    return _frame(kernels, counts, cols, run, path.name)


