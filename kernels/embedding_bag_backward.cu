// embedding_bag_backward.cu: the training step's embedding-bag kernels, the gradient of
// the pooled rows with respect to the table and the optimizer update.
//
// Kernels: atomic (each bag's gradient row scattered into a dense fp32 gradient with
//   atomic adds; the order of the adds is not fixed) | sorted (lookups sorted by row on
//   the host, one warp per unique row sums its segment without atomics, in sorted
//   order: deterministic) | fused (sorted, then the row updated in place: SGD, or
//   row-wise Adagrad as FBGEMM keeps it, one fp32 momentum per row += mean of the
//   squared gradient row) | wrong (sorted dropping each segment's last lookup; exists
//   only to prove the checker fails).
//
// Layout, as the forward's: one warp per bag (atomic) or per segment (sorted, fused),
// lane l owns features l, l+32, ... (C of them, C = ceil(D/32) rounded up to 1, 2, 4 or
// 8, so D <= 256), kept in registers. The lookups of a bag or segment are walked in
// groups of kGroup: the group's ids load together, then every row of the group, and
// only then are they added (sorted) or scattered (atomic), so a warp waits once per
// group, not once per lookup (`characterize sass --training` replays the hot loop).
// A row looked up very often would keep one warp busy for its whole segment (the `high`
// preset's hottest row has 17.5K of a table's 307K lookups; `one-item`, all of them), so
// the host splits segments longer than a chunk (about the square root of the longest,
// at least 64 lookups: kernels.training_registry.segment_chunk) and a first pass sums
// each chunk into a partial row, which the segment's warp then adds in order.
//
// Gradients and sums are fp32 whatever the table's dtype (CHZ_DTYPE, chz_compat.cuh);
// the fused update reads and writes the table in its dtype (fp32, fp16, bf16; int8
// tables are not trained). Mean pooling divides each bag's gradient by its number of
// non-padding lookups, per-sample weights multiply it, the padding row gets none, as
// torch's autograd of embedding_bag does.
//
// Napkin math for the paper's shape (T=12, E=500K, D=128 fp32, B=2048, L=150): per table
// N = 307,200 lookups; the atomic backward reads 1 MB of bag gradients and issues
// N x D = 39.3M fp32 atomic adds (157 MB of read-modify-write at L2); the sorted
// backward gathers N rows of the bag gradients (157 MB, L2 hits: the 1 MB fits) and
// writes U rows (U = unique rows: 22K-230K by hotness); the fused update also reads and
// writes those U table rows (and U momenta) and never writes a gradient.
#define CHZ_UNSUPPORTED_MESSAGE "shape not supported by this kernel (D > 256, or an int8 table to update)"
#include "chz_compat.cuh"

#include <math.h>

#include <type_traits>

constexpr int kDtype = CHZ_DTYPE;
static_assert(kDtype != CHZ_FP8, "fp8 tables are read by the tbe kernel (tbe.cu) only");
constexpr int kGroup = 4;             // lookups whose rows are loaded before any is used
constexpr int kWarpsPerBlock = 8;     // 256-thread blocks

enum chz_update : int { CHZ_UPDATE_SGD = 0, CHZ_UPDATE_ROWWISE_ADAGRAD = 1 };
// How a bag's gradient is scaled per lookup, a template argument so the hot loops carry no
// branch on it: not at all (sum), / bag size (mean), x the lookup's weight (per-sample).
enum chz_scale : int { CHZ_SCALE_NONE = 0, CHZ_SCALE_MEAN = 1, CHZ_SCALE_WEIGHTS = 2 };

