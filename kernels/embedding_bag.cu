// embedding_bag.cu: the embedding-bag (sum/mean pooling) kernel family.
//
// Variants: base (PyTorch-style thread per bag x feature) | optmt (base, register cap)
//   | rpf (register prefetch: P row loads in flight per thread) | l2p (hot rows pinned
//   in L2 by a prefetch pre-pass) | l2w (access-policy window over frequency-sorted
//   rows) | combined (rpf + l2p, capped) | warp (sub-warp per bag, 16-byte loads, U*V
//   float4 per lane in flight) | wrong (base with an off-by-one; exists only to prove
//   the checker fails).
//
// What is in flight is a property of the SASS, not of this source: ptxas may turn a
// guarded prefetch into a load plus an immediate move, or interleave adds between
// independent loads. `characterize sass` (characterize/kernels/sass.py) replays each
// hot loop and tests/kernels/test_sass.py holds these kernels to their claims.
//
// Order: kernels (base, rpf, warp, L2 pre-pass), then launchers, then the C entry
// points Python loads with ctypes. optmt/combined are compile-flag variants (the
// register cap applies to the whole library build), so they reuse these kernels.
//
// Precision: one library per dtype (CHZ_DTYPE, chz_compat.cuh). Loads keep the raw bits
// and values are decoded to fp32 where they are added (fp16/bf16 from their 16-bit
// patterns, int8 as q x scale + bias with the row's own scale and bias), so decoding
// never makes a load wait; pooling and the output are fp32.
//
// Napkin math for the paper's shape (D=128 fp32, L=150, B=2048): each lookup gathers
// one 512-byte row (16 sectors of 32 B); a table costs B*L*512 B = 157 MB of row
// traffic against 2.4 MB of indices and 1 MB of output, so the kernels are bound by
// how many row loads are in flight, not by arithmetic.
#define CHZ_UNSUPPORTED_MESSAGE "shape not supported by this variant"
#include "chz_compat.cuh"

#include <type_traits>

// ------------------------------------------------------------------- helpers
__device__ __forceinline__ int64_t chz_bag_begin(const chz_bag_args& a, int64_t bag) {
  return bag == 0 ? 0 : a.offsets[bag];  // the first bag always starts at 0, as in torch
}
__device__ __forceinline__ int64_t chz_bag_end(const chz_bag_args& a, int64_t bag) {
  return bag + 1 < a.num_bags ? a.offsets[bag + 1] : a.num_indices;
}

// --------------------------------------------------------------- element types
constexpr int kDtype = CHZ_DTYPE;
static_assert(kDtype != CHZ_FP8, "fp8 tables are read by the tbe kernel (tbe.cu) only");
constexpr int kElemBytes = kDtype == CHZ_FP32 ? 4 : (kDtype == CHZ_FP16 || kDtype == CHZ_BF16) ? 2 : 1;
constexpr int kQparamBytes = kDtype == CHZ_INT8 ? 8 : kDtype == CHZ_INT8H ? 4 : 0;  // scale + bias after the values
constexpr int kVecElems = 16 / kElemBytes;  // elements per 16-byte load (warp)

__device__ __forceinline__ float chz_half_bits(unsigned bits) {
#if defined(CHZ_EMULATE)
  return chz_emu::half_to_float((uint16_t)bits);
#else
  return __half2float(__ushort_as_half((unsigned short)bits));
#endif
}

// Loads and decoding are split: a kernel that keeps several rows in flight stores what
// it loaded as stored (chz_storage, chz_qraw) and decodes only when it adds, so no
// conversion waits on a load before the next load issues (checked in the SASS).
typedef std::conditional<kElemBytes == 4, float,
                         std::conditional<kElemBytes == 2, unsigned short, unsigned char>::type>::type chz_storage;
typedef std::conditional<kDtype == CHZ_INT8H, unsigned short, float>::type chz_qstore;

// Scale and bias of an int8 row as stored, and decoded (1 and 0 for the other dtypes).
struct chz_qraw {
  chz_qstore scale, bias;
};
struct chz_qparams {
  float scale, bias;
};
__device__ __forceinline__ chz_qraw chz_load_qparams(const unsigned char* row, int64_t dim) {
  if constexpr (kQparamBytes > 0) {
    const chz_qstore* q = reinterpret_cast<const chz_qstore*>(row + dim);
    return {q[0], q[1]};
  } else {
    return {};
  }
}
__device__ __forceinline__ chz_qparams chz_decode_qparams(const chz_qraw& q) {
  if constexpr (kDtype == CHZ_INT8) return {(float)q.scale, (float)q.bias};
  else if constexpr (kDtype == CHZ_INT8H) return {chz_half_bits(q.scale), chz_half_bits(q.bias)};
  else return {1.f, 0.f};
}
__device__ __forceinline__ chz_qparams chz_row_qparams(const unsigned char* row, int64_t dim) {
  return chz_decode_qparams(chz_load_qparams(row, dim));
}

// One stored element decoded to fp32 (int8: the raw value; scale it with the row's qparams).
__device__ __forceinline__ float chz_decode(chz_storage v) {
  if constexpr (kDtype == CHZ_FP16) return chz_half_bits(v);
  else if constexpr (kDtype == CHZ_BF16) return __uint_as_float((unsigned)v << 16);
  else return (float)v;
}
__device__ __forceinline__ float chz_dequantize(chz_storage v, const chz_qraw& q) {
  if constexpr (kQparamBytes > 0) {
    const chz_qparams d = chz_decode_qparams(q);
    return chz_decode(v) * d.scale + d.bias;
  } else {
    return chz_decode(v);
  }
}

