"""Kernels stage, SASS analysis: the disassembler (cuobjdump), and the SASS text of a built library.

`cuobjdump -sass` disassembles a library, executable or cubin; its text is kept in the
disk cache (kernels.diskcache, sass/) by the file's content and the tool's version, and
in memory by path, size and modification time.
"""

from __future__ import annotations

import subprocess
from functools import lru_cache
from pathlib import Path

from characterize import toolchain
from characterize.errors import BuildError, ToolchainNamedMissing, ToolchainNotFound
from characterize.kernels.build import Toolchain
from characterize.kernels.diskcache import entry_key, get_or_compute

SASS_CACHE_FORMAT = 1

INSTALL_HINT = ("Install NVIDIA's disassemblers with `pip install 'characterize[sass]'` "
                "(nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels) or install the CUDA "
                "toolkit and set CUDA_HOME.")


# ------------------------------------------------------------------ toolchain
def _tool_version(path: Path) -> str:
    try:
        return toolchain.cuda_tool_version(path)
    except toolchain.ToolDidNotRun as e:
        raise ToolchainNotFound(f"{path} did not run: {e}. {INSTALL_HINT}") from None


def _find_tool(name: str, env_var: str) -> Toolchain:
    try:
        found = toolchain.find(name, env_var)
    except toolchain.ToolNamedMissing as e:
        raise ToolchainNamedMissing(f"{name}: {e}; point ${env_var} at a {name} executable or unset it") from None
    if found is None:
        raise ToolchainNotFound(f"no {name} found (looked at {toolchain.searched(name, env_var)}); the SASS "
                                f"analysis needs it. {INSTALL_HINT}")
    return Toolchain(found[0], _tool_version(found[0]), found[1])


@lru_cache(maxsize=None)
def find_cuobjdump() -> Toolchain:
    """cuobjdump from $CHARACTERIZE_CUOBJDUMP, PATH, $CUDA_HOME, /usr/local/cuda or a pip wheel."""
    return _find_tool("cuobjdump", "CHARACTERIZE_CUOBJDUMP")


# ---------------------------------------------------------------- disassembly
_TEXT_MEMO: dict[tuple[str, int, int], str] = {}


def disassemble(path: str | Path, *, force: bool = False) -> str:
    """`cuobjdump -sass` of a library, executable or cubin. Cached on disk by the file's
    content and the tool's version, and in memory by path, size and mtime (`force`
    runs cuobjdump again and refreshes both)."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError as e:
        raise BuildError(f"cannot disassemble {path}: {e}") from None
    memo_key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if memo_key in _TEXT_MEMO and not force:
        return _TEXT_MEMO[memo_key]
    tool = find_cuobjdump()
    key = entry_key(path.read_bytes(), f"{SASS_CACHE_FORMAT} {tool.version}")
    text = get_or_compute("sass", key, lambda: _cuobjdump_sass(tool, path), suffix=".sass", force=force)
    _TEXT_MEMO[memo_key] = text
    return text


def _cuobjdump_sass(tool: Toolchain, path: Path) -> str:
    proc = subprocess.run([str(tool.path), "-sass", str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"{tool.path} -sass {path} failed: {(proc.stderr or proc.stdout).strip()[-2000:]}")
    return proc.stdout
