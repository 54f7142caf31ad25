"""characterize: GPU microarchitecture characterization of DLRM embedding-bag kernels.

The public API for notebooks and scripts; every query returns a tidy DataFrame or a
small dataclass. Names resolve lazily so `import characterize` stays cheap.

    import characterize as chz
    run = chz.load_run("profiles/static-paper")
    a = chz.answer_run(run)          # what to use per dataset and GPU, by how much, how sure
    run.static, run.sass, run.locality, run.predictions, run.e2e, run.bench, run.kernels

Runs and experiments
    load_run            a run directory as DataFrames (Run: static, sass, locality, predictions, bench, ...)
    list_runs           the run directories under a folder
    Run                 a stored run (its tables, points and metadata)
    load_experiment     a shipped experiment ('paper', 'quick') or a TOML file, checked
    trace_experiment    an experiment on your own trace file, T, E and bags read from it
    run_experiment      the main job (`characterize run`) into a run directory
    predict             the model's predictions for an experiment (compiles what the model reads)
    predict_experiment  the same as predict
    calibrate           fit the model's constants to a measured run, stored per GPU
    columns             a run-directory table's columns with units and meanings
    ARTIFACTS           every file a run directory can hold, declared once
    ExperimentConfig    an experiment: workload x datasets x variants x architectures
    WorkloadConfig      the embedding stage in the field's vocabulary (T, E, D, B, L, dtype)
    Pooling             the pooling factor L (fixed, uniform or Poisson)

The answer
    answer              the best variant per dataset and GPU from predictions (and timings)
    answer_run          the same for a stored run
    ModelValidation     the model's error on measurements it was not fitted to (GMAE, band coverage)

Workloads
    generate            a preset dataset (one-item, high, medium, low, random, zipf:A) for a workload
    generate_stream     just N lookups of one table of a preset
    load_trace          a trace file read as the bench reads it
    load_dataset        a preset generated, or a trace file read, for a workload
    write_trace         a dataset written as .npz (dlrm_datasets layout) or .txt
    PRESETS             the hotness presets
    HOTNESS_ORDER       the datasets from hottest to coldest
    locality_stats      unique rows, top-K coverage and reuse distances of a stream
    reuse_distances     distinct rows between two reads of each row (exact, O(N log N))
    source_locality     the locality of a preset or one table of a trace file

Kernels and static characterization
    VARIANTS            the kernel family (torch, base, optmt, rpf, l2p, l2w, combined, warp, cache, uvm)
    VARIANT_ORDER       the family in presentation order
    run_variant         run one variant on the CPU emulation or the GPU
    bind                a built library's kernels as Python callables
    check_variants      every variant against torch.nn.functional.embedding_bag
    static_characterization  registers, spills and occupancy per variant and architecture
    default_register_cap     the register cap chosen per architecture and kernel
    theoretical_occupancy    the occupancy calculator
    ARCHS               per-architecture SM limits (hardware.specs)
    GPUS                the spec table of GPUs (hardware.specs)
    gpu_spec            a GPU by key, alias, architecture or driver name
    devices             the GPUs present (NVML and torch), or none

Extraction and analysis
    read_report         an .ncu-rep as a tidy frame (one row per kernel and metric)
    read_csv            an ncu CSV export as the same tidy frame
    read_any            either, chosen by extension and content
    wide                one row per kernel with friendly columns
    rule_results        ncu's rule findings per kernel
    kernel_summary      one row per kernel: speed of light, bound, memory chart, stalls
    weighted_stalls     stall reasons weighted by instructions issued (else executed, else duration)
    roofline            achieved and peak FLOP/s and bytes/s from ncu's roofline counters
    speedups            measured per-table latency and speedups with 95% CIs
    headline            measured technique x hotness speedup table
    stall_breakdown     stall reasons per (variant, dataset) of the lookup kernels
    compare_runs        two tidy metric tables compared metric by metric
    compare_sources     two runs or reports compared on the kernels they share
    compare_all         everything two sources can be compared on, as named frames
    match_kernels       kernels of two sources paired by name and launch order
    gmae                geometric-mean absolute error of predictions against measurements
    compare_to_measured predictions against a run's measurements, per point
    fit_run             the model's constants fitted to a measured run
    load_calibration    a GPU's stored calibration, or None
    primary_predictions the predictions at the workload's precision, one row per point
    precision_grid      predicted speedup per precision and variant over fp32 base
    paper_claims        the model against the MICRO 2024 paper's A100 claims
    PAPER_CLAIMS        the paper's published claims

The DLRM step and the report
    e2e                 the DLRM step around each variant, checked, predicted and (on a GPU) measured
    render_report       the self-contained HTML report of runs and .ncu-rep files
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_API = {
    # runs and experiments
    "load_run": "store", "list_runs": "store", "Run": "store",
    "load_experiment": "pipeline", "run_experiment": "pipeline", "predict": "pipeline", "calibrate": "pipeline",
    "trace_experiment": "pipeline",
    "ExperimentConfig": "config", "WorkloadConfig": "config", "Pooling": "config",
    # workloads
    "generate": "workloads.traces", "generate_stream": "workloads.traces", "load_trace": "workloads.traces",
    "load_dataset": "workloads.traces", "write_trace": "workloads.traces", "PRESETS": "workloads.presets",
    "HOTNESS_ORDER": "workloads.presets", "locality_stats": "workloads.locality",
    "reuse_distances": "workloads.locality", "source_locality": "workloads.locality",
    # kernels and static characterization
    "VARIANTS": "kernels.registry", "VARIANT_ORDER": "kernels.registry", "run_variant": "kernels.library",
    "bind": "kernels.library", "check_variants": "kernels.check", "static_characterization": "kernels.static",
    "default_register_cap": "kernels.static", "theoretical_occupancy": "kernels.occupancy",
    "ARCHS": "hardware.specs", "GPUS": "hardware.specs", "gpu_spec": "hardware.specs", "devices": "hardware.devices",
    # extraction and analysis
    "read_report": "extract.ncu_rep", "read_csv": "extract.ncu_csv", "read_any": "extract.read", "wide": "extract.read",
    "rule_results": "extract.rules", "speedups": "analysis.compare", "headline": "analysis.compare",
    "stall_breakdown": "analysis.compare", "compare_runs": "analysis.compare", "compare_sources": "analysis.compare",
    "gmae": "analysis.model.scores", "compare_to_measured": "analysis.calibrate", "fit_run": "analysis.calibrate",
    "load_calibration": "analysis.model.constants", "predict_experiment": "pipeline",
    "primary_predictions": "analysis.model.predict", "precision_grid": "analysis.model.predict",
    "paper_claims": "analysis.claims", "PAPER_CLAIMS": "analysis.claims",
    # the answer: what to use per dataset and GPU, by how much, how sure
    "answer": "analysis.answer", "answer_run": "analysis.answer", "ModelValidation": "analysis.answer",
    # one Nsight Compute report's kernels: speed of light, weighted stalls, roofline, matching
    "kernel_summary": "analysis.ncu", "weighted_stalls": "analysis.ncu", "roofline": "analysis.ncu",
    "match_kernels": "analysis.compare", "compare_all": "analysis.compare",
    # the DLRM step
    "e2e": "pipeline",
    # report
    "render_report": "report.render",
    # the run directory's files and columns, declared once
    "columns": "rundir", "ARTIFACTS": "rundir",
}

__all__ = sorted(_API) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'characterize' has no attribute {name!r}")
    return getattr(import_module(f".{module}", __name__), name)


def __dir__() -> list[str]:
    return __all__
