/* Cross-entropy with class-index targets (torch.nn.functional.cross_entropy
 * semantics: weight, ignore_index, label_smoothing, reduction), forward and
 * backward, from FP32/FP16/BF16 logits without an FP32 copy of them.
 *
 * Forward reads the logits twice per slice (max, then sum of exponentials
 * and the weighted sum that label smoothing needs; the second read comes
 * from cache) and writes a few floats per position: the loss (reduction
 * none) and the max and log-sum that backward needs. Backward reads the logits once
 * and writes the gradient in their dtype. Slices are those of softmax.c. */
#include <math.h>
#include <stdlib.h>

#include "cross_entropy_check.h"
#include "cross_entropy_rules.h"
#include "softmax_internal.h"

#include "softmax_rules.h"

typedef void (*stats_fn)(const void *, mixprec_dtype, int64_t, int64_t, int64_t,
                         const float *, float *, float *, float *);
typedef void (*grad_fn)(const void *, mixprec_dtype, void *, int64_t, int64_t, int64_t,
                        const float *, const float *, const float *, const float *,
                        const float *, const int32_t *, const float *);

/* W = sum of the class weights (C without weight), for label smoothing. */
static double class_weight_sum(const float *weight, int64_t n) {
  if (!weight) return (double)n;
  double w = 0.0;
  for (int64_t c = 0; c < n; c++) w += (double)weight[c];
  return w;
}

/* Room for `per` partial sums (double) per slice, added in slice order after
 * the parallel loop, so a reduction does not depend on the thread count.
 * *part stays NULL for no slices. */
static mixprec_status alloc_parts(int64_t slices, int per, double **part) {
  *part = NULL;
  if (slices == 0) return MIXPREC_OK;
  *part = (double *)malloc(sizeof(double) * (size_t)per * (size_t)slices);
  return *part ? MIXPREC_OK : MIXPREC_ERR_OUT_OF_MEMORY;
}

mixprec_cross_entropy_params mixprec_cross_entropy_params_default(void) {
  mixprec_cross_entropy_params p;
  p.outer = p.classes = p.inner = 0;
  p.ignore_index = -100;
  p.label_smoothing = 0.0;
  p.reduction = MIXPREC_REDUCTION_MEAN;
  p.weight = NULL;
  return p;
}

/* Argument and target checks shared by forward and backward (the CUDA
 * entry points share the first part, cross_entropy_check.h); *positions receives
 * outer * inner. */
static mixprec_status check(const void *logits, mixprec_dtype dtype, const int64_t *target,
                            const mixprec_cross_entropy_params *p, int64_t *positions) {
  const mixprec_status st = mixprec__ce_check(logits, dtype, target, p, positions);
  if (st != MIXPREC_OK || *positions == 0) return st;
  int bad = 0;
  for (int64_t i = 0; i < *positions; i++) {
    const int64_t t = target[i];
    bad |= t != p->ignore_index && (t < 0 || t >= p->classes);
  }
  return bad ? MIXPREC_ERR_BAD_ARGUMENT : MIXPREC_OK;
}

