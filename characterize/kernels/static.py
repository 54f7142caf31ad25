"""Kernels stage, static characterization: what each variant costs in registers and what occupancy it can reach,
for any architecture, without a GPU.

Every compiled variant is built for each requested architecture (and, for the
register sweep, with each requested -maxrregcount); ptxas's resource report feeds the
occupancy calculator. The default register cap of the capped variants is chosen here
too: the highest occupancy step the calculator says a cap can reach whose spills
stay light.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any, Iterable

from characterize.config import DEFAULT_ARCHS, dtype_spec
from characterize.errors import BuildError, ConfigError, ToolchainNotFound, UnsupportedShape
from characterize.hardware.specs import ARCHS, normalize_arch
from characterize.kernels.build import BuildResult, BuildSpec, build_many
from characterize.kernels.occupancy import register_steps, theoretical_occupancy
from characterize.kernels.registry import FAMILY_DTYPES, VARIANTS, Variant, built_in, check_caps, get_variant
from characterize.kernels.sass import (
    MEMORY_LATENCY,
    LoopRow,
    analyze_kernel,
    find_cuobjdump,
    hot_loop,
    kernel_code,
    kernels_in,
)

#: spill traffic (stores + loads, bytes per thread) we still call light. On sm_80 the
#: base kernel (54 registers) spills 44 B at a cap of 48 (5 blocks/SM), 224 B at the
#: paper's 42 (also 5 blocks) and 288 B at 40 (6 blocks): 128 B keeps the first.
LIGHT_SPILL_BYTES = 128
BASE_KERNEL = "chz_base_kernel<false>"


@dataclass(frozen=True)
class StaticRow:
    """One kernel of one variant compiled for one architecture, cap and dtype."""

    variant: str
    arch: str
    maxrregcount: int | None   # the cap given to nvcc (None: uncapped)
    kernel: str                # kernel name as ptxas reports it
    role: str                  # lookup | prepass
    registers: int
    spill_stores: int
    spill_loads: int
    stack_frame: int
    shared_mem: int
    block_size: int
    blocks_per_sm: int
    theoretical_occupancy_pct: float
    limiter: str
    sweep: bool                # a register-sweep row rather than the variant's configuration
    compiler: str
    dtype: str = "fp32"        # table element type of the build

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _row(variant: Variant, arch: str, cap: int | None, kernel: str, role: str, block: int,
         result, sweep: bool) -> StaticRow:
    res = result.resources(kernel)
    occ = theoretical_occupancy(ARCHS[arch], block, res.registers, res.shared_mem)
    return StaticRow(variant.name, arch, cap, kernel, role, res.registers, res.spill_stores, res.spill_loads,
                     res.stack_frame, res.shared_mem, block, occ.blocks_per_sm, occ.occupancy_pct, occ.limiter,
                     sweep, result.compiler, result.spec.dtype)


def _loop_spills(result: BuildResult, kernel: str) -> int | None:
    """LDL/STL on the hot loop's path, or None when cuobjdump is not installed."""
    try:
        find_cuobjdump()
    except ToolchainNotFound:
        return None
    loop = hot_loop(kernel_code(result, kernel))
    return sum(1 for i in loop.path if i.opcode in ("LDL", "STL")) if loop is not None else None


def _device(spec: BuildSpec) -> BuildSpec:
    """The build static characterization and SASS analysis read: the device code alone
    (the ptxas report and the SASS are those of the library; nvcc skips the host side)."""
    return dataclasses.replace(spec, output="cubin")


def _cap_candidates(arch: str, uncapped_registers: int) -> list[int]:
    """The caps worth trying for a kernel of `uncapped_registers` on `arch`: each that puts
    more 256-thread blocks on an SM than the kernel uncapped, from the fewest blocks up."""
    spec = ARCHS[arch]
    block = VARIANTS["base"].block_size
    start = theoretical_occupancy(spec, block, uncapped_registers).blocks_per_sm
    return [regs for regs, blocks in register_steps(spec, block) if blocks > start and regs >= spec.min_maxrregcount]


