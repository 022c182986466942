/* AVX2 path of the scoring pass of mixprec_efficient_nms (efficient_nms.c): 8
 * scores per step widened to float (F16C for float16, a shift for
 * bfloat16), compared with the threshold in one vector compare (ordered, so
 * a NaN never passes), and only the lanes that pass are turned into keys;
 * in a detector's output most groups of 8 have none. Compiled with -mavx2
 * -mfma -mf16c, called only when the CPU has them. The same candidates, keys
 * and order as the scalar loop. */
#include <immintrin.h>

#include "avx2_internal.h"
#include "nms_internal.h"

int64_t mixprec__efficient_nms_score_avx2(const void *scores, mixprec_dtype dt, int64_t nc, int use_thr,
                                   float thr, uint32_t *keys, int32_t *idx);

MIXPREC__FORCE_INLINE int64_t score_loop(const void *scores, mixprec_dtype dt, int64_t nc,
                                         int use_thr, float thr, uint32_t *keys, int32_t *idx) {
  /* s > thr is false for NaN; without a threshold, s == s keeps the rest. */
  const __m256 vthr = _mm256_set1_ps(thr);
  int64_t m = 0, j = 0;
  for (; j + 8 <= nc; j += 8) {
    const __m256 s = mixprec__avx2_load8(scores, dt, j);
    const __m256 ok = use_thr ? _mm256_cmp_ps(s, vthr, _CMP_GT_OQ) : _mm256_cmp_ps(s, s, _CMP_EQ_OQ);
    unsigned bits = (unsigned)_mm256_movemask_ps(ok);
    if (!bits) continue;
    float v[8];
    _mm256_storeu_ps(v, s);
    while (bits) {
      const int l = __builtin_ctz(bits);
      bits &= bits - 1;
      keys[m] = ~mixprec__nms_score_key(v[l]);
      idx[m] = (int32_t)(j + l);
      m++;
    }
  }
  for (; j < nc; j++) {
    const float s = mixprec__load_f32(scores, dt, j);
    if (s != s || (use_thr && !(s > thr))) continue;
    keys[m] = ~mixprec__nms_score_key(s);
    idx[m] = (int32_t)j;
    m++;
  }
  return m;
}

int64_t mixprec__efficient_nms_score_avx2(const void *scores, mixprec_dtype dt, int64_t nc, int use_thr,
                                   float thr, uint32_t *keys, int32_t *idx) {
  MIXPREC__DISPATCH(dt, D, return score_loop(scores, D, nc, use_thr, thr, keys, idx));
  return 0;
}
