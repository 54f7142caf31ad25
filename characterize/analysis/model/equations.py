"""Analysis stage, model equations: time, traffic and the bounding resource of one
prepared point (model.geometry.ModelPoint) for one set of constants.
"""

from __future__ import annotations

import math
from typing import Any

from characterize.analysis.model.constants import WAVEFRONT, ModelConstants
from characterize.analysis.model.geometry import ModelPoint
from characterize.analysis.model.host import cache_terms, uvm_terms
from characterize.analysis.model.locality import hit_fraction

#: load-to-use latency of a row read in place from host memory over the link (zero-copy
#: managed memory): the GPU's DRAM latency plus a PCIe round trip (~1 us)
HOST_READ_LATENCY_NS = 1000.0


def l2_hit(p: ModelPoint, c: ModelConstants) -> float:
    """Share of row lookups that hit L2: an LRU of f x L2 bytes shared by the rows and every
    byte streamed through it (indices, offsets, outputs; other tables' launches between
    batches), with the hot rows of l2p pinned in the set-aside, warm from the pre-pass
    without one, or kept by the access-policy window (l2w)."""
    gpu, prof, rs = p.gpu, p.profile, p.row_sector_bytes
    capacity = c.l2_capacity_factor * gpu.l2_bytes
    if p.host == "uvm" and p.uvm_mode == "zero-copy":
        return 0.0   # rows read in place over the host link: measured as fast on a skewed trace as on a uniform one
    if p.l2 == "none" or (p.prepass_rows == 0 and p.pinned_rows == 0):
        return hit_fraction(prof.byte_distances(p.mode, rs, p.stream_bytes, in_flight=p.tables_in_flight),
                            capacity)
    if p.l2 == "prefetch" and not p.set_aside:
        k = p.prepass_rows
        hot = prof.pinned(k)
        warm = hit_fraction(prof.warm_start(k, p.mode, rs, p.stream_bytes), capacity)
        cold = hit_fraction(prof.byte_distances(p.mode, rs, p.stream_bytes, f"cold:{k}"), capacity)
        return hot * warm + (1 - hot) * cold
    k = p.pinned_rows
    hot = prof.pinned(k)
    if p.l2 == "prefetch":
        # a row pinned within the set-aside keeps its priority with a probability to calibrate; the
        # set-aside its lost pins leave is normal L2 again, where such a row competes as without pinning
        rest = c.l2_capacity_factor * max(gpu.l2_bytes - c.pinned_hit * k * rs, 0.0)
        kept, unkept = prof.window(k, p.mode)
        unkept_hit = hit_fraction(unkept, rest / rs)
        hot_hit = c.pinned_hit + (1 - c.pinned_hit) * (kept + (1 - kept) * unkept_hit)
    else:
        rest = c.l2_capacity_factor * max(gpu.l2_bytes - k * rs, 0.0)
        kept, unkept = prof.window(k, p.mode)
        hot_hit = kept + (1 - kept) * hit_fraction(unkept, rest / rs)
    cold = hit_fraction(prof.byte_distances(p.mode, rs, p.stream_bytes, f"cold:{k}"), rest)
    return hot * hot_hit + (1 - hot) * cold


def norm(terms: Any, k: float) -> float:
    """The time terms of one kernel (latency, DRAM, L2, L1, issue), overlapped: their k-norm.
    k = 1 adds them (nothing overlaps), a large k takes the largest (perfect overlap, the
    roofline); in between, each slows the others as it nears its limit: loads queue
    as the memory system fills, and issue slots go to the warps that wait."""
    t = [max(0.0, float(x)) for x in terms]
    hi = max(t, default=0.0)
    if hi <= 0:
        return 0.0
    return hi * sum((x / hi) ** k for x in t) ** (1.0 / k)


