/* AVX2 + FMA + F16C body kernel of the SGD step (sgd.c). Compiled with
 * -mavx2 -mfma -mf16c, called only when the CPU has them. It runs the
 * formulas of torch's vectorised body (see sgd.c) 8 lanes at a time with the
 * same operations in the same order: _mm256_fmadd_ps exactly where the
 * scalar body calls fmaf, separate multiplies elsewhere (the project builds
 * with -ffp-contract=off), the same float constants, so the results are
 * bit-identical to the scalar body. The tail elements of a tensor (the last
 * numel % 8) never come here. */
#include "optim_common.h"

/* One dtype combination; pd, gd and sr (master-free BF16: read the param,
 * round stochastically) are constants at each call. */
MIXPREC__INLINE int64_t body(const mixprec_opt_tensor *t, int64_t begin, int64_t end, int first,
                             uint32_t sr_key, const mixprec__sgd_consts *k,
                             const mixprec_dtype pd, const mixprec_dtype gd, const int sr) {
  const int half = pd != MIXPREC_F32;
  float *P = half ? t->master : (float *)t->param;
  float *B = t->exp_avg;
  const __m256 scale = _mm256_set1_ps(k->scale), wd = _mm256_set1_ps(k->wd);
  const __m256 momentum = _mm256_set1_ps(k->momentum), damp1 = _mm256_set1_ps(k->damp1);
  const __m256 lr = _mm256_set1_ps(k->lr);
  const int has_scale = k->has_scale, maximize = k->maximize, wd_on = k->wd_on;
  const int momentum_on = k->momentum_on, nesterov = k->nesterov;
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    __m256 g = mixprec__opt_load8(t->grad, gd, i);
    if (has_scale) g = _mm256_div_ps(g, scale);
    if (maximize) g = mixprec__opt_neg8(g);
    __m256 p = sr ? mixprec__opt_load8(t->param, MIXPREC_BF16, i) : _mm256_loadu_ps(P + i);
    if (wd_on) g = _mm256_fmadd_ps(p, wd, g);
    if (momentum_on) {
      __m256 buf;
      if (first)
        buf = g;
      else
        buf = _mm256_fmadd_ps(damp1, g, _mm256_mul_ps(_mm256_loadu_ps(B + i), momentum));
      _mm256_storeu_ps(B + i, buf);
      g = nesterov ? _mm256_fmadd_ps(buf, momentum, g) : buf;
    }
    p = _mm256_fmadd_ps(mixprec__opt_neg8(g), lr, p);
    if (sr) {
      mixprec__opt_store8_bf16_sr(t->param, i, sr_key, p);
    } else {
      _mm256_storeu_ps(P + i, p);
      if (half) mixprec__opt_store8_half(t->param, pd, i, p);
    }
  }
  return i;
}

#define MIXPREC__SGD_GD(pd, sr)                                                          \
  switch (t->grad_dtype) {                                                               \
    case MIXPREC_F16: return body(t, begin, end, first, sr_key, k, pd, MIXPREC_F16, sr);   \
    case MIXPREC_BF16: return body(t, begin, end, first, sr_key, k, pd, MIXPREC_BF16, sr); \
    default: return body(t, begin, end, first, sr_key, k, pd, MIXPREC_F32, sr);            \
  }

int64_t mixprec__sgd_body_avx2(const mixprec_opt_tensor *t, int64_t begin, int64_t end, int first,
                               uint32_t sr_key, const mixprec__sgd_consts *k) {
  switch (t->param_dtype) {
    case MIXPREC_F16: MIXPREC__SGD_GD(MIXPREC_F16, 0)
    case MIXPREC_BF16:
      if (mixprec__opt_is_sr(t)) {
        MIXPREC__SGD_GD(MIXPREC_BF16, 1)
      } else {
        MIXPREC__SGD_GD(MIXPREC_BF16, 0)
      }
    default: MIXPREC__SGD_GD(MIXPREC_F32, 0)
  }
}
