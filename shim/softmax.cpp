// Softmax, log_softmax and cross-entropy: schemas, the one validation of
// their arguments, and the CPU registrations.
//
// The op bodies below are templates over a backend (how to run the C entry
// points); shim/softmax_cuda.cpp includes this file with
// MIXPREC_SOFTMAX_NO_REGISTER defined and instantiates them for CUDA, so
// both devices share every check and message without a second header.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/Layout.h>
#include <torch/headeronly/core/ScalarType.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common.h"

namespace mixprec_shim {
namespace softmax_detail {

using torch::headeronly::Layout;
using torch::headeronly::ScalarType;

inline std::string shape_str(const Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); d++) s += (d ? ", " : "") + std::to_string(t.sizes()[d]);
  return s + "]";
}

// A floating tensor argument: strided, one of the three dtypes.
inline mixprec_dtype float_arg(const char* op, const char* arg, const Tensor& t) {
  STD_TORCH_CHECK(t.defined() && t.layout() == Layout::Strided, "mixprec::", op, ": ", arg,
                  " must be a defined strided tensor");
  mixprec_dtype d;
  STD_TORCH_CHECK(to_mixprec_dtype(t.scalar_type(), &d), "mixprec::", op, ": ", arg,
                  " must be float32, float16 or bfloat16, got ", dtype_name(t.scalar_type()));
  return d;
}

inline void same_device(const char* op, const char* arg, const Tensor& t, const Where& dev,
                        const char* ref) {
  STD_TORCH_CHECK(where(t) == dev, "mixprec::", op, ": ", arg, " is on ", describe(where(t)),
                  " but ", ref, " is on ", describe(dev));
}

// The contiguous tensor the kernels read: t itself or a copy in t's own
// dtype (never an FP32 copy).
inline Tensor dense(const Tensor& t) { return t.is_contiguous() ? t : torch::stable::contiguous(t); }

struct Layout3 {
  int64_t outer = 1, n = 1, inner = 1;
};

// (outer, n, inner) of t reduced over dim; a 0-dim tensor is one element.
inline Layout3 layout_over(const char* op, const Tensor& t, int64_t dim) {
  const int64_t nd = t.dim();
  const int64_t span = nd > 0 ? nd : 1;
  STD_TORCH_CHECK(dim >= -span && dim < span, "mixprec::", op, ": dim ", dim,
                  " is out of range for a tensor of ", nd, " dimensions (expected in [", -span,
                  ", ", span - 1, "])");
  Layout3 l;
  if (nd == 0) return l;
  if (dim < 0) dim += nd;
  auto sizes = t.sizes();
  l.n = sizes[dim];
  for (int64_t d = 0; d < dim; d++) l.outer *= sizes[d];
  for (int64_t d = dim + 1; d < nd; d++) l.inner *= sizes[d];
  return l;
}

inline std::vector<int64_t> sizes_of(const Tensor& t) {
  auto s = t.sizes();
  return std::vector<int64_t>(s.begin(), s.end());
}

// ---- softmax / log_softmax ---------------------------------------------------

template <class B>
Tensor softmax_forward(const char* op, bool log, const Tensor& x, int64_t dim,
                       std::optional<ScalarType> dtype) {
  const mixprec_dtype xd = float_arg(op, "self", x);
  mixprec_dtype yd = xd;
  if (dtype.has_value()) {
    STD_TORCH_CHECK(to_mixprec_dtype(*dtype, &yd), "mixprec::", op,
                    ": dtype must be float32, float16 or bfloat16, got ", dtype_name(*dtype));
  }
  const Layout3 l = layout_over(op, x, dim);
  const Where dev = where(x);
  B::check_device(op, dev);
  Tensor xc = dense(x);
  Tensor y = torch::stable::new_empty(x, sizes_of(x), dtype.has_value() ? *dtype : x.scalar_type());
  if (x.numel() == 0) return y;
  check_status(B::softmax(log, xc.data_ptr(), xd, y.data_ptr(), yd, l.outer, l.n, l.inner, dev.index),
               op);
  return y;
}

