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

/* The vector update of 8 elements (mixprec__adamw_math's body formulas, the
 * same operations in the same order): m, v and (amsgrad) vmax in place;
 * returns the new p. */
MIXPREC__FORCE_INLINE __m256 math8(__m256 g, __m256 p, __m256 *m, __m256 *v, __m256 *vmax,
                                   const mixprec__adamw_scalars *s, const mixprec__adamw_consts *k,
                                   const int amsgrad) {
  if (k->h.decay_on) p = _mm256_mul_ps(p, _mm256_set1_ps(s->decay));
  const __m256 diff = _mm256_sub_ps(g, *m);
  *m = k->h.w_small ? _mm256_fmadd_ps(_mm256_set1_ps(k->h.w), diff, *m)
                    : _mm256_fmadd_ps(_mm256_set1_ps(k->h.w_m1), diff, g);
  const __m256 cg = _mm256_mul_ps(_mm256_set1_ps(k->h.c2), g);
  *v = _mm256_fmadd_ps(cg, g, _mm256_mul_ps(*v, _mm256_set1_ps(k->h.beta2)));
  __m256 vd = *v;
  if (amsgrad) {
    /* torch's Vectorized<float> maximum: max_ps(old, v) gives v unless
     * old > v; or'ed with the unordered compare, a NaN gives all ones. */
    vd = _mm256_or_ps(_mm256_max_ps(*vmax, vd), _mm256_cmp_ps(*vmax, vd, _CMP_UNORD_Q));
    *vmax = vd;
  }
  const __m256 denom = _mm256_add_ps(
      _mm256_div_ps(_mm256_sqrt_ps(vd), _mm256_set1_ps(s->bc2_sqrt)), _mm256_set1_ps(k->h.eps));
  const __m256 upd = _mm256_mul_ps(_mm256_set1_ps(s->step_size), *m);
  return _mm256_sub_ps(p, _mm256_div_ps(upd, denom));
}

/* The gradient of elements [i, i + 8) as the update sees it (unscaled,
 * written back with unscale_grads, negated for maximize). */
MIXPREC__FORCE_INLINE __m256 grad8(const mixprec_opt_tensor *t, int64_t i, const mixprec__adamw_consts *k,
                                   const mixprec_dtype gd) {
  __m256 g = mixprec__opt_load8(t->grad, gd, i);
  if (k->has_scale) g = _mm256_div_ps(g, _mm256_set1_ps(k->scale));
  if (k->unscale) mixprec__opt_store8_grad(t->grad, gd, i, g);
  if (k->h.maximize) g = mixprec__opt_neg8(g);
  return g;
}

/* One vector of the update: elements [i, i + 8); stores m, v (and the
 * amsgrad max) and returns the new FP32 param. pd, gd, amsgrad and sr
 * (master-free BF16: read the param itself) are constants at each call. */
MIXPREC__FORCE_INLINE __m256 update8(const mixprec_opt_tensor *t, int64_t i, const float *P,
                               const mixprec__adamw_scalars *s, const mixprec__adamw_consts *k,
                               const mixprec_dtype gd, const int amsgrad, const int sr,
                               const int ema) {
  const __m256 g = grad8(t, i, k, gd);
  const __m256 p0 = sr ? mixprec__opt_load8(t->param, MIXPREC_BF16, i) : _mm256_loadu_ps(P + i);
  __m256 m = _mm256_loadu_ps(t->exp_avg + i);
  __m256 v = _mm256_loadu_ps(t->exp_avg_sq + i);
  __m256 vmax = amsgrad ? _mm256_loadu_ps(t->max_exp_avg_sq + i) : _mm256_setzero_ps();
  const __m256 p = math8(g, p0, &m, &v, &vmax, s, k, amsgrad);
  if (amsgrad) _mm256_storeu_ps(t->max_exp_avg_sq + i, vmax);
  _mm256_storeu_ps(t->exp_avg + i, m);
  _mm256_storeu_ps(t->exp_avg_sq + i, v);
  if (ema) mixprec__opt_ema8(s->ema, i, p, s->ema_w);
  return p;
}

