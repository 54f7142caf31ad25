"""Extract stage, CSV reader: `ncu --csv` exports (details page or raw page), into the
tidy schema.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from characterize.errors import ReportError, escape_text
from characterize.extract.ncu_rep import REPORT_MAGIC, existing_file
from characterize.extract.schema import (
    FRIENDLY_BY_LABEL,
    FRIENDLY_METRICS,
    LABEL_OF_METRIC,
    RAW_METRIC,
    KernelFields,
    csv_nvtx_stack,
    dims_from_values,
    dims_text,
    empty_metric_cols,
    normalize_unit,
    short_function_name,
    tidy_frame,
)

# ---------------------------------------------------------------------------
# CSV reader
# ---------------------------------------------------------------------------

_HEADER_START = re.compile(r'^\ufeff?\s*"?ID"?\s*,')
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d*)?(?:[eE][+-]?\d+)?$")
_IDENTITY_COLUMNS = frozenset(
    {"ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Kernel Time", "Context", "Stream",
     "Block Size", "Grid Size", "Device", "CC"}
)  # fmt: skip
RULE_TYPES = {"OPT": "OPTIMIZATION", "WRN": "WARNING", "ERR": "ERROR", "INF": "OK", "OK": "OK"}
_KERNEL_ROW = re.compile(r'^\ufeff?\s*"?\d+"?\s*(,|$)')
#: columns only the details page has; a file with some of them is a details export
_DETAILS_COLUMNS = ("Section Name", "Metric Name", "Metric Unit", "Metric Value")


def parse_number(text: str) -> float | None:
    """ncu's printed number -> float (thousands separators allowed); None if not a number."""
    t = text.strip()
    if not t:
        return None
    if "," in t:
        if not _THOUSANDS.match(t):
            return None
        t = t.replace(",", "")
    try:
        return float(t)
    except ValueError:
        return None


def _read_text(path: Path) -> str:
    if path.stat().st_size > (1 << 30):
        raise ReportError(f"{path}: larger than 1 GiB; export fewer kernels or metrics to CSV")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ReportError(f"{path}: cannot be read ({exc})") from None
    if not raw.strip():
        raise ReportError(f"{path}: the CSV file is empty; the ncu run that should have produced it probably failed")
    if b"\x00" in raw[:4096]:
        hint = " (it looks like a binary .ncu-rep report: use read_report())" if raw.startswith(REPORT_MAGIC) else ""
        raise ReportError(f"{path}: binary data, not an ncu CSV export{hint}")
    return raw.decode("utf-8-sig", errors="replace")


class _CsvTable(NamedTuple):
    header: list[str]
    rows: list[list[str]]
    units: list[str] | None
    lines: list[int]  # file line number of each row, for messages


def _parse_line(path: Path, n: int, line: str, units_row: bool = False, row: list[str] | None = None
                ) -> list[str] | None:
    """One CSV line (or its `row` already parsed), strictly: broken quoting on the header,
    the units row or a kernel row is damage (it would silently swallow the next row, or
    turn a value into text), on anything else program output (None)."""
    ours = units_row or _KERNEL_ROW.match(line) or _HEADER_START.match(line)
    if row is None:
        try:
            row = next(csv.reader([line], strict=True), [])
        except csv.Error as exc:
            if ours:
                raise ReportError(f"{path}, line {n}: broken quoting ({exc}); the export is damaged or was edited, "
                                  "export it again with `ncu --csv`") from None
            return None
    if ours and line.count('"') != 2 * len(row):  # not simply every field quoted: look closer
        for field in row:  # a quote inside an unquoted field: a closing or opening quote went missing
            if '"' in field and f'"{field.replace(chr(34), chr(34) * 2)}"' not in line:
                raise ReportError(f"{path}, line {n}: stray quote in field {field[:40]!r}; the export is damaged "
                                  "or was edited, export it again with `ncu --csv`")
    return row


