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
#include "optim_common.h"

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
    float g = mixprec__opt_unscale(mixprec__load_f32(t->grad, t->grad_dtype, i), k->has_scale,
                                   k->scale);
    if (k->unscale) mixprec__opt_store_grad(t->grad, t->grad_dtype, i, g);
    if (k->h.maximize) g = -g;
    const float p0 = sr ? mixprec__load_f32(t->param, MIXPREC_BF16, i) : P[i];
    float buf = k->h.momentum_on && !first ? B[i] : 0.0f;
    const float p = mixprec__sgd_math(g, p0, &buf, &k->h, first, tail);
    if (k->h.momentum_on) B[i] = buf;
    if (E) E[i] = mixprec__ema_lerp(E[i], p, ema->w);
    if (sr) {
      mixprec__opt_store_bf16_sr(t->param, i, sr_key, p);
    } else {
      P[i] = p;
      if (half) mixprec__opt_store_half(t->param, t->param_dtype, i, p);
    }
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
  x.tab_s = &lk->tab_s;
  x.tab_u = &lk->tab_u;
  const int q8 = k->h.momentum_on && db == MIXPREC_STATE_Q8;
  for (int64_t b0 = begin; b0 < end; b0 += MIXPREC__Q8_BLOCK) {
    const int64_t b1 = end - b0 < MIXPREC__Q8_BLOCK ? end : b0 + MIXPREC__Q8_BLOCK;
    x.b0 = b0;
    x.sc0 = q8 && !first ? t->exp_avg_scale[b0 / MIXPREC__Q8_BLOCK] : 0.0f;
    int64_t i = b0;
    if (lk->sgd) i = lk->sgd(t, b0, b1 < tail_from ? b1 : tail_from, first, sr_key, ema, k, &x);
    for (; i < b1; i++) {
      float g = mixprec__opt_unscale(mixprec__load_f32(t->grad, t->grad_dtype, i), k->has_scale,
                                     k->scale);
      if (k->unscale) mixprec__opt_store_grad(t->grad, t->grad_dtype, i, g);
      if (k->h.maximize) g = -g;
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
                &t->exp_avg_scale[b0 / MIXPREC__Q8_BLOCK], &lk->tab_s, 1);
  }
}

static void sgd_chunk(const mixprec_opt_tensor *t, int64_t begin, int64_t end, int first,
                      uint32_t sr_key, const mixprec__ema_scalars *ema, const sgd_consts *k,
                      mixprec__sgd_body_fn body, const mixprec__lean_kernels *lk) {
  if (mixprec__opt_is_lean(t, 0)) {
    sgd_lean_range(t, begin, end, first, sr_key, ema, k, lk);
    return;
  }
  const int64_t tail = mixprec__opt_tail_start(t->numel);
  const int64_t mid = end < tail ? end : (begin > tail ? begin : tail);
  const int64_t done = body(t, begin, mid, first, sr_key, ema, k);
  sgd_range(t, done, mid, first, sr_key, ema, k, 0);
  sgd_range(t, mid, end, first, sr_key, ema, k, 1);
}

mixprec_sgd_params mixprec_sgd_params_default(void) {
  mixprec_sgd_params p;
  p.lr = 1e-3;
  p.momentum = 0.0;
  p.dampening = 0.0;
  p.weight_decay = 0.0;
  p.nesterov = 0;
  p.maximize = 0;
  p.lr_tensor = NULL;
  p.grad_scale = NULL;
  p.found_inf = NULL;
  p.first_step = 0;
  p.sr_seed = 0;
  p.unscale_grads = 0;
  p.ema = mixprec__ema_params_default();
  return p;
}


mixprec_status mixprec_sgd_step(const mixprec_opt_tensor *list, int64_t n,
                                const mixprec_sgd_params *p) {
  mixprec_status st = mixprec__sgd_check(list, n, p);
  if (st != MIXPREC_OK) return st;
  if (mixprec__opt_skip(p->found_inf) || n == 0) return MIXPREC_OK;

  /* Per tensor: its "first step" flag, its new count and its rounding key.
   * Every count is read before any is written (tensors may share one). */
  typedef struct {
    float new_step;
    uint32_t sr_key;
    int first;
    mixprec__ema_scalars ema;
  } sgd_scalars;
  sgd_scalars *sc = (sgd_scalars *)malloc(sizeof(sgd_scalars) * (size_t)n);
  if (!sc) return MIXPREC_ERR_OUT_OF_MEMORY;
  int64_t n_chunks, total;
  int64_t *first = mixprec__opt_chunks(list, n, &n_chunks, &total);
  if (!first) {
    free(sc);
    return MIXPREC_ERR_OUT_OF_MEMORY;
  }
  const mixprec__ema_hyper eh = mixprec__ema_hyper_of(&p->ema);
  for (int64_t i = 0; i < n; i++) {
    const float *s = list[i].step;
    sc[i].first = s ? *s == 0.0f : p->first_step != 0;
    sc[i].new_step = s ? *s + 1.0f : 0.0f;
    sc[i].sr_key = mixprec__sr_key(p->sr_seed, (uint64_t)i, sc[i].new_step);
    /* A tensor with an EMA buffer has a step count (mixprec__sgd_check). */
    sc[i].ema = mixprec__ema_scalars_of(&p->ema, &eh, i, sc[i].new_step);
  }

  /* torch reads the learning rate tensor as a double (lr.item<double>()). */
  const double lr = p->lr_tensor ? (double)*p->lr_tensor : p->lr;
  sgd_consts k;
  k.h = mixprec__sgd_hyper_of(p, lr);
  k.has_scale = p->grad_scale != NULL;
  k.scale = p->grad_scale ? *p->grad_scale : 1.0f;
  k.unscale = p->grad_scale != NULL && p->unscale_grads != 0;
  k.stream = total >= MIXPREC__OPT_STREAM_MIN;

  const mixprec__sgd_body_fn body = sgd_body_kernel();
  mixprec__lean_kernels lk;
  mixprec__lean_kernels_init(&lk, list, n, 0);
  int n_threads = mixprec__num_threads();
  (void)n_threads;
#pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads) \
    if (total >= MIXPREC__OPT_PARALLEL_MIN && n_chunks > 1)
  for (int64_t c = 0; c < n_chunks; c++) {
    int64_t begin, end;
    const int64_t t = mixprec__opt_chunk_range(list, first, n, c, &begin, &end);
    sgd_chunk(&list[t], begin, end, sc[t].first, sc[t].sr_key, &sc[t].ema, &k, body, &lk);
  }

  for (int64_t i = 0; i < n; i++)
    if (list[i].step) *list[i].step = sc[i].new_step;
  free(first);
  free(sc);
  return MIXPREC_OK;
}
