/* libFuzzer harness: mixprec_act_packed_size(), mixprec_act_pack(),
 * mixprec_act_unpack(), mixprec_act_mask() and mixprec_act_unpack_norm_relu()
 * (act_pack.h), the C entry points of compressed activations. The mask runs
 * on every pack input (x's own bits: NaN payloads, +-0, infinities); the
 * recomputed ReLU output on every valid pack's result, with fuzzed a, b
 * (specials included), channel count, inner run length and mask, each
 * element against the header's rule, then with a bad channel count, inner
 * or a NULL mask (nothing written). A quarter of the inputs (op bits 1 and
 * 2 set) run mixprec_act_pool_encode / _decode instead ([note: pool
 * codes]): fuzzed geometry, layout and indices against a search over each
 * window, the inexact count, decode back, argument faults.
 *
 * One input = one of two calls, on n from 0 to past the 2^17 threading
 * limit, a dtype, 8- or 4-bit codes, a block of 32..4096 and a 64-bit seed:
 *   - pack (op bit 0 clear): x filled with raw bits, NaNs with payloads,
 *     infinities, subnormals, each dtype's limits, small integers, and
 *     blocks made ReLU-like (|x|, zeros, -0), at an odd element offset
 *     inside a larger buffer; then unpack of the packed result to x's dtype
 *     and to another one;
 *   - unpack (op bit 0 set) of fuzzed codes and scales (any bits are valid
 *     input: raw words, NaNs, infinities, zeros of both signs, subnormals).
 * With the fault bits: negative n, bits and blocks the format does not take,
 * unknown dtypes, NULL pointers (for n == 0 too, where they are allowed).
 * Checked:
 *   - packed_size and the call return a status the header documents for the
 *     input (OK only when none applies); on an error nothing is written;
 *     x, codes and scales given as input are never written;
 *   - codes, scales and unpacked values are the same bits on 1 and 2
 *     threads and on each ISA path this CPU has (each a new call with the
 *     same seed);
 *   - pack, per block, from the header's note: a block with an inf or NaN
 *     has the scale 0x7fc00000 and codes 0; otherwise the stored scale is,
 *     bit for bit, s | z with s = hi / Q (no element below zero, -0 is
 *     zero; z = 0) or max(hi, 0) / (Q - 1) - lo / (Q - 1), at least 2^-126,
 *     rounded up to free its low 8 bits, and z = ceil(-lo / s) clamped to
 *     [1, Q]; each code is c = q + z clamped to [0, Q] with q = floor(t + u)
 *     for some u in [0, 1) (t = x * (1 / s) in float), i.e. q in {floor(t),
 *     floor(t) + 1}, +-1 in place of 0 for a non-zero x, and c = z exactly
 *     for a zero; the padding nibble of an odd 4-bit tensor is 0;
 *   - unpack of what pack wrote: a zero comes back +0, a non-zero non-zero
 *     with its sign (x's dtype), |y - x| <= s plus float rounding, finite
 *     stays finite, a non-finite block is the dtype's fixed NaN;
 *   - unpack of any codes / scales: bit for bit the header's rule ((c - z)
 *     * s in float, z the low 8 bits of the stored scale and s the rest,
 *     clamped to the dtype's finite range, rounded by the public
 *     converters; an s that is not finite gives the fixed NaN).
 * Two library bugs this harness found are fixed and now checked: a value
 * within s of its dtype's largest finite value came back as inf; a signed
 * block whose -lo / s underflowed to 0 in float got z = 0, and its negative
 * elements came back +0. */
#include "fuzz_common.h"

typedef struct call {
  int64_t n, bits, block;
  mixprec_dtype dtype;
  uint64_t seed;
  int x_null, codes_null, scales_null, out_null;
} call;

static const uint32_t kFixedNan[3] = {0x7fc00000u, 0x7e00u, 0x7fc0u}; /* F32, F16, BF16 */

static int format_ok(int64_t bits, int64_t block) {
  return (bits == 8 || bits == 4) && block >= 32 && block <= 4096 && (block & (block - 1)) == 0;
}

static int64_t code_bytes_of(int64_t n, int64_t bits) { return bits == 8 ? n : n / 2 + (n & 1); }
static int64_t n_scales_of(int64_t n, int64_t block) { return n / block + (n % block != 0); }

static int code_at(const uint8_t *codes, int64_t bits, int64_t i) {
  return bits == 8 ? codes[i] : (codes[i / 2] >> (4 * (i & 1))) & 15;
}

static uint32_t raw_at(const void *p, mixprec_dtype d, int64_t i) {
  if (d == MIXPREC_F32) {
    uint32_t u;
    memcpy(&u, (const char *)p + 4 * i, 4);
    return u;
  }
  uint16_t h;
  memcpy(&h, (const char *)p + 2 * i, 2);
  return h;
}

/* A stored scale's parts: s (the low 8 bits cleared) and z (those bits). */
static float scale_part(float stored) { return fz_f32_from_bits(fz_bits(stored) & ~0xffu); }
static int zero_part(float stored) { return (int)(fz_bits(stored) & 0xffu); }

