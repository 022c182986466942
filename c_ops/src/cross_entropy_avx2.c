/* AVX2 + FMA + F16C slice kernels of cross-entropy, class-index and
 * class-probability targets (see cross_entropy.c for the per-position
 * stats and formulas, softmax.c for what a slice is). Compiled with
 * -mavx2 -mfma -mf16c, called only when the CPU has them; the loads, exp
 * and row / column reductions are softmax's (softmax_avx2_internal.h). */
#include "softmax_avx2_internal.h"

/* ---- cross-entropy pieces ------------------------------------------------ */

MIXPREC__FORCE_INLINE void row_ce_stats(const void *x, const mixprec_dtype xd, int64_t n, const float *weight,
                        float *mx, float *se, float *wx) {
  const float m = row_max(x, xd, n);
  *mx = m;
  if (!wx) {
    *se = row_sumexp(x, xd, n, m, NULL);
    return;
  }
  const __m256 vm = _mm256_set1_ps(m);
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, w0 = s0, w1 = s0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 d0 = _mm256_sub_ps(mixprec__avx2_load8(x, xd, i), vm);
    const __m256 d1 = _mm256_sub_ps(mixprec__avx2_load8(x, xd, i + 8), vm);
    s0 = _mm256_add_ps(s0, exp8(d0));
    s1 = _mm256_add_ps(s1, exp8(d1));
    if (weight) {
      w0 = _mm256_fmadd_ps(_mm256_loadu_ps(weight + i), d0, w0);
      w1 = _mm256_fmadd_ps(_mm256_loadu_ps(weight + i + 8), d1, w1);
    } else {
      w0 = _mm256_add_ps(w0, d0);
      w1 = _mm256_add_ps(w1, d1);
    }
  }
  for (; i < n; i += 8) {
    const int64_t k = n - i;
    /* Padding lanes: -inf for the sum (exp gives 0), m for the weighted sum
     * (difference 0, weight 0). */
    const __m256 d = _mm256_sub_ps(mixprec__avx2_load_upto(x, xd, i, k, -INFINITY), vm);
    const __m256 dz = k >= 8 ? d : _mm256_sub_ps(mixprec__avx2_load_part(x, xd, i, k, m), vm);
    const __m256 w = weight ? mixprec__avx2_load_upto(weight, MIXPREC_F32, i, k, 0.0f)
                            : _mm256_set1_ps(1.0f);
    s0 = _mm256_add_ps(s0, exp8(d));
    w0 = _mm256_fmadd_ps(w, dz, w0);
  }
  *se = hsum(_mm256_add_ps(s0, s1));
  *wx = hsum(_mm256_add_ps(w0, w1));
}

MIXPREC__FORCE_INLINE void row_ce_grad(const void *x, const mixprec_dtype xd, void *dx, int64_t n, float mx,
                       float lg, float a, float b, const float *weight, int64_t t, float bt) {
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 vm = _mm256_set1_ps(mx), vl = _mm256_set1_ps(lg), va = _mm256_set1_ps(a),
               vb = _mm256_set1_ps(b);
  for (int64_t i = 0; i < n; i += 8) {
    const int64_t k = n - i;
    const __m256 v = mixprec__avx2_load_upto(x, xd, i, k, 0.0f);
    const __m256 w = weight ? mixprec__avx2_load_upto(weight, MIXPREC_F32, i, k, 0.0f)
                            : _mm256_set1_ps(1.0f);
    const __m256 e = exp8(_mm256_sub_ps(_mm256_sub_ps(v, vm), vl));
    __m256 r = _mm256_fnmadd_ps(vb, w, _mm256_mul_ps(va, e));
    if (t >= i && t < i + 8) {
      const __m256i hit = _mm256_cmpeq_epi32(iota, _mm256_set1_epi32((int)(t - i)));
      r = _mm256_sub_ps(r, _mm256_and_ps(_mm256_castsi256_ps(hit), _mm256_set1_ps(bt)));
    }
    if (k >= 8)
      mixprec__avx2_store8(dx, xd, i, r);
    else
      mixprec__avx2_store_part(dx, xd, i, k, r);
  }
}

