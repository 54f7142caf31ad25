"""Extract stage: Nsight Compute output (``.ncu-rep`` or CSV export) -> tidy pandas frames.

Every reader returns the same long ("tidy") schema, one row per (kernel, metric):

==============  =======  ==========================================================
column          dtype    meaning
==============  =======  ==========================================================
run             str      caller-supplied run label (``run=`` argument)
report          str      file name the rows came from (tells concatenated files apart)
variant         str      from an NVTX range ``chz/<variant>/<dataset>/<table>``, else ""
dataset         str      idem
table           Int64    idem (nullable integer; <NA> without the convention)
kernel_id       int64    running index over all ranges and actions (CSV: ncu's "ID")
kernel_name     str      demangled kernel name
function        str      short function name (no namespace, template args, parameters)
nvtx_range      str      innermost NVTX push/pop range of the launch, "" when none
grid            str      "(x, y, z)" grid dimensions
block           str      "(x, y, z)" block dimensions
device          str      GPU display name (CSV details page: ncu's "Device" column)
metric          str      raw metric name (friendly CSV labels are mapped when known)
label           str      ncu's friendly label for the metric, "" when it has none
unit            str      unit after normalisation (time in ns, bytes in byte, rates per s)
value           float64  numeric value in ``unit``; NaN for string metrics
value_text      str      the value of string metrics, "" for numeric ones
==============  =======  ==========================================================

:func:`wide` turns the tidy frame into one row per kernel with friendly, unit-named
columns; :func:`rule_results` returns ncu's rule findings (OPTIMIZATION hints etc.).
The ``.ncu-rep`` reader goes through NVIDIA's ``ncu_report`` package only; the file
format itself is never parsed here.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from characterize.errors import ReportError
from characterize.ncu import STALL_REASONS, stall_metric

__all__ = [
    "TIDY_COLUMNS",
    "RULE_COLUMNS",
    "WIDE_METRICS",
    "FRIENDLY_METRICS",
    "read_report",
    "read_csv",
    "read_any",
    "wide",
    "rule_results",
    "normalize_unit",
    "short_function_name",
    "parse_nvtx_convention",
]

TIDY_COLUMNS: tuple[str, ...] = (
    "run", "report", "variant", "dataset", "table",
    "kernel_id", "kernel_name", "function", "nvtx_range", "grid", "block", "device",
    "metric", "label", "unit", "value", "value_text",
)  # fmt: skip

RULE_COLUMNS: tuple[str, ...] = (
    "run", "report", "kernel_id", "kernel_name", "section", "rule", "rule_name",
    "message_type", "title", "message", "speedup_type", "estimated_speedup",
)  # fmt: skip

_KERNEL_KEYS = ["run", "report", "kernel_id"]
_KERNEL_INFO = ["kernel_name", "function", "nvtx_range", "variant", "dataset", "table", "grid", "block", "device"]

# ---------------------------------------------------------------------------
# Friendly names
# ---------------------------------------------------------------------------

#: ``wide()`` columns and the raw metric behind each. Units are in the column name;
#: stall columns are cycles per issued instruction and appear only for the stall
#: reasons present in the data (``gmma`` exists on Hopper only).
WIDE_METRICS: dict[str, str] = {
    "duration_ns": "gpu__time_duration.sum",
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "theoretical_occupancy_pct": "sm__maximum_warps_per_active_cycle_pct",
    "registers_per_thread": "launch__registers_per_thread",
    "block_limit_registers": "launch__occupancy_limit_registers",
    "block_limit_shared_mem": "launch__occupancy_limit_shared_mem",
    "block_limit_warps": "launch__occupancy_limit_warps",
    "block_limit_blocks": "launch__occupancy_limit_blocks",
    "l1_hit_rate_pct": "l1tex__t_sector_hit_rate.pct",
    "l2_hit_rate_pct": "lts__t_sector_hit_rate.pct",
    "l2_bytes": "lts__t_bytes.sum",
    "dram_bytes_read": "dram__bytes_read.sum",
    "dram_bytes_write": "dram__bytes_write.sum",
    "dram_throughput_pct": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "sm_throughput_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    **{f"stall_{reason}": stall_metric(reason) for reason in STALL_REASONS},
}

_SOL = "GPU Speed Of Light Throughput"
_LAUNCH = "Launch Statistics"
_OCC = "Occupancy"
_MEM = "Memory Workload Analysis"
_WARP = "Warp State Statistics"
_SCHED = "Scheduler Statistics"
_COMPUTE = "Compute Workload Analysis"
_INST = "Instruction Statistics"

#: (section display name, friendly label) on ncu's details page -> raw metric name.
#: Read from the section definitions recorded in real A100 and H800 reports; labels
#: whose metric differs between GPUs or ncu versions (e.g. "ALU", "Warp Occupancy")
#: are left out on purpose and keep their label as metric name.
FRIENDLY_METRICS: dict[tuple[str, str], str] = {
    (_SOL, "Duration"): "gpu__time_duration.sum",
    (_SOL, "Elapsed Cycles"): "gpc__cycles_elapsed.max",
    (_SOL, "SM Active Cycles"): "sm__cycles_active.avg",
    (_SOL, "SM Frequency"): "gpc__cycles_elapsed.avg.per_second",
    (_SOL, "DRAM Frequency"): "dram__cycles_elapsed.avg.per_second",
    (_SOL, "Memory Throughput"): "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    (_SOL, "DRAM Throughput"): "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    (_SOL, "L1/TEX Cache Throughput"): "l1tex__throughput.avg.pct_of_peak_sustained_active",
    (_SOL, "L2 Cache Throughput"): "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    (_SOL, "Compute (SM) Throughput"): "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    (_LAUNCH, "Block Size"): "launch__block_size",
    (_LAUNCH, "Grid Size"): "launch__grid_size",
    (_LAUNCH, "Registers Per Thread"): "launch__registers_per_thread",
    (_LAUNCH, "Threads"): "launch__thread_count",
    (_LAUNCH, "Waves Per SM"): "launch__waves_per_multiprocessor",
    (_LAUNCH, "Function Cache Configuration"): "launch__func_cache_config",
    (_LAUNCH, "Shared Memory Configuration Size"): "launch__shared_mem_config_size",
    (_LAUNCH, "Driver Shared Memory Per Block"): "launch__shared_mem_per_block_driver",
    (_LAUNCH, "Dynamic Shared Memory Per Block"): "launch__shared_mem_per_block_dynamic",
    (_LAUNCH, "Static Shared Memory Per Block"): "launch__shared_mem_per_block_static",
    (_LAUNCH, "Cluster Size"): "launch__cluster_size",
    (_LAUNCH, "Cluster Scheduling Policy"): "launch__cluster_scheduling_policy",
    (_OCC, "Theoretical Occupancy"): "sm__maximum_warps_per_active_cycle_pct",
    (_OCC, "Theoretical Active Warps per SM"): "sm__maximum_warps_avg_per_active_cycle",
    (_OCC, "Achieved Occupancy"): "sm__warps_active.avg.pct_of_peak_sustained_active",
    (_OCC, "Achieved Active Warps Per SM"): "sm__warps_active.avg.per_cycle_active",
    (_OCC, "Block Limit Registers"): "launch__occupancy_limit_registers",
    (_OCC, "Block Limit Shared Mem"): "launch__occupancy_limit_shared_mem",
    (_OCC, "Block Limit Warps"): "launch__occupancy_limit_warps",
    (_OCC, "Block Limit SM"): "launch__occupancy_limit_blocks",
    (_OCC, "Max Active Clusters"): "launch__cluster_max_active",
    (_OCC, "Max Cluster Size"): "launch__cluster_max_potential_size",
    (_OCC, "Overall GPU Occupancy"): "launch__occupancy_cluster_gpu_pct",
    (_OCC, "Cluster Occupancy"): "launch__occupancy_cluster_pct",
    (_MEM, "Memory Throughput"): "dram__bytes.sum.per_second",
    (_MEM, "L1/TEX Hit Rate"): "l1tex__t_sector_hit_rate.pct",
    (_MEM, "L2 Hit Rate"): "lts__t_sector_hit_rate.pct",
    (_MEM, "Mem Busy"): "gpu__compute_memory_access_throughput.avg.pct_of_peak_sustained_elapsed",
    (_MEM, "Max Bandwidth"): "gpu__compute_memory_request_throughput.avg.pct_of_peak_sustained_elapsed",
    (_MEM, "Mem Pipes Busy"): "sm__memory_throughput.avg.pct_of_peak_sustained_elapsed",
    (_MEM, "L2 Compression Success Rate"): "lts__average_gcomp_input_sector_success_rate.pct",
    (_MEM, "L2 Compression Ratio"): "lts__average_gcomp_output_sector_compression_achieved_rate.ratio",
    (_WARP, "Warp Cycles Per Issued Instruction"): "smsp__average_warp_latency_per_inst_issued.ratio",
    (_WARP, "Warp Cycles Per Executed Instruction"): "smsp__average_warps_active_per_inst_executed.ratio",
    (_WARP, "Avg. Active Threads Per Warp"): "smsp__thread_inst_executed_per_inst_executed.ratio",
    (_WARP, "Avg. Not Predicated Off Threads Per Warp"): "smsp__thread_inst_executed_pred_on_per_inst_executed.ratio",
    (_WARP, "Selected"): stall_metric("selected"),
    (_WARP, "Stall GMMA"): stall_metric("gmma"),
    (_WARP, "Stall IMC Miss"): stall_metric("imc_miss"),
    (_WARP, "Stall LG Throttle"): stall_metric("lg_throttle"),
    (_WARP, "Stall MIO Throttle"): stall_metric("mio_throttle"),
    **{
        (_WARP, "Stall " + " ".join(w.capitalize() for w in reason.split("_"))): stall_metric(reason)
        for reason in STALL_REASONS
        if reason not in ("selected", "gmma", "imc_miss", "lg_throttle", "mio_throttle")
    },
    (_SCHED, "Active Warps Per Scheduler"): "smsp__warps_active.avg.per_cycle_active",
    (_SCHED, "Eligible Warps Per Scheduler"): "smsp__warps_eligible.avg.per_cycle_active",
    (_SCHED, "Issued Warp Per Scheduler"): "smsp__issue_active.avg.per_cycle_active",
    (_SCHED, "No Eligible"): "smsp__issue_inst0.avg.pct_of_peak_sustained_active",
    (_SCHED, "One or More Eligible"): "smsp__issue_active.avg.pct_of_peak_sustained_active",
    (_SCHED, "GPU Maximum Warps Per Scheduler"): "smsp__warps_active.avg.peak_sustained",
    (_SCHED, "Theoretical Warps Per Scheduler"): "smsp__maximum_warps_avg_per_active_cycle",
    (_COMPUTE, "Executed Ipc Active"): "sm__inst_executed.avg.per_cycle_active",
    (_COMPUTE, "Executed Ipc Elapsed"): "sm__inst_executed.avg.per_cycle_elapsed",
    (_COMPUTE, "Issued Ipc Active"): "sm__inst_issued.avg.per_cycle_active",
    (_COMPUTE, "Issue Slots Busy"): "sm__inst_issued.avg.pct_of_peak_sustained_active",
    (_COMPUTE, "SM Busy"): "sm__instruction_throughput.avg.pct_of_peak_sustained_active",
    (_INST, "Executed Instructions"): "smsp__inst_executed.sum",
    (_INST, "Issued Instructions"): "smsp__inst_issued.sum",
    (_INST, "Avg. Executed Instructions Per Scheduler"): "smsp__inst_executed.avg",
    (_INST, "Avg. Issued Instructions Per Scheduler"): "smsp__inst_issued.avg",
}


def _unique_labels(mapping: dict[tuple[str, str], str]) -> dict[str, str]:
    by_label: dict[str, set[str]] = {}
    for (_, label), metric in mapping.items():
        by_label.setdefault(label, set()).add(metric)
    return {label: next(iter(metrics)) for label, metrics in by_label.items() if len(metrics) == 1}


# Fallback when the section name is unknown (renamed section): labels that are unambiguous.
_FRIENDLY_BY_LABEL = _unique_labels(FRIENDLY_METRICS)
# Reverse direction, to give raw-named CSV rows the same label the report carries.
_LABEL_OF_METRIC: dict[str, str] = {}
for (_section, _label), _metric in FRIENDLY_METRICS.items():
    _LABEL_OF_METRIC.setdefault(_metric, _label)

_RAW_METRIC = re.compile(r"^[a-z][a-z0-9_]*__[A-Za-z0-9_.]+$")

# ---------------------------------------------------------------------------
# Units
# ---------------------------------------------------------------------------

# Old ncu spells nsecond/usecond/msecond/second and byte/Kbyte/Mbyte/Gbyte, newer
# versions ns/us/ms/s and B/KB/MB/GB; reports store base units (ns, byte, hz).
# Decimal prefixes: ncu scales bytes by 1000 (SI); binary spellings are kept for safety.
_TIME_NS: dict[str, float] = {
    "ns": 1.0, "nsecond": 1.0, "nsec": 1.0,
    "us": 1e3, "usecond": 1e3, "usec": 1e3, "µs": 1e3, "μs": 1e3,
    "ms": 1e6, "msecond": 1e6, "msec": 1e6,
    "s": 1e9, "second": 1e9, "sec": 1e9,
}  # fmt: skip
_BYTES: dict[str, float] = {
    "B": 1.0, "byte": 1.0, "bytes": 1.0,
    "KB": 1e3, "kB": 1e3, "Kbyte": 1e3, "kbyte": 1e3,
    "MB": 1e6, "Mbyte": 1e6, "GB": 1e9, "Gbyte": 1e9, "TB": 1e12, "Tbyte": 1e12,
    "KiB": 1024.0, "MiB": 1024.0**2, "GiB": 1024.0**3, "TiB": 1024.0**4,
}  # fmt: skip
_HERTZ: dict[str, float] = {
    "hz": 1.0, "Hz": 1.0, "khz": 1e3, "Khz": 1e3, "kHz": 1e3, "KHz": 1e3,
    "Mhz": 1e6, "MHz": 1e6, "Ghz": 1e9, "GHz": 1e9,
}  # fmt: skip
_SI_PREFIX = {"K": 1e3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_COUNT_UNITS = ("sector", "inst", "request", "warp", "block", "thread", "cycle", "sample", "pass", "cluster")


def _split_prefix(unit: str) -> tuple[str, float]:
    if len(unit) > 1 and unit[0] in _SI_PREFIX and unit[1:] in _COUNT_UNITS:
        return unit[1:], _SI_PREFIX[unit[0]]
    return unit, 1.0


@lru_cache(maxsize=None)
def normalize_unit(unit: str) -> tuple[str, float]:
    """Canonical spelling of an ncu unit and the factor that converts values into it.

    Time becomes ns, bytes become byte, frequencies hz (including old "cycle/nsecond"),
    rates "<thing>/s". Unknown units pass through unchanged with factor 1.
    """
    u = (unit or "").strip()
    if u in _TIME_NS:
        return "ns", _TIME_NS[u]
    if u in _BYTES:
        return "byte", _BYTES[u]
    if u in _HERTZ:
        return "hz", _HERTZ[u]
    if "/" in u:
        num, den = u.split("/", 1)
        if den in _TIME_NS:
            per_second = 1e9 / _TIME_NS[den]
            if num == "cycle":
                return "hz", per_second
            if num in _BYTES:
                return "byte/s", _BYTES[num] * per_second
            base, scale = _split_prefix(num)
            return f"{base}/s", scale * per_second
        return u, 1.0
    return _split_prefix(u)


# ---------------------------------------------------------------------------
# Names, grids, NVTX
# ---------------------------------------------------------------------------


def _strip_trailing_group(text: str, open_ch: str, close_ch: str) -> str:
    """Drop the balanced ``open_ch ... close_ch`` group that ends ``text``."""
    if not text.endswith(close_ch):
        return text
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        ch = text[i]
        if ch == close_ch:
            depth += 1
        elif ch == open_ch:
            depth -= 1
            if depth == 0:
                return text[:i].rstrip()
    return text


def short_function_name(demangled: str) -> str:
    """Bare function name of a demangled kernel signature (what ncu calls the FUNCTION base).

    ``void ns::<unnamed>::kern<float, (int)4>(float *, int)`` -> ``kern``.
    """
    text = (demangled or "").strip()
    text = _strip_trailing_group(text, "(", ")")
    text = _strip_trailing_group(text, "<", ">")
    # Last '::' component outside brackets, then drop a leading return type.
    depth = 0
    start = 0
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0 and text.startswith("::", i):
            start = i + 2
            i += 1
        elif depth == 0 and ch == " ":
            start = i + 1
        i += 1
    return text[start:].strip() or (demangled or "").strip()


_INTS = re.compile(r"-?\d+")


def _dims_text(text: str) -> str:
    """'(1024,1,1)' / '(1024, 1, 1)' -> '(1024, 1, 1)'; other text unchanged."""
    numbers = _INTS.findall(text or "")
    if len(numbers) == 3:
        return f"({numbers[0]}, {numbers[1]}, {numbers[2]})"
    return (text or "").strip()


def _dims_from_values(x: float | None, y: float | None, z: float | None) -> str:
    if x is None or y is None or z is None or any(math.isnan(v) for v in (x, y, z)):
        return ""
    return f"({int(x)}, {int(y)}, {int(z)})"


_CONVENTION = re.compile(r"^chz/(?P<variant>[^/]+)/(?P<dataset>[^/]+)/(?P<table>\d+)$")


def parse_nvtx_convention(name: str) -> tuple[str, str, int | None]:
    """(variant, dataset, table) of a range named ``chz/<variant>/<dataset>/<table>``, else ("", "", None)."""
    match = _CONVENTION.match((name or "").strip())
    if not match:
        return "", "", None
    return match["variant"], match["dataset"], int(match["table"])


def _nvtx_fields(stack: Sequence[str]) -> tuple[str, str, str, int | None]:
    """nvtx_range (innermost) and the convention fields of the innermost matching range."""
    innermost = stack[-1] if stack else ""
    for name in reversed(stack):
        variant, dataset, table = parse_nvtx_convention(name)
        if table is not None:
            return innermost, variant, dataset, table
    return innermost, "", "", None


def _report_nvtx_stack(action: Any) -> list[str]:
    """Push/pop range names of one action, outermost first.

    Ranges of several NVTX domains cannot be ordered against each other, so the
    default domain's stack goes last (its innermost range becomes ``nvtx_range``)
    and other domains' ranges are put in front, where only the naming-convention
    search still sees them.
    """
    state = action.nvtx_state()
    if state is None:
        return []
    stacks: list[list[str]] = []
    for domain_id in state.domains():
        domain = state.domain_by_id(domain_id)
        if domain is None:
            continue
        names = [str(n) for n in domain.push_pop_ranges()]
        if not names:
            continue
        if domain.name() == "<default domain>":
            stacks.insert(0, names)
        else:
            stacks.append(names)
    if not stacks:
        return []
    first, rest = stacks[0], [n for s in stacks[1:] for n in s]
    return rest + first


_QUOTED = re.compile(r'"([^"]*)"')


def _csv_nvtx_stack(cell: str) -> list[str]:
    """Range names from ncu's 'thread Domain:Push/Pop_Range:PL_Type:...:Msg' CSV cell.

    The cell holds the thread id, then one quoted ``domain:range:<6 attribute fields>``
    entry per stacked range, outermost first.
    """
    cell = (cell or "").strip()
    if not cell:
        return []
    entries = _QUOTED.findall(cell)
    if not entries:
        # A bare thread id means no range; anything else is taken as a plain name.
        return [] if cell.isdigit() else [cell]
    names = []
    for entry in entries:
        parts = entry.split(":")
        if len(parts) >= 8:
            names.append(":".join(parts[1:-6]))
        elif len(parts) >= 2:
            names.append(parts[1])
        else:
            names.append(entry)
    return [n for n in names if n]


# ---------------------------------------------------------------------------
# Frame assembly shared by both readers
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Kernel:
    """Per-launch fields repeated on every metric row of that kernel."""

    kernel_id: int
    kernel_name: str
    function: str
    nvtx_stack: tuple[str, ...]
    grid: str
    block: str
    device: str


def _frame(
    kernels: Sequence[_Kernel],
    counts: Sequence[int],
    metric_cols: dict[str, list[Any]],
    run: str,
    report: str,
) -> pd.DataFrame:
    """Build the tidy frame column-wise: kernel fields are repeated with numpy, not per row."""
    reps = np.asarray(counts, dtype=np.int64)
    total = int(reps.sum())
    fields = [_nvtx_fields(k.nvtx_stack) for k in kernels]

    def rep(values: Iterable[Any]) -> np.ndarray:
        return np.repeat(np.array(list(values), dtype=object), reps) if len(reps) else np.array([], dtype=object)

    tables = np.array([np.nan if f[3] is None else float(f[3]) for f in fields], dtype=np.float64)
    data = {
        "run": np.full(total, run, dtype=object),
        "report": np.full(total, report, dtype=object),
        "variant": rep(f[1] for f in fields),
        "dataset": rep(f[2] for f in fields),
        "table": pd.array(np.repeat(tables, reps), dtype="Int64"),  # nullable: <NA> off-convention
        "kernel_id": np.repeat(np.array([k.kernel_id for k in kernels], dtype=np.int64), reps),
        "kernel_name": rep(k.kernel_name for k in kernels),
        "function": rep(k.function for k in kernels),
        "nvtx_range": rep(f[0] for f in fields),
        "grid": rep(k.grid for k in kernels),
        "block": rep(k.block for k in kernels),
        "device": rep(k.device for k in kernels),
        "metric": np.array(metric_cols["metric"], dtype=object),
        "label": np.array(metric_cols["label"], dtype=object),
        "unit": np.array(metric_cols["unit"], dtype=object),
        "value": np.array(metric_cols["value"], dtype=np.float64),
        "value_text": np.array(metric_cols["value_text"], dtype=object),
    }
    return pd.DataFrame(data, columns=list(TIDY_COLUMNS))


def _empty_metric_cols() -> dict[str, list[Any]]:
    return {"metric": [], "label": [], "unit": [], "value": [], "value_text": []}


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


# ---------------------------------------------------------------------------
# CSV reader
# ---------------------------------------------------------------------------

_HEADER_START = re.compile(r'^\ufeff?\s*"?ID"?\s*,')
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d*)?(?:[eE][+-]?\d+)?$")
_IDENTITY_COLUMNS = frozenset(
    {"ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Kernel Time", "Context", "Stream",
     "Block Size", "Grid Size", "Device", "CC"}
)  # fmt: skip
_RULE_TYPES = {"OPT": "OPTIMIZATION", "WRN": "WARNING", "ERR": "ERROR", "INF": "OK", "OK": "OK"}


def _parse_number(text: str) -> float | None:
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
        hint = " (it looks like a binary .ncu-rep report: use read_report())" if raw.startswith(_REPORT_MAGIC) else ""
        raise ReportError(f"{path}: binary data, not an ncu CSV export{hint}")
    return raw.decode("utf-8-sig", errors="replace")


def _csv_table(path: Path) -> tuple[list[str], list[list[str]], list[str] | None]:
    """Header, kernel rows and (raw page) units row of an ncu CSV, skipping non-CSV lines.

    ncu interleaves its own ``==PROF==``/``==WARNING==`` lines and the program's output
    with the CSV when both go to one stream; rows whose first field is not a kernel ID
    are dropped, and rows may be ragged (rule rows and trailing commas).
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
    body = [line for line in lines[start:] if not line.lstrip().startswith("==")]
    records = list(csv.reader(body))
    header = [h.strip().lstrip("\ufeff") for h in records[0]]
    units: list[str] | None = None
    rows: list[list[str]] = []
    for row in records[1:]:
        if not row:
            continue
        first = row[0].strip()
        if first.isdigit() and len(row) >= 4:
            rows.append(row)
        elif first == "" and units is None and not rows and len(row) >= len(header) // 2:
            units = row
    if not rows:
        raise ReportError(f"{path}: an ncu CSV header but no kernel rows; ncu profiled nothing or the export was cut")
    return header, rows, units


