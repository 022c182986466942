/* RoIAlign forward and backward on the CPU: torchvision's float operations
 * in torchvision's order (roi_align_internal.h), FP32 accumulation for every
 * dtype, OpenMP over (roi, channel block) forward and (image, channel block)
 * backward. Each output element is computed by one thread, so results never
 * depend on the thread count.
 *
 * Per roi, the row and column positions (pooled_h * grid_h, pooled_w *
 * grid_w) are computed once and combined into torchvision's table of
 * pre-computed samples (offsets and weights, w1 = hy * hx, ...), shared by
 * the roi's channels in both passes. The forward's AVX2 path
 * (roi_align_avx2.c) runs 8 channels per vector with the same bits. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "roi_align_check.h"
#include "roi_align_internal.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Channels per work item: enough to amortise the roi's tables, small enough
 * to spread a few rois over the threads. */
#define ROI_CB 16
/* Below this many output elements (times samples) one thread is faster. */
#define ROI_PARALLEL_MIN 32768

mixprec_roi_align_params mixprec_roi_align_params_default(int64_t pooled_height,
                                                          int64_t pooled_width) {
  mixprec_roi_align_params p;
  p.pooled_height = pooled_height;
  p.pooled_width = pooled_width;
  p.spatial_scale = 1.0;
  p.sampling_ratio = -1;
  p.aligned = 0;
  return p;
}

mixprec_status mixprec_roi_align_first_bad_roi(const void *rois, mixprec_dtype rois_dtype,
                                               int64_t n_rois, int64_t batch,
                                               int64_t *first_bad) {
  if (!first_bad) return MIXPREC_ERR_NULL_POINTER;
  if (n_rois < 0 || batch < 0) return MIXPREC_ERR_BAD_SIZE;
  if (mixprec_dtype_size(rois_dtype) == 0) return MIXPREC_ERR_BAD_DTYPE;
  if (n_rois > 0 && !rois) return MIXPREC_ERR_NULL_POINTER;
  *first_bad = -1;
  for (int64_t k = 0; k < n_rois; k++) {
    const float b = mixprec__load_f32(rois, rois_dtype, k * 5);
    if (!(b > -1.0f && (double)b < (double)batch)) {
      *first_bad = k;
      break;
    }
  }
  return MIXPREC_OK;
}

/* The largest row / column table any roi needs (entries). */
static void table_sizes(const void *rois, mixprec_dtype rd, int64_t n_rois, int64_t batch,
                        const mixprec_roi_align_params *p, float scale, int64_t *rows,
                        int64_t *cols) {
  *rows = *cols = 1;
  for (int64_t k = 0; k < n_rois; k++) {
    const mixprec__roi r = mixprec__roi_make(rois, rd, k, batch, p, scale);
    if (r.grid_h > 0 && r.grid_h * p->pooled_height > *rows) *rows = r.grid_h * p->pooled_height;
    if (r.grid_w > 0 && r.grid_w * p->pooled_width > *cols) *cols = r.grid_w * p->pooled_width;
  }
}

static void fill_tables(const mixprec__roi *r, const mixprec_roi_align_params *p, int64_t H,
                        int64_t W, mixprec__roi_axis *ty, mixprec__roi_axis *tx) {
  for (int64_t ph = 0; ph < p->pooled_height; ph++)
    for (int64_t iy = 0; iy < r->grid_h; iy++)
      ty[ph * r->grid_h + iy] =
          mixprec__roi_axis_at(mixprec__roi_coord(r->start_h, ph, r->bin_h, iy, r->grid_h), H);
  for (int64_t pw = 0; pw < p->pooled_width; pw++)
    for (int64_t ix = 0; ix < r->grid_w; ix++)
      tx[pw * r->grid_w + ix] =
          mixprec__roi_axis_at(mixprec__roi_coord(r->start_w, pw, r->bin_w, ix, r->grid_w), W);
}

/* ---- forward ------------------------------------------------------------ */

/* torchvision's pre_calc_for_bilinear_interpolate from the row and column
 * tables: the same weights (hy * hx, ...) and offsets. */
static void fill_pc(const mixprec__roi *r, const mixprec_roi_align_params *p, int64_t W,
                    const mixprec__roi_axis *ty, const mixprec__roi_axis *tx,
                    mixprec__roi_pc *pc) {
  int64_t i = 0;
  for (int64_t ph = 0; ph < p->pooled_height; ph++)
    for (int64_t pw = 0; pw < p->pooled_width; pw++)
      for (int64_t iy = 0; iy < r->grid_h; iy++) {
        const mixprec__roi_axis ay = ty[ph * r->grid_h + iy];
        for (int64_t ix = 0; ix < r->grid_w; ix++, i++)
          pc[i] = mixprec__roi_pc_at(ay, tx[pw * r->grid_w + ix], W);
      }
}

