/* libFuzzer harness: mixprec_softmax(), mixprec_log_softmax(), their
 * backwards, mixprec_cross_entropy() and mixprec_cross_entropy_backward()
 * (softmax.h).
 *
 * One input = one call on an (outer, n, inner) array (rows and strided
 * slices, sizes 0 to past the 2^15-element threading limit; with the fault
 * bit negative, overflowing and unknown-dtype arguments and NULL pointers),
 * input and output dtypes chosen apart, in place where allowed, values with
 * NaN/inf/huge entries; for cross-entropy targets with ignore_index and out
 * of range, class weights, label smoothing in and out of [0, 1], every
 * reduction and unknown ones. Checked:
 *   - the status is one the header documents for the input;
 *   - on an error no output changed (and no input ever does);
 *   - on success: the same bits on 1 and 2 threads for each ISA path (the
 *     header promises no bit equality across paths: they are compared with
 *     a double reference instead, within float rounding), in place equal to
 *     out of place, NaN exactly where the header says (slices with NaN, +inf
 *     or only -inf), softmax of -inf exactly 0, the cross-entropy max
 *     exactly the slice's max and ignored positions exactly 0. */
#include "fuzz_common.h"

enum { OP_SOFTMAX, OP_LOG_SOFTMAX, OP_SOFTMAX_BWD, OP_LOG_SOFTMAX_BWD, OP_CE, N_OPS };

/* Relative rounding of one store in dtype d (half an ulp, doubled). */
static double rel_of(mixprec_dtype d) {
  return d == MIXPREC_BF16 ? 1.0 / 128 : d == MIXPREC_F16 ? 1.0 / 1024 : 1.0 / 8388608;
}

/* Where dtype d rounds to inf. */
static double inf_of(mixprec_dtype d) {
  return d == MIXPREC_F16 ? 65520.0 : d == MIXPREC_BF16 ? 3.3961775292304e38 : 3.4028235677973e38;
}

/* The smallest subnormal of dtype d: the absolute rounding near 0. */
static double sub_of(mixprec_dtype d) {
  return d == MIXPREC_BF16 ? ldexp(1.0, -133) : d == MIXPREC_F16 ? ldexp(1.0, -24) : ldexp(1.0, -149);
}

/* out is want within tol, or the inf that want rounds to in float. */
static int close_to(float out, double want, double tol) {
  if (fabs(want) > 3.4028234e38 && out == (want > 0 ? INFINITY : -INFINITY)) return 1;
  return fabs((double)out - want) <= tol;
}

static int64_t dim(fz *f, int64_t hi) {
  const uint8_t m = fz_u8(f);
  if (m < 8) return 0;
  if (m < 96) return 1;
  if (m < 240) return fz_range(f, 2, hi);
  return fz_range(f, hi + 1, hi * 16);
}

static int64_t bad_dim(fz *f) {
  static const int64_t v[] = {-1, INT64_MIN, INT64_MAX, (int64_t)1 << 32, (int64_t)1 << 62,
                              ((int64_t)1 << 31) + 1};
  return v[fz_u8(f) % 6];
}

/* Index of element c of slice (o, j). */
static int64_t at(int64_t o, int64_t c, int64_t j, int64_t n, int64_t inner) {
  return (o * n + c) * inner + j;
}

/* ---- softmax / log_softmax forward --------------------------------------- */