def _parse_body(lines: list[str]) -> list[list[str]] | None:
    """Every line parsed at C speed by one strict reader, or None when some line is not
    a well-formed CSV record on its own (a record spanning lines makes fewer records
    than lines); the caller then goes line by line for the exact message."""
    try:
        rows = list(csv.reader(lines, strict=True))
    except csv.Error:
        return None
    return rows if len(rows) == len(lines) else None


def csv_table(path: Path) -> _CsvTable:
    """Header, kernel rows and (raw page) units row of an ncu CSV, skipping non-CSV lines.

    ncu interleaves its own ``==PROF==``/``==WARNING==`` lines and the program's output
    with the CSV when both go to one stream; rows whose first field is not a kernel ID
    are dropped, and rows may be ragged (rule rows and trailing commas). Every line must
    be a record of its own, so a stray quote cannot merge rows.
    """
    text = _read_text(path)
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _HEADER_START.match(line)), None)
    if start is None:
        hint = ""
        if "ERR_NVGPUCTRPERM" in text:
            hint = " The text reports ERR_NVGPUCTRPERM: ncu had no permission to read the performance counters."
        elif "No kernels were profiled" in text:
            hint = " The text says no kernels were profiled: the NVTX/kernel filter matched nothing."
        raise ReportError(
            f'{path}: no ncu CSV header (a line starting with "ID") found; export with '
            f"`ncu --csv --page details` or `--page raw` (or `ncu --import x.ncu-rep --csv ...`).{hint}"
        )
    header = [h.strip().lstrip("\ufeff") for h in _parse_line(path, start + 1, lines[start]) or []]
    for i, name in enumerate(header):   # two columns of one name: which one holds the values is a guess
        if name and name in header[:i]:
            raise ReportError(f"{path}, line {start + 1}: two {escape_text(name)!r} columns (fields "
                              f"{header.index(name) + 1} and {i + 1}); the export was edited or joined, export it "
                              "again with `ncu --csv`")
    units: list[str] | None = None
    rows: list[list[str]] = []
    numbers: list[int] = []
    body = [(n, line) for n, line in enumerate(lines[start + 1:], start + 2) if not line.lstrip().startswith("==")]
    parsed = _parse_body([line for _, line in body])
    for i, (n, line) in enumerate(body):
        # a quoted line between the header and the first kernel row can only be the units row
        maybe_units = units is None and not rows and line.startswith('"')
        if parsed is None:
            row = _parse_line(path, n, line, units_row=maybe_units)
        else:
            row = parsed[i]
            if line.count('"') != 2 * len(row):  # every field simply quoted is the rule; else look closer
                row = _parse_line(path, n, line, units_row=maybe_units, row=row)
        if not row:
            continue
        first = row[0].strip()
        if first.isdigit() and len(row) >= 4:
            _kernel_id(first, path, n)
            rows.append(row)
            numbers.append(n)
        elif maybe_units:
            if first != "" or len(row) != len(header):
                raise ReportError(f"{path}, line {n}: expected the units row or a kernel row after the header, got "
                                  f"{len(row)} fields starting {line[:30]!r}; the export is damaged, export it again "
                                  "with `ncu --csv`")
            units = row
    if not rows:
        raise ReportError(f"{path}: an ncu CSV header but no kernel rows; ncu profiled nothing or the export was cut")
    if not text.endswith("\n") and numbers[-1] == len(lines):
        _check_last_row(path, rows, numbers[-1], len(header))
    return _CsvTable(header, rows, units, numbers)


def _check_last_row(path: Path, rows: list[list[str]], line: int, header_fields: int) -> None:
    """A final row without a line end may have been cut: refuse it when it is shorter than
    the other rows of its kind (metric rows, rule rows and raw rows have fixed widths)."""
    last = rows[-1]
    kind = len(last) >= header_fields
    widths = [len(r) for r in rows[:-1] if (len(r) >= header_fields) == kind] or [header_fields]
    usual = max(set(widths), key=widths.count)
    if len(last) < usual:
        raise ReportError(f"{path}, line {line}: the export ends in the middle of a row ({len(last)} of {usual} "
                          "fields); it is truncated, export it again with `ncu --csv`")


