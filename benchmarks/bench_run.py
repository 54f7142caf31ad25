"""Benchmark: `characterize run` (the paper experiment by default) without a GPU, cold (an
empty build cache, CHARACTERIZE_CACHE pointing at a fresh temporary directory) and then
warm (the same cache), in one go. Targets on two idle cores: <= 60 s cold, <= 15 s warm.

    python benchmarks/bench_run.py [EXPERIMENT] [--steps]

--steps also prints each step's time as the run logged it (log.txt).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(experiment: str, out: Path, env: dict[str, str]) -> tuple[float, list[str]]:
    """Wall time of one `characterize run` into `out`, and the step lines of its log."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "characterize.cli", "run", experiment, "--out", str(out)], env=env,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"characterize run {experiment} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    log = (out / "log.txt").read_text() if (out / "log.txt").is_file() else ""
    steps = [m.group(1) for m in re.finditer(r"^\S+ (\w+: .*\(\d+\.\d s\))$", log, re.M)]
    return seconds, steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("experiment", nargs="?", default="paper")
    ap.add_argument("--steps", action="store_true", help="print each step's time from the run's log")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, CHARACTERIZE_CACHE=str(Path(tmp) / "cache"))
        cold, cold_steps = timed(args.experiment, Path(tmp) / "cold", env)
        warm, warm_steps = timed(args.experiment, Path(tmp) / "warm", env)
    cores = os.cpu_count()
    print(f"characterize run {args.experiment} without a GPU on {cores} core(s): cold {cold:.1f} s (target <= 60 s), "
          f"warm {warm:.1f} s (target <= 15 s)")
    if args.steps:
        for label, steps in (("cold", cold_steps), ("warm", warm_steps)):
            print(f"  {label}: " + "; ".join(steps))


if __name__ == "__main__":
    main()