static void check_forward(const void *x, mixprec_dtype xd, const void *y, mixprec_dtype yd,
                          int64_t outer, int64_t n, int64_t inner, int is_log, fz_config cfg) {
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < inner; j++) {
      int bad = 0, all_ninf = 1;
      double m = -INFINITY;
      for (int64_t c = 0; c < n; c++) {
        const float v = fz_load(x, xd, at(o, c, j, n, inner));
        if (fz_isnan(v) || v == INFINITY) bad = 1;
        if (v != -INFINITY) all_ninf = 0;
        if (v > m) m = v;
      }
      if (bad || all_ninf) {
        for (int64_t c = 0; c < n; c++) {
          const float out = fz_load(y, yd, at(o, c, j, n, inner));
          FZ_CHECK(fz_isnan(out), "%s: slice (%lld, %lld) holds NaN/+inf or only -inf but "
                   "element %lld is %a (%s)", is_log ? "log_softmax" : "softmax", (long long)o,
                   (long long)j, (long long)c, (double)out, fz_isa_name(cfg.isa));
        }
        continue;
      }
      /* The max as float, then (x - m) in float as both paths do. */
      const float mf = (float)m;
      double s = 0.0;
      for (int64_t c = 0; c < n; c++) s += exp((double)(fz_load(x, xd, at(o, c, j, n, inner)) - mf));
      const double ls = log(s);
      for (int64_t c = 0; c < n; c++) {
        const float v = fz_load(x, xd, at(o, c, j, n, inner));
        const float out = fz_load(y, yd, at(o, c, j, n, inner));
        const double d = (double)(v - mf);
        if (v == -INFINITY) {
          FZ_CHECK(is_log ? out == -INFINITY : fz_bits(out) == 0,
                   "%s of -inf is %a (%s)", is_log ? "log_softmax" : "softmax", (double)out,
                   fz_isa_name(cfg.isa));
          continue;
        }
        const double want = is_log ? d - ls : exp(d - ls);
        const double tol = is_log ? rel_of(yd) * fabs(want) + 2e-5 + fabs(d) * 2.5e-7
                               : rel_of(yd) * want + 4e-6 * want + 1e-6;
        /* Within tol of the dtype's overflow threshold: inf is a rounding. */
        if (!fz_finite(out) && !fz_isnan(out) && fabs(want) + tol >= inf_of(yd) &&
            (out > 0) == (want > 0))
          continue;
        FZ_CHECK(fabs((double)out - want) <= tol,
                 "%s: slice (%lld, %lld) element %lld: x %a -> %a, reference %.9g (n %lld, "
                 "inner %lld, dtypes %d -> %d, %s)", is_log ? "log_softmax" : "softmax",
                 (long long)o, (long long)j, (long long)c, (double)v, (double)out, want,
                 (long long)n, (long long)inner, (int)xd, (int)yd, fz_isa_name(cfg.isa));
      }
    }
}

/* ---- softmax / log_softmax backward -------------------------------------- */

static void check_backward(const void *dy, const void *y, mixprec_dtype yd, const void *dx,
                           mixprec_dtype dxd, int64_t outer, int64_t n, int64_t inner, int is_log,
                           fz_config cfg) {
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < inner; j++) {
      double s = 0.0, sa = 0.0;
      int finite = 1;
      for (int64_t c = 0; c < n; c++) {
        const double g = fz_load(dy, yd, at(o, c, j, n, inner));
        const double v = fz_load(y, yd, at(o, c, j, n, inner));
        /* Huge dy or y overflow float sums and products (differently on
         * each path): a reference only where they cannot. */
        if (!isfinite(g) || !isfinite(v) || fabs(g) > 1e15 || fabs(v) > 1e15 ||
            (is_log && v > 60))
          finite = 0;
        s += is_log ? g : g * v;
        sa += is_log ? fabs(g) : fabs(g * v);
      }
      if (!finite) continue; /* the paths may overflow at different points */
      for (int64_t c = 0; c < n; c++) {
        const double g = fz_load(dy, yd, at(o, c, j, n, inner));
        const double v = fz_load(y, yd, at(o, c, j, n, inner));
        const float out = fz_load(dx, dxd, at(o, c, j, n, inner));
        const double want = is_log ? g - exp(v) * s : v * (g - s);
        const double t = is_log ? fabs(g) + exp(v) * sa : fabs(v) * (fabs(g) + sa);
        /* The AVX2 exp flushes results below ~1.2e-38 to 0. */
        /* Products dy * y that are subnormal floats keep only an absolute
         * 2^-150 each, which the sum carries into dx scaled by y. */
        const double tol = rel_of(dxd) * fabs(want) + (1e-6 + (double)n * 2.4e-7) * t +
                           sub_of(dxd) + (is_log ? 1.2e-38 * sa + exp(v) * (double)n * 0x1p-149
                                                 : (fabs(v) + 1.0) * (double)(n + 1) * 0x1p-149);
        /* Within tol of the dtype's overflow threshold: inf is a rounding. */
        if (!fz_finite(out) && !fz_isnan(out) && fabs(want) + tol >= inf_of(dxd) &&
            (out > 0) == (want > 0))
          continue;
        FZ_CHECK(fabs((double)out - want) <= tol,
                 "%s_backward: slice (%lld, %lld) element %lld: dy %a y %a -> %a, reference "
                 "%.9g (n %lld, dtypes %d -> %d, %s)", is_log ? "log_softmax" : "softmax",
                 (long long)o, (long long)j, (long long)c, g, v, (double)out, want, (long long)n,
                 (int)yd, (int)dxd, fz_isa_name(cfg.isa));
      }
    }
}

