/* Softmax and log_softmax, forward and backward, FP32 accumulation, over
 * the middle dimension of an (outer, n, inner) array; plus the scalar slice
 * kernels that cross_entropy.c shares.
 *
 * Slices, the work hand-out and the kernel declarations: softmax_internal.h. */
#include <math.h>
#include <stdlib.h>

#include "softmax_check.h"
#include "cross_entropy_rules.h"
#include "softmax_internal.h"
#include "softmax_rules.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* ---- Scalar path --------------------------------------------------------- */

/* The scalar path sums in double: it is the reference-like fallback, and a
 * long row summed in one float would lose more than the AVX2 path's lanes.
 * The element steps: [note: softmax steps] (softmax_rules.h). */
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
    for (int64_t j = 0; j < width; j++) m[j] = mixprec__sm_max_step(m[j], mixprec__load_f32(x, xd, c * stride + j));
  for (int64_t c = 0; c < n; c++)
    for (int64_t j = 0; j < width; j++)
      s[j] += (double)mixprec__sm_exp_term(mixprec__load_f32(x, xd, c * stride + j), m[j]);
  for (int64_t j = 0; j < width; j++) f[j] = mixprec__sm_factor((float)s[j], log);
  for (int64_t c = 0; c < n; c++)
    for (int64_t j = 0; j < width; j++) {
      const int64_t i = c * stride + j;
      mixprec__store_f32(y, yd, i, mixprec__sm_out(mixprec__load_f32(x, xd, i) - m[j], f[j], log));
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
      s[j] += (double)mixprec__sm_bwd_term(mixprec__load_f32(dy, yd, i), mixprec__load_f32(y, yd, i), log);
    }
  for (int64_t j = 0; j < width; j++) f[j] = (float)s[j];
  for (int64_t c = 0; c < n; c++)
    for (int64_t j = 0; j < width; j++) {
      const int64_t i = c * stride + j;
      mixprec__store_f32(dx, dxd, i,
                         mixprec__sm_bwd_out(mixprec__load_f32(dy, yd, i), mixprec__load_f32(y, yd, i), f[j], log));
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
    for (int64_t j = 0; j < width; j++) mx[j] = mixprec__sm_max_step(mx[j], mixprec__load_f32(x, xd, c * stride + j));
  for (int64_t c = 0; c < n; c++) {
    const float wc = weight ? weight[c] : 1.0f;
    for (int64_t j = 0; j < width; j++) {
      const float v = mixprec__load_f32(x, xd, c * stride + j), d = v - mx[j];
      s[j] += (double)mixprec__sm_exp_term(v, mx[j]);
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
      const float p = mixprec__ce_prob(mixprec__load_f32(x, xd, i), mx[j], lg[j]);
      mixprec__store_f32(dx, xd, i, mixprec__ce_grad_elem(a[j], b[j], bt[j], p, wc, c == tc[j]));
    }
  }
}

/* ---- Dispatch ------------------------------------------------------------ */

static mixprec_status softmax_fwd(const void *x, mixprec_dtype xd, void *y,
                                  mixprec_dtype yd, int64_t outer, int64_t n,
                                  int64_t inner, int log) {
  int64_t numel;
  mixprec_status status = mixprec__softmax_check_shape(xd, yd, outer, n, inner, &numel);
  if (status != MIXPREC_OK || numel == 0) return status;
  if (!x || !y) return MIXPREC_ERR_NULL_POINTER;
  const int avx2 = mixprec__sm_use_avx2();
  void (*const fn)(const void *, mixprec_dtype, void *, mixprec_dtype, int64_t, int64_t, int64_t, int,
                   float *) = MIXPREC__SM_KERNEL(softmax_fwd);
  const mixprec__sm_plan plan = mixprec__sm_plan_of(outer, inner, numel);
  const int n_threads = plan.n_threads;
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
#pragma omp for schedule(dynamic, plan.chunk)
    for (int64_t t = 0; t < plan.slices; t++) {
      int64_t width;
      const int64_t off = mixprec__sm_slice_at(t, n, inner, &width, NULL);
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
  mixprec_status status = mixprec__softmax_check_shape(yd, dxd, outer, n, inner, &numel);
  if (status != MIXPREC_OK || numel == 0) return status;
  if (!dy || !y || !dx) return MIXPREC_ERR_NULL_POINTER;
  void (*const fn)(const void *, const void *, mixprec_dtype, void *, mixprec_dtype, int64_t, int64_t,
                   int64_t, int) = MIXPREC__SM_KERNEL(softmax_bwd);
  const mixprec__sm_plan plan = mixprec__sm_plan_of(outer, inner, numel);
  const size_t ys = (size_t)mixprec_dtype_size(yd), xs = (size_t)mixprec_dtype_size(dxd);
#pragma omp parallel for schedule(dynamic, plan.chunk) num_threads(plan.n_threads) if (plan.n_threads > 1)
  for (int64_t t = 0; t < plan.slices; t++) {
    int64_t width;
    const int64_t off = mixprec__sm_slice_at(t, n, inner, &width, NULL);
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
