/* AVX-512 (F/BW/VL/DQ + F16C) path of the unscale chunk kernel. Called only
 * when the CPU has them. Bit-identical to the scalar path: same IEEE multiply,
 * same round-to-nearest-even, same norm lane order (acc[0] = lanes 0-7,
 * acc[1] = lanes 8-15; 16 consecutive elements fill lanes 0-15 in order).
 * The AVX512-BF16 conversion instruction is deliberately not used: it flushes
 * subnormals to zero, and results must equal torch's bit for bit. */
#include <immintrin.h>

#include "internal.h"

static inline void acc_sq16(__m512d acc[2], __m512 y) {
  __m512d a0 = _mm512_cvtps_pd(_mm512_castps512_ps256(y));
  __m512d a1 = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(y), 1)));
  acc[0] = _mm512_fmadd_pd(a0, a0, acc[0]);
  acc[1] = _mm512_fmadd_pd(a1, a1, acc[1]);
}

static inline __m256i f32_to_bf16_16(__m512 x) {
  __m512i u = _mm512_castps_si512(x);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
  __m512i qnan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  __mmask16 isnan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  r = _mm512_mask_blend_epi32(isnan, r, qnan);
  return _mm512_cvtepi32_epi16(r);
}

static inline __m512 bf16_to_f32_16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static void chunk_f32(float *p, int64_t n, float inv_scale, int *nonfinite,
                      double *lanes) {
  const __m512 s = _mm512_set1_ps(inv_scale);
  const __m512i exp = _mm512_set1_epi32(0x7f800000);
  __mmask16 bad = 0;
  __m512d acc[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 x = _mm512_loadu_ps(p + i);
    bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(x), exp), exp);
    __m512 y = _mm512_mul_ps(x, s);
    _mm512_storeu_ps(p + i, y);
    if (lanes) acc_sq16(acc, y);
  }
  if (bad) *nonfinite = 1;
  if (lanes) {
    _mm512_storeu_pd(lanes, acc[0]);
    _mm512_storeu_pd(lanes + 8, acc[1]);
  }
  mixprec__unscale_tail(p, MIXPREC_F32, i, n, inv_scale, nonfinite, lanes);
}

static void chunk_f16(uint16_t *p, int64_t n, float inv_scale, int *nonfinite,
                      double *lanes) {
  const __m512 s = _mm512_set1_ps(inv_scale);
  const __m512i exp = _mm512_set1_epi16(0x7c00);
  __mmask32 bad = 0;
  __m512d acc[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512i h = _mm512_loadu_si512((const void *)(p + i));
    bad |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(h, exp), exp);
    __m512 y0 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), s);
    __m512 y1 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), s);
    __m256i r0 = _mm512_cvtps_ph(y0, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256i r1 = _mm512_cvtps_ph(y1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm512_storeu_si512((void *)(p + i), _mm512_inserti64x4(_mm512_castsi256_si512(r0), r1, 1));
    if (lanes) {
      acc_sq16(acc, _mm512_cvtph_ps(r0));
      acc_sq16(acc, _mm512_cvtph_ps(r1));
    }
  }
  if (bad) *nonfinite = 1;
  if (lanes) {
    _mm512_storeu_pd(lanes, acc[0]);
    _mm512_storeu_pd(lanes + 8, acc[1]);
  }
  mixprec__unscale_tail(p, MIXPREC_F16, i, n, inv_scale, nonfinite, lanes);
}

static void chunk_bf16(uint16_t *p, int64_t n, float inv_scale, int *nonfinite,
                       double *lanes) {
  const __m512 s = _mm512_set1_ps(inv_scale);
  const __m512i exp = _mm512_set1_epi16(0x7f80);
  __mmask32 bad = 0;
  __m512d acc[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512i h = _mm512_loadu_si512((const void *)(p + i));
    bad |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(h, exp), exp);
    __m512 y0 = _mm512_mul_ps(bf16_to_f32_16(_mm512_castsi512_si256(h)), s);
    __m512 y1 = _mm512_mul_ps(bf16_to_f32_16(_mm512_extracti64x4_epi64(h, 1)), s);
    __m256i r0 = f32_to_bf16_16(y0), r1 = f32_to_bf16_16(y1);
    _mm512_storeu_si512((void *)(p + i), _mm512_inserti64x4(_mm512_castsi256_si512(r0), r1, 1));
    if (lanes) {
      acc_sq16(acc, bf16_to_f32_16(r0));
      acc_sq16(acc, bf16_to_f32_16(r1));
    }
  }
  if (bad) *nonfinite = 1;
  if (lanes) {
    _mm512_storeu_pd(lanes, acc[0]);
    _mm512_storeu_pd(lanes + 8, acc[1]);
  }
  mixprec__unscale_tail(p, MIXPREC_BF16, i, n, inv_scale, nonfinite, lanes);
}

void mixprec__unscale_chunk_avx512(void *data, mixprec_dtype dtype, int64_t n,
                                   float inv_scale, int *nonfinite,
                                   double *norm) {
  double lanes[MIXPREC__NORM_LANES];
  double *l = norm ? lanes : NULL;
  switch (dtype) {
    case MIXPREC_F16:
      chunk_f16((uint16_t *)data, n, inv_scale, nonfinite, l);
      break;
    case MIXPREC_BF16:
      chunk_bf16((uint16_t *)data, n, inv_scale, nonfinite, l);
      break;
    default:
      chunk_f32((float *)data, n, inv_scale, nonfinite, l);
      break;
  }
  if (norm) *norm = mixprec__sum_lanes(lanes);
}
