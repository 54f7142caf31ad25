"""Domain exceptions: the library raises these, the CLI turns them into messages.

Every error carries a message meant for a person (what went wrong and what to do),
so the CLI can print it verbatim and exit with the class's exit code instead of a
traceback.
"""

from __future__ import annotations

import errno
import os
import re


class CharacterizeError(Exception):
    """Base class of every error the toolkit raises on purpose. Its message is one line;
    `detail` may carry more (a compiler's output), which the CLI prints above it."""

    exit_code = 2

    def __init__(self, *args: object, detail: str = "") -> None:
        super().__init__(*args)
        self.detail = detail


class ConfigError(CharacterizeError, ValueError):
    """A configuration value is out of range or inconsistent."""


class OutputError(CharacterizeError, ValueError):
    """An output path that must not be written: a device, a FIFO, a directory, or one of
    the command's own inputs (writing would destroy it)."""


class MissingInput(ConfigError):
    """A value the input cannot tell (a trace file's embedding dimension, say) was not given;
    `names` are the options that give it (the CLI asks for them on a terminal)."""

    def __init__(self, message: str, names: "list[str] | tuple[str, ...]" = ()) -> None:
        super().__init__(message)
        self.names = tuple(names)


class WorkloadError(CharacterizeError, ValueError):
    """A trace is malformed, truncated or holds out-of-range indices."""


class ToolchainNotFound(CharacterizeError):
    """No usable nvcc (or host compiler) was found."""

    exit_code = 3


class NamedToolMissing(CharacterizeError):
    """A tool named explicitly (--ncu PATH) or by its environment variable
    ($CHARACTERIZE_NVCC, ...) is not an executable file: an error, never a reason to skip
    a step or to fall back to another copy of the tool."""


class ToolchainNamedMissing(ToolchainNotFound, NamedToolMissing):
    """nvcc, cuobjdump or nvdisasm named by $CHARACTERIZE_* is missing."""


class BuildError(CharacterizeError):
    """nvcc or the host compiler failed on a kernel source."""

    exit_code = 3


class UnsupportedShape(CharacterizeError, ValueError):
    """A variant cannot compute this shape correctly and refuses to run it."""


class NoCudaDevice(CharacterizeError):
    """The operation needs a CUDA GPU and none is visible."""

    exit_code = 4


class KernelLaunchError(CharacterizeError):
    """A kernel launch or CUDA runtime call returned an error."""

    exit_code = 5


class NcuNotFound(CharacterizeError):
    """No Nsight Compute command-line profiler could be located."""

    exit_code = 6


class NcuNamedMissing(NcuNotFound, NamedToolMissing):
    """The ncu given with --ncu or $CHARACTERIZE_NCU is missing."""


class NcuPermissionError(CharacterizeError):
    """Performance counters are restricted to admin users (ERR_NVGPUCTRPERM)."""

    exit_code = 6


class NcuError(CharacterizeError):
    """ncu ran but failed for another reason."""

    exit_code = 6


class ReportError(CharacterizeError, ValueError):
    """A profiler report or CSV export is corrupt, truncated or not a report."""

    exit_code = 7


class RunDirError(CharacterizeError):
    """A run directory is missing, incomplete or inconsistent."""

    exit_code = 8


class RunDirLocked(RunDirError):
    """Another live process is writing the run directory (two writers would measure twice)."""


class StepsFailed(CharacterizeError):
    """A run finished, but some of its steps failed (what finished is kept and reported)."""

    exit_code = 9


class GpuMemoryError(CharacterizeError):
    """The configuration does not fit in the target GPU's memory."""


class MemoryBudgetError(CharacterizeError):
    """Generating, loading or analyzing a workload would need more host memory than the
    budget allows; refused before allocating, instead of swapping or being killed."""


class SchedulerError(CharacterizeError):
    """A cluster scheduler (Slurm, through submitit) cannot be used or refused a
    submission: no Slurm client here, no submitit, a bad partition or time limit."""

    exit_code = 10


class CheckMismatch(CharacterizeError):
    """A variant's output did not match torch on a point's own data on the device: the
    point is recorded as failed with its maximum error, and neither timed nor profiled."""

    exit_code = 11


class MeasurementError(CharacterizeError):
    """A point's timings are not times: every repetition's subtraction (the batch minus its
    pre-passes timed alone) came out at or below zero, the noise larger than the kernel.
    The point is recorded as failed with that reason instead of a negative latency."""

    exit_code = 13


class PointsFailed(CharacterizeError):
    """bench or profile finished, but points of it failed (or their jobs vanished): what
    finished is kept, and `--resume` measures the failed points again."""

    exit_code = 13


class OutOfTime(CharacterizeError):
    """A step's time budget (--budget) ran out before all its points were measured: what
    finished is kept, the rest is cut (not failed), and `--resume` measures it."""

    exit_code = 13


