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

/* One vector of the update: elements [i, i + 8); stores m, v (and the
 * amsgrad max) and returns the new FP32 param. pd, gd, amsgrad and sr
 * (master-free BF16: read the param itself) are constants at each call. */
MIXPREC__FORCE_INLINE __m256 update8(const mixprec_opt_tensor *t, int64_t i, const float *P,
                               const mixprec__adamw_scalars *s, const mixprec__adamw_consts *k,
                               const mixprec_dtype gd, const int amsgrad, const int sr,
                               const int ema) {
  __m256 g = mixprec__opt_load8(t->grad, gd, i);
  if (k->has_scale) g = _mm256_div_ps(g, _mm256_set1_ps(k->scale));
  if (k->unscale) mixprec__opt_store8_grad(t->grad, gd, i, g);
  if (k->h.maximize) g = mixprec__opt_neg8(g);
  __m256 p = sr ? mixprec__opt_load8(t->param, MIXPREC_BF16, i) : _mm256_loadu_ps(P + i);
  if (k->h.decay_on) p = _mm256_mul_ps(p, _mm256_set1_ps(s->decay));
  __m256 m = _mm256_loadu_ps(t->exp_avg + i);
  const __m256 diff = _mm256_sub_ps(g, m);
  m = k->h.w_small ? _mm256_fmadd_ps(_mm256_set1_ps(k->h.w), diff, m)
                 : _mm256_fmadd_ps(_mm256_set1_ps(k->h.w_m1), diff, g);
  const __m256 cg = _mm256_mul_ps(_mm256_set1_ps(k->h.c2), g);
  const __m256 v = _mm256_fmadd_ps(
      cg, g, _mm256_mul_ps(_mm256_loadu_ps(t->exp_avg_sq + i), _mm256_set1_ps(k->h.beta2)));
  __m256 vd = v;
  if (amsgrad) {
    /* torch's Vectorized<float> maximum: max_ps(old, v) gives v unless
     * old > v; or'ed with the unordered compare, a NaN gives all ones. */
    const __m256 old = _mm256_loadu_ps(t->max_exp_avg_sq + i);
    vd = _mm256_or_ps(_mm256_max_ps(old, v), _mm256_cmp_ps(old, v, _CMP_UNORD_Q));
    _mm256_storeu_ps(t->max_exp_avg_sq + i, vd);
  }
  const __m256 denom = _mm256_add_ps(
      _mm256_div_ps(_mm256_sqrt_ps(vd), _mm256_set1_ps(s->bc2_sqrt)), _mm256_set1_ps(k->h.eps));
  const __m256 upd = _mm256_mul_ps(_mm256_set1_ps(s->step_size), m);
  _mm256_storeu_ps(t->exp_avg + i, m);
  _mm256_storeu_ps(t->exp_avg_sq + i, v);
  p = _mm256_sub_ps(p, _mm256_div_ps(upd, denom));
  if (ema) mixprec__opt_ema8(s->ema, i, p, s->ema_w);
  return p;
}

/* One dtype combination (constants at each call). */
MIXPREC__FORCE_INLINE int64_t body(const mixprec_opt_tensor *t_in, int64_t begin, int64_t end,
                             const mixprec__adamw_scalars *s_in, const mixprec__adamw_consts *k_in,
                             const mixprec_dtype pd, const mixprec_dtype gd, const int amsgrad,
                             const int sr, const int ema) {
  /* Local copies: the compiler may then keep every field in a register
   * (vector stores may alias anything, the caller's structs included). */
  const mixprec_opt_tensor tc = *t_in;
  const mixprec__adamw_scalars sc = *s_in;
  const mixprec__adamw_consts kc = *k_in;
  const mixprec_opt_tensor *t = &tc;
  const mixprec__adamw_scalars *s = &sc;
  const mixprec__adamw_consts *k = &kc;
  float *P = pd != MIXPREC_F32 && !sr ? t->master : (float *)t->param;
  int64_t i = begin;
#define UPDATE8(j, r) update8(t, j, P, s, k, gd, amsgrad, r, ema)
  MIXPREC__OPT_BODY_LOOP(t, P, pd, sr, s->sr_key, k->stream, i, end, UPDATE8);
#undef UPDATE8
  return i;
}

#define MIXPREC__ADAMW_GD(pd, ams, sr, ema)                                              \
  switch (t->grad_dtype) {                                                               \
    case MIXPREC_F16: return body(t, begin, end, s, k, pd, MIXPREC_F16, ams, sr, ema);   \
    case MIXPREC_BF16: return body(t, begin, end, s, k, pd, MIXPREC_BF16, ams, sr, ema); \
    default: return body(t, begin, end, s, k, pd, MIXPREC_F32, ams, sr, ema);            \
  }

#define MIXPREC__ADAMW_PD(ams, ema)                               \
  switch (t->param_dtype) {                                       \
    case MIXPREC_F16: MIXPREC__ADAMW_GD(MIXPREC_F16, ams, 0, ema) \
    case MIXPREC_BF16:                                            \
      if (mixprec__opt_is_sr(t)) {                                \
        MIXPREC__ADAMW_GD(MIXPREC_BF16, ams, 1, ema)              \
      } else {                                                    \
        MIXPREC__ADAMW_GD(MIXPREC_BF16, ams, 0, ema)              \
      }                                                           \
    default: MIXPREC__ADAMW_GD(MIXPREC_F32, ams, 0, ema)          \
  }

/* EMA on/off is a constant of each instantiation: with it off the loop is
 * exactly the one without the feature. */
int64_t mixprec__adamw_body_avx2(const mixprec_opt_tensor *t, int64_t begin, int64_t end,
                                 const mixprec__adamw_scalars *s, const mixprec__adamw_consts *k) {
  if (s->ema) {
    if (k->h.amsgrad) {
      MIXPREC__ADAMW_PD(1, 1)
    } else {
      MIXPREC__ADAMW_PD(0, 1)
    }
  }
  if (k->h.amsgrad) {
    MIXPREC__ADAMW_PD(1, 0)
  } else {
    MIXPREC__ADAMW_PD(0, 0)
  }
}
