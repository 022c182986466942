/* The AVX2 + FMA + F16C pieces shared by softmax_avx2.c and
 * cross_entropy_avx2.c: loads/stores of 8 lanes in each dtype, exp, the row
 * max and sum of exponentials, the strided column groups. Static inline: only
 * files compiled with -mavx2 -mfma -mf16c (the *_avx2.c ones) include it. */
#ifndef MIXPREC_SOFTMAX_AVX2_INTERNAL_H
#define MIXPREC_SOFTMAX_AVX2_INTERNAL_H

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

/* The group of 8 per-column floats starting at column j of a slice whose
 * last group may be short (k < 8 left: the other lanes 0). */
MIXPREC__FORCE_INLINE __m256 load_group(const float *p, int64_t j, int64_t k) {
  return k >= 8 ? _mm256_loadu_ps(p + j) : load_part(p, MIXPREC_F32, j, k, 0.0f);
}

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

#endif /* MIXPREC_SOFTMAX_AVX2_INTERNAL_H */