MIXPREC__FORCE_INLINE void cols_ce_stats(const void *x, const mixprec_dtype xd, int64_t n, int64_t stride,
                         int64_t width, const float *weight, float *mx, float *se, float *wx) {
  const int groups = (int)((width + 7) / 8);
  __m256 m[4], s[4], w[4];
  cols_stats(x, xd, n, stride, width, groups, weight, m, s, wx ? w : NULL);
  for (int g = 0; g < groups; g++) {
    const int64_t j = 8 * (int64_t)g, k = width - j < 8 ? width - j : 8;
    float tm[8], ts[8], tw[8];
    _mm256_storeu_ps(tm, m[g]);
    _mm256_storeu_ps(ts, s[g]);
    if (wx) _mm256_storeu_ps(tw, w[g]);
    for (int64_t l = 0; l < k; l++) {
      mx[j + l] = tm[l];
      se[j + l] = ts[l];
      if (wx) wx[j + l] = tw[l];
    }
  }
}

MIXPREC__FORCE_INLINE void cols_ce_grad(const void *x, const mixprec_dtype xd, void *dx, int64_t n,
                        int64_t stride, int64_t width, const float *mx, const float *lg,
                        const float *a, const float *b, const float *weight, const int32_t *tc,
                        const float *bt) {
  const int groups = (int)((width + 7) / 8);
  __m256 vm[4], vl[4], va[4], vb[4], vbt[4];
  __m256i vt[4];
  load_groups(mx, width, vm);
  load_groups(lg, width, vl);
  load_groups(a, width, va);
  load_groups(b, width, vb);
  load_groups(bt, width, vbt);
  for (int g = 0; g < groups; g++) {
    const int64_t j = 8 * (int64_t)g, k = width - j;
    int32_t t8[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
    for (int64_t l = 0; l < (k < 8 ? k : 8); l++) t8[l] = tc[j + l];
    vt[g] = _mm256_loadu_si256((const __m256i *)t8);
  }
  for (int64_t c = 0; c < n; c++) {
    const __m256 w = _mm256_set1_ps(weight ? weight[c] : 1.0f);
    const __m256i vc = _mm256_set1_epi32((int32_t)c);
    for (int g = 0; g < groups; g++) {
      const __m256 v = col_load(x, xd, c, stride, g, width, 0.0f);
      __m256 r = _mm256_fnmadd_ps(vb[g], w,
                                  _mm256_mul_ps(va[g], exp8(_mm256_sub_ps(_mm256_sub_ps(v, vm[g]), vl[g]))));
      const __m256 hit = _mm256_castsi256_ps(_mm256_cmpeq_epi32(vt[g], vc));
      r = _mm256_sub_ps(r, _mm256_and_ps(hit, vbt[g]));
      col_store(dx, xd, c, stride, g, width, r);
    }
  }
}

/* ---- entry points: one dispatch on the dtypes each -------------------------- */

void mixprec__ce_stats_avx2(const void *x, mixprec_dtype xd, int64_t n,
                            int64_t stride, int64_t width, const float *weight,
                            float *mx, float *se, float *wx) {
  const int row = stride == 1 && width == 1;
  MIXPREC__DISPATCH(xd, X,
                    if (row) row_ce_stats(x, X, n, weight, mx, se, wx);
                    else cols_ce_stats(x, X, n, stride, width, weight, mx, se, wx));
}

void mixprec__ce_grad_avx2(const void *x, mixprec_dtype xd, void *dx,
                           int64_t n, int64_t stride, int64_t width,
                           const float *mx, const float *lg, const float *a,
                           const float *b, const float *weight, const int32_t *tc,
                           const float *bt) {
  const int row = stride == 1 && width == 1;
  MIXPREC__DISPATCH(xd, X,
                    if (row) row_ce_grad(x, X, dx, n, mx[0], lg[0], a[0], b[0], weight, tc[0], bt[0]);
                    else cols_ce_grad(x, X, dx, n, stride, width, mx, lg, a, b, weight, tc, bt));
}

/* ---- cross-entropy with class-probability targets --------------------------- */

/* Lanes [0, k) all ones, the others zero. */
MIXPREC__FORCE_INLINE __m256 lanes_below(int64_t k) {
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)k), iota));
}

