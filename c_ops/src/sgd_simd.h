/* The SGD step's vector body and lean kernels, written once for a width
 * (optim_simd.h: included by sgd_avx2.c with MIXPREC__VW 8 and by
 * sgd_avx512.c with 16). They run the formulas of torch's vectorised body
 * (see sgd.c) with the same operations in the same order: fmadd exactly
 * where the scalar body calls fmaf, separate multiplies elsewhere (the
 * project builds with -ffp-contract=off), the same float constants, so the
 * results are bit-identical to the scalar body. The tail elements of a
 * tensor (the last numel % 8) never come here. */
#include "optim_simd.h"

typedef mixprec__vf vf;

/* The vector update (mixprec__sgd_math's body formulas): g as the update
 * sees it, p the FP32 param, *buf the momentum buffer (not read on the first
 * step, written when momentum != 0); returns the new p. */
MIXPREC__FORCE_INLINE vf math_v(vf g, vf p, vf *buf, int first, const mixprec__sgd_consts *k) {
  if (k->h.wd_on) g = MPV(fmadd)(p, MPV(set1)(k->h.wd), g);
  if (k->h.momentum_on) {
    const vf momentum = MPV(set1)(k->h.momentum);
    if (first)
      *buf = g;
    else
      *buf = MPV(fmadd)(MPV(set1)(k->h.damp1), g, MPV(mul)(*buf, momentum));
    g = k->h.nesterov ? MPV(fmadd)(*buf, momentum, g) : *buf;
  }
  return MPV(fmadd)(MPV_N(mixprec__opt_neg)(g), MPV(set1)(k->h.lr), p);
}

/* The gradient of one vector at i as the update sees it
 * (mixprec__opt_grad_v). */
MIXPREC__FORCE_INLINE vf grad_v(const mixprec_opt_tensor *t, int64_t i, const mixprec__sgd_consts *k,
                                const mixprec_dtype gd) {
  return mixprec__opt_grad_v(t, i, gd, k->has_scale, k->scale, k->unscale, k->h.maximize);
}

/* One vector of the update at i; stores the momentum buffer and returns the
 * new FP32 param. gd and sr (master-free BF16: read the param itself) are
 * constants at each call. */
MIXPREC__FORCE_INLINE vf update_v(const mixprec_opt_tensor *t, int64_t i, const float *P, int first,
                                  const mixprec__sgd_consts *k, const mixprec_dtype gd, const int sr,
                                  const mixprec__ema_scalars *e, const int ema) {
  const vf g = grad_v(t, i, k, gd);
  const vf p = sr ? MPV_N(mixprec__opt_load)(t->param, MIXPREC_BF16, i) : MPV(loadu)(P + i);
  vf buf = k->h.momentum_on && !first ? MPV(loadu)(t->momentum_buffer + i) : MPV(setzero)();
  const vf out = math_v(g, p, &buf, first, k);
  if (k->h.momentum_on) MPV(storeu)(t->momentum_buffer + i, buf);
  if (ema) MPV_N(mixprec__opt_ema)(e->buf, i, out, e->w);
  return out;
}

/* One dtype combination (constants at each call). */
MIXPREC__FORCE_INLINE int64_t body(const mixprec_opt_tensor *t_in, int64_t begin, int64_t end, int first,
                                   uint32_t sr_key, const mixprec__ema_scalars *e_in,
                                   const mixprec__sgd_consts *k_in, const mixprec_dtype pd,
                                   const mixprec_dtype gd, const int sr, const int ema,
                                   const int plain) {
  /* Local copies, kept in registers (MIXPREC__OPT_LOCAL). */
  MIXPREC__OPT_LOCAL(mixprec_opt_tensor, t, t_in);
  MPV_PLAIN_LOCAL(mixprec__sgd_consts, k, k_in, plain);
  MIXPREC__OPT_LOCAL(mixprec__ema_scalars, e, e_in);
  float *P = pd != MIXPREC_F32 && !sr ? t->master : (float *)t->param;
  int64_t i = begin;
#define UPDATE_V(j, r) update_v(t, j, P, first, k, gd, r, e, ema)
  MPV_BODY_LOOP(t, P, pd, sr, sr_key, k->stream, i, end, UPDATE_V);
#undef UPDATE_V
  return i;
}

/* The dtypes, sr, EMA on/off and plain are constants of each instantiation
 * (see adamw_simd.h). */
