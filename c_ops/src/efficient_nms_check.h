/* Argument checks of mixprec_efficient_nms, shared verbatim by the CPU
 * (efficient_nms.c) and the CUDA host code (kernels/efficient_nms.cu), so both return the
 * same status for the same arguments. Depends only on the public header. */
#ifndef MIXPREC_EFFICIENT_NMS_CHECK_H
#define MIXPREC_EFFICIENT_NMS_CHECK_H

#include <stdint.h>

#include "compiler.h"
#include "mixprec/efficient_nms.h"

MIXPREC__INLINE mixprec_status mixprec__efficient_nms_check(
    const void *boxes, mixprec_dtype boxes_dtype, const void *scores, mixprec_dtype scores_dtype,
    int64_t batch, int64_t n, int64_t classes, const mixprec_detect_params *p,
    const void *out_boxes, const void *out_scores, const int64_t *out_classes,
    const int64_t *out_indices, const int64_t *counts) {
  if (!p) return MIXPREC_ERR_NULL_POINTER;
  if (batch < 0 || n < 0 || classes < 0 || batch > INT32_MAX) return MIXPREC_ERR_BAD_SIZE;
  if (classes > 0 && n > INT32_MAX / classes) return MIXPREC_ERR_BAD_SIZE;
  if (mixprec_dtype_size(boxes_dtype) == 0 || mixprec_dtype_size(scores_dtype) == 0)
    return MIXPREC_ERR_BAD_DTYPE;
  if (batch > 0 && (!out_boxes || !out_scores || !out_classes || !out_indices || !counts))
    return MIXPREC_ERR_NULL_POINTER;
  if (batch > 0 && n > 0 && classes > 0 && (!boxes || !scores)) return MIXPREC_ERR_NULL_POINTER;
  if (!(p->iou_threshold >= 0.0)) return MIXPREC_ERR_BAD_ARGUMENT; /* NaN too */
  if (p->use_score_threshold && p->score_threshold != p->score_threshold)
    return MIXPREC_ERR_BAD_ARGUMENT;
  if (p->pre_nms_top_k == 0) return MIXPREC_ERR_BAD_ARGUMENT;
  if (p->max_detections < 1 || p->max_detections > INT32_MAX) return MIXPREC_ERR_BAD_ARGUMENT;
  return MIXPREC_OK;
}

/* Candidates per image that can reach the NMS: min(n * classes, top-k). */
MIXPREC__INLINE int64_t mixprec__efficient_nms_cap(int64_t n, int64_t classes,
                                            const mixprec_detect_params *p) {
  const int64_t all = n * classes;
  return p->pre_nms_top_k > 0 && p->pre_nms_top_k < all ? p->pre_nms_top_k : all;
}

#endif /* MIXPREC_EFFICIENT_NMS_CHECK_H */
