/* AVX2 + FMA + F16C slice kernels of softmax, log_softmax and
 * cross-entropy (see softmax.c for what a slice is). Compiled with
 * -mavx2 -mfma -mf16c, called only when the CPU has them.
 *
 * Rows (stride 1): vectorised along the row, four vectors (32 lanes) of
 * partial maxima/sums, reduced in one fixed order. Strided slices: the 32
 * columns of a slice are four vectors, each accumulated over the n values of
 * its columns, so every load is a whole 64-byte line of FP16/BF16 values.
 * Tails (a row's last n % 8 values, a slice's last width % 8 columns) go
 * through the same vector code via a padded buffer, so every element of a
 * path is computed the same way. */
#include <immintrin.h>
#include <math.h>

#include "softmax_internal.h"

/* ---- loads, stores, exp -------------------------------------------------- */

MIXPREC__FORCE_INLINE __m256 load8(const void *p, mixprec_dtype d, int64_t i) {
  switch (d) {
    case MIXPREC_F16:
      return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    case MIXPREC_BF16: {
      __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
      return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    }
    default:
      return _mm256_loadu_ps((const float *)p + i);
  }
}

/* The first k (< 8) elements at p + i, the other lanes `fill`. */
MIXPREC__FORCE_INLINE __m256 load_part(const void *p, mixprec_dtype d, int64_t i, int64_t k, float fill) {
  float t[8];
  for (int l = 0; l < 8; l++) t[l] = fill;
  for (int64_t l = 0; l < k; l++) {
    t[l] = mixprec__load_f32(p, d, i + l);
  }
  return _mm256_loadu_ps(t);
}

/* Round to nearest even to BF16 (NaN quieted), in the low halves of 32-bit
 * lanes, then packed to 8 uint16. */
MIXPREC__FORCE_INLINE __m128i to_bf16(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  const __m256i isnan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, qnan, isnan);
  r = _mm256_and_si256(r, _mm256_set1_epi32(0xffff));
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  return _mm256_castsi256_si128(packed);
}

MIXPREC__FORCE_INLINE void store8(void *p, mixprec_dtype d, int64_t i, __m256 v) {
  switch (d) {
    case MIXPREC_F16:
      _mm_storeu_si128((__m128i *)((uint16_t *)p + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
      break;
    case MIXPREC_BF16:
      _mm_storeu_si128((__m128i *)((uint16_t *)p + i), to_bf16(v));
      break;
    default:
      _mm256_storeu_ps((float *)p + i, v);
      break;
  }
}

MIXPREC__FORCE_INLINE void store_part(void *p, mixprec_dtype d, int64_t i, int64_t k, __m256 v) {
  uint16_t h[8];
  float f[8];
  switch (d) {
    case MIXPREC_F16:
      _mm_storeu_si128((__m128i *)h, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
      for (int64_t l = 0; l < k; l++) ((uint16_t *)p)[i + l] = h[l];
      break;
    case MIXPREC_BF16:
      _mm_storeu_si128((__m128i *)h, to_bf16(v));
      for (int64_t l = 0; l < k; l++) ((uint16_t *)p)[i + l] = h[l];
      break;
    default:
      _mm256_storeu_ps(f, v);
      for (int64_t l = 0; l < k; l++) ((float *)p)[i + l] = f[l];
      break;
  }
}

/* exp(x), Cephes' expf polynomial with FMA: within 2 ulp of exp for
 * x in [-87.3, 88.7]; 0 below about -87.6 (exp(-inf) = 0 exactly, so -inf
 * masks), inf above 88.72, NaN stays NaN. */
MIXPREC__FORCE_INLINE __m256 exp8(__m256 x) {
  const __m256 nan_mask = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  const __m256 big = _mm256_cmp_ps(x, _mm256_set1_ps(88.72283935546875f), _CMP_GT_OQ);
  __m256 v = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f)),
                           _mm256_set1_ps(88.3762626647949f));
  __m256 fx = _mm256_fmadd_ps(v, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  v = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), v);
  v = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), v);
  const __m256 v2 = _mm256_mul_ps(v, v);
  __m256 p = _mm256_set1_ps(1.9875691500E-4f);
  p = _mm256_fmadd_ps(p, v, _mm256_set1_ps(1.3981999507E-3f));
  p = _mm256_fmadd_ps(p, v, _mm256_set1_ps(8.3334519073E-3f));
  p = _mm256_fmadd_ps(p, v, _mm256_set1_ps(4.1665795894E-2f));
  p = _mm256_fmadd_ps(p, v, _mm256_set1_ps(1.6666665459E-1f));
  p = _mm256_fmadd_ps(p, v, _mm256_set1_ps(5.0000001201E-1f));
  p = _mm256_fmadd_ps(p, v2, v);
  p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
  /* 2^fx with fx in [-127, 128]: exponent field 0 (fx = -127) gives 0. */
  __m256i e = _mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127));
  e = _mm256_max_epi32(e, _mm256_setzero_si256());
  e = _mm256_min_epi32(e, _mm256_set1_epi32(254));
  p = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(e, 23)));
  p = _mm256_blendv_ps(p, _mm256_set1_ps(INFINITY), big);
  return _mm256_blendv_ps(p, x, nan_mask);
}

