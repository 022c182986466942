/* AVX2 + FMA + F16C slice kernels of softmax and log_softmax (see softmax.c
 * for what a slice is; cross-entropy's are in cross_entropy_avx2.c, the
 * pieces both use in softmax_avx2_internal.h). Compiled with -mavx2 -mfma
 * -mf16c, called only when the CPU has them.
 *
 * Rows (stride 1): vectorised along the row, four vectors (32 lanes) of
 * partial maxima/sums, reduced in one fixed order. Strided slices: the 32
 * columns of a slice are four vectors, each accumulated over the n values of
 * its columns, so every load is a whole 64-byte line of FP16/BF16 values.
 * Tails (a row's last n % 8 values, a slice's last width % 8 columns) go
 * through the same vector code via a padded buffer, so every element of a
 * path is computed the same way. */
#include "softmax_avx2_internal.h"

/* ---- rows ---------------------------------------------------------------- */

MIXPREC__FORCE_INLINE void row_fwd(const void *x, const mixprec_dtype xd, void *y, mixprec_dtype yd,
                   int64_t n, int log, float *scratch) {
  const float m = row_max(x, xd, n);
  const float s = row_sumexp(x, xd, n, m, log ? NULL : scratch);
  int64_t i = 0;
  if (log) {
    const __m256 vm = _mm256_set1_ps(m), vl = _mm256_set1_ps(logf(s));
    for (; i + 8 <= n; i += 8)
      mixprec__avx2_store8(y, yd, i, _mm256_sub_ps(_mm256_sub_ps(mixprec__avx2_load8(x, xd, i), vm), vl));
    if (i < n)
      mixprec__avx2_store_part(y, yd, i, n - i,
                 _mm256_sub_ps(_mm256_sub_ps(mixprec__avx2_load_part(x, xd, i, n - i, 0.0f), vm), vl));
  } else {
    const __m256 inv = _mm256_set1_ps(1.0f / s);
    for (; i + 8 <= n; i += 8) mixprec__avx2_store8(y, yd, i, _mm256_mul_ps(_mm256_loadu_ps(scratch + i), inv));
    if (i < n)
      mixprec__avx2_store_part(y, yd, i, n - i, _mm256_mul_ps(mixprec__avx2_load_part(scratch, MIXPREC_F32, i, n - i, 0.0f), inv));
  }
}

/* ---- strided slices ------------------------------------------------------ */

MIXPREC__FORCE_INLINE void cols_fwd(const void *x, const mixprec_dtype xd, void *y, mixprec_dtype yd, int64_t n,
                    int64_t stride, int64_t width, int log) {
  const int groups = (int)((width + 7) / 8);
  __m256 m[4], s[4], f[4];
  cols_stats(x, xd, n, stride, width, groups, NULL, m, s, NULL);
  for (int g = 0; g < groups; g++)
    f[g] = log ? log8(s[g]) : _mm256_div_ps(_mm256_set1_ps(1.0f), s[g]);
  for (int64_t c = 0; c < n; c++)
    for (int g = 0; g < groups; g++) {
      const __m256 d = _mm256_sub_ps(col_load(x, xd, c, stride, g, width, 0.0f), m[g]);
      col_store(y, yd, c, stride, g, width,
                log ? _mm256_sub_ps(d, f[g]) : _mm256_mul_ps(exp8(d), f[g]));
    }
}

/* ---- backward ------------------------------------------------------------ */