/* Runs forward (log 0/1) or backward (2/3) on fresh buffers; *out receives y
 * or dx. */
typedef struct sm_call {
  int op;
  mixprec_dtype xd, yd; /* forward: x, y; backward: y (and dy), dx */
  int64_t outer, n, inner, numel, held;
  void *a, *b;    /* forward: x; backward: dy, y */
  void *out_init; /* the output buffer's initial contents */
  int in_place, null_a, null_b, null_out;
} sm_call;

static mixprec_status sm_run(const sm_call *c, int in_place, void **out, void **a_after) {
  const size_t ab = (size_t)c->held * fz_dsize(c->xd), ob = (size_t)c->held * fz_dsize(c->yd);
  void *a = fz_dup(c->a, ab);
  void *o = in_place ? a : fz_dup(c->out_init, ob);
  mixprec_status st;
  void *pa = c->null_a ? NULL : a, *po = c->null_out ? NULL : o;
  switch (c->op) {
    case OP_SOFTMAX:
      st = mixprec_softmax(pa, c->xd, po, c->yd, c->outer, c->n, c->inner);
      break;
    case OP_LOG_SOFTMAX:
      st = mixprec_log_softmax(pa, c->xd, po, c->yd, c->outer, c->n, c->inner);
      break;
    case OP_SOFTMAX_BWD:
      st = mixprec_softmax_backward(pa, c->null_b ? NULL : c->b, c->xd, po, c->yd, c->outer,
                                    c->n, c->inner);
      break;
    default:
      st = mixprec_log_softmax_backward(pa, c->null_b ? NULL : c->b, c->xd, po, c->yd,
                                        c->outer, c->n, c->inner);
  }
  if (in_place) {
    *out = a;
    *a_after = NULL;
  } else {
    *out = o;
    *a_after = a;
  }
  return st;
}

