/* Softmax and log_softmax, forward and backward, on CUDA: the GPU twin of
 * c_ops/src/softmax.c (same (outer, n, inner) layout, same formulas).
 *
 * Rows (inner == 1): one warp per row for n <= 1024, one block per row
 * above. Each thread walks its share of the row with 16-byte loads (when
 * the row is 16-byte aligned and n is a multiple of the vector width, else
 * element by element) and keeps an online (max, sum) pair:
 *   v > m: s = s * exp(m - v) + 1, m = v;  else s += exp(v - m)
 * so the row is read once for both; the pairs are merged with warp shuffles
 * (then across warps through shared memory). The write pass reads the row
 * again, from L2 for all but huge rows.
 * Strided slices (inner > 1): one thread per column (outer, j); neighbouring
 * threads read neighbouring columns, so each load instruction of a warp is
 * coalesced; the same online pair, then the write pass.
 * Every launch goes to the caller's stream; nothing synchronises.
 * The element helpers and the online (max, sum) reductions are in
 * softmax.cuh, shared with cross_entropy.cu. */
#include "softmax.cuh"
#include "softmax_check.h"

namespace {

/* ---- row kernels ------------------------------------------------------------
 * WARP: one warp per row (row = blockIdx.x * warps + warp), else one block. */

template <int DX, int DY, bool LOG, bool WARP>
__global__ void softmax_rows(const void *x, void *y, int64_t rows, int64_t n) {
  __shared__ float scratch[64];
  const int64_t row = WARP ? (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32 : blockIdx.x;
  if (WARP && row >= rows) return;
  const int tid = WARP ? threadIdx.x % 32 : threadIdx.x;
  const int nt = WARP ? 32 : blockDim.x;
  const char *xr = static_cast<const char *>(x) + row * n * (DX == MIXPREC_F32 ? 4 : 2);
  char *yr = static_cast<char *>(y) + row * n * (DY == MIXPREC_F32 ? 4 : 2);
  constexpr int VX = VecWidth<DX>::value;
  const bool vec = aligned16(xr) && n % VX == 0;
  MaxSum a{-INFINITY, 0.0f};
  if (vec) {
    for (int64_t i = (int64_t)tid * VX; i < n; i += (int64_t)nt * VX) {
      float v[8];
      ld_vec<DX>(xr, i, v);
      online_add_vec<VX>(a, v);
    }
  } else {
    for (int64_t i = tid; i < n; i += nt) online_add(a, ld<DX>(xr, i));
  }
  a = WARP ? warp_merge(a) : block_merge(a, scratch);
  const float m = a.m;
  const float f = LOG ? logf(a.s) : 1.0f / a.s;
  constexpr int VY = VecWidth<DY>::value;
  if (vec && aligned16(yr) && n % VY == 0) {
    /* Read in x vectors, write in y vectors: handle VX * VY / gcd... simply
     * step by 8 elements (a multiple of both widths). */
    if (n % 8 == 0) {
      for (int64_t i = (int64_t)tid * 8; i < n; i += (int64_t)nt * 8) {
        float v[8];
        ld_vec<DX>(xr, i, v);
        if (VX == 4) ld_vec<DX>(xr, i + 4, v + 4);
        for (int k = 0; k < 8; k++) v[k] = LOG ? (v[k] - m) - f : expf(v[k] - m) * f;
        st_vec<DY>(yr, i, v);
        if (VY == 4) st_vec<DY>(yr, i + 4, v + 4);
      }
      return;
    }
  }
  for (int64_t i = tid; i < n; i += nt) {
    const float d = ld<DX>(xr, i) - m;
    st<DY>(yr, i, LOG ? d - f : expf(d) * f);
  }
}

template <int DY, int DX, bool LOG, bool WARP>
__global__ void softmax_rows_bwd(const void *dy, const void *y, void *dx,
                                 int64_t rows, int64_t n) {
  __shared__ float scratch[64];
  const int64_t row = WARP ? (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32 : blockIdx.x;
  if (WARP && row >= rows) return;
  const int tid = WARP ? threadIdx.x % 32 : threadIdx.x;
  const int nt = WARP ? 32 : blockDim.x;
  const int64_t off = row * n;
  float s = 0.0f;
  for (int64_t i = tid; i < n; i += nt) {
    const float g = ld<DY>(dy, off + i);
    s += LOG ? g : g * ld<DY>(y, off + i);
  }
  s = WARP ? warp_sum(s) : block_sum(s, scratch);
  for (int64_t i = tid; i < n; i += nt) {
    const float g = ld<DY>(dy, off + i), o = ld<DY>(y, off + i);
    st<DX>(dx, off + i, LOG ? g - expf(o) * s : o * (g - s));
  }
}

/* ---- strided kernels: one thread per column ---------------------------------- */

template <int DX, int DY, bool LOG>
__global__ void softmax_cols(const void *x, void *y, int64_t outer, int64_t n,
                             int64_t inner) {
  const int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t o = blockIdx.y;
  if (col >= inner) return;
  const int64_t base = o * n * inner + col;
  MaxSum a{-INFINITY, 0.0f};
  for (int64_t c = 0; c < n; c++) online_add(a, ld<DX>(x, base + c * inner));
  const float f = LOG ? logf(a.s) : 1.0f / a.s;
  for (int64_t c = 0; c < n; c++) {
    const float d = ld<DX>(x, base + c * inner) - a.m;
    st<DY>(y, base + c * inner, LOG ? d - f : expf(d) * f);
  }
}

template <int DY, int DX, bool LOG>
__global__ void softmax_cols_bwd(const void *dy, const void *y, void *dx,
                                 int64_t outer, int64_t n, int64_t inner) {
  const int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t o = blockIdx.y;
  if (col >= inner) return;
  const int64_t base = o * n * inner + col;
  float s = 0.0f;
  for (int64_t c = 0; c < n; c++) {
    const float g = ld<DY>(dy, base + c * inner);
    s += LOG ? g : g * ld<DY>(y, base + c * inner);
  }
  for (int64_t c = 0; c < n; c++) {
    const int64_t i = base + c * inner;
    const float g = ld<DY>(dy, i), v = ld<DY>(y, i);
    st<DX>(dx, i, LOG ? g - expf(v) * s : v * (g - s));
  }
}

/* ---- launch ------------------------------------------------------------------ */

/* grid.y is at most 65535: outer beyond that goes in several launches. */
#define MIXPREC__SM_MAX_Y 65535

template <int DX, int DY, bool LOG>
mixprec_status launch_fwd(const void *x, void *y, int64_t outer, int64_t n, int64_t inner, cudaStream_t s) {
  const int xs = DX == MIXPREC_F32 ? 4 : 2, ys = DY == MIXPREC_F32 ? 4 : 2;
  if (inner == 1) {
    if (n <= MIXPREC__SM_WARP_ROW_MAX) {
      const int64_t per_block = MIXPREC__SM_THREADS / 32;
      const int64_t blocks = (outer + per_block - 1) / per_block;
      if (blocks > MIXPREC__MAX_GRID) return MIXPREC_ERR_BAD_SIZE;
      softmax_rows<DX, DY, LOG, true><<<(unsigned)blocks, MIXPREC__SM_THREADS, 0, s>>>(x, y, outer, n);
    } else {
      if (outer > MIXPREC__MAX_GRID) return MIXPREC_ERR_BAD_SIZE;
      const int threads = n >= 16384 ? MIXPREC__SM_BIG_THREADS : MIXPREC__SM_THREADS;
      softmax_rows<DX, DY, LOG, false><<<(unsigned)outer, threads, 0, s>>>(x, y, outer, n);
    }
    return mixprec__cuda_launch_status();
  }
  const int64_t bx = (inner + MIXPREC__SM_THREADS - 1) / MIXPREC__SM_THREADS;
  if (bx > MIXPREC__MAX_GRID) return MIXPREC_ERR_BAD_SIZE;
  for (int64_t o0 = 0; o0 < outer; o0 += MIXPREC__SM_MAX_Y) {
    const int64_t cnt = outer - o0 < MIXPREC__SM_MAX_Y ? outer - o0 : MIXPREC__SM_MAX_Y;
    const size_t off = (size_t)(o0 * n * inner);
    softmax_cols<DX, DY, LOG><<<dim3((unsigned)bx, (unsigned)cnt), MIXPREC__SM_THREADS, 0, s>>>(
        static_cast<const char *>(x) + off * xs, static_cast<char *>(y) + off * ys, cnt, n, inner);
    mixprec_status st = mixprec__cuda_launch_status();
    if (st != MIXPREC_OK) return st;
  }
  return MIXPREC_OK;
}

template <int DY, int DX, bool LOG>
mixprec_status launch_bwd(const void *dy, const void *y, void *dx, int64_t outer, int64_t n,
                          int64_t inner, cudaStream_t s) {
  const int ys = DY == MIXPREC_F32 ? 4 : 2, xs = DX == MIXPREC_F32 ? 4 : 2;
  if (inner == 1) {
    if (n <= MIXPREC__SM_WARP_ROW_MAX) {
      const int64_t per_block = MIXPREC__SM_THREADS / 32;
      const int64_t blocks = (outer + per_block - 1) / per_block;
      if (blocks > MIXPREC__MAX_GRID) return MIXPREC_ERR_BAD_SIZE;
      softmax_rows_bwd<DY, DX, LOG, true><<<(unsigned)blocks, MIXPREC__SM_THREADS, 0, s>>>(dy, y, dx, outer, n);
    } else {
      if (outer > MIXPREC__MAX_GRID) return MIXPREC_ERR_BAD_SIZE;
      const int threads = n >= 16384 ? MIXPREC__SM_BIG_THREADS : MIXPREC__SM_THREADS;
      softmax_rows_bwd<DY, DX, LOG, false><<<(unsigned)outer, threads, 0, s>>>(dy, y, dx, outer, n);
    }
    return mixprec__cuda_launch_status();
  }
  const int64_t bx = (inner + MIXPREC__SM_THREADS - 1) / MIXPREC__SM_THREADS;
  if (bx > MIXPREC__MAX_GRID) return MIXPREC_ERR_BAD_SIZE;
  for (int64_t o0 = 0; o0 < outer; o0 += MIXPREC__SM_MAX_Y) {
    const int64_t cnt = outer - o0 < MIXPREC__SM_MAX_Y ? outer - o0 : MIXPREC__SM_MAX_Y;
    const size_t off = (size_t)(o0 * n * inner);
    softmax_cols_bwd<DY, DX, LOG><<<dim3((unsigned)bx, (unsigned)cnt), MIXPREC__SM_THREADS, 0, s>>>(
        static_cast<const char *>(dy) + off * ys, static_cast<const char *>(y) + off * ys,
        static_cast<char *>(dx) + off * xs, cnt, n, inner);
    mixprec_status st = mixprec__cuda_launch_status();
    if (st != MIXPREC_OK) return st;
  }
  return MIXPREC_OK;
}

/* One dispatch per dtype argument of an entry point: (input dtype, output dtype, log). */
template <int DX, bool LOG>
mixprec_status fwd_out(const void *x, void *y, mixprec_dtype yd, int64_t o, int64_t n, int64_t i,
                       cudaStream_t s) {
  MIXPREC__DISPATCH(yd, Y, return launch_fwd<DX, Y, LOG>(x, y, o, n, i, s));
}

template <bool LOG>
mixprec_status fwd(const void *x, mixprec_dtype xd, void *y, mixprec_dtype yd, int64_t o, int64_t n,
                   int64_t i, cudaStream_t s) {
  MIXPREC__DISPATCH(xd, X, return fwd_out<X, LOG>(x, y, yd, o, n, i, s));
}

template <int DY, bool LOG>
mixprec_status bwd_out(const void *dy, const void *y, void *dx, mixprec_dtype dxd, int64_t o, int64_t n,
                       int64_t i, cudaStream_t s) {
  MIXPREC__DISPATCH(dxd, DX, return launch_bwd<DY, DX, LOG>(dy, y, dx, o, n, i, s));
}

template <bool LOG>
mixprec_status bwd(const void *dy, const void *y, mixprec_dtype yd, void *dx, mixprec_dtype dxd, int64_t o,
                   int64_t n, int64_t i, cudaStream_t s) {
  MIXPREC__DISPATCH(yd, Y, return bwd_out<Y, LOG>(dy, y, dx, dxd, o, n, i, s));
}

/* The checks of softmax.c (softmax_check.h, then the pointers), plus element
 * alignment (a misaligned device load faults). */
mixprec_status check(const void *a, mixprec_dtype ad, const void *b, mixprec_dtype bd, const void *c,
                     int64_t outer, int64_t n, int64_t inner, int64_t *numel) {
  const mixprec_status st = mixprec__softmax_check_shape(ad, bd, outer, n, inner, numel);
  if (st != MIXPREC_OK || *numel == 0) return st;
  if (!a || !b || !c) return MIXPREC_ERR_NULL_POINTER;
  if ((uintptr_t)a % (uintptr_t)mixprec_dtype_size(ad) || (uintptr_t)c % (uintptr_t)mixprec_dtype_size(ad) ||
      (uintptr_t)b % (uintptr_t)mixprec_dtype_size(bd))
    return MIXPREC_ERR_BAD_ARGUMENT;
  return MIXPREC_OK;
}

}  // namespace

extern "C" MIXPREC_API mixprec_status mixprec_cuda_softmax(const void *x, mixprec_dtype x_dtype, void *y,
                                                           mixprec_dtype y_dtype, int64_t outer, int64_t n,
                                                           int64_t inner, void *stream) {
  int64_t numel;
  mixprec_status st = check(x, x_dtype, y, y_dtype, x, outer, n, inner, &numel);
  if (st != MIXPREC_OK || numel == 0) return st;
  return fwd<false>(x, x_dtype, y, y_dtype, outer, n, inner, (cudaStream_t)stream);
}

extern "C" MIXPREC_API mixprec_status mixprec_cuda_log_softmax(const void *x, mixprec_dtype x_dtype, void *y,
                                                               mixprec_dtype y_dtype, int64_t outer,
                                                               int64_t n, int64_t inner, void *stream) {
  int64_t numel;
  mixprec_status st = check(x, x_dtype, y, y_dtype, x, outer, n, inner, &numel);
  if (st != MIXPREC_OK || numel == 0) return st;
  return fwd<true>(x, x_dtype, y, y_dtype, outer, n, inner, (cudaStream_t)stream);
}

extern "C" MIXPREC_API mixprec_status mixprec_cuda_softmax_backward(const void *dy, const void *y,
                                                                    mixprec_dtype y_dtype, void *dx,
                                                                    mixprec_dtype dx_dtype, int64_t outer,
                                                                    int64_t n, int64_t inner, void *stream) {
  int64_t numel;
  mixprec_status st = check(dy, y_dtype, dx, dx_dtype, y, outer, n, inner, &numel);
  if (st != MIXPREC_OK || numel == 0) return st;
  return bwd<false>(dy, y, y_dtype, dx, dx_dtype, outer, n, inner, (cudaStream_t)stream);
}

extern "C" MIXPREC_API mixprec_status mixprec_cuda_log_softmax_backward(const void *dy, const void *y,
                                                                        mixprec_dtype y_dtype, void *dx,
                                                                        mixprec_dtype dx_dtype,
                                                                        int64_t outer, int64_t n,
                                                                        int64_t inner, void *stream) {
  int64_t numel;
  mixprec_status st = check(dy, y_dtype, dx, dx_dtype, y, outer, n, inner, &numel);
  if (st != MIXPREC_OK || numel == 0) return st;
  return bwd<true>(dy, y, y_dtype, dx, dx_dtype, outer, n, inner, (cudaStream_t)stream);
}
