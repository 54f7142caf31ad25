"""The CPU emulator's thread model itself (kernels/chz_emulate.h): shuffles of every mode,
ballots and block barriers give what a GPU gives, and a barrier that cannot complete, a lane
outside its mask or a thrown non-standard exception is a launch error, not a hang or a crash;
the same with the fast x86-64 fiber switch and with the portable ucontext one."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import pytest

from characterize.errors import ToolchainNotFound
from characterize.kernels.build import find_host_compiler, kernels_dir

PROBE = Path(__file__).resolve().parents[1] / "data" / "emulator_probe.cu"
BLOCK, GRID = 96, 3


def expected_exchange() -> list[int]:
    """What exchange_kernel writes, from the CUDA semantics of each intrinsic."""
    out = []
    for b in range(GRID):
        def v(t: int) -> int:
            return 1000 * b + t
        for t in range(BLOCK):
            lane, base = t & 31, t & ~31
            down = lane + 5 if lane + 5 < 32 else lane
            sub = lane & ~7
            half_src = sub + (((lane - sub) ^ 3) & 7)
            acc4 = sum(v(base + i) for i in range(8))
            out.append(v(base + 3) + 3 * v(base + down) + 7 * v(base + (lane ^ 9)) + 2 * v(base + half_src)
                       + 0xAAAAAAAA + 11 * v((t + 32) % BLOCK) + acc4)
    return out


@pytest.fixture(scope="module")
def compiler() -> Path:
    try:
        return find_host_compiler().path
    except ToolchainNotFound as e:
        pytest.skip(str(e))


@pytest.mark.parametrize("fibers", ["default", "ucontext"])
def test_the_thread_model_matches_cuda_and_reports_broken_barriers(compiler, fibers, tmp_path):
    exe = tmp_path / "probe"
    flags = ["-DCHZ_EMU_UCONTEXT"] if fibers == "ucontext" else []
    subprocess.run([str(compiler), "-O1", "-std=c++17", "-x", "c++", "-DCHZ_EMULATE", *flags,
                    f"-I{kernels_dir()}", str(PROBE), "-o", str(exe)], check=True, capture_output=True, text=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = {ln.split(" ", 1)[0]: ln.split(" ", 1)[1] for ln in r.stdout.splitlines()}
    assert lines["exchange"] == "0 ok" and lines["after_errors"] == "0 ok"
    assert [int(x) for x in lines["out"].split()] == expected_exchange()
    assert lines["early_exit"] == "719 deadlock: a barrier or shuffle waits for threads that never arrive"
    assert lines["foreign_mask"] == "719 a lane called a warp intrinsic outside its own mask"
    assert lines["throwing"] == "719 a kernel threw a non-standard exception"


def test_the_fast_switch_is_the_one_built_on_x86_64(compiler, tmp_path):
    """The switch that saves no signal mask is what x86-64 builds use (a ucontext build
    calls swapcontext); other machines keep ucontext."""
    obj = tmp_path / "probe.o"
    subprocess.run([str(compiler), "-O1", "-std=c++17", "-x", "c++", "-DCHZ_EMULATE", f"-I{kernels_dir()}", "-c",
                    str(PROBE), "-o", str(obj)], check=True, capture_output=True)
    symbols = subprocess.run(["nm", str(obj)], capture_output=True, text=True).stdout
    if platform.machine() in ("x86_64", "AMD64"):
        assert "chz_emu_switch" in symbols and "swapcontext" not in symbols
    else:
        assert "swapcontext" in symbols
