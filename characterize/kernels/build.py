"""Kernels stage, build: compile the kernel family with nvcc (or the host compiler, for CPU
emulation), cache the shared libraries, and read ptxas's resource usage.

One library holds the whole family; what differs between builds is the target
(an SM architecture or the CPU emulator) and the flags (the register cap). Builds
are cached by a hash of the sources, the flags and the compiler's identity, so
rebuilding the family for two architectures costs seconds once and nothing after.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import ctypes.util
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from characterize import toolchain
from characterize.config import DTYPES
from characterize.errors import (
    BuildError,
    FileSystemError,
    ToolchainNamedMissing,
    ToolchainNotFound,
    describe_os_error,
)
from characterize.files import one_at_a_time
from characterize.hardware.devices import driver_cuda_version
from characterize.hardware.specs import ARCHS, REFERENCE_ARCH, nearest_arch
from characterize.kernels.diskcache import cache_root
from characterize.progress import Progress, Reporter, as_reporter

SOURCE = "embedding_bag.cu"
#: the training step's kernels (backward and fused optimizer): their own library per build
TRAINING_SOURCE = "embedding_bag_backward.cu"
#: the table-batched forward (variant tbe: every table of a batch in one launch): its own library per build
TBE_SOURCE = "tbe.cu"
SOURCES = (SOURCE, TRAINING_SOURCE, TBE_SOURCE)
#: what a build writes (BuildSpec.output)
OUTPUTS = ("library", "cubin")
CACHE_FORMAT = 1


def kernels_dir() -> Path:
    """The CUDA sources: $CHARACTERIZE_KERNELS, else the repository's top-level kernels/
    (a checkout or an editable install), else the copy a wheel ships as package data
    (characterize/kernels/cuda, mapped from kernels/ by setup.py)."""
    env = os.environ.get("CHARACTERIZE_KERNELS")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent
    checkout = here.parents[1] / "kernels"
    if (checkout / SOURCE).is_file():
        return checkout
    return here / "cuda"


# ------------------------------------------------------------------ toolchains
@dataclass(frozen=True)
class Toolchain:
    """A compiler and how it was found."""

    path: Path
    version: str
    found_in: str  # PATH | CUDA_HOME | /usr/local/cuda | pip wheel | CHARACTERIZE_NVCC | host
    chosen: str = ""  # why this one: the driver it was chosen for, or that there is none here

    def describe(self) -> str:
        """One line for build logs and meta.json."""
        return f"{self.path} ({self.version}, from {self.found_in}" + (f"; {self.chosen})" if self.chosen else ")")


#: the oldest Linux driver each CUDA major version runs on (CUDA Toolkit release notes, "CUDA
#: Toolkit and Corresponding Driver Versions", minor version compatibility): a library built
#: with toolkit X.y, whose CUDA runtime is linked in statically, loads only under a driver
#: that reports CUDA X or newer
MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}


def _nvcc_version(path: Path) -> str:
    try:
        return toolchain.cuda_tool_version(path)
    except toolchain.ToolDidNotRun as e:
        raise ToolchainNotFound(f"{path} did not run: {e}") from None


@lru_cache(maxsize=None)
def find_nvcc() -> Toolchain:
    """The CUDA compiler to build with: from $CHARACTERIZE_NVCC, PATH, $CUDA_HOME, a pip
    wheel or /usr/local/cuda* (characterize.toolchain: one search for every CUDA tool),
    the first whose CUDA version the installed driver supports (choose_nvcc)."""
    try:
        found = toolchain.find_all("nvcc", "CHARACTERIZE_NVCC")
    except toolchain.ToolNamedMissing as e:
        raise ToolchainNamedMissing(f"nvcc: {e}; point $CHARACTERIZE_NVCC at an nvcc executable or unset it") from None
    return choose_nvcc(found, *driver_cuda_version())


def choose_nvcc(found: list[tuple[Path, str]], driver: str | None, cuda: tuple[int, int] | None) -> Toolchain:
    """The first of `found` (path, where) that the driver (`driver`, supporting CUDA
    `cuda`) can load what it builds: its CUDA major version at most the driver's (minor
    versions are compatible within a major). Without a driver (static builds) the first.
    ToolchainNotFound naming the driver and the version needed when none fits."""
    if not found:
        raise ToolchainNotFound(
            f"no nvcc found (looked at {toolchain.searched('nvcc', 'CHARACTERIZE_NVCC')}). Install one with "
            "`pip install 'characterize[nvcc]'` (NVIDIA's nvidia-cuda-nvcc wheel, no system toolkit needed) or "
            "install the CUDA toolkit and set CUDA_HOME.")
    if cuda is None:
        path, where = found[0]
        return Toolchain(path, _nvcc_version(path), where, "no NVIDIA driver here: the first nvcc found")
    newer = []
    for path, where in found:
        version = _nvcc_version(path)
        major = _major(version)
        if major is not None and major <= cuda[0]:
            return Toolchain(path, version, where, f"chosen for driver {driver or '?'} (CUDA {cuda[0]}.{cuda[1]})")
        newer.append((major, version, path))
    need = min(m for m, _, _ in newer if m is not None) if any(m is not None for m, _, _ in newer) else None
    raise ToolchainNotFound(
        f"the NVIDIA driver {driver or '?'} supports CUDA up to {cuda[0]}.{cuda[1]}, but every nvcc found is newer ("
        + ", ".join(f"{v} at {p}" for _, v, p in newer) + ")"
        + (f"; CUDA {need} needs driver >= {MIN_DRIVER[need]}" if need in MIN_DRIVER else "")
        + f". Update the driver, or install a CUDA {cuda[0]}.x toolkit (NVIDIA's installer or package repository; "
        f"PyPI has no CUDA {cuda[0]} nvcc) and point CHARACTERIZE_NVCC or CUDA_HOME at it")


def toolkit_record() -> dict[str, Any]:
    """What meta.json records of the CUDA compiler a run builds with and why it was chosen."""
    driver, cuda = driver_cuda_version()
    record: dict[str, Any] = {"driver": driver, "driver_cuda": f"{cuda[0]}.{cuda[1]}" if cuda else None}
    try:
        tool = find_nvcc()
    except ToolchainNotFound as e:
        return record | {"error": str(e)}
    return record | {"nvcc": str(tool.path), "version": tool.version, "found_in": tool.found_in,
                     "chosen": tool.chosen}


def _major(version: str) -> int | None:
    m = re.match(r"(\d+)\.", version)
    return int(m.group(1)) if m else None


@lru_cache(maxsize=None)
def nvcc_archs() -> tuple[str, ...]:
    """The sm_XX this nvcc compiles for (`nvcc --list-gpu-arch`): CUDA 13 no longer builds
    Volta, older toolkits build what newer ones dropped."""
    tool = find_nvcc()
    try:
        out = subprocess.run([str(tool.path), "--list-gpu-arch"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise ToolchainNotFound(f"{tool.path} --list-gpu-arch did not run: {e}") from None
    return tuple(f"sm_{m}" for m in re.findall(r"compute_(\d+)", out))


def buildable_arch(arch: str) -> str:
    """`arch` when this nvcc builds it, else the known architecture it builds whose code
    stands in for it (hardware.specs.nearest_arch)."""
    have = nvcc_archs()
    if arch in have or not have:
        return arch
    known = [a for a in ARCHS if a in have]
    if not known:
        raise ToolchainNotFound(f"{find_nvcc().path} builds none of the architectures the toolkit knows "
                                f"({', '.join(ARCHS)}); it lists {', '.join(have)}")
    return nearest_arch(known, arch) or known[0]


@lru_cache(maxsize=None)
def find_host_compiler() -> Toolchain:
    """The C++ compiler used for the CPU-emulation build."""
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            path = Path(shutil.which(name))
            try:
                out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60).stdout
            except (OSError, subprocess.SubprocessError):
                continue
            return Toolchain(path, out.splitlines()[0] if out else "unknown", "host")
    raise ToolchainNotFound("no C++ compiler (g++, c++ or clang++) found for the CPU-emulation build; "
                            "install one (Debian: apt install g++)")


# --------------------------------------------------------------- build specs
@dataclass(frozen=True)
class BuildSpec:
    """One library build: for a GPU architecture (target 'cuda') or the CPU emulator."""

    target: str = "cuda"            # cuda | emulate
    arch: str | None = REFERENCE_ARCH  # SM architecture for cuda builds
    maxrregcount: int | None = None  # register cap (cuda builds only)
    dtype: str = "fp32"             # table element type: one library per dtype (config.DTYPES)
    source: str = SOURCE            # the .cu file: the forward family or the training kernels (SOURCES)
    output: str = "library"         # library: a shared object the host loads and launches | cubin: the
    #                                 device code alone, all that static and SASS analysis read (no host
    #                                 compile or link: about 40% less nvcc time); same ptxas report, same SASS

    def __post_init__(self) -> None:
        if self.target not in ("cuda", "emulate"):
            raise BuildError(f"unknown build target {self.target!r}")
        if self.source not in SOURCES and not (Path(self.source).is_absolute() and self.source.endswith(".cu")):
            raise BuildError(f"unknown kernel source {self.source!r}: one of {', '.join(SOURCES)}, or the absolute "
                             "path of a .cu file of one's own (built with the toolkit's headers and flags)")
        if self.dtype not in DTYPES:
            raise BuildError(f"unknown dtype {self.dtype!r}; the kernels read {', '.join(DTYPES)}")
        if self.output not in OUTPUTS:
            raise BuildError(f"unknown build output {self.output!r}; one of {', '.join(OUTPUTS)}")
        if self.target == "emulate":
            object.__setattr__(self, "arch", None)
            object.__setattr__(self, "maxrregcount", None)
            object.__setattr__(self, "output", "library")

    @property
    def source_path(self) -> Path:
        """The .cu file this build compiles: one of ours in kernels_dir(), or a user's own."""
        return kernels_dir() / self.source if self.source in SOURCES else Path(self.source)

    def label(self) -> str:
        dtype = "" if self.dtype == "fp32" else f" {self.dtype}"
        if self.source != SOURCE:
            dtype += f" ({Path(self.source).name})"
        if self.target == "emulate":
            return "cpu-emulation" + dtype
        return f"{self.arch}" + (f" maxrregcount={self.maxrregcount}" if self.maxrregcount else "") + dtype + \
            (" (device code)" if self.output == "cubin" else "")

    @property
    def filename(self) -> str:
        """The file a build writes: the shared library, or the device code alone."""
        return "chz.cubin" if self.output == "cubin" else "libchz.so"

    def command(self, compiler: Path, output: Path) -> list[str]:
        """The exact compiler command line."""
        src = self.source_path
        if self.target == "emulate":
            # the CPU checks a kernel's logic: -O1 compiles about a third faster than -O2 (tbe.cu: 1.5 s
            # vs 2.4 s of CPU), and the checks' small shapes run as fast (four kernel test files, builds
            # included: 57 s against 62 s)
            return [str(compiler), "-O1", "-std=c++17", "-shared", "-fPIC", "-x", "c++", "-DCHZ_EMULATE",
                    f"-DCHZ_DTYPE={DTYPES[self.dtype].code}", f"-I{kernels_dir()}", "-o", str(output), str(src)]
        cc = self.arch.removeprefix("sm_")
        if self.output == "cubin":
            cmd = [str(compiler), "-O3", "-std=c++17", "-cubin", "-gencode", f"arch=compute_{cc},code=sm_{cc}",
                   "-Xptxas", "-v", "-lineinfo"]
        else:
            cmd = [str(compiler), "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-cudart", "static",
                   "-gencode", f"arch=compute_{cc},code=[sm_{cc},compute_{cc}]", "-Xptxas", "-v", "-lineinfo"]
        if self.maxrregcount:
            cmd += ["-maxrregcount", str(self.maxrregcount)]
        return cmd + [f"-DCHZ_DTYPE={DTYPES[self.dtype].code}", f"-I{kernels_dir()}", "-o", str(output), str(src)]


