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
    "load_experiment": "config", "ExperimentConfig": "config", "WorkloadConfig": "config", "Pooling": "config",
    "run_experiment": "experiment",
    # workloads
    "generate": "workloads", "generate_stream": "workloads", "load_trace": "workloads", "load_dataset": "workloads",
    "locality_stats": "workloads", "reuse_distances": "workloads", "PRESETS": "workloads",
    # kernels and static characterization
    "VARIANTS": "kernels", "run_variant": "kernels", "bind": "kernels", "check_variants": "check",
    "static_characterization": "static", "default_register_cap": "static", "theoretical_occupancy": "occupancy",
    "ARCHS": "hardware", "GPUS": "hardware", "gpu_spec": "hardware", "devices": "hardware",
    # extraction and analysis
    "read_report": "extract", "read_csv": "extract", "read_any": "extract", "wide": "extract",
    "rule_results": "extract", "speedups": "analyze", "headline": "analyze", "stall_breakdown": "analyze",
    "compare_runs": "analyze",
    # model and report
    "predict": "model", "predict_experiment": "model", "calibrate": "model", "load_calibration": "model",
    "compare_to_measured": "model", "gmae": "model", "paper_claims": "model", "render_report": "report",
}

__all__ = sorted(_API) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'characterize' has no attribute {name!r}")
    return getattr(import_module(f".{module}", __name__), name)


def __dir__() -> list[str]:
    return __all__
