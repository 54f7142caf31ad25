"""Kernels stage, SASS analysis: the loop nest around a kernel's hot loop, replayed per bag length.

One task of the nest (a bag per lane group) is walked along its steady path with the
hot loop run as many times as a bag of L lookups needs, and replayed in order: the
memory latencies a warp serializes at each bag length of NEST_L (the model
interpolates between them). The replays are most of a warm run's time, so they are
cached on disk beside the disassembly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

from characterize.kernels.diskcache import entry_key, get_or_compute, source_digest
from characterize.kernels.sass.loads import classify
from characterize.kernels.sass.loops import Block, Loop, basic_blocks, find_loops, hot_loop, is_cold
from characterize.kernels.sass.parse import LOCAL_MEMORY, Instruction, KernelCode
from characterize.kernels.sass.replay import MEMORY_LATENCY, replay

#: bag lengths at which the loop nest is replayed: the model interpolates between them
#: and extrapolates past the last with the slope of the last two
NEST_L = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: the bag length rows in flight over the nest are quoted at (the paper's L)
REFERENCE_L = 150
#: latency of an index or offset load on a lane-uniform stream relative to a row's: one load
#: in 16 opens a new 128-byte line of 8-byte indices (a DRAM or L2 latency), the others hit L1
#: (~35 of ~600 cycles): (1 + 15 x 0.06) / 16 ~ 0.1
INDEX_LATENCY_RATIO = 0.1


@dataclass(frozen=True)
class Nest:
    """The loops one lookup kernel runs a bag through: the hot loop, the loop that
    loads a tile of indices for it (if any: its index loads feed the hot loop's gathers
    through registers or shuffles), and the loop over tasks around them (bags or (bag,
    chunk) tasks; None when the kernel body runs one task). With a tile loop, the loop
    over tasks is the one right around it, and loops around that one are `outer`: they
    set a run of tasks up (tbe's loop over the tables of a warp's slice of tasks), once
    per run, not once per bag."""

    hot: Loop
    tile: Loop | None
    root: Loop | None
    lanes_per_bag: int        # lanes that share one bag (32 for a warp or a thread per feature)
    tile_lookups: int         # lookups of one bag whose indices one tile loads (0: no tile loop)
    hot_lookups: int          # lookups of one bag one hot iteration gathers
    row_mnemonics: frozenset[str]  # how the hot loop gathers rows (its remainder code elsewhere does alike)
    load_mnemonics: frozenset[str] = frozenset()  # every global load of the hot loop (to tell its remainder)
    tile_loads: frozenset[int] = frozenset()      # the tile loop's index loads (each lane a different index)
    outer: Loop | None = None                     # the outermost loop around the loop over tasks, if any


class Gate(Protocol):
    """What a bag of a given length runs at a two-way branch: whether it enters a block,
    and what entering it consumes of the bag."""

    def admits(self, block: Block) -> bool: ...

    def enter(self, block: Block) -> None: ...


class _Avoid:
    """A gate that keeps out of blocks loading like `avoid` (remainder code of the hot loop)."""

    def __init__(self, avoid: frozenset[str]):
        self.avoid = avoid

    def admits(self, block: Block) -> bool:
        return not any(i.mnemonic in self.avoid for i in block.instructions)

    def enter(self, block: Block) -> None:
        return None


def _forest(code: KernelCode) -> tuple[dict[int, Block], dict[int, Loop], dict[int, int | None]]:
    """Blocks, loops by header, and each loop's enclosing loop (None: outermost)."""
    blocks = basic_blocks(code)
    loops = {lp.header: lp for lp in find_loops(code)}
    parent: dict[int, int | None] = {}
    for h, lp in loops.items():
        outer = [o for o in loops.values() if o.header != h and h in o.blocks and lp.blocks <= o.blocks]
        parent[h] = min(outer, key=lambda o: len(o.blocks)).header if outer else None
    return blocks, loops, parent


