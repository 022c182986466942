/* libFuzzer harness: mixprec_roi_align(), mixprec_roi_align_backward() and
 * mixprec_roi_align_first_bad_roi() (roi_align.h).
 *
 * One input = one forward or backward call: 0 to 3 images of 0 to 20
 * channels (past the AVX2 path's 8 and the 16-channel blocks) on maps of 0
 * to 24 pixels a side, 0 to 40 rois (FP32/FP16/BF16 features, rois, outputs,
 * each its own dtype), boxes inside, across and outside the map, inverted,
 * tiny or with specials; pooled sizes 0 to 9, sampling ratios adaptive or
 * fixed, aligned or not, spatial scales from tiny to large; the backward's
 * gradient contiguous, expanded (stride 0) or padded. With the fault bit:
 * NULL pointers, unknown dtypes, negative or overflowing sizes, bad options,
 * batch indices out of range (NaN, -1, N). Checked: the status is one the
 * header documents; on an error the output is unchanged; on success the
 * output equals a reference written here from the header's semantics (the
 * sampling grid, clamping and bilinear weights in float, the sum in sample
 * order, the backward's scatter in roi, bin, sample order, rounded once),
 * the inputs are unchanged, and the bits are the same on 1 and 2 threads and
 * on every ISA path (any two NaNs counting as equal, see the README). */
#include "fuzz_common.h"

typedef struct call {
  int backward;
  int64_t n, c, h, w, k;     /* as passed */
  int64_t hn, hc, hh, hw, hk; /* held */
  mixprec_dtype id, rd, od;   /* input (grad_output for backward), rois, output */
  void *in, *rois;
  size_t in_bytes, rois_bytes;
  int64_t gs[4]; /* backward: grad_output strides */
  mixprec_roi_align_params p;
  int p_null, out_null, gs_null;
} call;

/* The header's per-roi geometry, in float. */
typedef struct geo {
  int64_t b;
  int finite;
  float sh, sw, bh, bw;
  int64_t gh, gw;
} geo;

static int64_t ceil_grid(float size, int64_t pooled) {
  const float q = ceilf(size / (float)pooled);
  if (!(q > -2147483648.0f)) return q == q ? INT32_MIN : 0;
  if (q >= 2147483647.0f) return INT32_MAX;
  return (int64_t)q;
}

static geo roi_geo(const call *c, int64_t k) {
  geo g;
  const float b = fz_load(c->rois, c->rd, 5 * k);
  g.b = (int64_t)b;
  float v[4];
  g.finite = 1;
  for (int e = 0; e < 4; e++) {
    v[e] = fz_load(c->rois, c->rd, 5 * k + 1 + e);
    g.finite &= fz_finite(v[e]);
  }
  const float scale = (float)c->p.spatial_scale, off = c->p.aligned ? 0.5f : 0.0f;
  g.sw = v[0] * scale - off;
  g.sh = v[1] * scale - off;
  float rw = (v[2] * scale - off) - g.sw, rh = (v[3] * scale - off) - g.sh;
  if (!c->p.aligned) {
    rw = rw < 1.0f ? 1.0f : rw;
    rh = rh < 1.0f ? 1.0f : rh;
  }
  g.bh = rh / (float)c->p.pooled_height;
  g.bw = rw / (float)c->p.pooled_width;
  g.gh = c->p.sampling_ratio > 0 ? c->p.sampling_ratio : ceil_grid(rh, c->p.pooled_height);
  g.gw = c->p.sampling_ratio > 0 ? c->p.sampling_ratio : ceil_grid(rw, c->p.pooled_width);
  if (!g.finite) g.gh = g.gw = 0;
  return g;
}

/* One axis of a sample: ok, corners lo/hi, weights of hi (l) and lo (hh). */
static int axis(float y, int64_t size, int64_t *lo, int64_t *hi, float *l, float *hh) {
  if (!(y >= -1.0f && y <= (float)size)) return 0;
  if (y <= 0.0f) y = 0.0f;
  *lo = (int64_t)y;
  if (*lo >= size - 1) {
    *lo = *hi = size - 1;
    y = (float)*lo;
  } else {
    *hi = *lo + 1;
  }
  *l = y - (float)*lo;
  *hh = 1.0f - *l;
  return 1;
}

