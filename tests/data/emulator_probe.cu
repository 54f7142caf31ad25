// Probes of the CPU emulator's thread model (kernels/chz_emulate.h), built as a host
// program by tests/kernels/test_emulator.py: each probe prints one line the test checks.
#include <stdio.h>

#include "chz_compat.cuh"

constexpr int kBlock = 96;  // three warps; odd on purpose: the last warp is full, blocks are not 32-aligned
constexpr int kGrid = 3;

// Every shuffle mode, a width below 32, a ballot and a block barrier, in one kernel; each
// thread writes a checksum of what it saw.
__global__ void exchange_kernel(long long* out) {
  const int lane = threadIdx.x & 31;
  const int v = 1000 * (int)blockIdx.x + (int)threadIdx.x;
  const int idx = __shfl_sync(0xffffffffu, v, 3);
  const int down = __shfl_down_sync(0xffffffffu, v, 5);
  const int xr = __shfl_xor_sync(0xffffffffu, v, 9);
  const float half = __shfl_xor_sync(0xffffffffu, 0.5f * (float)v, 3, 8);
  const unsigned odd = __ballot_sync(0xffffffffu, lane & 1);
  __shared__ int smem[kBlock];
  smem[threadIdx.x] = v;
  __syncthreads();
  const int across = smem[(threadIdx.x + 32) % kBlock];
  __syncthreads();
  double acc = 0.0;  // floating point on a fiber's stack, across switches
  for (int i = 0; i < 8; ++i) {
    acc += 0.25 * __shfl_sync(0xffffffffu, v, i);
    __syncwarp();
  }
  out[blockIdx.x * kBlock + threadIdx.x] =
      (long long)idx + 3LL * down + 7LL * xr + (long long)(4.0f * half) + (long long)odd + 11LL * across +
      (long long)(4.0 * acc);
}

__global__ void early_exit_kernel(int) {
  if (threadIdx.x == 5) return;  // lane 5 never reaches the warp barrier the others wait at
  __syncwarp();
}

__global__ void foreign_mask_kernel(int) { __shfl_sync(0x1u, 1, 0); }  // lanes 1..31 are not in the mask

__global__ void throwing_kernel(int) {
  if (threadIdx.x == 40) throw 7;  // not a std::exception
  __syncthreads();
}

static void report(const char* name, cudaError_t e) {
  printf("%s %d %s\n", name, (int)e, e == cudaSuccess ? "ok" : cudaGetErrorString(e));
}

int main() {
  static long long out[kGrid * kBlock];
  report("exchange", CHZ_LAUNCH_COOPERATIVE(exchange_kernel, kGrid, kBlock, 0, nullptr, out));
  printf("out");
  for (long long x : out) printf(" %lld", x);
  printf("\n");
  report("early_exit", CHZ_LAUNCH_COOPERATIVE(early_exit_kernel, 1, 64, 0, nullptr, 0));
  report("foreign_mask", CHZ_LAUNCH_COOPERATIVE(foreign_mask_kernel, 1, 32, 0, nullptr, 0));
  report("throwing", CHZ_LAUNCH_COOPERATIVE(throwing_kernel, 2, 64, 0, nullptr, 0));
  cudaGetLastError();  // clears the error the launches above left
  report("after_errors", CHZ_LAUNCH_COOPERATIVE(exchange_kernel, kGrid, kBlock, 0, nullptr, out));
  return 0;
}
