/* AVX-512 (F/BW/VL/DQ + F16C) path of the unscale chunk kernel. Called only
 * when the CPU has them. Bit-identical to the scalar path: same IEEE multiply,
 * same round-to-nearest-even, same norm order (internal.h): one 16-float
 * vector holds the 16 lanes' block sums in lane order. The AVX512-BF16
 * conversion instruction is deliberately not used: it flushes subnormals to
 * zero, and results must equal torch's bit for bit. */
#include <immintrin.h>

#include "internal.h"

typedef struct {
  __m512 f;       /* lanes 0-15, float block sums */
  __m512d d[2];   /* lanes 0-7, 8-15 */
} norm_state;

MIXPREC__INLINE void norm_init(norm_state *s) {
  s->f = _mm512_setzero_ps();
  s->d[0] = s->d[1] = _mm512_setzero_pd();
}

/* 16 consecutive elements, lane order. Two roundings, like `f += v * v`. */
MIXPREC__INLINE void norm_add(norm_state *s, __m512 y) {
  s->f = _mm512_add_ps(s->f, _mm512_mul_ps(y, y));
}

MIXPREC__INLINE void norm_store(const norm_state *s, mixprec__norm_acc *acc) {
  _mm512_storeu_ps(acc->f, s->f);
  _mm512_storeu_pd(acc->d, s->d[0]);
  _mm512_storeu_pd(acc->d + 8, s->d[1]);
}

MIXPREC__INLINE void norm_flush(norm_state *s, mixprec__norm_acc *acc, const void *data,
                              mixprec_dtype dtype, int64_t begin) {
  /* x - x == 0 exactly when x is finite. */
  __mmask16 ok = _mm512_cmp_ps_mask(_mm512_sub_ps(s->f, s->f), _mm512_setzero_ps(), _CMP_EQ_OQ);
  if (ok != 0xffff) {
    norm_store(s, acc);
    mixprec__norm_flush(acc, data, dtype, begin, begin + MIXPREC__NORM_BLOCK);
    s->d[0] = _mm512_loadu_pd(acc->d);
    s->d[1] = _mm512_loadu_pd(acc->d + 8);
  } else {
    __m256 lo = _mm512_castps512_ps256(s->f);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s->f), 1));
    s->d[0] = _mm512_add_pd(s->d[0], _mm512_cvtps_pd(lo));
    s->d[1] = _mm512_add_pd(s->d[1], _mm512_cvtps_pd(hi));
  }
  s->f = _mm512_setzero_ps();
}

/* See unscale_avx2.c: no NaN test needed unless the scale is a NaN. */
MIXPREC__INLINE __m256i round_bf16(__m512 x) {
  __m512i u = _mm512_castps_si512(x);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  return _mm512_cvtepi32_epi16(r);
}

MIXPREC__INLINE __m512 bf16_to_f32_16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

MIXPREC__FORCE_INLINE void chunk_f32(float *p, int64_t n, float inv_scale,
                                                            int *nonfinite, mixprec__norm_acc *acc) {
  const __m512 s = _mm512_set1_ps(inv_scale);
  const __m512i exp = _mm512_set1_epi32(0x7f800000);
  __mmask16 bad = 0;
  norm_state ns;
  norm_init(&ns);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 x = _mm512_loadu_ps(p + i);
    bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(x), exp), exp);
    __m512 y = _mm512_mul_ps(x, s);
    _mm512_storeu_ps(p + i, y);
    if (acc) {
      norm_add(&ns, y);
      if ((i + 16) % MIXPREC__NORM_BLOCK == 0)
        norm_flush(&ns, acc, p, MIXPREC_F32, i + 16 - MIXPREC__NORM_BLOCK);
    }
  }
  if (bad) *nonfinite = 1;
  if (acc) norm_store(&ns, acc);
  mixprec__unscale_tail(p, MIXPREC_F32, i, n, inv_scale, nonfinite, acc);
}

/* FP16 and BF16 share one loop: 32 elements a step, widened and rounded
 * per D (a constant once dispatched). */
MIXPREC__FORCE_INLINE __m512 widen16(__m256i h, const mixprec_dtype D) {
  return D == MIXPREC_F16 ? _mm512_cvtph_ps(h) : bf16_to_f32_16(h);
}

MIXPREC__FORCE_INLINE __m256i narrow16(__m512 y, const mixprec_dtype D) {
  return D == MIXPREC_F16 ? _mm512_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC) : round_bf16(y);
}

MIXPREC__FORCE_INLINE void chunk_half(uint16_t *p, const mixprec_dtype D, int64_t n, float inv_scale,
                                      int *nonfinite, mixprec__norm_acc *acc) {
  const __m512 s = _mm512_set1_ps(inv_scale);
  const __m512i exp = _mm512_set1_epi16(D == MIXPREC_F16 ? 0x7c00 : 0x7f80);
  __mmask32 bad = 0;
  norm_state ns;
  norm_init(&ns);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512i h = _mm512_loadu_si512((const void *)(p + i));
    bad |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(h, exp), exp);
    __m512 y0 = _mm512_mul_ps(widen16(_mm512_castsi512_si256(h), D), s);
    __m512 y1 = _mm512_mul_ps(widen16(_mm512_extracti64x4_epi64(h, 1), D), s);
    __m256i r0 = narrow16(y0, D), r1 = narrow16(y1, D);
    _mm512_storeu_si512((void *)(p + i), _mm512_inserti64x4(_mm512_castsi256_si512(r0), r1, 1));
    if (acc) {
      norm_add(&ns, widen16(r0, D)); /* elements i..i+15: lanes 0-15 */
      norm_add(&ns, widen16(r1, D)); /* then i+16..i+31, same lanes */
      if ((i + 32) % MIXPREC__NORM_BLOCK == 0)
        norm_flush(&ns, acc, p, D, i + 32 - MIXPREC__NORM_BLOCK);
    }
  }
  if (bad) *nonfinite = 1;
  if (acc) norm_store(&ns, acc);
  mixprec__unscale_tail(p, D, i, n, inv_scale, nonfinite, acc);
}

MIXPREC__FORCE_INLINE void chunk(void *p, const mixprec_dtype D, int64_t n, float inv_scale,
                                 int *nonfinite, mixprec__norm_acc *acc) {
  if (D == MIXPREC_F32)
    chunk_f32((float *)p, n, inv_scale, nonfinite, acc);
  else
    chunk_half((uint16_t *)p, D, n, inv_scale, nonfinite, acc);
}

void mixprec__unscale_chunk_avx512(void *data, mixprec_dtype dtype, int64_t n,
                                   float inv_scale, int *nonfinite, double *norm) {
  mixprec__norm_acc acc;
  MIXPREC__DISPATCH(dtype, D,
                    if (norm) chunk(data, D, n, inv_scale, nonfinite, &acc);
                    else chunk(data, D, n, inv_scale, nonfinite, NULL));
  if (norm) *norm = mixprec__sum_lanes(&acc);
}
