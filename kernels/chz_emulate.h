// chz_emulate.h: run the CUDA kernel family on the CPU to check its logic.
//
// Blocks run one after another. Within a block, kernels launched with CHZ_LAUNCH run
// thread by thread; kernels launched with CHZ_LAUNCH_COOPERATIVE get one fiber per
// thread, and __syncthreads / __syncwarp / shuffles / ballots switch fibers until
// every participating thread has arrived, as on the GPU. A barrier that
// can never complete (threads exited, masks disagree) is reported as an error
// instead of hanging. The CUDA runtime calls the launchers make (L2 persistence
// limit, stream access-policy window) act on a small emulated device whose state
// tests can read back, and PTX L2 prefetches are logged instead of issued.
#pragma once

#include <stdint.h>
#include <string.h>
#include <ucontext.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// Blocks run one after another, so a block's shared memory can be one static array per kernel.
#define __shared__ static
#define __restrict__ __restrict

// ---------------------------------------------------------------- CUDA types
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
  unsigned x, y, z;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
struct alignas(8) float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) { return float2{x, y}; }
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned x, y;
};

// Reduced-precision element types without cuda_fp16.h: the kernels keep fp16/bf16
// values as their 16-bit patterns and convert them with these (IEEE binary16 with
// subnormals, infinities and NaN; bfloat16 is the top half of a float).
inline float __uint_as_float(unsigned u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  memcpy(&u, &f, sizeof u);
  return u;
}
namespace chz_emu {
inline float half_to_float(uint16_t h) {
  const unsigned sign = (unsigned)(h & 0x8000u) << 16;
  const unsigned exp = (h >> 10) & 0x1fu;
  const unsigned mant = h & 0x3ffu;
  if (exp == 0x1f) return __uint_as_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return __uint_as_float(sign | ((exp + 112u) << 23) | (mant << 13));
  const float sub = (float)mant * (1.0f / 16777216.0f);  // subnormal: mant x 2^-24
  return sign ? -sub : sub;
}
}  // namespace chz_emu

template <typename T>
inline T __ldg(const T* p) { return *p; }

typedef struct chz_emu_stream* cudaStream_t;

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorLaunchFailure = 719,
};

enum cudaLimit { cudaLimitPersistingL2CacheSize = 0x06 };
enum cudaDeviceAttr {
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrL2CacheSize = 89,
  cudaDevAttrMaxPersistingL2CacheSize = 108,
  cudaDevAttrMaxAccessPolicyWindowSize = 109,
};
enum cudaAccessProperty {
  cudaAccessPropertyNormal = 0,
  cudaAccessPropertyStreaming = 1,
  cudaAccessPropertyPersisting = 2,
};
struct cudaAccessPolicyWindow {
  void* base_ptr;
  size_t num_bytes;
  float hitRatio;
  cudaAccessProperty hitProp;
  cudaAccessProperty missProp;
};
union cudaStreamAttrValue {
  cudaAccessPolicyWindow accessPolicyWindow;
  char pad[64];
};
enum cudaStreamAttrID { cudaStreamAttributeAccessPolicyWindow = 1 };