MIXPREC__FORCE_INLINE void fwd_channels(const void *in, mixprec_dtype dt, int64_t C,
                                        int64_t plane, const mixprec__roi *r, int64_t k,
                                        int64_t c0, int64_t c1, int64_t bins, int64_t samples,
                                        const mixprec__roi_pc *pc, void *out, mixprec_dtype od) {
  for (int64_t c = c0; c < c1; c++) {
    const int64_t base = (r->batch * C + c) * plane;
    const int64_t obase = (k * C + c) * bins;
    const mixprec__roi_pc *e = pc;
    for (int64_t b = 0; b < bins; b++) {
      float val = 0.0f;
      for (int64_t s = 0; s < samples; s++, e++) val += mixprec__roi_sample(e, in, dt, base);
      val /= r->count;
      mixprec__store_f32(out, od, obase + b, val);
    }
  }
}

/* One copy of the loop per input dtype, so the load's switch is resolved
 * outside it. */
void mixprec__roi_fwd_scalar(const void *in, mixprec_dtype dt, int64_t C, int64_t plane,
                             int64_t total_planes, const mixprec__roi *r, int64_t k, int64_t c0,
                             int64_t c1, int64_t bins, int64_t samples, const mixprec__roi_pc *pc,
                             void *out, mixprec_dtype od) {
  (void)total_planes;
  MIXPREC__DISPATCH(dt, D, fwd_channels(in, D, C, plane, r, k, c0, c1, bins, samples, pc, out, od));
}

static int threads_for(int64_t work) {
  return work < ROI_PARALLEL_MIN ? 1 : mixprec__num_threads();
}

static int thread_id(void) {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

mixprec_status mixprec_roi_align(const void *input, mixprec_dtype input_dtype, int64_t batch,
                                 int64_t channels, int64_t height, int64_t width,
                                 const void *rois, mixprec_dtype rois_dtype, int64_t n_rois,
                                 const mixprec_roi_align_params *p, void *output,
                                 mixprec_dtype output_dtype) {
  int64_t in_numel, out_numel;
  mixprec_status st = mixprec__roi_align_forward_check(input, input_dtype, batch, channels, height,
                                                       width, rois, rois_dtype, n_rois, p, output,
                                                       output_dtype, &in_numel, &out_numel);
  if (st != MIXPREC_OK || out_numel == 0) return st;
  int64_t bad;
  st = mixprec_roi_align_first_bad_roi(rois, rois_dtype, n_rois, batch, &bad);
  if (st != MIXPREC_OK) return st;
  if (bad >= 0) return MIXPREC_ERR_BAD_ARGUMENT;
  const float scale = (float)p->spatial_scale;
  int64_t rows, cols;
  table_sizes(rois, rois_dtype, n_rois, batch, p, scale, &rows, &cols);
  /* the largest sample table: (pooled_h * grid_h) * (pooled_w * grid_w) */
  if (rows > 0 && cols > INT64_MAX / rows) return MIXPREC_ERR_OUT_OF_MEMORY;
  const int64_t pcs = rows * cols;
  const int64_t n_cb = (channels + ROI_CB - 1) / ROI_CB;
  const int64_t items = n_rois * n_cb;
  const int n_threads = threads_for(out_numel * 4);
  const size_t per = (size_t)(rows + cols) * sizeof(mixprec__roi_axis) +
                     (size_t)pcs * sizeof(mixprec__roi_pc);
  if ((size_t)pcs > SIZE_MAX / 64 || per > SIZE_MAX / (size_t)n_threads)
    return MIXPREC_ERR_OUT_OF_MEMORY;
  char *scratch = (char *)malloc(per * (size_t)n_threads);
  if (!scratch) return MIXPREC_ERR_OUT_OF_MEMORY;
  mixprec__roi_fwd_fn fn = mixprec__roi_fwd_scalar;
#if defined(MIXPREC_X86)
  if (mixprec__active_isa() != MIXPREC_ISA_SCALAR) fn = mixprec__roi_fwd_avx2;
#endif
  const int64_t bins = p->pooled_height * p->pooled_width, plane = height * width;
#pragma omp parallel num_threads(n_threads) if (n_threads > 1)
  {
    mixprec__roi_pc *pc = (mixprec__roi_pc *)(scratch + per * (size_t)thread_id());
    mixprec__roi_axis *ty = (mixprec__roi_axis *)(pc + pcs);
    mixprec__roi_axis *tx = ty + rows;
    int64_t last_k = -1;
    mixprec__roi r;
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; it++) {
      const int64_t k = it / n_cb, c0 = (it % n_cb) * ROI_CB;
      const int64_t c1 = c0 + ROI_CB < channels ? c0 + ROI_CB : channels;
      if (k != last_k) {
        r = mixprec__roi_make(rois, rois_dtype, k, batch, p, scale);
        if (r.finite) {
          fill_tables(&r, p, height, width, ty, tx);
          fill_pc(&r, p, width, ty, tx, pc);
        }
        last_k = k;
      }
      if (!r.finite) {
        const int64_t n = (c1 - c0) * bins, o = (k * channels + c0) * bins;
        for (int64_t i = 0; i < n; i++)
          mixprec__store_f32(output, output_dtype, o + i, mixprec__f32_from_bits(0x7fc00000u));
        continue;
      }
      const int64_t samples = (r.grid_h > 0 && r.grid_w > 0) ? r.grid_h * r.grid_w : 0;
      fn(input, input_dtype, channels, plane, batch * channels, &r, k, c0, c1, bins, samples, pc,
         output, output_dtype);
    }
  }
  free(scratch);
  return MIXPREC_OK;
}

