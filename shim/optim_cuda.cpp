// The CUDA backend of the optim family: after optim_op.h's validation,
// enqueue the CUDA C API on torch's current stream of the params' device. A
// skipped step is decided on the device: no host synchronisation.
#include <torch/csrc/stable/accelerator.h>

#include "cuda_common.h"
#include "optim_op.h"

namespace mixprec_shim {
namespace optim {
namespace {

struct CudaBackend {
  static void check_device(const char* op, const Where& w) { check_cuda_device(op, w); }
  static mixprec_status step(const char* op, const OptArgs& a, const mixprec_adamw_params& p) {
    torch::stable::accelerator::DeviceGuard guard(a.device.index);
    return mixprec_cuda_adamw_step(a.list.data(), static_cast<int64_t>(a.list.size()), &p,
                                   current_cuda_stream(op, a.device.index));
  }
  static mixprec_status step(const char* op, const OptArgs& a, const mixprec_sgd_params& p) {
    torch::stable::accelerator::DeviceGuard guard(a.device.index);
    return mixprec_cuda_sgd_step(a.list.data(), static_cast<int64_t>(a.list.size()), &p,
                                 current_cuda_stream(op, a.device.index));
  }
};

}  // namespace
}  // namespace optim
}  // namespace mixprec_shim

STABLE_TORCH_LIBRARY_IMPL(mixprec, CUDA, m) {
  namespace optim = mixprec_shim::optim;
  using B = optim::CudaBackend;
  m.impl("adamw_step_", TORCH_BOX(&optim::adamw_step_op<B>));
  m.impl("sgd_step_", TORCH_BOX(&optim::sgd_step_op<B>));
}