// Everything one backward (or fused backward + update) of one table needs.
struct chz_bwd_args {
  const float* grad_output;        // [num_bags, dim]: the loss's gradient of the pooled rows
  int64_t num_bags;                // B
  int64_t dim;                     // D
  int64_t num_rows;                // E
  const int64_t* indices;          // [num_indices] in lookup order (atomic)
  const int64_t* offsets;          // [num_bags] bag starts (atomic; offsets[0] is treated as 0)
  int64_t num_indices;
  const int64_t* bag_size;         // [num_bags] non-padding lookups per bag (mean mode), else null
  const float* per_sample_weights; // [num_indices] in lookup order (sum mode), or null
  int32_t mode;                    // chz_mode
  int32_t dtype;                   // chz_dtype of the table (fused): must be the library's
  int64_t padding_idx;             // row that gets no gradient; -1 for none
  const int64_t* sorted_bag;       // [num_sorted] bag of each lookup, lookups sorted by row (stable)
  const int64_t* sorted_pos;       // [num_sorted] its position in lookup order (per-sample weights)
  const int64_t* segment_start;    // [num_segments + 1]: segment s is sorted lookups [start[s], start[s+1])
  const int64_t* segment_row;      // [num_segments] the table row of segment s
  const int64_t* state_row;        // [num_segments] its momentum slot (fused Adagrad), null: segment_row
  int64_t num_segments;
  float* grad_weight;              // [num_rows, dim] dense fp32 gradient, zeroed by the caller (atomic, sorted)
  void* weight;                    // [num_rows, weight_stride0] elements of the dtype (fused)
  int64_t weight_stride0;
  float* momentum;                 // [num_rows] row-wise Adagrad state (fused Adagrad)
  float lr;
  float eps;
  // Long segments split into chunks (sort_lookups): chunk k sums sorted lookups
  // [chunk_begin[k], chunk_end[k]) into partials row k; segment s then sums its partial rows
  // [segment_partials[s], segment_partials[s+1]) in order (none: it sums its lookups itself).
  const int64_t* chunk_begin;      // [num_chunks]
  const int64_t* chunk_end;        // [num_chunks]
  int64_t num_chunks;              // 0: no segment is split
  const int64_t* segment_partials; // [num_segments + 1]
  float* partials;                 // [num_chunks, dim]
};