/* Lane sums and maxima in one fixed order. */
MIXPREC__FORCE_INLINE float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

MIXPREC__FORCE_INLINE float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/* A NaN input never wins the max (max_ps returns its second operand when
 * one is NaN); it reaches the result through the sum instead. */
MIXPREC__FORCE_INLINE __m256 vmax(__m256 acc, __m256 v) { return _mm256_max_ps(v, acc); }

/* ---- rows ---------------------------------------------------------------- */

MIXPREC__FORCE_INLINE float row_max(const void *x, mixprec_dtype xd, int64_t n) {
  __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    m0 = vmax(m0, load8(x, xd, i));
    m1 = vmax(m1, load8(x, xd, i + 8));
    m2 = vmax(m2, load8(x, xd, i + 16));
    m3 = vmax(m3, load8(x, xd, i + 24));
  }
  for (; i + 8 <= n; i += 8) m0 = vmax(m0, load8(x, xd, i));
  if (i < n) m1 = vmax(m1, load_part(x, xd, i, n - i, -INFINITY));
  return hmax(_mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
}

/* sum(exp(x - m)); stores each exp into e when e is not NULL. */
MIXPREC__FORCE_INLINE float row_sumexp(const void *x, mixprec_dtype xd, int64_t n, float m, float *e) {
  const __m256 vm = _mm256_set1_ps(m);
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256 e0 = exp8(_mm256_sub_ps(load8(x, xd, i), vm));
    __m256 e1 = exp8(_mm256_sub_ps(load8(x, xd, i + 8), vm));
    __m256 e2 = exp8(_mm256_sub_ps(load8(x, xd, i + 16), vm));
    __m256 e3 = exp8(_mm256_sub_ps(load8(x, xd, i + 24), vm));
    if (e) {
      _mm256_storeu_ps(e + i, e0);
      _mm256_storeu_ps(e + i + 8, e1);
      _mm256_storeu_ps(e + i + 16, e2);
      _mm256_storeu_ps(e + i + 24, e3);
    }
    s0 = _mm256_add_ps(s0, e0);
    s1 = _mm256_add_ps(s1, e1);
    s2 = _mm256_add_ps(s2, e2);
    s3 = _mm256_add_ps(s3, e3);
  }
  for (; i + 8 <= n; i += 8) {
    __m256 e0 = exp8(_mm256_sub_ps(load8(x, xd, i), vm));
    if (e) _mm256_storeu_ps(e + i, e0);
    s0 = _mm256_add_ps(s0, e0);
  }
  if (i < n) {
    __m256 e0 = exp8(_mm256_sub_ps(load_part(x, xd, i, n - i, -INFINITY), vm));
    if (e) store_part(e, MIXPREC_F32, i, n - i, e0);
    s1 = _mm256_add_ps(s1, e0);
  }
  return hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

MIXPREC__FORCE_INLINE void row_fwd(const void *x, const mixprec_dtype xd, void *y, mixprec_dtype yd,
                   int64_t n, int log, float *scratch) {
  const float m = row_max(x, xd, n);
  const float s = row_sumexp(x, xd, n, m, log ? NULL : scratch);
  int64_t i = 0;
  if (log) {
    const __m256 vm = _mm256_set1_ps(m), vl = _mm256_set1_ps(logf(s));
    for (; i + 8 <= n; i += 8)
      store8(y, yd, i, _mm256_sub_ps(_mm256_sub_ps(load8(x, xd, i), vm), vl));
    if (i < n)
      store_part(y, yd, i, n - i,
                 _mm256_sub_ps(_mm256_sub_ps(load_part(x, xd, i, n - i, 0.0f), vm), vl));
  } else {
    const __m256 inv = _mm256_set1_ps(1.0f / s);
    for (; i + 8 <= n; i += 8) store8(y, yd, i, _mm256_mul_ps(_mm256_loadu_ps(scratch + i), inv));
    if (i < n)
      store_part(y, yd, i, n - i, _mm256_mul_ps(load_part(scratch, MIXPREC_F32, i, n - i, 0.0f), inv));
  }
}

/* ---- strided slices ------------------------------------------------------ */

