/* What the RoIAlign kernels of the CPU (roi_align.c) and of CUDA
 * (kernels/roi_align.cu) share: a roi's geometry, one sample's bilinear
 * corners and weights, and the per-pixel gather of the backward pass, in
 * torchvision's float operations and order. Compiled as device code under
 * nvcc (every float operation through a _rn intrinsic, so nothing is
 * contracted into an FMA) and as plain C elsewhere (c_ops builds with
 * -ffp-contract=off). The includer provides mixprec__load_f32 (element.h,
 * through internal.h on the CPU and common.cuh on the GPU).
 * Internal; every name starts with mixprec__. */
#ifndef MIXPREC_ROI_ALIGN_INTERNAL_H
#define MIXPREC_ROI_ALIGN_INTERNAL_H

#include <stdint.h>

#include "compiler.h"
#include "mixprec/roi_align.h"

#ifdef __CUDACC__
#  define MIXPREC__ROI_FN MIXPREC__DEVICE
#  define MIXPREC__RA(a, b) __fadd_rn((a), (b))
#  define MIXPREC__RS(a, b) __fsub_rn((a), (b))
#  define MIXPREC__RM(a, b) __fmul_rn((a), (b))
#  define MIXPREC__RD(a, b) __fdiv_rn((a), (b))
#else
#  define MIXPREC__ROI_FN MIXPREC__FORCE_INLINE
#  define MIXPREC__RA(a, b) ((a) + (b))
#  define MIXPREC__RS(a, b) ((a) - (b))
#  define MIXPREC__RM(a, b) ((a) * (b))
#  define MIXPREC__RD(a, b) ((a) / (b))
#endif

/* NaN and inf fail (x - x is NaN for both). */
MIXPREC__ROI_FN int mixprec__roi_finite(float x) { return MIXPREC__RS(x, x) == 0.0f; }

/* One roi, as torchvision's kernels derive it. */
typedef struct mixprec__roi {
  int64_t batch;           /* truncated index; -1 when not an image */
  int finite;              /* every coordinate finite */
  float start_h, start_w;  /* roi_start_h / roi_start_w */
  float bin_h, bin_w;      /* bin_size_h / bin_size_w */
  int64_t grid_h, grid_w;  /* roi_bin_grid_h / _w (may be <= 0: no samples) */
  float count;             /* max(grid_h * grid_w, 1), as torchvision's forward */
  float count_bwd;         /* grid_h * grid_w, as torchvision's backward */
} mixprec__roi;

/* ceil(size / pooled) as an int, like torchvision's (int)ceil(); clamped
 * into the int32 range where torchvision's conversion would be undefined. */
MIXPREC__ROI_FN int64_t mixprec__roi_grid(float size, int64_t pooled) {
  float q = MIXPREC__RD(size, (float)pooled);
#ifdef __CUDACC__
  q = ceilf(q);
#else
  q = __builtin_ceilf(q);
#endif
  if (!(q > -2147483648.0f)) return q == q ? (int64_t)-2147483647 - 1 : 0;
  if (q >= 2147483647.0f) return 2147483647;
  return (int64_t)q;
}

