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

/* The layout's own checks (after mixprec__efficient_nms_check): strides
 * >= 0, a known coding, every byte offset within int64. */
MIXPREC__INLINE mixprec_status mixprec__efficient_nms_check_layout(const mixprec_detect_layout *l,
                                                                   int64_t batch, int64_t n,
                                                                   int64_t classes) {
  if (!l) return MIXPREC_ERR_NULL_POINTER;
  if (l->box_coding != MIXPREC_BOX_CORNER && l->box_coding != MIXPREC_BOX_CENTER)
    return MIXPREC_ERR_BAD_ARGUMENT;
  for (int d = 0; d < 4; d++)
    if (l->box_strides[d] < 0) return MIXPREC_ERR_BAD_ARGUMENT;
  for (int d = 0; d < 3; d++)
    if (l->score_strides[d] < 0) return MIXPREC_ERR_BAD_ARGUMENT;
  if (batch == 0 || n == 0 || classes == 0) return MIXPREC_OK;
  const int64_t bsz[4] = {batch - 1, n - 1, classes - 1, 3};
  int64_t bmax = 0, smax = 0;
  for (int d = 0; d < 4; d++) {
    if (bsz[d] > 0 && l->box_strides[d] > (INT64_MAX - bmax) / bsz[d]) return MIXPREC_ERR_BAD_SIZE;
    bmax += bsz[d] * l->box_strides[d];
  }
  for (int d = 0; d < 3; d++) {
    if (bsz[d] > 0 && l->score_strides[d] > (INT64_MAX - smax) / bsz[d])
      return MIXPREC_ERR_BAD_SIZE;
    smax += bsz[d] * l->score_strides[d];
  }
  /* The byte offsets too (4 bytes: the largest element). */
  if (bmax > INT64_MAX / 4 || smax > INT64_MAX / 4) return MIXPREC_ERR_BAD_SIZE;
  return MIXPREC_OK;
}

/* Element offset of box (n, c)'s first coordinate / of score (n, c) within
 * image b. */
MIXPREC__HD int64_t mixprec__efficient_nms_box_at(const mixprec_detect_layout *l, int64_t b,
                                                  int64_t n, int64_t c) {
  return b * l->box_strides[0] + n * l->box_strides[1] + c * l->box_strides[2];
}
MIXPREC__HD int64_t mixprec__efficient_nms_score_at(const mixprec_detect_layout *l, int64_t b,
                                                    int64_t n, int64_t c) {
  return b * l->score_strides[0] + n * l->score_strides[1] + c * l->score_strides[2];
}

/* mixprec_detect_layout_contiguous(), for both backends. */
MIXPREC__INLINE mixprec_detect_layout mixprec__efficient_nms_contiguous(int64_t n, int64_t classes,
                                                                       int class_boxes) {
  /* Unsigned products: sizes too large for any buffer wrap instead of
   * overflowing (the entry points refuse them before using a layout). With
   * no candidate (n or classes 0) the other size may be anything up to
   * INT64_MAX, and a product with it could wrap negative and be refused:
   * such a layout's products are taken of zero sizes (its strides are
   * never used). */
  const int none = n == 0 || classes == 0;
  const uint64_t un = none ? 0u : (uint64_t)n, uc = none ? 0u : (uint64_t)classes;
  mixprec_detect_layout l;
  l.box_strides[3] = 1;
  l.box_strides[2] = class_boxes ? 4 : 0;
  l.box_strides[1] = (int64_t)(class_boxes ? 4u * uc : 4u);
  l.box_strides[0] = (int64_t)(un * (uint64_t)l.box_strides[1]);
  l.score_strides[2] = 1;
  l.score_strides[1] = classes;
  l.score_strides[0] = (int64_t)(un * uc);
  l.box_coding = MIXPREC_BOX_CORNER;
  return l;
}

/* Candidates per image that can reach the NMS: min(n * classes, top-k). */
MIXPREC__INLINE int64_t mixprec__efficient_nms_cap(int64_t n, int64_t classes,
                                            const mixprec_detect_params *p) {
  const int64_t all = n * classes;
  return p->pre_nms_top_k > 0 && p->pre_nms_top_k < all ? p->pre_nms_top_k : all;
}

#endif /* MIXPREC_EFFICIENT_NMS_CHECK_H */
