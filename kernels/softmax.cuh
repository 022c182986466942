/* Device code shared by softmax.cu and cross_entropy.cu: loads and stores
 * of the three dtypes (element and 16-byte vector), the online (max, sum)
 * reductions over a row or a column,
 *   v > m: s = s * exp(m - v) + 1, m = v;  else s += exp(v - m),
 * built from the steps of [note: softmax steps] (softmax_rules.h) and merged
 * across a warp with shuffles and across warps through shared memory, and
 * the launch geometry both files use. Templates in an anonymous namespace:
 * each .cu instantiates what it uses. */
#ifndef MIXPREC_KERNELS_SOFTMAX_CUH
#define MIXPREC_KERNELS_SOFTMAX_CUH

#include "common.cuh"
#include "mixprec/softmax.h"
#include "softmax_rules.h"

#define MIXPREC__SM_THREADS 256
#define MIXPREC__SM_BIG_THREADS 1024
#define MIXPREC__SM_WARP_ROW_MAX 1024

namespace {

/* ---- elements ------------------------------------------------------------ */

/* element.h's accesses with the dtype a template argument. */
template <int D>
__device__ __forceinline__ float ld(const void *p, int64_t i) {
  return mixprec__load_f32(p, (mixprec_dtype)D, i);
}

template <int D>
__device__ __forceinline__ void st(void *p, int64_t i, float v) {
  mixprec__store_f32(p, (mixprec_dtype)D, i, v);
}

/* Elements per 16-byte vector. */
template <int D>
struct VecWidth {
  static constexpr int value = D == MIXPREC_F32 ? 4 : 8;
};

/* Loads the vector holding elements [i, i + width) (16-byte aligned). */
template <int D>
__device__ __forceinline__ void ld_vec(const void *p, int64_t i, float *out) {
  const uint4 u = *reinterpret_cast<const uint4 *>(static_cast<const char *>(p) +
                                                    i * (D == MIXPREC_F32 ? 4 : 2));
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
  if constexpr (D == MIXPREC_F32) {
    for (int k = 0; k < 4; k++) out[k] = __uint_as_float(w[k]);
  } else {
    for (int k = 0; k < 4; k++) {
      const uint16_t lo = (uint16_t)(w[k] & 0xffffu), hi = (uint16_t)(w[k] >> 16);
      out[2 * k] = mixprec__half_to_f32((mixprec_dtype)D, lo);
      out[2 * k + 1] = mixprec__half_to_f32((mixprec_dtype)D, hi);
    }
  }
}

template <int D>
__device__ __forceinline__ void st_vec(void *p, int64_t i, const float *v) {
  uint32_t w[4];
  if constexpr (D == MIXPREC_F32) {
    for (int k = 0; k < 4; k++) w[k] = __float_as_uint(v[k]);
  } else {
    for (int k = 0; k < 4; k++) {
      const uint32_t lo = mixprec__f32_to_half((mixprec_dtype)D, v[2 * k]);
      const uint32_t hi = mixprec__f32_to_half((mixprec_dtype)D, v[2 * k + 1]);
      w[k] = lo | (hi << 16);
    }
  }
  *reinterpret_cast<uint4 *>(static_cast<char *>(p) + i * (D == MIXPREC_F32 ? 4 : 2)) =
      make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* ---- online (max, sum) ------------------------------------------------------ */

struct MaxSum {
  float m, s;
};

/* Adds one value. -inf adds nothing (and never makes exp(-inf - -inf)); NaN
 * and +inf make the sum NaN, as the two-pass CPU formula does. */
__device__ __forceinline__ void online_add(MaxSum &a, float v) {
  if (v > a.m) {
    a.s = v == INFINITY ? NAN : a.s * mixprec__sm_exp_term(a.m, v) + 1.0f;
    a.m = v;
  } else if (v != -INFINITY) {
    a.s += mixprec__sm_exp_term(v, a.m);
  }
}

/* Adds k values at once: one rescale for the whole vector (at most), then
 * k exponentials against the new max, instead of a compare-and-rescale per
 * element. Same special cases as online_add (a NaN never wins fmaxf but
 * makes the sum NaN; +inf makes it NaN; -inf adds nothing). */
template <int K>
__device__ __forceinline__ void online_add_vec(MaxSum &a, const float *v) {
  float vm = v[0];
  bool nan = false;
  for (int k = 0; k < K; k++) {
    vm = fmaxf(vm, v[k]);
    nan |= v[k] != v[k];
  }
  if (vm > a.m) {
    a.s = vm == INFINITY ? NAN : a.s * mixprec__sm_exp_term(a.m, vm);
    a.m = vm;
  }
  if (nan) {
    a.s = NAN;
    return;
  }
  if (a.m == -INFINITY) return;
  float s = 0.0f;
  for (int k = 0; k < K; k++) s += mixprec__sm_exp_term(v[k], a.m);
  a.s += s;
}

__device__ __forceinline__ MaxSum online_merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY || m == INFINITY) return {m, a.s + b.s};
  const float sa = a.m == -INFINITY ? 0.0f : a.s * mixprec__sm_exp_term(a.m, m);
  const float sb = b.m == -INFINITY ? 0.0f : b.s * mixprec__sm_exp_term(b.m, m);
  return {m, sa + sb};
}

