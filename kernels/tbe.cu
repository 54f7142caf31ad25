// tbe.cu: every table of a batch in one launch (the `tbe` variant), as a table-batched
// embedding (TBE) kernel would: per-table rows E, dimension D and index counts may differ.
//
// Why its own library: the batch has its own interface (a table descriptor array passed by
// value, one launch for T tables) and its own launcher (grid from SM count x resident
// blocks, per-table lane groups and bags per run), and editing it rebuilds only this file's
// libraries, not the per-table family of embedding_bag.cu. One library per dtype, as the
// family's (CHZ_DTYPE): a batch of several dtypes is one launch per dtype group (see
// "Mixed dtypes" below).
//
// Work: table t's bags are cut into runs of K_t consecutive bags, and a group of G_t lanes
// (the power of two covering the row's vectors / V, at most 32, at least a step's 8 / V rows)
// gathers one run; a warp's 32/G_t groups take consecutive runs: one warp task. Warp tasks of
// all tables form one list; the grid is SMs x resident blocks
// (cudaOccupancyMaxActiveBlocksPerMultiprocessor), never sized by B, and warp w takes the w-th
// contiguous slice of the list, so every SM works until the batch is done. Two paths, chosen
// per launch from the bags' mean length N / B (what the offsets define): the long path
// (K = 1, a group per bag) and the short path (K ~ G / mean L <= G - 1 bags per run, when the
// mean bag is at most half a step), each its own kernel instance, so each hot loop is one
// loop in the SASS.
//
// A run's indices are walked in tiles of G_t (one index per lane, loaded coalesced), each
// tile in steps of U = 8/V rows: U row pointers broadcast by shuffles, U*V independent vector
// loads per lane issued back to back (8 per lane in flight), then the adds; at the last row of
// a bag the group writes the bag's output. Nothing the loops wait on is loaded when needed:
//   - the next tile's indices load when the current tile starts and are read when the next
//     tile starts, after the current tile's rows;
//   - the last tile of a bag (or run) loads the first tile of the group's next one;
//   - the offsets of the bag (or run) after next load when one starts, so the next one's are
//     there before any tile names its first tile.
// Loads use clamped addresses or the zero row, never a condition around the load: a guarded
// load compiles to a load plus a move that waits on it (see embedding_bag.cu).
// (kernels.static.loop_nest replays the whole nest from the SASS; tests hold it to >= 8 rows
// in flight over a bag of 150 at fp32 and >= 6 at int8.)
//
// Indices: int32 or int64 as stored (the launch's index_bits); rows are 32-bit (one
// shuffle, 32-bit address math) when every table has fewer than 2^31 rows, chosen at launch.
//
// Precision: loads keep the stored bits; decoding happens at the add, so no conversion waits
// on a load before the next load issues. Every dtype loads 4 elements per vector: fp32 16
// bytes, fp16/bf16 8, int8 4, so a lane keeps 4 fp32 accumulators per vector whatever the
// dtype and the narrow dtypes fit 64 registers (4 blocks per SM); an int8 row's scale and
// bias load once per tile, by the lane holding that row's index, and reach the group by
// shuffles at the add. int8 values are decoded two at a time: a byte permute makes two
// halves 1024 + q (exact), one packed half subtraction leaves q0, q1 (exact), then fp32
// q x scale + acc; fp16 pairs convert to fp32 and every sum is fp32, so every dtype keeps
// fp32 accumulation (on sm_100 the fp32 adds themselves are packed in pairs, FADD2/FFMA2).
// fp8 (e4m3) rows take int8's structure (4-byte vectors, a row-wise fp32 scale in the word
// after the values, no bias): a byte permute and two logic ops move two e4m3 bytes into two
// fp16 halves exactly (the value x 2^-8, folded into the row's scale), on every arch alike.
// Pooling and the output are fp32.
//
// Mixed dtypes: one kernel instance per dtype, a batch of several dtypes launched as one
// launch per dtype group back to back. A warp-uniform switch over dtypes in one kernel
// would allocate every table the registers of the widest decode and make one kernel's hot
// loop several, which the SASS reading could no longer attribute; per dtype each instance
// keeps its own register count (`characterize build`: fp32 78-80, int8 61-64 at D <= 128).
//
// Napkin math (paper shape: T=12 tables, E=500K, D=128 fp32, B=2048, L=150): one launch
// gathers 12 x 2048 x 150 x 512 B = 1.89 GB of rows (plus 29 MB of indices, 12.6 MB of
// output): 0.56 ms at H100's 3.35 TB/s. L=1 shape (T=10 x 1.7M rows, B=104,857): 537 MB
// of rows + 537 MB of output writes + 16.8 MB of int64 indices and offsets: 0.32 ms at 3.35 TB/s.
#define CHZ_UNSUPPORTED_MESSAGE \
  "shape not supported by the tbe kernel (D must fill whole vectors, D <= 1024, rows aligned, < 2^31 lookups)"
#include "chz_compat.cuh"

#include <type_traits>

// --------------------------------------------------------------- element types
constexpr int kDtype = CHZ_DTYPE;
constexpr bool kInt8 = kDtype == CHZ_INT8 || kDtype == CHZ_INT8H;
constexpr bool kFp8 = kDtype == CHZ_FP8;
constexpr int kElemBytes = kDtype == CHZ_FP32 ? 4 : (kInt8 || kFp8) ? 1 : 2;
constexpr int kQparamBytes = kDtype == CHZ_INT8 ? 8 : (kDtype == CHZ_INT8H || kFp8) ? 4 : 0;
constexpr bool kHasBias = kInt8;                        // fp8 rows carry a scale only
constexpr int kVecElems = 4;                            // elements per vector load, every dtype
constexpr int kVecBytes = kVecElems * kElemBytes;       // 16 (fp32), 8 (fp16/bf16) or 4 bytes (int8)
typedef std::conditional<kVecBytes == 16, uint4, std::conditional<kVecBytes == 8, uint2, unsigned>::type>::type chz_vec;
// a row's scale and bias as stored: fp32 pair (int8), fp16 pair in one word (int8h), or the
// fp32 scale's bits (fp8)
typedef std::conditional<kDtype == CHZ_INT8, float2, unsigned>::type chz_qword;