MIXPREC__FORCE_INLINE void row_bwd(const void *dy, const void *y, const mixprec_dtype yd, void *dx,
                   mixprec_dtype dxd, int64_t n, int log) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  if (log) {
    for (; i + 32 <= n; i += 32) {
      s0 = _mm256_add_ps(s0, mixprec__avx2_load8(dy, yd, i));
      s1 = _mm256_add_ps(s1, mixprec__avx2_load8(dy, yd, i + 8));
      s2 = _mm256_add_ps(s2, mixprec__avx2_load8(dy, yd, i + 16));
      s3 = _mm256_add_ps(s3, mixprec__avx2_load8(dy, yd, i + 24));
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_add_ps(s0, mixprec__avx2_load8(dy, yd, i));
    if (i < n) s1 = _mm256_add_ps(s1, mixprec__avx2_load_part(dy, yd, i, n - i, 0.0f));
  } else {
    for (; i + 32 <= n; i += 32) {
      s0 = _mm256_fmadd_ps(mixprec__avx2_load8(dy, yd, i), mixprec__avx2_load8(y, yd, i), s0);
      s1 = _mm256_fmadd_ps(mixprec__avx2_load8(dy, yd, i + 8), mixprec__avx2_load8(y, yd, i + 8), s1);
      s2 = _mm256_fmadd_ps(mixprec__avx2_load8(dy, yd, i + 16), mixprec__avx2_load8(y, yd, i + 16), s2);
      s3 = _mm256_fmadd_ps(mixprec__avx2_load8(dy, yd, i + 24), mixprec__avx2_load8(y, yd, i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(mixprec__avx2_load8(dy, yd, i), mixprec__avx2_load8(y, yd, i), s0);
    if (i < n)
      s1 = _mm256_fmadd_ps(mixprec__avx2_load_part(dy, yd, i, n - i, 0.0f), mixprec__avx2_load_part(y, yd, i, n - i, 0.0f), s1);
  }
  const __m256 s = _mm256_set1_ps(hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3))));
  for (i = 0; i < n; i += 8) {
    const int64_t k = n - i;
    const __m256 g = mixprec__avx2_load_upto(dy, yd, i, k, 0.0f);
    const __m256 o = mixprec__avx2_load_upto(y, yd, i, k, 0.0f);
    const __m256 r = log ? _mm256_fnmadd_ps(exp8(o), s, g) : _mm256_mul_ps(o, _mm256_sub_ps(g, s));
    if (k >= 8)
      mixprec__avx2_store8(dx, dxd, i, r);
    else
      mixprec__avx2_store_part(dx, dxd, i, k, r);
  }
}

MIXPREC__FORCE_INLINE void cols_bwd(const void *dy, const void *y, const mixprec_dtype yd, void *dx,
                    mixprec_dtype dxd, int64_t n, int64_t stride, int64_t width, int log) {
  const int groups = (int)((width + 7) / 8);
  __m256 s[4];
  for (int g = 0; g < groups; g++) s[g] = _mm256_setzero_ps();
  for (int64_t c = 0; c < n; c++)
    for (int g = 0; g < groups; g++) {
      const __m256 gv = col_load(dy, yd, c, stride, g, width, 0.0f);
      s[g] = log ? _mm256_add_ps(s[g], gv)
                 : _mm256_fmadd_ps(gv, col_load(y, yd, c, stride, g, width, 0.0f), s[g]);
    }
  for (int64_t c = 0; c < n; c++)
    for (int g = 0; g < groups; g++) {
      const __m256 gv = col_load(dy, yd, c, stride, g, width, 0.0f);
      const __m256 o = col_load(y, yd, c, stride, g, width, 0.0f);
      col_store(dx, dxd, c, stride, g, width,
                log ? _mm256_fnmadd_ps(exp8(o), s[g], gv) : _mm256_mul_ps(o, _mm256_sub_ps(gv, s[g])));
    }
}

/* ---- entry points: one dispatch on the input dtype each ------------------- */

void mixprec__softmax_fwd_avx2(const void *x, mixprec_dtype xd, void *y,
                               mixprec_dtype yd, int64_t n, int64_t stride,
                               int64_t width, int log, float *scratch) {
  const int row = stride == 1 && width == 1;
  MIXPREC__DISPATCH(xd, X,
                    if (row) row_fwd(x, X, y, yd, n, log, scratch);
                    else cols_fwd(x, X, y, yd, n, stride, width, log));
}

void mixprec__softmax_bwd_avx2(const void *dy, const void *y, mixprec_dtype yd,
                               void *dx, mixprec_dtype dxd, int64_t n,
                               int64_t stride, int64_t width, int log) {
  const int row = stride == 1 && width == 1;
  MIXPREC__DISPATCH(yd, Y,
                    if (row) row_bwd(dy, y, Y, dx, dxd, n, log);
                    else cols_bwd(dy, y, Y, dx, dxd, n, stride, width, log));
}