/* Group g (8 columns, or the last k < 8) of row c of a slice. */
MIXPREC__FORCE_INLINE __m256 col_load(const void *x, mixprec_dtype d, int64_t c, int64_t stride, int g,
                      int64_t width, float fill) {
  const int64_t j = 8 * (int64_t)g, i = c * stride + j;
  return width - j >= 8 ? load8(x, d, i) : load_part(x, d, i, width - j, fill);
}

MIXPREC__FORCE_INLINE void col_store(void *y, mixprec_dtype d, int64_t c, int64_t stride, int g, int64_t width,
                     __m256 v) {
  const int64_t j = 8 * (int64_t)g, i = c * stride + j;
  if (width - j >= 8)
    store8(y, d, i, v);
  else
    store_part(y, d, i, width - j, v);
}

MIXPREC__FORCE_INLINE void cols_stats(const void *x, mixprec_dtype xd, int64_t n, int64_t stride, int64_t width,
                      int groups, const float *weight, __m256 m[4], __m256 s[4], __m256 *wx) {
  for (int g = 0; g < groups; g++) m[g] = _mm256_set1_ps(-INFINITY);
  for (int64_t c = 0; c < n; c++)
    for (int g = 0; g < groups; g++)
      m[g] = vmax(m[g], col_load(x, xd, c, stride, g, width, -INFINITY));
  for (int g = 0; g < groups; g++) {
    s[g] = _mm256_setzero_ps();
    if (wx) wx[g] = _mm256_setzero_ps();
  }
  for (int64_t c = 0; c < n; c++) {
    const __m256 w = _mm256_set1_ps(weight ? weight[c] : 1.0f);
    for (int g = 0; g < groups; g++) {
      const __m256 d = _mm256_sub_ps(col_load(x, xd, c, stride, g, width, 0.0f), m[g]);
      s[g] = _mm256_add_ps(s[g], exp8(d));
      if (wx) wx[g] = _mm256_fmadd_ps(w, d, wx[g]);
    }
  }
}

MIXPREC__FORCE_INLINE __m256 log8(__m256 v) {
  float t[8];
  _mm256_storeu_ps(t, v);
  for (int l = 0; l < 8; l++) t[l] = logf(t[l]);
  return _mm256_loadu_ps(t);
}

MIXPREC__FORCE_INLINE void cols_fwd(const void *x, const mixprec_dtype xd, void *y, mixprec_dtype yd, int64_t n,
                    int64_t stride, int64_t width, int log) {
  const int groups = (int)((width + 7) / 8);
  __m256 m[4], s[4], f[4];
  cols_stats(x, xd, n, stride, width, groups, NULL, m, s, NULL);
  for (int g = 0; g < groups; g++)
    f[g] = log ? log8(s[g]) : _mm256_div_ps(_mm256_set1_ps(1.0f), s[g]);
  for (int64_t c = 0; c < n; c++)
    for (int g = 0; g < groups; g++) {
      const __m256 d = _mm256_sub_ps(col_load(x, xd, c, stride, g, width, 0.0f), m[g]);
      col_store(y, yd, c, stride, g, width,
                log ? _mm256_sub_ps(d, f[g]) : _mm256_mul_ps(exp8(d), f[g]));
    }
}

/* ---- backward ------------------------------------------------------------ */

MIXPREC__FORCE_INLINE void row_bwd(const void *dy, const void *y, const mixprec_dtype yd, void *dx,
                   mixprec_dtype dxd, int64_t n, int log) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  if (log) {
    for (; i + 32 <= n; i += 32) {
      s0 = _mm256_add_ps(s0, load8(dy, yd, i));
      s1 = _mm256_add_ps(s1, load8(dy, yd, i + 8));
      s2 = _mm256_add_ps(s2, load8(dy, yd, i + 16));
      s3 = _mm256_add_ps(s3, load8(dy, yd, i + 24));
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_add_ps(s0, load8(dy, yd, i));
    if (i < n) s1 = _mm256_add_ps(s1, load_part(dy, yd, i, n - i, 0.0f));
  } else {
    for (; i + 32 <= n; i += 32) {
      s0 = _mm256_fmadd_ps(load8(dy, yd, i), load8(y, yd, i), s0);
      s1 = _mm256_fmadd_ps(load8(dy, yd, i + 8), load8(y, yd, i + 8), s1);
      s2 = _mm256_fmadd_ps(load8(dy, yd, i + 16), load8(y, yd, i + 16), s2);
      s3 = _mm256_fmadd_ps(load8(dy, yd, i + 24), load8(y, yd, i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(load8(dy, yd, i), load8(y, yd, i), s0);
    if (i < n)
      s1 = _mm256_fmadd_ps(load_part(dy, yd, i, n - i, 0.0f), load_part(y, yd, i, n - i, 0.0f), s1);
  }
  const __m256 s = _mm256_set1_ps(hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3))));
  for (i = 0; i < n; i += 8) {
    const int64_t k = n - i;
    const __m256 g = k >= 8 ? load8(dy, yd, i) : load_part(dy, yd, i, k, 0.0f);
    const __m256 o = k >= 8 ? load8(y, yd, i) : load_part(y, yd, i, k, 0.0f);
    const __m256 r = log ? _mm256_fnmadd_ps(exp8(o), s, g) : _mm256_mul_ps(o, _mm256_sub_ps(g, s));
    if (k >= 8)
      store8(dx, dxd, i, r);
    else
      store_part(dx, dxd, i, k, r);
  }
}

