/* AVX-512 (F, BW, VL, DQ) body kernels of the AdamW step (adamw.c): those of
 * adamw_avx2.c at 16 lanes, the same operations in the same order (fmadd
 * exactly where the scalar body calls fmaf, -ffp-contract=off elsewhere),
 * so the results are bit-identical to the scalar body and to AVX2. A range's
 * last whole 8 elements go to the AVX2 kernel. Compiled with the AVX-512
 * flags (CMakeLists.txt), called only when the CPU has them. */
#include "optim_common.h"

/* mixprec__adamw_math's body formulas for 16 lanes (adamw_avx2.c's math8). */
MIXPREC__FORCE_INLINE __m512 math16(__m512 g, __m512 p, __m512 *m, __m512 *v, __m512 *vmax,
                                    const mixprec__adamw_scalars *s, const mixprec__adamw_consts *k,
                                    const int amsgrad) {
  if (k->h.decay_on) p = _mm512_mul_ps(p, _mm512_set1_ps(s->decay));
  const __m512 diff = _mm512_sub_ps(g, *m);
  *m = k->h.w_small ? _mm512_fmadd_ps(_mm512_set1_ps(k->h.w), diff, *m)
                    : _mm512_fmadd_ps(_mm512_set1_ps(k->h.w_m1), diff, g);
  const __m512 cg = _mm512_mul_ps(_mm512_set1_ps(k->h.c2), g);
  *v = _mm512_fmadd_ps(cg, g, _mm512_mul_ps(*v, _mm512_set1_ps(k->h.beta2)));
  __m512 vd = *v;
  if (amsgrad) {
    /* torch's AVX2 maximum: max(old, v), all ones where either is NaN */
    vd = _mm512_mask_mov_ps(_mm512_max_ps(*vmax, vd), _mm512_cmp_ps_mask(*vmax, vd, _CMP_UNORD_Q),
                            _mm512_castsi512_ps(_mm512_set1_epi32(-1)));
    *vmax = vd;
  }
  const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vd), _mm512_set1_ps(s->bc2_sqrt)),
                                     _mm512_set1_ps(k->h.eps));
  const __m512 upd = _mm512_mul_ps(_mm512_set1_ps(s->step_size), *m);
  return _mm512_sub_ps(p, _mm512_div_ps(upd, denom));
}

MIXPREC__FORCE_INLINE __m512 grad16(const mixprec_opt_tensor *t, int64_t i, const mixprec__adamw_consts *k,
                                    const mixprec_dtype gd) {
  __m512 g = mixprec__opt_load16(t->grad, gd, i);
  if (k->has_scale) g = _mm512_div_ps(g, _mm512_set1_ps(k->scale));
  if (k->unscale) mixprec__opt_store16_grad(t->grad, gd, i, g);
  if (k->h.maximize) g = mixprec__opt_neg16(g);
  return g;
}

MIXPREC__FORCE_INLINE __m512 update16(const mixprec_opt_tensor *t, int64_t i, const float *P,
                                      const mixprec__adamw_scalars *s, const mixprec__adamw_consts *k,
                                      const mixprec_dtype gd, const int amsgrad, const int sr, const int ema) {
  const __m512 g = grad16(t, i, k, gd);
  const __m512 p0 = sr ? mixprec__opt_load16(t->param, MIXPREC_BF16, i) : _mm512_loadu_ps(P + i);
  __m512 m = _mm512_loadu_ps(t->exp_avg + i);
  __m512 v = _mm512_loadu_ps(t->exp_avg_sq + i);
  __m512 vmax = amsgrad ? _mm512_loadu_ps(t->max_exp_avg_sq + i) : _mm512_setzero_ps();
  const __m512 p = math16(g, p0, &m, &v, &vmax, s, k, amsgrad);
  if (amsgrad) _mm512_storeu_ps(t->max_exp_avg_sq + i, vmax);
  _mm512_storeu_ps(t->exp_avg + i, m);
  _mm512_storeu_ps(t->exp_avg_sq + i, v);
  if (ema) mixprec__opt_ema16(s->ema, i, p, s->ema_w);
  return p;
}

MIXPREC__FORCE_INLINE int64_t body(const mixprec_opt_tensor *t_in, int64_t begin, int64_t end,
                                   const mixprec__adamw_scalars *s_in, const mixprec__adamw_consts *k_in,
                                   const mixprec_dtype pd, const mixprec_dtype gd, const int amsgrad,
                                   const int sr, const int ema) {
  MIXPREC__OPT_LOCAL(mixprec_opt_tensor, t, t_in);
  MIXPREC__OPT_LOCAL(mixprec__adamw_scalars, s, s_in);
  MIXPREC__OPT_LOCAL(mixprec__adamw_consts, k, k_in);
  float *P = pd != MIXPREC_F32 && !sr ? t->master : (float *)t->param;
  int64_t i = begin;
#define UPDATE16(j, r) update16(t, j, P, s, k, gd, amsgrad, r, ema)
  MIXPREC__OPT_BODY_LOOP16(t, P, pd, sr, s->sr_key, k->stream, i, end, UPDATE16);
#undef UPDATE16
  return i;
}

int64_t mixprec__adamw_body_avx512(const mixprec_opt_tensor *t, int64_t begin, int64_t end,
                                   const mixprec__adamw_scalars *s, const mixprec__adamw_consts *k) {
  int64_t i = begin;
#define MIXPREC__ADAMW_BODY(AMS, EMA)                                                          \
  MIXPREC__DISPATCH(t->param_dtype, PD, MIXPREC__DISPATCH(t->grad_dtype, GD, {               \
    if (PD == MIXPREC_BF16 && mixprec__opt_is_sr(t)) i = body(t, begin, end, s, k, PD, GD, AMS, 1, EMA); \
    else i = body(t, begin, end, s, k, PD, GD, AMS, 0, EMA);                                 \
  }))
  if (s->ema) {
    if (k->h.amsgrad) MIXPREC__ADAMW_BODY(1, 1);
    else MIXPREC__ADAMW_BODY(0, 1);
  } else {
    if (k->h.amsgrad) MIXPREC__ADAMW_BODY(1, 0);
    else MIXPREC__ADAMW_BODY(0, 0);
  }
#undef MIXPREC__ADAMW_BODY
  return end - i >= 8 ? mixprec__adamw_body_avx2(t, i, end, s, k) : i;
}