// Element `off` of a row, decoded to fp32 (int8: the raw value; scale it with the row's qparams).
__device__ __forceinline__ float chz_elem_at(const unsigned char* row, int64_t off) {
  if constexpr (kDtype == CHZ_FP32) return reinterpret_cast<const float*>(row)[off];
  else if constexpr (kDtype == CHZ_FP16) return chz_half_bits(reinterpret_cast<const unsigned short*>(row)[off]);
  else if constexpr (kDtype == CHZ_BF16)
    return __uint_as_float((unsigned)reinterpret_cast<const unsigned short*>(row)[off] << 16);
  else return (float)row[off];
}

// Where feature `feature` of row 0 sits: hoisted out of the row loops, as torch's kernel does.
__device__ __forceinline__ const unsigned char* chz_column(const chz_bag_args& a, int64_t feature) {
  return reinterpret_cast<const unsigned char*>(a.weight) + feature * a.weight_stride1 * kElemBytes;
}

// Feature `feature` (whose column is `column`) of row `row`, dequantized to fp32. An int8
// row's values are contiguous bytes (stride1 == 1), so its start is column - feature.
__device__ __forceinline__ float chz_value(const chz_bag_args& a, const unsigned char* column, int64_t row,
                                           int64_t feature) {
  const unsigned char* at = column + row * a.weight_stride0 * kElemBytes;
  const float v = chz_elem_at(at, 0);
  if constexpr (kQparamBytes > 0) {
    const chz_qparams q = chz_row_qparams(at - feature, a.dim);
    return v * q.scale + q.bias;
  } else {
    return v;
  }
}

// ---------------------------------------------------------------- base / wrong
// One thread per (bag, feature element); a 32x8 block covers 8 (bag, 32-feature
// chunk) pairs; the grid strides over all pairs. Each iteration issues one scalar
// 4-byte load whose address depends on the index load before it, so a warp has one
// row-chunk (128 B) in flight: latency bound. kOffByOne drops each bag's last index
// (the deliberately wrong variant).
template <bool kOffByOne>
__global__ void chz_base_kernel(const chz_bag_args a) {
  const int64_t chunks_per_bag = (a.dim + blockDim.x - 1) / blockDim.x;
  const int64_t num_chunks = a.num_bags * chunks_per_bag;
  const int64_t stride = (int64_t)gridDim.x * blockDim.y;
  for (int64_t chunk = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; chunk < num_chunks; chunk += stride) {
    const int64_t feature = (chunk % chunks_per_bag) * blockDim.x + threadIdx.x;
    if (feature >= a.dim) continue;
    const int64_t bag = chunk / chunks_per_bag;
    const int64_t begin = chz_bag_begin(a, bag);
    const int64_t end = chz_bag_end(a, bag) - (kOffByOne ? 1 : 0);
    CHZ_KERNEL_ASSERT(end >= begin || kOffByOne);  // offsets must be non-decreasing
    float sum = 0.f;
    int64_t count = 0;
    const unsigned char* column = chz_column(a, feature);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t row = a.indices[i];
      CHZ_KERNEL_ASSERT(row < a.num_rows);  // device-side bounds check, as torch's kernel has
      const bool pad = row == a.padding_idx;
      float value = pad ? 0.f : chz_value(a, column, row, feature);
      if (a.per_sample_weights) value *= a.per_sample_weights[i * a.per_sample_weights_stride];
      sum += value;
      count += pad ? 0 : 1;
      if (feature == 0) a.offset2bag[i] = bag;
    }
    if (a.mode == CHZ_MODE_MEAN && count > 0) sum /= (float)count;
    a.bag_size[bag] = count;
    a.output[bag * a.dim + feature] = sum;
  }
}

// ------------------------------------------------------------------------ rpf
// base with register prefetching: P row loads per thread in flight. The steady-state
// loop walks whole groups of P indices with no guards: it issues the P row loads of
// the current group, loads the next group's P indices while they are in flight, and
// only then adds the rows, so the warp waits once per group, not once per row (a
// guarded refill, `if (next < end) slot = row[next]`, compiles to a load into a
// temporary and an immediate move into the slot: the wait the prefetch should hide).
// The last whole group runs without the index refill and the < P leftover indices
// run one by one as straight-line code. offset2bag is written up front, coalesced,
// by the chunk-0 threads of each bag, which keeps it out of the hot loop.

// One group: row[] holds P indices; when `next` is given, row[] is refilled from it
// while the rows are in flight.
template <int P>
__device__ __forceinline__ void chz_rpf_group(const chz_bag_args& a, const unsigned char* column, int64_t feature,
                                              int64_t (&row)[P],
                                              const int64_t* next, float& sum, int& pads) {
  int64_t ahead[P];
#pragma unroll
  for (int p = 0; p < P; ++p) ahead[p] = next ? next[p] : 0;
  chz_storage value[P];  // as stored: decoded only when added, after every load has issued
  chz_qraw q[P];
  bool pad[P];
#pragma unroll
  for (int p = 0; p < P; ++p) {
    CHZ_KERNEL_ASSERT(row[p] < a.num_rows);  // device-side bounds check, as base has
    const unsigned char* at = column + row[p] * a.weight_stride0 * kElemBytes;
    value[p] = *reinterpret_cast<const chz_storage*>(at);
    q[p] = chz_load_qparams(at - feature, a.dim);
    pad[p] = row[p] == a.padding_idx;
  }
#pragma unroll
  for (int p = 0; p < P; ++p) row[p] = ahead[p];
#pragma unroll
  for (int p = 0; p < P; ++p) {
    sum += pad[p] ? 0.f : chz_dequantize(value[p], q[p]);
    pads += pad[p] ? 1 : 0;
  }
}

