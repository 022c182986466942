// The amp ops (unscale_, unscale_norm_, grad_norm, update_scale_,
// update_scale_ex_), validated once for both devices: each op is a template
// over a backend B (amp.cpp: CPU, amp_cuda.cpp: CUDA) that only says how to
// run the C entry point:
//   B::check_device(op, where)                   the tensors are B's
//   B::unscale(op, args, norms, total, write, like) -> mixprec_status
//     (norms/total null: no norm; write false: mixprec_grad_norm)
//   B::update_scale(op, args)                     -> mixprec_status
// Every check runs before any kernel, so a failed call leaves all inputs
// untouched.
#pragma once

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "common.h"

namespace mixprec_shim {
namespace amp {

struct UnscaleArgs {
  std::vector<mixprec_tensor> list;
  Where device;
  float* found_inf;
  const float* inv_scale;
  // [note: non-dense grads] The C kernels walk a tensor as one flat array,
  // so a grad that is not dense (g[:, :5], which torch's
  // _amp_foreach_non_finite_check_and_unscale_ takes) runs on a dense copy
  // in its own dtype: staged[k] is the copy of grads[staged_index[k]]. The
  // element rule is the same, so the bits are torch's. After a successful
  // write the copies go back through an alias made with from_blob: it shares
  // the grad's memory but not its version counter, so the only version bump
  // is the op's own (the ADInplaceOrView kernel of _amp.py), one per grad as
  // for a dense grad.
  std::vector<Tensor> staged;
  std::vector<size_t> staged_index;
};

// No two elements of t share memory (no stride-0 or otherwise overlapping
// dimensions): sorted by stride, each dimension must step past everything
// the smaller ones cover. What a tensor written in place must satisfy.
inline bool no_internal_overlap(const Tensor& t) {
  auto sizes = t.sizes();
  auto strides = t.strides();
  std::vector<int64_t> order;
  for (int64_t d = 0; d < t.dim(); d++)
    if (sizes[d] > 1) order.push_back(d);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return strides[a] < strides[b]; });
  int64_t reach = 0;  // the largest offset the dimensions seen so far span
  for (int64_t d : order) {
    if (strides[d] <= reach) return false;
    reach += (sizes[d] - 1) * strides[d];
  }
  return true;
}

// Grads: a non-empty list of strided float32/float16/bfloat16 tensors on
// found_inf's device, any strides (see [note: non-dense grads]); written
// ones (write) must not overlap one another or themselves. read_only
// (grad_norm): the same grad may be listed twice, as torch._foreach_norm
// takes it. found_inf and inv_scale: one-element float32 tensors on that
// device, overlapping nothing.
inline UnscaleArgs unscale_args(const char* op, const std::vector<Tensor>& grads,
                                const Tensor& found_inf, const Tensor& inv_scale,
                                bool write = true) {
  UnscaleArgs a;
  a.device = where(found_inf);
  check_scalar(op, "found_inf", found_inf, ScalarType::Float, a.device, nullptr);
  check_scalar(op, "inv_scale", inv_scale, ScalarType::Float, a.device, nullptr);
  MIXPREC_CHECK(!grads.empty(), "mixprec::", op, ": grads must be a non-empty list of tensors");
  a.list.reserve(grads.size());
  for (size_t i = 0; i < grads.size(); i++) {
    const Tensor& g = grads[i];
    MIXPREC_CHECK(g.defined(), "mixprec::", op, ": grads[", i, "] is undefined");
    MIXPREC_CHECK(g.layout() == Layout::Strided, "mixprec::", op, ": grads[", i,
                    "] must be a strided tensor (sparse gradients are not supported)");
    mixprec_dtype dt;
    MIXPREC_CHECK(to_mixprec_dtype(g.scalar_type(), &dt), "mixprec::", op, ": grads[", i,
                    "] must be float32, float16 or bfloat16, got ", dtype_name(g.scalar_type()));
    MIXPREC_CHECK(where(g) == a.device, "mixprec::", op, ": grads[", i, "] is on ",
                    describe(where(g)), " but found_inf is on ", describe(a.device));
    MIXPREC_CHECK(!write || no_internal_overlap(g), "mixprec::", op, ": grads[", i,
                  "] has elements that share memory (an expanded view?) and cannot be "
                  "written in place; clone() it first");
    // Strides are never negative in torch, so a dense tensor's data_ptr() is
    // the lowest address of its elements whatever the dimension order.
    a.list.push_back({g.numel() ? g.data_ptr() : nullptr, g.numel(), dt});
  }
  // Written grads may not share memory (mixprec/amp.h: the tensors must not
  // overlap): a grad listed twice would be unscaled twice. found_inf inside a
  // grad or inv_scale would change what the kernel reads, so it overlaps
  // nothing in either mode. Spans of non-dense grads are bounding ranges:
  // two interleaved views of one buffer are refused too.
  std::vector<Span> spans;
  spans.reserve(grads.size() + 2);
  if (write) {
    for (size_t i = 0; i < grads.size(); i++)
      add_span(spans, grads[i], "grads", static_cast<int64_t>(i));
    add_span(spans, found_inf, "found_inf");
    add_span(spans, inv_scale, "inv_scale");
    check_disjoint(op, std::move(spans));
  } else {
    for (size_t i = 0; i < grads.size(); i++) {
      std::vector<Span> pair;
      add_span(pair, grads[i], "grads", static_cast<int64_t>(i));
      add_span(pair, found_inf, "found_inf");
      check_disjoint(op, std::move(pair));
    }
    add_span(spans, found_inf, "found_inf");
    add_span(spans, inv_scale, "inv_scale");
    check_disjoint(op, std::move(spans));
  }
  // Every check has passed: only now the copies (allocations, no writes).
  for (size_t i = 0; i < grads.size(); i++) {
    if (grads[i].numel() == 0 || is_dense(grads[i])) continue;
    a.staged.push_back(torch::stable::contiguous(grads[i]));
    a.staged_index.push_back(i);
    a.list[i].data = a.staged.back().data_ptr();
  }
  a.found_inf = static_cast<float*>(found_inf.data_ptr());
  a.inv_scale = static_cast<const float*>(inv_scale.data_ptr());
  return a;
}

