"""Kernels stage, registry: every variant of the family once, with its description, parameters,
compile flags and the kernel name ptxas reports it under.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from characterize.config import DTYPES, dtype_spec
from characterize.errors import (
    ConfigError,
    UnsupportedShape,
    did_you_mean,
)
from characterize.kernels.build import BuildSpec


def vector_elems(dtype: str) -> int:
    """Elements one 16-byte load of the warp kernel covers (4 fp32, 8 fp16/bf16, 16 int8)."""
    return 16 // dtype_spec(dtype).element_bytes


# ------------------------------------------------------------------- registry
@dataclass(frozen=True)
class Param:
    """A tunable of a variant, with its valid range."""

    name: str
    help: str
    default: int | None = None   # None: chosen per architecture / GPU at run time
    low: int = 1
    high: int = 2**31 - 1


@dataclass(frozen=True)
class Variant:
    """One member of the kernel family."""

    name: str
    description: str
    entry: str | None = None        # exported C entry point; None for torch
    kernel: str | None = None       # ptxas name of the lookup kernel ({P}, {V}, {U} filled in)
    capped: bool = False            # compiled with -maxrregcount (param maxrregcount)
    l2: str = "none"                # none | prefetch (pre-pass) | window (access policy)
    block: tuple[int, int] = (32, 8)
    grid: int = 1024                # blocks; 0 lets the launcher size the grid
    params: tuple[Param, ...] = ()
    dim_multiple: int = 1           # in 16-byte vectors when vector_loads, else elements
    max_dim: int | None = None
    vector_loads: bool = False      # loads rows as 16-byte vectors: D must fill whole vectors of the dtype
    dtypes: tuple[str, ...] = tuple(DTYPES)  # table element types the variant reads
    per_sample_weights: bool = False
    honors_cap: bool = True         # False where __launch_bounds__ overrides -maxrregcount
    test_only: bool = False
    host: str = "none"              # none: table in GPU memory | cache: host table + GPU row cache | uvm: managed

    @property
    def block_size(self) -> int:
        return self.block[0] * self.block[1]

    @property
    def compiled(self) -> bool:
        return self.entry is not None

    def check_dtype(self, dtype: str) -> None:
        """Refuse table element types this variant cannot read, by name."""
        dtype_spec(dtype)
        if dtype not in self.dtypes:
            raise UnsupportedShape(f"variant {self.name} cannot read {dtype} tables; it reads "
                                   f"{', '.join(self.dtypes)}")

    def check_shape(self, D: int, dtype: str = "fp32") -> None:
        """Refuse shapes this variant would compute wrongly."""
        self.check_dtype(dtype)
        qparams = DTYPES[dtype].qparam_bytes
        if qparams and D % (qparams // 2):
            raise UnsupportedShape(f"variant {self.name} needs D to be a multiple of {qparams // 2} for "
                                   f"{dtype} tables (the scale and bias after the values must be aligned); D={D}")
        multiple = self.dim_multiple * (vector_elems(dtype) if self.vector_loads else 1)
        if D % multiple:
            raise UnsupportedShape(f"variant {self.name} needs D to be a multiple of {multiple} for {dtype} "
                                   f"(it loads rows as 16-byte vectors); D={D}. Use base or rpf for this D.")
        if self.max_dim is not None and D > self.max_dim:
            raise UnsupportedShape(f"variant {self.name} supports D <= {self.max_dim}; D={D}")

    def resolve_params(self, given: dict[str, Any] | None, *, cap: int | None = None, gpu: Any = None,
                       row_bytes: int | None = None, rows: int | None = None) -> dict[str, int]:
        """Validate user parameters and fill defaults, without compiling anything: `cap`
        is the register cap to use when none is given (`static.default_register_cap`
        computes one); with `gpu` and `row_bytes`, the hot-row count K defaults to the
        rows fitting the persisting-L2 budget; with `rows` (E), the cache's C defaults to
        DEFAULT_CACHE_RATIO of them."""
        given = dict(given or {})
        known = {p.name: p for p in self.params}
        unknown = set(given) - set(known)
        if unknown:
            raise ConfigError(f"variant {self.name} has no parameter(s) {', '.join(sorted(unknown))}; "
                              f"it takes: {', '.join(known) or 'none'}")
        out: dict[str, int] = {}
        for p in self.params:
            value = given.get(p.name, p.default)
            if value is None:
                value = self._default(p.name, cap, gpu, row_bytes, rows)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not p.low <= value <= p.high:
                raise ConfigError(f"variant {self.name}: {p.name} must be an integer in {p.low}..{p.high}, got {value!r}")
            out[p.name] = int(value)
        return out

    def _default(self, name: str, cap: int | None, gpu: Any, row_bytes: int | None, rows: int | None) -> int | None:
        if name == "maxrregcount":
            return cap
        if name == "K" and gpu is not None and row_bytes:
            return gpu.rows_in_persisting_l2(row_bytes)
        if name == "C" and rows:
            return default_cache_rows(rows)
        return None

    def build_spec(self, target: str, arch: str | None, params: dict[str, int], dtype: str = "fp32") -> BuildSpec:
        """The library build this variant runs from: one per target, architecture, cap and dtype."""
        cap = params.get("maxrregcount") if self.capped else None
        return BuildSpec(target, arch, cap, dtype)

    def kernel_name(self, params: dict[str, int], D: int, dtype: str = "fp32") -> str | None:
        """The lookup kernel's name in ptxas output for these parameters, D and dtype (the
        dtype's library holds it; the dtype picks the warp kernel's vectors per lane)."""
        if self.kernel is None:
            return None
        group = warp_group(D, dtype)
        per_lane = -(-(D // vector_elems(dtype)) // group)
        V = next((v for v in (1, 2, 4, 8) if per_lane <= v), 8)
        return self.kernel.format(P=params.get("P", 2), V=V, U=8 // V)


_CAP = Param("maxrregcount", "register cap passed to nvcc -maxrregcount (default: chosen per architecture and "
                             "kernel; ptxas raises caps below 24 to 24; 255 leaves the kernel uncapped)",
             None, 24, 255)
_P = Param("P", "prefetch distance: row loads kept in flight per thread (at a register cap of 48, P >= 5 "
                "spills inside the loop: raise maxrregcount with it; `characterize sass` shows the spills)", 2, 1, 8)
_K = Param("K", "hot rows kept in L2 (default: the GPU's persisting-L2 budget / row bytes)", None, 1)
_C = Param("C", "rows of the GPU cache of a host-resident table (default: 1.5% of E, the share at which the "
                "frequency-aware cache of Fang et al. 2022 reports a decent speed)", None, 1)

#: the cache's default size as a share of E: 1.5% of the embedding parameters on the GPU (Fang et al. 2022)
DEFAULT_CACHE_RATIO = 0.015


def default_cache_rows(E: int, ratio: float = DEFAULT_CACHE_RATIO) -> int:
    """C for a cache holding `ratio` of a table's E rows (at least one row, at most E)."""
    return int(min(E, max(1, round(ratio * E))))