mixprec_status mixprec_cross_entropy(const void *logits, mixprec_dtype dtype,
                                     const int64_t *target,
                                     const mixprec_cross_entropy_params *p,
                                     float *loss, float *stats, float *weight_sum) {
  int64_t positions;
  mixprec_status status = check(logits, dtype, target, p, &positions);
  if (status != MIXPREC_OK) return status;
  if (!loss && (positions > 0 || p->reduction != MIXPREC_REDUCTION_NONE))
    return MIXPREC_ERR_NULL_POINTER;
  const int64_t n = p->classes, inner = p->inner;
  const float *weight = p->weight;
  const double eps = p->label_smoothing;
  const int smooth = eps > 0.0;
  const double wsum_all = class_weight_sum(weight, n);
  const stats_fn fn = MIXPREC__SM_KERNEL(ce_stats);
  const mixprec__sm_plan plan = mixprec__sm_plan_of(p->outer, inner, positions * n);
  const int64_t slices = plan.slices;
  /* Per slice: sum of losses and of target weights. */
  double *part;
  if (alloc_parts(slices, 2, &part) != MIXPREC_OK) return MIXPREC_ERR_OUT_OF_MEMORY;
  const size_t es = (size_t)mixprec_dtype_size(dtype);
#pragma omp parallel for schedule(dynamic, plan.chunk) num_threads(plan.n_threads) if (plan.n_threads > 1)
  for (int64_t t = 0; t < slices; t++) {
    int64_t width, pos;
    const int64_t off = mixprec__sm_slice_at(t, n, inner, &width, &pos);
    const char *x = (const char *)logits + (size_t)off * es;
    float mx[MIXPREC__SM_WIDTH], se[MIXPREC__SM_WIDTH], wx[MIXPREC__SM_WIDTH];
    fn(x, dtype, n, inner, width, weight, mx, se, smooth ? wx : NULL);
    double sl = 0.0, sw = 0.0;
    for (int64_t j = 0; j < width; j++) {
      const int64_t tg = target[pos + j];
      float l = 0.0f, m = 0.0f, lg = 0.0f;
      if (tg != p->ignore_index) {
        const float wt = weight ? weight[tg] : 1.0f;
        m = mx[j];
        lg = logf(se[j]);
        const float nll = mixprec__ce_nll(mixprec__load_f32(x, dtype, tg * inner + j), mx[j], lg);
        const double v = mixprec__ce_position_loss(nll, wt, eps, wsum_all, lg, smooth ? wx[j] : 0.0f, n);
        l = (float)v;
        sl += v;
        sw += (double)wt;
      }
      if (p->reduction == MIXPREC_REDUCTION_NONE) loss[pos + j] = l;
      if (stats) {
        stats[pos + j] = m;
        stats[positions + pos + j] = lg;
      }
    }
    part[2 * t] = sl;
    part[2 * t + 1] = sw;
  }
  double total = 0.0, wtotal = 0.0;
  for (int64_t t = 0; t < slices; t++) {
    total += part[2 * t];
    wtotal += part[2 * t + 1];
  }
  free(part);
  if (p->reduction == MIXPREC_REDUCTION_SUM) loss[0] = (float)total;
  /* All positions ignored: 0 / 0 = NaN, as torch's mean. */
  if (p->reduction == MIXPREC_REDUCTION_MEAN) loss[0] = (float)(total / wtotal);
  if (weight_sum) weight_sum[0] = (float)wtotal;
  return MIXPREC_OK;
}

mixprec_status mixprec_cross_entropy_backward(const float *grad_loss, const void *logits,
                                              mixprec_dtype dtype, const int64_t *target,
                                              const mixprec_cross_entropy_params *p,
                                              const float *stats, const float *weight_sum,
                                              void *grad_logits) {
  int64_t positions;
  mixprec_status status = check(logits, dtype, target, p, &positions);
  if (status != MIXPREC_OK || positions == 0) return status;
  if (!grad_loss || !stats || !grad_logits) return MIXPREC_ERR_NULL_POINTER;
  if (p->reduction == MIXPREC_REDUCTION_MEAN && !weight_sum) return MIXPREC_ERR_NULL_POINTER;
  const int64_t n = p->classes, inner = p->inner;
  const float *weight = p->weight;
  const double eps = p->label_smoothing;
  const double wsum_all = class_weight_sum(weight, n);
  /* The gradient of a SUM/MEAN loss is the same for every position. */
  float g_all = 0.0f;
  if (p->reduction == MIXPREC_REDUCTION_SUM) g_all = grad_loss[0];
  if (p->reduction == MIXPREC_REDUCTION_MEAN) g_all = grad_loss[0] / weight_sum[0];
  const grad_fn fn = MIXPREC__SM_KERNEL(ce_grad);
  const mixprec__sm_plan plan = mixprec__sm_plan_of(p->outer, inner, positions * n);
  const size_t es = (size_t)mixprec_dtype_size(dtype);
#pragma omp parallel for schedule(dynamic, plan.chunk) num_threads(plan.n_threads) if (plan.n_threads > 1)
  for (int64_t t = 0; t < plan.slices; t++) {
    int64_t width, pos;
    const int64_t off = mixprec__sm_slice_at(t, n, inner, &width, &pos);
    const char *x = (const char *)logits + (size_t)off * es;
    char *dx = (char *)grad_logits + (size_t)off * es;
    float m[MIXPREC__SM_WIDTH], l[MIXPREC__SM_WIDTH], a[MIXPREC__SM_WIDTH], b[MIXPREC__SM_WIDTH];
    float bt[MIXPREC__SM_WIDTH];
    int32_t tc[MIXPREC__SM_WIDTH];
    for (int64_t j = 0; j < width; j++) {
      const int64_t tg = target[pos + j];
      if (tg == p->ignore_index) {
        /* exp(x - inf) = 0: the whole slice of this position becomes 0. */
        m[j] = INFINITY;
        l[j] = 0.0f;
        a[j] = b[j] = bt[j] = 0.0f;
        tc[j] = -1;
        continue;
      }
      const float g = p->reduction == MIXPREC_REDUCTION_NONE ? grad_loss[pos + j] : g_all;
      const double wt = weight ? (double)weight[tg] : 1.0;
      m[j] = stats[pos + j];
      l[j] = stats[positions + pos + j];
      const mixprec__ce_coefs k = mixprec__ce_grad_coefs(g, wt, eps, wsum_all, n);
      a[j] = k.a;
      b[j] = k.b;
      bt[j] = k.t;
      tc[j] = (int32_t)tg;
    }
    fn(x, dtype, dx, n, inner, width, m, l, a, b, weight, tc, bt);
  }
  return MIXPREC_OK;
}

