/* Softmax and log_softmax, forward and backward, FP32 accumulation, over
 * the middle dimension of an (outer, n, inner) array; plus the scalar slice
 * kernels that cross_entropy.c shares.
 *
 * Work is cut into slices: a slice is `width` (<= MIXPREC__SM_WIDTH)
 * neighbouring columns of one outer index, each column holding n values
 * `stride` elements apart (stride = inner). A row (inner == 1) is one
 * column of stride 1. One thread computes a whole slice, so results do not
 * depend on the thread count. */
#include <math.h>
#include <stdlib.h>

#include "internal.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Columns per slice in the strided case: 32 FP16/BF16 values are one 64-byte
 * cache line, and four AVX2 vectors of floats. */
#define MIXPREC__SM_WIDTH 32
/* Below this many elements in all, a parallel region costs more than it saves. */
#define PARALLEL_MIN ((int64_t)1 << 15)
/* Slices are handed out in chunks of about this many elements, first come
 * first served: on a shared machine a thread that loses its core does not
 * hold the others up at the end (a slice is always computed whole by one
 * thread, so results do not depend on who takes it). */
#define CHUNK_ELEMS ((int64_t)1 << 15)

/* ---- The slice kernels, declared here and in cross_entropy.c ------------ */

/* Forward over one slice. scratch (AVX2 rows only) holds n floats. */
void mixprec__softmax_fwd_scalar(const void *x, mixprec_dtype xd, void *y,
                                 mixprec_dtype yd, int64_t n, int64_t stride,
                                 int64_t width, int log, float *scratch);
void mixprec__softmax_bwd_scalar(const void *dy, const void *y,
                                 mixprec_dtype yd, void *dx, mixprec_dtype dxd,
                                 int64_t n, int64_t stride, int64_t width,
                                 int log);
/* Per column j: mx[j] = max_c x_c, se[j] = sum_c exp(x_c - mx[j]) and, if
 * wx is not NULL, wx[j] = sum_c w_c * (x_c - mx[j]) (w_c = 1 without
 * weight). */
void mixprec__ce_stats_scalar(const void *x, mixprec_dtype xd, int64_t n,
                              int64_t stride, int64_t width,
                              const float *weight, float *mx, float *se,
                              float *wx);
/* Per column j: dx_c = a[j] * exp((x_c - mx[j]) - lg[j]) - b[j] * w_c,
 * minus bt[j] where c == tc[j] (the target; -1 for an ignored position). */
void mixprec__ce_grad_scalar(const void *x, mixprec_dtype xd, void *dx,
                             int64_t n, int64_t stride, int64_t width,
                             const float *mx, const float *lg, const float *a,
                             const float *b, const float *weight, const int32_t *tc,
                             const float *bt);
#if defined(MIXPREC_X86)
void mixprec__softmax_fwd_avx2(const void *x, mixprec_dtype xd, void *y,
                               mixprec_dtype yd, int64_t n, int64_t stride,
                               int64_t width, int log, float *scratch);
void mixprec__softmax_bwd_avx2(const void *dy, const void *y, mixprec_dtype yd,
                               void *dx, mixprec_dtype dxd, int64_t n,
                               int64_t stride, int64_t width, int log);
#endif

/* ---- Scalar path --------------------------------------------------------- */

MIXPREC__INLINE float ld(const void *p, mixprec_dtype d, int64_t i) {
  switch (d) {
    case MIXPREC_F16: return mixprec__f16_to_f32(((const uint16_t *)p)[i]);
    case MIXPREC_BF16: return mixprec__bf16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
  }
}

MIXPREC__INLINE void st(void *p, mixprec_dtype d, int64_t i, float v) {
  switch (d) {
    case MIXPREC_F16: ((uint16_t *)p)[i] = mixprec__f32_to_f16(v); break;
    case MIXPREC_BF16: ((uint16_t *)p)[i] = mixprec__f32_to_bf16(v); break;
    default: ((float *)p)[i] = v; break;
  }
}

/* The scalar path sums in double: it is the reference-like fallback, and a
 * long row summed in one float would lose more than the AVX2 path's lanes. */
