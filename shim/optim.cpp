// The optim family (fused optimizer steps): its schemas, and its CPU
// backend. The validation is optim_op.h's, shared with the CUDA backend in
// optim_cuda.cpp.
#include "optim_op.h"

namespace mixprec_shim {
namespace optim {
namespace {

struct CpuBackend {
  static void check_device(const char* op, const Where& w) { check_cpu_device(op, w); }
  static mixprec_status step(const char*, const OptArgs& a, const mixprec_adamw_params& p) {
    return mixprec_adamw_step(a.list.data(), static_cast<int64_t>(a.list.size()), &p);
  }
  static mixprec_status step(const char*, const OptArgs& a, const mixprec_sgd_params& p) {
    return mixprec_sgd_step(a.list.data(), static_cast<int64_t>(a.list.size()), &p);
  }
};

}  // namespace
}  // namespace optim
}  // namespace mixprec_shim

STABLE_TORCH_LIBRARY_FRAGMENT(mixprec, m) {
  // Fused master-weight optimizer steps. masters[i] is the FP32 master of a
  // float16/bfloat16 param, or an empty tensor for a float32 param. State
  // lists are float32; max_exp_avg_sqs is empty unless amsgrad, and
  // momentum_buffers empty when momentum is 0. steps: one float32 count per
  // param. lr (when given) overrides the float lr; grad_scale divides the
  // grads; a nonzero found_inf skips the whole step. All on the device.
  // A bfloat16 param whose masters[i] is empty goes without a master: it is
  // updated from its own value and written back with stochastic rounding
  // seeded by sr_seed (reproducible; c_ops/src/stochastic_round.h).
  // grads are read only unless unscale_grads: then, when grad_scale is given
  // and the step is not skipped, each grad is overwritten with grad /
  // grad_scale in its dtype (what torch's fused optimizers leave in p.grad);
  // params, masters and state are the same either way. grads is declared
  // mutable (g!) for that path; with unscale_grads=False it is not written.
  // emas (empty: none): one float32 EMA buffer per param, moved toward the
  // new FP32 weights in the same pass, ema.lerp_(w, 1 - decay) with timm
  // ModelEmaV3's decay (ema_decay, ema_min_decay, ema_use_warmup,
  // ema_warmup_gamma, ema_warmup_power, ema_update_after_step) at the
  // param's step count after the step, on steps that are multiples of
  // ema_update_every; a skipped step writes none (mixprec_ema_params).
  // The lean state (mixprec_state_dtype in mixprec/optim.h; None or [] is
  // none): remainders[i] (int16, the param's shape) beside a bfloat16 param
  // whose masters[i] is empty holds its exact FP32 master with it; exp_avgs,
  // exp_avg_sqs (SGD: momentum_buffers) may be float32, bfloat16 (written
  // with stochastic rounding seeded by sr_seed) or uint8 (8-bit blockwise,
  // with ceil(numel / 256) float32 scales in exp_avg_scales[i] /
  // exp_avg_sq_scales[i], SGD buf_scales[i]; an empty tensor elsewhere).
  m.def(
      "adamw_step_(Tensor(a!)[] params, Tensor(g!)[] grads, Tensor(b!)[] masters,"
      " Tensor(c!)[] exp_avgs, Tensor(d!)[] exp_avg_sqs, Tensor(e!)[] max_exp_avg_sqs,"
      " Tensor(f!)[] steps, float lr, float beta1, float beta2, float weight_decay,"
      " float eps, bool amsgrad, bool maximize, Tensor? lr_tensor, Tensor? grad_scale,"
      " Tensor? found_inf, int sr_seed=0,"
      " bool unscale_grads=False, Tensor(h!)[]? emas=None, float ema_decay=0.9999,"
      " float ema_min_decay=0., bool ema_use_warmup=False, float ema_warmup_gamma=1.,"
      " float ema_warmup_power=0.66666666666666663, int ema_update_after_step=0,"
      " int ema_update_every=1, Tensor(r!)[]? remainders=None,"
      " Tensor(s!)[]? exp_avg_scales=None, Tensor(t!)[]? exp_avg_sq_scales=None) -> ()");
  m.def(
      "sgd_step_(Tensor(a!)[] params, Tensor(g!)[] grads, Tensor(b!)[] masters,"
      " Tensor(c!)[] momentum_buffers, Tensor(d!)[] steps, float lr, float momentum,"
      " float dampening, float weight_decay, bool nesterov, bool maximize,"
      " Tensor? lr_tensor, Tensor? grad_scale, Tensor? found_inf, int sr_seed=0,"
      " bool unscale_grads=False, Tensor(h!)[]? emas=None, float ema_decay=0.9999,"
      " float ema_min_decay=0., bool ema_use_warmup=False, float ema_warmup_gamma=1.,"
      " float ema_warmup_power=0.66666666666666663, int ema_update_after_step=0,"
      " int ema_update_every=1, Tensor(r!)[]? remainders=None,"
      " Tensor(s!)[]? buf_scales=None) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(mixprec, CPU, m) {
  namespace optim = mixprec_shim::optim;
  using B = optim::CpuBackend;
  m.impl("adamw_step_", TORCH_BOX(&optim::adamw_step_op<B>));
  m.impl("sgd_step_", TORCH_BOX(&optim::sgd_step_op<B>));
}
