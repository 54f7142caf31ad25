"""Kernels stage, registry: every variant of the family once, with its description, parameters,
compile flags and the kernel name ptxas reports it under.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from characterize.config import DTYPES, UserKernel, dtype_spec
from characterize.errors import (
    ConfigError,
    UnsupportedShape,
    did_you_mean,
)
from characterize.kernels.build import SOURCE, TBE_SOURCE, BuildSpec


def vector_elems(dtype: str) -> int:
    """Elements one 16-byte load of the warp kernel covers (4 fp32, 8 fp16/bf16, 16 int8)."""
    return 16 // dtype_spec(dtype).element_bytes


#: elements one vector load of the tbe kernel covers, every dtype (16-byte fp32, 8-byte fp16/bf16 and
#: 4-byte int8 vectors: the same 4 fp32 accumulators per vector, so narrow dtypes fit fewer registers)
TBE_VECTOR_ELEMS = 4
#: the dtypes every kernel of the family (and PyTorch's) reads; fp8 rows are tbe's alone
FAMILY_DTYPES = tuple(d for d in DTYPES if d != "fp8")
#: tables one tbe launch covers (its descriptors travel as kernel parameters; more tables: one launch per 64)
TBE_MAX_TABLES = 64
#: `Variant.tables_per_launch` of a variant whose one launch covers every table of the batch
ALL_TABLES = 0


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
    dtypes: tuple[str, ...] = FAMILY_DTYPES  # table element types the variant reads
    per_sample_weights: bool = False
    honors_cap: bool = True         # False where __launch_bounds__ overrides -maxrregcount
    test_only: bool = False
    host: str = "none"              # none: table in GPU memory | cache: host table + GPU row cache | uvm: managed
    peer: str | None = None         # torch | fbgemm: a kernel we did not write, modelled from its own SASS (peers)
    offset2bag: bool = True         # also writes offset2bag and bag sizes, as torch's operator does
    persistent: bool = False        # a grid of SMs x resident blocks, whatever B
    tables_per_launch: int = 1      # tables one launch covers: 1, or ALL_TABLES (one launch per batch)
    source: str = SOURCE            # the CUDA source its library is built from (kernels.build.SOURCES)
    user: Any = None                # a user's kernel (peer "user"): its config.UserKernel

    @property
    def block_size(self) -> int:
        return self.block[0] * self.block[1]

    @property
    def batched(self) -> bool:
        """Whether one launch covers every table of a batch (timed per batch, reported per table as batch / T)."""
        return self.tables_per_launch == ALL_TABLES

    @property
    def compiled(self) -> bool:
        """One of ours, built from the toolkit's sources (not a peer's, not a user's)."""
        return self.entry is not None and self.peer is None

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
        elems = (TBE_VECTOR_ELEMS if self.batched else vector_elems(dtype)) if self.vector_loads else 1
        multiple = self.dim_multiple * elems
        if D % multiple:
            why = "it loads rows as 16-byte vectors" if self.vector_loads else "its rows are read in 4-element vectors"
            raise UnsupportedShape(f"variant {self.name} needs D to be a multiple of {multiple} for {dtype} "
                                   f"({why}); D={D}. Use base or rpf for this D.")
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
        return BuildSpec(target, arch, cap, dtype, source=self.source)

    def kernel_name(self, params: dict[str, int], D: int, dtype: str = "fp32") -> str | None:
        """The lookup kernel's name in ptxas output for these parameters, D and dtype (the
        dtype's library holds it; the dtype picks the warp kernel's vectors per lane)."""
        if self.kernel is None:
            return None
        if self.batched:
            V = tbe_vectors_per_lane(D)
            index = "long" if params.get("index_bits", 32) == 64 else "int"
            return self.kernel.format(V=V, I=index, R="unsigned int", S="true" if params.get("short") else "false")
        group = warp_group(D, dtype)
        per_lane = -(-(D // vector_elems(dtype)) // group)
        V = next((v for v in (1, 2, 4, 8) if per_lane <= v), 8)
        return self.kernel.format(P=params.get("P", 2), V=V, U=8 // V)


_CAP = Param("maxrregcount", "register cap passed to nvcc -maxrregcount (default: chosen per architecture and "
                             "kernel; ptxas raises caps below 24 to 24; 255 leaves the kernel uncapped)",
             None, 24, 255)


def check_caps(caps: Iterable[Any], where: str = "--maxrregcount") -> list[int]:
    """Register caps of a sweep as integers, each a cap ptxas applies as given
    (_CAP.low.._CAP.high); anything else is a ConfigError naming it."""
    out = []
    for c in caps:
        text = str(c).strip()
        value = int(text) if isinstance(c, (int, np.integer)) and not isinstance(c, bool) else \
            int(text) if re.fullmatch(r"[0-9]{1,4}", text) else None
        if value is None or not _CAP.low <= value <= _CAP.high:
            raise ConfigError(f"{where}: {text!r} is not a register cap; give integers in {_CAP.low}..{_CAP.high} "
                              f"(ptxas raises smaller caps to {_CAP.low} and ignores larger ones)")
        out.append(value)
    return out
_P = Param("P", "prefetch distance: row loads kept in flight per thread (at a register cap of 48, P >= 5 "
                "spills inside the loop: raise maxrregcount with it; `characterize sass` shows the spills)", 2, 1, 8)
_K = Param("K", "hot rows kept in L2 (default: the GPU's persisting-L2 budget / row bytes)", None, 1)
_INDEX_BITS = Param("index_bits", "width of the indices and offsets the kernel reads: 32 (the traces are converted "
                                  "once, outside the timed launches, when every table has fewer than 2^31 rows) or 64 "
                                  "(as given)", None, 32, 64)
_SHORT = Param("short", "1: the short-bag path (a group gathers several consecutive bags as one stream of indices); "
                        "0: a group per bag (default: chosen per launch, short when the batch's mean bag length is "
                        "at most half a step of rows)", None, 0, 1)
_BAGS_PER_RUN = Param("bags_per_run", "short path: consecutive bags one group gathers as one stream (default: about "
                                      "lanes per group / mean bag length, per table)", None, 1, 32)
_TABLES_IN_FLIGHT = Param("tables_in_flight", "tables walked at a time: the launch takes its tables in phases of this "
                                            "many, every warp a slice of each phase in turn, so that only a phase's "
                                            "hot rows share the L2 (default: every table at once)", None, 1, 64)
_BOUNDS_CHECK = Param("bounds_check", "fbgemm: 1 checks every index in a kernel of its own before the lookup, as "
                                      "FBGEMM does by default (BoundsCheckMode.WARNING); 0 skips it (BoundsCheckMode.NONE)",
                      1, 0, 1)
_C = Param("C", "rows of the GPU cache of a host-resident table (default: 1.5% of E, the share at which the "
                "frequency-aware cache of Fang et al. 2022 reports a decent speed)", None, 1)

_MIGRATE = Param("migrate", "uvm: 0 zero-copy, the table stays in host memory and the GPU reads it over the bus "
                            "(preferred location host, accessed by the GPU, as FBGEMM's UVM tables); 1 pages "
                            "migrate to the GPU on first touch", 0, 0, 1)

#: the uvm variant's modes, by its `migrate` parameter
UVM_MODES = ("zero-copy", "migrate")


def uvm_mode(params: dict[str, Any]) -> str:
    """The uvm variant's mode for resolved parameters: zero-copy (default) or migrate."""
    return UVM_MODES[int(params.get("migrate", 0))]


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


#: the entry name a user's Python callable is launched under
USER_CALLABLE = "callable"


def user_variant(name: str, kernel: UserKernel) -> Variant:
    """A kernel of one's own as a variant: launched through its entry point (or Python
    callable) one table at a time, modelled from its own SASS like a peer."""
    return Variant(name, kernel.description or f"a kernel of one's own ({kernel.source or kernel.binary})",
                   entry=kernel.entry or USER_CALLABLE, block=tuple(kernel.block), grid=kernel.grid, dtypes=tuple(kernel.dtypes),
                   per_sample_weights=kernel.per_sample_weights, peer="user", offset2bag=kernel.offset2bag,
                   user=kernel)


def register_user(name: str, kernel: UserKernel) -> Variant:
    """Register a user's kernel under `name` (an experiment's [variants.NAME] table): the
    same kernel again is a no-op, a built-in name or another kernel under a taken name is
    refused by name."""
    known = VARIANTS.get(name)
    if known is not None and known.peer != "user":
        raise ConfigError(f"variants.{name}: {name} is a built-in variant; give your kernel another name")
    v = user_variant(name, kernel)
    if known is not None and known.user != kernel:
        raise ConfigError(f"variants.{name}: another kernel of one's own is registered under {name} in this "
                          "process; give this one another name")
    VARIANTS[name] = v
    return v


register(Variant("torch", "torch.nn.functional.embedding_bag: PyTorch's own kernel, what users run today "
                          "(modelled from the SASS of torch 2.13.0's CUDA wheel)", per_sample_weights=True, peer="torch"))
register(Variant("fbgemm", "FBGEMM's table-batched embedding forward (TBE, fbgemm-gpu 1.8.0), what TorchRec runs: every "
                           "table in one launch, a warp per bag, whole rows in 16-byte loads, 32 indices per tile "
                           "broadcast by shuffles (modelled from its own SASS; measured through its Python API when "
                           "fbgemm-gpu is installed)", peer="fbgemm", tables_per_launch=ALL_TABLES, offset2bag=False,
                 params=(_BOUNDS_CHECK,),
                 block=(512, 1), grid=0, dim_multiple=4, per_sample_weights=True, dtypes=("fp32", "fp16", "bf16", "int8h")))
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
register(Variant("tbe", "ours, table-batched: every table of the batch in one launch (per-table E, D; grid = SMs x "
                        "resident blocks), the next tile of indices loaded while the current one's rows are gathered, "
                        "32-bit indices, a short-bag path, int8 and fp8 (e4m3) rows decoded two values per packed half op",
                 entry="chz_tbe_forward", kernel="chz_tbe_kernel<{V}, {I}, {R}, {S}>", block=(256, 1), grid=0,
                 params=(_INDEX_BITS, _SHORT, _BAGS_PER_RUN, _TABLES_IN_FLIGHT), vector_loads=True, max_dim=1024, honors_cap=False,
                 tables_per_launch=ALL_TABLES, source=TBE_SOURCE, persistent=True, dtypes=tuple(DTYPES)))
register(Variant("cache", "host-resident table in pinned memory with a GPU cache of C rows warmed from the trace's "
                          "frequencies: per batch unique ids, hits and misses, misses copied from the host with "
                          "frequency-aware eviction, then base's kernel on cache slots",
                 entry="chz_forward_base", kernel="chz_base_kernel<false>", params=(_C,), per_sample_weights=True,
                 host="cache"))
register(Variant("uvm", "host-resident table in CUDA managed memory, base's kernel reading it: zero-copy by default "
                        "(the pages stay on the host), or migrating the pages it touches (migrate=1); on the CPU "
                        "backend it is just the table",
                 entry="chz_forward_base", kernel="chz_base_kernel<false>", params=(_MIGRATE,),
                 per_sample_weights=True, host="uvm"))
register(Variant("wrong", "base with an off-by-one dropping each bag's last index (test-only: the checker must fail)",
                 entry="chz_forward_wrong", kernel="chz_base_kernel<true>", test_only=True))

#: every public variant whose table lives in GPU memory, in registration order: the kernel family an
#: experiment runs by default, and the order of every table and figure
def built_in() -> list[str]:
    """Every public variant of the family and its peers, in registry order (not the kernels
    of one's own an experiment registered): what 'all variants' means."""
    return [n for n, v in VARIANTS.items() if not v.test_only and v.peer != "user"]


VARIANT_ORDER: tuple[str, ...] = tuple(n for n, v in VARIANTS.items() if not v.test_only and v.host == "none")
#: variants of host-resident tables (GPU row cache, managed memory): named by an experiment, or chosen
#: for it when its tables do not fit the GPU; each runs base's lookup kernel
HOST_VARIANTS: tuple[str, ...] = tuple(n for n, v in VARIANTS.items() if not v.test_only and v.host != "none")


def get_variant(name: str) -> Variant:
    try:
        return VARIANTS[name]
    except KeyError:
        public = ", ".join(built_in())
        raise ConfigError(f"unknown variant {name!r}; known: {public}." + did_you_mean(name, built_in())) from None


def tbe_vectors_per_lane(D: int) -> int:
    """V of the tbe kernel for a table of D (1, 2, 4 or 8 vectors of 4 elements per lane; mirrors
    chz_tbe_vectors_per_lane in kernels/tbe.cu, a test keeps them in step). A launch takes its
    tables' largest."""
    nvec = D // TBE_VECTOR_ELEMS
    v = 1
    while v < 8 and 32 * v < nvec:
        v *= 2
    return v


def tbe_group(D: int, V: int) -> int:
    """Lanes per bag (or run of bags) of the tbe kernel for a table of D in a launch of V vectors
    per lane: the power of two covering the row's vectors / V, at least a step's 8 / V rows, at
    most 32 (mirrors chz_tbe_group)."""
    need = -(-(D // TBE_VECTOR_ELEMS) // V)
    g = 8 // V
    while g < 32 and g < need:
        g *= 2
    return g


def tbe_path(lookups: float, bags: int, D: int, params: dict[str, Any] | None = None) -> tuple[bool, int, int]:
    """(short path, bags per run, lanes per group) the tbe launcher picks for a table of
    `bags` bags and `lookups` lookups (mirrors chz_tbe_short_path and chz_tbe_bags_per_run):
    short when the mean bag is at most half a step of rows, a run then holding about
    lanes / mean L consecutive bags, at most lanes - 1."""
    params = params or {}
    V = tbe_vectors_per_lane(D)
    G = tbe_group(D, V)
    short = params.get("short")
    short = bool(short) if short is not None else bags > 0 and 2 * lookups <= bags * (8 // V)
    if not short:
        return False, 1, G
    k = int(params.get("bags_per_run") or 0)
    if k <= 0:
        mean_ceil = -(-int(lookups) // max(bags, 1))
        k = G if mean_ceil <= 1 else G // mean_ceil
    return True, max(1, min(k, G - 1 if G > 1 else 1)), G


def bag_lanes(v: Variant, D: int, dtype: str = "fp32") -> int:
    """Lanes sharing one bag in a variant whose lanes share bags (warp, tbe), as its
    launcher picks them for D and the dtype."""
    if v.source == TBE_SOURCE:
        return tbe_group(D, tbe_vectors_per_lane(D))
    return warp_group(D, dtype)


def warp_group(D: int, dtype: str = "fp32") -> int:
    """Lanes per bag of the warp variant: the power of two covering the row's 16-byte
    vectors (D/4 fp32, D/8 fp16/bf16, D/16 int8), <= 32 (mirrors chz_warp_group in the
    CUDA source; a test keeps them in step)."""
    g = 1
    while g < 32 and g < D // vector_elems(dtype):
        g *= 2
    return g