template <int P>
__global__ void chz_rpf_kernel(const chz_bag_args a) {
  const int64_t chunks_per_bag = (a.dim + blockDim.x - 1) / blockDim.x;
  const int64_t num_chunks = a.num_bags * chunks_per_bag;
  const int64_t stride = (int64_t)gridDim.x * blockDim.y;
  for (int64_t chunk = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; chunk < num_chunks; chunk += stride) {
    const int64_t bag = chunk / chunks_per_bag;
    const int64_t part = chunk - bag * chunks_per_bag;
    const int64_t begin = chz_bag_begin(a, bag);
    const int64_t end = chz_bag_end(a, bag);
    CHZ_KERNEL_ASSERT(end >= begin);  // offsets must be non-decreasing
    if (part == 0)
      for (int64_t k = begin + threadIdx.x; k < end; k += blockDim.x) a.offset2bag[k] = bag;
    const int64_t feature = part * blockDim.x + threadIdx.x;
    if (feature >= a.dim) continue;
    const unsigned char* column = chz_column(a, feature);
    float sum = 0.f;
    int pads = 0;  // padding rows met: excluded from the sum and the count
    int64_t i = begin;
    if (end - begin >= P) {
      int64_t row[P];
#pragma unroll
      for (int p = 0; p < P; ++p) row[p] = a.indices[begin + p];
      for (; i + 2 * P <= end; i += P) chz_rpf_group<P>(a, column, feature, row, a.indices + i + P, sum, pads);
      chz_rpf_group<P>(a, column, feature, row, nullptr, sum, pads);
      i += P;
    }
#pragma unroll
    for (int r = 0; r < P - 1; ++r) {  // fewer than P left
      if (i + r < end) {
        const int64_t row = a.indices[i + r];
        CHZ_KERNEL_ASSERT(row < a.num_rows);
        const bool pad = row == a.padding_idx;
        sum += pad ? 0.f : chz_value(a, column, row, feature);
        pads += pad ? 1 : 0;
      }
    }
    const int64_t count = end - begin - pads;
    if (a.mode == CHZ_MODE_MEAN && count > 0) sum /= (float)count;
    a.bag_size[bag] = count;
    a.output[bag * a.dim + feature] = sum;
  }
}

// ----------------------------------------------------------------------- warp
// A group of G lanes (G = next power of two >= D/W, at most 32, W = 16 / element bytes:
// 4 fp32, 8 fp16/bf16, 16 int8 elements per 16-byte vector) owns one bag; lane l owns
// vector columns l, l+G, ... (V of them). The group loads G indices at once
// (coalesced, bounds-checked like base; offset2bag written alongside). Then, per U
// rows: an index phase (U shuffles broadcast the rows; a row past the bag's end or
// the padding row is redirected to chz_zero_row, so no load is conditional) and a row
// phase (U*V independent 16-byte loads, plus each int8 row's scale and bias, all
// issued before the first add), so a warp keeps U*V vectors per lane, U whole rows at
// D=128, in flight instead of base's one 128-byte chunk. Columns past D (D/W not a
// multiple of G) read the row's last vector and are never stored.
// __launch_bounds__(256, 2) lets ptxas keep the U*V loads in registers (up to 128 per
// thread): with the default budget it interleaves the adds between the loads on sm_80
// (about two rows in flight, checked in the SASS). Needs D % W == 0, D <= 1024 and
// 16-byte aligned rows (contiguous for fp32/fp16/bf16; int8 rows padded to 16 bytes).
constexpr int kMaxVec = 256;  // float4 columns per row at D = 1024 fp32 (4 KiB: any dtype's row + qparams)
// 16-byte vectors per lane at D = 1024: 8 fp32, 4 fp16/bf16, 2 int8 (larger V is never launched, so not built)
constexpr int kMaxPerLane = 1024 / kVecElems / 32;
__device__ const float4 chz_zero_row[kMaxVec] = {};

// An int8 row's scale and bias in one aligned load: the warp kernel's rows are 16-byte
// aligned and D % 16 == 0, so they sit at an 8-byte (int8h: 4-byte) aligned offset.
// (A template, so the other dtypes' branches are discarded, not compiled.)
template <int kD = kDtype>
__device__ __forceinline__ chz_qraw chz_load_qparams_pair(const unsigned char* row, int64_t dim) {
  if constexpr (kD == CHZ_INT8) {
    const float2 q = *reinterpret_cast<const float2*>(row + dim);
    return {(chz_qstore)q.x, (chz_qstore)q.y};
  } else if constexpr (kD == CHZ_INT8H) {
    const unsigned w = *reinterpret_cast<const unsigned*>(row + dim);
    return {(chz_qstore)(w & 0xffffu), (chz_qstore)(w >> 16)};
  } else {
    return {};
  }
}

// acc[0..W) += the W elements packed in one 16-byte vector, decoded (int8: x scale; the
// row's bias is summed once per row into the bag's bias, not once per element).
__device__ __forceinline__ void chz_accumulate(float (&acc)[kVecElems], const uint4& v, float scale) {
  const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (kDtype == CHZ_FP32) {
      acc[i] += __uint_as_float(w[i]);
    } else if constexpr (kDtype == CHZ_FP16) {
      acc[2 * i] += chz_half_bits(w[i] & 0xffffu);
      acc[2 * i + 1] += chz_half_bits(w[i] >> 16);
    } else if constexpr (kDtype == CHZ_BF16) {
      acc[2 * i] += __uint_as_float(w[i] << 16);
      acc[2 * i + 1] += __uint_as_float(w[i] & 0xffff0000u);
    } else {
#pragma unroll
      for (int b = 0; b < 4; ++b) acc[4 * i + b] += (float)((w[i] >> (8 * b)) & 0xffu) * scale;
    }
  }
}