/* One dtype combination (constants at each call). */
MIXPREC__FORCE_INLINE int64_t body(const mixprec_opt_tensor *t_in, int64_t begin, int64_t end,
                             const mixprec__adamw_scalars *s_in, const mixprec__adamw_consts *k_in,
                             const mixprec_dtype pd, const mixprec_dtype gd, const int amsgrad,
                             const int sr, const int ema) {
  /* Local copies, kept in registers (MIXPREC__OPT_LOCAL). */
  MIXPREC__OPT_LOCAL(mixprec_opt_tensor, t, t_in);
  MIXPREC__OPT_LOCAL(mixprec__adamw_scalars, s, s_in);
  MIXPREC__OPT_LOCAL(mixprec__adamw_consts, k, k_in);
  float *P = pd != MIXPREC_F32 && !sr ? t->master : (float *)t->param;
  int64_t i = begin;
#define UPDATE8(j, r) update8(t, j, P, s, k, gd, amsgrad, r, ema)
  MIXPREC__OPT_BODY_LOOP(t, P, pd, sr, s->sr_key, k->stream, i, end, UPDATE8);
#undef UPDATE8
  return i;
}

/* The param dtype (BF16 master-free: sr), the grad dtype, amsgrad and EMA
 * on/off are constants of each instantiation: with EMA off the loop is
 * exactly the one without the feature. */
int64_t mixprec__adamw_body_avx2(const mixprec_opt_tensor *t, int64_t begin, int64_t end,
                                 const mixprec__adamw_scalars *s, const mixprec__adamw_consts *k) {
#define MIXPREC__ADAMW_BODY(AMS, EMA)                                                         \
  MIXPREC__DISPATCH(t->param_dtype, PD, MIXPREC__DISPATCH(t->grad_dtype, GD, {              \
    if (PD == MIXPREC_BF16 && mixprec__opt_is_sr(t)) return body(t, begin, end, s, k, PD, GD, AMS, 1, EMA); \
    return body(t, begin, end, s, k, PD, GD, AMS, 0, EMA);                                  \
  }))
  if (s->ema) {
    if (k->h.amsgrad) MIXPREC__ADAMW_BODY(1, 1);
    else MIXPREC__ADAMW_BODY(0, 1);
  } else {
    if (k->h.amsgrad) MIXPREC__ADAMW_BODY(1, 0);
    else MIXPREC__ADAMW_BODY(0, 0);
  }
#undef MIXPREC__ADAMW_BODY
  return begin;
}

/* ---- the lean state (mixprec_state_dtype) --------------------------------
 * One vector as update8, with the param, its remainder and the moments in
 * their formats: pm (mixprec__opt_param_mode), dm and dv are constants of
 * each instantiation, so every vector runs only its formats' code; the new
 * Q8 moments go to the block buffers, encoded by the caller at the block's
 * end. */
MIXPREC__FORCE_INLINE void lean8(const mixprec_opt_tensor *t, int64_t i, float *P,
                                 const mixprec__adamw_scalars *s, const mixprec__adamw_consts *k,
                                 const mixprec__lean_ctx *c, const mixprec_dtype gd, const int pm,
                                 const mixprec_state_dtype dm, const mixprec_state_dtype dv) {
  const __m256 g = grad8(t, i, k, gd);
  const __m256 p0 = mixprec__opt_lean_param_load8(t, P, i, pm);
  __m256 m = mixprec__opt_state_load8(t->exp_avg_data, dm, i, c->sc0, c->tab_s, 1);
  __m256 v = mixprec__opt_state_load8(t->exp_avg_sq_data, dv, i, c->sc1, c->tab_u, 0);
  const int amsgrad = k->h.amsgrad;
  __m256 vmax = amsgrad ? _mm256_loadu_ps(t->max_exp_avg_sq + i) : _mm256_setzero_ps();
  const __m256 p = math8(g, p0, &m, &v, &vmax, s, k, amsgrad);
  if (amsgrad) _mm256_storeu_ps(t->max_exp_avg_sq + i, vmax);
  mixprec__opt_state_store8(t->exp_avg_data, dm, i, m, c->k0, c->q0, c->b0);
  mixprec__opt_state_store8(t->exp_avg_sq_data, dv, i, v, c->k1, c->q1, c->b0);
  if (s->ema) mixprec__opt_ema8(s->ema, i, p, s->ema_w);
  mixprec__opt_lean_param_store8(t, P, i, pm, s->sr_key, p);
}