def _kernel_id(text: str, path: Path, line: int) -> int:
    """A kernel ID: ASCII digits that fit 64 bits ('²' is a digit to Python, not an ID)."""
    if not (text.isascii() and text.isdigit()) or len(text) > 19 or int(text) >= 2**63:
        raise ReportError(f"{path}, line {line}: kernel ID {escape_text(text)[:30]!r} is not an ID (a number below "
                          "2^63 in ASCII digits); the export is damaged or was edited, export it again with "
                          "`ncu --csv`")
    return int(text)


def csv_field(row: Sequence[str], index: int | None) -> str:
    """Field `index` of a CSV row, stripped; '' when the column is absent or the row is short."""
    if index is None or index >= len(row):
        return ""
    return row[index].strip()


def _friendly_to_metric(section: str, name: str) -> tuple[str, str]:
    """(raw metric, label) for one details-page 'Metric Name' in its section."""
    if RAW_METRIC.match(name):
        return name, LABEL_OF_METRIC.get(name, "")
    metric = FRIENDLY_METRICS.get((section, name)) or FRIENDLY_BY_LABEL.get(name) or name
    return metric, name


def _append_value(cols: dict[str, list[Any]], metric: str, label: str, raw_unit: str, text: str) -> None:
    unit, factor = normalize_unit(raw_unit)
    number = parse_number(text)
    cols["metric"].append(metric)
    cols["label"].append(label)
    cols["unit"].append(unit)
    if number is None:
        cols["value"].append(math.nan)
        cols["value_text"].append(text)
    else:
        cols["value"].append(number * factor)
        cols["value_text"].append("")


def _kernel_from_row(row: Sequence[str], idx: dict[str, int], nvtx_col: int | None) -> KernelFields:
    name = csv_field(row, idx.get("Kernel Name"))
    return KernelFields(
        kernel_id=int(csv_field(row, idx.get("ID"))),
        kernel_name=name,
        function=short_function_name(name),
        nvtx_stack=tuple(csv_nvtx_stack(csv_field(row, nvtx_col))),
        grid=dims_text(csv_field(row, idx.get("Grid Size"))),
        block=dims_text(csv_field(row, idx.get("Block Size"))),
        device=csv_field(row, idx.get("Device")),
    )


def _nvtx_column(header: Sequence[str]) -> int | None:
    return next((i for i, h in enumerate(header) if "Push/Pop_Range" in h or h.strip().upper() == "NVTX"), None)


def read_csv(path: str | Path, run: str = "") -> pd.DataFrame:
    """Tidy frame from an ncu CSV export: details page (one row per metric) or raw page.

    Tolerates ncu/program output around the CSV, old and new unit spellings (values
    are normalised like read_report's), thousands separators and ragged rule rows.
    """
    path = existing_file(path)
    table = csv_table(path)
    header = table.header
    if "Metric Name" in header and "Metric Value" in header:
        return _read_details(path, header, table.rows, run, table.lines)
    present = [c for c in _DETAILS_COLUMNS if c in header]
    if present:
        missing = [c for c in ("Metric Name", "Metric Value") if c not in header]
        raise ReportError(f"{path}: a details-page export (it has {', '.join(present)}) without the "
                          f"{' and '.join(missing)} column; export it again with `ncu --csv --page details` and keep "
                          "every column")
    return _read_raw(path, header, table.rows, table.units, run, table.lines)


