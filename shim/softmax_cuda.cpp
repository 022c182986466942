// CUDA registrations of softmax, log_softmax and cross-entropy. The op
// bodies and every check come from softmax.cpp (included without its
// schemas and CPU registrations); this file only says how to enqueue the
// CUDA C API on torch's current stream of the tensors' device.
#include <torch/csrc/stable/accelerator.h>

#define MIXPREC_SOFTMAX_NO_REGISTER
#include "softmax.cpp"
#undef MIXPREC_SOFTMAX_NO_REGISTER

#include "cuda_common.h"

namespace mixprec_shim {
namespace softmax_detail {

struct CudaBackend {
  static void check_device(const char* op, const Where& w) { check_cuda_device(op, w); }
  static mixprec_status softmax(bool log, const void* x, mixprec_dtype xd, void* y,
                                mixprec_dtype yd, int64_t outer, int64_t n, int64_t inner,
                                int32_t device) {
    torch::stable::accelerator::DeviceGuard guard(device);
    void* s = current_cuda_stream(log ? "log_softmax" : "softmax", device);
    return log ? mixprec_cuda_log_softmax(x, xd, y, yd, outer, n, inner, s)
               : mixprec_cuda_softmax(x, xd, y, yd, outer, n, inner, s);
  }
  static mixprec_status softmax_backward(bool log, const void* dy, const void* y,
                                         mixprec_dtype yd, void* dx, mixprec_dtype dxd,
                                         int64_t outer, int64_t n, int64_t inner, int32_t device) {
    torch::stable::accelerator::DeviceGuard guard(device);
    void* s = current_cuda_stream(log ? "log_softmax_backward" : "softmax_backward", device);
    return log ? mixprec_cuda_log_softmax_backward(dy, y, yd, dx, dxd, outer, n, inner, s)
               : mixprec_cuda_softmax_backward(dy, y, yd, dx, dxd, outer, n, inner, s);
  }
  // Out-of-range targets are not detected here (that would need a sync):
  // they give NaN (see mixprec_cuda_cross_entropy), so the status is never
  // MIXPREC_ERR_BAD_ARGUMENT for them.
  static mixprec_status cross_entropy(const CeArgs& a, float* loss, float* stats, float* wsum,
                                      const Tensor& like) {
    torch::stable::accelerator::DeviceGuard guard(a.device.index);
    const int64_t bytes = mixprec_cuda_cross_entropy_workspace_size(&a.p);
    STD_TORCH_CHECK(bytes >= 0, "mixprec::cross_entropy: invalid sizes");
    // Scratch from torch's caching allocator on the current stream.
    Tensor ws = torch::stable::new_empty(like, {bytes > 0 ? bytes : 1}, ScalarType::Byte);
    return mixprec_cuda_cross_entropy(
        a.positions ? a.logits.data_ptr() : nullptr, a.dtype,
        a.positions ? static_cast<const int64_t*>(a.target.data_ptr()) : nullptr, &a.p, loss, stats,
        wsum, ws.data_ptr(), bytes, current_cuda_stream("cross_entropy", a.device.index));
  }
  static mixprec_status cross_entropy_backward(const CeArgs& a, const float* grad_loss,
                                               const float* stats, const float* wsum, void* dx) {
    torch::stable::accelerator::DeviceGuard guard(a.device.index);
    return mixprec_cuda_cross_entropy_backward(
        grad_loss, a.logits.data_ptr(), a.dtype, static_cast<const int64_t*>(a.target.data_ptr()),
        &a.p, stats, wsum, dx, current_cuda_stream("cross_entropy_backward", a.device.index));
  }
};

}  // namespace softmax_detail
}  // namespace mixprec_shim

STABLE_TORCH_LIBRARY_IMPL(mixprec, CUDA, m) {
  using mixprec_shim::softmax_detail::CudaBackend;
  namespace sd = mixprec_shim::softmax_detail;
  m.impl("softmax", TORCH_BOX(&sd::softmax_op<CudaBackend>));
  m.impl("log_softmax", TORCH_BOX(&sd::log_softmax_op<CudaBackend>));
  m.impl("softmax_backward", TORCH_BOX(&sd::softmax_backward_op<CudaBackend>));
  m.impl("log_softmax_backward", TORCH_BOX(&sd::log_softmax_backward_op<CudaBackend>));
  m.impl("cross_entropy", TORCH_BOX(&sd::cross_entropy_op<CudaBackend>));
  m.impl("cross_entropy_backward", TORCH_BOX(&sd::cross_entropy_backward_op<CudaBackend>));
}
