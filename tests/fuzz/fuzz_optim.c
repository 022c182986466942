/* libFuzzer harness: mixprec_adamw_step() and mixprec_sgd_step() (optim.h).
 *
 * One input = one step over 0-6 parameters of mixed param/grad dtypes and
 * sizes (0 to past the 65536-element chunk and threading limits), with FP32
 * masters, master-free BF16 (stochastic rounding), shared step counts,
 * lr_tensor / grad_scale / found_inf pointers, unscale_grads, and
 * hyper-parameters in and out of range (NaN, inf, negative, beta 1...);
 * with the fault bit also unknown dtypes, negative sizes, masters beside F32
 * params and missing buffers. Checked:
 *   - the status is one the header documents for the input;
 *   - on an error (and on a skipped step) no buffer and no count changed;
 *   - on success: each step count used by the list advanced once by 1.0f,
 *     F16/BF16 params with a master hold the master rounded to nearest even,
 *     the grads are g / grad_scale rounded to their dtype under
 *     unscale_grads (else untouched), buffers the call ignores untouched,
 *     unscale_grads changes nothing but the grads, the fused EMA is
 *     lerp(ema, p, 1 - decay) of the new FP32 value on the steps its
 *     interval selects (else untouched) and changes nothing else, and
 *     everything is the same bits on 1 and 2 threads and on each ISA path
 *     of this CPU. */
#include "fuzz_common.h"

#define MAX_T 6
enum { B_PARAM, B_GRAD, B_MASTER, B_M, B_V, B_VMAX, B_EMA, B_REM, B_MSC, B_VSC, N_BUF };
static const char *const buf_name[N_BUF] = {"param", "grad", "master", "exp_avg/momentum_buffer",
                                            "exp_avg_sq", "max_exp_avg_sq", "ema", "remainder",
                                            "exp_avg_scale", "exp_avg_sq_scale"};

typedef struct tensor {
  mixprec_opt_tensor d; /* pointers filled per run */
  void *buf[N_BUF];     /* originals (NULL: passed as NULL) */
  size_t bytes[N_BUF];
  int step_slot; /* -1: step NULL */
} tensor;

typedef struct call {
  int sgd;
  int64_t n;
  int n_alloc, list_null, p_null;
  tensor t[MAX_T];
  float steps[MAX_T];
  mixprec_adamw_params a;
  mixprec_sgd_params s;
  float lr_t, scale_t, found_t;
  int has_lr_t, has_scale_t, has_found_t;
  int ema_on; /* ema.bufs given (each tensor's B_EMA buffer, NULL: none) */
  mixprec_ema_params ema;
} call;

typedef struct result {
  void *buf[MAX_T][N_BUF];
  float steps[MAX_T];
} result;

/* The dtype a buffer's bits are compared as (NaNs equal): a remainder or a
 * BF16 moment as BF16, 8-bit codes as raw BF16 pairs (bit-exact but for
 * NaN-looking pairs, which codes never form in practice). */
static mixprec_dtype buf_dtype(const tensor *t, int b) {
  if (b == B_PARAM) return t->d.param_dtype;
  if (b == B_GRAD) return t->d.grad_dtype;
  if (b == B_REM) return MIXPREC_BF16;
  if (b == B_M && t->d.exp_avg_dtype != MIXPREC_STATE_F32) return MIXPREC_BF16;
  if (b == B_V && t->d.exp_avg_sq_dtype != MIXPREC_STATE_F32) return MIXPREC_BF16;
  return MIXPREC_F32;
}

/* Elements of buffer b as buf_dtype counts them. */
static int64_t buf_elems(const tensor *t, int b) {
  return (int64_t)(t->bytes[b] / fz_dsize(buf_dtype(t, b)));
}

static size_t state_size(mixprec_state_dtype f) {
  return f == MIXPREC_STATE_BF16 ? 2 : f == MIXPREC_STATE_Q8 ? 1 : 4;
}

/* The FP32 master a (BF16 param bits, remainder) pair holds, written from
 * mixprec/optim.h's [note: remainders] independently of the kernels. */
