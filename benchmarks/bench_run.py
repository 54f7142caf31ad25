"""Benchmark: `characterize run` (the paper experiment by default) without a GPU, cold (an
empty build cache, CHARACTERIZE_CACHE pointing at a fresh temporary directory) and then
warm (the same cache), in one go, each as a whole process. The figure that counts is the
first answer (the line "predicted answer" on the terminal, timed from the process's start):
targets on two idle cores <= 60 s cold, <= 10 s warm. The whole run (the register sweep and
the precision grid come after the answer, then the report) is printed beside it.

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

#: seconds to the first answer, from an empty build cache and from a warm one (two idle cores)
COLD_TARGET_S, WARM_TARGET_S = 60.0, 10.0


def timed(experiment: str, out: Path, env: dict[str, str]) -> tuple[float, float | None, float, list[str]]:
    """Wall time of one `characterize run` into `out` as a whole process, the time its first
    answer appeared (None when it printed none), its CPU time (user + system, every process
    it started), and the step lines of its log."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    answer = None
    tail: list[str] = []
    with tempfile.TemporaryFile("w+") as stdout:
        proc = subprocess.Popen([sys.executable, "-m", "characterize.cli", "run", experiment, "--out", str(out)],
                                env=env, stdout=stdout, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        for line in proc.stderr:   # the terminal's progress lines, as they come
            if answer is None and "predicted answer" in line:
                answer = time.perf_counter() - start
            tail = (tail + [line])[-40:]
        proc.wait()
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"characterize run {experiment} failed ({proc.returncode}):\n{''.join(tail)}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    log = (out / "log.txt").read_text() if (out / "log.txt").is_file() else ""
    steps = [m.group(1) for m in re.finditer(r"^\S+ (\w+: .*\(\d+\.\d s\))$", log, re.M)]
    return seconds, answer, cpu, steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("experiment", nargs="?", default="paper")
    ap.add_argument("--steps", action="store_true", help="print each step's time from the run's log")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, CHARACTERIZE_CACHE=str(Path(tmp) / "cache"))
        load = os.getloadavg()[0]
        cold, cold_answer, cold_cpu, cold_steps = timed(args.experiment, Path(tmp) / "cold", env)
        warm, warm_answer, warm_cpu, warm_steps = timed(args.experiment, Path(tmp) / "warm", env)

    def first(answer: float | None) -> str:
        return "no answer printed" if answer is None else f"{answer:.1f} s"

    print(f"characterize run {args.experiment} without a GPU on {os.cpu_count()} core(s), whole processes "
          f"(load average {load:.1f} when it started: other work shares the cores)")
    print(f"  first answer: cold {first(cold_answer)} (target <= {COLD_TARGET_S:.0f} s), warm {first(warm_answer)} "
          f"(target <= {WARM_TARGET_S:.0f} s)")
    print(f"  whole run:    cold {cold:.1f} s, warm {warm:.1f} s; CPU time cold {cold_cpu:.1f} s, warm {warm_cpu:.1f} s")
    missed = [label for label, t, target in (("cold", cold_answer, COLD_TARGET_S), ("warm", warm_answer, WARM_TARGET_S))
              if t is None or t > target]
    if args.steps:
        for label, steps in (("cold", cold_steps), ("warm", warm_steps)):
            print(f"  {label}: " + "; ".join(steps))
    if missed:
        print(f"target missed: {', '.join(missed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
