/* Fused multi-tensor SGD step with optional FP32 master weights.
 *
 * FP32 results are bitwise equal to torch.optim.SGD(fused=True) on CPU as
 * built for ATEN_CPU_CAPABILITY=avx2 (checked against torch 2.14.1 by
 * tests/python/test_optim_capi.py; with momentum 0 also equal to the default
 * foreach/for-loop SGD, whose add_(grad, alpha=-lr) is a fused multiply-add
 * too). The formulas follow torch's fused CPU kernel,
 * aten/src/ATen/native/cpu/FusedSGDKernel.cpp, sgd_math<float, float> (the
 * Half/BFloat16 overload is not followed: a low-precision param is updated
 * here through its FP32 master, like torch run on an FP32 copy), and what GCC
 * makes of it. The vectorised body calls vec::fmadd explicitly for the weight
 * decay, the momentum update and nesterov; the remaining `param_vec +=
 * grad_vec * Vec(-lr)` and the whole scalar tail are contracted into fused
 * multiply-adds by GCC (-mfma, -ffp-contract=fast), and in the momentum update
 * the tail fuses the other product than the body. The tail is the tensor's
 * last numel % MIXPREC__OPT_TORCH_VEC elements (see optim_consts.h).
 *
 * Per element, in float (c = rounded once to float from double; fma = fmaf):
 *   g = g / grad_scale;  grad = g (unscale_grads: rounded to the grad's
 *                        dtype, nearest even; an extra store, the update
 *                        is unchanged);  g = -g (maximize)
 *   g = fma(p, c(wd), g)                                   (if wd != 0)
 *   buf = g                                                first step
 *       = fma(c(1 - dampening), g, buf * c(momentum))      body
 *       = fma(buf, c(momentum), g * c(1 - dampening))      tail
 *   g = nesterov ? fma(buf, c(momentum), g) : buf          (if momentum != 0)
 *   p = fma(-g, c(lr), p)                                  (p - g*lr, rounded once)
 *   ema = lerp(ema, p, c(1 - decay))   (EMA of the weights, mixprec_ema_params)
 * torch's other capabilities (DEFAULT, NEON/SVE builds without contraction,
 * AVX-512 with width 16) are not matched bit for bit. */
#include "optim_driver.h"

typedef mixprec__sgd_consts sgd_consts;

/* Elements [begin, end) of one tensor, all in torch's vectorised body
 * (tail == 0) or all in its scalar tail (tail == 1). */
MIXPREC__FORCE_INLINE void sgd_range(const mixprec_opt_tensor *t, int64_t begin, int64_t end,
                               int first, uint32_t sr_key, const mixprec__ema_scalars *ema,
                               const sgd_consts *k, const int tail) {
  const int half = t->param_dtype != MIXPREC_F32;
  const int sr = mixprec__opt_is_sr(t);
  float *P = half ? t->master : (float *)t->param;
  float *B = t->momentum_buffer;
  float *E = ema->buf;
  for (int64_t i = begin; i < end; i++) {
    const float g = MIXPREC__OPT_GRAD_IN(t, i, k);
    const float p0 = mixprec__opt_param_get(t, P, i, sr);
    float buf = k->h.momentum_on && !first ? B[i] : 0.0f;
    const float p = mixprec__sgd_math(g, p0, &buf, &k->h, first, tail);
    if (k->h.momentum_on) B[i] = buf;
    if (E) E[i] = mixprec__ema_lerp(E[i], p, ema->w);
    mixprec__opt_param_put(t, P, i, sr, half, sr_key, p);
  }
}

static int64_t sgd_body_scalar(const mixprec_opt_tensor *t, int64_t begin, int64_t end,
                               int first, uint32_t sr_key, const mixprec__ema_scalars *ema,
                               const sgd_consts *k) {
  sgd_range(t, begin, end, first, sr_key, ema, k, 0);
  return end;
}

/* The body kernel of the active ISA (the scalar one is the reference). */
static mixprec__sgd_body_fn sgd_body_kernel(void) {
  switch (mixprec__active_isa()) {
#if defined(MIXPREC_X86)
    case MIXPREC_ISA_AVX512:
      return mixprec__sgd_body_avx512;
    case MIXPREC_ISA_AVX2:
      return mixprec__sgd_body_avx2;
#endif
    default:
      return sgd_body_scalar;
  }
}

/* Elements [begin, end) of a tensor with lean state (as adamw_lean_range:
 * block by block, the lean body first, Q8 buffers encoded per block). */
