// The CUDA backend of the roi_align family: after roi_align_op.h's
// validation, enqueue the C entry points on torch's current stream. No host
// synchronisation: a batch index out of range gives NaN outputs (see
// mixprec_cuda_roi_align) instead of the CPU's error.
#include <torch/csrc/stable/accelerator.h>

#include "cuda_common.h"
#include "roi_align_op.h"

namespace mixprec_shim {
namespace roi_align {
namespace {

struct CudaBackend {
  static void check_device(const char* op, const Where& w) { check_cuda_device(op, w); }

  static void check_rois(const char*, const RoiArgs&) {}

  static void forward(const char* op, const RoiArgs& a, const void* input, mixprec_dtype in_dtype,
                      Tensor& output) {
    torch::stable::accelerator::DeviceGuard guard(a.device.index);
    void* stream = current_cuda_stream(op, a.device.index);
    check_status(mixprec_cuda_roi_align(input, in_dtype, a.batch, a.channels, a.height, a.width,
                                        a.rois, a.rois_dtype, a.n_rois, &a.params,
                                        output.data_ptr(), in_dtype, stream),
                 op);
  }

  static void backward(const char* op, const RoiArgs& a, const Tensor& grad, mixprec_dtype g_dtype,
                       Tensor& grad_input) {
    torch::stable::accelerator::DeviceGuard guard(a.device.index);
    void* stream = current_cuda_stream(op, a.device.index);
    const int64_t strides[4] = {grad.stride(0), grad.stride(1), grad.stride(2), grad.stride(3)};
    const int64_t ws_bytes = mixprec_cuda_roi_align_backward_workspace_size(a.n_rois, a.batch);
    MIXPREC_CHECK(ws_bytes >= 0, "mixprec::", op, ": could not size the workspace");
    Tensor workspace =
        torch::stable::new_empty(grad_input, {ws_bytes > 0 ? ws_bytes : 1}, ScalarType::Byte);
    check_status(mixprec_cuda_roi_align_backward(
                     grad.numel() ? grad.data_ptr() : nullptr, g_dtype, strides, a.rois,
                     a.rois_dtype, a.n_rois, a.batch, a.channels, a.height, a.width, &a.params,
                     grad_input.data_ptr(), g_dtype, workspace.data_ptr(), ws_bytes, stream),
                 op);
  }
};

}  // namespace
}  // namespace roi_align
}  // namespace mixprec_shim

STABLE_TORCH_LIBRARY_IMPL(mixprec, CUDA, m) {
  namespace ra = mixprec_shim::roi_align;
  using B = ra::CudaBackend;
  m.impl("roi_align", TORCH_BOX(&ra::roi_align_op<B>));
  m.impl("roi_align_backward", TORCH_BOX(&ra::roi_align_backward_op<B>));
}
