/* The overflow check's chunk scan with AVX2: the scalar scan's two maxima
 * (finite magnitudes, all magnitudes) on 16 halves or 8 floats per vector,
 * four vectors per iteration; the tail goes to the scalar scan. Masked
 * magnitudes are below 2^15 / 2^31, so signed compares and maxima order them
 * as unsigned ones would. Same result as the scalar path, bit for bit. */
#include <immintrin.h>

#include "internal.h"
#include "overflow_internal.h"

#define UNROLL 4

static uint32_t hmax16(__m256i v) {
  __m128i x = _mm_max_epi16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_max_epi16(x, _mm_srli_si128(x, 8));
  x = _mm_max_epi16(x, _mm_srli_si128(x, 4));
  x = _mm_max_epi16(x, _mm_srli_si128(x, 2));
  return (uint32_t)(uint16_t)_mm_cvtsi128_si32(x);
}

static uint32_t hmax32(__m256i v) {
  __m128i x = _mm_max_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_max_epi32(x, _mm_srli_si128(x, 8));
  x = _mm_max_epi32(x, _mm_srli_si128(x, 4));
  return (uint32_t)_mm_cvtsi128_si32(x);
}

void mixprec__overflow_scan_avx2(const void *data, mixprec_dtype dtype, int64_t n,
                                 uint32_t *max_bits, int *nonfinite) {
  const int f32 = dtype == MIXPREC_F32;
  const int64_t lanes = f32 ? 8 : 16;
  const int64_t step = lanes * UNROLL;
  const int64_t body = n - n % step;
  __m256i m[UNROLL], all[UNROLL];
  for (int k = 0; k < UNROLL; k++) m[k] = all[k] = _mm256_setzero_si256();
  const char *p = (const char *)data;
  if (f32) {
    const __m256i mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    for (int64_t i = 0; i < body; i += step)
      for (int k = 0; k < UNROLL; k++) {
        const __m256i a = _mm256_and_si256(
            _mm256_loadu_si256((const __m256i *)(p + 4 * (i + k * lanes))), mask);
        m[k] = _mm256_max_epi32(m[k], _mm256_and_si256(a, _mm256_cmpgt_epi32(inf, a)));
        all[k] = _mm256_max_epi32(all[k], a);
      }
    for (int k = 1; k < UNROLL; k++) {
      m[0] = _mm256_max_epi32(m[0], m[k]);
      all[0] = _mm256_max_epi32(all[0], all[k]);
    }
  } else {
    const __m256i mask = _mm256_set1_epi16(0x7fff);
    const __m256i inf = _mm256_set1_epi16((short)mixprec__overflow_inf_bits(dtype));
    for (int64_t i = 0; i < body; i += step)
      for (int k = 0; k < UNROLL; k++) {
        const __m256i a = _mm256_and_si256(
            _mm256_loadu_si256((const __m256i *)(p + 2 * (i + k * lanes))), mask);
        m[k] = _mm256_max_epi16(m[k], _mm256_and_si256(a, _mm256_cmpgt_epi16(inf, a)));
        all[k] = _mm256_max_epi16(all[k], a);
      }
    for (int k = 1; k < UNROLL; k++) {
      m[0] = _mm256_max_epi16(m[0], m[k]);
      all[0] = _mm256_max_epi16(all[0], all[k]);
    }
  }
  const uint32_t vm = f32 ? hmax32(m[0]) : hmax16(m[0]);
  const uint32_t va = f32 ? hmax32(all[0]) : hmax16(all[0]);
  if (vm > *max_bits) *max_bits = vm;
  if (va >= mixprec__overflow_inf_bits(dtype)) *nonfinite = 1;
  mixprec__overflow_scan_scalar(p + (f32 ? 4 : 2) * body, dtype, n - body, max_bits, nonfinite);
}
