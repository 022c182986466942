// The overflow family (mixprec.guard's forward check): its schema and its
// CPU backend. The validation is overflow_op.h's, shared with the CUDA
// backend in overflow_cuda.cpp.
#include "overflow_op.h"

namespace mixprec_shim {
namespace overflow {
namespace {

struct CpuBackend {
  static void check_device(const char* op, const Where& w) { check_cpu_device(op, w); }
  static mixprec_status check(const char*, const CheckArgs& a) {
    return mixprec_overflow_check(a.outputs.data(), static_cast<int64_t>(a.outputs.size()),
                                  a.inputs.data(), static_cast<int64_t>(a.inputs.size()),
                                  a.record, a.n_slots, a.slot);
  }
};

}  // namespace
}  // namespace overflow
}  // namespace mixprec_shim

STABLE_TORCH_LIBRARY_FRAGMENT(mixprec, m) {
  // Reads outputs (and, if one is not finite, inputs) and folds into
  // record[slot] (float32 [n_slots, 8]): [0] an output was inf/NaN, [1] the
  // largest finite |output|, [2] ... with a non-finite input, [3] ... from
  // finite inputs. See mixprec/overflow.h.
  m.def("overflow_check_(Tensor[] outputs, Tensor[] inputs, Tensor(a!) record, int slot) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(mixprec, CPU, m) {
  m.impl("overflow_check_",
         TORCH_BOX(&mixprec_shim::overflow::overflow_check_op<mixprec_shim::overflow::CpuBackend>));
}