constexpr int kTbeMaxTables = 64;   // tables per launch (the descriptors travel as kernel parameters)
constexpr int kTbeBlock = 256;      // threads per block
// Resident 256-thread blocks per SM the registers must allow, per dtype, vectors per lane and
// path: a step keeps 8 vectors per lane in flight (32 registers of fp32 16-byte vectors, 16 of
// fp16/bf16 8-byte ones, 8 of int8 4-byte ones) beside the accumulators (4 per vector) and
// the bag's state, so fp32 fits 80 registers (3 blocks), the narrower dtypes 64 (4 blocks),
// except fp16/bf16 on the short path (a run's edges and bag state: 80); wide rows (V >= 4)
// need more accumulators and keep 2 blocks (<= 128) rather than spill.
constexpr int chz_tbe_min_blocks(int V, bool short_path) {
  return V >= 4 ? 2 : (kVecBytes == 16 || V == 2 || (short_path && kVecBytes == 8)) ? 3 : 4;
}
constexpr int kMaxDim = 1024;
constexpr int kZeroBytes = kMaxDim * 4 + 16;  // the zero row covers any row of D <= 1024 with its qparams

// Padding rows, positions past a run and rows of bags past B read this (no condition on a load).
__device__ const uint4 chz_tbe_zero[kZeroBytes / 16] = {};

// ---------------------------------------------------------------- descriptors
// One table of the batch. The caller fills the first block; the launcher fills the second
// (and the Python side reads it back to know what ran).
struct chz_tbe_table {
  const void* weight;       // E rows, row_bytes apart, kVecBytes-aligned (int8: values, then scale and bias)
  const void* indices;      // [num_indices] of the launch's index type
  const void* offsets;      // [num_bags] of the index type: bag b is [offsets[b], offsets[b+1]), offsets[0]
                            // read as 0, the last bag ends at num_indices (torch's 1-D convention)
  float* output;            // bag b's D floats at output + b * output_stride
  int64_t* offset2bag;      // [num_indices]: bag of each index, or null
  int64_t* bag_size;        // [num_bags]: non-padding indices per bag, or null
  int64_t num_rows;         // E
  int64_t padding_idx;      // row excluded from sums and counts; -1 for none
  int64_t num_indices;      // N (< 2^31)
  int64_t num_bags;         // B (< 2^31)
  int64_t row_bytes;        // bytes between rows
  int64_t output_stride;    // floats between output rows (>= D, a multiple of 4)
  int32_t dim;              // D
  int32_t dtype;            // chz_dtype: must be this library's
  // filled by the launcher
  int32_t group;            // G: lanes per run
  int32_t bags_per_run;     // K: consecutive bags one group gathers as one stream (short path: <= G - 1)
  int32_t first_task;       // index of the table's first warp task in the launch
  int32_t tasks;            // warp tasks: ceil(ceil(B / K) / (32 / G))
};

enum chz_tbe_path : int32_t { CHZ_TBE_AUTO = 0, CHZ_TBE_LONG = 1, CHZ_TBE_SHORT = 2 };

struct chz_tbe_args {
  int32_t num_tables;       // T (<= kTbeMaxTables)
  int32_t mode;             // chz_mode, for every table
  int32_t index_bits;       // 32 | 64: how indices and offsets are stored (every table alike)
  int32_t path;             // in: chz_tbe_path (AUTO: short when the batch's mean bag is short);
                            // out: the path launched (LONG or SHORT)
  int32_t bags_per_run;     // short path: 0 chooses K per table from its mean bag length; > 0: that K
  // filled by the launcher
  int32_t vectors_per_lane; // V of the instance launched (vector loads per lane per row)
  int32_t row_bits;         // in: 64 forces 64-bit row numbers (0: 32-bit when every table has < 2^31 rows);
                            // out: the width of row numbers in the instance launched
  int32_t grid;             // blocks launched
  int32_t total_tasks;      // warp tasks of all tables
  int32_t tasks_per_warp;   // each warp's slice of the first phase's tasks: this many,
  int32_t extra_tasks;      // and one more for extra_tasks warps
  // Work order: the tables are walked in phases of consecutive tables, every warp taking a slice
  // of each phase's tasks in turn, so that the tables in flight at any moment are about one
  // phase's (their hot rows then share the L2 with few others). One phase of every table is the
  // plain order: warp w's contiguous slice of all tasks.
  int32_t num_phases;       // in: phases (0: one phase of every table); out: phases launched
  int32_t phase_tables[kTbeMaxTables];  // in: tables per phase, in order (summing to num_tables)
  // filled by the launcher, per phase p
  int32_t phase_first_table[kTbeMaxTables];
  int32_t phase_first_task[kTbeMaxTables + 1];  // [p + 1] ends phase p
  int32_t phase_rotation[kTbeMaxTables];  // warp w takes slice (w + rotation) % warps: the warps left
                                          // short in one phase are first served in the next
  chz_tbe_table tables[kTbeMaxTables];
};

// ------------------------------------------------------------------- helpers
template <typename T>
__device__ __forceinline__ T chz_min(T a, T b) { return a < b ? a : b; }

__device__ __forceinline__ float chz_half_to_float(unsigned bits) {
#if defined(CHZ_EMULATE)
  return chz_emu::half_to_float((uint16_t)bits);
#else
  return __half2float(__ushort_as_half((unsigned short)bits));
#endif
}

// Two halves packed in a word, widened to fp32 (low half first).
__device__ __forceinline__ float2 chz_half2_to_float2(unsigned w) {
#if defined(CHZ_EMULATE)
  return make_float2(chz_emu::half_to_float((uint16_t)(w & 0xffffu)), chz_emu::half_to_float((uint16_t)(w >> 16)));
#else
  __half2 h;
  memcpy(&h, &w, sizeof h);
  return __half22float2(h);
#endif
}

// Two bytes of `w` (selected by `sel`, a __byte_perm selector placing them in bytes 0 and 2)
// as exact fp32 values, packed: 0x64 in bytes 1 and 3 makes the halves 1024 + q, and one
// packed half subtraction of 1024 leaves q exactly (integers below 2048 are exact halves).
template <unsigned kSel>
__device__ __forceinline__ float2 chz_u8x2_to_float2(unsigned w) {
  const unsigned h = __byte_perm(w, 0x64646464u, kSel);
#if defined(CHZ_EMULATE)
  return make_float2(chz_emu::half_to_float((uint16_t)(h & 0xffffu)) - 1024.f,
                     chz_emu::half_to_float((uint16_t)(h >> 16)) - 1024.f);
#else
  __half2 x;
  memcpy(&x, &h, sizeof x);
  return __half22float2(__hsub2(x, __half2half2(__ushort_as_half((unsigned short)0x6400u))));
#endif
}

// Two e4m3 bytes of `w` as exact fp32 values x 2^-8. `kSel` (a __byte_perm selector) puts them
// in bytes 1 and 3 over zero bytes 0 and 2; shifted right by one, a byte's exponent and
// mantissa bits sit where a half's are (bias 15 against e4m3's 7: the 2^-8), its sign stays
// at the top, and subnormals stay subnormal. (e4m3fn's NaN code would read as 480: a
// quantizer never writes it.)
template <unsigned kSel>
__device__ __forceinline__ float2 chz_e4m3x2_to_float2(unsigned w) {
  const unsigned p = __byte_perm(w, 0u, kSel);
  return chz_half2_to_float2((p & 0x80008000u) | ((p >> 1) & 0x3f803f80u));
}

