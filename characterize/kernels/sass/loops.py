"""Kernels stage, SASS analysis: a kernel's control flow, its natural loops and its hot loop.

Per kernel a control-flow graph gives the natural loops (back edges to a block that
dominates their source). The steady-state path through a loop follows the fall-through
of each branch (guarded code runs, as in the middle of a long bag) except where the
fall-through block only fails an assertion or traps, and stops at the back edge. The hot
loop is the innermost loop (one that holds no other loop) whose steady-state path
gathers the most rows (row loads plus L2 prefetches); ties go to the shorter path, then
to the lower address.
"""

from __future__ import annotations

from dataclasses import dataclass

from characterize.kernels.sass.loads import accumulates, classify
from characterize.kernels.sass.parse import CONTROL, Instruction, KernelCode


@dataclass(frozen=True)
class Block:
    """A basic block: straight-line instructions, entered at the top, left at the bottom."""

    start: int
    instructions: tuple[Instruction, ...]
    successors: tuple[int, ...]    # block starts; the fall-through first when there is one
    fallthrough: int | None


@dataclass(frozen=True)
class Loop:
    """A natural loop: a header block and the blocks that reach its back edges."""

    kernel: str
    header: int
    blocks: frozenset[int]
    latches: tuple[int, ...]       # addresses of the back-edge instructions
    innermost: bool
    path: tuple[Instruction, ...]  # one steady-state iteration

    @property
    def label(self) -> str:
        return f"0x{self.header:04x}-0x{max(self.latches):04x}"


def basic_blocks(code: KernelCode) -> dict[int, Block]:
    ins = code.instructions
    if not ins:
        return {}
    addrs = {i.address for i in ins}
    leaders = {ins[0].address}
    for k, i in enumerate(ins):
        if i.opcode in CONTROL:
            if i.target is not None and i.target in addrs:
                leaders.add(i.target)
            if k + 1 < len(ins):
                leaders.add(ins[k + 1].address)
    blocks: dict[int, Block] = {}
    current: list[Instruction] = []
    order = sorted(leaders)
    nxt = {a: b for a, b in zip(order, order[1:])}
    for i in ins:
        if i.address in leaders and current:
            blocks[current[0].address] = _close(current, nxt, addrs)
            current = []
        current.append(i)
    if current:
        blocks[current[0].address] = _close(current, nxt, addrs)
    return blocks


def _close(body: list[Instruction], nxt: dict[int, int], addrs: set[int]) -> Block:
    last = body[-1]
    fall = nxt.get(body[0].address)
    succ: list[int] = []
    op = last.opcode
    if op == "BRA":
        if last.conditional and fall is not None:
            succ.append(fall)
        if last.target in addrs:
            succ.append(last.target)
        if not last.conditional:
            fall = None
    elif op == "CALL":  # calls return; an in-function target is also a successor (ptxas uses CALL.REL.NOINC as a jump)
        if fall is not None:
            succ.append(fall)
        if last.target is not None and last.target in addrs:
            succ.append(last.target)
    elif op in ("EXIT", "RET", "BPT", "BRX", "JMX", "JMP"):
        if last.conditional and fall is not None:
            succ.append(fall)
        else:
            fall = None
    elif fall is not None:
        succ.append(fall)
    return Block(body[0].address, tuple(body), tuple(dict.fromkeys(succ)), fall)


def _dominators(blocks: dict[int, Block], entry: int) -> dict[int, set[int]]:
    preds: dict[int, list[int]] = {b: [] for b in blocks}
    reach, stack = {entry}, [entry]
    while stack:
        b = stack.pop()
        for s in blocks[b].successors:
            preds[s].append(b)
            if s not in reach:
                reach.add(s)
                stack.append(s)
    order = sorted(reach)
    dom = {b: set(reach) for b in order}
    dom[entry] = {entry}
    changed = True
    while changed:
        changed = False
        for b in order:
            if b == entry:
                continue
            ps = [dom[p] for p in preds[b] if p in reach]
            new = set.intersection(*ps) | {b} if ps else {b}
            if new != dom[b]:
                dom[b], changed = new, True
    return dom


def is_cold(block: Block) -> bool:
    """A block off the steady-state path: it fails an assertion (a call to an external
    function, __assertfail), traps, or calls an out-of-line slow path (an unguarded
    CALL.REL, e.g. 64-bit division when the operands do not fit 32 bits)."""
    return any((i.opcode == "CALL" and ("ABS" in i.modifiers or not i.predicate)) or i.opcode == "BPT"
               for i in block.instructions)


def _steady_path(blocks: dict[int, Block], header: int, body: frozenset[int]) -> tuple[Instruction, ...]:
    path: list[Instruction] = []
    b, seen = header, set()
    while b not in seen:
        seen.add(b)
        block = blocks[b]
        path += block.instructions
        inside = [s for s in block.successors if s in body]
        if header in inside or not inside:
            break
        if len(inside) == 1:
            b = inside[0]
            continue
        fall = block.fallthrough if block.fallthrough in inside else inside[0]
        other = next(s for s in inside if s != fall)
        b = other if is_cold(blocks[fall]) and not is_cold(blocks[other]) else fall
    return tuple(path)


def find_loops(code: KernelCode) -> list[Loop]:
    """The natural loops of a kernel, with their steady-state paths."""
    blocks = basic_blocks(code)
    if not blocks:
        return []
    entry = code.instructions[0].address
    dom = _dominators(blocks, entry)
    preds: dict[int, set[int]] = {b: set() for b in blocks}
    for b, blk in blocks.items():
        for s in blk.successors:
            preds[s].add(b)
    bodies: dict[int, set[int]] = {}
    latches: dict[int, list[int]] = {}
    for b in dom:
        for h in blocks[b].successors:
            if h in dom.get(b, ()):  # back edge b -> h
                body = bodies.setdefault(h, {h})
                stack = [b]
                while stack:
                    n = stack.pop()
                    if n not in body:
                        body.add(n)
                        stack += [p for p in preds[n] if p in dom]
                latches.setdefault(h, []).append(blocks[b].instructions[-1].address)
    loops = []
    for h, body in sorted(bodies.items()):
        innermost = not any(o != h and o in body for o in bodies)
        frozen = frozenset(body)
        loops.append(Loop(code.name, h, frozen, tuple(sorted(latches[h])), innermost,
                          _steady_path(blocks, h, frozen)))
    return loops


def hot_loop(code: KernelCode) -> Loop | None:
    """The innermost loop gathering the most rows (row loads + prefetches) per
    iteration, among the loops that add what they gather when there are any (a kernel
    with a pooled path and a copy path is judged by the pooled one); ties: the shorter
    steady-state path, then the lower address."""
    best, best_key = None, None
    for loop in find_loops(code):
        if not loop.innermost:
            continue
        cls = classify(loop.path)
        gathers = len(cls.row_loads) + len(cls.prefetches) + len(cls.scatters)
        if gathers == 0:
            continue
        pooled = accumulates(loop.path, cls.row_loads) or bool(cls.prefetches) or bool(cls.scatters)
        key = (not pooled, -gathers, len(loop.path), loop.header)
        if best_key is None or key < best_key:
            best, best_key = loop, key
    return best
