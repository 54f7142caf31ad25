"""Kernels stage, a kernel of one's own: built, read and launched as the family's are.

An experiment's [variants.NAME] table (config.UserKernel) names a user's kernel: its
source (built here per architecture with the toolkit's flags, and for the CPU
emulator so that it is checked against torch without a GPU) or a binary already built,
the function that gathers, and its entry point with the launch wrappers' signature (or
a Python callable taking the same arguments). The SASS analysis reads it as it reads
ours and the peers' (kernels.binary), and kernels.library launches it one table at a
time through TableKernel like any variant.
"""

from __future__ import annotations

import ctypes
import importlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterable

from characterize.config import UserKernel
from characterize.errors import BinaryError, ConfigError, KernelLaunchError, UnsupportedShape
from characterize.kernels.binary import analyze_binary
from characterize.kernels.build import BuildSpec, build, buildable_arch

#: what a user's entry point returns for a shape it does not compute (chz_compat.cuh: CHZ_ERR_UNSUPPORTED)
ERR_UNSUPPORTED = 10002


def library_path(kernel: UserKernel, target: str, arch: str | None, dtype: str = "fp32") -> Path:
    """The library holding the user's kernel for `target` ('cuda' on `arch`, or 'emulate'):
    built from its source (cached like ours), or the binary it names (GPU only)."""
    if kernel.source:
        return build(BuildSpec(target, arch if target == "cuda" else None, None, dtype, source=kernel.source)).library
    if target == "emulate":
        raise UnsupportedShape(f"{kernel.binary} is a GPU binary; to check the kernel on the CPU give its source "
                               "(built for the emulator too) or a Python callable")
    return Path(kernel.binary)


def sass_rows(kernel: UserKernel, archs: Iterable[str], dtype: str = "fp32") -> dict[str, dict[str, Any]]:
    """Per architecture, the user's gathering kernel as kernels.binary reads it
    (BinaryRow.to_dict: registers, loads, the loop nest's figures, provenance). A
    source is built for the closest architecture this nvcc builds."""
    out = {}
    for arch in archs:
        code_arch = buildable_arch(arch) if kernel.source else arch
        rows = analyze_binary(library_path(kernel, "cuda", code_arch, dtype), kernel.kernel, [code_arch], dtype=dtype)
        found = [r for r in rows if r.loop is not None]
        if not found:
            raise BinaryError(f"{kernel.source or kernel.binary}: no function matching {kernel.kernel!r} gathers rows")
        out[arch] = found[0].to_dict() | {"code_arch": code_arch}
    return out


def _callable(spec: str) -> Callable[..., int]:
    module, _, name = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"callable {spec!r} cannot be imported ({type(e).__name__}: {e})") from None
    if not callable(fn):
        raise ConfigError(f"callable {spec!r} is not a function")
    return fn


class UserLibrary:
    """A user's entry point behind the interface TableKernel launches through (`lib.<entry>`
    and `check`): a C function of its library, called with pointers to the arguments, or
    a Python callable, called with the argument structures themselves."""

    def __init__(self, kernel: UserKernel, entry: str, target: str, arch: str | None, dtype: str) -> None:
        self.emulated = target == "emulate"
        self._strerror: Any = None
        if kernel.callable:
            fn = _callable(kernel.callable)
            call = lambda a, launch, stream: int(fn(a._obj, launch._obj, stream))  # noqa: E731 (byref -> the struct)
        else:
            path = library_path(kernel, target, arch, dtype)
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as e:
                raise KernelLaunchError(f"cannot load {path}: {e}") from None
            try:
                call = getattr(lib, kernel.entry)
            except AttributeError:
                raise ConfigError(f"{path} exports no function {kernel.entry!r} (give entry = its name, declared "
                                  "extern \"C\")") from None
            call.restype = ctypes.c_int
            self._strerror = getattr(lib, "chz_error_string", None)
            if self._strerror is not None:
                self._strerror.restype = ctypes.c_char_p
        self.lib = SimpleNamespace(**{entry: call})

    def check(self, code: int, what: str) -> None:
        """A non-zero return as the error it names (the toolkit's codes when the library
        includes chz_compat.cuh)."""
        if code == 0:
            return
        said = self._strerror(code).decode(errors="replace") if self._strerror is not None else f"returned {code}"
        if code == ERR_UNSUPPORTED:
            raise UnsupportedShape(f"{what}: {said}")
        raise KernelLaunchError(f"{what}: {said} (code {code})")