def _read_details(path: Path, header: list[str], rows: list[list[str]], run: str,
                  lines: Sequence[int]) -> pd.DataFrame:
    idx = {h: i for i, h in enumerate(header)}
    nvtx_col = _nvtx_column(header)
    i_section, i_name = idx.get("Section Name"), idx["Metric Name"]
    i_unit, i_value = idx.get("Metric Unit"), idx["Metric Value"]
    i_rule = idx.get("Rule Name")
    per_kernel: dict[int, tuple[KernelFields, dict[str, list[Any]], set[str]]] = {}
    for row, line in zip(rows, lines):
        name = csv_field(row, i_name)
        if not name or csv_field(row, i_rule):
            continue  # rule rows carry no metric; rule_results() reads them
        if len(row) <= i_value:
            raise ReportError(f"{path}, line {line}: metric row {name!r} ends before its Metric Value column; the "
                              "export is truncated or damaged, export it again with `ncu --csv`")
        kernel_id = int(csv_field(row, idx.get("ID")))
        entry = per_kernel.get(kernel_id)
        if entry is None:
            entry = per_kernel[kernel_id] = (_kernel_from_row(row, idx, nvtx_col), empty_metric_cols(), set())
        _, cols, seen = entry
        metric, label = _friendly_to_metric(csv_field(row, i_section), name)
        if metric in seen:
            continue  # the same label listed twice (e.g. in two sections): keep the first
        seen.add(metric)
        _append_value(cols, metric, label, csv_field(row, i_unit), csv_field(row, i_value))
    if not per_kernel:
        raise ReportError(f"{path}: the CSV details page has no metric rows (rule rows only?)")
    return _assemble(per_kernel.values(), run, path.name)


def _read_raw(
    path: Path, header: list[str], rows: list[list[str]], units: list[str] | None, run: str, lines: Sequence[int]
) -> pd.DataFrame:
    idx = {h: i for i, h in enumerate(header)}
    nvtx_col = _nvtx_column(header)
    metric_idx = [
        (i, h)
        for i, h in enumerate(header)
        if h and h not in _IDENTITY_COLUMNS and "Range:" not in h and i != nvtx_col
    ]
    if not metric_idx:
        raise ReportError(f"{path}: CSV has neither 'Metric Name'/'Metric Value' columns nor metric columns")
    entries = []
    for row, line in zip(rows, lines):
        if len(row) < len(header):
            raise ReportError(f"{path}, line {line}: a raw-page row of {len(row)} fields under a header of "
                              f"{len(header)}; the export is truncated or damaged, export it again with `ncu --csv`")
        kernel = _kernel_from_row(row, idx, nvtx_col)
        cols = empty_metric_cols()
        for i, metric in metric_idx:
            _append_value(cols, metric, LABEL_OF_METRIC.get(metric, ""), csv_field(units or [], i), csv_field(row, i))
        values = dict(zip(cols["metric"], cols["value"]))
        display = dict(zip(cols["metric"], cols["value_text"])).get("device__attribute_display_name", "")
        grid = kernel.grid or dims_from_values(*(values.get(f"launch__grid_dim_{a}") for a in "xyz"))
        block = kernel.block or dims_from_values(*(values.get(f"launch__block_dim_{a}") for a in "xyz"))
        kernel = KernelFields(
            kernel.kernel_id, kernel.kernel_name, kernel.function, kernel.nvtx_stack, grid, block,
            display or kernel.device,
        )  # fmt: skip
        entries.append((kernel, cols, set()))
    return _assemble(entries, run, path.name)


def _assemble(entries: Iterable[tuple[KernelFields, dict[str, list[Any]], set[str]]], run: str,
              report: str) -> pd.DataFrame:
    kernels: list[KernelFields] = []
    counts: list[int] = []
    cols = empty_metric_cols()
    for kernel, kcols, _ in entries:
        kernels.append(kernel)
        counts.append(len(kcols["metric"]))
        for key in cols:
            cols[key].extend(kcols[key])
    return tidy_frame(kernels, counts, cols, run, report)


