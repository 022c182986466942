/* libFuzzer harness: mixprec_unscale() and mixprec_grad_norm() (amp.h).
 *
 * One input = one call on a list of 0-8 tensors of mixed dtypes and sizes
 * (0 to past the 65536-element chunk and the 2^17 threading limit), with an
 * inv_scale that may be 0, NaN, inf, huge or subnormal, and, with the fault
 * bit, negative counts, unknown dtypes and NULL pointers. Checked:
 *   - the status is one the header documents for the input;
 *   - on an error nothing (tensors, found_inf, norms, total_norm) changed;
 *   - on success: every element is (float)v * inv_scale rounded back to its
 *     dtype (bit for bit), found_inf is 1 iff an element was inf/NaN (else
 *     left as it was), grad_norm leaves the tensors alone, the norms are
 *     within float rounding of a reference and non-finite exactly when an
 *     unscaled element is, grad_norm's norms equal unscale's bit for bit,
 *     and every output is the same bits on 1 and 2 threads and on each ISA
 *     path this CPU has. */
#include "fuzz_common.h"

#define MAX_TENSORS 8

typedef struct call {
  int op_unscale; /* 1: mixprec_unscale, 0: mixprec_grad_norm */
  int64_t n;      /* n_tensors as passed (may be negative) */
  int list_null;
  int n_alloc; /* descriptors actually held */
  mixprec_tensor t[MAX_TENSORS];
  size_t bytes[MAX_TENSORS];
  float inv_scale, found_inf;
  int inv_null, found_null, want_norms, want_total;
} call;

/* Runs the call on fresh copies of the tensors; outputs go to out_*. */
static mixprec_status run(const call *c, int op_unscale, void **data_out, float *found_out,
                          float *norms_out, int norms_cap, float *total_out) {
  mixprec_tensor list[MAX_TENSORS];
  for (int i = 0; i < c->n_alloc; i++) {
    list[i] = c->t[i];
    data_out[i] = c->t[i].data ? fz_dup(c->t[i].data, c->bytes[i]) : NULL;
    list[i].data = data_out[i];
  }
  float inv = c->inv_scale;
  *found_out = c->found_inf;
  float *norms = NULL;
  if (c->want_norms) {
    norms = (float *)fz_alloc(sizeof(float) * (size_t)norms_cap);
    memcpy(norms, norms_out, sizeof(float) * (size_t)norms_cap);
  }
  mixprec_status st =
      (op_unscale ? mixprec_unscale : mixprec_grad_norm)(
          c->list_null ? NULL : list, c->n, c->inv_null ? NULL : &inv,
          c->found_null ? NULL : found_out, norms, c->want_total ? total_out : NULL);
  if (norms) {
    memcpy(norms_out, norms, sizeof(float) * (size_t)norms_cap);
    free(norms);
  }
  return st;
}

static void free_data(void **d, int n) {
  for (int i = 0; i < n; i++) free(d[i]);
}

/* Sum of squares of a tensor's stored values, two ways (squares in float as
 * the kernel does, and in double) so the kernel's result lies between. */
static void ref_sq(const void *data, mixprec_dtype d, int64_t n, double *lo, double *hi,
                   int *nonfinite) {
  double a = 0.0, b = 0.0;
  for (int64_t i = 0; i < n; i++) {
    float v = fz_load(data, d, i);
    if (!fz_finite(v)) *nonfinite = 1;
    float sq = v * v;
    double dsq = (double)v * (double)v;
    a += fz_finite(sq) ? (double)sq : dsq;
    b += dsq;
  }
  *lo = a < b ? a : b;
  *hi = a < b ? b : a;
}

