/* AVX-512 (F, BW, VL, DQ) kernels of the AdamW step (adamw.c): the body and
 * lean kernels of adamw_simd.h at 16 lanes (bit-identical to the scalar body
 * and to AVX2; a range's last whole 8 elements go to the AVX2 kernel), and
 * the Q8 block store with masked tails. Compiled with the AVX-512 flags
 * (CMakeLists.txt), called only when the CPU has them. */
#define MIXPREC__VW 16
#include "adamw_simd.h"

/* One Q8 block's codes and scale (mixprec__q8_store_block), 16 at a time,
 * the block's last n % 16 with masked loads and stores. */
void mixprec__q8_store_block_avx512(const float *x, int n, uint8_t *codes, float *scale,
                                    const mixprec__q8_tabs *tb, int is_signed) {
  __m512 mx16 = _mm512_setzero_ps();
  for (int j = 0; j < n; j += 16) {
    const __mmask16 in = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1u);
    const __m512 a = _mm512_abs_ps(_mm512_maskz_loadu_ps(in, x + j));
    /* finite only: a NaN or inf compares false (a max is exact: any order) */
    mx16 = _mm512_max_ps(mx16, _mm512_maskz_mov_ps(
        _mm512_cmp_ps_mask(a, _mm512_set1_ps(3.40282346638528859812e+38f), _CMP_LE_OQ), a));
  }
  const float mx = _mm512_reduce_max_ps(mx16);
  const float inv = mixprec__q8_inv(mx);
  const __m512 inv16 = _mm512_set1_ps(inv);
#define MIXPREC__Q8_ENC_LOOP(SIGNED)                                                          \
  const mixprec__q8_enc16 e = mixprec__q8_enc16_load(tb, SIGNED);                           \
  for (int i = 0; i < n; i += 16) {                                                         \
    const __mmask16 in = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u); \
    _mm_mask_storeu_epi8(codes + i, in,                                                     \
                         mixprec__q8_encode16(_mm512_maskz_loadu_ps(in, x + i), inv16, &e, SIGNED)); \
  }
  if (is_signed) {
    MIXPREC__Q8_ENC_LOOP(1)
  } else {
    MIXPREC__Q8_ENC_LOOP(0)
  }
#undef MIXPREC__Q8_ENC_LOOP
  *scale = mx;
}