void mixprec__softmax_fwd_scalar(const void *x, mixprec_dtype xd, void *y,
                                 mixprec_dtype yd, int64_t n, int64_t stride,
                                 int64_t width, int log, float *scratch) {
  (void)scratch;
  float m[MIXPREC__SM_WIDTH], f[MIXPREC__SM_WIDTH];
  double s[MIXPREC__SM_WIDTH];
  for (int64_t j = 0; j < width; j++) {
    m[j] = -INFINITY;
    s[j] = 0.0;
  }
  for (int64_t c = 0; c < n; c++)
    for (int64_t j = 0; j < width; j++) {
      float v = ld(x, xd, c * stride + j);
      /* A NaN never becomes the max, but it makes the sum NaN below. */
      if (v > m[j]) m[j] = v;
    }
  for (int64_t c = 0; c < n; c++)
    for (int64_t j = 0; j < width; j++) s[j] += (double)expf(ld(x, xd, c * stride + j) - m[j]);
  for (int64_t j = 0; j < width; j++) f[j] = log ? logf((float)s[j]) : 1.0f / (float)s[j];
  for (int64_t c = 0; c < n; c++)
    for (int64_t j = 0; j < width; j++) {
      const int64_t i = c * stride + j;
      const float d = ld(x, xd, i) - m[j];
      st(y, yd, i, log ? d - f[j] : expf(d) * f[j]);
    }
}

void mixprec__softmax_bwd_scalar(const void *dy, const void *y,
                                 mixprec_dtype yd, void *dx, mixprec_dtype dxd,
                                 int64_t n, int64_t stride, int64_t width,
                                 int log) {
  double s[MIXPREC__SM_WIDTH];
  float f[MIXPREC__SM_WIDTH];
  for (int64_t j = 0; j < width; j++) s[j] = 0.0;
  for (int64_t c = 0; c < n; c++)
    for (int64_t j = 0; j < width; j++) {
      const int64_t i = c * stride + j;
      const float g = ld(dy, yd, i);
      s[j] += log ? (double)g : (double)(g * ld(y, yd, i));
    }
  for (int64_t j = 0; j < width; j++) f[j] = (float)s[j];
  for (int64_t c = 0; c < n; c++)
    for (int64_t j = 0; j < width; j++) {
      const int64_t i = c * stride + j;
      const float g = ld(dy, yd, i), o = ld(y, yd, i);
      st(dx, dxd, i, log ? g - expf(o) * f[j] : o * (g - f[j]));
    }
}

void mixprec__ce_stats_scalar(const void *x, mixprec_dtype xd, int64_t n,
                              int64_t stride, int64_t width,
                              const float *weight, float *mx, float *se,
                              float *wx) {
  double s[MIXPREC__SM_WIDTH], w[MIXPREC__SM_WIDTH];
  for (int64_t j = 0; j < width; j++) {
    mx[j] = -INFINITY;
    s[j] = w[j] = 0.0;
  }
  for (int64_t c = 0; c < n; c++)
    for (int64_t j = 0; j < width; j++) {
      float v = ld(x, xd, c * stride + j);
      if (v > mx[j]) mx[j] = v;
    }
  for (int64_t c = 0; c < n; c++) {
    const float wc = weight ? weight[c] : 1.0f;
    for (int64_t j = 0; j < width; j++) {
      const float d = ld(x, xd, c * stride + j) - mx[j];
      s[j] += (double)expf(d);
      if (wx) w[j] += (double)(wc * d);
    }
  }
  for (int64_t j = 0; j < width; j++) {
    se[j] = (float)s[j];
    if (wx) wx[j] = (float)w[j];
  }
}

void mixprec__ce_grad_scalar(const void *x, mixprec_dtype xd, void *dx,
                             int64_t n, int64_t stride, int64_t width,
                             const float *mx, const float *lg, const float *a,
                             const float *b, const float *weight, const int32_t *tc,
                             const float *bt) {
  for (int64_t c = 0; c < n; c++) {
    const float wc = weight ? weight[c] : 1.0f;
    for (int64_t j = 0; j < width; j++) {
      const int64_t i = c * stride + j;
      float v = a[j] * expf((ld(x, xd, i) - mx[j]) - lg[j]) - b[j] * wc;
      if (c == tc[j]) v -= bt[j];
      st(dx, xd, i, v);
    }
  }
}