@dataclass(frozen=True)
class KernelResources:
    """ptxas's report for one kernel (entry function) of one build."""

    kernel: str          # demangled name, e.g. "void chz_rpf_kernel<2>(chz_bag_args)"
    mangled: str
    arch: str
    registers: int
    spill_stores: int    # bytes per thread
    spill_loads: int
    stack_frame: int
    shared_mem: int      # static shared memory, bytes per block
    barriers: int
    max_registers: int | None = None  # the cap ptxas applied, when one was given


@dataclass(frozen=True)
class BuildResult:
    spec: BuildSpec
    library: Path
    compiler: str
    command: tuple[str, ...]
    log: str
    kernels: dict[str, KernelResources] = field(default_factory=dict)  # by demangled name
    warnings: tuple[str, ...] = ()
    seconds: float = 0.0
    cached: bool = False

    def resources(self, base_name: str) -> KernelResources:
        """The kernel whose demangled name starts with `base_name` (e.g. 'chz_rpf_kernel<2>')."""
        for name, res in self.kernels.items():
            short = re.sub(r"^void\s+", "", name)
            if short.startswith(base_name + "(") or short == base_name:
                return res
        raise BuildError(f"kernel {base_name!r} not in the {self.spec.label()} build; "
                         f"have: {', '.join(sorted(self.kernels))}")


