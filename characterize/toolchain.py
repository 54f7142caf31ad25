"""Toolchain: where NVIDIA's command-line tools are found (nvcc, cuobjdump, nvdisasm,
ncu), one search for all of them.

Order, most specific first: a path the caller names (`--ncu PATH`); the tool's own
environment variable ($CHARACTERIZE_NVCC, ...); PATH; $CUDA_HOME/bin and
$CUDA_PATH/bin; the newest /opt/nvidia/nsight-compute/*/ (where Nsight Compute installs
on its own, often newer than a toolkit's); NVIDIA's PyPI wheels installed in this
environment (nvidia/<cuXX>/bin on sys.path: `pip install '.[nvcc]'` asked for them);
/usr/local/cuda/bin, then the newest /usr/local/cuda-*/bin. A path named explicitly, or
by the environment variable, must exist: it is never skipped silently for another tool.
`find` answers the first; `find_all` every one, for a caller that chooses among them
(the CUDA compiler the installed driver supports: kernels.build.find_nvcc).
Callers turn "not found" into their own domain error (ToolchainNotFound, NcuNotFound).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Places:
    """Where the search looks; the defaults are this machine's (tests point them at
    temporary folders). An empty `path` or `cuda_home` skips that place."""

    path: str | None = None                       # None: $PATH
    cuda_home: str | None = None                  # None: $CUDA_HOME and $CUDA_PATH
    cuda_parent: Path = Path("/usr/local")        # cuda/bin, then the newest cuda-*/bin
    nsight_root: Path = Path("/opt/nvidia/nsight-compute")  # the newest */
    wheels: bool = True                           # NVIDIA's pip wheels on sys.path


class ToolNamedMissing(Exception):
    """A tool named explicitly or by its environment variable is not an executable file."""

    def __init__(self, path: Path, where: str) -> None:
        why = "does not exist" if not path.exists() else "is not an executable file"
        super().__init__(f"{path} ({where}) {why}")
        self.path, self.where, self.why = path, where, why


class ToolDidNotRun(Exception):
    """`TOOL --version` could not run (not executable, failed to start, hung)."""


def cuda_tool_version(path: Path) -> str:
    """The version a CUDA toolkit tool (nvcc, cuobjdump, nvdisasm) prints, '13.0.88' from
    'Cuda compilation tools, release 13.0, V13.0.88'; its last line when there is no such
    version, 'unknown' when it prints nothing. Why one probe: the build and the SASS
    analysis each record the tool that made their output, and read its version alike."""
    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise ToolDidNotRun(str(e)) from None
    m = re.search(r"V(\d+\.\d+\.\d+)", out)
    return m.group(1) if m else (out.strip().splitlines()[-1] if out.strip() else "unknown")


def is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def version_key(name: str) -> tuple[tuple[int, ...], str]:
    """Numeric version order: '2025.10.0' after '2025.3.1', 'cuda-13.0' after 'cuda-12.4'."""
    return tuple(int(n) for n in re.findall(r"\d+", name)), name


def candidates(name: str, places: Places = Places()) -> list[tuple[Path, str]]:
    """Every place `name` may be, in order of preference, with a word on where each is
    (PATH, CUDA_HOME, /usr/local/cuda, pip wheel, ...); not filtered for existence."""
    out: list[tuple[Path, str]] = []
    search_path = os.environ.get("PATH", "") if places.path is None else places.path
    if search_path and (found := shutil.which(name, path=search_path)):
        out.append((Path(found), "PATH"))
    homes = [(os.environ.get(v), v) for v in ("CUDA_HOME", "CUDA_PATH")] if places.cuda_home is None \
        else [(places.cuda_home, "CUDA_HOME")]
    out += [(Path(h) / "bin" / name, v) for h, v in homes if h]
    for p in sorted(places.nsight_root.glob(f"*/{name}"), key=lambda p: version_key(p.parent.name), reverse=True):
        out.append((p, str(p.parent)))
    if places.wheels:
        for entry in sys.path:
            root = Path(entry) / "nvidia"
            if root.is_dir():
                out += [(p, "pip wheel") for p in sorted(root.glob(f"*/bin/{name}"), reverse=True)]
    parent = places.cuda_parent
    out.append((parent / "cuda" / "bin" / name, str(parent / "cuda")))
    for p in sorted(parent.glob(f"cuda-*/bin/{name}"), key=lambda p: version_key(p.parents[1].name), reverse=True):
        out.append((p, str(p.parents[1])))
    return out


def searched(name: str, env_var: str, places: Places = Places()) -> str:
    """Where `find` looked, for a 'not found' message."""
    home = "$CUDA_HOME/bin" if places.cuda_home is None else f"{places.cuda_home}/bin"
    return (f"${env_var}, PATH, {home}, {places.nsight_root}/*/"
            + (", NVIDIA's pip wheels" if places.wheels else "") + f", {places.cuda_parent}/cuda*/bin")


def find(name: str, env_var: str, explicit: str | Path | None = None,
         places: Places = Places()) -> tuple[Path, str] | None:
    """(path, where it was found) of the first executable `name`, or None. A path given
    explicitly or in $env_var that is not executable raises ToolNamedMissing."""
    for given, where in ((explicit, "given"), (os.environ.get(env_var) or None, f"${env_var}")):
        if given is not None:
            p = Path(given).expanduser()
            if not is_executable(p):
                raise ToolNamedMissing(p, where)
            return p, where.lstrip("$") if where != "given" else "given"
    for p, where in candidates(name, places):
        if is_executable(p):
            return p, where
    return None


def find_all(name: str, env_var: str, explicit: str | Path | None = None,
             places: Places = Places()) -> list[tuple[Path, str]]:
    """Every executable `name`, in `find`'s order, each file once. A path given explicitly
    or in $env_var is the only answer (ToolNamedMissing when it is not executable)."""
    first = find(name, env_var, explicit, places)
    if first is None or first[1] in ("given", env_var):
        return [first] if first is not None else []
    out, seen = [], set()
    for p, where in candidates(name, places):
        if is_executable(p) and (key := p.resolve()) not in seen:
            seen.add(key)
            out.append((p, where))
    return out
