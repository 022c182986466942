// The cross_entropy family: its schemas, and its CPU backend. The
// validation is cross_entropy_op.h's, shared with the CUDA backend in
// cross_entropy_cuda.cpp.
#include "cross_entropy_op.h"

namespace mixprec_shim {
namespace cross_entropy {
namespace {

struct CpuBackend {
  static void check_device(const char* op, const Where& w) { check_cpu_device(op, w); }
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
  static mixprec_status cross_entropy_soft(const CeArgs& a, float* loss, float* stats,
                                           const Tensor&) {
    return mixprec_cross_entropy_soft(a.positions ? a.logits.data_ptr() : nullptr, a.dtype,
                                      a.positions ? a.target.data_ptr() : nullptr, a.target_dtype,
                                      &a.p, loss, stats);
  }
  static mixprec_status cross_entropy_soft_backward(const CeArgs& a, const float* grad_loss,
                                                    const float* stats, void* dx, void* dt) {
    return mixprec_cross_entropy_soft_backward(grad_loss, a.logits.data_ptr(), a.dtype,
                                               a.target.data_ptr(), a.target_dtype, &a.p, stats,
                                               dx, dt);
  }
};

}  // namespace
}  // namespace cross_entropy
}  // namespace mixprec_shim

STABLE_TORCH_LIBRARY_FRAGMENT(mixprec, m) {
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
  // Cross-entropy with class-probability targets of self's shape (float32,
  // float16 or bfloat16; torch's probability-target form: no ignore_index,
  // mean over positions). Returns the float32 loss and per position (max,
  // log-sum, sum_c w_c t'_c) as float32 of shape (3, *loss positions).
  m.def(
      "cross_entropy_soft(Tensor self, Tensor target, Tensor? weight, int reduction,"
      " float label_smoothing) -> (Tensor, Tensor)");
  // (grad_self, grad_target); one not asked for is an empty tensor of shape [0].
  m.def(
      "cross_entropy_soft_backward(Tensor grad_loss, Tensor self, Tensor target, Tensor? weight,"
      " Tensor stats, int reduction, float label_smoothing, bool self_grad, bool target_grad)"
      " -> (Tensor, Tensor)");
}


STABLE_TORCH_LIBRARY_IMPL(mixprec, CPU, m) {
  namespace ce = mixprec_shim::cross_entropy;
  using B = ce::CpuBackend;
  m.impl("cross_entropy", TORCH_BOX(&ce::cross_entropy_op<B>));
  m.impl("cross_entropy_backward", TORCH_BOX(&ce::cross_entropy_backward_op<B>));
  m.impl("cross_entropy_soft", TORCH_BOX(&ce::cross_entropy_soft_op<B>));
  m.impl("cross_entropy_soft_backward", TORCH_BOX(&ce::cross_entropy_soft_backward_op<B>));
}