# ------------------------------------------------------------------- demangling
@lru_cache(maxsize=1)
def _cxa_demangle():
    for name in ("libstdc++.so.6", ctypes.util.find_library("stdc++")):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
            fn = lib.__cxa_demangle
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_void_p
        fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_int)]
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.free.argtypes = [ctypes.c_void_p]
        return fn, libc.free
    return None


def demangle(mangled: str) -> str:
    """Itanium C++ demangling through libstdc++ (the mangled name if that fails)."""
    api = _cxa_demangle()
    if api is None or not mangled.startswith("_Z"):
        return mangled
    fn, free = api
    status = ctypes.c_int(0)
    ptr = fn(mangled.encode(), None, None, ctypes.byref(status))
    if status.value != 0 or not ptr:
        return mangled
    try:
        return ctypes.string_at(ptr).decode()
    finally:
        free(ptr)


# ------------------------------------------------------------------ ptxas log
_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(.*)")
_OVERRIDE = re.compile(r"Overriding maximum register limit \d+ for '([^']+)' with\s+(\d+)")


def parse_ptxas(log: str) -> dict[str, KernelResources]:
    """Resource usage per entry function from `nvcc -Xptxas -v` output."""
    entries: dict[str, dict] = {}
    caps: dict[str, int] = {}
    current = None
    props_for = None
    for line in log.splitlines():
        if m := _OVERRIDE.search(line):
            caps[m.group(1)] = int(m.group(2))
        elif m := _ENTRY.search(line):
            current = m.group(1)
            entries[current] = {"arch": m.group(2), "registers": 0, "spill_stores": 0, "spill_loads": 0,
                                "stack_frame": 0, "shared_mem": 0, "barriers": 0}
        elif m := _PROPS.search(line):
            props_for = m.group(1)
        elif (m := _FRAME.search(line)) and props_for in entries:
            e = entries[props_for]
            e["stack_frame"], e["spill_stores"], e["spill_loads"] = (int(g) for g in m.groups())
        elif (m := _USED.search(line)) and current in entries:
            e = entries[current]
            e["registers"] = int(m.group(1))
            rest = m.group(2)
            if b := re.search(r"used (\d+) barriers", rest):
                e["barriers"] = int(b.group(1))
            if s := re.search(r"(\d+) bytes smem", rest):
                e["shared_mem"] = int(s.group(1))
    out = {}
    for mangled, e in entries.items():
        name = demangle(mangled)
        out[name] = KernelResources(kernel=name, mangled=mangled, max_registers=caps.get(mangled), **e)
    return out


