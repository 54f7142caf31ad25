"""Static stage: what each variant costs in registers and what occupancy it can reach,
for any architecture, without a GPU.

Every compiled variant is built for each requested architecture (and, for the
register sweep, with each requested -maxrregcount); ptxas's resource report feeds the
occupancy calculator. The default register cap of the capped variants is chosen here
too: the highest occupancy step the calculator says a cap can reach whose spills
stay light.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any, Iterable

from characterize.config import DEFAULT_ARCHS
from characterize.hardware import ARCHS, normalize_arch
from characterize.kernels.build import BuildSpec, build_many
from characterize.kernels.occupancy import register_steps, theoretical_occupancy
from characterize.kernels.registry import VARIANTS, Variant, get_variant

#: spill traffic (stores + loads, bytes per thread) we still call light. On sm_80 the
#: base kernel (54 registers) spills 44 B at a cap of 48 (5 blocks/SM), 224 B at the
#: paper's 42 (also 5 blocks) and 288 B at 40 (6 blocks): 128 B keeps the first.
LIGHT_SPILL_BYTES = 128
BASE_KERNEL = "chz_base_kernel<false>"


@dataclass(frozen=True)
class StaticRow:
    """One kernel of one variant compiled for one architecture and cap."""

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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _row(variant: Variant, arch: str, cap: int | None, kernel: str, role: str, block: int,
         result, sweep: bool) -> StaticRow:
    res = result.resources(kernel)
    occ = theoretical_occupancy(ARCHS[arch], block, res.registers, res.shared_mem)
    return StaticRow(variant.name, arch, cap, kernel, role, res.registers, res.spill_stores, res.spill_loads,
                     res.stack_frame, res.shared_mem, block, occ.blocks_per_sm, occ.occupancy_pct, occ.limiter,
                     sweep, result.compiler)


@lru_cache(maxsize=None)
def default_register_cap(arch: str) -> int:
    """The register cap for optmt/rpf/combined on `arch`: among the caps that put more
    256-thread blocks on an SM than the uncapped base kernel, the one reaching the
    highest occupancy with light spilling (LIGHT_SPILL_BYTES); the uncapped register
    count when no cap helps."""
    arch = normalize_arch(arch)
    spec = ARCHS[arch]
    block = VARIANTS["base"].block_size
    uncapped = build_many([BuildSpec("cuda", arch)])[BuildSpec("cuda", arch)].resources(BASE_KERNEL)
    start = theoretical_occupancy(spec, block, uncapped.registers).blocks_per_sm
    candidates = [regs for regs, blocks in register_steps(spec, block)
                  if blocks > start and regs >= spec.min_maxrregcount]
    if not candidates:
        return uncapped.registers
    built = build_many([BuildSpec("cuda", arch, c) for c in candidates])
    best = uncapped.registers
    for cap in candidates:  # fewest blocks first: later entries reach higher occupancy
        res = built[BuildSpec("cuda", arch, cap)].resources(BASE_KERNEL)
        if res.spill_stores + res.spill_loads <= LIGHT_SPILL_BYTES:
            best = cap
    return best


def resolve_params(v: Variant, given: dict[str, Any] | None, arch: str | None, gpu: Any = None,
                   row_bytes: int | None = None) -> dict[str, int]:
    """`Variant.resolve_params` with the register cap filled in for `arch` (compiling
    the family to choose it) when the variant is capped and the caller gave none."""
    cap = None
    if v.capped and arch is not None and "maxrregcount" not in (given or {}):
        cap = default_register_cap(arch)
    return v.resolve_params(given, cap=cap, gpu=gpu, row_bytes=row_bytes)


def static_characterization(variants: Iterable[str] | None = None, archs: Iterable[str] = DEFAULT_ARCHS,
                            sweep_caps: Iterable[int] = (), D: int = 128,
                            params: dict[str, dict[str, Any]] | None = None) -> list[StaticRow]:
    """Rows for every compiled variant x architecture as configured (capped variants at
    their cap), plus one row per sweep cap for each variant's lookup kernel."""
    names = list(variants) if variants is not None else [n for n, v in VARIANTS.items() if not v.test_only]
    chosen = [get_variant(n) for n in names]
    compiled = [v for v in chosen if v.compiled]
    archs = [normalize_arch(a) for a in archs]
    caps = sorted(set(int(c) for c in sweep_caps))
    params = params or {}
    plans = []  # (variant, arch, cap, kernel, role, sweep)
    for arch in archs:
        for v in compiled:
            p = resolve_params(v, params.get(v.name), arch)
            cap = p.get("maxrregcount") if v.capped else None
            kernel = v.kernel_name(p, D)
            plans.append((v, arch, cap, kernel, "lookup", False))
            if v.l2 == "prefetch":
                plans.append((v, arch, cap, "chz_l2_pin_kernel", "prepass", False))
            for c in caps if v.honors_cap else ():
                plans.append((v, arch, c, kernel, "lookup", True))
    results = build_many({BuildSpec("cuda", a, c) for _, a, c, *_ in plans})
    rows = []
    for v, arch, cap, kernel, role, sweep in plans:
        block = 256 if role == "prepass" else v.block_size
        rows.append(_row(v, arch, cap, kernel, role, block, results[BuildSpec("cuda", arch, cap)], sweep))
    return rows