def evaluate_point(p: ModelPoint, c: ModelConstants) -> dict[str, Any]:
    """The model's equations for one point and one constant set (the module docstring of
    characterize.analysis.model says them in words)."""
    gpu, k, rs = p.gpu, p.kernel, p.row_sector_bytes
    h2 = l2_hit(p, c)
    zero_copy = p.host == "uvm" and p.uvm_mode == "zero-copy"
    # the L1 of an SM keeps its own blocks' hot rows as for one table, however many tables a batched launch
    # walks at once: measured on an H200 (profiles/h200/tbe-order), tbe on high took 160-172 us walking 1 to 12
    # tables at a time (an L1 split among 3 tables predicts +20%), and ncu's L1 hit rate of tbe on medium over
    # random's (4.7% - 1.5%) is base's (25.5% - 22.5%), not a third of it
    l1 = 0.0 if zero_copy else hit_fraction(p.l1, gpu.l1_data_bytes / rs)
    phi1, phi2, phid = l1, max(h2 - l1, 0.0), 1.0 - max(h2, l1)
    lam1, lam2 = c.l1_latency_ns, c.l2_latency_ns
    lamd = c.dram_latency_ns + (HOST_READ_LATENCY_NS if p.host == "uvm" and p.uvm_mode == "zero-copy" else 0.0)
    t_row = phi1 * lam1 + phi2 * lam2 + phid * lamd
    # one wait covers the rows in flight: it lasts as long as the slowest of them
    U = max(1.0, k.rows_in_flight)
    a, b = phi1 ** U, (phi1 + phi2) ** U
    wait = lam1 * a + lam2 * (b - a) + lamd * (1 - b)
    task_ns = p.task_latencies * wait
    # a warp's chain of tasks (a grid-stride loop takes ceil(tasks / warps) of them), once per round of blocks on
    # the busiest SM: blocks of equal work retire together, so 8 blocks on an SM that holds 5 take 2 rounds, not
    # 1.6 (ncu on an H200: base, optmt and l2p at 1024 blocks, 4-6 resident, averaged 30-31 warps per SM)
    latency_ns = task_ns * math.ceil(p.tasks / (p.blocks * p.warps_per_block)) * p.rounds
    TL = p.tables_per_launch
    N = p.lookups * TL
    row_reads = N * phid * rs
    reads = row_reads + p.read_stream_bytes * TL
    writes = p.write_bytes * TL
    link = zero_copy
    # a random read of s contiguous bytes pays a fixed cost beside its transfer (activations, bursts): rate
    # s / (s + s0) of the streaming one; the index, offset and output streams are contiguous
    s = k.request_bytes(p.row_bytes)
    gather = c.hbm_efficiency * s / (s + c.request_overhead_bytes)
    streams_ns = (reads - row_reads) / (c.hbm_efficiency * gpu.hbm_GBps) + writes / (c.write_efficiency *
                                                                                  gpu.hbm_GBps)
    if link:   # rows read in place over the host link: it is their bandwidth
        dram_ns = streams_ns + row_reads / gpu.pcie_GBps
    else:
        dram_ns = streams_ns + row_reads / (gather * gpu.hbm_GBps)
    l2_bytes = N * (1 - phi1) * rs + p.read_stream_bytes * TL + writes
    l1_bytes = N * math.ceil(p.row_bytes / WAVEFRONT) * WAVEFRONT + p.read_stream_bytes * TL
    clk = gpu.boost_clock_MHz / 1000   # cycles per ns
    terms_ns = {
        "latency": latency_ns,
        "dram": dram_ns,                                              # GB/s == bytes/ns
        "l2": l2_bytes / gpu.l2_GBps,
        # an SM's L1 and schedulers serve its own blocks only: the busiest SM's share of the work sets them
        "l1": l1_bytes * p.busiest_share / (c.l1_efficiency * gpu.l1_bytes_per_clk * clk),
        # four schedulers per SM could issue four warp instructions a cycle; a gather's loop reaches issue_ipc
        "issue": p.tasks * p.task_instructions * p.busiest_share / (c.issue_ipc * clk),
    }
    # the terms contend for the same warps, schedulers and memory system: they add up as a k-norm
    kernel_ns = norm(terms_ns.values(), c.overlap)
    bound = max(terms_ns, key=terms_ns.get)
    time_us = kernel_ns / 1000 + c.launch_overhead_us
    if k.index_pass:   # a kernel of its own reads every index and offset first (FBGEMM's bounds check)
        time_us += c.launch_overhead_us + p.read_stream_bytes * TL / (c.hbm_efficiency * gpu.hbm_GBps) / 1000
    # the traffic no kernel avoids: the distinct rows a launch reads that its L2 could not hold already
    # (at most L2's bytes are on chip when it starts), every index and offset, every output byte
    compulsory = (max(0.0, p.profile.unique_per_launch * rs * TL - gpu.l2_bytes) + p.read_stream_bytes * TL + writes)
    floor_us = compulsory / gpu.hbm_GBps / 1000
    prepass = (p.prepass_rows * rs / (c.hbm_efficiency * gpu.hbm_GBps) / 1000 + c.launch_overhead_us
               if p.prepass_rows else math.nan)
    host: dict[str, Any] = {"cache_rows": math.nan, "cache_hit_rate_pct": math.nan,
                            "cache_lookup_hit_rate_pct": math.nan, "host_bytes": 0.0, "dedup_us": math.nan,
                            "transfer_us": math.nan, "lookup_us": math.nan}
    per_table = p.lookups
    if p.host == "cache" and p.host_profile is not None:
        host = cache_terms(p.host_profile.cache(p.cache_rows), gpu, p.row_bytes, per_table, c.hbm_efficiency,
                           c.launch_overhead_us, time_us)
    elif p.host == "uvm" and p.host_profile is not None and p.uvm_mode != "zero-copy":
        host = uvm_terms(p.host_profile.pages(p.row_bytes), gpu, p.uvm_pages, p.profile.T, p.mode, per_table,
                         time_us)
    elif link:
        host = {**host, "host_bytes": row_reads, "transfer_us": row_reads / gpu.pcie_GBps / 1000,
                "lookup_us": time_us, "dedup_us": 0.0, "time_us": time_us,
                "cache_hit_rate_pct": 100 * h2, "cache_lookup_hit_rate_pct": 100 * h2}
    if p.host != "none":
        time_us = host.pop("time_us")
        bound = "host link" if host["transfer_us"] >= max(host["dedup_us"], host["lookup_us"] * 0.5) else bound
    return {**host,
            "time_us": time_us, "bound": bound, "floor_us": floor_us,
            "l1_hit_rate_pct": 100 * l1,
            "l2_hit_rate_pct": 100 * (phi2 / (phi2 + phid) if phi2 + phid > 0 else h2),
            "dram_bytes": reads + writes, "dram_read_bytes": reads, "dram_write_bytes": writes,
            "l2_bytes": l2_bytes, "l1_bytes": l1_bytes,
            "latency_ns": t_row, "step_ns": wait, "task_us": task_ns / 1000,
            "latency_us": terms_ns["latency"] / 1000, "dram_us": terms_ns["dram"] / 1000,
            "l2_us": terms_ns["l2"] / 1000, "l1_us": terms_ns["l1"] / 1000, "issue_us": terms_ns["issue"] / 1000,
            "prepass_us": prepass,
            }
