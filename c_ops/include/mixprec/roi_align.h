/* mixprec C API: RoIAlign (Mask R-CNN's average-pooled bilinear RoI
 * pooling), forward and backward. Included by mixprec/mixprec.h.
 *
 * torchvision.ops.roi_align's semantics for float32, float16 and bfloat16
 * feature maps, with every coordinate, weight and sum in float (FP32):
 *
 *     float feat[1][1][8][8];                 // N=1, C=1, H=W=8, filled
 *     float rois[1][5] = {{0, 1.0f, 1.0f, 5.0f, 5.0f}};   // b, x1, y1, x2, y2
 *     float out[1][1][2][2];
 *     mixprec_roi_align_params p = mixprec_roi_align_params_default(2, 2);
 *     mixprec_roi_align(feat, MIXPREC_F32, 1, 1, 8, 8, rois, MIXPREC_F32, 1,
 *                       &p, out, MIXPREC_F32);
 *
 * Semantics (torchvision/csrc/ops/cpu/roi_align_kernel.cpp, in float):
 * - input is (N, C, H, W) contiguous; rois is (K, 5) contiguous rows
 *   (batch index, x1, y1, x2, y2) in any of the three dtypes (widened
 *   exactly to float; torchvision requires the input's dtype, mixprec accepts
 *   any); output is (K, C, pooled_height, pooled_width) contiguous.
 * - scale = (float)spatial_scale, offset = aligned ? 0.5 : 0;
 *   start = x1 * scale - offset, end = x2 * scale - offset (likewise y);
 *   roi size = end - start, at least 1 when not aligned;
 *   bin = size / pooled; grid = sampling_ratio if > 0, else
 *   ceil(size / pooled) (adaptive; any sampling_ratio <= 0 means adaptive,
 *   as in torchvision); count = max(grid_h * grid_w, 1).
 * - sample (iy, ix) of bin (ph, pw):
 *   y = start_h + ph * bin_h + (iy + .5f) * bin_h / grid_h (likewise x);
 *   a sample outside [-1, H] x [-1, W] (or NaN) contributes 0 * input[0]
 *   (as torchvision's pre-computed empty sample does); otherwise it is
 *   clamped (y <= 0 -> 0; y_low >= H - 1 -> y_low = y_high = H - 1, y =
 *   y_low) and interpolated with w1 = hy*hx, w2 = hy*lx, w3 = ly*hx,
 *   w4 = ly*lx; out = (sum over samples of
 *   ((w1*v1 + w2*v2) + w3*v3) + w4*v4, in sample order) / count.
 *   The operations are torchvision's, in its order, without FMA: for float32
 *   the output is bit-identical to torchvision's CPU kernel; for float16 /
 *   bfloat16 it is torchvision's float32 result on the widened input,
 *   rounded once (to nearest even).
 * - The batch index is truncated toward zero (as torchvision's (int) cast)
 *   and must name an image: -1 < rois[k, 0] < N, else MIXPREC_ERR_BAD_ARGUMENT
 *   (torchvision reads outside the input). A roi with a non-finite
 *   coordinate gives NaN in all of its outputs and no gradient (torchvision's
 *   behaviour there is undefined).
 * - backward: grad_input (N, C, H, W) = the sum of every sample's
 *   (grad_output * w) / (grid_h * grid_w) at its four pixels, added in
 *   torchvision's order (roi, bin, sample) in float, rounded once to the
 *   grad_input dtype: bit-identical to torchvision for float32, torchvision's
 *   float32 result rounded once for float16 / bfloat16.
 * Threads: OpenMP over (roi, block of 16 channels) forward and over (image,
 * block of 16 channels) backward, each output element written by one thread
 * in the fixed order above: results never depend on the thread count. The
 * forward's AVX2 + F16C path (8 channels per vector, chosen at run time)
 * gives the scalar path's bits, a NaN's sign and payload aside (when NaN
 * inputs of both signs meet in one sum either may be kept).
 */
#ifndef MIXPREC_ROI_ALIGN_H
#define MIXPREC_ROI_ALIGN_H

#include "mixprec/mixprec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Options of the RoIAlign entry points. */
typedef struct mixprec_roi_align_params {
  int64_t pooled_height;  /* >= 0 (0: an empty output) */
  int64_t pooled_width;   /* >= 0 */
  double spatial_scale;   /* finite; used as float, as torchvision does */
  int64_t sampling_ratio; /* > 0: that many samples per bin side; <= 0: adaptive */
  int aligned;            /* nonzero: shift by -0.5 pixel, no minimum size */
} mixprec_roi_align_params;

/*! mixprec_roi_align_params_default() :
 *  @return : pooled_height x pooled_width, spatial_scale 1, adaptive
 *            sampling (-1), not aligned: torchvision's defaults. */
MIXPREC_API mixprec_roi_align_params mixprec_roi_align_params_default(int64_t pooled_height,
                                                                      int64_t pooled_width);

/*! mixprec_roi_align_first_bad_roi() :
 *  Finds the first roi whose batch index (rois[k * 5], truncated toward
 *  zero) is not an image of a batch of `batch` (NaN included).
 *  @param first_bad : receives its index k, or -1 if every roi is valid.
 *  @return : MIXPREC_ERR_NULL_POINTER, MIXPREC_ERR_BAD_SIZE (n_rois < 0),
 *            MIXPREC_ERR_BAD_DTYPE; else MIXPREC_OK. */
MIXPREC_API mixprec_status mixprec_roi_align_first_bad_roi(const void *rois,
                                                           mixprec_dtype rois_dtype,
                                                           int64_t n_rois, int64_t batch,
                                                           int64_t *first_bad);