MIXPREC__FORCE_INLINE void row_soft_stats(const void *x, const mixprec_dtype xd, const void *t,
                                          const mixprec_dtype td, int64_t n, const float *weight,
                                          float keep, float add, float *mx, float *se, float *tw,
                                          float *twx) {
  const float m = row_max(x, xd, n);
  *mx = m;
  const __m256 vm = _mm256_set1_ps(m), vk = _mm256_set1_ps(keep), va = _mm256_set1_ps(add);
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, a0 = s0, a1 = s0, b0 = s0, b1 = s0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 d0 = _mm256_sub_ps(mixprec__avx2_load8(x, xd, i), vm);
    const __m256 d1 = _mm256_sub_ps(mixprec__avx2_load8(x, xd, i + 8), vm);
    __m256 p0 = _mm256_fmadd_ps(mixprec__avx2_load8(t, td, i), vk, va);
    __m256 p1 = _mm256_fmadd_ps(mixprec__avx2_load8(t, td, i + 8), vk, va);
    if (weight) {
      p0 = _mm256_mul_ps(_mm256_loadu_ps(weight + i), p0);
      p1 = _mm256_mul_ps(_mm256_loadu_ps(weight + i + 8), p1);
    }
    s0 = _mm256_add_ps(s0, exp8(d0));
    s1 = _mm256_add_ps(s1, exp8(d1));
    a0 = _mm256_add_ps(a0, p0);
    a1 = _mm256_add_ps(a1, p1);
    b0 = _mm256_fmadd_ps(p0, d0, b0);
    b1 = _mm256_fmadd_ps(p1, d1, b1);
  }
  for (; i < n; i += 8) {
    const int64_t k = n - i;
    /* Padding lanes: -inf for the sum (exp gives 0); for the target sums a
     * zero weighted target times a zero difference. */
    const __m256 d = _mm256_sub_ps(mixprec__avx2_load_upto(x, xd, i, k, -INFINITY), vm);
    const __m256 dz = k >= 8 ? d : _mm256_sub_ps(mixprec__avx2_load_part(x, xd, i, k, m), vm);
    __m256 p = _mm256_fmadd_ps(mixprec__avx2_load_upto(t, td, i, k, 0.0f), vk, va);
    if (weight) p = _mm256_mul_ps(mixprec__avx2_load_upto(weight, MIXPREC_F32, i, k, 0.0f), p);
    if (k < 8) p = _mm256_and_ps(p, lanes_below(k));
    s0 = _mm256_add_ps(s0, exp8(d));
    a0 = _mm256_add_ps(a0, p);
    b0 = _mm256_fmadd_ps(p, k >= 8 ? d : _mm256_and_ps(dz, lanes_below(k)), b0);
  }
  *se = hsum(_mm256_add_ps(s0, s1));
  *tw = hsum(_mm256_add_ps(a0, a1));
  *twx = hsum(_mm256_add_ps(b0, b1));
}

