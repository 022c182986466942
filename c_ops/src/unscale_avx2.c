/* AVX2 + FMA + F16C path of the unscale chunk kernel. Compiled with
 * -mavx2 -mfma -mf16c, called only when the CPU has them. Bit-identical to
 * the scalar path: same IEEE multiply, same round-to-nearest-even, same norm
 * lane order (16 double lanes: acc[k] holds lanes 4k..4k+3). */
#include <immintrin.h>

#include "internal.h"

/* Adds the squares of 16 floats (lo: elements 0-7, hi: 8-15) into the
 * 16 double lanes. */
static inline void acc_sq16(__m256d acc[4], __m256 lo, __m256 hi) {
  __m256d a0 = _mm256_cvtps_pd(_mm256_castps256_ps128(lo));
  __m256d a1 = _mm256_cvtps_pd(_mm256_extractf128_ps(lo, 1));
  __m256d a2 = _mm256_cvtps_pd(_mm256_castps256_ps128(hi));
  __m256d a3 = _mm256_cvtps_pd(_mm256_extractf128_ps(hi, 1));
  /* The square of a float is exact in double, so fma == mul + add here. */
  acc[0] = _mm256_fmadd_pd(a0, a0, acc[0]);
  acc[1] = _mm256_fmadd_pd(a1, a1, acc[1]);
  acc[2] = _mm256_fmadd_pd(a2, a2, acc[2]);
  acc[3] = _mm256_fmadd_pd(a3, a3, acc[3]);
}

static inline __m256i nonfinite_f32(__m256 x) {
  const __m256i exp = _mm256_set1_epi32(0x7f800000);
  return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(x), exp), exp);
}

/* 8 floats -> 8 bf16 (round to nearest even, NaN quieted) in a __m128i. */
static inline __m128i f32_to_bf16_8(__m256 x) {
  __m256i u = _mm256_castps_si256(x);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
  r = _mm256_srli_epi32(r, 16);
  __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  __m256 isnan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  r = _mm256_blendv_epi8(r, qnan, _mm256_castps_si256(isnan));
  __m256i packed = _mm256_packus_epi32(r, r); /* values < 2^16: no saturation */
  packed = _mm256_permute4x64_epi64(packed, 0x08);
  return _mm256_castsi256_si128(packed);
}

static inline __m256 bf16_to_f32_8(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static void chunk_f32(float *p, int64_t n, float inv_scale, int *nonfinite,
                      double *lanes) {
  const __m256 s = _mm256_set1_ps(inv_scale);
  __m256i bad = _mm256_setzero_si256();
  __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 x0 = _mm256_loadu_ps(p + i), x1 = _mm256_loadu_ps(p + i + 8);
    bad = _mm256_or_si256(bad, _mm256_or_si256(nonfinite_f32(x0), nonfinite_f32(x1)));
    __m256 y0 = _mm256_mul_ps(x0, s), y1 = _mm256_mul_ps(x1, s);
    _mm256_storeu_ps(p + i, y0);
    _mm256_storeu_ps(p + i + 8, y1);
    if (lanes) acc_sq16(acc, y0, y1);
  }
  if (!_mm256_testz_si256(bad, bad)) *nonfinite = 1;
  if (lanes) for (int k = 0; k < 4; k++) _mm256_storeu_pd(lanes + 4 * k, acc[k]);
  mixprec__unscale_tail(p, MIXPREC_F32, i, n, inv_scale, nonfinite, lanes);
}

static void chunk_f16(uint16_t *p, int64_t n, float inv_scale, int *nonfinite,
                      double *lanes) {
  const __m256 s = _mm256_set1_ps(inv_scale);
  const __m256i exp = _mm256_set1_epi16(0x7c00);
  __m256i bad = _mm256_setzero_si256();
  __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i h = _mm256_loadu_si256((const __m256i *)(p + i));
    bad = _mm256_or_si256(bad, _mm256_cmpeq_epi16(_mm256_and_si256(h, exp), exp));
    __m256 y0 = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), s);
    __m256 y1 = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), s);
    __m128i r0 = _mm256_cvtps_ph(y0, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m128i r1 = _mm256_cvtps_ph(y1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256((__m256i *)(p + i), _mm256_set_m128i(r1, r0));
    if (lanes) acc_sq16(acc, _mm256_cvtph_ps(r0), _mm256_cvtph_ps(r1));
  }
  if (!_mm256_testz_si256(bad, bad)) *nonfinite = 1;
  if (lanes) for (int k = 0; k < 4; k++) _mm256_storeu_pd(lanes + 4 * k, acc[k]);
  mixprec__unscale_tail(p, MIXPREC_F16, i, n, inv_scale, nonfinite, lanes);
}

static void chunk_bf16(uint16_t *p, int64_t n, float inv_scale, int *nonfinite,
                       double *lanes) {
  const __m256 s = _mm256_set1_ps(inv_scale);
  const __m256i exp = _mm256_set1_epi16(0x7f80);
  __m256i bad = _mm256_setzero_si256();
  __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i h = _mm256_loadu_si256((const __m256i *)(p + i));
    bad = _mm256_or_si256(bad, _mm256_cmpeq_epi16(_mm256_and_si256(h, exp), exp));
    __m256 y0 = _mm256_mul_ps(bf16_to_f32_8(_mm256_castsi256_si128(h)), s);
    __m256 y1 = _mm256_mul_ps(bf16_to_f32_8(_mm256_extracti128_si256(h, 1)), s);
    __m128i r0 = f32_to_bf16_8(y0), r1 = f32_to_bf16_8(y1);
    _mm256_storeu_si256((__m256i *)(p + i), _mm256_set_m128i(r1, r0));
    if (lanes) acc_sq16(acc, bf16_to_f32_8(r0), bf16_to_f32_8(r1));
  }
  if (!_mm256_testz_si256(bad, bad)) *nonfinite = 1;
  if (lanes) for (int k = 0; k < 4; k++) _mm256_storeu_pd(lanes + 4 * k, acc[k]);
  mixprec__unscale_tail(p, MIXPREC_BF16, i, n, inv_scale, nonfinite, lanes);
}

void mixprec__unscale_chunk_avx2(void *data, mixprec_dtype dtype, int64_t n,
                                 float inv_scale, int *nonfinite, double *norm) {
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
