"""Pipeline, the DLRM step: the whole inference and training step around each embedding
variant, checked against autograd, predicted stage by stage and timed on a GPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Sequence

import pandas as pd

from characterize.analysis.model.constants import ModelConstants, load_calibration
from characterize.analysis.model.e2e import Overheads
from characterize.analysis.model.e2e import predict_step as predict_e2e
from characterize.config import DlrmConfig, ExperimentConfig, WorkloadConfig
from characterize.hardware.devices import devices
from characterize.hardware.specs import gpu_spec
from characterize.kernels.library import unavailable
from characterize.kernels.training import CUDA_BACKWARDS, kernel_for, training_facts
from characterize.measure.e2e import check_pipeline, measure_step
from characterize.pipeline.experiment import check_experiment
from characterize.pipeline.facts import CodeFacts
from characterize.pipeline.predictions import predict
from characterize.progress import Progress, Reporter, as_reporter
from characterize.workloads.traces import load_dataset


def _e2e_embedding(predictions: pd.DataFrame | None, variants: Sequence[str], targets: Sequence[str],
                   dtype: str) -> pd.DataFrame | None:
    """The embedding stage's rows from earlier predictions, or None unless they cover
    every variant on every target at the workload's precision."""
    if predictions is None or predictions.empty or not {"variant", "gpu", "arch"} <= set(predictions.columns):
        return None
    if "cache_ratio" in predictions.columns and predictions["cache_ratio"].notna().any():
        return None   # a cache-size sweep: the step takes the configured cache, predicted afresh
    df = predictions
    if "dtype" in df.columns:
        df = df[df["dtype"] == dtype]
    for t in targets:
        spec = gpu_spec(t)
        have = set(df.loc[df["gpu"] == spec.key, "variant"])
        if not set(variants) <= have:
            return None
    return df[df["gpu"].isin([gpu_spec(t).key for t in targets])]


@dataclass
class E2EOutcome:
    """`characterize e2e`: the stage table and the CPU correctness checks."""

    rows: pd.DataFrame    # variant, dataset, gpu, arch, phase, stage, time_us(_low/_high), source, speedups
    checks: pd.DataFrame  # variant, phase, backward, optimizer, max_abs_error, ok
    training: pd.DataFrame = field(default_factory=pd.DataFrame)  # our backward's facts (kernels.training)


def e2e(exp: ExperimentConfig, variants: Sequence[str] | None = None, archs: Sequence[str] | None = None, *,
        dlrm: DlrmConfig | None = None, backward: str = "sort", optimizer: str = "sgd",
        overheads: Overheads | None = None, check: bool = True, code: CodeFacts | None = None,
        predictions: pd.DataFrame | None = None, progress: Reporter | Progress | None = None,
        datasets: Sequence[str] | None = None, reps: int = 20, measure: bool = True) -> E2EOutcome:
    """The DLRM step around each variant: checked on the CPU (or the GPU) at a small
    size, predicted stage by stage for every target GPU, and measured when a GPU is here
    (and `measure`; `datasets` of the experiment's, `reps` timed steps each). `predictions`
    (a run's, covering the variants and targets) spare predicting the embedding stage
    again; the step runs at the workload's own precision. A variant that cannot run here
    (FBGEMM not installed) is predicted but neither checked nor measured, said in one line."""
    reporter = as_reporter(progress)
    say = reporter.message
    dlrm = (dlrm or DlrmConfig.for_dim(exp.workload.D)).validate(exp.workload.D)
    overheads = (overheads or Overheads()).validate()
    exp = check_experiment(exp)
    names = list(dict.fromkeys(["base", *(variants or exp.variants)]))   # base: the speedups' reference
    exp = dataclasses.replace(exp, variants=tuple(names))
    found = devices()
    backend = "cuda" if found else "emulate"
    skipped = {v: why for v in names if (why := unavailable(v, backend))}
    for v, why in skipped.items():
        say(f"e2e: {v} predicted only, not checked or measured: {why}")
    runnable = [v for v in names if v not in skipped]
    checks = pd.DataFrame()
    if check:
        say(f"checking the DLRM step of {len(runnable)} variant(s) against torch autograd "
            f"({'GPU' if found else 'CPU emulation'})")
        checks = pd.DataFrame(check_pipeline(runnable, backend=backend))
    targets = list(archs or exp.archs)
    emb = _e2e_embedding(predictions, names, targets, exp.workload.dtype)
    if emb is None:
        emb = predict(dataclasses.replace(exp, dtypes=()), targets, code=code, progress=reporter)
    emb = emb[emb["mode"] == "steady"]
    gpus = [gpu_spec(t) for t in targets]
    constants = {g.key: load_calibration(g) or ModelConstants.defaults(g) for g in gpus}
    unique, hottest = {}, {}
    for ds in exp.datasets:
        first, _ = load_dataset(ds, exp.workload, tables=[0]).tables[0].batch(0)
        counts = pd.Series(first).value_counts()
        unique[ds], hottest[ds] = float(len(counts)), float(counts.max()) if len(counts) else 0.0
    training = pd.DataFrame()
    if backward in CUDA_BACKWARDS:   # our backward: modelled from its static and SASS facts
        kernel = kernel_for(backward, optimizer).name
        say(f"reading {kernel}'s registers, occupancy and hot loop for {', '.join(targets)}")
        training = training_facts([kernel], list(dict.fromkeys(g.arch for g in gpus)), D=exp.workload.D,
                                  dtype=exp.workload.dtype)
    rows = predict_e2e(exp.workload, dlrm, emb, gpus, constants, unique, backward=backward, optimizer=optimizer,
                       overheads=overheads, training=training, hottest=hottest)
    if found and measure:
        timed = list(datasets or exp.datasets)
        estimate = e2e_estimate(exp.workload, len(runnable), len(timed), reps)
        say(f"timing the DLRM step on the GPU: {len(runnable)} variant(s) x {len(timed)} dataset(s), inference and "
            f"training, {reps} steps each; about {estimate:.0f} s")
        measured = pd.DataFrame(measure_step(exp.workload, dlrm, runnable, timed, backward=backward,
                                             optimizer=optimizer, params=exp.params, reps=reps, progress=say))
        info = found[0].spec()
        rows = pd.concat([rows, measured.assign(gpu=info.key, arch=info.arch)], ignore_index=True)
    return E2EOutcome(rows, checks, training)


@dataclass(frozen=True)
class E2ECosts:
    """What timing the DLRM step costs, as planned before it starts (upper bounds until a
    GPU run's log replaces them): building the model, loading a dataset, binding a variant,
    and one step at the paper's shape."""

    model_s: float = 5.0             # the model's tables and MLPs on the device
    lookups_per_s: float = 7e6       # a dataset's trace generated and copied (as profile's)
    bind_s: float = 1.0              # a variant bound to every table (hot rows, reordering)
    step_s_per_Mlookup: float = 0.01  # one inference + one training step per million lookups of a batch


def e2e_estimate(wl: WorkloadConfig, variants: int, datasets: int, reps: int, costs: E2ECosts = E2ECosts()) -> float:
    """Seconds timing the DLRM step of `variants` x `datasets` should take (warm-up included)."""
    lookups = wl.T * wl.lookups_per_batch
    steps = (reps + 3) * 2   # warm-up and timed, inference and training
    return (costs.model_s + datasets * wl.T * wl.batches * wl.lookups_per_batch / costs.lookups_per_s
            + variants * datasets * (costs.bind_s + steps * costs.step_s_per_Mlookup * lookups / 1e6))

