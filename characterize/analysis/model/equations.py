"""Analysis stage, model equations: time, traffic and the bounding resource of one prepared point.
"""

from __future__ import annotations

import math
from typing import Any

from characterize.analysis.model.constants import SECTOR, WAVEFRONT, ModelConstants
from characterize.analysis.model.geometry import _Point
from characterize.analysis.model.host import cache_terms, uvm_terms
from characterize.analysis.model.locality import _hit_fraction
from characterize.config import INDEX_BYTES


# ------------------------------------------------------------------ evaluation
def _evaluate(p: _Point, c: ModelConstants) -> dict[str, Any]:
    """The model's equations (module docstring) for one point and one constant set."""
    gpu, prof, rs = p.gpu, p.profile, p.row_sector_bytes
    f = c.l2_capacity_factor
    if p.l2 == "none" or p.pinned_rows == 0:
        h2 = _hit_fraction(prof.distances(p.mode), f * gpu.l2_bytes / rs)
    else:
        k = p.pinned_rows
        hot = prof.pinned(k)
        rest = f * max(gpu.l2_bytes - k * rs, 0.0) / rs
        if p.l2 == "prefetch":
            # a row pinned within the set-aside (geometry caps K to it) keeps its priority with a
            # probability to calibrate; the set-aside its lost pins leave is normal L2 again, where
            # such a row competes with its own reuse distances, as without pinning
            rest = f * max(gpu.l2_bytes - c.pinned_hit * k * rs, 0.0) / rs
            kept, unkept = prof.window(k, p.mode)
            hot_hit = c.pinned_hit + (1 - c.pinned_hit) * (kept + (1 - kept) * _hit_fraction(unkept, rest))
        else:
            kept, unkept = prof.window(k, p.mode)
            hot_hit = kept + (1 - kept) * _hit_fraction(unkept, rest)
        h2 = hot * hot_hit + (1 - hot) * _hit_fraction(prof.distances(p.mode, f"cold:{k}"), rest)
    l1 = _hit_fraction(p.l1, gpu.l1_data_bytes / rs)
    phi1, phi2, phid = l1, max(h2 - l1, 0.0), 1.0 - max(h2, l1)
    lam1, lam2, lamd = c.l1_latency_ns, c.l2_latency_ns, c.dram_latency_ns
    t_row = phi1 * lam1 + phi2 * lam2 + phid * lamd
    N, B = p.lookups, p.bags
    # one wait of the hot loop covers the rows in flight: it lasts as long as the slowest
    U = max(1.0, p.sass_rows_in_flight)
    a, b = phi1 ** U, (phi1 + phi2) ** U
    wait = lam1 * a + lam2 * (b - a) + lamd * (1 - b)
    step = p.latencies_per_lookup * wait             # per lookup a warp gathers
    if p.family == "chunk":
        miss = INDEX_BYTES / SECTOR
        t_idx = (1 - miss) * lam1 + miss * lamd
        task_ns = p.per_bag * step
        requests = N * p.chunks
        warp_lookups = N * p.chunks                    # each (bag, 32-feature chunk) is one warp's task
        l1_bytes = 2 * N * p.chunks * WAVEFRONT      # a row-chunk and an index request per iteration
    else:
        G = p.group
        t_idx = lamd
        L = max(int(round(p.per_bag)), 0)
        tiles = -(-L // G)
        task_ns = tiles * t_idx + p.per_bag * (32 // G) * step   # a warp gathers the rows of 32/G bags
        requests = N / (32 // G)
        warp_lookups = N
        l1_bytes = N * math.ceil(p.row_bytes / WAVEFRONT) * WAVEFRONT + N * INDEX_BYTES
    streams = N * INDEX_BYTES + B * INDEX_BYTES + B * p.row_bytes + N * INDEX_BYTES + B * INDEX_BYTES
    dram = N * phid * rs + streams
    l2_bytes = N * (1 - phi1) * rs + streams
    l2_reads = N * (1 - phi1) * rs + N * INDEX_BYTES + B * INDEX_BYTES
    terms_ns = {
        "latency": p.waves * p.rounds * task_ns,
        "dram": dram / (c.hbm_efficiency * gpu.hbm_GBps),          # GB/s == bytes/ns
        "l2": l2_bytes / gpu.l2_GBps,
        "l1": l1_bytes / (gpu.l1_bytes_per_clk * gpu.sm_count * gpu.boost_clock_MHz / 1000),
        # four schedulers per SM issue one warp instruction per cycle each
        "issue": warp_lookups * p.instructions_per_lookup / (4 * gpu.sm_count * gpu.boost_clock_MHz / 1000),
    }
    bound = max(terms_ns, key=terms_ns.get)
    time_us = terms_ns[bound] / 1000 + c.launch_overhead_us
    prepass = (p.prepass_rows * rs / (c.hbm_efficiency * gpu.hbm_GBps) / 1000 + c.launch_overhead_us
               if p.prepass_rows else math.nan)
    host: dict[str, Any] = {"cache_rows": math.nan, "cache_hit_rate_pct": math.nan,
                            "cache_lookup_hit_rate_pct": math.nan, "host_bytes": 0.0, "dedup_us": math.nan,
                            "transfer_us": math.nan, "lookup_us": math.nan}
    if p.host == "cache" and p.host_profile is not None:
        host = cache_terms(p.host_profile.cache(p.cache_rows), gpu, p.row_bytes, N, c.hbm_efficiency,
                           c.launch_overhead_us, time_us)
    elif p.host == "uvm" and p.host_profile is not None:
        host = uvm_terms(p.host_profile.pages(p.row_bytes), gpu, p.uvm_pages, prof.T, p.mode, N, time_us)
    if p.host != "none":
        time_us = host.pop("time_us")
        bound = "host link" if host["transfer_us"] >= max(host["dedup_us"], host["lookup_us"]) else bound
    return {**host,
        "time_us": time_us, "bound": bound,
        "l1_hit_rate_pct": 100 * l1,
        "l2_hit_rate_pct": 100 * (phi2 / (phi2 + phid) if phi2 + phid > 0 else h2),
        "l2_hit_rate_all_pct": 100 * N * phi2 * rs / l2_reads if l2_reads else math.nan,
        "dram_bytes": dram, "l2_bytes": l2_bytes, "l1_bytes": l1_bytes,
        "latency_ns": t_row, "index_latency_ns": t_idx, "step_ns": step, "requests": requests,
        "latency_us": terms_ns["latency"] / 1000, "dram_us": terms_ns["dram"] / 1000,
        "l2_us": terms_ns["l2"] / 1000, "l1_us": terms_ns["l1"] / 1000, "issue_us": terms_ns["issue"] / 1000,
        "prepass_us": prepass,
    }


