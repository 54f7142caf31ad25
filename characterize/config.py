"""Configuration stage: frozen dataclasses in the field's vocabulary.

T tables of E rows of D elements; a batch has B bags per table; a bag pools L
lookups (fixed or drawn from a distribution). The defaults reproduce the MICRO 2024
paper's embedding stage (T=12, E=500000, D=128, L=150, B=2048, fp32, sum). An
experiment adds datasets, variants, architectures and measurement settings, and is
read from a small TOML file (the named ones ship in characterize/experiments/).
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from characterize.errors import ConfigError, GpuMemoryError, did_you_mean
from characterize.units import format_bytes

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

@dataclass(frozen=True)
class DType:
    """One table element type: how a row is stored, and the code the CUDA sources know
    it by. int8 rows are row-wise quantized, as FBGEMM stores them: D uint8 values, then
    the row's scale and bias (value = q x scale + bias); fp8 rows hold D e4m3 values, then
    the row's fp32 scale (value = e4m3 x scale)."""

    name: str
    element_bytes: int   # bytes per stored element
    qparam_bytes: int    # bytes of the scale (and bias) after a quantized row's values (0 for the others)
    code: int            # CHZ_DTYPE in kernels/chz_compat.cuh (tests read the header against this)
    note: str


#: the table element types the kernels read, in order: the one home of these facts
DTYPES: dict[str, DType] = {d.name: d for d in (
    DType("fp32", 4, 0, 0, "32-bit floats"),
    DType("fp16", 2, 0, 1, "16-bit IEEE halves"),
    DType("bf16", 2, 0, 2, "16-bit brain floats"),
    DType("int8", 1, 8, 3, "row-wise int8 with an fp32 scale and bias"),
    DType("int8h", 1, 4, 4, "row-wise int8 with an fp16 scale and bias"),
    DType("fp8", 1, 4, 5, "fp8 e4m3 with a row-wise fp32 scale (the tbe kernel reads it)"),
)}

#: dtypes whose rows carry a scale (and bias) after their values
QUANTIZED = tuple(d.name for d in DTYPES.values() if d.qparam_bytes)


def dtype_spec(name: str) -> DType:
    """The table element type `name`, or ConfigError naming the ones the kernels read."""
    try:
        return DTYPES[name]
    except (KeyError, TypeError):
        raise ConfigError(f"dtype {name!r} is not supported; use one of {', '.join(DTYPES)} "
                          "(int8: row-wise with fp32 scale and bias; int8h: with fp16 scale and bias; "
                          "fp8: e4m3 with an fp32 scale per row, tbe only)") from None


MODES = ("sum", "mean")
INDEX_BYTES = 8  # int64 indices and offsets, as torch uses by default