MIXPREC__FORCE_INLINE void cols_bwd(const void *dy, const void *y, const mixprec_dtype yd, void *dx,
                    mixprec_dtype dxd, int64_t n, int64_t stride, int64_t width, int log) {
  const int groups = (int)((width + 7) / 8);
  __m256 s[4];
  for (int g = 0; g < groups; g++) s[g] = _mm256_setzero_ps();
  for (int64_t c = 0; c < n; c++)
    for (int g = 0; g < groups; g++) {
      const __m256 gv = col_load(dy, yd, c, stride, g, width, 0.0f);
      s[g] = log ? _mm256_add_ps(s[g], gv)
                 : _mm256_fmadd_ps(gv, col_load(y, yd, c, stride, g, width, 0.0f), s[g]);
    }
  for (int64_t c = 0; c < n; c++)
    for (int g = 0; g < groups; g++) {
      const __m256 gv = col_load(dy, yd, c, stride, g, width, 0.0f);
      const __m256 o = col_load(y, yd, c, stride, g, width, 0.0f);
      col_store(dx, dxd, c, stride, g, width,
                log ? _mm256_fnmadd_ps(exp8(o), s[g], gv) : _mm256_mul_ps(o, _mm256_sub_ps(gv, s[g])));
    }
}

/* ---- cross-entropy pieces ------------------------------------------------ */

MIXPREC__FORCE_INLINE void row_ce_stats(const void *x, const mixprec_dtype xd, int64_t n, const float *weight,
                        float *mx, float *se, float *wx) {
  const float m = row_max(x, xd, n);
  *mx = m;
  if (!wx) {
    *se = row_sumexp(x, xd, n, m, NULL);
    return;
  }
  const __m256 vm = _mm256_set1_ps(m);
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, w0 = s0, w1 = s0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 d0 = _mm256_sub_ps(load8(x, xd, i), vm);
    const __m256 d1 = _mm256_sub_ps(load8(x, xd, i + 8), vm);
    s0 = _mm256_add_ps(s0, exp8(d0));
    s1 = _mm256_add_ps(s1, exp8(d1));
    if (weight) {
      w0 = _mm256_fmadd_ps(_mm256_loadu_ps(weight + i), d0, w0);
      w1 = _mm256_fmadd_ps(_mm256_loadu_ps(weight + i + 8), d1, w1);
    } else {
      w0 = _mm256_add_ps(w0, d0);
      w1 = _mm256_add_ps(w1, d1);
    }
  }
  for (; i < n; i += 8) {
    const int64_t k = n - i;
    /* Padding lanes: -inf for the sum (exp gives 0), m for the weighted sum
     * (difference 0, weight 0). */
    const __m256 d = _mm256_sub_ps(k >= 8 ? load8(x, xd, i) : load_part(x, xd, i, k, -INFINITY), vm);
    const __m256 dz = k >= 8 ? d : _mm256_sub_ps(load_part(x, xd, i, k, m), vm);
    const __m256 w = weight ? (k >= 8 ? _mm256_loadu_ps(weight + i) : load_part(weight, MIXPREC_F32, i, k, 0.0f))
                            : _mm256_set1_ps(1.0f);
    s0 = _mm256_add_ps(s0, exp8(d));
    w0 = _mm256_fmadd_ps(w, dz, w0);
  }
  *se = hsum(_mm256_add_ps(s0, s1));
  *wx = hsum(_mm256_add_ps(w0, w1));
}

