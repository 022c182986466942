// The RoIAlign ops (roi_align, roi_align_backward), validated once for both
// devices: each op is a template over a backend B (roi_align.cpp: CPU,
// roi_align_cuda.cpp: CUDA) that only says how to run the C entry point:
//   B::check_device(op, where)                the tensors are B's
//   B::check_rois(op, args)                   the batch indices (CPU only;
//                                             the GPU writes NaN instead)
//   B::forward(op, args, output)              fills output
//   B::backward(op, args, grad, grad_input)   fills grad_input
#pragma once

#include <cmath>
#include <cstdint>

#include "common.h"
#include "mixprec/roi_align.h"

namespace mixprec_shim {
namespace roi_align {

struct RoiArgs {
  const void* rois;
  mixprec_dtype rois_dtype;
  int64_t n_rois, batch, channels, height, width;
  mixprec_roi_align_params params;
  Where device;
};

inline mixprec_dtype roi_float_dtype(const char* op, const char* arg, const Tensor& t) {
  MIXPREC_CHECK(t.defined() && t.layout() == Layout::Strided, "mixprec::", op, ": ", arg,
                " must be a defined strided tensor");
  mixprec_dtype d;
  MIXPREC_CHECK(to_mixprec_dtype(t.scalar_type(), &d), "mixprec::", op, ": ", arg,
                " must be float32, float16 or bfloat16, got ", dtype_name(t.scalar_type()),
                t.scalar_type() == ScalarType::Double
                    ? " (float64 is not supported: mixprec computes in float32; use "
                      "torchvision.ops.roi_align for float64)"
                    : "");
  return d;
}

// The rois and the options (shared by both ops). Nothing is copied here:
// an expanded rois of absurd size must fail its checks (or the output's
// allocation) before any copy of it is tried (read_rois comes last).
inline void roi_common(const char* op, const char* ref, RoiArgs& a, const Tensor& rois,
                       double spatial_scale, int64_t pooled_height, int64_t pooled_width,
                       int64_t sampling_ratio, bool aligned) {
  a.rois_dtype = roi_float_dtype(op, "rois", rois);
  same_device(op, "rois", rois, a.device, ref);
  MIXPREC_CHECK(rois.dim() == 2 && rois.size(1) == 5, "mixprec::", op,
                ": rois must have shape (K, 5) (batch index, x1, y1, x2, y2), got ",
                shape_str(rois));
  a.n_rois = rois.size(0);
  MIXPREC_CHECK(pooled_height >= 0 && pooled_width >= 0 && pooled_height <= INT32_MAX &&
                    pooled_width <= INT32_MAX,
                "mixprec::", op, ": output_size must be >= 0 (and below 2^31), got (",
                pooled_height, ", ", pooled_width, ")");
  MIXPREC_CHECK(sampling_ratio <= INT32_MAX, "mixprec::", op,
                ": sampling_ratio must be below 2^31, got ", sampling_ratio);
  MIXPREC_CHECK(std::isfinite(spatial_scale) && std::isfinite(static_cast<float>(spatial_scale)),
                "mixprec::", op, ": spatial_scale must be finite (as a float32), got ",
                spatial_scale);
  a.params = mixprec_roi_align_params_default(pooled_height, pooled_width);
  a.params.spatial_scale = spatial_scale;
  a.params.sampling_ratio = sampling_ratio;
  a.params.aligned = aligned ? 1 : 0;
  a.rois = nullptr;
}

// The contiguous rois the kernel reads, after every check and allocation;
// the caller keeps it alive.
inline Tensor read_rois(RoiArgs& a, const Tensor& rois) {
  Tensor rois_c = dense(rois);
  a.rois = a.n_rois ? rois_c.data_ptr() : nullptr;
  return rois_c;
}

inline void check_map(const char* op, const RoiArgs& a) {
  MIXPREC_CHECK(a.n_rois == 0 || a.params.pooled_height == 0 || a.params.pooled_width == 0 ||
                    a.channels == 0 || (a.height > 0 && a.width > 0),
                "mixprec::", op, ": cannot sample rois from an empty feature map (height ",
                a.height, ", width ", a.width, ")");
}

template <class B>
Tensor roi_align_op(Tensor input, Tensor rois, double spatial_scale, int64_t pooled_height,
                    int64_t pooled_width, int64_t sampling_ratio, bool aligned) {
  const char* op = "roi_align";
  RoiArgs a;
  const mixprec_dtype in_dtype = roi_float_dtype(op, "input", input);
  a.device = where(input);
  MIXPREC_CHECK(input.dim() == 4, "mixprec::", op, ": input must have shape (N, C, H, W), got ",
                shape_str(input));
  a.batch = input.size(0);
  a.channels = input.size(1);
  a.height = input.size(2);
  a.width = input.size(3);
  roi_common(op, "input", a, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio,
             aligned);
  check_map(op, a);
  B::check_device(op, a.device);
  Tensor output = torch::stable::new_empty(input, {a.n_rois, a.channels, pooled_height, pooled_width});
  if (output.numel() == 0) return output;
  Tensor rois_c = read_rois(a, rois);
  B::check_rois(op, a);
  Tensor input_c = dense(input);
  B::forward(op, a, input_c.data_ptr(), in_dtype, output);
  return output;
}

template <class B>
Tensor roi_align_backward_op(Tensor grad, Tensor rois, double spatial_scale,
                             int64_t pooled_height, int64_t pooled_width, int64_t batch_size,
                             int64_t channels, int64_t height, int64_t width,
                             int64_t sampling_ratio, bool aligned) {
  const char* op = "roi_align_backward";
  RoiArgs a;
  const mixprec_dtype g_dtype = roi_float_dtype(op, "grad", grad);
  a.device = where(grad);
  MIXPREC_CHECK(batch_size >= 0 && channels >= 0 && height >= 0 && width >= 0, "mixprec::", op,
                ": batch_size, channels, height and width must be >= 0, got ", batch_size, ", ",
                channels, ", ", height, ", ", width);
  a.batch = batch_size;
  a.channels = channels;
  a.height = height;
  a.width = width;
  roi_common(op, "grad", a, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio,
             aligned);
  MIXPREC_CHECK(grad.dim() == 4 && grad.size(0) == a.n_rois && grad.size(1) == channels &&
                    grad.size(2) == pooled_height && grad.size(3) == pooled_width,
                "mixprec::", op, ": grad must have shape (K, channels, pooled_height, "
                "pooled_width) = [", a.n_rois, ", ", channels, ", ", pooled_height, ", ",
                pooled_width, "], got ", shape_str(grad));
  check_map(op, a);
  B::check_device(op, a.device);
  Tensor grad_input = torch::stable::new_empty(grad, {batch_size, channels, height, width});
  if (grad_input.numel() == 0) return grad_input;
  Tensor rois_c;
  if (grad.numel() > 0) {
    rois_c = read_rois(a, rois);
    B::check_rois(op, a);
  }
  B::backward(op, a, grad, g_dtype, grad_input);
  return grad_input;
}

}  // namespace roi_align
}  // namespace mixprec_shim