/* Visits every sample of bin (ph, pw) of roi g: fn(w[4], off[4]). */
#define FOR_SAMPLES(g, ph, pw, BODY)                                                          \
  for (int64_t iy = 0; iy < (g).gh; iy++) {                                                  \
    const float y = (g).sh + (float)(ph) * (g).bh + ((float)iy + 0.5f) * (g).bh / (float)(g).gh; \
    int64_t ylo = 0, yhi = 0;                                                                \
    float ly = 0, hy = 0;                                                                    \
    const int yok = axis(y, c->hh, &ylo, &yhi, &ly, &hy);                                    \
    for (int64_t ix = 0; ix < (g).gw; ix++) {                                                \
      const float x = (g).sw + (float)(pw) * (g).bw + ((float)ix + 0.5f) * (g).bw / (float)(g).gw; \
      int64_t xlo = 0, xhi = 0;                                                              \
      float lx = 0, hx = 0;                                                                  \
      const int ok = axis(x, c->hw, &xlo, &xhi, &lx, &hx) && yok;                            \
      const float wt[4] = {ok ? hy * hx : 0, ok ? hy * lx : 0, ok ? ly * hx : 0, ok ? ly * lx : 0}; \
      const int64_t at[4] = {ok ? ylo * c->hw + xlo : 0, ok ? ylo * c->hw + xhi : 0,         \
                             ok ? yhi * c->hw + xlo : 0, ok ? yhi * c->hw + xhi : 0};        \
      BODY                                                                                   \
    }                                                                                        \
  }

static void reference(const call *c, void *out) {
  const int64_t PH = c->p.pooled_height, PW = c->p.pooled_width, plane = c->hh * c->hw;
  if (!c->backward) {
    for (int64_t k = 0; k < c->hk; k++) {
      const geo g = roi_geo(c, k);
      const int64_t prod = g.gh * g.gw;
      const float count = (float)(prod > 1 ? prod : 1);
      for (int64_t ch = 0; ch < c->hc; ch++)
        for (int64_t ph = 0; ph < PH; ph++)
          for (int64_t pw = 0; pw < PW; pw++) {
            const int64_t o = ((k * c->hc + ch) * PH + ph) * PW + pw;
            if (!g.finite) {
              fz_store(out, c->od, o, fz_f32_from_bits(0x7fc00000u));
              continue;
            }
            const int64_t base = (g.b * c->hc + ch) * plane;
            float val = 0.0f;
            FOR_SAMPLES(g, ph, pw, {
              float t = wt[0] * fz_load(c->in, c->id, base + at[0]);
              t = t + wt[1] * fz_load(c->in, c->id, base + at[1]);
              t = t + wt[2] * fz_load(c->in, c->id, base + at[2]);
              t = t + wt[3] * fz_load(c->in, c->id, base + at[3]);
              val += t;
            })
            fz_store(out, c->od, o, val / count);
          }
    }
    return;
  }
  const int64_t total = c->hn * c->hc * plane;
  float *acc = (float *)fz_alloc(sizeof(float) * (size_t)(total > 0 ? total : 1));
  for (int64_t i = 0; i < total; i++) acc[i] = 0.0f;
  const int64_t grad_numel = c->hk * c->hc * PH * PW;
  for (int64_t k = 0; k < c->hk && grad_numel > 0; k++) {
    const geo g = roi_geo(c, k);
    if (!g.finite || g.gh <= 0 || g.gw <= 0) continue;
    const float count = (float)(g.gh * g.gw);
    for (int64_t ch = 0; ch < c->hc; ch++)
      for (int64_t ph = 0; ph < PH; ph++)
        for (int64_t pw = 0; pw < PW; pw++) {
          const float gv = fz_load(c->in, c->id, k * c->gs[0] + ch * c->gs[1] + ph * c->gs[2] + pw * c->gs[3]);
          float *dst = acc + (g.b * c->hc + ch) * plane;
          FOR_SAMPLES(g, ph, pw, {
            if (wt[0] != 0.0f || wt[1] != 0.0f || wt[2] != 0.0f || wt[3] != 0.0f)
              for (int q = 0; q < 4; q++) dst[at[q]] += gv * wt[q] / count;
          })
        }
  }
  for (int64_t i = 0; i < total; i++) fz_store(out, c->od, i, acc[i]);
  free(acc);
}

static mixprec_status run(const call *c, void *out) {
  const mixprec_roi_align_params p = c->p;
  const mixprec_roi_align_params *pp = c->p_null ? NULL : &p;
  void *o = c->out_null ? NULL : out;
  int64_t gs[4];
  memcpy(gs, c->gs, sizeof gs);
  mixprec_status st;
  if (c->backward)
    st = mixprec_roi_align_backward(c->in, c->id, c->gs_null ? NULL : gs, c->rois, c->rd, c->k,
                                    c->n, c->c, c->h, c->w, pp, o, c->od);
  else
    st = mixprec_roi_align(c->in, c->id, c->n, c->c, c->h, c->w, c->rois, c->rd, c->k, pp, o,
                           c->od);
  FZ_CHECK(!memcmp(&p, &c->p, sizeof p), "params written");
  FZ_CHECK(!memcmp(gs, c->gs, sizeof gs), "grad_strides written");
  return st;
}

