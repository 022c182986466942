// CUDA implementations: validate (common.cpp), then enqueue the CUDA C API on
// torch's current stream of the tensors' device. No host synchronisation.
#include <torch/csrc/stable/accelerator.h>
#include <torch/headeronly/core/ScalarType.h>

#include <tuple>

#include "cuda_common.h"

namespace mixprec_shim {
namespace {

using torch::headeronly::ScalarType;


void unscale_cuda(std::vector<Tensor> grads, Tensor found_inf, Tensor inv_scale) {
  UnscaleArgs a = unscale_args("unscale_", grads, found_inf, inv_scale);
  check_cuda_device("unscale_", a.device);
  torch::stable::accelerator::DeviceGuard guard(a.device.index);
  check_status(mixprec_cuda_unscale(a.list.data(), (int64_t)a.list.size(), a.inv_scale,
                                    a.found_inf, nullptr, nullptr, nullptr, 0,
                                    current_cuda_stream("unscale_", a.device.index)),
               "unscale_");
}

using CudaNormFn = mixprec_status (*)(const mixprec_tensor*, int64_t, const float*, float*,
                                      float*, float*, void*, int64_t, void*);

// unscale_norm_ (in place) and grad_norm (read only): the same launch.
template <CudaNormFn Fn>
std::tuple<Tensor, Tensor> norm_cuda(const char* op, std::vector<Tensor> grads, Tensor found_inf,
                                     Tensor inv_scale) {
  UnscaleArgs a = unscale_args(op, grads, found_inf, inv_scale);
  check_cuda_device(op, a.device);
  torch::stable::accelerator::DeviceGuard guard(a.device.index);
  int64_t n = (int64_t)a.list.size();
  int64_t ws_bytes = mixprec_cuda_unscale_workspace_size(a.list.data(), n, 1);
  STD_TORCH_CHECK(ws_bytes >= 0, "mixprec::unscale_norm_: invalid tensor list");
  // Scratch and outputs come from torch's caching allocator on the current
  // stream, so the call stays capturable in a CUDA graph.
  Tensor workspace = torch::stable::new_empty(found_inf, {ws_bytes > 0 ? ws_bytes : 1}, ScalarType::Byte);
  Tensor norms = torch::stable::new_empty(found_inf, {n}, ScalarType::Float);
  Tensor total = torch::stable::new_empty(found_inf, {}, ScalarType::Float);
  check_status(Fn(a.list.data(), n, a.inv_scale, a.found_inf,
                  static_cast<float*>(norms.data_ptr()), static_cast<float*>(total.data_ptr()),
                  workspace.data_ptr(), ws_bytes, current_cuda_stream(op, a.device.index)),
               op);
  return {norms, total};
}

std::tuple<Tensor, Tensor> unscale_norm_cuda(std::vector<Tensor> grads, Tensor found_inf,
                                             Tensor inv_scale) {
  return norm_cuda<mixprec_cuda_unscale>("unscale_norm_", grads, found_inf, inv_scale);
}

std::tuple<Tensor, Tensor> grad_norm_cuda(std::vector<Tensor> grads, Tensor found_inf,
                                          Tensor inv_scale) {
  return norm_cuda<mixprec_cuda_grad_norm>("grad_norm", grads, found_inf, inv_scale);
}

void run_update_cuda(const char* op, const UpdateScaleArgs& a) {
  check_cuda_device(op, a.device);
  torch::stable::accelerator::DeviceGuard guard(a.device.index);
  check_status(mixprec_cuda_update_scale(a.scale, a.growth_tracker, a.hysteresis_tracker,
                                         a.skipped_steps, a.found_inf, &a.params,
                                         current_cuda_stream(op, a.device.index)),
               op);
}

mixprec_status adamw_cuda(const mixprec_opt_tensor* list, int64_t n,
                          const mixprec_adamw_params* p, int32_t device) {
  torch::stable::accelerator::DeviceGuard guard(device);
  return mixprec_cuda_adamw_step(list, n, p, current_cuda_stream("adamw_step_", device));
}

mixprec_status sgd_cuda(const mixprec_opt_tensor* list, int64_t n, const mixprec_sgd_params* p,
                        int32_t device) {
  torch::stable::accelerator::DeviceGuard guard(device);
  return mixprec_cuda_sgd_step(list, n, p, current_cuda_stream("sgd_step_", device));
}

}  // namespace
}  // namespace mixprec_shim

STABLE_TORCH_LIBRARY_IMPL(mixprec, CUDA, m) {
  m.impl("unscale_", TORCH_BOX(&mixprec_shim::unscale_cuda));
  m.impl("unscale_norm_", TORCH_BOX(&mixprec_shim::unscale_norm_cuda));
  m.impl("grad_norm", TORCH_BOX(&mixprec_shim::grad_norm_cuda));
  m.impl("update_scale_",
         TORCH_BOX(&mixprec_shim::update_scale_op<mixprec_shim::run_update_cuda>));
  m.impl("update_scale_ex_",
         TORCH_BOX(&mixprec_shim::update_scale_ex_op<mixprec_shim::run_update_cuda>));
  m.impl("adamw_step_", TORCH_BOX(&mixprec_shim::adamw_step_op<mixprec_shim::adamw_cuda>));
  m.impl("sgd_step_", TORCH_BOX(&mixprec_shim::sgd_step_op<mixprec_shim::sgd_cuda>));
}