/* ---- class-probability (soft) targets ------------------------------------- */

typedef void (*soft_stats_fn)(const void *, mixprec_dtype, const void *, mixprec_dtype, int64_t,
                              int64_t, int64_t, const float *, float, float, float *, float *,
                              float *, float *);
typedef void (*soft_grad_fn)(const void *, mixprec_dtype, const void *, mixprec_dtype, void *,
                             void *, int64_t, int64_t, int64_t, const float *, const float *,
                             const float *, const float *, const float *, const float *, float,
                             float);

void mixprec__ce_soft_stats_scalar(const void *x, mixprec_dtype xd, const void *t,
                                   mixprec_dtype td, int64_t n, int64_t stride, int64_t width,
                                   const float *weight, float keep, float add, float *mx,
                                   float *se, float *tw, float *twx) {
  double s[MIXPREC__SM_WIDTH], a[MIXPREC__SM_WIDTH], b[MIXPREC__SM_WIDTH];
  for (int64_t j = 0; j < width; j++) {
    mx[j] = -INFINITY;
    s[j] = a[j] = b[j] = 0.0;
  }
  for (int64_t c = 0; c < n; c++)
    for (int64_t j = 0; j < width; j++) mx[j] = mixprec__sm_max_step(mx[j], mixprec__load_f32(x, xd, c * stride + j));
  for (int64_t c = 0; c < n; c++) {
    const float wc = weight ? weight[c] : 1.0f;
    for (int64_t j = 0; j < width; j++) {
      const int64_t i = c * stride + j;
      const float v = mixprec__load_f32(x, xd, i), d = v - mx[j];
      const float wt = mixprec__ce_soft_weight(wc, mixprec__load_f32(t, td, i), keep, add);
      s[j] += (double)mixprec__sm_exp_term(v, mx[j]);
      a[j] += (double)wt;
      b[j] += (double)wt * (double)d;
    }
  }
  for (int64_t j = 0; j < width; j++) {
    se[j] = (float)s[j];
    tw[j] = (float)a[j];
    twx[j] = (float)b[j];
  }
}

void mixprec__ce_soft_grad_scalar(const void *x, mixprec_dtype xd, const void *t,
                                  mixprec_dtype td, void *dx, void *dt, int64_t n, int64_t stride,
                                  int64_t width, const float *mx, const float *lg, const float *a,
                                  const float *g, const float *cdt, const float *weight,
                                  float keep, float add) {
  for (int64_t c = 0; c < n; c++) {
    const float wc = weight ? weight[c] : 1.0f;
    for (int64_t j = 0; j < width; j++) {
      const int64_t i = c * stride + j;
      const float lp = mixprec__ce_log_prob(mixprec__load_f32(x, xd, i), mx[j], lg[j]);
      if (dx) {
        const float wt = mixprec__ce_soft_weight(wc, mixprec__load_f32(t, td, i), keep, add);
        mixprec__store_f32(dx, xd, i, mixprec__ce_soft_grad_elem(a[j], lp, g[j], wt));
      }
      if (dt) mixprec__store_f32(dt, td, i, mixprec__ce_soft_target_grad(cdt[j], wc, lp));
    }
  }
}