MIXPREC__FORCE_INLINE void row_soft_grad(const void *x, const mixprec_dtype xd, const void *t,
                                         const mixprec_dtype td, void *dx, void *dt, int64_t n,
                                         float mx, float lg, float a, float g, float cdt,
                                         const float *weight, float keep, float add) {
  const __m256 vm = _mm256_set1_ps(mx), vl = _mm256_set1_ps(lg), va = _mm256_set1_ps(a),
               vg = _mm256_set1_ps(g), vc = _mm256_set1_ps(cdt), vk = _mm256_set1_ps(keep),
               vad = _mm256_set1_ps(add);
  for (int64_t i = 0; i < n; i += 8) {
    const int64_t k = n - i;
    const __m256 v = mixprec__avx2_load_upto(x, xd, i, k, 0.0f);
    const __m256 w = weight ? mixprec__avx2_load_upto(weight, MIXPREC_F32, i, k, 0.0f)
                            : _mm256_set1_ps(1.0f);
    const __m256 lp = _mm256_sub_ps(_mm256_sub_ps(v, vm), vl);
    if (dx) {
      const __m256 p = _mm256_fmadd_ps(mixprec__avx2_load_upto(t, td, i, k, 0.0f), vk, vad);
      const __m256 r = _mm256_fnmadd_ps(vg, _mm256_mul_ps(w, p), _mm256_mul_ps(va, exp8(lp)));
      if (k >= 8)
        mixprec__avx2_store8(dx, xd, i, r);
      else
        mixprec__avx2_store_part(dx, xd, i, k, r);
    }
    if (dt) {
      const __m256 r = _mm256_mul_ps(_mm256_mul_ps(vc, w), lp);
      if (k >= 8)
        mixprec__avx2_store8(dt, td, i, r);
      else
        mixprec__avx2_store_part(dt, td, i, k, r);
    }
  }
}

MIXPREC__FORCE_INLINE void cols_soft_stats(const void *x, const mixprec_dtype xd, const void *t,
                                           const mixprec_dtype td, int64_t n, int64_t stride,
                                           int64_t width, const float *weight, float keep, float add,
                                           float *mx, float *se, float *tw, float *twx) {
  const int groups = (int)((width + 7) / 8);
  const __m256 vk = _mm256_set1_ps(keep), va = _mm256_set1_ps(add);
  __m256 m[4], s[4], a[4], b[4];
  for (int g = 0; g < groups; g++) m[g] = _mm256_set1_ps(-INFINITY);
  for (int64_t c = 0; c < n; c++)
    for (int g = 0; g < groups; g++) m[g] = vmax(m[g], col_load(x, xd, c, stride, g, width, -INFINITY));
  for (int g = 0; g < groups; g++) s[g] = a[g] = b[g] = _mm256_setzero_ps();
  for (int64_t c = 0; c < n; c++) {
    const __m256 w = _mm256_set1_ps(weight ? weight[c] : 1.0f);
    for (int g = 0; g < groups; g++) {
      const __m256 d = _mm256_sub_ps(col_load(x, xd, c, stride, g, width, 0.0f), m[g]);
      const __m256 p = _mm256_mul_ps(w, _mm256_fmadd_ps(col_load(t, td, c, stride, g, width, 0.0f), vk, va));
      s[g] = _mm256_add_ps(s[g], exp8(d));
      a[g] = _mm256_add_ps(a[g], p);
      b[g] = _mm256_fmadd_ps(p, d, b[g]);
    }
  }
  for (int g = 0; g < groups; g++) {
    const int64_t j = 8 * (int64_t)g, k = width - j < 8 ? width - j : 8;
    float tm[8], ts[8], ta[8], tb[8];
    _mm256_storeu_ps(tm, m[g]);
    _mm256_storeu_ps(ts, s[g]);
    _mm256_storeu_ps(ta, a[g]);
    _mm256_storeu_ps(tb, b[g]);
    for (int64_t l = 0; l < k; l++) {
      mx[j + l] = tm[l];
      se[j + l] = ts[l];
      tw[j + l] = ta[l];
      twx[j + l] = tb[l];
    }
  }
}