/* The largest finite value of a dtype: what unpack clamps to. */
static double dtype_max(mixprec_dtype d) {
  return d == MIXPREC_F32 ? 0x1.fffffep127 : d == MIXPREC_F16 ? 65504.0 : 0x1.fep127;
}

/* The header's unpack of one element (a stored scale with finite s). */
static uint32_t ref_value_bits(int c, float stored, mixprec_dtype d) {
  float v = (float)(c - zero_part(stored)) * scale_part(stored);
  const float m = (float)dtype_max(d);
  v = v > m ? m : v < -m ? -m : v;
  char tmp[4];
  fz_store(tmp, d, 0, v);
  return raw_at(tmp, d, 0);
}

/* The stored scale of a finite block with smallest lo and largest hi. */
static float ref_stored_scale(float lo, float hi, int64_t bits) {
  const int qmax = (1 << bits) - 1;
  const int is_signed = lo < 0.0f;
  const float top = hi > 0.0f ? hi : 0.0f;
  float s = is_signed ? top / (float)(qmax - 1) - lo / (float)(qmax - 1) : top / (float)qmax;
  if (s < 0x1p-126f) s = 0x1p-126f;
  /* Up to the next float with its low 8 bits zero (the real-line ceiling
   * on the grid of 2^(e - 16), 2^(e-1) <= s < 2^e). */
  int e;
  frexp((double)s, &e);
  const double grid = ldexp(1.0, e - 16);
  s = (float)(ceil((double)s / grid) * grid);
  int z = 0;
  if (is_signed) {
    const double w = ceil((double)(-lo / s));
    z = w > qmax ? qmax : w < 1.0 ? 1 : (int)w;
  }
  return fz_f32_from_bits(fz_bits(s) | (uint32_t)z);
}

/* Status errors of a pack / unpack call, from the header. */
static fz_allowed call_errors(const call *c, int data_null, int codes_null, int scales_null) {
  fz_allowed e = 0;
  if (c->n < 0) e |= FZ_BIT(MIXPREC_ERR_BAD_SIZE);
  if (!format_ok(c->bits, c->block)) e |= FZ_BIT(MIXPREC_ERR_BAD_ARGUMENT);
  if (!fz_dtype_ok(c->dtype)) e |= FZ_BIT(MIXPREC_ERR_BAD_DTYPE);
  if (c->n > 0 && (data_null || codes_null || scales_null)) e |= FZ_BIT(MIXPREC_ERR_NULL_POINTER);
  return e;
}

/* Decodes n, dtype, bits, block, seed (and the faults). */
static void decode_call(fz *f, call *c, int faults) {
  c->n = fz_count(f, (int64_t)1 << 17);
  c->dtype = fz_dtype(f, faults);
  const uint8_t fmt = fz_u8(f);
  c->bits = fmt & 1 ? 4 : 8;
  c->block = (int64_t)32 << ((fmt >> 1) % 8);
  c->seed = fz_u64(f);
  if (!faults) return;
  const uint8_t fm = fz_u8(f);
  if ((fm & 7) == 1) {
    static const int64_t bad[] = {-1, -2, -4097, INT64_MIN, INT64_MIN + 1};
    c->n = bad[fz_u8(f) % 5];
  }
  if ((fm & 7) == 2) {
    static const int64_t bad[] = {0, 1, 2, 3, 5, 7, 9, 16, -4, -8, (int64_t)1 << 33};
    c->bits = bad[fz_u8(f) % 11];
  }
  if ((fm & 7) == 3) {
    static const int64_t bad[] = {0, 1, 16, 31, 33, 48, 96, 4095, 4097, 8192, -32, INT64_MIN,
                                  (int64_t)1 << 40};
    c->block = bad[fz_u8(f) % 13];
  }
  if ((fm & 7) == 4) c->n = 0; /* NULLs allowed */
  c->x_null = (fm & 0x10) != 0;
  c->codes_null = (fm & 0x20) != 0;
  c->scales_null = (fm & 0x40) != 0;
  c->out_null = (fm & 0x80) != 0;
}

/* Checks mixprec_act_packed_size for the call's n, bits, block; returns
 * whether the sizes are known (OK), filling them. */
static int sizes(const call *c, int64_t *cb, int64_t *ns) {
  int64_t a = -77, b = -77;
  fz_allowed e = 0;
  if (c->n < 0) e |= FZ_BIT(MIXPREC_ERR_BAD_SIZE);
  if (!format_ok(c->bits, c->block)) e |= FZ_BIT(MIXPREC_ERR_BAD_ARGUMENT);
  const mixprec_status st = mixprec_act_packed_size(c->n, c->bits, c->block, &a, &b);
  fz_check_status("mixprec_act_packed_size", st, e);
  FZ_CHECK(mixprec_act_packed_size(c->n, c->bits, c->block, NULL, &b) ==
               MIXPREC_ERR_NULL_POINTER || e,
           "packed_size with a NULL out pointer");
  if (st != MIXPREC_OK) {
    FZ_CHECK(a == -77 && b == -77, "packed_size wrote on status %d", (int)st);
    return 0;
  }
  FZ_CHECK(a == code_bytes_of(c->n, c->bits) && b == n_scales_of(c->n, c->block),
           "packed_size(%lld, %lld, %lld) = %lld, %lld", (long long)c->n, (long long)c->bits,
           (long long)c->block, (long long)a, (long long)b);
  *cb = a;
  *ns = b;
  return 1;
}

