"""Kernels stage, SASS analysis: what the compiled hot loop of each kernel does.

Why: without a GPU the machine code is the only ground truth. Reading the source
missed that a guarded register prefetch (`if (next < end) slot = row[next]`)
compiles to a load into a temporary plus an immediate move into the slot, so the
warp waits on every "prefetched" row, and that ptxas interleaves consumers between
independent loads on one architecture and not on another. This stage reads the
SASS of every built kernel and scores its hot loop.

How, one module a step:
1. disasm: `cuobjdump -sass` disassembles a built library (cached by the file's content).
2. parse: each instruction is parsed: guard predicate, opcode and modifiers, the
   registers it writes and reads, its branch target.
3. loops: per kernel a control-flow graph gives the natural loops, each with its
   steady-state path; the hot loop is the innermost loop whose path gathers the most rows.
4. loads: the global loads of a path are classified by register dataflow (row loads,
   index loads, other loads; an int8 row's scale and bias apart).
5. replay: the path is replayed with in-order issue, iterations back to back: the
   memory latencies it serializes per iteration.
6. nest: the loop nest around the hot loop is walked and replayed per bag length
   (cached on disk beside the disassembly).
7. analyze: one LoopRow per kernel, variant and architecture: rows and bytes in flight
   per warp, the nest's latencies per bag length.

This package re-exports what the rest of the toolkit reads of it.
"""

from characterize.kernels.sass.analyze import LoopRow, analyze_kernel
from characterize.kernels.sass.disasm import disassemble, find_cuobjdump
from characterize.kernels.sass.loads import classify
from characterize.kernels.sass.loops import find_loops, hot_loop
from characterize.kernels.sass.nest import NEST_L, REFERENCE_L, interpolate
from characterize.kernels.sass.parse import instruction_frame, kernel_code, kernels_in, parse_instruction, parse_sass
from characterize.kernels.sass.replay import MEMORY_LATENCY, replay

__all__ = ["LoopRow", "MEMORY_LATENCY", "NEST_L", "REFERENCE_L", "analyze_kernel", "classify", "disassemble",
           "find_cuobjdump", "find_loops", "hot_loop", "instruction_frame", "interpolate", "kernel_code", "kernels_in",
           "parse_instruction", "parse_sass", "replay"]
