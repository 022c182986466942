/* AVX2 + FMA + F16C path of the unscale chunk kernel. Compiled with
 * -mavx2 -mfma -mf16c, called only when the CPU has them. Bit-identical to
 * the scalar path: same IEEE multiply, same round-to-nearest-even, same norm
 * order (internal.h). */
#include <immintrin.h>

#include "internal.h"

#define BLOCK_ITERS (MIXPREC__NORM_BLOCK / 16)

/* Per-chunk norm state: two float vectors holding the 16 lanes' block sums,
 * four double vectors holding lanes 0-3, 4-7, 8-11, 12-15. `lo` holds the
 * lanes `lanes_lo`, `hi` the rest, in the order the loader produced them
 * (natural for F32/F16; interleaved by 128-bit halves for BF16, see below). */
typedef struct {
  __m256 lo, hi;
  __m256d d[4];
} norm_state;

MIXPREC__INLINE void norm_init(norm_state *s) {
  s->lo = s->hi = _mm256_setzero_ps();
  for (int k = 0; k < 4; k++) s->d[k] = _mm256_setzero_pd();
}

/* Square and add (two roundings, like the scalar `f += v * v`). */
MIXPREC__INLINE void norm_add(norm_state *s, __m256 a, __m256 b) {
  s->lo = _mm256_add_ps(s->lo, _mm256_mul_ps(a, a));
  s->hi = _mm256_add_ps(s->hi, _mm256_mul_ps(b, b));
}

/* Writes the float lanes to acc->f in lane order and the doubles to acc->d.
 * `interleaved`: lo = lanes 0-3 | 8-11, hi = lanes 4-7 | 12-15. */
MIXPREC__INLINE void norm_store(const norm_state *s, mixprec__norm_acc *acc, int interleaved) {
  if (interleaved) {
    _mm_storeu_ps(acc->f + 0, _mm256_castps256_ps128(s->lo));
    _mm_storeu_ps(acc->f + 8, _mm256_extractf128_ps(s->lo, 1));
    _mm_storeu_ps(acc->f + 4, _mm256_castps256_ps128(s->hi));
    _mm_storeu_ps(acc->f + 12, _mm256_extractf128_ps(s->hi, 1));
  } else {
    _mm256_storeu_ps(acc->f, s->lo);
    _mm256_storeu_ps(acc->f + 8, s->hi);
  }
  for (int k = 0; k < 4; k++) _mm256_storeu_pd(acc->d + 4 * k, s->d[k]);
}

MIXPREC__INLINE void norm_load_d(norm_state *s, const mixprec__norm_acc *acc) {
  for (int k = 0; k < 4; k++) s->d[k] = _mm256_loadu_pd(acc->d + 4 * k);
}

/* End of a 128-element block [begin, begin + 128): float sums into doubles,
 * or, if one is not finite (rare), the scalar flush that redoes it. */
MIXPREC__INLINE void norm_flush(norm_state *s, mixprec__norm_acc *acc, const void *data,
                              mixprec_dtype dtype, int64_t begin, int interleaved,
                              int write, float inv_scale) {
  const __m256 zero = _mm256_setzero_ps();
  /* x - x == 0 exactly when x is finite. */
  __m256 ok = _mm256_and_ps(_mm256_cmp_ps(_mm256_sub_ps(s->lo, s->lo), zero, _CMP_EQ_OQ),
                            _mm256_cmp_ps(_mm256_sub_ps(s->hi, s->hi), zero, _CMP_EQ_OQ));
  if (_mm256_movemask_ps(ok) != 0xff) {
    norm_store(s, acc, interleaved);
    if (write)
      mixprec__norm_flush(acc, data, dtype, begin, begin + MIXPREC__NORM_BLOCK);
    else
      mixprec__norm_flush_scaled(acc, data, dtype, begin, begin + MIXPREC__NORM_BLOCK, inv_scale);
    norm_load_d(s, acc);
  } else {
    __m256d l0 = _mm256_cvtps_pd(_mm256_castps256_ps128(s->lo));
    __m256d l1 = _mm256_cvtps_pd(_mm256_extractf128_ps(s->lo, 1));
    __m256d h0 = _mm256_cvtps_pd(_mm256_castps256_ps128(s->hi));
    __m256d h1 = _mm256_cvtps_pd(_mm256_extractf128_ps(s->hi, 1));
    s->d[0] = _mm256_add_pd(s->d[0], l0);
    s->d[interleaved ? 2 : 1] = _mm256_add_pd(s->d[interleaved ? 2 : 1], l1);
    s->d[interleaved ? 1 : 2] = _mm256_add_pd(s->d[interleaved ? 1 : 2], h0);
    s->d[3] = _mm256_add_pd(s->d[3], h1);
  }
  s->lo = s->hi = zero;
}

MIXPREC__INLINE __m256i nonfinite_f32(__m256 x) {
  const __m256i exp = _mm256_set1_epi32(0x7f800000);
  return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(x), exp), exp);
}

/* Round-to-nearest-even of float bits to BF16, kept in the low 16 bits of
 * each 32-bit lane. No NaN test is needed: a NaN product here is either a
 * widened BF16 NaN (low 16 bits zero) or the default NaN, and neither can
 * carry into the exponent; only a NaN scale could, and unscale.c sends that
 * to the scalar path. */
MIXPREC__INLINE __m256i round_bf16(__m256 x) {
  __m256i u = _mm256_castps_si256(x);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
}

/* Scalar continuation after the last full vector: unscale (write) or only
 * read. */