// ---------------------------------------------------------------- elements
#if defined(CHZ_EMULATE)
// IEEE binary16, round to nearest even (the device uses __float2half_rn).
static inline unsigned short chz_float_to_half_bits(float f) {
  const unsigned x = __float_as_uint(f);
  const unsigned sign = (x >> 16) & 0x8000u;
  const unsigned absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return (unsigned short)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
  if (absx >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  // rounds past the largest half
  if (absx < 0x38800000u) {                                          // subnormal half (or zero)
    const float sub = __uint_as_float(absx) * 16777216.0f;           // in units of 2^-24
    const unsigned q = (unsigned)nearbyintf(sub);
    return (unsigned short)(sign | q);
  }
  const unsigned mant = absx & 0x7fffffu;
  unsigned h = ((absx >> 23) - 112u) << 10 | (mant >> 13);
  const unsigned rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return (unsigned short)(sign | h);
}
#endif

__device__ __forceinline__ float chz_load_elem(const void* base, int64_t at) {
  if constexpr (kDtype == CHZ_FP16) {
    const unsigned short bits = reinterpret_cast<const unsigned short*>(base)[at];
#if defined(CHZ_EMULATE)
    return chz_emu::half_to_float(bits);
#else
    return __half2float(__ushort_as_half(bits));
#endif
  } else if constexpr (kDtype == CHZ_BF16) {
    return __uint_as_float((unsigned)reinterpret_cast<const unsigned short*>(base)[at] << 16);
  } else {
    return reinterpret_cast<const float*>(base)[at];
  }
}

__device__ __forceinline__ void chz_store_elem(void* base, int64_t at, float v) {
  if constexpr (kDtype == CHZ_FP16) {
#if defined(CHZ_EMULATE)
    reinterpret_cast<unsigned short*>(base)[at] = chz_float_to_half_bits(v);
#else
    reinterpret_cast<unsigned short*>(base)[at] = __half_as_ushort(__float2half_rn(v));
#endif
  } else if constexpr (kDtype == CHZ_BF16) {  // round to nearest even, NaN kept quiet
    const unsigned u = __float_as_uint(v);
    const unsigned r = (u & 0x7fffffffu) > 0x7f800000u ? (u | 0x400000u) : u + 0x7fffu + ((u >> 16) & 1u);
    reinterpret_cast<unsigned short*>(base)[at] = (unsigned short)(r >> 16);
  } else {
    reinterpret_cast<float*>(base)[at] = v;
  }
}

__device__ __forceinline__ int64_t chz_warp_id() {
  return ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
}
__device__ __forceinline__ int64_t chz_warp_count() { return ((int64_t)gridDim.x * blockDim.x) >> 5; }

// The bag's gradient as torch's autograd scales it: / bag size (mean), x weight (per sample).
template <int S>
__device__ __forceinline__ float chz_scaled(const chz_bwd_args& a, float g, int64_t bag, float w) {
  if constexpr (S == CHZ_SCALE_MEAN) return g / (float)a.bag_size[bag];
  else if constexpr (S == CHZ_SCALE_WEIGHTS) return g * w;
  else return g;
}

// -------------------------------------------------------------------- atomic
// One group of kGroup lookups of a bag: row[] holds their ids; each lane adds its C
// features of the bag's gradient into each row. When `next` is given, row[] is refilled
// from it before the first atomic, so the next group's ids are in flight while this
// group scatters (loaded unguarded: the caller passes it only when a whole group follows).
template <int C, int S>
__device__ __forceinline__ void chz_scatter_group(const chz_bwd_args& a, int64_t i, int lane, const float (&g)[C],
                                                  int64_t (&row)[kGroup], const int64_t* next) {
  int64_t ahead[kGroup];  // first, as the forward's rpf: issued before anything of this group
#pragma unroll
  for (int k = 0; k < kGroup; ++k) ahead[k] = next ? next[k] : 0;
  int64_t cur[kGroup];
  float w[kGroup];
#pragma unroll
  for (int k = 0; k < kGroup; ++k) {
    cur[k] = row[k];
    w[k] = S == CHZ_SCALE_WEIGHTS ? a.per_sample_weights[i + k] : 1.f;
  }
#pragma unroll
  for (int k = 0; k < kGroup; ++k) row[k] = ahead[k];
#pragma unroll
  for (int k = 0; k < kGroup; ++k) {
    CHZ_KERNEL_ASSERT(cur[k] >= 0 && cur[k] < a.num_rows);
    if (cur[k] == a.padding_idx) continue;
    float* dst = a.grad_weight + cur[k] * a.dim;
#pragma unroll
    for (int c = 0; c < C; ++c)
      if (lane + 32 * c < a.dim) atomicAdd(dst + lane + 32 * c, S == CHZ_SCALE_WEIGHTS ? g[c] * w[k] : g[c]);
  }
}

// One warp per bag: the bag's gradient row (C features per lane) loads once; then per
// group of kGroup lookups (chz_scatter_group) each lane adds its C features of the row
// into each looked-up row of the dense gradient with atomicAdd (its result unused, so it
// compiles to a reduction, RED, that no instruction waits on).
template <int C, int S>
__global__ void __launch_bounds__(256) chz_bwd_atomic_kernel(const chz_bwd_args a) {
  const int lane = threadIdx.x & 31;
  for (int64_t bag = chz_warp_id(); bag < a.num_bags; bag += chz_warp_count()) {
    const int64_t begin = bag == 0 ? 0 : a.offsets[bag];
    const int64_t end = bag + 1 < a.num_bags ? a.offsets[bag + 1] : a.num_indices;
    if (S == CHZ_SCALE_MEAN && a.bag_size[bag] == 0) continue;
    float g[C];
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int64_t f = lane + 32 * c;
      g[c] = f < a.dim ? chz_scaled<S == CHZ_SCALE_MEAN ? S : CHZ_SCALE_NONE>(a, a.grad_output[bag * a.dim + f], bag, 1.f)
                       : 0.f;
    }
    int64_t i = begin;
    if (end - begin >= kGroup) {
      int64_t row[kGroup];
#pragma unroll
      for (int k = 0; k < kGroup; ++k) row[k] = a.indices[begin + k];
      for (; i + 2 * kGroup <= end; i += kGroup) chz_scatter_group<C, S>(a, i, lane, g, row, a.indices + i + kGroup);
      chz_scatter_group<C, S>(a, i, lane, g, row, nullptr);
      i += kGroup;
    }
    // Fewer than kGroup left: straight-line code (a loop here is unrolled by the compiler
    // into a second 4-lookup loop, which the SASS analysis could take for the hot one).
#pragma unroll
    for (int r = 0; r < kGroup - 1; ++r) {
      if (i + r >= end) break;
      const int64_t row = a.indices[i + r];
      CHZ_KERNEL_ASSERT(row >= 0 && row < a.num_rows);
      if (row == a.padding_idx) continue;
      const float w = S == CHZ_SCALE_WEIGHTS ? a.per_sample_weights[i + r] : 1.f;
      float* dst = a.grad_weight + row * a.dim;
#pragma unroll
      for (int c = 0; c < C; ++c)
        if (lane + 32 * c < a.dim) atomicAdd(dst + lane + 32 * c, S == CHZ_SCALE_WEIGHTS ? g[c] * w : g[c]);
    }
  }
}

