"""Kernels stage, SASS analysis: the in-order replay that counts the memory latencies a loop serializes.

The path is replayed with in-order issue for ITERATIONS iterations back to back,
registers carried over. An instruction issues one cycle after the previous one unless a
register it reads or overwrites is not ready; a global load's destinations (index and
row loads alike) become ready MEMORY_LATENCY cycles after issue, other results a few
cycles after (a small table; a spill reload is an L1 hit). The time spent waiting on
global loads, divided by the latency, is the number of memory latencies serialized per
iteration, the mean over the second half of the replay (steady state).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from characterize.kernels.sass.parse import DOUBLE_OPS, Instruction

#: cycles from a global load's issue until its registers are ready (DRAM-like)
MEMORY_LATENCY = 500
#: iterations replayed back to back; the second half is the steady state
ITERATIONS = 8


def _latency(i: Instruction, memory_latency: int) -> int:
    """Cycles until an instruction's results are ready (rough Ampere/Hopper figures)."""
    op = i.opcode
    if i.is_global_load:
        return memory_latency
    if op == "LDL":
        return 40     # a spill reload: an L1 hit
    if op in ("LDS", "LDSM", "ATOMS"):
        return 30
    if op in ("SHFL", "LDC", "S2R", "S2UR", "MATCH", "REDUX") or (op == "CS2R" and "SRZ" not in i.text):
        return 20  # CS2R of SRZ is a plain zeroing move; of a clock, a special-register read
    if op in ("MUFU", "I2F", "F2I", "F2F", "I2I", "POPC", "FLO", "BREV", "FRND"):
        return 12
    if op in DOUBLE_OPS:
        return 8
    return 5


@dataclass(frozen=True)
class Replay:
    """Steady-state figures of the in-order replay, per iteration."""

    cycles_per_iteration: float
    memory_stall_per_iteration: float
    latencies_per_iteration: float


def _depbar_keep(i: Instruction) -> int:
    """How many of the newest asynchronous-copy groups a DEPBAR leaves in flight
    (`DEPBAR.LE SB0, 0x1` waits until at most one is outstanding)."""
    try:
        return int(i.operands[-1], 0) if len(i.operands) >= 2 else 0
    except ValueError:
        return 0


def replay(path: Sequence[Instruction], memory_latency: int = MEMORY_LATENCY, iterations: int = ITERATIONS,
           load_latency: Mapping[int, int] | None = None, first_full: Iterable[int] = ()) -> Replay:
    """In-order issue of `iterations` back-to-back iterations of the path, registers
    carried over; figures are means over the second half (steady state). Asynchronous
    copies to shared memory (LDGSTS) are committed in groups (LDGDEPBAR) that a DEPBAR
    waits for: that wait is a memory wait like a register's. `load_latency` gives some
    global loads (by address) another latency than `memory_latency` (an index stream
    that mostly hits L1), except their first execution in an iteration for the loads in
    `first_full` (a task's first index: a line no one has read yet); the waits are still
    counted in units of `memory_latency`."""
    ready: dict[str, tuple[int, bool]] = {}   # register -> (ready time, written by a global load)
    t_prev = -1
    per_iteration: list[tuple[int, int]] = []
    open_group: list[int] = []       # completion times of the copies not yet committed
    groups: list[int] = []           # committed groups, oldest first: when each completes
    latency_of = load_latency or {}
    full_first = set(first_full)
    for _ in range(iterations):
        start, stall = t_prev + 1, 0
        seen: set[int] = set()
        for i in path:
            earliest = t_prev + 1
            other = mem = earliest
            for r in i.srcs + i.dests:
                when, from_memory = ready.get(r, (0, False))
                if from_memory:
                    mem = max(mem, when)
                else:
                    other = max(other, when)
            if i.opcode == "DEPBAR":
                keep = _depbar_keep(i)
                waited, groups = groups[:max(0, len(groups) - keep)], groups[max(0, len(groups) - keep):]
                mem = max([mem, *waited])
            t = max(other, mem)
            if mem > other:
                stall += mem - other
            if not i.is_global_load:
                lat = _latency(i, memory_latency)
            elif i.address in full_first and i.address not in seen:
                lat = memory_latency
            else:
                lat = latency_of.get(i.address, memory_latency)
            seen.add(i.address)
            if i.opcode == "LDGSTS":
                open_group.append(t + lat)
            elif i.opcode == "LDGDEPBAR" and open_group:
                groups.append(max(open_group))
                open_group = []
            for d in i.dests:
                ready[d] = (t + lat, i.is_global_load)
            t_prev = t
        per_iteration.append((t_prev + 1 - start, stall))
    steady = per_iteration[iterations // 2:] or per_iteration
    cycles = sum(c for c, _ in steady) / len(steady)
    stall = sum(s for _, s in steady) / len(steady)
    return Replay(cycles, stall, stall / memory_latency)