MIXPREC__INLINE void tail(void *p, mixprec_dtype dtype, int64_t i, int64_t n, float inv_scale,
                        int *nonfinite, mixprec__norm_acc *acc, int write) {
  if (write)
    mixprec__unscale_tail(p, dtype, i, n, inv_scale, nonfinite, acc);
  else
    mixprec__norm_tail(p, dtype, i, n, inv_scale, nonfinite, acc);
}

/* One step of 16 elements at p + i in dtype D (a constant once
 * dispatched): multiplies by s, stores the results when `write`, returns the
 * non-finite lanes of the inputs and sets *n0, *n1 to the rounded results as
 * floats for the norm. BF16 widens by interleaving with zeros inside each
 * 128-bit half: n0 = elements 0-3 | 8-11, n1 = elements 4-7 | 12-15;
 * packus_epi32 then restores the memory order with no cross-lane permute,
 * and the norm keeps the lane mapping in mind (norm_state `interleaved`). */
MIXPREC__FORCE_INLINE __m256i step16(void *p, const mixprec_dtype D, int64_t i, __m256 s, const int write,
                                     __m256 *n0, __m256 *n1) {
  if (D == MIXPREC_F32) {
    float *f = (float *)p + i;
    __m256 x0 = _mm256_loadu_ps(f), x1 = _mm256_loadu_ps(f + 8);
    __m256 y0 = _mm256_mul_ps(x0, s), y1 = _mm256_mul_ps(x1, s);
    if (write) {
      _mm256_storeu_ps(f, y0);
      _mm256_storeu_ps(f + 8, y1);
    }
    *n0 = y0;
    *n1 = y1;
    return _mm256_or_si256(nonfinite_f32(x0), nonfinite_f32(x1));
  }
  uint16_t *q = (uint16_t *)p + i;
  const __m256i exp = _mm256_set1_epi16(D == MIXPREC_F16 ? 0x7c00 : 0x7f80);
  __m256i h = _mm256_loadu_si256((const __m256i *)q);
  if (D == MIXPREC_F16) {
    __m256 y0 = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), s);
    __m256 y1 = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), s);
    __m128i r0 = _mm256_cvtps_ph(y0, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m128i r1 = _mm256_cvtps_ph(y1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    if (write) _mm256_storeu_si256((__m256i *)q, _mm256_set_m128i(r1, r0));
    *n0 = _mm256_cvtph_ps(r0);
    *n1 = _mm256_cvtph_ps(r1);
  } else {
    const __m256i zero = _mm256_setzero_si256();
    __m256 ylo = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, h)), s);
    __m256 yhi = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, h)), s);
    __m256i rlo = round_bf16(ylo), rhi = round_bf16(yhi);
    /* Values are < 2^16, so the signed-to-unsigned saturation never bites. */
    if (write) _mm256_storeu_si256((__m256i *)q, _mm256_packus_epi32(rlo, rhi));
    *n0 = _mm256_castsi256_ps(_mm256_slli_epi32(rlo, 16));
    *n1 = _mm256_castsi256_ps(_mm256_slli_epi32(rhi, 16));
  }
  return _mm256_cmpeq_epi16(_mm256_and_si256(h, exp), exp);
}

/* The loop, stamped per dtype, with and without the norm, and with and
 * without the stores (write = 0: mixprec_grad_norm, acc never NULL), so the
 * hot loop carries no test of `acc` or `write`. */
MIXPREC__FORCE_INLINE void chunk(void *p, const mixprec_dtype D, int64_t n, float inv_scale, int *nonfinite,
                                 mixprec__norm_acc *acc, const int write) {
  const int interleaved = D == MIXPREC_BF16;
  const __m256 s = _mm256_set1_ps(inv_scale);
  __m256i bad = _mm256_setzero_si256();
  norm_state ns;
  norm_init(&ns);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 n0, n1;
    bad = _mm256_or_si256(bad, step16(p, D, i, s, write, &n0, &n1));
    if (acc) {
      norm_add(&ns, n0, n1);
      if ((i + 16) % MIXPREC__NORM_BLOCK == 0)
        norm_flush(&ns, acc, p, D, i + 16 - MIXPREC__NORM_BLOCK, interleaved, write, inv_scale);
    }
  }
  if (!_mm256_testz_si256(bad, bad)) *nonfinite = 1;
  if (acc) norm_store(&ns, acc, interleaved);
  tail(p, D, i, n, inv_scale, nonfinite, acc, write);
}

void mixprec__unscale_chunk_avx2(void *data, mixprec_dtype dtype, int64_t n,
                                 float inv_scale, int *nonfinite, double *norm) {
  mixprec__norm_acc acc;
  MIXPREC__DISPATCH(dtype, D,
                    if (norm) chunk(data, D, n, inv_scale, nonfinite, &acc, 1);
                    else chunk(data, D, n, inv_scale, nonfinite, NULL, 1));
  if (norm) *norm = mixprec__sum_lanes(&acc);
}

/* mixprec_grad_norm's chunk kernel: the loop above without its stores
 * (data is only read; the cast drops const for the shared body). */
void mixprec__norm_chunk_avx2(const void *data, mixprec_dtype dtype, int64_t n,
                              float inv_scale, int *nonfinite, double *norm) {
  mixprec__norm_acc acc;
  MIXPREC__DISPATCH(dtype, D, chunk((void *)data, D, n, inv_scale, nonfinite, &acc, 0));
  *norm = mixprec__sum_lanes(&acc);
}
