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
from characterize.errors import BuildError, ToolchainNotFound
from characterize.hardware.specs import REFERENCE_ARCH
from characterize.progress import Progress, Reporter, as_reporter

SOURCE = "embedding_bag.cu"
#: the training step's kernels (backward and fused optimizer): their own library per build
TRAINING_SOURCE = "embedding_bag_backward.cu"
SOURCES = (SOURCE, TRAINING_SOURCE)
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


def cache_root() -> Path:
    """Where built libraries live: $CHARACTERIZE_CACHE, else the user cache dir."""
    env = os.environ.get("CHARACTERIZE_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "characterize"


# ------------------------------------------------------------------ toolchains
@dataclass(frozen=True)
class Toolchain:
    """A compiler and how it was found."""

    path: Path
    version: str
    found_in: str  # PATH | CUDA_HOME | /usr/local/cuda | pip wheel | CHARACTERIZE_NVCC | host


def _nvcc_version(path: Path) -> str:
    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise ToolchainNotFound(f"{path} did not run: {e}") from None
    m = re.search(r"release (\d+\.\d+), V([\d.]+)", out)
    return m.group(2) if m else out.strip().splitlines()[-1] if out.strip() else "unknown"


@lru_cache(maxsize=None)
def find_nvcc() -> Toolchain:
    """nvcc from $CHARACTERIZE_NVCC, PATH, $CUDA_HOME, /usr/local/cuda or a pip wheel
    (characterize.toolchain: one search for every CUDA tool)."""
    try:
        found = toolchain.find("nvcc", "CHARACTERIZE_NVCC")
    except toolchain.ToolNamedMissing as e:
        raise ToolchainNotFound(f"nvcc: {e}; point $CHARACTERIZE_NVCC at an nvcc executable or unset it") from None
    if found is None:
        raise ToolchainNotFound(
            f"no nvcc found (looked at {toolchain.searched('nvcc', 'CHARACTERIZE_NVCC')}). Install one with "
            "`pip install 'characterize[nvcc]'` (NVIDIA's nvidia-cuda-nvcc wheel, no system toolkit needed) or "
            "install the CUDA toolkit and set CUDA_HOME.")
    return Toolchain(found[0], _nvcc_version(found[0]), found[1])


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
        if self.source not in SOURCES:
            raise BuildError(f"unknown kernel source {self.source!r}; the sources are {', '.join(SOURCES)}")
        if self.dtype not in DTYPES:
            raise BuildError(f"unknown dtype {self.dtype!r}; the kernels read {', '.join(DTYPES)}")
        if self.output not in OUTPUTS:
            raise BuildError(f"unknown build output {self.output!r}; one of {', '.join(OUTPUTS)}")
        if self.target == "emulate":
            object.__setattr__(self, "arch", None)
            object.__setattr__(self, "maxrregcount", None)
            object.__setattr__(self, "output", "library")

    def label(self) -> str:
        dtype = "" if self.dtype == "fp32" else f" {self.dtype}"
        if self.source != SOURCE:
            dtype += f" ({self.source})"
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
        src = kernels_dir() / self.source
        if self.target == "emulate":
            return [str(compiler), "-O2", "-std=c++17", "-shared", "-fPIC", "-x", "c++", "-DCHZ_EMULATE",
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
    rebuilds only its libraries)."""
    h = hashlib.sha256()
    for path in sorted(kernels_dir().glob("*")):
        if path.suffix in (".cuh", ".h") or path.name == source:
            h.update(path.name.encode())
            h.update(path.read_bytes())
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
    if spec.output == "library":   # and a library's those it had before device-code builds
        del fields["output"]
    key_data = json.dumps({"format": CACHE_FORMAT, "spec": fields, "compiler": str(tool.path),
                           "version": tool.version, "sources": _source_digest(spec.source)}, sort_keys=True)
    return cache_root() / "build" / hashlib.sha256(key_data.encode()).hexdigest()[:20]


def is_cached(spec: BuildSpec) -> bool:
    """Whether `build(spec)` would reuse a cached library instead of compiling."""
    return (_cache_dir(spec, _toolchain_for(spec)) / "build.json").is_file()


def build(spec: BuildSpec, *, force: bool = False) -> BuildResult:
    """Compile (or fetch from the cache) the kernel family for `spec`."""
    if not (kernels_dir() / spec.source).is_file():
        raise BuildError(f"kernel sources not found in {kernels_dir()} (set CHARACTERIZE_KERNELS)")
    tool = _toolchain_for(spec)
    final = _cache_dir(spec, tool)
    key = final.name
    meta_path = final / "build.json"
    if meta_path.is_file() and not force:
        try:
            meta = json.loads(meta_path.read_text())
            return _result(spec, final, meta, cached=True)
        except (OSError, ValueError, KeyError):
            pass  # a damaged cache entry is rebuilt
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_litter(final.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-{os.getpid()}-", dir=final.parent))
    try:
        cmd = spec.command(tool.path, tmp / spec.filename)
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:
            tail = "\n".join(log.strip().splitlines()[-25:])
            raise BuildError(f"compiling {spec.source} for {spec.label()} failed ({tool.path}):\n{tail}")
        meta = {"command": cmd, "compiler": f"{tool.path} ({tool.version}, from {tool.found_in})",
                "log": log, "seconds": seconds}
        (tmp / "build.json").write_text(json.dumps(meta, indent=1))
        if force and final.exists():
            shutil.rmtree(final, ignore_errors=True)
        try:
            os.replace(tmp, final)
        except OSError:  # another process finished the same build first
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return _result(spec, final, json.loads(meta_path.read_text()), cached=False)


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
    """Within the block, every `build_many` reports its builds to `observer`."""
    token = _OBSERVER.set(observer)
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
