"""Kernels stage, any binary: the hot-loop analysis of a CUDA binary we did not build.

Why: the kernels users run (PyTorch's embedding bag in libtorch_cuda.so, FBGEMM's
table-batched embedding in its extension, a user's own library) decide what our
variants are compared with, and their machine code is the only ground truth about
them. A library such as libtorch_cuda.so holds tens of thousands of functions for
several architectures (9.8 GB of SASS for sm_90 alone), so nothing is disassembled
whole:

1. `cuobjdump -res-usage -arch ARCH BINARY` lists every function of that architecture
   with its registers, stack, shared and local memory (about 2 s for libtorch_cuda);
   the functions whose demangled name matches the user's pattern are kept;
2. `cuobjdump -sass -fun NAMES -arch ARCH BINARY` disassembles only those (about a
   second), and the SASS analysis (kernels.sass) reads each one's hot loop and loop
   nest, as for our own builds.

A binary without code for the architecture asked for is analyzed at the one its
GPU would run (the same major version, the highest minor not above it: sm_90a for
an H100, sm_86 code on an sm_89 GPU) and says so; with none, the error lists what
it has. Results are cached on disk by the file's content, the architecture and the
functions asked for.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from characterize.errors import BinaryError
from characterize.kernels.build import demangle
from characterize.kernels.diskcache import entry_key, get_or_compute
from characterize.kernels.sass import LoopRow, analyze_kernel, find_cuobjdump, parse_sass

#: on-disk cache format of binary listings and disassemblies
BINARY_CACHE_FORMAT = 1
_FUNCTION = re.compile(r"^\s*Function\s+(\S+?):?\s*$")
_RES = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")
_ARCH_LINE = re.compile(r"^\s*arch\s*=\s*(sm_\w+)")
_ELF_ARCH = re.compile(r"\.(sm_\d+[a-z]?)\.cubin\s*$")


@dataclass(frozen=True)
class BinaryKernel:
    """One function of a binary for one architecture, as cuobjdump's resource usage
    lists it."""

    mangled: str
    name: str          # demangled
    arch: str          # as the binary holds it (sm_90a, sm_80, ...)
    registers: int
    stack: int         # bytes per thread
    shared: int        # static shared memory per block, bytes
    local: int         # local memory per thread (spills and stack arrays), bytes


@dataclass(frozen=True)
class BinaryRow:
    """A kernel of a binary, its resources and its hot loop (kernels.sass.LoopRow)."""

    binary: str
    sha256: str
    kernel: BinaryKernel
    asked_arch: str
    loop: LoopRow | None       # None: no loop gathering rows in this function

    def to_dict(self) -> dict:
        out = {"binary": self.binary, "sha256": self.sha256, "symbol": self.kernel.mangled,
               "kernel": self.kernel.name, "arch": self.asked_arch, "binary_arch": self.kernel.arch,
               "registers": self.kernel.registers, "stack": self.kernel.stack, "shared_mem": self.kernel.shared,
               "local_bytes": self.kernel.local}
        if self.loop is not None:
            d = self.loop.to_dict()
            for key in ("variant", "arch", "kernel", "registers", "maxrregcount", "role"):
                d.pop(key, None)
            out.update(d)
        return out


# ------------------------------------------------------------------ the tool
def _cuobjdump(args: list[str], path: Path, what: str) -> str:
    tool = find_cuobjdump()
    try:
        proc = subprocess.run([str(tool.path), *args, str(path)], capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        raise BinaryError(f"{path}: cuobjdump took more than 30 minutes to {what}") from None
    except OSError as e:
        raise BinaryError(f"{path}: cuobjdump did not run ({e})") from None
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip().splitlines()
        raise BinaryError(f"{path}: not a CUDA binary cuobjdump can read ({err[-1] if err else 'no output'}); give a "
                          "shared library, executable, cubin or fatbin with device code")
    return proc.stdout


def file_digest(path: Path) -> str:
    """sha256 of a file (libtorch_cuda.so: about a second), read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _cached(key: dict, make: Callable[[], str]) -> str:
    """A cuobjdump result kept in the disk cache (binary/) by `key` (file hash, tool, args)."""
    return get_or_compute("binary", entry_key(json.dumps({"format": BINARY_CACHE_FORMAT, **key}, sort_keys=True)),
                          make, suffix=".txt")


def binary_archs(path: Path, digest: str | None = None) -> list[str]:
    """The SASS architectures a binary holds (cuobjdump -lelf), in order of first sight."""
    key = {"sha256": digest or file_digest(path), "tool": find_cuobjdump().version, "args": ["-lelf"]}
    text = _cached(key, lambda: _cuobjdump(["-lelf"], path, "list its device code"))
    archs = [m.group(1) for line in text.splitlines() if (m := _ELF_ARCH.search(line))]
    return list(dict.fromkeys(archs))


def parse_res_usage(text: str, default_arch: str = "") -> list[BinaryKernel]:
    """Functions from `cuobjdump -res-usage` output (per ELF: an `arch =` line, then
    `Function NAME:` and its `REG:.. STACK:.. SHARED:.. LOCAL:..` line)."""
    out, arch, current = [], default_arch, None
    for line in text.splitlines():
        if m := _ARCH_LINE.match(line):
            arch = m.group(1)
        elif m := _FUNCTION.match(line):
            current = m.group(1)
        elif current and (m := _RES.search(line)):
            reg, stack, shared, local = (int(g) for g in m.groups())
            out.append(BinaryKernel(current, demangle(current), arch, reg, stack, shared, local))
            current = None
    return out


