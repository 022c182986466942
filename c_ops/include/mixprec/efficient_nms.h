/* mixprec C API: batched detection post-processing (the job of TensorRT's
 * EfficientNMS plugin). Included by mixprec/mixprec.h.
 *
 * A whole batch of detector outputs in one call: per image, score filter,
 * pre-NMS top-k over every (box, class) candidate, class-aware or
 * class-agnostic greedy NMS with the IoU in float32 (the sweep and the
 * rules of mixprec_nms), and the first max_detections survivors written to
 * fixed-size outputs.
 *
 *     // 2 images, 3 boxes, 2 classes, float32
 *     float boxes[2][3][4], scores[2][3][2];              // filled by a model
 *     float out_boxes[2][10][4], out_scores[2][10];
 *     int64_t out_classes[2][10], out_indices[2][10], counts[2];
 *     mixprec_detect_params p = mixprec_detect_params_default();
 *     p.use_score_threshold = 1, p.score_threshold = 0.05, p.max_detections = 10;
 *     mixprec_efficient_nms(boxes, MIXPREC_F32, 0, scores, MIXPREC_F32, 2, 3, 2, &p,
 *                           out_boxes, out_scores, out_classes, out_indices, counts);
 *
 * Semantics, per image b (equal to a per-image loop of score filter +
 * top-k + torchvision.ops.batched_nms, see python/mixprec/_efficient_nms.py):
 * - Candidates are the pairs (n, c) with scores[b, n, c] > score_threshold
 *   (strict, compared as float vs double like mixprec_nms; torchvision's
 *   postprocess_detections uses `scores > score_thresh` too). A NaN score is
 *   never a candidate, with or without a threshold.
 * - Order: decreasing score; equal scores by increasing flat index n * C + c
 *   (a stable sort of the flattened (N, C) scores). +0 == -0.
 * - pre_nms_top_k >= 1 keeps only the first that many candidates of that
 *   order (< 0: all of them).
 * - NMS walks that order: a candidate is kept unless a kept candidate of the
 *   same class (any class when class_agnostic) has IoU > iou_threshold with
 *   it, the IoU computed exactly as mixprec_nms does (float32, torchvision's
 *   operation order). The box of candidate (n, c) is boxes[b, n] for shared
 *   boxes (B, N, 4), boxes[b, n, c] for class-specific boxes (B, N, C, 4).
 *   Class-agnostic NMS runs over all (box, class) pairs, as EfficientNMS's
 *   class_agnostic does: a box's second class is suppressed by its first
 *   (IoU 1) unless iou_threshold >= 1.
 * - Outputs, per image, the first min(kept, max_detections) kept candidates
 *   in that order: out_boxes (B, K, 4) and out_scores (B, K) as the input
 *   values bit for bit in the input dtypes, out_classes (B, K) = c and
 *   out_indices (B, K) = n as int64, counts (B,) int64. Entries past counts[b]
 *   are padded: boxes and scores +0, classes and indices -1.
 */
#ifndef MIXPREC_EFFICIENT_NMS_H
#define MIXPREC_EFFICIENT_NMS_H

#include "mixprec/mixprec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Options of mixprec_efficient_nms. */
typedef struct mixprec_detect_params {
  double iou_threshold;    /* >= 0, not NaN; suppress when IoU > this */
  int use_score_threshold; /* nonzero: candidates need score > score_threshold */
  double score_threshold;  /* not NaN (used only when enabled) */
  int64_t pre_nms_top_k;   /* >= 1: candidates per image before NMS; < 0: all; 0 refused */
  int64_t max_detections;  /* K, 1 .. INT32_MAX: detections per image */
  int class_agnostic;      /* nonzero: one NMS over all classes */
} mixprec_detect_params;

/*! mixprec_detect_params_default() :
 *  @return : iou_threshold 0.5, no score threshold, no pre-NMS top-k,
 *            max_detections 100, class-aware. */
MIXPREC_API mixprec_detect_params mixprec_detect_params_default(void);

