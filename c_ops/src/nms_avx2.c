/* AVX2 path of the NMS sweep (see nms.c): one kept box against 8 candidates
 * per step. Compiled with -mavx2 -mfma -mf16c, called only when the CPU has
 * them. Bit-identical to the scalar sweep: the same IEEE operations in the
 * same order (vdivps is correctly rounded, nothing is fused), and the
 * operand order of vmaxps/vminps reproduces std::max/std::min even for NaN:
 * _mm256_max_ps(a, b) is (a > b ? a : b), so std::max(k, c) = (k < c ? c : k)
 * is _mm256_max_ps(c, k), and std::min(k, c) = (c < k ? c : k) is
 * _mm256_min_ps(c, k). */
#include <immintrin.h>

#include "nms_internal.h"

int64_t mixprec__nms_sweep_avx2(const float *x1, const float *y1, const float *x2,
                                const float *y2, const float *area, int32_t *dead,
                                int64_t begin, int64_t end, const float b[5], float thr) {
  const __m256 bx1 = _mm256_set1_ps(b[0]), by1 = _mm256_set1_ps(b[1]);
  const __m256 bx2 = _mm256_set1_ps(b[2]), by2 = _mm256_set1_ps(b[3]);
  const __m256 barea = _mm256_set1_ps(b[4]), vthr = _mm256_set1_ps(thr);
  const __m256 zero = _mm256_setzero_ps();
  int64_t killed = 0;
  int64_t j = begin;
  for (; j + 8 <= end; j += 8) {
    const __m256 d = _mm256_loadu_ps((const float *)(dead + j));
    const int dm = _mm256_movemask_ps(d);
    if (dm == 0xff) continue; /* all 8 already suppressed */
    const __m256 xx1 = _mm256_max_ps(_mm256_loadu_ps(x1 + j), bx1);
    const __m256 yy1 = _mm256_max_ps(_mm256_loadu_ps(y1 + j), by1);
    const __m256 xx2 = _mm256_min_ps(_mm256_loadu_ps(x2 + j), bx2);
    const __m256 yy2 = _mm256_min_ps(_mm256_loadu_ps(y2 + j), by2);
    const __m256 w = _mm256_max_ps(_mm256_sub_ps(xx2, xx1), zero);
    const __m256 h = _mm256_max_ps(_mm256_sub_ps(yy2, yy1), zero);
    const __m256 inter = _mm256_mul_ps(w, h);
    /* inter == 0 gives IoU +-0 or NaN, never > thr (thr >= 0): in sparse
     * scenes most candidates skip the division. */
    if (_mm256_movemask_ps(_mm256_cmp_ps(inter, zero, _CMP_EQ_OQ)) == 0xff) continue;
    const __m256 uni = _mm256_sub_ps(_mm256_add_ps(barea, _mm256_loadu_ps(area + j)), inter);
    const __m256 ovr = _mm256_div_ps(inter, uni);
    const __m256 hit = _mm256_cmp_ps(ovr, vthr, _CMP_GT_OQ);
    const int hm = _mm256_movemask_ps(hit) & ~dm;
    if (hm) {
      _mm256_storeu_ps((float *)(dead + j), _mm256_or_ps(d, hit));
      killed += __builtin_popcount((unsigned)hm);
    }
  }
  return killed + mixprec__nms_sweep_scalar(x1, y1, x2, y2, area, dead, j, end, b, thr);
}
