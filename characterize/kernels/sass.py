"""Kernels stage, SASS analysis: what the compiled hot loop of each kernel does.

Why: without a GPU the machine code is the only ground truth. Reading the source
missed that a guarded register prefetch (`if (next < end) slot = row[next]`)
compiles to a load into a temporary plus an immediate move into the slot, so the
warp waits on every "prefetched" row, and that ptxas interleaves consumers between
independent loads on one architecture and not on another. This stage reads the
SASS of every built kernel and scores its hot loop.

How:
1. `cuobjdump -sass` disassembles a built library (cached by the file's content).
2. Each instruction is parsed: guard predicate, opcode and modifiers, the registers
   it writes and reads (`R4.64` is R4 and R5; `.64`/`.128` loads write 2/4
   consecutive registers; IMAD.WIDE and CS2R write a pair), its branch target.
3. Per kernel a control-flow graph gives the natural loops (back edges to a block
   that dominates their source). The hot loop is the innermost loop (one that holds
   no other loop) whose steady-state path gathers the most rows (row loads plus L2
   prefetches); ties go to the shorter path, then to the lower address.
4. The steady-state path through a loop follows the fall-through of each branch
   (guarded code runs, as in the middle of a long bag) except where the fall-through
   block only fails an assertion or traps, and stops at the back edge.
5. Loads are classified by register dataflow along that path, replayed three times
   so that values carried from one iteration to the next count (spilled values
   follow their stack slot): a global load whose address is computed from a value
   loaded or shuffled in the loop is a row load; a global load whose value reaches
   the address of a row load or prefetch, and that gathers nothing itself, is an
   index load; the rest (per-sample weights, offsets) are other loads.
6. Rows in flight: the path is replayed with in-order issue for ITERATIONS
   iterations back to back, registers carried over. An instruction issues one cycle
   after the previous one unless a register it reads or overwrites is not ready; a
   global load's destinations (index and row loads alike) become ready
   MEMORY_LATENCY cycles after issue, other results a few cycles after (a small
   table; a spill reload is an L1 hit). The time spent waiting on global loads,
   divided by the latency, is the number of memory latencies serialized per
   iteration; rows in flight per warp = row loads per iteration / latencies per
   iteration, both the mean over the second half of the replay (steady state). The
   wait excludes the cycles spent issuing, so a loop that issues for a while before
   its one wait scores a little above its row loads; a loop that waits less than
   half a latency per iteration gets Little's law instead, row loads x latency /
   cycles per iteration.

A row load is one gathered load instruction: per warp it moves 32 lanes x its width
(base: a 128-byte segment of a row; warp at D=128: a whole 512-byte row), hence
`bytes_in_flight_per_warp` beside it, and `lookups_per_iteration` counts the
distinct indices the row loads of one iteration gather by.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import threading
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import pandas as pd

from characterize import toolchain
from characterize.errors import BuildError, ToolchainNamedMissing, ToolchainNotFound
from characterize.kernels.build import (
    BuildResult,
    Toolchain,
    cache_root,
    demangle,
)

#: cycles from a global load's issue until its registers are ready (DRAM-like)
MEMORY_LATENCY = 500
#: iterations replayed back to back; the second half is the steady state
ITERATIONS = 8
SASS_CACHE_FORMAT = 1

INSTALL_HINT = ("Install NVIDIA's disassemblers with `pip install 'characterize[sass]'` "
                "(nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels) or install the CUDA "
                "toolkit and set CUDA_HOME.")


# ------------------------------------------------------------------ toolchain
def _tool_version(path: Path) -> str:
    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise ToolchainNotFound(f"{path} did not run: {e}. {INSTALL_HINT}") from None
    m = re.search(r"V(\d+\.\d+\.\d+)", out)
    return m.group(1) if m else (out.strip().splitlines()[-1] if out.strip() else "unknown")


def _find_tool(name: str, env_var: str) -> Toolchain:
    try:
        found = toolchain.find(name, env_var)
    except toolchain.ToolNamedMissing as e:
        raise ToolchainNamedMissing(f"{name}: {e}; point ${env_var} at a {name} executable or unset it") from None
    if found is None:
        raise ToolchainNotFound(f"no {name} found (looked at {toolchain.searched(name, env_var)}); the SASS "
                                f"analysis needs it. {INSTALL_HINT}")
    return Toolchain(found[0], _tool_version(found[0]), found[1])


@lru_cache(maxsize=None)
def find_cuobjdump() -> Toolchain:
    """cuobjdump from $CHARACTERIZE_CUOBJDUMP, PATH, $CUDA_HOME, /usr/local/cuda or a pip wheel."""
    return _find_tool("cuobjdump", "CHARACTERIZE_CUOBJDUMP")


@lru_cache(maxsize=None)
def find_nvdisasm() -> Toolchain:
    """nvdisasm, located like cuobjdump ($CHARACTERIZE_NVDISASM first). cuobjdump reads
    libraries and cubins alike, so the analysis itself only needs cuobjdump."""
    return _find_tool("nvdisasm", "CHARACTERIZE_NVDISASM")


# ---------------------------------------------------------------- disassembly
_TEXT_MEMO: dict[tuple[str, int, int], str] = {}


def disassemble(path: str | Path, *, force: bool = False) -> str:
    """`cuobjdump -sass` of a library, executable or cubin. Cached on disk by the file's
    content and the tool's version, and in memory by path, size and mtime (`force`
    runs cuobjdump again and refreshes both)."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError as e:
        raise BuildError(f"cannot disassemble {path}: {e}") from None
    memo_key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if memo_key in _TEXT_MEMO and not force:
        return _TEXT_MEMO[memo_key]
    tool = find_cuobjdump()
    digest = hashlib.sha256(path.read_bytes())
    digest.update(f"{SASS_CACHE_FORMAT} {tool.version}".encode())
    cached = cache_root() / "sass" / f"{digest.hexdigest()[:24]}.sass"
    if cached.is_file() and not force:
        text = cached.read_text()
    else:
        proc = subprocess.run([str(tool.path), "-sass", str(path)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"{tool.path} -sass {path} failed: {(proc.stderr or proc.stdout).strip()[-2000:]}")
        text = proc.stdout
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".{os.getpid()}-{threading.get_ident()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, cached)
    _TEXT_MEMO[memo_key] = text
    return text


# --------------------------------------------------------------------- parsing
GLOBAL_LOADS = frozenset({"LDG", "LD", "ATOMG", "ATOM"})
LOCAL_MEMORY = frozenset({"LDL", "STL"})
STORES = frozenset({"STG", "ST", "STL", "STS", "RED", "REDG"})
LOADS = GLOBAL_LOADS | frozenset({"LDL", "LDS", "LDSM", "LDC", "ULDC", "ATOMS"})
#: opcodes without register results (every register operand is read)
NO_DEST = STORES | frozenset({
    "BRA", "BRX", "JMP", "JMX", "CALL", "RET", "EXIT", "BSSY", "BSYNC", "BREAK", "WARPSYNC", "BAR", "MEMBAR",
    "CCTL", "CCTLL", "ERRBAR", "NOP", "YIELD", "BPT", "DEPBAR", "NANOSLEEP", "FENCE", "KILL", "LDGSTS", "LDGDEPBAR",
    "ACQBULK", "CGAERRBAR", "SYNCS", "UCGABAR_ARV", "UCGABAR_WAIT", "PREEXIT", "BMOV"})
CONTROL = frozenset({"BRA", "BRX", "JMP", "JMX", "CALL", "RET", "EXIT", "BPT"})
DOUBLE_OPS = frozenset({"DADD", "DMUL", "DFMA", "DMNMX", "DSETP"})
#: global atomics: RED (result unused, nothing waits on it) and ATOM (returns the old value)
ATOMICS = frozenset({"RED", "REDG", "ATOM", "ATOMG"})

_LINE = re.compile(r"^\s*/\*([0-9a-fA-F]{4,})\*/\s+(.*?)\s*;")
_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")
_ARCH = re.compile(r"^\s*arch\s*=\s*(sm_\w+)")
_GUARD = re.compile(r"^@(!?)(U?P[0-6T])\s+")
_REG = re.compile(r"(?<![A-Za-z0-9_])(UR\d+|URZ|UP[0-6]|UPT|R\d+|RZ|P[0-6]|PT)(\.64)?(?![0-9])")
_TARGET = re.compile(r"(0x[0-9a-fA-F]+)\s*$")
_ZERO = frozenset({"RZ", "URZ", "PT", "UPT"})


@dataclass(frozen=True)
class Instruction:
    """One SASS instruction of one kernel, with the registers it reads and writes."""

    kernel: str                    # demangled name
    arch: str
    address: int
    predicate: str                 # guard: "" (always), "P0" or "!P0"
    opcode: str                    # e.g. LDG
    modifiers: tuple[str, ...]     # e.g. ("E", "128", "CONSTANT")
    operands: tuple[str, ...]
    dests: tuple[str, ...]         # registers written (R, UR, P, UP; RZ/PT left out)
    srcs: tuple[str, ...]          # registers read, guard predicate included
    address_regs: tuple[str, ...]  # registers inside the memory operand's brackets
    target: int | None             # branch / call target
    text: str

    @property
    def mnemonic(self) -> str:
        return ".".join((self.opcode,) + self.modifiers)

    @property
    def width_bits(self) -> int:
        """Access width of a load or store (32 unless a .64/.128/.U8-style modifier says)."""
        for m in self.modifiers:
            if m in ("64", "128"):
                return int(m)
            if m in ("U8", "S8"):
                return 8
            if m in ("U16", "S16"):
                return 16
        return 32

    @property
    def is_global_load(self) -> bool:
        if self.opcode == "LD":  # generic load: global unless it is the stack
            return not any(r == "R1" for r in self.address_regs)
        return self.opcode in GLOBAL_LOADS

    @property
    def is_prefetch(self) -> bool:
        return self.opcode == "CCTL" and any(m.startswith("PF") or m.startswith("PML") for m in self.modifiers)

    @property
    def conditional(self) -> bool:
        """Whether a control instruction may fall through: a guard, a predicate operand or .DIV."""
        if self.predicate and self.predicate not in ("PT",):
            return True
        if self.opcode == "BRA" and ("DIV" in self.modifiers or any(re.match(r"!?U?P[0-6]", o) for o in self.operands)):
            return True
        return False


def _regs(operand: str) -> list[str]:
    """Registers named in an operand; `R4.64` is R4 and R5."""
    out = []
    for m in _REG.finditer(operand):
        name, pair = m.group(1), m.group(2)
        if name in _ZERO:
            continue
        out.append(name)
        if pair:
            out.append(_next_reg(name))
    return out


def _mask_predicates(mask: str) -> list[str]:
    try:
        bits = int(mask, 0)
    except ValueError:
        bits = 0x7f
    return [f"P{k}" for k in range(7) if bits >> k & 1]


def _next_reg(name: str, k: int = 1) -> str:
    prefix = "UR" if name.startswith("UR") else "R"
    return f"{prefix}{int(name[len(prefix):]) + k}"


def _widen(regs: list[str], n: int) -> list[str]:
    """A register operand that is the first of `n` consecutive ones."""
    out = []
    for r in regs:
        out.append(r)
        if n > 1 and (r.startswith("R") or r.startswith("UR")):
            out += [_next_reg(r, k) for k in range(1, n)]
    return out


def _dest_width(opcode: str, mods: tuple[str, ...]) -> int:
    if opcode in LOADS or opcode in ("LDGSTS",):
        return 4 if "128" in mods else 2 if "64" in mods else 1
    if (opcode in ("IMAD", "UIMAD") and "WIDE" in mods) or (opcode == "CS2R" and "32" not in mods):
        return 2
    if opcode in DOUBLE_OPS or "64" in mods:
        return 2
    return 1


def parse_instruction(kernel: str, arch: str, address: int, body: str) -> Instruction:
    """One instruction from its text without address and trailing ';'."""
    predicate = ""
    if m := _GUARD.match(body):
        predicate = ("!" if m.group(1) else "") + m.group(2)
        body = body[m.end():]
    head, _, rest = body.partition(" ")
    parts = head.split(".")
    opcode, mods = parts[0], tuple(parts[1:])
    operands = tuple(o.strip() for o in rest.split(",")) if rest.strip() else ()
    dests: list[str] = []
    srcs: list[str] = []
    address_regs: list[str] = []
    ops = list(operands)
    if opcode in NO_DEST or opcode.startswith("UCGA"):
        pass
    elif opcode.endswith("SETP") or opcode in ("PLOP3", "UPLOP3"):
        for o in ops[:2]:
            dests += _regs(o)
        ops = ops[2:]
    elif opcode == "R2P" and ops and ops[0] == "PR":  # R2P PR, R0, mask: writes the masked predicates
        dests += _mask_predicates(ops[-1])
        ops = ops[1:]
    else:
        taken = 0
        while taken < len(ops) and re.fullmatch(r"U?P[0-6T]", ops[taken]):  # leading predicate results
            dests += _regs(ops[taken])
            taken += 1
        if taken < len(ops) and re.fullmatch(r"U?R(\d+|Z)(\.64)?", ops[taken].split(".reuse")[0]):
            dests += _widen(_regs(ops[taken]), _dest_width(opcode, mods))
            taken += 1
            if not opcode.startswith("VOTE"):  # carry-outs right after the result: IADD3 R3, P1, ...
                while taken < len(ops) and re.fullmatch(r"U?P[0-6T]", ops[taken]):
                    dests += _regs(ops[taken])
                    taken += 1
        ops = ops[taken:]
    wide_src = 2 if opcode in DOUBLE_OPS or (opcode not in LOADS and opcode not in STORES and "64" in mods) else 1
    for i, o in enumerate(ops):
        if o == "PR":  # P2R R0, PR, RZ, mask: reads the masked predicates
            srcs += _mask_predicates(ops[-1])
            continue
        if "[" in o:
            inner = o[o.rfind("["):]  # desc[UR4][R2.64+0x8]: the last bracket holds the address
            address_regs += _regs(inner)
            srcs += _regs(o)
            continue
        regs = _regs(o)
        if opcode in STORES and i == len(ops) - 1:
            regs = _widen(regs, _dest_width("LDG", mods))
        elif opcode in ("IMAD", "UIMAD") and "WIDE" in mods and i == 2:
            regs = _widen(regs, 2)
        elif wide_src > 1:
            regs = _widen(regs, wide_src)
        srcs += regs
    if predicate:
        srcs.append(predicate.lstrip("!"))
    target = None
    if opcode in ("BRA", "CALL") and operands and (t := _TARGET.search(operands[-1])):
        target = int(t.group(1), 16)
    return Instruction(kernel, arch, address, predicate, opcode, mods, operands, tuple(dict.fromkeys(dests)),
                       tuple(s for s in dict.fromkeys(srcs) if s != "PT"), tuple(dict.fromkeys(address_regs)),
                       target, body.strip())


@dataclass(frozen=True)
class KernelCode:
    """The SASS of one entry function for one architecture."""

    name: str        # demangled
    mangled: str
    arch: str
    instructions: tuple[Instruction, ...]

    @property
    def short(self) -> str:
        """The name without return type and parameters: chz_rpf_kernel<2>."""
        return _short(self.name)


def _short(name: str) -> str:
    name = re.sub(r"^void\s+", "", name)
    depth = 0
    for i, ch in enumerate(name):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0:
            return name[:i]
    return name


def _functions(text: str) -> list[tuple[str, str, list[tuple[int, str]]]]:
    """(arch, mangled name, [(address, instruction text)]) per function: the cheap split."""
    out: list[tuple[str, str, list[tuple[int, str]]]] = []
    arch = "unknown"
    current: list[tuple[int, str]] | None = None
    for line in text.splitlines():
        if m := _LINE.match(line):
            if current is not None:
                current.append((int(m.group(1), 16), m.group(2)))
        elif m := _FUNCTION.match(line):
            current = []
            out.append((arch, m.group(1), current))
        elif m := _ARCH.match(line):
            arch, current = m.group(1), None
    return [f for f in out if f[2]]


def _kernel(arch: str, mangled: str, lines: list[tuple[int, str]]) -> KernelCode:
    name = demangle(mangled)
    return KernelCode(name, mangled, arch, tuple(parse_instruction(name, arch, a, t) for a, t in lines))


def parse_sass(text: str) -> list[KernelCode]:
    """Every function in `cuobjdump -sass` output."""
    return [_kernel(*f) for f in _functions(text)]


class KernelTable(Mapping[str, KernelCode]):
    """The kernels of one disassembly by short name (chz_rpf_kernel<2>), each parsed
    on first use: a library holds 15 kernels and an analysis reads a few."""

    def __init__(self, text: str):
        self._raw = {_short(demangle(mangled)): (arch, mangled, lines) for arch, mangled, lines in _functions(text)}
        self._parsed: dict[str, KernelCode] = {}

    def __getitem__(self, name: str) -> KernelCode:
        if name not in self._parsed:
            self._parsed[name] = _kernel(*self._raw[name])
        return self._parsed[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)


_KERNEL_MEMO: dict[tuple[str, int, int], KernelTable] = {}


def kernels_in(path: str | Path, *, force: bool = False) -> KernelTable:
    """The kernels of a library or cubin, by short name (chz_rpf_kernel<2>); `force`
    disassembles again."""
    path = Path(path)
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _KERNEL_MEMO or force:
        _KERNEL_MEMO[key] = KernelTable(disassemble(path, force=force))
    return _KERNEL_MEMO[key]


def instruction_frame(kernels: Iterable[KernelCode]) -> pd.DataFrame:
    """One row per instruction: kernel, arch, address, predicate, opcode, modifiers,
    dests, srcs, target, text."""
    rows = [{"kernel": i.kernel, "arch": i.arch, "address": i.address, "predicate": i.predicate,
             "opcode": i.opcode, "modifiers": ".".join(i.modifiers), "dests": i.dests, "srcs": i.srcs,
             "address_regs": i.address_regs, "target": i.target, "text": i.text}
            for k in kernels for i in k.instructions]
    return pd.DataFrame(rows, columns=["kernel", "arch", "address", "predicate", "opcode", "modifiers", "dests",
                                       "srcs", "address_regs", "target", "text"])


# ----------------------------------------------------------------------- loops
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


def _blocks(code: KernelCode) -> dict[int, Block]:
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


def _cold(block: Block) -> bool:
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
        b = other if _cold(blocks[fall]) and not _cold(blocks[other]) else fall
    return tuple(path)


def find_loops(code: KernelCode) -> list[Loop]:
    """The natural loops of a kernel, with their steady-state paths."""
    blocks = _blocks(code)
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


# -------------------------------------------------------------- dataflow, replay
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


@dataclass(frozen=True)
class Replay:
    """Steady-state figures of the in-order replay, per iteration."""

    cycles_per_iteration: float
    memory_stall_per_iteration: float
    latencies_per_iteration: float


def replay(path: Sequence[Instruction], memory_latency: int = MEMORY_LATENCY, iterations: int = ITERATIONS) -> Replay:
    """In-order issue of `iterations` back-to-back iterations of the path, registers
    carried over; figures are means over the second half (steady state)."""
    ready: dict[str, tuple[int, bool]] = {}   # register -> (ready time, written by a global load)
    t_prev = -1
    per_iteration: list[tuple[int, int]] = []
    for _ in range(iterations):
        start, stall = t_prev + 1, 0
        for i in path:
            earliest = t_prev + 1
            other = mem = earliest
            for r in i.srcs + i.dests:
                when, from_memory = ready.get(r, (0, False))
                if from_memory:
                    mem = max(mem, when)
                else:
                    other = max(other, when)
            t = max(other, mem)
            if mem > other:
                stall += mem - other
            lat = _latency(i, memory_latency)
            for d in i.dests:
                ready[d] = (t + lat, i.is_global_load)
            t_prev = t
        per_iteration.append((t_prev + 1 - start, stall))
    steady = per_iteration[iterations // 2:] or per_iteration
    cycles = sum(c for c, _ in steady) / len(steady)
    stall = sum(s for _, s in steady) / len(steady)
    return Replay(cycles, stall, stall / memory_latency)


# -------------------------------------------------------------------- reports
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

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["load_bits"] = dict(sorted(self.load_bits.items()))
        return out


#: widths of the loads of an int8 row's scale and bias: one each (base, rpf) or both at once (warp);
#: the values are loaded 8 bits (base, rpf) or 128 bits (warp) wide, so widths tell them apart
QPARAM_LOAD_BITS = {"int8": frozenset({32, 64}), "int8h": frozenset({16, 32})}


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
    qbits = QPARAM_LOAD_BITS.get(dtype, frozenset())
    qparams = {i.address for i in path if i.address in cls.row_loads and i.width_bits in qbits}
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
        variant=variant, arch=arch or (path[0].arch if path else ""), kernel=_short(loop.kernel), loop=loop.label,
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
        atomic_bits=sum(_atomic_bits(i) for i in path if i.opcode in ATOMICS))


def hot_loop(code: KernelCode) -> Loop | None:
    """The innermost loop gathering the most rows (row loads + prefetches) per
    iteration; ties: the shorter steady-state path, then the lower address."""
    best, best_key = None, None
    for loop in find_loops(code):
        if not loop.innermost:
            continue
        cls = classify(loop.path)
        gathers = len(cls.row_loads) + len(cls.prefetches) + len(cls.scatters)
        if gathers == 0:
            continue
        key = (-gathers, len(loop.path), loop.header)
        if best_key is None or key < best_key:
            best, best_key = loop, key
    return best


def analyze_kernel(code: KernelCode, **kw: Any) -> LoopRow | None:
    """The hot loop of one kernel, analyzed (None when no loop gathers anything)."""
    loop = hot_loop(code)
    return analyze_loop(loop, **kw) if loop is not None else None


def kernel_code(result: BuildResult, kernel: str) -> KernelCode:
    """The SASS of `kernel` (short name, e.g. chz_rpf_kernel<2>) in a build."""
    found = kernels_in(result.library)
    if kernel not in found:
        raise BuildError(f"kernel {kernel!r} not in the SASS of the {result.spec.label()} build; "
                         f"have: {', '.join(sorted(found))}")
    return found[kernel]


