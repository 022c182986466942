// CPU implementations: validate (common.cpp), then call the C API.
#include <torch/headeronly/core/ScalarType.h>

#include <tuple>

#include "common.h"

namespace mixprec_shim {
namespace {

using torch::headeronly::ScalarType;

void unscale_cpu(std::vector<Tensor> grads, Tensor found_inf, Tensor inv_scale) {
  UnscaleArgs a = unscale_args("unscale_", grads, found_inf, inv_scale);
  check_status(mixprec_unscale(a.list.data(), (int64_t)a.list.size(), a.inv_scale,
                               a.found_inf, nullptr, nullptr),
               "unscale_");
}

using CpuNormFn = mixprec_status (*)(const mixprec_tensor*, int64_t, const float*, float*,
                                     float*, float*);

// unscale_norm_ (in place) and grad_norm (read only): the same call.
template <CpuNormFn Fn>
std::tuple<Tensor, Tensor> norm_cpu(const char* op, std::vector<Tensor> grads, Tensor found_inf,
                                    Tensor inv_scale) {
  UnscaleArgs a = unscale_args(op, grads, found_inf, inv_scale);
  int64_t n = (int64_t)a.list.size();
  Tensor norms = torch::stable::new_empty(found_inf, {n}, ScalarType::Float);
  Tensor total = torch::stable::new_empty(found_inf, {}, ScalarType::Float);
  check_status(Fn(a.list.data(), n, a.inv_scale, a.found_inf,
                  static_cast<float*>(norms.data_ptr()), static_cast<float*>(total.data_ptr())),
               op);
  return {norms, total};
}

std::tuple<Tensor, Tensor> unscale_norm_cpu(std::vector<Tensor> grads, Tensor found_inf,
                                            Tensor inv_scale) {
  return norm_cpu<mixprec_unscale>("unscale_norm_", grads, found_inf, inv_scale);
}

std::tuple<Tensor, Tensor> grad_norm_cpu(std::vector<Tensor> grads, Tensor found_inf,
                                         Tensor inv_scale) {
  return norm_cpu<mixprec_grad_norm>("grad_norm", grads, found_inf, inv_scale);
}

void run_update_cpu(const char* op, const UpdateScaleArgs& a) {
  check_status(mixprec_update_scale(a.scale, a.growth_tracker, a.hysteresis_tracker,
                                    a.skipped_steps, a.found_inf, &a.params),
               op);
}

mixprec_status adamw_cpu(const mixprec_opt_tensor* list, int64_t n,
                         const mixprec_adamw_params* p, int32_t) {
  return mixprec_adamw_step(list, n, p);
}

mixprec_status sgd_cpu(const mixprec_opt_tensor* list, int64_t n, const mixprec_sgd_params* p,
                       int32_t) {
  return mixprec_sgd_step(list, n, p);
}

}  // namespace
}  // namespace mixprec_shim

STABLE_TORCH_LIBRARY_IMPL(mixprec, CPU, m) {
  m.impl("unscale_", TORCH_BOX(&mixprec_shim::unscale_cpu));
  m.impl("unscale_norm_", TORCH_BOX(&mixprec_shim::unscale_norm_cpu));
  m.impl("grad_norm", TORCH_BOX(&mixprec_shim::grad_norm_cpu));
  m.impl("update_scale_",
         TORCH_BOX(&mixprec_shim::update_scale_op<mixprec_shim::run_update_cpu>));
  m.impl("update_scale_ex_",
         TORCH_BOX(&mixprec_shim::update_scale_ex_op<mixprec_shim::run_update_cpu>));
  m.impl("adamw_step_", TORCH_BOX(&mixprec_shim::adamw_step_op<mixprec_shim::adamw_cpu>));
  m.impl("sgd_step_", TORCH_BOX(&mixprec_shim::sgd_step_op<mixprec_shim::sgd_cpu>));
}