// acc[i] += x (and acc[i+1] += y): on sm_100 one packed fp32 add of the pair.
__device__ __forceinline__ void chz_add2(float* acc, float x, float y) {
#if !defined(CHZ_EMULATE) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
  unsigned long long a, v;
  const float2 in = make_float2(x, y);
  memcpy(&a, acc, 8);
  memcpy(&v, &in, 8);
  asm("add.rn.f32x2 %0, %0, %1;" : "+l"(a) : "l"(v));
  memcpy(acc, &a, 8);
#else
  acc[0] += x;
  acc[1] += y;
#endif
}

// acc[i] += x * s (and acc[i+1] += y * s): on sm_100 one packed fp32 fma of the pair.
__device__ __forceinline__ void chz_fma2(float* acc, float x, float y, float s) {
#if !defined(CHZ_EMULATE) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
  unsigned long long a, v, w;
  const float2 in = make_float2(x, y), sc = make_float2(s, s);
  memcpy(&a, acc, 8);
  memcpy(&v, &in, 8);
  memcpy(&w, &sc, 8);
  asm("fma.rn.f32x2 %0, %1, %2, %0;" : "+l"(a) : "l"(v), "l"(w));
  memcpy(acc, &a, 8);
#else
  acc[0] += x * s;
  acc[1] += y * s;
#endif
}

// The words of one vector.
__device__ __forceinline__ void chz_words(const uint4& v, unsigned (&w)[4]) { w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w; }
__device__ __forceinline__ void chz_words(const uint2& v, unsigned (&w)[2]) { w[0] = v.x; w[1] = v.y; }
__device__ __forceinline__ void chz_words(const unsigned& v, unsigned (&w)[1]) { w[0] = v; }

// acc[0..4) += the vector's four elements, decoded (int8: x the row's scale; its bias is
// summed once per row into the bag's bias, not once per element).
__device__ __forceinline__ void chz_accumulate(float (&acc)[kVecElems], const chz_vec& v, float scale) {
  unsigned w[kVecBytes / 4];
  chz_words(v, w);
  if constexpr (kDtype == CHZ_FP32) {
    chz_add2(acc, __uint_as_float(w[0]), __uint_as_float(w[1]));
    chz_add2(acc + 2, __uint_as_float(w[2]), __uint_as_float(w[3]));
  } else if constexpr (kDtype == CHZ_FP16) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float2 f = chz_half2_to_float2(w[i]);
      chz_add2(acc + 2 * i, f.x, f.y);
    }
  } else if constexpr (kDtype == CHZ_BF16) {
#pragma unroll
    for (int i = 0; i < 2; ++i) chz_add2(acc + 2 * i, __uint_as_float(w[i] << 16), __uint_as_float(w[i] & 0xffff0000u));
  } else if constexpr (kFp8) {
    const float2 lo = chz_e4m3x2_to_float2<0x1404u>(w[0]);  // bytes 0, 1
    const float2 hi = chz_e4m3x2_to_float2<0x3424u>(w[0]);  // bytes 2, 3
    chz_fma2(acc, lo.x, lo.y, scale);
    chz_fma2(acc + 2, hi.x, hi.y, scale);
  } else {
    const float2 lo = chz_u8x2_to_float2<0x5140u>(w[0]);  // bytes 0, 1
    const float2 hi = chz_u8x2_to_float2<0x5342u>(w[0]);  // bytes 2, 3
    chz_fma2(acc, lo.x, lo.y, scale);
    chz_fma2(acc + 2, hi.x, hi.y, scale);
  }
}

// An int8 row's scale and bias as stored, read from just past its values (4-byte aligned:
// int8 takes them as two words, so D need only be a multiple of 4).
// (A template, so the other dtypes' branches are discarded, not compiled.)
template <typename Q = chz_qword>
__device__ __forceinline__ Q chz_load_qword(const unsigned char* at) {
  if constexpr (std::is_same<Q, float2>::value) {
    const float* q = reinterpret_cast<const float*>(at);
    return make_float2(__ldg(q), __ldg(q + 1));
  } else {
    return __ldg(reinterpret_cast<const unsigned*>(at));
  }
}

// The scale and bias of an int8 row, an fp8 row's scale x 2^8 (its decode gives the value
// x 2^-8) and bias 0, 1 and 0 for the other dtypes. (A template, so the other dtypes'
// branches are discarded, not compiled.)
template <typename Q>
__device__ __forceinline__ float2 chz_decode_qword(const Q& q) {
  if constexpr (std::is_same<Q, float2>::value) return q;
  else if constexpr (kDtype == CHZ_INT8H) return make_float2(chz_half_to_float(q & 0xffffu), chz_half_to_float(q >> 16));
  else if constexpr (kFp8) return make_float2(__uint_as_float(q) * 256.f, 0.f);
  else return make_float2(1.f, 0.f);
}

template <typename W>
__device__ __forceinline__ W chz_shfl_down_word(unsigned mask, const W& v, int delta, int width) {
  if constexpr (std::is_same<W, float2>::value)
    return make_float2(__shfl_down_sync(mask, v.x, delta, width), __shfl_down_sync(mask, v.y, delta, width));
  else return __shfl_down_sync(mask, v, delta, width);
}

template <typename W>
__device__ __forceinline__ W chz_shfl_word(unsigned mask, const W& v, int src, int width) {
  if constexpr (std::is_same<W, float2>::value)
    return make_float2(__shfl_sync(mask, v.x, src, width), __shfl_sync(mask, v.y, src, width));
  else return __shfl_sync(mask, v, src, width);
}

// -------------------------------------------------------------------- kernel
// A warp's current table. The descriptor sits in the warp's shared-memory slot and its fields
// are read where they are used (volatile: not held in registers through the loops, which
// keep their registers for the loads in flight); the lane grouping is kept in registers.
template <typename Idx, typename Row>
struct chz_tbe_ctx {
  static constexpr Row kNoRow = ~(Row)0;  // padding, past the run: read the zero row
  const volatile chz_tbe_table& d;
  int G, g_lane, g_base;
  unsigned gmask, gbits;

