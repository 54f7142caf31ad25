"""Long fuzz run of every reader of outside data: byte-mutated real .ncu-rep reports,
truncated / quote-broken / byte-flipped CSV exports, malformed traces of every format,
damaged run-directory files (meta.json, point files, locality.json, the CSV tables: cut,
flipped, of the wrong JSON type, text where numbers belong; every --report-every'th also
rendered as a report) and damaged stored calibrations. The test suite runs the same
generators (tests/extract/test_fuzz.py, tests/workloads/test_trace_fuzz.py,
tests/test_rundir_fuzz.py) on a few dozen inputs; this runs hundreds.

Acceptable outcomes: a correct result (ok) or a one-line CharacterizeError (counted by
class). Anything else (another exception, a multi-line message, a CSV or trace that
reads with values the original does not have) is a failure: listed, and exit status 1.

Run from the repository root:
    python benchmarks/fuzz_readers.py [--seed 0] [--reports 350] [--csv 2000] [--traces 1000] [--rundirs 1000]
                                      [--calibrations 500] [--report-every 50]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # a script run from a checkout, not an installed package
    sys.path.insert(0, str(ROOT))

from characterize.errors import CharacterizeError  # noqa: E402
from tests.conftest import fixtures_dir  # noqa: E402
from tests.extract.test_fuzz import csv_mutants, read_csv_fully, read_report_fully, report_mutants  # noqa: E402
from tests.test_rundir_fuzz import (  # noqa: E402
    calibration_mutants,
    read_calibration,
    read_run_fully,
    rundir_mutants,
)
from tests.workloads.test_trace_fuzz import CONFIG, read_and_check, trace_mutants  # noqa: E402


class Tally:
    """Outcome counts of one reader, and the failures with what caused them."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.counts: Counter[str] = Counter()
        self.failures: list[str] = []
        self.inputs = 0
        self.seconds = 0.0

    def run(self, label: str, fn: Callable[[], object]) -> None:
        start = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fn()
            result = "ok"
        except CharacterizeError as e:
            result = type(e).__name__
            if "\n" in str(e) or not str(e).strip():
                result = "FAIL multi-line message"
                self.failures.append(f"{label}: {str(e)[:200]!r}")
        except AssertionError as e:
            result = "FAIL wrong result"
            self.failures.append(f"{label}: {e}")
        except Exception as e:  # noqa: BLE001 - exactly what the fuzzer looks for
            result = f"FAIL {type(e).__name__}"
            where = traceback.extract_tb(e.__traceback__)[-1]
            self.failures.append(f"{label}: {type(e).__name__}: {str(e)[:160]} ({where.filename}:{where.lineno})")
        self.seconds += time.perf_counter() - start
        self.inputs += 1
        self.counts[result] += 1

    def print(self) -> None:
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items(), key=lambda kv: -kv[1]))
        print(f"{self.name:<32} {self.inputs:>6} inputs in {self.seconds:6.1f} s: {outcomes}")
        for f in self.failures[:10]:
            print(f"    {f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reports", type=int, default=350, help="byte-mutated .ncu-rep files")
    ap.add_argument("--csv", type=int, default=2000, help="damaged CSV exports")
    ap.add_argument("--traces", type=int, default=1000, help="damaged trace files (each read with and without E)")
    ap.add_argument("--rundirs", type=int, default=1000, help="run directories with one damaged file")
    ap.add_argument("--report-every", type=int, default=50, help="render every Nth damaged run as a report too")
    ap.add_argument("--calibrations", type=int, default=500, help="damaged stored calibrations")
    ap.add_argument("--fixtures", type=Path, default=fixtures_dir())
    args = ap.parse_args()
    os.environ.setdefault("CHARACTERIZE_MEMORY_BUDGET", "1G")  # a damaged header may promise terabytes
    tallies = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        reports = sorted(args.fixtures.glob("*.ncu-rep"))
        if reports and args.reports:
            t = Tally(".ncu-rep (read_any, wide, rules)")
            for how, p in report_mutants(reports, work, args.seed, args.reports):
                t.run(f"{p.name} ({how})", lambda: read_report_fully(p, work))
                p.unlink()
            tallies.append(t)
        elif args.reports:
            print(f"no .ncu-rep fixtures in {args.fixtures}; skipping reports")
        if args.csv:
            t = Tally("ncu CSV export (read_csv, rules)")
            for how, src, p in csv_mutants(args.seed, args.csv, work):
                t.run(f"{p.name} ({how})", lambda: read_csv_fully(src, p, how))
                p.unlink()
            tallies.append(t)
        if args.traces:
            t = Tally("traces (txt, npy, npz, pt)")
            for label, p in trace_mutants(work, args.seed, args.traces):
                for rows in (CONFIG.E, None):
                    t.run(f"{p.name} ({label}, rows={rows})", lambda: read_and_check(p, rows))
                p.unlink()
            tallies.append(t)
        if args.rundirs:
            from characterize.report.render import report_html

            t = Tally("run directories (load_run, frames)")
            r = Tally("run directories (HTML report)")
            for i, (label, run) in enumerate(rundir_mutants(work / "rundirs", args.seed, args.rundirs)):
                t.run(label, lambda: read_run_fully(run))
                if args.report_every and i % args.report_every == 0:
                    r.run(label, lambda: report_html([run]))
            tallies += [t, r]
        if args.calibrations:
            os.environ["CHARACTERIZE_CALIBRATION"] = str(work / "calibration")
            t = Tally("stored calibrations")
            for label, gpu in calibration_mutants(work, args.seed, args.calibrations):
                t.run(label, lambda: read_calibration(gpu))
            tallies.append(t)
    print(f"fuzz_readers, seed {args.seed}: inputs tried and outcomes (ok = read correctly, else the error class)")
    for t in tallies:
        t.print()
    failed = sum(len(t.failures) for t in tallies)
    print(f"total: {sum(t.inputs for t in tallies)} inputs, {failed} failure(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
