"""Analysis stage, model of the kernels: what the model knows of each variant's kernel on
one architecture, gathered from its machine code whoever wrote it.

Our variants: ptxas's resources and occupancy (static.csv) and the loop nest read from
the SASS (sass.csv); how they are launched comes from the variant registry. PyTorch's
and FBGEMM's kernels: the same facts, read from the wheels users install
(kernels.peers, peers.csv), with the launch their host code makes. A user's kernel:
the facts `characterize sass --binary` reads, with the launch the experiment states.
Nothing about a kernel comes from its name: a kernel is its registers, its occupancy,
the latencies its warps wait per bag of each length and the instructions they issue.

When the architecture of a GPU has no code facts (nvcc 13 cannot build sm_70; the
peers ship sm_80 and sm_90 only), the nearest architecture of the same major version
stands in, else the nearest one, and the facts say so (`code_arch`).
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

import pandas as pd

from characterize.config import DTYPES, WorkloadConfig
from characterize.errors import ConfigError
from characterize.hardware.specs import ARCHS, GpuSpec, nearest_arch
from characterize.kernels.occupancy import theoretical_occupancy
from characterize.kernels.peers import PEER_VERSIONS, peer_kernel
from characterize.kernels.registry import TBE_SOURCE, Variant, bag_lanes, tbe_path
from characterize.kernels.sass import interpolate

#: block slots that tasks-sized grids of a persistent kernel fill: SMs x resident blocks
PERSISTENT = -1


@dataclass(frozen=True)
class KernelFacts:
    """One variant's lookup kernel on one architecture, as the model uses it."""

    variant: str
    arch: str                    # the GPU's architecture
    code_arch: str               # the architecture whose code the facts were read from
    source: str                  # ours | torch 2.13.0 | fbgemm 1.8.0 | binary PATH
    work: str                    # chunk: a warp per (bag, feature chunk) | bag: lanes_per_bag lanes per bag
    lanes_per_bag: int           # bag work: lanes sharing a bag (a warp holds 32 / lanes_per_bag bags)
    chunk_features: int          # chunk work: features one warp covers (32 lanes x elements per lane)
    block_threads: int
    grid: int                    # blocks of a fixed grid striding over the tasks; 0: sized by the tasks;
                                 # PERSISTENT: SMs x resident blocks
    tables_per_launch: str       # one | all
    registers: int
    shared_mem: int
    blocks_per_sm: int
    rows_in_flight: float        # row loads a warp keeps in flight in the hot loop (SASS replay)
    bag_latencies: Mapping[Any, float]      # L -> row latencies one task waits (nest replay)
    bag_instructions: Mapping[Any, float]   # L -> instructions one task issues
    offset2bag: bool             # writes offset2bag and bag sizes beside the output (torch's op does)
    output_bytes: int            # bytes per output element (fp32 4; torch writes the table's dtype)
    symbol: str = ""
    note: str = ""
    load_bits: Mapping[Any, int] = field(default_factory=dict)
    row_load_bits: int = 0       # width of one lane's row load: with the lanes sharing a row, the contiguous
                                 # bytes one warp request reads
    run_bags: int = 1            # consecutive bags a lane group gathers as one stream (tbe's short path)
    setup_latencies: float = 0.0  # row latencies a warp waits once per run of tasks, beyond the tasks (an outer
                                  # loop's own loads: tbe's switch to the next table of its slice)
    index_pass: bool = False     # a kernel of its own reads every index before the lookup (FBGEMM's bounds check)

    def request_bytes(self, row_bytes: int) -> float:
        """Contiguous bytes of a row one warp request reads: 32 lanes' loads for a thread
        per feature, a lane group's for a warp of bags; at most the row."""
        if self.row_load_bits <= 0:
            return float(row_bytes)
        lanes = 32 if self.work == "chunk" else self.lanes_per_bag
        return float(min(row_bytes, lanes * self.row_load_bits / 8))

    def latencies(self, L: float) -> float:
        """Row latencies one task waits for bags of L lookups."""
        v = interpolate(self.bag_latencies, L)
        if v is None:
            raise ConfigError(f"{self.variant} on {self.arch}: no loop-nest figures in its SASS facts; "
                              "re-run the static step (`characterize sass`) with this version")
        return max(v, 0.0)

    def instructions(self, L: float) -> float:
        return max(interpolate(self.bag_instructions, L) or 0.0, 0.0)


def _json(v: Any) -> dict:
    """A dict column as written: a dict, its JSON text, or (a frame saved as is) its repr."""
    if isinstance(v, Mapping):
        return dict(v)
    if isinstance(v, str) and v.strip().startswith("{"):
        try:
            return json.loads(v)
        except ValueError:
            try:
                out = ast.literal_eval(v)
            except (ValueError, SyntaxError):
                return {}
            return out if isinstance(out, dict) else {}
    return {}


