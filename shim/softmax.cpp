// The softmax family (softmax, log_softmax and their backward): its schemas,
// and its CPU backend. The validation is softmax_op.h's, shared with the
// CUDA backend in softmax_cuda.cpp.
#include "softmax_op.h"

namespace mixprec_shim {
namespace softmax {
namespace {

struct CpuBackend {
  static void check_device(const char* op, const Where& w) { check_cpu_device(op, w); }
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
};

}  // namespace
}  // namespace softmax
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
}

STABLE_TORCH_LIBRARY_IMPL(mixprec, CPU, m) {
  namespace sm = mixprec_shim::softmax;
  using B = sm::CpuBackend;
  m.impl("softmax", TORCH_BOX(&sm::softmax_op<B>));
  m.impl("log_softmax", TORCH_BOX(&sm::log_softmax_op<B>));
  m.impl("softmax_backward", TORCH_BOX(&sm::softmax_backward_op<B>));
  m.impl("log_softmax_backward", TORCH_BOX(&sm::log_softmax_backward_op<B>));
}
