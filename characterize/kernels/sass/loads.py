"""Kernels stage, SASS analysis: what each global load of a loop path does, by register dataflow.

Loads are classified by register dataflow along the path, replayed three times so that
values carried from one iteration to the next count (spilled values follow their stack
slot): a global load whose address is computed from a value loaded or shuffled in the
loop is a row load; a global load whose value reaches the address of a row load or
prefetch, and that gathers nothing itself, is an index load; the rest (per-sample
weights, offsets) are other loads. For int8 rows, the gathers of a row's scale and bias
are told from its values by what reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from characterize.kernels.sass.parse import ATOMICS, Instruction


@dataclass(frozen=True)
class Classification:
    """The global loads and prefetches of a loop path, by what they do (addresses)."""

    row_loads: frozenset[int]      # addresses of gathered global loads
    index_loads: frozenset[int]    # addresses of loads feeding a gather's address
    prefetches: frozenset[int]
    lookups: int                   # distinct index sources among gathers
    scatters: frozenset[int] = frozenset()  # addresses of atomics whose address comes from a loaded index


def _slot(i: Instruction) -> str:
    """The stack slot a local load or store names, e.g. local[R1+0x10]."""
    mem = next((o for o in i.operands if "[" in o), "")
    return "local" + mem[mem.rfind("["):].replace(".reuse", "")


def classify(path: Sequence[Instruction], passes: int = 3) -> Classification:
    """Register dataflow along the path (repeated, so loop-carried values count):
    which loads gather rows and which load the indices they gather by.

    A guarded write may not happen, so for finding gathers it adds to what its
    register may hold, unless the reader has the same guard (the same predicate,
    not rewritten since): then only the guarded write counts. Grouping gathers into
    lookups uses the optimistic view (every guarded write happens) and, within it,
    the most recently executed source."""
    none: frozenset[int] = frozenset()
    may: dict[str, tuple[frozenset[int], tuple | None, frozenset[int]]] = {}  # union, last guard, last write
    runs: dict[str, frozenset[int]] = {}   # every guarded write happens
    version: dict[str, int] = {}           # predicate -> times written
    gathers: dict[int, set[int]] = {}
    key_of: dict[int, int] = {}
    executed: dict[int, int] = {}          # producer -> position of its latest execution
    step = 0

    def youngest(roots: Iterable[int]) -> int | None:
        return max(roots, key=lambda r: executed.get(r, -1), default=None)

    def read(r: str, guard: tuple | None) -> frozenset[int]:
        union, last_guard, last = may.get(r, (none, None, none))
        return last if guard is not None and last_guard == guard else union

    for _ in range(passes):
        for i in path:
            step += 1
            pred = i.predicate.lstrip("!")
            guard = (i.predicate, version.get(pred, 0)) if i.predicate else None
            if i.is_global_load or i.is_prefetch or i.opcode in ATOMICS:
                addr = none.union(*(read(r, guard) for r in i.address_regs))
                if addr:
                    gathers.setdefault(i.address, set()).update(addr)
                    hit = youngest(none.union(*(runs.get(r, none) for r in i.address_regs)))
                    key_of[i.address] = hit if hit is not None else youngest(addr)
            producer = i.is_global_load or i.opcode == "SHFL"
            own = frozenset({i.address}) if producer else none
            srcs = [r for r in i.srcs if r != pred]
            if i.opcode == "STL":  # a spill: the value lives on in its stack slot
                slot = _slot(i)
                data = [r for r in srcs if r not in i.address_regs]
                may[slot] = (none.union(*(read(r, guard) for r in data)), None, none)
                runs[slot] = none.union(*(runs.get(r, none) for r in data))
                continue
            if i.opcode == "LDL":
                slot = _slot(i)
                may_new, runs_new = may.get(slot, (none, None, none))[0], runs.get(slot, none)
            else:
                may_new = own if i.is_global_load else own.union(*(read(r, guard) for r in srcs))
                runs_new = own if i.is_global_load else own.union(*(runs.get(r, none) for r in srcs))
            for d in i.dests:
                union = may.get(d, (none, None, none))[0] | may_new if guard else may_new
                may[d] = (union, guard, may_new)
                runs[d] = runs_new
                if d[0] in "UP" and not d.startswith("UR"):
                    version[d] = version.get(d, 0) + 1
            if producer:
                executed[i.address] = step
    loads = {i.address for i in path if i.is_global_load}
    rows = frozenset(a for a in gathers if a in loads)
    # a row load reaching another address (a kept register, a pointer chase) stays a
    # row load; index loads are the loads that feed addresses and gather nothing. Atomics
    # whose address comes from a loaded index scatter (the backward's RED), they gather nothing
    atomics = {i.address for i in path if i.opcode in ATOMICS}
    rows = rows - atomics
    index = frozenset(r for a in gathers for r in gathers[a] if r in loads and r not in rows and r not in atomics)
    prefetch = frozenset(a for a in gathers if a not in loads and a not in atomics)
    return Classification(rows, index, prefetch, len(set(key_of.values())), frozenset(a for a in gathers if a in atomics))


#: widths of the loads of an int8 row's scale and bias when their consumers do not tell (a fallback):
#: one each (base, rpf) or both at once (warp)
QPARAM_LOAD_BITS = {"int8": frozenset({32, 64}), "int8h": frozenset({16, 32}), "fp8": frozenset({32})}
#: instructions that decode packed integer row values (int8 bytes into floats)
INT_DECODE = frozenset({"I2F", "I2FP", "PRMT", "LOP3", "SHF", "I2I", "BFE", "IMAD", "IADD3", "SGXT", "LEA"})
#: floating-point arithmetic: where a row's scale and bias, or float row values, go
FLOAT_MATH = frozenset({"FADD", "FFMA", "FMUL", "HADD2", "HFMA2", "HMUL2", "F2F", "FMNMX", "HMNMX2", "FSETP",
                        "FSEL"})


def first_reader(path: Sequence[Instruction], k: int) -> Instruction | None:
    """The first instruction after path[k] (wrapping around the loop) that reads one of
    its results."""
    dests = set(path[k].dests)
    if not dests:
        return None
    n = len(path)
    for step in range(1, n + 1):
        i = path[(k + step) % n]
        if dests & set(i.srcs):
            return i
        if dests & set(i.dests):   # overwritten before anyone read it
            return None
    return None


def qparam_loads(path: Sequence[Instruction], row_loads: frozenset[int], dtype: str) -> set[int]:
    """The gathers of int8 rows' scales and biases, told from the rows' values by what
    reads them: values are decoded by integer instructions (I2F, PRMT, LOP3...), a scale
    or a bias goes straight into float arithmetic (a loop that loads its scales outside,
    once per tile as tbe does, has values only). Where no reader says "value", the widths
    do (QPARAM_LOAD_BITS)."""
    if dtype not in QPARAM_LOAD_BITS:
        return set()
    kinds: dict[int, str] = {}
    for k, i in enumerate(path):
        if i.address in row_loads and i.dests:
            reader = first_reader(path, k)
            op = reader.opcode if reader is not None else ""
            kinds[i.address] = "value" if op in INT_DECODE else "qparam" if op in FLOAT_MATH else "?"
    if "value" in kinds.values():   # values decoded here: the gathers read by float math alone are qparams
        return {a for a, kind in kinds.items() if kind == "qparam"}
    bits = QPARAM_LOAD_BITS[dtype]
    return {i.address for i in path if i.address in row_loads and i.width_bits in bits}


def accumulates(path: Sequence[Instruction], row_loads: Iterable[int]) -> bool:
    """Whether the loop adds up what it gathers (a pooled sum: float math or an int8
    decode reads the rows), rather than copying rows to memory (a sequence lookup)."""
    rows = set(row_loads)
    for k, i in enumerate(path):
        if i.address in rows:
            reader = first_reader(path, k)
            if reader is not None and (reader.opcode in FLOAT_MATH or reader.opcode in INT_DECODE):
                return True
    return any(i.opcode == "LDGSTS" for i in path if i.address in rows)  # staged in shared memory, added there