def _cell(row: Sequence[str], index: int | None) -> str:
    if index is None or index >= len(row):
        return ""
    return row[index].strip()


def _friendly_to_metric(section: str, name: str) -> tuple[str, str]:
    """(raw metric, label) for one details-page 'Metric Name' in its section."""
    if _RAW_METRIC.match(name):
        return name, _LABEL_OF_METRIC.get(name, "")
    metric = FRIENDLY_METRICS.get((section, name)) or _FRIENDLY_BY_LABEL.get(name) or name
    return metric, name


def _append_value(cols: dict[str, list[Any]], metric: str, label: str, raw_unit: str, text: str) -> None:
    unit, factor = normalize_unit(raw_unit)
    number = _parse_number(text)
    cols["metric"].append(metric)
    cols["label"].append(label)
    cols["unit"].append(unit)
    if number is None:
        cols["value"].append(math.nan)
        cols["value_text"].append(text)
    else:
        cols["value"].append(number * factor)
        cols["value_text"].append("")


def _kernel_from_row(row: Sequence[str], idx: dict[str, int], nvtx_col: int | None) -> _Kernel:
    name = _cell(row, idx.get("Kernel Name"))
    return _Kernel(
        kernel_id=int(_cell(row, idx.get("ID"))),
        kernel_name=name,
        function=short_function_name(name),
        nvtx_stack=tuple(_csv_nvtx_stack(_cell(row, nvtx_col))),
        grid=_dims_text(_cell(row, idx.get("Grid Size"))),
        block=_dims_text(_cell(row, idx.get("Block Size"))),
        device=_cell(row, idx.get("Device")),
    )


