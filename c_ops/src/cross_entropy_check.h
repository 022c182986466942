/* Argument checks of the cross-entropy entry points, shared verbatim by the
 * CPU (cross_entropy.c) and the CUDA host code (kernels/cross_entropy.cu), so
 * both return the same status for the same arguments. The CPU then checks
 * the targets' range, the GPU the pointers' alignment. */
#ifndef MIXPREC_CROSS_ENTROPY_CHECK_H
#define MIXPREC_CROSS_ENTROPY_CHECK_H

#include <stdint.h>

#include "compiler.h"
#include "mixprec/mixprec.h"

/* Sizes, options and pointers; *positions receives outer * inner (0 when
 * there is nothing to do, and then logits/target are not checked). */
MIXPREC__INLINE mixprec_status mixprec__ce_check(const void *logits, mixprec_dtype dtype,
                                               const int64_t *target,
                                               const mixprec_cross_entropy_params *p,
                                               int64_t *positions) {
  if (!p) return MIXPREC_ERR_NULL_POINTER;
  if (mixprec_dtype_size(dtype) == 0) return MIXPREC_ERR_BAD_DTYPE;
  if (p->outer < 0 || p->classes < 0 || p->inner < 0) return MIXPREC_ERR_BAD_SIZE;
  if (!(p->label_smoothing >= 0.0 && p->label_smoothing <= 1.0)) return MIXPREC_ERR_BAD_ARGUMENT;
  if (p->reduction != MIXPREC_REDUCTION_NONE && p->reduction != MIXPREC_REDUCTION_MEAN &&
      p->reduction != MIXPREC_REDUCTION_SUM)
    return MIXPREC_ERR_BAD_ARGUMENT;
  *positions = 0;
  if (p->outer == 0 || p->inner == 0) return MIXPREC_OK;
  if (p->outer > INT64_MAX / p->inner) return MIXPREC_ERR_BAD_SIZE;
  *positions = p->outer * p->inner;
  if (p->classes < 1 || p->classes > INT32_MAX) return MIXPREC_ERR_BAD_SIZE;
  if (p->classes > INT64_MAX / *positions) return MIXPREC_ERR_BAD_SIZE;
  if (!logits || !target) return MIXPREC_ERR_NULL_POINTER;
  return MIXPREC_OK;
}

/* The soft-target entry points: the target's dtype, then the class-index
 * checks (the target pointer only tested for NULL, never read here). */
MIXPREC__INLINE mixprec_status mixprec__ce_soft_check(const void *logits, mixprec_dtype dtype,
                                                    const void *target, mixprec_dtype target_dtype,
                                                    const mixprec_cross_entropy_params *p,
                                                    int64_t *positions) {
  if (!p) return MIXPREC_ERR_NULL_POINTER;
  if (mixprec_dtype_size(target_dtype) == 0) return MIXPREC_ERR_BAD_DTYPE;
  return mixprec__ce_check(logits, dtype, (const int64_t *)target, p, positions);
}

#endif /* MIXPREC_CROSS_ENTROPY_CHECK_H */
