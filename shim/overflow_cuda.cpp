// The CUDA backend of the overflow family: after overflow_op.h's validation,
// one launch on torch's current stream of the record's device. No host
// synchronisation.
#include <torch/csrc/stable/accelerator.h>

#include "cuda_common.h"
#include "overflow_op.h"

namespace mixprec_shim {
namespace overflow {
namespace {

struct CudaBackend {
  static void check_device(const char* op, const Where& w) { check_cuda_device(op, w); }
  static mixprec_status check(const char* op, const CheckArgs& a) {
    torch::stable::accelerator::DeviceGuard guard(a.device.index);
    return mixprec_cuda_overflow_check(a.outputs.data(), static_cast<int64_t>(a.outputs.size()),
                                       a.inputs.data(), static_cast<int64_t>(a.inputs.size()),
                                       a.record, a.n_slots, a.slot,
                                       current_cuda_stream(op, a.device.index));
  }
};

}  // namespace
}  // namespace overflow
}  // namespace mixprec_shim

STABLE_TORCH_LIBRARY_IMPL(mixprec, CUDA, m) {
  m.impl("overflow_check_",
         TORCH_BOX(&mixprec_shim::overflow::overflow_check_op<mixprec_shim::overflow::CudaBackend>));
}