static int mul_ok(int64_t a, int64_t b, int64_t *out) {
  if (a < 0 || b < 0) return 0;
  if (a != 0 && b > INT64_MAX / a) return 0;
  *out = a * b;
  return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  FZ_OPEN(f, c, op);
  c.backward = op & 1;
  const int faults = fz_faults(op, 0xc0);
  c.hn = fz_range(&f, 0, 3);
  c.hc = fz_u8(&f) < 200 ? fz_range(&f, 0, 9) : fz_range(&f, 10, 20);
  c.hh = fz_range(&f, 0, 24);
  c.hw = fz_range(&f, 0, 24);
  c.hk = fz_range(&f, 0, 40);
  c.id = fz_dtype(&f, faults);
  c.rd = fz_dtype(&f, faults);
  c.od = fz_dtype(&f, faults);
  const mixprec_dtype id = fz_dtype_ok(c.id) ? c.id : MIXPREC_F32;
  const mixprec_dtype rd = fz_dtype_ok(c.rd) ? c.rd : MIXPREC_F32;
  c.p = mixprec_roi_align_params_default(fz_range(&f, 0, 9), fz_range(&f, 0, 9));
  {
    const uint8_t s = fz_u8(&f);
    c.p.spatial_scale = s < 128 ? 1.0 : s < 192 ? ldexp(1.0, (int)fz_range(&f, -6, 3)) : fz_param(&f, 0.0, 4.0);
    /* Bounded, so that adaptive grids stay small (a huge roi would take as
     * long here as in torchvision). */
    if (!(c.p.spatial_scale >= 0.0 && c.p.spatial_scale <= 4.0)) c.p.spatial_scale = 0.5;
    const uint8_t r = fz_u8(&f);
    c.p.sampling_ratio = r < 128 ? -1 : r < 136 ? 0 : fz_range(&f, 1, 4);
    c.p.aligned = fz_u8(&f) & 1;
  }
  if (c.hn == 0) c.hk = 0; /* a roi needs an image (a bad index is a fault below) */
  c.n = c.hn, c.c = c.hc, c.h = c.hh, c.w = c.hw, c.k = c.hk;
  const int64_t PH = c.p.pooled_height, PW = c.p.pooled_width;

  /* rois: batch indices valid unless a fault makes one out of range. */
  c.rois_bytes = (size_t)(5 * c.hk) * fz_dsize(c.rd);
  c.rois = fz_alloc(c.rois_bytes);
  {
    const float scale = (float)c.p.spatial_scale;
    const float span_x = (float)(c.hw + 4) / (scale > 0 ? scale : 1.0f);
    const float span_y = (float)(c.hh + 4) / (scale > 0 ? scale : 1.0f);
    for (int64_t k = 0; k < c.hk; k++) {
      const uint64_t r = fz_rng(&f);
      float v[5];
      v[0] = c.hn > 0 ? (float)(r % (uint64_t)c.hn) + ((r >> 8) & 1 ? 0.5f : 0.0f) : 0.0f;
      for (int e = 0; e < 2; e++) {
        const float sp = e == 0 ? span_x : span_y;
        const float a = ((float)((r >> (16 + 12 * e)) % 4096) / 4096.0f) * sp - 2.0f;
        const float len = ((float)((r >> (40 + 8 * e)) % 256) / 64.0f) * sp / 4.0f;
        v[1 + e] = a;
        v[3 + e] = ((r >> 60) & 1) ? a - len : a + len; /* sometimes inverted */
      }
      /* Non-finite coordinates (NaN rows, no gradient); huge finite ones
       * would make adaptive grids of billions of samples. */
      if (((r >> 58) & 3) == 0 && (fz_u8(&f) & 7) == 0) v[1 + (r >> 61) % 4] = (r & 1) ? NAN : -INFINITY;
      for (int e = 0; e < 5; e++) fz_store(c.rois, rd, 5 * k + e, v[e]);
    }
  }
  /* Input (forward: features; backward: grad_output with its strides). */
  int64_t held_in = 0;
  if (!c.backward) {
    held_in = c.hn * c.hc * c.hh * c.hw;
  } else {
    const uint8_t sm = fz_u8(&f) % 3;
    const int64_t pad = fz_range(&f, 1, 3);
    if (sm == 0) {
      c.gs[3] = 1, c.gs[2] = PW, c.gs[1] = PH * PW, c.gs[0] = c.hc * PH * PW;
    } else if (sm == 1) { /* expanded: one value per channel */
      c.gs[0] = 0, c.gs[1] = 1, c.gs[2] = 0, c.gs[3] = 0;
    } else {
      c.gs[3] = pad, c.gs[2] = PW * pad, c.gs[1] = PH * PW * pad, c.gs[0] = c.hc * PH * PW * pad + 1;
    }
    held_in = 1;
    const int64_t dims[4] = {c.hk, c.hc, PH, PW};
    int empty = 0;
    for (int d = 0; d < 4; d++) empty |= dims[d] == 0;
    if (!empty)
      for (int d = 0; d < 4; d++) held_in += (dims[d] - 1) * c.gs[d];
  }
  c.in_bytes = (size_t)held_in * fz_dsize(c.id);
  c.in = fz_alloc(c.in_bytes);
  fz_fill(&f, c.in, id, held_in);

  const uint8_t fm = faults ? fz_u8(&f) : 0;
  if (fm & 1) {
    /* Negative only: a positive size past the buffers could be valid. */
    static const int64_t bad[] = {-1, INT64_MIN, -((int64_t)1 << 40), -7};
    const int64_t v = bad[fz_u8(&f) % 4];
    switch (fz_u8(&f) % 5) {
      case 0: c.n = v; break;
      case 1: c.c = v; break;
      case 2: c.h = v; break;
      case 3: c.w = v; break;
      default: c.k = v; break;
    }
  }
  if (fm & 2) {
    const uint8_t w = fz_u8(&f);
    switch (w % 5) {
      case 0: c.p.pooled_height = -1 - (int64_t)(w >> 4); break;
      case 1: c.p.pooled_width = (int64_t)INT32_MAX + 1; break;
      case 2: c.p.sampling_ratio = (int64_t)INT32_MAX + 1 + (int64_t)(w >> 4); break;
      case 3: c.p.spatial_scale = w & 16 ? NAN : 1e39; break;
      default: c.p.spatial_scale = INFINITY; break;
    }
  }
  if ((fm & 4) && c.hk > 0) { /* a batch index out of range */
    static const float bad_b[] = {-1.0f, 3.0e9f, NAN, -1.5f};
    const float v = (fz_u8(&f) & 1) ? (float)c.hn : bad_b[fz_u8(&f) % 4];
    fz_store(c.rois, rd, 5 * fz_range(&f, 0, c.hk - 1), v);
  }
  c.p_null = (fm & 8) != 0;
  c.out_null = (fm & 16) != 0;
  if (fm & 32) {
    if (fz_u8(&f) & 1) {
      free(c.in);
      c.in = NULL;
    } else {
      free(c.rois);
      c.rois = NULL;
    }
  }
  if (c.backward && (fm & 64)) {
    if (fz_u8(&f) & 1) c.gs_null = 1;
    else c.gs[fz_u8(&f) % 4] = -1;
  }

  /* The documented errors. */
  fz_allowed errors = 0;
  int64_t plane = 0, t = 0, in_numel = 0, bins = 0, out_numel = 0;
  int sizes_ok = 1;
  if (c.p_null) errors |= FZ_BIT(MIXPREC_ERR_NULL_POINTER);
  if (c.n < 0 || c.c < 0 || c.h < 0 || c.w < 0 || c.k < 0) errors |= FZ_BIT(MIXPREC_ERR_BAD_SIZE), sizes_ok = 0;
  if (!fz_dtype_ok(c.id) || !fz_dtype_ok(c.rd) || !fz_dtype_ok(c.od)) errors |= FZ_BIT(MIXPREC_ERR_BAD_DTYPE);
  const int pooled_bad = c.p.pooled_height < 0 || c.p.pooled_width < 0;
  if (pooled_bad || c.p.pooled_height > INT32_MAX || c.p.pooled_width > INT32_MAX ||
      c.p.sampling_ratio > INT32_MAX || !(c.p.spatial_scale - c.p.spatial_scale == 0.0) ||
      !fz_finite((float)c.p.spatial_scale))
    errors |= FZ_BIT(MIXPREC_ERR_BAD_ARGUMENT);
  if (sizes_ok && !pooled_bad) {
    if (!mul_ok(c.h, c.w, &plane) || !mul_ok(plane, c.c, &t) || !mul_ok(t, c.n, &in_numel) ||
        !mul_ok(c.p.pooled_height, c.p.pooled_width, &bins) || !mul_ok(bins, c.c, &t) ||
        !mul_ok(t, c.k, &out_numel) || c.k > INT64_MAX / 5)
      errors |= FZ_BIT(MIXPREC_ERR_BAD_SIZE), sizes_ok = 0;
    else if (out_numel > 0 && plane == 0)
      errors |= FZ_BIT(MIXPREC_ERR_BAD_SIZE);
  } else {
    sizes_ok = 0;
  }
  if (c.backward) {
    if (c.gs_null) errors |= FZ_BIT(MIXPREC_ERR_NULL_POINTER);
    else if (c.gs[0] < 0 || c.gs[1] < 0 || c.gs[2] < 0 || c.gs[3] < 0)
      errors |= FZ_BIT(MIXPREC_ERR_BAD_ARGUMENT);
  }
  /* Data pointers matter only when there is something to compute; a size
   * error leaves that open, so NULLs are allowed errors then too. */
  const int live = c.backward ? (!sizes_ok || in_numel > 0) : (!sizes_ok || out_numel > 0);
  if (live) {
    if (c.out_null) errors |= FZ_BIT(MIXPREC_ERR_NULL_POINTER);
    const int reads = c.backward ? (!sizes_ok || out_numel > 0) : 1;
    if (reads && (!c.in || !c.rois)) errors |= FZ_BIT(MIXPREC_ERR_NULL_POINTER);
  }
  if (fm & 4) errors |= FZ_BIT(MIXPREC_ERR_BAD_ARGUMENT);
  if (fm & 32) errors |= FZ_BIT(MIXPREC_ERR_NULL_POINTER);

  const int64_t held_out = c.backward ? c.hn * c.hc * c.hh * c.hw : c.hk * c.hc * PH * PW;
  const size_t out_bytes = (size_t)(held_out > 0 ? held_out : 0) * fz_dsize(c.od);
  uint8_t *out0 = (uint8_t *)fz_alloc(out_bytes);
  memset(out0, 0x5a, out_bytes);
  void *in0 = c.in ? fz_dup(c.in, c.in_bytes) : NULL;
  void *rois0 = c.rois ? fz_dup(c.rois, c.rois_bytes) : NULL;

  FZ_CONFIGS(cfg, n_cfg);
  uint8_t *ref = NULL;
  int ok_status = 0;
  FZ_FOR_EACH_CONFIG(cfg, n_cfg, q) {
    uint8_t *out = (uint8_t *)fz_dup(out0, out_bytes);
    const mixprec_status st = run(&c, out);
    if (faults && fm) {
      /* With a fault the call may still be valid: then it must succeed on
       * every configuration alike; otherwise it must be an allowed error. */
      FZ_CHECK(st == MIXPREC_OK || ((unsigned)st < 32 && (errors & FZ_BIT(st))),
               "status %d (%s) not documented for this input (mask 0x%x)", (int)st,
               mixprec_status_string(st), (unsigned)errors);
      if (q == 0) ok_status = st == MIXPREC_OK;
      FZ_CHECK(ok_status == (st == MIXPREC_OK), "status differs between configurations");
    } else {
      fz_check_status(c.backward ? "mixprec_roi_align_backward" : "mixprec_roi_align", st, errors);
    }
    if (in0) fz_unchanged("input", in0, c.in, c.in_bytes, st);
    if (rois0) fz_unchanged("rois", rois0, c.rois, c.rois_bytes, st);
    if (st != MIXPREC_OK) {
      fz_unchanged("output", out0, out, out_bytes, st);
      free(out);
      break;
    }
    if (q == 0) {
      ref = out;
      continue;
    }
    /* Any two NaNs are equal: when NaN inputs of both signs meet in one sum
     * the paths may keep either (tests/fuzz/README.md, Findings). */
    fz_same_nan("output", 0, ref, out, c.od, held_out, cfg[0], cfg[q]);
    free(out);
  }
  if (ref && !(faults && fm) && held_out > 0) {
    uint8_t *want = (uint8_t *)fz_dup(out0, out_bytes);
    reference(&c, want);
    const fz_config ref_cfg = {MIXPREC_ISA_AUTO, 0};
    fz_same_nan("output vs the reference", 0, want, ref, c.od, held_out, ref_cfg, cfg[0]);
    free(want);
  }
  free(ref);
  mixprec_set_cpu_isa(MIXPREC_ISA_AUTO);
  free(out0);
  free(in0);
  free(rois0);
  free(c.in);
  free(c.rois);
  return 0;
}
