"""Analysis stage, model geometry: what one table launch of a variant looks like on a GPU (bags, warps,
waves), from the variant's shape and the static characterization, and what each warp
does per lookup (latencies serialized, rows in flight, instructions), from its SASS.
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
from characterize.analysis.model.locality import TraceProfile, sectors_per_row, trace_profile
from characterize.config import DTYPES, WorkloadConfig
from characterize.errors import ConfigError
from characterize.hardware.specs import UVM_PAGE_BYTES, GpuSpec
from characterize.kernels.registry import (
    Variant,
    default_cache_rows,
    get_variant,
    vector_elems,
    warp_group,
)
from characterize.progress import Progress


# ------------------------------------------------------------- kernel shapes
@dataclass(frozen=True)
class _Point:
    """One (variant, dataset, GPU): everything that does not depend on the constants."""

    variant: str
    dataset: str
    gpu: GpuSpec
    family: str             # chunk (thread per bag x feature) | warp (sub-warp per bag)
    l2: str                 # none | prefetch | window
    rows_per_step: int      # U (warp family)
    latencies_per_lookup: float   # memory latencies a warp serializes per lookup (SASS replay)
    sass_rows_in_flight: float    # row loads a warp keeps in flight (SASS replay)
    instructions_per_lookup: float  # hot-loop instructions a warp issues per lookup (SASS)
    blocks_per_sm: int
    registers: int
    warps_per_block: int
    blocks: int             # blocks that have work
    rounds: int             # tasks per warp
    lookups: float          # N per launch
    bags: int
    per_bag: float          # L
    row_bytes: int
    row_sector_bytes: float
    chunks: int             # 32-feature chunks per bag (chunk family)
    group: int              # lanes per bag (warp family)
    bytes_per_load: int     # per warp-level row load
    pinned_rows: int        # K_r: hot rows resident (0 without pinning)
    prepass_rows: int       # hot rows the pre-pass prefetches (l2p/combined): K, at most the rows the trace reads
    profile: TraceProfile
    mode: str               # steady | cold
    l1: np.ndarray          # sorted L1 distances
    note: str = ""
    dtype: str = "fp32"     # table element type (row_bytes includes an int8 row's scale and bias)
    host: str = "none"      # none | cache | uvm: where the table lives (kernels.registry.Variant.host)
    cache_rows: int = 0     # cache: C
    cache_ratio: float = float("nan")  # cache: C / E; uvm: the share of the table GPU memory can hold
    uvm_pages: float = 0.0  # uvm: pages of this table GPU memory holds
    host_profile: HostProfile | None = None

    @property
    def waves(self) -> int:
        return -(-self.blocks // max(1, self.blocks_per_sm * self.gpu.sm_count))

    @property
    def resident_warps(self) -> int:
        """Warps resident per SM: the occupancy limit, or fewer when the work runs out."""
        return min(self.blocks_per_sm, -(-self.blocks // self.gpu.sm_count)) * self.warps_per_block

    @property
    def rows_in_flight(self) -> float:
        """Independent row loads a warp keeps in flight, as the SASS replay counts them."""
        return self.sass_rows_in_flight


def _geometry(v: Variant, wl: WorkloadConfig, bags: int) -> dict[str, Any]:
    """Launch geometry of the lookup kernel as the launchers in embedding_bag.cu set it."""
    warps_per_block = v.block_size // 32
    if v.name == "warp":
        group = warp_group(wl.D, wl.dtype)
        per_lane = -(-(wl.D // vector_elems(wl.dtype)) // group)
        vec = next((x for x in (1, 2, 4, 8) if per_lane <= x), 8)   # 16-byte vectors per lane; U = 8 / V
        bags_per_block = warps_per_block * (32 // group)
        blocks = -(-bags // bags_per_block)
        return dict(family="warp", chunks=1, group=group, rows_per_step=8 // vec, warps_per_block=warps_per_block,
                    blocks=blocks, rounds=1, bytes_per_load=wl.row_bytes * (32 // group),
                    block_num=1, block_den=bags_per_block)
    chunks = -(-wl.D // v.block[0])
    tasks = bags * chunks
    grid = v.grid or -(-tasks // warps_per_block)
    blocks = min(grid, -(-tasks // warps_per_block))
    rounds = -(-tasks // (grid * warps_per_block))
    return dict(family="chunk", chunks=chunks, group=32, rows_per_step=1, warps_per_block=warps_per_block,
                blocks=blocks, rounds=rounds, bytes_per_load=min(v.block[0], wl.D) * DTYPES[wl.dtype].element_bytes,
                block_num=chunks, block_den=warps_per_block)


def _of_dtype(df: pd.DataFrame, dtype: str, what: str) -> pd.DataFrame:
    """The rows of one dtype's build (rows without a dtype column are fp32 builds)."""
    dtypes = df["dtype"].astype(object).fillna("fp32") if "dtype" in df.columns else pd.Series("fp32", df.index)
    have = set(dtypes)
    if dtype not in have:
        raise ConfigError(f"the {what} rows are for {', '.join(sorted(have))}, not {dtype}; characterize the "
                          f"{dtype} build (`characterize build --dtype {dtype}`, `characterize sass --dtype {dtype}`)")
    return df[dtypes == dtype]