  __device__ __forceinline__ explicit chz_tbe_ctx(const volatile chz_tbe_table& t) : d(t) {
    const int lane = threadIdx.x & 31;
    G = t.group;
    g_lane = lane & (G - 1);
    g_base = lane - g_lane;
    gbits = G == 32 ? 0xffffffffu : (1u << G) - 1u;
    gmask = gbits << g_base;
  }
  __device__ __forceinline__ int32_t B() const { return (int32_t)d.num_bags; }
  __device__ __forceinline__ int32_t N() const { return (int32_t)d.num_indices; }
  __device__ __forceinline__ int dim() const { return d.dim; }
  __device__ __forceinline__ int32_t first_task() const { return d.first_task; }
  __device__ __forceinline__ const Idx* off() const { return reinterpret_cast<const Idx*>(d.offsets); }
  __device__ __forceinline__ const Idx* zero_idx() const { return reinterpret_cast<const Idx*>(chz_tbe_zero); }
  // This lane's index of the tile at `at`, clamped into the indices (the zero word when there is none).
  __device__ __forceinline__ Idx load_tile(bool any, int32_t at) const {
    const int32_t n = N();
    return __ldg(any && at < n ? reinterpret_cast<const Idx*>(d.indices) + at + chz_min(g_lane, n - 1 - at)
                               : zero_idx());
  }
  // The row this lane's index reads (the zero row for padding and positions past the tile).
  __device__ __forceinline__ const unsigned char* row_of(Idx mine, bool live, bool& real) const {
    CHZ_KERNEL_ASSERT(!live || (mine >= 0 && (uint64_t)mine < (uint64_t)d.num_rows));  // device-side bounds check
    const int64_t p = d.padding_idx;
    real = live && (int64_t)mine != p;
    return real ? reinterpret_cast<const unsigned char*>(d.weight) + (uint64_t)(Row)mine * (uint32_t)d.row_bytes
                : reinterpret_cast<const unsigned char*>(chz_tbe_zero);
  }
  // Write one bag's sums (x inv; int8: + the bag's bias first) and its size.
  template <int V>
  __device__ __forceinline__ void write_bag(int32_t bag, float (&acc)[V][kVecElems], float bias, int count,
                                            int mode) const {
    const float inv = mode == CHZ_MODE_MEAN && count > 0 ? __fdividef(1.f, (float)count) : 1.f;
    float* out = d.output + (int64_t)bag * d.output_stride;
    const int nvec = dim() / kVecElems;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int c = g_lane + k * G;
      if constexpr (kHasBias) {
#pragma unroll
        for (int q = 0; q < kVecElems; ++q) acc[k][q] += bias;
      }
      if (c < nvec)
        *reinterpret_cast<float4*>(out + c * kVecElems) =
            make_float4(acc[k][0] * inv, acc[k][1] * inv, acc[k][2] * inv, acc[k][3] * inv);
#pragma unroll
      for (int q = 0; q < kVecElems; ++q) acc[k][q] = 0.f;
    }
    int64_t* sizes = d.bag_size;
    if (g_lane == 0 && sizes) sizes[bag] = count;
  }
  // Zeros for an empty bag.
  template <int V>
  __device__ __forceinline__ void write_empty(int32_t bag) const {
    float* out = d.output + (int64_t)bag * d.output_stride;
    const int nvec = dim() / kVecElems;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int c = g_lane + k * G;
      if (c < nvec) *reinterpret_cast<float4*>(out + c * kVecElems) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    int64_t* sizes = d.bag_size;
    if (g_lane == 0 && sizes) sizes[bag] = 0;
  }
  // offset2bag[pos] = bag, when the caller asked for it.
  __device__ __forceinline__ void write_offset2bag(bool live, int32_t pos, int32_t bag) const {
    int64_t* o2b = d.offset2bag;
    if (live && o2b) o2b[pos] = bag;
  }
};

// One step: the U rows at the front of the tile's remaining positions, every load issued
// before any is used; then the remaining positions move U lanes down, so the shuffles read
// lanes 0..U-1 (immediate operands, no lane-number registers). G >= U (the launcher's
// choice), so a step never reaches past its tile.
template <int V, int U>
__device__ __forceinline__ void chz_tbe_step_loads(chz_vec (&v)[U][V], unsigned long long& ptrs, unsigned gmask,
                                                   int G, const uint32_t (&col)[V]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const unsigned char* row = reinterpret_cast<const unsigned char*>(__shfl_sync(gmask, ptrs, u, G));
#pragma unroll
    for (int k = 0; k < V; ++k) v[u][k] = __ldg(reinterpret_cast<const chz_vec*>(row + col[k]));
  }
  ptrs = __shfl_down_sync(gmask, ptrs, U, G);
}

