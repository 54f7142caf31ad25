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

import contextlib
import dataclasses
import hashlib
import json
import re
import subprocess
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import pandas as pd

from characterize import toolchain
from characterize.errors import BuildError, OutputError, ToolchainNamedMissing, ToolchainNotFound
from characterize.files import write_atomic
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
        write_atomic(cached, text)
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
_ARCH = re.compile(r"^\s*(?:arch\s*=|code for)\s*(sm_\w+)")
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
        """A load from global memory: LDG, a generic LD not on the stack, a global atomic,
        or an asynchronous copy to shared memory (LDGSTS, cp.async), whose data a later
        DEPBAR waits for instead of a register."""
        if self.opcode == "LD":  # generic load: global unless it is the stack
            return not any(r == "R1" for r in self.address_regs)
        return self.opcode in GLOBAL_LOADS or self.opcode == "LDGSTS"

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

    def latencies_at(self, L: float) -> float | None:
        """Memory latencies per task for bags of L lookups, interpolated between the
        replayed lengths and extrapolated past the last with the last slope."""
        return interpolate(self.bag_latencies, L)


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
        row_load_bits=max((i.width_bits for i in path if i.address in row_loads), default=0),
        atomic_bits=sum(_atomic_bits(i) for i in path if i.opcode in ATOMICS))


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


# ------------------------------------------------------------------ loop nests
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


def _forest(code: KernelCode) -> tuple[dict[int, Block], dict[int, Loop], dict[int, int | None]]:
    """Blocks, loops by header, and each loop's enclosing loop (None: outermost)."""
    blocks = _blocks(code)
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


def _choose(blocks: dict[int, Block], block: Block, inside: list[int], avoid: frozenset[str]) -> int:
    """The successor a steady execution takes: the fall-through, unless it only fails
    an assertion, or (once the hot loop ran) it is remainder code gathering like the hot
    loop while the other way does not."""
    fall = block.fallthrough if block.fallthrough in inside else inside[0]
    other = next((b for b in inside if b != fall), fall)
    if _cold(blocks[fall]) and not _cold(blocks[other]):
        return other
    if avoid:
        def gathers(b: int) -> bool:
            return any(i.mnemonic in avoid for i in blocks[b].instructions)
        if gathers(fall) and not gathers(other):
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
               after: frozenset[int] = frozenset()) -> list[Instruction]:
    """One iteration of `loop` (the kernel body when None) along its steady path, each
    child loop met replaced by what `expand` gives for it (a dict by header, or a
    function called in path order; None or a missing entry: its own steady path once).
    A branch is taken towards a child loop in `after` (the loops around the hot loop)
    while it is still ahead; once it has run, remainder code that loads like `avoid` is
    passed by where the branch allows."""
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
        b = inside[0] if len(inside) == 1 else _choose(blocks, block, inside, avoiding)
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