int64_t MPV_ISA(mixprec__sgd_body)(const mixprec_opt_tensor *t, int64_t begin, int64_t end, int first,
                                   uint32_t sr_key, const mixprec__ema_scalars *e,
                                   const mixprec__sgd_consts *k) {
  int64_t i = begin;
  const int plain = !k->has_scale && !k->h.maximize;
#define MIXPREC__SGD_BODY(EMA)                                                                 \
  MIXPREC__DISPATCH(t->param_dtype, PD, MIXPREC__DISPATCH(t->grad_dtype, GD, {               \
    const int sr_ = PD == MIXPREC_BF16 && mixprec__opt_is_sr(t);                             \
    if (sr_ && plain) i = body(t, begin, end, first, sr_key, e, k, PD, GD, 1, EMA, 1);      \
    else if (sr_) i = body(t, begin, end, first, sr_key, e, k, PD, GD, 1, EMA, 0);          \
    else if (plain) i = body(t, begin, end, first, sr_key, e, k, PD, GD, 0, EMA, 1);        \
    else i = body(t, begin, end, first, sr_key, e, k, PD, GD, 0, EMA, 0);                   \
  }))
  if (e->buf) MIXPREC__SGD_BODY(1);
  else MIXPREC__SGD_BODY(0);
#undef MIXPREC__SGD_BODY
  return MPV_REST(i, end, mixprec__sgd_body_avx2(t, i, end, first, sr_key, e, k));
}

/* ---- the lean state (see adamw_simd.h: pm and db constants) -------------- */
MIXPREC__FORCE_INLINE int64_t lean_body(const mixprec_opt_tensor *t_in, int64_t begin, int64_t end, int first,
                                        uint32_t sr_key, const mixprec__ema_scalars *e_in,
                                        const mixprec__sgd_consts *k_in, const mixprec__lean_ctx *c_in,
                                        const mixprec_dtype gd, const int pm, const mixprec_state_dtype db,
                                        const int plain) {
  /* Local copies, kept in registers (MIXPREC__OPT_LOCAL); plain: no grad
   * scale, maximize or EMA (MPV_PLAIN_LOCAL). */
  MIXPREC__OPT_LOCAL(mixprec_opt_tensor, t, t_in);
  MPV_PLAIN_LOCAL(mixprec__sgd_consts, k, k_in, plain);
  mixprec__ema_scalars e_copy_ = *e_in;
  if (plain) e_copy_.buf = NULL;
  const mixprec__ema_scalars *e = &e_copy_;
  MIXPREC__OPT_LOCAL(mixprec__lean_ctx, c, c_in);
  float *P = t->param_dtype != MIXPREC_F32 ? t->master : (float *)t->param;
  int64_t i = begin;
  for (; i + MIXPREC__VW <= end; i += MIXPREC__VW) {
    const vf g = grad_v(t, i, k, gd);
    const vf p0 = MPV_N(mixprec__opt_lean_param_load)(t, P, i, pm);
    vf buf = k->h.momentum_on && !first ? MPV_STATE_LOAD(t->exp_avg_data, db, i, c->sc0, c->tab_s, 1)
                                        : MPV(setzero)();
    const vf p = math_v(g, p0, &buf, first, k);
    if (k->h.momentum_on) MPV_N(mixprec__opt_state_store)(t->exp_avg_data, db, i, buf, c->k0, c->q0, c->b0);
    if (e->buf) MPV_N(mixprec__opt_ema)(e->buf, i, p, e->w);
    MPV_N(mixprec__opt_lean_param_store)(t, P, i, pm, sr_key, p);
  }
  return i;
}

int64_t MPV_ISA(mixprec__sgd_lean)(const mixprec_opt_tensor *t, int64_t begin, int64_t end, int first,
                                   uint32_t sr_key, const mixprec__ema_scalars *e,
                                   const mixprec__sgd_consts *k, const mixprec__lean_ctx *c) {
  int64_t i = begin;
  const int plain = !k->has_scale && !k->h.maximize && !e->buf;
  MIXPREC__PM_DISPATCH(t, PM, MIXPREC__STATE_DISPATCH(t->exp_avg_dtype, DB, MIXPREC__DISPATCH(
      t->grad_dtype, GD, {
        if (plain) i = lean_body(t, begin, end, first, sr_key, e, k, c, GD, PM, DB, 1);
        else i = lean_body(t, begin, end, first, sr_key, e, k, c, GD, PM, DB, 0);
      })));
  return MPV_REST(i, end, mixprec__sgd_lean_avx2(t, i, end, first, sr_key, e, k, c));
}