MIXPREC__ROI_FN mixprec__roi mixprec__roi_make(const void *rois, mixprec_dtype rd, int64_t k,
                                               int64_t batch, const mixprec_roi_align_params *p,
                                               float scale) {
  mixprec__roi r;
  const float b = mixprec__load_f32(rois, rd, k * 5);
  r.batch = (b > -1.0f && (double)b < (double)batch) ? (int64_t)b : -1;
  const float x1 = mixprec__load_f32(rois, rd, k * 5 + 1);
  const float y1 = mixprec__load_f32(rois, rd, k * 5 + 2);
  const float x2 = mixprec__load_f32(rois, rd, k * 5 + 3);
  const float y2 = mixprec__load_f32(rois, rd, k * 5 + 4);
  r.finite = mixprec__roi_finite(x1) && mixprec__roi_finite(y1) && mixprec__roi_finite(x2) &&
             mixprec__roi_finite(y2);
  const float offset = p->aligned ? 0.5f : 0.0f;
  r.start_w = MIXPREC__RS(MIXPREC__RM(x1, scale), offset);
  r.start_h = MIXPREC__RS(MIXPREC__RM(y1, scale), offset);
  const float end_w = MIXPREC__RS(MIXPREC__RM(x2, scale), offset);
  const float end_h = MIXPREC__RS(MIXPREC__RM(y2, scale), offset);
  float roi_w = MIXPREC__RS(end_w, r.start_w);
  float roi_h = MIXPREC__RS(end_h, r.start_h);
  if (!p->aligned) {
    /* std::max(v, 1.f): 1 unless 1 < v is false... i.e. (v < 1) ? 1 : v */
    roi_w = roi_w < 1.0f ? 1.0f : roi_w;
    roi_h = roi_h < 1.0f ? 1.0f : roi_h;
  }
  r.bin_h = MIXPREC__RD(roi_h, (float)p->pooled_height);
  r.bin_w = MIXPREC__RD(roi_w, (float)p->pooled_width);
  r.grid_h = p->sampling_ratio > 0 ? p->sampling_ratio : mixprec__roi_grid(roi_h, p->pooled_height);
  r.grid_w = p->sampling_ratio > 0 ? p->sampling_ratio : mixprec__roi_grid(roi_w, p->pooled_width);
  if (!r.finite) r.grid_h = r.grid_w = 0;
  /* torchvision multiplies ints; int64 here never overflows */
  const int64_t prod = r.grid_h * r.grid_w;
  r.count = (float)(prod > 1 ? prod : 1);
  r.count_bwd = (float)prod;
  return r;
}

/* Sample iy of bin ph: roi_start + ph * bin + (iy + .5f) * bin / grid. */
MIXPREC__ROI_FN float mixprec__roi_coord(float start, int64_t ph, float bin, int64_t iy,
                                         int64_t grid) {
  const float a = MIXPREC__RA(start, MIXPREC__RM((float)ph, bin));
  const float frac = MIXPREC__RD(MIXPREC__RM((float)iy + 0.5f, bin), (float)grid);
  return MIXPREC__RA(a, frac);
}

/* One axis of one sample: corners lo/hi and weights l (of hi) and h (of lo);
 * ok = 0 when the coordinate is outside [-1, size] or NaN. */
typedef struct mixprec__roi_axis {
  int64_t lo, hi;
  float l, h;
  int ok;
} mixprec__roi_axis;

MIXPREC__ROI_FN mixprec__roi_axis mixprec__roi_axis_at(float y, int64_t size) {
  mixprec__roi_axis a;
  a.ok = y >= -1.0f && y <= (float)size;
  if (!a.ok) {
    a.lo = a.hi = 0;
    a.l = a.h = 0.0f;
    return a;
  }
  if (y <= 0.0f) y = 0.0f;
  a.lo = (int64_t)y;
  if (a.lo >= size - 1) {
    a.hi = a.lo = size - 1;
    y = (float)a.lo;
  } else {
    a.hi = a.lo + 1;
  }
  a.l = MIXPREC__RS(y, (float)a.lo);
  a.h = MIXPREC__RS(1.0f, a.l);
  return a;
}

/* One sample of a roi: the four pixel offsets in the channel plane and the
 * four weights (w1 = hy * hx, ...), exactly torchvision's PreCalc entry; a
 * sample outside the map has offsets 0 and weights 0. The CPU builds a table
 * of them per roi ((ph, pw, iy, ix) order, shared by the roi's channels), the
 * CUDA forward one at a time. */
typedef struct mixprec__roi_pc {
  int64_t p1, p2, p3, p4;
  float w1, w2, w3, w4;
} mixprec__roi_pc;

MIXPREC__ROI_FN mixprec__roi_pc mixprec__roi_pc_at(mixprec__roi_axis ay, mixprec__roi_axis ax,
                                                   int64_t W) {
  mixprec__roi_pc e = {0, 0, 0, 0, 0.0f, 0.0f, 0.0f, 0.0f};
  if (ay.ok && ax.ok) {
    e.w1 = MIXPREC__RM(ay.h, ax.h);
    e.w2 = MIXPREC__RM(ay.h, ax.l);
    e.w3 = MIXPREC__RM(ay.l, ax.h);
    e.w4 = MIXPREC__RM(ay.l, ax.l);
    e.p1 = ay.lo * W + ax.lo;
    e.p2 = ay.lo * W + ax.hi;
    e.p3 = ay.hi * W + ax.lo;
    e.p4 = ay.hi * W + ax.hi;
  }
  return e;
}

