"""Kernels stage, SASS analysis: a kernel's hot loop scored, one LoopRow per kernel, variant and architecture.

Rows in flight per warp = row loads per iteration / memory latencies serialized per
iteration (the in-order replay). The wait excludes the cycles spent issuing, so a loop
that issues for a while before its one wait scores a little above its row loads; a loop
that waits less than half a latency per iteration gets Little's law instead, row loads x
latency / cycles per iteration.

A row load is one gathered load instruction: per warp it moves 32 lanes x its width
(base: a 128-byte segment of a row; warp at D=128: a whole 512-byte row), hence
`bytes_in_flight_per_warp` beside it, and `lookups_per_iteration` counts the distinct
indices the row loads of one iteration gather by.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from characterize.kernels.sass.loads import classify, qparam_loads
from characterize.kernels.sass.loops import Loop, hot_loop
from characterize.kernels.sass.nest import REFERENCE_L, nest_facts
from characterize.kernels.sass.parse import ATOMICS, LOCAL_MEMORY, Instruction, KernelCode, short_name
from characterize.kernels.sass.replay import MEMORY_LATENCY, replay


@dataclass(frozen=True)
class LoopRow:
    """The hot loop of one kernel of one variant for one architecture."""

    variant: str
    arch: str
    kernel: str
    loop: str                       # header-latch addresses, e.g. 0x0f30-0x1bb0
    role: str                       # lookup | prepass
    maxrregcount: int | None
    registers: int | None
    instructions: int               # on the steady-state path, per iteration
    lookups_per_iteration: int
    instructions_per_lookup: float | None
    row_loads: int
    index_loads: int
    other_loads: int
    load_bits: dict[int, int]       # global loads per width in bits
    local_mem_ops: int              # LDL/STL on the path: spills
    shuffles: int
    prefetches: dict[str, int]      # CCTL kind -> count (E.PML2: evict_last, E.PF2: plain)
    cycles_per_iteration: float
    latencies_per_iteration: float
    rows_in_flight: float | None    # per warp: row loads / latencies per iteration
    bytes_in_flight_per_warp: float | None
    dtype: str = "fp32"             # table element type of the build
    qparam_loads: int = 0           # int8: gathered loads of a row's scale and bias (not counted as row loads)
    atomics: int = 0                # global atomics (RED, ATOM) on the path per iteration
    atomic_bits: int = 0            # bits one lane's atomics of one iteration update (32 per fp32 RED)
    row_load_bits: int = 0          # width of one lane's row load (x 32 lanes: the bytes one warp request reads)
    # the loop nest around the hot loop (loop_nest, nest_latencies): what one task costs at each bag length
    lanes_per_bag: int = 32         # lanes sharing one bag (a warp holds 32 / lanes_per_bag bags)
    tile_lookups: int = 0           # a bag's lookups one tile of indices covers (0: no tile loop)
    bag_latencies: dict[int, float] = field(default_factory=dict)   # L -> row latencies a task waits (nest replay)
    bag_instructions: dict[int, int] = field(default_factory=dict)  # L -> instructions per task
    nest_rows_in_flight: float | None = None  # row loads per latency over the whole nest at REFERENCE_L
    spills_in_nest: int = 0         # LDL/STL anywhere in the nest's task path at REFERENCE_L
    setup_latencies: float = 0.0    # row latencies a run of tasks waits beyond its tasks (an outer loop's own
                                    # loads: tbe's switch to a table), once per run, not per task

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["load_bits"] = dict(sorted(self.load_bits.items()))
        return out


def _atomic_bits(i: Instruction) -> int:
    """Bits one lane's atomic updates: 32 for RED.E.ADD.F32, x2/x4 for the vector forms (F32x2, F32x4),
    64 for .64 operations."""
    for m in i.modifiers:
        if v := re.fullmatch(r"F(16|32)x(\d)", m):
            return int(v.group(1)) * int(v.group(2))
        if m in ("64", "U64", "S64", "F64"):
            return 64
    return 32


def analyze_loop(loop: Loop, *, variant: str = "", arch: str = "", role: str = "lookup",
                 maxrregcount: int | None = None, registers: int | None = None,
                 memory_latency: int = MEMORY_LATENCY, dtype: str = "fp32") -> LoopRow:
    """Counts, load classes and the in-order replay of one loop. For int8 tables the
    gathers of a row's scale and bias (loads of their width: QPARAM_LOAD_BITS) are
    counted apart, so rows in flight counts rows' values, as for the other dtypes."""
    path = loop.path
    cls = classify(path)
    rep = replay(path, memory_latency)
    widths: dict[int, int] = {}
    for i in path:
        if i.is_global_load:
            widths[i.width_bits] = widths.get(i.width_bits, 0) + 1
    prefetches: dict[str, int] = {}
    for i in path:
        if i.opcode == "CCTL":
            prefetches[i.mnemonic] = prefetches.get(i.mnemonic, 0) + 1
    qparams = qparam_loads(path, cls.row_loads, dtype)
    row_loads = cls.row_loads - qparams
    rows = len(row_loads)
    row_bits = sum(i.width_bits for i in path if i.address in row_loads)
    lat = rep.latencies_per_iteration
    if rows == 0:
        in_flight = bytes_in_flight = None
    elif lat >= 0.5:
        in_flight, bytes_in_flight = rows / lat, row_bits / 8 * 32 / lat
    else:  # (almost) never waits on memory: Little's law with the issue-bound iteration time
        in_flight = rows * memory_latency / rep.cycles_per_iteration
        bytes_in_flight = row_bits / 8 * 32 * memory_latency / rep.cycles_per_iteration
    lookups = cls.lookups
    return LoopRow(
        variant=variant, arch=arch or (path[0].arch if path else ""), kernel=short_name(loop.kernel), loop=loop.label,
        role=role, maxrregcount=maxrregcount, registers=registers, instructions=len(path),
        lookups_per_iteration=lookups, instructions_per_lookup=round(len(path) / lookups, 2) if lookups else None,
        row_loads=rows, index_loads=len(cls.index_loads),
        other_loads=sum(1 for i in path if i.is_global_load) - len(cls.row_loads) - len(cls.index_loads - cls.row_loads),
        load_bits=widths, local_mem_ops=sum(1 for i in path if i.opcode in LOCAL_MEMORY),
        shuffles=sum(1 for i in path if i.opcode == "SHFL"), prefetches=prefetches,
        cycles_per_iteration=round(rep.cycles_per_iteration, 1), latencies_per_iteration=round(lat, 3),
        rows_in_flight=None if in_flight is None else round(in_flight, 2),
        bytes_in_flight_per_warp=None if bytes_in_flight is None else round(bytes_in_flight, 1), dtype=dtype,
        qparam_loads=len(qparams), atomics=sum(1 for i in path if i.opcode in ATOMICS),
        row_load_bits=max((i.width_bits for i in path if i.address in row_loads), default=0),
        atomic_bits=sum(_atomic_bits(i) for i in path if i.opcode in ATOMICS))