MIXPREC__FORCE_INLINE void row_ce_grad(const void *x, const mixprec_dtype xd, void *dx, int64_t n, float mx,
                       float lg, float a, float b, const float *weight, int64_t t, float bt) {
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 vm = _mm256_set1_ps(mx), vl = _mm256_set1_ps(lg), va = _mm256_set1_ps(a),
               vb = _mm256_set1_ps(b);
  for (int64_t i = 0; i < n; i += 8) {
    const int64_t k = n - i;
    const __m256 v = k >= 8 ? load8(x, xd, i) : load_part(x, xd, i, k, 0.0f);
    const __m256 w = weight ? (k >= 8 ? _mm256_loadu_ps(weight + i) : load_part(weight, MIXPREC_F32, i, k, 0.0f))
                            : _mm256_set1_ps(1.0f);
    const __m256 e = exp8(_mm256_sub_ps(_mm256_sub_ps(v, vm), vl));
    __m256 r = _mm256_fnmadd_ps(vb, w, _mm256_mul_ps(va, e));
    if (t >= i && t < i + 8) {
      const __m256i hit = _mm256_cmpeq_epi32(iota, _mm256_set1_epi32((int)(t - i)));
      r = _mm256_sub_ps(r, _mm256_and_ps(_mm256_castsi256_ps(hit), _mm256_set1_ps(bt)));
    }
    if (k >= 8)
      store8(dx, xd, i, r);
    else
      store_part(dx, xd, i, k, r);
  }
}

MIXPREC__FORCE_INLINE void cols_ce_stats(const void *x, const mixprec_dtype xd, int64_t n, int64_t stride,
                         int64_t width, const float *weight, float *mx, float *se, float *wx) {
  const int groups = (int)((width + 7) / 8);
  __m256 m[4], s[4], w[4];
  cols_stats(x, xd, n, stride, width, groups, weight, m, s, wx ? w : NULL);
  for (int g = 0; g < groups; g++) {
    const int64_t j = 8 * (int64_t)g, k = width - j < 8 ? width - j : 8;
    float tm[8], ts[8], tw[8];
    _mm256_storeu_ps(tm, m[g]);
    _mm256_storeu_ps(ts, s[g]);
    if (wx) _mm256_storeu_ps(tw, w[g]);
    for (int64_t l = 0; l < k; l++) {
      mx[j + l] = tm[l];
      se[j + l] = ts[l];
      if (wx) wx[j + l] = tw[l];
    }
  }
}

MIXPREC__FORCE_INLINE void cols_ce_grad(const void *x, const mixprec_dtype xd, void *dx, int64_t n,
                        int64_t stride, int64_t width, const float *mx, const float *lg,
                        const float *a, const float *b, const float *weight, const int32_t *tc,
                        const float *bt) {
  const int groups = (int)((width + 7) / 8);
  __m256 vm[4], vl[4], va[4], vb[4], vbt[4];
  __m256i vt[4];
  for (int g = 0; g < groups; g++) {
    const int64_t j = 8 * (int64_t)g, k = width - j;
    vm[g] = k >= 8 ? _mm256_loadu_ps(mx + j) : load_part(mx, MIXPREC_F32, j, k, 0.0f);
    vl[g] = k >= 8 ? _mm256_loadu_ps(lg + j) : load_part(lg, MIXPREC_F32, j, k, 0.0f);
    va[g] = k >= 8 ? _mm256_loadu_ps(a + j) : load_part(a, MIXPREC_F32, j, k, 0.0f);
    vb[g] = k >= 8 ? _mm256_loadu_ps(b + j) : load_part(b, MIXPREC_F32, j, k, 0.0f);
    vbt[g] = k >= 8 ? _mm256_loadu_ps(bt + j) : load_part(bt, MIXPREC_F32, j, k, 0.0f);
    int32_t t8[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
    for (int64_t l = 0; l < (k < 8 ? k : 8); l++) t8[l] = tc[j + l];
    vt[g] = _mm256_loadu_si256((const __m256i *)t8);
  }
  for (int64_t c = 0; c < n; c++) {
    const __m256 w = _mm256_set1_ps(weight ? weight[c] : 1.0f);
    const __m256i vc = _mm256_set1_epi32((int32_t)c);
    for (int g = 0; g < groups; g++) {
      const __m256 v = col_load(x, xd, c, stride, g, width, 0.0f);
      __m256 r = _mm256_fnmadd_ps(vb[g], w,
                                  _mm256_mul_ps(va[g], exp8(_mm256_sub_ps(_mm256_sub_ps(v, vm[g]), vl[g]))));
      const __m256 hit = _mm256_castsi256_ps(_mm256_cmpeq_epi32(vt[g], vc));
      r = _mm256_sub_ps(r, _mm256_and_ps(hit, vbt[g]));
      col_store(dx, xd, c, stride, g, width, r);
    }
  }
}

/* ---- entry points: one dispatch on the input dtype each ------------------- */

void mixprec__softmax_fwd_avx2(const void *x, mixprec_dtype xd, void *y,
                               mixprec_dtype yd, int64_t n, int64_t stride,
                               int64_t width, int log, float *scratch) {
  const int row = stride == 1 && width == 1;
  MIXPREC__DISPATCH(xd, X,
                    if (row) row_fwd(x, X, y, yd, n, log, scratch);
                    else cols_fwd(x, X, y, yd, n, stride, width, log));
}

void mixprec__softmax_bwd_avx2(const void *dy, const void *y, mixprec_dtype yd,
                               void *dx, mixprec_dtype dxd, int64_t n,
                               int64_t stride, int64_t width, int log) {
  const int row = stride == 1 && width == 1;
  MIXPREC__DISPATCH(yd, Y,
                    if (row) row_bwd(dy, y, Y, dx, dxd, n, log);
                    else cols_bwd(dy, y, Y, dx, dxd, n, stride, width, log));
}

void mixprec__ce_stats_avx2(const void *x, mixprec_dtype xd, int64_t n,
                            int64_t stride, int64_t width, const float *weight,
                            float *mx, float *se, float *wx) {
  const int row = stride == 1 && width == 1;
  MIXPREC__DISPATCH(xd, X,
                    if (row) row_ce_stats(x, X, n, weight, mx, se, wx);
                    else cols_ce_stats(x, X, n, stride, width, weight, mx, se, wx));
}

void mixprec__ce_grad_avx2(const void *x, mixprec_dtype xd, void *dx,
                           int64_t n, int64_t stride, int64_t width,
                           const float *mx, const float *lg, const float *a,
                           const float *b, const float *weight, const int32_t *tc,
                           const float *bt) {
  const int row = stride == 1 && width == 1;
  MIXPREC__DISPATCH(xd, X,
                    if (row) row_ce_grad(x, X, dx, n, mx[0], lg[0], a[0], b[0], weight, tc[0], bt[0]);
                    else cols_ce_grad(x, X, dx, n, stride, width, mx, lg, a, b, weight, tc, bt));
}

/* ---- cross-entropy with class-probability targets --------------------------- */

/* Lanes [0, k) all ones, the others zero. */
MIXPREC__FORCE_INLINE __m256 lanes_below(int64_t k) {
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)k), iota));
}