// -------------------------------------------------------------------- sorted
// One group of kGroup sorted lookups: bag[] holds their bags; their gradient elements all
// load before any is added, and when `next` is given bag[] is refilled from it while they
// are in flight (unguarded: the caller only passes it when a whole group follows), so a
// warp waits about once per group (the forward's rpf does the same with table rows).
template <int C, int S>
__device__ __forceinline__ void chz_segment_group(const chz_bwd_args& a, int64_t j, int lane, int64_t (&bag)[kGroup],
                                                  const int64_t* next, float (&sum)[C]) {
  int64_t ahead[kGroup];  // first, as the forward's rpf: issued before this group's row loads
#pragma unroll
  for (int k = 0; k < kGroup; ++k) ahead[k] = next ? next[k] : 0;
  float w[kGroup];
#pragma unroll
  for (int k = 0; k < kGroup; ++k) w[k] = S == CHZ_SCALE_WEIGHTS ? a.per_sample_weights[a.sorted_pos[j + k]] : 1.f;
  float v[kGroup][C];
#pragma unroll
  for (int k = 0; k < kGroup; ++k)
#pragma unroll
    for (int c = 0; c < C; ++c)
      v[k][c] = lane + 32 * c < a.dim ? a.grad_output[bag[k] * a.dim + lane + 32 * c] : 0.f;
  int64_t scale_bag[kGroup];
#pragma unroll
  for (int k = 0; k < kGroup; ++k) scale_bag[k] = bag[k];
#pragma unroll
  for (int k = 0; k < kGroup; ++k) bag[k] = ahead[k];
#pragma unroll
  for (int k = 0; k < kGroup; ++k)
#pragma unroll
    for (int c = 0; c < C; ++c) sum[c] += chz_scaled<S>(a, v[k][c], scale_bag[k], w[k]);
}

// The sum over sorted lookups [begin, end) of their bags' gradient rows, scaled.
template <int C, int S>
__device__ __forceinline__ void chz_range_sum(const chz_bwd_args& a, int64_t begin, int64_t end, int lane,
                                              float (&sum)[C]) {
#pragma unroll
  for (int c = 0; c < C; ++c) sum[c] = 0.f;
  int64_t j = begin;
  if (end - begin >= kGroup) {
    int64_t bag[kGroup];
#pragma unroll
    for (int k = 0; k < kGroup; ++k) bag[k] = a.sorted_bag[begin + k];
    for (; j + 2 * kGroup <= end; j += kGroup) chz_segment_group<C, S>(a, j, lane, bag, a.sorted_bag + j + kGroup, sum);
    chz_segment_group<C, S>(a, j, lane, bag, nullptr, sum);
    j += kGroup;
  }
  // Fewer than kGroup left: straight-line code (a loop here is unrolled by the compiler
  // into a second 4-lookup loop, which the SASS analysis could take for the hot one).
#pragma unroll
  for (int r = 0; r < kGroup - 1; ++r) {
    if (j + r < end) {
      const int64_t bag = a.sorted_bag[j + r];
      const float w = S == CHZ_SCALE_WEIGHTS ? a.per_sample_weights[a.sorted_pos[j + r]] : 1.f;
#pragma unroll
      for (int c = 0; c < C; ++c)
        if (lane + 32 * c < a.dim) sum[c] += chz_scaled<S>(a, a.grad_output[bag * a.dim + lane + 32 * c], bag, w);
    }
  }
}

