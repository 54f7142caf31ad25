"""Kernels stage, occupancy: theoretical occupancy and its limiter, as the CUDA calculator does.

Given an architecture's SM limits and a kernel's resources (threads per block,
registers per thread, shared memory per block), count how many blocks fit on one SM
under each limit (warp slots, block slots, registers, shared memory); the smallest
count wins and names the limiter. Registers are allocated per warp in units of
`reg_alloc_unit` and split among the SM's sub-partitions, which is what makes 54
registers cost as much as 56 and caps a 256-thread block at 4 blocks on sm_80.
"""

from __future__ import annotations

from dataclasses import dataclass

from characterize.errors import ConfigError
from characterize.hardware.specs import ArchSpec

LIMITERS = ("warps", "blocks", "registers", "shared_mem")


def _ceil_to(x: int, unit: int) -> int:
    return -(-x // unit) * unit


@dataclass(frozen=True)
class Occupancy:
    """Resident blocks per SM and the resource that bounds them."""

    blocks_per_sm: int
    warps_per_sm: int
    occupancy_pct: float         # resident warps / max warps per SM
    limiter: str                 # one of LIMITERS; on ties the hardware slots (warps, blocks) win
    limits: dict[str, int]       # blocks allowed by each resource


def theoretical_occupancy(arch: ArchSpec, block_size: int, registers: int, shared_mem: int = 0) -> Occupancy:
    """Blocks per SM for a kernel using `registers` per thread and `shared_mem` bytes of
    shared memory (static + dynamic) per block of `block_size` threads."""
    if block_size <= 0 or block_size > arch.max_threads_per_block:
        raise ConfigError(f"block size {block_size} is outside 1..{arch.max_threads_per_block} for {arch.arch}")
    if registers < 0 or shared_mem < 0:
        raise ConfigError("registers and shared memory must be non-negative")
    warps_per_block = -(-block_size // arch.warp_size)
    limits: dict[str, int] = {
        "warps": arch.max_warps_per_sm // warps_per_block,
        "blocks": arch.max_blocks_per_sm,
    }
    # registers: allocated per warp, rounded to the allocation unit, per sub-partition
    regs_per_warp = _ceil_to(registers * arch.warp_size, arch.reg_alloc_unit)
    if registers > arch.max_regs_per_thread or regs_per_warp * _ceil_to(warps_per_block, arch.sub_partitions) > arch.regs_per_block:
        limits["registers"] = 0
    elif regs_per_warp == 0:
        limits["registers"] = arch.max_blocks_per_sm
    else:
        warps_per_partition = (arch.regs_per_sm // arch.sub_partitions) // regs_per_warp
        limits["registers"] = warps_per_partition * arch.sub_partitions // warps_per_block
    # shared memory: the runtime reserves some per block and allocates in units
    smem = _ceil_to(shared_mem + arch.smem_reserved_per_block, arch.smem_alloc_unit)
    if shared_mem > arch.max_smem_per_block:
        limits["shared_mem"] = 0
    else:
        limits["shared_mem"] = arch.smem_per_sm // smem if smem else arch.max_blocks_per_sm
    blocks = min(limits.values())
    # on a tie the kernel's resources are not what holds it back: name the slot limit
    limiter = next(k for k in LIMITERS if limits[k] == blocks)
    warps = blocks * warps_per_block
    return Occupancy(blocks, warps, 100.0 * warps / arch.max_warps_per_sm, limiter, limits)


def register_steps(arch: ArchSpec, block_size: int) -> list[tuple[int, int]]:
    """Each distinct blocks-per-SM level reachable by lowering registers, as
    (largest register count reaching it, blocks per SM), from the fewest blocks up.
    These are the only caps worth trying: any other cap spills more for nothing."""
    steps: list[tuple[int, int]] = []
    last = -1
    for regs in range(arch.max_regs_per_thread, 0, -1):
        b = theoretical_occupancy(arch, block_size, regs).blocks_per_sm
        if b != last:
            steps.append((regs, b))
            last = b
    return steps