__device__ __forceinline__ MaxSum warp_merge(MaxSum a) {
  for (int off = 16; off > 0; off /= 2) {
    MaxSum b{__shfl_xor_sync(0xffffffffu, a.m, off), __shfl_xor_sync(0xffffffffu, a.s, off)};
    a = online_merge(a, b);
  }
  return a;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

/* Whole-block merge; every thread gets the result. scratch: 2 * 32 floats. */
__device__ __forceinline__ MaxSum block_merge(MaxSum a, float *scratch) {
  a = warp_merge(a);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
  if (lane == 0) {
    scratch[warp] = a.m;
    scratch[32 + warp] = a.s;
  }
  __syncthreads();
  MaxSum r{-INFINITY, 0.0f};
  for (int w = 0; w < nw; w++) r = online_merge(r, MaxSum{scratch[w], scratch[32 + w]});
  __syncthreads();
  return r;
}

__device__ __forceinline__ float block_sum(float v, float *scratch) {
  v = warp_sum(v);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = 0.0f;
  for (int w = 0; w < nw; w++) r += scratch[w];
  __syncthreads();
  return r;
}

/* ---- one row -------------------------------------------------------------------- */

/* The row's online (max, sum) by threads tid of nt (one warp when WARP,
 * else the block), every thread getting the result: 16-byte loads when the
 * row is 16-byte aligned and n is a multiple of the vector width, else
 * element by element. scratch: 2 * 32 floats (block rows). */
template <int D, bool WARP>
__device__ __forceinline__ MaxSum row_max_sum(const void *xr, int64_t n, int tid, int nt, float *scratch) {
  constexpr int V = VecWidth<D>::value;
  MaxSum a{-INFINITY, 0.0f};
  if (aligned16(xr) && n % V == 0) {
    for (int64_t i = (int64_t)tid * V; i < n; i += (int64_t)nt * V) {
      float v[8];
      ld_vec<D>(xr, i, v);
      online_add_vec<V>(a, v);
    }
  } else {
    for (int64_t i = tid; i < n; i += nt) online_add(a, ld<D>(xr, i));
  }
  return WARP ? warp_merge(a) : block_merge(a, scratch);
}

/* One column's online (max, sum): n values `inner` apart from base, by one
 * thread. */
template <int D>
__device__ __forceinline__ MaxSum col_max_sum(const void *x, int64_t base, int64_t n, int64_t inner) {
  MaxSum a{-INFINITY, 0.0f};
  for (int64_t c = 0; c < n; c++) online_add(a, ld<D>(x, base + c * inner));
  return a;
}

/* ---- launch geometry ---------------------------------------------------------------- */

/* grid.y is at most 65535: outer beyond that goes in several launches. */
#define MIXPREC__SM_MAX_Y 65535

/* [note: slice launch] Rows (inner == 1): one warp per row for n <=
 * MIXPREC__SM_WARP_ROW_MAX (MIXPREC__SM_THREADS / 32 rows per block), one
 * block per row above (MIXPREC__SM_BIG_THREADS threads from n = 16384).
 * Strided (inner > 1): one thread per column, grid (columns / threads, outer)
 * in launches of at most MIXPREC__SM_MAX_Y outer indices. The callables
 * launch their kernel: warp_rows(blocks, threads), block_rows(blocks,
 * threads), cols(grid, o0, count); each returns nothing. */
template <class WarpRows, class BlockRows, class Cols>
mixprec_status launch_slices(int64_t outer, int64_t n, int64_t inner, const WarpRows &warp_rows,
                             const BlockRows &block_rows, const Cols &cols) {
  if (inner == 1) {
    if (n <= MIXPREC__SM_WARP_ROW_MAX) {
      const int64_t per_block = MIXPREC__SM_THREADS / 32;
      const int64_t blocks = (outer + per_block - 1) / per_block;
      if (blocks > MIXPREC__MAX_GRID) return MIXPREC_ERR_BAD_SIZE;
      warp_rows((unsigned)blocks, MIXPREC__SM_THREADS);
    } else {
      if (outer > MIXPREC__MAX_GRID) return MIXPREC_ERR_BAD_SIZE;
      block_rows((unsigned)outer, n >= 16384 ? MIXPREC__SM_BIG_THREADS : MIXPREC__SM_THREADS);
    }
    return mixprec__cuda_launch_status();
  }
  const int64_t bx = (inner + MIXPREC__SM_THREADS - 1) / MIXPREC__SM_THREADS;
  if (bx > MIXPREC__MAX_GRID) return MIXPREC_ERR_BAD_SIZE;
  for (int64_t o0 = 0; o0 < outer; o0 += MIXPREC__SM_MAX_Y) {
    const int64_t cnt = outer - o0 < MIXPREC__SM_MAX_Y ? outer - o0 : MIXPREC__SM_MAX_Y;
    cols(dim3((unsigned)bx, (unsigned)cnt), o0, cnt);
    const mixprec_status st = mixprec__cuda_launch_status();
    if (st != MIXPREC_OK) return st;
  }
  return MIXPREC_OK;
}

}  // namespace

#endif /* MIXPREC_KERNELS_SOFTMAX_CUH */
