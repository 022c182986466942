// The CUDA backend of the amp family: after amp_op.h's validation, enqueue
// the CUDA C API on torch's current stream of the tensors' device. No host
// synchronisation.
#include <torch/csrc/stable/accelerator.h>

#include "amp_op.h"
#include "cuda_common.h"

namespace mixprec_shim {
namespace amp {
namespace {

struct CudaBackend {
  static void check_device(const char* op, const Where& w) { check_cuda_device(op, w); }
  static mixprec_status unscale(const char* op, const UnscaleArgs& a, float* norms, float* total,
                                bool write, const Tensor& like) {
    torch::stable::accelerator::DeviceGuard guard(a.device.index);
    const int64_t n = static_cast<int64_t>(a.list.size());
    void* stream = current_cuda_stream(op, a.device.index);
    if (!norms && !total)
      return mixprec_cuda_unscale(a.list.data(), n, a.inv_scale, a.found_inf, nullptr, nullptr,
                                  nullptr, 0, stream);
    const int64_t ws_bytes = mixprec_cuda_unscale_workspace_size(a.list.data(), n, 1);
    MIXPREC_CHECK(ws_bytes >= 0, "mixprec::unscale_norm_: invalid tensor list");
    // Scratch from torch's caching allocator on the current stream, so the
    // call stays capturable in a CUDA graph.
    Tensor ws = torch::stable::new_empty(like, {ws_bytes > 0 ? ws_bytes : 1}, ScalarType::Byte);
    return (write ? mixprec_cuda_unscale : mixprec_cuda_grad_norm)(
        a.list.data(), n, a.inv_scale, a.found_inf, norms, total, ws.data_ptr(), ws_bytes,
        stream);
  }
  static mixprec_status update_scale(const char* op, const UpdateScaleArgs& a) {
    torch::stable::accelerator::DeviceGuard guard(a.device.index);
    return mixprec_cuda_update_scale(a.scale, a.growth_tracker, a.hysteresis_tracker,
                                     a.skipped_steps, a.found_inf, &a.params,
                                     current_cuda_stream(op, a.device.index));
  }
};

}  // namespace
}  // namespace amp
}  // namespace mixprec_shim

STABLE_TORCH_LIBRARY_IMPL(mixprec, CUDA, m) {
  namespace amp = mixprec_shim::amp;
  using B = amp::CudaBackend;
  m.impl("unscale_", TORCH_BOX(&amp::unscale_op<B>));
  m.impl("unscale_norm_", TORCH_BOX(&amp::unscale_norm_op<B>));
  m.impl("grad_norm", TORCH_BOX(&amp::grad_norm_op<B>));
  m.impl("update_scale_", TORCH_BOX(&amp::update_scale_op<B>));
  m.impl("update_scale_ex_", TORCH_BOX(&amp::update_scale_ex_op<B>));
}