// Long bags: each group gathers one bag (K = 1) per warp task, tile after tile, and writes
// it after its last tile. Every lane loads its bag's offsets itself (the group's lanes read
// the same two words). The offsets of the bag after next load when a bag starts (so the next
// bag's are there before its first tile is named), its first tile with the bag's last tile.
template <int V, typename Idx, typename Row>
__device__ __forceinline__ void chz_tbe_long(const volatile chz_tbe_table& d, int mode, int32_t task, int32_t last) {
  constexpr int U = 8 / V;  // rows per step per group: U*V vector loads per lane in flight
  const chz_tbe_ctx<Idx, Row> c(d);
  const int G = c.G, g_lane = c.g_lane;
  uint32_t col[V];  // this lane's vector columns of a row (bytes), clamped into the row (columns past D are never stored)
#pragma unroll
  for (int k = 0; k < V; ++k) col[k] = chz_min(g_lane + k * G, c.dim() / kVecElems - 1) * kVecBytes;
  const int32_t bags_per_task = 32 / G;
  auto bag_of = [&](int32_t tk) -> int32_t { return (tk - c.first_task()) * bags_per_task + c.g_base / G; };
  // the raw offsets of task tk's bag (the zero word past the tasks, past B, and for bag 0's start)
  auto load_bounds = [&](int32_t tk, Idx& s, Idx& e) {
    const int32_t b = bag_of(tk), B = c.B();
    const bool mine = tk < last && b < B;
    s = __ldg(mine && b > 0 ? c.off() + b : c.zero_idx());
    e = __ldg(mine && b + 1 < B ? c.off() + b + 1 : c.zero_idx());
  };
  auto finish_bounds = [&](int32_t tk, Idx s_raw, Idx e_raw, int32_t& s, int32_t& e) {
    const int32_t b = bag_of(tk), B = c.B(), N = c.N();
    const bool mine = tk < last && b < B;
    s = mine ? (int32_t)s_raw : 0;
    e = mine ? (b + 1 < B ? (int32_t)e_raw : N) : 0;
    CHZ_KERNEL_ASSERT(!mine || (s_raw >= 0 && s <= e && e <= N));  // offsets non-decreasing, within the indices
  };

  Idx far_s, far_e;  // offsets of the bag after next, as loaded
  int32_t s, e;      // this bag
  {
    Idx s0, e0;
    load_bounds(task, s0, e0);
    load_bounds(task + 1, far_s, far_e);
    finish_bounds(task, s0, e0, s, e);
  }
  Idx mine = c.load_tile(true, s);
  for (; task < last; ++task) {
    const int32_t bag = bag_of(task);
    // the next bag's offsets arrive now (loaded a bag ago), so every tile can name the next
    // bag's first without waiting; the one after next starts loading
    int32_t next_s, next_e;
    finish_bounds(task + 1, far_s, far_e, next_s, next_e);
    load_bounds(task + 2, far_s, far_e);
    const bool has_next = task + 1 < last && bag_of(task + 1) < c.B();
    float acc[V][kVecElems];
#pragma unroll
    for (int k = 0; k < V; ++k)
#pragma unroll
      for (int q = 0; q < kVecElems; ++q) acc[k][q] = 0.f;
    float bias = 0.f;  // int8: the biases of the bag's rows
    int count = 0;     // non-padding rows of the bag
    int32_t tile = s;
#pragma unroll 1
    do {  // once for an empty bag too: its one pass loads the next bag's first tile
      // this tile's indices are `mine` (loaded a tile ago); the next tile's, or the next
      // bag's first, start loading now and are waited on when that tile starts
      const bool more = tile + G < e;
      const Idx next = c.load_tile(more || has_next, more ? tile + G : next_s);
      const int n = chz_min(G, e - tile);
      bool real;
      const unsigned char* my_ptr = c.row_of(mine, g_lane < n, real);
      count += __popc(__ballot_sync(c.gmask, real));
      c.write_offset2bag(g_lane < n, tile + g_lane, bag);
      chz_qword my_q{};  // int8: scale and bias of this lane's row (scale shuffled to the group at the add)
      if constexpr (kQparamBytes > 0) my_q = chz_load_qword(my_ptr + c.dim());
      unsigned long long ptrs = reinterpret_cast<unsigned long long>(my_ptr);
      float scales = chz_decode_qword(my_q).x;  // int8: moves down with the pointers
#pragma unroll 1  // one step at a time: its 8 loads per lane are what the registers hold
      for (int j = 0; j < n; j += U) {
        chz_vec v[U][V];
        chz_tbe_step_loads<V, U>(v, ptrs, c.gmask, G, col);
#pragma unroll
        for (int u = 0; u < U; ++u) {
          float scale = 1.f;
          if constexpr (kQparamBytes > 0) scale = __shfl_sync(c.gmask, scales, u, G);
#pragma unroll
          for (int k = 0; k < V; ++k) chz_accumulate(acc[k], v[u][k], scale);
        }
        if constexpr (kQparamBytes > 0) scales = __shfl_down_sync(c.gmask, scales, U, G);
      }
      if constexpr (kHasBias) {  // the tile's biases: summed over the group once, not per row
        float b = chz_decode_qword(my_q).y;
        for (int w = G / 2; w > 0; w /= 2) b += __shfl_xor_sync(c.gmask, b, w, G);
        bias += b;
      }
      mine = next;
      tile += G;
    } while (tile < e);
    if (bag < c.B()) {
      if (s == e) c.template write_empty<V>(bag);
      else c.template write_bag<V>(bag, acc, bias, count, mode);
    }
    s = next_s;
    e = next_e;
  }
}

// Short bags: each group gathers a run of K consecutive bags as one stream of indices.
// Lane l <= K holds the run's l-th edge: where bag l starts and bag l-1 ends (K <= G - 1, so
// lane K holds the run's end; one offset per lane and run). Per tile each lane finds the bag
// of its own position (log2 K shuffle rounds over the edges) and whether it is that bag's last
// row, a ballot makes the tile's `ends` mask, and in the steps a row ending a bag writes it
// out. A run is often one tile, so the edges load two runs ahead: the next run's are there
// when this run's last (often first) tile loads the next run's first tile.
template <int V, typename Idx, typename Row>
__device__ __forceinline__ void chz_tbe_short(const volatile chz_tbe_table& d, int mode, int32_t task, int32_t last) {
  constexpr int U = 8 / V;
  const chz_tbe_ctx<Idx, Row> c(d);
  const int G = c.G, g_lane = c.g_lane, g_base = c.g_base;
  const unsigned gmask = c.gmask, gbits = c.gbits;
  const int K = d.bags_per_run;
  uint32_t col[V];
#pragma unroll
  for (int k = 0; k < V; ++k) col[k] = chz_min(g_lane + k * G, c.dim() / kVecElems - 1) * kVecBytes;
  int kbits = 0;  // shuffle rounds to find a position's bag among K
  while ((1 << kbits) < K) ++kbits;
  const int32_t runs_per_task = 32 / G;
  auto run_first = [&](int32_t tk) -> int32_t { return ((tk - c.first_task()) * runs_per_task + g_base / G) * K; };
  // this lane's edge of the run of task tk, as stored (the zero word for bag 0, past B, lanes > K)
  auto load_edge = [&](int32_t tk) -> Idx {
    const int32_t b = run_first(tk) + g_lane;
    return __ldg(tk < last && g_lane <= K && b > 0 && b < c.B() ? c.off() + b : c.zero_idx());
  };
  // the edge once loaded: N past the table's last bag
  auto finish_edge = [&](int32_t tk, Idx raw) -> int32_t {
    const int32_t b = run_first(tk) + g_lane, N = c.N();
    const bool mine = tk < last && g_lane <= K;
    CHZ_KERNEL_ASSERT(!mine || (raw >= 0 && raw <= N));  // offsets within the indices
    return !mine ? 0 : b < c.B() ? (int32_t)raw : N;
  };

  Idx far = load_edge(task + 1);  // the edge of the run after next, as loaded
  int32_t s = finish_edge(task, load_edge(task));  // this lane's edge of the current run
  int32_t run_s = __shfl_sync(gmask, s, 0, G);
  Idx mine = c.load_tile(true, run_s);

  for (; task < last; ++task) {
    const int32_t b0 = run_first(task);
    const int nb = chz_min(K, c.B() - b0);  // bags of this group's run (<= 0: none)
    const int32_t next_s = finish_edge(task + 1, far);  // the next run's edges arrive now (loaded a run ago)
    const bool has_next = task + 1 < last && run_first(task + 1) < c.B();
    far = load_edge(task + 2);  // the one after next starts loading
    const int32_t next_run_s = __shfl_sync(gmask, next_s, 0, G);
    const int32_t run_e = __shfl_sync(gmask, s, nb > 0 ? nb : 0, G);
    // bags of the run with rows, in order: `cur` is being summed (run-local index)
    unsigned open;
    {
      const int32_t e = __shfl_down_sync(gmask, s, 1, G);  // where this lane's bag ends
      CHZ_KERNEL_ASSERT(!(g_lane < nb) || s <= e);       // offsets non-decreasing
      unsigned empty = (__ballot_sync(gmask, g_lane < nb && s == e) >> g_base) & gbits;
      while (empty) {  // empty bags: zeros now; the others are written at their last row
        c.template write_empty<V>(b0 + __ffs(empty) - 1);
        empty &= empty - 1;
      }
      open = (__ballot_sync(gmask, g_lane < nb && e > s) >> g_base) & gbits;
    }
    int cur = __ffs(open) - 1;
    float acc[V][kVecElems];
#pragma unroll
    for (int k = 0; k < V; ++k)
#pragma unroll
      for (int q = 0; q < kVecElems; ++q) acc[k][q] = 0.f;
    float bias = 0.f;
    int count = 0;

    int32_t tile = run_s;
#pragma unroll 1
    do {  // once for a run without indices too: its one pass loads the next run's first tile
      const bool more = tile + G < run_e;
      const Idx next = c.load_tile(more || has_next, more ? tile + G : next_run_s);
      const int n = chz_min(G, run_e - tile);
      const int32_t pos = tile + g_lane;
      bool real;
      const unsigned char* my_ptr = c.row_of(mine, g_lane < n, real);
      const unsigned reals = (__ballot_sync(gmask, real) >> g_base) & gbits;
      int lo = 0;  // the bag of this lane's position: the last bag of the run starting at or before it
      for (int r = kbits - 1; r >= 0; --r) {
        const int probe = lo + (1 << r);
        const int32_t ps = __shfl_sync(gmask, s, chz_min(probe, G - 1), G);
        if (probe < nb && ps <= pos) lo = probe;
      }
      const int32_t my_end = __shfl_sync(gmask, s, lo + 1, G);
      const unsigned ends = (__ballot_sync(gmask, g_lane < n && pos + 1 == my_end) >> g_base) & gbits;
      c.write_offset2bag(g_lane < n, pos, b0 + lo);
      chz_qword my_q{};
      if constexpr (kQparamBytes > 0) my_q = chz_load_qword(my_ptr + c.dim());
      unsigned long long ptrs = reinterpret_cast<unsigned long long>(my_ptr);
      chz_qword qs = my_q;  // int8: moves down with the pointers

#pragma unroll 1  // one step at a time: its 8 loads per lane are what the registers hold
      for (int j = 0; j < n; j += U) {
        chz_vec v[U][V];
        chz_tbe_step_loads<V, U>(v, ptrs, gmask, G, col);
        const unsigned step_ends = ends >> j, step_reals = reals >> j;
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const bool counts = (step_reals >> u) & 1u;
          float scale = 1.f;
          if constexpr (kQparamBytes > 0) {
            const float2 q = chz_decode_qword(chz_shfl_word(gmask, qs, u, G));
            scale = q.x;
            if constexpr (kHasBias) bias += counts ? q.y : 0.f;
          }
#pragma unroll
          for (int k = 0; k < V; ++k) chz_accumulate(acc[k], v[u][k], scale);
          count += counts ? 1 : 0;
          if ((step_ends >> u) & 1u) {  // the bag's last row: write it, start the next bag
            c.template write_bag<V>(b0 + cur, acc, bias, count, mode);
            bias = 0.f;
            count = 0;
            open &= open - 1;  // cur was its lowest bit
            cur = __ffs(open) - 1;
          }
        }
        if constexpr (kQparamBytes > 0) qs = chz_shfl_down_word(gmask, qs, U, G);
      }
      mine = next;
      tile += G;
    } while (tile < run_e);
    s = next_s;
    run_s = next_run_s;
  }
}

