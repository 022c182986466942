/* The NMS family's rules, written once for every path: the scalar sweep and
 * the SIMD tail of nms.c / nms_avx2.c (and through them efficient_nms.c),
 * and the CUDA kernels (kernels/nms.cuh, nms.cu, efficient_nms.cu). The SIMD
 * bodies vectorise these same operations in the same order (see
 * nms_avx2.c). Every name starts with mixprec__; internal, not installed.
 *
 * [note: torchvision's IoU] area = (x2 - x1) * (y2 - y1); intersection
 * xx1 = max(k.x1, c.x1), ..., w = max(0, xx2 - xx1), h likewise,
 * inter = w * h, IoU = inter / (area_k + area_c - inter), with max/min
 * as std::max/std::min (NaN cases included: tv_max(a, b) = a < b ? b : a)
 * and k the kept box, c the candidate, in float32 without FMA: the device
 * uses _rn intrinsics, the C files build with -ffp-contract=off. A candidate
 * is suppressed when IoU > thr, thr the largest float not above the double
 * threshold, which reproduces torchvision's `float_iou > double_thr`. */
#ifndef MIXPREC_NMS_RULES_H
#define MIXPREC_NMS_RULES_H

#include <stdint.h>
#include <string.h>

#include "compiler.h"

#ifdef __CUDA_ARCH__
#  define MIXPREC__NMS_ADD(a, b) __fadd_rn((a), (b))
#  define MIXPREC__NMS_SUB(a, b) __fsub_rn((a), (b))
#  define MIXPREC__NMS_MUL(a, b) __fmul_rn((a), (b))
#  define MIXPREC__NMS_DIV(a, b) __fdiv_rn((a), (b))
#else
#  define MIXPREC__NMS_ADD(a, b) ((a) + (b))
#  define MIXPREC__NMS_SUB(a, b) ((a) - (b))
#  define MIXPREC__NMS_MUL(a, b) ((a) * (b))
#  define MIXPREC__NMS_DIV(a, b) ((a) / (b))
#endif

/* std::max / std::min of torchvision's kernel, NaN cases included. */
MIXPREC__HD float mixprec__tv_max(float a, float b) { return a < b ? b : a; }
MIXPREC__HD float mixprec__tv_min(float a, float b) { return b < a ? b : a; }

/* A box's area, [note: torchvision's IoU]. */
MIXPREC__HD float mixprec__nms_area(float x1, float y1, float x2, float y2) {
  return MIXPREC__NMS_MUL(MIXPREC__NMS_SUB(x2, x1), MIXPREC__NMS_SUB(y2, y1));
}

/* Does the kept box k suppress the candidate c ([note: torchvision's IoU])?
 * An intersection of 0 (or NaN) gives IoU +-0 or NaN, never > thr >= 0, so
 * the GPU skips the division, the costly part there, for the many pairs that
 * do not intersect: the decision is the division's either way. The CPU
 * always divides: in dense scenes the skip is an unpredictable branch, which
 * made a whole efficient_nms call (2x8400x80, 2026-12-06) 12% slower on the
 * scalar path and 5% on AVX2 (whose sweep runs this test on its tails) than
 * the branch-free division. */
MIXPREC__HD int mixprec__nms_suppresses(float kx1, float ky1, float kx2, float ky2,
                                        float karea, float cx1, float cy1, float cx2,
                                        float cy2, float carea, float thr) {
  const float xx1 = mixprec__tv_max(kx1, cx1), yy1 = mixprec__tv_max(ky1, cy1);
  const float xx2 = mixprec__tv_min(kx2, cx2), yy2 = mixprec__tv_min(ky2, cy2);
  const float w = mixprec__tv_max(0.0f, MIXPREC__NMS_SUB(xx2, xx1));
  const float h = mixprec__tv_max(0.0f, MIXPREC__NMS_SUB(yy2, yy1));
  const float inter = MIXPREC__NMS_MUL(w, h);
#ifdef __CUDA_ARCH__
  if (!(inter > 0.0f)) return 0;
#endif
  const float uni = MIXPREC__NMS_SUB(MIXPREC__NMS_ADD(karea, carea), inter);
  return MIXPREC__NMS_DIV(inter, uni) > thr;
}

/* A box's corners from its stored coordinates v[0..3] (mixprec_box_coding):
 * as stored for corner coding; for centre coding ultralytics' xywh2xyxy in
 * float32 (w * 0.5f is w / 2 exactly). */
MIXPREC__HD void mixprec__box_corners(int center, const float v[4], float out[4]) {
  if (!center) {
    out[0] = v[0], out[1] = v[1], out[2] = v[2], out[3] = v[3];
    return;
  }
  const float hw = MIXPREC__NMS_MUL(v[2], 0.5f), hh = MIXPREC__NMS_MUL(v[3], 0.5f);
  out[0] = MIXPREC__NMS_SUB(v[0], hw);
  out[1] = MIXPREC__NMS_SUB(v[1], hh);
  out[2] = MIXPREC__NMS_ADD(v[0], hw);
  out[3] = MIXPREC__NMS_ADD(v[1], hh);
}

/* Sort key of a score: larger key = earlier in the output. NaN above +inf
 * (torch.sort's order), -0 equal to +0. Every real key is >= 0x007fffff, so
 * the CUDA kernels use 0 for "no candidate"; the CPU sorts ~key ascending. */
MIXPREC__HD uint32_t mixprec__nms_score_key(float s) {
  uint32_t u;
  memcpy(&u, &s, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0xffffffffu;
  if ((u & 0x7fffffffu) == 0) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

#endif /* MIXPREC_NMS_RULES_H */