// Segment s's gradient row, in sorted order: the sum of its lookups, or of its chunks'
// partial sums when it was split (in chunk order, so the result is deterministic).
// kWrong drops the segment's last lookup (the deliberately wrong kernel).
template <int C, int S, bool kWrong>
__device__ __forceinline__ void chz_segment_sum(const chz_bwd_args& a, int64_t s, int lane, float (&sum)[C]) {
  const int64_t p0 = a.segment_partials ? a.segment_partials[s] : 0;
  const int64_t p1 = a.segment_partials ? a.segment_partials[s + 1] : 0;
  if (p1 == p0) {
    chz_range_sum<C, S>(a, a.segment_start[s], a.segment_start[s + 1] - (kWrong ? 1 : 0), lane, sum);
    return;
  }
#pragma unroll
  for (int c = 0; c < C; ++c) sum[c] = 0.f;
  int64_t p = p0;
  const int64_t last = p1 - (kWrong ? 1 : 0);  // the wrong kernel drops a split segment's last chunk
  for (; p + kGroup <= last; p += kGroup) {  // kGroup partial rows loaded before any is added
    float v[kGroup][C];
#pragma unroll
    for (int k = 0; k < kGroup; ++k)
#pragma unroll
      for (int c = 0; c < C; ++c)
        v[k][c] = lane + 32 * c < a.dim ? a.partials[(p + k) * a.dim + lane + 32 * c] : 0.f;
#pragma unroll
    for (int k = 0; k < kGroup; ++k)
#pragma unroll
      for (int c = 0; c < C; ++c) sum[c] += v[k][c];
  }
  for (; p < last; ++p)
#pragma unroll
    for (int c = 0; c < C; ++c)
      if (lane + 32 * c < a.dim) sum[c] += a.partials[p * a.dim + lane + 32 * c];
}

// One warp per chunk of a split segment: its partial sum, written to partials.
template <int C, int S>
__global__ void __launch_bounds__(256) chz_bwd_chunk_kernel(const chz_bwd_args a) {
  const int lane = threadIdx.x & 31;
  for (int64_t k = chz_warp_id(); k < a.num_chunks; k += chz_warp_count()) {
    float sum[C];
    chz_range_sum<C, S>(a, a.chunk_begin[k], a.chunk_end[k], lane, sum);
#pragma unroll
    for (int c = 0; c < C; ++c)
      if (lane + 32 * c < a.dim) a.partials[k * a.dim + lane + 32 * c] = sum[c];
  }
}

// One warp per segment (unique row): its gradient row written once, no atomics.
template <int C, int S, bool kWrong>
__global__ void __launch_bounds__(256) chz_bwd_sorted_kernel(const chz_bwd_args a) {
  const int lane = threadIdx.x & 31;
  for (int64_t s = chz_warp_id(); s < a.num_segments; s += chz_warp_count()) {
    const int64_t row = a.segment_row[s];
    CHZ_KERNEL_ASSERT(row >= 0 && row < a.num_rows);
    if (row == a.padding_idx) continue;
    float sum[C];
    chz_segment_sum<C, S, kWrong>(a, s, lane, sum);
    float* dst = a.grad_weight + row * a.dim;
#pragma unroll
    for (int c = 0; c < C; ++c)
      if (lane + 32 * c < a.dim) dst[lane + 32 * c] = sum[c];
  }
}

