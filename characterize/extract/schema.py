"""Extract stage, schema: the tidy columns every reader returns, friendly metric names,
unit normalization, kernel names and the NVTX naming convention.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

#: Warp-stall reasons reported by the WarpStateStats section, in ncu's own
#: spelling. ``gmma`` (warpgroup MMA) exists only on Hopper (sm_90) and later.
STALL_REASONS: tuple[str, ...] = (
    "barrier",
    "branch_resolving",
    "dispatch_stall",
    "drain",
    "imc_miss",
    "lg_throttle",
    "long_scoreboard",
    "math_pipe_throttle",
    "membar",
    "mio_throttle",
    "misc",
    "no_instruction",
    "not_selected",
    "selected",
    "short_scoreboard",
    "sleeping",
    "tex_throttle",
    "wait",
    "gmma",
)


#: Stall reasons whose counters do not exist before sm_90. Asking ncu for a metric
#: the GPU lacks aborts the profile ("==ERROR== Failed to find metric ..."), so these
#: are only requested when the target SM is known to have them.
HOPPER_STALL_REASONS: tuple[str, ...] = ("gmma",)


def stall_metric(reason: str) -> str:
    """Raw metric name of one stall reason, in cycles per issued instruction."""
    return f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"


TIDY_COLUMNS: tuple[str, ...] = (
    "run", "report", "variant", "dataset", "table",
    "kernel_id", "kernel_name", "function", "nvtx_range", "grid", "block", "device",
    "metric", "label", "unit", "value", "value_text",
)  # fmt: skip

RULE_COLUMNS: tuple[str, ...] = (
    "run", "report", "kernel_id", "kernel_name", "section", "rule", "rule_name",
    "message_type", "title", "message", "speedup_type", "estimated_speedup",
)  # fmt: skip

TIDY_KERNEL_KEYS = ["run", "report", "kernel_id"]
TIDY_KERNEL_INFO = ["kernel_name", "function", "nvtx_range", "variant", "dataset", "table", "grid", "block", "device"]

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
FRIENDLY_BY_LABEL = _unique_labels(FRIENDLY_METRICS)
# Reverse direction, to give raw-named CSV rows the same label the report carries.
LABEL_OF_METRIC: dict[str, str] = {}
for (_section, _label), _metric in FRIENDLY_METRICS.items():
    LABEL_OF_METRIC.setdefault(_metric, _label)

RAW_METRIC = re.compile(r"^[a-z][a-z0-9_]*__[A-Za-z0-9_.]+$")

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


def dims_text(text: str) -> str:
    """'(1024,1,1)' / '(1024, 1, 1)' -> '(1024, 1, 1)'; other text unchanged."""
    numbers = _INTS.findall(text or "")
    if len(numbers) == 3:
        return f"({numbers[0]}, {numbers[1]}, {numbers[2]})"
    return (text or "").strip()


def dims_from_values(x: float | None, y: float | None, z: float | None) -> str:
    """'(x, y, z)' from three launch dimensions, '' when any is missing or NaN."""
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


def report_nvtx_stack(action: Any) -> list[str]:
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


def csv_nvtx_stack(cell: str) -> list[str]:
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
class KernelFields:
    """Per-launch fields repeated on every metric row of that kernel."""

    kernel_id: int
    kernel_name: str
    function: str
    nvtx_stack: tuple[str, ...]
    grid: str
    block: str
    device: str


def tidy_frame(
    kernels: Sequence[KernelFields],
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


def empty_metric_cols() -> dict[str, list[Any]]:
    """Empty per-metric columns (metric, label, unit, value, value_text) for tidy_frame to fill."""
    return {"metric": [], "label": [], "unit": [], "value": [], "value_text": []}