template <class B>
Tensor softmax_backward(const char* op, bool log, const Tensor& grad_output, const Tensor& output,
                        int64_t dim, ScalarType input_dtype) {
  const mixprec_dtype yd = float_arg(op, "output", output);
  const mixprec_dtype gd = float_arg(op, "grad_output", grad_output);
  STD_TORCH_CHECK(gd == yd, "mixprec::", op, ": grad_output must have output's dtype ",
                  dtype_name(output.scalar_type()), ", got ", dtype_name(grad_output.scalar_type()));
  mixprec_dtype xd;
  STD_TORCH_CHECK(to_mixprec_dtype(input_dtype, &xd), "mixprec::", op,
                  ": input_dtype must be float32, float16 or bfloat16, got ", dtype_name(input_dtype));
  STD_TORCH_CHECK(sizes_of(grad_output) == sizes_of(output), "mixprec::", op,
                  ": grad_output has shape ", shape_str(grad_output), " but output has shape ",
                  shape_str(output));
  const Where dev = where(output);
  same_device(op, "grad_output", grad_output, dev, "output");
  B::check_device(op, dev);
  const Layout3 l = layout_over(op, output, dim);
  Tensor yc = dense(output), gc = dense(grad_output);
  Tensor dx = torch::stable::new_empty(output, sizes_of(output), input_dtype);
  if (output.numel() == 0) return dx;
  check_status(B::softmax_backward(log, gc.data_ptr(), yc.data_ptr(), yd, dx.data_ptr(), xd,
                                   l.outer, l.n, l.inner, dev.index),
               op);
  return dx;
}

template <class B>
Tensor softmax_op(Tensor x, int64_t dim, std::optional<ScalarType> dtype) {
  return softmax_forward<B>("softmax", false, x, dim, dtype);
}
template <class B>
Tensor log_softmax_op(Tensor x, int64_t dim, std::optional<ScalarType> dtype) {
  return softmax_forward<B>("log_softmax", true, x, dim, dtype);
}
template <class B>
Tensor softmax_backward_op(Tensor grad_output, Tensor output, int64_t dim, ScalarType input_dtype) {
  return softmax_backward<B>("softmax_backward", false, grad_output, output, dim, input_dtype);
}
template <class B>
Tensor log_softmax_backward_op(Tensor grad_output, Tensor output, int64_t dim,
                               ScalarType input_dtype) {
  return softmax_backward<B>("log_softmax_backward", true, grad_output, output, dim, input_dtype);
}

// ---- cross-entropy -----------------------------------------------------------

struct CeArgs {
  mixprec_cross_entropy_params p;
  mixprec_dtype dtype;
  Where device;
  Tensor logits, target, weight;  // contiguous
  std::vector<int64_t> loss_shape;  // target's shape
  int64_t positions;
};