VARIANTS: dict[str, Variant] = {}


def register(v: Variant) -> Variant:
    if v.name in VARIANTS:
        raise ValueError(f"variant {v.name} registered twice")
    VARIANTS[v.name] = v
    return v


register(Variant("torch", "torch.nn.functional.embedding_bag: PyTorch's own kernel, what users run today",
                 per_sample_weights=True))
register(Variant("base", "PyTorch-style kernel: thread per (bag, feature), 32x8 blocks, grid 1024, scalar loads",
                 entry="chz_forward_base", kernel="chz_base_kernel<false>", per_sample_weights=True))
register(Variant("optmt", "base compiled with a register cap for more resident warps (occupancy)",
                 entry="chz_forward_base", kernel="chz_base_kernel<false>", capped=True, params=(_CAP,),
                 per_sample_weights=True))
register(Variant("rpf", "base with register prefetching: groups of P rows loaded together, the next group's "
                        "indices loaded while they are in flight (P rows in flight per thread), capped",
                 entry="chz_forward_rpf", kernel="chz_rpf_kernel<{P}>", capped=True, params=(_P, _CAP)))
register(Variant("l2p", "base after a pre-pass pinning the K hottest rows in L2 (prefetch evict_last), with the "
                        "register cap as the paper measured it (L2P+OptMT; maxrregcount=255 for uncapped)",
                 entry="chz_forward_base", kernel="chz_base_kernel<false>", capped=True, l2="prefetch",
                 params=(_K, _CAP), per_sample_weights=True))