/* Unpacks into a poisoned buffer of `bytes` (exactly the output when the
 * call is valid) under every configuration; returns the status and leaves
 * cfg[0]'s output in *first (caller frees). */
static mixprec_status unpack_all(const call *c, const uint8_t *codes, const float *scales,
                                 mixprec_dtype od, size_t bytes, fz_allowed errors,
                                 void **first) {
  FZ_CONFIGS(cfg, n_cfg);
  void *poison = fz_alloc(bytes);
  memset(poison, 0x5b, bytes);
  void *out0 = fz_dup(poison, bytes), *out = fz_dup(poison, bytes);
  mixprec_status st0 = MIXPREC_OK;
  FZ_FOR_EACH_CONFIG(cfg, n_cfg, k) {
    void *o = k == 0 ? out0 : out;
    memcpy(o, poison, bytes);
    const mixprec_status st = mixprec_act_unpack(c->codes_null ? NULL : codes,
                                                 c->scales_null ? NULL : scales, c->n, c->bits,
                                                 c->block, c->out_null ? NULL : o, od);
    if (k == 0) {
      st0 = st;
      fz_check_status("mixprec_act_unpack", st, errors);
    } else {
      FZ_CHECK(st == st0, "unpack status %d vs %d", (int)st, (int)st0);
      if (st == MIXPREC_OK) fz_same("unpacked values", o, out0, bytes, cfg[k], cfg[0]);
    }
    if (st != MIXPREC_OK) fz_unchanged("unpack output", poison, o, bytes, st);
  }
  free(poison);
  free(out);
  *first = out0;
  return st0;
}

/* Unpack of fuzzed codes and scales. */
static void run_unpack(fz *f, call *c, int faults) {
  int64_t cb = 0, ns = 0;
  const int known = sizes(c, &cb, &ns);
  if (!known) cb = ns = 16; /* an error: nothing may be read or written */
  uint8_t *codes = (uint8_t *)fz_alloc((size_t)cb);
  float *scales = (float *)fz_alloc(sizeof(float) * (size_t)ns);
  const uint8_t cmode = fz_u8(f);
  for (int64_t i = 0; i < cb; i++) codes[i] = cmode < 64 ? fz_u8(f) : (uint8_t)fz_rng(f);
  for (int64_t b = 0; b < ns; b++) {
    const uint8_t m = fz_u8(f);
    scales[b] = m < 96 ? fz_special(f) : m < 160 ? fz_f32_from_bits(fz_u32(f))
                                                 : (float)fz_param(f, -1e3, 1e3);
  }
  uint8_t *codes_in = (uint8_t *)fz_dup(codes, (size_t)cb);
  float *scales_in = (float *)fz_dup(scales, sizeof(float) * (size_t)ns);
  const fz_allowed errors = call_errors(c, c->out_null, c->codes_null, c->scales_null);
  (void)faults;
  const mixprec_dtype od = c->dtype;
  const size_t bytes = known && fz_dtype_ok(od) ? (size_t)c->n * fz_dsize(od) : 64;
  void *y = NULL;
  const mixprec_status st = unpack_all(c, codes, scales, od, bytes, errors, &y);
  FZ_CHECK(!memcmp(codes, codes_in, (size_t)cb), "unpack wrote its codes");
  FZ_CHECK(!memcmp(scales, scales_in, sizeof(float) * (size_t)ns), "unpack wrote its scales");
  if (st == MIXPREC_OK) {
    for (int64_t i = 0; i < c->n; i++) {
      const float stored = scales[i / c->block];
      const uint32_t got = raw_at(y, od, i);
      const uint32_t want = fz_finite(scale_part(stored))
                                ? ref_value_bits(code_at(codes, c->bits, i), stored, od)
                                : kFixedNan[od];
      FZ_CHECK(got == want,
               "unpack element %lld (code %d, scale %a, bits %lld, block %lld, dtype %d): 0x%x, "
               "want 0x%x", (long long)i, code_at(codes, c->bits, i), (double)stored,
               (long long)c->bits, (long long)c->block, (int)od, got, want);
    }
  }
  free(y);
  free(codes);
  free(scales);
  free(codes_in);
  free(scales_in);
}

