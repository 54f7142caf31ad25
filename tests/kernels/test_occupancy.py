import pytest

from characterize.errors import ConfigError
from characterize.hardware.specs import ARCHS
from characterize.kernels.occupancy import register_steps, theoretical_occupancy


@pytest.mark.parametrize("regs,blocks,pct,limiter", [
    (54, 4, 50.0, "registers"), (42, 5, 62.5, "registers"), (32, 8, 100.0, "warps"),
    (48, 5, 62.5, "registers"), (40, 6, 75.0, "registers"), (64, 4, 50.0, "registers"), (255, 1, 12.5, "registers"),
])
def test_hand_worked_sm80_256_threads(regs, blocks, pct, limiter):
    occ = theoretical_occupancy(ARCHS["sm_80"], 256, regs)
    assert (occ.blocks_per_sm, occ.occupancy_pct, occ.limiter) == (blocks, pct, limiter)


def test_block_slot_limit_small_blocks():
    occ = theoretical_occupancy(ARCHS["sm_86"], 32, 16)  # 16 blocks/SM max on sm_86
    assert occ.blocks_per_sm == 16 and occ.limiter == "blocks" and occ.occupancy_pct == pytest.approx(100 * 16 / 48)


def test_shared_memory_limit():
    occ = theoretical_occupancy(ARCHS["sm_90"], 128, 32, shared_mem=60 * 1024)
    # (60 KiB + 1 KiB reserved) per block in a 228 KiB SM -> 3 blocks
    assert occ.blocks_per_sm == 3 and occ.limiter == "shared_mem"
    assert theoretical_occupancy(ARCHS["sm_80"], 128, 32, shared_mem=200 * 1024).blocks_per_sm == 0


def test_odd_block_sizes_round_to_warps():
    occ = theoretical_occupancy(ARCHS["sm_80"], 129, 32)  # 5 warps per block
    assert occ.blocks_per_sm == 12 and occ.warps_per_sm == 60


def test_invalid_inputs():
    with pytest.raises(ConfigError):
        theoretical_occupancy(ARCHS["sm_80"], 2048, 32)
    assert theoretical_occupancy(ARCHS["sm_80"], 1024, 255).blocks_per_sm == 0  # too many registers per block


def test_register_steps_are_the_largest_count_per_level():
    steps = register_steps(ARCHS["sm_80"], 256)
    assert (48, 5) in steps and (40, 6) in steps and (32, 8) in steps
    assert [b for _, b in steps] == sorted(b for _, b in steps)