/* ---- Dispatch ------------------------------------------------------------ */

typedef void (*fwd_fn)(const void *, mixprec_dtype, void *, mixprec_dtype,
                       int64_t, int64_t, int64_t, int, float *);
typedef void (*bwd_fn)(const void *, const void *, mixprec_dtype, void *,
                       mixprec_dtype, int64_t, int64_t, int64_t, int);

static int use_avx2(void) {
#if defined(MIXPREC_X86)
  /* The AVX-512 path, where chosen, runs the AVX2 kernels. */
  return mixprec__active_isa() != MIXPREC_ISA_SCALAR;
#else
  return 0;
#endif
}

static mixprec_status check_shape(mixprec_dtype a, mixprec_dtype b, int64_t outer,
                                  int64_t n, int64_t inner, int64_t *numel) {
  if (mixprec_dtype_size(a) == 0 || mixprec_dtype_size(b) == 0) return MIXPREC_ERR_BAD_DTYPE;
  if (outer < 0 || n < 0 || inner < 0) return MIXPREC_ERR_BAD_SIZE;
  *numel = 0;
  if (outer == 0 || n == 0 || inner == 0) return MIXPREC_OK;
  if (n > INT64_MAX / inner || outer > INT64_MAX / (n * inner)) return MIXPREC_ERR_BAD_SIZE;
  *numel = outer * n * inner;
  return MIXPREC_OK;
}

/* Slices of the (outer, n, inner) array: rows when inner == 1, else blocks
 * of MIXPREC__SM_WIDTH columns. */
MIXPREC__INLINE int64_t slice_count(int64_t outer, int64_t inner) {
  return inner == 1 ? outer : outer * ((inner + MIXPREC__SM_WIDTH - 1) / MIXPREC__SM_WIDTH);
}

MIXPREC__INLINE int chunk_slices(int64_t numel, int64_t slices) {
  const int64_t per = numel / (slices > 0 ? slices : 1);
  const int64_t c = CHUNK_ELEMS / (per > 0 ? per : 1);
  return c < 1 ? 1 : c > 4096 ? 4096 : (int)c;
}

/* Element offset and width of slice t. */
MIXPREC__INLINE int64_t slice_at(int64_t t, int64_t n, int64_t inner, int64_t *width) {
  if (inner == 1) {
    *width = 1;
    return t * n;
  }
  const int64_t blocks = (inner + MIXPREC__SM_WIDTH - 1) / MIXPREC__SM_WIDTH;
  const int64_t o = t / blocks, b = t % blocks;
  const int64_t col = b * MIXPREC__SM_WIDTH;
  *width = inner - col < MIXPREC__SM_WIDTH ? inner - col : MIXPREC__SM_WIDTH;
  return o * n * inner + col;
}