register(Variant("l2w", "base on a frequency-sorted table with a persisting-L2 access-policy window on the hot rows",
                 entry="chz_forward_base", kernel="chz_base_kernel<false>", l2="window", params=(_K,),
                 per_sample_weights=True))
register(Variant("combined", "rpf + l2p with the register cap",
                 entry="chz_forward_rpf", kernel="chz_rpf_kernel<{P}>", capped=True, l2="prefetch",
                 params=(_P, _K, _CAP)))
register(Variant("warp", "ours: sub-warp per bag, shuffled indices, 8 independent 16-byte row loads in flight per "
                         "lane (8 whole rows per warp at D=128)",
                 entry="chz_forward_warp", kernel="chz_warp_kernel<{V}, {U}>", block=(256, 1), grid=0,
                 vector_loads=True, max_dim=1024, honors_cap=False))
register(Variant("cache", "host-resident table in pinned memory with a GPU cache of C rows warmed from the trace's "
                          "frequencies: per batch unique ids, hits and misses, misses copied from the host with "
                          "frequency-aware eviction, then base's kernel on cache slots",
                 entry="chz_forward_base", kernel="chz_base_kernel<false>", params=(_C,), per_sample_weights=True,
                 host="cache"))
register(Variant("uvm", "host-resident table in CUDA managed memory: base's kernel reads it and the driver migrates "
                        "the pages it touches (on the CPU backend it is just the table)",
                 entry="chz_forward_base", kernel="chz_base_kernel<false>", per_sample_weights=True, host="uvm"))
register(Variant("wrong", "base with an off-by-one dropping each bag's last index (test-only: the checker must fail)",
                 entry="chz_forward_wrong", kernel="chz_base_kernel<true>", test_only=True))

#: every public variant whose table lives in GPU memory, in registration order: the kernel family an
#: experiment runs by default, and the order of every table and figure
VARIANT_ORDER: tuple[str, ...] = tuple(n for n, v in VARIANTS.items() if not v.test_only and v.host == "none")
#: variants of host-resident tables (GPU row cache, managed memory): named by an experiment, or chosen
#: for it when its tables do not fit the GPU; each runs base's lookup kernel
HOST_VARIANTS: tuple[str, ...] = tuple(n for n, v in VARIANTS.items() if not v.test_only and v.host != "none")


def get_variant(name: str) -> Variant:
    try:
        return VARIANTS[name]
    except KeyError:
        public = ", ".join(v for v in VARIANTS if not VARIANTS[v].test_only)
        raise ConfigError(f"unknown variant {name!r}; known: {public}." + did_you_mean(name, list(VARIANTS))) from None


def warp_group(D: int, dtype: str = "fp32") -> int:
    """Lanes per bag of the warp variant: the power of two covering the row's 16-byte
    vectors (D/4 fp32, D/8 fp16/bf16, D/16 int8), <= 32 (mirrors chz_warp_group in the
    CUDA source; a test keeps them in step)."""
    g = 1
    while g < 32 and g < D // vector_elems(dtype):
        g *= 2
    return g