def _nvtx_column(header: Sequence[str]) -> int | None:
    return next((i for i, h in enumerate(header) if "Push/Pop_Range" in h or h.strip().upper() == "NVTX"), None)


def read_csv(path: str | Path, run: str = "") -> pd.DataFrame:
    """Tidy frame from an ncu CSV export: details page (one row per metric) or raw page.

    Tolerates ncu/program output around the CSV, old and new unit spellings (values
    are normalised like read_report's), thousands separators and ragged rule rows.
    """
    path = _existing_file(path)
    header, rows, units = _csv_table(path)
    if "Metric Name" in header and "Metric Value" in header:
        return _read_details(path, header, rows, run)
    return _read_raw(path, header, rows, units, run)


def _read_details(path: Path, header: list[str], rows: list[list[str]], run: str) -> pd.DataFrame:
    idx = {h: i for i, h in enumerate(header)}
    nvtx_col = _nvtx_column(header)
    i_section, i_name = idx.get("Section Name"), idx["Metric Name"]
    i_unit, i_value = idx.get("Metric Unit"), idx["Metric Value"]
    i_rule = idx.get("Rule Name")
    per_kernel: dict[int, tuple[_Kernel, dict[str, list[Any]], set[str]]] = {}
    for row in rows:
        name = _cell(row, i_name)
        if not name or _cell(row, i_rule):
            continue  # rule rows carry no metric; rule_results() reads them
        kernel_id = int(_cell(row, idx.get("ID")))
        entry = per_kernel.get(kernel_id)
        if entry is None:
            entry = per_kernel[kernel_id] = (_kernel_from_row(row, idx, nvtx_col), _empty_metric_cols(), set())
        _, cols, seen = entry
        metric, label = _friendly_to_metric(_cell(row, i_section), name)
        if metric in seen:
            continue  # the same label listed twice (e.g. in two sections): keep the first
        seen.add(metric)
        _append_value(cols, metric, label, _cell(row, i_unit), _cell(row, i_value))
    if not per_kernel:
        raise ReportError(f"{path}: the CSV details page has no metric rows (rule rows only?)")
    return _assemble(per_kernel.values(), run, path.name)


