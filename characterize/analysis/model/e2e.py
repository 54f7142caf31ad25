"""Analysis stage, model of the whole step: one DLRM batch (inference, or a training step) around each
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
gradient, the embedding bag's gradient: sort-based as PyTorch does it, an atomic
scatter-add, or our kernels of kernels.training) and the optimizer (SGD, or row-wise
Adagrad with one fp32 state per row) on the rows the batch touched. Our kernels are
modelled from their compiled code (training_kernel_us): resident warps from the static
occupancy, and from the SASS the hot loop's lookups, instructions, serialized memory
latencies and atomics per iteration; the atomics' L2 throughput is an assumption.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import pandas as pd

from characterize.analysis.model.constants import ModelConstants
from characterize.analysis.model.scores import gmae
from characterize.config import INDEX_BYTES, DlrmConfig, WorkloadConfig
from characterize.errors import ConfigError
from characterize.hardware.specs import GpuSpec
from characterize.kernels.training_registry import CUDA_BACKWARDS, OPTIMIZERS, kernel_for, segment_chunk

#: the stages of one batch, in execution order (also the order of the report's stacked bars)
INFERENCE_STAGES = ("input_copy", "bottom_mlp", "embedding", "interaction", "top_mlp")
TRAINING_STAGES = INFERENCE_STAGES + ("top_mlp_backward", "interaction_backward", "bottom_mlp_backward",
                                      "embedding_backward", "optimizer")
#: PyTorch's sort-based backward, its index_add_ scatter, and our kernels (kernels.training)
BACKWARDS = ("sort", "atomic", *CUDA_BACKWARDS)
FP32 = 4


@dataclass(frozen=True)
class Overheads:
    """What the host adds around the kernels. Configured, or measured on a GPU run."""

    dispatch_us: float = 8.0          # eager PyTorch op dispatch on the host, per operator
    gemm_efficiency: float = 0.7      # achieved fraction of peak arithmetic for these small GEMMs
    matmul: str = "fp32"              # fp32 (PyTorch's default) or tf32 (allow_tf32 = True)

    def validate(self) -> "Overheads":
        if not (math.isfinite(self.dispatch_us) and 0 <= self.dispatch_us <= 1e6):
            raise ConfigError(f"dispatch_us must be a finite number of microseconds in 0..1e6, got {self.dispatch_us!r}")
        if not (math.isfinite(self.gemm_efficiency) and 0 < self.gemm_efficiency <= 1):
            raise ConfigError(f"gemm_efficiency must be in (0, 1], got {self.gemm_efficiency!r}")
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


@dataclass(frozen=True)
class KernelFacts:
    """What one training kernel's compiled code says, for one architecture: resident
    blocks per SM (static), and per iteration of its hot loop (SASS) the lookups it
    handles, its instructions, the memory latencies it serializes and its atomics."""

    kernel: str
    blocks_per_sm: int
    warps_per_block: int
    instructions: int
    lookups_per_iteration: int
    latencies_per_iteration: float
    atomics: int
    atomic_bits: int           # bits one lane's atomics of one iteration update

    @classmethod
    def from_row(cls, r: Mapping) -> "KernelFacts":
        return cls(str(r["kernel"]), int(r["blocks_per_sm"]), int(r["warps_per_block"]), int(r["instructions"]),
                   max(1, int(r["lookups_per_iteration"])), float(r["latencies_per_iteration"]), int(r["atomics"]),
                   int(r["atomic_bits"]))


def facts_for(training: pd.DataFrame | None, kernel: str, arch: str) -> KernelFacts:
    """The facts of `kernel` on `arch` from a training_facts frame, or ConfigError naming
    what to compute (`characterize sass --training`)."""
    if training is not None and not training.empty:
        hit = training[(training["kernel"] == kernel) & (training["arch"] == arch)]
        if not hit.empty:
            return KernelFacts.from_row(hit.iloc[0])
    raise ConfigError(f"no static/SASS facts for the training kernel {kernel} on {arch}: the model of our "
                      "backward reads them from the compiled code (kernels.training.training_facts)")


def training_kernel_us(f: KernelFacts, wl: WorkloadConfig, unique_rows: float, hottest_lookups: float,
                       gpu: GpuSpec, c: ModelConstants) -> dict[str, float]:
    """One table's launch of one of our training kernels: the max of its terms, plus the
    launch overhead. Terms (us), each named after what bounds it:

    - latency: the SASS's memory latencies per hot-loop iteration x the iterations a warp
      runs, over the warps resident at once (static blocks/SM x warps/block x SMs, at most
      one per bag or unique row); a sorted kernel's warp runs a whole segment, or a chunk
      of one split at segment_chunk(hottest) lookups, so the hottest row bounds it from
      below, plus, when split, the pass adding that row's partial rows (4 per wait, as
      the hot loop: its SASS waits 0.9 latencies per 4 partial rows too). A wait lasts an
      L2 hit while the batch's bag gradients fit the effective L2 (B x D x 4 bytes), else
      a DRAM access.
    - issue: hot-loop instructions per lookup (SASS) x lookups, at one warp instruction
      per cycle per SM sub-partition.
    - atomics: the bytes the SASS's atomics update per lookup (lanes x bits), each read
      and written at L2 at half the L2 bandwidth, as for index_add_ (an assumption, not
      read from the SASS).
    - l2: the gathered bag-gradient rows (sorted, fused) at the L2 bandwidth.
    - dram: ids, bag gradients, and what the kernel writes (dense-gradient rows, or the
      table rows read and written and the Adagrad momentum), at the achievable HBM rate.
    """
    N = wl.B * wl.L.mean
    grad_row = FP32 * wl.D
    chunk = segment_chunk(hottest_lookups)
    # a warp's unit of work: a bag (atomic), or a unique row's segment or one chunk of a split one
    items = wl.B if f.kernel == "cuda-atomic" else max(unique_rows, N / chunk, 1.0)
    lookups_per_item = N / items
    resident = f.blocks_per_sm * f.warps_per_block * gpu.sm_count
    wait_ns = c.l2_latency_ns if wl.B * grad_row <= c.l2_capacity_factor * gpu.l2_bytes else c.dram_latency_ns
    per_iteration_ns = f.latencies_per_iteration * wait_ns
    waves = math.ceil(items / resident)
    latency = waves * (lookups_per_item / f.lookups_per_iteration) * per_iteration_ns
    split = 0.0
    if f.kernel != "cuda-atomic":   # one warp walks the hottest row's segment, or a chunk of it
        latency = max(latency, min(hottest_lookups, chunk) / f.lookups_per_iteration * per_iteration_ns)
        if hottest_lookups > chunk:   # then its warp adds the chunks' partial rows, 4 per wait
            latency += math.ceil(math.ceil(hottest_lookups / chunk) / 4) * per_iteration_ns
            split = N / chunk          # at most this many partial rows written and read back
    clock_per_us = gpu.boost_clock_MHz   # cycles per us
    issue = N * f.instructions / f.lookups_per_iteration / (gpu.archspec.sub_partitions * gpu.sm_count * clock_per_us)
    atomic_bytes = N * f.atomic_bits * gpu.archspec.warp_size / 8 / f.lookups_per_iteration
    atomics = 2 * atomic_bytes / (0.5 * gpu.l2_GBps * 1e3)
    gathered = 0.0 if f.kernel == "cuda-atomic" else N * grad_row + 2 * split * grad_row
    l2 = gathered / (gpu.l2_GBps * 1e3)
    dram_bytes = N * INDEX_BYTES + wl.B * grad_row
    if f.kernel in ("cuda-atomic", "cuda-sorted"):
        dram_bytes += unique_rows * grad_row                       # the gradient rows written back
    else:
        dram_bytes += unique_rows * (2 * wl.row_bytes + 2 * INDEX_BYTES)   # rows read + written, segment arrays
        if f.kernel.endswith("rowwise_adagrad"):
            dram_bytes += unique_rows * 2 * FP32                   # the momentum read + written
    dram = dram_bytes / (c.hbm_efficiency * gpu.hbm_GBps * 1e3)
    terms = {"latency": latency / 1000, "issue": issue, "atomics": atomics, "l2": l2, "dram": dram}
    launches = 2 if split else 1      # the chunk pass, then the segment pass
    return terms | {"time": max(terms.values()) + launches * c.launch_overhead_us}


def _embedding_backward(wl: WorkloadConfig, unique_rows: float, how: str, gpu: GpuSpec, c: ModelConstants,
                        o: Overheads, band: tuple[ModelConstants, ModelConstants], *, optimizer: str = "sgd",
                        facts: KernelFacts | None = None, hottest_lookups: float = 0.0) -> list[Op]:
    """Per table. PyTorch's ways produce a dense gradient (zeroed first). Sort:
    radix-sort (index, position) pairs (3 passes of 8-byte keys and values for up to
    2^24 rows), then reduce each run of equal rows (reads each lookup's bag gradient,
    writes one gradient row per unique row). Atomic (index_add_): one fp32 atomic add
    per lookup element into the dense gradient, served by L2 (the gradient of a batch's
    rows fits it), at half the L2 bandwidth (read-modify-write). Ours (cuda-*): the bag
    layout in torch, the sort by row (cuda-sorted, cuda-fused), the zeroed gradient
    (not for cuda-fused, which writes no gradient) and the kernel, modelled from its
    static and SASS facts (training_kernel_us)."""
    N = wl.B * wl.L.mean
    row = wl.row_bytes
    passes = max(1, math.ceil(math.log2(max(wl.E, 2)) / 8))
    ops: list[Op] = []
    for t in range(wl.T):
        if how != "cuda-fused":   # a dense gradient, as PyTorch's dense backward gives: zero it first
            ops.append(_op("embedding_backward", f"zero gradient table {t}", 0, wl.E * FP32 * wl.D, gpu, c, o,
                           band))
        if how in ("sort", "cuda-sorted", "cuda-fused"):
            ops.append(_op("embedding_backward", f"sort ids table {t}", 0, passes * 2 * 16 * N, gpu, c, o, band))
        if how == "sort":
            ops.append(_op("embedding_backward", f"segment reduce table {t}", 0, N * row + unique_rows * row
                           + N * INDEX_BYTES, gpu, c, o, band))
        elif how == "atomic":
            def atomic(cc: ModelConstants) -> float:
                return 2 * N * row / (0.5 * gpu.l2_GBps * 1e3) + cc.launch_overhead_us
            ops.append(Op("embedding_backward", f"atomic scatter-add table {t}", atomic(c), atomic(band[0]),
                          atomic(band[1])))
        else:
            if facts is None:
                raise ConfigError(f"backward {how} needs the kernel's static/SASS facts")
            ops.append(_op("embedding_backward", f"bag layout table {t}", 0, 2 * N * INDEX_BYTES, gpu, c, o, band))
            times = [training_kernel_us(facts, wl, unique_rows, hottest_lookups, gpu, cc)["time"]
                     for cc in (c, *band)]
            ops.append(Op("embedding_backward", f"{facts.kernel} table {t}", *times))
    return ops


def _optimizer(wl: WorkloadConfig, unique_rows: float, optimizer: str, dlrm: DlrmConfig, gpu: GpuSpec,
               c: ModelConstants, o: Overheads, band: tuple[ModelConstants, ModelConstants],
               fused: bool = False) -> list[Op]:
    """Sparse update of the rows the batch touched (read gradient, read and write the
    row; Adagrad also reads and writes one fp32 state per row), then the dense MLP
    parameters in one fused update. `fused`: the tables were updated by the backward."""
    state = 2 * FP32 if optimizer == "rowwise_adagrad" else 0
    per_row = 3 * wl.row_bytes + state
    ops = [] if fused else [_op("optimizer", f"{optimizer} table {t}", 0, unique_rows * per_row, gpu, c, o, band)
                            for t in range(wl.T)]
    params = sum(a * b + b for dims in (dlrm.bottom, (dlrm.interaction_width(wl.T, wl.D), *dlrm.top))
                 for a, b in zip(dims[:-1], dims[1:]))
    ops.append(_op("optimizer", f"{optimizer} MLPs", 0, params * (3 * FP32 + state), gpu, c, o, band))
    return ops


def step_ops(wl: WorkloadConfig, dlrm: DlrmConfig, embedding: pd.Series, gpu: GpuSpec, c: ModelConstants,
             phase: str = "inference", *, unique_rows: float = 0.0, backward: str = "sort",
             optimizer: str = "sgd", overheads: Overheads = Overheads(), training: pd.DataFrame | None = None,
             hottest_lookups: float = 0.0) -> list[Op]:
    """The kernels of one batch in issue order. `embedding` is one prediction row of
    the kernel model (time_us, time_us_low, time_us_high, prepass_us) for this
    variant, dataset and GPU; `unique_rows` the distinct rows a table's batch touches
    and `hottest_lookups` the lookups of its most looked-up row; `training` the facts
    of our training kernels (kernels.training.training_facts) for backward cuda-*."""
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
    # numpy's integers are not Python ints: read the count as a number whatever its type
    per_launch = pd.to_numeric(pd.Series([embedding.get("tables_per_launch", 1)]), errors="coerce").iloc[0]
    per_launch = int(per_launch) if per_launch == per_launch and per_launch >= 1 else 1
    for t in range(0, T, max(1, per_launch)):   # a kernel covering every table (tbe, fbgemm): one launch
        if isinstance(pre, float) and math.isfinite(pre):
            ops.append(Op("embedding", f"L2 pin pre-pass table {t}", pre, pre, pre))
        what = f"embedding bag table {t}" if per_launch <= 1 else f"embedding bag, tables {t}-{min(T, t + per_launch) - 1}"
        ops.append(Op("embedding", what, float(embedding["time_us"]),
                      float(embedding["time_us_low"]), float(embedding["time_us_high"])))
    ops += _interaction(T, D, B, False, gpu, c, o, band)
    ops += _mlp("top_mlp", top, B, True, False, gpu, c, o, band)
    if phase == "training":
        ops += _mlp("top_mlp_backward", top, B, True, True, gpu, c, o, band)
        ops += _interaction(T, D, B, True, gpu, c, o, band)
        ops += _mlp("bottom_mlp_backward", dlrm.bottom, B, False, True, gpu, c, o, band)
        facts = None
        if backward in CUDA_BACKWARDS:
            facts = facts_for(training, kernel_for(backward, optimizer).name, gpu.arch)
        ops += _embedding_backward(wl, unique_rows, backward, gpu, c, o, band, optimizer=optimizer, facts=facts,
                                   hottest_lookups=hottest_lookups)
        ops += _optimizer(wl, unique_rows, optimizer, dlrm, gpu, c, o, band, fused=backward == "cuda-fused")
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
                 optimizer: str = "sgd", overheads: Overheads = Overheads(), training: pd.DataFrame | None = None,
                 hottest: Mapping[str, float] | None = None) -> pd.DataFrame:
    """Per (variant, dataset, GPU, phase): one row per stage plus 'total' (batch time,
    band) and 'active' (sum of kernel times), with the embedding share and speedups
    over base end to end and embedding only. `embedding` is the kernel model's
    prediction frame (steady mode); `unique_rows` maps a dataset to its distinct rows
    per table per batch and `hottest` to the lookups of its most looked-up row; `training`
    holds our training kernels' facts (backward cuda-*). Columns: variant, dataset, gpu, arch, phase, stage, time_us,
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
                           backward=backward, optimizer=optimizer, overheads=overheads, training=training,
                           hottest_lookups=(hottest or {}).get(dataset, 0.0))
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