@dataclass(frozen=True)
class Pooling:
    """The pooling factor L: how many lookups a bag sums."""

    kind: str = "fixed"  # fixed | uniform | poisson
    mean: float = 150.0  # L itself for fixed, the distribution's mean otherwise
    low: int = 0         # uniform: smallest L (0 gives empty bags)
    high: int = 0        # uniform: largest L

    @classmethod
    def parse(cls, spec: "str | int | Pooling") -> "Pooling":
        """'150' | 'uniform:LO:HI' | 'poisson:MEAN'."""
        if isinstance(spec, Pooling):
            return spec
        text = str(spec).strip().lower()
        if re.fullmatch(r"\d+", text):
            return cls("fixed", float(int(text))).validate()
        m = re.fullmatch(r"uniform:(\d+):(\d+)", text)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            return cls("uniform", (lo + hi) / 2, lo, hi).validate()
        m = re.fullmatch(r"poisson:(\d+(?:\.\d+)?)", text)
        if m:
            return cls("poisson", float(m.group(1))).validate()
        raise ConfigError(f"bad pooling factor L={spec!r}: use an integer, uniform:LO:HI or poisson:MEAN")

    def validate(self) -> "Pooling":
        if self.kind == "fixed" and (self.mean < 1 or self.mean != int(self.mean)):
            raise ConfigError(f"L must be a positive integer, got {self.mean}")
        if self.kind == "uniform" and not (0 <= self.low <= self.high and self.high >= 1):
            raise ConfigError(f"uniform L needs 0 <= LO <= HI and HI >= 1, got {self.low}:{self.high}")
        if self.kind == "poisson" and self.mean <= 0:
            raise ConfigError(f"poisson L needs a positive mean, got {self.mean}")
        if self.kind not in ("fixed", "uniform", "poisson"):
            raise ConfigError(f"unknown pooling kind {self.kind!r}")
        return self

    def sample(self, rng: np.random.Generator, bags: int) -> np.ndarray:
        """Bag lengths for `bags` bags (int64)."""
        if self.kind == "fixed":
            return np.full(bags, int(self.mean), dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(self.low, self.high + 1, size=bags, dtype=np.int64)
        return rng.poisson(self.mean, size=bags).astype(np.int64)

    @property
    def max(self) -> int:
        """An upper bound used for sizing (poisson: mean + 8 sigma)."""
        if self.kind == "fixed":
            return int(self.mean)
        if self.kind == "uniform":
            return self.high
        return int(self.mean + 8 * math.sqrt(self.mean) + 1)

    def __str__(self) -> str:
        if self.kind == "fixed":
            return str(int(self.mean))
        if self.kind == "uniform":
            return f"uniform:{self.low}:{self.high}"
        return f"poisson:{self.mean:g}"


@dataclass(frozen=True)
class WorkloadConfig:
    """The embedding stage being characterized."""

    T: int = 12                 # embedding tables (one kernel launch each per batch)
    E: int = 500_000            # rows per table
    D: int = 128                # embedding dimension: elements per row
    B: int = 2048               # batch size: bags per table per batch
    L: Pooling = field(default_factory=lambda: Pooling("fixed", 150.0))  # lookups per bag
    dtype: str = "fp32"         # element type of the tables
    mode: str = "sum"           # pooling: sum | mean
    batches: int = 8            # batches in a generated trace (warm-up + measured)
    seed: int = 0               # seed of generated tables and traces

    def __post_init__(self) -> None:
        if not isinstance(self.L, Pooling):
            object.__setattr__(self, "L", Pooling.parse(self.L))

    # ------------------------------------------------------------- derived sizes
    @property
    def row_bytes(self) -> int:
        """Bytes one lookup reads: D elements plus an int8 row's scale and bias."""
        d = DTYPES.get(self.dtype, DTYPES["fp32"])
        return self.D * d.element_bytes + d.qparam_bytes

    @property
    def table_bytes(self) -> int:
        return self.E * self.row_bytes

    @property
    def lookups_per_batch(self) -> float:
        """Expected lookups per table per batch (B x mean L)."""
        return self.B * self.L.mean

    def device_bytes(self) -> int:
        """GPU memory a run needs: tables, the trace's indices/offsets, outputs and
        offset2bag/bag-size buffers, plus one reordered table copy for l2w."""
        lookups = self.B * self.L.max * self.batches
        per_table = lookups * INDEX_BYTES + (self.B + 1) * INDEX_BYTES * self.batches
        outputs = self.B * self.row_bytes + self.B * self.L.max * INDEX_BYTES + self.B * INDEX_BYTES
        return self.T * (self.table_bytes + per_table) + self.table_bytes + outputs

    def host_resident_device_bytes(self, cache_rows: int = 0) -> int:
        """GPU memory when the tables stay in host memory: the traces and outputs as
        device_bytes counts them, plus per table a cache of `cache_rows` rows with its
        row -> slot map, frequency statistics and counts (int64 per row of E); 0 for
        managed memory, which the driver pages in and out as the GPU touches it."""
        rest = self.device_bytes() - (self.T + 1) * self.table_bytes
        cache = cache_rows * self.row_bytes + 4 * INDEX_BYTES * self.E if cache_rows else 0
        return rest + self.T * cache

    # ---------------------------------------------------------------- checking
    def validate(self, gpu: Any = None, *, host: str = "none", cache_rows: int = 0) -> "WorkloadConfig":
        """Raise ConfigError for impossible values, GpuMemoryError when `gpu` (a GpuSpec)
        cannot hold the workload: its tables (host 'none'), or with the tables in host
        memory what stays on the GPU (host 'cache' with `cache_rows` per table, or 'uvm').
        Whether each variant can run D is the pipeline's check (`pipeline.check_experiment`),
        since the variant registry sits above config."""
        for name in ("T", "E", "D", "B", "batches"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or not 0 <= self.seed < 2**63:
            raise ConfigError(f"seed must be an integer in 0..2^63-1, got {self.seed!r}")
        dtype_spec(self.dtype)
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        self.L.validate()
        if self.E >= 2**62 or self.E * self.D >= 2**62:
            raise ConfigError("E x D does not fit 64-bit indexing")
        if gpu is not None and host != "none":
            need = self.host_resident_device_bytes(cache_rows if host == "cache" else 0)
            if need > gpu.memory_bytes:
                what = f"caches of {cache_rows:,} rows, their maps" if host == "cache" else "nothing resident"
                raise GpuMemoryError(
                    f"the workload needs about {format_bytes(need)} of GPU memory with its tables in host memory "
                    f"(T={self.T:,} tables: {what}, plus traces) but {gpu.name} has "
                    f"{format_bytes(gpu.memory_bytes)}; lower C (cache.C), T, batches or B")
        elif gpu is not None:
            need = self.device_bytes()
            if need > gpu.memory_bytes:
                raise GpuMemoryError(
                    f"the workload needs about {format_bytes(need)} of GPU memory (T={self.T:,} tables of "
                    f"{format_bytes(self.table_bytes, 2)} plus traces) but {gpu.name} has "
                    f"{format_bytes(gpu.memory_bytes)}; lower T, E, batches or B, or keep the tables in host "
                    "memory with variants cache or uvm")
        return self

    # ------------------------------------------------------------ conversions
    def replace(self, **changes: Any) -> "WorkloadConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["L"] = str(self.L)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "") -> "WorkloadConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(data, dict):
            raise ConfigError(f"{source or 'experiment'}: workload must be a table ([workload]), got {data!r}")
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown workload field(s): {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
        _check_types(cls, data, source, "workload")
        return cls(**data)

    @classmethod
    def paper(cls) -> "WorkloadConfig":
        """The MICRO 2024 paper's embedding stage."""
        return cls()

    @classmethod
    def tiny(cls) -> "WorkloadConfig":
        """Odd small sizes for tests: partial warps and chunks, empty bags, a prime E."""
        return cls(T=2, E=1009, D=68, B=127, L=Pooling("uniform", 10.0, 0, 20), batches=2, seed=7)


#: architectures an experiment characterizes statically unless it names others
DEFAULT_ARCHS: tuple[str, ...] = ("sm_80", "sm_90")


@dataclass(frozen=True)
class BenchConfig:
    """How `characterize bench` times each point with CUDA events."""

    warmup: int = 3             # untimed batches before measuring
    min_reps: int = 10          # timed repetitions at least
    max_reps: int = 200         # and at most
    ci_target: float = 0.02     # stop when the 95% CI half-width < this fraction of the mean
    budget_s: float = 10.0      # per point time budget for repetitions
    modes: tuple[str, ...] = ("steady", "cold")
    l2_set_aside: bool = True   # l2p/combined: a persisting-L2 set-aside for the pinned rows (False: without)
    timeout_s: float = 900.0    # a point's worker that has not finished it after this long is stopped (point failed)
    stall_s: float = 30.0       # a worker whose heartbeat stopped this long (stopped, frozen) is stopped (point failed)

    def validate(self) -> "BenchConfig":
        if not isinstance(self.l2_set_aside, bool):
            raise ConfigError(f"bench.l2_set_aside must be true or false, got {self.l2_set_aside!r}")
        _count("bench.warmup", self.warmup, 0, MAX_BATCHES, "warm-up batches")
        _count("bench.min_reps", self.min_reps, 2, MAX_REPS, "repetitions")
        _count("bench.max_reps", self.max_reps, self.min_reps, MAX_REPS, "repetitions (at least min_reps)")
        _seconds("bench.ci_target", self.ci_target, 0, 0.999999, "a fraction of the mean")
        _seconds("bench.budget_s", self.budget_s, 0, MAX_SECONDS, "seconds of repetitions per point")
        _seconds("bench.timeout_s", self.timeout_s, self.budget_s, MAX_SECONDS,
                 "seconds a point may take, more than bench.budget_s")
        _seconds("bench.stall_s", self.stall_s, 2.0, MAX_SECONDS,
                 "seconds without a heartbeat from the worker (it beats every second) before it is stopped")
        bad = set(self.modes) - {"steady", "cold"}
        if bad or not self.modes:
            raise ConfigError(f"bench modes must be steady and/or cold, got {', '.join(self.modes)}")
        return self


@dataclass(frozen=True)
class ProfileConfig:
    """How `characterize profile` runs each point under Nsight Compute."""

    metric_set: str = "default"   # a name in characterize.measure.ncu.METRIC_SETS
    cache_control: str = "none"   # none keeps L2 contents between kernels (needed for L2 pinning)
    clock_control: str = "none"   # the clock policy bench runs at too: unlocked, sampled by NVML per point
    replay_mode: str = "kernel"
    tables: int = 2               # profiled launches per point (first tables of the last batch)
    warmup_batches: int | None = None  # bench's warm-up batches (bench.warmup) precede the profiled launches;
                                       # only that value is accepted here (profile sees bench's state)
    l2_set_aside: bool = True     # must equal bench.l2_set_aside: profile runs in the state bench timed

    def validate(self) -> "ProfileConfig":
        if not isinstance(self.l2_set_aside, bool):
            raise ConfigError(f"profile.l2_set_aside must be true or false, got {self.l2_set_aside!r}")
        if self.cache_control not in ("none", "all"):
            raise ConfigError("cache_control must be 'none' or 'all'")
        if self.clock_control not in ("base", "none"):
            raise ConfigError("clock_control must be 'base' or 'none'")
        if self.replay_mode not in ("kernel", "application", "range"):
            raise ConfigError("replay_mode must be kernel, application or range")
        _count("profile.tables", self.tables, 1, MAX_BATCHES, "profiled launches per point")
        if self.warmup_batches is not None:   # None: as bench warms up
            _count("profile.warmup_batches", self.warmup_batches, 0, MAX_BATCHES, "warm-up batches")
        return self


@dataclass(frozen=True)
class SlurmConfig:
    """Where `--executor slurm` sends each point (one Slurm array task per point). The
    CLI's --slurm-partition, --slurm-gpus-per-task and --slurm-time override the first
    three; `gpus` names several GPU types, each reached by a partition or a constraint,
    so one experiment measures all of them into one run directory."""

    partition: str = ""                 # sbatch --partition ("" : the cluster's default)
    gpus_per_task: int = 1              # sbatch --gpus-per-task for the cuda backend (emulate asks for none)
    time: int = 60                      # minutes one point may take before Slurm ends it (TIMEOUT)
    constraint: str = ""                # sbatch --constraint, e.g. a node feature naming the GPU
    setup: tuple[str, ...] = ()         # shell lines run before each task (module load, venv activation)
    gpus: dict[str, dict[str, str]] = field(default_factory=dict)  # GPU type -> {partition, constraint}
    poll: float = 2.0                   # seconds between two looks at the queue (squeue, sacct)

    def validate(self) -> "SlurmConfig":
        _count("slurm.time", self.time, 1, MAX_SECONDS // 60, "slurm.time is minutes per point")
        _seconds("slurm.poll", self.poll, 0.05, 600, "seconds between two looks at the Slurm queue")
        _count("slurm.gpus_per_task", self.gpus_per_task, 0, 64, "GPUs per task")
        for name, where in self.gpus.items():
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
                raise ConfigError(f"slurm.gpus: GPU type {name!r} may hold only letters, digits, '.', '_' and '-'")
            bad = set(where) - {"partition", "constraint"}
            if bad or not where:
                raise ConfigError(f"slurm.gpus.{name} takes partition and/or constraint, got "
                                  f"{', '.join(sorted(where)) or 'nothing'}")
        return self


@dataclass(frozen=True)
class DlrmConfig:
    """The DLRM around the embedding stage, in DLRM's own notation: the bottom MLP
    lists its input (dense features) and layer widths, whose last must equal D; the
    top MLP lists its layer widths (its input is the dot interaction's output). The
    defaults are the MICRO 2024 paper's model."""

    bottom: tuple[int, ...] = (256, 128, 128)   # dense features -> ... -> D
    top: tuple[int, ...] = (128, 64, 1)         # interaction output -> ... -> 1 (click probability)
    interaction: str = "dot"                    # pairwise dot products of the T + 1 feature vectors

    def validate(self, D: int) -> "DlrmConfig":
        for name in ("bottom", "top"):
            dims = getattr(self, name)
            if len(dims) < 2 - (name == "top") or any(isinstance(d, bool) or not isinstance(d, int) or d <= 0
                                                    for d in dims):
                raise ConfigError(f"dlrm.{name} must list positive layer widths, got {list(dims)!r}")
        if self.bottom[-1] != D:
            raise ConfigError(f"the bottom MLP must end at the embedding dimension D={D}, got {self.bottom[-1]}")
        if self.interaction != "dot":
            raise ConfigError(f"dlrm.interaction {self.interaction!r} is not supported; use 'dot'")
        return self

    def interaction_width(self, T: int, D: int) -> int:
        """Top-MLP input: the dense vector plus one dot product per pair of the T + 1 vectors."""
        return D + (T + 1) * T // 2

    @classmethod
    def for_dim(cls, D: int) -> "DlrmConfig":
        """The paper's model with its bottom MLP ending at D (the paper's D is 128)."""
        paper = cls()
        return cls(bottom=(*paper.bottom[:-1], D))

    @staticmethod
    def parse_dims(text: str) -> tuple[int, ...]:
        """'256-128-128' -> (256, 128, 128), as DLRM's --arch-mlp options spell them."""
        try:
            return tuple(int(x) for x in text.split("-"))
        except ValueError:
            raise ConfigError(f"bad MLP shape {text!r}: use widths joined by '-', e.g. 256-128-128") from None


#: how a user's kernel spreads its work: lanes sharing a bag, or a warp per (bag, chunk of features)
USER_WORK = ("bag", "chunk")


@dataclass(frozen=True)
class UserKernel:
    """A kernel of one's own, characterized beside the family (an experiment's
    [variants.NAME] table): where its code is, which function gathers, and how it is
    launched, which the model cannot read from the code. Its entry point takes the
    launch wrappers' arguments (kernels/chz_compat.cuh: chz_bag_args, chz_launch, a
    stream) and launches one table."""

    source: str = ""        # a .cu file, built as the toolkit builds its own: per architecture, and for the CPU
                            # emulator (-DCHZ_EMULATE) so that it is checked against torch without a GPU
    binary: str = ""        # or a CUDA binary already built (a shared library, cubin or fatbin): SASS and GPU runs
    kernel: str = "."       # regular expression of the gathering kernel's name in the binary
    entry: str = ""         # exported C function: int f(const chz_bag_args*, const chz_launch*, void* stream)
    callable: str = ""      # or "module:function", a Python callable f(BagArgs, LaunchArgs, stream) -> int
    block: tuple[int, int] = (32, 8)
    grid: int = 0           # 0: as many blocks as the tasks need; N: a fixed grid striding over them
    work: str = "bag"       # bag: lanes_per_bag lanes per bag | chunk: a warp per (bag, chunk_features features)
    lanes_per_bag: int = 0  # bag work; 0: read from the SASS
    chunk_features: int = 32
    dtypes: tuple[str, ...] = ("fp32",)
    offset2bag: bool = False          # writes offset2bag and bag sizes as torch's operator does
    per_sample_weights: bool = False
    description: str = ""

    @classmethod
    def from_dict(cls, name: str, data: dict[str, Any], base: Path | None, source: str) -> "UserKernel":
        """The [variants.NAME] table; relative paths are relative to the experiment file."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"{source or 'experiment'}: variants.{name} has no field(s) {', '.join(sorted(unknown))}; "
                              f"it takes {', '.join(sorted(known))}")
        _check_types(cls, data, source, f"variants.{name}")
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        for key in ("source", "binary"):
            if values.get(key) and base is not None and not Path(values[key]).is_absolute():
                values[key] = str((base / values[key]).resolve())
        return cls(**values).validate(name, source)

    def validate(self, name: str, source: str = "") -> "UserKernel":
        where = f"{source + ': ' if source else ''}variants.{name}"
        if bool(self.source) == bool(self.binary):
            raise ConfigError(f"{where}: give the kernel's source (a .cu file the toolkit builds) or its binary "
                              "(one already built), one of the two")
        path = Path(self.source or self.binary)
        if not path.is_file():
            raise ConfigError(f"{where}: {path} does not exist")
        if self.source and path.suffix != ".cu":
            raise ConfigError(f"{where}: source {path} is not a .cu file")
        if self.entry and self.callable:
            raise ConfigError(f"{where}: entry (a C function in the binary) or callable (a Python function), not both")
        if self.callable and ":" not in self.callable:
            raise ConfigError(f"{where}: callable must be 'module:function', got {self.callable!r}")
        try:
            re.compile(self.kernel)
        except re.error as e:
            raise ConfigError(f"{where}: kernel {self.kernel!r} is not a regular expression ({e})") from None
        if self.work not in USER_WORK:
            raise ConfigError(f"{where}: work must be one of {', '.join(USER_WORK)}, got {self.work!r}")
        bx, by = self.block
        if bx < 1 or by < 1 or bx * by > 1024 or (bx * by) % 32:
            raise ConfigError(f"{where}: block {list(self.block)} must hold whole warps, at most 1024 threads")
        if self.grid < 0 or not 0 <= self.lanes_per_bag <= 32 or self.chunk_features < 1:
            raise ConfigError(f"{where}: grid >= 0, lanes_per_bag in 0..32 and chunk_features >= 1, got "
                              f"{self.grid}, {self.lanes_per_bag}, {self.chunk_features}")
        for dt in self.dtypes:
            if dt not in DTYPES:
                raise ConfigError(f"{where}: dtype {dt!r} is not one of {', '.join(DTYPES)}")
        return self


@dataclass(frozen=True)
class ExperimentConfig:
    """Everything one `characterize run` does: workload x datasets x variants x archs."""

    name: str = "paper"
    description: str = "The MICRO 2024 paper's matrix"
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    datasets: tuple[str, ...] = ()                    # empty: every hotness preset, in order
    variants: tuple[str, ...] = ()                    # empty: every public variant, in order
    dtypes: tuple[str, ...] = ()                      # precisions the model also predicts beside workload.dtype
    params: dict[str, dict[str, Any]] = field(default_factory=dict)  # per-variant overrides
    archs: tuple[str, ...] = DEFAULT_ARCHS            # static characterization targets
    maxrregcount: tuple[int, ...] = (32, 40, 42, 48, 64)  # register sweep caps
    bench: BenchConfig = field(default_factory=BenchConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)  # where --executor slurm sends each point
    source: str = ""                                   # the file it was read from
    user_kernels: dict[str, UserKernel] = field(default_factory=dict)  # [variants.NAME] tables: kernels of one's own

    def validate(self, gpu: Any = None) -> "ExperimentConfig":
        """Structural checks of the experiment's own values; names of datasets, variants,
        parameters and architectures are checked against their registries by
        `pipeline.check_experiment`."""
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.name):
            raise ConfigError(f"experiment name {self.name!r} may hold only letters, digits, '.', '_' and '-'")
        if len(self.name) > MAX_NAME:
            raise ConfigError(f"experiment name of {len(self.name)} characters: at most {MAX_NAME} (run directories "
                              "and Slurm jobs are named after it, and file names have a length limit)")
        if any(isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c <= 0 for c in self.maxrregcount):
            raise ConfigError(f"maxrregcount values must be positive integers, got {list(self.maxrregcount)!r}")
        for dt in self.dtypes:
            if dt not in DTYPES:
                raise ConfigError(f"dtypes: {dt!r} is not supported; use {', '.join(DTYPES)}")
        self.workload.validate(gpu=gpu)
        self.bench.validate()
        self.profile.validate()
        if self.profile.l2_set_aside != self.bench.l2_set_aside:
            raise ConfigError(f"profile.l2_set_aside is {str(self.profile.l2_set_aside).lower()} but bench.l2_set_aside "
                              f"is {str(self.bench.l2_set_aside).lower()}: profile runs in the state bench timed; set "
                              "bench.l2_set_aside (profile follows it)")
        if self.profile.warmup_batches is not None and self.profile.warmup_batches != self.bench.warmup:
            raise ConfigError(f"profile.warmup_batches is {self.profile.warmup_batches} but bench.warmup is "
                              f"{self.bench.warmup}: the profiled launches follow bench's warm-up batches, so that "
                              "profile measures the state bench timed; remove profile.warmup_batches")
        self.slurm.validate()
        return self

    def params_for(self, variant: str) -> dict[str, Any]:
        return dict(self.params.get(variant, {}))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["workload"] = self.workload.to_dict()
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "") -> "ExperimentConfig":
        data = dict(data)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"{source or 'experiment'}: unknown field(s) {', '.join(sorted(unknown))}")
        base = Path(source).parent if source else None
        kernels: dict[str, UserKernel] = {}
        for name, spec in dict(data.pop("user_kernels", None) or {}).items():   # as to_dict writes them
            kernels[name] = spec if isinstance(spec, UserKernel) else UserKernel.from_dict(name, spec, base, source)
        if isinstance(data.get("variants"), dict):   # [variants.NAME] tables: built-in ones empty, one's own described
            tables = data["variants"]
            for name, spec in tables.items():
                if not isinstance(spec, dict):
                    raise ConfigError(f"{source or 'experiment'}: variants.{name} must be a table ([variants.{name}])")
                if spec:
                    kernels[name] = UserKernel.from_dict(name, spec, base, source)
            data["variants"] = list(tables)
        _check_types(cls, data, source, "")
        kwargs: dict[str, Any] = {"user_kernels": kernels}
        for key, value in data.items():
            if key == "workload":
                value = WorkloadConfig.from_dict(value, source)
            elif key == "bench":
                value = _sub(BenchConfig, value, source)
            elif key == "profile":
                value = _sub(ProfileConfig, value, source)
            elif key == "slurm":
                value = _sub(SlurmConfig, value, source)
            elif key in ("datasets", "variants", "archs", "maxrregcount", "dtypes") or key == "modes":
                value = tuple(value)
            kwargs[key] = value
        kwargs["source"] = source
        return cls(**kwargs)


#: the largest counts and durations a setting may ask for (beyond them, a typo)
MAX_BATCHES = 100_000
MAX_REPS = 10_000_000
MAX_SECONDS = 7 * 24 * 3600
#: the longest experiment name (run directories are named <name>-<gpu>)
MAX_NAME = 100


def _count(name: str, value: Any, low: int, high: int, what: str) -> None:
    """ConfigError unless `value` is an integer in low..high."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
        raise ConfigError(f"{name} must be an integer in {low:,}..{high:,} ({what}), got {value!r}")


def _seconds(name: str, value: Any, low: float, high: float, what: str) -> None:
    """ConfigError unless `value` is a finite number above `low` and at most `high`."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not low < value <= high:
        raise ConfigError(f"{name} must be a finite number above {low:g} and at most {high:g} ({what}), "
                          f"got {value!r}")


def _sub(cls: type, value: dict[str, Any], source: str) -> Any:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(value) - known
    if unknown:
        raise ConfigError(f"{source}: unknown {cls.__name__} field(s) {', '.join(sorted(unknown))}")
    _check_types(cls, value, source, cls.__name__.removesuffix("Config").lower())
    value = {k: tuple(v) if isinstance(v, list) else v for k, v in value.items()}
    return cls(**value)


def _type_ok(value: Any, hint: Any) -> bool:
    """Whether a TOML/JSON value can stand for a field of type `hint` (bools are not numbers)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if hint is int:
        return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if hint is float:   # NaN and infinity (TOML's nan, inf, 1e400) are not settings
        return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) and \
            math.isfinite(value)
    if hint is str:
        return isinstance(value, str)
    if hint is Pooling:
        return isinstance(value, (str, Pooling)) or _type_ok(value, int)
    if origin is tuple:
        return isinstance(value, (list, tuple)) and all(_type_ok(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(_type_ok(k, args[0]) and _type_ok(v, args[1]) for k, v in value.items())
    if dataclasses.is_dataclass(hint):
        return isinstance(value, (dict, hint))
    return True


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Pooling:
        return "an integer or a string such as \"uniform:0:20\""
    if origin is tuple:
        return f"a list of {_describe(args[0]).removeprefix('an ').removeprefix('a ')}s"
    if origin is dict:
        return "a table"
    if dataclasses.is_dataclass(hint):
        return "a table"
    return {int: "an integer", float: "a number", str: "a string"}.get(hint, str(hint))


def _check_types(cls: type, values: dict[str, Any], source: str, section: str) -> None:
    """ConfigError naming the field, the value and the expected type, so a quoted number
    or a list where a scalar belongs is one line, not a TypeError deep in validate()."""
    hints = typing.get_type_hints(cls)
    for key, value in values.items():
        hint = hints.get(key)
        if hint is None or _type_ok(value, hint):
            continue
        where = f"{source}: " if source else ""
        name = f"{section}.{key}" if section else key
        tip = ""
        if isinstance(value, str) and re.fullmatch(r"[+-]?\d+(\.\d*)?", value.strip()):
            tip = "; write the number without quotes"
        elif isinstance(value, float) and not math.isfinite(value):
            tip = "; NaN and infinity are not allowed"
        elif isinstance(value, list) and any(isinstance(v, str) for v in value) and hint is not str:
            tip = "; write the numbers without quotes"
        raise ConfigError(f"{where}{name} must be {_describe(hint)}, got {value!r}{tip}")


def parse_param_overrides(items: Iterable[str]) -> dict[str, dict[str, int]]:
    """['rpf.P=4', 'optmt.maxrregcount=42'] -> {'rpf': {'P': 4}, 'optmt': {'maxrregcount': 42}}."""
    out: dict[str, dict[str, int]] = {}
    for item in items:
        try:
            key, value = item.split("=", 1)
            variant, name = key.split(".", 1)
            out.setdefault(variant.strip(), {})[name.strip()] = int(value)
        except ValueError:
            raise ConfigError(f"bad parameter {item!r}: use VARIANT.NAME=INTEGER, e.g. rpf.P=4") from None
    return out


def experiments_dir() -> Path:
    """The named experiments shipped with the package (characterize/experiments/*.toml)."""
    return Path(__file__).resolve().parent / "experiments"


def read_experiment(name_or_path: str | None = None) -> ExperimentConfig:
    """Read an experiment: a TOML path, or a name shipped in characterize/experiments/ ('paper', 'quick').
    Only its structure is checked here; `pipeline.load_experiment` also checks its names."""
    target = name_or_path or "paper"
    path = Path(target)
    if not path.suffix:
        path = experiments_dir() / f"{target}.toml"
    if not path.is_file():
        available = sorted(p.stem for p in experiments_dir().glob("*.toml"))
        raise ConfigError(f"no experiment {target!r} (looked for {path}); available: {', '.join(available) or 'none'}."
                          + did_you_mean(path.stem, available))
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read ({e.strerror or e})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                          "save the experiment file as UTF-8") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {str(e).splitlines()[0]}") from None
    if not data:
        raise ConfigError(f"{path}: the experiment file is empty; give at least a name and what to change "
                          f"(see {experiments_dir() / 'quick.toml'}), or run the shipped 'paper' experiment by name")
    # an unnamed file is named after itself, never silently after the shipped 'paper' experiment
    data.setdefault("name", path.stem)
    try:
        return ExperimentConfig.from_dict(data, source=str(path))
    except TypeError as e:
        raise ConfigError(f"{path}: {e}") from None