mixprec_status mixprec_cross_entropy_soft(const void *logits, mixprec_dtype dtype,
                                          const void *target, mixprec_dtype target_dtype,
                                          const mixprec_cross_entropy_params *p, float *loss,
                                          float *stats) {
  int64_t positions;
  mixprec_status status = mixprec__ce_soft_check(logits, dtype, target, target_dtype, p, &positions);
  if (status != MIXPREC_OK) return status;
  if (!loss && (positions > 0 || p->reduction != MIXPREC_REDUCTION_NONE))
    return MIXPREC_ERR_NULL_POINTER;
  const int64_t n = p->classes, inner = p->inner;
  /* t' = t * (1 - eps) + eps / C in float, as torch's FP32 expression. */
  const float keep = (float)(1.0 - p->label_smoothing);
  const float add = n > 0 ? (float)(p->label_smoothing / (double)n) : 0.0f;
  const soft_stats_fn fn = MIXPREC__SM_KERNEL(ce_soft_stats);
  const mixprec__sm_plan plan = mixprec__sm_plan_of(p->outer, inner, positions * n);
  const int64_t slices = plan.slices;
  /* Per-slice loss sums. */
  double *part;
  if (alloc_parts(slices, 1, &part) != MIXPREC_OK) return MIXPREC_ERR_OUT_OF_MEMORY;
  const size_t es = (size_t)mixprec_dtype_size(dtype), ts = (size_t)mixprec_dtype_size(target_dtype);
#pragma omp parallel for schedule(dynamic, plan.chunk) num_threads(plan.n_threads) if (plan.n_threads > 1)
  for (int64_t t = 0; t < slices; t++) {
    int64_t width, pos;
    const int64_t off = mixprec__sm_slice_at(t, n, inner, &width, &pos);
    float mx[MIXPREC__SM_WIDTH], se[MIXPREC__SM_WIDTH], tw[MIXPREC__SM_WIDTH], twx[MIXPREC__SM_WIDTH];
    fn((const char *)logits + (size_t)off * es, dtype, (const char *)target + (size_t)off * ts,
       target_dtype, n, inner, width, p->weight, keep, add, mx, se, tw, twx);
    double sl = 0.0;
    for (int64_t j = 0; j < width; j++) {
      const float lg = logf(se[j]);
      const double v = mixprec__ce_soft_loss(tw[j], lg, twx[j]); /* [note: soft cross-entropy] */
      sl += v;
      if (p->reduction == MIXPREC_REDUCTION_NONE) loss[pos + j] = (float)v;
      if (stats) {
        stats[pos + j] = mx[j];
        stats[positions + pos + j] = lg;
        stats[2 * positions + pos + j] = tw[j];
      }
    }
    part[t] = sl;
  }
  double total = 0.0;
  for (int64_t t = 0; t < slices; t++) total += part[t];
  free(part);
  if (p->reduction == MIXPREC_REDUCTION_SUM) loss[0] = (float)total;
  /* torch divides by the number of positions; none: 0 / 0 = NaN. */
  if (p->reduction == MIXPREC_REDUCTION_MEAN) loss[0] = (float)(total / (double)positions);
  return MIXPREC_OK;
}

mixprec_status mixprec_cross_entropy_soft_backward(const float *grad_loss, const void *logits,
                                                   mixprec_dtype dtype, const void *target,
                                                   mixprec_dtype target_dtype,
                                                   const mixprec_cross_entropy_params *p,
                                                   const float *stats, void *grad_logits,
                                                   void *grad_target) {
  int64_t positions;
  mixprec_status status = mixprec__ce_soft_check(logits, dtype, target, target_dtype, p, &positions);
  if (status != MIXPREC_OK || positions == 0 || (!grad_logits && !grad_target)) return status;
  if (!grad_loss || !stats) return MIXPREC_ERR_NULL_POINTER;
  const int64_t n = p->classes, inner = p->inner;
  const double keep_d = 1.0 - p->label_smoothing;
  const float keep = (float)keep_d;
  const float add = (float)(p->label_smoothing / (double)n);
  float g_all = 0.0f;
  if (p->reduction == MIXPREC_REDUCTION_SUM) g_all = grad_loss[0];
  if (p->reduction == MIXPREC_REDUCTION_MEAN) g_all = mixprec__ce_soft_mean_grad(grad_loss[0], positions);
  const soft_grad_fn fn = MIXPREC__SM_KERNEL(ce_soft_grad);
  const mixprec__sm_plan plan = mixprec__sm_plan_of(p->outer, inner, positions * n);
  const size_t es = (size_t)mixprec_dtype_size(dtype), ts = (size_t)mixprec_dtype_size(target_dtype);
#pragma omp parallel for schedule(dynamic, plan.chunk) num_threads(plan.n_threads) if (plan.n_threads > 1)
  for (int64_t t = 0; t < plan.slices; t++) {
    int64_t width, pos;
    const int64_t off = mixprec__sm_slice_at(t, n, inner, &width, &pos);
    float m[MIXPREC__SM_WIDTH], l[MIXPREC__SM_WIDTH], a[MIXPREC__SM_WIDTH], g[MIXPREC__SM_WIDTH];
    float cdt[MIXPREC__SM_WIDTH];
    for (int64_t j = 0; j < width; j++) {
      const float gj = p->reduction == MIXPREC_REDUCTION_NONE ? grad_loss[pos + j] : g_all;
      const mixprec__ce_soft_coefs k = mixprec__ce_soft_grad_coefs(gj, stats[2 * positions + pos + j], keep_d);
      m[j] = stats[pos + j];
      l[j] = stats[positions + pos + j];
      a[j] = k.a;
      g[j] = gj;
      cdt[j] = k.dt;
    }
    fn((const char *)logits + (size_t)off * es, dtype, (const char *)target + (size_t)off * ts,
       target_dtype, grad_logits ? (char *)grad_logits + (size_t)off * es : NULL,
       grad_target ? (char *)grad_target + (size_t)off * ts : NULL, n, inner, width, m, l, a, g,
       cdt, p->weight, keep, add);
  }
  return MIXPREC_OK;
}
