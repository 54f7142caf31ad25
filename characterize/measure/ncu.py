"""Measure stage, profiling: locate Nsight Compute, build the ``ncu`` command, run it, classify failures.

This module owns the single place where an ``ncu`` argv is assembled
(:func:`build_argv`), the metric sets we ask for (:data:`METRIC_SETS`), and the
translation of ncu's console output into the toolkit's domain exceptions
(:func:`run_ncu`). Reading the report that ncu writes is the extract stage's job
(``characterize.extract.schema``).

Option spelling follows the Nsight Compute CLI documentation
(https://docs.nvidia.com/nsight-compute/NsightComputeCli/index.html); the notes next
to :func:`build_argv` record what it says about each option we pass.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from characterize import toolchain
from characterize.errors import ConfigError, NcuError, NcuNamedMissing, NcuNotFound, NcuPermissionError
from characterize.extract.schema import HOPPER_STALL_REASONS, STALL_REASONS, stall_metric
from characterize.measure.lifeline import parent_death_preexec

__all__ = [
    "STALL_REASONS",
    "HOPPER_STALL_REASONS",
    "MetricSet",
    "METRIC_SETS",
    "NcuOptions",
    "stall_metric",
    "find_ncu",
    "ncu_version",
    "export_path",
    "nvtx_push_pop_filter",
    "build_argv",
    "run_ncu",
    "CACHE_METRICS",
    "CACHE_REPLAY_MODE",
    "CACHE_SINGLE_PASS_MODE",
    "PANEL_METRICS",
    "CLOCK_METRICS",
    "cache_argv",
    "replay_modes",
]

# ---------------------------------------------------------------------------
# Metric sets
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricSet:
    """A named bundle of ncu sections and metrics collected together."""

    name: str  # registry key, e.g. "default"
    metrics: tuple[str, ...]  # raw metric names passed to --metrics on every GPU
    sections: tuple[str, ...]  # section identifiers passed as --section
    description: str  # one line for CLI help and reports
    # Metrics that exist only from a given SM version on: (metric, min_sm) pairs.
    arch_metrics: tuple[tuple[str, int], ...] = ()

    def metrics_for(self, sm: int | None) -> tuple[str, ...]:
        """Metrics to request on SM version ``sm`` (e.g. 80, 90); None = portable only."""
        extra = tuple(m for m, min_sm in self.arch_metrics if sm is not None and sm >= min_sm)
        return self.metrics + extra


_PORTABLE_STALLS = tuple(r for r in STALL_REASONS if r not in HOPPER_STALL_REASONS)

#: the SM clock each kernel ran at (SpeedOfLight's "SM Frequency"), in every metric set: what
#: bench's NVML clock samples are compared with (the cache collection leaves it out: it asks for
#: as few counters as one replay pass can hold, see CACHE_SINGLE_PASS_MODE)
CLOCK_METRICS: tuple[str, ...] = ("gpc__cycles_elapsed.avg.per_second",)

_DEFAULT_METRICS: tuple[str, ...] = (
    "gpu__time_duration.sum",
    "sm__warps_active.avg.pct_of_peak_sustained_active",  # achieved occupancy
    "sm__maximum_warps_per_active_cycle_pct",  # theoretical occupancy
    "launch__registers_per_thread",
    "launch__occupancy_limit_blocks",
    "launch__occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem",
    "launch__occupancy_limit_warps",
    "launch__block_size",
    "launch__grid_size",
    *(stall_metric(r) for r in _PORTABLE_STALLS),
    "lts__t_sector_hit_rate.pct",
    "l1tex__t_sector_hit_rate.pct",
    "lts__t_bytes.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    *CLOCK_METRICS,
)

#: What the report's panels read beyond the sections below (analysis.ncu.RAW names them): the
#: memory chart (MemoryWorkloadAnalysis_Chart: L1 requests and sectors, L2 sectors from L1,
#: L1<->L2 bytes), instructions and IPC (ComputeWorkloadAnalysis: the issue ceiling the model
#: reads), waves per SM (LaunchStats) and the bandwidth roofline (bytes per second and peak
#: bytes per cycle of DRAM, L2 and L1, with their clocks). Measured on an H200 (profiles/h200/
#: ncu-probe): the five default sections and raw metrics took 18 replay passes, those plus the
#: chart, compute, instruction, scheduler, source and roofline sections 36.
PANEL_METRICS: tuple[str, ...] = (
    "launch__waves_per_multiprocessor",
    "smsp__inst_issued.sum",
    "smsp__inst_executed.sum",
    "sm__inst_executed.avg.per_cycle_active",
    "sm__inst_issued.avg.per_cycle_active",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
    "l1tex__m_xbar2l1tex_read_bytes.sum",
    "l1tex__m_l1tex2xbar_write_bytes.sum",
    "lts__t_sectors_srcunit_tex_op_read.sum",
    "lts__t_sectors_srcunit_tex_op_write.sum",
    "lts__t_sectors.sum",
    "dram__bytes.sum.per_second",
    "dram__bytes.sum.peak_sustained",
    "dram__cycles_elapsed.avg.per_second",
    "lts__t_bytes.sum.per_second",
    "lts__t_bytes.sum.peak_sustained",
    "lts__cycles_elapsed.avg.per_second",
    "l1tex__t_bytes.sum.per_second",
    "l1tex__t_bytes.sum.peak_sustained",
    "l1tex__cycles_elapsed.avg.per_second",
    "smsp__warps_eligible.avg.per_cycle_active",
    "smsp__issue_active.avg.per_cycle_active",
)

#: Cache counters that kernel replay would warm: with --cache-control none each replay
#: pass of a kernel sees the L2 the previous pass left, and the default set needs many
#: passes, so L2 hit rate and DRAM bytes would come out optimistic. They are collected
#: apart, under application replay (the program runs again for every pass, so every
#: pass sees the cache state the program itself produced before the kernel).
CACHE_METRICS: tuple[str, ...] = (
    "lts__t_sector_hit_rate.pct",
    "lts__t_sectors.sum",
    "lts__t_bytes.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
)
CACHE_REPLAY_MODE = "application"
#: the cache counters under kernel replay when ncu needed one pass per kernel: nothing was
#: replayed, so each kernel saw the cache state the program left (measure.runner tries it first)
CACHE_SINGLE_PASS_MODE = "kernel, 1 pass"

METRIC_SETS: Mapping[str, MetricSet] = {
    "default": MetricSet(
        name="default",
        metrics=_DEFAULT_METRICS + PANEL_METRICS,
        sections=("LaunchStats", "Occupancy", "WarpStateStats", "MemoryWorkloadAnalysis", "SpeedOfLight"),
        description="occupancy, warp stalls, L1/L2 hit rates, DRAM traffic, duration, the memory chart's "
                    "requests and sectors, instructions and IPC, waves, and bandwidths against their peaks",
        arch_metrics=tuple((stall_metric(r), 90) for r in HOPPER_STALL_REASONS),
    ),
    "quick": MetricSet(
        name="quick",
        metrics=(
            "gpu__time_duration.sum",
            "sm__warps_active.avg.pct_of_peak_sustained_active",
            "lts__t_sector_hit_rate.pct",
            "dram__bytes_read.sum",
            "dram__bytes_write.sum",
            *CLOCK_METRICS,
        ),
        sections=(),
        description="duration, achieved occupancy, L2 hit rate, DRAM bytes and SM clock only (few replay passes)",
    ),
    "cache": MetricSet(
        name="cache",
        metrics=CACHE_METRICS + CLOCK_METRICS,
        sections=(),
        description="L2 hit rate, L2 sectors and bytes, DRAM bytes (the counters replay must not warm), SM clock",
    ),
}

# ---------------------------------------------------------------------------
# Options
# ---------------------------------------------------------------------------

_CACHE_CONTROL = ("none", "all")
_CLOCK_CONTROL = ("base", "none")
_REPLAY_MODES = ("kernel", "application", "range", "app-range")
_TARGET_PROCESSES = ("all", "application-only")
_METRIC_NAME = re.compile(r"^[A-Za-z0-9_.:]+$")


@dataclass(frozen=True)
class NcuOptions:
    """How to profile: what to collect, and under which cache/clock/replay regime."""

    # Key into METRIC_SETS.
    metric_set: str = "default"
    # Raw metric names added to the set's --metrics list.
    extra_metrics: tuple[str, ...] = ()
    # "none" keeps L2 contents between replays (needed to see L2 pinning); ncu's own
    # default "all" flushes every cache before each replay pass.
    cache_control: str = "none"
    # "base" locks clocks to base frequency (comparable runs, slower than real);
    # "none" leaves clocks alone. Passed explicitly because newer ncu changed its default.
    clock_control: str = "base"
    # "kernel" replays each kernel; "application" reruns the program; "range"/"app-range"
    # profile whole NVTX/profiler ranges (then nvtx_include should select them).
    replay_mode: str = "kernel"
    # NVTX filter expressions, one --nvtx-include each (see nvtx_push_pop_filter).
    nvtx_include: tuple[str, ...] = ()
    # Profile at most this many kernel launches (None: all that match).
    launch_count: int | None = None
    # Regular expression on the kernel's function name (None: every kernel).
    kernel_name: str | None = None
    # "all" follows child processes (python launchers, torchrun); "application-only" does not.
    target_processes: str = "all"
    # Target SM version (80 = A100, 90 = H100/H800); enables arch-only metrics such as
    # the Hopper gmma stall. None requests portable metrics only.
    sm: int | None = None
    # Pass "--config-file off" so a stray config.ncu-cfg in the working directory or
    # home cannot silently change the collection.
    ignore_config_file: bool = True

    def validate(self) -> None:
        """Raise ConfigError naming the bad field, its value and the allowed values."""
        if self.metric_set not in METRIC_SETS:
            raise ConfigError(
                f"unknown ncu metric set {self.metric_set!r}; choose one of {sorted(METRIC_SETS)}"
            )
        _check_choice("cache_control", self.cache_control, _CACHE_CONTROL)
        _check_choice("clock_control", self.clock_control, _CLOCK_CONTROL)
        _check_choice("replay_mode", self.replay_mode, _REPLAY_MODES)
        _check_choice("target_processes", self.target_processes, _TARGET_PROCESSES)
        _check_str_tuple("extra_metrics", self.extra_metrics)
        for metric in self.extra_metrics:
            if not _METRIC_NAME.match(metric):
                raise ConfigError(
                    f"extra_metrics entry {metric!r} is not a metric name (letters, digits, '_', '.', ':' "
                    "only; give several metrics as separate tuple entries, not one comma-joined string)"
                )
        _check_str_tuple("nvtx_include", self.nvtx_include)
        if any(not f.strip() for f in self.nvtx_include):
            raise ConfigError("nvtx_include holds an empty filter; remove it or give a range name")
        if self.launch_count is not None and (
            isinstance(self.launch_count, bool) or not isinstance(self.launch_count, int) or self.launch_count < 1
        ):
            raise ConfigError(f"launch_count must be a positive integer or None, got {self.launch_count!r}")
        if self.kernel_name is not None:
            if not isinstance(self.kernel_name, str) or not self.kernel_name:
                raise ConfigError(
                    f"kernel_name must be a non-empty regular expression or None, got {self.kernel_name!r}"
                )
            try:
                re.compile(self.kernel_name)
            except re.error as exc:
                raise ConfigError(
                    f"kernel_name {self.kernel_name!r} is not a valid regular expression: {exc}"
                ) from None
        if self.sm is not None and (isinstance(self.sm, bool) or not isinstance(self.sm, int) or self.sm < 50):
            raise ConfigError(f"sm must be an SM version such as 80 or 90, or None; got {self.sm!r}")


def _check_choice(name: str, value: object, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {list(allowed)}, got {value!r}")


def _check_str_tuple(name: str, value: object) -> None:
    # A bare string is a sequence of characters: catch it before it becomes N options.
    if isinstance(value, str) or not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{name} must be a tuple of strings, got {value!r}")


# ---------------------------------------------------------------------------
# Locating ncu
# ---------------------------------------------------------------------------

def find_ncu(explicit: str | Path | None = None, *, places: toolchain.Places = toolchain.Places()) -> Path:
    """Locate the ncu executable (characterize.toolchain: the search every CUDA tool
    shares; Nsight Compute's own /opt/nvidia/nsight-compute/<version>/ncu included): a
    path given explicitly (--ncu) must exist; then $CHARACTERIZE_NCU, PATH, $CUDA_HOME,
    /usr/local/cuda*, the newest Nsight Compute."""
    try:
        found = toolchain.find("ncu", "CHARACTERIZE_NCU", explicit, places)
    except toolchain.ToolNamedMissing as e:
        raise NcuNamedMissing(f"the ncu {'given explicitly' if e.where == 'given' else 'named by ' + e.where} "
                          f"({e.path}) {e.why}; pass the path of the Nsight Compute command-line profiler, e.g. "
                          "--ncu /usr/local/cuda/bin/ncu") from None
    if found is None:
        raise NcuNotFound(
            f"Nsight Compute (ncu) was not found; searched: {toolchain.searched('ncu', 'CHARACTERIZE_NCU', places)}. "
            "Install Nsight Compute (it ships with the CUDA toolkit, or as a standalone download from NVIDIA), put "
            "its directory on PATH or set CUDA_HOME, or pass the executable with --ncu PATH.")
    return found[0]


_VERSION_LINE = re.compile(r"Version\s+(\d+(?:\.\d+)+)")


def ncu_version(ncu: Path) -> str:
    """Version string of an ncu executable, e.g. '2025.3.1.0' (recorded in run metadata)."""
    try:
        proc = subprocess.run([str(ncu), "--version"], capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        raise NcuNotFound(f"ncu executable {ncu} does not exist; check --ncu or your PATH") from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NcuError(f"could not run '{ncu} --version': {exc}") from None
    text = (proc.stdout or "") + (proc.stderr or "")
    match = _VERSION_LINE.search(text)
    if proc.returncode != 0 or not match:
        tail = text.strip().splitlines()[-3:]
        raise NcuError(
            f"'{ncu} --version' gave no version (exit code {proc.returncode}); output: {' | '.join(tail) or '(none)'}. "
            "Is this really the Nsight Compute CLI?"
        )
    return match.group(1)


# ---------------------------------------------------------------------------
# Building the command
# ---------------------------------------------------------------------------

_REPORT_SUFFIXES = (".ncu-rep", ".ncu-repz")


def export_path(export: str | Path) -> Path:
    """The report file ncu will write for ``--export export``.

    Without an extension ncu appends its version's default (``.ncu-rep``, or
    ``.ncu-repz`` from Nsight Compute 2026.3 on), so we always pass an explicit
    ``.ncu-rep`` to keep the file name predictable across versions.
    """
    path = Path(export)
    if path.name.endswith(_REPORT_SUFFIXES):
        return path
    return path.with_name(path.name + ".ncu-rep")


# NVTX filter syntax, as the Nsight Compute CLI docs describe it ("NVTX Filtering",
# https://docs.nvidia.com/nsight-compute/NsightComputeCli/index.html#nvtx-filtering):
#   * filters only apply with --nvtx; each --nvtx-include/--nvtx-exclude adds one
#     expression; a kernel is profiled when any include matches and no exclude does;
#   * "Range A" names a start/end range; a trailing "/" ("Range A/") makes it a
#     push/pop range, i.e. what nvtxRangePush / torch.cuda.nvtx.range_push create;
#   * "Domain A@Range A/" selects a non-default domain (domain comes first);
#   * push/pop nesting: "A/B" (B directly inside A), "A/*/B" (zero or more ranges in
#     between), "A/+/B" (exactly one), "[A" (A at the bottom of the stack),
#     "B]" (B at the top of the stack);
#   * "regex:" in front makes the range names regular expressions ("regex:iter_[0-9]+/");
#   * a character that is also a quantifier (/ [ ] + *) is taken literally when
#     escaped with a backslash.
# Our own ranges ("chz/<variant>/<dataset>/<table>") contain "/", so they must be
# escaped; nvtx_push_pop_filter does that.
_NVTX_QUANTIFIERS = re.compile(r"([/\[\]+*])")


def nvtx_push_pop_filter(range_name: str, *, domain: str | None = None) -> str:
    """ncu --nvtx-include expression matching the push/pop range ``range_name`` exactly.

    Escapes ncu's NVTX quantifier characters in the name and appends the "/" that
    marks a push/pop range, e.g. ``chz/base/medium/3`` -> ``chz\\/base\\/medium\\/3/``.
    """
    if not range_name:
        raise ConfigError("an NVTX range name must not be empty")
    if "@" in range_name:
        raise ConfigError(
            f"NVTX range name {range_name!r} contains '@', which ncu reads as the domain separator; "
            "rename the range or pass domain= separately"
        )
    escaped = _NVTX_QUANTIFIERS.sub(r"\\\1", range_name) + "/"
    return f"{domain}@{escaped}" if domain else escaped


def build_argv(ncu: Path, options: NcuOptions, export: Path, target: Sequence[str]) -> list[str]:
    """The complete ncu command line for profiling ``target`` (the one place argv is built).

    What the Nsight Compute CLI docs say about each option used here:
      --export <path>           write the report to <path> (we always give the extension)
      --force-overwrite         overwrite an existing report instead of failing
      --config-file off         ignore config.ncu-cfg files (cwd, then ~/.config/NVIDIA Corporation)
      --cache-control all|none  flush all GPU caches before each replay pass, or never
      --clock-control base|none lock GPC and memory clocks to base frequency, or leave them
      --replay-mode kernel|application|range|app-range   how passes are replayed
      --target-processes all|application-only            also profile child processes or not
      --nvtx                    enable NVTX support: the report records each kernel's NVTX
                                state (extract reads our chz/... ranges from it) and
                                --nvtx-include filters become active
      --nvtx-include <expr>     one filter expression per option (syntax above)
      --section <id>            collect a section (repeatable)
      --metrics a,b,c           collect extra raw metrics (comma-separated, one option)
      --launch-count N          stop after N profiled launches
      -k regex:<expr>           kernel-name filter; "regex:" turns it into a regular
                                expression, matched against the function name by default
                                (--kernel-name-base function)
    The target command follows the options verbatim.
    """
    options.validate()
    if isinstance(target, str) or not target:
        raise ConfigError("target must be a non-empty sequence of program arguments, e.g. ['python', 'bench.py']")
    metric_set = METRIC_SETS[options.metric_set]
    metrics = list(dict.fromkeys((*metric_set.metrics_for(options.sm), *options.extra_metrics)))

    argv: list[str] = [str(ncu), "--export", str(export_path(export)), "--force-overwrite"]
    if options.ignore_config_file:
        argv += ["--config-file", "off"]
    argv += [
        "--cache-control", options.cache_control,
        "--clock-control", options.clock_control,
        "--replay-mode", options.replay_mode,
        "--target-processes", options.target_processes,
        "--nvtx",
    ]  # fmt: skip
    for expression in options.nvtx_include:
        argv += ["--nvtx-include", expression]
    for section in metric_set.sections:
        argv += ["--section", section]
    if metrics:
        argv += ["--metrics", ",".join(metrics)]
    if options.launch_count is not None:
        argv += ["--launch-count", str(options.launch_count)]
    if options.kernel_name is not None:
        argv += ["-k", f"regex:{options.kernel_name}"]
    argv += [str(a) for a in target]
    return argv


def cache_argv(argv: Sequence[str], export: Path, replay_mode: str = CACHE_REPLAY_MODE) -> list[str]:
    """The cache collection that goes with a point's main ncu command ``argv``: the same
    ncu, options, scoping (NVTX range or launch order) and target, but only
    CACHE_METRICS, no sections, under `replay_mode` (application replay unless the
    caller tries kernel replay, which holds when every kernel needs one pass), written to
    ``export``."""
    argv = [str(a) for a in argv]
    if "--replay-mode" not in argv or "--export" not in argv:
        raise ConfigError("cache_argv needs an ncu command built by build_argv")
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("--section", "--metrics"):  # dropped; the cache metrics are added below
            i += 2
            continue
        if a == "--replay-mode":
            out += [a, replay_mode]
            i += 2
            continue
        if a == "--export":
            out += [a, str(export_path(export))]
            i += 2
            continue
        if a == "--nvtx":  # options end with the NVTX switch and its filters
            out.append(a)
            i += 1
            while i < len(argv) and argv[i] == "--nvtx-include":
                out += argv[i:i + 2]
                i += 2
            out += ["--metrics", ",".join(CACHE_METRICS)]
            continue
        out.append(a)
        i += 1
    return out


def replay_modes(options: NcuOptions, *, cache_collected: bool = True,
                 cache_mode: str = CACHE_REPLAY_MODE) -> dict[str, str]:
    """The replay mode each metric's value comes from: "default" for every metric of
    the main collection (its sections included), each CACHE_METRICS entry apart
    (`cache_mode`: application replay, or kernel replay of one pass)."""
    modes = {"default": options.replay_mode}
    for metric in CACHE_METRICS:
        modes[metric] = cache_mode if cache_collected else options.replay_mode
    return modes


# ---------------------------------------------------------------------------
# Running ncu
# ---------------------------------------------------------------------------

_PERMISSION_HELP = (
    "ncu could not read the GPU performance counters (ERR_NVGPUCTRPERM): the NVIDIA driver restricts "
    "them to administrators. Either run the profile as root (e.g. with sudo; in a container, start it "
    "with --cap-add=SYS_ADMIN), or have an administrator allow all users: add the line "
    "'options nvidia NVreg_RestrictProfilingToAdminUsers=0' to a file in /etc/modprobe.d/, then reload "
    "the nvidia kernel modules or reboot (rebuild the initramfs first where the driver loads from it). "
    "Details: https://developer.nvidia.com/ERR_NVGPUCTRPERM"
)

_DRAIN_SECONDS = 60.0
_APP_ERROR = re.compile(r"application returned an error code \((-?\d+)\)")
_TAIL_LINES = 8


def _attach(exc: Exception, **attrs: object) -> Exception:
    for key, value in attrs.items():
        setattr(exc, key, value)
    return exc


def _ncu_error(
    message: str,
    *,
    reason: str,
    returncode: int | None,
    log_path: Path,
    target_returncode: int | None = None,
    output: str = "",
    cls: type[Exception] = NcuError,
) -> Exception:
    """A domain exception carrying what callers need to react without parsing text.

    Attributes: ``reason`` ("permission", "no_kernels", "target_failed", "ncu_failed",
    "timeout", "launch_failed"), ``returncode`` (ncu's exit status, None if it never
    exited), ``target_returncode`` (the profiled program's exit code as ncu reported
    it, else None), ``log_path`` and ``output`` (the full captured text).
    """
    return _attach(
        cls(message),
        reason=reason,
        returncode=returncode,
        target_returncode=target_returncode,
        log_path=log_path,
        output=output,
    )


def _filters_in(argv: Sequence[str]) -> list[str]:
    wanted = {"--nvtx-include", "-k", "--kernel-name", "--launch-count", "-c"}
    return [f"{a} {b}" for a, b in zip(argv, argv[1:]) if a in wanted]


def run_ncu(
    argv: Sequence[str],
    log_path: Path,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    *,
    echo: TextIO | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run an ncu command, tee its combined stdout/stderr into ``log_path``, classify failures.

    Returns the CompletedProcess (``stdout`` holds the combined output) when ncu
    profiled something. Raises NcuPermissionError for ERR_NVGPUCTRPERM, NcuError when
    no kernel matched, when ncu or the profiled program failed (``target_returncode``
    tells them apart), or on timeout; NcuNotFound when argv[0] cannot be executed.
    ``echo``, if given, receives every line as it arrives (e.g. sys.stderr).
    """
    argv = [str(a) for a in argv]
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    with open(log_path, "w", encoding="utf-8", errors="replace") as log:
        log.write("$ " + shlex.join(argv) + "\n")
        log.flush()
        try:
            proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                errors="replace",
                bufsize=1,
                env=dict(env) if env is not None else None,
                start_new_session=True,  # own process group: a timeout kills ncu and its target
                preexec_fn=parent_death_preexec(signal.SIGTERM),  # and so does our death, even by SIGKILL
            )
        except FileNotFoundError:
            raise NcuNotFound(
                f"cannot execute {argv[0]}: no such file; locate ncu with find_ncu() or pass --ncu PATH"
            ) from None
        except PermissionError:
            raise NcuNotFound(f"cannot execute {argv[0]}: permission denied (not an executable?)") from None
        except OSError as exc:
            raise _ncu_error(
                f"could not start {argv[0]}: {exc}", reason="launch_failed", returncode=None, log_path=log_path
            ) from None

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if log.closed:  # a stray grandchild kept the pipe open past our deadline
                    continue
                log.write(line)
                if echo is not None:
                    echo.write(line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            returncode = proc.wait(timeout=timeout)
        except KeyboardInterrupt:  # ncu runs in its own session: take it down with us
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            raise
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            reader.join(timeout=5)
            log.write(f"\n[characterize] killed after {timeout} s timeout\n")
            raise _ncu_error(
                f"ncu did not finish within {timeout} s and was killed (with the profiled program). "
                "Profile fewer launches (launch_count), narrow the NVTX filter, use the 'quick' metric set, "
                f"or raise the timeout. Output so far: {log_path}",
                reason="timeout",
                returncode=None,
                log_path=log_path,
                output="".join(lines),
            ) from None
        # A daemon the program left behind may hold the pipe open after ncu exits: do not wait forever.
        reader.join(timeout=_DRAIN_SECONDS)

    output = "".join(lines)
    _classify(output, returncode, argv, log_path)
    return subprocess.CompletedProcess(argv, returncode, stdout=output, stderr=None)


def _classify(output: str, returncode: int, argv: Sequence[str], log_path: Path) -> None:
    """Raise the domain exception that matches ncu's output, or return if all is well."""
    if "ERR_NVGPUCTRPERM" in output:
        raise _ncu_error(
            _PERMISSION_HELP + f" (ncu log: {log_path})",
            reason="permission",
            returncode=returncode,
            log_path=log_path,
            output=output,
            cls=NcuPermissionError,
        )
    error_lines = [ln.strip() for ln in output.splitlines() if ln.lstrip().startswith("==ERROR==")]
    no_kernels = "No kernels were profiled" in output
    app = _APP_ERROR.search(output)
    target_returncode = int(app.group(1)) if app else None
    if returncode != 0 or error_lines:
        tail = " | ".join(error_lines[-_TAIL_LINES:]) or " | ".join(output.strip().splitlines()[-3:]) or "(no output)"
        if target_returncode is not None:
            head = (
                f"the profiled program exited with code {target_returncode} under ncu (ncu exit code {returncode}); "
                "run it without ncu first to check it works"
            )
            reason = "target_failed"
        else:
            head = f"ncu failed (exit code {returncode})"
            reason = "ncu_failed"
        if no_kernels:
            head += "; no kernels were profiled"
        raise _ncu_error(
            f"{head}. Last errors: {tail}. Full log: {log_path}",
            reason=reason,
            returncode=returncode,
            target_returncode=target_returncode,
            log_path=log_path,
            output=output,
        )
    if no_kernels:
        filters = _filters_in(argv)
        hint = f" Filters in effect: {', '.join(filters)}." if filters else ""
        raise _ncu_error(
            "ncu ran but profiled no kernels: the NVTX filter (--nvtx-include), kernel-name regex or "
            "launch count matched no kernel launch, or the program launched no CUDA kernels."
            f"{hint} Check the range names the program pushes (push/pop filters need a trailing '/'). "
            f"Full log: {log_path}",
            reason="no_kernels",
            returncode=returncode,
            log_path=log_path,
            output=output,
        )