/* ---- the lean state (adamw_avx2.c's lean8 at 16 lanes) ----------------- */
MIXPREC__FORCE_INLINE void lean16(const mixprec_opt_tensor *t, int64_t i, float *P,
                                  const mixprec__adamw_scalars *s, const mixprec__adamw_consts *k,
                                  const mixprec__lean_ctx *c, const mixprec_dtype gd, const int pm,
                                  const mixprec_state_dtype dm, const mixprec_state_dtype dv) {
  const __m512 g = grad16(t, i, k, gd);
  const __m512 p0 = mixprec__opt_lean_param_load16(t, P, i, pm);
  __m512 m = mixprec__opt_state_load16(t->exp_avg_data, dm, i, c->sc0, c->tab_s);
  __m512 v = mixprec__opt_state_load16(t->exp_avg_sq_data, dv, i, c->sc1, c->tab_u);
  const int amsgrad = k->h.amsgrad;
  __m512 vmax = amsgrad ? _mm512_loadu_ps(t->max_exp_avg_sq + i) : _mm512_setzero_ps();
  const __m512 p = math16(g, p0, &m, &v, &vmax, s, k, amsgrad);
  if (amsgrad) _mm512_storeu_ps(t->max_exp_avg_sq + i, vmax);
  mixprec__opt_state_store16(t->exp_avg_data, dm, i, m, c->k0, c->q0, c->b0);
  mixprec__opt_state_store16(t->exp_avg_sq_data, dv, i, v, c->k1, c->q1, c->b0);
  if (s->ema) mixprec__opt_ema16(s->ema, i, p, s->ema_w);
  mixprec__opt_lean_param_store16(t, P, i, pm, s->sr_key, p);
}

MIXPREC__FORCE_INLINE int64_t lean_body(const mixprec_opt_tensor *t_in, int64_t begin, int64_t end,
                                        const mixprec__adamw_scalars *s_in, const mixprec__adamw_consts *k_in,
                                        const mixprec__lean_ctx *c_in, const mixprec_dtype gd, const int pm,
                                        const mixprec_state_dtype dm, const mixprec_state_dtype dv) {
  MIXPREC__OPT_LOCAL(mixprec_opt_tensor, t, t_in);
  MIXPREC__OPT_LOCAL(mixprec__adamw_scalars, s, s_in);
  MIXPREC__OPT_LOCAL(mixprec__adamw_consts, k, k_in);
  MIXPREC__OPT_LOCAL(mixprec__lean_ctx, c, c_in);
  float *P = t->param_dtype != MIXPREC_F32 ? t->master : (float *)t->param;
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) lean16(t, i, P, s, k, c, gd, pm, dm, dv);
  return i;
}

int64_t mixprec__adamw_lean_avx512(const mixprec_opt_tensor *t, int64_t begin, int64_t end,
                                   const mixprec__adamw_scalars *s, const mixprec__adamw_consts *k,
                                   const mixprec__lean_ctx *c) {
  int64_t i = begin;
  MIXPREC__PM_DISPATCH(t, PM, MIXPREC__STATE_DISPATCH(t->exp_avg_dtype, DM, MIXPREC__STATE_DISPATCH(
      t->exp_avg_sq_dtype, DV, MIXPREC__DISPATCH(t->grad_dtype, GD,
          i = lean_body(t, begin, end, s, k, c, GD, PM, DM, DV)))));
  return end - i >= 8 ? mixprec__adamw_lean_avx2(t, i, end, s, k, c) : i;
}

/* One Q8 block's codes and scale (mixprec__q8_store_block), 16 at a time,
 * the block's last n % 16 with masked loads and stores. */
void mixprec__q8_store_block_avx512(const float *x, int n, uint8_t *codes, float *scale,
                                    const mixprec__q8_tabs *tb, int is_signed) {
  __m512 mx16 = _mm512_setzero_ps();
  for (int j = 0; j < n; j += 16) {
    const __mmask16 in = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1u);
    const __m512 a = _mm512_abs_ps(_mm512_maskz_loadu_ps(in, x + j));
    /* finite only: a NaN or inf compares false (a max is exact: any order) */
    mx16 = _mm512_max_ps(mx16, _mm512_maskz_mov_ps(
        _mm512_cmp_ps_mask(a, _mm512_set1_ps(3.40282346638528859812e+38f), _CMP_LE_OQ), a));
  }
  const float mx = _mm512_reduce_max_ps(mx16);
  const float inv = mixprec__q8_inv(mx);
  const __m512 inv16 = _mm512_set1_ps(inv);
#define MIXPREC__Q8_ENC_LOOP(SIGNED)                                                          \
  for (int i = 0; i < n; i += 16) {                                                         \
    const __mmask16 in = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u); \
    _mm_mask_storeu_epi8(codes + i, in,                                                     \
                         mixprec__q8_encode16(_mm512_maskz_loadu_ps(in, x + i), inv16, tb, SIGNED)); \
  }
  if (is_signed) MIXPREC__Q8_ENC_LOOP(1)
  else MIXPREC__Q8_ENC_LOOP(0)
#undef MIXPREC__Q8_ENC_LOOP
  *scale = mx;
}