// A warp's walk over the phases, kept in shared memory rather than in registers held through the
// gather's loops (each field is read once per phase or per table; in registers, ptxas spilled
// some of them on sm_100).
struct chz_tbe_walk {
  int32_t phase;  // the phase being walked
  int32_t end;    // the end of the warp's slice of its tasks
  int32_t table;  // the table being walked
  int32_t warp;   // the warp's index in the grid
};

// Per phase, warp w gathers a contiguous slice of the phase's warp tasks, table by table (the
// launcher gives each phase's first table, first task and rotation; a phase of n tasks over W
// warps gives n / W to each and one more to n % W of them). With one phase this is the plain
// order: the w-th contiguous slice of all tables' tasks.
// Each table's descriptor is copied into the warp's shared-memory slot when the warp starts it.
template <int V, typename Idx, typename Row, bool kShort>
__global__ void __launch_bounds__(kTbeBlock, chz_tbe_min_blocks(V, kShort)) chz_tbe_kernel(const chz_tbe_args a) {
  __shared__ chz_tbe_table slots[kTbeBlock / 32];
  // the warp's phase and the end of its slice live in shared memory, not in registers held
  // through the gather's loops (they are read once per table)
  __shared__ chz_tbe_walk walks[kTbeBlock / 32];
  const int lane = threadIdx.x & 31;
  volatile chz_tbe_table& slot = slots[threadIdx.x >> 5];
  volatile chz_tbe_walk& walk = walks[threadIdx.x >> 5];
  volatile int32_t& phase = walk.phase;
  volatile int32_t& task_end = walk.end;
  volatile int32_t& t = walk.table;
  if (lane == 0) {
    phase = 0;
    walk.warp = (int32_t)((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
  }
  __syncwarp();
  for (int p = phase; p < a.num_phases; p = phase) {
    const int32_t warps = (int32_t)(gridDim.x * (kTbeBlock / 32));
    const int32_t warp = walk.warp;
    const int32_t first = a.phase_first_task[p];
    const int32_t n = a.phase_first_task[p + 1] - first;
    const int32_t q = n / warps, r = n - q * warps;
    int32_t w = warp + a.phase_rotation[p];
    if (w >= warps) w -= warps;
    int32_t task = first + w * q + chz_min(w, r);
    __syncwarp();
    if (lane == 0) {
      task_end = task + q + (w < r ? 1 : 0);
      t = a.phase_first_table[p];
    }
    __syncwarp();
    while (task < task_end) {
      int tt = t;
      while (task >= a.tables[tt].first_task + a.tables[tt].tasks) ++tt;
      const int32_t last = chz_min((int32_t)task_end, a.tables[tt].first_task + a.tables[tt].tasks);
      constexpr int kWords = (int)(sizeof(chz_tbe_table) / 4);
      static_assert(kWords <= 32, "a descriptor is copied one word per lane");
      __syncwarp();  // every lane is done with the previous table's descriptor
      if (lane < kWords)
        reinterpret_cast<volatile uint32_t*>(&slot)[lane] = reinterpret_cast<const uint32_t*>(&a.tables[tt])[lane];
      if (lane == 0) t = tt;
      __syncwarp();
      if constexpr (kShort) chz_tbe_short<V, Idx, Row>(slot, a.mode, task, last);
      else chz_tbe_long<V, Idx, Row>(slot, a.mode, task, last);
      task = last;
    }
    __syncwarp();
    if (lane == 0) phase = phase + 1;
    __syncwarp();
  }
}

// ------------------------------------------------------------------ launcher
// Lanes per run for a table of `dim` with V vectors per lane: the power of two covering the
// row's vectors / V, at most 32, and at least a step's rows (8 / V), so that a step never
// reaches past its tile (mirrored by kernels.registry.tbe_group; a test keeps them in step).
CHZ_EXPORT int chz_tbe_group(int64_t dim, int vectors_per_lane) {
  const int64_t nvec = dim / kVecElems;
  const int64_t need = (nvec + vectors_per_lane - 1) / vectors_per_lane;
  int group = 8 / vectors_per_lane;
  while (group < 32 && group < need) group *= 2;
  return group;
}

// Vectors per lane for a table of `dim`: 1, 2, 4 or 8 (rows up to 32 x 8 vectors).
CHZ_EXPORT int chz_tbe_vectors_per_lane(int64_t dim) {
  const int64_t nvec = dim / kVecElems;
  int v = 1;
  while (v < 8 && 32 * v < nvec) v *= 2;
  return v;
}

// The short path when the batch's bags are shorter than half a step (mean L <= U / 2, U =
// 8 / V rows per step): a group per bag would then leave most of each step's loads to the
// zero row.
CHZ_EXPORT int chz_tbe_short_path(int64_t num_indices, int64_t num_bags, int vectors_per_lane) {
  return num_bags > 0 && 2 * num_indices <= num_bags * (int64_t)(8 / vectors_per_lane) ? 1 : 0;
}

// Bags per run on the short path: about G / mean L consecutive bags share one stream
// (a group's tile of G indices then spans several bags).
CHZ_EXPORT int chz_tbe_bags_per_run(int64_t num_indices, int64_t num_bags, int group) {
  if (num_bags <= 0) return 1;
  const int64_t mean_ceil = (num_indices + num_bags - 1) / num_bags;
  const int64_t k = mean_ceil <= 1 ? group : group / mean_ceil;
  return (int)(k < 1 ? 1 : k > group ? group : k);
}

static int chz_tbe_check(const chz_tbe_table& t, int index_bits) {
  if (!t.weight || t.num_rows <= 0 || t.dim <= 0 || t.num_bags < 0 || t.num_indices < 0) return CHZ_ERR_BAD_ARGUMENT;
  if (t.num_bags > 0 && (!t.offsets || !t.output)) return CHZ_ERR_BAD_ARGUMENT;
  if (t.num_indices > 0 && !t.indices) return CHZ_ERR_BAD_ARGUMENT;
  if (t.dtype != kDtype) return CHZ_ERR_DTYPE;
  constexpr int64_t kMaxCount = ((int64_t)1 << 31) - 64;  // positions + a tile stay in int32
  if (t.dim % kVecElems || t.dim > kMaxDim || t.num_indices >= kMaxCount || t.num_bags >= kMaxCount)
    return CHZ_ERR_UNSUPPORTED;
  const int64_t need = (int64_t)t.dim * kElemBytes + kQparamBytes;
  if (t.row_bytes < need || t.row_bytes % kVecBytes || t.row_bytes >= ((int64_t)1 << 32) ||
      (uintptr_t)t.weight % kVecBytes)
    return CHZ_ERR_UNSUPPORTED;
  if (t.output_stride < t.dim || t.output_stride % 4 || (uintptr_t)t.output % 16) return CHZ_ERR_UNSUPPORTED;
  if (index_bits == 32 && t.num_rows >= (int64_t)1 << 31) return CHZ_ERR_UNSUPPORTED;
  return CHZ_OK;
}

constexpr int kTbeInstances = 4 * 3 * 2;  // V x (index, row) types x path

#if !defined(CHZ_EMULATE)
// Resident blocks per SM of one instance times the device's SM count, asked once per device.
template <typename Kernel>
static int chz_tbe_full_grid(Kernel kernel, int slot) {
  static int cached[16][kTbeInstances] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 16) return 0;
  if (!cached[device][slot]) {
    int sms = 0, blocks = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kTbeBlock, 0) != cudaSuccess)
      return 0;
    cached[device][slot] = sms * (blocks > 0 ? blocks : 1);
  }
  return cached[device][slot];
}
#else
template <typename Kernel>
static int chz_tbe_full_grid(Kernel, int) {
  return chz_emu::device.sm_count * 4;
}
#endif

