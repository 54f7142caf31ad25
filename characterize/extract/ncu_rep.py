"""Extract stage, `.ncu-rep` reader: Nsight Compute's binary reports through NVIDIA's
`ncu_report` module, into the tidy schema.
"""

from __future__ import annotations

import faulthandler
import math
import os
import re
import signal
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd

from characterize.errors import ReportError, escape_text
from characterize.extract.schema import (
    KernelFields,
    dims_from_values,
    normalize_unit,
    report_nvtx_stack,
    tidy_frame,
)
from characterize.files import file_kind

# ---------------------------------------------------------------------------
# .ncu-rep reader
# ---------------------------------------------------------------------------

REPORT_MAGIC = b"NVR\x00"


def import_ncu_report() -> Any:
    """NVIDIA's optional ncu_report module, or ReportError saying how to install it or export to CSV."""
    try:
        import ncu_report  # noqa: PLC0415 - optional dependency, imported on use
    except (ImportError, OSError) as exc:
        raise ReportError(
            f"reading .ncu-rep files needs NVIDIA's ncu_report Python package, which could not be imported "
            f"({exc}); install it with `pip install ncu-report`, or export the report to CSV with "
            "`ncu --import report.ncu-rep --csv --page raw` and use read_csv()"
        ) from None
    return ncu_report