static void softmax_case(fz *f, int op, int faults) {
  sm_call c;
  memset(&c, 0, sizeof c);
  c.op = op;
  const int bwd = op >= OP_SOFTMAX_BWD, is_log = op == OP_LOG_SOFTMAX || op == OP_LOG_SOFTMAX_BWD;
  c.xd = fz_dtype(f, faults);
  c.yd = fz_u8(f) < 96 ? c.xd : fz_dtype(f, faults);
  c.outer = dim(f, 8);
  c.n = dim(f, 100);
  c.inner = fz_u8(f) < 160 ? 1 : dim(f, 40);
  const uint8_t fm = faults ? fz_u8(f) : 0;
  if (fm & 1) c.outer = bad_dim(f);
  if (fm & 2) c.n = bad_dim(f);
  if (fm & 4) c.inner = bad_dim(f);
  c.null_a = (fm & 8) != 0;
  c.null_b = (fm & 16) != 0 && bwd;
  c.null_out = (fm & 32) != 0;

  fz_allowed errors = 0;
  if (!fz_dtype_ok(c.xd) || !fz_dtype_ok(c.yd)) errors |= FZ_BIT(MIXPREC_ERR_BAD_DTYPE);
  int64_t numel = 0;
  if (c.outer < 0 || c.n < 0 || c.inner < 0) {
    errors |= FZ_BIT(MIXPREC_ERR_BAD_SIZE);
  } else if (c.outer && c.n && c.inner) {
    if (c.n > INT64_MAX / c.inner || c.outer > INT64_MAX / (c.n * c.inner))
      errors |= FZ_BIT(MIXPREC_ERR_BAD_SIZE);
    else
      numel = c.outer * c.n * c.inner;
  }
  if (numel > 0 && (c.null_a || c.null_b || c.null_out)) errors |= FZ_BIT(MIXPREC_ERR_NULL_POINTER);
  if (!errors && numel > 70000) { /* too big to run: make it smaller */
    c.outer = 1 + c.outer % 4;
    c.n = 1 + c.n % 300;
    c.inner = 1 + c.inner % 60;
    numel = c.outer * c.n * c.inner;
  }
  c.numel = numel;
  c.held = numel <= 70000 ? numel : 16; /* an error is expected beyond */
  const size_t ab = (size_t)c.held * fz_dsize(c.xd), ob = (size_t)c.held * fz_dsize(c.yd);
  const mixprec_dtype xk = fz_dtype_ok(c.xd) ? c.xd : MIXPREC_F32;
  c.a = fz_alloc(ab);
  c.out_init = fz_alloc(ob);
  fz_fill(f, c.out_init, fz_dtype_ok(c.yd) ? c.yd : MIXPREC_F32, c.held);
  if (!bwd) {
    fz_fill(f, c.a, xk, c.held);
  } else {
    /* dy arbitrary; y an actual output of the forward (scalar path), or
     * arbitrary. */
    fz_fill(f, c.a, xk, c.held);
    c.b = fz_alloc(ab);
    fz_fill(f, c.b, xk, c.held);
    if (!errors && (fz_u8(f) & 1)) {
      mixprec_set_cpu_isa(MIXPREC_ISA_SCALAR);
      mixprec_status st = (is_log ? mixprec_log_softmax : mixprec_softmax)(
          c.b, c.xd, c.b, c.xd, c.outer, c.n, c.inner);
      FZ_CHECK(st == MIXPREC_OK, "forward for the backward's y failed: %d", (int)st);
    }
  }
  c.in_place = !errors && c.xd == c.yd && (fz_u8(f) & 3) == 0;
  const char *fn = op == OP_SOFTMAX ? "mixprec_softmax" : op == OP_LOG_SOFTMAX ? "mixprec_log_softmax"
                   : op == OP_SOFTMAX_BWD ? "mixprec_softmax_backward" : "mixprec_log_softmax_backward";
  void *b0 = c.b ? fz_dup(c.b, ab) : NULL;

  FZ_CONFIGS(cfg, n_cfg);
  void *prev = NULL;
  FZ_FOR_EACH_CONFIG(cfg, n_cfg, k) {
    void *out, *a_after;
    const mixprec_status st = sm_run(&c, c.in_place, &out, &a_after);
    fz_check_status(fn, st, errors);
    if (a_after) fz_unchanged(bwd ? "dy (input)" : "x (input)", c.a, a_after, ab, st);
    if (c.b) fz_unchanged("y (input)", b0, c.b, ab, st);
    free(a_after);
    if (st != MIXPREC_OK) {
      fz_unchanged("the output", c.out_init, out, ob, st);
      free(out);
      break;
    }
    /* Same bits on 1 and 2 threads of one path. */
    if (k > 0 && cfg[k].isa == cfg[k - 1].isa) fz_same("the output", prev, out, ob, cfg[k - 1], cfg[k]);
    if (cfg[k].threads == 1 && c.numel > 0) {
      if (c.in_place) { /* in place equals out of place */
        void *o2, *a2;
        FZ_CHECK(sm_run(&c, 0, &o2, &a2) == MIXPREC_OK, "out-of-place call failed");
        fz_same("the output in place vs out of place", o2, out, ob, cfg[k], cfg[k]);
        free(o2);
        free(a2);
      }
      if (!bwd)
        check_forward(c.a, c.xd, out, c.yd, c.outer, c.n, c.inner, is_log, cfg[k]);
      else
        check_backward(c.a, c.b, c.xd, out, c.yd, c.outer, c.n, c.inner, is_log, cfg[k]);
    }
    free(prev);
    prev = out;
  }
  free(prev);
  free(b0);
  free(c.a);
  free(c.b);
  free(c.out_init);
}

/* ---- cross-entropy ------------------------------------------------------- */

typedef struct ce_out {
  float *loss, *stats, *wsum, *grad;
} ce_out;

