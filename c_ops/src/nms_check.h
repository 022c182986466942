/* Argument checks of the NMS entry points, shared verbatim by the CPU
 * (nms.c) and the CUDA host code (kernels/nms.cu), so both return the same
 * status for the same arguments. In two parts, because the class dtype is
 * checked between them on the GPU (mixprec_cuda_nms takes classes NULL as one
 * class) and after them on the CPU (mixprec_batched_nms). The GPU then checks
 * the pointers' alignment. Depends only on the public header. */
#ifndef MIXPREC_NMS_CHECK_H
#define MIXPREC_NMS_CHECK_H

#include <stdint.h>

#include "compiler.h"
#include "mixprec/nms.h"

/* The options, the count and the dtypes of boxes and scores. */
MIXPREC__INLINE mixprec_status mixprec__nms_check_sizes(mixprec_dtype boxes_dtype,
                                                        mixprec_dtype scores_dtype, int64_t n,
                                                        const mixprec_nms_params *p,
                                                        const int64_t *n_keep) {
  if (!p || !n_keep) return MIXPREC_ERR_NULL_POINTER;
  if (n < 0 || n > INT32_MAX) return MIXPREC_ERR_BAD_SIZE;
  if (mixprec_dtype_size(boxes_dtype) == 0 || mixprec_dtype_size(scores_dtype) == 0)
    return MIXPREC_ERR_BAD_DTYPE;
  return MIXPREC_OK;
}

MIXPREC__INLINE int mixprec__nms_classes_dtype_ok(mixprec_index_dtype d) {
  return d == MIXPREC_I64 || d == MIXPREC_I32;
}

/* The data pointers and the thresholds (after mixprec__nms_check_sizes). */
MIXPREC__INLINE mixprec_status mixprec__nms_check_data(const void *boxes, const void *scores,
                                                       int64_t n, const mixprec_nms_params *p,
                                                       const int64_t *keep) {
  if (n > 0 && (!boxes || !scores)) return MIXPREC_ERR_NULL_POINTER;
  if (mixprec_nms_capacity(n, p) > 0 && !keep) return MIXPREC_ERR_NULL_POINTER;
  if (!(p->iou_threshold >= 0.0)) return MIXPREC_ERR_BAD_ARGUMENT; /* NaN too */
  if (p->use_score_threshold && p->score_threshold != p->score_threshold)
    return MIXPREC_ERR_BAD_ARGUMENT;
  return MIXPREC_OK;
}

#endif /* MIXPREC_NMS_CHECK_H */