MIXPREC__FORCE_INLINE void row_soft_stats(const void *x, const mixprec_dtype xd, const void *t,
                                          const mixprec_dtype td, int64_t n, const float *weight,
                                          float keep, float add, float *mx, float *se, float *tw,
                                          float *twx) {
  const float m = row_max(x, xd, n);
  *mx = m;
  const __m256 vm = _mm256_set1_ps(m), vk = _mm256_set1_ps(keep), va = _mm256_set1_ps(add);
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, a0 = s0, a1 = s0, b0 = s0, b1 = s0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 d0 = _mm256_sub_ps(load8(x, xd, i), vm);
    const __m256 d1 = _mm256_sub_ps(load8(x, xd, i + 8), vm);
    __m256 p0 = _mm256_fmadd_ps(load8(t, td, i), vk, va);
    __m256 p1 = _mm256_fmadd_ps(load8(t, td, i + 8), vk, va);
    if (weight) {
      p0 = _mm256_mul_ps(_mm256_loadu_ps(weight + i), p0);
      p1 = _mm256_mul_ps(_mm256_loadu_ps(weight + i + 8), p1);
    }
    s0 = _mm256_add_ps(s0, exp8(d0));
    s1 = _mm256_add_ps(s1, exp8(d1));
    a0 = _mm256_add_ps(a0, p0);
    a1 = _mm256_add_ps(a1, p1);
    b0 = _mm256_fmadd_ps(p0, d0, b0);
    b1 = _mm256_fmadd_ps(p1, d1, b1);
  }
  for (; i < n; i += 8) {
    const int64_t k = n - i;
    /* Padding lanes: -inf for the sum (exp gives 0); for the target sums a
     * zero weighted target times a zero difference. */
    const __m256 d = _mm256_sub_ps(k >= 8 ? load8(x, xd, i) : load_part(x, xd, i, k, -INFINITY), vm);
    const __m256 dz = k >= 8 ? d : _mm256_sub_ps(load_part(x, xd, i, k, m), vm);
    __m256 p = _mm256_fmadd_ps(k >= 8 ? load8(t, td, i) : load_part(t, td, i, k, 0.0f), vk, va);
    if (weight) p = _mm256_mul_ps(k >= 8 ? _mm256_loadu_ps(weight + i) : load_part(weight, MIXPREC_F32, i, k, 0.0f), p);
    if (k < 8) p = _mm256_and_ps(p, lanes_below(k));
    s0 = _mm256_add_ps(s0, exp8(d));
    a0 = _mm256_add_ps(a0, p);
    b0 = _mm256_fmadd_ps(p, k >= 8 ? d : _mm256_and_ps(dz, lanes_below(k)), b0);
  }
  *se = hsum(_mm256_add_ps(s0, s1));
  *tw = hsum(_mm256_add_ps(a0, a1));
  *twx = hsum(_mm256_add_ps(b0, b1));
}