static void sgd_lean_range(const mixprec_opt_tensor *t, int64_t begin, int64_t end, int first,
                           uint32_t sr_key, const mixprec__ema_scalars *ema, const sgd_consts *k,
                           const mixprec__lean_kernels *lk) {
  const int sr = mixprec__opt_is_sr(t);
  float *P = t->param_dtype != MIXPREC_F32 ? t->master : (float *)t->param;
  const mixprec_state_dtype db = t->exp_avg_dtype;
  const int64_t tail_from = mixprec__opt_tail_start(t->numel);
  float *E = ema->buf;
  float qb[MIXPREC__Q8_BLOCK];
  mixprec__lean_ctx x;
  x.q0 = qb;
  x.q1 = NULL;
  x.k0 = mixprec__sr_stream_key(sr_key, 1);
  x.k1 = 0;
  x.sc1 = 0.0f;
  x.tab_s = lk->tab_s;
  x.tab_u = lk->tab_u;
  const int q8 = k->h.momentum_on && db == MIXPREC_STATE_Q8;
  for (int64_t b0 = begin; b0 < end; b0 += MIXPREC__Q8_BLOCK) {
    const int64_t b1 = end - b0 < MIXPREC__Q8_BLOCK ? end : b0 + MIXPREC__Q8_BLOCK;
    x.b0 = b0;
    x.sc0 = q8 && !first ? t->exp_avg_scale[b0 / MIXPREC__Q8_BLOCK] : 0.0f;
    int64_t i = b0;
    if (lk->sgd) i = lk->sgd(t, b0, b1 < tail_from ? b1 : tail_from, first, sr_key, ema, k, &x);
    for (; i < b1; i++) {
      const float g = MIXPREC__OPT_GRAD_IN(t, i, k);
      float buf = k->h.momentum_on && !first
                      ? mixprec__opt_state_get(t->exp_avg_data, db, t->exp_avg_scale, i, 1)
                      : 0.0f;
      const float p = mixprec__sgd_math(g, mixprec__opt_lean_param_get(t, P, i, sr), &buf, &k->h,
                                        first, i >= tail_from);
      if (k->h.momentum_on) mixprec__opt_state_put(t->exp_avg_data, db, i, buf, x.k0, qb);
      if (E) E[i] = mixprec__ema_lerp(E[i], p, ema->w);
      mixprec__opt_lean_param_put(t, P, i, sr, sr_key, p);
    }
    if (q8)
      lk->store(qb, (int)(b1 - b0), (uint8_t *)t->exp_avg_data + b0,
                &t->exp_avg_scale[b0 / MIXPREC__Q8_BLOCK], lk->tab_s, 1);
  }
}

static void sgd_chunk(const mixprec_opt_tensor *t, int64_t begin, int64_t end, int first,
                      uint32_t sr_key, const mixprec__ema_scalars *ema, const sgd_consts *k,
                      mixprec__sgd_body_fn body, const mixprec__lean_kernels *lk) {
  if (mixprec__opt_is_lean(t, 0)) {
    sgd_lean_range(t, begin, end, first, sr_key, ema, k, lk);
    return;
  }
  const int64_t mid = mixprec__opt_tail_split(t->numel, begin, end);
  const int64_t done = body(t, begin, mid, first, sr_key, ema, k);
  sgd_range(t, done, mid, first, sr_key, ema, k, 0);
  sgd_range(t, mid, end, first, sr_key, ema, k, 1);
}

mixprec_sgd_params mixprec_sgd_params_default(void) {
  mixprec_sgd_params p;
  MIXPREC__OPT_PARAMS_DEFAULT(&p);
  p.momentum = 0.0;
  p.dampening = 0.0;
  p.weight_decay = 0.0;
  p.nesterov = 0;
  p.first_step = 0;
  return p;
}

/* SGD's per tensor scalars: its new count (0 without one), its "first step"
 * flag, its rounding key and its EMA. */
typedef struct sgd_scalars {
  float new_step; /* first: the driver writes it back */
  uint32_t sr_key;
  int first;
  mixprec__ema_scalars ema;
} sgd_scalars;

/* SGD's per-step state for the driver (mixprec__opt_traits). */
typedef struct sgd_run {
  sgd_consts k;
  mixprec__ema_hyper eh;
  mixprec__sgd_body_fn body;
  mixprec__lean_kernels lk;
} sgd_run;

static void sgd_prepare(const void *pv, const mixprec_opt_tensor *list, int64_t n, int64_t total,
                        void *rv) {
  const mixprec_sgd_params *p = (const mixprec_sgd_params *)pv;
  sgd_run *r = (sgd_run *)rv;
  r->k.h = mixprec__sgd_hyper_of(p, mixprec__opt_lr(p->lr_tensor, p->lr));
  MIXPREC__OPT_GRAD_CONSTS(&r->k, p, total);
  r->eh = mixprec__ema_hyper_of(&p->ema);
  r->body = sgd_body_kernel();
  mixprec__lean_kernels_init(&r->lk, list, n, 0);
}

static void sgd_tensor_scalars(const void *pv, const void *rv, const mixprec_opt_tensor *list,
                               int64_t i, void *out) {
  const mixprec_sgd_params *p = (const mixprec_sgd_params *)pv;
  const sgd_run *r = (const sgd_run *)rv;
  sgd_scalars *sc = (sgd_scalars *)out;
  const float *s = list[i].step;
  sc->first = s ? *s == 0.0f : p->first_step != 0;
  sc->new_step = s ? *s + 1.0f : 0.0f;
  sc->sr_key = mixprec__sr_key(p->sr_seed, (uint64_t)i, sc->new_step);
  /* A tensor with an EMA buffer has a step count (mixprec__sgd_check). */
  sc->ema = mixprec__ema_scalars_of(&p->ema, &r->eh, i, sc->new_step);
}

static void sgd_run_chunk(const mixprec_opt_tensor *t, int64_t begin, int64_t end,
                          const void *scv, const void *rv) {
  const sgd_run *r = (const sgd_run *)rv;
  const sgd_scalars *sc = (const sgd_scalars *)scv;
  sgd_chunk(t, begin, end, sc->first, sc->sr_key, &sc->ema, &r->k, r->body, &r->lk);
}

static const mixprec__opt_traits sgd_traits = {sizeof(sgd_scalars), sgd_prepare,
                                               sgd_tensor_scalars, sgd_run_chunk};

mixprec_status mixprec_sgd_step(const mixprec_opt_tensor *list, int64_t n,
                                const mixprec_sgd_params *p) {
  const mixprec_status st = mixprec__sgd_check(list, n, p);
  if (st != MIXPREC_OK) return st;
  sgd_run r;
  return mixprec__opt_step_drive(&sgd_traits, list, n, p, p->found_inf, &r);
}
