"""Run directory: every file a run directory can hold, declared once, as data.

The run directory is the contract between stages: the pipeline writes it step by
step, `store.Run` reads it back, the report and the notebook show it, other machines
resume it. Each artifact below says its path, format, the pipeline step that writes
it, whether its numbers are measured, static, predicted or a record, a one-line
meaning and, for tables, every column with its unit. Writers (`store.RunDir.write`),
readers (`store.Run.table`), the model's output columns, the report's data needs,
docs/gpu.md's run-directory table and the notebook's column help all come from here,
and a schema test holds a committed run and a fresh one to it. Adding an artifact
touches this table and the step that writes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

#: what the numbers in a file are
SOURCES = ("measured", "static", "trace", "predicted", "record")


@dataclass(frozen=True)
class Column:
    """One column of a table artifact."""

    name: str
    unit: str      # "" for text and flags; us, ns, %, B, count, x (a ratio), MHz, ...
    meaning: str


#: what a JSON field may hold ("?" after it: or null); `store` checks files against these
KINDS = ("object", "records", "list", "text", "number", "numbers", "flag", "any")


@dataclass(frozen=True)
class Field:
    """One field of a JSON artifact. kind: object | records (a list of objects) | list |
    text | number | numbers (an object of numbers) | flag | any, "?" appended when it may
    be null; a required field must be present."""

    name: str
    kind: str
    meaning: str
    required: bool = False


@dataclass(frozen=True)
class Artifact:
    """One file (or family of files) of a run directory."""

    key: str                     # how the code names it
    path: str                    # relative to the run directory; '*' for a family of files
    format: str                  # csv | json | text | ncu-rep | html | folder
    step: str                    # the pipeline step that writes it (pipeline.STEPS), or 'run'
    source: str                  # measured | static | trace | predicted | record (SOURCES)
    meaning: str
    columns: tuple[Column, ...] = ()
    fields: tuple[Field, ...] = ()   # JSON: the fields of the object (of each entry, when keyed)
    keyed: str = ""              # JSON: what the top-level keys are, when each value is one record (locality)
    added_by: tuple[str, ...] = ()   # later steps that add rows to it (the sweeps step, after the first answer)

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"{self.path} has no column {name!r}")


def _fields(*specs: str) -> tuple[Field, ...]:
    """Fields from 'name | kind | meaning' lines; a name ending in '!' is required."""
    out = []
    for spec in specs:
        name, kind, meaning = (part.strip() for part in spec.split("|", 2))
        assert kind.rstrip("?") in KINDS, kind
        out.append(Field(name.rstrip("!"), kind, meaning, name.endswith("!")))
    return tuple(out)


def _cols(*specs: str) -> tuple[Column, ...]:
    """Columns from 'name | unit | meaning' lines."""
    out = []
    for spec in specs:
        name, unit, meaning = (part.strip() for part in spec.split("|", 2))
        out.append(Column(name, unit, meaning))
    return tuple(out)


_STATIC = _cols(
    "variant | | the kernel variant (kernels.registry)",
    "arch | | SM architecture compiled for (sm_80, sm_90, ...)",
    "maxrregcount | count | the register cap given to nvcc (empty: uncapped)",
    "kernel | | the kernel's name as ptxas reports it",
    "role | | lookup (the embedding-bag kernel) or prepass (the L2 pinning pre-pass)",
    "registers | count | registers per thread (ptxas)",
    "spill_stores | B | bytes of spill stores per thread (ptxas)",
    "spill_loads | B | bytes of spill loads per thread (ptxas)",
    "stack_frame | B | stack frame per thread (ptxas)",
    "shared_mem | B | static shared memory per block (ptxas)",
    "block_size | count | threads per block as launched",
    "blocks_per_sm | count | resident blocks per SM (occupancy calculator)",
    "theoretical_occupancy_pct | % | resident warps over the SM's maximum",
    "limiter | | what limits occupancy: registers, shared memory, warps or blocks",
    "sweep | | true for a register-sweep row rather than the variant as configured",
    "compiler | | nvcc path, version and where it was found",
    "dtype | | table element type of the build (config.DTYPES)",
)

_SASS = _cols(
    "variant | | the kernel variant",
    "arch | | SM architecture of the SASS",
    "kernel | | the kernel whose hot loop this is",
    "loop | | header and latch addresses of the hot loop",
    "role | | lookup or prepass",
    "maxrregcount | count | register cap of the build (empty: uncapped)",
    "registers | count | registers per thread",
    "instructions | count | instructions on one steady-state iteration of the hot loop",
    "lookups_per_iteration | count | distinct indices the iteration's row loads gather by",
    "instructions_per_lookup | count | instructions / lookups per iteration",
    "row_loads | count | gathered global loads of table rows per iteration",
    "index_loads | count | global loads whose value feeds a gather's address",
    "other_loads | count | other global loads (weights, offsets)",
    "load_bits | | global loads per width in bits, a JSON object",
    "local_mem_ops | count | LDL/STL (spills) on the hot loop's path",
    "shuffles | count | SHFL instructions per iteration",
    "prefetches | | CCTL prefetches by kind, a JSON object (E.PML2: evict_last)",
    "cycles_per_iteration | count | in-order replay: cycles per iteration",
    "latencies_per_iteration | count | memory latencies a warp serializes per iteration",
    "rows_in_flight | count | row loads per warp per memory latency (row loads / latencies)",
    "bytes_in_flight_per_warp | B | bytes those row loads move per warp per latency",
    "dtype | | table element type of the build",
    "qparam_loads | count | int8: loads of a row's scale and bias",
    "atomics | count | global atomics (RED, ATOM) per iteration",
    "atomic_bits | count | bits one lane's atomics update per iteration",
    "row_load_bits | count | width of one lane's row load in bits (x 32 lanes: the bytes one warp request reads)",
    "lanes_per_bag | count | lanes sharing one bag (a warp holds 32 / lanes_per_bag bags at once)",
    "tile_lookups | count | lookups of a bag whose indices one tile load brings (0: no tile loop)",
    "bag_latencies | | memory latencies a warp serializes per task (bag, or bag and feature chunk) by bag "
    "length L, in units of a row's latency (index streams mostly hit L1), a JSON object replayed over the whole "
    "loop nest",
    "bag_instructions | | instructions a warp issues per task by bag length L, a JSON object",
    "nest_rows_in_flight | count | row loads per warp per latency over the whole loop nest at L = 150",
    "spills_in_nest | count | LDL/STL anywhere in the loop nest",
    "setup_latencies | count | memory latencies a warp serializes once per run of tasks beyond the tasks (a loop "
    "around the loop over bags: tbe's switch to the next table of a warp's slice), in a row's latency",
)

_PREDICTIONS = _cols(
    "variant | | the kernel variant",
    "dtype | | table element type",
    "dataset | | hotness preset or trace file",
    "arch | | SM architecture",
    "gpu | | GPU (hardware.specs key)",
    "mode | | steady (tables in turn, warm L2) or cold (L2 flushed before each launch)",
    "constants | | default, calibrated or given model constants",
    "kernel_source | | whose machine code the kernel's facts come from: ours, torch 2.13.0, fbgemm 1.8.0, a binary",
    "code_arch | | the architecture whose code the facts were read from (the GPU's, or the nearest one built)",
    "tables_per_launch | count | tables one launch covers (1, or T for a kernel covering every table)",
    "tables_in_flight | count | tables whose rows share the L2 while the launch runs (1; tbe: its work order's phase)",
    "time_us | us | predicted time of one launch (a PREDICTION)",
    "time_us_low | us | fast end of the band: the constants' ranges and the model's measured error",
    "time_us_high | us | slow end of the band",
    "time_per_table_us | us | time_us / tables_per_launch",
    "batch_us | us | one batch of all T tables (every launch it takes)",
    "floor_us | us | the compulsory traffic (distinct rows, streams, writes) at peak bandwidth: no kernel is faster",
    "speedup_vs_base | x | base's batch time over this one's",
    "speedup_vs_torch | x | PyTorch's kernel's batch time over this one's (what users run today)",
    "speedup_vs_fbgemm | x | FBGEMM's TBE's batch time over this one's",
    "bound | | the term that sets the time: latency, dram, l2, l1, issue (or host link)",
    "regime | | where the time goes: host tables, short bags, L1/L2-resident, DRAM-bound or latency-bound (its band "
    "is that regime's measured error)",
    "l1_hit_rate_pct | % | predicted L1 hit rate of row requests",
    "l2_hit_rate_pct | % | predicted L2 hit rate of row requests that reach L2",
    "dram_bytes | B | predicted DRAM traffic of one launch",
    "dram_read_bytes | B | of it, reads",
    "dram_write_bytes | B | of it, writes",
    "l2_bytes | B | predicted L2 traffic of one launch",
    "l1_bytes | B | predicted L1 wavefront traffic of one launch",
    "blocks_per_sm | count | resident blocks per SM (occupancy calculator on the kernel's resources)",
    "registers | count | registers per thread",
    "resident_warps | count | warps resident per SM averaged over the launch (ncu's achieved occupancy, in warps)",
    "loads_in_flight | count | row loads a warp keeps in flight over its whole loop nest at the trace's bag lengths "
    "(lookups per latency waited; the SASS table's rows_in_flight is the hot loop's alone)",
    "latencies_per_lookup | count | row latencies a warp waits per lookup over the whole loop nest (SASS)",
    "instructions_per_lookup | count | instructions a warp issues per lookup over the loop nest (SASS)",
    "waves | count | rounds of blocks the busiest SM runs (whole: blocks of equal work retire together)",
    "latency_ns | ns | mean load-to-use latency of a row",
    "step_ns | ns | one wait of a warp: the slowest of the rows in flight",
    "task_us | us | one task (a bag, or a bag and feature chunk) of one warp",
    "latency_us | us | latency term",
    "dram_us | us | DRAM bandwidth term (reads and writes at their efficiencies)",
    "l2_us | us | L2 bandwidth term",
    "l1_us | us | L1 bandwidth term",
    "issue_us | us | instruction issue term",
    "prepass_us | us | the L2 pinning pre-pass, apart from the launch",
    "pinned_rows | count | hot rows kept in the persisting L2",
    "cache_ratio | % | cache: C / E (a fraction); uvm: the share of a table GPU memory holds",
    "cache_rows | count | cache: rows of the GPU cache",
    "cache_hit_rate_pct | % | cache: hits among a batch's unique rows; uvm: of the reads",
    "cache_lookup_hit_rate_pct | % | cache: hits among a batch's lookups",
    "host_bytes | B | bytes crossing the host link per launch",
    "host_link | | the CPU-GPU link of the host-resident rows",
    "dedup_us | us | cache: unique ids and map lookups",
    "transfer_us | us | host-resident rows over the link",
    "lookup_us | us | the lookup kernel on the GPU-resident rows",
    "validated_n | count | public measurements the model's error was measured on (characterize validate)",
    "validated_gmae_pct | % | the model's cross-validated GMAE on them",
    "note | | how the row was modelled",
)

_E2E = _cols(
    "variant | | the kernel variant of the embedding stage",
    "dataset | | hotness preset or trace file",
    "gpu | | GPU (hardware.specs key)",
    "arch | | SM architecture",
    "phase | | inference or training",
    "source | | predicted or measured",
    "stage | | a stage of the DLRM step (bottom MLP, embedding, interaction, ...)",
    "time_us | us | time of the stage",
    "time_us_low | us | fast end of the band",
    "time_us_high | us | slow end of the band",
    "embedding_share | % | the embedding stage's share of the step (a fraction)",
    "speedup_e2e | x | base's step time over this variant's",
    "speedup_embedding | x | base's embedding stage over this variant's",
)

_VALIDATION = _cols(
    "claim | | one of the paper's headline claims (analysis.claims)",
    "paper | | what the paper says",
    "model | | what the model predicts for it",
    "agrees | | whether the model is within the claim's tolerance",
    "gpu | | GPU the claim is checked on",
    "constants | | default, calibrated or given model constants",
)

_LOCALITY = _cols(
    "dataset | | hotness preset or trace file",
    "lookups | count | lookups of the analyzed table",
    "unique_rows | count | distinct rows they read",
    "rows | count | rows of the table (E)",
    "row_bytes | B | bytes one lookup reads",
    "cold_fraction | % | first reads among the lookups (a fraction)",
    "bytes_touched | B | unique rows x row bytes",
    "table | count | which table of the dataset was analyzed",
    "description | | how the trace was made or read",
    "top_K_coverage | % | share of lookups the K most frequent rows take (a fraction), per K",
    "reuse_pNN | count | reuse-distance quantiles (distinct rows between two reads of a row)",
)

_BENCH = _cols(
    "variant | | the kernel variant",
    "dataset | | hotness preset or trace file",
    "status | | ok, or failed with the point's error",
    "mode | | steady or cold",
    "per_table_us | us | mean time of one table launch: one event pair around the batch of T launches, / T "
    "(cold mode: each launch after its own flush)",
    "ci95_us | us | 95% confidence half-width of the batch time (Student t)",
    "per_launch_us | us | diagnostic: one event pair around each launch (the launch front-end included), "
    "mean over tables",
    "timed_unit | | what one event pair bracketed",
    "launches_per_batch | count | a batched variant's kernel launches per batch (one per dtype group); "
    "absent for per-table variants",
)

_META = _fields(
    "started! | text | when the run directory was created (UTC, ISO 8601)",
    "name | text | the run's name (its directory's)",
    "experiment! | object | the full experiment (config.ExperimentConfig.to_dict), as the points were measured",
    "fingerprint | object | what every point depends on: the experiment's workload, parameters and settings, "
    "each trace file's SHA-256, the toolkit and the backend (store.run_fingerprint); a resume that differs is "
    "refused, naming the difference, or re-measures what changed (--remeasure)",
    "command_line | text | the command that last wrote the run",
    "environment | object? | host, Python, torch, numpy, pandas versions and the git revision",
    "backend | text? | cuda or emulate (null: no measurement here)",
    "gpu | object? | the GPU identity (null without one)",
    "cache_control | text? | ncu cache control of profile points",
    "clock_control | text? | clock control of profile points",
    "resumed | list | when the run was resumed",
    "steps | object | each step's outcome: done, skipped: why, failed: why",
    "ncu | object? | the ncu used by profile: path and version",
    "executor | object? | Slurm: partition, constraint and hosts",
    "gpu_type | text? | with several Slurm GPU types: this run's",
    "analyzed | object? | a run measured on a GPU and analyzed elsewhere (run --resume without it): when, the "
    "kernel sources' digest and git revision its static facts and predictions describe, and whether those "
    "differ from the kernels measured",
)

_POINT = _fields(
    "kind | text | bench or profile",
    "variant! | text | the kernel variant",
    "dataset! | text | hotness preset or trace file",
    "status! | text | ok, or failed",
    "finished | text | when the point was written (UTC)",
    "error | text | why it failed",
    "fingerprint | object | what the point was measured with (store.point_fingerprint); a point whose "
    "fingerprint differs from the run's is not reused",
    "backend | text | cuda or emulate",
    "gpu | text? | the GPU it ran on",
    "params | object | the variant's parameters as bound",
    "check | object | the correctness check against torch before timing",
    "clocks | object | NVML samples before and after the point",
    "throttle | object | whether a clock slowdown was seen, and why",
    "summary | records | one row per mode: latency statistics (the bench columns)",
    "repetitions | records | every timed repetition",
    "per_table_mean_us | object | mean time of each table launch per mode",
    "report | text | profile: the .ncu-rep, relative to the run directory",
    "cache_report | text | profile: the cache counters' .ncu-rep",
    "replay_modes | object | profile: the replay mode of each metric",
    "kernels | number | profile: kernels in the report",
    "argv | list | profile: the ncu command line",
    "scheduler | object | Slurm: the job's state when it ended without a point",
    "ran_on | object | Slurm: the job and host that measured the point",
)

_LOCALITY_FIELDS = _fields(
    "lookups! | number | lookups of the analyzed table",
    "unique_rows! | number | distinct rows they read",
    "rows | number | rows of the table (E)",
    "row_bytes | number | bytes one lookup reads",
    "cold_fraction | number | first reads among the lookups",
    "bytes_touched | number | unique rows x row bytes",
    "table | number | which table of the dataset was analyzed",
    "description | text | how the trace was made or read",
    "top_k_coverage | numbers | share of lookups the K most frequent rows take, by K",
    "reuse_distance_quantiles | numbers | reuse-distance quantiles, by pNN",
    "reuse_histogram | list | reuse distances by power-of-two bucket",
)

ARTIFACTS: dict[str, Artifact] = {a.key: a for a in (
    Artifact("meta", "meta.json", "json", "run", "record",
             "GPU identity (without UUID), driver, CUDA and ncu versions, clocks, SM count, L2 size, cache and "
             "clock modes, git revision, the full experiment and its fingerprint, the command line, each step's "
             "outcome", fields=_META),
    Artifact("log", "log.txt", "text", "run", "record", "what happened, one timestamped line per event"),
    Artifact("static", "static.csv", "csv", "static", "static",
             "registers, spills and theoretical occupancy per variant x architecture (with the register sweep)",
             _STATIC, added_by=("sweeps",)),
    Artifact("sass", "sass.csv", "csv", "static", "static",
             "each kernel's hot loop read from its SASS: loads by width, spills, rows in flight", _SASS,
             added_by=("sweeps",)),
    Artifact("locality", "locality.json", "json", "locality", "trace",
             "trace statistics per dataset: unique rows, top-K coverage, reuse distances", _LOCALITY,
             fields=_LOCALITY_FIELDS, keyed="dataset"),
    Artifact("predictions", "predictions.csv", "csv", "predict", "predicted",
             "model predictions per variant x dataset x GPU x mode (x dtype, x cache size), with bands",
             _PREDICTIONS, added_by=("sweeps",)),
    Artifact("model_validation", "model_validation.csv", "csv", "predict", "predicted",
             "the model against the paper's published claims", _VALIDATION),
    Artifact("e2e", "e2e.csv", "csv", "e2e", "predicted",
             "the DLRM step around each variant, stage by stage (measured too on a GPU)", _E2E),
    Artifact("bench", "points/bench/*.json", "json", "bench", "measured",
             "one file per finished (variant, dataset) point: checks, every repetition, per-table means, clocks, "
             "throttling, identity; written atomically", _BENCH, fields=_POINT),
    Artifact("profile", "points/profile/*.json", "json", "profile", "measured",
             "one file per profiled point: its report, scoping, collection modes and replay modes",
             fields=_POINT),
    Artifact("ncu", "ncu/*.ncu-rep", "ncu-rep", "profile", "measured",
             "the raw Nsight Compute reports (and *.cache.ncu-rep, cache counters under application replay), "
             "with their logs"),
    Artifact("gpus", "gpus/*", "folder", "bench", "measured",
             "with several Slurm GPU types: one complete run directory per type"),
    Artifact("jobs", "jobs/*", "folder", "bench", "record", "Slurm job scripts and logs (--executor slurm)"),
    Artifact("report", "report.html", "html", "report", "record", "the self-contained HTML report"),
    Artifact("lock", ".lock", "text", "run", "record",
             "held (flock) by the process writing the run, with its pid and command line"),
)}


def artifact(key: str) -> Artifact:
    """The declared artifact `key` (KeyError names the known ones)."""
    try:
        return ARTIFACTS[key]
    except KeyError:
        raise KeyError(f"no run-directory artifact {key!r}; known: {', '.join(ARTIFACTS)}") from None


def tables() -> list[Artifact]:
    """The CSV artifacts: the ones with a fixed set of columns."""
    return [a for a in ARTIFACTS.values() if a.format == "csv"]


def markdown_table(artifacts: Iterable[Artifact] | None = None) -> str:
    """docs/gpu.md's run-directory table: file, written by, numbers, meaning."""
    lines = ["| file | written by | numbers | what it holds |", "|---|---|---|---|"]
    for a in artifacts or ARTIFACTS.values():
        step = ", then ".join([a.step, *a.added_by])
        lines.append(f"| `{a.path}` | {step} | {a.source} | {a.meaning} |")
    return "\n".join(lines)


def columns(key: str) -> list[dict[str, str]]:
    """Every column of a run-directory table (`chz.columns("predictions")`) with its unit
    and meaning, as the notebook shows them."""
    return [{"column": c.name, "unit": c.unit, "meaning": c.meaning} for c in artifact(key).columns]
