/* mixprec's CUDA emulator (tests/cuda_emu/README.md): the device side of the
 * CUDA subset kernels/ uses, for g++. Each CUDA thread is a fiber; a block's
 * threads run on one OS thread until they finish or wait at a barrier or a
 * warp operation, which the scheduler (emu.cc) completes only when every
 * thread it names has arrived. Included first by every rewritten kernel file
 * (rewrite.py) and by the stand-in cuda_runtime.h. */
#ifndef MIXPREC_CUDA_EMU_H
#define MIXPREC_CUDA_EMU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __constant__ static
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
/* rewrite.py turns __launch_bounds__(N) into a check at the kernel's entry
 * and __grid_constant__ parameters into references to one copy per launch;
 * what is left (a header it did not rewrite) expands to nothing. */
#define __launch_bounds__(...)
#define __grid_constant__
#ifndef __restrict__
#define __restrict__ __restrict
#endif

struct uint3 { unsigned x, y, z; };
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
  constexpr dim3(uint3 u) : x(u.x), y(u.y), z(u.z) {}
};
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
static inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
static inline float2 make_float2(float x, float y) { return {x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
static inline int2 make_int2(int x, int y) { return {x, y}; }

namespace emu {

/* Where a thread waits, for the scheduler and for error messages. */
struct Site { const char *file; int line; };

struct Thread;
extern Thread *cur;           /* the running CUDA thread (null on the host) */
extern uint3 block_idx;       /* of the running block */
extern dim3 block_dim, grid_dim;
uint3 &thread_idx();

void syncthreads(Site at);
int syncthreads_red(int pred, int op, Site at); /* op 0 or, 1 and, 2 count */
uint64_t warp_op(int kind, unsigned mask, uint64_t value, int arg, int width, Site at);
unsigned activemask(Site at);
void *shared_var(const void *key, size_t bytes, size_t align);
void *dynamic_shared();
void launch_bounds(int max_threads, Site at);
[[noreturn]] void fail(Site at, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

enum { W_SYNC = 1, W_SHFL_IDX, W_SHFL_UP, W_SHFL_DOWN, W_SHFL_XOR, W_BALLOT, W_MATCH_ANY, W_ANY, W_ALL };

template <class T> uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "warp operand");
  uint64_t u = 0;
  memcpy(&u, &v, sizeof(T));
  return u;
}
template <class T> T from_bits(uint64_t u) {
  T v;
  memcpy(&v, &u, sizeof(T));
  return v;
}

/* A launch, in the order CUDA evaluates it: configuration, then the
 * arguments, converted to the kernel's parameter types once (a
 * __grid_constant__ reference parameter binds to that one copy). */
using Body = std::function<void()>;
int submit(Site at, dim3 grid, dim3 block, size_t smem, void *stream, Body body);

template <class... P> struct Launcher {
  Site at;
  void (*k)(P...);
  dim3 g, b;
  size_t smem = 0;
  void *stream = nullptr;
  Launcher &cfg(dim3 grid, dim3 block, size_t shared = 0, void *s = nullptr) {
    g = grid; b = block; smem = shared; stream = s;
    return *this;
  }
  template <class S> Launcher &cfg(dim3 grid, dim3 block, size_t shared, S *s) {
    return cfg(grid, block, shared, (void *)s);
  }
  /* The parameters' own types: the call converts the arguments as a call of
   * the kernel would (NULL to a pointer, int64_t to int). */
  void operator()(std::decay_t<P>... a) {
    auto args = std::make_shared<std::tuple<std::decay_t<P>...>>(std::move(a)...);
    auto fn = k;
    submit(at, g, b, smem, stream, [fn, args] { std::apply(fn, *args); });
  }
};
template <class... P> Launcher<P...> launch(const char *file, int line, void (*k)(P...)) {
  return Launcher<P...>{Site{file, line}, k, dim3(), dim3()};
}

}  // namespace emu

#define threadIdx (::emu::thread_idx())
#define blockIdx (::emu::block_idx)
#define blockDim (::emu::block_dim)
#define gridDim (::emu::grid_dim)
#define warpSize 32

#define EMU_SITE (::emu::Site{__FILE__, __LINE__})
#define __syncthreads() ::emu::syncthreads(EMU_SITE)
#define __syncthreads_or(p) ::emu::syncthreads_red((p) != 0, 0, EMU_SITE)
#define __syncthreads_and(p) ::emu::syncthreads_red((p) != 0, 1, EMU_SITE)
#define __syncthreads_count(p) ::emu::syncthreads_red((p) != 0, 2, EMU_SITE)
#define __syncwarp(...) ::emu::syncwarp_(EMU_SITE, ##__VA_ARGS__)
#define __activemask() ::emu::activemask(EMU_SITE)
#define __shfl_sync(m, v, l, ...) ::emu::shfl_(::emu::W_SHFL_IDX, m, v, l, EMU_SITE, ##__VA_ARGS__)
#define __shfl_up_sync(m, v, d, ...) ::emu::shfl_(::emu::W_SHFL_UP, m, v, d, EMU_SITE, ##__VA_ARGS__)
#define __shfl_down_sync(m, v, d, ...) ::emu::shfl_(::emu::W_SHFL_DOWN, m, v, d, EMU_SITE, ##__VA_ARGS__)
#define __shfl_xor_sync(m, v, l, ...) ::emu::shfl_(::emu::W_SHFL_XOR, m, v, l, EMU_SITE, ##__VA_ARGS__)
#define __ballot_sync(m, p) ((unsigned)::emu::warp_op(::emu::W_BALLOT, m, (p) != 0, 0, 32, EMU_SITE))
#define __any_sync(m, p) ((int)::emu::warp_op(::emu::W_ANY, m, (p) != 0, 0, 32, EMU_SITE))
#define __all_sync(m, p) ((int)::emu::warp_op(::emu::W_ALL, m, (p) != 0, 0, 32, EMU_SITE))
#define __match_any_sync(m, v) ((unsigned)::emu::warp_op(::emu::W_MATCH_ANY, m, ::emu::to_bits(v), 0, 32, EMU_SITE))

namespace emu {
inline void syncwarp_(Site at, unsigned mask = 0xffffffffu) { warp_op(W_SYNC, mask, 0, 0, 32, at); }
template <class T> T shfl_(int kind, unsigned mask, T v, int arg, Site at, int width = 32) {
  return from_bits<T>(warp_op(kind, mask, to_bits(v), arg, width, at));
}
}  // namespace emu

/* ---- intrinsics: IEEE round-to-nearest, never contracted into an fma ---- */
#define EMU_OPAQUE(x) __asm__("" : "+x"(x))
static inline float __fadd_rn(float a, float b) { float r = a + b; EMU_OPAQUE(r); return r; }
static inline float __fsub_rn(float a, float b) { float r = a - b; EMU_OPAQUE(r); return r; }
static inline float __fmul_rn(float a, float b) { float r = a * b; EMU_OPAQUE(r); return r; }
static inline float __fdiv_rn(float a, float b) { float r = a / b; EMU_OPAQUE(r); return r; }
static inline float __fsqrt_rn(float a) { float r = sqrtf(a); EMU_OPAQUE(r); return r; }
static inline float __frcp_rn(float a) { float r = 1.0f / a; EMU_OPAQUE(r); return r; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __dadd_rn(double a, double b) { double r = a + b; EMU_OPAQUE(r); return r; }
static inline double __dsub_rn(double a, double b) { double r = a - b; EMU_OPAQUE(r); return r; }
static inline double __dmul_rn(double a, double b) { double r = a * b; EMU_OPAQUE(r); return r; }
static inline double __ddiv_rn(double a, double b) { double r = a / b; EMU_OPAQUE(r); return r; }
static inline double __dsqrt_rn(double a) { double r = sqrt(a); EMU_OPAQUE(r); return r; }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline int __float_as_int(float f) { int u; memcpy(&u, &f, 4); return u; }
static inline double __longlong_as_double(long long u) { double f; memcpy(&f, &u, 8); return f; }
static inline long long __double_as_longlong(double f) { long long u; memcpy(&u, &f, 8); return u; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
static inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
static inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; i++) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x != x ? 0.0f : x; }
/* Device min/max: CUDA's overloads for one type each (a mixed call that
 * nvcc resolves by promotion fails here too, or promotes the same way). */
#define EMU_MINMAX(T)                                          \
  static inline T min(T a, T b) { return a < b ? a : b; }     \
  static inline T max(T a, T b) { return a > b ? a : b; }
EMU_MINMAX(int) EMU_MINMAX(unsigned) EMU_MINMAX(long) EMU_MINMAX(unsigned long)
EMU_MINMAX(long long) EMU_MINMAX(unsigned long long)
#undef EMU_MINMAX
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }

/* ---- atomics: a thread runs alone between its waits, so a plain
 * read-modify-write is atomic here (the order of blocks is the seed's) ---- */
template <class T> T atomicAdd(T *p, T v) { T o = *p; *p = o + v; return o; }
template <class T> T atomicSub(T *p, T v) { T o = *p; *p = o - v; return o; }
template <class T> T atomicMax(T *p, T v) { T o = *p; *p = o > v ? o : v; return o; }
template <class T> T atomicMin(T *p, T v) { T o = *p; *p = o < v ? o : v; return o; }
template <class T> T atomicExch(T *p, T v) { T o = *p; *p = v; return o; }
template <class T> T atomicOr(T *p, T v) { T o = *p; *p = o | v; return o; }
template <class T> T atomicAnd(T *p, T v) { T o = *p; *p = o & v; return o; }
template <class T> T atomicCAS(T *p, T c, T v) { T o = *p; if (o == c) *p = v; return o; }
static inline unsigned atomicInc(unsigned *p, unsigned lim) { unsigned o = *p; *p = o >= lim ? 0 : o + 1; return o; }
static inline void __threadfence() {}
static inline void __threadfence_block() {}
template <class T> T __ldg(const T *p) { return *p; }

#endif /* __cplusplus */
#endif /* MIXPREC_CUDA_EMU_H */