// --------------------------------------------------------------------- fused
// The sorted backward with the update in place of the gradient write: SGD, w -= lr g;
// row-wise Adagrad, m += mean(g^2) over the row (a warp reduction by shuffles), then
// w -= lr g / (sqrt(m) + eps). The gradient never reaches memory. Every lane walks the
// same segments, so the full-mask shuffles are convergent.
template <int C, int kUpdate, int S>
__global__ void __launch_bounds__(256) chz_bwd_fused_kernel(const chz_bwd_args a) {
  const int lane = threadIdx.x & 31;
  for (int64_t s = chz_warp_id(); s < a.num_segments; s += chz_warp_count()) {
    const int64_t row = a.segment_row[s];
    CHZ_KERNEL_ASSERT(row >= 0 && row < a.num_rows);
    if (row == a.padding_idx) continue;
    float sum[C];
    chz_segment_sum<C, S, false>(a, s, lane, sum);
    float scale = a.lr;
    if constexpr (kUpdate == CHZ_UPDATE_ROWWISE_ADAGRAD) {
      float squares = 0.f;
#pragma unroll
      for (int c = 0; c < C; ++c) squares += sum[c] * sum[c];  // lanes past D hold 0
#pragma unroll
      for (int delta = 16; delta > 0; delta >>= 1) squares += __shfl_xor_sync(0xffffffffu, squares, delta);
      const int64_t slot = a.state_row ? a.state_row[s] : row;
      const float m = a.momentum[slot] + squares / (float)a.dim;
      __syncwarp();
      if (lane == 0) a.momentum[slot] = m;
      const float denom = sqrtf(m) + a.eps;
#pragma unroll
      for (int c = 0; c < C; ++c) sum[c] = sum[c] / denom;
    }
    const int64_t at = row * a.weight_stride0;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int64_t f = lane + 32 * c;
      if (f < a.dim) chz_store_elem(a.weight, at + f, chz_load_elem(a.weight, at + f) - scale * sum[c]);
    }
  }
}

// ------------------------------------------------------------------ launchers
// Lanes own C = chunks features each: the smallest of 1, 2, 4, 8 covering D / 32.
CHZ_EXPORT int chz_bwd_chunks(int64_t dim) {
  const int64_t need = (dim + 31) / 32;
  for (int c = 1; c <= 8; c *= 2)
    if (need <= c) return c;
  return 0;  // D > 256
}

static int chz_bwd_check(const chz_bwd_args* a, bool sorted) {
  if (!a || a->num_bags < 0 || a->num_indices < 0 || a->dim <= 0 || a->num_rows <= 0) return CHZ_ERR_BAD_ARGUMENT;
  if (a->mode != CHZ_MODE_SUM && a->mode != CHZ_MODE_MEAN) return CHZ_ERR_BAD_ARGUMENT;
  if (a->mode == CHZ_MODE_MEAN && (a->per_sample_weights || (a->num_bags > 0 && !a->bag_size)))
    return CHZ_ERR_BAD_ARGUMENT;  // torch: per-sample weights only with sum pooling
  if (a->num_bags > 0 && !a->grad_output) return CHZ_ERR_BAD_ARGUMENT;
  if (sorted) {
    if (a->num_segments < 0 || (a->num_segments > 0 && (!a->segment_start || !a->segment_row || !a->sorted_bag)))
      return CHZ_ERR_BAD_ARGUMENT;
    if (a->per_sample_weights && !a->sorted_pos) return CHZ_ERR_BAD_ARGUMENT;
  } else if (a->num_bags > 0 && (!a->offsets || (a->num_indices > 0 && !a->indices))) {
    return CHZ_ERR_BAD_ARGUMENT;
  }
  if (chz_bwd_chunks(a->dim) == 0) return CHZ_ERR_UNSUPPORTED;
  return CHZ_OK;
}

