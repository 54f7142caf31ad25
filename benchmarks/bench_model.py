"""Benchmark: model predictions for the paper matrix (profiles/paper.toml: 5 datasets x 8
variants) on sm_80 and sm_90 (target: under 30 s on a 2-core machine). Reuse distances
are computed once per dataset and shared by every variant and architecture; the
static characterization comes from the build cache (run bench_build.py first on a
cold cache)."""

import time

from characterize.analysis.model.predict import predict_experiment
from characterize.pipeline import load_experiment
from characterize.workloads.locality import reuse_distances
from characterize.workloads.traces import generate_stream


def main() -> None:
    reuse_distances(generate_stream("medium", 1000, 1000))  # numba compile / cache load
    exp = load_experiment("paper")
    start = time.perf_counter()
    df = predict_experiment(exp, ["sm_80", "sm_90"])
    elapsed = time.perf_counter() - start
    print(f"paper matrix: {len(df)} predictions ({len(exp.datasets)} datasets x {len(exp.variants)} variants x 2 "
          f"architectures) in {elapsed:.1f} s (target: < 30 s)")


if __name__ == "__main__":
    main()
