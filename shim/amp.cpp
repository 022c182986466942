// The amp family (loss scaling): its schemas, and its CPU backend. The
// validation is amp_op.h's, shared with the CUDA backend in amp_cuda.cpp.
// In-place ops return () (never an alias of a mutated input) so that
// functionalization and torch.compile handle them.
#include "amp_op.h"

namespace mixprec_shim {
namespace amp {
namespace {

struct CpuBackend {
  static void check_device(const char* op, const Where& w) { check_cpu_device(op, w); }
  static mixprec_status unscale(const char*, const UnscaleArgs& a, float* norms, float* total,
                                bool write, const Tensor&) {
    const int64_t n = static_cast<int64_t>(a.list.size());
    return write ? mixprec_unscale(a.list.data(), n, a.inv_scale, a.found_inf, norms, total)
                 : mixprec_grad_norm(a.list.data(), n, a.inv_scale, a.found_inf, norms, total);
  }
  static mixprec_status update_scale(const char*, const UpdateScaleArgs& a) {
    return mixprec_update_scale(a.scale, a.growth_tracker, a.hysteresis_tracker, a.skipped_steps,
                                a.found_inf, &a.params);
  }
};

}  // namespace
}  // namespace amp
}  // namespace mixprec_shim

STABLE_TORCH_LIBRARY_FRAGMENT(mixprec, m) {
  // torch._amp_foreach_non_finite_check_and_unscale_, for fp32/fp16/bf16
  // grads, mixed dtypes allowed in one list.
  m.def("unscale_(Tensor(a!)[] grads, Tensor(b!) found_inf, Tensor inv_scale) -> ()");
  // The same pass also returns the L2 norm of the unscaled grads: per tensor
  // (float32, shape [len(grads)]) and in total (float32, shape []), the
  // total being what torch.nn.utils.clip_grad_norm_ computes.
  m.def(
      "unscale_norm_(Tensor(a!)[] grads, Tensor(b!) found_inf, Tensor inv_scale)"
      " -> (Tensor, Tensor)");
  // The norms and non-finite check of unscale_norm_ (bit for bit) without
  // writing the grads: for clipping folded into the optimizer step.
  m.def("grad_norm(Tensor[] grads, Tensor(a!) found_inf, Tensor inv_scale) -> (Tensor, Tensor)");
  // torch._amp_update_scale_ (returns nothing instead of an alias of scale).
  m.def(
      "update_scale_(Tensor(a!) scale, Tensor(b!) growth_tracker, Tensor found_inf,"
      " float scale_growth_factor, float scale_backoff_factor, int growth_interval) -> ()");
  // Extended update: hysteresis, scale bounds and a device-side count of
  // skipped (overflowing) steps.
  m.def(
      "update_scale_ex_(Tensor(a!) scale, Tensor(b!) growth_tracker,"
      " Tensor(c!) hysteresis_tracker, Tensor(d!) skipped_steps, Tensor found_inf,"
      " float growth_factor, float backoff_factor, int growth_interval,"
      " int hysteresis, float min_scale, float max_scale) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(mixprec, CPU, m) {
  namespace amp = mixprec_shim::amp;
  using B = amp::CpuBackend;
  m.impl("unscale_", TORCH_BOX(&amp::unscale_op<B>));
  m.impl("unscale_norm_", TORCH_BOX(&amp::unscale_norm_op<B>));
  m.impl("grad_norm", TORCH_BOX(&amp::grad_norm_op<B>));
  m.impl("update_scale_", TORCH_BOX(&amp::update_scale_op<B>));
  m.impl("update_scale_ex_", TORCH_BOX(&amp::update_scale_ex_op<B>));
}