// The checks of mixprec::cross_entropy and its backward, in one place.
inline CeArgs ce_args(const char* op, const Tensor& self, const Tensor& target,
                      const std::optional<Tensor>& weight, int64_t reduction, int64_t ignore_index,
                      double label_smoothing) {
  CeArgs a;
  a.dtype = float_arg(op, "self", self);
  a.device = where(self);
  const int64_t nd = self.dim();
  STD_TORCH_CHECK(nd >= 1, "mixprec::", op,
                  ": self must have shape (C), (N, C) or (N, C, d1, ...), got a 0-dim tensor");
  STD_TORCH_CHECK(target.defined() && target.layout() == Layout::Strided, "mixprec::", op,
                  ": target must be a defined strided tensor");
  STD_TORCH_CHECK(target.scalar_type() == ScalarType::Long, "mixprec::", op,
                  ": target must be int64 class indices, got ", dtype_name(target.scalar_type()),
                  " (class-probability targets are not supported)");
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
  STD_TORCH_CHECK(sizes_of(target) == want, "mixprec::", op, ": target has shape ",
                  shape_str(target), " but self of shape ", shape_str(self),
                  " needs a target of shape [", [&] {
                    std::string r;
                    for (size_t i = 0; i < want.size(); i++) r += (i ? ", " : "") + std::to_string(want[i]);
                    return r;
                  }(), "]");
  a.positions = a.p.outer * a.p.inner;
  STD_TORCH_CHECK(a.p.classes >= 1 || a.positions == 0, "mixprec::", op,
                  ": self has 0 classes (dimension 1 of size 0)");
  STD_TORCH_CHECK(reduction >= 0 && reduction <= 2, "mixprec::", op,
                  ": reduction must be 0 (none), 1 (mean) or 2 (sum), got ", reduction);
  STD_TORCH_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, "mixprec::", op,
                  ": label_smoothing must be in [0, 1], got ", label_smoothing);
  a.p.ignore_index = ignore_index;
  a.p.label_smoothing = label_smoothing;
  a.p.reduction = static_cast<mixprec_reduction>(reduction);
  if (weight.has_value() && weight->defined()) {
    const Tensor& w = *weight;
    STD_TORCH_CHECK(w.layout() == Layout::Strided && w.scalar_type() == ScalarType::Float,
                    "mixprec::", op, ": weight must be a float32 tensor, got ",
                    dtype_name(w.scalar_type()));
    STD_TORCH_CHECK(w.dim() == 1 && w.sizes()[0] == a.p.classes, "mixprec::", op,
                    ": weight must have shape [", a.p.classes, "] (one per class), got ",
                    shape_str(w));
    same_device(op, "weight", w, a.device, "self");
    a.weight = dense(w);
    a.p.weight = a.p.classes ? static_cast<const float*>(a.weight.data_ptr()) : nullptr;
  }
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
  STD_TORCH_CHECK(st != MIXPREC_ERR_BAD_ARGUMENT, "mixprec::", op,
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
  STD_TORCH_CHECK(grad_loss.defined() && grad_loss.scalar_type() == ScalarType::Float,
                  "mixprec::", op, ": grad_loss must be float32");
  same_device(op, "grad_loss", grad_loss, a.device, "self");
  if (reduction == 0) {
    STD_TORCH_CHECK(sizes_of(grad_loss) == a.loss_shape, "mixprec::", op, ": grad_loss has shape ",
                    shape_str(grad_loss), " but the loss has target's shape ", shape_str(target));
  } else {
    STD_TORCH_CHECK(grad_loss.numel() == 1, "mixprec::", op,
                    ": grad_loss of a reduced loss must have one element, got ", grad_loss.numel());
  }
  std::vector<int64_t> stats_shape{2};
  stats_shape.insert(stats_shape.end(), a.loss_shape.begin(), a.loss_shape.end());
  STD_TORCH_CHECK(stats.defined() && stats.scalar_type() == ScalarType::Float &&
                      sizes_of(stats) == stats_shape,
                  "mixprec::", op, ": stats must be the float32 tensor of shape (2, *target.shape) "
                  "that mixprec::cross_entropy returned");
  same_device(op, "stats", stats, a.device, "self");
  STD_TORCH_CHECK(weight_sum.defined() && weight_sum.scalar_type() == ScalarType::Float &&
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
  STD_TORCH_CHECK(st != MIXPREC_ERR_BAD_ARGUMENT, "mixprec::", op,
                  ": target holds a class index out of range [0, ", a.p.classes,
                  ") that is not ignore_index (", ignore_index, ")");
  check_status(st, op);
  return dx;
}

}  // namespace softmax_detail
}  // namespace mixprec_shim

#ifndef MIXPREC_SOFTMAX_NO_REGISTER

