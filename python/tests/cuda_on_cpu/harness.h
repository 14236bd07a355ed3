// CUDA on the CPU, just enough to run kernelize's row kernels and the verifier's reference
// layers bit for bit (python/tests/test_mean_order_on_cpu.py), and the elementwise and gated
// kernels against a scalar loop (python/tests/test_elementwise_on_cpu.py). Force-included (g++ -include)
// before a .cu file; the include/ folder's cuda_bf16.h / cuda_fp16.h are empty.
//
// Execution: a launch runs its blocks one after another; a block's threads are fibers on one OS
// thread (x86-64 only), switched only at barriers (__syncthreads, and the warp barriers of the
// shuffles), so threadIdx is a plain global set by the scheduler. __shared__ variables are
// statics: one copy, shared by the block's fibers (blocks never overlap).
//
// Arithmetic: IEEE float on SSE (compile with -ffp-contract=off), correctly rounded
// __fadd_rn/__fsub_rn/__fmul_rn/__fdiv_rn and fmaf (glibc). rsqrtf, expf, erff, tanhf are NOT
// CUDA's: rsqrtf(v) is 1/sqrtf(v) here, expf & co. glibc's, __expf and __fdividef expf and a
// division; the same functions in every code under test, so a kernel and the reference still
// agree exactly when their statistics (or, elementwise, which element goes where) do.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct uint3 { unsigned x, y, z; };
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
inline uint2 make_uint2(unsigned a, unsigned b) { return uint2{a, b}; }
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }
// __ldg: a read-only load (the staged engine's weight loads)
template <typename V> inline V __ldg(const V* p) { return *p; }
// __ffs: the position of the lowest set bit, 1-based, 0 for 0 (the staged engine's lanes shift)
inline int __ffs(int x) { return __builtin_ffs(x); }
// __ldcs / __stcs: streaming loads and stores (the elementwise kernels)
template <typename V> inline V __ldcs(const V* p) { return *p; }
template <typename V> inline void __stcs(V* p, V v) { *p = v; }

inline uint3 threadIdx, blockIdx, blockDim, gridDim;

// ---- fibers ------------------------------------------------------------------------------------
// kz_switch (main.cpp: x86-64 assembly, callee-saved registers, MXCSR and the x87 control word)
// saves the running fiber's stack pointer in *from and continues the one saved in `to`; no
// system call, unlike swapcontext.
extern "C" void kz_switch(void** from, void* to);

namespace kzcpu {
struct Fiber {
  void* sp;
  uint3 idx;
  bool done;
  const unsigned* wait;  // the generation counter it waits on (nullptr: runnable) ...
  unsigned wait_gen;     // ... while it still reads this
};
inline void* sched_sp = nullptr;
inline std::vector<Fiber> fibers;
inline std::vector<std::vector<char>> stacks;
inline Fiber* cur = nullptr;
inline void (*body)() = nullptr;
inline unsigned long long events = 0;  // barrier arrivals and finished fibers (deadlock check)
// barriers: one for the block, one per warp
inline unsigned block_arrived = 0, block_gen = 0;
inline std::vector<unsigned> warp_arrived, warp_gen;
inline std::vector<unsigned long long> warp_slot;  // 32 words per warp (shuffles)
constexpr size_t kStack = 128 * 1024;

[[noreturn]] inline void die(const char* what) {
  std::fprintf(stderr, "kzcpu: %s (block %u, thread %u,%u)\n", what, blockIdx.x, threadIdx.x, threadIdx.y);
  std::exit(3);
}
// Wait until *gen moves on from g (other fibers run meanwhile).
inline void wait_for(const unsigned* gen, unsigned g) {
  Fiber* me = cur;
  me->wait = gen;
  me->wait_gen = g;
  kz_switch(&me->sp, sched_sp);
}
[[noreturn]] inline void fiber_start() {
  body();
  cur->done = true;
  ++events;
  kz_switch(&cur->sp, sched_sp);
  __builtin_unreachable();
}
inline unsigned nthreads() { return blockDim.x * blockDim.y * blockDim.z; }
inline unsigned flat() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
inline void sync_block() {
  const unsigned g = block_gen;
  ++events;
  if (++block_arrived == nthreads()) {
    block_arrived = 0;
    ++block_gen;
    return;
  }
  wait_for(&block_gen, g);
}
inline void sync_warp() {
  const unsigned w = flat() / 32;
  const unsigned g = warp_gen[w];
  ++events;
  if (++warp_arrived[w] == 32) {
    warp_arrived[w] = 0;
    ++warp_gen[w];
    return;
  }
  wait_for(&warp_gen[w], g);
}
// A fresh fiber's stack: the frame kz_switch pops (MXCSR and x87 control word, r15 .. rbp), then
// fiber_start as the return address, 16-byte aligned as after a call.
inline void* fresh_stack(std::vector<char>& st) {
  uintptr_t top = (reinterpret_cast<uintptr_t>(st.data()) + st.size()) & ~uintptr_t(15);
  uint64_t* a = reinterpret_cast<uint64_t*>(top - 16);
  a[0] = reinterpret_cast<uint64_t>(&fiber_start);
  a[1] = 0;
  uint64_t* sp = a - 7;
  for (int i = 1; i < 7; ++i) sp[i] = 0;  // r15, r14, r13, r12, rbx, rbp
  unsigned mx;
  unsigned short cw;
  asm volatile("stmxcsr %0" : "=m"(mx));
  asm volatile("fnstcw %0" : "=m"(cw));
  std::memcpy(reinterpret_cast<char*>(sp), &mx, 4);
  std::memcpy(reinterpret_cast<char*>(sp) + 4, &cw, 2);
  return sp;
}
// One block of `body`, every thread a fiber, until all are done.
inline void run_block() {
  const unsigned n = nthreads();
  if (n % 32) die("block size is not a multiple of 32");
  fibers.assign(n, Fiber{});
  if (stacks.size() < n) stacks.resize(n);
  block_arrived = 0;
  warp_arrived.assign(n / 32, 0);
  warp_gen.assign(n / 32, 0);
  warp_slot.assign(n, 0);
  for (unsigned i = 0; i < n; ++i) {
    Fiber& f = fibers[i];
    f.idx = uint3{i % blockDim.x, (i / blockDim.x) % blockDim.y, i / (blockDim.x * blockDim.y)};
    f.done = false;
    f.wait = nullptr;
    if (stacks[i].empty()) stacks[i].resize(kStack);
    f.sp = fresh_stack(stacks[i]);
  }
  for (;;) {
    bool any = false;
    const unsigned long long before = events;
    for (unsigned i = 0; i < n; ++i) {
      Fiber& f = fibers[i];
      if (f.done) continue;
      any = true;
      if (f.wait && *f.wait == f.wait_gen) continue;  // its barrier is not complete yet
      f.wait = nullptr;
      cur = &f;
      threadIdx = f.idx;
      kz_switch(&sched_sp, f.sp);
    }
    if (!any) break;
    // a pass in which no fiber arrived anywhere or finished: they wait on each other forever
    // (a barrier or shuffle not reached by the whole block or warp)
    if (events == before) die("deadlock: a barrier or shuffle that not every thread reaches");
  }
  cur = nullptr;
}
// Launch `fn` on a grid of blocks (one after another).
inline void launch(uint3 grid, uint3 block, void (*fn)()) {
  gridDim = grid;
  blockDim = block;
  body = fn;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = uint3{x, y, z};
        run_block();
      }
}
}  // namespace kzcpu