# ---------------------------------------------------------------------- build
def _source_digest(source: str = SOURCE) -> str:
    """The headers and the one .cu file a build compiles (so editing one source
    rebuilds only its libraries; a user's source by its path and contents)."""
    h = hashlib.sha256()
    for path in sorted(kernels_dir().glob("*")):
        if path.suffix in (".cuh", ".h") or path.name == source:
            h.update(path.name.encode())
            h.update(path.read_bytes())
    if source not in SOURCES:
        own = Path(source)
        h.update(str(own).encode())
        h.update(own.read_bytes() if own.is_file() else b"")
    return h.hexdigest()


def _toolchain_for(spec: BuildSpec) -> Toolchain:
    return find_host_compiler() if spec.target == "emulate" else find_nvcc()


_TMP_DIR = re.compile(r"^\.[0-9a-f]{20}-(?:(\d+)-)?")


def _remove_litter(directory: Path) -> None:
    """Temporary build folders of processes that are gone (killed mid-build): named
    .<key>-<pid>-..., removed once that pid no longer runs (older unnamed ones after a day)."""
    for d in directory.glob(".*-*"):
        m = _TMP_DIR.match(d.name)
        if m is None:
            continue
        try:
            if m.group(1):
                os.kill(int(m.group(1)), 0)
                continue  # its builder still runs
            if time.time() - d.stat().st_mtime < 86400:
                continue
        except ProcessLookupError:
            pass
        except OSError:  # PermissionError: another user's live process; or it vanished meanwhile
            continue
        shutil.rmtree(d, ignore_errors=True)


