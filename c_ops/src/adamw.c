/* Fused multi-tensor AdamW step with optional FP32 master weights.
 *
 * FP32 results are bitwise equal to torch.optim.AdamW(fused=True) on CPU as
 * built for ATEN_CPU_CAPABILITY=avx2 (checked against torch 2.14.1 by
 * tests/python/test_optim_capi.py). The formulas follow torch's fused CPU
 * kernel, aten/src/ATen/native/cpu/FusedAdamKernel.cpp, adam_math<float,
 * float, ADAM_MODE::ADAMW> (the Half/BFloat16 overload is not followed: a
 * low-precision param is updated here through its FP32 master, like torch
 * run on an FP32 copy), and what GCC makes of it: ATen's AVX2 kernels are
 * compiled with -mavx2 -mfma and GCC's default -ffp-contract=fast, so a
 * product feeding an add is contracted into one fused multiply-add, in the
 * Vectorized<float> body (whose operators are plain vector arithmetic) as well
 * as in the scalar tail. Which product is fused differs between the two loops,
 * so the split is reproduced: torch processes each tensor in tasks of whole
 * 64-byte cache lines (16 floats), and in each task a vectorised body over
 * Vectorized<float>::size() lanes (MIXPREC__OPT_TORCH_VEC, 8 with AVX2) and a
 * scalar tail; task boundaries are multiples of 16, so the tail is always
 * the tensor's last numel % MIXPREC__OPT_TORCH_VEC elements.
 *
 * Per element, in float (c = rounded once to float from double; fma = fmaf):
 *   g = g / grad_scale;  grad = g (unscale_grads: rounded to the grad's
 *                        dtype, nearest even; an extra store, the update
 *                        is unchanged);  g = -g (maximize)
 *   p = p * c(1 - lr*wd)                                  (if wd != 0)
 *   m = fma(w, g - m, m)          if |w| < 0.5, w = c(1 - beta1)
 *     = fma(w - 1, g - m, g)      otherwise       (exp_avg.lerp_(g, w))
 *   v = fma(c(1-beta2) * g, g, v * c(beta2))      body
 *     = fma(v, c(beta2), (c(1-beta2) * g) * g)    tail
 *   vmax = max(vmax, v)    body: Vectorized maximum, a NaN operand gives the
 *                          all-ones NaN; tail: std::max(vmax, v)
 *   p = p - (c(step_size) * m) / (sqrt(v or vmax) / c(sqrt(bc2)) + c(eps))
 *   ema = lerp(ema, p, c(1 - decay))   (EMA of the weights, mixprec_ema_params)
 * with step_size = lr / (1 - beta1^t), bc2 = 1 - beta2^t in double, t the
 * float step count. torch's AVX512 capability gives the same bits
 * (tests/python/optim/test_optim_capi.py passes under AVX2 and AVX512,
 * checked on an AVX-512 EPYC, 2026-12-02); DEFAULT and NEON/SVE builds,
 * compiled without contraction, are not matched bit for bit. */
#include "optim_driver.h"

typedef mixprec__adamw_scalars adamw_scalars;
typedef mixprec__adamw_consts adamw_consts;

/* Elements [begin, end) of one tensor, all in torch's vectorised body
 * (tail == 0) or all in its scalar tail (tail == 1). Inlined twice with a
 * constant `tail`. */
MIXPREC__FORCE_INLINE void adamw_range(const mixprec_opt_tensor *t, int64_t begin, int64_t end,
                                 const adamw_scalars *s, const adamw_consts *k, const int tail) {
  const int half = t->param_dtype != MIXPREC_F32;
  const int sr = mixprec__opt_is_sr(t);
  float *P = half ? t->master : (float *)t->param;
  float *M = t->exp_avg, *V = t->exp_avg_sq, *VM = t->max_exp_avg_sq;
  float *E = s->ema;
  const mixprec__adamw_tc c = {s->decay, s->step_size, s->bc2_sqrt};
  for (int64_t i = begin; i < end; i++) {
    const float g = MIXPREC__OPT_GRAD_IN(t, i, k);
    const float p0 = mixprec__opt_param_get(t, P, i, sr);
    float vmax = k->h.amsgrad ? VM[i] : 0.0f;
    const float p = mixprec__adamw_math(g, p0, &M[i], &V[i], &vmax, &k->h, &c, tail);
    if (k->h.amsgrad) VM[i] = vmax;
    if (E) E[i] = mixprec__ema_lerp(E[i], p, s->ema_w);
    mixprec__opt_param_put(t, P, i, sr, half, s->sr_key, p);
  }
}