namespace mixprec_shim {
namespace softmax_detail {

struct CpuBackend {
  static void check_device(const char* op, const Where& w) {
    STD_TORCH_CHECK(!w.cuda && w.index < 0, "mixprec::", op,
                    ": the CPU kernel got tensors that are not on the CPU");
  }
  static mixprec_status softmax(bool log, const void* x, mixprec_dtype xd, void* y,
                                mixprec_dtype yd, int64_t outer, int64_t n, int64_t inner,
                                int32_t) {
    return log ? mixprec_log_softmax(x, xd, y, yd, outer, n, inner)
               : mixprec_softmax(x, xd, y, yd, outer, n, inner);
  }
  static mixprec_status softmax_backward(bool log, const void* dy, const void* y,
                                         mixprec_dtype yd, void* dx, mixprec_dtype dxd,
                                         int64_t outer, int64_t n, int64_t inner, int32_t) {
    return log ? mixprec_log_softmax_backward(dy, y, yd, dx, dxd, outer, n, inner)
               : mixprec_softmax_backward(dy, y, yd, dx, dxd, outer, n, inner);
  }
  static mixprec_status cross_entropy(const CeArgs& a, float* loss, float* stats, float* wsum,
                                      const Tensor&) {
    return mixprec_cross_entropy(a.positions ? a.logits.data_ptr() : nullptr, a.dtype,
                                 a.positions ? static_cast<const int64_t*>(a.target.data_ptr())
                                             : nullptr,
                                 &a.p, loss, stats, wsum);
  }
  static mixprec_status cross_entropy_backward(const CeArgs& a, const float* grad_loss,
                                               const float* stats, const float* wsum, void* dx) {
    return mixprec_cross_entropy_backward(grad_loss, a.logits.data_ptr(), a.dtype,
                                          static_cast<const int64_t*>(a.target.data_ptr()), &a.p,
                                          stats, wsum, dx);
  }
};

}  // namespace softmax_detail
}  // namespace mixprec_shim

STABLE_TORCH_LIBRARY_FRAGMENT(mixprec, m) {
  // softmax / log_softmax over dim, FP32 accumulation; dtype = output dtype
  // (None: the input's). The input is read in its own dtype.
  m.def("softmax(Tensor self, int dim, ScalarType? dtype=None) -> Tensor");
  m.def("log_softmax(Tensor self, int dim, ScalarType? dtype=None) -> Tensor");
  // Gradients from the output (torch's _softmax_backward_data): written in
  // input_dtype.
  m.def(
      "softmax_backward(Tensor grad_output, Tensor output, int dim, ScalarType input_dtype)"
      " -> Tensor");
  m.def(
      "log_softmax_backward(Tensor grad_output, Tensor output, int dim,"
      " ScalarType input_dtype) -> Tensor");
  // Cross-entropy with int64 class-index targets; reduction 0 none, 1 mean,
  // 2 sum (torch's Reduction enum); weight float32 or None. Returns the loss
  // (float32) and what backward needs: per position the max and the log of
  // the sum of exp(x - max) (float32, shape (2, *target.shape)) and the
  // mean's denominator (float32, 0-dim).
  m.def(
      "cross_entropy(Tensor self, Tensor target, Tensor? weight, int reduction,"
      " int ignore_index, float label_smoothing) -> (Tensor, Tensor, Tensor)");
  m.def(
      "cross_entropy_backward(Tensor grad_loss, Tensor self, Tensor target, Tensor? weight,"
      " Tensor stats, Tensor weight_sum, int reduction, int ignore_index,"
      " float label_smoothing) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(mixprec, CPU, m) {
  using mixprec_shim::softmax_detail::CpuBackend;
  namespace sd = mixprec_shim::softmax_detail;
  m.impl("softmax", TORCH_BOX(&sd::softmax_op<CpuBackend>));
  m.impl("log_softmax", TORCH_BOX(&sd::log_softmax_op<CpuBackend>));
  m.impl("softmax_backward", TORCH_BOX(&sd::softmax_backward_op<CpuBackend>));
  m.impl("log_softmax_backward", TORCH_BOX(&sd::log_softmax_backward_op<CpuBackend>));
  m.impl("cross_entropy", TORCH_BOX(&sd::cross_entropy_op<CpuBackend>));
  m.impl("cross_entropy_backward", TORCH_BOX(&sd::cross_entropy_backward_op<CpuBackend>));
}

#endif  // MIXPREC_SOFTMAX_NO_REGISTER
