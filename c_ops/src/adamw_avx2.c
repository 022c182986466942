/* AVX2 + FMA + F16C body kernel of the AdamW step (adamw.c). Compiled with
 * -mavx2 -mfma -mf16c, called only when the CPU has them. It runs the
 * formulas of torch's vectorised body (see adamw.c) 8 lanes at a time with
 * the same operations in the same order: _mm256_fmadd_ps exactly where the
 * scalar body calls fmaf, separate multiplies and adds elsewhere (the
 * project builds with -ffp-contract=off, so none is contracted), correctly
 * rounded sqrt and division, and the same float constants, so the results
 * are bit-identical to the scalar body. The tail elements of a tensor (the
 * last numel % 8) never come here. */
#include "optim_common.h"

/* One dtype combination; pd, gd, amsgrad and sr (master-free BF16: read the
 * param, round stochastically) are constants at each call. */
MIXPREC__INLINE int64_t body(const mixprec_opt_tensor *t, int64_t begin, int64_t end,
                             const mixprec__adamw_scalars *s, const mixprec__adamw_consts *k,
                             const mixprec_dtype pd, const mixprec_dtype gd, const int amsgrad,
                             const int sr) {
  const int half = pd != MIXPREC_F32;
  float *P = half ? t->master : (float *)t->param;
  float *M = t->exp_avg, *V = t->exp_avg_sq, *VM = t->max_exp_avg_sq;
  const __m256 scale = _mm256_set1_ps(k->scale), decay = _mm256_set1_ps(s->decay);
  const __m256 w = _mm256_set1_ps(k->w_small ? k->w : k->w_m1);
  const __m256 beta2 = _mm256_set1_ps(k->beta2), c2 = _mm256_set1_ps(k->c2);
  const __m256 eps = _mm256_set1_ps(k->eps), bc2_sqrt = _mm256_set1_ps(s->bc2_sqrt);
  const __m256 step_size = _mm256_set1_ps(s->step_size);
  const int has_scale = k->has_scale, maximize = k->maximize, decay_on = k->decay_on;
  const int w_small = k->w_small;
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    __m256 g = mixprec__opt_load8(t->grad, gd, i);
    if (has_scale) g = _mm256_div_ps(g, scale);
    if (maximize) g = mixprec__opt_neg8(g);
    __m256 p = sr ? mixprec__opt_load8(t->param, MIXPREC_BF16, i) : _mm256_loadu_ps(P + i);
    if (decay_on) p = _mm256_mul_ps(p, decay);
    __m256 m = _mm256_loadu_ps(M + i);
    const __m256 diff = _mm256_sub_ps(g, m);
    m = _mm256_fmadd_ps(w, diff, w_small ? m : g);
    const __m256 cg = _mm256_mul_ps(c2, g);
    __m256 v = _mm256_fmadd_ps(cg, g, _mm256_mul_ps(_mm256_loadu_ps(V + i), beta2));
    __m256 vd = v;
    if (amsgrad) {
      /* torch's Vectorized<float> maximum: max_ps(old, v) gives v unless
       * old > v; or'ed with the unordered compare, a NaN gives all ones. */
      const __m256 old = _mm256_loadu_ps(VM + i);
      vd = _mm256_or_ps(_mm256_max_ps(old, v), _mm256_cmp_ps(old, v, _CMP_UNORD_Q));
      _mm256_storeu_ps(VM + i, vd);
    }
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vd), bc2_sqrt), eps);
    const __m256 upd = _mm256_mul_ps(step_size, m);
    p = _mm256_sub_ps(p, _mm256_div_ps(upd, denom));
    _mm256_storeu_ps(M + i, m);
    _mm256_storeu_ps(V + i, v);
    if (sr) {
      mixprec__opt_store8_bf16_sr(t->param, i, s->sr_key, p);
    } else {
      _mm256_storeu_ps(P + i, p);
      if (half) mixprec__opt_store8_half(t->param, pd, i, p);
    }
  }
  return i;
}

#define MIXPREC__ADAMW_GD(pd, ams, sr)                                              \
  switch (t->grad_dtype) {                                                          \
    case MIXPREC_F16: return body(t, begin, end, s, k, pd, MIXPREC_F16, ams, sr);   \
    case MIXPREC_BF16: return body(t, begin, end, s, k, pd, MIXPREC_BF16, ams, sr); \
    default: return body(t, begin, end, s, k, pd, MIXPREC_F32, ams, sr);            \
  }

#define MIXPREC__ADAMW_PD(ams)                                    \
  switch (t->param_dtype) {                                       \
    case MIXPREC_F16: MIXPREC__ADAMW_GD(MIXPREC_F16, ams, 0)      \
    case MIXPREC_BF16:                                            \
      if (mixprec__opt_is_sr(t)) {                                \
        MIXPREC__ADAMW_GD(MIXPREC_BF16, ams, 1)                   \
      } else {                                                    \
        MIXPREC__ADAMW_GD(MIXPREC_BF16, ams, 0)                   \
      }                                                           \
    default: MIXPREC__ADAMW_GD(MIXPREC_F32, ams, 0)               \
  }

int64_t mixprec__adamw_body_avx2(const mixprec_opt_tensor *t, int64_t begin, int64_t end,
                                 const mixprec__adamw_scalars *s, const mixprec__adamw_consts *k) {
  if (k->amsgrad) {
    MIXPREC__ADAMW_PD(1)
  } else {
    MIXPREC__ADAMW_PD(0)
  }
}