static int64_t adamw_body_scalar(const mixprec_opt_tensor *t, int64_t begin, int64_t end,
                                 const adamw_scalars *s, const adamw_consts *k) {
  adamw_range(t, begin, end, s, k, 0);
  return end;
}

/* The body kernel of the active ISA (the scalar one is the reference). */
static mixprec__adamw_body_fn adamw_body_kernel(void) {
  switch (mixprec__active_isa()) {
#if defined(MIXPREC_X86)
    case MIXPREC_ISA_AVX512:
      return mixprec__adamw_body_avx512;
    case MIXPREC_ISA_AVX2:
      return mixprec__adamw_body_avx2;
#endif
    default:
      return adamw_body_scalar;
  }
}

/* Elements [begin, end) of a tensor with lean state (mixprec_state_dtype):
 * begin is a multiple of the Q8 block, so each block of 256 is updated (the
 * active ISA's lean body over its whole vectors in torch's vectorised body,
 * this scalar loop over the rest, torch's tail from tail_from on) and then
 * its Q8 moments, if any, are encoded from the new values. */
static void adamw_lean_range(const mixprec_opt_tensor *t, int64_t begin, int64_t end,
                             const adamw_scalars *s, const adamw_consts *k,
                             const mixprec__lean_kernels *lk) {
  const int sr = mixprec__opt_is_sr(t);
  float *P = t->param_dtype != MIXPREC_F32 ? t->master : (float *)t->param;
  const mixprec_state_dtype dm = t->exp_avg_dtype, dv = t->exp_avg_sq_dtype;
  const int64_t tail_from = mixprec__opt_tail_start(t->numel);
  const mixprec__adamw_tc c = {s->decay, s->step_size, s->bc2_sqrt};
  float *E = s->ema, *VM = t->max_exp_avg_sq;
  float qm[MIXPREC__Q8_BLOCK], qv[MIXPREC__Q8_BLOCK];
  mixprec__lean_ctx x;
  x.q0 = qm;
  x.q1 = qv;
  x.k0 = mixprec__sr_stream_key(s->sr_key, 1);
  x.k1 = mixprec__sr_stream_key(s->sr_key, 2);
  x.tab_s = lk->tab_s;
  x.tab_u = lk->tab_u;
  for (int64_t b0 = begin; b0 < end; b0 += MIXPREC__Q8_BLOCK) {
    const int64_t b1 = end - b0 < MIXPREC__Q8_BLOCK ? end : b0 + MIXPREC__Q8_BLOCK;
    x.b0 = b0;
    x.sc0 = dm == MIXPREC_STATE_Q8 ? t->exp_avg_scale[b0 / MIXPREC__Q8_BLOCK] : 0.0f;
    x.sc1 = dv == MIXPREC_STATE_Q8 ? t->exp_avg_sq_scale[b0 / MIXPREC__Q8_BLOCK] : 0.0f;
    int64_t i = b0;
    if (lk->adamw) i = lk->adamw(t, b0, b1 < tail_from ? b1 : tail_from, s, k, &x);
    for (; i < b1; i++) {
      const float g = MIXPREC__OPT_GRAD_IN(t, i, k);
      float m = mixprec__opt_state_get(t->exp_avg_data, dm, t->exp_avg_scale, i, 1);
      float v = mixprec__opt_state_get(t->exp_avg_sq_data, dv, t->exp_avg_sq_scale, i, 0);
      float vmax = k->h.amsgrad ? VM[i] : 0.0f;
      const float p = mixprec__adamw_math(g, mixprec__opt_lean_param_get(t, P, i, sr), &m, &v,
                                          &vmax, &k->h, &c, i >= tail_from);
      if (k->h.amsgrad) VM[i] = vmax;
      mixprec__opt_state_put(t->exp_avg_data, dm, i, m, x.k0, qm);
      mixprec__opt_state_put(t->exp_avg_sq_data, dv, i, v, x.k1, qv);
      if (E) E[i] = mixprec__ema_lerp(E[i], p, s->ema_w);
      mixprec__opt_lean_param_put(t, P, i, sr, s->sr_key, p);
    }
    if (dm == MIXPREC_STATE_Q8)
      lk->store(qm, (int)(b1 - b0), (uint8_t *)t->exp_avg_data + b0,
                &t->exp_avg_scale[b0 / MIXPREC__Q8_BLOCK], lk->tab_s, 1);
    if (dv == MIXPREC_STATE_Q8)
      lk->store(qv, (int)(b1 - b0), (uint8_t *)t->exp_avg_sq_data + b0,
                &t->exp_avg_sq_scale[b0 / MIXPREC__Q8_BLOCK], lk->tab_u, 0);
  }
}