static void check_norm(const char *what, float norm, double lo, double hi, int nonfinite) {
  if (nonfinite) {
    FZ_CHECK(!fz_finite(norm), "%s = %g is finite but an unscaled element is inf/NaN", what,
             (double)norm);
    return;
  }
  /* The norm itself may be past FLT_MAX (a sum of squares above ~1.16e77). */
  if (!fz_finite(norm) && (float)sqrt(hi) == INFINITY) return;
  FZ_CHECK(fz_finite(norm), "%s = %g for finite unscaled elements (sum of squares %g)", what,
           (double)norm, hi);
  const double n2 = (double)norm * (double)norm;
  const double tol = 1e-5;
  FZ_CHECK(n2 >= lo * (1 - tol) - 1e-30 && n2 <= hi * (1 + tol) + 1e-30,
           "%s = %.9g, reference sqrt in [%.9g, %.9g]", what, (double)norm, sqrt(lo), sqrt(hi));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  FZ_OPEN(f, c, op);
  c.op_unscale = op & 1;
  c.want_norms = !(op & 2);
  c.want_total = !(op & 4);
  const int faults = fz_faults(op, 0xe0);
  c.n_alloc = (int)fz_range(&f, 0, MAX_TENSORS);
  c.n = c.n_alloc;
  fz_allowed errors = 0;
  const uint8_t fault_mask = faults ? fz_u8(&f) : 0;
  if (fault_mask & 1) {
    static const int64_t bad_n[] = {-1, -2, INT64_MIN, -1000000};
    c.n = bad_n[fz_u8(&f) % 4];
    errors |= FZ_BIT(MIXPREC_ERR_BAD_SIZE);
  }
  c.list_null = (fault_mask & 2) && c.n > 0;
  c.inv_null = (fault_mask & 4) != 0;
  c.found_null = (fault_mask & 8) != 0;
  if (c.list_null || c.inv_null || c.found_null) errors |= FZ_BIT(MIXPREC_ERR_NULL_POINTER);

  int64_t total_elems = 0;
  for (int i = 0; i < c.n_alloc; i++) {
    mixprec_tensor *t = &c.t[i];
    t->dtype = fz_dtype(&f, faults);
    t->numel = fz_count(&f, (int64_t)1 << 17);
    if (total_elems + t->numel > ((int64_t)1 << 18)) t->numel = 0;
    total_elems += t->numel;
    const uint8_t tf = faults ? fz_u8(&f) : 0;
    int null_data = 0;
    if (tf >= 250) {
      t->numel = -(int64_t)fz_range(&f, 1, 3) - (tf == 255 ? (INT64_MAX - 8) : 0);
    } else if (tf >= 244) {
      null_data = 1;
    }
    c.bytes[i] = t->numel > 0 ? (size_t)t->numel * fz_dsize(t->dtype) : 0;
    if (!null_data && (t->numel != 0 || fz_u8(&f) & 1)) {
      t->data = fz_alloc(c.bytes[i]);
      if (t->numel > 0) fz_fill(&f, t->data, fz_dtype_ok(t->dtype) ? t->dtype : MIXPREC_F32, t->numel);
    }
    /* Only the tensors the call reads (n may be smaller than what is held). */
    if (c.n > 0 && !c.list_null && i < c.n) {
      if (t->numel < 0) errors |= FZ_BIT(MIXPREC_ERR_BAD_SIZE);
      if (!fz_dtype_ok(t->dtype)) errors |= FZ_BIT(MIXPREC_ERR_BAD_DTYPE);
      if (t->numel > 0 && !t->data) errors |= FZ_BIT(MIXPREC_ERR_NULL_POINTER);
    }
  }
  {
    const uint8_t m = fz_u8(&f);
    c.inv_scale = m < 128 ? ldexpf(1.0f, -(int)(m % 40)) : (float)fz_param(&f, 0.0, 2.0);
    const uint8_t g = fz_u8(&f);
    c.found_inf = g < 200 ? 0.0f : g < 230 ? 1.0f : fz_special(&f);
  }

  const int norms_cap = c.n_alloc > 0 ? c.n_alloc : 1;
  float norms_init[MAX_TENSORS];
  for (int i = 0; i < MAX_TENSORS; i++) norms_init[i] = fz_f32_from_bits(0x7fc0dead);
  const float total_init = fz_f32_from_bits(0x7fc0beef);

  FZ_CONFIGS(cfg, n_cfg);
  void *ref_data[MAX_TENSORS];
  float ref_found = 0, ref_norms[MAX_TENSORS], ref_total = 0;
  FZ_FOR_EACH_CONFIG(cfg, n_cfg, k) {
    void *out[MAX_TENSORS];
    float found, norms[MAX_TENSORS], total = total_init;
    memcpy(norms, norms_init, sizeof norms);
    const mixprec_status st = run(&c, c.op_unscale, out, &found, norms, norms_cap, &total);
    fz_check_status(c.op_unscale ? "mixprec_unscale" : "mixprec_grad_norm", st, errors);
    if (st != MIXPREC_OK) {
      for (int i = 0; i < c.n_alloc; i++)
        if (out[i]) fz_unchanged("a tensor", c.t[i].data, out[i], c.bytes[i], st);
      fz_unchanged("found_inf", &c.found_inf, &found, sizeof found, st);
      fz_unchanged("norms", norms_init, norms, sizeof(float) * (size_t)norms_cap, st);
      fz_unchanged("total_norm", &total_init, &total, sizeof total, st);
      free_data(out, c.n_alloc);
      break; /* an error does not depend on the configuration */
    }
    if (k == 0) {
      memcpy(ref_data, out, sizeof out);
      ref_found = found;
      memcpy(ref_norms, norms, sizeof norms);
      ref_total = total;
      continue;
    }
    for (int i = 0; i < c.n_alloc; i++) fz_same("a tensor", ref_data[i], out[i], c.bytes[i], cfg[0], cfg[k]);
    fz_same("found_inf", &ref_found, &found, sizeof found, cfg[0], cfg[k]);
    if (c.want_norms) fz_same("norms", ref_norms, norms, sizeof(float) * (size_t)c.n_alloc, cfg[0], cfg[k]);
    if (c.want_total) fz_same("total_norm", &ref_total, &total, sizeof total, cfg[0], cfg[k]);
    free_data(out, c.n_alloc);
  }

  if (errors == 0) {
    /* References, on the scalar path's outputs. */
    int any_nonfinite_in = 0, any_nonfinite_out = 0;
    double lo_all = 0, hi_all = 0;
    void *unscaled[MAX_TENSORS];
    for (int i = 0; i < c.n_alloc; i++) {
      const mixprec_tensor *t = &c.t[i];
      unscaled[i] = NULL;
      if (i >= c.n || t->numel == 0) continue;
      unscaled[i] = fz_alloc(c.bytes[i]);
      for (int64_t e = 0; e < t->numel; e++) {
        const float v = fz_load(t->data, t->dtype, e);
        if (!fz_finite(v)) any_nonfinite_in = 1;
        fz_store(unscaled[i], t->dtype, e, v * c.inv_scale);
      }
      if (c.op_unscale) {
        if (memcmp(unscaled[i], ref_data[i], c.bytes[i]) != 0) {
          int64_t e = 0;
          const size_t es = fz_dsize(t->dtype);
          while (!memcmp((char *)unscaled[i] + e * es, (char *)ref_data[i] + e * es, es)) e++;
          FZ_FAIL("tensor %d element %lld: %a * %a stored as %a, expected %a (dtype %d)", i,
                  (long long)e, (double)fz_load(t->data, t->dtype, e), (double)c.inv_scale,
                  (double)fz_load(ref_data[i], t->dtype, e),
                  (double)fz_load(unscaled[i], t->dtype, e), (int)t->dtype);
        }
      } else {
        fz_same("a tensor under grad_norm (read-only)", t->data, ref_data[i], c.bytes[i], cfg[0],
                cfg[0]);
      }
      double lo, hi;
      int nf = 0;
      ref_sq(unscaled[i], t->dtype, t->numel, &lo, &hi, &nf);
      any_nonfinite_out |= nf;
      lo_all += lo;
      hi_all += hi;
      if (c.want_norms) {
        char what[32];
        snprintf(what, sizeof what, "norms[%d]", i);
        check_norm(what, ref_norms[i], lo, hi, nf);
      }
    }
    if (c.want_norms)
      for (int i = 0; i < c.n_alloc && i < c.n; i++)
        if (c.t[i].numel == 0)
          FZ_CHECK(fz_bits(ref_norms[i]) == 0, "norms[%d] = %g for an empty tensor", i,
                   (double)ref_norms[i]);
    if (c.want_total) check_norm("total_norm", ref_total, lo_all, hi_all, any_nonfinite_out);
    if (any_nonfinite_in)
      FZ_CHECK(fz_bits(ref_found) == fz_bits(1.0f), "found_inf = %g with an inf/NaN element",
               (double)ref_found);
    else
      FZ_CHECK(fz_bits(ref_found) == fz_bits(c.found_inf), "found_inf changed %g -> %g",
               (double)c.found_inf, (double)ref_found);

    /* The twin op gives the same flag and norms bit for bit. */
    if (c.want_norms || c.want_total) {
      void *out[MAX_TENSORS];
      float found, norms[MAX_TENSORS], total = total_init;
      memcpy(norms, norms_init, sizeof norms);
      fz_apply(cfg[0]);
      const mixprec_status st = run(&c, !c.op_unscale, out, &found, norms, norms_cap, &total);
      FZ_CHECK(st == MIXPREC_OK, "twin op returned %d", (int)st);
      fz_same("found_inf of the twin op", &ref_found, &found, sizeof found, cfg[0], cfg[0]);
      if (c.want_norms)
        fz_same("norms of unscale vs grad_norm", ref_norms, norms,
                sizeof(float) * (size_t)c.n_alloc, cfg[0], cfg[0]);
      if (c.want_total)
        fz_same("total_norm of unscale vs grad_norm", &ref_total, &total, sizeof total, cfg[0],
                cfg[0]);
      free_data(out, c.n_alloc);
    }
    free_data(unscaled, c.n_alloc);
    free_data(ref_data, c.n_alloc);
  }
  for (int i = 0; i < c.n_alloc; i++) free(c.t[i].data);
  return 0;
}