/* Per-block checks of packed output against the header's note. */
static void check_packed(const call *c, const void *x, const uint8_t *codes, const float *scales,
                         int64_t cb) {
  const int64_t bits = c->bits, block = c->block;
  const int qmax = (1 << bits) - 1;
  for (int64_t first = 0; first < c->n; first += block) {
    const int64_t len = c->n - first < block ? c->n - first : block;
    const float stored = scales[first / block];
    int finite = 1;
    float lo = INFINITY, hi = -INFINITY;
    for (int64_t i = first; i < first + len; i++) {
      const float v = fz_load(x, c->dtype, i);
      if (!fz_finite(v)) {
        finite = 0;
      } else {
        if (v < lo) lo = v;
        if (v > hi) hi = v;
      }
    }
    if (!finite) {
      FZ_CHECK(fz_bits(stored) == 0x7fc00000u,
               "block at %lld holds an inf/NaN but its scale is %a (0x%x)", (long long)first,
               (double)stored, fz_bits(stored));
      for (int64_t i = first; i < first + len; i++)
        FZ_CHECK(code_at(codes, bits, i) == 0, "non-finite block: code %d at %lld",
                 code_at(codes, bits, i), (long long)i);
      continue;
    }
    const float want = ref_stored_scale(lo, hi, bits);
    FZ_CHECK(fz_bits(stored) == fz_bits(want),
             "block at %lld (lo %a, hi %a, bits %lld): stored scale 0x%x, want 0x%x",
             (long long)first, (double)lo, (double)hi, (long long)bits, fz_bits(stored),
             fz_bits(want));
    const float s = scale_part(stored);
    const int z = zero_part(stored);
    const float inv = 1.0f / s;
    for (int64_t i = first; i < first + len; i++) {
      const float v = fz_load(x, c->dtype, i);
      const int code = code_at(codes, bits, i);
      FZ_CHECK(code >= 0 && code <= qmax, "element %lld: code %d past Q %d", (long long)i, code,
               qmax);
      if (v == 0.0f) {
        FZ_CHECK(code == z, "element %lld is zero but its code is %d, z %d", (long long)i, code,
                 z);
        continue;
      }
      /* q = floor(t + u), u in [0, 1): floor(t) or floor(t) + 1 (the float
       * sum t + u may round up to the next integer); +-1 in place of 0;
       * c = q + z clamped. */
      const float t = v * inv;
      int ok = 0;
      for (int k = 0; k < 2 && !ok; k++) {
        double q = floor((double)t) + k;
        if (q == 0.0) q = v > 0.0f ? 1.0 : -1.0;
        double cc = q + z;
        cc = cc < 0 ? 0 : cc > qmax ? qmax : cc;
        ok = (double)code == cc;
      }
      FZ_CHECK(ok, "element %lld (%a, t %a, s %a, z %d): code %d", (long long)i, (double)v,
               (double)t, (double)s, z, code);
    }
  }
  if (bits == 4 && (c->n & 1))
    FZ_CHECK((codes[cb - 1] >> 4) == 0, "padding nibble %d", codes[cb - 1] >> 4);
}

/* Unpack of what pack wrote, in dtype od: the round trip's invariants. */
static void check_round_trip(const call *c, const void *x, const float *scales, const void *y,
                             mixprec_dtype od) {
  const int same = od == c->dtype;
  for (int64_t i = 0; i < c->n; i++) {
    const float stored = scales[i / c->block];
    const uint32_t got = raw_at(y, od, i);
    if (!fz_finite(scale_part(stored))) {
      FZ_CHECK(got == kFixedNan[od], "element %lld of a non-finite block: 0x%x", (long long)i,
               got);
      continue;
    }
    const float v = fz_load(x, c->dtype, i), w = fz_load(y, od, i);
    if (v == 0.0f) {
      FZ_CHECK(got == 0, "element %lld: a zero comes back as 0x%x", (long long)i, got);
      continue;
    }
    if (!same) continue; /* another dtype may overflow or flush: no promise */
    const double s = (double)scale_part(stored);
    /* The two fixed bugs (header comment): sign and finiteness kept. */
    FZ_CHECK(w != 0.0f && signbit(w) == signbit(v),
             "element %lld: %a comes back as %a (scale 0x%x)", (long long)i, (double)v, (double)w,
             fz_bits(stored));
    FZ_CHECK(fz_finite(w), "element %lld: finite %a comes back as %a (scale 0x%x)", (long long)i,
             (double)v, (double)w, fz_bits(stored));
    /* |y - x| <= s, plus float rounding of t and (c - z) * s and the
     * dtype's rounding (an ulp: 2^-10 relative for F16 normals, 2^-7 for
     * BF16, plus the smallest subnormal step). */
    const double rel = od == MIXPREC_F32 ? 0x1p-21 : od == MIXPREC_F16 ? 0x1p-10 : 0x1p-7;
    const double tiny = od == MIXPREC_F16 ? 0x1p-24 : 0x1p-149;
    const double err = fabs((double)w - (double)v);
    const double tol = s * (1.0 + 0x1p-20) + rel * fmax(fabs((double)v), fabs((double)w)) + tiny;
    FZ_CHECK(err <= tol, "element %lld: %a comes back as %a, error %g > %g (scale 0x%x)",
             (long long)i, (double)v, (double)w, err, tol, fz_bits(stored));
  }
}

