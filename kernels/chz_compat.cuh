// chz_compat.cuh: one source, two targets.
//
// Compiled by nvcc, the kernel family is real CUDA. Compiled by a host C++ compiler
// with -DCHZ_EMULATE, the same source runs on the CPU through chz_emulate.h (serial
// blocks, one fiber per thread, PTX prefetches recorded instead of issued), so every
// variant's logic is checked against torch on machines without a GPU.
#pragma once

#include <stdint.h>
#include <string.h>

#if defined(CHZ_EMULATE)
#include "chz_emulate.h"
#else
#include <cuda_runtime.h>
#include <cuda_fp16.h>

// Kernels that never synchronise threads launch with CHZ_LAUNCH; kernels using
// shuffles or barriers with CHZ_LAUNCH_COOPERATIVE (identical on the GPU; the
// emulator runs those with one fiber per thread).
#define CHZ_LAUNCH(kernel, grid, block, smem, stream, ...) \
  kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#define CHZ_LAUNCH_COOPERATIVE CHZ_LAUNCH

// A launch carrying an access-policy window as a launch attribute: the window applies
// to this launch only, so nothing on the stream or the device changes (cudaLaunchKernelEx,
// CUDA 11.8+; the emulator records the window and runs the kernel).
template <typename... Params, typename... Args>
static cudaError_t chz_launch_window(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream,
                                     const cudaAccessPolicyWindow& window, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeAccessPolicyWindow;
  attribute[0].val.accessPolicyWindow = window;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, args...);
}
#define CHZ_LAUNCH_WINDOW(kernel, grid, block, stream, window, ...) \
  chz_launch_window(kernel, dim3(grid), dim3(block), (stream), (window), __VA_ARGS__)

// Device-side assertion, as PyTorch's kernels have (a failed one aborts the launch).
#include <assert.h>
#define CHZ_KERNEL_ASSERT(cond) assert(cond)

// Bring the line holding `ptr` into L2 with evict-last priority (PTX ISA 7.4, sm_80+).
#define CHZ_PREFETCH_L2_EVICT_LAST(ptr) \
  asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(ptr))
#endif

#define CHZ_EXPORT extern "C" __attribute__((visibility("default")))

// Error codes returned by the exported entry points besides cudaError_t values.
enum chz_status : int {
  CHZ_OK = 0,
  CHZ_ERR_BAD_ARGUMENT = 10001,   // a null pointer or a negative size
  CHZ_ERR_UNSUPPORTED = 10002,    // the variant cannot compute this shape
  CHZ_ERR_EMULATION = 10003,      // the CPU emulator detected a kernel bug
  CHZ_ERR_DTYPE = 10004,          // the table's dtype is not the library's
};

enum chz_mode : int { CHZ_MODE_SUM = 0, CHZ_MODE_MEAN = 1 };

// Element type of the tables. One library holds one dtype's kernels (nvcc -DCHZ_DTYPE=n,
// see BuildSpec.dtype), so kernel names and the build's size stay those of fp32. The
// int8 types are row-wise quantized as FBGEMM stores them: D uint8 values followed in
// the same row by a scale and a bias (fp32: D + 8 bytes; fp16: D + 4), value = q x
// scale + bias. fp8 rows (tbe.cu only) hold D e4m3 values then an fp32 scale (D + 4
// bytes), value = e4m3 x scale. Pooling always accumulates in fp32 and writes fp32.
enum chz_dtype : int { CHZ_FP32 = 0, CHZ_FP16 = 1, CHZ_BF16 = 2, CHZ_INT8 = 3, CHZ_INT8H = 4, CHZ_FP8 = 5 };
#ifndef CHZ_DTYPE
#define CHZ_DTYPE 0
#endif

// Everything one embedding-bag forward needs. Bags follow torch's 1-D convention:
// bag b covers indices [offsets[b], offsets[b+1]) and the last bag ends at
// num_indices; offsets[0] is treated as 0.
struct chz_bag_args {
  const void* weight;       // [num_rows, weight_stride0] elements of the dtype (int8: bytes)
  int64_t num_rows;         // E
  int64_t dim;              // D
  const int64_t* indices;   // [num_indices]
  int64_t num_indices;
  const int64_t* offsets;   // [num_bags]
  int64_t num_bags;         // B
  float* output;            // [num_bags, dim]
  int64_t* offset2bag;      // [num_indices]: bag of each index (used by backward)
  int64_t* bag_size;        // [num_bags]: non-padding indices per bag
  int32_t mode;             // chz_mode
  int32_t dtype;            // chz_dtype of the table: must be the library's CHZ_DTYPE
  int64_t padding_idx;      // row excluded from sums and counts; -1 for none
  int64_t weight_stride0;   // elements between rows (D for a contiguous table; int8: row bytes)
  int64_t weight_stride1;   // elements between features (1 for a contiguous table)
  const float* per_sample_weights;  // [num_indices] scale of each lookup (sum mode), or null
  int64_t per_sample_weights_stride;
};

// Launch geometry, chosen by the Python variant registry.
struct chz_launch {
  int32_t block_x;
  int32_t block_y;
  int32_t grid;               // blocks; 0 lets the launcher size the grid
  int32_t prefetch_distance;  // rpf: rows kept in flight per thread (1..8)
};

// ------------------------------------------------ what every library exports
// Each library is one .cu file that includes this header once; these entry points are
// the same in all of them. CHZ_UNSUPPORTED_MESSAGE says what CHZ_ERR_UNSUPPORTED means
// for that library's kernels (define it before including this header).
#ifndef CHZ_UNSUPPORTED_MESSAGE
#define CHZ_UNSUPPORTED_MESSAGE "shape not supported by this kernel"
#endif

CHZ_EXPORT const char* chz_error_string(int code) {
  switch (code) {
    case CHZ_OK: return "no error";
    case CHZ_ERR_BAD_ARGUMENT: return "bad argument (null pointer, negative size, or an unknown mode or option)";
    case CHZ_ERR_UNSUPPORTED: return CHZ_UNSUPPORTED_MESSAGE;
    case CHZ_ERR_EMULATION: return "the CPU emulator detected a kernel bug";
    case CHZ_ERR_DTYPE: return "the table's dtype is not the one this library was built for";
  }
  return cudaGetErrorString((cudaError_t)code);
}

// The dtype this library's kernels read (one library per dtype).
CHZ_EXPORT int chz_dtype() { return CHZ_DTYPE; }

CHZ_EXPORT int chz_is_emulated() {
#if defined(CHZ_EMULATE)
  return 1;
#else
  return 0;
#endif
}

