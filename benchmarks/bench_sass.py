"""Benchmark: SASS analysis of the whole family (every public variant's hot loop and
L2 pre-pass) for sm_80 and sm_90 after the build (builds cached), as
`characterize sass --arch sm_80,sm_90 --json` in a fresh process: once with no
disassembly cached (cuobjdump runs, one library per thread) and once with it cached.
Target: under 10 s."""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from characterize.kernels.build import build_many
from characterize.kernels.diskcache import cache_root
from characterize.kernels.static import plan_variants

ARCHS = ("sm_80", "sm_90")


def timed(env: dict) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "characterize.cli", "sass", "--arch", ",".join(ARCHS), "--json"], env=env,
                   check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    start = time.perf_counter()
    results = build_many({p.spec for p in plan_variants(None, ARCHS)})
    print(f"builds ready in {time.perf_counter() - start:.1f} s ({len(results)} libraries)")
    with tempfile.TemporaryDirectory() as tmp:
        # the builds (and the register-cap search's builds) stay cached; the disassembly cache starts empty
        (Path(tmp) / "build").symlink_to(cache_root() / "build", target_is_directory=True)
        env = dict(os.environ, CHARACTERIZE_CACHE=tmp)
        cold = timed(env)
        cached = timed(env)
    print(f"characterize sass --arch {','.join(ARCHS)}: {cold:.1f} s with cuobjdump (target < 10 s), "
          f"{cached:.1f} s with the disassembly cached")


if __name__ == "__main__":
    main()
