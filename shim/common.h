// Shared by the CPU and CUDA registrations: the ONE place where the torch
// arguments of each op are validated and turned into C API arguments. Every
// check runs before any kernel, so a failed call leaves all inputs untouched.
#pragma once

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "mixprec/mixprec.h"

namespace mixprec_shim {

using torch::stable::Tensor;

// Raises RuntimeError "mixprec::<op>: <C status text>" unless st is OK.
void check_status(mixprec_status st, const char* op);

// Device of a tensor as (is_cuda, index); CPU tensors have index -1.
struct Where {
  bool cuda;
  int32_t index;
  bool operator==(const Where& o) const { return cuda == o.cuda && index == o.index; }
};
Where where(const Tensor& t);

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

struct ScaleUpdateArgs {
  float* scale;
  int32_t* growth_tracker;
  int32_t* hysteresis_tracker;  // may be null
  int64_t* skipped_steps;       // may be null
  const float* found_inf;
  mixprec_scale_update_params params;
  Where device;
};

// Validates the arguments of mixprec::update_scale_ / update_scale_ex_;
// hysteresis_tracker / skipped_steps are null tensors for update_scale_.
ScaleUpdateArgs scale_update_args(const char* op, const Tensor& scale,
                                  const Tensor& growth_tracker,
                                  const Tensor* hysteresis_tracker,
                                  const Tensor* skipped_steps,
                                  const Tensor& found_inf, double growth_factor,
                                  double backoff_factor, int64_t growth_interval,
                                  int64_t hysteresis, double min_scale,
                                  double max_scale);

// The two update ops, for a backend whose runner enqueues the C call:
// update_scale_ is update_scale_ex_ without hysteresis, bounds or counter.
template <void (*Run)(const char* op, const ScaleUpdateArgs&)>
void update_scale_op(Tensor scale, Tensor growth_tracker, Tensor found_inf,
                     double growth_factor, double backoff_factor, int64_t growth_interval) {
  Run("update_scale_",
      scale_update_args("update_scale_", scale, growth_tracker, nullptr, nullptr, found_inf,
                        growth_factor, backoff_factor, growth_interval, 1, 0.0, INFINITY));
}

template <void (*Run)(const char* op, const ScaleUpdateArgs&)>
void update_scale_ex_op(Tensor scale, Tensor growth_tracker, Tensor hysteresis_tracker,
                        Tensor skipped_steps, Tensor found_inf, double growth_factor,
                        double backoff_factor, int64_t growth_interval, int64_t hysteresis,
                        double min_scale, double max_scale) {
  Run("update_scale_ex_",
      scale_update_args("update_scale_ex_", scale, growth_tracker, &hysteresis_tracker,
                        &skipped_steps, found_inf, growth_factor, backoff_factor,
                        growth_interval, hysteresis, min_scale, max_scale));
}

}  // namespace mixprec_shim