def _feeding_loads(path: Sequence[Instruction], targets: Iterable[int], depth: int = 24,
                   values: bool = False) -> set[int]:
    """The global loads nearest upstream of the address registers of `targets` (or of
    all their sources, `values`), through arithmetic and shuffles, wrapping around once:
    which loads the targets gather by."""
    n = len(path)
    pos = {i.address: k for k, i in enumerate(path)}
    found: set[int] = set()

    def writers(k: int, regs: Iterable[str]) -> list[int]:
        out = []
        for r in regs:
            for step in range(1, n + 1):
                j = (k - step) % n
                if r in path[j].dests:
                    out.append(j)
                    break
        return out

    for t in targets:
        if t not in pos:
            continue
        k = pos[t]
        frontier, seen = writers(k, path[k].srcs if values else path[k].address_regs), set()
        for _ in range(depth):
            nxt = []
            for j in frontier:
                if j in seen:
                    continue
                seen.add(j)
                if path[j].is_global_load:
                    found.add(path[j].address)
                else:
                    nxt += writers(j, [r for r in path[j].srcs if r not in ("PT",)])
            frontier = nxt
            if not frontier:
                break
    return found


def _lanes_per_bag(path: Sequence[Instruction]) -> int:
    """Lanes sharing one bag, from the segment of the hot loop's shuffles (SHFL.IDX's
    last operand packs 32 - segment width above its lane mask: 0x1f is the whole warp,
    0x181f segments of 8 lanes); 32 without shuffles."""
    widths = []
    for i in path:
        if i.opcode == "SHFL" and i.operands:
            try:
                c = int(i.operands[-1], 0)
            except ValueError:
                continue
            widths.append(32 - ((c >> 8) & 0x1f))
    return min(widths) if widths else 32


