/* The optimizer's vector bodies are written once, for a width: adamw_simd.h
 * and sgd_simd.h hold the AdamW and SGD body and lean kernels in terms of
 * the macros below, and adamw_avx2.c / adamw_avx512.c (sgd_*.c likewise)
 * include them after `#define MIXPREC__VW 8` or `16`. The two instances run
 * the same operations in the same order, so AVX2 and AVX-512 give the same
 * bits (OptimIsa tests); only what has no common spelling is chosen here:
 * the intrinsics' prefix, the lane helpers of optim_common.h (name8 /
 * name16: MPV_N, MPV_NS for pre8post), torch's NaN-propagating maximum, and what a kernel does with the
 * range it leaves (AVX-512: its last whole 8 elements go to AVX2). */
#ifndef MIXPREC_OPTIM_SIMD_H
#define MIXPREC_OPTIM_SIMD_H

#include "optim_common.h"

#if MIXPREC__VW == 8
typedef __m256 mixprec__vf;
#  define MPV(op) _mm256_##op##_ps
#  define MPV_N(name) name##8
#  define MPV_NS(pre, post) pre##8##post
#  define MPV_ISA(name) name##_avx2
#  define MPV_BODY_LOOP MIXPREC__OPT_BODY_LOOP
/* torch's Vectorized<float> maximum: max_ps(old, v) gives v unless old > v;
 * or'ed with the unordered compare, a NaN gives all ones. */
#  define MPV_NANMAX(a, b) _mm256_or_ps(_mm256_max_ps(a, b), _mm256_cmp_ps(a, b, _CMP_UNORD_Q))
#  define MPV_STATE_LOAD(buf, d, i, sc, tab, is_signed) \
    mixprec__opt_state_load8(buf, d, i, sc, tab, is_signed)
/* what is left of [begin, end) after the vectors: the caller's scalar tail */
#  define MPV_REST(i, end, avx2_call) (i)
#elif MIXPREC__VW == 16
typedef __m512 mixprec__vf;
#  define MPV(op) _mm512_##op##_ps
#  define MPV_N(name) name##16
#  define MPV_NS(pre, post) pre##16##post
#  define MPV_ISA(name) name##_avx512
#  define MPV_BODY_LOOP MIXPREC__OPT_BODY_LOOP16
#  define MPV_NANMAX(a, b)                                                    \
    _mm512_mask_mov_ps(_mm512_max_ps(a, b), _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q), \
                       _mm512_castsi512_ps(_mm512_set1_epi32(-1)))
#  define MPV_STATE_LOAD(buf, d, i, sc, tab, is_signed) \
    mixprec__opt_state_load16(buf, d, i, sc, tab, is_signed)
/* a whole 8 left: the AVX2 kernel takes it, the rest is the scalar tail */
#  define MPV_REST(i, end, avx2_call) ((end) - (i) >= 8 ? (avx2_call) : (i))
#else
#  error "define MIXPREC__VW as 8 or 16 before including optim_simd.h"
#endif

/* Declares `name`, a pointer to a local copy of either optimizer's
 * constants *src (type T), kept in registers as MIXPREC__OPT_LOCAL does; for
 * a plain step (a constant: no grad scale, no maximize) the copy's fields
 * for those are zero, so the compiler drops their tests from the loop (the
 * other steps run the general loop). The copy stays writable as
 * name##_copy_ for a caller's further plain fields. */
#define MPV_PLAIN_LOCAL(T, name, src, plain) \
  T name##_copy_ = *(src);                    \
  if (plain) {                                \
    name##_copy_.has_scale = 0;               \
    name##_copy_.unscale = 0;                 \
    name##_copy_.h.maximize = 0;              \
  }                                           \
  const T *name = &name##_copy_

/* The gradient of one vector at i as the update sees it (unscaled, written
 * back with unscale_grads, negated for maximize): AdamW's and SGD's grad_v
 * with their consts' fields. */
MIXPREC__FORCE_INLINE mixprec__vf mixprec__opt_grad_v(const mixprec_opt_tensor *t, int64_t i,
                                                      const mixprec_dtype gd, const int has_scale,
                                                      const float scale, const int unscale,
                                                      const int maximize) {
  mixprec__vf g = MPV_N(mixprec__opt_load)(t->grad, gd, i);
  if (has_scale) g = MPV(div)(g, MPV(set1)(scale));
  if (unscale) MPV_NS(mixprec__opt_store, _grad)(t->grad, gd, i, g);
  if (maximize) g = MPV_N(mixprec__opt_neg)(g);
  return g;
}

#endif /* MIXPREC_OPTIM_SIMD_H */
