// The CUDA backend of the softmax family: after softmax_op.h's validation,
// enqueue the CUDA C API on torch's current stream of the tensors' device.
#include <torch/csrc/stable/accelerator.h>

#include "cuda_common.h"
#include "softmax_op.h"

namespace mixprec_shim {
namespace softmax {
namespace {

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
};

}  // namespace
}  // namespace softmax
}  // namespace mixprec_shim

STABLE_TORCH_LIBRARY_IMPL(mixprec, CUDA, m) {
  namespace sm = mixprec_shim::softmax;
  using B = sm::CudaBackend;
  m.impl("softmax", TORCH_BOX(&sm::softmax_op<B>));
  m.impl("log_softmax", TORCH_BOX(&sm::log_softmax_op<B>));
  m.impl("softmax_backward", TORCH_BOX(&sm::softmax_backward_op<B>));
  m.impl("log_softmax_backward", TORCH_BOX(&sm::log_softmax_backward_op<B>));
}