def prebuild(variants: Iterable[str], archs: Iterable[str], dtypes: Iterable[str], sweep_caps: Iterable[int] = (),
             params: dict[str, dict[str, Any]] | None = None, D: int = 128) -> int:
    """Build, on every core at once, each library the static characterization and the SASS
    analysis of `variants` will read for every architecture and dtype: first every uncapped
    build, the caps given in `params` and the register sweep (`sweep_caps`, for the first
    dtype), then every register cap the default-cap choice will try, and disassemble those.
    Without it the builds come one or two at a time, as each variant asks for them.
    Returns how many builds were asked for (cached ones cost nothing)."""
    archs = [normalize_arch(a) for a in archs]
    dtypes = [d for d in dict.fromkeys(dtypes) if d in FAMILY_DTYPES]   # the family's source (fp8: tbe's alone)
    chosen = [get_variant(n) for n in variants]
    params = params or {}
    first = {_device(BuildSpec("cuda", a, None, dt)) for a in archs for dt in dtypes}
    first |= {_device(BuildSpec("cuda", a, int(c), dtypes[0])) for a in archs for c in sweep_caps} if dtypes else set()
    for v in chosen:
        if v.compiled and v.capped and "maxrregcount" in (params.get(v.name) or {}):
            first |= {_device(v.build_spec("cuda", a, v.resolve_params(params.get(v.name)), dt))
                      for a in archs for dt in dtypes}
    built = build_many(first)
    second: set[BuildSpec] = set()
    for v in chosen:
        if not (v.compiled and v.capped) or "maxrregcount" in (params.get(v.name) or {}):
            continue
        for a in archs:
            for dt in dtypes:
                try:
                    v.check_shape(D, dt)
                except UnsupportedShape:
                    continue
                kernel = v.kernel_name(v.resolve_params(params.get(v.name)), 128, dt)
                regs = built[_device(BuildSpec("cuda", a, None, dt))].resources(kernel).registers
                caps = _cap_candidates(a, regs) or [regs]
                second |= {_device(BuildSpec("cuda", a, c, dt)) for c in caps}
    results = build_many(second - set(built))
    try:
        find_cuobjdump()
    except ToolchainNotFound:
        return len(first | second)
    libraries = [r.library for r in results.values()]
    if libraries:   # the cap choice reads each candidate's SASS (cuobjdump: ~1 s each)
        with ThreadPoolExecutor(max(1, min(len(libraries), os.cpu_count() or 1))) as pool:
            list(pool.map(kernels_in, libraries))
    return len(first | second)


@lru_cache(maxsize=None)
def default_register_cap(arch: str, kernel: str = BASE_KERNEL, dtype: str = "fp32") -> int:
    """The register cap of a capped variant's lookup `kernel` on `arch`: among the caps
    that put more 256-thread blocks on an SM than the kernel uncapped, the one reaching
    the highest occupancy whose spills are light (LIGHT_SPILL_BYTES) and, where the
    SASS can be read, stay out of the hot loop; the uncapped register count when no
    cap helps. Chosen per kernel and dtype: a cap light for base can spill inside rpf's loop,
    and int8's dequantization needs registers fp32 does not."""
    arch = normalize_arch(arch)
    spec = _device(BuildSpec("cuda", arch, None, dtype))
    uncapped = build_many([spec])[spec].resources(kernel)
    candidates = _cap_candidates(arch, uncapped.registers)
    if not candidates:
        return uncapped.registers
    built = build_many([_device(BuildSpec("cuda", arch, c, dtype)) for c in candidates])
    best = uncapped.registers
    for cap in candidates:  # fewest blocks first: later entries reach higher occupancy
        result = built[_device(BuildSpec("cuda", arch, cap, dtype))]
        res = result.resources(kernel)
        if res.spill_stores + res.spill_loads <= LIGHT_SPILL_BYTES and not _loop_spills(result, kernel):
            best = cap
    return best


def resolve_params(v: Variant, given: dict[str, Any] | None, arch: str | None, gpu: Any = None,
                   row_bytes: int | None = None, dtype: str = "fp32") -> dict[str, int]:
    """`Variant.resolve_params` with the register cap filled in for `arch` (compiling
    the family to choose it for this variant's kernel) when the variant is capped and
    the caller gave none."""
    cap = None
    if v.capped and arch is not None and "maxrregcount" not in (given or {}):
        kernel = v.kernel_name(v.resolve_params(given), 128, dtype)   # chunk-family kernels do not depend on D
        cap = default_register_cap(arch, kernel, dtype)
    return v.resolve_params(given, cap=cap, gpu=gpu, row_bytes=row_bytes)


