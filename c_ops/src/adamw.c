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
 * float step count. The other capabilities of torch (AVX-512: width 16 with
 * the same formulas; DEFAULT, NEON/SVE: built without contraction) are not
 * matched bit for bit; MIXPREC__OPT_TORCH_VEC=16 would match an AVX-512 torch
 * if its build contracts the same way (not verified). */
#include "optim_common.h"

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
    float g = mixprec__opt_unscale(mixprec__load_f32(t->grad, t->grad_dtype, i), k->has_scale,
                                   k->scale);
    if (k->unscale) mixprec__opt_store_grad(t->grad, t->grad_dtype, i, g);
    if (k->h.maximize) g = -g;
    const float p0 = sr ? mixprec__load_f32(t->param, MIXPREC_BF16, i) : P[i];
    float vmax = k->h.amsgrad ? VM[i] : 0.0f;
    const float p = mixprec__adamw_math(g, p0, &M[i], &V[i], &vmax, &k->h, &c, tail);
    if (k->h.amsgrad) VM[i] = vmax;
    if (E) E[i] = mixprec__ema_lerp(E[i], p, s->ema_w);
    if (sr) {
      mixprec__opt_store_bf16_sr(t->param, i, s->sr_key, p);
    } else {
      P[i] = p;
      if (half) mixprec__opt_store_half(t->param, t->param_dtype, i, p);
    }
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
  x.tab_s = &lk->tab_s;
  x.tab_u = &lk->tab_u;
  for (int64_t b0 = begin; b0 < end; b0 += MIXPREC__Q8_BLOCK) {
    const int64_t b1 = end - b0 < MIXPREC__Q8_BLOCK ? end : b0 + MIXPREC__Q8_BLOCK;
    x.b0 = b0;
    x.sc0 = dm == MIXPREC_STATE_Q8 ? t->exp_avg_scale[b0 / MIXPREC__Q8_BLOCK] : 0.0f;
    x.sc1 = dv == MIXPREC_STATE_Q8 ? t->exp_avg_sq_scale[b0 / MIXPREC__Q8_BLOCK] : 0.0f;
    int64_t i = b0;
    if (lk->adamw) i = lk->adamw(t, b0, b1 < tail_from ? b1 : tail_from, s, k, &x);
    for (; i < b1; i++) {
      float g = mixprec__opt_unscale(mixprec__load_f32(t->grad, t->grad_dtype, i), k->has_scale,
                                     k->scale);
      if (k->unscale) mixprec__opt_store_grad(t->grad, t->grad_dtype, i, g);
      if (k->h.maximize) g = -g;
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
                &t->exp_avg_scale[b0 / MIXPREC__Q8_BLOCK], &lk->tab_s, 1);
    if (dv == MIXPREC_STATE_Q8)
      lk->store(qv, (int)(b1 - b0), (uint8_t *)t->exp_avg_sq_data + b0,
                &t->exp_avg_sq_scale[b0 / MIXPREC__Q8_BLOCK], &lk->tab_u, 0);
  }
}

static void adamw_chunk(const mixprec_opt_tensor *t, int64_t begin, int64_t end,
                        const adamw_scalars *s, const adamw_consts *k,
                        mixprec__adamw_body_fn body, const mixprec__lean_kernels *lk) {
  if (mixprec__opt_is_lean(t, 1)) {
    adamw_lean_range(t, begin, end, s, k, lk);
    return;
  }
  const int64_t tail = mixprec__opt_tail_start(t->numel);
  const int64_t mid = end < tail ? end : (begin > tail ? begin : tail);
  const int64_t done = body(t, begin, mid, s, k);
  adamw_range(t, done, mid, s, k, 0);
  adamw_range(t, mid, end, s, k, 1);
}

mixprec_adamw_params mixprec_adamw_params_default(void) {
  mixprec_adamw_params p;
  p.lr = 1e-3;
  p.beta1 = 0.9;
  p.beta2 = 0.999;
  p.eps = 1e-8;
  p.weight_decay = 1e-2;
  p.amsgrad = 0;
  p.maximize = 0;
  p.lr_tensor = NULL;
  p.grad_scale = NULL;
  p.found_inf = NULL;
  p.sr_seed = 0;
  p.unscale_grads = 0;
  p.ema = mixprec__ema_params_default();
  return p;
}


mixprec_status mixprec_adamw_step(const mixprec_opt_tensor *list, int64_t n,
                                  const mixprec_adamw_params *p) {
  mixprec_status st = mixprec__adamw_check(list, n, p);
  if (st != MIXPREC_OK) return st;
  if (mixprec__opt_skip(p->found_inf) || n == 0) return MIXPREC_OK;

  adamw_scalars *sc = (adamw_scalars *)malloc(sizeof(adamw_scalars) * (size_t)n);
  if (!sc) return MIXPREC_ERR_OUT_OF_MEMORY;
  int64_t n_chunks, total;
  int64_t *first = mixprec__opt_chunks(list, n, &n_chunks, &total);
  if (!first) {
    free(sc);
    return MIXPREC_ERR_OUT_OF_MEMORY;
  }

  /* torch reads the learning rate tensor as a double (lr.item<double>()). */
  const double lr = p->lr_tensor ? (double)*p->lr_tensor : p->lr;
  adamw_consts k;
  k.h = mixprec__adamw_hyper_of(p);
  k.has_scale = p->grad_scale != NULL;
  k.scale = p->grad_scale ? *p->grad_scale : 1.0f;
  k.unscale = p->grad_scale != NULL && p->unscale_grads != 0;
  k.stream = total >= MIXPREC__OPT_STREAM_MIN;
  const mixprec__ema_hyper eh = mixprec__ema_hyper_of(&p->ema);

  /* Every count is read before any is written (tensors may share one). */
  for (int64_t i = 0; i < n; i++) {
    const float t = *list[i].step + 1.0f;
    const double step = (double)t;
    const double bc1 = 1.0 - pow(p->beta1, step);
    const double bc2 = 1.0 - pow(p->beta2, step);
    sc[i].new_step = t;
    mixprec__adamw_tensor_consts(lr, p->weight_decay, bc1, bc2, &sc[i].decay, &sc[i].step_size,
                                 &sc[i].bc2_sqrt);
    sc[i].sr_key = mixprec__sr_key(p->sr_seed, (uint64_t)i, t);
    const mixprec__ema_scalars e = mixprec__ema_scalars_of(&p->ema, &eh, i, t);
    sc[i].ema = e.buf;
    sc[i].ema_w = e.w;
  }

  const mixprec__adamw_body_fn body = adamw_body_kernel();
  mixprec__lean_kernels lk;
  mixprec__lean_kernels_init(&lk, list, n, 1);
  int n_threads = mixprec__num_threads();
  (void)n_threads;
#pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads) \
    if (total >= MIXPREC__OPT_PARALLEL_MIN && n_chunks > 1)
  for (int64_t c = 0; c < n_chunks; c++) {
    int64_t begin, end;
    const int64_t t = mixprec__opt_chunk_range(list, first, n, c, &begin, &end);
    adamw_chunk(&list[t], begin, end, &sc[t], &k, body, &lk);
  }

  for (int64_t i = 0; i < n; i++) *list[i].step = sc[i].new_step;
  free(first);
  free(sc);
  return MIXPREC_OK;
}
