/* Softmax and log_softmax, forward and backward, on CUDA: the GPU twin of
 * c_ops/src/softmax.c, the same element steps ([note: softmax steps]).
 * Contracts: mixprec/softmax.h. Geometry: [note: slice launch] (softmax.cuh).
 * A row is read once for the online (max, sum) and once more (from L2 for
 * all but huge rows) to write; strided columns are one thread each, so a
 * warp's loads are coalesced. Launches go to the caller's stream; nothing
 * synchronises. Not yet run on a GPU. */
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
  const MaxSum a = row_max_sum<DX, WARP>(xr, n, tid, nt, scratch);
  const float m = a.m;
  const float f = mixprec__sm_factor(a.s, LOG);
  constexpr int VY = VecWidth<DY>::value;
  if (vec && aligned16(yr) && n % VY == 0) {
    /* Read in x vectors, write in y vectors: handle VX * VY / gcd... simply
     * step by 8 elements (a multiple of both widths). */
    if (n % 8 == 0) {
      for (int64_t i = (int64_t)tid * 8; i < n; i += (int64_t)nt * 8) {
        float v[8];
        ld_vec<DX>(xr, i, v);
        if (VX == 4) ld_vec<DX>(xr, i + 4, v + 4);
        for (int k = 0; k < 8; k++) v[k] = mixprec__sm_out(v[k] - m, f, LOG);
        st_vec<DY>(yr, i, v);
        if (VY == 4) st_vec<DY>(yr, i + 4, v + 4);
      }
      return;
    }
  }
  for (int64_t i = tid; i < n; i += nt) st<DY>(yr, i, mixprec__sm_out(ld<DX>(xr, i) - m, f, LOG));
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
  for (int64_t i = tid; i < n; i += nt) s += mixprec__sm_bwd_term(ld<DY>(dy, off + i), ld<DY>(y, off + i), LOG);
  s = WARP ? warp_sum(s) : block_sum(s, scratch);
  for (int64_t i = tid; i < n; i += nt)
    st<DX>(dx, off + i, mixprec__sm_bwd_out(ld<DY>(dy, off + i), ld<DY>(y, off + i), s, LOG));
}

/* ---- strided kernels: one thread per column ---------------------------------- */

template <int DX, int DY, bool LOG>
__global__ void softmax_cols(const void *x, void *y, int64_t outer, int64_t n,
                             int64_t inner) {
  const int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t o = blockIdx.y;
  if (col >= inner) return;
  const int64_t base = o * n * inner + col;
  const MaxSum a = col_max_sum<DX>(x, base, n, inner);
  const float f = mixprec__sm_factor(a.s, LOG);
  for (int64_t c = 0; c < n; c++) st<DY>(y, base + c * inner, mixprec__sm_out(ld<DX>(x, base + c * inner) - a.m, f, LOG));
}

template <int DY, int DX, bool LOG>
__global__ void softmax_cols_bwd(const void *dy, const void *y, void *dx,
                                 int64_t outer, int64_t n, int64_t inner) {
  const int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t o = blockIdx.y;
  if (col >= inner) return;
  const int64_t base = o * n * inner + col;
  float s = 0.0f;
  for (int64_t c = 0; c < n; c++) s += mixprec__sm_bwd_term(ld<DY>(dy, base + c * inner), ld<DY>(y, base + c * inner), LOG);
  for (int64_t c = 0; c < n; c++) {
    const int64_t i = base + c * inner;
    st<DX>(dx, i, mixprec__sm_bwd_out(ld<DY>(dy, i), ld<DY>(y, i), s, LOG));
  }
}

/* ---- launch: [note: slice launch] ------------------------------------------------- */

template <int DX, int DY, bool LOG>
mixprec_status launch_fwd(const void *x, void *y, int64_t outer, int64_t n, int64_t inner, cudaStream_t s) {
  const int xs = DX == MIXPREC_F32 ? 4 : 2, ys = DY == MIXPREC_F32 ? 4 : 2;
  return launch_slices(
      outer, n, inner,
      [&](unsigned blocks, int threads) { softmax_rows<DX, DY, LOG, true><<<blocks, threads, 0, s>>>(x, y, outer, n); },
      [&](unsigned blocks, int threads) { softmax_rows<DX, DY, LOG, false><<<blocks, threads, 0, s>>>(x, y, outer, n); },
      [&](dim3 grid, int64_t o0, int64_t cnt) {
        const size_t off = (size_t)(o0 * n * inner);
        softmax_cols<DX, DY, LOG><<<grid, MIXPREC__SM_THREADS, 0, s>>>(
            static_cast<const char *>(x) + off * xs, static_cast<char *>(y) + off * ys, cnt, n, inner);
      });
}

template <int DY, int DX, bool LOG>
mixprec_status launch_bwd(const void *dy, const void *y, void *dx, int64_t outer, int64_t n,
                          int64_t inner, cudaStream_t s) {
  const int ys = DY == MIXPREC_F32 ? 4 : 2, xs = DX == MIXPREC_F32 ? 4 : 2;
  return launch_slices(
      outer, n, inner,
      [&](unsigned blocks, int threads) {
        softmax_rows_bwd<DY, DX, LOG, true><<<blocks, threads, 0, s>>>(dy, y, dx, outer, n);
      },
      [&](unsigned blocks, int threads) {
        softmax_rows_bwd<DY, DX, LOG, false><<<blocks, threads, 0, s>>>(dy, y, dx, outer, n);
      },
      [&](dim3 grid, int64_t o0, int64_t cnt) {
        const size_t off = (size_t)(o0 * n * inner);
        softmax_cols_bwd<DY, DX, LOG><<<grid, MIXPREC__SM_THREADS, 0, s>>>(
            static_cast<const char *>(dy) + off * ys, static_cast<const char *>(y) + off * ys,
            static_cast<char *>(dx) + off * xs, cnt, n, inner);
      });
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
