"""characterize: GPU microarchitecture characterization of DLRM embedding-bag kernels.

The public API for notebooks and scripts; every query returns a tidy DataFrame or a
small dataclass. Names resolve lazily so `import characterize` stays cheap.

    import characterize as chz
    run = chz.load_run("profiles/static-paper")
    run.static, run.locality, run.bench, run.kernels, run.predictions
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_API = {
    # runs and experiments
    "load_run": "store", "list_runs": "store", "Run": "store",
    "load_experiment": "pipeline", "run_experiment": "pipeline", "predict": "pipeline", "calibrate": "pipeline",
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
    "ARCHS": "hardware", "GPUS": "hardware", "gpu_spec": "hardware", "devices": "hardware",
    # extraction and analysis
    "read_report": "extract.ncu_rep", "read_csv": "extract.ncu_csv", "read_any": "extract.read", "wide": "extract.read",
    "rule_results": "extract.rules", "speedups": "analysis.compare", "headline": "analysis.compare",
    "stall_breakdown": "analysis.compare", "compare_runs": "analysis.compare", "compare_sources": "analysis.compare",
    "gmae": "analysis.model.scores", "compare_to_measured": "analysis.calibrate", "fit_run": "analysis.calibrate",
    "load_calibration": "analysis.model.constants", "predict_experiment": "analysis.model.predict",
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
