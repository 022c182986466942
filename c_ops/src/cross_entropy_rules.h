/* The per-position rules of cross-entropy, class-index and class-probability
 * (soft) targets, one MIXPREC__HD function each, called by the CPU scalar
 * kernels (cross_entropy.c, softmax.c) and the CUDA kernels
 * (kernels/cross_entropy.cu) alike, so the CPU tests run the formulas the GPU
 * runs. Internal; depends only on compiler.h and math.h. */
#ifndef MIXPREC_CROSS_ENTROPY_RULES_H
#define MIXPREC_CROSS_ENTROPY_RULES_H

#include <math.h>
#include <stdint.h>

#include "compiler.h"

/* -log_softmax(x)_t from the target's logit xt, the position's max m and
 * lg = log(sum_c exp(x_c - m)), in float and in torch's order:
 * (x_t - max) - log(sum). */
MIXPREC__HD float mixprec__ce_log_prob(float x, float m, float lg) { return (x - m) - lg; }

MIXPREC__HD float mixprec__ce_nll(float xt, float m, float lg) { return -mixprec__ce_log_prob(xt, m, lg); }

/* softmax(x)_c = exp(log_softmax(x)_c), the p_c of the gradients below. */
MIXPREC__HD float mixprec__ce_prob(float x, float m, float lg) { return expf(mixprec__ce_log_prob(x, m, lg)); }

/* [note: cross-entropy position loss] The loss of one non-ignored position,
 * in double (the reductions add these in double):
 *   (1 - eps) * w_t * nll + eps / C * (W * lg - wx)
 * with W = sum_c w_c (C without weight) and wx = sum_c w_c * (x_c - m): the
 * smoothing term is eps / C * sum_c w_c * (lse - x_c) without forming lse.
 * Each side passes its own eps and W (the CPU's in double, the GPU's from
 * float), so each keeps its bits; the smoothing term is skipped for eps = 0. */
MIXPREC__HD double mixprec__ce_position_loss(float nll, float wt, double eps, double W, float lg,
                                             float wx, int64_t C) {
  double v = (1.0 - eps) * (double)wt * (double)nll;
  if (eps > 0.0) v += eps / (double)C * (W * (double)lg - (double)wx);
  return v;
}

/* [note: cross-entropy gradient] The gradient of the position's loss with
 * respect to logit c, from p_c = exp((x_c - m) - lg):
 *   g * ((1 - eps) * w_t + eps / C * W) * p_c - g * eps / C * w_c
 *     - [c == t] * g * (1 - eps) * w_t
 * where g is the incoming gradient of the position's loss (already divided
 * by the weight sum for MEAN). The three coefficients are computed once per
 * position in double and rounded to float; each side passes its own eps and
 * W as for the loss. */
typedef struct mixprec__ce_coefs {
  float a; /* multiplies p_c */
  float b; /* multiplies w_c */
  float t; /* subtracted at the target class */
} mixprec__ce_coefs;

MIXPREC__HD mixprec__ce_coefs mixprec__ce_grad_coefs(float g, double wt, double eps, double W, int64_t C) {
  mixprec__ce_coefs k;
  k.a = (float)((double)g * ((1.0 - eps) * wt + eps / (double)C * W));
  k.b = (float)((double)g * eps / (double)C);
  k.t = (float)((double)g * (1.0 - eps) * wt);
  return k;
}

/* One element of [note: cross-entropy gradient], in float. */
MIXPREC__HD float mixprec__ce_grad_elem(float a, float b, float t, float p, float wc, int is_target) {
  float v = a * p - b * wc;
  if (is_target) v -= t;
  return v;
}

/* [note: soft cross-entropy] Class-probability targets t (the logits'
 * layout), smoothed in float as torch's FP32 expression,
 *   t'_c = t_c * keep + add    (keep = 1 - eps, add = eps / C),
 * class weights w_c (1 without weight). Per position, with T = sum_c w_c t'_c,
 * TX = sum_c w_c t'_c (x_c - m) and lp_c = (x_c - m) - lg:
 *   loss = -sum_c w_c t'_c lp_c = T * lg - TX (in double; for a non-negative
 *          target both terms are >= 0, nothing cancels),
 *   dx_c = g T p_c - g w_c t'_c,   dt_c = -g keep w_c lp_c,
 * the two per-position coefficients g T and -g keep formed in double and
 * rounded to float. MEAN divides by the number of positions, as torch. */
MIXPREC__HD float mixprec__ce_soft_weight(float wc, float t, float keep, float add) {
  return wc * (t * keep + add);
}

MIXPREC__HD double mixprec__ce_soft_loss(float tw, float lg, float twx) {
  return (double)tw * (double)lg - (double)twx;
}

typedef struct mixprec__ce_soft_coefs {
  float a;  /* g * T: multiplies p_c */
  float dt; /* -g * keep: multiplies w_c lp_c in dt */
} mixprec__ce_soft_coefs;

MIXPREC__HD mixprec__ce_soft_coefs mixprec__ce_soft_grad_coefs(float g, float tw, double keep) {
  mixprec__ce_soft_coefs k;
  k.a = (float)((double)g * (double)tw);
  k.dt = (float)(-(double)g * keep);
  return k;
}

/* dx_c of [note: soft cross-entropy]; wt = w_c t'_c. */
MIXPREC__HD float mixprec__ce_soft_grad_elem(float a, float lp, float g, float wt) {
  return a * expf(lp) - g * wt;
}

/* dt_c of [note: soft cross-entropy]. */
MIXPREC__HD float mixprec__ce_soft_target_grad(float cdt, float wc, float lp) { return cdt * wc * lp; }

/* The gradient every position of a MEAN soft loss gets. */
MIXPREC__HD float mixprec__ce_soft_mean_grad(float grad_loss, int64_t positions) {
  return (float)((double)grad_loss / (double)positions);
}

#endif /* MIXPREC_CROSS_ENTROPY_RULES_H */
