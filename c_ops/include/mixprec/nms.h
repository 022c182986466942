/* mixprec C API: Non-maximum suppression. Included by mixprec/mixprec.h.
 *
 * Greedy NMS with torchvision.ops.nms's semantics, the IoU always computed
 * in float (FP32) whatever the storage dtype of the boxes, and a class-aware
 * variant that never shifts coordinates.
 *
 *     float boxes[3][4] = {{0, 0, 10, 10}, {1, 1, 11, 11}, {50, 50, 60, 60}};
 *     float scores[3] = {0.9f, 0.8f, 0.7f};
 *     int64_t keep[3], n_keep;
 *     mixprec_nms_params p = mixprec_nms_params_default();   // IoU > 0.5
 *     mixprec_nms(boxes, MIXPREC_F32, scores, MIXPREC_F32, 3, &p, keep, &n_keep);
 *     // n_keep == 2, keep == {0, 2, -1}
 *
 * Semantics (torchvision.ops.nms, boxes as x1, y1, x2, y2):
 * - Candidates are ordered by decreasing score with a stable sort: equal
 *   scores keep their input order (what torchvision's CPU kernel does with
 *   scores.sort(stable=True, descending=True)). +0 and -0 are equal; a NaN
 *   score ranks above every number, as in torch.sort (so a NaN-scored box is
 *   kept first), unless a score threshold is set (NaN > t is false: dropped).
 * - Walking that order, a box is kept unless an already kept box (of the same
 *   class, for the batched variant) overlaps it with IoU > iou_threshold
 *   (strict), where, in float with torchvision's operation order:
 *     area(b) = (x2 - x1) * (y2 - y1)                (no +1)
 *     w = max(0, min(x2a, x2b) - max(x1a, x1b)), h likewise, inter = w * h
 *     IoU = inter / (area(a) + area(b) - inter)
 *   and `IoU > iou_threshold` is decided exactly as float-vs-double (as
 *   torchvision compares its float IoU with the double threshold). max/min
 *   follow std::max/std::min, so even NaN coordinates give torchvision's
 *   decisions. Two zero-area boxes have IoU 0/0 = NaN: never suppressed.
 *   For float32 boxes the result is identical to torchvision.ops.nms on the
 *   CPU; float16/bfloat16 boxes are widened exactly to float first, so no
 *   area or intersection overflows (65504 is not a limit).
 * - keep[] receives the original indices of the kept boxes in decreasing
 *   score order (the same order), then -1 up to the capacity (see below).
 */
#ifndef MIXPREC_NMS_H
#define MIXPREC_NMS_H

#include "mixprec/mixprec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Integer dtype of the class ids of mixprec_batched_nms. */
typedef enum mixprec_index_dtype {
  MIXPREC_I64 = 0,
  MIXPREC_I32 = 1
} mixprec_index_dtype;

/* Options of the NMS entry points. */
typedef struct mixprec_nms_params {
  double iou_threshold;    /* >= 0 (NaN refused); suppress when IoU > this.
                              Above 1 nothing is suppressed. */
  int use_score_threshold; /* nonzero: only boxes with score > score_threshold
                              (compared in double) take part at all */
  double score_threshold;  /* any value but NaN (used only when enabled) */
  int64_t max_output;      /* < 0: no limit; else stop after this many kept
                              boxes (the first ones of the full result) */
} mixprec_nms_params;

/*! mixprec_nms_params_default() :
 *  @return : iou_threshold 0.5, no score threshold, no output limit. */
MIXPREC_API mixprec_nms_params mixprec_nms_params_default(void);

/*! mixprec_nms_capacity() :
 *  @return : entries keep[] must have for n boxes under p: n, or max_output
 *            if that is smaller and not negative (-1 for n < 0 or p NULL). */
MIXPREC_API int64_t mixprec_nms_capacity(int64_t n, const mixprec_nms_params *p);

/*! mixprec_nms() :
 *  Greedy NMS of n boxes (see the semantics above) on the CPU.
 *  @param boxes  : n * 4 contiguous values of boxes_dtype (x1, y1, x2, y2).
 *  @param scores : n contiguous values of scores_dtype (may differ from the
 *                  boxes' dtype).
 *  @param keep   : mixprec_nms_capacity(n, p) int64 entries: the kept
 *                  indices, then -1 in the unused entries (so it is also the
 *                  fixed-size "padded" result).
 *  @param n_keep : receives the number of kept boxes.
 *  Uses one thread; the SIMD path (AVX2) is chosen at run time and gives the
 *  same result as the scalar one.
 *  @return : MIXPREC_OK; MIXPREC_ERR_NULL_POINTER (boxes/scores may be NULL
 *            only when n == 0); MIXPREC_ERR_BAD_SIZE for n < 0 or
 *            n > INT32_MAX; MIXPREC_ERR_BAD_DTYPE; MIXPREC_ERR_BAD_ARGUMENT for
 *            a NaN or negative iou_threshold or a NaN score_threshold;
 *            MIXPREC_ERR_OUT_OF_MEMORY. Nothing is written on an error. */