def _read_raw(
    path: Path, header: list[str], rows: list[list[str]], units: list[str] | None, run: str
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
    for row in rows:
        kernel = _kernel_from_row(row, idx, nvtx_col)
        cols = _empty_metric_cols()
        for i, metric in metric_idx:
            _append_value(cols, metric, _LABEL_OF_METRIC.get(metric, ""), _cell(units or [], i), _cell(row, i))
        values = dict(zip(cols["metric"], cols["value"]))
        display = dict(zip(cols["metric"], cols["value_text"])).get("device__attribute_display_name", "")
        grid = kernel.grid or _dims_from_values(*(values.get(f"launch__grid_dim_{a}") for a in "xyz"))
        block = kernel.block or _dims_from_values(*(values.get(f"launch__block_dim_{a}") for a in "xyz"))
        kernel = _Kernel(
            kernel.kernel_id, kernel.kernel_name, kernel.function, kernel.nvtx_stack, grid, block,
            display or kernel.device,
        )  # fmt: skip
        entries.append((kernel, cols, set()))
    return _assemble(entries, run, path.name)


def _assemble(entries: Iterable[tuple[_Kernel, dict[str, list[Any]], set[str]]], run: str, report: str) -> pd.DataFrame:
    kernels: list[_Kernel] = []
    counts: list[int] = []
    cols = _empty_metric_cols()
    for kernel, kcols, _ in entries:
        kernels.append(kernel)
        counts.append(len(kcols["metric"]))
        for key in cols:
            cols[key].extend(kcols[key])
    return _frame(kernels, counts, cols, run, report)


# ---------------------------------------------------------------------------
# Dispatch
# ---------------------------------------------------------------------------

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def read_any(path: str | Path, run: str = "") -> pd.DataFrame:
    """Read an ncu report or CSV export, choosing the reader by extension, then by content."""
    path = _existing_file(path)
    name = path.name.lower()
    if name.endswith((".ncu-rep", ".ncu-repz")):
        return read_report(path, run)
    if name.endswith(".csv"):
        return read_csv(path, run)
    head = _read_head(path, 4096)
    if head.startswith((_REPORT_MAGIC, _ZSTD_MAGIC)):
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
    keys = [k for k in _KERNEL_KEYS if k in df.columns]
    info_cols = [c for c in _KERNEL_INFO if c in df.columns]
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