def _cache_dir(spec: BuildSpec, tool: Toolchain) -> Path:
    """Where the build of `spec` with `tool` lives in the cache (keyed by sources, flags, compiler)."""
    fields = asdict(spec)
    if spec.source == SOURCE:   # the forward's cache keys stay those it had before the training source
        del fields["source"]
    # the toolkit is the compiler's path and version: its headers and static CUDA runtime go with it
    if spec.output == "library":   # and a library's those it had before device-code builds
        del fields["output"]
    key_data = json.dumps({"format": CACHE_FORMAT, "spec": fields, "compiler": str(tool.path),
                           "version": tool.version, "sources": _source_digest(spec.source)}, sort_keys=True)
    return cache_root() / "build" / hashlib.sha256(key_data.encode()).hexdigest()[:20]


#: the shared library a build writes into its cache entry
LIBRARY = "libchz.so"


def _library_digest(lib: Path) -> str:
    """SHA-256 of a library, read afresh every time (a few ms: an in-place damage keeps
    the size and, within a clock tick, the modification time)."""
    h = hashlib.sha256()
    with open(lib, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def elf_whole(path: Path) -> bool:
    """Whether a 64-bit little-endian ELF file holds every byte its headers point at: its
    program and section header tables and the contents of every segment and section.
    A truncated shared library fails this; mapped by the loader, it would end the
    process with SIGBUS."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return False
    size = len(data)
    if size < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return False
    phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 0x36)
    if phoff + phnum * phentsize > size or shoff + shnum * shentsize > size:
        return False
    for i in range(phnum):
        offset, _, _, filesz = struct.unpack_from("<QQQQ", data, phoff + i * phentsize + 8)
        if offset + filesz > size:
            return False
    for i in range(shnum):
        (kind,) = struct.unpack_from("<I", data, shoff + i * shentsize + 4)
        offset, length = struct.unpack_from("<QQ", data, shoff + i * shentsize + 0x18)
        if kind != 8 and offset + length > size:   # SHT_NOBITS (.bss) occupies no bytes of the file
            return False
    return True


def verified_entry(directory: Path, filename: str = LIBRARY) -> dict | None:
    """build.json of a cache entry whose library is whole: present, of the size and
    SHA-256 recorded when it was built. None for a missing, damaged or truncated entry
    (rebuilt), so that a cut library never reaches the loader. An entry written before
    sizes were recorded is adopted when its ELF structure is whole (and its record added)."""
    try:
        meta = json.loads((directory / "build.json").read_text())
        lib = directory / filename
        size = lib.stat().st_size
        if not isinstance(meta["log"], str) or not meta["command"] or not meta["compiler"] or size == 0:
            return None
        recorded = meta.get("library")
        if recorded is None:
            if not elf_whole(lib):
                return None
            meta["library"] = {"bytes": size, "sha256": _library_digest(lib)}
            with contextlib.suppress(OSError):
                _write_meta(directory, meta)
            return meta
        if size != recorded["bytes"] or _library_digest(lib) != recorded["sha256"]:
            return None
        return meta
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None


def _write_meta(directory: Path, meta: dict) -> None:
    """build.json written whole (a temporary file renamed over it)."""
    fd, tmp = tempfile.mkstemp(prefix=".build.json.", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(meta, indent=1))
        os.replace(tmp, directory / "build.json")
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def is_cached(spec: BuildSpec) -> bool:
    """Whether `build(spec)` would reuse a cached library instead of compiling."""
    return verified_entry(_cache_dir(spec, _toolchain_for(spec)), spec.filename) is not None


def _remove(path: Path) -> None:
    """A cache entry (or whatever sits at its path) moved aside, then deleted."""
    aside = path.with_name(f".{path.name}-{os.getpid()}-damaged")
    try:
        os.replace(path, aside)
    except OSError:
        aside = path
    if aside.is_dir() and not aside.is_symlink():
        shutil.rmtree(aside, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            aside.unlink()


def _install(tmp: Path, final: Path, filename: str = LIBRARY) -> None:
    """Put a finished build in place of its cache entry: a damaged entry there is
    replaced; a whole one another process just finished is kept."""
    for _ in range(3):
        try:
            os.replace(tmp, final)
            return
        except OSError:
            if not final.exists() and not final.is_symlink():
                raise
            if verified_entry(final, filename) is not None:   # another process finished the same build first
                shutil.rmtree(tmp, ignore_errors=True)
                return
            _remove(final)   # damaged (truncated library, torn build.json, a stray file): replaced
    raise BuildError(f"cannot replace the damaged build cache entry {final}; remove it by hand")


def _cache_error(e: OSError, what: str) -> FileSystemError:
    return FileSystemError(f"{describe_os_error(e, what)} (the build cache: $CHARACTERIZE_CACHE chooses another "
                           "directory)")


def build(spec: BuildSpec, *, force: bool = False) -> BuildResult:
    """Compile (or fetch from the cache) the kernel family for `spec`. A cached entry is
    used only when its library verifies (size and SHA-256 recorded at build time); a
    damaged one is rebuilt and replaced, and a build that wrote no library is an error,
    never cached."""
    if not spec.source_path.is_file():
        if spec.source not in SOURCES:
            raise BuildError(f"{spec.source}: no such kernel source")
        raise BuildError(f"kernel sources not found in {kernels_dir()} (set CHARACTERIZE_KERNELS)")
    tool = _toolchain_for(spec)
    final = _cache_dir(spec, tool)
    if not force:
        meta = verified_entry(final, spec.filename)
        if meta is not None:
            return _result(spec, final, meta, cached=True)
    # processes building the same entry at once (a Slurm array, runs side by side) compile it once
    with one_at_a_time(cache_root() / "locks" / f"{final.name}.lock"):
        if not force:
            meta = verified_entry(final, spec.filename)
            if meta is not None:
                return _result(spec, final, meta, cached=True)
        return _compile(spec, tool, final, force)


def _compile(spec: BuildSpec, tool: Toolchain, final: Path, force: bool) -> BuildResult:
    """Compile `spec` into a temporary folder beside `final`, verify it, install it as `final`."""
    key = final.name
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _cache_error(e, "create the directory") from None
    _remove_litter(final.parent)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-{os.getpid()}-", dir=final.parent))
    except OSError as e:
        raise _cache_error(e, "create a build folder in") from None
    try:
        cmd = spec.command(tool.path, tmp / spec.filename)
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        log = proc.stdout + proc.stderr
        lines = log.strip().splitlines()
        if proc.returncode != 0:
            if spec.target == "cuda" and spec.arch and "Unsupported gpu architecture" in log:
                have = nvcc_archs()
                raise BuildError(f"nvcc {tool.version} ({tool.path}) does not build {spec.arch}; it builds "
                                 f"{', '.join(have) or 'none it lists'}. Predictions for such a GPU read the code "
                                 f"of {buildable_arch(spec.arch)} (`characterize predict --arch {spec.arch}`)")
            said = next((ln.strip() for ln in lines if "error" in ln.lower()), lines[-1].strip() if lines else "")
            raise BuildError(f"compiling {spec.source} for {spec.label()} failed ({tool.path}): {said}",
                             detail="\n".join(lines[-25:]))
        lib = tmp / spec.filename
        size = lib.stat().st_size if lib.is_file() else 0
        if size == 0:
            raise BuildError(f"compiling {spec.source} for {spec.label()} produced no library ({tool.path} exited 0 "
                             f"but wrote {'an empty file' if lib.is_file() else 'nothing'}); nothing was cached",
                             detail="\n".join(lines[-25:]))
        meta = {"command": cmd, "compiler": tool.describe(),
                "log": log, "seconds": seconds, "library": {"bytes": size, "sha256": _library_digest(lib)}}
        try:
            (tmp / "build.json").write_text(json.dumps(meta, indent=1))
            if force and final.exists():
                _remove(final)
            _install(tmp, final, spec.filename)
        except OSError as e:
            raise _cache_error(e, "write") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    installed = verified_entry(final, spec.filename)
    if installed is None:
        raise BuildError(f"the build cache entry {final} did not verify right after it was written (another process "
                         "replaced it, or the file system lost it); run the command again")
    return _result(spec, final, installed, cached=False)


def _result(spec: BuildSpec, directory: Path, meta: dict, cached: bool) -> BuildResult:
    log = meta["log"]
    warnings = tuple(line.strip() for line in log.splitlines() if "warning" in line.lower())
    return BuildResult(spec=spec, library=directory / spec.filename, compiler=meta["compiler"],
                       command=tuple(meta["command"]), log=log, kernels=parse_ptxas(log), warnings=warnings,
                       seconds=float(meta.get("seconds", 0.0)), cached=cached)


@dataclass(frozen=True)
class BuildEvent:
    """What `build_many` tells an observer: every spec once as "planned" (with whether
    the cache holds it), then once as "done" (with the compile time, 0 when reused)."""

    spec: BuildSpec
    stage: str        # planned | done
    cached: bool
    seconds: float = 0.0


BuildObserver = Callable[[BuildEvent], None]

#: the observer of the builds requested in this context: builds are asked for from several
#: places (configured variants, the register-cap choice, sweeps, SASS analysis), and a
#: caller that shows progress sees all of them without threading a callback through each
_OBSERVER: contextvars.ContextVar[BuildObserver | None] = contextvars.ContextVar("build_observer", default=None)


@contextlib.contextmanager
def observe_builds(observer: BuildObserver | None) -> Iterator[None]:
    """Within the block, every `build_many` reports its builds to `observer`, and to the
    observer of an enclosing block too (a step that tallies its parts' builds)."""
    outer, inner = _OBSERVER.get(), observer

    def both(ev: BuildEvent) -> None:
        assert inner is not None and outer is not None
        inner(ev)
        outer(ev)
    token = _OBSERVER.set(both if inner is not None and outer is not None else inner)
    try:
        yield
    finally:
        _OBSERVER.reset(token)


class BuildTally:
    """A build observer that counts distinct builds, compiled or reused, and passes each
    new one on: `planned()` when first asked for, `done(label)` when it is ready."""

    def __init__(self, planned: Callable[[], None] | None = None, done: Callable[[str], None] | None = None) -> None:
        self.planned, self.done = planned, done
        self.seen: set[BuildSpec] = set()
        self.finished: set[BuildSpec] = set()
        self.compiled = 0
        self.reused = 0
        self.note = ""   # what the step did besides building, for its summary line

    def __call__(self, ev: BuildEvent) -> None:
        if ev.stage == "planned" and ev.spec not in self.seen:
            self.seen.add(ev.spec)
            if self.planned:
                self.planned()
        elif ev.stage == "done" and ev.spec not in self.finished:
            self.finished.add(ev.spec)
            if ev.cached:
                self.reused += 1
            else:
                self.compiled += 1
            if self.done:
                self.done(f"{ev.spec.label()}: " + ("cached" if ev.cached else f"compiled in {ev.seconds:.0f} s"))

    @classmethod
    def advancing(cls, task: Any) -> "BuildTally":
        """A tally that advances a progress task (anything with `advance(n, item=...)`)
        once per distinct build. It sets no total: the register-cap choice asks for builds
        only once the uncapped ones are read, so a total known early would be too small."""
        return cls(done=lambda item: task.advance(1, item=item))

    def summary(self) -> str:
        return (f"{self.compiled + self.reused} build(s): {self.compiled} compiled, {self.reused} reused from the "
                "cache")


@contextlib.contextmanager
def reported_builds(progress: "Reporter | Progress | None", title: str) -> Iterator[BuildTally]:
    """A step named `title` on `progress` that advances once per distinct build asked for
    inside the block (compiled or reused) and ends with the tally's summary, plus the
    `note` the block may set on the tally it is given."""
    with as_reporter(progress).task(title, unit="builds") as task:
        tally = BuildTally.advancing(task)
        with observe_builds(tally):
            yield tally
        task.finish(tally.summary() + (f"; {tally.note}" if tally.note else ""))


def build_many(specs: Iterable[BuildSpec], jobs: int | None = None, force: bool = False,
               observer: BuildObserver | None = None) -> dict[BuildSpec, BuildResult]:
    """Build several specs in parallel (each nvcc is mostly single-threaded), telling
    `observer` (or the one of `observe_builds`) what is compiled and what reused."""
    unique = list(dict.fromkeys(specs))
    tell = observer or _OBSERVER.get()
    if tell is not None:
        for s in unique:
            tell(BuildEvent(s, "planned", not force and is_cached(s)))
    workers = max(1, min(len(unique), jobs or os.cpu_count() or 1))
    results: dict[BuildSpec, BuildResult] = {}
    with ThreadPoolExecutor(workers) as pool:
        futures = {pool.submit(build, s, force=force): s for s in unique}
        for f in as_completed(futures):
            r = f.result()
            results[futures[f]] = r
            if tell is not None:
                tell(BuildEvent(r.spec, "done", r.cached, 0.0 if r.cached else r.seconds))
    return {s: results[s] for s in unique}
