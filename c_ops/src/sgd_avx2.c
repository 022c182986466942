/* AVX2 + FMA + F16C body kernel of the SGD step (sgd.c). Compiled with
 * -mavx2 -mfma -mf16c, called only when the CPU has them. It runs the
 * formulas of torch's vectorised body (see sgd.c) 8 lanes at a time with the
 * same operations in the same order: _mm256_fmadd_ps exactly where the
 * scalar body calls fmaf, separate multiplies elsewhere (the project builds
 * with -ffp-contract=off), the same float constants, so the results are
 * bit-identical to the scalar body. The tail elements of a tensor (the last
 * numel % 8) never come here. */
#include "optim_common.h"

/* The vector update of 8 elements (mixprec__sgd_math's body formulas): g
 * as the update sees it, p the FP32 param, *buf the momentum buffer (not
 * read on the first step, written when momentum != 0); returns the new p. */
MIXPREC__FORCE_INLINE __m256 math8(__m256 g, __m256 p, __m256 *buf, int first,
                                   const mixprec__sgd_consts *k) {
  if (k->h.wd_on) g = _mm256_fmadd_ps(p, _mm256_set1_ps(k->h.wd), g);
  if (k->h.momentum_on) {
    const __m256 momentum = _mm256_set1_ps(k->h.momentum);
    if (first)
      *buf = g;
    else
      *buf = _mm256_fmadd_ps(_mm256_set1_ps(k->h.damp1), g, _mm256_mul_ps(*buf, momentum));
    g = k->h.nesterov ? _mm256_fmadd_ps(*buf, momentum, g) : *buf;
  }
  return _mm256_fmadd_ps(mixprec__opt_neg8(g), _mm256_set1_ps(k->h.lr), p);
}

/* The gradient of elements [i, i + 8) as the update sees it. */
MIXPREC__FORCE_INLINE __m256 grad8(const mixprec_opt_tensor *t, int64_t i, const mixprec__sgd_consts *k,
                                   const mixprec_dtype gd) {
  __m256 g = mixprec__opt_load8(t->grad, gd, i);
  if (k->has_scale) g = _mm256_div_ps(g, _mm256_set1_ps(k->scale));
  if (k->unscale) mixprec__opt_store8_grad(t->grad, gd, i, g);
  if (k->h.maximize) g = mixprec__opt_neg8(g);
  return g;
}

/* One vector of the update: elements [i, i + 8); stores the momentum
 * buffer and returns the new FP32 param. gd and sr (master-free BF16: read
 * the param itself) are constants at each call. */
MIXPREC__FORCE_INLINE __m256 update8(const mixprec_opt_tensor *t, int64_t i, const float *P, int first,
                               const mixprec__sgd_consts *k, const mixprec_dtype gd, const int sr,
                               const mixprec__ema_scalars *e, const int ema) {
  const __m256 g = grad8(t, i, k, gd);
  const __m256 p = sr ? mixprec__opt_load8(t->param, MIXPREC_BF16, i) : _mm256_loadu_ps(P + i);
  __m256 buf = k->h.momentum_on && !first ? _mm256_loadu_ps(t->momentum_buffer + i) : _mm256_setzero_ps();
  const __m256 out = math8(g, p, &buf, first, k);
  if (k->h.momentum_on) _mm256_storeu_ps(t->momentum_buffer + i, buf);
  if (ema) mixprec__opt_ema8(e->buf, i, out, e->w);
  return out;
}

/* One dtype combination (constants at each call). */
MIXPREC__FORCE_INLINE int64_t body(const mixprec_opt_tensor *t_in, int64_t begin, int64_t end, int first,
                             uint32_t sr_key, const mixprec__ema_scalars *e_in,
                             const mixprec__sgd_consts *k_in, const mixprec_dtype pd,
                             const mixprec_dtype gd, const int sr, const int ema) {
  /* Local copies, kept in registers (MIXPREC__OPT_LOCAL). */
  MIXPREC__OPT_LOCAL(mixprec_opt_tensor, t, t_in);
  MIXPREC__OPT_LOCAL(mixprec__sgd_consts, k, k_in);
  MIXPREC__OPT_LOCAL(mixprec__ema_scalars, e, e_in);
  float *P = pd != MIXPREC_F32 && !sr ? t->master : (float *)t->param;
  int64_t i = begin;
#define UPDATE8(j, r) update8(t, j, P, first, k, gd, r, e, ema)
  MIXPREC__OPT_BODY_LOOP(t, P, pd, sr, sr_key, k->stream, i, end, UPDATE8);
#undef UPDATE8
  return i;
}

