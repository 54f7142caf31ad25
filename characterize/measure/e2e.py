"""Measure stage, end to end: the DLRM around the embedding stage, in PyTorch.

`Dlrm` holds the model (bottom MLP, T tables, dot interaction, top MLP); its
embedding stage is any variant of the family, bound per table. `inference` runs a
batch; `training_step` adds the loss, the backward pass and the optimizer, with the
embedding bag's gradient taken PyTorch's way (its own sort-based
`_embedding_bag_backward`), by an atomic scatter-add (`index_add_`, atomics on a GPU),
or by our own kernels (kernels.training: `cuda-atomic`, `cuda-sorted`, and `cuda-fused`,
the sorted backward fused with the optimizer), and SGD or row-wise Adagrad on the rows
the batch touched. Our kernels run on the GPU, or through the CPU emulation on CPU
tensors; `time_training_kernels` times each alone with CUDA events.

On the CPU this checks correctness at a small size: every variant's step against the
same step with `torch.nn.functional.embedding_bag` and autograd. On a GPU,
`time_stages` times each stage with CUDA events inside NVTX ranges named
`chz-e2e/<phase>/<stage>`, so the stages show in Nsight Systems and Compute.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch

from characterize.analysis.model.e2e import BACKWARDS
from characterize.config import DlrmConfig, WorkloadConfig
from characterize.errors import ConfigError, NoCudaDevice
from characterize.kernels import training
from characterize.kernels.library import TableKernel, bind, close_all, device_state
from characterize.measure.timing import summarize
from characterize.workloads.traces import Dataset, generate, load_dataset


class Embed:
    """An embedding stage: pooled rows per table, and the row ids of a lookup in the
    table's current order (a variant may keep a table reordered while bound)."""

    def __call__(self, t: int, idx: torch.Tensor, off: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def rows(self, t: int, idx: torch.Tensor) -> torch.Tensor:
        return idx

    def table_rows(self, t: int, num_rows: int) -> torch.Tensor | None:
        """Where each original row of table t lives now, or None when the order is unchanged."""
        return None


@dataclass
class Batch:
    """One batch's inputs on the model's device; offset2bag and bag sizes are derived
    from the offsets on the host (they are inputs to the backward, whatever variant
    ran the forward)."""

    dense: torch.Tensor                 # B x bottom[0]
    indices: list[torch.Tensor]         # per table, int64
    offsets: list[torch.Tensor]         # per table, B starts
    offset2bag: list[torch.Tensor]
    bag_size: list[torch.Tensor]
    labels: torch.Tensor                # B x 1, 0 or 1


def make_batch(ds: Dataset, dlrm: DlrmConfig, batch: int, device: torch.device, seed: int = 0) -> Batch:
    """Batch `batch` of a dataset with seeded dense features and click labels."""
    g = torch.Generator().manual_seed(seed * 7919 + batch)
    idx, off, o2b, size = [], [], [], []
    for tr in ds.tables:
        i, o = tr.batch(batch)
        i_t, o_t = torch.as_tensor(i, dtype=torch.int64), torch.as_tensor(o, dtype=torch.int64)
        lengths = torch.diff(o_t, append=torch.tensor([i_t.numel()]))
        idx.append(i_t.to(device))
        off.append(o_t.to(device))
        o2b.append(torch.repeat_interleave(torch.arange(o_t.numel()), lengths).to(device))
        size.append(lengths.to(device))
    B = off[0].numel()
    dense = torch.rand(B, dlrm.bottom[0], generator=g).to(device)
    labels = (torch.rand(B, 1, generator=g) < 0.5).float().to(device)
    return Batch(dense, idx, off, o2b, size, labels)


def _mlp(dims: Sequence[int], sigmoid_last: bool) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        layers.append(torch.nn.Linear(a, b))
        last = i == len(dims) - 2
        layers.append(torch.nn.Sigmoid() if (last and sigmoid_last) else torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


@dataclass
class Dlrm:
    """The model's parameters: MLPs as torch modules, tables as plain tensors (the
    embedding stage and the optimizer update them, not autograd)."""

    wl: WorkloadConfig
    dlrm: DlrmConfig
    bottom: torch.nn.Sequential
    top: torch.nn.Sequential
    tables: list[torch.Tensor]
    state: list[torch.Tensor] = field(default_factory=list)   # row-wise Adagrad: one value per row

    @classmethod
    def create(cls, wl: WorkloadConfig, dlrm: DlrmConfig, device: torch.device, seed: int = 0) -> "Dlrm":
        dlrm.validate(wl.D)
        torch.manual_seed(seed)
        bottom = _mlp(dlrm.bottom, False).to(device)
        top = _mlp((dlrm.interaction_width(wl.T, wl.D), *dlrm.top), True).to(device)
        g = torch.Generator().manual_seed(seed + 1)
        tables = [(torch.rand(wl.E, wl.D, generator=g) * 0.02 - 0.01).to(device) for _ in range(wl.T)]
        return cls(wl, dlrm, bottom, top, tables)

    def copy(self) -> "Dlrm":
        return Dlrm(self.wl, self.dlrm, copy.deepcopy(self.bottom), copy.deepcopy(self.top),
                    [t.clone() for t in self.tables], [s.clone() for s in self.state])


def interact(x: torch.Tensor, embs: Sequence[torch.Tensor]) -> torch.Tensor:
    """Dot interaction: the dense vector and every pairwise dot product of the T + 1 vectors."""
    z = torch.stack([x, *embs], dim=1)
    s = torch.bmm(z, z.transpose(1, 2))
    li, lj = torch.tril_indices(z.shape[1], z.shape[1], offset=-1, device=z.device)
    return torch.cat([x, s[:, li, lj]], dim=1)


@contextmanager
def _stage(name: str, marks: dict[str, tuple[torch.cuda.Event, torch.cuda.Event]] | None) -> Iterator[None]:
    if marks is None:
        yield
        return
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.nvtx.range_push(f"chz-e2e/{name}")
    start.record()
    try:
        yield
    finally:
        end.record()
        torch.cuda.nvtx.range_pop()
        marks[name] = (start, end)


class TorchEmbed(Embed):
    """The reference embedding stage: torch.nn.functional.embedding_bag."""

    def __init__(self, model: Dlrm) -> None:
        self.model = model

    def __call__(self, t: int, idx: torch.Tensor, off: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.embedding_bag(idx, self.model.tables[t], off, mode="sum")


class VariantEmbed(Embed):
    """A variant bound per table: the pre-pass (pinning), then the lookup kernel."""

    def __init__(self, kernels: Sequence[TableKernel]) -> None:
        self.kernels = list(kernels)

    def __call__(self, t: int, idx: torch.Tensor, off: torch.Tensor) -> torch.Tensor:
        k = self.kernels[t]
        k.prepass()
        return k.launch(k.map_indices(idx), off).output

    def rows(self, t: int, idx: torch.Tensor) -> torch.Tensor:
        return self.kernels[t].map_indices(idx)

    def table_rows(self, t: int, num_rows: int) -> torch.Tensor | None:
        k = self.kernels[t]
        if k.variant.l2 != "window":   # only the access-policy window keeps a table reordered
            return None
        return k.map_indices(torch.arange(num_rows, device=k.weight.device))


@contextmanager
def embedding_stage(model: Dlrm, variant: str, traces: Sequence[torch.Tensor], backend: str,
                    params: dict | None = None, gpu: object = None) -> Iterator[Embed]:
    """`variant` bound to every table (hot rows from each table's trace). Binding may
    reorder a table (l2w); leaving the block restores it."""
    kernels: list[TableKernel] = []
    try:
        for w, tr in zip(model.tables, traces):
            kernels.append(bind(variant, w, trace=tr, params=params, backend=backend, gpu=gpu))
        with device_state(kernels):   # saved once before the first change, restored once after the last table
            yield VariantEmbed(kernels)
    finally:
        close_all(kernels)


def inference(model: Dlrm, batch: Batch, embed: Embed,
              marks: dict[str, tuple[torch.cuda.Event, torch.cuda.Event]] | None = None) -> torch.Tensor:
    """Click probabilities (B x 1) of one batch; `marks` collects CUDA events per stage."""
    with torch.no_grad():
        with _stage("inference/bottom_mlp", marks):
            x = model.bottom(batch.dense)
        with _stage("inference/embedding", marks):
            embs = [embed(t, batch.indices[t], batch.offsets[t]) for t in range(len(model.tables))]
        with _stage("inference/interaction", marks):
            r = interact(x, embs)
        with _stage("inference/top_mlp", marks):
            return model.top(r)


def embedding_grad(model: Dlrm, t: int, batch: Batch, grad_out: torch.Tensor, how: str,
                   rows: torch.Tensor | None = None) -> torch.Tensor:
    """Dense fp32 gradient of table t: PyTorch's own backward ('sort': on a GPU it sorts
    the ids and reduces runs of equal rows), a scatter-add of each lookup's bag
    gradient ('atomic': index_add_, atomic adds on a GPU), or our kernels ('cuda-atomic',
    'cuda-sorted'; emulated on CPU tensors). `rows`: the lookups' ids in the table's
    current order (default: the batch's indices)."""
    E = model.tables[t].shape[0]
    ids = batch.indices[t] if rows is None else rows
    if how in ("cuda-atomic", "cuda-sorted"):
        return training.backward(how, grad_out, ids, batch.offsets[t], E)
    if how == "sort":
        empty = torch.empty(0, dtype=torch.int64, device=grad_out.device)
        return torch.ops.aten._embedding_bag_backward(grad_out, ids, batch.offsets[t],
                                                      batch.offset2bag[t], batch.bag_size[t], empty, E,
                                                      False, 0, False, None, -1)
    if how == "atomic":
        grad = torch.zeros_like(model.tables[t])
        return grad.index_add_(0, ids, grad_out.index_select(0, batch.offset2bag[t]))
    raise ConfigError(f"backward must be sort, atomic, cuda-atomic or cuda-sorted here, got {how!r} "
                      "(cuda-fused updates the rows itself: training_step)")


def _state(model: Dlrm, t: int) -> torch.Tensor:
    """Table t's row-wise Adagrad state (one fp32 per row, by original row id), created at 0."""
    while len(model.state) <= t:
        model.state.append(torch.zeros(model.tables[len(model.state)].shape[0], device=model.tables[t].device))
    return model.state[t]


def update_rows(model: Dlrm, t: int, rows: torch.Tensor, grad: torch.Tensor, optimizer: str, lr: float,
                state_rows: torch.Tensor | None = None, eps: float = 1e-8) -> None:
    """Update the rows a batch touched: SGD, or row-wise Adagrad (one accumulated mean
    squared gradient per row, as FBGEMM keeps it). `rows` index the table (and
    `grad`) in its current order; `state_rows`, the same rows by their original ids
    (the Adagrad state never moves), default `rows`."""
    g = grad.index_select(0, rows)
    w = model.tables[t]
    if optimizer == "sgd":
        w.index_add_(0, rows, g, alpha=-lr)
    elif optimizer == "rowwise_adagrad":
        s, at = _state(model, t), rows if state_rows is None else state_rows
        s.index_add_(0, at, (g * g).mean(dim=1))
        w.index_add_(0, rows, g / (s.index_select(0, at).sqrt() + eps).unsqueeze(1), alpha=-lr)
    else:
        raise ConfigError(f"optimizer must be sgd or rowwise_adagrad, got {optimizer!r}")


def training_step(model: Dlrm, batch: Batch, embed: Embed, *, backward: str = "sort", optimizer: str = "sgd",
                  lr: float = 0.05, marks: dict[str, tuple[torch.cuda.Event, torch.cuda.Event]] | None = None
                  ) -> torch.Tensor:
    """Forward, binary cross-entropy, backward and the optimizer; returns the loss.
    The MLPs always take plain SGD; `optimizer` chooses the tables' update. With
    backward 'cuda-fused' the embedding backward stage updates the tables itself (the
    fused kernel) and the optimizer stage updates only the MLPs."""
    fused = backward == "cuda-fused"
    if fused:
        training.kernel_for(backward, optimizer)
    with _stage("training/bottom_mlp", marks):
        x = model.bottom(batch.dense)
    with _stage("training/embedding", marks):
        with torch.no_grad():
            embs = [embed(t, batch.indices[t], batch.offsets[t]) for t in range(len(model.tables))]
    leaves = [e.detach().requires_grad_(True) for e in embs]
    with _stage("training/interaction", marks):
        r = interact(x, leaves)
    with _stage("training/top_mlp", marks):
        p = model.top(r)
        loss = torch.nn.functional.binary_cross_entropy(p, batch.labels)
    params = [*model.bottom.parameters(), *model.top.parameters()]
    with _stage("training/mlp_interaction_backward", marks):
        grads = torch.autograd.grad(loss, params + leaves)
    with _stage("training/embedding_backward", marks):
        if fused:
            for t, g in enumerate(grads[len(params):]):
                w = model.tables[t]
                training.fused_update(w, g, batch.indices[t], batch.offsets[t], optimizer=optimizer, lr=lr,
                                      momentum=_state(model, t) if optimizer == "rowwise_adagrad" else None,
                                      table_rows=embed.table_rows(t, w.shape[0]))
            table_grads = []
        else:
            ids = [embed.rows(t, batch.indices[t]) for t in range(len(model.tables))]
            table_grads = [embedding_grad(model, t, batch, g, backward, ids[t])
                           for t, g in enumerate(grads[len(params):])]
    with _stage("training/optimizer", marks):
        with torch.no_grad():
            for prm, g in zip(params, grads[:len(params)]):
                prm.add_(g, alpha=-lr)
            for t, g in enumerate(table_grads):
                touched = torch.unique(batch.indices[t])
                update_rows(model, t, embed.rows(t, touched), g, optimizer, lr, state_rows=touched)
    return loss.detach()


def reference_training_step(model: Dlrm, batch: Batch, *, optimizer: str = "sgd", lr: float = 0.05) -> torch.Tensor:
    """The same step through autograd of torch.nn.functional.embedding_bag: what the
    variants' steps are checked against."""
    tables = [w.clone().requires_grad_(True) for w in model.tables]
    params = [*model.bottom.parameters(), *model.top.parameters()]
    x = model.bottom(batch.dense)
    embs = [torch.nn.functional.embedding_bag(batch.indices[t], tables[t], batch.offsets[t], mode="sum")
            for t in range(len(tables))]
    loss = torch.nn.functional.binary_cross_entropy(model.top(interact(x, embs)), batch.labels)
    grads = torch.autograd.grad(loss, params + tables)
    with torch.no_grad():
        for prm, g in zip(params, grads[:len(params)]):
            prm.add_(g, alpha=-lr)
        for t, g in enumerate(grads[len(params):]):
            update_rows(model, t, torch.unique(batch.indices[t]), g, optimizer, lr)
    return loss.detach()


def require_cuda() -> torch.device:
    if not torch.cuda.is_available():
        raise NoCudaDevice("timing the DLRM step needs a CUDA GPU; without one, `characterize e2e` checks the "
                           "pipeline on the CPU and predicts each stage")
    return torch.device("cuda")


def time_stages(run: Callable[[dict], object], reps: int = 20, warmup: int = 3) -> dict[str, list[float]]:
    """Microseconds per stage (and 'total') over `reps` runs of `run(marks)`, after
    `warmup` untimed ones. `run` records its stages' CUDA events into `marks`."""
    require_cuda()
    for _ in range(warmup):
        run({})
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {}
    for _ in range(reps):
        marks: dict[str, tuple[torch.cuda.Event, torch.cuda.Event]] = {}
        with _stage("total", marks):
            run(marks)
        torch.cuda.synchronize()
        for name, (a, b) in marks.items():
            times.setdefault(name.split("/")[-1], []).append(a.elapsed_time(b) * 1000.0)
    return times


#: largest |difference| from the reference step we accept (fp32 sums in another order)
CHECK_TOLERANCE = 1e-4


def check_pipeline(variants: Sequence[str], dataset: str = "medium", *, backend: str = "emulate",
                   backwards: Sequence[str] = BACKWARDS,
                   optimizers: Sequence[str] = ("sgd", "rowwise_adagrad")) -> list[dict]:
    """Every variant's inference and training step against the reference, at a small
    odd size (T=3, E=1009, D=12, B=37, L=0..9 with empty bags and duplicate ids):
    inference output, loss, and every table and MLP parameter after the update. One
    dict per (variant, phase, backward, optimizer) with max_abs_error and ok."""
    wl = WorkloadConfig(T=3, E=1009, D=12, B=37, L="uniform:0:9", batches=2, seed=11)
    dl = DlrmConfig(bottom=(13, 24, wl.D), top=(11, 1))
    device = torch.device("cuda" if backend == "cuda" else "cpu")
    ds = generate(dataset, wl)
    batch, second = make_batch(ds, dl, 0, device), make_batch(ds, dl, 1, device)
    traces = [torch.as_tensor(t.indices, device=device) for t in ds.tables]
    model = Dlrm.create(wl, dl, device)
    reference = TorchEmbed(model)
    expected = inference(model, batch, reference)
    pooled = [reference(t, batch.indices[t], batch.offsets[t]) for t in range(wl.T)]
    out = []
    for v in variants:
        with embedding_stage(model, v, traces, backend) as embed:
            err = float((inference(model, batch, embed) - expected).abs().max())
            for t in range(wl.T):   # the pooled rows themselves: the sigmoid would hide small errors
                got = embed(t, batch.indices[t], batch.offsets[t])
                err = max(err, float((got - pooled[t]).abs().max()))
        out.append({"variant": v, "phase": "inference", "backward": "", "optimizer": "", "max_abs_error": err,
                    "ok": err <= CHECK_TOLERANCE})
        for how in backwards:
            for opt in optimizers:
                mine, ref = model.copy(), model.copy()
                diffs = []
                for step in (batch, second):   # two steps: the optimizer's state carries over
                    with embedding_stage(mine, v, traces, backend) as embed:
                        loss = training_step(mine, step, embed, backward=how, optimizer=opt)
                    ref_loss = reference_training_step(ref, step, optimizer=opt)
                    diffs.append(abs(float(loss) - float(ref_loss)))
                diffs += [float((a - b).abs().max()) for a, b in zip(mine.tables, ref.tables)]
                diffs += [float((a - b).abs().max()) for a, b in zip(mine.state, ref.state)]
                diffs += [float((a - b).detach().abs().max()) for a, b in
                          zip([*mine.bottom.parameters(), *mine.top.parameters()],
                              [*ref.bottom.parameters(), *ref.top.parameters()])]
                err = max(diffs)
                out.append({"variant": v, "phase": "training", "backward": how, "optimizer": opt,
                            "max_abs_error": err, "ok": err <= CHECK_TOLERANCE})
    return out


def measure_step(wl: WorkloadConfig, dlrm: DlrmConfig, variants: Sequence[str], datasets: Sequence[str], *,
                 phases: Sequence[str] = ("inference", "training"), backward: str = "sort", optimizer: str = "sgd",
                 params: dict | None = None, reps: int = 20, gpu: object = None,
                 progress: Callable[[str], None] | None = None) -> list[dict]:
    """Per (variant, dataset, phase, stage) the mean time on this GPU and its 95%
    confidence interval, plus 'total' (the whole batch). Stages are CUDA-event
    intervals on the default stream, so host gaps between kernels count. `progress`
    hears one line per variant and dataset timed."""
    import time

    device = require_cuda()
    params = params or {}
    model = Dlrm.create(wl, dlrm, device)
    rows = []
    done, total, start = 0, len(variants) * len(datasets), time.perf_counter()
    for dataset in datasets:
        ds = load_dataset(dataset, wl)
        batch = make_batch(ds, dlrm, 0, device)
        traces = [torch.as_tensor(t.indices, device=device) for t in ds.tables]
        for v in variants:
            done += 1
            if progress is not None:
                spent = time.perf_counter() - start
                left = f", about {spent / (done - 1) * (total - done + 1):.0f} s left" if done > 1 else ""
                progress(f"timing the DLRM step around {v} on {dataset} ({done}/{total}, {spent:.0f} s{left})")
            with embedding_stage(model, v, traces, "cuda", params.get(v), gpu) as embed:
                for phase in phases:
                    if phase == "inference":
                        times = time_stages(lambda marks: inference(model, batch, embed, marks), reps)
                    else:
                        times = time_stages(lambda marks: training_step(model, batch, embed, backward=backward,
                                                                        optimizer=optimizer, marks=marks), reps)
                    for stage, ts in times.items():
                        st = summarize(ts)   # the 95% CI every measurement reports (Student t)
                        half = st.ci95 if len(ts) > 1 else 0.0
                        rows.append({"variant": v, "dataset": dataset, "phase": phase, "stage": stage,
                                     "time_us": st.mean, "time_us_low": st.mean - half,
                                     "time_us_high": st.mean + half, "source": "measured"})
    return rows


#: spin before each timed launch, so the events bracket device work only (the host's
#: ctypes launch, 10-20 us, happens while the GPU spins)
_DELAY_CYCLES = 50_000


def time_training_kernels(wl: WorkloadConfig, datasets: Sequence[str], kernels: Sequence[str] | None = None, *,
                          reps: int = 30, warmup: int = 3, lr: float = 0.05, seed: int = 0) -> list[dict]:
    """Each training kernel alone on this GPU, per (kernel, dataset), over the T tables
    of batch 0: CUDA events around each launch (queued behind a spin so the host's launch
    cost stays outside), `reps` repetitions per table after `warmup`; and once per table
    the preparation in torch (bag layout, index checks and, for the sorted kernels, the
    sort by row: torch.sort + unique_consecutive), whose host syncs count. Rows: kernel,
    dataset, stage ('kernel', 'zero_gradient' or 'prepare'), time_us (mean per table),
    time_us_low, time_us_high (95% CI), source ('measured'), reps."""
    device = require_cuda()
    names = list(kernels) if kernels is not None else list(training.TRAINING_ORDER)
    g = torch.Generator().manual_seed(seed)
    rows = []
    for dataset in datasets:
        ds = load_dataset(dataset, wl)
        inputs = []
        for tr_ in ds.tables:
            i, o = tr_.batch(0)
            idx = torch.as_tensor(i, dtype=torch.int64, device=device)
            off = torch.as_tensor(o, dtype=torch.int64, device=device)
            inputs.append((idx, off, (torch.rand(off.numel(), wl.D, generator=g) - 0.5).to(device)))
        for name in names:
            k = training.get_training_kernel(name)
            samples: dict[str, list[float]] = {}
            for idx, off, grad_out in inputs:
                table = torch.zeros(wl.E, wl.D, device=device)
                momentum = torch.zeros(wl.E, device=device)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                if k.optimizer:
                    bound = training.bind_update(table, grad_out, idx, off, optimizer=k.optimizer, lr=lr,
                                                 momentum=momentum)
                else:
                    bound = training.bind_backward(name, grad_out, idx, off, wl.E)
                end.record()
                torch.cuda.synchronize()
                samples.setdefault("prepare", []).append(start.elapsed_time(end) * 1e3)
                for rep in range(warmup + reps):
                    events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
                    torch.cuda._sleep(_DELAY_CYCLES)
                    events[0].record()
                    if bound.grad is not None:
                        bound.grad.zero_()
                    events[1].record()
                    bound.launch()
                    events[2].record()
                    torch.cuda.synchronize()
                    if rep >= warmup:
                        if bound.grad is not None:
                            samples.setdefault("zero_gradient", []).append(events[0].elapsed_time(events[1]) * 1e3)
                        samples.setdefault("kernel", []).append(events[1].elapsed_time(events[2]) * 1e3)
            for stage, ts in samples.items():
                st = summarize(ts)
                half = st.ci95 if st.n > 1 else 0.0
                rows.append({"kernel": name, "dataset": dataset, "stage": stage, "time_us": st.mean,
                             "time_us_low": st.mean - half, "time_us_high": st.mean + half, "source": "measured",
                             "reps": st.n})
    return rows