/*! mixprec_roi_align() :
 *  RoIAlign forward on the CPU (see the semantics above).
 *  @param input  : batch * channels * height * width contiguous values.
 *  @param rois   : n_rois * 5 contiguous values (b, x1, y1, x2, y2).
 *  @param output : n_rois * channels * pooled_height * pooled_width values
 *                  of output_dtype, every one written.
 *  @return : MIXPREC_OK; MIXPREC_ERR_NULL_POINTER (p always; the data only
 *            when the output is not empty); MIXPREC_ERR_BAD_SIZE for a
 *            negative size, an element count above INT64_MAX, or rois on an
 *            empty (height or width 0) map; MIXPREC_ERR_BAD_DTYPE;
 *            MIXPREC_ERR_BAD_ARGUMENT for a negative pooled size, a pooled
 *            size or sampling_ratio above INT32_MAX, a spatial_scale that
 *            is not finite as a float, or a batch index out of range;
 *            MIXPREC_ERR_OUT_OF_MEMORY. Nothing is written on an error. */
MIXPREC_API mixprec_status mixprec_roi_align(const void *input, mixprec_dtype input_dtype,
                                             int64_t batch, int64_t channels, int64_t height,
                                             int64_t width, const void *rois,
                                             mixprec_dtype rois_dtype, int64_t n_rois,
                                             const mixprec_roi_align_params *p, void *output,
                                             mixprec_dtype output_dtype);

/*! mixprec_roi_align_backward() :
 *  The gradient of mixprec_roi_align() with respect to its input.
 *  @param grad_output  : (n_rois, channels, pooled_height, pooled_width)
 *                        values of grad_dtype at element strides
 *                        grad_strides[0..3] (any strides >= 0, e.g. an
 *                        expanded gradient).
 *  @param grad_input   : batch * channels * height * width contiguous values
 *                        of grad_input_dtype, every one written (zeros where
 *                        no sample falls). Accumulated in float (a float
 *                        workspace of 16 channel planes per thread for
 *                        float16 / bfloat16, or grad_input itself for
 *                        float32) and rounded once. When grad_output
 *                        is empty (no rois, a pooled size 0) the rois are
 *                        not read and grad_input is all zeros.
 *  @return : as mixprec_roi_align(); MIXPREC_ERR_NULL_POINTER also for
 *            grad_strides NULL, MIXPREC_ERR_BAD_ARGUMENT also for a negative
 *            stride. */
MIXPREC_API mixprec_status mixprec_roi_align_backward(
    const void *grad_output, mixprec_dtype grad_dtype, const int64_t *grad_strides,
    const void *rois, mixprec_dtype rois_dtype, int64_t n_rois, int64_t batch,
    int64_t channels, int64_t height, int64_t width, const mixprec_roi_align_params *p,
    void *grad_input, mixprec_dtype grad_input_dtype);

/* ---- CUDA (libmixprec_cuda) ---------------------------------------------- */

/*! mixprec_cuda_roi_align() :
 *  mixprec_roi_align() on the current device (input, rois, output are device
 *  pointers; p stays on the host), one thread per output element, the same
 *  float operations (roi_align_internal.h, no FMA contraction). CUDA:
 *  written to match the CPU bit for bit; not yet run on a GPU. The batch index is not checked against the batch on the host (that
 *  would synchronise): a roi whose index is out of range gives NaN outputs
 *  instead (and no gradient), never a read outside the input.
 *  @return : as mixprec_roi_align() (without the batch index check);
 *            MIXPREC_ERR_CUDA if a launch failed. */
MIXPREC_API mixprec_status mixprec_cuda_roi_align(const void *input, mixprec_dtype input_dtype,
                                                  int64_t batch, int64_t channels,
                                                  int64_t height, int64_t width,
                                                  const void *rois, mixprec_dtype rois_dtype,
                                                  int64_t n_rois,
                                                  const mixprec_roi_align_params *p,
                                                  void *output, mixprec_dtype output_dtype,
                                                  void *stream);

/*! mixprec_cuda_roi_align_backward_workspace_size() :
 *  @return : bytes of device scratch mixprec_cuda_roi_align_backward()
 *            needs (each roi's geometry, under 64 bytes per roi), or -1 for
 *            negative sizes. Host-only. */
MIXPREC_API int64_t mixprec_cuda_roi_align_backward_workspace_size(int64_t n_rois,
                                                                   int64_t batch);

/*! mixprec_cuda_roi_align_backward() :
 *  mixprec_roi_align_backward() on the current device, deterministic and
 *  without atomics: a gather, one thread per grad_input element, which
 *  visits the rois of its image in order and adds the contributions of the
 *  samples that touch its pixel in the CPU's order (roi, bin, sample), in
 *  float, rounded once. CUDA: written to match the CPU bit for bit; not yet
 *  run on a GPU.
 *  @param workspace : mixprec_cuda_roi_align_backward_workspace_size() bytes,
 *                     256-byte aligned.
 *  @return : as mixprec_roi_align_backward(); MIXPREC_ERR_BAD_ARGUMENT also
 *            for a too small workspace; MIXPREC_ERR_CUDA. */
MIXPREC_API mixprec_status mixprec_cuda_roi_align_backward(
    const void *grad_output, mixprec_dtype grad_dtype, const int64_t *grad_strides,
    const void *rois, mixprec_dtype rois_dtype, int64_t n_rois, int64_t batch,
    int64_t channels, int64_t height, int64_t width, const mixprec_roi_align_params *p,
    void *grad_input, mixprec_dtype grad_input_dtype, void *workspace,
    int64_t workspace_bytes, void *stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MIXPREC_ROI_ALIGN_H */
