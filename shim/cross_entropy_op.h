// The cross-entropy ops (cross_entropy, cross_entropy_backward, and for
// class-probability targets cross_entropy_soft(_backward)), validated
// once for both devices: each op is a template over a backend B
// (cross_entropy.cpp: CPU, cross_entropy_cuda.cpp: CUDA) that only says how
// to run the C entry point:
//   B::check_device(op, where)                             the tensors are B's
//   B::cross_entropy(args, loss, stats, weight_sum, like)  -> mixprec_status
//   B::cross_entropy_backward(args, grad_loss, stats, weight_sum, grad_logits)
//                                                          -> mixprec_status
//   B::cross_entropy_soft(args, loss, stats, like)          -> mixprec_status
//   B::cross_entropy_soft_backward(args, grad_loss, stats, grad_logits, grad_target)
//                                                          -> mixprec_status
// like: the tensor whose device scratch goes to.
#pragma once

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common.h"

namespace mixprec_shim {
namespace cross_entropy {

struct CeArgs {
  mixprec_cross_entropy_params p;
  mixprec_dtype dtype;
  Where device;
  Tensor logits, target, weight;  // contiguous
  std::vector<int64_t> loss_shape;  // target's shape
  int64_t positions;
  mixprec_dtype target_dtype;  // soft targets only
};

// The optional float32 class weights, one per class, on self's device.
inline void ce_weight(const char* op, const std::optional<Tensor>& weight, CeArgs& a) {
  if (!weight.has_value() || !weight->defined()) return;
  const Tensor& w = *weight;
  MIXPREC_CHECK(w.layout() == Layout::Strided && w.scalar_type() == ScalarType::Float,
                  "mixprec::", op, ": weight must be a float32 tensor, got ",
                  dtype_name(w.scalar_type()));
  MIXPREC_CHECK(w.dim() == 1 && w.sizes()[0] == a.p.classes, "mixprec::", op,
                  ": weight must have shape [", a.p.classes, "] (one per class), got ",
                  shape_str(w));
  same_device(op, "weight", w, a.device, "self");
  a.weight = dense(w);
  a.p.weight = a.p.classes ? static_cast<const float*>(a.weight.data_ptr()) : nullptr;
}

// What both families of checks begin with: self's dtype and device, at
// least one dimension, a defined strided target.
inline CeArgs ce_self(const char* op, const Tensor& self, const Tensor& target) {
  CeArgs a;
  a.dtype = float_arg(op, "self", self);
  a.device = where(self);
  MIXPREC_CHECK(self.dim() >= 1, "mixprec::", op,
                  ": self must have shape (C), (N, C) or (N, C, d1, ...), got a 0-dim tensor");
  MIXPREC_CHECK(target.defined() && target.layout() == Layout::Strided, "mixprec::", op,
                  ": target must be a defined strided tensor");
  return a;
}

// The checks both target kinds make once the shape is known (a.p's outer,
// classes and inner): classes, reduction, label_smoothing, then the weight.
inline void ce_options(const char* op, const std::optional<Tensor>& weight, int64_t reduction,
                       double label_smoothing, CeArgs& a) {
  a.positions = a.p.outer * a.p.inner;
  MIXPREC_CHECK(a.p.classes >= 1 || a.positions == 0, "mixprec::", op,
                  ": self has 0 classes (dimension 1 of size 0)");
  MIXPREC_CHECK(reduction >= 0 && reduction <= 2, "mixprec::", op,
                  ": reduction must be 0 (none), 1 (mean) or 2 (sum), got ", reduction);
  MIXPREC_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, "mixprec::", op,
                  ": label_smoothing must be in [0, 1], got ", label_smoothing);
  a.p.label_smoothing = label_smoothing;
  a.p.reduction = static_cast<mixprec_reduction>(reduction);
  ce_weight(op, weight, a);
}

// The checks of mixprec::cross_entropy and its backward, in one place.
inline CeArgs ce_args(const char* op, const Tensor& self, const Tensor& target,
                      const std::optional<Tensor>& weight, int64_t reduction, int64_t ignore_index,
                      double label_smoothing) {
  CeArgs a = ce_self(op, self, target);
  const int64_t nd = self.dim();
  const ScalarType tt = target.scalar_type();
  const bool floating = tt == ScalarType::Float || tt == ScalarType::Half ||
                        tt == ScalarType::BFloat16 || tt == ScalarType::Double;
  MIXPREC_CHECK(tt == ScalarType::Long, "mixprec::", op,
                  ": target must be int64 class indices, got ", dtype_name(tt),
                  !floating ? std::string(" (convert it with target.long())")
                  : sizes_of(target) == sizes_of(self)
                      ? std::string(" (a class-probability target of self's shape goes to "
                                    "mixprec::cross_entropy_soft; mixprec.ops.cross_entropy picks it)")
                      : " (a class-probability target must have self's shape " + shape_str(self) + ")");
  same_device(op, "target", target, a.device, "self");
  auto s = self.sizes();
  std::vector<int64_t> want;
  a.p = mixprec_cross_entropy_params_default();
  if (nd == 1) {
    a.p.outer = 1;
    a.p.classes = s[0];
    a.p.inner = 1;
  } else {
    a.p.outer = s[0];
    a.p.classes = s[1];
    a.p.inner = 1;
    want.push_back(s[0]);
    for (int64_t d = 2; d < nd; d++) {
      a.p.inner *= s[d];
      want.push_back(s[d]);
    }
  }
  MIXPREC_CHECK(sizes_of(target) == want, "mixprec::", op, ": target has shape ",
                  shape_str(target), " but self of shape ", shape_str(self),
                  " needs a target of shape [", [&] {
                    std::string r;
                    for (size_t i = 0; i < want.size(); i++) r += (i ? ", " : "") + std::to_string(want[i]);
                    return r;
                  }(), "]");
  ce_options(op, weight, reduction, label_smoothing, a);
  a.p.ignore_index = ignore_index;
  a.target_dtype = MIXPREC_F32;
  a.logits = dense(self);
  a.target = dense(target);
  a.loss_shape = sizes_of(target);
  return a;
}

template <class B>
std::tuple<Tensor, Tensor, Tensor> cross_entropy_op(Tensor self, Tensor target,
                                                     std::optional<Tensor> weight,
                                                     int64_t reduction, int64_t ignore_index,
                                                     double label_smoothing) {
  const char* op = "cross_entropy";
  CeArgs a = ce_args(op, self, target, weight, reduction, ignore_index, label_smoothing);
  B::check_device(op, a.device);
  Tensor loss = reduction == 0
                    ? torch::stable::new_empty(self, a.loss_shape, ScalarType::Float)
                    : torch::stable::new_empty(self, {}, ScalarType::Float);
  std::vector<int64_t> stats_shape{2};
  stats_shape.insert(stats_shape.end(), a.loss_shape.begin(), a.loss_shape.end());
  Tensor stats = torch::stable::new_empty(self, stats_shape, ScalarType::Float);
  Tensor wsum = torch::stable::new_empty(self, {}, ScalarType::Float);
  mixprec_status st = B::cross_entropy(a, static_cast<float*>(loss.data_ptr()),
                                       static_cast<float*>(stats.data_ptr()),
                                       static_cast<float*>(wsum.data_ptr()), self);
  MIXPREC_CHECK(st != MIXPREC_ERR_BAD_ARGUMENT, "mixprec::", op,
                  ": target holds a class index out of range [0, ", a.p.classes,
                  ") that is not ignore_index (", ignore_index, ")");
  check_status(st, op);
  return {loss, stats, wsum};
}

template <class B>
Tensor cross_entropy_backward_op(Tensor grad_loss, Tensor self, Tensor target,
                                 std::optional<Tensor> weight, Tensor stats, Tensor weight_sum,
                                 int64_t reduction, int64_t ignore_index, double label_smoothing) {
  const char* op = "cross_entropy_backward";
  CeArgs a = ce_args(op, self, target, weight, reduction, ignore_index, label_smoothing);
  B::check_device(op, a.device);
  MIXPREC_CHECK(grad_loss.defined() && grad_loss.scalar_type() == ScalarType::Float,
                  "mixprec::", op, ": grad_loss must be float32");
  same_device(op, "grad_loss", grad_loss, a.device, "self");
  if (reduction == 0) {
    MIXPREC_CHECK(sizes_of(grad_loss) == a.loss_shape, "mixprec::", op, ": grad_loss has shape ",
                    shape_str(grad_loss), " but the loss has target's shape ", shape_str(target));
  } else {
    MIXPREC_CHECK(grad_loss.numel() == 1, "mixprec::", op,
                    ": grad_loss of a reduced loss must have one element, got ", grad_loss.numel());
  }
  std::vector<int64_t> stats_shape{2};
  stats_shape.insert(stats_shape.end(), a.loss_shape.begin(), a.loss_shape.end());
  MIXPREC_CHECK(stats.defined() && stats.scalar_type() == ScalarType::Float &&
                      sizes_of(stats) == stats_shape,
                  "mixprec::", op, ": stats must be the float32 tensor of shape (2, *target.shape) "
                  "that mixprec::cross_entropy returned");
  same_device(op, "stats", stats, a.device, "self");
  MIXPREC_CHECK(weight_sum.defined() && weight_sum.scalar_type() == ScalarType::Float &&
                      weight_sum.numel() == 1,
                  "mixprec::", op, ": weight_sum must be a one-element float32 tensor");
  same_device(op, "weight_sum", weight_sum, a.device, "self");
  Tensor gl = dense(grad_loss), sc = dense(stats);
  Tensor dx = torch::stable::new_empty(self, sizes_of(self), self.scalar_type());
  if (self.numel() == 0) return dx;
  mixprec_status st = B::cross_entropy_backward(a, static_cast<const float*>(gl.data_ptr()),
                                                static_cast<const float*>(sc.data_ptr()),
                                                static_cast<const float*>(weight_sum.data_ptr()),
                                                dx.data_ptr());
  MIXPREC_CHECK(st != MIXPREC_ERR_BAD_ARGUMENT, "mixprec::", op,
                  ": target holds a class index out of range [0, ", a.p.classes,
                  ") that is not ignore_index (", ignore_index, ")");
  check_status(st, op);
  return dx;
}

// ---- class-probability (soft) targets: cross_entropy_soft(_backward) ---------

// The checks of mixprec::cross_entropy_soft and its backward: target of
// self's shape, float32/float16/bfloat16 (any of them with any logits
// dtype). loss_shape is self's shape without the class dimension.
inline CeArgs soft_args(const char* op, const Tensor& self, const Tensor& target,
                        const std::optional<Tensor>& weight, int64_t reduction,
                        double label_smoothing) {
  CeArgs a = ce_self(op, self, target);
  const int64_t nd = self.dim();
  const ScalarType tt = target.scalar_type();
  MIXPREC_CHECK(to_mixprec_dtype(tt, &a.target_dtype), "mixprec::", op,
                  ": target holds class probabilities and must be float32, float16 or bfloat16, got ",
                  dtype_name(tt),
                  tt == ScalarType::Long ? " (class indices go to mixprec::cross_entropy, with the "
                                           "class dimension left out of target's shape)"
                                         : "");
  same_device(op, "target", target, a.device, "self");
  MIXPREC_CHECK(sizes_of(target) == sizes_of(self), "mixprec::", op, ": target has shape ",
                  shape_str(target), " but class probabilities must have self's shape ",
                  shape_str(self));
  auto s = self.sizes();
  a.p = mixprec_cross_entropy_params_default();
  a.p.outer = nd == 1 ? 1 : s[0];
  a.p.classes = nd == 1 ? s[0] : s[1];
  a.p.inner = 1;
  if (nd >= 2) a.loss_shape.push_back(s[0]);
  for (int64_t d = 2; d < nd; d++) {
    a.p.inner *= s[d];
    a.loss_shape.push_back(s[d]);
  }
  ce_options(op, weight, reduction, label_smoothing, a);
  a.logits = dense(self);
  a.target = dense(target);
  return a;
}

inline std::vector<int64_t> soft_stats_shape(const CeArgs& a) {
  std::vector<int64_t> r{3};
  r.insert(r.end(), a.loss_shape.begin(), a.loss_shape.end());
  return r;
}

// Returns the float32 loss and per position (max, log-sum, sum_c w_c t'_c)
// as a float32 (3, *loss_shape) tensor for the backward.
template <class B>
std::tuple<Tensor, Tensor> cross_entropy_soft_op(Tensor self, Tensor target,
                                                 std::optional<Tensor> weight, int64_t reduction,
                                                 double label_smoothing) {
  const char* op = "cross_entropy_soft";
  CeArgs a = soft_args(op, self, target, weight, reduction, label_smoothing);
  B::check_device(op, a.device);
  Tensor loss = reduction == 0
                    ? torch::stable::new_empty(self, a.loss_shape, ScalarType::Float)
                    : torch::stable::new_empty(self, {}, ScalarType::Float);
  Tensor stats = torch::stable::new_empty(self, soft_stats_shape(a), ScalarType::Float);
  check_status(B::cross_entropy_soft(a, static_cast<float*>(loss.data_ptr()),
                                     static_cast<float*>(stats.data_ptr()), self),
               op);
  return {loss, stats};
}

// Returns (grad_self in self's dtype, grad_target in target's dtype); an
// output not asked for (self_grad / target_grad false) is an empty tensor
// of shape [0].
template <class B>
std::tuple<Tensor, Tensor> cross_entropy_soft_backward_op(
    Tensor grad_loss, Tensor self, Tensor target, std::optional<Tensor> weight, Tensor stats,
    int64_t reduction, double label_smoothing, bool self_grad, bool target_grad) {
  const char* op = "cross_entropy_soft_backward";
  CeArgs a = soft_args(op, self, target, weight, reduction, label_smoothing);
  B::check_device(op, a.device);
  MIXPREC_CHECK(grad_loss.defined() && grad_loss.layout() == Layout::Strided &&
                    grad_loss.scalar_type() == ScalarType::Float,
                  "mixprec::", op, ": grad_loss must be a float32 tensor");
  same_device(op, "grad_loss", grad_loss, a.device, "self");
  if (reduction == 0) {
    MIXPREC_CHECK(sizes_of(grad_loss) == a.loss_shape, "mixprec::", op, ": grad_loss has shape ",
                    shape_str(grad_loss), " but the unreduced loss has self's shape without "
                    "dimension 1");
  } else {
    MIXPREC_CHECK(grad_loss.numel() == 1, "mixprec::", op,
                    ": grad_loss of a reduced loss must have one element, got ", grad_loss.numel());
  }
  MIXPREC_CHECK(stats.defined() && stats.layout() == Layout::Strided &&
                    stats.scalar_type() == ScalarType::Float &&
                    sizes_of(stats) == soft_stats_shape(a),
                  "mixprec::", op, ": stats must be the float32 tensor of shape (3, ...) "
                  "that mixprec::cross_entropy_soft returned");
  same_device(op, "stats", stats, a.device, "self");
  Tensor gl = dense(grad_loss), sc = dense(stats);
  Tensor dx = self_grad ? torch::stable::new_empty(self, sizes_of(self), self.scalar_type())
                        : torch::stable::new_empty(self, {0}, self.scalar_type());
  Tensor dt = target_grad ? torch::stable::new_empty(target, sizes_of(target), target.scalar_type())
                          : torch::stable::new_empty(target, {0}, target.scalar_type());
  if (self.numel() == 0 || (!self_grad && !target_grad)) return {dx, dt};
  check_status(B::cross_entropy_soft_backward(a, static_cast<const float*>(gl.data_ptr()),
                                              static_cast<const float*>(sc.data_ptr()),
                                              self_grad ? dx.data_ptr() : nullptr,
                                              target_grad ? dt.data_ptr() : nullptr),
               op);
  return {dx, dt};
}

}  // namespace cross_entropy
}  // namespace mixprec_shim
