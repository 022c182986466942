/* The AdamW step's vector body and lean kernels, written once for a width
 * (optim_simd.h: included by adamw_avx2.c with MIXPREC__VW 8 and by
 * adamw_avx512.c with 16). They run the formulas of torch's vectorised body
 * (see adamw.c) with the same operations in the same order: fmadd exactly
 * where the scalar body calls fmaf, separate multiplies and adds elsewhere
 * (the project builds with -ffp-contract=off, so none is contracted),
 * correctly rounded sqrt and division, and the same float constants, so the
 * results are bit-identical to the scalar body. The tail elements of a
 * tensor (the last numel % 8) never come here. */
#include "optim_simd.h"

typedef mixprec__vf vf;

/* The vector update (mixprec__adamw_math's body formulas, the same
 * operations in the same order): m, v and (amsgrad) vmax in place; returns
 * the new p. */
MIXPREC__FORCE_INLINE vf math_v(vf g, vf p, vf *m, vf *v, vf *vmax, const mixprec__adamw_scalars *s,
                                const mixprec__adamw_consts *k, const int amsgrad) {
  if (k->h.decay_on) p = MPV(mul)(p, MPV(set1)(s->decay));
  const vf diff = MPV(sub)(g, *m);
  *m = k->h.w_small ? MPV(fmadd)(MPV(set1)(k->h.w), diff, *m)
                    : MPV(fmadd)(MPV(set1)(k->h.w_m1), diff, g);
  const vf cg = MPV(mul)(MPV(set1)(k->h.c2), g);
  *v = MPV(fmadd)(cg, g, MPV(mul)(*v, MPV(set1)(k->h.beta2)));
  vf vd = *v;
  if (amsgrad) {
    vd = MPV_NANMAX(*vmax, vd);
    *vmax = vd;
  }
  const vf denom = MPV(add)(MPV(div)(MPV(sqrt)(vd), MPV(set1)(s->bc2_sqrt)), MPV(set1)(k->h.eps));
  const vf upd = MPV(mul)(MPV(set1)(s->step_size), *m);
  return MPV(sub)(p, MPV(div)(upd, denom));
}

/* The gradient of one vector at i as the update sees it
 * (mixprec__opt_grad_v). */
MIXPREC__FORCE_INLINE vf grad_v(const mixprec_opt_tensor *t, int64_t i, const mixprec__adamw_consts *k,
                                const mixprec_dtype gd) {
  return mixprec__opt_grad_v(t, i, gd, k->has_scale, k->scale, k->unscale, k->h.maximize);
}

/* One vector of the update at i; stores m, v (and the amsgrad max) and
 * returns the new FP32 param. gd, amsgrad and sr (master-free BF16: read the
 * param itself) are constants at each call. */
MIXPREC__FORCE_INLINE vf update_v(const mixprec_opt_tensor *t, int64_t i, const float *P,
                                  const mixprec__adamw_scalars *s, const mixprec__adamw_consts *k,
                                  const mixprec_dtype gd, const int amsgrad, const int sr, const int ema) {
  const vf g = grad_v(t, i, k, gd);
  const vf p0 = sr ? MPV_N(mixprec__opt_load)(t->param, MIXPREC_BF16, i) : MPV(loadu)(P + i);
  vf m = MPV(loadu)(t->exp_avg + i);
  vf v = MPV(loadu)(t->exp_avg_sq + i);
  vf vmax = amsgrad ? MPV(loadu)(t->max_exp_avg_sq + i) : MPV(setzero)();
  const vf p = math_v(g, p0, &m, &v, &vmax, s, k, amsgrad);
  if (amsgrad) MPV(storeu)(t->max_exp_avg_sq + i, vmax);
  MPV(storeu)(t->exp_avg + i, m);
  MPV(storeu)(t->exp_avg_sq + i, v);
  if (ema) MPV_N(mixprec__opt_ema)(s->ema, i, p, s->ema_w);
  return p;
}