def nest_latencies(code: KernelCode, nest: Nest, L: int, memory_latency: int = MEMORY_LATENCY,
                   from_outer: bool = False) -> tuple[float, int]:
    """(memory latencies a warp serializes, instructions it issues) for one task of the
    nest (one bag per lane group: a warp's 32 / lanes_per_bag bags, or a (bag, chunk)
    for a thread-per-feature kernel) with bags of L lookups: the root's steady path with
    the tile loop run once per tile of the bag (the last one partial), the hot loop as
    many times as the lookups need (a fraction of an iteration counted as that fraction
    of its latencies), loops that only stream the bag's indices (a bounds check, with its
    unrolled remainder loops) as many times as the indices they have left, and the
    remainder code of the unrolled hot loop passed where a path around it exists. Rows
    and tile index loads take the memory latency; every other load (a lane-uniform index
    or offset stream, 8 bytes a step through 128-byte lines) takes INDEX_LATENCY_RATIO of
    it, since most of them hit L1: the waits are in units of a row's latency.
    `from_outer`: one iteration of the outer loop instead, its loop over tasks run once
    (what a run of tasks costs beyond its tasks is the difference)."""
    blocks, loops, parent = _forest(code)
    hot = nest.hot
    tile = nest.tile_lookups
    chunks = ([tile] * (L // tile) + ([L % tile] if L % tile else [])) if tile else [L]
    chunks = chunks or [0]
    fractions = [c / nest.hot_lookups - int(c / nest.hot_lookups) for c in chunks]
    ancestors = {hot.header}
    q = hot.header
    while parent.get(q) is not None:
        q = parent[q]
        ancestors.add(q)
    after = frozenset(ancestors)
    streamed = {"left": L}

    def child(lp: Loop, chunk: int) -> list[Instruction] | None:
        if lp.header == hot.header:
            return [*hot.path] * int(chunk / nest.hot_lookups)
        if nest.tile is not None and lp.header == nest.tile.header:
            body: list[Instruction] = []
            for c in chunks:
                body += _walk_once(blocks, loops, parent, lp, lambda x, c=c: child(x, c), nest.load_mnemonics,
                                   after=after)
            return body
        inner = _walk_once(blocks, loops, parent, lp, lambda x: child(x, chunk), nest.load_mnemonics, after=after)
        loads = [i for i in lp.path if i.is_global_load]
        if lp.header not in ancestors and loads and not classify(lp.path).row_loads:
            trips = streamed["left"] // len(loads)       # streams the bag's indices (a bounds check)
            streamed["left"] -= trips * len(loads)
            return inner * trips
        return inner

    root = nest.outer if from_outer and nest.outer is not None else nest.root
    start = None if root is not None else code.instructions[0].address
    task = _walk_once(blocks, loops, parent, root, lambda x: child(x, chunks[0] if tile else L), nest.load_mnemonics,
                      start=start, after=after)
    short = max(1, int(round(memory_latency * INDEX_LATENCY_RATIO)))
    latency = {i.address: short for i in task if i.is_global_load and i.mnemonic not in nest.row_mnemonics
               and i.address not in nest.tile_loads}
    # a task's first index (and offset) loads open lines no one has read yet: a whole latency
    firsts = _first_index_loads(task, latency)
    rep = replay(task, memory_latency, iterations=2, load_latency=latency, first_full=firsts)
    hot_rep = replay(hot.path, memory_latency, load_latency=latency)
    extra = sum(fractions) * hot_rep.latencies_per_iteration
    return rep.latencies_per_iteration + extra, len(task) + int(round(sum(fractions) * len(hot.path)))


def _first_index_loads(task: Sequence[Instruction], short: Mapping[int, int]) -> set[int]:
    """The short-latency loads of a task that load its bag's first indices: the first
    short load met on the path, and the first one inside each loop that streams them
    (the first instruction of each distinct load site until one repeats)."""
    out: set[int] = set()
    seen: set[int] = set()
    for i in task:
        if i.address in short:
            if i.address in seen:
                break
            seen.add(i.address)
            out.add(i.address)
    return out


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
    facts = _nest_facts(code, loop, kw.get("memory_latency", MEMORY_LATENCY))
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


@lru_cache(maxsize=1)
def _analysis_digest() -> str:
    """This module's source: a cached nest replay is reused only by the analysis that made it."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def _nest_facts(code: KernelCode, loop: Loop, memory_latency: int) -> dict[str, Any] | None:
    """The loop nest of `code` replayed at every bag length of NEST_L and at REFERENCE_L
    (None without a nest). The replays are most of a warm run's time, so they are cached
    on disk beside the disassembly, keyed by the kernel's instructions, the latency and
    this module's source; an unreadable cache entry is computed again."""
    key = hashlib.sha256(f"{_analysis_digest()} {memory_latency} {NEST_L} {REFERENCE_L} {code.arch} "
                         f"{code.mangled} {loop.header}\n{code.instructions!r}".encode()).hexdigest()[:24]
    path = cache_root() / "sass" / "nest" / f"{key}.json"
    try:
        return json.loads(path.read_text())["facts"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    n = loop_nest(code, loop)
    facts: dict[str, Any] | None = None
    if n is not None:
        bags = []
        for L in NEST_L:
            total, count = nest_latencies(code, n, L, memory_latency)
            bags.append([L, round(total, 3), count])
        reference = nest_latencies(code, n, REFERENCE_L, memory_latency)[0]
        setup = 0.0
        if n.outer is not None:   # the outer loop's own waits: once per run of tasks
            setup = max(0.0, nest_latencies(code, n, REFERENCE_L, memory_latency, from_outer=True)[0] - reference)
        facts = {"bags": bags, "reference": reference, "setup": round(setup, 3),
                 "lanes_per_bag": n.lanes_per_bag, "tile_lookups": n.tile_lookups, "spills": _nest_spills(code, n)}
    with contextlib.suppress(OSError, OutputError):   # a read-only cache costs the replay next time, nothing else
        write_atomic(path, json.dumps({"facts": facts}))
    return facts


def _nest_spills(code: KernelCode, nest: Nest) -> int:
    """LDL/STL inside the loops of the nest (the root's blocks, or the hot loop's)."""
    top = nest.outer or nest.root
    region = top.blocks if top is not None else nest.hot.blocks
    blocks = _blocks(code)
    return sum(1 for b in region for i in blocks[b].instructions if i.opcode in LOCAL_MEMORY)


def kernel_code(result: BuildResult, kernel: str) -> KernelCode:
    """The SASS of `kernel` (short name, e.g. chz_rpf_kernel<2>) in a build."""
    found = kernels_in(result.library)
    if kernel not in found:
        raise BuildError(f"kernel {kernel!r} not in the SASS of the {result.spec.label()} build; "
                         f"have: {', '.join(sorted(found))}")
    return found[kernel]