MIXPREC_API mixprec_status mixprec_nms(const void *boxes, mixprec_dtype boxes_dtype,
                                       const void *scores, mixprec_dtype scores_dtype,
                                       int64_t n, const mixprec_nms_params *p,
                                       int64_t *keep, int64_t *n_keep);

/*! mixprec_batched_nms() :
 *  Class-aware NMS (torchvision.ops.batched_nms): as mixprec_nms(), but a
 *  box only suppresses boxes with the same class id (classes[i], any int64
 *  or int32 values). Coordinates are never offset by class, so the result is
 *  exact in every dtype and at any coordinate range: it equals running
 *  mixprec_nms() per class and merging the kept boxes by decreasing score
 *  (stable). max_output limits the merged result. Classes run in parallel
 *  (OpenMP, up to mixprec_get_num_threads()) when they hold enough work
 *  (about 4M box pairs); the result does not depend on the thread count.
 *  @return : as mixprec_nms(); MIXPREC_ERR_NULL_POINTER also for classes
 *            NULL with n > 0, MIXPREC_ERR_BAD_DTYPE for an unknown
 *            classes_dtype. */
MIXPREC_API mixprec_status mixprec_batched_nms(
    const void *boxes, mixprec_dtype boxes_dtype, const void *scores,
    mixprec_dtype scores_dtype, const void *classes, mixprec_index_dtype classes_dtype,
    int64_t n, const mixprec_nms_params *p, int64_t *keep, int64_t *n_keep);

/* ---- CUDA (libmixprec_cuda) ---------------------------------------------- */

/*! mixprec_cuda_nms_workspace_size() :
 *  @return : bytes of device scratch mixprec_cuda_nms() needs for n boxes
 *            (about n * n / 8 bytes for the IoU bitmask, plus the sort's),
 *            or -1 for n < 0, n > INT32_MAX or a CUDA error while sizing
 *            the sort. Host-only. */
MIXPREC_API int64_t mixprec_cuda_nms_workspace_size(int64_t n);

/*! mixprec_cuda_nms() :
 *  mixprec_nms() / mixprec_batched_nms() (classes NULL: one class) on the
 *  current device: boxes, scores, classes, keep and n_keep (one int64) are
 *  device pointers; p stays on the host. The IoU test is the CPU's
 *  (nms_rules.h); CUDA: written to match the CPU bit for bit, not yet run
 *  on a GPU. Scores are sorted
 *  on the device (CUB radix sort, stable); the IoU bitmask is built in 64x64
 *  tiles and reduced by one block on the device: nothing is copied to the
 *  host and nothing synchronises, so the call is capturable in a CUDA graph
 *  (keep is padded with -1 up to mixprec_nms_capacity()). Reading *n_keep
 *  on the host is the caller's one synchronisation, if it needs it (see
 *  mixprec_cuda_nms_read_count()).
 *  @param workspace : at least mixprec_cuda_nms_workspace_size(n) bytes,
 *                     256-byte aligned (torch's allocator gives 512).
 *  @return : as mixprec_batched_nms(); MIXPREC_ERR_BAD_ARGUMENT also for a
 *            too small or misaligned workspace or misaligned data;
 *            MIXPREC_ERR_BAD_SIZE also above 4,194,240 boxes (the tile
 *            grid's limit; the mask would need 2 TB anyway);
 *            MIXPREC_ERR_CUDA if a launch failed. */
MIXPREC_API mixprec_status mixprec_cuda_nms(
    const void *boxes, mixprec_dtype boxes_dtype, const void *scores,
    mixprec_dtype scores_dtype, const void *classes, mixprec_index_dtype classes_dtype,
    int64_t n, const mixprec_nms_params *p, int64_t *keep, int64_t *n_keep,
    void *workspace, int64_t workspace_bytes, void *stream);

/*! mixprec_cuda_nms_read_count() :
 *  Copies the device int64 at d_count to *h_count after the work queued on
 *  `stream` so far: the one host synchronisation of an NMS whose output
 *  size depends on the data. Not capturable in a CUDA graph.
 *  @return : MIXPREC_ERR_NULL_POINTER, MIXPREC_ERR_CUDA. */
MIXPREC_API mixprec_status mixprec_cuda_nms_read_count(const int64_t *d_count,
                                                       int64_t *h_count, void *stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MIXPREC_NMS_H */