MIXPREC__FORCE_INLINE void row_soft_grad(const void *x, const mixprec_dtype xd, const void *t,
                                         const mixprec_dtype td, void *dx, void *dt, int64_t n,
                                         float mx, float lg, float a, float g, float cdt,
                                         const float *weight, float keep, float add) {
  const __m256 vm = _mm256_set1_ps(mx), vl = _mm256_set1_ps(lg), va = _mm256_set1_ps(a),
               vg = _mm256_set1_ps(g), vc = _mm256_set1_ps(cdt), vk = _mm256_set1_ps(keep),
               vad = _mm256_set1_ps(add);
  for (int64_t i = 0; i < n; i += 8) {
    const int64_t k = n - i;
    const __m256 v = k >= 8 ? load8(x, xd, i) : load_part(x, xd, i, k, 0.0f);
    const __m256 w = weight ? (k >= 8 ? _mm256_loadu_ps(weight + i) : load_part(weight, MIXPREC_F32, i, k, 0.0f))
                            : _mm256_set1_ps(1.0f);
    const __m256 lp = _mm256_sub_ps(_mm256_sub_ps(v, vm), vl);
    if (dx) {
      const __m256 p = _mm256_fmadd_ps(k >= 8 ? load8(t, td, i) : load_part(t, td, i, k, 0.0f), vk, vad);
      const __m256 r = _mm256_fnmadd_ps(vg, _mm256_mul_ps(w, p), _mm256_mul_ps(va, exp8(lp)));
      if (k >= 8)
        store8(dx, xd, i, r);
      else
        store_part(dx, xd, i, k, r);
    }
    if (dt) {
      const __m256 r = _mm256_mul_ps(_mm256_mul_ps(vc, w), lp);
      if (k >= 8)
        store8(dt, td, i, r);
      else
        store_part(dt, td, i, k, r);
    }
  }
}

MIXPREC__FORCE_INLINE void cols_soft_stats(const void *x, const mixprec_dtype xd, const void *t,
                                           const mixprec_dtype td, int64_t n, int64_t stride,
                                           int64_t width, const float *weight, float keep, float add,
                                           float *mx, float *se, float *tw, float *twx) {
  const int groups = (int)((width + 7) / 8);
  const __m256 vk = _mm256_set1_ps(keep), va = _mm256_set1_ps(add);
  __m256 m[4], s[4], a[4], b[4];
  for (int g = 0; g < groups; g++) m[g] = _mm256_set1_ps(-INFINITY);
  for (int64_t c = 0; c < n; c++)
    for (int g = 0; g < groups; g++) m[g] = vmax(m[g], col_load(x, xd, c, stride, g, width, -INFINITY));
  for (int g = 0; g < groups; g++) s[g] = a[g] = b[g] = _mm256_setzero_ps();
  for (int64_t c = 0; c < n; c++) {
    const __m256 w = _mm256_set1_ps(weight ? weight[c] : 1.0f);
    for (int g = 0; g < groups; g++) {
      const __m256 d = _mm256_sub_ps(col_load(x, xd, c, stride, g, width, 0.0f), m[g]);
      const __m256 p = _mm256_mul_ps(w, _mm256_fmadd_ps(col_load(t, td, c, stride, g, width, 0.0f), vk, va));
      s[g] = _mm256_add_ps(s[g], exp8(d));
      a[g] = _mm256_add_ps(a[g], p);
      b[g] = _mm256_fmadd_ps(p, d, b[g]);
    }
  }
  for (int g = 0; g < groups; g++) {
    const int64_t j = 8 * (int64_t)g, k = width - j < 8 ? width - j : 8;
    float tm[8], ts[8], ta[8], tb[8];
    _mm256_storeu_ps(tm, m[g]);
    _mm256_storeu_ps(ts, s[g]);
    _mm256_storeu_ps(ta, a[g]);
    _mm256_storeu_ps(tb, b[g]);
    for (int64_t l = 0; l < k; l++) {
      mx[j + l] = tm[l];
      se[j + l] = ts[l];
      tw[j + l] = ta[l];
      twx[j + l] = tb[l];
    }
  }
}