/* One dtype combination (constants at each call). */
MIXPREC__FORCE_INLINE int64_t body(const mixprec_opt_tensor *t_in, int64_t begin, int64_t end,
                                   const mixprec__adamw_scalars *s_in, const mixprec__adamw_consts *k_in,
                                   const mixprec_dtype pd, const mixprec_dtype gd, const int amsgrad,
                                   const int sr, const int ema, const int plain) {
  /* Local copies, kept in registers (MIXPREC__OPT_LOCAL). */
  MIXPREC__OPT_LOCAL(mixprec_opt_tensor, t, t_in);
  MIXPREC__OPT_LOCAL(mixprec__adamw_scalars, s, s_in);
  MPV_PLAIN_LOCAL(mixprec__adamw_consts, k, k_in, plain);
  float *P = pd != MIXPREC_F32 && !sr ? t->master : (float *)t->param;
  int64_t i = begin;
#define UPDATE_V(j, r) update_v(t, j, P, s, k, gd, amsgrad, r, ema)
  MPV_BODY_LOOP(t, P, pd, sr, s->sr_key, k->stream, i, end, UPDATE_V);
#undef UPDATE_V
  return i;
}

/* The param dtype (BF16 master-free: sr), the grad dtype, amsgrad, EMA
 * on/off and plain (MPV_PLAIN_LOCAL) are constants of each instantiation: with
 * EMA off the loop is exactly the one without the feature. */
int64_t MPV_ISA(mixprec__adamw_body)(const mixprec_opt_tensor *t, int64_t begin, int64_t end,
                                     const mixprec__adamw_scalars *s, const mixprec__adamw_consts *k) {
  int64_t i = begin;
  const int plain = !k->has_scale && !k->h.maximize;
#define MIXPREC__ADAMW_BODY(AMS, EMA)                                                             \
  MIXPREC__DISPATCH(t->param_dtype, PD, MIXPREC__DISPATCH(t->grad_dtype, GD, {                  \
    const int sr_ = PD == MIXPREC_BF16 && mixprec__opt_is_sr(t);                                \
    if (sr_ && plain) i = body(t, begin, end, s, k, PD, GD, AMS, 1, EMA, 1);                    \
    else if (sr_) i = body(t, begin, end, s, k, PD, GD, AMS, 1, EMA, 0);                        \
    else if (plain) i = body(t, begin, end, s, k, PD, GD, AMS, 0, EMA, 1);                      \
    else i = body(t, begin, end, s, k, PD, GD, AMS, 0, EMA, 0);                                 \
  }))
  if (s->ema) {
    if (k->h.amsgrad) MIXPREC__ADAMW_BODY(1, 1);
    else MIXPREC__ADAMW_BODY(0, 1);
  } else {
    if (k->h.amsgrad) MIXPREC__ADAMW_BODY(1, 0);
    else MIXPREC__ADAMW_BODY(0, 0);
  }
#undef MIXPREC__ADAMW_BODY
  return MPV_REST(i, end, mixprec__adamw_body_avx2(t, i, end, s, k));
}

/* ---- the lean state (mixprec_state_dtype) --------------------------------
 * One vector as update_v, with the param, its remainder and the moments in
 * their formats: pm (mixprec__opt_param_mode), dm and dv are constants of
 * each instantiation, so every vector runs only its formats' code; the new
 * Q8 moments go to the block buffers, encoded by the caller at the block's
 * end. */