def _static_table(static: Any, dtype: str = "fp32") -> dict[tuple[str, str], tuple[int, int]]:
    """(variant, arch) -> (blocks per SM, registers) of each lookup kernel as configured."""
    df = pd.DataFrame([r.to_dict() for r in static]) if isinstance(static, list) else pd.DataFrame(static)
    df = _of_dtype(df, dtype, "static") if not df.empty else df
    need = {"variant", "arch", "blocks_per_sm", "registers"}
    if df.empty or not need <= set(df.columns):
        raise ConfigError(f"static rows need columns {', '.join(sorted(need))}")
    if "role" in df.columns:
        df = df[df["role"] == "lookup"]
    if "sweep" in df.columns:
        df = df[~df["sweep"].astype(str).str.lower().isin(["true", "1"])]
    return {(r.variant, r.arch): (int(r.blocks_per_sm), int(r.registers)) for r in df.itertuples()}


def _sass_table(sass: Any, dtype: str = "fp32") -> dict[tuple[str, str], tuple[float, float, float]]:
    """(variant, arch) -> (latencies per lookup, rows in flight, instructions per lookup)
    of each lookup kernel's hot loop."""
    df = pd.DataFrame([r.to_dict() for r in sass]) if isinstance(sass, list) else pd.DataFrame(sass)
    df = _of_dtype(df, dtype, "SASS") if not df.empty else df
    need = {"variant", "arch", "latencies_per_iteration", "lookups_per_iteration", "rows_in_flight",
            "instructions_per_lookup"}
    if df.empty or not need <= set(df.columns):
        raise ConfigError(f"SASS rows need columns {', '.join(sorted(need))}")
    if "role" in df.columns:
        df = df[df["role"] == "lookup"]
    return {(r.variant, r.arch): (float(r.latencies_per_iteration) / max(1.0, float(r.lookups_per_iteration)),
                                  float(r.rows_in_flight), float(r.instructions_per_lookup))
            for r in df.itertuples()}


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
    return [dict(uvm_pages=share / UVM_PAGE_BYTES, cache_ratio=min(1.0, share / workload.table_bytes))]


