"""Benchmark: tbe's work order on a GPU, measured side by side in one process.

One tbe launch covers every table of a batch. Walked in the plain order (warp w takes the
w-th contiguous slice of all tables' tasks), every table is in flight at once and their hot
rows share the L2; walked in phases of a few tables (`tables_in_flight`), only a phase's hot
rows do. This script times, per dataset of an experiment (the paper's by default), tbe at
each tables-in-flight value (0: the plain order) and `warp` (one launch per table, so one
table in flight), each point checked against torch first, CUDA-event timed as `bench` times
it, all on the same tables and traces in one process. It prints us per table and each
order's speedup over the plain order and over warp, and writes the records as JSON
(--json) for the run directory's README.

    python benchmarks/bench_tbe_order.py [--experiment paper] [--datasets medium,high]
        [--flights 0,1,2,3,4,6] [--modes steady] [--json out.json]

Needs a CUDA GPU: without one it says so and exits 2 (what the order predicts without a GPU
is `python benchmarks/bench_kernels.py`'s tbe order table).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import torch

from characterize.config import read_experiment


def _exp_with(exp, flight: int, modes: tuple[str, ...], budget_s: float):
    """The experiment with tbe walking `flight` tables at a time (0: the plain order)."""
    params = {k: dict(v) for k, v in exp.params.items()}
    tbe = params.setdefault("tbe", {})
    tbe.pop("tables_in_flight", None)
    if flight:
        tbe["tables_in_flight"] = flight
    bench = dataclasses.replace(exp.bench, modes=modes, budget_s=budget_s)
    return dataclasses.replace(exp, params=params, bench=bench)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experiment", default="paper")
    ap.add_argument("--datasets", default="")
    ap.add_argument("--flights", default="0,1,2,3,4,6")
    ap.add_argument("--reference", default="warp", help="per-table variant timed beside tbe ('' for none)")
    ap.add_argument("--modes", default="steady")
    ap.add_argument("--budget", type=float, default=1.0, help="seconds of repetitions per point")
    ap.add_argument("--json", default="")
    ap.add_argument("--backend", default="cuda", choices=("cuda", "emulate"),
                    help="emulate: the CPU emulation (checks this script, times nothing meaningful)")
    args = ap.parse_args()
    if args.backend == "cuda" and not torch.cuda.is_available():
        print("bench_tbe_order: no CUDA GPU here; it times tbe's work orders on one "
              "(python benchmarks/bench_kernels.py prints what the model predicts for them)", file=sys.stderr)
        return 2
    from characterize.measure.worker import Session, bench_point

    exp = read_experiment(args.experiment)
    datasets = [d for d in args.datasets.split(",") if d] or list(exp.datasets)
    flights = [int(f) for f in args.flights.split(",") if f]
    modes = tuple(m for m in args.modes.split(",") if m)
    session = Session.open(_exp_with(exp, 0, modes, args.budget), args.backend)
    print(f"{session.gpu.name}: T={session.workload.T} E={session.workload.E:,} D={session.workload.D} "
          f"B={session.workload.B} L={session.workload.L} {session.workload.dtype}; tables in flight {flights} "
          f"(0: plain order) and {args.reference or 'no reference'}; modes {', '.join(modes)}", flush=True)
    records: list[dict] = []
    t0 = time.monotonic()
    for ds in datasets:
        batches = session.dataset(ds)
        points = [("tbe", f) for f in flights] + ([(args.reference, 0)] if args.reference else [])
        for variant, flight in points:
            session.exp = _exp_with(exp, flight, modes, args.budget)
            rec = bench_point(session, variant, ds, batches)
            for s in rec["summary"]:
                row = {"dataset": ds, "variant": variant, "tables_in_flight": flight, "mode": s["mode"],
                       "per_table_us": s["per_table_us"], "ci95_us": s["ci95_us"], "reps": s["reps"],
                       "per_batch_us": s["per_batch_us"], "launch": rec.get("launch"),
                       "clocks": rec.get("clocks"), "check": rec["check"]}
                records.append(row)
                order = f"in flight {flight or 'all':>3}" if variant == "tbe" else "per table    "
                print(f"[{time.monotonic() - t0:6.1f} s] {ds:9s} {variant:5s} {order} "
                      f"{s['mode']:6s} {s['per_table_us']:8.2f} us/table +-{s['ci95_us']:.2f}", flush=True)
    print()
    print(f"{'dataset':9s} {'mode':6s} {'order':>10s} {'us/table':>9s} {'vs plain':>9s} {'vs ' + args.reference:>9s}")
    for ds in datasets:
        for mode in modes:
            rows = [r for r in records if r["dataset"] == ds and r["mode"] == mode]
            plain = next((r["per_table_us"] for r in rows if r["variant"] == "tbe" and not r["tables_in_flight"]),
                         None)
            ref = next((r["per_table_us"] for r in rows if r["variant"] == args.reference), None)
            for r in rows:
                label = r["variant"] if r["variant"] != "tbe" else f"tbe/{r['tables_in_flight'] or 'all'}"
                us = r["per_table_us"]
                print(f"{ds:9s} {mode:6s} {label:>10s} {us:9.2f} {plain / us if plain else float('nan'):8.3f}x "
                      f"{ref / us if ref else float('nan'):8.3f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": session.gpu.name, "experiment": args.experiment, "workload": session.workload.to_dict(),
                       "identity": session.identity, "records": records}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
