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
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(experiment: str, out: Path, env: dict[str, str]) -> tuple[float, float, list[str]]:
    """Wall and CPU time (user + system, every process it started) of one `characterize run`
    into `out`, and the step lines of its log."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "characterize.cli", "run", experiment, "--out", str(out)], env=env,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"characterize run {experiment} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    log = (out / "log.txt").read_text() if (out / "log.txt").is_file() else ""
    steps = [m.group(1) for m in re.finditer(r"^\S+ (\w+: .*\(\d+\.\d s\))$", log, re.M)]
    return seconds, cpu, steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("experiment", nargs="?", default="paper")
    ap.add_argument("--steps", action="store_true", help="print each step's time from the run's log")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, CHARACTERIZE_CACHE=str(Path(tmp) / "cache"))
        load = os.getloadavg()[0]
        cold, cold_cpu, cold_steps = timed(args.experiment, Path(tmp) / "cold", env)
        warm, warm_cpu, warm_steps = timed(args.experiment, Path(tmp) / "warm", env)
    cores = os.cpu_count()
    print(f"characterize run {args.experiment} without a GPU on {cores} core(s): cold {cold:.1f} s (target <= 60 s), "
          f"warm {warm:.1f} s (target <= 15 s); CPU time cold {cold_cpu:.1f} s, warm {warm_cpu:.1f} s "
          f"(load average {load:.1f} when it started: other work shares the cores)")
    if args.steps:
        for label, steps in (("cold", cold_steps), ("warm", warm_steps)):
            print(f"  {label}: " + "; ".join(steps))


if __name__ == "__main__":
    main()