namespace chz_emu {

// ------------------------------------------------------- emulated device state
struct DeviceState {
  size_t l2_bytes = 40u << 20;
  size_t max_persisting_bytes = 30u << 20;
  size_t max_window_bytes = 128u << 20;
  size_t persisting_limit = 0;
  int persisting_resets = 0;
  int sm_count = 108;               // cudaDevAttrMultiProcessorCount (sizes grids of SMs x resident blocks)
  cudaAccessPolicyWindow window{};  // of the (single) emulated stream
  std::vector<uint64_t> prefetches; // addresses given to prefetch.global.L2::evict_last
  cudaAccessPolicyWindow launch_window{};  // the window the last windowed launch carried
  int64_t windowed_launches = 0;           // launches that carried a window (launch attribute)
};
inline DeviceState device;
inline cudaError_t last_error = cudaSuccess;

// ---------------------------------------------------------------- thread model
inline uint3 thread_idx{0, 0, 0};
inline uint3 block_idx{0, 0, 0};
inline dim3 block_dim;
inline dim3 grid_dim;

struct EmulationError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
inline std::string error_text;

struct WarpSync {
  uint32_t arrived = 0;
  uint32_t released = 0;
  uint64_t slots[32] = {};
};

// ------------------------------------------------------------------ fibers
// A shuffle is two warp barriers, each a switch per lane, so switching dominates the
// emulated time of cooperative kernels. glibc's swapcontext saves and restores the
// signal mask, one system call per switch; on x86-64 a fiber switch here saves only
// the callee-saved registers and the FPU control words (the System V ABI's preserved
// state): warp's emulated bag runs about 8.5x faster. Elsewhere fibers are ucontexts.
#if defined(__x86_64__) && !defined(CHZ_EMU_UCONTEXT)
#define CHZ_EMU_FAST_FIBERS 1
extern "C" void chz_emu_switch(void** save_sp, void* load_sp);
// Pushes rbp rbx r12-r15 and mxcsr / x87 control word on the current stack, stores the
// stack pointer in *save_sp, then pops the same from load_sp and returns there.
asm(R"(
  .text
  .weak chz_emu_switch
  .hidden chz_emu_switch
  .type chz_emu_switch, @function
chz_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size chz_emu_switch, .-chz_emu_switch
)");
#endif

struct Scheduler {
  bool cooperative = false;
  int nthreads = 0;
  int current = 0;
  long stalled_yields = 0;
#ifdef CHZ_EMU_FAST_FIBERS
  void* main_sp = nullptr;
  std::vector<void*> sp;
#else
  ucontext_t main_ctx;
  std::vector<ucontext_t> ctx;
#endif
  std::vector<char> done;
  std::vector<char> stacks;
  std::vector<WarpSync> warps;
  int block_arrived = 0;
  long block_generation = 0;
  std::function<void()> body;
  static constexpr size_t kStack = 64 * 1024;
};
inline Scheduler sched;

inline int linear_tid() {
  return (int)(thread_idx.x + block_dim.x * (thread_idx.y + block_dim.y * thread_idx.z));
}

inline void set_thread(int t) {
  thread_idx.x = t % block_dim.x;
  thread_idx.y = (t / block_dim.x) % block_dim.y;
  thread_idx.z = t / (block_dim.x * block_dim.y);
}

inline void require_cooperative(const char* what) {
  if (!sched.cooperative)
    throw EmulationError(std::string(what) +
                         " used by a kernel launched with CHZ_LAUNCH; "
                         "launch it with CHZ_LAUNCH_COOPERATIVE");
}

// From the running fiber back to the block's scheduler (run_block).
inline void to_scheduler() {
#ifdef CHZ_EMU_FAST_FIBERS
  chz_emu_switch(&sched.sp[sched.current], sched.main_sp);
#else
  swapcontext(&sched.ctx[sched.current], &sched.main_ctx);
#endif
}

// Give the CPU to the next fiber; detect barriers that can never complete.
inline void yield_waiting() {
  if (++sched.stalled_yields > 4L * sched.nthreads + 64)
    throw EmulationError("deadlock: a barrier or shuffle waits for threads that never arrive");
  to_scheduler();
  set_thread(sched.current);
}

inline void progress() { sched.stalled_yields = 0; }

inline void warp_barrier(uint32_t mask) {
  require_cooperative("a warp-synchronous intrinsic");
  const int tid = linear_tid();
  const int lane = tid & 31;
  WarpSync& w = sched.warps[tid >> 5];
  if (!(mask & (1u << lane))) throw EmulationError("a lane called a warp intrinsic outside its own mask");
  w.arrived |= 1u << lane;
  if ((w.arrived & mask) == mask) {
    w.arrived &= ~mask;
    w.released |= mask & ~(1u << lane);
    progress();
    return;
  }
  while (!(w.released & (1u << lane))) yield_waiting();
  w.released &= ~(1u << lane);
  progress();
}

// Publish this lane's 8-byte value to the lanes in `mask`; returns the warp's slots,
// valid until the lane's next exchange.
inline const uint64_t* exchange(uint32_t mask, uint64_t raw) {
  const int tid = linear_tid();
  WarpSync& w = sched.warps[tid >> 5];
  warp_barrier(mask);  // every lane has finished reading the previous exchange
  w.slots[tid & 31] = raw;
  warp_barrier(mask);  // every lane has written
  return w.slots;
}

enum ShuffleMode { kIndex = 0, kDown = 1, kXor = 2 };

template <typename T>
inline T shfl(uint32_t mask, T value, int arg, int width, ShuffleMode mode) {
  static_assert(sizeof(T) <= 8, "emulated shuffles move at most 8 bytes");
  if (width <= 0 || width > 32 || (width & (width - 1))) throw EmulationError("shuffle width must be a power of two <= 32");
  uint64_t raw = 0;
  memcpy(&raw, &value, sizeof(T));
  const uint64_t* slots = exchange(mask, raw);
  const int lane = linear_tid() & 31;
  const int base = lane & ~(width - 1);
  const int pos = lane - base;
  int src = lane;
  if (mode == kIndex) src = base + (arg & (width - 1));
  else if (mode == kDown) src = pos + arg < width ? lane + arg : lane;
  else src = base + ((pos ^ arg) & (width - 1));
  if (!(mask & (1u << src))) src = lane;  // reading a lane outside the mask is undefined on the GPU
  T out;
  memcpy(&out, &slots[src], sizeof(T));
  return out;
}

inline void fiber_entry() {
  sched.body();
  sched.done[sched.current] = 1;
  progress();
  // ucontext: returning switches to uc_link (the scheduler)
}

#ifdef CHZ_EMU_FAST_FIBERS
// A fiber's first instruction: chz_emu_switch "returns" here on the fiber's fresh stack.
[[noreturn]] inline void fiber_boot() {
  fiber_entry();
  void* unused;
  chz_emu_switch(&unused, sched.main_sp);  // a finished fiber is never resumed
  __builtin_unreachable();
}

// A fresh stack that chz_emu_switch pops into fiber_boot with the ABI's call alignment
// (the stack pointer 8 past a multiple of 16 at the first instruction).
inline void* fiber_stack(char* base, size_t size) {
  uintptr_t top = ((uintptr_t)(base + size)) & ~(uintptr_t)15;
  void** frame = (void**)(top - 8);       // fiber_boot's (absent) return address
  frame[0] = nullptr;
  *--frame = (void*)&fiber_boot;          // popped by ret
  for (int i = 0; i < 6; ++i) *--frame = nullptr;  // rbp rbx r12-r15
  uint32_t words[2] = {0x1F80u, 0x037Fu}; // mxcsr and x87 control word: the ABI's defaults
  *--frame = nullptr;
  memcpy(frame, words, sizeof words);
  return frame;
}
#endif

// Run one block: directly, or as fibers when the kernel synchronises.
inline void run_block() {
  const int n = sched.nthreads;
  if (!sched.cooperative) {
    for (int t = 0; t < n && error_text.empty(); ++t) {
      set_thread(t);
      sched.body();
    }
    return;
  }
  sched.done.assign(n, 0);
  sched.warps.assign((n + 31) / 32, WarpSync{});
  sched.block_arrived = 0;
  if (sched.stacks.size() < (size_t)n * Scheduler::kStack) sched.stacks.resize((size_t)n * Scheduler::kStack);
#ifdef CHZ_EMU_FAST_FIBERS
  sched.sp.assign(n, nullptr);
  for (int t = 0; t < n; ++t) sched.sp[t] = fiber_stack(sched.stacks.data() + (size_t)t * Scheduler::kStack,
                                                        Scheduler::kStack);
#else
  sched.ctx.assign(n, ucontext_t{});
  for (int t = 0; t < n; ++t) {
    getcontext(&sched.ctx[t]);
    sched.ctx[t].uc_stack.ss_sp = sched.stacks.data() + (size_t)t * Scheduler::kStack;
    sched.ctx[t].uc_stack.ss_size = Scheduler::kStack;
    sched.ctx[t].uc_link = &sched.main_ctx;
    makecontext(&sched.ctx[t], fiber_entry, 0);
  }
#endif
  sched.stalled_yields = 0;
  int remaining = n;
  while (remaining > 0) {
    for (int t = 0; t < n; ++t) {
      if (sched.done[t]) continue;
      sched.current = t;
      set_thread(t);
#ifdef CHZ_EMU_FAST_FIBERS
      chz_emu_switch(&sched.main_sp, sched.sp[t]);
#else
      swapcontext(&sched.main_ctx, &sched.ctx[t]);
#endif
      if (!error_text.empty()) return;
      if (sched.done[t]) --remaining;
    }
  }
}

template <typename Kernel, typename... Args>
inline cudaError_t launch(bool cooperative, Kernel kernel, dim3 grid, dim3 block, Args... args) {
  if (grid.x == 0 || block.x * block.y * block.z == 0 || block.x * block.y * block.z > 1024) {
    last_error = cudaErrorInvalidValue;
    return last_error;
  }
  error_text.clear();
  grid_dim = grid;
  block_dim = block;
  sched.cooperative = cooperative;
  sched.nthreads = (int)(block.x * block.y * block.z);
  sched.body = [&]() {
    try {
      kernel(args...);
    } catch (const std::exception& e) {
      if (error_text.empty()) error_text = e.what();
      if (sched.cooperative) sched.done[sched.current] = 1;
    } catch (...) {  // nothing may unwind past a fiber's first frame
      if (error_text.empty()) error_text = "a kernel threw a non-standard exception";
      if (sched.cooperative) sched.done[sched.current] = 1;
    }
  };
  for (unsigned bz = 0; bz < grid.z && error_text.empty(); ++bz)
    for (unsigned by = 0; by < grid.y && error_text.empty(); ++by)
      for (unsigned bx = 0; bx < grid.x && error_text.empty(); ++bx) {
        block_idx = uint3{bx, by, bz};
        run_block();
      }
  sched.body = nullptr;
  if (!error_text.empty()) last_error = cudaErrorLaunchFailure;
  return last_error;
}

template <typename Kernel, typename... Args>
inline cudaError_t launch_window(Kernel kernel, dim3 grid, dim3 block, const cudaAccessPolicyWindow& w,
                                 Args... args) {
  if (w.num_bytes > device.max_window_bytes || w.hitRatio < 0.f || w.hitRatio > 1.f) {
    last_error = cudaErrorInvalidValue;
    return last_error;
  }
  device.launch_window = w;
  ++device.windowed_launches;
  return launch(false, kernel, grid, block, args...);
}

}  // namespace chz_emu

