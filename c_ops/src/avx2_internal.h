/* Loads and stores of 8 float lanes in each dtype, for the files built with
 * -mavx2 -mfma -mf16c (the *_avx2.c ones). MIXPREC__FORCE_INLINE, so inside a
 * MIXPREC__DISPATCH body, where the dtype is a constant, the switch folds
 * away. Bit-identical to mixprec__load_f32 / mixprec__store_f32. */
#ifndef MIXPREC_AVX2_INTERNAL_H
#define MIXPREC_AVX2_INTERNAL_H

#include <immintrin.h>

#include "internal.h"

MIXPREC__FORCE_INLINE __m256 mixprec__avx2_load8(const void *p, mixprec_dtype d, int64_t i) {
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
MIXPREC__FORCE_INLINE __m256 mixprec__avx2_load_part(const void *p, mixprec_dtype d, int64_t i, int64_t k, float fill) {
  float t[8];
  for (int l = 0; l < 8; l++) t[l] = fill;
  for (int64_t l = 0; l < k; l++) {
    t[l] = mixprec__load_f32(p, d, i + l);
  }
  return _mm256_loadu_ps(t);
}

/* Elements [i, i + 8) at p when k >= 8, else the first k of them with the
 * other lanes `fill` (a row's last, partial vector). */
MIXPREC__FORCE_INLINE __m256 mixprec__avx2_load_upto(const void *p, mixprec_dtype d, int64_t i, int64_t k,
                                                     float fill) {
  return k >= 8 ? mixprec__avx2_load8(p, d, i) : mixprec__avx2_load_part(p, d, i, k, fill);
}

/* Round to nearest even to BF16 (NaN quieted), in the low halves of 32-bit
 * lanes, then packed to 8 uint16. */
MIXPREC__FORCE_INLINE __m128i mixprec__avx2_to_bf16(__m256 v) {
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

MIXPREC__FORCE_INLINE void mixprec__avx2_store8(void *p, mixprec_dtype d, int64_t i, __m256 v) {
  switch (d) {
    case MIXPREC_F16:
      _mm_storeu_si128((__m128i *)((uint16_t *)p + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
      break;
    case MIXPREC_BF16:
      _mm_storeu_si128((__m128i *)((uint16_t *)p + i), mixprec__avx2_to_bf16(v));
      break;
    default:
      _mm256_storeu_ps((float *)p + i, v);
      break;
  }
}

MIXPREC__FORCE_INLINE void mixprec__avx2_store_part(void *p, mixprec_dtype d, int64_t i, int64_t k, __m256 v) {
  uint16_t h[8];
  float f[8];
  switch (d) {
    case MIXPREC_F16:
      _mm_storeu_si128((__m128i *)h, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
      for (int64_t l = 0; l < k; l++) ((uint16_t *)p)[i + l] = h[l];
      break;
    case MIXPREC_BF16:
      _mm_storeu_si128((__m128i *)h, mixprec__avx2_to_bf16(v));
      for (int64_t l = 0; l < k; l++) ((uint16_t *)p)[i + l] = h[l];
      break;
    default:
      _mm256_storeu_ps(f, v);
      for (int64_t l = 0; l < k; l++) ((float *)p)[i + l] = f[l];
      break;
  }
}

#endif /* MIXPREC_AVX2_INTERNAL_H */