/* The bilinear value of one sample of the plane at element offset `base`:
 * w1 * v1 + w2 * v2 + w3 * v3 + w4 * v4, left to right, as torchvision. */
MIXPREC__ROI_FN float mixprec__roi_sample(const mixprec__roi_pc *e, const void *in,
                                          mixprec_dtype dt, int64_t base) {
  float s = MIXPREC__RM(e->w1, mixprec__load_f32(in, dt, base + e->p1));
  s = MIXPREC__RA(s, MIXPREC__RM(e->w2, mixprec__load_f32(in, dt, base + e->p2)));
  s = MIXPREC__RA(s, MIXPREC__RM(e->w3, mixprec__load_f32(in, dt, base + e->p3)));
  return MIXPREC__RA(s, MIXPREC__RM(e->w4, mixprec__load_f32(in, dt, base + e->p4)));
}

/* One corner's share of a bin's gradient g: g * w / count, as torchvision's
 * backward (the CPU scatter and the CUDA gather both add exactly this). */
MIXPREC__ROI_FN float mixprec__roi_grad_share(float g, float w, float count) {
  return MIXPREC__RD(MIXPREC__RM(g, w), count);
}

/* The raw coordinate where bin ph starts. */
MIXPREC__ROI_FN float mixprec__roi_bin_lo(float start, int64_t ph, float bin) {
  return MIXPREC__RA(start, MIXPREC__RM((float)ph, bin));
}

/* The contribution of one roi to grad_input pixel (py, px) of nc channels
 * (at most MIXPREC__ROI_GATHER_C), added to acc[0..nc) in torchvision's
 * scatter order (bin ph, pw, sample iy, ix, corners 1..4), so that a gather
 * over the rois in order gives the scatter's float sums bit for bit.
 * g(channel cc, ph, pw) is read at element offset
 * goff + cc * sc + ph * sh + pw * sw of grad. */
#define MIXPREC__ROI_GATHER_C 8

MIXPREC__ROI_FN void mixprec__roi_add(float *acc, int nc, const float *g, float w, float count) {
  for (int cc = 0; cc < MIXPREC__ROI_GATHER_C; cc++)
    if (cc < nc) acc[cc] = MIXPREC__RA(acc[cc], mixprec__roi_grad_share(g[cc], w, count));
}

/* Could a sample with raw coordinate in [a, b] (either order) touch a pixel
 * of [q0, q1] on an axis of `size` pixels? A conservative test (never says
 * no when the exact one says yes): clamped samples lie in the clamped
 * interval, and a sample at y touches floor(y) and floor(y) + 1. */
MIXPREC__ROI_FN int mixprec__roi_may_touch_range(double a, double b, int64_t q0, int64_t q1,
                                                 int64_t size) {
  if (a > b) {
    const double t = a;
    a = b;
    b = t;
  }
  const double m = 1e-4 * (1.0 + (a < 0 ? -a : a) + (b < 0 ? -b : b));
  a -= m;
  b += m;
  if (b < -1.0 || a > (double)size) return 0;
  if (a < 0.0) a = 0.0;
  if (b > (double)(size - 1)) b = (double)(size - 1);
  if (a > b) a = b;
  return (double)q1 >= a - 1.0 && (double)q0 <= b + 1.0;
}

/* The same for the one pixel q. */
MIXPREC__ROI_FN int mixprec__roi_may_touch(double a, double b, int64_t q, int64_t size) {
  return mixprec__roi_may_touch_range(a, b, q, q, size);
}

