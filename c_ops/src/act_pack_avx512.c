/* The AVX-512 instantiation of act_pack_internal.h's bodies: the same loops,
 * vectorised by the compiler at 16 lanes; FP16 through the 16-lane F16C
 * conversions (same rounding as the portable converters).
 * The AVX2 path is hand-written instead (act_pack_avx2_body.h). It has not
 * been timed against this body (no AVX-512 machine at hand), so this one
 * stays: by instruction count (objdump, GCC 12) this body's 8-bit encode
 * loop, 16 lanes wide, takes about 2.3 instructions per element against the
 * AVX2 body's 3.3 (its whole 8-bit pack ~4.3), while the AVX2 body's 4-bit
 * pack (per-block work batched over 8 blocks) and unpack are leaner than
 * these loops. Time both on an AVX-512 CPU before switching; compiling
 * act_pack_avx2_body.h here (MIXPREC__ACT_DEFINE_SIMD256(avx512)) would do
 * it, with the test suite comparing it against the reference. */
#include <immintrin.h>

#include "act_pack_internal.h"

MIXPREC__FORCE_INLINE void widen16_avx512(const uint16_t *h, float *v, int64_t len) {
  int64_t i = 0;
  for (; i + 16 <= len; i += 16)
    _mm512_storeu_ps(v + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + i))));
  for (; i < len; i++) v[i] = mixprec__f16_to_f32(h[i]);
}
MIXPREC__FORCE_INLINE void narrow16_avx512(const float *v, uint16_t *h, int64_t len) {
  int64_t i = 0;
  for (; i + 16 <= len; i += 16)
    _mm256_storeu_si256((__m256i *)(h + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(v + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < len; i++) h[i] = mixprec__f32_to_f16(v[i]);
}

MIXPREC__ACT_DEFINE(avx512, widen16_avx512, narrow16_avx512)