template <int V, typename Idx, typename Row, bool kShort>
static int chz_tbe_launch(chz_tbe_args* a, const chz_launch* l, void* stream, int slot) {
  auto kernel = chz_tbe_kernel<V, Idx, Row, kShort>;
  const int warps_per_block = kTbeBlock / 32;
  const int64_t needed = (a->total_tasks + warps_per_block - 1) / warps_per_block;
  int grid = l->grid > 0 ? l->grid : chz_tbe_full_grid(kernel, slot);
  if (grid <= 0) return (int)cudaGetLastError();
  if (grid > needed) grid = (int)needed;
  a->grid = grid;
  const int32_t warps = grid * warps_per_block;
  int32_t rotation = 0;
  for (int p = 0; p < a->num_phases; ++p) {
    a->phase_rotation[p] = rotation;
    rotation = (int32_t)((rotation + (a->phase_first_task[p + 1] - a->phase_first_task[p]) % warps) % warps);
  }
  const int32_t first_phase = a->phase_first_task[1] - a->phase_first_task[0];
  a->tasks_per_warp = first_phase / warps;
  a->extra_tasks = first_phase % warps;
  a->vectors_per_lane = V;
  a->row_bits = sizeof(Row) * 8;
  CHZ_LAUNCH_COOPERATIVE(kernel, grid, dim3(kTbeBlock), 0, (cudaStream_t)stream, *a);
  return (int)cudaGetLastError();
}

template <int V, bool kShort>
static int chz_tbe_dispatch(chz_tbe_args* a, const chz_launch* l, void* stream, bool rows32) {
  constexpr int base = ((V == 1 ? 0 : V == 2 ? 1 : V == 4 ? 2 : 3) * 2 + (kShort ? 1 : 0)) * 3;  // cache slot
  if (a->index_bits == 32) return chz_tbe_launch<V, int32_t, uint32_t, kShort>(a, l, stream, base);
  if (rows32) return chz_tbe_launch<V, int64_t, uint32_t, kShort>(a, l, stream, base + 1);
  return chz_tbe_launch<V, int64_t, uint64_t, kShort>(a, l, stream, base + 2);  // (rare: 2^31 rows or more)
}

template <int V>
static int chz_tbe_dispatch_path(chz_tbe_args* a, const chz_launch* l, void* stream, bool rows32) {
  return a->path == CHZ_TBE_SHORT ? chz_tbe_dispatch<V, true>(a, l, stream, rows32)
                                  : chz_tbe_dispatch<V, false>(a, l, stream, rows32);
}

