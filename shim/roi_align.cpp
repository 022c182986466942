// The roi_align family: its schemas, and its CPU backend. The validation is
// roi_align_op.h's, shared with the CUDA backend in roi_align_cuda.cpp.
#include "roi_align_op.h"

namespace mixprec_shim {
namespace roi_align {
namespace {

struct CpuBackend {
  static void check_device(const char* op, const Where& w) { check_cpu_device(op, w); }

  static void check_rois(const char* op, const RoiArgs& a) {
    int64_t bad = -1;
    check_status(mixprec_roi_align_first_bad_roi(a.rois, a.rois_dtype, a.n_rois, a.batch, &bad),
                 op);
    if (bad < 0) return;
    float b = 0.0f;
    MIXPREC_SHIM_DISPATCH(a.rois_dtype, T,
                          b = to_float(static_cast<const T*>(a.rois)[bad * 5]));
    MIXPREC_CHECK(false, "mixprec::", op, ": rois[", bad, ", 0] (the batch index) is ", b,
                  "; it must name an image of the batch: 0 <= index < ", a.batch,
                  " after truncation");
  }

  static void forward(const char* op, const RoiArgs& a, const void* input, mixprec_dtype in_dtype,
                      Tensor& output) {
    check_status(mixprec_roi_align(input, in_dtype, a.batch, a.channels, a.height, a.width, a.rois,
                                   a.rois_dtype, a.n_rois, &a.params, output.data_ptr(), in_dtype),
                 op);
  }

  static void backward(const char* op, const RoiArgs& a, const Tensor& grad, mixprec_dtype g_dtype,
                       Tensor& grad_input) {
    const int64_t strides[4] = {grad.stride(0), grad.stride(1), grad.stride(2), grad.stride(3)};
    check_status(mixprec_roi_align_backward(grad.numel() ? grad.data_ptr() : nullptr, g_dtype,
                                            strides, a.rois, a.rois_dtype, a.n_rois, a.batch,
                                            a.channels, a.height, a.width, &a.params,
                                            grad_input.data_ptr(), g_dtype),
                 op);
  }
};

}  // namespace
}  // namespace roi_align
}  // namespace mixprec_shim

STABLE_TORCH_LIBRARY_FRAGMENT(mixprec, m) {
  // torchvision.ops.roi_align (rois as Tensor[K, 5]) for float32 / float16 /
  // bfloat16 features, computed in float32: the output has the input's dtype.
  m.def(
      "roi_align(Tensor input, Tensor rois, float spatial_scale, int pooled_height,"
      " int pooled_width, int sampling_ratio, bool aligned) -> Tensor");
  // Its gradient with respect to the input (the grad's dtype), accumulated
  // in float32 and rounded once; deterministic on every device.
  m.def(
      "roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, int pooled_height,"
      " int pooled_width, int batch_size, int channels, int height, int width,"
      " int sampling_ratio, bool aligned) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(mixprec, CPU, m) {
  namespace ra = mixprec_shim::roi_align;
  using B = ra::CpuBackend;
  m.impl("roi_align", TORCH_BOX(&ra::roi_align_op<B>));
  m.impl("roi_align_backward", TORCH_BOX(&ra::roi_align_backward_op<B>));
}