static void adamw_chunk(const mixprec_opt_tensor *t, int64_t begin, int64_t end,
                        const adamw_scalars *s, const adamw_consts *k,
                        mixprec__adamw_body_fn body, const mixprec__lean_kernels *lk) {
  if (mixprec__opt_is_lean(t, 1)) {
    adamw_lean_range(t, begin, end, s, k, lk);
    return;
  }
  const int64_t mid = mixprec__opt_tail_split(t->numel, begin, end);
  const int64_t done = body(t, begin, mid, s, k);
  adamw_range(t, done, mid, s, k, 0);
  adamw_range(t, mid, end, s, k, 1);
}

mixprec_adamw_params mixprec_adamw_params_default(void) {
  mixprec_adamw_params p;
  MIXPREC__OPT_PARAMS_DEFAULT(&p);
  p.beta1 = 0.9;
  p.beta2 = 0.999;
  p.eps = 1e-8;
  p.weight_decay = 1e-2;
  p.amsgrad = 0;
  return p;
}

/* AdamW's per-step state for the driver (mixprec__opt_traits). */
typedef struct adamw_run {
  adamw_consts k;
  mixprec__ema_hyper eh;
  double lr;
  mixprec__adamw_body_fn body;
  mixprec__lean_kernels lk;
} adamw_run;

static void adamw_prepare(const void *pv, const mixprec_opt_tensor *list, int64_t n,
                          int64_t total, void *rv) {
  const mixprec_adamw_params *p = (const mixprec_adamw_params *)pv;
  adamw_run *r = (adamw_run *)rv;
  r->lr = mixprec__opt_lr(p->lr_tensor, p->lr);
  r->k.h = mixprec__adamw_hyper_of(p);
  MIXPREC__OPT_GRAD_CONSTS(&r->k, p, total);
  r->eh = mixprec__ema_hyper_of(&p->ema);
  r->body = adamw_body_kernel();
  mixprec__lean_kernels_init(&r->lk, list, n, 1);
}

static void adamw_tensor_scalars(const void *pv, const void *rv, const mixprec_opt_tensor *list,
                                 int64_t i, void *out) {
  const mixprec_adamw_params *p = (const mixprec_adamw_params *)pv;
  const adamw_run *r = (const adamw_run *)rv;
  adamw_scalars *sc = (adamw_scalars *)out;
  const float t = *list[i].step + 1.0f;
  const double step = (double)t;
  const double bc1 = 1.0 - pow(p->beta1, step);
  const double bc2 = 1.0 - pow(p->beta2, step);
  sc->new_step = t;
  mixprec__adamw_tensor_consts(r->lr, p->weight_decay, bc1, bc2, &sc->decay, &sc->step_size,
                               &sc->bc2_sqrt);
  sc->sr_key = mixprec__sr_key(p->sr_seed, (uint64_t)i, t);
  const mixprec__ema_scalars e = mixprec__ema_scalars_of(&p->ema, &r->eh, i, t);
  sc->ema = e.buf;
  sc->ema_w = e.w;
}

static void adamw_run_chunk(const mixprec_opt_tensor *t, int64_t begin, int64_t end,
                            const void *sc, const void *rv) {
  const adamw_run *r = (const adamw_run *)rv;
  adamw_chunk(t, begin, end, (const adamw_scalars *)sc, &r->k, r->body, &r->lk);
}

static const mixprec__opt_traits adamw_traits = {sizeof(adamw_scalars), adamw_prepare,
                                                 adamw_tensor_scalars, adamw_run_chunk};

mixprec_status mixprec_adamw_step(const mixprec_opt_tensor *list, int64_t n,
                                  const mixprec_adamw_params *p) {
  const mixprec_status st = mixprec__adamw_check(list, n, p);
  if (st != MIXPREC_OK) return st;
  adamw_run r;
  return mixprec__opt_step_drive(&adamw_traits, list, n, p, p->found_inf, &r);
}