static void ce_case(fz *f, int faults) {
  mixprec_cross_entropy_params p = mixprec_cross_entropy_params_default();
  const mixprec_dtype dt = fz_dtype(f, faults);
  p.outer = dim(f, 8);
  p.classes = dim(f, 100);
  p.inner = fz_u8(f) < 160 ? 1 : dim(f, 40);
  const uint8_t ro = fz_u8(f);
  p.reduction = (mixprec_reduction)(ro % 3);
  p.label_smoothing = (ro & 0x18) == 0 ? 0.0 : fz_param(f, 0.0, 1.0);
  if (!faults && !(p.label_smoothing >= 0 && p.label_smoothing <= 1)) p.label_smoothing = 0.25;
  const uint8_t ig = fz_u8(f);
  p.ignore_index = ig < 128 ? -100 : ig < 192 ? (int64_t)(ig % 4) : ig < 224 ? INT64_MIN : -1;
  int with_weight = (ro & 0x20) != 0;
  const int with_stats = !(ro & 0x40), with_wsum = !(ro & 0x80);
  const uint8_t fm = faults ? fz_u8(f) : 0;
  if (fm & 1) p.outer = bad_dim(f);
  if (fm & 2) p.classes = bad_dim(f);
  if (fm & 4) p.inner = bad_dim(f);
  if (fm & 8) p.reduction = (mixprec_reduction)(fz_u8(f) % 2 ? 3 : -1);
  const int null_logits = (fm & 16) != 0, null_target = (fm & 32) != 0, null_loss = (fm & 64) != 0;
  const int p_null = faults && (fm & 128) && (fz_u8(f) & 1);
  const int bad_targets = faults && fz_u8(f) >= 192;

  fz_allowed errors = 0;
  int64_t positions = 0;
  if (p_null) errors |= FZ_BIT(MIXPREC_ERR_NULL_POINTER);
  if (!fz_dtype_ok(dt)) errors |= FZ_BIT(MIXPREC_ERR_BAD_DTYPE);
  if (p.outer < 0 || p.classes < 0 || p.inner < 0) errors |= FZ_BIT(MIXPREC_ERR_BAD_SIZE);
  if (!(p.label_smoothing >= 0 && p.label_smoothing <= 1)) errors |= FZ_BIT(MIXPREC_ERR_BAD_ARGUMENT);
  if (p.reduction != MIXPREC_REDUCTION_NONE && p.reduction != MIXPREC_REDUCTION_MEAN &&
      p.reduction != MIXPREC_REDUCTION_SUM)
    errors |= FZ_BIT(MIXPREC_ERR_BAD_ARGUMENT);
  int size_ok = p.outer >= 0 && p.classes >= 0 && p.inner >= 0;
  if (size_ok && p.outer > 0 && p.inner > 0) {
    if (p.outer > INT64_MAX / p.inner) {
      errors |= FZ_BIT(MIXPREC_ERR_BAD_SIZE);
      size_ok = 0;
    } else {
      positions = p.outer * p.inner;
      if (p.classes < 1 || p.classes > INT32_MAX || p.classes > INT64_MAX / positions) {
        errors |= FZ_BIT(MIXPREC_ERR_BAD_SIZE);
        size_ok = 0;
      }
    }
  }
  if (!size_ok) positions = 0;
  if (!errors && positions * p.classes > 70000) { /* too big to run */
    p.outer = 1 + p.outer % 8;
    p.inner = 1 + p.inner % 40;
    p.classes = 1 + p.classes % 200;
    positions = p.outer * p.inner;
  }
  const int small = p.classes >= 0 && p.classes <= 70000 && positions * p.classes <= 70000;
  const int64_t held_pos = small ? positions : 4;
  const int64_t held_cls = small ? p.classes : 4;
  if (positions > 0 && (null_logits || null_target)) errors |= FZ_BIT(MIXPREC_ERR_NULL_POINTER);
  const int loss_needed = positions > 0 || p.reduction != MIXPREC_REDUCTION_NONE;
  const int fwd_loss_null = null_loss && loss_needed;

  /* Buffers. */
  const size_t es = fz_dsize(dt);
  const int64_t nlog = held_pos * held_cls;
  void *logits = fz_alloc((size_t)nlog * es);
  fz_fill(f, logits, fz_dtype_ok(dt) ? dt : MIXPREC_F32, nlog);
  int64_t *target = (int64_t *)fz_alloc(sizeof(int64_t) * (size_t)held_pos);
  int any_bad_target = 0;
  for (int64_t i = 0; i < held_pos; i++) {
    const uint64_t r = fz_rng(f);
    int64_t t = held_cls > 0 ? (int64_t)(r % (uint64_t)held_cls) : 0;
    if (((r >> 32) & 7) == 0) t = p.ignore_index;
    if (bad_targets && ((r >> 40) & 15) == 0) {
      static const int64_t bad[] = {-1, INT64_MIN, INT64_MAX, 0};
      t = bad[(r >> 44) & 3];
      if (t == 0) t = p.classes;
    }
    if (t != p.ignore_index && (t < 0 || t >= p.classes)) any_bad_target = 1;
    target[i] = t;
  }
  if (positions > 0 && !null_target && any_bad_target && !(errors & FZ_BIT(MIXPREC_ERR_BAD_SIZE)))
    errors |= FZ_BIT(MIXPREC_ERR_BAD_ARGUMENT);
  /* `classes` weights are read even without a position: a huge count with
   * none cannot be given weights here. */
  if (!small) with_weight = 0;
  float *weight = NULL;
  if (with_weight) {
    weight = (float *)fz_alloc(sizeof(float) * (size_t)(held_cls > 0 ? held_cls : 0));
    const uint8_t wm = fz_u8(f);
    for (int64_t c = 0; c < held_cls; c++)
      weight[c] = wm < 200 ? (float)(fz_rng(f) % 1000) / 100.0f : fz_special(f);
  }
  p.weight = weight;
  const int64_t nloss = p.reduction == MIXPREC_REDUCTION_NONE ? held_pos : 1;
  const fz_allowed fwd_errors = errors | (fwd_loss_null ? FZ_BIT(MIXPREC_ERR_NULL_POINTER) : 0);

  const mixprec_cross_entropy_params p0 = p;
  void *logits0 = fz_dup(logits, (size_t)nlog * es);
  int64_t *target0 = (int64_t *)fz_dup(target, sizeof(int64_t) * (size_t)held_pos);
  float init_loss[1] = {fz_f32_from_bits(0x7fc0dead)};
  /* The backward's own inputs, the same for every configuration. */
  const int bwd_anyway = fz_u8(f) < 64; /* also after a failed forward */
  float *gl = (float *)fz_alloc(sizeof(float) * (size_t)(nloss > 0 ? nloss : 0));
  if (fz_u8(f) < 64)
    fz_fill(f, gl, MIXPREC_F32, nloss);
  else /* tame grad_loss in most cases */
    for (int64_t i = 0; i < nloss; i++) gl[i] = 1.0f + (float)(i % 3);
  const int null_gl = faults && (fz_u8(f) & 1);
  void *grad_init = fz_alloc((size_t)nlog * es);
  fz_fill(f, grad_init, fz_dtype_ok(dt) ? dt : MIXPREC_F32, nlog);
  FZ_CONFIGS(cfg, n_cfg);
  ce_out prev = {0};
  FZ_FOR_EACH_CONFIG(cfg, n_cfg, k) {
    ce_out o;
    o.loss = (float *)fz_alloc(sizeof(float) * (size_t)(nloss > 0 ? nloss : 0));
    for (int64_t i = 0; i < nloss; i++) o.loss[i] = init_loss[0];
    o.stats = with_stats ? (float *)fz_alloc(sizeof(float) * 2 * (size_t)held_pos) : NULL;
    for (int64_t i = 0; with_stats && i < 2 * held_pos; i++) o.stats[i] = init_loss[0];
    o.wsum = with_wsum ? (float *)fz_alloc(sizeof(float)) : NULL;
    if (o.wsum) o.wsum[0] = init_loss[0];
    o.grad = NULL;
    const mixprec_status st =
        mixprec_cross_entropy(null_logits ? NULL : logits, dt, null_target ? NULL : target,
                              p_null ? NULL : &p, null_loss ? NULL : o.loss, o.stats, o.wsum);
    fz_check_status("mixprec_cross_entropy", st, fwd_errors);
    fz_unchanged("params (input)", &p0, &p, sizeof p, st);
    fz_unchanged("logits (input)", logits0, logits, (size_t)nlog * es, st);
    fz_unchanged("target (input)", target0, target, sizeof(int64_t) * (size_t)held_pos, st);
    if (st != MIXPREC_OK) {
      for (int64_t i = 0; i < nloss; i++) fz_unchanged("loss", init_loss, &o.loss[i], 4, st);
      for (int64_t i = 0; with_stats && i < 2 * held_pos; i++)
        fz_unchanged("stats", init_loss, &o.stats[i], 4, st);
      if (o.wsum) fz_unchanged("weight_sum", init_loss, o.wsum, 4, st);
    }

    /* Backward with this configuration's stats. */
    if (st == MIXPREC_OK || bwd_anyway) {
      const int null_stats = !with_stats;
      const int null_ws = !with_wsum;
      fz_allowed be = errors;
      if (positions > 0 && (null_gl || null_stats || null_loss || null_logits))
        be |= FZ_BIT(MIXPREC_ERR_NULL_POINTER);
      if (positions > 0 && p.reduction == MIXPREC_REDUCTION_MEAN && null_ws)
        be |= FZ_BIT(MIXPREC_ERR_NULL_POINTER);
      /* Stats of a failed forward are garbage; only used when an error is
       * expected anyway or the forward succeeded. */
      if (st != MIXPREC_OK && !be) goto next;
      o.grad = fz_dup(grad_init, (size_t)nlog * es);
      void *grad0 = grad_init;
      float *stats_in = o.stats ? (float *)fz_dup(o.stats, sizeof(float) * 2 * (size_t)held_pos) : NULL;
      const mixprec_status bs = mixprec_cross_entropy_backward(
          null_gl ? NULL : gl, null_logits ? NULL : logits, dt, null_target ? NULL : target,
          p_null ? NULL : &p, null_stats ? NULL : o.stats, null_ws ? NULL : o.wsum,
          null_loss ? NULL : o.grad);
      fz_check_status("mixprec_cross_entropy_backward", bs, be);
      if (stats_in) fz_unchanged("stats (input of backward)", stats_in, o.stats,
                                 sizeof(float) * 2 * (size_t)held_pos, bs);
      if (bs != MIXPREC_OK) fz_unchanged("grad_logits", grad0, o.grad, (size_t)nlog * es, bs);
      if (bs == MIXPREC_OK && positions > 0) {
        /* Ignored positions: a zero gradient (unless the logits there are
         * not finite: see tests/fuzz/README.md). */
        for (int64_t pos = 0; pos < positions; pos++) {
          if (target[pos] != p.ignore_index) continue;
          const int64_t oo = pos / p.inner, j = pos % p.inner;
          for (int64_t c = 0; c < p.classes; c++) {
            const int64_t e = at(oo, c, j, p.classes, p.inner);
            const float x = fz_load(logits, dt, e);
            const float wc = weight ? weight[c] : 1.0f;
            if (!fz_finite(x) || !fz_finite(wc)) continue;
            const float g = fz_load(o.grad, dt, e);
            FZ_CHECK(fz_bits(g) == 0 || fz_bits(g) == 0x80000000u,
                     "cross_entropy_backward: ignored position %lld class %lld: gradient %a",
                     (long long)pos, (long long)c, (double)g);
          }
        }
        if (k > 0 && cfg[k].isa == cfg[k - 1].isa && prev.grad)
          fz_same("grad_logits", prev.grad, o.grad, (size_t)nlog * es, cfg[k - 1], cfg[k]);
      }
      if (bs != MIXPREC_OK) {
        free(o.grad);
        o.grad = NULL;
      }
      free(stats_in);
    }
  next:
    if (st != MIXPREC_OK) {
      free(o.loss);
      free(o.stats);
      free(o.wsum);
      free(o.grad);
      break;
    }
    if (k > 0 && cfg[k].isa == cfg[k - 1].isa) {
      fz_same("loss", prev.loss, o.loss, sizeof(float) * (size_t)nloss, cfg[k - 1], cfg[k]);
      if (with_stats)
        fz_same("stats", prev.stats, o.stats, sizeof(float) * 2 * (size_t)held_pos, cfg[k - 1], cfg[k]);
      if (with_wsum) fz_same("weight_sum", prev.wsum, o.wsum, sizeof(float), cfg[k - 1], cfg[k]);
    }
    /* References (each path): max exact, ignored positions 0, losses within
     * float rounding of a double computation. */
    double tot = 0, tot_tol = 0, wtot = 0;
    int tot_ok = 1;
    for (int64_t pos = 0; pos < positions; pos++) {
      const int64_t oo = pos / p.inner, j = pos % p.inner, t = target[pos];
      if (t == p.ignore_index) {
        if (p.reduction == MIXPREC_REDUCTION_NONE)
          FZ_CHECK(fz_bits(o.loss[pos]) == 0, "loss of ignored position %lld is %a",
                   (long long)pos, (double)o.loss[pos]);
        if (with_stats)
          FZ_CHECK(fz_bits(o.stats[pos]) == 0 && fz_bits(o.stats[positions + pos]) == 0,
                   "stats of ignored position %lld are %a, %a", (long long)pos,
                   (double)o.stats[pos], (double)o.stats[positions + pos]);
        continue;
      }
      float mx = -INFINITY;
      int finite = 1, tame = 1;
      double wall = 0;
      for (int64_t c = 0; c < p.classes; c++) {
        const float x = fz_load(logits, dt, at(oo, c, j, p.classes, p.inner));
        if (!fz_finite(x)) finite = 0;
        /* Logits apart by ~1e38 overflow the float weighted sum of label
         * smoothing (and only then): no reference for those. */
        if (fabsf(x) > 1e18f) tame = 0;
        if (x > mx) mx = x;
        const float wc = weight ? weight[c] : 1.0f;
        if (!fz_finite(wc) || fabsf(wc) > 1e6f) finite = 0;
        wall += wc;
      }
      const double wt = weight ? weight[t] : 1.0;
      wtot += wt;
      if (with_stats && finite)
        FZ_CHECK(o.stats[pos] == mx, "stats max of position %lld: %a, max %a",
                 (long long)pos, (double)o.stats[pos], (double)mx);
      if (!finite || !tame) {
        tot_ok = 0;
        continue;
      }
      double s = 0, wx = 0, wxa = 0;
      for (int64_t c = 0; c < p.classes; c++) {
        const float d = fz_load(logits, dt, at(oo, c, j, p.classes, p.inner)) - mx;
        const double wc = weight ? weight[c] : 1.0;
        s += exp((double)d);
        wx += wc * d;
        wxa += fabs(wc * d);
      }
      const double lg = log(s);
      const double eps = p.label_smoothing, C = (double)p.classes;
      const double xt = (double)(fz_load(logits, dt, at(oo, t, j, p.classes, p.inner)) - mx);
      const double want = (1 - eps) * wt * (lg - xt) + eps / C * (wall * lg - wx);
      const double tol = 2e-6 * (fabs((1 - eps) * wt) * (fabs(xt) + lg + 1) +
                                 eps / C * (fabs(wall) * (lg + 1) + wxa)) + 1e-30;
      if (with_stats)
        FZ_CHECK(fabs(o.stats[positions + pos] - lg) <= 2e-6 * (lg + 1),
                 "stats log-sum of position %lld: %a, reference %.9g (%s)", (long long)pos,
                 (double)o.stats[positions + pos], lg, fz_isa_name(cfg[k].isa));
      if (p.reduction == MIXPREC_REDUCTION_NONE)
        FZ_CHECK(close_to(o.loss[pos], want, tol + 6e-8 * fabs(want)),
                 "loss of position %lld: %a, reference %.9g (classes %lld, eps %g, %s)",
                 (long long)pos, (double)o.loss[pos], want, (long long)p.classes, eps,
                 fz_isa_name(cfg[k].isa));
      tot += want;
      tot_tol += tol;
    }
    if (tot_ok && positions > 0 && p.reduction == MIXPREC_REDUCTION_SUM)
      FZ_CHECK(close_to(o.loss[0], tot, tot_tol + 6e-8 * fabs(tot)),
               "SUM loss %a, reference %.9g", (double)o.loss[0], tot);
    if (tot_ok && positions > 0 && p.reduction == MIXPREC_REDUCTION_MEAN && wtot > 0)
      FZ_CHECK(close_to(o.loss[0], tot / wtot, (tot_tol + 6e-8 * fabs(tot)) / wtot * 1.001 + 1e-30),
               "MEAN loss %a, reference %.9g", (double)o.loss[0], tot / wtot);
    if (positions > 0 && p.reduction == MIXPREC_REDUCTION_MEAN && wtot == 0 && !weight)
      FZ_CHECK(fz_isnan(o.loss[0]), "MEAN loss over only ignored positions is %a, not NaN",
               (double)o.loss[0]);
    if (with_wsum && tot_ok)
      FZ_CHECK(close_to(o.wsum[0], wtot, 1e-6 * fabs(wtot)), "weight_sum %a, reference %.9g",
               (double)o.wsum[0], wtot);
    free(prev.loss);
    free(prev.stats);
    free(prev.wsum);
    free(prev.grad);
    prev = o;
  }
  free(prev.loss);
  free(prev.stats);
  free(prev.wsum);
  free(prev.grad);
  free(gl);
  free(grad_init);
  free(logits);
  free(logits0);
  free(target);
  free(target0);
  free(weight);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz f;
  fz_init(&f, data, size);
  const uint8_t op = fz_u8(&f);
  const int faults = fz_faults(op, 0xc0);
  const int which = (op & 7) % 6;
  if (which >= OP_CE)
    ce_case(&f, faults);
  else
    softmax_case(&f, which, faults);
  return 0;
}