/* ---- backward ----------------------------------------------------------- */

/* rois grouped by image, in their order: order[start[b] .. start[b + 1]). */
static int group_by_image(const void *rois, mixprec_dtype rd, int64_t n_rois, int64_t batch,
                          int64_t **start_out, int64_t **order_out) {
  int64_t *start = (int64_t *)calloc((size_t)batch + 1, sizeof(int64_t));
  int64_t *order = (int64_t *)malloc(sizeof(int64_t) * (size_t)(n_rois > 0 ? n_rois : 1));
  if (!start || !order) {
    free(start);
    free(order);
    return 0;
  }
  for (int64_t k = 0; k < n_rois; k++) start[(int64_t)mixprec__load_f32(rois, rd, k * 5) + 1]++;
  for (int64_t b = 0; b < batch; b++) start[b + 1] += start[b];
  int64_t *fill = (int64_t *)malloc(sizeof(int64_t) * (size_t)(batch > 0 ? batch : 1));
  if (!fill) {
    free(start);
    free(order);
    return 0;
  }
  memcpy(fill, start, sizeof(int64_t) * (size_t)batch);
  for (int64_t k = 0; k < n_rois; k++) order[fill[(int64_t)mixprec__load_f32(rois, rd, k * 5)]++] = k;
  free(fill);
  *start_out = start;
  *order_out = order;
  return 1;
}

/* torchvision's scatter from the sample table: an empty sample (all four
 * weights 0; a valid one's sum to 1) adds nothing, as torchvision skips it. */
MIXPREC__FORCE_INLINE void bwd_roi(const void *grad, mixprec_dtype gd, const int64_t *gs,
                                   int64_t plane, const mixprec__roi *r, int64_t k, int64_t c0,
                                   int64_t c1, const mixprec_roi_align_params *p,
                                   const mixprec__roi_pc *pc, float *acc) {
  const int64_t PH = p->pooled_height, PW = p->pooled_width, samples = r->grid_h * r->grid_w;
  const float count = r->count_bwd;
  for (int64_t c = c0; c < c1; c++) {
    float *dst = acc + (c - c0) * plane;
    const int64_t goff = k * gs[0] + c * gs[1];
    const mixprec__roi_pc *e = pc;
    for (int64_t ph = 0; ph < PH; ph++) {
      for (int64_t pw = 0; pw < PW; pw++) {
        const float g = mixprec__load_f32(grad, gd, goff + ph * gs[2] + pw * gs[3]);
        for (int64_t s = 0; s < samples; s++, e++) {
          if (e->w1 == 0.0f && e->w2 == 0.0f && e->w3 == 0.0f && e->w4 == 0.0f) continue;
          dst[e->p1] += mixprec__roi_grad_share(g, e->w1, count);
          dst[e->p2] += mixprec__roi_grad_share(g, e->w2, count);
          dst[e->p3] += mixprec__roi_grad_share(g, e->w3, count);
          dst[e->p4] += mixprec__roi_grad_share(g, e->w4, count);
        }
      }
    }
  }
}

static void bwd_item(const void *grad, mixprec_dtype gd, const int64_t *gs, int64_t plane,
                     const mixprec__roi *r, int64_t k, int64_t c0, int64_t c1,
                     const mixprec_roi_align_params *p, const mixprec__roi_pc *pc, float *acc) {
  MIXPREC__DISPATCH(gd, D, bwd_roi(grad, D, gs, plane, r, k, c0, c1, p, pc, acc));
}