MIXPREC__FORCE_INLINE int64_t lean_body(const mixprec_opt_tensor *t_in, int64_t begin, int64_t end,
                                        const mixprec__adamw_scalars *s_in, const mixprec__adamw_consts *k_in,
                                        const mixprec__lean_ctx *c_in, const mixprec_dtype gd, const int pm,
                                        const mixprec_state_dtype dm, const mixprec_state_dtype dv) {
  /* Local copies, kept in registers (MIXPREC__OPT_LOCAL). */
  MIXPREC__OPT_LOCAL(mixprec_opt_tensor, t, t_in);
  MIXPREC__OPT_LOCAL(mixprec__adamw_scalars, s, s_in);
  MIXPREC__OPT_LOCAL(mixprec__adamw_consts, k, k_in);
  MIXPREC__OPT_LOCAL(mixprec__lean_ctx, c, c_in);
  float *P = t->param_dtype != MIXPREC_F32 ? t->master : (float *)t->param;
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) lean8(t, i, P, s, k, c, gd, pm, dm, dv);
  return i;
}

int64_t mixprec__adamw_lean_avx2(const mixprec_opt_tensor *t, int64_t begin, int64_t end,
                                 const mixprec__adamw_scalars *s, const mixprec__adamw_consts *k,
                                 const mixprec__lean_ctx *c) {
  MIXPREC__PM_DISPATCH(t, PM, MIXPREC__STATE_DISPATCH(t->exp_avg_dtype, DM, MIXPREC__STATE_DISPATCH(
      t->exp_avg_sq_dtype, DV, MIXPREC__DISPATCH(t->grad_dtype, GD,
          return lean_body(t, begin, end, s, k, c, GD, PM, DM, DV)))));
  return begin;
}

/* One Q8 block's codes and scale (mixprec__q8_store_block), 8 at a time. */
void mixprec__q8_store_block_avx2(const float *x, int n, uint8_t *codes, float *scale,
                                  const mixprec__q8_tabs *tb, int is_signed) {
  __m256 mx8 = _mm256_setzero_ps();
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_loadu_ps(x + j));
    /* finite only: a NaN or inf compares false */
    const __m256 keep = _mm256_cmp_ps(a, _mm256_set1_ps(3.40282346638528859812e+38f), _CMP_LE_OQ);
    mx8 = _mm256_max_ps(mx8, _mm256_and_ps(a, keep));
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, mx8);
  float mx = 0.0f;
  for (int l = 0; l < 8; l++) mx = lanes[l] > mx ? lanes[l] : mx;
  for (int r = j; r < n; r++) mx = mixprec__q8_absmax_step(mx, x[r]);
  const float inv = mixprec__q8_inv(mx);
  const __m256 inv8 = _mm256_set1_ps(inv);
  int i = 0;
  if (is_signed)
    for (; i + 8 <= n; i += 8) _mm_storel_epi64((__m128i *)(codes + i), mixprec__q8_encode8(_mm256_loadu_ps(x + i), inv8, tb, 1));
  else
    for (; i + 8 <= n; i += 8) _mm_storel_epi64((__m128i *)(codes + i), mixprec__q8_encode8(_mm256_loadu_ps(x + i), inv8, tb, 0));
  for (; i < n; i++) codes[i] = mixprec__q8_encode(x[i], inv, is_signed);
  *scale = mx;
}