// ---- intrinsics --------------------------------------------------------------------------------
inline void __syncthreads() { kzcpu::sync_block(); }
[[noreturn]] inline void __trap() { kzcpu::die("__trap()"); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float rsqrtf(float v) { return 1.0f / sqrtf(v); }
inline float __expf(float v) { return expf(v); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
// CUDA's integer min/max overloads
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float cospif(float x) { return (float)std::cos(M_PI * (double)x); }

template <typename V>
inline V kz_shfl_impl(V v, int src_of_lane_delta, bool idx) {
  using namespace kzcpu;
  static_assert(sizeof(V) <= 8, "shuffle of at most 8 bytes");
  const unsigned me = flat();
  const unsigned w = me / 32, lane = me % 32;
  unsigned long long word = 0;
  std::memcpy(&word, &v, sizeof(V));
  warp_slot[32 * w + lane] = word;
  sync_warp();
  unsigned src = idx ? (unsigned)src_of_lane_delta : lane + (unsigned)src_of_lane_delta;
  if (src >= 32) src = lane;  // shfl_down past the warp: the caller's own value
  const unsigned long long got = warp_slot[32 * w + src];
  sync_warp();  // nobody rewrites the slots before everyone has read
  V r;
  std::memcpy(&r, &got, sizeof(V));
  return r;
}
template <typename V>
inline V __shfl_down_sync(unsigned mask, V v, unsigned delta) {
  if (mask != 0xffffffffu) kzcpu::die("shuffle with a partial mask");
  return kz_shfl_impl(v, (int)delta, false);
}
template <typename V>
inline V __shfl_sync(unsigned mask, V v, int src) {
  if (mask != 0xffffffffu) kzcpu::die("shuffle with a partial mask");
  return kz_shfl_impl(v, src, true);
}

// ---- 16-bit floats -----------------------------------------------------------------------------
struct __nv_bfloat16 { unsigned short x; };
struct __half { unsigned short x; };
inline float __bfloat162float(__nv_bfloat16 b) { return __uint_as_float((unsigned)b.x << 16); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{(unsigned short)((u >> 16) | 0x40)};  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return __nv_bfloat16{(unsigned short)(u >> 16)};
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short s) { return __nv_bfloat16{s}; }
inline float __half2float(__half h) { _Float16 f; std::memcpy(&f, &h.x, 2); return (float)f; }
inline __half __float2half_rn(float v) {
  const _Float16 f = (_Float16)v;  // round to nearest even (libgcc)
  __half h;
  std::memcpy(&h.x, &f, 2);
  return h;
}
inline unsigned short __half_as_ushort(__half h) { return h.x; }
inline __half __ushort_as_half(unsigned short s) { return __half{s}; }