def static_characterization(variants: Iterable[str] | None = None, archs: Iterable[str] = DEFAULT_ARCHS,
                            sweep_caps: Iterable[int] = (), D: int = 128,
                            params: dict[str, dict[str, Any]] | None = None, dtype: str = "fp32") -> list[StaticRow]:
    """Rows for every compiled variant x architecture as configured (capped variants at
    their cap), plus one row per sweep cap for each variant's lookup kernel, for tables of `dtype`."""
    caps = sorted(set(check_caps(sweep_caps)))
    plans = plan_variants(variants, archs, D, params, dtype)
    sweeps = [(p, _device(BuildSpec("cuda", p.arch, c, dtype))) for p in plans
              if p.role == "lookup" and p.variant.honors_cap
              for c in caps]
    results = build_many({p.spec for p in plans} | {spec for _, spec in sweeps})
    rows = []
    for p in plans:
        block = 256 if p.role == "prepass" else p.variant.block_size
        rows.append(_row(p.variant, p.arch, p.spec.maxrregcount, p.kernel, p.role, block, results[p.spec], False))
    for p, spec in sweeps:
        rows.append(_row(p.variant, p.arch, spec.maxrregcount, p.kernel, "lookup", p.variant.block_size,
                         results[spec], True))
    return rows


@dataclass(frozen=True)
class Plan:
    """One kernel to analyze: a variant's lookup kernel or pre-pass in one build."""

    variant: Variant
    arch: str
    spec: BuildSpec
    kernel: str     # short name, e.g. chz_rpf_kernel<2>
    role: str       # lookup | prepass


def plan_variants(variants: Iterable[str] | None = None, archs: Iterable[str] = DEFAULT_ARCHS, D: int = 128,
                  params: dict[str, dict[str, Any]] | None = None, dtype: str = "fp32") -> list[Plan]:
    """What `analyze_variants` looks at, built as `static.static_characterization`
    builds it (capped variants at their default or given cap), from the `dtype` library."""
    if isinstance(D, bool) or not isinstance(D, numbers.Integral) or D < 1:
        raise ConfigError(f"D must be a positive integer, got {D!r}")
    dtype_spec(dtype)   # a dtype no kernel reads is refused by name, not built as nothing
    # by default every built-in variant that reads `dtype` (fp8: tbe alone); one named is held to it
    names = list(variants) if variants is not None else [n for n in built_in() if dtype in get_variant(n).dtypes]
    chosen: list[Variant] = [get_variant(n) for n in names]
    params = params or {}
    plans = []
    for arch in [normalize_arch(a) for a in archs]:
        for v in chosen:
            if not v.compiled:
                continue
            v.check_shape(D, dtype)
            p = resolve_params(v, params.get(v.name), arch, dtype=dtype)
            spec = _device(v.build_spec("cuda", arch, p, dtype))
            plans.append(Plan(v, arch, spec, v.kernel_name(p, D, dtype), "lookup"))
            if v.l2 == "prefetch":
                plans.append(Plan(v, arch, spec, "chz_l2_pin_kernel", "prepass"))
    return plans


def analyze_variants(variants: Iterable[str] | None = None, archs: Iterable[str] = DEFAULT_ARCHS, D: int = 128,
                     params: dict[str, dict[str, Any]] | None = None, *,
                     memory_latency: int = MEMORY_LATENCY, dtype: str = "fp32") -> list[LoopRow]:
    """The hot loop of every compiled variant's lookup kernel (and L2 pre-pass) per
    architecture, one row each, in `plan_variants` order, for tables of `dtype`."""
    plans = plan_variants(variants, archs, D, params, dtype)
    results = build_many({p.spec for p in plans})
    libraries = [r.library for r in results.values()]
    with ThreadPoolExecutor(max(1, min(len(libraries), os.cpu_count() or 1))) as pool:  # cuobjdump: ~1 s each
        list(pool.map(kernels_in, libraries))
    rows = []
    for p in plans:
        result = results[p.spec]
        row = analyze_kernel(kernel_code(result, p.kernel), variant=p.variant.name, arch=p.arch, role=p.role,
                             maxrregcount=p.spec.maxrregcount, registers=result.resources(p.kernel).registers,
                             memory_latency=memory_latency, dtype=dtype)
        if row is None:
            raise BuildError(f"no loop gathering rows found in {p.kernel} ({p.spec.label()}); the kernel changed "
                             "shape or the SASS parser needs a look")
        rows.append(row)
    return rows