/* Pack of fuzzed data, then unpack of the result. */
/* mixprec_act_mask of x (x's own n; with the call's NULL faults) on every
 * configuration: bit i = x[i] > 0 from its value (NaN and +-0 give 0), the
 * last byte's unused bits 0, nothing written on an error, x untouched. */
static void check_mask(const call *c, const void *x, mixprec_dtype xd, int64_t n_x) {
  const int64_t n = c->n >= 0 && c->n <= n_x ? c->n : c->n < 0 ? c->n : n_x;
  const size_t bytes = n > 0 ? (size_t)((n + 7) / 8) : 8;
  fz_allowed e = 0;
  if (n < 0) e |= FZ_BIT(MIXPREC_ERR_BAD_SIZE);
  if (n > 0 && (c->x_null || c->out_null)) e |= FZ_BIT(MIXPREC_ERR_NULL_POINTER);
  uint8_t *poison = (uint8_t *)fz_alloc(bytes), *m0 = (uint8_t *)fz_alloc(bytes),
          *m = (uint8_t *)fz_alloc(bytes);
  memset(poison, 0x5b, bytes);
  FZ_CONFIGS(cfg, n_cfg);
  mixprec_status st0 = MIXPREC_OK;
  FZ_FOR_EACH_CONFIG(cfg, n_cfg, k) {
    uint8_t *o = k == 0 ? m0 : m;
    memcpy(o, poison, bytes);
    const mixprec_status st =
        mixprec_act_mask(c->x_null ? NULL : x, xd, n, c->out_null ? NULL : o);
    if (k == 0) {
      st0 = st;
      fz_check_status("mixprec_act_mask", st, e);
    } else {
      FZ_CHECK(st == st0, "mask status %d vs %d", (int)st, (int)st0);
      if (st == MIXPREC_OK) fz_same("mask", o, m0, bytes, cfg[k], cfg[0]);
    }
    if (st != MIXPREC_OK) fz_unchanged("mask", poison, o, bytes, st);
  }
  if (st0 == MIXPREC_OK)
    for (int64_t i = 0; i < (n > 0 ? n : 0); i++) {
      const float v = fz_load(x, xd, i);
      const int want = v == v && v > 0.0f;
      FZ_CHECK(((m0[i / 8] >> (i % 8)) & 1) == want, "mask bit %lld: x 0x%x", (long long)i,
               raw_at(x, xd, i));
    }
  if (st0 == MIXPREC_OK && n > 0 && n % 8)
    FZ_CHECK((m0[n / 8] >> (n % 8)) == 0, "mask: unused bits of the last byte set");
  free(poison);
  free(m0);
  free(m);
}

/* mixprec_act_unpack_norm_relu of a valid packed tensor with fuzzed a, b
 * (specials included), channels, inner and mask, on every configuration,
 * each element bit for bit the header's rule; then its argument faults
 * (channels / inner < 1, NULLs) write nothing. */
static void check_norm_relu(fz *f, const call *c, const uint8_t *codes, const float *scales) {
  const int64_t n = c->n;
  const int64_t channels = 1 + fz_u8(f) % 70, inner = 1 + (int64_t)(fz_u32(f) % 3000);
  float *a = (float *)fz_alloc(4 * (size_t)channels), *b = (float *)fz_alloc(4 * (size_t)channels);
  for (int64_t k = 0; k < channels; k++) {
    const uint8_t m = fz_u8(f);
    a[k] = m < 32 ? fz_special(f) : (float)fz_param(f, -8, 8);
    b[k] = m >= 224 ? fz_special(f) : (float)fz_param(f, -8, 8);
  }
  const size_t mb = (size_t)((n + 7) / 8);
  uint8_t *mask = (uint8_t *)fz_alloc(mb);
  for (size_t k = 0; k < mb; k++) mask[k] = (uint8_t)fz_rng(f);
  const mixprec_dtype od = (mixprec_dtype)((c->dtype + (fz_u8(f) % 3)) % 3);
  const size_t bytes = (size_t)n * fz_dsize(od);
  void *poison = fz_alloc(bytes), *y0 = fz_alloc(bytes), *y = fz_alloc(bytes);
  memset(poison, 0x5b, bytes);
  FZ_CONFIGS(cfg, n_cfg);
  FZ_FOR_EACH_CONFIG(cfg, n_cfg, k) {
    void *o = k == 0 ? y0 : y;
    memcpy(o, poison, bytes);
    const mixprec_status st = mixprec_act_unpack_norm_relu(codes, scales, n, c->bits, c->block, a,
                                                           b, channels, inner, mask, o, od);
    fz_check_status("mixprec_act_unpack_norm_relu", st, 0);
    if (k > 0 && st == MIXPREC_OK) fz_same("norm_relu output", o, y0, bytes, cfg[k], cfg[0]);
  }
  const float tiny = od == MIXPREC_F16 ? 0x1p-14f : 0x1p-126f;
  for (int64_t i = 0; i < n; i++) {
    const float stored = scales[i / c->block];
    float x;
    if (fz_finite(scale_part(stored))) {
      x = (float)(code_at(codes, c->bits, i) - zero_part(stored)) * scale_part(stored);
      x = x > 0x1.fffffep127f ? 0x1.fffffep127f : x < -0x1.fffffep127f ? -0x1.fffffep127f : x;
    } else {
      x = fz_f32_from_bits(0x7fc00000u);
    }
    const int64_t ch = (i / inner) % channels;
    volatile float prod = x * a[ch]; /* one rounding each, never fused */
    const float v = prod + b[ch];
    uint32_t want;
    if (!((mask[i / 8] >> (i % 8)) & 1)) {
      want = 0;
    } else if (v != v) {
      want = kFixedNan[od];
    } else {
      char tmp[4];
      fz_store(tmp, od, 0, v < tiny ? tiny : v);
      want = raw_at(tmp, od, 0);
    }
    const uint32_t got = raw_at(y0, od, i);
    FZ_CHECK(got == want,
             "norm_relu element %lld (x %a, a %a, b %a, channel %lld, dtype %d): 0x%x, want 0x%x",
             (long long)i, (double)x, (double)a[ch], (double)b[ch], (long long)ch, (int)od, got,
             want);
  }
  /* faults: nothing written */
  static const int64_t bad_counts[] = {0, -1, INT64_MIN};
  const int64_t bc = bad_counts[fz_u8(f) % 3];
  const int which = fz_u8(f) % 3;
  memcpy(y, poison, bytes);
  const mixprec_status st = mixprec_act_unpack_norm_relu(
      codes, scales, n, c->bits, c->block, a, b, which == 0 ? bc : channels,
      which == 1 ? bc : inner, which == 2 ? NULL : mask, y, od);
  FZ_CHECK(st == (which == 2 ? MIXPREC_ERR_NULL_POINTER : MIXPREC_ERR_BAD_ARGUMENT),
           "norm_relu fault %d: status %d", which, (int)st);
  fz_unchanged("norm_relu output", poison, y, bytes, st);
  free(a);
  free(b);
  free(mask);
  free(poison);
  free(y0);
  free(y);
}

