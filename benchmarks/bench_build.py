"""Benchmark: static characterization of every variant for sm_80 and sm_90, cold (empty
build cache) and cached. Targets: under 60 s cold, under 2 s cached."""

import os
import subprocess
import sys
import tempfile
import time


def timed(env: dict) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "characterize.cli.base", "build", "--arch", "sm_80,sm_90", "--json"], env=env,
                   check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, CHARACTERIZE_CACHE=cache)
        cold = timed(env)
        cached = timed(env)
    print(f"all variants x sm_80,sm_90: cold {cold:.1f} s (target < 60 s), cached {cached:.2f} s (target < 2 s)")


if __name__ == "__main__":
    main()