// One launch for every table of `a` (the launcher fills group, bags_per_run, first_task,
// tasks, total_tasks, path, vectors_per_lane, row_bits and grid). l->grid > 0 sets the grid
// (tests: several tasks per warp); 0 sizes it to SMs x resident blocks (or fewer when the
// batch has fewer warp tasks than that).
CHZ_EXPORT int chz_tbe_forward(chz_tbe_args* a, const chz_launch* l, void* stream) {
  if (!a || !l || a->num_tables < 1 || a->num_tables > kTbeMaxTables) return CHZ_ERR_BAD_ARGUMENT;
  if (a->mode != CHZ_MODE_SUM && a->mode != CHZ_MODE_MEAN) return CHZ_ERR_BAD_ARGUMENT;
  if ((a->index_bits != 32 && a->index_bits != 64) || a->bags_per_run < 0 || a->bags_per_run > 32 ||
      a->path < CHZ_TBE_AUTO || a->path > CHZ_TBE_SHORT)
    return CHZ_ERR_BAD_ARGUMENT;
  if (l->block_x != kTbeBlock || l->block_y != 1) return CHZ_ERR_BAD_ARGUMENT;
  if (a->num_phases < 0 || a->num_phases > a->num_tables) return CHZ_ERR_BAD_ARGUMENT;
  if (a->num_phases == 0) {
    a->num_phases = 1;
    a->phase_tables[0] = a->num_tables;
  }
  for (int p = 0, first = 0; p < a->num_phases; ++p) {
    if (a->phase_tables[p] < 1 || first + a->phase_tables[p] > a->num_tables) return CHZ_ERR_BAD_ARGUMENT;
    a->phase_first_table[p] = first;
    first += a->phase_tables[p];
    if (p + 1 == a->num_phases && first != a->num_tables) return CHZ_ERR_BAD_ARGUMENT;
  }
  int V = 1;
  bool rows32 = a->row_bits != 64;
  int64_t lookups = 0, bags = 0;
  for (int i = 0; i < a->num_tables; ++i) {
    if (int e = chz_tbe_check(a->tables[i], a->index_bits)) return e;
    const int v = chz_tbe_vectors_per_lane(a->tables[i].dim);
    V = v > V ? v : V;
    rows32 = rows32 && a->tables[i].num_rows < ((int64_t)1 << 31);
    lookups += a->tables[i].num_indices;
    bags += a->tables[i].num_bags;
  }
  if (a->path == CHZ_TBE_AUTO) a->path = chz_tbe_short_path(lookups, bags, V) ? CHZ_TBE_SHORT : CHZ_TBE_LONG;
  const bool short_path = a->path == CHZ_TBE_SHORT;
  int64_t tasks = 0;
  for (int i = 0; i < a->num_tables; ++i) {
    chz_tbe_table& t = a->tables[i];
    t.group = chz_tbe_group(t.dim, V);
    int k = 1;  // the short path's lane K holds its run's end: K <= G - 1
    if (short_path) k = a->bags_per_run > 0 ? a->bags_per_run : chz_tbe_bags_per_run(t.num_indices, t.num_bags, t.group);
    const int kmax = short_path && t.group > 1 ? t.group - 1 : 1;
    t.bags_per_run = k < kmax ? k : kmax;
    const int64_t runs = (t.num_bags + t.bags_per_run - 1) / t.bags_per_run;
    const int64_t per_warp = 32 / t.group;
    t.first_task = (int32_t)tasks;
    t.tasks = (int32_t)((runs + per_warp - 1) / per_warp);
    tasks += t.tasks;
    if (tasks >= (int64_t)1 << 31) return CHZ_ERR_UNSUPPORTED;
  }
  a->total_tasks = (int32_t)tasks;
  for (int p = 0; p < a->num_phases; ++p) a->phase_first_task[p] = a->tables[a->phase_first_table[p]].first_task;
  a->phase_first_task[a->num_phases] = (int32_t)tasks;
  a->grid = 0;
  if (tasks == 0) return CHZ_OK;
  switch (V) {
    case 1: return chz_tbe_dispatch_path<1>(a, l, stream, rows32);
    case 2: return chz_tbe_dispatch_path<2>(a, l, stream, rows32);
    case 4: return chz_tbe_dispatch_path<4>(a, l, stream, rows32);
    case 8: return chz_tbe_dispatch_path<8>(a, l, stream, rows32);
  }
  return CHZ_ERR_UNSUPPORTED;
}

CHZ_EXPORT int chz_tbe_args_size() { return (int)sizeof(chz_tbe_args); }
CHZ_EXPORT int chz_tbe_max_tables() { return kTbeMaxTables; }
CHZ_EXPORT int chz_tbe_vector_elems() { return kVecElems; }
CHZ_EXPORT int chz_qparam_bytes() { return kQparamBytes; }

// What the driver says about one instance: registers per thread and resident blocks per SM.
// `which`: "tbe<V>_<index bits>_<row bits>_<long|short>", e.g. "tbe1_32_32_long".
CHZ_EXPORT int chz_tbe_kernel_info(const char* which, int* blocks_per_sm, int* registers) {
#if defined(CHZ_EMULATE)
  (void)which; (void)blocks_per_sm; (void)registers;
  return CHZ_ERR_UNSUPPORTED;
#else
  cudaFuncAttributes attr;
  auto info = [&](auto kernel) {
    cudaError_t e = cudaFuncGetAttributes(&attr, kernel);
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, kernel, kTbeBlock, 0);
    *registers = attr.numRegs;
    return (int)e;
  };
#define CHZ_TBE_INFO(V, P, S)                                                                          \
  if (!strcmp(which, "tbe" #V "_32_32_" #P)) return info(chz_tbe_kernel<V, int32_t, uint32_t, S>);     \
  if (!strcmp(which, "tbe" #V "_64_32_" #P)) return info(chz_tbe_kernel<V, int64_t, uint32_t, S>);     \
  if (!strcmp(which, "tbe" #V "_64_64_" #P)) return info(chz_tbe_kernel<V, int64_t, uint64_t, S>);
  CHZ_TBE_INFO(1, long, false)
  CHZ_TBE_INFO(2, long, false)
  CHZ_TBE_INFO(4, long, false)
  CHZ_TBE_INFO(8, long, false)
  CHZ_TBE_INFO(1, short, true)
  CHZ_TBE_INFO(2, short, true)
  CHZ_TBE_INFO(4, short, true)
  CHZ_TBE_INFO(8, short, true)
#undef CHZ_TBE_INFO
  return CHZ_ERR_BAD_ARGUMENT;
#endif
}

// Demote every line marked persisting to normal (cold-L2 measurements start here), as the
// family's library does.
CHZ_EXPORT int chz_l2_reset() { return (int)cudaCtxResetPersistingL2Cache(); }