static void run_pack(fz *f, call *c) {
  int64_t cb = 0, ns = 0;
  const int known = sizes(c, &cb, &ns);
  if (!known) cb = ns = 16;
  /* x at an element offset of 0-7 in a buffer with 0-7 to spare. */
  const mixprec_dtype xd = fz_dtype_ok(c->dtype) ? c->dtype : MIXPREC_F32;
  const int64_t n_x = known && c->n > 0 ? c->n : 8;
  const int64_t lead = fz_range(f, 0, 7), tail = fz_range(f, 0, 7);
  const size_t es = fz_dsize(xd);
  char *xbuf = (char *)fz_alloc((size_t)(lead + n_x + tail) * es);
  fz_fill(f, xbuf, xd, lead + n_x + tail);
  void *x = xbuf + lead * es;
  /* ReLU-like blocks, zeros of both signs. */
  const uint8_t shape = fz_u8(f);
  if (shape & 1)
    for (int64_t i = 0; i < n_x; i++) {
      const uint64_t r = fz_rng(f);
      const int64_t blk = i / 32;
      if (((uint64_t)blk * 0x9e3779b97f4a7c15ull >> 62) & 1) { /* this block: |x| */
        const float v = fz_load(x, xd, i);
        if (v < 0.0f) fz_store(x, xd, i, -v);
      }
      if ((r & 7) == 0) fz_store(x, xd, i, (r & 8) ? -0.0f : 0.0f);
    }
  if (shape & 2) /* one block of only zeros */
    for (int64_t i = 0; i < n_x && i < 64; i++) fz_store(x, xd, i, (i & 1) ? -0.0f : 0.0f);
  void *x_in = fz_dup(x, (size_t)n_x * es);
  if (getenv("FZ_VERBOSE") && atoi(getenv("FZ_VERBOSE")) >= 2)
    for (int64_t i = 0; i < n_x && i < 64; i++)
      fprintf(stderr, "  x[%lld] = 0x%x (%a)\n", (long long)i, raw_at(x, xd, i),
              (double)fz_load(x, xd, i));

  const fz_allowed errors = call_errors(c, c->x_null, c->codes_null, c->scales_null);
  FZ_CONFIGS(cfg, n_cfg);
  uint8_t *codes0 = (uint8_t *)fz_alloc((size_t)cb), *codes = (uint8_t *)fz_alloc((size_t)cb);
  float *scales0 = (float *)fz_alloc(4 * (size_t)ns), *scales = (float *)fz_alloc(4 * (size_t)ns);
  uint8_t *codes_p = (uint8_t *)fz_alloc((size_t)cb);
  float *scales_p = (float *)fz_alloc(4 * (size_t)ns);
  memset(codes_p, 0xa5, (size_t)cb);
  for (int64_t b = 0; b < ns; b++) scales_p[b] = fz_f32_from_bits(0x7fa5a5a5u);
  mixprec_status st0 = MIXPREC_OK;
  FZ_FOR_EACH_CONFIG(cfg, n_cfg, k) {
    uint8_t *cd = k == 0 ? codes0 : codes;
    float *sc = k == 0 ? scales0 : scales;
    memcpy(cd, codes_p, (size_t)cb);
    memcpy(sc, scales_p, 4 * (size_t)ns);
    const mixprec_status st =
        mixprec_act_pack(c->x_null ? NULL : x, c->dtype, c->n, c->bits, c->block, c->seed,
                         c->codes_null ? NULL : cd, c->scales_null ? NULL : sc);
    if (k == 0) {
      st0 = st;
      fz_check_status("mixprec_act_pack", st, errors);
    } else {
      FZ_CHECK(st == st0, "pack status %d vs %d", (int)st, (int)st0);
      if (st == MIXPREC_OK) {
        fz_same("codes", cd, codes0, (size_t)cb, cfg[k], cfg[0]);
        fz_same("scales", sc, scales0, 4 * (size_t)ns, cfg[k], cfg[0]);
      }
    }
    if (st != MIXPREC_OK) {
      fz_unchanged("codes", codes_p, cd, (size_t)cb, st);
      fz_unchanged("scales", scales_p, sc, 4 * (size_t)ns, st);
    }
    FZ_CHECK(!memcmp(x, x_in, (size_t)n_x * es), "pack wrote its input");
  }

  if (fz_dtype_ok(c->dtype)) check_mask(c, x, xd, n_x);
  if (st0 == MIXPREC_OK && c->n > 0) {
    check_packed(c, x, codes0, scales0, cb);
    check_norm_relu(f, c, codes0, scales0);
    /* Unpack to x's dtype and (below the threading limit, to keep inputs
     * fast) to another one, valid pointers. */
    call u = *c;
    u.codes_null = u.scales_null = u.out_null = 0;
    for (int pass = 0; pass < (c->n <= 70000 ? 2 : 1); pass++) {
      const mixprec_dtype od =
          pass == 0 ? c->dtype : (mixprec_dtype)((c->dtype + 1 + (fz_u8(f) & 1)) % 3);
      void *y = NULL;
      const mixprec_status st =
          unpack_all(&u, codes0, scales0, od, (size_t)c->n * fz_dsize(od), 0, &y);
      if (st == MIXPREC_OK) check_round_trip(c, x, scales0, y, od);
      free(y);
    }
  }
  free(codes0);
  free(codes);
  free(scales0);
  free(scales);
  free(codes_p);
  free(scales_p);
  free(x_in);
  free(xbuf);
}

