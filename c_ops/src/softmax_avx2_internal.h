/* The AVX2 + FMA + F16C pieces shared by softmax_avx2.c and
 * cross_entropy_avx2.c: exp, the row max and sum of exponentials, the strided column groups. Static inline: only
 * files compiled with -mavx2 -mfma -mf16c (the *_avx2.c ones) include it. */
#ifndef MIXPREC_SOFTMAX_AVX2_INTERNAL_H
#define MIXPREC_SOFTMAX_AVX2_INTERNAL_H

#include <immintrin.h>
#include <math.h>

#include "avx2_internal.h"
#include "softmax_internal.h"

/* ---- exp ---------------------------------------------------------------- */

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
  return mixprec__avx2_load_upto(p, MIXPREC_F32, j, k, 0.0f);
}

/* load_group of every group of a slice `width` (<= 32) columns wide. */
MIXPREC__FORCE_INLINE void load_groups(const float *p, int64_t width, __m256 out[4]) {
  for (int64_t j = 0; j < width; j += 8) out[j / 8] = load_group(p, j, width - j);
}

/* ---- rows ---------------------------------------------------------------- */

MIXPREC__FORCE_INLINE float row_max(const void *x, mixprec_dtype xd, int64_t n) {
  __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    m0 = vmax(m0, mixprec__avx2_load8(x, xd, i));
    m1 = vmax(m1, mixprec__avx2_load8(x, xd, i + 8));
    m2 = vmax(m2, mixprec__avx2_load8(x, xd, i + 16));
    m3 = vmax(m3, mixprec__avx2_load8(x, xd, i + 24));
  }
  for (; i + 8 <= n; i += 8) m0 = vmax(m0, mixprec__avx2_load8(x, xd, i));
  if (i < n) m1 = vmax(m1, mixprec__avx2_load_part(x, xd, i, n - i, -INFINITY));
  return hmax(_mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
}

/* sum(exp(x - m)); stores each exp into e when e is not NULL. */
MIXPREC__FORCE_INLINE float row_sumexp(const void *x, mixprec_dtype xd, int64_t n, float m, float *e) {
  const __m256 vm = _mm256_set1_ps(m);
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256 e0 = exp8(_mm256_sub_ps(mixprec__avx2_load8(x, xd, i), vm));
    __m256 e1 = exp8(_mm256_sub_ps(mixprec__avx2_load8(x, xd, i + 8), vm));
    __m256 e2 = exp8(_mm256_sub_ps(mixprec__avx2_load8(x, xd, i + 16), vm));
    __m256 e3 = exp8(_mm256_sub_ps(mixprec__avx2_load8(x, xd, i + 24), vm));
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
    __m256 e0 = exp8(_mm256_sub_ps(mixprec__avx2_load8(x, xd, i), vm));
    if (e) _mm256_storeu_ps(e + i, e0);
    s0 = _mm256_add_ps(s0, e0);
  }
  if (i < n) {
    __m256 e0 = exp8(_mm256_sub_ps(mixprec__avx2_load_part(x, xd, i, n - i, -INFINITY), vm));
    if (e) mixprec__avx2_store_part(e, MIXPREC_F32, i, n - i, e0);
    s1 = _mm256_add_ps(s1, e0);
  }
  return hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

/* ---- strided slices ------------------------------------------------------ */

/* Group g (8 columns, or the last k < 8) of row c of a slice. */
MIXPREC__FORCE_INLINE __m256 col_load(const void *x, mixprec_dtype d, int64_t c, int64_t stride, int g,
                      int64_t width, float fill) {
  const int64_t j = 8 * (int64_t)g, i = c * stride + j;
  return width - j >= 8 ? mixprec__avx2_load8(x, d, i) : mixprec__avx2_load_part(x, d, i, width - j, fill);
}

MIXPREC__FORCE_INLINE void col_store(void *y, mixprec_dtype d, int64_t c, int64_t stride, int g, int64_t width,
                     __m256 v) {
  const int64_t j = 8 * (int64_t)g, i = c * stride + j;
  if (width - j >= 8)
    mixprec__avx2_store8(y, d, i, v);
  else
    mixprec__avx2_store_part(y, d, i, width - j, v);
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
