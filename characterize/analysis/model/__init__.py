"""Analysis stage, the model: kernel time, L2 hit rate and memory traffic of every variant
(ours, PyTorch's, FBGEMM's, a user's) on any GPU in the spec table, predicted from the
trace and each kernel's machine code alone, with a handful of constants inside their
published ranges, validated against public measurements (analysis.validation).

Per launch (B bags and N lookups per table, T_l tables per launch: 1, or T for a kernel
covering every table at once; rows of R bytes covering s 32-byte sectors, R_s = 32 s;
S bytes streamed through L2 per lookup besides rows: its index, offset2bag where the
kernel writes it, and its share of offsets and outputs):

Locality, computed once per dataset and shared by every variant, GPU and constant set
  d_i   reuse distance of lookup i in its table's own multi-batch trace (distinct rows
        read since the previous read of the same row; workloads.reuse_distances)
  g_i   lookups since that previous read; k_i batch boundaries crossed
  U     distinct rows per launch
  The L2 holds, between two reads of a row, every distinct row read in between and
  every byte streamed meanwhile; per-table launches run the T tables in turn, so each
  boundary brings T-1 other launches (a batched launch walking m tables at a time, tbe's
  phases or FBGEMM's all, interleaves their reads: m tables' rows share the L2 at once):
  b_i = d_i R_s + g_i S + k_i (T-1) (U R_s + (N/T_l) S) bytes (cold mode, L2 flushed
  before every launch: b_i = inf when k_i > 0). A lookup hits when
  b_i < f L2_bytes (f: l2_capacity_factor, the share of the sectored, set-associative,
  two-partition L2 that behaves like an ideal LRU). Batch 0 is warm-up.
  l2p/combined with a persisting set-aside: the K_r hottest rows (as the runner picks
  them) are pinned; a pinned row keeps its priority with probability p (pinned_hit),
  else it competes as the l2w window's rows do; the other rows compete in the rest of
  L2. Without a set-aside (cudaLimitPersistingL2CacheSize unset) the pre-pass only warms
  L2: a hot row's first read in a launch finds it as if last read at the pre-pass, the
  hot rows prefetched after it and what the launch streamed so far lying in between.
  l2w: the carve-out of K_r rows is re-aimed at each table; a hot lookup is kept when its
  distance among hot rows is below K_r, otherwise it competes with its full distance.
  L1 (per SM, invalidated between kernels): the lookups of the bags one SM runs (blocks
  dealt round-robin) against L1_data / R_s rows, as for one table however many tables a
  batched launch walks at once (its blocks' hot rows are what the L1 keeps). A lookup is
  served by L1 (phi1), L2 (phi2 = max(h2 - phi1, 0)) or DRAM (phiD = 1 - max(h2, phi1)).

Latency: what each warp waits for, read from the code (kernels.sass, kernels.peers)
  A task is a warp's unit of work: a (bag, chunk of features) for a thread per feature,
  32 / lanes_per_bag bags for lanes sharing a bag. The loop nest of the kernel's SASS is
  replayed for bags of 1..256 lookups: the row latencies a task waits (index tiles, the
  bag's offsets, bounds checks, the output store and its rows, as the code orders them)
  and the instructions it issues; the trace's own bag lengths pick the mean over its
  bags. One wait covers the U rows the hot loop keeps in flight and lasts as long as
  the slowest of them:
      E[max] = lambda1 phi1^U + lambda2 ((phi1+phi2)^U - phi1^U) + lambdaD (1 - (phi1+phi2)^U)
  so a task takes latencies x E[max]. Nothing is taken from a variant's name.
  Scheduling: the busiest SM runs ceil(blocks / SMs) blocks, as many at a time as fit
  (occupancy from registers, shared memory and block size, ptxas's or cuobjdump's), in
  whole rounds: blocks of equal work retire together, so 8 blocks on an SM that holds 5
  take 2 rounds, not 1.6. t_lat = task x ceil(tasks / warps of the grid) x rounds.
  Issue: the busiest SM's share of tasks x instructions per task at issue_ipc warp
  instructions per cycle (of four schedulers' 4: what a gather's loop reaches) at the
  boost clock; a grid of fewer blocks than SMs issues on the SMs it holds.

Bandwidth
  DRAM reads  = N phiD R_s (random gathers of s contiguous bytes per warp request, at
                eta BW_hbm s / (s + s0): a request pays a fixed cost beside its
                transfer) + N 8 + B 8 (indices and offsets, streamed at eta BW_hbm)
  DRAM writes = B D out_bytes (+ N 8 + B 8 where offset2bag and bag sizes are written),
                at w BW_hbm (write_efficiency): at L=1 they are most of the traffic
  L2 bytes    = N (1 - phi1) R_s + the streams, at BW_l2
  L1 bytes    = 128-byte wavefronts issued, the busiest SM's share, at l1_efficiency of
                the L1's bytes per clock
  uvm (zero-copy, the default): rows read in place over the host link at its bandwidth,
  with its round trip added to the DRAM latency; migrate=1 models faults and page
  migrations instead. cache: its per-batch dedup, transfer and lookup (model.host).

Time
  The terms (latency, DRAM, L2, L1, issue) contend for the same warps, schedulers and
  memory system: they combine as a k-norm, (sum t^k)^(1/k) with k = overlap (1 adds
  them, a large k is the roofline's max), plus t_launch. `bound` names the largest.
  floor_us: every distinct row once, the streams and the writes at peak bandwidth; no
  prediction or band edge goes below it. A row says how many tables its time covers
  (tables_per_launch); batch_us is a whole batch of T tables, and speedups over base,
  torch and fbgemm compare batches. The l2p pre-pass is reported apart (prepass_us);
  FBGEMM's bounds check, a kernel of its own reading every index before the lookup
  (its default; params bounds_check=0 turns it off), is in the time.

Constants (ModelConstants): lambda1, lambda2, lambdaD, f, eta, t_launch, p, w, k, s0,
issue_ipc, l1_efficiency, defaults from hardware.GpuSpec (sources there) or published
ranges (constants.BAND); `calibrate()` fits them to a measured run and stores them per
GPU. time_us_low and time_us_high span the constants' ranges and the model's own error
(validation_error.model_error): its regime's (host tables, short bags, L1/L2-resident,
DRAM-bound, latency-bound) held-out errors on our own GPU runs, each dataset's band drawn
from fits that never saw it (nested leave-one-dataset-out), else the public corpus's
under leave-one-source-out cross-validation; validated_n and validated_gmae_pct say how
well it did.
"""