/* The code of max-pool index v at (ho, wo) by search over the window (an
 * independent statement of [note: pool codes]): the position inside the
 * plane's columns whose h * W + w is v; 255 if none (or v >= 2^52). */
static int pool_ref_code(int64_t v, int64_t ho, int64_t wo, const int64_t *g) {
  if (v >= ((int64_t)1 << 52)) return 255;
  for (int64_t kh = 0; kh < g[1]; kh++)
    for (int64_t kw = 0; kw < g[2]; kw++) {
      const int64_t h = ho * g[3] - g[5] + kh * g[7], w = wo * g[4] - g[6] + kw * g[8];
      if (h >= 0 && w >= 0 && w < g[0] && h * g[0] + w == v) return (int)(kh * g[2] + kw);
    }
  return 255;
}

/* mixprec_act_pool_encode / _decode on fuzzed geometry, layout and indices
 * (most drawn inside their windows, some anywhere, negative or huge), on
 * every configuration: each code is the search's, *inexact counts the 255s,
 * decode gives every valid index back; faults (sizes, geometry, NULLs)
 * write nothing. */
static void run_pool(fz *f, int faults) {
  int64_t g[9];
  g[0] = 1 + fz_u8(f) % 200;                                 /* W */
  g[1] = 1 + fz_u8(f) % 7, g[2] = 1 + fz_u8(f) % 7;          /* kH, kW */
  g[3] = 1 + fz_u8(f) % 4, g[4] = 1 + fz_u8(f) % 4;          /* sH, sW */
  g[5] = fz_u8(f) % 4, g[6] = fz_u8(f) % 4;                  /* pH, pW */
  g[7] = 1 + fz_u8(f) % 3, g[8] = 1 + fz_u8(f) % 3;          /* dH, dW */
  const int64_t HO = 1 + fz_u8(f) % 40, WO = 1 + fz_u8(f) % 40, C = 1 + fz_u8(f) % 9;
  const int64_t planes = 1 + fz_u8(f) % 6;
  const int cl = fz_u8(f) & 1; /* channels-last: (planes, HO, WO, C) */
  const int64_t n = planes * C * HO * WO;
  const int64_t s_wo = cl ? C : 1, s_ho = cl ? WO * C : WO;
  int64_t *idx = (int64_t *)fz_alloc(8 * (size_t)n);
  for (int64_t i = 0; i < n; i++) {
    const int64_t ho = (i / s_ho) % HO, wo = (i / s_wo) % WO;
    const uint8_t m = fz_u8(f);
    const int64_t kh = (int64_t)(fz_rng(f) % (uint64_t)g[1]), kw = (int64_t)(fz_rng(f) % (uint64_t)g[2]);
    const int64_t in = (ho * g[3] - g[5] + kh * g[7]) * g[0] + wo * g[4] - g[6] + kw * g[8];
    idx[i] = m < 200 ? in : m < 230 ? (int64_t)(fz_rng(f) % 4000) - 50
                          : m < 245 ? -(int64_t)(fz_rng(f) >> 1) : ((int64_t)1 << 52) + m;
  }
  int64_t *idx_in = (int64_t *)fz_dup(idx, 8 * (size_t)n);
  uint8_t *c0 = (uint8_t *)fz_alloc((size_t)n), *c = (uint8_t *)fz_alloc((size_t)n);
  int64_t ie0 = -1, ie = -1;
  FZ_CONFIGS(cfg, n_cfg);
  FZ_FOR_EACH_CONFIG(cfg, n_cfg, k) {
    uint8_t *o = k == 0 ? c0 : c;
    int64_t *io = k == 0 ? &ie0 : &ie;
    const mixprec_status st = mixprec_act_pool_encode(idx, n, HO, WO, s_ho, s_wo, g, o, io);
    fz_check_status("mixprec_act_pool_encode", st, 0);
    if (k > 0) {
      fz_same("pool codes", o, c0, (size_t)n, cfg[k], cfg[0]);
      FZ_CHECK(ie == ie0, "pool inexact %lld vs %lld", (long long)ie, (long long)ie0);
    }
  }
  FZ_CHECK(!memcmp(idx, idx_in, 8 * (size_t)n), "pool encode wrote its input");
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) {
    const int want = pool_ref_code(idx[i], (i / s_ho) % HO, (i / s_wo) % WO, g);
    FZ_CHECK(c0[i] == want, "pool code %lld (index %lld, geom W %lld k %lldx%lld s %lld,%lld p %lld,%lld d %lld,%lld): %d, want %d",
             (long long)i, (long long)idx[i], (long long)g[0], (long long)g[1], (long long)g[2],
             (long long)g[3], (long long)g[4], (long long)g[5], (long long)g[6], (long long)g[7],
             (long long)g[8], c0[i], want);
    bad += want == 255;
  }
  FZ_CHECK(ie0 == bad, "pool inexact %lld, want %lld", (long long)ie0, (long long)bad);
  int64_t *back = (int64_t *)fz_alloc(8 * (size_t)n);
  FZ_CHECK(mixprec_act_pool_decode(c0, n, HO, WO, s_ho, s_wo, g, back) == MIXPREC_OK, "pool decode");
  for (int64_t i = 0; i < n; i++)
    if (c0[i] != 255)
      FZ_CHECK(back[i] == idx[i], "pool decode %lld: %lld, want %lld", (long long)i,
               (long long)back[i], (long long)idx[i]);
  if (faults) { /* one bad argument: nothing written */
    int64_t gb[9];
    memcpy(gb, g, sizeof gb);
    const uint8_t which = fz_u8(f) % 12;
    int64_t n2 = n, HO2 = HO, s2 = s_wo;
    int64_t *iep = &ie;
    mixprec_status want = MIXPREC_ERR_BAD_ARGUMENT;
    if (which < 9) gb[which] = which == 5 || which == 6 ? -1 : 0;
    else if (which == 9) { n2 = -1; want = MIXPREC_ERR_BAD_SIZE; }
    else if (which == 10) { HO2 = 0; s2 = 0; }
    else { iep = NULL; want = MIXPREC_ERR_NULL_POINTER; }
    memset(c, 0x5b, (size_t)n);
    ie = 77;
    uint8_t *poison = (uint8_t *)fz_dup(c, (size_t)n);
    FZ_CHECK(mixprec_act_pool_encode(idx, n2, HO2, WO, s_ho, s2, gb, c, iep) == want,
             "pool encode fault %d", which);
    fz_unchanged("pool codes", poison, c, (size_t)n, want);
    FZ_CHECK(ie == 77, "pool encode fault %d wrote inexact", which);
    free(poison);
  }
  free(idx);
  free(idx_in);
  free(c0);
  free(c);
  free(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  FZ_OPEN(f, c, op);
  const int faults = fz_faults(op, 0xe0);
  decode_call(&f, &c, faults);
  if (getenv("FZ_VERBOSE"))
    fprintf(stderr,
            "act_pack: %s n %lld dtype %d bits %lld block %lld seed 0x%llx nulls %d%d%d%d\n",
            op & 1 ? "unpack" : "pack", (long long)c.n, (int)c.dtype, (long long)c.bits,
            (long long)c.block, (unsigned long long)c.seed, c.x_null, c.codes_null,
            c.scales_null, c.out_null);
  if ((op & 6) == 6)
    run_pool(&f, faults);
  else if (op & 1)
    run_unpack(&f, &c, faults);
  else
    run_pack(&f, &c);
  return 0;
}
