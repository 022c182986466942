// The CUDA backend of the cross_entropy family: after cross_entropy_op.h's
// validation, enqueue the CUDA C API on torch's current stream of the
// tensors' device.
#include <torch/csrc/stable/accelerator.h>

#include "cross_entropy_op.h"
#include "cuda_common.h"

namespace mixprec_shim {
namespace cross_entropy {
namespace {

// The forward kernels' scratch, sized by the C API (bytes, which it takes
// too), from torch's caching allocator on the current stream; one byte when
// it needs none.
struct Workspace {
  Tensor buf;
  int64_t bytes;
};
Workspace workspace(const char* op, const CeArgs& a, const Tensor& like) {
  const int64_t bytes = mixprec_cuda_cross_entropy_workspace_size(&a.p);
  MIXPREC_CHECK(bytes >= 0, "mixprec::", op, ": invalid sizes");
  return {torch::stable::new_empty(like, {bytes > 0 ? bytes : 1}, ScalarType::Byte), bytes};
}

struct CudaBackend {
  static void check_device(const char* op, const Where& w) { check_cuda_device(op, w); }
  // Out-of-range targets are not detected here (that would need a sync):
  // they give NaN (see mixprec_cuda_cross_entropy), so the status is never
  // MIXPREC_ERR_BAD_ARGUMENT for them.
  static mixprec_status cross_entropy(const CeArgs& a, float* loss, float* stats, float* wsum,
                                      const Tensor& like) {
    torch::stable::accelerator::DeviceGuard guard(a.device.index);
    Workspace ws = workspace("cross_entropy", a, like);
    return mixprec_cuda_cross_entropy(
        a.positions ? a.logits.data_ptr() : nullptr, a.dtype,
        a.positions ? static_cast<const int64_t*>(a.target.data_ptr()) : nullptr, &a.p, loss, stats,
        wsum, ws.buf.data_ptr(), ws.bytes, current_cuda_stream("cross_entropy", a.device.index));
  }
  static mixprec_status cross_entropy_backward(const CeArgs& a, const float* grad_loss,
                                               const float* stats, const float* wsum, void* dx) {
    torch::stable::accelerator::DeviceGuard guard(a.device.index);
    return mixprec_cuda_cross_entropy_backward(
        grad_loss, a.logits.data_ptr(), a.dtype, static_cast<const int64_t*>(a.target.data_ptr()),
        &a.p, stats, wsum, dx, current_cuda_stream("cross_entropy_backward", a.device.index));
  }
  static mixprec_status cross_entropy_soft(const CeArgs& a, float* loss, float* stats,
                                           const Tensor& like) {
    torch::stable::accelerator::DeviceGuard guard(a.device.index);
    Workspace ws = workspace("cross_entropy_soft", a, like);
    return mixprec_cuda_cross_entropy_soft(
        a.positions ? a.logits.data_ptr() : nullptr, a.dtype,
        a.positions ? a.target.data_ptr() : nullptr, a.target_dtype, &a.p, loss, stats,
        ws.buf.data_ptr(), ws.bytes, current_cuda_stream("cross_entropy_soft", a.device.index));
  }
  static mixprec_status cross_entropy_soft_backward(const CeArgs& a, const float* grad_loss,
                                                    const float* stats, void* dx, void* dt) {
    torch::stable::accelerator::DeviceGuard guard(a.device.index);
    return mixprec_cuda_cross_entropy_soft_backward(
        grad_loss, a.logits.data_ptr(), a.dtype, a.target.data_ptr(), a.target_dtype, &a.p, stats,
        dx, dt, current_cuda_stream("cross_entropy_soft_backward", a.device.index));
  }
};

}  // namespace
}  // namespace cross_entropy
}  // namespace mixprec_shim

STABLE_TORCH_LIBRARY_IMPL(mixprec, CUDA, m) {
  namespace ce = mixprec_shim::cross_entropy;
  using B = ce::CudaBackend;
  m.impl("cross_entropy", TORCH_BOX(&ce::cross_entropy_op<B>));
  m.impl("cross_entropy_backward", TORCH_BOX(&ce::cross_entropy_backward_op<B>));
  m.impl("cross_entropy_soft", TORCH_BOX(&ce::cross_entropy_soft_op<B>));
  m.impl("cross_entropy_soft_backward", TORCH_BOX(&ce::cross_entropy_soft_backward_op<B>));
}
