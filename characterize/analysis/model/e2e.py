"""Model, end to end: one DLRM batch (inference, or a training step) around each
embedding variant, stage by stage.

Each operator is one GPU kernel. A GEMM costs the larger of its arithmetic at the
GPU's peak rate and its bytes at the gathering bandwidth, over an efficiency; an
elementwise or copy operator costs its bytes. The embedding stage is the kernel
model's prediction for each of the T tables (its band included). The batch then
walks the step's dependency graph as eager PyTorch executes it: the host issues
operators one after the other (a dispatch cost each), and a kernel starts when it is
issued and the previous kernel has finished. Active time is the sum of kernel times;
idle time is what the walk adds (dispatch gaps, the input copy, launch overheads).

Training adds the backward pass (two GEMMs per forward GEMM, the interaction's
gradient, the embedding bag's gradient: sort-based as PyTorch does it, or an atomic
scatter-add) and the optimizer (SGD, or row-wise Adagrad with one fp32 state per row)
on the rows the batch touched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import pandas as pd

from characterize.analysis.calibrate import gmae
from characterize.analysis.model.constants import ModelConstants
from characterize.config import INDEX_BYTES, DlrmConfig, WorkloadConfig
from characterize.errors import ConfigError
from characterize.hardware import GpuSpec

#: the stages of one batch, in execution order (also the order of the report's stacked bars)
INFERENCE_STAGES = ("input_copy", "bottom_mlp", "embedding", "interaction", "top_mlp")
TRAINING_STAGES = INFERENCE_STAGES + ("top_mlp_backward", "interaction_backward", "bottom_mlp_backward",
                                      "embedding_backward", "optimizer")
BACKWARDS = ("sort", "atomic")
OPTIMIZERS = ("sgd", "rowwise_adagrad")
FP32 = 4


@dataclass(frozen=True)
class Overheads:
    """What the host adds around the kernels. Configured, or measured on a GPU run."""

    dispatch_us: float = 8.0          # eager PyTorch op dispatch on the host, per operator
    gemm_efficiency: float = 0.7      # achieved fraction of peak arithmetic for these small GEMMs
    matmul: str = "fp32"              # fp32 (PyTorch's default) or tf32 (allow_tf32 = True)

    def validate(self) -> "Overheads":
        if self.dispatch_us < 0 or not 0 < self.gemm_efficiency <= 1:
            raise ConfigError("dispatch_us must be >= 0 and gemm_efficiency in (0, 1]")
        if self.matmul not in ("fp32", "tf32"):
            raise ConfigError(f"matmul must be fp32 or tf32, got {self.matmul!r}")
        return self


@dataclass(frozen=True)
class Op:
    """One GPU kernel of the step: its stage and its time (with the band's ends)."""

    stage: str
    name: str
    time_us: float
    low_us: float
    high_us: float


def _roofline_us(flops: float, nbytes: float, gpu: GpuSpec, c: ModelConstants, o: Overheads) -> float:
    peak = (gpu.tf32_TFLOPS if o.matmul == "tf32" else gpu.fp32_TFLOPS) * 1e6 * o.gemm_efficiency  # flop/us
    return max(flops / peak, nbytes / (c.hbm_efficiency * gpu.hbm_GBps * 1e3)) + c.launch_overhead_us


def _op(stage: str, name: str, flops: float, nbytes: float, gpu: GpuSpec, c: ModelConstants, o: Overheads,
        band: tuple[ModelConstants, ModelConstants]) -> Op:
    return Op(stage, name, _roofline_us(flops, nbytes, gpu, c, o), _roofline_us(flops, nbytes, gpu, band[0], o),
              _roofline_us(flops, nbytes, gpu, band[1], o))


def _mlp(stage: str, dims: Sequence[int], B: int, last_sigmoid: bool, backward: bool,
         gpu: GpuSpec, c: ModelConstants, o: Overheads, band: tuple[ModelConstants, ModelConstants]) -> list[Op]:
    ops = []
    layers = list(zip(dims[:-1], dims[1:]))
    order = reversed(layers) if backward else layers
    for i, (n_in, n_out) in enumerate(order):
        gemm_bytes = FP32 * (B * n_in + n_in * n_out + B * n_out)
        act = "sigmoid" if (last_sigmoid and (i == 0 if backward else i == len(layers) - 1)) else "relu"
        if backward:   # activation gradient, then dX = dY W and dW = dY^T X
            ops.append(_op(stage, f"{act}_grad {n_out}", 0, 3 * FP32 * B * n_out, gpu, c, o, band))
            ops.append(_op(stage, f"dX {n_out}->{n_in}", 2.0 * B * n_in * n_out, gemm_bytes, gpu, c, o, band))
            ops.append(_op(stage, f"dW {n_in}x{n_out}", 2.0 * B * n_in * n_out, gemm_bytes, gpu, c, o, band))
        else:
            ops.append(_op(stage, f"linear {n_in}->{n_out}", 2.0 * B * n_in * n_out, gemm_bytes, gpu, c, o, band))
            ops.append(_op(stage, act, 0, 2 * FP32 * B * n_out, gpu, c, o, band))
    return ops


def _interaction(T: int, D: int, B: int, backward: bool, gpu: GpuSpec, c: ModelConstants, o: Overheads,
                 band: tuple[ModelConstants, ModelConstants]) -> list[Op]:
    F = T + 1
    stage = "interaction_backward" if backward else "interaction"
    pairs = F * T // 2
    cat_bytes = 2 * FP32 * B * F * D
    bmm = (2.0 * B * F * F * D, FP32 * (2 * B * F * D + B * F * F))
    tri_bytes = FP32 * (B * F * F + B * pairs)
    out_bytes = 2 * FP32 * B * (D + pairs)
    if backward:   # the gradient flows back through the concat, the triangle gather and Z Z^T
        return [_op(stage, "split grad", 0, out_bytes, gpu, c, o, band),
                _op(stage, "triangle scatter", 0, tri_bytes, gpu, c, o, band),
                _op(stage, "bmm grad", 2 * bmm[0], 2 * bmm[1], gpu, c, o, band),
                _op(stage, "split features", 0, cat_bytes, gpu, c, o, band)]
    return [_op(stage, "stack features", 0, cat_bytes, gpu, c, o, band),
            _op(stage, "bmm Z Z^T", *bmm, gpu, c, o, band),
            _op(stage, "triangle gather", 0, tri_bytes, gpu, c, o, band),
            _op(stage, "concat dense", 0, out_bytes, gpu, c, o, band)]


def _embedding_backward(wl: WorkloadConfig, unique_rows: float, how: str, gpu: GpuSpec, c: ModelConstants,
                        o: Overheads, band: tuple[ModelConstants, ModelConstants]) -> list[Op]:
    """Per table, into a dense gradient (zeroed first). Sort: radix-sort (index, position) pairs (3 passes of 8-byte keys and
    values for up to 2^24 rows), then reduce each run of equal rows (reads each
    lookup's bag gradient, writes one gradient row per unique row). Atomic: one fp32
    atomic add per lookup element into a dense gradient, served by L2 (the gradient of
    a batch's rows fits it), at half the L2 bandwidth (read-modify-write)."""
    N = wl.B * wl.L.mean
    row = wl.row_bytes
    ops: list[Op] = []
    for t in range(wl.T):
        # both produce a dense gradient (as PyTorch's dense backward does): zero it first
        ops.append(_op("embedding_backward", f"zero gradient table {t}", 0, wl.E * row, gpu, c, o, band))
        if how == "sort":
            passes = max(1, math.ceil(math.log2(max(wl.E, 2)) / 8))
            ops.append(_op("embedding_backward", f"sort ids table {t}", 0, passes * 2 * 16 * N, gpu, c, o, band))
            ops.append(_op("embedding_backward", f"segment reduce table {t}", 0, N * row + unique_rows * row
                           + N * INDEX_BYTES, gpu, c, o, band))
        else:
            def atomic(cc: ModelConstants) -> float:
                return 2 * N * row / (0.5 * gpu.l2_GBps * 1e3) + cc.launch_overhead_us
            ops.append(Op("embedding_backward", f"atomic scatter-add table {t}", atomic(c), atomic(band[0]),
                          atomic(band[1])))
    return ops


def _optimizer(wl: WorkloadConfig, unique_rows: float, optimizer: str, dlrm: DlrmConfig, gpu: GpuSpec,
               c: ModelConstants, o: Overheads, band: tuple[ModelConstants, ModelConstants]) -> list[Op]:
    """Sparse update of the rows the batch touched (read gradient, read and write the
    row; Adagrad also reads and writes one fp32 state per row), then the dense MLP
    parameters in one fused update."""
    state = 2 * FP32 if optimizer == "rowwise_adagrad" else 0
    per_row = 3 * wl.row_bytes + state
    ops = [_op("optimizer", f"{optimizer} table {t}", 0, unique_rows * per_row, gpu, c, o, band)
           for t in range(wl.T)]
    params = sum(a * b + b for dims in (dlrm.bottom, (dlrm.interaction_width(wl.T, wl.D), *dlrm.top))
                 for a, b in zip(dims[:-1], dims[1:]))
    ops.append(_op("optimizer", f"{optimizer} MLPs", 0, params * (3 * FP32 + state), gpu, c, o, band))
    return ops


def step_ops(wl: WorkloadConfig, dlrm: DlrmConfig, embedding: pd.Series, gpu: GpuSpec, c: ModelConstants,
             phase: str = "inference", *, unique_rows: float = 0.0, backward: str = "sort",
             optimizer: str = "sgd", overheads: Overheads = Overheads()) -> list[Op]:
    """The kernels of one batch in issue order. `embedding` is one prediction row of
    the kernel model (time_us, time_us_low, time_us_high, prepass_us) for this
    variant, dataset and GPU; `unique_rows` the distinct rows a table's batch touches."""
    if phase not in ("inference", "training"):
        raise ConfigError(f"phase must be inference or training, got {phase!r}")
    if backward not in BACKWARDS or optimizer not in OPTIMIZERS:
        raise ConfigError(f"backward must be one of {', '.join(BACKWARDS)} and optimizer one of {', '.join(OPTIMIZERS)}")
    dlrm.validate(wl.D)
    o = overheads.validate()
    band = c.band()
    B, T, D = wl.B, wl.T, wl.D
    top = (dlrm.interaction_width(T, D), *dlrm.top)
    inputs = FP32 * B * dlrm.bottom[0] + T * (B * wl.L.mean + B) * INDEX_BYTES

    def h2d(cc: ModelConstants) -> float:
        return inputs / (gpu.pcie_GBps * 1e3) + cc.launch_overhead_us

    ops = [Op("input_copy", "host-to-device inputs", h2d(c), h2d(band[0]), h2d(band[1]))]
    ops += _mlp("bottom_mlp", dlrm.bottom, B, False, False, gpu, c, o, band)
    pre = embedding.get("prepass_us", math.nan)
    for t in range(T):
        if isinstance(pre, float) and math.isfinite(pre):
            ops.append(Op("embedding", f"L2 pin pre-pass table {t}", pre, pre, pre))
        ops.append(Op("embedding", f"embedding bag table {t}", float(embedding["time_us"]),
                      float(embedding["time_us_low"]), float(embedding["time_us_high"])))
    ops += _interaction(T, D, B, False, gpu, c, o, band)
    ops += _mlp("top_mlp", top, B, True, False, gpu, c, o, band)
    if phase == "training":
        ops += _mlp("top_mlp_backward", top, B, True, True, gpu, c, o, band)
        ops += _interaction(T, D, B, True, gpu, c, o, band)
        ops += _mlp("bottom_mlp_backward", dlrm.bottom, B, False, True, gpu, c, o, band)
        ops += _embedding_backward(wl, unique_rows, backward, gpu, c, o, band)
        ops += _optimizer(wl, unique_rows, optimizer, dlrm, gpu, c, o, band)
    return ops


def walk(ops: Sequence[Op], dispatch_us: float, which: str = "time_us") -> tuple[float, dict[str, float]]:
    """Critical path of one stream fed by one host thread: each kernel starts when the
    host has issued it and the previous kernel is done. Returns the batch time and
    each stage's share of it (its kernels plus the idle time before each of them)."""
    attr = {"time_us": "time_us", "time_us_low": "low_us", "time_us_high": "high_us"}[which]
    host = gpu_end = 0.0
    stages: dict[str, float] = {}
    for op in ops:
        host += dispatch_us
        start = max(host, gpu_end)
        end = start + getattr(op, attr)
        stages[op.stage] = stages.get(op.stage, 0.0) + (end - gpu_end)
        gpu_end = end
    return gpu_end, stages


def predict_step(wl: WorkloadConfig, dlrm: DlrmConfig, embedding: pd.DataFrame, gpus: Iterable[GpuSpec],
                 constants: dict[str, ModelConstants], unique_rows: dict[str, float], *,
                 phases: Sequence[str] = ("inference", "training"), backward: str = "sort",
                 optimizer: str = "sgd", overheads: Overheads = Overheads()) -> pd.DataFrame:
    """Per (variant, dataset, GPU, phase): one row per stage plus 'total' (batch time,
    band) and 'active' (sum of kernel times), with the embedding share and speedups
    over base end to end and embedding only. `embedding` is the kernel model's
    prediction frame (steady mode); `unique_rows` maps a dataset to its distinct rows
    per table per batch. Columns: variant, dataset, gpu, arch, phase, stage, time_us,
    time_us_low, time_us_high, source ('predicted'), embedding_share, speedup_e2e,
    speedup_embedding."""
    rows = []
    gpus = {g.key: g for g in gpus}
    for (variant, dataset, gkey), e in embedding.groupby(["variant", "dataset", "gpu"], sort=False):
        if gkey not in gpus:
            continue
        gpu, c = gpus[gkey], constants[gkey]
        for phase in phases:
            ops = step_ops(wl, dlrm, e.iloc[0], gpu, c, phase, unique_rows=unique_rows.get(dataset, 0.0),
                           backward=backward, optimizer=optimizer, overheads=overheads)
            ends = {w: walk(ops, overheads.dispatch_us, w) for w in ("time_us", "time_us_low", "time_us_high")}
            common = {"variant": variant, "dataset": dataset, "gpu": gkey, "arch": gpu.arch, "phase": phase,
                      "source": "predicted"}
            for stage in dict.fromkeys(op.stage for op in ops):
                rows.append(common | {"stage": stage, **{w: ends[w][1][stage] for w in ends}})
            rows.append(common | {"stage": "total", **{w: ends[w][0] for w in ends}})
            active = {w: sum(getattr(op, a) for op in ops)
                      for w, a in (("time_us", "time_us"), ("time_us_low", "low_us"), ("time_us_high", "high_us"))}
            rows.append(common | {"stage": "active", **active})
            emb = sum(op.time_us for op in ops if op.stage == "embedding")
            rows[-2]["embedding_kernels_us"] = emb
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    tot = df[df["stage"] == "total"].set_index(["variant", "dataset", "gpu", "phase"])
    df["embedding_share"] = math.nan
    df["speedup_e2e"] = math.nan
    df["speedup_embedding"] = math.nan
    for i, r in df[df["stage"] == "total"].iterrows():
        key = (r["dataset"], r["gpu"], r["phase"])
        base = tot.loc[("base", *key)] if ("base", *key) in tot.index else None
        df.at[i, "embedding_share"] = r["embedding_kernels_us"] / r["time_us"]
        if base is not None:
            df.at[i, "speedup_e2e"] = base["time_us"] / r["time_us"]
            df.at[i, "speedup_embedding"] = base["embedding_kernels_us"] / r["embedding_kernels_us"]
    return df.drop(columns="embedding_kernels_us")


def stage_gmae(rows: pd.DataFrame) -> pd.DataFrame:
    """Predicted against measured, per phase and stage, where a GPU run measured the
    step: one row per (phase, stage) with points and gmae (geometric-mean absolute
    error over variants and datasets). The measured batch starts with its inputs on
    the GPU, so 'step' compares it with the predicted batch less the input copy."""
    if rows.empty or not {"predicted", "measured"} <= set(rows.get("source", pd.Series(dtype=str))):
        return pd.DataFrame(columns=["phase", "stage", "points", "gmae"])
    key = ["variant", "dataset", "gpu", "phase", "stage"]
    pred = rows[rows["source"] == "predicted"].copy()
    copy = pred[pred["stage"] == "input_copy"].set_index(key[:-1])["time_us"]
    step = pred[pred["stage"] == "total"].set_index(key[:-1])["time_us"].sub(copy, fill_value=0.0)
    pred = pd.concat([pred.set_index(key)["time_us"],
                      step.rename("time_us").to_frame().assign(stage="step").set_index("stage", append=True)["time_us"]])
    meas = rows[rows["source"] == "measured"].replace({"stage": {"total": "step"}}).set_index(key)["time_us"]
    both = pd.concat([pred.rename("predicted_us"), meas.rename("measured_us")], axis=1, join="inner").reset_index()
    out = [{"phase": ph, "stage": st, "points": len(g), "gmae": gmae(g["predicted_us"], g["measured_us"])}
           for (ph, st), g in both.groupby(["phase", "stage"], sort=False)]
    return pd.DataFrame(out, columns=["phase", "stage", "points", "gmae"])