#define threadIdx chz_emu::thread_idx
#define blockIdx chz_emu::block_idx
#define blockDim chz_emu::block_dim
#define gridDim chz_emu::grid_dim

#define CHZ_LAUNCH(kernel, grid, block, smem, stream, ...) \
  chz_emu::launch(false, kernel, dim3(grid), dim3(block), __VA_ARGS__)
#define CHZ_LAUNCH_COOPERATIVE(kernel, grid, block, smem, stream, ...) \
  chz_emu::launch(true, kernel, dim3(grid), dim3(block), __VA_ARGS__)
// A launch carrying an access-policy window as a launch attribute (cudaLaunchKernelEx
// on the GPU): checked as the runtime checks a stream's window, recorded, then run.
#define CHZ_LAUNCH_WINDOW(kernel, grid, block, stream, window, ...) \
  chz_emu::launch_window(kernel, dim3(grid), dim3(block), window, __VA_ARGS__)
#define CHZ_KERNEL_ASSERT(cond) \
  ((cond) ? (void)0 : throw chz_emu::EmulationError("device assertion failed: " #cond))
#define CHZ_PREFETCH_L2_EVICT_LAST(ptr) chz_emu::device.prefetches.push_back((uint64_t)(uintptr_t)(ptr))

// ------------------------------------------------------- warp/block intrinsics
inline void __syncthreads() {
  chz_emu::require_cooperative("__syncthreads");
  auto& s = chz_emu::sched;
  const long generation = s.block_generation;
  if (++s.block_arrived == s.nthreads) {
    s.block_arrived = 0;
    ++s.block_generation;
    chz_emu::progress();
    return;
  }
  while (s.block_generation == generation) chz_emu::yield_waiting();
  chz_emu::progress();
}
inline void __syncwarp(unsigned mask = 0xffffffffu) { chz_emu::warp_barrier(mask); }
template <typename T>
inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) { return chz_emu::shfl(mask, v, src, width, chz_emu::kIndex); }
template <typename T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return chz_emu::shfl(mask, v, (int)delta, width, chz_emu::kDown);
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return chz_emu::shfl(mask, v, lane_mask, width, chz_emu::kXor);
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  const uint64_t* slots = chz_emu::exchange(mask, predicate ? 1u : 0u);
  unsigned bits = 0;
  for (int i = 0; i < 32; ++i)
    if ((mask & (1u << i)) && slots[i]) bits |= 1u << i;
  return bits;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
inline float __fdividef(float a, float b) { return a / b; }
// Byte i of the result is byte s_i (the i-th nibble of s, low three bits) of the 8 bytes y:x.
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const uint64_t bytes = ((uint64_t)y << 32) | x;
  unsigned out = 0;
  for (int i = 0; i < 4; ++i) out |= (unsigned)((bytes >> (8 * ((s >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
  return out;
}
// Blocks and threads run one at a time (fibers switch only at barriers and shuffles), so a
// plain read-modify-write is atomic; the backward's scatter-add uses it.
inline float atomicAdd(float* address, float value) {
  const float old = *address;
  *address = old + value;
  return old;
}

// ------------------------------------------------------------- CUDA runtime
inline cudaError_t cudaGetLastError() {
  cudaError_t e = chz_emu::last_error;
  chz_emu::last_error = cudaSuccess;
  return e;
}
inline const char* cudaGetErrorString(cudaError_t e) {
  if (e == cudaSuccess) return "no error";
  if (e == cudaErrorInvalidValue) return "invalid argument";
  return chz_emu::error_text.empty() ? "unspecified launch failure" : chz_emu::error_text.c_str();
}
inline cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = chz_emu::device.sm_count; return cudaSuccess;
    case cudaDevAttrL2CacheSize: *value = (int)chz_emu::device.l2_bytes; return cudaSuccess;
    case cudaDevAttrMaxPersistingL2CacheSize: *value = (int)chz_emu::device.max_persisting_bytes; return cudaSuccess;
    case cudaDevAttrMaxAccessPolicyWindowSize: *value = (int)chz_emu::device.max_window_bytes; return cudaSuccess;
  }
  return cudaErrorInvalidValue;
}
inline cudaError_t cudaDeviceGetLimit(size_t* value, cudaLimit limit) {
  if (limit != cudaLimitPersistingL2CacheSize) return cudaErrorInvalidValue;
  *value = chz_emu::device.persisting_limit;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceSetLimit(cudaLimit limit, size_t value) {
  if (limit != cudaLimitPersistingL2CacheSize) return cudaErrorInvalidValue;
  chz_emu::device.persisting_limit = std::min(value, chz_emu::device.max_persisting_bytes);
  return cudaSuccess;
}
inline cudaError_t cudaStreamGetAttribute(cudaStream_t, cudaStreamAttrID attr, cudaStreamAttrValue* out) {
  if (attr != cudaStreamAttributeAccessPolicyWindow) return cudaErrorInvalidValue;
  out->accessPolicyWindow = chz_emu::device.window;
  return cudaSuccess;
}
inline cudaError_t cudaStreamSetAttribute(cudaStream_t, cudaStreamAttrID attr, const cudaStreamAttrValue* in) {
  if (attr != cudaStreamAttributeAccessPolicyWindow) return cudaErrorInvalidValue;
  const cudaAccessPolicyWindow& w = in->accessPolicyWindow;
  if (w.num_bytes > chz_emu::device.max_window_bytes || w.hitRatio < 0.f || w.hitRatio > 1.f)
    return cudaErrorInvalidValue;
  chz_emu::device.window = w;
  return cudaSuccess;
}
inline cudaError_t cudaCtxResetPersistingL2Cache() {
  ++chz_emu::device.persisting_resets;
  return cudaSuccess;
}

// ------------------------------------------- introspection for the test suite
struct chz_emu_state {
  uint64_t l2_bytes;
  uint64_t max_persisting_bytes;
  uint64_t max_window_bytes;
  uint64_t persisting_limit;
  int64_t persisting_resets;
  uint64_t window_base;
  uint64_t window_bytes;
  float window_hit_ratio;
  int32_t window_hit_prop;
  int32_t window_miss_prop;
  int32_t _pad;
  int64_t prefetch_count;
  uint64_t launch_window_base;    // the window the last windowed launch carried
  uint64_t launch_window_bytes;
  float launch_window_hit_ratio;
  int32_t _pad2;
  int64_t windowed_launches;
};

extern "C" __attribute__((visibility("default"))) void chz_emu_get_state(chz_emu_state* s) {
  const auto& d = chz_emu::device;
  s->l2_bytes = d.l2_bytes;
  s->max_persisting_bytes = d.max_persisting_bytes;
  s->max_window_bytes = d.max_window_bytes;
  s->persisting_limit = d.persisting_limit;
  s->persisting_resets = d.persisting_resets;
  s->window_base = (uint64_t)(uintptr_t)d.window.base_ptr;
  s->window_bytes = d.window.num_bytes;
  s->window_hit_ratio = d.window.hitRatio;
  s->window_hit_prop = d.window.hitProp;
  s->window_miss_prop = d.window.missProp;
  s->prefetch_count = (int64_t)d.prefetches.size();
  s->launch_window_base = (uint64_t)(uintptr_t)d.launch_window.base_ptr;
  s->launch_window_bytes = d.launch_window.num_bytes;
  s->launch_window_hit_ratio = d.launch_window.hitRatio;
  s->_pad2 = 0;
  s->windowed_launches = d.windowed_launches;
}

// Configure the emulated device (sizes in bytes) and clear its state and logs.
extern "C" __attribute__((visibility("default"))) void chz_emu_configure(uint64_t l2_bytes, uint64_t max_persisting,
                                                                        uint64_t max_window) {
  chz_emu::device = chz_emu::DeviceState{};
  chz_emu::device.l2_bytes = l2_bytes;
  chz_emu::device.max_persisting_bytes = max_persisting;
  chz_emu::device.max_window_bytes = max_window;
}

// Set the emulated device's SM count (kernels that size their grid from it).
extern "C" __attribute__((visibility("default"))) void chz_emu_set_sm_count(int sms) {
  chz_emu::device.sm_count = sms > 0 ? sms : 1;
}

// Copy up to `capacity` logged prefetch addresses into `out`; returns how many exist.
extern "C" __attribute__((visibility("default"))) int64_t chz_emu_prefetch_log(uint64_t* out, int64_t capacity) {
  const auto& p = chz_emu::device.prefetches;
  const int64_t n = std::min<int64_t>(capacity, (int64_t)p.size());
  if (out && n > 0) memcpy(out, p.data(), (size_t)n * sizeof(uint64_t));
  return (int64_t)p.size();
}