template <int V, int U>
__global__ void __launch_bounds__(256, 2) chz_warp_kernel(const chz_bag_args a, int group) {
  const int lane = threadIdx.x & 31;
  const int g_lane = lane & (group - 1);
  const int g_in_warp = lane / group;
  const unsigned gmask = group == 32 ? 0xffffffffu : (((1u << group) - 1u) << (g_in_warp * group));
  const int groups_per_warp = 32 / group;
  const int64_t groups_per_block = (int64_t)(blockDim.x / 32) * groups_per_warp;
  const int64_t nvec = a.dim / kVecElems;
  const uint4* table = reinterpret_cast<const uint4*>(a.weight);
  const uint4* zero = reinterpret_cast<const uint4*>(chz_zero_row);
  const int64_t row_vecs = kQparamBytes > 0 ? a.weight_stride0 / 16 : nvec;  // 16-byte vectors between rows
  float4* out = reinterpret_cast<float4*>(a.output);
  int64_t col[V];  // this lane's columns, clamped into the row
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int64_t c = g_lane + (int64_t)k * group;
    col[k] = c < nvec ? c : nvec - 1;
  }
  const int64_t first = (int64_t)blockIdx.x * groups_per_block + (threadIdx.x / 32) * groups_per_warp + g_in_warp;
  for (int64_t bag = first; bag < a.num_bags; bag += (int64_t)gridDim.x * groups_per_block) {
    const int64_t begin = chz_bag_begin(a, bag);
    const int64_t end = chz_bag_end(a, bag);
    float acc[V][kVecElems];
#pragma unroll
    for (int k = 0; k < V; ++k)
#pragma unroll
      for (int e = 0; e < kVecElems; ++e) acc[k][e] = 0.f;
    float bias = 0.f;  // int8: the bias of every row added, added to each element at the end
    int64_t count = 0;
    for (int64_t tile = begin; tile < end; tile += group) {
      const int64_t i = tile + g_lane;
      int64_t mine = 0;
      if (i < end) {
        mine = a.indices[i];
        CHZ_KERNEL_ASSERT(mine >= 0 && mine < a.num_rows);  // device-side bounds check, as base has
        a.offset2bag[i] = bag;
        count += mine != a.padding_idx;
      }
      const int n = (int)(end - tile < group ? end - tile : group);
      for (int j = 0; j < n; j += U) {
        const uint4* row[U];  // index phase
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t r = __shfl_sync(gmask, mine, j + u, group);
          row[u] = j + u < n && r != a.padding_idx ? table + r * row_vecs : zero;
        }
        uint4 v[U][V];  // row phase: every load issued before the first add
        chz_qraw q[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
          for (int k = 0; k < V; ++k) v[u][k] = __ldg(row[u] + col[k]);
          q[u] = chz_load_qparams_pair(reinterpret_cast<const unsigned char*>(row[u]), a.dim);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const chz_qparams d = chz_decode_qparams(q[u]);
          if constexpr (kQparamBytes > 0) bias += d.bias;
#pragma unroll
          for (int k = 0; k < V; ++k) chz_accumulate(acc[k], v[u][k], d.scale);
        }
      }
    }
    for (int s = group / 2; s > 0; s /= 2) count += __shfl_xor_sync(gmask, count, s, group);
    if constexpr (kQparamBytes > 0) {
#pragma unroll
      for (int k = 0; k < V; ++k)
#pragma unroll
        for (int e = 0; e < kVecElems; ++e) acc[k][e] += bias;
    }
    if (a.mode == CHZ_MODE_MEAN && count > 0) {
      const float n = (float)count;
#pragma unroll
      for (int k = 0; k < V; ++k)
#pragma unroll
        for (int e = 0; e < kVecElems; ++e) acc[k][e] /= n;
    }
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int64_t c = g_lane + (int64_t)k * group;
      if (c < nvec) {
#pragma unroll
        for (int e = 0; e < kVecElems / 4; ++e)
          out[(bag * a.dim + c * kVecElems) / 4 + e] =
              make_float4(acc[k][4 * e], acc[k][4 * e + 1], acc[k][4 * e + 2], acc[k][4 * e + 3]);
      }
    }
    if (g_lane == 0) a.bag_size[bag] = count;
  }
}

// --------------------------------------------------------------- L2 pre-pass
// Issue prefetch.global.L2::evict_last for every 32-byte sector of each hot row, so
// the rows sit in L2 with evict-last priority before the lookup kernel runs. K rows
// of D fp32 cost K*ceil(4D/32) prefetches (60K x 16 ~ 1M for the paper's shape).
// Row r starts at weight + r*stride0 elements of the dtype (a view of a wider table
// has stride0 > D); its elements are stride1 apart: a row spanning less than a sector
// per element is prefetched sector by sector, one with elements a sector or more
// apart element by element. An int8 row's span includes its scale and bias.
constexpr int64_t kSectorBytes = 32;

// Prefetch slots per row: the sectors an unaligned span can touch, or one per element.
__host__ __device__ inline int64_t chz_pin_span(int64_t dim, int64_t stride1) {
  return ((dim - 1) * stride1 + 1) * (int64_t)kElemBytes + kQparamBytes;
}
__host__ __device__ inline int64_t chz_pin_slots(int64_t dim, int64_t stride1) {
  if (stride1 * (int64_t)kElemBytes >= kSectorBytes) return dim;
  return chz_pin_span(dim, stride1) / kSectorBytes + 2;
}

