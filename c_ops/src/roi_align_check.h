/* Argument checks of the RoIAlign entry points, shared verbatim by the CPU
 * (roi_align.c) and the CUDA host code (kernels/roi_align.cu), so both
 * return the same status for the same arguments. The CPU then checks every
 * batch index against the batch (the GPU cannot without a host sync: it
 * writes NaN for such a roi instead). Depends only on the public header. */
#ifndef MIXPREC_ROI_ALIGN_CHECK_H
#define MIXPREC_ROI_ALIGN_CHECK_H

#include <stdint.h>

#include "compiler.h"
#include "mixprec/roi_align.h"

/* a * b into *out, or 0 if it leaves [0, INT64_MAX] (both >= 0). */
MIXPREC__INLINE int mixprec__roi_mul(int64_t a, int64_t b, int64_t *out) {
  if (a != 0 && b > INT64_MAX / a) return 0;
  *out = a * b;
  return 1;
}

/* Sizes, dtypes and options; *in_numel / *out_numel receive the element
 * counts of the feature map and of the pooled output. */
MIXPREC__INLINE mixprec_status mixprec__roi_align_check(
    mixprec_dtype input_dtype, int64_t batch, int64_t channels, int64_t height, int64_t width,
    mixprec_dtype rois_dtype, int64_t n_rois, const mixprec_roi_align_params *p,
    mixprec_dtype output_dtype, int64_t *in_numel, int64_t *out_numel) {
  if (!p) return MIXPREC_ERR_NULL_POINTER;
  if (batch < 0 || channels < 0 || height < 0 || width < 0 || n_rois < 0)
    return MIXPREC_ERR_BAD_SIZE;
  if (mixprec_dtype_size(input_dtype) == 0 || mixprec_dtype_size(rois_dtype) == 0 ||
      mixprec_dtype_size(output_dtype) == 0)
    return MIXPREC_ERR_BAD_DTYPE;
  if (p->pooled_height < 0 || p->pooled_width < 0) return MIXPREC_ERR_BAD_ARGUMENT;
  /* torchvision's sizes are ints */
  if (p->pooled_height > INT32_MAX || p->pooled_width > INT32_MAX ||
      p->sampling_ratio > INT32_MAX)
    return MIXPREC_ERR_BAD_ARGUMENT;
  /* finite, and not NaN: written so that NaN fails */
  if (!(p->spatial_scale - p->spatial_scale == 0.0)) return MIXPREC_ERR_BAD_ARGUMENT;
  /* as float, like torchvision: must stay finite there too */
  if (!((float)p->spatial_scale - (float)p->spatial_scale == 0.0f)) return MIXPREC_ERR_BAD_ARGUMENT;
  int64_t plane, t, bins;
  if (!mixprec__roi_mul(height, width, &plane) || !mixprec__roi_mul(plane, channels, &t) ||
      !mixprec__roi_mul(t, batch, in_numel))
    return MIXPREC_ERR_BAD_SIZE;
  if (!mixprec__roi_mul(p->pooled_height, p->pooled_width, &bins) ||
      !mixprec__roi_mul(bins, channels, &t) || !mixprec__roi_mul(t, n_rois, out_numel))
    return MIXPREC_ERR_BAD_SIZE;
  /* rois sampling an empty map: torchvision reads outside it */
  if (*out_numel > 0 && plane == 0) return MIXPREC_ERR_BAD_SIZE;
  if (n_rois > INT64_MAX / 5) return MIXPREC_ERR_BAD_SIZE;
  return MIXPREC_OK;
}

/* The checks of both forward entry points (CPU and CUDA): the shapes and
 * dtypes (mixprec__roi_align_check), then, for a non-empty output, the
 * pointers. MIXPREC_OK with *out_numel == 0: nothing to do. */
MIXPREC__INLINE mixprec_status mixprec__roi_align_forward_check(
    const void *input, mixprec_dtype input_dtype, int64_t batch, int64_t channels, int64_t height,
    int64_t width, const void *rois, mixprec_dtype rois_dtype, int64_t n_rois,
    const mixprec_roi_align_params *p, const void *output, mixprec_dtype output_dtype,
    int64_t *in_numel, int64_t *out_numel) {
  const mixprec_status st = mixprec__roi_align_check(input_dtype, batch, channels, height, width,
                                                     rois_dtype, n_rois, p, output_dtype, in_numel,
                                                     out_numel);
  if (st != MIXPREC_OK || *out_numel == 0) return st;
  if (!input || !rois || !output) return MIXPREC_ERR_NULL_POINTER;
  return MIXPREC_OK;
}

/* The checks of both backward entry points (CPU and CUDA): the shapes and
 * dtypes (mixprec__roi_align_check), the strides, then, for a non-empty
 * grad_input, its pointer and, when there is any output gradient, those of
 * grad_output and rois. MIXPREC_OK with *in_numel == 0: nothing to do. */
MIXPREC__INLINE mixprec_status mixprec__roi_align_backward_check(
    const void *grad_output, mixprec_dtype grad_dtype, const int64_t *grad_strides, const void *rois,
    mixprec_dtype rois_dtype, int64_t n_rois, int64_t batch, int64_t channels, int64_t height,
    int64_t width, const mixprec_roi_align_params *p, const void *grad_input,
    mixprec_dtype grad_input_dtype, int64_t *in_numel, int64_t *out_numel) {
  const mixprec_status st = mixprec__roi_align_check(grad_input_dtype, batch, channels, height, width,
                                                     rois_dtype, n_rois, p, grad_dtype, in_numel,
                                                     out_numel);
  if (st != MIXPREC_OK) return st;
  if (!grad_strides) return MIXPREC_ERR_NULL_POINTER;
  for (int d = 0; d < 4; d++)
    if (grad_strides[d] < 0) return MIXPREC_ERR_BAD_ARGUMENT;
  if (*in_numel == 0) return MIXPREC_OK;
  if (!grad_input || (*out_numel > 0 && (!grad_output || !rois))) return MIXPREC_ERR_NULL_POINTER;
  return MIXPREC_OK;
}

#endif /* MIXPREC_ROI_ALIGN_CHECK_H */