def analyze_kernel(code: KernelCode, *, nest: bool = True, **kw: Any) -> LoopRow | None:
    """The hot loop of one kernel, analyzed, with its loop nest replayed at every bag
    length of NEST_L (None when no loop gathers anything). `nest=False` skips the nest
    (an L2 pre-pass, a training kernel: no bag to walk)."""
    loop = hot_loop(code)
    if loop is None:
        return None
    row = analyze_loop(loop, **kw)
    if not nest or not row.row_loads:
        return row
    facts = nest_facts(code, loop, kw.get("memory_latency", MEMORY_LATENCY))
    if facts is None:
        return row
    lat = {int(L): v for L, v, _ in facts["bags"]}
    ins = {int(L): i for L, _, i in facts["bags"]}
    ref_lat = facts["reference"]
    loads_per_lookup = row.row_loads / max(1, row.lookups_per_iteration)
    bags = 32 // max(1, facts["lanes_per_bag"])
    in_flight = REFERENCE_L * bags * loads_per_lookup / ref_lat if ref_lat > 0 else None
    return dataclasses.replace(row, lanes_per_bag=facts["lanes_per_bag"], tile_lookups=facts["tile_lookups"],
                               bag_latencies=lat, bag_instructions=ins, spills_in_nest=facts["spills"],
                               setup_latencies=float(facts.get("setup", 0.0)),
                               nest_rows_in_flight=None if in_flight is None else round(in_flight, 2))