__global__ void chz_l2_pin_kernel(const void* weight, int64_t dim, int64_t stride0, int64_t stride1,
                                  const int64_t* hot_rows, int64_t num_hot) {
  const int64_t slots = chz_pin_slots(dim, stride1);
  const bool spread = stride1 * (int64_t)kElemBytes >= kSectorBytes;
  const int64_t span = chz_pin_span(dim, stride1);
  const int64_t total = num_hot * slots;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
    const int64_t slot = t % slots;
    const char* row = reinterpret_cast<const char*>(weight) + hot_rows[t / slots] * stride0 * kElemBytes;
    if (spread) {
      CHZ_PREFETCH_L2_EVICT_LAST(reinterpret_cast<const void*>(row + slot * stride1 * kElemBytes));
      continue;
    }
    const char* start = reinterpret_cast<const char*>(row);
    const uintptr_t addr = ((uintptr_t)start & ~(uintptr_t)(kSectorBytes - 1)) + (uintptr_t)slot * kSectorBytes;
    if (addr < (uintptr_t)(start + span)) CHZ_PREFETCH_L2_EVICT_LAST(reinterpret_cast<const void*>(addr));
  }
}

// ------------------------------------------------------------------ launchers
static int chz_check(const chz_bag_args* a) {
  if (!a || a->num_bags < 0 || a->num_indices < 0 || a->dim <= 0 || a->num_rows <= 0) return CHZ_ERR_BAD_ARGUMENT;
  if (a->num_bags > 0 && (!a->weight || !a->offsets || !a->output || !a->bag_size)) return CHZ_ERR_BAD_ARGUMENT;
  if (a->num_indices > 0 && (!a->indices || !a->offset2bag)) return CHZ_ERR_BAD_ARGUMENT;
  if (a->mode != CHZ_MODE_SUM && a->mode != CHZ_MODE_MEAN) return CHZ_ERR_BAD_ARGUMENT;
  if (a->weight_stride0 < 0 || a->weight_stride1 < 0) return CHZ_ERR_BAD_ARGUMENT;
  if (a->dtype != kDtype) return CHZ_ERR_DTYPE;
  if constexpr (kQparamBytes > 0) {  // int8: contiguous values, then the aligned scale and bias inside the row
    constexpr int64_t align = kQparamBytes > 0 ? kQparamBytes / 2 : 1;  // scale + bias alignment
    if (a->weight_stride1 != 1 || a->weight_stride0 < a->dim + kQparamBytes || a->dim % align ||
        a->weight_stride0 % align || (uintptr_t)a->weight % align)
      return CHZ_ERR_UNSUPPORTED;
  }
  return CHZ_OK;
}

static dim3 chz_block(const chz_launch* l) { return dim3(l->block_x, l->block_y); }
static int chz_grid(const chz_launch* l, int fallback) { return l->grid > 0 ? l->grid : fallback; }

template <bool kOffByOne>
static int chz_launch_base(const chz_bag_args* a, const chz_launch* l, void* stream) {
  if (int e = chz_check(a)) return e;
  if (a->num_bags == 0) return CHZ_OK;
  auto kernel = chz_base_kernel<kOffByOne>;
  CHZ_LAUNCH(kernel, chz_grid(l, 1024), chz_block(l), 0, (cudaStream_t)stream, *a);
  return (int)cudaGetLastError();
}

template <int P>
static int chz_launch_rpf(const chz_bag_args* a, const chz_launch* l, void* stream) {
  auto kernel = chz_rpf_kernel<P>;
  CHZ_LAUNCH(kernel, chz_grid(l, 1024), chz_block(l), 0, (cudaStream_t)stream, *a);
  return (int)cudaGetLastError();
}

template <int V, int U>
static int chz_launch_warp(const chz_bag_args* a, const chz_launch* l, void* stream, int group) {
  const int64_t bags_per_block = (int64_t)(l->block_x / 32) * (32 / group);
  const int64_t needed = (a->num_bags + bags_per_block - 1) / bags_per_block;
  const int grid = l->grid > 0 ? l->grid : (int)(needed < (1 << 30) ? needed : (1 << 30));
  auto kernel = chz_warp_kernel<V, U>;
  CHZ_LAUNCH_COOPERATIVE(kernel, grid, dim3(l->block_x), 0, (cudaStream_t)stream, *a, group);
  return (int)cudaGetLastError();
}

// --------------------------------------------------------------- entry points
CHZ_EXPORT int chz_forward_base(const chz_bag_args* a, const chz_launch* l, void* stream) {
  return chz_launch_base<false>(a, l, stream);
}

CHZ_EXPORT int chz_forward_wrong(const chz_bag_args* a, const chz_launch* l, void* stream) {
  return chz_launch_base<true>(a, l, stream);
}

CHZ_EXPORT int chz_forward_rpf(const chz_bag_args* a, const chz_launch* l, void* stream) {
  if (int e = chz_check(a)) return e;
  if (a->per_sample_weights) return CHZ_ERR_UNSUPPORTED;
  if (a->num_bags == 0) return CHZ_OK;
  switch (l->prefetch_distance) {
    case 1: return chz_launch_rpf<1>(a, l, stream);
    case 2: return chz_launch_rpf<2>(a, l, stream);
    case 3: return chz_launch_rpf<3>(a, l, stream);
    case 4: return chz_launch_rpf<4>(a, l, stream);
    case 5: return chz_launch_rpf<5>(a, l, stream);
    case 6: return chz_launch_rpf<6>(a, l, stream);
    case 7: return chz_launch_rpf<7>(a, l, stream);
    case 8: return chz_launch_rpf<8>(a, l, stream);
  }
  return CHZ_ERR_BAD_ARGUMENT;
}