def _int(v: Any) -> int:
    try:
        return int(float(v))
    except (TypeError, ValueError):
        return 0


def _float(v: Any) -> float:
    """A finite number of a row (0 where the column is missing or empty: rows written before it)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return 0.0
    return f if math.isfinite(f) else 0.0


def ours(v: Variant, gpu: GpuSpec, wl: WorkloadConfig, static: pd.DataFrame, sass: pd.DataFrame,
         params: Mapping[str, Any] | None = None) -> KernelFacts:
    """Our compiled variant (or a host-resident one, which runs base's kernel) from the
    static and SASS rows of its build."""
    name = v.name if v.compiled and v.host == "none" else "base"
    rows_s = static[(static["variant"] == name)]
    rows_k = sass[(sass["variant"] == name)]
    if "role" in rows_s.columns:
        rows_s = rows_s[rows_s["role"] == "lookup"]
    if "sweep" in rows_s.columns:
        rows_s = rows_s[~rows_s["sweep"].astype(str).str.lower().isin(["true", "1"])]
    if "role" in rows_k.columns:
        rows_k = rows_k[rows_k["role"] == "lookup"]
    code_arch = nearest_arch(sorted(set(rows_s["arch"]) & set(rows_k["arch"])), gpu.arch)
    if code_arch is None:
        raise ConfigError(f"no static characterization and SASS of {name} ({wl.dtype}) to model it on {gpu.arch}")
    s = rows_s[rows_s["arch"] == code_arch].iloc[0]
    k = rows_k[rows_k["arch"] == code_arch].iloc[0]
    occ = theoretical_occupancy(ARCHS[gpu.arch], int(s["block_size"]), int(s["registers"]), int(s["shared_mem"]))
    lat = _json(k.get("bag_latencies"))
    if not lat:
        raise ConfigError(f"the SASS rows of {name} carry no loop-nest figures (bag_latencies): they were written "
                          "by an older version; run `characterize run` or `characterize sass` again")
    bag = v.block[1] == 1   # a one-dimensional block: lanes share bags (warp, tbe); 32 x 8: a thread per feature
    lanes = bag_lanes(v, wl.D, wl.dtype) if bag else 32
    run_bags, note = 1, ""
    if v.source == TBE_SOURCE:   # the launcher's path for this trace's bags: runs of K bags on the short one
        short, run_bags, _ = tbe_path(wl.L.mean * wl.B, wl.B, wl.D, params)
        if short:
            note = (f"tbe's short path: runs of {run_bags} bags gathered as one stream, modelled with the long "
                    "path's loop nest at the run's length")
    return KernelFacts(
        variant=v.name, arch=gpu.arch, code_arch=code_arch, source="ours", work="bag" if bag else "chunk",
        lanes_per_bag=lanes, chunk_features=v.block[0], block_threads=v.block_size,
        grid=PERSISTENT if getattr(v, "persistent", False) else v.grid,
        tables_per_launch="all" if v.batched else "one", registers=int(s["registers"]),
        shared_mem=int(s["shared_mem"]), blocks_per_sm=occ.blocks_per_sm,
        rows_in_flight=float(k.get("rows_in_flight") or 1.0), bag_latencies=lat,
        bag_instructions=_json(k.get("bag_instructions")), offset2bag=getattr(v, "offset2bag", True),
        output_bytes=4, symbol=str(k.get("kernel", "")),
        note="; ".join(n for n in (note, "" if code_arch == gpu.arch else f"code facts of {code_arch} (no build "
                                    f"for {gpu.arch})") if n),
        run_bags=run_bags, setup_latencies=_float(k.get("setup_latencies")),
        load_bits=_json(k.get("load_bits")), row_load_bits=_int(k.get("row_load_bits")))


#: the dtype whose peer kernel serves a table dtype: FBGEMM's int8 rows carry an fp16 scale and bias
#: (our int8h); PyTorch's quantized operator reads rows with fp32 ones (our int8)
PEER_DTYPE = {"torch": {"int8h": "int8"}, "fbgemm": {"int8": "int8h", "bf16": "fp16"}}


def _kernel_name(demangled: str) -> str:
    """'void at::native::(anonymous namespace)::EmbeddingBag_updateOutputKernel_sum_mean<float, long>(...)'
    -> 'EmbeddingBag_updateOutputKernel_sum_mean': the function's own name, for a note."""
    base = re.sub(r"<.*", "", demangled.replace("(anonymous namespace)", "").split("(")[0].removeprefix("void "))
    return base.split("::")[-1] or demangled[:60]


def peer_dtype(name: str, dtype: str) -> str:
    """The table dtype whose kernel a peer runs when a user's table is `dtype`."""
    return PEER_DTYPE.get(name, {}).get(dtype, dtype)


def peer(v: Variant, gpu: GpuSpec, wl: WorkloadConfig, params: Mapping[str, Any] | None = None) -> KernelFacts:
    """PyTorch's or FBGEMM's kernel for this workload, from peers.csv (with FBGEMM's bounds
    check of every index before the lookup, its default, unless params turn it off)."""
    name = v.peer or ""
    dtype = peer_dtype(name, wl.dtype)
    facts_dtype = "int8" if name == "fbgemm" and dtype == "int8h" else dtype
    row = peer_kernel(name, facts_dtype, wl.D, gpu.arch)
    code_arch = str(row["arch"])
    block = int(row.get("block_threads") or 256) if name == "fbgemm" else 256
    shared = int(row.get("shared_mem") or 0)
    if ARCHS[gpu.arch].compute_capability >= (8, 0) and shared > 1024 and str(row.get("binary_arch", "")).endswith("a"):
        shared -= 1024   # cuobjdump's sm_90a figure includes the 1 KiB the runtime reserves per block
    occ = theoretical_occupancy(ARCHS[gpu.arch], block, int(row["registers"]), shared)
    quantized = facts_dtype.startswith("int8")
    bag = name == "fbgemm" or quantized
    lanes = int(row.get("lanes_per_bag") or 32)
    return KernelFacts(
        variant=v.name, arch=gpu.arch, code_arch=code_arch, source=f"{name} {PEER_VERSIONS[name]}",
        work="bag" if bag else "chunk", lanes_per_bag=lanes, chunk_features=32, block_threads=block,
        grid=1024 if name == "torch" and not quantized else 0,
        tables_per_launch="all" if name == "fbgemm" else "one", registers=int(row["registers"]), shared_mem=shared,
        blocks_per_sm=occ.blocks_per_sm, rows_in_flight=float(row.get("rows_in_flight") or 1.0),
        bag_latencies=_json(row.get("bag_latencies")), bag_instructions=_json(row.get("bag_instructions")),
        offset2bag=name == "torch", output_bytes=DTYPES[dtype].element_bytes if name == "torch" and not quantized
        else 4, symbol=str(row.get("symbol", "")),
        note=(f"{name} {PEER_VERSIONS[name]}'s own SASS ({row.get('binary_arch', code_arch)}: "
              f"{_kernel_name(str(row.get('kernel', '')))}, from {row.get('wheel', '')}, sha256 "
              f"{str(row.get('wheel_sha256', ''))[:12]})" + ("" if code_arch == gpu.arch else
                                                          f"; code facts of {code_arch}")),
        load_bits=_json(row.get("load_bits")), row_load_bits=_int(row.get("row_load_bits")),
        index_pass=name == "fbgemm" and bool((params or {}).get("bounds_check", 1)))


def user(v: Variant, gpu: GpuSpec, wl: WorkloadConfig, rows: Mapping[str, Mapping[str, Any]] | None) -> KernelFacts:
    """A kernel of one's own (config.UserKernel), from its SASS as kernels.user reads it
    (`rows`: per architecture, kernels.binary's row) and the launch its table states."""
    kernel = v.user
    if not rows:
        raise ConfigError(f"no SASS of {v.name} to model it: characterize predict builds and reads it, or pass its "
                          "rows (kernels.user.sass_rows) as custom=")
    key = nearest_arch(list(rows), gpu.arch)
    r = rows[key]
    threads = int(kernel.block[0]) * int(kernel.block[1])
    shared = _int(r.get("shared_mem"))
    occ = theoretical_occupancy(ARCHS[gpu.arch], threads, _int(r.get("registers")), shared)
    bag = kernel.work == "bag"
    code_arch = str(r.get("code_arch") or key)
    where = kernel.source or kernel.binary
    return KernelFacts(
        variant=v.name, arch=gpu.arch, code_arch=code_arch, source=f"yours: {where}",
        work="bag" if bag else "chunk", lanes_per_bag=kernel.lanes_per_bag or _int(r.get("lanes_per_bag")) or 32,
        chunk_features=kernel.chunk_features, block_threads=threads, grid=kernel.grid, tables_per_launch="one",
        registers=_int(r.get("registers")), shared_mem=shared, blocks_per_sm=occ.blocks_per_sm,
        rows_in_flight=float(r.get("rows_in_flight") or 1.0), bag_latencies=_json(r.get("bag_latencies")),
        bag_instructions=_json(r.get("bag_instructions")), offset2bag=kernel.offset2bag, output_bytes=4,
        symbol=str(r.get("symbol", "")),
        note=f"your kernel {str(r.get('kernel', ''))[:60]} ({where}, sha256 {str(r.get('sha256', ''))[:12]})"
             + ("" if code_arch == gpu.arch else f"; code of {code_arch}"),
        load_bits=_json(r.get("load_bits")), row_load_bits=_int(r.get("row_load_bits")),
        setup_latencies=_float(r.get("setup_latencies")))
