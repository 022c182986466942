/* AVX2 + FMA + F16C body kernel of the SGD step (sgd.c). Compiled with
 * -mavx2 -mfma -mf16c, called only when the CPU has them. It runs the
 * formulas of torch's vectorised body (see sgd.c) 8 lanes at a time with the
 * same operations in the same order: _mm256_fmadd_ps exactly where the
 * scalar body calls fmaf, separate multiplies elsewhere (the project builds
 * with -ffp-contract=off), the same float constants, so the results are
 * bit-identical to the scalar body. The tail elements of a tensor (the last
 * numel % 8) never come here. */
#include "optim_common.h"

/* One vector of the update: elements [i, i + 8); stores the momentum
 * buffer and returns the new FP32 param. gd and sr (master-free BF16: read
 * the param itself) are constants at each call. */
MIXPREC__FORCE_INLINE __m256 update8(const mixprec_opt_tensor *t, int64_t i, const float *P, int first,
                               const mixprec__sgd_consts *k, const mixprec_dtype gd, const int sr,
                               const mixprec__ema_scalars *e, const int ema) {
  __m256 g = mixprec__opt_load8(t->grad, gd, i);
  if (k->has_scale) g = _mm256_div_ps(g, _mm256_set1_ps(k->scale));
  if (k->unscale) mixprec__opt_store8_grad(t->grad, gd, i, g);
  if (k->h.maximize) g = mixprec__opt_neg8(g);
  const __m256 p = sr ? mixprec__opt_load8(t->param, MIXPREC_BF16, i) : _mm256_loadu_ps(P + i);
  if (k->h.wd_on) g = _mm256_fmadd_ps(p, _mm256_set1_ps(k->h.wd), g);
  if (k->h.momentum_on) {
    const __m256 momentum = _mm256_set1_ps(k->h.momentum);
    __m256 buf;
    if (first)
      buf = g;
    else
      buf = _mm256_fmadd_ps(_mm256_set1_ps(k->h.damp1), g,
                            _mm256_mul_ps(_mm256_loadu_ps(t->momentum_buffer + i), momentum));
    _mm256_storeu_ps(t->momentum_buffer + i, buf);
    g = k->h.nesterov ? _mm256_fmadd_ps(buf, momentum, g) : buf;
  }
  const __m256 out = _mm256_fmadd_ps(mixprec__opt_neg8(g), _mm256_set1_ps(k->h.lr), p);
  if (ema) mixprec__opt_ema8(e->buf, i, out, e->w);
  return out;
}

/* One dtype combination (constants at each call). */
MIXPREC__FORCE_INLINE int64_t body(const mixprec_opt_tensor *t_in, int64_t begin, int64_t end, int first,
                             uint32_t sr_key, const mixprec__ema_scalars *e_in,
                             const mixprec__sgd_consts *k_in, const mixprec_dtype pd,
                             const mixprec_dtype gd, const int sr, const int ema) {
  /* Local copies, kept in registers (see adamw_avx2.c). */
  const mixprec_opt_tensor tc = *t_in;
  const mixprec__sgd_consts kc = *k_in;
  const mixprec__ema_scalars ec = *e_in;
  const mixprec_opt_tensor *t = &tc;
  const mixprec__sgd_consts *k = &kc;
  const mixprec__ema_scalars *e = &ec;
  float *P = pd != MIXPREC_F32 && !sr ? t->master : (float *)t->param;
  int64_t i = begin;
#define UPDATE8(j, r) update8(t, j, P, first, k, gd, r, e, ema)
  MIXPREC__OPT_BODY_LOOP(t, P, pd, sr, sr_key, k->stream, i, end, UPDATE8);
#undef UPDATE8
  return i;
}

#define MIXPREC__SGD_GD(pd, sr, ema)                                                           \
  switch (t->grad_dtype) {                                                                    \
    case MIXPREC_F16: return body(t, begin, end, first, sr_key, e, k, pd, MIXPREC_F16, sr, ema);   \
    case MIXPREC_BF16: return body(t, begin, end, first, sr_key, e, k, pd, MIXPREC_BF16, sr, ema); \
    default: return body(t, begin, end, first, sr_key, e, k, pd, MIXPREC_F32, sr, ema);            \
  }

#define MIXPREC__SGD_PD(ema)                                 \
  switch (t->param_dtype) {                                  \
    case MIXPREC_F16: MIXPREC__SGD_GD(MIXPREC_F16, 0, ema)   \
    case MIXPREC_BF16:                                       \
      if (mixprec__opt_is_sr(t)) {                           \
        MIXPREC__SGD_GD(MIXPREC_BF16, 1, ema)                \
      } else {                                               \
        MIXPREC__SGD_GD(MIXPREC_BF16, 0, ema)                \
      }                                                      \
    default: MIXPREC__SGD_GD(MIXPREC_F32, 0, ema)            \
  }

int64_t mixprec__sgd_body_avx2(const mixprec_opt_tensor *t, int64_t begin, int64_t end, int first,
                               uint32_t sr_key, const mixprec__ema_scalars *e,
                               const mixprec__sgd_consts *k) {
  /* EMA on/off is a constant of each instantiation (see adamw_avx2.c). */
  if (e->buf) {
    MIXPREC__SGD_PD(1)
  }
  MIXPREC__SGD_PD(0)
}