MIXPREC__ROI_FN void mixprec__roi_gather(const mixprec__roi *r, const void *grad,
                                         mixprec_dtype gd, int64_t goff, int64_t sc, int nc,
                                         int64_t sh, int64_t sw, int64_t ph_n, int64_t pw_n,
                                         int64_t H, int64_t W, int64_t py, int64_t px,
                                         float *acc) {
  if (r->grid_h <= 0 || r->grid_w <= 0) return;
  const double rh = (double)r->bin_h * (double)ph_n, rw = (double)r->bin_w * (double)pw_n;
  if (!mixprec__roi_may_touch(r->start_h, (double)r->start_h + rh, py, H) ||
      !mixprec__roi_may_touch(r->start_w, (double)r->start_w + rw, px, W))
    return;
  float g[MIXPREC__ROI_GATHER_C];
  for (int64_t ph = 0; ph < ph_n; ph++) {
    const double ylo = mixprec__roi_bin_lo(r->start_h, ph, r->bin_h);
    if (!mixprec__roi_may_touch(ylo, ylo + (double)r->bin_h, py, H)) continue;
    for (int64_t pw = 0; pw < pw_n; pw++) {
      const double xlo = mixprec__roi_bin_lo(r->start_w, pw, r->bin_w);
      if (!mixprec__roi_may_touch(xlo, xlo + (double)r->bin_w, px, W)) continue;
      int loaded = 0;
      for (int64_t iy = 0; iy < r->grid_h; iy++) {
        const mixprec__roi_axis ay =
            mixprec__roi_axis_at(mixprec__roi_coord(r->start_h, ph, r->bin_h, iy, r->grid_h), H);
        if (!ay.ok || (ay.lo != py && ay.hi != py)) continue;
        for (int64_t ix = 0; ix < r->grid_w; ix++) {
          const mixprec__roi_axis ax = mixprec__roi_axis_at(
              mixprec__roi_coord(r->start_w, pw, r->bin_w, ix, r->grid_w), W);
          if (!ax.ok || (ax.lo != px && ax.hi != px)) continue;
          if (!loaded) {
            for (int cc = 0; cc < MIXPREC__ROI_GATHER_C; cc++)
              g[cc] = cc < nc ? mixprec__load_f32(grad, gd, goff + cc * sc + ph * sh + pw * sw)
                              : 0.0f;
            loaded = 1;
          }
          if (ay.lo == py && ax.lo == px) mixprec__roi_add(acc, nc, g, MIXPREC__RM(ay.h, ax.h), r->count_bwd);
          if (ay.lo == py && ax.hi == px) mixprec__roi_add(acc, nc, g, MIXPREC__RM(ay.h, ax.l), r->count_bwd);
          if (ay.hi == py && ax.lo == px) mixprec__roi_add(acc, nc, g, MIXPREC__RM(ay.l, ax.h), r->count_bwd);
          if (ay.hi == py && ax.hi == px) mixprec__roi_add(acc, nc, g, MIXPREC__RM(ay.l, ax.l), r->count_bwd);
        }
      }
    }
  }
}

#ifndef __CUDACC__
/* ---- CPU forward ---------------------------------------------------------- */

/* The forward of channels [c0, c1) of roi k (r->batch valid) from its
 * table, output values rounded to od. The AVX2 path (roi_align_avx2.c)
 * gives the same bits, 8 channels per vector. */
typedef void (*mixprec__roi_fwd_fn)(const void *in, mixprec_dtype dt, int64_t C, int64_t plane,
                                    int64_t total_planes, const mixprec__roi *r, int64_t k,
                                    int64_t c0, int64_t c1, int64_t bins, int64_t samples,
                                    const mixprec__roi_pc *pc, void *out, mixprec_dtype od);
void mixprec__roi_fwd_scalar(const void *in, mixprec_dtype dt, int64_t C, int64_t plane,
                             int64_t total_planes, const mixprec__roi *r, int64_t k, int64_t c0,
                             int64_t c1, int64_t bins, int64_t samples, const mixprec__roi_pc *pc,
                             void *out, mixprec_dtype od);
#if defined(MIXPREC_X86)
void mixprec__roi_fwd_avx2(const void *in, mixprec_dtype dt, int64_t C, int64_t plane,
                           int64_t total_planes, const mixprec__roi *r, int64_t k, int64_t c0,
                           int64_t c1, int64_t bins, int64_t samples, const mixprec__roi_pc *pc,
                           void *out, mixprec_dtype od);
#endif
#endif /* !__CUDACC__ */

#endif /* MIXPREC_ROI_ALIGN_INTERNAL_H */