class FileSystemError(CharacterizeError):
    """The operating system refused a file operation (disk full, read-only, permission,
    a file where a directory belongs, a name too long): one line naming the path and the
    operation instead of a traceback."""

    exit_code = 12


#: what to do about each errno a user can meet while the toolkit reads and writes files
_ADVICE = {
    errno.ENOSPC: "free space on that file system or write elsewhere",
    errno.EDQUOT: "free space within your quota or write elsewhere",
    errno.EROFS: "the file system is read-only; write elsewhere (--out, -o, or $CHARACTERIZE_CACHE for builds)",
    errno.EACCES: "check its permissions or write elsewhere",
    errno.EPERM: "check its permissions or write elsewhere",
    errno.ENOTDIR: "a part of the path is a file, not a directory; choose another path",
    errno.EISDIR: "it is a directory where a file belongs; remove it or choose another path",
    errno.EEXIST: "something is already there; remove it or choose another path",
    errno.ENAMETOOLONG: "the name is too long for the file system; choose a shorter name or path",
    errno.ENOENT: "check the path",
    errno.ELOOP: "the path has a loop of symbolic links; fix the link",
    errno.EMFILE: "too many open files; raise the limit (ulimit -n)",
    errno.EIO: "the device reported an I/O error; check the disk",
    errno.EFBIG: "the file would exceed the size limit (ulimit -f) or the file system's; raise it or write elsewhere",
}


def escape_text(text: str) -> str:
    """`text` with every control character (escape sequences, carriage returns, newlines,
    DEL, C1 codes) written as a visible escape, so that outside text (file names, kernel
    names from a profiled program) can neither split a line nor drive the terminal."""
    return _CONTROL.sub(lambda m: _ESCAPES.get(m.group(), m.group().encode("unicode_escape").decode()), text)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _blocking_file(path: str) -> str | None:
    """The first part of `path` that exists but is not a directory, if any."""
    p = os.path.abspath(path)
    parts = []
    while True:
        parts.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    for part in reversed(parts[1:]):
        if os.path.lexists(part) and not os.path.isdir(part):
            return part
    return None


def describe_os_error(e: OSError, operation: str | None = None) -> str:
    """One line for an OSError: the operation, the path(s), the system's reason and what to
    do. `operation` ("write", "create the directory", ...) defaults to the one the error
    was tagged with (`e.operation`), else to "use"."""
    op = operation or getattr(e, "operation", None) or "use"
    reason = e.strerror or type(e).__name__
    code = errno.errorcode.get(e.errno or 0)
    reason += f" ({code})" if code else ""
    name = e.filename
    if e.errno == errno.ENOENT and (name is None or not os.path.isabs(os.fsdecode(name))):
        try:
            os.getcwd()
        except OSError:
            return ("the working directory no longer exists (it was deleted or moved); cd to an existing "
                    "directory and run the command again")
    if name is None:
        return f"cannot {op}: {escape_text(reason)}; {_ADVICE.get(e.errno or 0, 'check the file system')}"
    shown = os.fsdecode(name) if isinstance(name, bytes) else str(name)
    where = escape_text(shown) + (f" -> {escape_text(os.fsdecode(e.filename2))}" if e.filename2 else "")
    advice = _ADVICE.get(e.errno or 0, "check the file system")
    if e.errno in (errno.ENOTDIR, errno.EEXIST, errno.ENOENT):
        blocker = _blocking_file(shown)
        if blocker is not None and os.path.abspath(shown) != blocker:
            advice = f"{escape_text(blocker)} is a file, not a directory; choose another path"
    return f"cannot {op} {where}: {escape_text(reason)}; {advice}"


class BinaryError(CharacterizeError):
    """A CUDA binary cannot be analyzed as asked: no such file, no device code for the
    architecture, no function matching the pattern, or no lookup loop in the ones read."""

    exit_code = 14


class SlowerThanBaseline(CharacterizeError):
    """`compare --fail-if-slower`: timed points of the second run are slower than the
    first's beyond the allowed slowdown and both measurements' 95% CIs (a CI job's
    regression gate fails with the points named)."""

    exit_code = 15


def did_you_mean(name: str, known: "list[str] | tuple[str, ...]") -> str:
    """' Did you mean 'rpf'?' when `name` is close to one of `known` (a typo), else ''.
    Appended to the one-line error that refuses an unknown name."""
    import difflib

    text = str(name).strip()
    lowered = {k.lower(): k for k in known}
    matches = difflib.get_close_matches(text.lower(), list(lowered), n=2, cutoff=0.6)
    if not matches:
        return ""
    return " Did you mean " + " or ".join(repr(lowered[m]) for m in matches) + "?"
