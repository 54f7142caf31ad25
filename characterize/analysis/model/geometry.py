"""Model, geometry: what one table launch of a variant looks like on a GPU (bags, warps,
waves, rows in flight), from the variant's shape and the static characterization.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from characterize.analysis.model.constants import SECTOR, Progress
from characterize.analysis.model.locality import TraceProfile, sectors_per_row
from characterize.config import WorkloadConfig
from characterize.errors import ConfigError
from characterize.hardware import GpuSpec
from characterize.kernels.registry import Variant, get_variant, warp_group


# ------------------------------------------------------------- kernel shapes
@dataclass(frozen=True)
class _Point:
    """One (variant, dataset, GPU): everything that does not depend on the constants."""

    variant: str
    dataset: str
    gpu: GpuSpec
    family: str             # chunk (thread per bag x feature) | warp (sub-warp per bag)
    l2: str                 # none | prefetch | window
    prefetch: int           # P rows prefetched ahead (chunk family)
    rows_per_step: int      # U (warp family)
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

    @property
    def waves(self) -> int:
        return -(-self.blocks // max(1, self.blocks_per_sm * self.gpu.sm_count))

    @property
    def resident_warps(self) -> int:
        """Warps resident per SM: the occupancy limit, or fewer when the work runs out."""
        return min(self.blocks_per_sm, -(-self.blocks // self.gpu.sm_count)) * self.warps_per_block

    @property
    def rows_in_flight(self) -> int:
        """Independent row loads a warp keeps in flight."""
        return self.prefetch + 1 if self.family == "chunk" else self.rows_per_step * (32 // self.group)


def _geometry(v: Variant, wl: WorkloadConfig, bags: int) -> dict[str, Any]:
    """Launch geometry of the lookup kernel as the launchers in embedding_bag.cu set it."""
    warps_per_block = v.block_size // 32
    if v.name == "warp":
        group = warp_group(wl.D)
        per_lane = -(-(wl.D // 4) // group)
        vec = next((x for x in (1, 2, 4, 8) if per_lane <= x), 8)   # float4s per lane; U = 8 / V
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
                blocks=blocks, rounds=rounds, bytes_per_load=min(v.block[0], wl.D) * 4,
                block_num=chunks, block_den=warps_per_block)


def _static_table(static: Any) -> dict[tuple[str, str], tuple[int, int]]:
    """(variant, arch) -> (blocks per SM, registers) of each lookup kernel as configured."""
    df = pd.DataFrame([r.to_dict() for r in static]) if isinstance(static, list) else pd.DataFrame(static)
    need = {"variant", "arch", "blocks_per_sm", "registers"}
    if df.empty or not need <= set(df.columns):
        raise ConfigError(f"static rows need columns {', '.join(sorted(need))}")
    if "role" in df.columns:
        df = df[df["role"] == "lookup"]
    if "sweep" in df.columns:
        df = df[~df["sweep"].astype(str).str.lower().isin(["true", "1"])]
    return {(r.variant, r.arch): (int(r.blocks_per_sm), int(r.registers)) for r in df.itertuples()}


def _prepare(workload: WorkloadConfig, datasets: Sequence[str], variants: Sequence[str], gpus: Sequence[GpuSpec],
             params: Mapping[str, dict[str, Any]], static: Any, tables: int, mode: str,
             profiles: dict[str, TraceProfile], progress: Progress | None) -> list[_Point]:
    names = list(dict.fromkeys(["base", *variants]))
    for v in names:
        get_variant(v).check_shape(workload.D)
    if static is None:
        raise ConfigError("the model needs each variant's static characterization (registers, occupancy); "
                          "pass static= rows (a run's static.csv), or call characterize.pipeline.predict, "
                          "which compiles them")
    table = _static_table(static)
    points = []
    for ds in datasets:
        if ds not in profiles:
            if progress:
                progress(f"model: reuse distances of {ds}")
            profiles[ds] = TraceProfile(ds, workload, tables)
        prof = profiles[ds]
        per_bag = prof.lookups_per_launch / prof.bags
        for gpu in gpus:
            for name in names:
                v = get_variant(name)
                stand_in = name if v.compiled else "base"
                if (stand_in, gpu.arch) not in table:
                    raise ConfigError(f"no static characterization of {stand_in} for {gpu.arch}")
                blocks_per_sm, registers = table[(stand_in, gpu.arch)]
                model_v = v if v.compiled else get_variant("base")
                p = v.resolve_params(params.get(name), gpu=gpu, row_bytes=workload.row_bytes)
                geo = _geometry(model_v, workload, prof.bags)
                rs = sectors_per_row(workload.row_bytes) * SECTOR
                k = min(p.get("K", 0), prof.unique_rows) if v.l2 != "none" else 0
                k_res = min(k, int(gpu.max_persisting_l2_bytes // rs))
                points.append(_Point(
                    variant=name, dataset=ds, gpu=gpu, family=geo["family"], l2=v.l2,
                    prefetch=p.get("P", 0),
                    rows_per_step=geo["rows_per_step"], blocks_per_sm=blocks_per_sm, registers=registers,
                    warps_per_block=geo["warps_per_block"], blocks=geo["blocks"], rounds=geo["rounds"],
                    lookups=prof.lookups_per_launch, bags=prof.bags, per_bag=per_bag, row_bytes=workload.row_bytes,
                    row_sector_bytes=rs, chunks=geo["chunks"], group=geo["group"], bytes_per_load=geo["bytes_per_load"],
                    pinned_rows=k_res, prepass_rows=k if v.l2 == "prefetch" else 0, profile=prof, mode=mode,
                    l1=prof.l1_distances(gpu.sm_count, geo["block_num"], geo["block_den"]),
                    note="" if v.compiled else "PyTorch's kernel, modelled as base (same algorithm and launch)"))
    return points