struct UpdateScaleArgs {
  float* scale;
  int32_t* growth_tracker;
  int32_t* hysteresis_tracker;  // may be null
  int64_t* skipped_steps;       // may be null
  const float* found_inf;
  mixprec_update_scale_params params;
  Where device;
};

// hysteresis_tracker / skipped_steps are null for update_scale_.
inline UpdateScaleArgs update_scale_args(const char* op, const Tensor& scale,
                                         const Tensor& growth_tracker,
                                         const Tensor* hysteresis_tracker,
                                         const Tensor* skipped_steps, const Tensor& found_inf,
                                         double growth_factor, double backoff_factor,
                                         int64_t growth_interval, int64_t hysteresis,
                                         double min_scale, double max_scale) {
  UpdateScaleArgs a;
  a.device = where(scale);
  check_scalar(op, "scale", scale, ScalarType::Float, a.device, "scale");
  check_scalar(op, "growth_tracker", growth_tracker, ScalarType::Int, a.device, "scale");
  check_scalar(op, "found_inf", found_inf, ScalarType::Float, a.device, "scale");
  a.hysteresis_tracker = nullptr;
  a.skipped_steps = nullptr;
  if (hysteresis_tracker) {
    check_scalar(op, "hysteresis_tracker", *hysteresis_tracker, ScalarType::Int, a.device,
                 "scale");
    a.hysteresis_tracker = static_cast<int32_t*>(hysteresis_tracker->data_ptr());
  }
  if (skipped_steps) {
    check_scalar(op, "skipped_steps", *skipped_steps, ScalarType::Long, a.device, "scale");
    a.skipped_steps = static_cast<int64_t*>(skipped_steps->data_ptr());
  }
  MIXPREC_CHECK(std::isfinite(growth_factor) && growth_factor > 0, "mixprec::", op,
                  ": growth_factor must be finite and positive, got ", growth_factor);
  MIXPREC_CHECK(std::isfinite(backoff_factor) && backoff_factor > 0, "mixprec::", op,
                  ": backoff_factor must be finite and positive, got ", backoff_factor);
  MIXPREC_CHECK(growth_interval >= 1 && growth_interval <= INT32_MAX, "mixprec::", op,
                  ": growth_interval must be in [1, 2^31), got ", growth_interval);
  MIXPREC_CHECK(hysteresis >= 1 && hysteresis <= INT32_MAX, "mixprec::", op,
                  ": hysteresis must be in [1, 2^31), got ", hysteresis);
  MIXPREC_CHECK(min_scale >= 0 && max_scale >= min_scale, "mixprec::", op,
                  ": need 0 <= min_scale <= max_scale, got min_scale=", min_scale,
                  " max_scale=", max_scale);
  // The states are written, found_inf read: none may share memory.
  std::vector<Span> spans;
  add_span(spans, scale, "scale");
  add_span(spans, growth_tracker, "growth_tracker");
  if (hysteresis_tracker) add_span(spans, *hysteresis_tracker, "hysteresis_tracker");
  if (skipped_steps) add_span(spans, *skipped_steps, "skipped_steps");
  add_span(spans, found_inf, "found_inf");
  check_disjoint(op, std::move(spans));
  a.scale = static_cast<float*>(scale.data_ptr());
  a.growth_tracker = static_cast<int32_t*>(growth_tracker.data_ptr());
  a.found_inf = static_cast<const float*>(found_inf.data_ptr());
  a.params.growth_factor = growth_factor;
  a.params.backoff_factor = backoff_factor;
  a.params.growth_interval = growth_interval;
  a.params.hysteresis = hysteresis;
  a.params.min_scale = static_cast<float>(min_scale);
  a.params.max_scale = static_cast<float>(max_scale);
  return a;
}