// Lanes per bag for the warp kernel: the next power of two covering the row's 16-byte vectors.
CHZ_EXPORT int chz_warp_group(int64_t dim) {
  const int64_t nvec = dim / kVecElems;
  int group = 1;
  while (group < 32 && group < nvec) group *= 2;
  return group;
}

CHZ_EXPORT int chz_forward_warp(const chz_bag_args* a, const chz_launch* l, void* stream) {
  if (int e = chz_check(a)) return e;
  const bool rows_ok = kQparamBytes > 0 ? a->weight_stride0 % 16 == 0 : a->weight_stride0 == a->dim;
  if (a->dim % kVecElems != 0 || ((uintptr_t)a->weight % 16) != 0 || ((uintptr_t)a->output % 16) != 0 ||
      a->weight_stride1 != 1 || !rows_ok || a->per_sample_weights)
    return CHZ_ERR_UNSUPPORTED;
  if (l->block_x % 32 != 0 || l->block_y != 1) return CHZ_ERR_BAD_ARGUMENT;
  if (a->num_bags == 0) return CHZ_OK;
  const int group = chz_warp_group(a->dim);
  const int64_t per_lane = (a->dim / kVecElems + group - 1) / group;  // 16-byte columns per lane
  if (per_lane <= 1) return chz_launch_warp<1, 8>(a, l, stream, group);
  if (per_lane <= 2) return chz_launch_warp<2, 4>(a, l, stream, group);
  if constexpr (kMaxPerLane >= 4) {  // only the vectors per lane D <= 1024 can need are built
    if (per_lane <= 4) return chz_launch_warp<4, 2>(a, l, stream, group);
  }
  if constexpr (kMaxPerLane >= 8) {
    if (per_lane <= 8) return chz_launch_warp<8, 1>(a, l, stream, group);
  }
  return CHZ_ERR_UNSUPPORTED;  // D > 1024
}

// Pin the hot rows of a table whose rows are stride0 elements apart and whose elements
// are stride1 elements apart (torch's weight.stride(0), weight.stride(1); int8: bytes).
CHZ_EXPORT int chz_l2_pin(const void* weight, int64_t dim, int64_t stride0, int64_t stride1, const int64_t* hot_rows,
                          int64_t num_hot, void* stream) {
  if (num_hot < 0 || dim <= 0 || stride0 < 0 || stride1 < 0 || (num_hot > 0 && (!weight || !hot_rows)))
    return CHZ_ERR_BAD_ARGUMENT;
  if (num_hot == 0) return CHZ_OK;
  const int64_t total = num_hot * chz_pin_slots(dim, stride1);
  const int64_t blocks = (total + 255) / 256;
  const int grid = (int)(blocks < 4096 ? blocks : 4096);
  auto kernel = chz_l2_pin_kernel;
  CHZ_LAUNCH(kernel, grid, dim3(256), 0, (cudaStream_t)stream, weight, dim, stride0, stride1, hot_rows, num_hot);
  return (int)cudaGetLastError();
}

// ----------------------------------------------------- L2 access-policy window
// l2w keeps the hot rows (made contiguous by reordering the table by frequency) in
// the persisting part of L2 through an access-policy window. A caller that sets the
// window on a stream saves the device limit and the stream's window once, before the
// first change, and restores both afterwards (chz_l2_window_save/apply/restore), so
// other work is not measured with a carve-out; l2w's lookup carries its window as a
// launch attribute instead (chz_forward_base_window, below).
struct chz_l2_state {
  uint64_t persisting_limit;
  cudaAccessPolicyWindow window;
};

CHZ_EXPORT int chz_l2_state_size() { return (int)sizeof(chz_l2_state); }

CHZ_EXPORT int chz_l2_window_save(void* stream, chz_l2_state* state) {
  size_t limit = 0;
  cudaError_t e = cudaDeviceGetLimit(&limit, cudaLimitPersistingL2CacheSize);
  if (e != cudaSuccess) return (int)e;
  cudaStreamAttrValue value;
  memset(&value, 0, sizeof(value));
  e = cudaStreamGetAttribute((cudaStream_t)stream, cudaStreamAttributeAccessPolicyWindow, &value);
  if (e != cudaSuccess) return (int)e;
  state->persisting_limit = limit;
  state->window = value.accessPolicyWindow;
  return CHZ_OK;
}

// Persist [base, base+bytes): the carve-out is min(bytes, device max); the window is
// min(bytes, max window); hitRatio scales down when the window exceeds the carve-out
// so persisting lines do not thrash each other. Granted sizes are reported back.
CHZ_EXPORT int chz_l2_window_apply(void* stream, const void* base, uint64_t bytes, uint64_t* carveout,
                                   uint64_t* window_bytes, float* hit_ratio) {
  int device = 0, max_persist = 0, max_window = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&max_persist, cudaDevAttrMaxPersistingL2CacheSize, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&max_window, cudaDevAttrMaxAccessPolicyWindowSize, device);
  if (e != cudaSuccess) return (int)e;
  if (max_persist <= 0 || max_window <= 0) return CHZ_ERR_UNSUPPORTED;  // pre-Ampere: no persisting L2
  const uint64_t carve = bytes < (uint64_t)max_persist ? bytes : (uint64_t)max_persist;
  e = cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, carve);
  if (e != cudaSuccess) return (int)e;
  cudaStreamAttrValue value;
  memset(&value, 0, sizeof(value));
  value.accessPolicyWindow.base_ptr = const_cast<void*>(base);
  value.accessPolicyWindow.num_bytes = bytes < (uint64_t)max_window ? bytes : (uint64_t)max_window;
  const double ratio = value.accessPolicyWindow.num_bytes ? (double)carve / value.accessPolicyWindow.num_bytes : 0.0;
  value.accessPolicyWindow.hitRatio = (float)(ratio < 1.0 ? ratio : 1.0);
  value.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
  value.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
  e = cudaStreamSetAttribute((cudaStream_t)stream, cudaStreamAttributeAccessPolicyWindow, &value);
  if (e != cudaSuccess) return (int)e;
  if (carveout) *carveout = carve;
  if (window_bytes) *window_bytes = value.accessPolicyWindow.num_bytes;
  if (hit_ratio) *hit_ratio = value.accessPolicyWindow.hitRatio;
  return CHZ_OK;
}

