"""Analysis stage, model geometry: what one launch of a variant looks like on a GPU (tasks,
blocks, resident warps, how many tables it covers) and what each task costs in
latencies and instructions, from the kernel's facts (model.kernels) and the trace's
own bag lengths.
"""

from __future__ import annotations

import contextvars
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from characterize.analysis.model.constants import SECTOR
from characterize.analysis.model.host import HostProfile
from characterize.analysis.model.kernels import PERSISTENT, KernelFacts, ours, peer, peer_dtype, user
from characterize.analysis.model.locality import TraceProfile, sectors_per_row, trace_profile
from characterize.config import INDEX_BYTES, WorkloadConfig
from characterize.errors import ConfigError, UnsupportedShape
from characterize.hardware.specs import UVM_PAGE_BYTES, GpuSpec
from characterize.kernels.order import choose_tables_in_flight
from characterize.kernels.registry import Variant, default_cache_rows, get_variant
from characterize.progress import Progress


# ------------------------------------------------------------- kernel shapes
@dataclass(frozen=True)
class ModelPoint:
    """One (variant, dataset, GPU, mode): everything that does not depend on the constants."""

    variant: str
    dataset: str
    gpu: GpuSpec
    kernel: KernelFacts
    l2: str                 # none | prefetch | window
    set_aside: bool         # prefetch: pinned rows inside a persisting-L2 set-aside (else a warm start only)
    tables: int             # T
    tables_per_launch: int  # 1, or T for a kernel covering every table in one launch
    tables_in_flight: int   # tables whose rows share the L2 while a launch runs: 1, or its order's (tbe: phases)
    lookups: float          # N per table per batch
    bags: int               # B per table
    row_bytes: int
    row_sector_bytes: float
    tasks: float            # warp tasks of one launch
    blocks: int             # blocks launched
    warps_per_block: int
    slots: int              # blocks resident on the whole GPU at once
    task_latencies: float   # mean row latencies a task waits (nest replay at the trace's bag lengths)
    task_instructions: float  # mean instructions a task issues
    stream_bytes: float     # bytes per lookup streamed through L2 besides rows: indices, offsets, outputs
    read_stream_bytes: float   # per launch: indices and offsets read
    write_bytes: float      # per launch: output (and offset2bag, bag sizes) written
    pinned_rows: int        # K_r: hot rows inside the set-aside (0 without pinning)
    prepass_rows: int       # hot rows the pre-pass prefetches (l2p/combined): K, at most the rows the trace reads
    profile: TraceProfile
    mode: str               # steady | cold
    l1: np.ndarray          # sorted L1 distances
    note: str = ""
    dtype: str = "fp32"
    host: str = "none"      # none | cache | uvm: where the table lives (kernels.registry.Variant.host)
    uvm_mode: str = "zero-copy"   # uvm: read in place over the link, or pages migrated on faults
    cache_rows: int = 0     # cache: C
    cache_ratio: float = float("nan")  # cache: C / E; uvm: the share of the table GPU memory can hold
    uvm_pages: float = 0.0  # uvm: pages of this table GPU memory holds
    host_profile: HostProfile | None = None

    @property
    def launches(self) -> int:
        """Launches one batch of all T tables takes."""
        return max(1, self.tables // self.tables_per_launch)

    @property
    def rounds(self) -> int:
        """Rounds of blocks the busiest SM runs: its ceil(blocks / SMs) blocks, as many at a
        time as fit. Blocks of equal work retire together, so a round is whole however few
        blocks the last holds (SMs take new blocks as old ones retire, all at about once)."""
        per_sm = -(-self.blocks // self.gpu.sm_count)
        return -(-per_sm // max(1, self.kernel.blocks_per_sm))

    @property
    def busiest_share(self) -> float:
        """Share of the launch's SM-local work (instructions, L1 traffic) the busiest SM does:
        its ceil(blocks / SMs) blocks of equal work. An SM without a block issues nothing and
        its L1 moves nothing, so a grid of fewer blocks than SMs runs on those it has (64
        blocks on an H200's 132 SMs use 64 schedulers and L1s, not 132)."""
        return -(-self.blocks // self.gpu.sm_count) / max(1, self.blocks)

    @property
    def resident_warps(self) -> float:
        """Warps resident per SM on average over the launch (what ncu's achieved occupancy
        reads): every block's warps over the SMs and the busiest SM's rounds."""
        return self.blocks * self.warps_per_block / self.gpu.sm_count / self.rounds

    @property
    def waves(self) -> float:
        """Rounds of blocks on the busiest SM (`rounds`), the unit the launch's time counts in."""
        return float(self.rounds)

    @property
    def rows_in_flight(self) -> float:
        return self.kernel.rows_in_flight


def per_bag(samples: Mapping[Any, float], lengths: np.ndarray) -> np.ndarray:
    """A per-task figure sampled at a few bag lengths (kernels.sass.NEST_L), at each of
    `lengths`: linear between samples, the last slope beyond, proportional below the
    first."""
    pts = sorted((float(k), float(v)) for k, v in samples.items())
    if not pts:
        return np.zeros_like(lengths, dtype=np.float64)
    xs, ys = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
    out = np.interp(lengths, xs, ys)
    if len(xs) > 1:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        beyond = lengths > xs[-1]
        out[beyond] = ys[-1] + slope * (lengths[beyond] - xs[-1])
    below = lengths < xs[0]
    out[below] = ys[0] * lengths[below] / xs[0] if xs[0] > 0 else ys[0]
    return np.maximum(out, 0.0)


def run_lengths(lengths: np.ndarray, bags: int, run: int) -> np.ndarray:
    """The lookups of each run of `run` consecutive bags (within each batch of `bags` bags):
    what one lane group gathers as one stream on tbe's short path; the bags themselves
    when run is 1."""
    if run <= 1 or lengths.size == 0:
        return lengths
    per_batch = lengths.reshape(-1, bags) if bags and lengths.size % bags == 0 else lengths.reshape(1, -1)
    starts = np.arange(0, per_batch.shape[1], run)
    return np.add.reduceat(per_batch, starts, axis=1).reshape(-1)


def launch_shape(k: KernelFacts, gpu: GpuSpec, wl: WorkloadConfig, bags: int, tables_per_launch: int
                 ) -> dict[str, Any]:
    """Tasks, blocks and resident block slots of one launch, as the kernel's launcher
    sizes it: a warp per (bag, chunk) or per 32 / lanes_per_bag bags; a fixed grid
    striding over the tasks, a grid of one block per tasks' worth, or a persistent grid
    of SMs x resident blocks."""
    wpb = max(1, k.block_threads // 32)
    bags_launch = bags * tables_per_launch
    if k.work == "chunk":
        chunks = -(-wl.D // k.chunk_features)
        tasks = bags_launch * chunks
        block_num, block_den = chunks, wpb
    else:
        per_warp = max(1, 32 // k.lanes_per_bag)
        runs = -(-bags_launch // max(1, k.run_bags))   # tbe's short path: a group gathers K bags as one stream
        tasks = -(-runs // per_warp)
        block_num, block_den = 1, wpb * per_warp * max(1, k.run_bags)
    needed = -(-tasks // wpb)
    slots = k.blocks_per_sm * gpu.sm_count
    if k.grid == PERSISTENT:
        blocks = min(needed, slots)
        # each warp takes a contiguous slice of the tasks: a block covers its warps' slices
        block_den *= max(1, round(tasks / max(1, blocks * wpb)))
    elif k.grid > 0:
        blocks = min(k.grid, needed)
    else:
        blocks = needed
    return dict(tasks=float(tasks), blocks=int(max(1, blocks)), warps_per_block=wpb, slots=int(max(1, slots)),
                block_num=block_num, block_den=block_den)


def tables_in_flight(v: Variant, prof: TraceProfile, gpu: GpuSpec, wl: WorkloadConfig,
                     given: Mapping[str, Any] | None) -> int:
    """Tables whose rows share the L2 during one launch of a batched variant: tbe's
    tables_in_flight as given, else as its launcher chooses it from the warm-up batches'
    hot rows (kernels.order; every table of a generated dataset has table 0's distribution);
    every table for a batch kernel that walks them all at once (FBGEMM's)."""
    if v.name != "tbe":
        return wl.T
    m = int((given or {}).get("tables_in_flight") or 0)
    if not m:
        curve = prof.coverage_curve()
        m = choose_tables_in_flight([curve] * wl.T, [wl.row_bytes] * wl.T, gpu.l2_bytes * gpu.l2_effective_capacity)
    return min(wl.T, m) if m else wl.T


def _host_layouts(v: Variant, workload: WorkloadConfig, gpu: GpuSpec, given: dict[str, Any] | None,
                  cache_ratios: Sequence[float] | None) -> list[dict[str, Any]]:
    """Where a host-resident variant keeps the table on this GPU: one layout per cache
    size (cache: C given, else each of `cache_ratios` x E, else the default), or GPU
    memory left after the traces shared by the T tables as pages (uvm)."""
    if v.host == "cache":
        if given and "C" in given:
            sizes = [int(given["C"])]
        elif cache_ratios:
            sizes = [default_cache_rows(workload.E, r) for r in cache_ratios]
        else:
            sizes = [default_cache_rows(workload.E)]
        return [dict(cache_rows=min(C, workload.E), cache_ratio=min(C, workload.E) / workload.E)
                for C in dict.fromkeys(sizes)]
    overhead = workload.device_bytes() - (workload.T + 1) * workload.table_bytes
    share = max(0, gpu.memory_bytes - overhead) / workload.T
    return [dict(uvm_pages=share / UVM_PAGE_BYTES, cache_ratio=min(1.0, share / workload.table_bytes),
                 uvm_mode="migrate" if int((given or {}).get("migrate", 0)) else "zero-copy")]


def _frame(rows: Any) -> pd.DataFrame:
    return pd.DataFrame([r.to_dict() for r in rows]) if isinstance(rows, list) else pd.DataFrame(rows)


def _of_dtype(df: pd.DataFrame, dtype: str, what: str) -> pd.DataFrame:
    """The rows of one dtype's build (rows without a dtype column are fp32 builds)."""
    dtypes = df["dtype"].astype(object).fillna("fp32") if "dtype" in df.columns else pd.Series("fp32", df.index)
    have = set(dtypes)
    if dtype not in have:
        raise ConfigError(f"the {what} rows are for {', '.join(sorted(have))}, not {dtype}; characterize the "
                          f"{dtype} build (`characterize build --dtype {dtype}`, `characterize sass --dtype {dtype}`)")
    return df[dtypes == dtype]


def kernel_facts(v: Variant, gpu: GpuSpec, wl: WorkloadConfig, static: pd.DataFrame | None,
                 sass: pd.DataFrame | None, custom: Mapping[str, Mapping[str, Any]] | None = None,
                 params: Mapping[str, Any] | None = None) -> KernelFacts:
    """The facts the model uses for variant `v` on `gpu`: a user's kernel (`custom`),
    a peer's (PyTorch's, FBGEMM's: kernels.peers), or ours (static and SASS rows)."""
    if v.peer == "user":
        return user(v, gpu, wl, (custom or {}).get(v.name))
    if v.peer:
        return peer(v, gpu, wl, params)
    if static is None or static.empty:
        raise ConfigError("the model needs each variant's static characterization (registers, occupancy); "
                          "pass static= rows (a run's static.csv), or call characterize.pipeline.predict, "
                          "which compiles them")
    if sass is None or sass.empty:
        raise ConfigError("the model needs each variant's hot loop read from its SASS (rows in flight, "
                          "instructions per lookup); pass sass= rows (a run's sass.csv), or call "
                          "characterize.pipeline.predict, which disassembles the builds")
    return ours(v, gpu, wl, _of_dtype(static, wl.dtype, "static"), _of_dtype(sass, wl.dtype, "SASS"), params)


def prepare_points(workload: WorkloadConfig, datasets: Sequence[str], variants: Sequence[str], gpus: Sequence[GpuSpec],
                   params: Mapping[str, dict[str, Any]], static: Any, sass: Any, tables: int, mode: str,
                   profiles: dict[tuple, TraceProfile], progress: Progress | None,
                   cache_ratios: Sequence[float] | None = None, set_aside: bool = True,
                   custom: Mapping[str, Mapping[str, Any]] | None = None,
                   skipped: list[str] | None = None, with_base: bool = True,
                   optional: Sequence[str] = ()) -> list[ModelPoint]:
    """Every point to evaluate (base's too, the speedups' reference, unless `with_base`
    is False). A variant whose kernel has no facts on a GPU (a peer without code for
    it, a shape it refuses) is left out and said in `skipped`, instead of failing the
    whole prediction; so is one of `optional` (a reference the caller did not ask for)
    that refuses the workload's shape."""
    names = list(dict.fromkeys(["base", *variants] if with_base else variants))
    static_df = _frame(static) if static is not None else None
    sass_df = _frame(sass) if sass is not None else None
    points = []
    hosts: dict[str, HostProfile] = {}   # one per dataset: replays shared by every GPU
    facts: dict[tuple[str, str], KernelFacts] = {}
    for name in list(names):
        v = get_variant(name)
        try:   # a peer is modelled with the kernel its users run for this precision (FBGEMM: int8 -> int8h)
            v.check_shape(workload.D, peer_dtype(v.peer, workload.dtype) if v.peer else workload.dtype)
        except UnsupportedShape as e:
            if name not in optional or skipped is None:
                raise
            skipped.append(f"{name}: {e}")
            names.remove(name)
    # the trace does not depend on the rows' dtype: one profile per dataset for every precision
    key_of = {ds: (ds, workload.replace(dtype="fp32"), tables) for ds in datasets}
    missing = [ds for ds in dict.fromkeys(datasets) if key_of[ds] not in profiles]
    if progress:
        for ds in missing:
            progress(f"model: reuse distances of {ds}")
    if len(missing) > 1:   # each trace on its own thread (the reuse kernel releases the GIL), in this context
        contexts = [contextvars.copy_context() for _ in missing]   # (the shared caches of the run)
        with ThreadPoolExecutor(min(len(missing), os.cpu_count() or 1)) as pool:
            found = pool.map(lambda c, d: c.run(trace_profile, d, workload, tables), contexts, missing)
            profiles.update({key_of[d]: prof for d, prof in zip(missing, found)})
    for ds in datasets:
        key = key_of[ds]
        if key not in profiles:
            profiles[key] = trace_profile(ds, workload, tables)
        prof = profiles[key]
        lengths = prof.bag_lengths
        for gpu in gpus:
            for name in names:
                v = get_variant(name)
                key = (name, gpu.key)
                if key not in facts:
                    try:
                        facts[key] = kernel_facts(v, gpu, workload, static_df, sass_df, custom, params.get(name))
                    except ConfigError as e:
                        if name == "base" or skipped is None:
                            raise
                        skipped.append(f"{name} on {gpu.key}: {e}")
                        continue
                k = facts[key]
                tpl = workload.T if k.tables_per_launch == "all" else 1
                flight = tables_in_flight(v, prof, gpu, workload, params.get(name)) if tpl > 1 else 1
                geo = launch_shape(k, gpu, workload, prof.bags, tpl)
                runs = run_lengths(lengths, prof.bags, k.run_bags)
                lat = per_bag(k.bag_latencies, runs)
                ins = per_bag(k.bag_instructions, runs)
                task_lat, task_ins = float(lat.mean()), float(ins.mean())
                if k.setup_latencies > 0:   # once per run of tasks: each warp's slice of each phase, split at tables
                    warps = geo["blocks"] * geo["warps_per_block"]
                    phases = -(-tpl // flight)
                    task_lat += k.setup_latencies * min(1.0, (warps * phases + tpl - 1) / max(geo["tasks"], 1.0))
                p = v.resolve_params(params.get(name), gpu=gpu, row_bytes=workload.row_bytes, rows=workload.E)
                rs = sectors_per_row(workload.row_bytes) * SECTOR
                N, B = prof.lookups_per_launch, prof.bags
                out_bytes = B * workload.D * k.output_bytes
                extra = (N + B) * INDEX_BYTES if k.offset2bag else 0.0
                stream = INDEX_BYTES + (INDEX_BYTES if k.offset2bag else 0) + (out_bytes + B * INDEX_BYTES) / max(N, 1)
                kk = min(p.get("K", 0), prof.unique_rows) if v.l2 != "none" else 0
                aside = set_aside and v.l2 == "prefetch" and gpu.max_persisting_l2_bytes > 0
                k_res = min(kk, int(gpu.max_persisting_l2_bytes // rs)) if (aside or v.l2 == "window") else 0
                layouts = _host_layouts(v, workload, gpu, params.get(name), cache_ratios) if v.host != "none" else [{}]
                host = hosts.setdefault(ds, HostProfile(prof)) if v.host != "none" else None
                points.extend(ModelPoint(
                    variant=name, dataset=ds, gpu=gpu, kernel=k, l2=v.l2, set_aside=aside, tables=workload.T,
                    tables_per_launch=tpl, tables_in_flight=flight, lookups=N, bags=B, row_bytes=workload.row_bytes, row_sector_bytes=rs,
                    tasks=geo["tasks"], blocks=geo["blocks"], warps_per_block=geo["warps_per_block"],
                    slots=geo["slots"], task_latencies=task_lat, task_instructions=task_ins, stream_bytes=stream,
                    read_stream_bytes=N * INDEX_BYTES + B * INDEX_BYTES, write_bytes=out_bytes + extra,
                    pinned_rows=k_res, prepass_rows=kk if v.l2 == "prefetch" else 0, profile=prof, mode=mode,
                    l1=prof.l1_distances(gpu.sm_count, geo["block_num"], geo["block_den"]), note=k.note,
                    dtype=workload.dtype, host=v.host, host_profile=host, **layout) for layout in layouts)
    return points