// The unscaled copies back into their non-dense grads ([note: non-dense
// grads]), on the grads' device (torch's copy_, current stream on CUDA).
inline void copy_back_staged(const UnscaleArgs& a, const std::vector<Tensor>& grads) {
  for (size_t k = 0; k < a.staged.size(); k++) {
    const Tensor& g = grads[a.staged_index[k]];
    Tensor alias = torch::stable::from_blob(g.data_ptr(), g.sizes(), g.strides(), g.device(),
                                            g.scalar_type());
    torch::stable::copy_(alias, a.staged[k]);
  }
}

template <class B>
void unscale_op(std::vector<Tensor> grads, Tensor found_inf, Tensor inv_scale) {
  const char* op = "unscale_";
  UnscaleArgs a = unscale_args(op, grads, found_inf, inv_scale);
  B::check_device(op, a.device);
  check_status(B::unscale(op, a, nullptr, nullptr, true, found_inf), op);
  copy_back_staged(a, grads);
}

// unscale_norm_ (write) and grad_norm (read only): the same call.
template <class B>
std::tuple<Tensor, Tensor> norm_op(const char* op, bool write, const std::vector<Tensor>& grads,
                                   const Tensor& found_inf, const Tensor& inv_scale) {
  UnscaleArgs a = unscale_args(op, grads, found_inf, inv_scale, write);
  B::check_device(op, a.device);
  const int64_t n = static_cast<int64_t>(a.list.size());
  Tensor norms = torch::stable::new_empty(found_inf, {n}, ScalarType::Float);
  Tensor total = torch::stable::new_empty(found_inf, {}, ScalarType::Float);
  check_status(B::unscale(op, a, static_cast<float*>(norms.data_ptr()),
                          static_cast<float*>(total.data_ptr()), write, found_inf),
               op);
  if (write) copy_back_staged(a, grads);
  return {norms, total};
}

template <class B>
std::tuple<Tensor, Tensor> unscale_norm_op(std::vector<Tensor> grads, Tensor found_inf,
                                           Tensor inv_scale) {
  return norm_op<B>("unscale_norm_", true, grads, found_inf, inv_scale);
}

template <class B>
std::tuple<Tensor, Tensor> grad_norm_op(std::vector<Tensor> grads, Tensor found_inf,
                                        Tensor inv_scale) {
  return norm_op<B>("grad_norm", false, grads, found_inf, inv_scale);
}

// update_scale_ is update_scale_ex_ without hysteresis, bounds or counter.
template <class B>
void update_scale_op(Tensor scale, Tensor growth_tracker, Tensor found_inf, double growth_factor,
                     double backoff_factor, int64_t growth_interval) {
  const char* op = "update_scale_";
  UpdateScaleArgs a = update_scale_args(op, scale, growth_tracker, nullptr, nullptr, found_inf,
                                        growth_factor, backoff_factor, growth_interval, 1, 0.0,
                                        INFINITY);
  B::check_device(op, a.device);
  check_status(B::update_scale(op, a), op);
}

template <class B>
void update_scale_ex_op(Tensor scale, Tensor growth_tracker, Tensor hysteresis_tracker,
                        Tensor skipped_steps, Tensor found_inf, double growth_factor,
                        double backoff_factor, int64_t growth_interval, int64_t hysteresis,
                        double min_scale, double max_scale) {
  const char* op = "update_scale_ex_";
  UpdateScaleArgs a = update_scale_args(op, scale, growth_tracker, &hysteresis_tracker,
                                        &skipped_steps, found_inf, growth_factor, backoff_factor,
                                        growth_interval, hysteresis, min_scale, max_scale);
  B::check_device(op, a.device);
  check_status(B::update_scale(op, a), op);
}

}  // namespace amp
}  // namespace mixprec_shim