MIXPREC__FORCE_INLINE void cols_soft_grad(const void *x, const mixprec_dtype xd, const void *t,
                                          const mixprec_dtype td, void *dx, void *dt, int64_t n,
                                          int64_t stride, int64_t width, const float *mx,
                                          const float *lg, const float *a, const float *g,
                                          const float *cdt, const float *weight, float keep,
                                          float add) {
  const int groups = (int)((width + 7) / 8);
  const __m256 vk = _mm256_set1_ps(keep), vad = _mm256_set1_ps(add);
  __m256 vm[4], vl[4], va[4], vg[4], vc[4];
  load_groups(mx, width, vm);
  load_groups(lg, width, vl);
  load_groups(a, width, va);
  load_groups(g, width, vg);
  load_groups(cdt, width, vc);
  for (int64_t c = 0; c < n; c++) {
    const __m256 w = _mm256_set1_ps(weight ? weight[c] : 1.0f);
    for (int q = 0; q < groups; q++) {
      const __m256 lp = _mm256_sub_ps(_mm256_sub_ps(col_load(x, xd, c, stride, q, width, 0.0f), vm[q]), vl[q]);
      if (dx) {
        const __m256 p = _mm256_fmadd_ps(col_load(t, td, c, stride, q, width, 0.0f), vk, vad);
        col_store(dx, xd, c, stride, q, width,
                  _mm256_fnmadd_ps(vg[q], _mm256_mul_ps(w, p), _mm256_mul_ps(va[q], exp8(lp))));
      }
      if (dt) col_store(dt, td, c, stride, q, width, _mm256_mul_ps(_mm256_mul_ps(vc[q], w), lp));
    }
  }
}

/* One body per (logit dtype, target dtype) pair, each with both as
 * constants. */
MIXPREC__FORCE_INLINE void soft_stats(const void *x, const mixprec_dtype xd, const void *t,
                                      const mixprec_dtype td, int64_t n, int64_t stride, int64_t width,
                                      const float *weight, float keep, float add, float *mx, float *se,
                                      float *tw, float *twx) {
  if (stride == 1 && width == 1)
    row_soft_stats(x, xd, t, td, n, weight, keep, add, mx, se, tw, twx);
  else
    cols_soft_stats(x, xd, t, td, n, stride, width, weight, keep, add, mx, se, tw, twx);
}

MIXPREC__FORCE_INLINE void soft_grad(const void *x, const mixprec_dtype xd, const void *t,
                                     const mixprec_dtype td, void *dx, void *dt, int64_t n, int64_t stride,
                                     int64_t width, const float *mx, const float *lg, const float *a,
                                     const float *g, const float *cdt, const float *weight, float keep,
                                     float add) {
  if (stride == 1 && width == 1)
    row_soft_grad(x, xd, t, td, dx, dt, n, mx[0], lg[0], a[0], g[0], cdt[0], weight, keep, add);
  else
    cols_soft_grad(x, xd, t, td, dx, dt, n, stride, width, mx, lg, a, g, cdt, weight, keep, add);
}

void mixprec__ce_soft_stats_avx2(const void *x, mixprec_dtype xd, const void *t, mixprec_dtype td,
                                 int64_t n, int64_t stride, int64_t width, const float *weight,
                                 float keep, float add, float *mx, float *se, float *tw, float *twx) {
  MIXPREC__DISPATCH(xd, X,
                    MIXPREC__DISPATCH(td, T,
                                      soft_stats(x, X, t, T, n, stride, width, weight, keep, add,
                                                 mx, se, tw, twx)));
}

void mixprec__ce_soft_grad_avx2(const void *x, mixprec_dtype xd, const void *t, mixprec_dtype td,
                                void *dx, void *dt, int64_t n, int64_t stride, int64_t width,
                                const float *mx, const float *lg, const float *a, const float *g,
                                const float *cdt, const float *weight, float keep, float add) {
  MIXPREC__DISPATCH(xd, X,
                    MIXPREC__DISPATCH(td, T,
                                      soft_grad(x, X, t, T, dx, dt, n, stride, width, mx, lg, a, g,
                                                cdt, weight, keep, add)));
}