static int chz_bwd_grid(int64_t items, int grid) {
  if (grid > 0) return grid;
  const int64_t blocks = (items + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return (int)(blocks < 1 ? 1 : blocks < (1 << 20) ? blocks : (1 << 20));
}

// Calls launch(C, S) with C and S as std::integral_constant: the chunks per lane D needs and
// the scaling of the bag gradients (sum, mean, per-sample weights).
template <typename F>
static int chz_bwd_dispatch(const chz_bwd_args* a, F&& launch) {
  using std::integral_constant;
  const int scale = a->mode == CHZ_MODE_MEAN ? CHZ_SCALE_MEAN : a->per_sample_weights ? CHZ_SCALE_WEIGHTS : CHZ_SCALE_NONE;
  auto with_scale = [&](auto C) -> int {
    if (scale == CHZ_SCALE_MEAN) launch(C, integral_constant<int, CHZ_SCALE_MEAN>{});
    else if (scale == CHZ_SCALE_WEIGHTS) launch(C, integral_constant<int, CHZ_SCALE_WEIGHTS>{});
    else launch(C, integral_constant<int, CHZ_SCALE_NONE>{});
    return (int)cudaGetLastError();
  };
  switch (chz_bwd_chunks(a->dim)) {
    case 1: return with_scale(integral_constant<int, 1>{});
    case 2: return with_scale(integral_constant<int, 2>{});
    case 4: return with_scale(integral_constant<int, 4>{});
    case 8: return with_scale(integral_constant<int, 8>{});
  }
  return CHZ_ERR_UNSUPPORTED;
}

// ----------------------------------------------------------------- entry points
// `grid`: blocks of 256 threads (8 warps); 0 sizes the grid to one warp per bag or segment.
CHZ_EXPORT int chz_bwd_atomic(const chz_bwd_args* a, int grid, void* stream) {
  if (int e = chz_bwd_check(a, false)) return e;
  if (a->num_bags == 0 || a->num_indices == 0) return CHZ_OK;
  if (!a->grad_weight) return CHZ_ERR_BAD_ARGUMENT;
  const int g = chz_bwd_grid(a->num_bags, grid);
  return chz_bwd_dispatch(a, [&](auto C, auto S) {
    CHZ_LAUNCH((chz_bwd_atomic_kernel<decltype(C)::value, decltype(S)::value>), g, dim3(256), 0,
               (cudaStream_t)stream, *a);
  });
}

// The chunks of split segments first (their partial sums), on the same stream.
static int chz_bwd_chunks_launch(const chz_bwd_args* a, int grid, void* stream) {
  if (a->num_chunks == 0) return CHZ_OK;
  if (a->num_chunks < 0 || !a->chunk_begin || !a->chunk_end || !a->segment_partials || !a->partials)
    return CHZ_ERR_BAD_ARGUMENT;
  const int g = chz_bwd_grid(a->num_chunks, grid);
  return chz_bwd_dispatch(a, [&](auto C, auto S) {
    CHZ_LAUNCH((chz_bwd_chunk_kernel<decltype(C)::value, decltype(S)::value>), g, dim3(256), 0,
               (cudaStream_t)stream, *a);
  });
}

template <bool kWrong>
static int chz_bwd_sorted_launch(const chz_bwd_args* a, int grid, void* stream) {
  if (int e = chz_bwd_check(a, true)) return e;
  if (a->num_segments == 0) return CHZ_OK;
  if (!a->grad_weight) return CHZ_ERR_BAD_ARGUMENT;
  if (int e = chz_bwd_chunks_launch(a, grid, stream)) return e;
  const int g = chz_bwd_grid(a->num_segments, grid);
  return chz_bwd_dispatch(a, [&](auto C, auto S) {
    CHZ_LAUNCH((chz_bwd_sorted_kernel<decltype(C)::value, decltype(S)::value, kWrong>), g, dim3(256), 0,
               (cudaStream_t)stream, *a);
  });
}

CHZ_EXPORT int chz_bwd_sorted(const chz_bwd_args* a, int grid, void* stream) {
  return chz_bwd_sorted_launch<false>(a, grid, stream);
}

CHZ_EXPORT int chz_bwd_wrong(const chz_bwd_args* a, int grid, void* stream) {
  return chz_bwd_sorted_launch<true>(a, grid, stream);
}

template <int kUpdate>
static int chz_bwd_fused_launch(const chz_bwd_args* a, int grid, void* stream) {
  if (int e = chz_bwd_check(a, true)) return e;
  if (a->dtype != kDtype) return CHZ_ERR_DTYPE;
  if (kDtype != CHZ_FP32 && kDtype != CHZ_FP16 && kDtype != CHZ_BF16) return CHZ_ERR_UNSUPPORTED;
  if (a->num_segments == 0) return CHZ_OK;
  if (!a->weight || a->weight_stride0 < a->dim) return CHZ_ERR_BAD_ARGUMENT;
  if (kUpdate == CHZ_UPDATE_ROWWISE_ADAGRAD && !a->momentum) return CHZ_ERR_BAD_ARGUMENT;
  if (int e = chz_bwd_chunks_launch(a, grid, stream)) return e;
  const int g = chz_bwd_grid(a->num_segments, grid);
  return chz_bwd_dispatch(a, [&](auto C, auto S) {  // Adagrad's row reduction shuffles: cooperative
    CHZ_LAUNCH_COOPERATIVE((chz_bwd_fused_kernel<decltype(C)::value, kUpdate, decltype(S)::value>), g, dim3(256),
                           0, (cudaStream_t)stream, *a);
  });
}

CHZ_EXPORT int chz_bwd_fused_sgd(const chz_bwd_args* a, int grid, void* stream) {
  return chz_bwd_fused_launch<CHZ_UPDATE_SGD>(a, grid, stream);
}

CHZ_EXPORT int chz_bwd_fused_rowwise_adagrad(const chz_bwd_args* a, int grid, void* stream) {
  return chz_bwd_fused_launch<CHZ_UPDATE_ROWWISE_ADAGRAD>(a, grid, stream);
}

CHZ_EXPORT int chz_bwd_args_size() { return (int)sizeof(chz_bwd_args); }

// ------------------------------------------------------- runtime occupancy
// Registers per thread and resident 256-thread blocks per SM as the driver reports them
// for the sum-pooling kernel `kind` (atomic, sorted, wrong, fused_sgd, fused_rowwise_adagrad)
// with `chunks` features per lane.
#if !defined(CHZ_EMULATE)
template <typename Kernel>
static int chz_bwd_info_of(Kernel kernel, int block, int* blocks_per_sm, int* registers) {
  cudaFuncAttributes attr;
  cudaError_t e = cudaFuncGetAttributes(&attr, kernel);
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, kernel, block, 0);
  *registers = attr.numRegs;
  return (int)e;
}