def loop_nest(code: KernelCode, hot: Loop | None = None) -> Nest | None:
    """The nest around a kernel's hot loop (None when it has none)."""
    hot = hot or hot_loop(code)
    if hot is None:
        return None
    blocks, loops, parent = _forest(code)
    cls = classify(hot.path)
    lanes = _lanes_per_bag(hot.path)
    chain = [hot.header]
    while parent.get(chain[-1]) is not None:
        chain.append(parent[chain[-1]])
    tile, tile_lookups, tile_loads = None, 0, []
    shuffles = [i.address for i in hot.path if i.opcode == "SHFL"]
    if len(chain) > 1 and shuffles:
        # a tile: each lane loads indices in the enclosing loop, the hot loop broadcasts them
        p = loops[chain[1]]
        own = _walk_once(blocks, loops, parent, p, {hot.header: [*hot.path]})
        fed = _feeding_loads(own, shuffles, values=True)
        inside_hot = {i.address for i in hot.path}
        tile_loads = [i for i in own if i.address in fed and i.address not in inside_hot]
        if tile_loads:
            tile = p
            tile_lookups = lanes * sum(max(1, i.width_bits // 64) for i in tile_loads)
    # the loop over tasks: the outermost one, except that with a tile loop it is the loop
    # right around the tile (the tile walks a bag's indices, its parent moves to the next bag)
    at = min(len(chain) - 1, 2) if tile is not None else len(chain) - 1
    root = loops[chain[at]] if len(chain) > 1 else None
    outer = loops[chain[-1]] if len(chain) - 1 > at else None
    rows = frozenset(i.mnemonic for i in hot.path if i.address in cls.row_loads)
    loads = frozenset(i.mnemonic for i in hot.path if i.is_global_load)
    return Nest(hot, tile, root, lanes, tile_lookups, max(1, cls.lookups), rows, loads,
                frozenset(i.address for i in tile_loads) if tile is not None else frozenset(), outer)


def interpolate(samples: Mapping[Any, float], L: float) -> float | None:
    """A per-task figure at bag length L from figures at NEST_L (keys may be strings, as
    read back from JSON): linear between them, the last slope beyond."""
    pts = sorted((float(k), float(v)) for k, v in samples.items()) if samples else []
    if not pts:
        return None
    if L <= pts[0][0]:
        return pts[0][1] * max(L, 0.0) / pts[0][0] if pts[0][0] > 0 else pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if L <= x1:
            return y0 + (y1 - y0) * (L - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = pts[-2], pts[-1]
    return y1 + (y1 - y0) / (x1 - x0) * (L - x1)


def _choose(blocks: dict[int, Block], block: Block, inside: list[int], gate: Gate | None = None) -> int:
    """The successor a steady execution takes: the fall-through, unless it only fails
    an assertion, or `gate` says a bag of this length does not enter it (code for lookups
    or indices the bag does not have left, such as an unrolled loop's remainder) while it
    enters the other way."""
    fall = block.fallthrough if block.fallthrough in inside else inside[0]
    other = next((b for b in inside if b != fall), fall)
    if is_cold(blocks[fall]) and not is_cold(blocks[other]):
        return other
    if gate is not None and not gate.admits(blocks[fall]) and gate.admits(blocks[other]):
        return other
    return fall


def _exit_of(blocks: dict[int, Block], loop: Loop, region: frozenset[int] | None) -> int | None:
    """Where execution continues after `loop`: its latch's fall-through, else its first
    successor outside it (inside `region`)."""
    outside = []
    for latch_addr in loop.latches:
        blk = next((b for b in loop.blocks if latch_addr in {i.address for i in blocks[b].instructions}), None)
        if blk is not None:
            f = blocks[blk].fallthrough
            if f is not None and f not in loop.blocks:
                outside.append(f)
    for b in sorted(loop.blocks):
        outside += [s for s in blocks[b].successors if s not in loop.blocks]
    outside = [b for b in outside if region is None or b in region]
    return outside[0] if outside else None


def _walk_once(blocks: dict[int, Block], loops: dict[int, Loop], parent: dict[int, int | None], loop: Loop | None,
               expand: "dict[int, list[Instruction]] | Callable[[Loop], list[Instruction] | None]",
               avoid: frozenset[str] = frozenset(), start: int | None = None,
               after: frozenset[int] = frozenset(),
               gate: Gate | None = None) -> list[Instruction]:
    """One iteration of `loop` (the kernel body when None) along its steady path, each
    child loop met replaced by what `expand` gives for it (a dict by header, or a
    function called in path order; None or a missing entry: its own steady path once).
    A branch is taken towards a child loop in `after` (the loops around the hot loop)
    while it is still ahead; once it has run, remainder code that loads like `avoid` is
    passed by where the branch allows. `gate` (when given) decides every other two-way
    branch: it says whether a bag enters a block (and counts what the block consumes of
    the bag when it does)."""
    region = loop.blocks if loop is not None else None
    header = loop.header if loop is not None else None
    b = header if header is not None else (start if start is not None else min(blocks))
    path: list[Instruction] = []
    seen: set[int] = set()
    avoiding: frozenset[str] = frozenset()
    while b is not None and b not in seen and (region is None or b in region):
        if b != header and b in loops and parent.get(b) == header:   # a child loop
            child = loops[b]
            body = expand(child) if callable(expand) else expand.get(b)
            path += child.path if body is None else body
            seen |= child.blocks
            if b in after:
                avoiding = avoid
            b = _exit_of(blocks, child, region)
            continue
        seen.add(b)
        block = blocks[b]
        path += block.instructions
        if header is not None and header in block.successors:
            break
        inside = [s for s in block.successors if (region is None or s in region) and s not in seen]
        if not inside:
            break
        if len(inside) > 1 and not avoiding:
            ahead = [t for t in after if t != header and t not in seen and (region is None or t in region)]
            toward = [s for s in inside if any(_reaches(blocks, s, t, region, header) for t in ahead)]
            if len(toward) == 1:
                b = toward[0]
                continue
        if len(inside) == 1:
            b = inside[0]
        elif gate is not None:
            b = _choose(blocks, block, inside, gate)
            gate.enter(blocks[b])
        else:
            b = _choose(blocks, block, inside, _Avoid(avoiding) if avoiding else None)
    return path


def _reaches(blocks: dict[int, Block], source: int, target: int, region: frozenset[int] | None,
             header: int | None) -> bool:
    """Whether `target` can be reached from `source` inside `region` without passing
    through `header` (without going round the loop again)."""
    stack, seen = [source], {header}
    while stack:
        b = stack.pop()
        if b == target:
            return True
        if b in seen or (region is not None and b not in region):
            continue
        seen.add(b)
        stack += blocks[b].successors
    return False


class _Bag:
    """The gate of a bag of L lookups: what is left of it to stream (a bounds check over
    its indices, once a loop streaming them has been met) and to gather (once the hot
    loop ran: its unrolled remainder). A block is entered only when what it loads fits
    in what is left, the largest pieces first, as the unrolled code of a compiler takes
    them (a check unrolled by 16, then 8, then 4, then one at a time)."""

    def __init__(self, nest: Nest, L: int, blocks: dict[int, Block], prologue: int | None = None):
        self.blocks = blocks
        self.rows = frozenset(nest.row_mnemonics)
        self.loads = frozenset(nest.load_mnemonics)
        hot_rows = sum(1 for i in nest.hot.path if i.is_global_load and i.mnemonic in self.rows)
        self.rows_per_lookup = max(hot_rows, 1) / nest.hot_lookups
        self.indices_left = L          # indices a streaming loop or block has not checked yet
        self.streaming = False         # a loop streaming the bag's indices has been met
        self.gathered = False          # the hot loop ran: what is left is its remainder's
        self.lookups_left = 0.0        # lookups the hot loop left to its remainder
        self.claimed: set[int] = set() # remainder row loads already counted against them
        self.peeled = prologue is not None    # remainder code before the hot loop is gated too
        self.prologue_left = float(prologue or 0)  # lookups that remainder takes
        self.prologue_taken = 0.0

    def gather(self, lookups: float) -> None:
        """The hot loop ran, leaving `lookups` of the bag (or of its tile) to its remainder."""
        self.gathered = True
        self.lookups_left += lookups
        self.claimed = set()

    def _rows_ahead(self, block: Block) -> list[int]:
        """The remainder row loads a branch into `block` leads to: its own, else those of
        the first block after it (past an index load and the assertion on it) that has
        some, following the one way that is not cold; none past a two-way branch."""
        b: Block | None = block
        for _ in range(6):
            if b is None:
                break
            rows = [i.address for i in b.instructions if i.is_global_load and i.mnemonic in self.rows
                    and i.address not in self.claimed]
            if rows:
                return rows
            if not any(i.is_global_load and i.mnemonic in self.loads for i in b.instructions) and b is not block:
                break
            warm = [s for s in b.successors if s in self.blocks and not is_cold(self.blocks[s])]
            b = self.blocks[warm[0]] if len(warm) == 1 else None
        return []

    def lookups(self, block: Block) -> float:
        """Lookups a block of remainder code gathers: its unconditional row loads (a
        predicated one beyond them is a lookup a shorter bag skips), else its predicated ones."""
        rows = [i for i in block.instructions if i.is_global_load and i.mnemonic in self.rows]
        always = sum(1 for i in rows if not i.predicate)
        return (always or len(rows)) / self.rows_per_lookup

    def _need(self, block: Block) -> tuple[str, float, list[int]] | None:
        if self.gathered:
            rows = self._rows_ahead(block)
            return ("lookups_left", self.lookups(self.blocks[self._owner(rows[0])]), rows) if rows else None
        if self.peeled:
            rows = self._rows_ahead(block)
            if rows:
                return "prologue_left", self.lookups(self.blocks[self._owner(rows[0])]), rows
        loads = [i for i in block.instructions if i.is_global_load]
        if self.streaming and loads and not any(i.mnemonic in self.rows for i in loads):
            return "indices_left", float(sum(1 for i in loads if not i.predicate)), []
        return None

    def _owner(self, address: int) -> int:
        return next(b for b, blk in self.blocks.items() if any(i.address == address for i in blk.instructions))

    def admits(self, block: Block) -> bool:
        need = self._need(block)
        return need is None or getattr(self, need[0]) >= need[1] - 1e-9

    def enter(self, block: Block) -> None:
        need = self._need(block)
        if need is not None:
            setattr(self, need[0], max(0.0, getattr(self, need[0]) - need[1]))
            if need[0] == "prologue_left":
                self.prologue_taken += need[1]
            self.claimed.update(need[2])


def nest_latencies(code: KernelCode, nest: Nest, L: int, memory_latency: int = MEMORY_LATENCY,
                   from_outer: bool = False) -> tuple[float, int]:
    """(memory latencies a warp serializes, instructions it issues) for one task of the
    nest (one bag per lane group: a warp's 32 / lanes_per_bag bags, or a (bag, chunk)
    for a thread-per-feature kernel) with bags of L lookups: the root's steady path with
    the tile loop run once per tile of the bag (the last one partial), the hot loop as
    many times as the lookups need, loops that only stream the bag's indices (a bounds
    check, with its unrolled remainder loops) as many times as the indices they have
    left, and at each branch the way a bag of L takes (_Bag: the unrolled pieces of the
    check that fit what is left of the bag, the hot loop's remainder code for the lookups
    the hot loop left); lookups left with no remainder code on the path count as that
    fraction of a hot iteration's latencies. Rows and tile index loads take the memory
    latency; every other load (a lane-uniform index or offset stream, 8 bytes a step
    through 128-byte lines) takes INDEX_LATENCY_RATIO of it, since most of them hit L1,
    except the first load of each stream (the bag's offsets, its indices): the waits are
    in units of a row's latency. `from_outer`: one iteration of the outer loop instead,
    its loop over tasks run once (what a run of tasks costs beyond its tasks is the
    difference)."""
    blocks, loops, parent = _forest(code)
    hot = nest.hot
    tile = nest.tile_lookups
    chunks = ([tile] * (L // tile) + ([L % tile] if L % tile else [])) if tile else [L]
    chunks = chunks or [0]
    ancestors = {hot.header}
    q = hot.header
    while parent.get(q) is not None:
        q = parent[q]
        ancestors.add(q)
    after = frozenset(ancestors)
    # without remainder code (no block around the hot loop gathers like it) the hot loop
    # itself takes a bag's last, partial step: a whole iteration, its missing lookups
    # loading a stand-in row or predicated off
    around = loops[parent[hot.header]].blocks if parent.get(hot.header) is not None else frozenset(blocks)
    remainder = any(i.is_global_load and i.mnemonic in nest.row_mnemonics and i.address not in nest.tile_loads
                    for b in around - hot.blocks for i in blocks[b].instructions)
    bag = _Bag(nest, L, blocks, _prologue(blocks, nest, around, parent.get(hot.header), L)
               if remainder and not tile else None)

    def child(lp: Loop, chunk: int) -> list[Instruction] | None:
        if lp.header == hot.header:
            if not tile:
                chunk = max(0, chunk - int(round(bag.prologue_taken)))
            trips = int(chunk / nest.hot_lookups) if remainder else -(-chunk // nest.hot_lookups)
            bag.gather(max(0, chunk - trips * nest.hot_lookups))
            return [*hot.path] * trips
        if nest.tile is not None and lp.header == nest.tile.header:
            body: list[Instruction] = []
            for c in chunks:
                body += _walk_once(blocks, loops, parent, lp, lambda x, c=c: child(x, c), nest.load_mnemonics,
                                   after=after, gate=bag)
            return body
        inner = _walk_once(blocks, loops, parent, lp, lambda x: child(x, chunk), nest.load_mnemonics, after=after,
                           gate=bag)
        loads = [i for i in lp.path if i.is_global_load]
        if lp.header not in ancestors and loads and not classify(lp.path).row_loads:
            bag.streaming = True
            trips = int(bag.indices_left) // len(loads)      # streams the bag's indices (a bounds check)
            bag.indices_left -= trips * len(loads)
            return inner * trips
        return inner

    root = nest.outer if from_outer and nest.outer is not None else nest.root
    start = None if root is not None else code.instructions[0].address
    task = _walk_once(blocks, loops, parent, root, lambda x: child(x, chunks[0] if tile else L), nest.load_mnemonics,
                      start=start, after=after, gate=bag)
    short = max(1, int(round(memory_latency * INDEX_LATENCY_RATIO)))
    latency = {i.address: short for i in task if i.is_global_load and i.mnemonic not in nest.row_mnemonics
               and i.address not in nest.tile_loads}
    # a task's first index (and offset) loads open lines no one has read yet: a whole latency
    firsts = _first_index_loads(task, latency)
    rep = replay(task, memory_latency, iterations=2, load_latency=latency, first_full=firsts)
    hot_rep = replay(hot.path, memory_latency, load_latency=latency)
    left = bag.lookups_left / nest.hot_lookups      # lookups no remainder code on the path gathered
    extra = left * hot_rep.latencies_per_iteration
    return rep.latencies_per_iteration + extra, len(task) + int(round(left * len(hot.path)))


def _prologue(blocks: dict[int, Block], nest: Nest, around: frozenset[int], stop: int | None, L: int) -> int:
    """Lookups of a bag of L that remainder code before the hot loop gathers: L modulo the
    smallest piece the code from the hot loop on gathers (the hot loop, or an unrolled
    block after it), as a compiler peels a loop's remainder ahead of its unrolled body."""
    gauge = _Bag(nest, L, blocks)
    stack = [s for b in nest.hot.blocks for s in blocks[b].successors if s in around and s not in nest.hot.blocks]
    seen: set[int] = set()
    pieces = [nest.hot_lookups]
    while stack:
        b = stack.pop()
        if b in seen or b in nest.hot.blocks or b not in around:
            continue
        seen.add(b)
        if any(i.is_global_load and i.mnemonic in gauge.rows for i in blocks[b].instructions):
            pieces.append(max(1, int(round(gauge.lookups(blocks[b])))))
        stack += [s for s in blocks[b].successors if s != stop]
    return L % min(pieces)


def _depth(task: Sequence[Instruction], k: int, memo: dict[int, int], hops: int = 48) -> int:
    """How many global loads deep the address of the load at `k` is: 0 for an address
    from parameters and counters (a bag's offsets), 1 for one read from a load (its
    indices, at the offsets read), and so on; traced up the path through arithmetic."""
    if k in memo:
        return memo[k]
    memo[k] = 0
    deepest, frontier, seen = 0, [(k, r) for r in task[k].address_regs], set()
    for _ in range(hops):
        nxt = []
        for at, reg in frontier:
            j = next((j for j in range(at - 1, -1, -1) if reg in task[j].dests), None)
            if j is None or j in seen:
                continue
            seen.add(j)
            if task[j].is_global_load:
                deepest = max(deepest, 1 + _depth(task, j, memo, hops))
            else:
                nxt += [(j, r) for r in task[j].srcs if r not in ("PT", "UPT")]
        frontier = nxt
        if not frontier:
            break
    memo[k] = deepest
    return deepest


def _first_index_loads(task: Sequence[Instruction], short: Mapping[int, int]) -> set[int]:
    """The short-latency loads of a task that load its bag's first indices: the first
    short load met on the path, and the first one inside each loop that streams them
    (the first instruction of each distinct load site until one repeats), one per
    level of the chain (the offsets, the indices read at them, ...): a later load of the
    same level reads lines the first one opened (the lookups reading the indices a
    bounds check just read hit L1)."""
    out: set[int] = set()
    seen: set[int] = set()
    levels: set[int] = set()
    memo: dict[int, int] = {}
    for k, i in enumerate(task):
        if i.address in short:
            if i.address in seen:
                break
            seen.add(i.address)
            level = _depth(task, k, memo)
            if level in levels:
                continue
            levels.add(level)
            out.add(i.address)
    return out


@lru_cache(maxsize=1)
def _analysis_digest() -> str:
    """The SASS analysis's source (every module of this package, by name and content): a
    cached nest replay is reused only by the analysis that made it."""
    return source_digest(Path(__file__).resolve().parent)[:16]


def nest_facts(code: KernelCode, loop: Loop, memory_latency: int) -> dict[str, Any] | None:
    """The loop nest of `code` replayed at every bag length of NEST_L and at REFERENCE_L
    (None without a nest). The replays are most of a warm run's time, so they are kept
    in the disk cache (sass/nest/) beside the disassembly, keyed by the kernel's
    instructions, the latency and the analysis's source; a damaged entry is computed again."""
    key = entry_key(f"{_analysis_digest()} {memory_latency} {NEST_L} {REFERENCE_L} {code.arch} "
                 f"{code.mangled} {loop.header}\n{code.instructions!r}")
    return get_or_compute("sass/nest", key, lambda: _replayed(code, loop, memory_latency),
                          read=lambda p: json.loads(p.read_text())["facts"],
                          write=lambda facts: json.dumps({"facts": facts}), suffix=".json")


def _replayed(code: KernelCode, loop: Loop, memory_latency: int) -> dict[str, Any] | None:
    n = loop_nest(code, loop)
    if n is None:
        return None
    bags = []
    for L in NEST_L:
        total, count = nest_latencies(code, n, L, memory_latency)
        bags.append([L, round(total, 3), count])
    reference = nest_latencies(code, n, REFERENCE_L, memory_latency)[0]
    setup = 0.0
    if n.outer is not None:   # the outer loop's own waits: once per run of tasks
        setup = max(0.0, nest_latencies(code, n, REFERENCE_L, memory_latency, from_outer=True)[0] - reference)
    return {"bags": bags, "reference": reference, "setup": round(setup, 3),
            "lanes_per_bag": n.lanes_per_bag, "tile_lookups": n.tile_lookups, "spills": _nest_spills(code, n)}


def _nest_spills(code: KernelCode, nest: Nest) -> int:
    """LDL/STL inside the loops of the nest (the root's blocks, or the hot loop's)."""
    top = nest.outer or nest.root
    region = top.blocks if top is not None else nest.hot.blocks
    blocks = basic_blocks(code)
    return sum(1 for b in region for i in blocks[b].instructions if i.opcode in LOCAL_MEMORY)