/*! mixprec_efficient_nms() :
 *  Batched post-processing of `batch` images on the CPU (semantics above).
 *  @param boxes       : batch * n * 4 (class_boxes 0) or batch * n * classes
 *                       * 4 (class_boxes nonzero) contiguous values of
 *                       boxes_dtype (x1, y1, x2, y2).
 *  @param scores      : batch * n * classes contiguous values of scores_dtype.
 *  @param out_boxes   : batch * K * 4 values of boxes_dtype.
 *  @param out_scores  : batch * K values of scores_dtype.
 *  @param out_classes, out_indices : batch * K int64 each.
 *  @param counts      : batch int64.
 *  Images run on parallel threads (OpenMP, up to mixprec_get_num_threads())
 *  when there are several, classes otherwise; the SIMD sweep of mixprec_nms;
 *  results do not depend on the thread count.
 *  @return : MIXPREC_OK; MIXPREC_ERR_NULL_POINTER; MIXPREC_ERR_BAD_SIZE for
 *            a negative batch/n/classes, n * classes > INT32_MAX or batch >
 *            INT32_MAX; MIXPREC_ERR_BAD_DTYPE; MIXPREC_ERR_BAD_ARGUMENT for a
 *            NaN or negative iou_threshold, a NaN score_threshold,
 *            pre_nms_top_k 0, max_detections outside 1 .. INT32_MAX;
 *            MIXPREC_ERR_OUT_OF_MEMORY (the one error after which the
 *            outputs may be partly written). Nothing is written on the
 *            other errors. */
MIXPREC_API mixprec_status mixprec_efficient_nms(
    const void *boxes, mixprec_dtype boxes_dtype, int class_boxes, const void *scores,
    mixprec_dtype scores_dtype, int64_t batch, int64_t n, int64_t classes,
    const mixprec_detect_params *p, void *out_boxes, void *out_scores, int64_t *out_classes,
    int64_t *out_indices, int64_t *counts);

/* How the boxes are coded (TensorRT EfficientNMS's box_coding). */
typedef enum mixprec_box_coding {
  MIXPREC_BOX_CORNER = 0, /* x1, y1, x2, y2 */
  MIXPREC_BOX_CENTER = 1  /* cx, cy, w, h: decoded per candidate in float32 as
                           * x1 = cx - w * 0.5f, x2 = cx + w * 0.5f (y alike),
                           * ultralytics' xywh2xyxy in float32 */
} mixprec_box_coding;

/* Where the values of mixprec_efficient_nms_strided() live, strides in
 * elements (>= 0). Box (b, n, c) coordinate e is boxes[b * box_strides[0] +
 * n * box_strides[1] + c * box_strides[2] + e * box_strides[3]] (class stride
 * 0: one box per n for all its classes); score (b, n, c) is scores[b *
 * score_strides[0] + n * score_strides[1] + c * score_strides[2]]. A YOLO
 * head (B, 4 + C, N), channels first, in one buffer P: boxes = P, strides
 * {(4 + C) * N, 1, 0, N}, scores = P + 4 * N, strides {(4 + C) * N, 1, N},
 * MIXPREC_BOX_CENTER. */
typedef struct mixprec_detect_layout {
  int64_t box_strides[4];   /* batch, n, class, coordinate */
  int64_t score_strides[3]; /* batch, n, class */
  int box_coding;           /* a mixprec_box_coding */
} mixprec_detect_layout;

/*! mixprec_detect_layout_contiguous() :
 *  @return : the layout of mixprec_efficient_nms()'s contiguous arguments:
 *            boxes (batch, n, 4) (class_boxes 0) or (batch, n, classes, 4),
 *            scores (batch, n, classes), corner coded. */
MIXPREC_API mixprec_detect_layout mixprec_detect_layout_contiguous(int64_t n, int64_t classes,
                                                                   int class_boxes);

