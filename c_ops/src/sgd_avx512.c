/* AVX-512 (F, BW, VL, DQ) body kernels of the SGD step (sgd.c): those of
 * sgd_avx2.c at 16 lanes, the same operations in the same order, so the
 * results are bit-identical to the scalar body and to AVX2. A range's last
 * whole 8 elements go to the AVX2 kernel. */
#include "optim_common.h"

MIXPREC__FORCE_INLINE __m512 math16(__m512 g, __m512 p, __m512 *buf, int first,
                                    const mixprec__sgd_consts *k) {
  if (k->h.wd_on) g = _mm512_fmadd_ps(p, _mm512_set1_ps(k->h.wd), g);
  if (k->h.momentum_on) {
    const __m512 momentum = _mm512_set1_ps(k->h.momentum);
    if (first)
      *buf = g;
    else
      *buf = _mm512_fmadd_ps(_mm512_set1_ps(k->h.damp1), g, _mm512_mul_ps(*buf, momentum));
    g = k->h.nesterov ? _mm512_fmadd_ps(*buf, momentum, g) : *buf;
  }
  return _mm512_fmadd_ps(mixprec__opt_neg16(g), _mm512_set1_ps(k->h.lr), p);
}

MIXPREC__FORCE_INLINE __m512 grad16(const mixprec_opt_tensor *t, int64_t i, const mixprec__sgd_consts *k,
                                    const mixprec_dtype gd) {
  __m512 g = mixprec__opt_load16(t->grad, gd, i);
  if (k->has_scale) g = _mm512_div_ps(g, _mm512_set1_ps(k->scale));
  if (k->unscale) mixprec__opt_store16_grad(t->grad, gd, i, g);
  if (k->h.maximize) g = mixprec__opt_neg16(g);
  return g;
}

MIXPREC__FORCE_INLINE __m512 update16(const mixprec_opt_tensor *t, int64_t i, const float *P, int first,
                                      const mixprec__sgd_consts *k, const mixprec_dtype gd, const int sr,
                                      const mixprec__ema_scalars *e, const int ema) {
  const __m512 g = grad16(t, i, k, gd);
  const __m512 p = sr ? mixprec__opt_load16(t->param, MIXPREC_BF16, i) : _mm512_loadu_ps(P + i);
  __m512 buf = k->h.momentum_on && !first ? _mm512_loadu_ps(t->momentum_buffer + i) : _mm512_setzero_ps();
  const __m512 out = math16(g, p, &buf, first, k);
  if (k->h.momentum_on) _mm512_storeu_ps(t->momentum_buffer + i, buf);
  if (ema) mixprec__opt_ema16(e->buf, i, out, e->w);
  return out;
}

MIXPREC__FORCE_INLINE int64_t body(const mixprec_opt_tensor *t_in, int64_t begin, int64_t end, int first,
                                   uint32_t sr_key, const mixprec__ema_scalars *e_in,
                                   const mixprec__sgd_consts *k_in, const mixprec_dtype pd,
                                   const mixprec_dtype gd, const int sr, const int ema) {
  MIXPREC__OPT_LOCAL(mixprec_opt_tensor, t, t_in);
  MIXPREC__OPT_LOCAL(mixprec__sgd_consts, k, k_in);
  MIXPREC__OPT_LOCAL(mixprec__ema_scalars, e, e_in);
  float *P = pd != MIXPREC_F32 && !sr ? t->master : (float *)t->param;
  int64_t i = begin;
#define UPDATE16(j, r) update16(t, j, P, first, k, gd, r, e, ema)
  MIXPREC__OPT_BODY_LOOP16(t, P, pd, sr, sr_key, k->stream, i, end, UPDATE16);
#undef UPDATE16
  return i;
}

int64_t mixprec__sgd_body_avx512(const mixprec_opt_tensor *t, int64_t begin, int64_t end, int first,
                                 uint32_t sr_key, const mixprec__ema_scalars *e,
                                 const mixprec__sgd_consts *k) {
  int64_t i = begin;
#define MIXPREC__SGD_BODY(EMA)                                                                 \
  MIXPREC__DISPATCH(t->param_dtype, PD, MIXPREC__DISPATCH(t->grad_dtype, GD, {               \
    if (PD == MIXPREC_BF16 && mixprec__opt_is_sr(t))                                         \
      i = body(t, begin, end, first, sr_key, e, k, PD, GD, 1, EMA);                         \
    else                                                                                     \
      i = body(t, begin, end, first, sr_key, e, k, PD, GD, 0, EMA);                         \
  }))
  if (e->buf) MIXPREC__SGD_BODY(1);
  else MIXPREC__SGD_BODY(0);
#undef MIXPREC__SGD_BODY
  return end - i >= 8 ? mixprec__sgd_body_avx2(t, i, end, first, sr_key, e, k) : i;
}

/* ---- the lean state (sgd_avx2.c's lean body at 16 lanes) ---------------- */
MIXPREC__FORCE_INLINE int64_t lean_body(const mixprec_opt_tensor *t_in, int64_t begin, int64_t end, int first,
                                        uint32_t sr_key, const mixprec__ema_scalars *e_in,
                                        const mixprec__sgd_consts *k_in, const mixprec__lean_ctx *c_in,
                                        const mixprec_dtype gd, const int pm, const mixprec_state_dtype db) {
  MIXPREC__OPT_LOCAL(mixprec_opt_tensor, t, t_in);
  MIXPREC__OPT_LOCAL(mixprec__sgd_consts, k, k_in);
  MIXPREC__OPT_LOCAL(mixprec__ema_scalars, e, e_in);
  MIXPREC__OPT_LOCAL(mixprec__lean_ctx, c, c_in);
  float *P = t->param_dtype != MIXPREC_F32 ? t->master : (float *)t->param;
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m512 g = grad16(t, i, k, gd);
    const __m512 p0 = mixprec__opt_lean_param_load16(t, P, i, pm);
    __m512 buf = k->h.momentum_on && !first
                     ? mixprec__opt_state_load16(t->exp_avg_data, db, i, c->sc0, c->tab_s)
                     : _mm512_setzero_ps();
    const __m512 p = math16(g, p0, &buf, first, k);
    if (k->h.momentum_on) mixprec__opt_state_store16(t->exp_avg_data, db, i, buf, c->k0, c->q0, c->b0);
    if (e->buf) mixprec__opt_ema16(e->buf, i, p, e->w);
    mixprec__opt_lean_param_store16(t, P, i, pm, sr_key, p);
  }
  return i;
}

int64_t mixprec__sgd_lean_avx512(const mixprec_opt_tensor *t, int64_t begin, int64_t end, int first,
                                 uint32_t sr_key, const mixprec__ema_scalars *e,
                                 const mixprec__sgd_consts *k, const mixprec__lean_ctx *c) {
  int64_t i = begin;
  MIXPREC__PM_DISPATCH(t, PM, MIXPREC__STATE_DISPATCH(t->exp_avg_dtype, DB, MIXPREC__DISPATCH(
      t->grad_dtype, GD, i = lean_body(t, begin, end, first, sr_key, e, k, c, GD, PM, DB))));
  return end - i >= 8 ? mixprec__sgd_lean_avx2(t, i, end, first, sr_key, e, k, c) : i;
}