CHZ_EXPORT int chz_l2_window_restore(void* stream, const chz_l2_state* state) {
  cudaStreamAttrValue value;
  memset(&value, 0, sizeof(value));
  value.accessPolicyWindow = state->window;
  cudaError_t e = cudaStreamSetAttribute((cudaStream_t)stream, cudaStreamAttributeAccessPolicyWindow, &value);
  if (e == cudaSuccess) e = cudaCtxResetPersistingL2Cache();  // demote lines marked persisting
  if (e == cudaSuccess) e = cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, state->persisting_limit);
  return (int)e;
}

// Demote every line marked persisting to normal (cold-L2 measurements start here).
CHZ_EXPORT int chz_l2_reset() { return (int)cudaCtxResetPersistingL2Cache(); }

// The window as a launch attribute (what l2w runs): the persisting-L2 set-aside is set
// once per point (chz_l2_set_aside), each table's window is planned once against it, and
// every lookup launch carries its table's window, so between tables and repetitions no
// stream attribute or device limit changes, and nothing is left to restore but the
// set-aside.
struct chz_window {
  const void* base;     // the hot rows: rows 0..K-1 of the frequency-sorted table
  uint64_t bytes;       // window size, at most cudaDevAttrMaxAccessPolicyWindowSize
  float hit_ratio;      // share of the window's accesses marked persisting
};

// The window for `bytes` of hot rows under the current set-aside: min(bytes, max window),
// hitRatio = set-aside / window (at most 1), so persisting lines do not thrash each other.
CHZ_EXPORT int chz_l2_window_plan(uint64_t bytes, uint64_t* window_bytes, float* hit_ratio) {
  int device = 0, max_window = 0;
  size_t limit = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&max_window, cudaDevAttrMaxAccessPolicyWindowSize, device);
  if (e == cudaSuccess) e = cudaDeviceGetLimit(&limit, cudaLimitPersistingL2CacheSize);
  if (e != cudaSuccess) return (int)e;
  if (max_window <= 0) return CHZ_ERR_UNSUPPORTED;  // pre-Ampere: no access-policy window
  const uint64_t w = bytes < (uint64_t)max_window ? bytes : (uint64_t)max_window;
  const double ratio = w ? (double)limit / (double)w : 0.0;
  if (window_bytes) *window_bytes = w;
  if (hit_ratio) *hit_ratio = (float)(ratio < 1.0 ? ratio : 1.0);
  return CHZ_OK;
}

CHZ_EXPORT int chz_forward_base_window(const chz_bag_args* a, const chz_launch* l, void* stream,
                                       const chz_window* w) {
  if (int e = chz_check(a)) return e;
  if (!w || w->hit_ratio < 0.f || w->hit_ratio > 1.f) return CHZ_ERR_BAD_ARGUMENT;
  if (a->num_bags == 0) return CHZ_OK;
  cudaAccessPolicyWindow window;
  memset(&window, 0, sizeof(window));
  window.base_ptr = const_cast<void*>(w->base);
  window.num_bytes = w->bytes;
  window.hitRatio = w->hit_ratio;
  window.hitProp = cudaAccessPropertyPersisting;
  window.missProp = cudaAccessPropertyStreaming;
  auto kernel = chz_base_kernel<false>;
  CHZ_LAUNCH_WINDOW(kernel, chz_grid(l, 1024), chz_block(l), (cudaStream_t)stream, window, *a);
  return (int)cudaGetLastError();
}

// ------------------------------------------------------- runtime occupancy
// What the driver says about a kernel of this build: registers per thread and
// resident blocks per SM (cudaOccupancyMaxActiveBlocksPerMultiprocessor), to set
// beside the static characterization. `which`: "base", "wrong", "rpf1".."rpf8",
// "warp1".."warp8" (float4 columns per lane), "l2_pin".
#if !defined(CHZ_EMULATE)
template <typename Kernel>
static int chz_info(Kernel kernel, int block, int* blocks_per_sm, int* registers) {
  cudaFuncAttributes attr;
  cudaError_t e = cudaFuncGetAttributes(&attr, kernel);
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, kernel, block, 0);
  *registers = attr.numRegs;
  return (int)e;
}
#endif

