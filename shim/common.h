// Shared by the CPU and CUDA registrations: the ONE place where the torch
// arguments of each op are validated and turned into C API arguments. Every
// check runs before any kernel, so a failed call leaves all inputs untouched.
#pragma once

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mixprec/mixprec.h"

namespace mixprec_shim {

using torch::stable::Tensor;

// Raises RuntimeError "mixprec::<op>: <C status text>" unless st is OK.
void check_status(mixprec_status st, const char* op);

// "float32", "float16", ... for error messages.
const char* dtype_name(torch::headeronly::ScalarType s);

// The mixprec dtype of float32 / float16 / bfloat16; false for any other.
bool to_mixprec_dtype(torch::headeronly::ScalarType s, mixprec_dtype* d);

// Device of a tensor as (is_cuda, index); CPU tensors have index -1.
struct Where {
  bool cuda;
  int32_t index;
  bool operator==(const Where& o) const { return cuda == o.cuda && index == o.index; }
};
Where where(const Tensor& t);

// "cpu", "cuda:1", ... for error messages.
std::string describe(const Where& w);

struct UnscaleArgs {
  std::vector<mixprec_tensor> list;
  Where device;
  float* found_inf;
  const float* inv_scale;
};

// Validates (grads, found_inf, inv_scale) of mixprec::<op> and returns the C
// descriptors. Grads: a non-empty list of strided, dense (any dimension order,
// e.g. channels_last) float32/float16/bfloat16 tensors on found_inf's device.
// found_inf and inv_scale: one-element float32 tensors on that device.
UnscaleArgs unscale_args(const char* op, const std::vector<Tensor>& grads,
                         const Tensor& found_inf, const Tensor& inv_scale);

struct UpdateScaleArgs {
  float* scale;
  int32_t* growth_tracker;
  int32_t* hysteresis_tracker;  // may be null
  int64_t* skipped_steps;       // may be null
  const float* found_inf;
  mixprec_update_scale_params params;
  Where device;
};

// Validates the arguments of mixprec::update_scale_ / update_scale_ex_;
// hysteresis_tracker / skipped_steps are null tensors for update_scale_.
UpdateScaleArgs update_scale_args(const char* op, const Tensor& scale,
                                  const Tensor& growth_tracker,
                                  const Tensor* hysteresis_tracker,
                                  const Tensor* skipped_steps,
                                  const Tensor& found_inf, double growth_factor,
                                  double backoff_factor, int64_t growth_interval,
                                  int64_t hysteresis, double min_scale,
                                  double max_scale);

struct OptArgs {
  std::vector<mixprec_opt_tensor> list;
  Where device;
  const float* lr_tensor;   // null when absent
  const float* grad_scale;  // null when absent
  const float* found_inf;   // null when absent
};

// Validates the tensor lists of mixprec::adamw_step_ / sgd_step_ (one place
// for both backends). params: float32/float16/bfloat16, dense; grads: same
// sizes and strides, any of the three dtypes; masters: float32 with the
// param's sizes and strides, or an empty tensor for a float32 param (which is
// its own master); state lists (names given by the caller, empty list =
// absent): float32 with the param's sizes and strides; steps: one-element
// float32 each. Every tensor on the params' device.
OptArgs opt_args(const char* op, const std::vector<Tensor>& params,
                 const std::vector<Tensor>& grads, const std::vector<Tensor>& masters,
                 const std::vector<Tensor>* states[], const char* const state_names[],
                 int n_states, const std::vector<Tensor>& steps,
                 const std::optional<Tensor>& lr_tensor, const std::optional<Tensor>& grad_scale,
                 const std::optional<Tensor>& found_inf);

// The two update ops, for a backend whose runner enqueues the C call:
// update_scale_ is update_scale_ex_ without hysteresis, bounds or counter.
template <void (*Run)(const char* op, const UpdateScaleArgs&)>
void update_scale_op(Tensor scale, Tensor growth_tracker, Tensor found_inf,
                     double growth_factor, double backoff_factor, int64_t growth_interval) {
  Run("update_scale_",
      update_scale_args("update_scale_", scale, growth_tracker, nullptr, nullptr, found_inf,
                        growth_factor, backoff_factor, growth_interval, 1, 0.0, INFINITY));
}

template <void (*Run)(const char* op, const UpdateScaleArgs&)>
void update_scale_ex_op(Tensor scale, Tensor growth_tracker, Tensor hysteresis_tracker,
                        Tensor skipped_steps, Tensor found_inf, double growth_factor,
                        double backoff_factor, int64_t growth_interval, int64_t hysteresis,
                        double min_scale, double max_scale) {
  Run("update_scale_ex_",
      update_scale_args("update_scale_ex_", scale, growth_tracker, &hysteresis_tracker,
                        &skipped_steps, found_inf, growth_factor, backoff_factor,
                        growth_interval, hysteresis, min_scale, max_scale));
}

// The optimizer ops, for a backend whose runners enqueue the C calls.
using AdamwRunner = mixprec_status (*)(const mixprec_opt_tensor*, int64_t,
                                       const mixprec_adamw_params*, int32_t device);
using SgdRunner = mixprec_status (*)(const mixprec_opt_tensor*, int64_t,
                                     const mixprec_sgd_params*, int32_t device);

template <AdamwRunner Run>
void adamw_step_op(std::vector<Tensor> params, std::vector<Tensor> grads,
                   std::vector<Tensor> masters, std::vector<Tensor> exp_avgs,
                   std::vector<Tensor> exp_avg_sqs, std::vector<Tensor> max_exp_avg_sqs,
                   std::vector<Tensor> steps, double lr, double beta1, double beta2,
                   double weight_decay, double eps, bool amsgrad, bool maximize,
                   std::optional<Tensor> lr_tensor, std::optional<Tensor> grad_scale,
                   std::optional<Tensor> found_inf, int64_t sr_seed) {
  const char* op = "adamw_step_";
  STD_TORCH_CHECK(!exp_avgs.empty() && !exp_avg_sqs.empty(), "mixprec::", op,
                  ": exp_avgs and exp_avg_sqs are required");
  STD_TORCH_CHECK(amsgrad == !max_exp_avg_sqs.empty(), "mixprec::", op,
                  ": max_exp_avg_sqs must be given exactly when amsgrad is true");
  const std::vector<Tensor>* states[3] = {&exp_avgs, &exp_avg_sqs, &max_exp_avg_sqs};
  const char* const names[3] = {"exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs"};
  OptArgs a = opt_args(op, params, grads, masters, states, names, 3, steps, lr_tensor,
                       grad_scale, found_inf);
  mixprec_adamw_params p = mixprec_adamw_params_default();
  p.lr = lr;
  p.beta1 = beta1;
  p.beta2 = beta2;
  p.weight_decay = weight_decay;
  p.eps = eps;
  p.amsgrad = amsgrad;
  p.maximize = maximize;
  p.lr_tensor = a.lr_tensor;
  p.grad_scale = a.grad_scale;
  p.found_inf = a.found_inf;
  p.sr_seed = (uint64_t)sr_seed;
  check_status(Run(a.list.data(), (int64_t)a.list.size(), &p, a.device.index), op);
}

template <SgdRunner Run>
void sgd_step_op(std::vector<Tensor> params, std::vector<Tensor> grads,
                 std::vector<Tensor> masters, std::vector<Tensor> momentum_buffers,
                 std::vector<Tensor> steps, double lr, double momentum, double dampening,
                 double weight_decay, bool nesterov, bool maximize,
                 std::optional<Tensor> lr_tensor, std::optional<Tensor> grad_scale,
                 std::optional<Tensor> found_inf, int64_t sr_seed) {
  const char* op = "sgd_step_";
  STD_TORCH_CHECK((momentum != 0) == !momentum_buffers.empty(), "mixprec::", op,
                  ": momentum_buffers must be given exactly when momentum is not 0");
  const std::vector<Tensor>* states[1] = {&momentum_buffers};
  const char* const names[1] = {"momentum_buffers"};
  OptArgs a = opt_args(op, params, grads, masters, states, names, 1, steps, lr_tensor,
                       grad_scale, found_inf);
  mixprec_sgd_params p = mixprec_sgd_params_default();
  p.lr = lr;
  p.momentum = momentum;
  p.dampening = dampening;
  p.weight_decay = weight_decay;
  p.nesterov = nesterov;
  p.maximize = maximize;
  p.lr_tensor = a.lr_tensor;
  p.grad_scale = a.grad_scale;
  p.found_inf = a.found_inf;
  p.sr_seed = (uint64_t)sr_seed;
  check_status(Run(a.list.data(), (int64_t)a.list.size(), &p, a.device.index), op);
}

// NMS (nms.cpp, nms_cuda.cpp): the C arguments of mixprec::nms /
// batched_nms / nms_padded after every check. boxes: (N, 4) contiguous
// float32/float16/bfloat16; scores: (N,) contiguous, one of those dtypes;
// idxs (batched, may be null): (N,) contiguous int64/int32; all on one
// device; iou_threshold >= 0, thresholds not NaN.
struct NmsArgs {
  const void* boxes;
  mixprec_dtype boxes_dtype;
  const void* scores;
  mixprec_dtype scores_dtype;
  const void* classes;  // null: one class
  mixprec_index_dtype classes_dtype;
  int64_t n;
  int64_t capacity;  // entries of the padded output
  mixprec_nms_params params;
  Where device;
};
NmsArgs nms_args(const char* op, const Tensor& boxes, const Tensor& scores, const Tensor* idxs,
                 double iou_threshold, std::optional<double> score_threshold, int64_t max_output);

}  // namespace mixprec_shim