def _prepare(workload: WorkloadConfig, datasets: Sequence[str], variants: Sequence[str], gpus: Sequence[GpuSpec],
             params: Mapping[str, dict[str, Any]], static: Any, sass: Any, tables: int, mode: str,
             profiles: dict[str, TraceProfile], progress: Progress | None,
             cache_ratios: Sequence[float] | None = None) -> list[_Point]:
    names = list(dict.fromkeys(["base", *variants]))
    for v in names:
        get_variant(v).check_shape(workload.D, workload.dtype)
    if static is None:
        raise ConfigError("the model needs each variant's static characterization (registers, occupancy); "
                          "pass static= rows (a run's static.csv), or call characterize.pipeline.predict, "
                          "which compiles them")
    table = _static_table(static, workload.dtype)
    if sass is None:
        raise ConfigError("the model needs each variant's hot loop read from its SASS (rows in flight, "
                          "instructions per lookup); pass sass= rows (a run's sass.csv), or call "
                          "characterize.pipeline.predict, which disassembles the builds")
    code = _sass_table(sass, workload.dtype)
    points = []
    hosts: dict[str, HostProfile] = {}   # one per dataset: replays shared by every GPU
    missing = [ds for ds in datasets if ds not in profiles]
    if progress:
        for ds in missing:
            progress(f"model: reuse distances of {ds}")
    if len(missing) > 1:   # each trace on its own thread (the reuse kernel releases the GIL), in this context
        contexts = [contextvars.copy_context() for _ in missing]   # (the shared caches of the run)
        with ThreadPoolExecutor(min(len(missing), os.cpu_count() or 1)) as pool:
            profiles.update(zip(missing, pool.map(lambda c, d: c.run(trace_profile, d, workload, tables),
                                                  contexts, missing)))
    for ds in datasets:
        if ds not in profiles:
            profiles[ds] = trace_profile(ds, workload, tables)
        prof = profiles[ds]
        per_bag = prof.lookups_per_launch / prof.bags
        for gpu in gpus:
            for name in names:
                v = get_variant(name)
                stand_in = name if v.compiled and v.host == "none" else "base"   # host variants run base's kernel
                if (stand_in, gpu.arch) not in table:
                    raise ConfigError(f"no static characterization of {stand_in} for {gpu.arch} ({workload.dtype})")
                blocks_per_sm, registers = table[(stand_in, gpu.arch)]
                if (stand_in, gpu.arch) not in code:
                    raise ConfigError(f"no SASS analysis of {stand_in} for {gpu.arch} ({workload.dtype})")
                lat_per_lookup, in_flight, per_lookup = code[(stand_in, gpu.arch)]
                model_v = v if v.compiled else get_variant("base")
                p = v.resolve_params(params.get(name), gpu=gpu, row_bytes=workload.row_bytes, rows=workload.E)
                geo = _geometry(model_v, workload, prof.bags)
                rs = sectors_per_row(workload.row_bytes) * SECTOR
                k = min(p.get("K", 0), prof.unique_rows) if v.l2 != "none" else 0
                k_res = min(k, int(gpu.max_persisting_l2_bytes // rs))
                layouts = _host_layouts(v, workload, gpu, params.get(name), cache_ratios) if v.host != "none" else [{}]
                host = hosts.setdefault(ds, HostProfile(prof)) if v.host != "none" else None
                points.extend(_Point(
                    variant=name, dataset=ds, gpu=gpu, family=geo["family"], l2=v.l2,
                    rows_per_step=geo["rows_per_step"], latencies_per_lookup=lat_per_lookup,
                    sass_rows_in_flight=in_flight, instructions_per_lookup=per_lookup, blocks_per_sm=blocks_per_sm, registers=registers,
                    warps_per_block=geo["warps_per_block"], blocks=geo["blocks"], rounds=geo["rounds"],
                    lookups=prof.lookups_per_launch, bags=prof.bags, per_bag=per_bag, row_bytes=workload.row_bytes,
                    row_sector_bytes=rs, chunks=geo["chunks"], group=geo["group"], bytes_per_load=geo["bytes_per_load"],
                    pinned_rows=k_res, prepass_rows=k if v.l2 == "prefetch" else 0, profile=prof, mode=mode,
                    l1=prof.l1_distances(gpu.sm_count, geo["block_num"], geo["block_den"]),
                    note=("" if v.compiled else "PyTorch's kernel, modelled as base (same algorithm and launch)"),
                    dtype=workload.dtype, host=v.host, host_profile=host, **layout) for layout in layouts)
    return points