MIXPREC__FORCE_INLINE void lean_v(const mixprec_opt_tensor *t, int64_t i, float *P,
                                  const mixprec__adamw_scalars *s, const mixprec__adamw_consts *k,
                                  const mixprec__lean_ctx *c, const mixprec_dtype gd, const int pm,
                                  const mixprec_state_dtype dm, const mixprec_state_dtype dv) {
  const vf g = grad_v(t, i, k, gd);
  const vf p0 = MPV_N(mixprec__opt_lean_param_load)(t, P, i, pm);
  vf m = MPV_STATE_LOAD(t->exp_avg_data, dm, i, c->sc0, c->tab_s, 1);
  vf v = MPV_STATE_LOAD(t->exp_avg_sq_data, dv, i, c->sc1, c->tab_u, 0);
  const int amsgrad = k->h.amsgrad;
  vf vmax = amsgrad ? MPV(loadu)(t->max_exp_avg_sq + i) : MPV(setzero)();
  const vf p = math_v(g, p0, &m, &v, &vmax, s, k, amsgrad);
  if (amsgrad) MPV(storeu)(t->max_exp_avg_sq + i, vmax);
  MPV_N(mixprec__opt_state_store)(t->exp_avg_data, dm, i, m, c->k0, c->q0, c->b0);
  MPV_N(mixprec__opt_state_store)(t->exp_avg_sq_data, dv, i, v, c->k1, c->q1, c->b0);
  if (s->ema) MPV_N(mixprec__opt_ema)(s->ema, i, p, s->ema_w);
  MPV_N(mixprec__opt_lean_param_store)(t, P, i, pm, s->sr_key, p);
}

/* plain (a constant): the step has no grad scale, maximize, amsgrad or EMA,
 * and those tests leave the loop (MPV_PLAIN_LOCAL, and the EMA and
 * amsgrad fields here); the other steps run the general loop. */
MIXPREC__FORCE_INLINE int64_t lean_body(const mixprec_opt_tensor *t_in, int64_t begin, int64_t end,
                                        const mixprec__adamw_scalars *s_in, const mixprec__adamw_consts *k_in,
                                        const mixprec__lean_ctx *c_in, const mixprec_dtype gd, const int pm,
                                        const mixprec_state_dtype dm, const mixprec_state_dtype dv,
                                        const int plain) {
  /* Local copies, kept in registers (MIXPREC__OPT_LOCAL). */
  MIXPREC__OPT_LOCAL(mixprec_opt_tensor, t, t_in);
  mixprec__adamw_scalars s_copy_ = *s_in;
  MPV_PLAIN_LOCAL(mixprec__adamw_consts, k, k_in, plain);
  if (plain) {
    s_copy_.ema = NULL;
    k_copy_.h.amsgrad = 0;
  }
  const mixprec__adamw_scalars *s = &s_copy_;
  MIXPREC__OPT_LOCAL(mixprec__lean_ctx, c, c_in);
  float *P = t->param_dtype != MIXPREC_F32 ? t->master : (float *)t->param;
  int64_t i = begin;
  for (; i + MIXPREC__VW <= end; i += MIXPREC__VW) lean_v(t, i, P, s, k, c, gd, pm, dm, dv);
  return i;
}

int64_t MPV_ISA(mixprec__adamw_lean)(const mixprec_opt_tensor *t, int64_t begin, int64_t end,
                                     const mixprec__adamw_scalars *s, const mixprec__adamw_consts *k,
                                     const mixprec__lean_ctx *c) {
  int64_t i = begin;
  const int plain = !k->has_scale && !k->h.maximize && !k->h.amsgrad && !s->ema;
  MIXPREC__PM_DISPATCH(t, PM, MIXPREC__STATE_DISPATCH(t->exp_avg_dtype, DM, MIXPREC__STATE_DISPATCH(
      t->exp_avg_sq_dtype, DV, MIXPREC__DISPATCH(t->grad_dtype, GD, {
        if (plain) i = lean_body(t, begin, end, s, k, c, GD, PM, DM, DV, 1);
        else i = lean_body(t, begin, end, s, k, c, GD, PM, DM, DV, 0);
      }))));
  return MPV_REST(i, end, mixprec__adamw_lean_avx2(t, i, end, s, k, c));
}
