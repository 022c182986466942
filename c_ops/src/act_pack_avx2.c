/* The AVX2 + F16C instantiation of act_pack_internal.h's bodies: the same
 * loops, vectorised by the compiler under -mavx2; FP16 through F16C, which
 * rounds as the portable converters do (nearest even, NaN quieted). */
#include <immintrin.h>

#include "act_pack_internal.h"

MIXPREC__FORCE_INLINE void widen16_f16c(const uint16_t *h, float *v, int64_t len) {
  int64_t i = 0;
  for (; i + 8 <= len; i += 8)
    _mm256_storeu_ps(v + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
  for (; i < len; i++) v[i] = mixprec__f16_to_f32(h[i]);
}
MIXPREC__FORCE_INLINE void narrow16_f16c(const float *v, uint16_t *h, int64_t len) {
  int64_t i = 0;
  for (; i + 8 <= len; i += 8)
    _mm_storeu_si128((__m128i *)(h + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(v + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < len; i++) h[i] = mixprec__f32_to_f16(v[i]);
}

MIXPREC__ACT_DEFINE(avx2, widen16_f16c, narrow16_f16c)