CHZ_EXPORT int chz_kernel_info(const char* which, int block, int* blocks_per_sm, int* registers) {
#if defined(CHZ_EMULATE)
  (void)which; (void)block; (void)blocks_per_sm; (void)registers;
  return CHZ_ERR_UNSUPPORTED;
#else
  const char* w = which;
  if (!strcmp(w, "base")) return chz_info(chz_base_kernel<false>, block, blocks_per_sm, registers);
  if (!strcmp(w, "wrong")) return chz_info(chz_base_kernel<true>, block, blocks_per_sm, registers);
  if (!strcmp(w, "l2_pin")) return chz_info(chz_l2_pin_kernel, block, blocks_per_sm, registers);
  if (!strcmp(w, "rpf1")) return chz_info(chz_rpf_kernel<1>, block, blocks_per_sm, registers);
  if (!strcmp(w, "rpf2")) return chz_info(chz_rpf_kernel<2>, block, blocks_per_sm, registers);
  if (!strcmp(w, "rpf3")) return chz_info(chz_rpf_kernel<3>, block, blocks_per_sm, registers);
  if (!strcmp(w, "rpf4")) return chz_info(chz_rpf_kernel<4>, block, blocks_per_sm, registers);
  if (!strcmp(w, "rpf5")) return chz_info(chz_rpf_kernel<5>, block, blocks_per_sm, registers);
  if (!strcmp(w, "rpf6")) return chz_info(chz_rpf_kernel<6>, block, blocks_per_sm, registers);
  if (!strcmp(w, "rpf7")) return chz_info(chz_rpf_kernel<7>, block, blocks_per_sm, registers);
  if (!strcmp(w, "rpf8")) return chz_info(chz_rpf_kernel<8>, block, blocks_per_sm, registers);
  if (!strcmp(w, "warp1")) return chz_info(chz_warp_kernel<1, 8>, block, blocks_per_sm, registers);
  if (!strcmp(w, "warp2")) return chz_info(chz_warp_kernel<2, 4>, block, blocks_per_sm, registers);
  if constexpr (kMaxPerLane >= 4)
    if (!strcmp(w, "warp4")) return chz_info(chz_warp_kernel<4, 2>, block, blocks_per_sm, registers);
  if constexpr (kMaxPerLane >= 8)
    if (!strcmp(w, "warp8")) return chz_info(chz_warp_kernel<8, 1>, block, blocks_per_sm, registers);
  return CHZ_ERR_BAD_ARGUMENT;
#endif
}

// ----------------------------------------------------------- managed memory (uvm)
// Where a managed table lives. mode 0, zero-copy (what FBGEMM's UVM tables use): the
// preferred location is the host and the GPU is set as accessing it, so the GPU reads
// the host pages over the bus and nothing migrates. mode 1, migrate: no advice, pages
// move to the GPU on first touch (a table that fits ends up read from device memory).
// The CPU emulator has no managed memory: the uvm variant reads the table itself.
CHZ_EXPORT int chz_managed_advise(const void* ptr, uint64_t bytes, int mode, int device) {
  if (mode != 0 && mode != 1) return CHZ_ERR_BAD_ARGUMENT;
#if defined(CHZ_EMULATE)
  (void)ptr; (void)bytes; (void)device;
  return CHZ_OK;
#else
  if (mode == 1 || bytes == 0) return CHZ_OK;
#if CUDART_VERSION >= 13000
  cudaMemLocation host, gpu;
  memset(&host, 0, sizeof(host));
  memset(&gpu, 0, sizeof(gpu));
  host.type = cudaMemLocationTypeHost;
  gpu.type = cudaMemLocationTypeDevice;
  gpu.id = device;
  cudaError_t e = cudaMemAdvise(ptr, bytes, cudaMemAdviseSetPreferredLocation, host);
  if (e == cudaSuccess) e = cudaMemAdvise(ptr, bytes, cudaMemAdviseSetAccessedBy, gpu);
#else
  cudaError_t e = cudaMemAdvise(ptr, bytes, cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId);
  if (e == cudaSuccess) e = cudaMemAdvise(ptr, bytes, cudaMemAdviseSetAccessedBy, device);
#endif
  return (int)e;
#endif
}

// ------------------------------------------------------------------- dtype
// The bytes of an int8 row's scale + bias (chz_error_string, chz_dtype and
// chz_is_emulated come from chz_compat.cuh).
CHZ_EXPORT int chz_qparam_bytes() { return kQparamBytes; }

// ------------------------------------------------- persisting-L2 set-aside (l2p)
// The l2p/combined pre-pass marks the hot rows evict_last; the CUDA programming guide
// gives persisting accesses priority only within the set-aside configured with
// cudaLimitPersistingL2CacheSize (0 by default). Set it for the hot set, capped at the
// device's cudaDevAttrMaxPersistingL2CacheSize; report what was granted and what was
// there before, so the caller can restore it.
CHZ_EXPORT int chz_l2_set_aside(uint64_t bytes, uint64_t* granted, uint64_t* previous) {
  int device = 0, max_persist = 0;
  size_t before = 0, now = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&max_persist, cudaDevAttrMaxPersistingL2CacheSize, device);
  if (e == cudaSuccess) e = cudaDeviceGetLimit(&before, cudaLimitPersistingL2CacheSize);
  if (e != cudaSuccess) return (int)e;
  if (max_persist <= 0) return CHZ_ERR_UNSUPPORTED;  // pre-Ampere: no persisting L2
  const uint64_t carve = bytes < (uint64_t)max_persist ? bytes : (uint64_t)max_persist;
  e = cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, carve);
  if (e == cudaSuccess) e = cudaDeviceGetLimit(&now, cudaLimitPersistingL2CacheSize);
  if (e != cudaSuccess) return (int)e;
  if (granted) *granted = now;
  if (previous) *previous = before;
  return CHZ_OK;
}

// Demote the persisting lines and put the set-aside back to `previous`.
CHZ_EXPORT int chz_l2_set_aside_restore(uint64_t previous) {
  cudaError_t e = cudaCtxResetPersistingL2Cache();
  if (e == cudaSuccess) e = cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, previous);
  return (int)e;
}