static int rem_master_is_nan(uint16_t P, uint16_t R) {
  uint32_t hi = P;
  if (R >= 0x8000u) {
    const uint32_t mag = hi & 0x7fffu;
    if (mag == 0u)
      hi |= 0x7f80u;
    else if (mag <= 0x7f80u)
      hi -= 1u;
  }
  const uint32_t u = (hi << 16) | R;
  return (u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0u;
}

/* Remainders compared bit for bit, except where both paths' masters are NaN:
 * a NaN's low 16 payload bits live in the remainder, and the paths may give
 * a NaN result different payloads as they give it different signs (the
 * params are compared NaN-equal for the same reason; tests/fuzz/README.md). */
static void same_remainders(int i, const tensor *t, const result *a, const result *b,
                            fz_config ca, fz_config cb) {
  const uint16_t *pa = (const uint16_t *)a->buf[i][B_PARAM], *pb = (const uint16_t *)b->buf[i][B_PARAM];
  const uint16_t *ra = (const uint16_t *)a->buf[i][B_REM], *rb = (const uint16_t *)b->buf[i][B_REM];
  int64_t n = buf_elems(t, B_REM);
  if (n > buf_elems(t, B_PARAM)) n = buf_elems(t, B_PARAM);
  for (int64_t e = 0; e < n; e++) {
    if (ra[e] == rb[e]) continue;
    if (rem_master_is_nan(pa[e], ra[e]) && rem_master_is_nan(pb[e], rb[e]) && !getenv("FZ_STRICT_NAN"))
      continue;
    FZ_FAIL("remainder of tensor %d differs at element %lld (0x%04x vs 0x%04x, params 0x%04x vs 0x%04x) "
            "between %s/%d threads and %s/%d threads", i, (long long)e, ra[e], rb[e], pa[e], pb[e],
            fz_isa_name(ca.isa), ca.threads, fz_isa_name(cb.isa), cb.threads);
  }
}

/* Sets on p (a mixprec_sgd_params or a mixprec_adamw_params) the call c's
 * lr_tensor, grad_scale and found_inf (the addresses lr, scale and found;
 * NULL where c has none), unscale_grads and the EMA. */
#define SET_STEP_EXTRAS(p, c, lr, scale, found, unscale, ema_params) \
  do {                                                                \
    (p).lr_tensor = (c)->has_lr_t ? (lr) : NULL;                      \
    (p).grad_scale = (c)->has_scale_t ? (scale) : NULL;               \
    (p).found_inf = (c)->has_found_t ? (found) : NULL;                \
    (p).unscale_grads = (unscale);                                    \
    (p).ema = (ema_params);                                           \
  } while (0)

static mixprec_status run(const call *c, int unscale_grads, int with_ema, result *r) {
  mixprec_opt_tensor list[MAX_T];
  float *ema_bufs[MAX_T] = {NULL};
  memcpy(r->steps, c->steps, sizeof r->steps);
  for (int i = 0; i < c->n_alloc; i++) {
    const tensor *t = &c->t[i];
    for (int b = 0; b < N_BUF; b++)
      r->buf[i][b] = t->buf[b] ? fz_dup(t->buf[b], t->bytes[b]) : NULL;
    list[i] = t->d;
    list[i].param = r->buf[i][B_PARAM];
    list[i].grad = r->buf[i][B_GRAD];
    list[i].master = (float *)r->buf[i][B_MASTER];
    list[i].exp_avg_data = r->buf[i][B_M];
    list[i].exp_avg_sq_data = r->buf[i][B_V];
    list[i].remainder = (int16_t *)r->buf[i][B_REM];
    list[i].exp_avg_scale = (float *)r->buf[i][B_MSC];
    list[i].exp_avg_sq_scale = (float *)r->buf[i][B_VSC];
    list[i].max_exp_avg_sq = (float *)r->buf[i][B_VMAX];
    list[i].step = t->step_slot >= 0 ? &r->steps[t->step_slot] : NULL;
    ema_bufs[i] = with_ema ? (float *)r->buf[i][B_EMA] : NULL;
  }
  mixprec_ema_params ema = c->ema;
  ema.bufs = with_ema && c->ema_on ? ema_bufs : NULL;
  const float lr_t = c->lr_t, scale_t = c->scale_t, found_t = c->found_t;
  mixprec_status st;
  if (c->sgd) {
    mixprec_sgd_params p = c->s;
    SET_STEP_EXTRAS(p, c, &lr_t, &scale_t, &found_t, unscale_grads, ema);
    st = mixprec_sgd_step(c->list_null ? NULL : list, c->n, c->p_null ? NULL : &p);
  } else {
    mixprec_adamw_params p = c->a;
    SET_STEP_EXTRAS(p, c, &lr_t, &scale_t, &found_t, unscale_grads, ema);
    st = mixprec_adamw_step(c->list_null ? NULL : list, c->n, c->p_null ? NULL : &p);
  }
  FZ_CHECK(fz_bits(lr_t) == fz_bits(c->lr_t) && fz_bits(scale_t) == fz_bits(c->scale_t) &&
               fz_bits(found_t) == fz_bits(c->found_t),
           "lr_tensor, grad_scale or found_inf written");
  return st;
}

static void free_result(result *r, int n) {
  for (int i = 0; i < n; i++)
    for (int b = 0; b < N_BUF; b++) free(r->buf[i][b]);
}

/* FZ_VERBOSE=1: prints the decoded call (to read a crash input). */
static void describe(const call *c, int unscale_grads, fz_allowed errors) {
  if (c->sgd)
    fprintf(stderr, "sgd lr %.9g momentum %.9g dampening %.9g wd %.9g nesterov %d maximize %d "
            "first_step %d\n", c->s.lr, c->s.momentum, c->s.dampening, c->s.weight_decay,
            c->s.nesterov, c->s.maximize, c->s.first_step);
  else
    fprintf(stderr, "adamw lr %.9g betas %.9g %.9g eps %.9g wd %.9g amsgrad %d maximize %d\n",
            c->a.lr, c->a.beta1, c->a.beta2, c->a.eps, c->a.weight_decay, c->a.amsgrad,
            c->a.maximize);
  fprintf(stderr, "lr_tensor %d:%a grad_scale %d:%a found_inf %d:%a unscale_grads %d n %lld "
          "expected errors 0x%x\n", c->has_lr_t, (double)c->lr_t, c->has_scale_t,
          (double)c->scale_t, c->has_found_t, (double)c->found_t, unscale_grads, (long long)c->n,
          (unsigned)errors);
  if (c->ema_on)
    fprintf(stderr, "ema decay %.9g min_decay %.9g warmup %d gamma %.9g power %.9g after %lld "
            "every %lld\n", c->ema.decay, c->ema.min_decay, c->ema.use_warmup,
            c->ema.warmup_gamma, c->ema.warmup_power, (long long)c->ema.update_after_step,
            (long long)c->ema.update_every);
  for (int i = 0; i < c->n_alloc; i++) {
    const tensor *t = &c->t[i];
    fprintf(stderr, "  tensor %d: numel %lld param %d grad %d step slot %d (%a) buffers", i,
            (long long)t->d.numel, (int)t->d.param_dtype, (int)t->d.grad_dtype, t->step_slot,
            t->step_slot >= 0 ? (double)c->steps[t->step_slot] : 0.0);
    for (int b = 0; b < N_BUF; b++) fprintf(stderr, " %s:%d", buf_name[b], t->buf[b] != NULL);
    fputc('\n', stderr);
    for (int64_t e = 0; e < t->d.numel && e < 20 && getenv("FZ_VERBOSE")[0] == '2'; e++) {
      fprintf(stderr, "    [%lld]", (long long)e);
      const mixprec_dtype k[N_BUF] = {t->d.param_dtype, t->d.grad_dtype, MIXPREC_F32,
                                      MIXPREC_F32, MIXPREC_F32, MIXPREC_F32};
      for (int b = 0; b < N_BUF; b++)
        if (b < B_REM && t->buf[b]) fprintf(stderr, " %s=%a", buf_name[b], (double)fz_load(t->buf[b], k[b], e));
      fputc('\n', stderr);
    }
  }
}

static double hyper(fz *f, double lo, double hi, int faults) {
  return faults ? fz_param(f, lo, hi) : lo + (hi - lo) * (double)fz_u16(f) / 65535.0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  FZ_OPEN(f, c, op);
  c.sgd = op & 1;
  const int faults = fz_faults(op, 0xc0);
  const int hfaults = (op & 0x30) == 0x30; /* hyper-parameters out of range */
  c.a = mixprec_adamw_params_default();
  c.s = mixprec_sgd_params_default();
  const uint8_t hf = fz_u8(&f);
  if (c.sgd) {
    c.s.lr = hyper(&f, 0.0, 0.5, hfaults);
    c.s.momentum = (hf & 1) ? 0.0 : hyper(&f, 0.0, 0.99, hfaults);
    c.s.dampening = (hf & 2) ? 0.0 : hyper(&f, 0.0, 1.0, hfaults);
    c.s.weight_decay = (hf & 4) ? 0.0 : hyper(&f, 0.0, 0.1, hfaults);
    c.s.nesterov = (hf & 8) != 0;
    c.s.maximize = (hf & 16) != 0;
    c.s.first_step = (hf & 32) != 0;
    if (c.s.nesterov && !hfaults) c.s.dampening = 0.0, c.s.momentum = c.s.momentum > 0 ? c.s.momentum : 0.5;
    c.s.sr_seed = fz_u64(&f);
  } else {
    c.a.lr = hyper(&f, 0.0, 0.1, hfaults);
    c.a.beta1 = hyper(&f, 0.0, 0.999, hfaults);
    c.a.beta2 = hyper(&f, 0.0, 0.9999, hfaults);
    c.a.eps = hyper(&f, 0.0, 1e-3, hfaults);
    c.a.weight_decay = (hf & 4) ? 0.0 : hyper(&f, 0.0, 0.1, hfaults);
    c.a.amsgrad = (hf & 8) != 0;
    c.a.maximize = (hf & 16) != 0;
    c.a.sr_seed = fz_u64(&f);
  }
  const uint8_t pf = fz_u8(&f);
  c.has_lr_t = (pf & 1) != 0;
  c.lr_t = c.has_lr_t ? (float)fz_param(&f, 0.0, 0.1) : 0.0f;
  c.has_scale_t = (pf & 2) != 0;
  c.scale_t = c.has_scale_t ? (fz_u8(&f) < 200 ? ldexpf(1.0f, (int)fz_range(&f, -4, 24))
                                                : fz_special(&f))
                            : 0.0f;
  c.has_found_t = (pf & 4) != 0;
  c.found_t = c.has_found_t ? (fz_u8(&f) < 160 ? 0.0f : fz_special(&f)) : 0.0f;
  const int unscale_grads = (pf & 8) != 0;
  /* The fused EMA of the weights (mixprec_ema_params). */
  c.ema = c.sgd ? c.s.ema : c.a.ema;
  c.ema_on = (pf & 16) != 0;
  if (c.ema_on) {
    mixprec_ema_params *e = &c.ema;
    const uint8_t em = fz_u8(&f);
    e->decay = (em & 1) ? 0.9999 : hyper(&f, 0.0, 1.0, hfaults);
    e->min_decay = (em & 2) ? 0.0 : hyper(&f, 0.0, 1.0, hfaults);
    e->use_warmup = (em & 4) != 0;
    e->warmup_gamma = hyper(&f, 0.25, 10.0, hfaults);
    e->warmup_power = hyper(&f, 0.1, 1.0, hfaults);
    e->update_after_step = (em & 8) ? 0 : fz_range(&f, 0, 5);
    e->update_every = (em & 16) ? 1 : fz_range(&f, 0, 4);
    if (hfaults && (em & 0x60) == 0x60) e->update_after_step = -fz_range(&f, 1, 3);
    if (hfaults && (em & 0xa0) == 0xa0) e->update_every = fz_u8(&f) & 1 ? -1 : INT64_MIN;
  }

  fz_allowed errors = 0;
  const uint8_t fm = faults ? fz_u8(&f) : 0;
  c.n_alloc = (int)fz_range(&f, 0, MAX_T);
  c.n = c.n_alloc;
  if (fm & 1) {
    c.n = -(int64_t)fz_range(&f, 1, 2);
    errors |= FZ_BIT(MIXPREC_ERR_BAD_SIZE);
  }
  c.list_null = (fm & 2) && c.n > 0;
  c.p_null = (fm & 4) != 0;
  if (c.list_null || c.p_null) errors |= FZ_BIT(MIXPREC_ERR_NULL_POINTER);

  /* Hyper-parameter checks (torch's ranges plus finiteness). */
  if (c.sgd) {
    const mixprec_sgd_params *p = &c.s;
    if (!c.has_lr_t && !(isfinite(p->lr) && p->lr >= 0)) errors |= FZ_BIT(MIXPREC_ERR_BAD_ARGUMENT);
    if (!(isfinite(p->momentum) && p->momentum >= 0) ||
        !(isfinite(p->weight_decay) && p->weight_decay >= 0) || !isfinite(p->dampening))
      errors |= FZ_BIT(MIXPREC_ERR_BAD_ARGUMENT);
    if (p->nesterov && (!(p->momentum > 0) || p->dampening != 0))
      errors |= FZ_BIT(MIXPREC_ERR_BAD_ARGUMENT);
  } else {
    const mixprec_adamw_params *p = &c.a;
    if (!c.has_lr_t && !(isfinite(p->lr) && p->lr >= 0)) errors |= FZ_BIT(MIXPREC_ERR_BAD_ARGUMENT);
    if (!(isfinite(p->eps) && p->eps >= 0) || !(isfinite(p->weight_decay) && p->weight_decay >= 0) ||
        !(p->beta1 >= 0 && p->beta1 < 1) || !(p->beta2 >= 0 && p->beta2 < 1))
      errors |= FZ_BIT(MIXPREC_ERR_BAD_ARGUMENT);
  }
  if (c.ema_on) {
    const mixprec_ema_params *e = &c.ema;
    if (!(e->decay >= 0 && e->decay <= 1) || !(e->min_decay >= 0 && e->min_decay <= 1) ||
        e->update_after_step < 0 || e->update_every < 0)
      errors |= FZ_BIT(MIXPREC_ERR_BAD_ARGUMENT);
    if (e->use_warmup && !(isfinite(e->warmup_gamma) && e->warmup_gamma > 0 &&
                           isfinite(e->warmup_power) && e->warmup_power > 0))
      errors |= FZ_BIT(MIXPREC_ERR_BAD_ARGUMENT);
  }
  const int momentum_on = c.sgd && c.s.momentum != 0.0;
  const int amsgrad = !c.sgd && c.a.amsgrad;

  int64_t total = 0;
  for (int i = 0; i < c.n_alloc; i++) {
    tensor *t = &c.t[i];
    mixprec_opt_tensor *d = &t->d;
    d->param_dtype = fz_dtype(&f, faults);
    d->grad_dtype = fz_dtype(&f, faults);
    d->numel = fz_count(&f, (int64_t)1 << 16);
    if (total + d->numel > ((int64_t)1 << 17)) d->numel = 0;
    total += d->numel;
    const uint8_t tf = fz_u8(&f);
    const uint8_t nulls = (faults && (tf & 0x80)) ? fz_u8(&f) : 0;
    if (faults && tf >= 0xf8) d->numel = -(int64_t)fz_range(&f, 1, 5);
    const int64_t ne = d->numel > 0 ? d->numel : 0;
    /* A master: F16 needs one, BF16 may have one, F32 must not. */
    int master = d->param_dtype == MIXPREC_F16 || (d->param_dtype == MIXPREC_BF16 && (tf & 1)) ||
                 !fz_dtype_ok(d->param_dtype);
    if (faults && (tf & 0x40)) master = !master;
    /* The lean state: moment formats (3: an unknown one, faults only),
     * a remainder for a BF16 param without a master (any param with
     * faults), Q8 scales exactly for Q8 moments (flipped with faults). */
    const uint8_t lb = fz_u8(&f);
    int mf = lb & 3, vf = (lb >> 2) & 3;
    if (!faults && mf == 3) mf = 0;
    if (!faults && vf == 3) vf = 0;
    if (c.sgd && !faults) vf = 0;
    d->exp_avg_dtype = (mixprec_state_dtype)(mf == 3 ? 5 : mf);
    d->exp_avg_sq_dtype = (mixprec_state_dtype)(vf == 3 ? 5 : vf);
    const int rem = (lb & 0x10) && (faults || (d->param_dtype == MIXPREC_BF16 && !master));
    int msc = mf == MIXPREC_STATE_Q8, vsc = vf == MIXPREC_STATE_Q8;
    if (faults && (lb & 0x40)) msc = !msc;
    if (faults && (lb & 0x80)) vsc = !vsc;
    int present[N_BUF] = {1, 1, master, 1, 1, 1, c.ema_on && (tf & 2), rem, msc, vsc};
    for (int b = 0; b < 7; b++)
      if (nulls & (1 << b)) present[b] = 0;
    const mixprec_dtype pd = fz_dtype_ok(d->param_dtype) ? d->param_dtype : MIXPREC_F32;
    const mixprec_dtype gd = fz_dtype_ok(d->grad_dtype) ? d->grad_dtype : MIXPREC_F32;
    const mixprec_dtype kind[N_BUF] = {pd, gd, MIXPREC_F32, MIXPREC_F32, MIXPREC_F32, MIXPREC_F32,
                                       MIXPREC_F32, MIXPREC_BF16, MIXPREC_F32, MIXPREC_F32};
    for (int b = 0; b < N_BUF; b++) {
      t->bytes[b] = (size_t)ne * fz_dsize(kind[b]);
      if (b == B_M && mf != 0) t->bytes[b] = (size_t)ne * state_size((mixprec_state_dtype)(mf & 3));
      if (b == B_V && vf != 0) t->bytes[b] = (size_t)ne * state_size((mixprec_state_dtype)(vf & 3));
      if (b == B_MSC || b == B_VSC) t->bytes[b] = (size_t)((ne + 255) / 256) * 4;
      if (!present[b] || (ne == 0 && (fz_u8(&f) & 1) && b != B_MASTER && b != B_EMA)) continue;
      t->buf[b] = fz_alloc(t->bytes[b]);
      if ((b == B_M && mf != 0) || (b == B_V && vf != 0)) {
        /* BF16 moments or 8-bit codes: random bits (any code is valid) */
        for (size_t k = 0; k < t->bytes[b]; k++) ((uint8_t *)t->buf[b])[k] = fz_u8(&f);
        continue;
      }
      fz_fill(&f, t->buf[b], kind[b], (int64_t)(t->bytes[b] / fz_dsize(kind[b])));
      if (b == B_V || b == B_VMAX) /* a second moment is >= 0 unless faulted */
        for (int64_t e = 0; e < ne && !(tf & 0x20); e++) {
          float v = fz_load(t->buf[b], MIXPREC_F32, e);
          fz_store(t->buf[b], MIXPREC_F32, e, fabsf(v));
        }
    }
    /* Step counts: own, shared with tensor 0's, or none. */
    const uint8_t sm = fz_u8(&f);
    t->step_slot = (sm & 3) == 3 && i > 0 ? c.t[0].step_slot : i;
    if ((sm & 0x0c) == 0x0c && (c.sgd || faults)) t->step_slot = -1;
    if (t->step_slot == i) {
      const uint8_t v = fz_u8(&f);
      c.steps[i] = v < 96 ? 0.0f : v < 200 ? (float)(v - 95) : v < 230 ? 16777216.0f : fz_special(&f);
    }

    if (c.list_null || c.n < 0) continue; /* descriptors are not read */
    if (d->numel < 0) errors |= FZ_BIT(MIXPREC_ERR_BAD_SIZE);
    if (!fz_dtype_ok(d->param_dtype) || !fz_dtype_ok(d->grad_dtype))
      errors |= FZ_BIT(MIXPREC_ERR_BAD_DTYPE);
    if (d->param_dtype == MIXPREC_F32 && t->buf[B_MASTER]) errors |= FZ_BIT(MIXPREC_ERR_BAD_ARGUMENT);
    if (!c.sgd && t->step_slot < 0) errors |= FZ_BIT(MIXPREC_ERR_NULL_POINTER);
    /* The lean state (mixprec_state_dtype). */
    if (mf == 3 || (!c.sgd && vf == 3)) errors |= FZ_BIT(MIXPREC_ERR_BAD_DTYPE);
    if (t->buf[B_REM] && (d->param_dtype != MIXPREC_BF16 || t->buf[B_MASTER]))
      errors |= FZ_BIT(MIXPREC_ERR_BAD_ARGUMENT);
    if ((t->buf[B_MSC] && mf != MIXPREC_STATE_Q8) ||
        (t->buf[B_VSC] && (c.sgd || vf != MIXPREC_STATE_Q8)))
      errors |= FZ_BIT(MIXPREC_ERR_BAD_ARGUMENT);
    if (d->numel > 0 && ((mf == MIXPREC_STATE_Q8 && !t->buf[B_MSC]) ||
                         (!c.sgd && vf == MIXPREC_STATE_Q8 && !t->buf[B_VSC]) ||
                         ((mf == MIXPREC_STATE_BF16 || (!c.sgd && vf == MIXPREC_STATE_BF16)) &&
                          t->step_slot < 0)))
      errors |= FZ_BIT(MIXPREC_ERR_NULL_POINTER);
    if (d->numel > 0) {
      const int sr = d->param_dtype == MIXPREC_BF16 && !t->buf[B_MASTER] && !t->buf[B_REM];
      int missing = !t->buf[B_PARAM] || !t->buf[B_GRAD] ||
                    (d->param_dtype == MIXPREC_F16 && !t->buf[B_MASTER]);
      if (c.sgd) {
        missing |= momentum_on && !t->buf[B_M];
        missing |= sr && t->step_slot < 0;
        missing |= t->buf[B_EMA] && t->step_slot < 0;
      } else {
        missing |= !t->buf[B_M] || !t->buf[B_V] || (amsgrad && !t->buf[B_VMAX]);
      }
      if (missing) errors |= FZ_BIT(MIXPREC_ERR_NULL_POINTER);
    }
  }

  if (getenv("FZ_VERBOSE")) describe(&c, unscale_grads, errors);
  FZ_CONFIGS(cfg, n_cfg);
  result ref;
  const char *fn = c.sgd ? "mixprec_sgd_step" : "mixprec_adamw_step";
  FZ_FOR_EACH_CONFIG(cfg, n_cfg, k) {
    result r;
    const mixprec_status st = run(&c, unscale_grads, 1, &r);
    fz_check_status(fn, st, errors);
    const int skipped = st == MIXPREC_OK && c.has_found_t && c.found_t != 0.0f;
    if (st != MIXPREC_OK || skipped || c.n <= 0 || c.list_null) {
      for (int i = 0; i < c.n_alloc; i++)
        for (int b = 0; b < N_BUF; b++)
          if (c.t[i].buf[b]) fz_unchanged(buf_name[b], c.t[i].buf[b], r.buf[i][b], c.t[i].bytes[b], st);
      fz_unchanged("a step count", c.steps, r.steps, sizeof r.steps, st);
      free_result(&r, c.n_alloc);
      if (st != MIXPREC_OK) break;
      continue;
    }
    if (k == 0) {
      ref = r;
      continue;
    }
    for (int i = 0; i < c.n_alloc; i++)
      for (int b = 0; b < N_BUF; b++)
        if (b == B_REM && c.t[i].buf[b] && c.t[i].d.numel > 0)
          same_remainders(i, &c.t[i], &ref, &r, cfg[0], cfg[k]);
        else if (c.t[i].buf[b] && c.t[i].d.numel > 0)
          fz_same_nan(buf_name[b], i, ref.buf[i][b], r.buf[i][b], buf_dtype(&c.t[i], b),
                      buf_elems(&c.t[i], b), cfg[0], cfg[k]);
    fz_same("step counts", ref.steps, r.steps, sizeof r.steps, cfg[0], cfg[k]);
    free_result(&r, c.n_alloc);
  }
  if (errors || (c.has_found_t && c.found_t != 0.0f) || c.n <= 0) goto done;

  /* Cross-checks on the first configuration's result. */
  int used[MAX_T] = {0};
  for (int i = 0; i < c.n_alloc; i++)
    if (c.t[i].step_slot >= 0) used[c.t[i].step_slot] = 1;
  for (int s = 0; s < MAX_T; s++) {
    const float want = used[s] ? c.steps[s] + 1.0f : c.steps[s];
    FZ_CHECK(fz_bits(ref.steps[s]) == fz_bits(want), "step count %d: %a -> %a, expected %a", s,
             (double)c.steps[s], (double)ref.steps[s], (double)want);
  }
  for (int i = 0; i < c.n_alloc; i++) {
    const tensor *t = &c.t[i];
    const int64_t ne = t->d.numel;
    if (t->buf[B_MASTER] && ne > 0)
      for (int64_t e = 0; e < ne; e++) {
        const float m = fz_load(ref.buf[i][B_MASTER], MIXPREC_F32, e);
        FZ_CHECK(fz_bits(fz_load(ref.buf[i][B_PARAM], t->d.param_dtype, e)) == fz_bits(fz_round(t->d.param_dtype, m)),
                 "tensor %d element %lld: param %a is not its master %a rounded to dtype %d", i,
                 (long long)e, (double)fz_load(ref.buf[i][B_PARAM], t->d.param_dtype, e), (double)m,
                 (int)t->d.param_dtype);
      }
    if (t->buf[B_GRAD] && ne > 0) {
      if (unscale_grads && c.has_scale_t) {
        for (int64_t e = 0; e < ne; e++) {
          const float g = fz_load(t->buf[B_GRAD], t->d.grad_dtype, e) / c.scale_t;
          const float got = fz_load(ref.buf[i][B_GRAD], t->d.grad_dtype, e);
          FZ_CHECK(fz_bits(got) == fz_bits(fz_round(t->d.grad_dtype, g)),
                   "tensor %d grad %lld: %a / %a written as %a, expected %a", i, (long long)e,
                   (double)fz_load(t->buf[B_GRAD], t->d.grad_dtype, e), (double)c.scale_t,
                   (double)got, (double)fz_round(t->d.grad_dtype, g));
        }
      } else {
        fz_unchanged("grad (read-only without unscale_grads)", t->buf[B_GRAD], ref.buf[i][B_GRAD],
                     t->bytes[B_GRAD], MIXPREC_OK);
      }
    }
    /* Buffers the call ignores. */
    if (c.sgd) {
      if (!momentum_on && t->buf[B_M])
        fz_unchanged("momentum_buffer (momentum 0)", t->buf[B_M], ref.buf[i][B_M], t->bytes[B_M], MIXPREC_OK);
      if (t->buf[B_V]) fz_unchanged("exp_avg_sq under SGD", t->buf[B_V], ref.buf[i][B_V], t->bytes[B_V], MIXPREC_OK);
    }
    if ((c.sgd || !amsgrad) && t->buf[B_VMAX])
      fz_unchanged("max_exp_avg_sq (no amsgrad)", t->buf[B_VMAX], ref.buf[i][B_VMAX], t->bytes[B_VMAX], MIXPREC_OK);
  }
  /* The EMA: lerp(ema, p, 1 - decay) with the new FP32 value p, on the
   * steps the interval selects (header's formula, written here); and the
   * step without it changes nothing else. */
  if (c.ema_on) {
    for (int i = 0; i < c.n_alloc; i++) {
      const tensor *t = &c.t[i];
      if (!t->buf[B_EMA] || t->d.numel <= 0) continue;
      /* master-free: p before its stochastic rounding is not observable;
       * remainders: p is the master they hold, checked by the C tests */
      const int sr = t->d.param_dtype == MIXPREC_BF16 && !t->buf[B_MASTER];
      const double step = (double)ref.steps[t->step_slot];
      const mixprec_ema_params *e = &c.ema;
      const int update = !(e->update_every > 1 && fmod(step, (double)e->update_every) != 0.0);
      if (!update) {
        fz_unchanged("ema (not an EMA step)", t->buf[B_EMA], ref.buf[i][B_EMA], t->bytes[B_EMA], MIXPREC_OK);
        continue;
      }
      if (sr) continue;
      const double sd = step - (double)e->update_after_step - 1.0;
      double decay;
      if (!(sd > 0.0)) {
        decay = 0.0;
      } else if (e->use_warmup) {
        decay = 1.0 - pow(1.0 + sd / e->warmup_gamma, -e->warmup_power);
        if (e->decay < decay) decay = e->decay;
        if (e->min_decay > decay) decay = e->min_decay;
      } else {
        decay = e->decay;
      }
      const float w = (float)(1.0 - decay);
      const float *pnew = (const float *)ref.buf[i][t->buf[B_MASTER] ? B_MASTER : B_PARAM];
      for (int64_t k = 0; k < t->d.numel; k++) {
        const float e0 = fz_load(t->buf[B_EMA], MIXPREC_F32, k), p = pnew[k];
        const float d = p - e0;
        const float want = fabsf(w) < 0.5f ? fmaf(w, d, e0) : fmaf(w - 1.0f, d, p);
        const float got = fz_load(ref.buf[i][B_EMA], MIXPREC_F32, k);
        FZ_CHECK(fz_bits(got) == fz_bits(want) || (fz_isnan(got) && fz_isnan(want)),
                 "tensor %d ema[%lld]: lerp(%a, %a, %a) = %a, got %a (step %g)", i, (long long)k,
                 (double)e0, (double)p, (double)w, (double)want, (double)got, step);
      }
    }
    fz_apply(cfg[0]);
    result r;
    FZ_CHECK(run(&c, unscale_grads, 0, &r) == MIXPREC_OK, "the same call without the EMA failed");
    for (int i = 0; i < c.n_alloc; i++)
      for (int b = 0; b < N_BUF; b++)
        if (b != B_EMA && c.t[i].buf[b])
          fz_same(buf_name[b], ref.buf[i][b], r.buf[i][b], c.t[i].bytes[b], cfg[0], cfg[0]);
    fz_same("step counts (EMA vs none)", ref.steps, r.steps, sizeof r.steps, cfg[0], cfg[0]);
    free_result(&r, c.n_alloc);
  }
  /* unscale_grads changes nothing but the grads. */
  if (unscale_grads && c.has_scale_t) {
    fz_apply(cfg[0]);
    result r;
    FZ_CHECK(run(&c, 0, 1, &r) == MIXPREC_OK, "the same call without unscale_grads failed");
    for (int i = 0; i < c.n_alloc; i++)
      for (int b = 0; b < N_BUF; b++)
        if (b != B_GRAD && c.t[i].buf[b])
          fz_same(buf_name[b], ref.buf[i][b], r.buf[i][b], c.t[i].bytes[b], cfg[0], cfg[0]);
    fz_same("step counts (unscale_grads 1 vs 0)", ref.steps, r.steps, sizeof r.steps, cfg[0], cfg[0]);
    free_result(&r, c.n_alloc);
  }
  free_result(&ref, c.n_alloc);
done:
  for (int i = 0; i < c.n_alloc; i++)
    for (int b = 0; b < N_BUF; b++) free(c.t[i].buf[b]);
  return 0;
}