mixprec_status mixprec_roi_align_backward(const void *grad_output, mixprec_dtype grad_dtype,
                                          const int64_t *grad_strides, const void *rois,
                                          mixprec_dtype rois_dtype, int64_t n_rois,
                                          int64_t batch, int64_t channels, int64_t height,
                                          int64_t width, const mixprec_roi_align_params *p,
                                          void *grad_input, mixprec_dtype grad_input_dtype) {
  int64_t in_numel, out_numel;
  mixprec_status st = mixprec__roi_align_backward_check(
      grad_output, grad_dtype, grad_strides, rois, rois_dtype, n_rois, batch, channels, height, width, p,
      grad_input, grad_input_dtype, &in_numel, &out_numel);
  if (st != MIXPREC_OK || in_numel == 0) return st;
  int64_t bad = -1;
  if (out_numel > 0) {
    st = mixprec_roi_align_first_bad_roi(rois, rois_dtype, n_rois, batch, &bad);
    if (st != MIXPREC_OK) return st;
    if (bad >= 0) return MIXPREC_ERR_BAD_ARGUMENT;
  } else {
    n_rois = 0; /* nothing flows back; the rois are not read */
  }
  const float scale = (float)p->spatial_scale;
  int64_t rows, cols;
  table_sizes(rois, rois_dtype, n_rois, batch, p, scale, &rows, &cols);
  int64_t *start, *order;
  if (!group_by_image(rois, rois_dtype, n_rois, batch, &start, &order))
    return MIXPREC_ERR_OUT_OF_MEMORY;
  const int64_t plane = height * width;
  const int64_t n_cb = (channels + ROI_CB - 1) / ROI_CB;
  const int64_t items = batch * n_cb;
  const int n_threads = threads_for(out_numel * 4 > in_numel ? out_numel * 4 : in_numel);
  /* float grad_input: accumulate in place; else in a float workspace of
   * ROI_CB planes per thread, rounded once. */
  const int direct = grad_input_dtype == MIXPREC_F32;
  if (rows > 0 && cols > INT64_MAX / rows) {
    free(start);
    free(order);
    return MIXPREC_ERR_OUT_OF_MEMORY;
  }
  const int64_t pcs = rows * cols;
  const size_t ws_floats = direct ? 0 : (size_t)ROI_CB * (size_t)plane;
  const size_t per_bytes = (size_t)pcs * sizeof(mixprec__roi_pc) +
                           (size_t)(rows + cols) * sizeof(mixprec__roi_axis) +
                           ws_floats * sizeof(float);
  void *scratch = NULL;
  if ((size_t)pcs <= SIZE_MAX / 64 && per_bytes <= SIZE_MAX / (size_t)n_threads)
    scratch = malloc(per_bytes * (size_t)n_threads);
  if (!scratch) {
    free(start);
    free(order);
    return MIXPREC_ERR_OUT_OF_MEMORY;
  }
#pragma omp parallel num_threads(n_threads) if (n_threads > 1)
  {
    char *mine = (char *)scratch + per_bytes * (size_t)thread_id();
    mixprec__roi_pc *pc = (mixprec__roi_pc *)mine;
    mixprec__roi_axis *ty = (mixprec__roi_axis *)(pc + pcs);
    mixprec__roi_axis *tx = ty + rows;
    float *ws = (float *)(tx + cols);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; it++) {
      const int64_t b = it / n_cb, c0 = (it % n_cb) * ROI_CB;
      const int64_t c1 = c0 + ROI_CB < channels ? c0 + ROI_CB : channels;
      const int64_t first = (b * channels + c0) * plane, n = (c1 - c0) * plane;
      float *acc = direct ? (float *)grad_input + first : ws;
      memset(acc, 0, sizeof(float) * (size_t)n);
      for (int64_t j = start[b]; j < start[b + 1]; j++) {
        const int64_t k = order[j];
        const mixprec__roi r = mixprec__roi_make(rois, rois_dtype, k, batch, p, scale);
        if (!r.finite || r.grid_h <= 0 || r.grid_w <= 0) continue;
        fill_tables(&r, p, height, width, ty, tx);
        fill_pc(&r, p, width, ty, tx, pc);
        bwd_item(grad_output, grad_dtype, grad_strides, plane, &r, k, c0, c1, p, pc, acc);
      }
      if (!direct)
        for (int64_t i = 0; i < n; i++) mixprec__store_f32(grad_input, grad_input_dtype, first + i, acc[i]);
    }
  }
  free(scratch);
  free(start);
  free(order);
  return MIXPREC_OK;
}
