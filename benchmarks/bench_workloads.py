"""Benchmark: locality statistics of 10 million lookups (target: under 10 s on 2 cores)."""

import time

from characterize.workloads.locality import locality_stats, reuse_distances
from characterize.workloads.traces import generate_stream


def main() -> None:
    reuse_distances(generate_stream("medium", 1000, 1000))  # numba compile / cache load
    for preset in ("medium", "random"):
        t0 = time.perf_counter()
        x = generate_stream(preset, 500_000, 10_000_000)
        t1 = time.perf_counter()
        s = locality_stats(x, 500_000, 512, [60_000, 81_920])
        t2 = time.perf_counter()
        print(f"{preset:7s} generate {t1 - t0:5.2f} s  stats {t2 - t1:5.2f} s  total {t2 - t0:5.2f} s  "
              f"unique {s.unique_rows:,}  top-60K {s.top_k_coverage[60_000]:.1%}  (target: < 10 s)")


if __name__ == "__main__":
    main()
