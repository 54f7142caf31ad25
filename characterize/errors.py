"""Domain exceptions: the library raises these, the CLI turns them into messages.

Every error carries a message meant for a person (what went wrong and what to do),
so the CLI can print it verbatim and exit with the class's exit code instead of a
traceback.
"""

from __future__ import annotations


class CharacterizeError(Exception):
    """Base class of every error the toolkit raises on purpose."""

    exit_code = 2


class ConfigError(CharacterizeError, ValueError):
    """A configuration value is out of range or inconsistent."""


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
