"""Pipeline, code facts: what the model reads of each kernel (static resources and the hot loop
from the SASS), compiled here; the only caller of the static characterization besides `build`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import pandas as pd

from characterize.analysis.model.kernels import peer_dtype
from characterize.config import ExperimentConfig, WorkloadConfig
from characterize.errors import (
    ToolchainNotFound,
    UnsupportedShape,
)
from characterize.hardware.specs import normalize_arch
from characterize.kernels.build import reported_builds
from characterize.kernels.registry import (
    get_variant,
)
from characterize.kernels.static import analyze_variants, prebuild, static_characterization
from characterize.kernels.user import sass_rows
from characterize.progress import Progress, Reporter, as_reporter


@dataclass(frozen=True)
class CodeFacts:
    """What the compiled code says about the variants at one D, the model's inputs:
    ptxas resources and theoretical occupancy (static) and each kernel's hot loop
    read from its SASS (sass)."""

    D: int
    static: pd.DataFrame
    sass: pd.DataFrame

    def covers(self, variants: Sequence[str], archs: Sequence[str], D: int, dtype: str = "fp32") -> bool:
        """Whether these facts hold every compiled variant's rows on `archs` for `dtype`
        (rows written without a dtype are fp32 builds)."""
        if D != self.D:
            return False
        need = {(v, normalize_arch(a)) for v in variants if get_variant(v).compiled for a in archs}
        for df in (self.static, self.sass):
            if df.empty or not {"variant", "arch"} <= set(df.columns):
                return False
            dt = df["dtype"].astype(object).fillna("fp32") if "dtype" in df.columns else pd.Series("fp32", df.index)
            mine = df[dt == dtype]
            if not need <= set(zip(mine["variant"], mine["arch"])):
                return False
        return True


def sass_frame(variants: Sequence[str], archs: Sequence[str], D: int,
               params: Mapping[str, Any] | None = None, dtype: str = "fp32") -> pd.DataFrame:
    """The SASS hot-loop analysis as a frame (compiles; disassembles with cuobjdump).
    Per-width load counts and prefetch kinds are JSON objects in their cells."""
    rows = [r.to_dict() for r in analyze_variants(list(variants), list(archs), D=D, params=dict(params or {}),
                                                  dtype=dtype)]
    df = pd.DataFrame(rows)
    for col in ("load_bits", "prefetches", "bag_latencies", "bag_instructions"):
        if col in df.columns:
            df[col] = [json.dumps({str(k): v for k, v in d.items()}, sort_keys=True) for d in df[col]]
    return df


def code_facts(variants: Sequence[str], archs: Sequence[str], D: int, params: Mapping[str, Any] | None = None,
               sweep_caps: Sequence[int] = (), dtype: str = "fp32",
               progress: Reporter | Progress | None = None, also_dtypes: Sequence[str] = (),
               label: str = "", hot_loops: bool = True) -> CodeFacts:
    """Compile the variants (builds are cached), read ptxas's resources and the SASS
    (not with `hot_loops` False, for a caller that has them: sass is then empty);
    `progress` sees each build, compiled or reused. The builds of `also_dtypes` (the
    experiment's other precisions, characterized later) are compiled in the same parallel
    batches, so nvcc runs on every core from the start. `label` starts each progress
    title (the dtype, where a step characterizes several)."""
    rep = as_reporter(progress)
    try:
        with reported_builds(rep, f"{label}compile for {', '.join(archs)}"):
            prebuild(variants, archs, [dtype, *(d for d in also_dtypes if d != dtype)], sweep_caps, dict(params or {}),
                     D=D)
            rows = static_characterization(list(variants), list(archs), sweep_caps, D=D,
                                           params=dict(params or {}), dtype=dtype)
        sass = pd.DataFrame()
        if hot_loops:
            with rep.task(f"{label}SASS hot loops (cuobjdump)") as task:
                sass = sass_frame(variants, archs, D, params, dtype)
                task.finish(f"{len(sass)} kernel(s) analyzed")
    except ToolchainNotFound as e:
        raise type(e)(f"{e}; the model needs each variant's registers, occupancy and hot loop, which "
                                "come from the compiled code (or pass a run's static.csv and sass.csv)") from None
    return CodeFacts(D, pd.DataFrame([r.to_dict() for r in rows]), sass)


def user_sass(exp: ExperimentConfig, archs: Sequence[str], progress: Reporter) -> dict[str, dict[str, dict]]:
    """The SASS rows of the experiment's kernels of one's own, per architecture (each
    built from its source, or read from its binary)."""
    out: dict[str, dict[str, dict]] = {}
    for name in exp.variants:
        v = get_variant(name)
        if v.peer != "user":
            continue
        with progress.task(f"your kernel {name}: SASS ({', '.join(archs)})") as task:
            out[name] = sass_rows(v.user, archs, exp.workload.dtype)
            nest = [r.get("nest_rows_in_flight") for r in out[name].values()]
            task.finish(f"{', '.join(f'{a}: {n} rows in flight' for a, n in zip(out[name], nest))}")
    return out


def reads(variant: str, wl: WorkloadConfig) -> bool:
    """Whether a variant reads tables of the workload's dtype at its D (a peer: the
    dtype its users run for it, FBGEMM's int8 rows for an int8 table)."""
    v = get_variant(variant)
    try:
        v.check_shape(wl.D, peer_dtype(v.peer, wl.dtype) if v.peer else wl.dtype)
    except UnsupportedShape:
        return False
    return True