/*! mixprec_efficient_nms_strided() :
 *  mixprec_efficient_nms() on boxes and scores laid out as `layout` says,
 *  read in place (no copy of either). With MIXPREC_BOX_CENTER the NMS and
 *  out_boxes use the decoded corners (out_boxes: those float32 corners
 *  rounded to boxes_dtype; a NaN coordinate gives NaN corners, their
 *  payload unspecified); with MIXPREC_BOX_CORNER out_boxes holds the input
 *  values bit for bit. Results equal mixprec_efficient_nms() on the
 *  same values stored contiguously (corner coded: after decoding).
 *  @return : as mixprec_efficient_nms(); MIXPREC_ERR_NULL_POINTER for a NULL
 *            layout; MIXPREC_ERR_BAD_ARGUMENT for a negative stride or an
 *            unknown box_coding; MIXPREC_ERR_BAD_SIZE when the byte offset
 *            of an element (as 4-byte elements) would exceed INT64_MAX. */
MIXPREC_API mixprec_status mixprec_efficient_nms_strided(
    const void *boxes, mixprec_dtype boxes_dtype, const void *scores, mixprec_dtype scores_dtype,
    const mixprec_detect_layout *layout, int64_t batch, int64_t n, int64_t classes,
    const mixprec_detect_params *p, void *out_boxes, void *out_scores, int64_t *out_classes,
    int64_t *out_indices, int64_t *counts);

/* ---- CUDA (libmixprec_cuda) ---------------------------------------------- */

/* Most candidates per image the CUDA path takes into its IoU bitmask:
 * min(n * classes, pre_nms_top_k) must not exceed it (EfficientNMS itself
 * keeps at most 4096). */
#define MIXPREC_CUDA_DETECT_MAX_CANDIDATES 16384

/*! mixprec_cuda_efficient_nms_workspace_size() :
 *  @return : bytes of device scratch mixprec_cuda_efficient_nms() needs, or
 *            -1 for arguments it refuses or a CUDA error while sizing the
 *            sort. Host-only. */
MIXPREC_API int64_t mixprec_cuda_efficient_nms_workspace_size(int64_t batch, int64_t n,
                                                              int64_t classes,
                                                              const mixprec_detect_params *p);

/*! mixprec_cuda_efficient_nms() :
 *  mixprec_efficient_nms() on the current device, the whole batch in one
 *  fixed set of launches on `stream` (a segmented radix sort of the batch's
 *  scores, one IoU-bitmask grid over all images, one reduction block per
 *  image). All pointers but p are device pointers; nothing is copied to the
 *  host and nothing synchronises, so it is capturable in a CUDA graph.
 *  CUDA: written to match the CPU bit for bit; not yet run on a GPU.
 *  @param workspace : mixprec_cuda_efficient_nms_workspace_size() bytes,
 *                     256-byte aligned.
 *  @return : as mixprec_efficient_nms(); MIXPREC_ERR_BAD_SIZE also when the
 *            candidate cap exceeds MIXPREC_CUDA_DETECT_MAX_CANDIDATES or
 *            batch * n * classes > INT32_MAX; MIXPREC_ERR_BAD_ARGUMENT for a
 *            small or misaligned workspace; MIXPREC_ERR_CUDA. */
MIXPREC_API mixprec_status mixprec_cuda_efficient_nms(
    const void *boxes, mixprec_dtype boxes_dtype, int class_boxes, const void *scores,
    mixprec_dtype scores_dtype, int64_t batch, int64_t n, int64_t classes,
    const mixprec_detect_params *p, void *out_boxes, void *out_scores, int64_t *out_classes,
    int64_t *out_indices, int64_t *counts, void *workspace, int64_t workspace_bytes,
    void *stream);

/*! mixprec_cuda_efficient_nms_strided() :
 *  mixprec_efficient_nms_strided() on the current device, with the
 *  workspace and stream of mixprec_cuda_efficient_nms().
 *  @return : as mixprec_cuda_efficient_nms() and
 *            mixprec_efficient_nms_strided(). */
MIXPREC_API mixprec_status mixprec_cuda_efficient_nms_strided(
    const void *boxes, mixprec_dtype boxes_dtype, const void *scores, mixprec_dtype scores_dtype,
    const mixprec_detect_layout *layout, int64_t batch, int64_t n, int64_t classes,
    const mixprec_detect_params *p, void *out_boxes, void *out_scores, int64_t *out_classes,
    int64_t *out_indices, int64_t *counts, void *workspace, int64_t workspace_bytes,
    void *stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MIXPREC_EFFICIENT_NMS_H */
