// The schemas of every mixprec op: defined once here, implemented per device
// in cpu.cpp / cuda.cpp. In-place ops return () (never an alias of a mutated
// input) so functionalization and torch.compile handle them.
#include <torch/csrc/stable/library.h>

STABLE_TORCH_LIBRARY(mixprec, m) {
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
  // Fused master-weight optimizer steps. masters[i] is the FP32 master of a
  // float16/bfloat16 param, or an empty tensor for a float32 param. State
  // lists are float32; max_exp_avg_sqs is empty unless amsgrad, and
  // momentum_buffers empty when momentum is 0. steps: one float32 count per
  // param. lr (when given) overrides the float lr; grad_scale divides the
  // grads; a nonzero found_inf skips the whole step. All on the device.
  // A bfloat16 param whose masters[i] is empty goes without a master: it is
  // updated from its own value and written back with stochastic rounding
  // seeded by sr_seed (reproducible; c_ops/src/stochastic_round.h).
  m.def(
      "adamw_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] masters,"
      " Tensor(c!)[] exp_avgs, Tensor(d!)[] exp_avg_sqs, Tensor(e!)[] max_exp_avg_sqs,"
      " Tensor(f!)[] steps, float lr, float beta1, float beta2, float weight_decay,"
      " float eps, bool amsgrad, bool maximize, Tensor? lr_tensor, Tensor? grad_scale,"
      " Tensor? found_inf, int sr_seed=0) -> ()");
  m.def(
      "sgd_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] masters,"
      " Tensor(c!)[] momentum_buffers, Tensor(d!)[] steps, float lr, float momentum,"
      " float dampening, float weight_decay, bool nesterov, bool maximize,"
      " Tensor? lr_tensor, Tensor? grad_scale, Tensor? found_inf, int sr_seed=0) -> ()");
}
