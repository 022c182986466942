/* What nms.c shares with the batched detection post-processing (efficient_nms.c):
 * the score order, the radix sort, the threshold rounding, and the greedy
 * NMS core over candidates already in output order, so both run one
 * implementation of the sweep (nms_avx2.c) and of torchvision's IoU rules. */
#ifndef MIXPREC_NMS_INTERNAL_H
#define MIXPREC_NMS_INTERNAL_H

#include "internal.h"
#include "nms_rules.h"

/* Stable LSD radix sort of m (key, value) pairs by ascending key. Result in
 * keys/vals; tk/tv are scratch of the same size. */
void mixprec__nms_radix_sort(uint32_t *keys, int32_t *vals, uint32_t *tk, int32_t *tv,
                             int64_t m);

/* The largest float f with f <= t (t not NaN): `float > t` <=> `> f`. */
float mixprec__nms_float_floor(double t);

/* Greedy NMS of m candidates given in output order (position r = 0 is the
 * highest score; ties already resolved by the caller). Candidate r's box is
 * row rows[r] of `boxes` (x1, y1, x2, y2 of boxes_dtype per row), its class
 * cls[r] (cls NULL: one class): a kept candidate suppresses the later ones
 * of its class with IoU > iou_thr (iou_thr from mixprec__nms_float_floor).
 * Sets flags[r] to 1 for each kept r, 0 for the others; each class stops
 * after max_keep kept boxes (< 0: no limit). Classes run on up to
 * max_threads OpenMP threads when they hold enough work; the result does
 * not depend on it. Returns MIXPREC_OK or MIXPREC_ERR_OUT_OF_MEMORY (flags
 * then unspecified). */
mixprec_status mixprec__nms_sorted(const void *boxes, mixprec_dtype boxes_dtype,
                                   const int32_t *rows, const int64_t *cls, int64_t m,
                                   float iou_thr, int64_t max_keep, int max_threads,
                                   uint8_t *flags);

/* Sweep of candidates [begin, end) by the kept box b (x1, y1, x2, y2, area):
 * sets dead[j] = -1 for every live j with IoU(b, j) > thr; returns how many
 * it newly killed. The scalar sweep, which the AVX2 one (nms_avx2.c) runs on
 * its last < 8 candidates and matches bit for bit on the others. */
MIXPREC__FORCE_INLINE int64_t mixprec__nms_sweep_scalar(const float *x1, const float *y1,
                                                        const float *x2, const float *y2,
                                                        const float *area, int32_t *dead,
                                                        int64_t begin, int64_t end,
                                                        const float b[5], float thr) {
  int64_t killed = 0;
  for (int64_t j = begin; j < end; j++) {
    if (dead[j]) continue;
    if (mixprec__nms_suppresses(b[0], b[1], b[2], b[3], b[4], x1[j], y1[j], x2[j], y2[j],
                                area[j], thr)) {
      dead[j] = -1;
      killed++;
    }
  }
  return killed;
}

#if defined(MIXPREC_X86)
int64_t mixprec__nms_sweep_avx2(const float *x1, const float *y1, const float *x2,
                                const float *y2, const float *area, int32_t *dead,
                                int64_t begin, int64_t end, const float b[5], float thr);
#endif

#endif /* MIXPREC_NMS_INTERNAL_H */