def compatible_arch(asked: str, available: Iterable[str]) -> str | None:
    """The architecture of `available` a GPU of `asked` runs: the same one, its
    architecture-specific twin (sm_90a for sm_90), else the same major version's highest
    minor not above it (SASS runs on later minors of its major version)."""
    avail = list(available)
    if asked in avail:
        return asked
    if asked + "a" in avail:
        return asked + "a"
    m = re.fullmatch(r"sm_(\d+?)(\d)", asked)
    if not m:
        return None
    major, minor = m.groups()
    same = []
    for a in avail:
        n = re.fullmatch(r"sm_(\d+?)(\d)(a?)", a)
        if n and n.group(1) == major and int(n.group(2)) <= int(minor) and not n.group(3):
            same.append((int(n.group(2)), a))
    return max(same)[1] if same else None


def list_kernels(path: str | Path, arch: str) -> tuple[str, list[BinaryKernel]]:
    """(the architecture read, its functions) of a binary for a GPU of `arch`;
    BinaryError naming what the binary holds when it has nothing that GPU runs."""
    p = _existing(path)
    digest = file_digest(p)
    archs = binary_archs(p, digest)
    use = compatible_arch(arch, archs)
    if use is None:
        raise BinaryError(f"{p}: no device code a {arch} GPU runs; it holds "
                          f"{', '.join(archs) if archs else 'no SASS at all (PTX only, or no device code)'}; ask for "
                          "one of those with --arch")
    tool = find_cuobjdump()
    text = _cached({"sha256": digest, "tool": tool.version, "args": ["-res-usage", "-arch", use]},
                   lambda: _cuobjdump(["-res-usage", "-arch", use], p, "list its functions"))
    return use, [k for k in parse_res_usage(text, use) if k.arch in (use, "")]


def disassemble_functions(path: str | Path, arch: str, mangled: Iterable[str]) -> str:
    """`cuobjdump -sass -fun N1,N2 -arch ARCH` of a binary: only those functions."""
    p = _existing(path)
    names = sorted(set(mangled))
    tool = find_cuobjdump()
    key = {"sha256": file_digest(p), "tool": tool.version, "args": ["-sass", "-arch", arch], "functions": names}
    return _cached(key, lambda: _cuobjdump(["-sass", "-fun", ",".join(names), "-arch", arch], p, "disassemble"))


def _existing(path: str | Path) -> Path:
    p = Path(path)
    if not p.exists():
        raise BinaryError(f"{p}: no such file; give a shared library, executable, cubin or fatbin")
    if not p.is_file():
        raise BinaryError(f"{p}: not a regular file; give a shared library, executable, cubin or fatbin")
    return p


def analyze_binary(path: str | Path, kernel: str = ".", archs: Iterable[str] = ("sm_90",), *,
                   dtype: str = "fp32", limit: int = 64) -> list[BinaryRow]:
    """The hot loop and loop nest of every function of `path` whose demangled name
    matches the regular expression `kernel`, for each architecture. Refuses, in one
    line, a pattern that matches nothing (naming a few functions the binary has), more
    than `limit` functions (narrow the pattern), and functions of which none has a loop
    gathering rows (naming the ones read). `dtype` tells int8 rows' scales from values."""
    p = _existing(path)
    try:
        pattern = re.compile(kernel)
    except re.error as e:
        raise BinaryError(f"--kernel {kernel!r} is not a regular expression ({e})") from None
    digest = file_digest(p)
    rows: list[BinaryRow] = []
    for asked in archs:
        use, funcs = list_kernels(p, asked)
        chosen = [k for k in funcs if pattern.search(k.name) or pattern.search(k.mangled)]
        if not chosen:
            sample = ", ".join(sorted({k.name.split("(")[0] for k in funcs})[:5]) or "none"
            raise BinaryError(f"{p}: no {use} function matches {kernel!r} (it has {len(funcs):,}, e.g. {sample}); "
                              "give --kernel a part of a kernel's name")
        if len(chosen) > limit:
            raise BinaryError(f"{p}: {len(chosen):,} {use} functions match {kernel!r}; narrow the pattern to at most "
                              f"{limit}")
        codes = {c.mangled: c for c in parse_sass(disassemble_functions(p, use, [k.mangled for k in chosen]))}
        found = 0
        for k in chosen:
            code = codes.get(k.mangled)
            loop = analyze_kernel(code, arch=asked, registers=k.registers, dtype=dtype) if code else None
            found += loop is not None
            rows.append(BinaryRow(str(p), digest, k, asked, loop))
        if not found:
            names = ", ".join(k.name.split("(")[0] for k in chosen[:6])
            raise BinaryError(f"{p}: no loop gathering table rows in the {len(chosen)} {use} function(s) read "
                              f"({names}{', ...' if len(chosen) > 6 else ''}); they are not embedding lookups, "
                              "or their rows arrive in a way the SASS analysis does not follow")
    return rows

