"""Pipeline, experiments: an experiment checked against the registries (datasets, variants and
what each can run, parameters, architectures, whether the GPU holds it), and one built around a
user's trace file.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from characterize.config import ExperimentConfig, WorkloadConfig, read_experiment
from characterize.errors import (
    GpuMemoryError,
)
from characterize.hardware.specs import gpu_spec, normalize_arch
from characterize.kernels.registry import (
    HOST_VARIANTS,
    VARIANT_ORDER,
    check_caps,
    default_cache_rows,
    get_variant,
    register_user,
)
from characterize.pipeline.facts import reads
from characterize.workloads.locality import check_dataset
from characterize.workloads.presets import HOTNESS_ORDER, Hotness, parse_dataset
from characterize.workloads.shape import infer_workload, trace_shape


def check_experiment(exp: ExperimentConfig, gpu: Any = None) -> ExperimentConfig:
    """`exp.validate(gpu)` plus the names it holds: datasets, variants (and whether
    each can run D), variant parameters and architectures. Empty datasets or variants
    mean all of them, in registry order; the returned experiment lists them. Before any
    work: without a GPU the workload must fit each target architecture's GPU, trace
    files must exist, and one table must fit the host-memory budget. Tables too large
    for the GPU steer an experiment that names no variants to the host-resident ones
    (cache, uvm); one that names GPU-resident variants is refused with that advice.
    Kernels of one's own ([variants.NAME] tables) are registered as variants here."""
    targets = [gpu] if gpu is not None else [gpu_spec(normalize_arch(a)) for a in exp.archs]
    default = VARIANT_ORDER
    if not exp.variants and not all(_fits(exp.workload, g) for g in targets):
        default = HOST_VARIANTS
    exp = dataclasses.replace(exp, datasets=exp.datasets or HOTNESS_ORDER, variants=exp.variants or default)
    exp.validate()
    for name, kernel in exp.user_kernels.items():   # [variants.NAME]: kernels of one's own beside the family
        register_user(name, kernel)
    for v in exp.variants:
        get_variant(v).check_shape(exp.workload.D, exp.workload.dtype)
    for v, p in exp.params.items():
        get_variant(v).resolve_params(p)
    for a in exp.archs:
        normalize_arch(a)
    check_caps(exp.maxrregcount, f"{exp.source or 'the experiment'}: maxrregcount")
    for g in targets:   # without a GPU here the workload must still fit each target architecture's GPU
        try:
            check_fit(exp, g)
        except GpuMemoryError as e:
            if default is not HOST_VARIANTS:
                raise
            try:
                exp.workload.validate(gpu=g)
            except GpuMemoryError as resident:
                raise GpuMemoryError(f"{resident}; kept in host memory it still does not fit: {e}") from None
    for d in exp.datasets:
        check_dataset(d, exp.workload)
    return exp


def check_names(exp: ExperimentConfig) -> ExperimentConfig:
    """The names an experiment holds (variants, datasets, architectures), checked before
    anything else, GPU or no GPU: an unknown one is refused in one line, with the name it
    is closest to. Trace files must exist."""
    for v in exp.variants:
        get_variant(v)
    for a in exp.archs:
        normalize_arch(a)
    for d in exp.datasets:
        if not isinstance(parse_dataset(d), Hotness) and not Path(parse_dataset(d)).is_file():
            check_dataset(d, exp.workload)   # the one-line "no such trace file" refusal
    return exp


def _fits(workload: WorkloadConfig, gpu: Any) -> bool:
    """Whether the tables (and traces) fit the GPU's memory."""
    return workload.device_bytes() <= gpu.memory_bytes


def check_fit(exp: ExperimentConfig, gpu: Any, variants: Sequence[str] | None = None) -> None:
    """GpuMemoryError unless each variant's share of the workload fits `gpu`: the tables
    for GPU-resident variants, the caches (cache) or nothing (uvm) for host-resident ones."""
    for host in dict.fromkeys(get_variant(v).host for v in (variants or exp.variants)):
        C = exp.params_for("cache").get("C") or default_cache_rows(exp.workload.E) if host == "cache" else 0
        exp.workload.validate(gpu=gpu, host=host, cache_rows=C)


def load_experiment(name_or_path: str | None = None) -> ExperimentConfig:
    """A shipped experiment by name ('paper', 'quick') or a TOML file, fully checked."""
    return check_experiment(read_experiment(name_or_path))


@dataclass
class TraceExperiment:
    """An experiment made for a trace file (`--trace`): the experiment, and one line per
    choice made for it (what the file said, what was given, what was left out)."""

    experiment: ExperimentConfig
    notes: list[str]


def trace_experiment(path: str | Path, base: str | None = None, **given: Any) -> TraceExperiment:
    """The experiment `base` (default 'paper': every variant, its architectures and bench
    settings) on one dataset, the trace file `path`, with the workload inferred from the
    file (workloads.shape.infer_workload: T, E and the bags from the file, D and a flat
    stream's T from `given`, else MissingInput). Extra precisions are left to --dtypes;
    variants that cannot run the inferred D are left out, and said so."""
    exp = read_experiment(base)
    shape = trace_shape(path)
    inferred = infer_workload(shape, exp.workload, given)
    wl = inferred.workload
    notes = list(inferred.notes)
    runnable = tuple(v for v in exp.variants if reads(v, wl))
    dropped = [v for v in exp.variants if v not in runnable]
    if dropped:
        notes.append(f"left out: {', '.join(dropped)} (cannot run D={wl.D} {wl.dtype})")
    name = f"trace-{Path(path).stem}"
    exp = dataclasses.replace(exp, name=name, description=f"{exp.name} experiment on the trace {Path(path).name}",
                              datasets=(str(path),), workload=wl, variants=runnable, dtypes=())
    return TraceExperiment(check_experiment(exp), notes)