template <int C>
static int chz_bwd_info_c(const char* kind, int block, int* blocks, int* regs) {
  if (!strcmp(kind, "atomic")) return chz_bwd_info_of(chz_bwd_atomic_kernel<C, CHZ_SCALE_NONE>, block, blocks, regs);
  if (!strcmp(kind, "sorted")) return chz_bwd_info_of(chz_bwd_sorted_kernel<C, CHZ_SCALE_NONE, false>, block, blocks, regs);
  if (!strcmp(kind, "wrong")) return chz_bwd_info_of(chz_bwd_sorted_kernel<C, CHZ_SCALE_NONE, true>, block, blocks, regs);
  if (!strcmp(kind, "chunk")) return chz_bwd_info_of(chz_bwd_chunk_kernel<C, CHZ_SCALE_NONE>, block, blocks, regs);
  if (!strcmp(kind, "fused_sgd"))
    return chz_bwd_info_of(chz_bwd_fused_kernel<C, CHZ_UPDATE_SGD, CHZ_SCALE_NONE>, block, blocks, regs);
  if (!strcmp(kind, "fused_rowwise_adagrad"))
    return chz_bwd_info_of(chz_bwd_fused_kernel<C, CHZ_UPDATE_ROWWISE_ADAGRAD, CHZ_SCALE_NONE>, block, blocks, regs);
  return CHZ_ERR_BAD_ARGUMENT;
}
#endif

CHZ_EXPORT int chz_bwd_kernel_info(const char* kind, int chunks, int block, int* blocks_per_sm, int* registers) {
#if defined(CHZ_EMULATE)
  (void)kind; (void)chunks; (void)block; (void)blocks_per_sm; (void)registers;
  return CHZ_ERR_UNSUPPORTED;
#else
  switch (chunks) {
    case 1: return chz_bwd_info_c<1>(kind, block, blocks_per_sm, registers);
    case 2: return chz_bwd_info_c<2>(kind, block, blocks_per_sm, registers);
    case 4: return chz_bwd_info_c<4>(kind, block, blocks_per_sm, registers);
    case 8: return chz_bwd_info_c<8>(kind, block, blocks_per_sm, registers);
  }
  return CHZ_ERR_BAD_ARGUMENT;
#endif
}