int64_t mixprec__sgd_body_avx2(const mixprec_opt_tensor *t, int64_t begin, int64_t end, int first,
                               uint32_t sr_key, const mixprec__ema_scalars *e,
                               const mixprec__sgd_consts *k) {
  /* The dtypes, sr and EMA on/off are constants of each instantiation (see
   * adamw_avx2.c). */
#define MIXPREC__SGD_BODY(EMA)                                                                 \
  MIXPREC__DISPATCH(t->param_dtype, PD, MIXPREC__DISPATCH(t->grad_dtype, GD, {               \
    if (PD == MIXPREC_BF16 && mixprec__opt_is_sr(t))                                         \
      return body(t, begin, end, first, sr_key, e, k, PD, GD, 1, EMA);                      \
    return body(t, begin, end, first, sr_key, e, k, PD, GD, 0, EMA);                        \
  }))
  if (e->buf) MIXPREC__SGD_BODY(1);
  else MIXPREC__SGD_BODY(0);
#undef MIXPREC__SGD_BODY
  return begin;
}

/* ---- the lean state (see adamw_avx2.c: pm and db constants) --------------- */
MIXPREC__FORCE_INLINE int64_t lean_body(const mixprec_opt_tensor *t_in, int64_t begin, int64_t end, int first,
                                        uint32_t sr_key, const mixprec__ema_scalars *e_in,
                                        const mixprec__sgd_consts *k_in, const mixprec__lean_ctx *c_in,
                                        const mixprec_dtype gd, const int pm, const mixprec_state_dtype db) {
  /* Local copies, kept in registers (MIXPREC__OPT_LOCAL). */
  MIXPREC__OPT_LOCAL(mixprec_opt_tensor, t, t_in);
  MIXPREC__OPT_LOCAL(mixprec__sgd_consts, k, k_in);
  MIXPREC__OPT_LOCAL(mixprec__ema_scalars, e, e_in);
  MIXPREC__OPT_LOCAL(mixprec__lean_ctx, c, c_in);
  float *P = t->param_dtype != MIXPREC_F32 ? t->master : (float *)t->param;
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256 g = grad8(t, i, k, gd);
    const __m256 p0 = mixprec__opt_lean_param_load8(t, P, i, pm);
    __m256 buf = k->h.momentum_on && !first
                     ? mixprec__opt_state_load8(t->exp_avg_data, db, i, c->sc0, c->tab_s, 1)
                     : _mm256_setzero_ps();
    const __m256 p = math8(g, p0, &buf, first, k);
    if (k->h.momentum_on) mixprec__opt_state_store8(t->exp_avg_data, db, i, buf, c->k0, c->q0, c->b0);
    if (e->buf) mixprec__opt_ema8(e->buf, i, p, e->w);
    mixprec__opt_lean_param_store8(t, P, i, pm, sr_key, p);
  }
  return i;
}

int64_t mixprec__sgd_lean_avx2(const mixprec_opt_tensor *t, int64_t begin, int64_t end, int first,
                               uint32_t sr_key, const mixprec__ema_scalars *e,
                               const mixprec__sgd_consts *k, const mixprec__lean_ctx *c) {
  MIXPREC__PM_DISPATCH(t, PM, MIXPREC__STATE_DISPATCH(t->exp_avg_dtype, DB, MIXPREC__DISPATCH(
      t->grad_dtype, GD, return lean_body(t, begin, end, first, sr_key, e, k, c, GD, PM, DB))));
  return begin;
}
