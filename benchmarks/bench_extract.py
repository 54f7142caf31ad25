"""Benchmark of the extract stage: read_report vs a bare ncu_report loop over the same values.

The bare loop is the floor: load each fixture report and touch every metric's
``name()``, ``value()`` and ``unit()``, keeping nothing. ``read_report`` does the
same reads plus labels, unit normalisation, NVTX and launch fields, and builds the
tidy DataFrame. The target is read_report / bare < 2.0.

Run from the repository root:  python benchmarks/bench_extract.py [--repeat N] [--fixtures DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # a script run from a checkout, not an installed package
    sys.path.insert(0, str(ROOT))

from characterize.extract.ncu_rep import read_report  # noqa: E402

TARGET_RATIO = 2.0


def default_fixtures() -> Path:
    env = os.environ.get("CHARACTERIZE_NCU_FIXTURES")
    return Path(env) if env else ROOT.parent / "shared" / "fixtures" / "ncu"


def bare_loop(paths: list[Path]) -> int:
    """Read every metric's name, value and unit straight through ncu_report."""
    import ncu_report

    count = 0
    for path in paths:
        context = ncu_report.load_report(str(path))
        for rng in context:
            for action in rng:
                for name in action.metric_names():
                    metric = action[name]
                    metric.name(), metric.value(), metric.unit()
                    count += 1
    return count


def with_read_report(paths: list[Path]) -> int:
    return sum(len(read_report(path)) for path in paths)


def timed(fn: Callable[[list[Path]], int], paths: list[Path]) -> tuple[float, int]:
    start = time.perf_counter()
    rows = fn(paths)
    return time.perf_counter() - start, rows


def best_of_interleaved(
    fns: list[Callable[[list[Path]], int]], paths: list[Path], repeat: int
) -> list[tuple[float, int]]:
    """Minimum wall time of each function over ``repeat`` rounds, run alternately.

    ncu_report keeps memory from every report it has loaded (a process grows by
    several MB per load and gets slower), so running one variant after the other
    would penalise whichever runs second; alternating gives both the same heap.
    """
    best = [(float("inf"), 0)] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            seconds, rows = timed(fn, paths)
            if seconds < best[i][0]:
                best[i] = (seconds, rows)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="runs per variant; the best is reported")
    parser.add_argument("--fixtures", type=Path, default=default_fixtures(), help="folder with .ncu-rep files")
    args = parser.parse_args(argv)

    paths = sorted(args.fixtures.glob("*.ncu-rep"))
    if not paths:
        print(f"no .ncu-rep files in {args.fixtures}; set --fixtures or CHARACTERIZE_NCU_FIXTURES", file=sys.stderr)
        return 2

    bare_loop(paths)  # warm-up: the first load maps the ncu_report library
    with_read_report(paths)
    (bare_s, bare_n), (ours_s, ours_n) = best_of_interleaved([bare_loop, with_read_report], paths, args.repeat)
    if bare_n != ours_n:
        print(f"row count differs: bare loop {bare_n} metrics, read_report {ours_n} rows", file=sys.stderr)
        return 1

    ratio = ours_s / bare_s
    print(f"reports: {len(paths)} ({', '.join(p.name for p in paths)}), metrics: {bare_n}")
    print(f"bare ncu_report loop : {bare_s * 1e3:8.1f} ms  ({bare_n / bare_s:,.0f} metrics/s)")
    print(f"read_report          : {ours_s * 1e3:8.1f} ms  ({ours_n / ours_s:,.0f} rows/s)")
    print(f"ratio read_report/bare: {ratio:.2f} (target < {TARGET_RATIO})")
    return 0 if ratio < TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
