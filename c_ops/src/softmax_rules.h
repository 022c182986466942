/* The per-element steps of softmax and log_softmax, one MIXPREC__HD function
 * each, called by the scalar CPU kernels (softmax.c, and cross_entropy's in
 * softmax.c / cross_entropy.c) and the CUDA kernels (kernels/softmax.cu,
 * kernels/cross_entropy.cu, softmax.cuh) alike, so the CPU tests run the
 * formulas the GPU runs. The AVX2 kernels apply the same formulas to eight
 * lanes at once (their own exp8, so their bits are their own). Internal;
 * depends only on compiler.h and math.h.
 *
 * [note: softmax steps] Over one row x_0..x_{n-1}:
 *   m = max_c x_c                 (mixprec__sm_max_step; a NaN never wins)
 *   s = sum_c exp(x_c - m)        (mixprec__sm_exp_term; a NaN makes it NaN)
 *   f = log ? log(s) : 1 / s      (mixprec__sm_factor)
 *   y_c = log ? (x_c - m) - f : exp(x_c - m) * f          (mixprec__sm_out)
 * and backward, from the forward's output y and the incoming gradient g:
 *   s = sum_c (log ? g_c : g_c * y_c)                (mixprec__sm_bwd_term)
 *   dx_c = log ? g_c - exp(y_c) * s : y_c * (g_c - s)  (mixprec__sm_bwd_out)
 * The CPU makes the two forward passes (and adds s in double on the scalar
 * path); the GPU folds the first two into one online (max, sum) pass
 * (softmax.cuh) built from the same two steps. */
#ifndef MIXPREC_SOFTMAX_RULES_H
#define MIXPREC_SOFTMAX_RULES_H

#include <math.h>

#include "compiler.h"

MIXPREC__HD float mixprec__sm_max_step(float m, float v) { return v > m ? v : m; }

MIXPREC__HD float mixprec__sm_exp_term(float v, float m) { return expf(v - m); }

MIXPREC__HD float mixprec__sm_factor(float s, int is_log) { return is_log ? logf(s) : 1.0f / s; }

/* d = x_c - m. */
MIXPREC__HD float mixprec__sm_out(float d, float f, int is_log) { return is_log ? d - f : expf(d) * f; }

MIXPREC__HD float mixprec__sm_bwd_term(float g, float y, int is_log) { return is_log ? g : g * y; }

MIXPREC__HD float mixprec__sm_bwd_out(float g, float y, float s, int is_log) {
  return is_log ? g - expf(y) * s : y * (g - s);
}

#endif /* MIXPREC_SOFTMAX_RULES_H */
