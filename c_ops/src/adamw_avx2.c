/* AVX2 + FMA + F16C kernels of the AdamW step (adamw.c): the body and lean
 * kernels of adamw_simd.h at 8 lanes, and the Q8 block store. Compiled with
 * -mavx2 -mfma -mf16c, called only when the CPU has them. */
#define MIXPREC__VW 8
#include "adamw_simd.h"

/* One Q8 block's codes and scale (mixprec__q8_store_block), 8 at a time. */
void mixprec__q8_store_block_avx2(const float *x, int n, uint8_t *codes, float *scale,
                                  const mixprec__q8_tabs *tb, int is_signed) {
  __m256 mx8 = _mm256_setzero_ps();
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_loadu_ps(x + j));
    /* finite only: a NaN or inf compares false */
    const __m256 keep = _mm256_cmp_ps(a, _mm256_set1_ps(3.40282346638528859812e+38f), _CMP_LE_OQ);
    mx8 = _mm256_max_ps(mx8, _mm256_and_ps(a, keep));
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, mx8);
  float mx = 0.0f;
  for (int l = 0; l < 8; l++) mx = lanes[l] > mx ? lanes[l] : mx;
  for (int r = j; r < n; r++) mx = mixprec__q8_absmax_step(mx, x[r]);
  const float inv = mixprec__q8_inv(mx);
  const __m256 inv8 = _mm256_set1_ps(inv);
  int i = 0;
  if (is_signed)
    for (; i + 8 <= n; i += 8) _mm_storel_epi64((__m128i *)(codes + i), mixprec__q8_encode8(_mm256_loadu_ps(x + i), inv8, tb, 1));
  else
    for (; i + 8 <= n; i += 8) _mm_storel_epi64((__m128i *)(codes + i), mixprec__q8_encode8(_mm256_loadu_ps(x + i), inv8, tb, 0));
  for (; i < n; i++) codes[i] = mixprec__q8_encode(x[i], inv, is_signed);
  *scale = mx;
}
