"""Kernels stage, SASS analysis: the instructions of each kernel, parsed from `cuobjdump -sass`.

Each instruction is parsed: guard predicate, opcode and modifiers, the registers it
writes and reads (`R4.64` is R4 and R5; `.64`/`.128` loads write 2/4 consecutive
registers; IMAD.WIDE and CS2R write a pair), its branch target. A library's kernels are
found by short name (chz_rpf_kernel<2>) and parsed on first use.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import pandas as pd

from characterize.errors import BuildError
from characterize.kernels.build import BuildResult, demangle
from characterize.kernels.sass.disasm import disassemble

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
        return short_name(self.name)


def short_name(name: str) -> str:
    """A demangled name without return type and parameters: chz_rpf_kernel<2>."""
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
        self._raw = {short_name(demangle(mangled)): (arch, mangled, lines) for arch, mangled, lines in _functions(text)}
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


def kernel_code(result: BuildResult, kernel: str) -> KernelCode:
    """The SASS of `kernel` (short name, e.g. chz_rpf_kernel<2>) in a build."""
    found = kernels_in(result.library)
    if kernel not in found:
        raise BuildError(f"kernel {kernel!r} not in the SASS of the {result.spec.label()} build; "
                         f"have: {', '.join(sorted(found))}")
    return found[kernel]
