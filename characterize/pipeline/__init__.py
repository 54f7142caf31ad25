"""Pipeline: the one place that strings the stages together.

It checks an experiment against the registries (experiment), compiles what the model
reads of each kernel (facts), predicts (predictions), runs an experiment end to end into
a run directory step by step (steps: static characterization, trace locality,
predictions, the DLRM step, then on a GPU timing and Nsight Compute profiling, and the
report), scores the model against measurements (validation), runs the DLRM step (dlrm)
and the GPU self-test within a budget (selftest). Each step writes its results as it
finishes, so an interrupted run keeps everything already measured and `--resume`
continues it. The names below are the package's public API.
"""

from __future__ import annotations

from characterize.pipeline.dlrm import (  # noqa: F401
    E2ECosts,
    E2EOutcome,
    e2e,
    e2e_estimate,
)
from characterize.pipeline.experiment import (  # noqa: F401
    TraceExperiment,
    check_experiment,
    check_fit,
    check_names,
    load_experiment,
    trace_experiment,
)
from characterize.pipeline.facts import (  # noqa: F401
    CodeFacts,
    code_facts,
    reads,
    sass_frame,
    user_sass,
)
from characterize.pipeline.predictions import (  # noqa: F401
    calibrate,
    model_validation,
    predict,
    predict_experiment,
)
from characterize.pipeline.selftest import (  # noqa: F401
    SELFTEST_BUDGET_S,
    SELFTEST_CHECK_DATASET,
    SELFTEST_E2E_REPS,
    SELFTEST_EXPERIMENT,
    SELFTEST_RECORD,
    PlannedStep,
    SelftestCosts,
    SelftestOutcome,
    SelftestPlan,
    selftest_checks,
    selftest_gpu,
    selftest_plan,
)
from characterize.pipeline.steps import (  # noqa: F401
    STEPS,
    RunOutcome,
    Step,
    StepContext,
    bench_step,
    default_run_dir,
    e2e_step,
    follow_points,
    locality_step,
    measurable,
    open_experiment_run,
    open_step,
    predict_step,
    profile_step,
    raise_unfinished,
    report_step,
    run_experiment,
    run_meta,
    static_step,
    stored_code,
    sweeps_step,
)
from characterize.pipeline.validation import (  # noqa: F401
    measured_points,
    validate,
)

__all__ = [
    "check_experiment",
    "check_names",
    "check_fit",
    "load_experiment",
    "TraceExperiment",
    "trace_experiment",
    "CodeFacts",
    "sass_frame",
    "code_facts",
    "user_sass",
    "reads",
    "predict",
    "predict_experiment",
    "model_validation",
    "calibrate",
    "follow_points",
    "default_run_dir",
    "run_meta",
    "locality_step",
    "static_step",
    "sweeps_step",
    "stored_code",
    "predict_step",
    "e2e_step",
    "open_experiment_run",
    "RunOutcome",
    "StepContext",
    "measurable",
    "open_step",
    "bench_step",
    "profile_step",
    "raise_unfinished",
    "report_step",
    "Step",
    "STEPS",
    "run_experiment",
    "measured_points",
    "validate",
    "E2EOutcome",
    "e2e",
    "E2ECosts",
    "e2e_estimate",
    "SELFTEST_EXPERIMENT",
    "SELFTEST_CHECK_DATASET",
    "SELFTEST_BUDGET_S",
    "SELFTEST_E2E_REPS",
    "SelftestCosts",
    "PlannedStep",
    "SelftestPlan",
    "selftest_checks",
    "selftest_plan",
    "SelftestOutcome",
    "SELFTEST_RECORD",
    "selftest_gpu",
]