MIXPREC__FORCE_INLINE void cols_soft_grad(const void *x, const mixprec_dtype xd, const void *t,
                                          const mixprec_dtype td, void *dx, void *dt, int64_t n,
                                          int64_t stride, int64_t width, const float *mx,
                                          const float *lg, const float *a, const float *g,
                                          const float *cdt, const float *weight, float keep,
                                          float add) {
  const int groups = (int)((width + 7) / 8);
  const __m256 vk = _mm256_set1_ps(keep), vad = _mm256_set1_ps(add);
  __m256 vm[4], vl[4], va[4], vg[4], vc[4];
  for (int q = 0; q < groups; q++) {
    const int64_t j = 8 * (int64_t)q, k = width - j;
    vm[q] = k >= 8 ? _mm256_loadu_ps(mx + j) : load_part(mx, MIXPREC_F32, j, k, 0.0f);
    vl[q] = k >= 8 ? _mm256_loadu_ps(lg + j) : load_part(lg, MIXPREC_F32, j, k, 0.0f);
    va[q] = k >= 8 ? _mm256_loadu_ps(a + j) : load_part(a, MIXPREC_F32, j, k, 0.0f);
    vg[q] = k >= 8 ? _mm256_loadu_ps(g + j) : load_part(g, MIXPREC_F32, j, k, 0.0f);
    vc[q] = k >= 8 ? _mm256_loadu_ps(cdt + j) : load_part(cdt, MIXPREC_F32, j, k, 0.0f);
  }
  for (int64_t c = 0; c < n; c++) {
    const __m256 w = _mm256_set1_ps(weight ? weight[c] : 1.0f);
    for (int q = 0; q < groups; q++) {
      const __m256 lp = _mm256_sub_ps(_mm256_sub_ps(col_load(x, xd, c, stride, q, width, 0.0f), vm[q]), vl[q]);
      if (dx) {
        const __m256 p = _mm256_fmadd_ps(col_load(t, td, c, stride, q, width, 0.0f), vk, vad);
        col_store(dx, xd, c, stride, q, width,
                  _mm256_fnmadd_ps(vg[q], _mm256_mul_ps(w, p), _mm256_mul_ps(va[q], exp8(lp))));
      }
      if (dt) col_store(dt, td, c, stride, q, width, _mm256_mul_ps(_mm256_mul_ps(vc[q], w), lp));
    }
  }
}

/* One body per (logit dtype, target dtype) pair, each with both as
 * constants. */
MIXPREC__FORCE_INLINE void soft_stats(const void *x, const mixprec_dtype xd, const void *t,
                                      const mixprec_dtype td, int64_t n, int64_t stride, int64_t width,
                                      const float *weight, float keep, float add, float *mx, float *se,
                                      float *tw, float *twx) {
  if (stride == 1 && width == 1)
    row_soft_stats(x, xd, t, td, n, weight, keep, add, mx, se, tw, twx);
  else
    cols_soft_stats(x, xd, t, td, n, stride, width, weight, keep, add, mx, se, tw, twx);
}

MIXPREC__FORCE_INLINE void soft_grad(const void *x, const mixprec_dtype xd, const void *t,
                                     const mixprec_dtype td, void *dx, void *dt, int64_t n, int64_t stride,
                                     int64_t width, const float *mx, const float *lg, const float *a,
                                     const float *g, const float *cdt, const float *weight, float keep,
                                     float add) {
  if (stride == 1 && width == 1)
    row_soft_grad(x, xd, t, td, dx, dt, n, mx[0], lg[0], a[0], g[0], cdt[0], weight, keep, add);
  else
    cols_soft_grad(x, xd, t, td, dx, dt, n, stride, width, mx, lg, a, g, cdt, weight, keep, add);
}

void mixprec__ce_soft_stats_avx2(const void *x, mixprec_dtype xd, const void *t, mixprec_dtype td,
                                 int64_t n, int64_t stride, int64_t width, const float *weight,
                                 float keep, float add, float *mx, float *se, float *tw, float *twx) {
  MIXPREC__DISPATCH(xd, X,
                    MIXPREC__DISPATCH(td, T,
                                      soft_stats(x, X, t, T, n, stride, width, weight, keep, add,
                                                 mx, se, tw, twx)));
}

void mixprec__ce_soft_grad_avx2(const void *x, mixprec_dtype xd, const void *t, mixprec_dtype td,
                                void *dx, void *dt, int64_t n, int64_t stride, int64_t width,
                                const float *mx, const float *lg, const float *a, const float *g,
                                const float *cdt, const float *weight, float keep, float add) {
  MIXPREC__DISPATCH(xd, X,
                    MIXPREC__DISPATCH(td, T,
                                      soft_grad(x, X, t, T, dx, dt, n, stride, width, mx, lg, a, g,
                                                cdt, weight, keep, add)));
}