def existing_file(path: str | Path) -> Path:
    """`path` as a Path when it is an existing regular file, else ReportError saying what it is."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ReportError(f"{p}: no such file; check the path (profile runs keep the report in the run directory)")
    if not p.is_file():
        raise ReportError(f"{escape_text(str(p))}: is {file_kind(p.stat().st_mode)}, not a report file")
    return p


def read_head(path: Path, n: int = 64) -> bytes:
    """The first `n` bytes of a file (to tell its format by magic), ReportError when unreadable."""
    try:
        with open(path, "rb") as fh:
            return fh.read(n)
    except OSError as exc:
        raise ReportError(f"{path}: cannot be read ({exc})") from None


_NATIVE_PREFIX = re.compile(r"^[EWIF]\d{4} [\d:.]+\s+\d+ [\w.]+:\d+\]\s*")


@contextmanager
def _native_stderr() -> Iterator[list[str]]:
    """Collect what NVIDIA's native report library prints on file descriptor 2 while
    loading (protobuf parse complaints about a damaged file), instead of letting it
    spill several raw lines in front of our one-line error."""
    lines: list[str] = []
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to redirect
        yield lines
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            for line in sink.read().decode("utf-8", "replace").splitlines():
                line = _NATIVE_PREFIX.sub("", line).strip()
                if line and "absl::InitializeLog" not in line and not line.startswith("***"):
                    lines.append(line)


#: (path, size, mtime) -> [the signal that killed a trial load ("" when it loaded), what the reader said]
_PROBED: dict[tuple[str, int, int], list[str]] = {}


def _crashes_on_load(ncu_report: Any, path: Path) -> list[str]:
    """[the name of the signal a trial load of `path` dies of in a forked child ("" if it
    loads), the reader's last words (filled in by the caller)]. NVIDIA's native reader
    aborts the whole process (a failed protobuf CHECK, SIGABRT) on some damaged files,
    which no exception handler can catch; probing in a child turns that into a
    ReportError. Linux only (fork is unsafe elsewhere); one probe per file version."""
    if not sys.platform.startswith("linux"):
        return ["", ""]
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _PROBED:
        pid = os.fork()
        if pid == 0:  # the child only loads and leaves, without running any exit handler
            faulthandler.disable()  # its expected abort is reported by the parent, not as a Python traceback
            try:
                ncu_report.load_report(str(path))
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        _PROBED[key] = [signal.Signals(os.WTERMSIG(status)).name if os.WIFSIGNALED(status) else "", ""]
    return _PROBED[key]


def report_actions(ncu_report: Any, path: Path, allow_partial: bool) -> list[tuple[int, Any, tuple[str, ...]]]:
    """(kernel_id, action, metric names) of every result, in range then action order, checked for truncation.

    ncu_report.load_report does not raise on bad input: garbage or a heavily truncated
    file loads as an empty context, and a file cut inside a result loads with a final
    action that has no name and no metrics. Both are turned into ReportError here.
    kernel_id is the running index over all results, so it stays ncu's "ID" even when
    allow_partial drops an incomplete result.
    """
    head = read_head(path)
    if not head:
        raise ReportError(f"{path}: the file is empty (0 bytes); the profile run probably failed, see its ncu log")
    with _native_stderr() as native:
        probe = _crashes_on_load(ncu_report, path)
        crash = probe[0]
        if crash:
            context = None
        else:
            try:
                context = ncu_report.load_report(str(path))
            except Exception as exc:  # noqa: BLE001 - the library raises assorted types
                first = (str(exc).strip().splitlines() or [""])[0]
                raise ReportError(f"{path}: ncu_report could not load it ({type(exc).__name__}: {first})") from None
        actions = []
        if context is not None:
            for r in range(context.num_ranges()):
                rng = context.range_by_idx(r)
                for a in range(rng.num_actions()):
                    actions.append(rng.action_by_idx(a))
    if crash and native and not probe[1]:
        probe[1] = native[0]
    said = f" (ncu_report: {(native[0] if native else probe[1])[:160]})" if native or probe[1] else ""
    if crash:
        raise ReportError(f"{path}: corrupt: NVIDIA's report reader crashed on it ({crash}){said}; copy the report "
                          "again or re-run the profile")
    if context is None:
        raise ReportError(f"{path}: ncu_report returned nothing; the file is not a readable Nsight Compute "
                          f"report{said}")
    if not actions:
        if not head.startswith(REPORT_MAGIC) and not path.name.endswith(".ncu-repz"):
            raise ReportError(
                f"{path}: not an Nsight Compute report (no report signature, no results); "
                "pass a .ncu-rep written by `ncu --export`, or a CSV export to read_csv()"
            )
        raise ReportError(
            f"{path}: holds no profiled kernels; the file is truncated or corrupt, or ncu profiled nothing "
            f"(check the NVTX filter and the ncu log of that run){said}"
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
                f"read_report(..., allow_partial=True) returns the complete results only{said}"
            )
        complete.append((index, action, names))
    if not complete:
        raise ReportError(f"{path}: truncated or corrupt: no complete kernel result in the file{said}")
    return complete


def checked_utf8(text: str | None, what: str, index: int) -> str:
    """`text` when it is valid UTF-8 (ncu writes nothing else); a name with undecodable
    bytes means the report is damaged, and would crash every writer downstream."""
    if not text or text.isascii():
        return text or ""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise CorruptResult(f"{what} of result {index + 1} is not valid UTF-8") from None
    return text


class CorruptResult(Exception):
    """One result of a report is damaged (internal: becomes ReportError or a skipped result)."""


def _report_dims(action: Any, prefix: str) -> str:
    """'(x, y, z)' from the launch__{grid,block}_dim_{x,y,z} metrics, "" when absent."""
    values = []
    for axis in "xyz":
        metric = action.metric_by_name(f"{prefix}_{axis}")
        value = None if metric is None else metric.value()
        values.append(None if value is None or isinstance(value, str) else float(value))
    return dims_from_values(*values)


def read_report(path: str | Path, run: str = "", *, allow_partial: bool = False) -> pd.DataFrame:
    """Every metric of every kernel in an ``.ncu-rep`` / ``.ncu-repz`` file, as a tidy frame.

    ``run`` fills the ``run`` column. A truncated file raises ReportError unless
    ``allow_partial`` is set, in which case incomplete trailing results are skipped.
    """
    path = existing_file(path)
    ncu_report = import_ncu_report()
    actions = report_actions(ncu_report, path, allow_partial)

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
    kernels: list[KernelFields] = []
    counts: list[int] = []

    for kernel_id, action, names in actions:
        by_name = action.metric_by_name
        start = len(metrics)
        try:
            for name in names:
                if not name.isascii():  # undecodable bytes would raise TypeError in the binding
                    checked_utf8(name, "a metric name", kernel_id)
                m = by_name(name)
                if m is None:
                    raise CorruptResult(f"metric {name!r} of result {kernel_id + 1} is listed but cannot be read")
                kind = get_kind(m)
                raw_unit = get_unit(m)
                norm = units.get(raw_unit)
                if norm is None:
                    norm = units[raw_unit] = normalize_unit(checked_utf8(raw_unit, "a unit", kernel_id))
                if kind in doubles:
                    value = as_double(m) * norm[1]
                    text = ""
                elif kind in integers:
                    value = as_uint64(m) * norm[1]
                    text = ""
                elif kind == string_kind:
                    value = nan
                    text = checked_utf8(as_string(m), f"the value of {name}", kernel_id)
                else:  # no value recorded (ValueKind_UNKNOWN / ANY)
                    value = nan
                    text = ""
                metrics.append(name)
                labels.append(checked_utf8(get_label(m), f"the label of {name}", kernel_id))
                unit_col.append(norm[0])
                values.append(value)
                texts.append(text)

            display = by_name("device__attribute_display_name")
            kernel = KernelFields(
                kernel_id=kernel_id,
                kernel_name=checked_utf8(action.name(demangled) or action.name() or "", "the kernel name", kernel_id),
                function=checked_utf8(action.name() or "", "the function name", kernel_id),
                nvtx_stack=tuple(checked_utf8(n, "an NVTX range name", kernel_id) for n in report_nvtx_stack(action)),
                grid=_report_dims(action, "launch__grid_dim"),
                block=_report_dims(action, "launch__block_dim"),
                device=checked_utf8((display.as_string() or "") if display is not None else "", "the device name",
                                    kernel_id),
            )
        except (CorruptResult, TypeError, UnicodeError, ValueError) as exc:
            del metrics[start:], labels[start:], unit_col[start:], values[start:], texts[start:]
            if allow_partial:
                continue  # a damaged result costs only itself
            why = (str(exc) if isinstance(exc, CorruptResult)
                   else f"result {kernel_id + 1} cannot be read ({type(exc).__name__})")
            raise ReportError(f"{path}: corrupt: {why}; copy the report again or re-run the profile") from None
        counts.append(len(metrics) - start)
        kernels.append(kernel)
    if not kernels:
        raise ReportError(f"{path}: corrupt: no result of the report can be read; re-copy or re-run the profile")

    cols = {"metric": metrics, "label": labels, "unit": unit_col, "value": values, "value_text": texts}
    return tidy_frame(kernels, counts, cols, run, path.name)


