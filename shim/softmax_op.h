// The softmax ops (softmax, log_softmax and their backward), validated once
// for both devices: each op is a template over a backend B (softmax.cpp:
// CPU, softmax_cuda.cpp: CUDA) that only says how to run the C entry point:
//   B::check_device(op, where)                        the tensors are B's
//   B::softmax(log, x, x_dtype, y, y_dtype, outer, n, inner, device)
//   B::softmax_backward(log, dy, y, y_dtype, dx, dx_dtype, outer, n, inner, device)
// each -> mixprec_status.
#pragma once

#include <optional>
#include <vector>

#include "common.h"

namespace mixprec_shim {
namespace softmax {

struct Layout3 {
  int64_t outer = 1, n = 1, inner = 1;
};

// (outer, n, inner) of t reduced over dim; a 0-dim tensor is one element.
inline Layout3 layout_over(const char* op, const Tensor& t, int64_t dim) {
  const int64_t nd = t.dim();
  const int64_t span = nd > 0 ? nd : 1;
  MIXPREC_CHECK(dim >= -span && dim < span, "mixprec::", op, ": dim ", dim,
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

template <class B>
Tensor softmax_forward(const char* op, bool log, const Tensor& x, int64_t dim,
                       std::optional<ScalarType> dtype) {
  const mixprec_dtype xd = float_arg(op, "self", x);
  mixprec_dtype yd = xd;
  if (dtype.has_value()) {
    MIXPREC_CHECK(to_mixprec_dtype(*dtype, &yd), "mixprec::", op,
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
  MIXPREC_CHECK(gd == yd, "mixprec::", op, ": grad_output must have output's dtype ",
                  dtype_name(output.scalar_type()), ", got ", dtype_name(grad_output.scalar_type()));
  mixprec_dtype xd;
  MIXPREC_CHECK(to_mixprec_dtype(input_dtype, &xd), "mixprec::", op,
                  ": input_dtype must be float32, float16 or bfloat16, got ", dtype_name(input_dtype));
  MIXPREC_CHECK(sizes_of(grad_output) == sizes_of(output), "mixprec::", op,
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

}  // namespace softmax
}  // namespace mixprec_shim