static mixprec_status softmax_fwd(const void *x, mixprec_dtype xd, void *y,
                                  mixprec_dtype yd, int64_t outer, int64_t n,
                                  int64_t inner, int log) {
  int64_t numel;
  mixprec_status status = check_shape(xd, yd, outer, n, inner, &numel);
  if (status != MIXPREC_OK || numel == 0) return status;
  if (!x || !y) return MIXPREC_ERR_NULL_POINTER;
  const int avx2 = use_avx2();
  fwd_fn fn = mixprec__softmax_fwd_scalar;
#if defined(MIXPREC_X86)
  if (avx2) fn = mixprec__softmax_fwd_avx2;
#endif
  const int64_t slices = slice_count(outer, inner);
  const int n_threads = numel < PARALLEL_MIN ? 1 : mixprec__num_threads();
  const int chunk = chunk_slices(numel, slices);
  /* The AVX2 row kernel keeps exp(x - max) of its row in float scratch
   * (n floats per thread, L2-resident for rows up to ~100k). */
  float *scratch = NULL;
  const int64_t per_thread = (avx2 && inner == 1) ? n : 0;
  if (per_thread > 0) {
    scratch = (float *)malloc(sizeof(float) * (size_t)per_thread * (size_t)n_threads);
    if (!scratch) return MIXPREC_ERR_OUT_OF_MEMORY;
  }
  const size_t xs = (size_t)mixprec_dtype_size(xd), ys = (size_t)mixprec_dtype_size(yd);
#pragma omp parallel num_threads(n_threads) if (n_threads > 1)
  {
    int tid = 0;
#ifdef _OPENMP
    tid = omp_get_thread_num();
#endif
    float *mine = scratch ? scratch + (size_t)tid * (size_t)per_thread : NULL;
#pragma omp for schedule(dynamic, chunk)
    for (int64_t t = 0; t < slices; t++) {
      int64_t width;
      const int64_t off = slice_at(t, n, inner, &width);
      fn((const char *)x + (size_t)off * xs, xd, (char *)y + (size_t)off * ys, yd, n, inner,
         width, log, mine);
    }
  }
  free(scratch);
  return MIXPREC_OK;
}

static mixprec_status softmax_bwd(const void *dy, const void *y, mixprec_dtype yd,
                                  void *dx, mixprec_dtype dxd, int64_t outer,
                                  int64_t n, int64_t inner, int log) {
  int64_t numel;
  mixprec_status status = check_shape(yd, dxd, outer, n, inner, &numel);
  if (status != MIXPREC_OK || numel == 0) return status;
  if (!dy || !y || !dx) return MIXPREC_ERR_NULL_POINTER;
  bwd_fn fn = mixprec__softmax_bwd_scalar;
#if defined(MIXPREC_X86)
  if (use_avx2()) fn = mixprec__softmax_bwd_avx2;
#endif
  const int64_t slices = slice_count(outer, inner);
  const int n_threads = numel < PARALLEL_MIN ? 1 : mixprec__num_threads();
  const int chunk = chunk_slices(numel, slices);
  const size_t ys = (size_t)mixprec_dtype_size(yd), xs = (size_t)mixprec_dtype_size(dxd);
#pragma omp parallel for schedule(dynamic, chunk) num_threads(n_threads) if (n_threads > 1)
  for (int64_t t = 0; t < slices; t++) {
    int64_t width;
    const int64_t off = slice_at(t, n, inner, &width);
    fn((const char *)dy + (size_t)off * ys, (const char *)y + (size_t)off * ys, yd,
       (char *)dx + (size_t)off * xs, dxd, n, inner, width, log);
  }
  return MIXPREC_OK;
}

mixprec_status mixprec_softmax(const void *x, mixprec_dtype x_dtype, void *y,
                               mixprec_dtype y_dtype, int64_t outer, int64_t n,
                               int64_t inner) {
  return softmax_fwd(x, x_dtype, y, y_dtype, outer, n, inner, 0);
}

mixprec_status mixprec_log_softmax(const void *x, mixprec_dtype x_dtype, void *y,
                                   mixprec_dtype y_dtype, int64_t outer,
                                   int64_t n, int64_t inner) {
  return softmax_fwd(x, x_dtype, y, y_dtype, outer, n, inner, 1);
}

mixprec_status mixprec_softmax_backward(const void *dy, const void *y,
                                        mixprec_dtype y_dtype, void *dx,
                                        mixprec_dtype dx_dtype, int64_t outer,
                                        int64_t n, int64_t inner) {
  return softmax_bwd(dy, y, y_dtype, dx, dx_dtype, outer, n, inner, 0);
}

mixprec_status mixprec_log_softmax_backward(const void *dy, const void *y,
                                            mixprec_dtype y_dtype, void *dx,
                                            mixprec_dtype dx_dtype,
                                            int64_t outer, int64_t n,
                                            int64_t inner) {
  return softmax_bwd(dy, y, y_dtype, dx, dx_dtype, outer, n, inner, 1);
}
