"""Analysis stage, the model: kernel time, L2 hit rate and memory traffic of every variant on any GPU
in the spec table, predicted from the trace and the static characterization alone,
with a handful of constants that a measured run can calibrate.

Per table launch (B bags, N lookups, L = N/B per bag, rows of R bytes covering s
32-byte sectors, R_s = 32 s):

Locality, computed once per dataset and shared by every variant and GPU
  d_i   reuse distance of lookup i in its table's own multi-batch trace (distinct rows
        read since the previous read of the same row; workloads.reuse_distances)
  k_i   batch boundaries crossed since that previous read
  U     distinct rows per launch
  The T tables are launched in turn, so each boundary brings T-1 other launches of U
  distinct rows each: d*_i = d_i + k_i (T-1) U (cold mode, L2 flushed before every
  launch: d*_i = inf when k_i > 0). Batch 0 is warm-up (it has no history); hit rates
  are scored over the later batches.
  L2 = a fully associative LRU of C2 = f L2_bytes / R_s rows: h2 = P(d* < C2). The real
  L2 is sectored, set-associative and split in two partitions that each hold a copy
  of lines read from both sides; f (l2_capacity_factor, default from GpuSpec) is the
  fraction of it that behaves like the ideal LRU.
  l2p/combined: the K_r = min(K, rows the trace reads, persisting budget / R_s)
  hottest rows (by frequency over the table's trace, as the runner picks them) are
  prefetched with evict_last before each launch: they hit. The other lookups compete,
  with their own distances d*_c over the non-hot substream, for
  C2' = f (L2_bytes - K_r R_s) / R_s rows:  h2 = p_hot + (1 - p_hot) P(d*_c < C2').
  l2w: nothing is prefetched; hot rows become persisting on use and the carve-out of
  K_r rows is re-aimed at each table, so a hot lookup is kept when its distance among
  hot rows d*_h < K_r (a first read per launch is not, unless the hot sets of all T
  tables fit); a hot lookup not kept competes in C2' with its full distance d*. The
  other lookups as for l2p. (So l2w can lose to plain L2 in steady state.)
  L1 (per SM, invalidated between kernels): the lookups of the bags one SM runs
  (blocks dealt round-robin), reuse within the launch against C1 = L1_data / R_s rows:
  l1. A lookup is served by L1 (phi1 = l1), L2 (phi2 = max(h2 - l1, 0)) or DRAM
  (phiD = 1 - max(h2, l1)); l2_hit_rate_pct = phi2 / (phi2 + phiD), the rate of row
  requests reaching L2.

Latency (lambda1, lambda2, lambdaD: L1, L2, DRAM load-to-use), from the code itself
  The hot loop of each kernel is read from its SASS (kernels.sass): the in-order replay
  gives the memory latencies a warp serializes per iteration (a), the lookups one
  iteration gathers (n) and the row loads it keeps in flight (U). Nothing is assumed
  from a variant's name: a "prefetching" kernel whose compiled loop waits on every row
  is modelled as waiting on every row. One wait covers U rows and lasts as long as the
  slowest of them:
      E[max] = lambda1 phi1^U + lambda2 ((phi1+phi2)^U - phi1^U) + lambdaD (1 - (phi1+phi2)^U)
  (U = 1: t_row = phi1 lambda1 + phi2 lambda2 + phiD lambdaD), so a lookup costs
      step = (a / n) E[max].
  Thread per (bag, feature) kernels (base, optmt, l2p, l2w, rpf, combined; torch is
  modelled as base): a warp's task, one (bag, 32-feature chunk), takes L step; base
  issues the next index load before it waits on the current row, which a (about 1.2
  latencies per lookup) carries.
  warp: per tile of G indices one coalesced index load (lambdaD), then the rows of the
  warp's 32/G bags: tiles lambdaD + L (32/G) step.
  Blocks carry equal work, so they run in waves: waves = ceil(blocks with work /
  (blocks_per_sm SMs)), rounds = tasks per warp, and t_lat = waves rounds task.
  Issue: the hot loop's instructions per lookup (SASS) x the warps a lookup needs
  (chunks, or 1 for warp), over four schedulers per SM at the boost clock.

Bandwidth
  DRAM bytes = N phiD R_s + N 8 (indices, streamed once) + B 8 (offsets) + B R (output)
               + N 8 (offset2bag) + B 8 (bag sizes)
  L2 bytes   = N (1 - phi1) R_s + the same streams
  L1 bytes   = 128-byte wavefronts issued (row loads and index loads)
  time = max(t_lat, DRAM / (eta BW_hbm), L2 / BW_l2, L1 / BW_l1, issue) + t_launch; `bound`
  names the largest term. The l2p pre-pass (K rows from DRAM) is reported apart, in
  prepass_us, as the paper and the runner report it.

Constants (ModelConstants): lambda1, lambda2, lambdaD, f, eta and t_launch per GPU,
defaults from hardware.GpuSpec (with sources there); `calibrate()` fits them to a
measured run by least squares on log time (and on L2 hit rates where ncu measured
them with --cache-control none) and stores them per GPU; predictions use them when
present (column `constants`). time_us_low and time_us_high evaluate the same
equations at the fast and slow ends of each constant's published range
(constants.BAND).
"""
