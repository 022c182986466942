// The CUDA backend of the nms family: after nms_op.h's validation, enqueue
// mixprec_cuda_nms on torch's current stream. Scratch, outputs and the count
// come from torch's caching allocator. nms / batched_nms read the kept count
// back (one 8-byte copy, one host sync) to size their output; nms_padded
// does not synchronise at all.
#include <torch/csrc/stable/accelerator.h>

#include "cuda_common.h"
#include "nms_op.h"

namespace mixprec_shim {
namespace nms {
namespace {

struct CudaResult {
  Tensor keep;   // capacity entries, -1 after the kept ones
  Tensor count;  // 0-dim int64 on the device
  void* stream;
};

CudaResult run_cuda(const char* op, const NmsArgs& a, const Tensor& like) {
  torch::stable::accelerator::DeviceGuard guard(a.device.index);
  void* stream = current_cuda_stream(op, a.device.index);
  const int64_t ws_bytes = mixprec_cuda_nms_workspace_size(a.n);
  MIXPREC_CHECK(ws_bytes >= 0, "mixprec::", op, ": could not size the workspace for ", a.n,
                  " boxes");
  Tensor workspace = torch::stable::new_empty(like, {ws_bytes > 0 ? ws_bytes : 1}, ScalarType::Byte);
  Tensor keep = torch::stable::new_empty(like, {a.capacity}, ScalarType::Long);
  Tensor count = torch::stable::new_empty(like, {}, ScalarType::Long);
  check_status(mixprec_cuda_nms(a.boxes, a.boxes_dtype, a.scores, a.scores_dtype, a.classes,
                                a.classes_dtype, a.n, &a.params,
                                a.capacity ? static_cast<int64_t*>(keep.data_ptr()) : nullptr,
                                static_cast<int64_t*>(count.data_ptr()), workspace.data_ptr(),
                                ws_bytes, stream),
               op);
  return {keep, count, stream};
}

struct CudaBackend {
  static void check_device(const char* op, const Where& w) { check_cuda_device(op, w); }

  static Tensor keep(const char* op, const NmsArgs& a, const Tensor& like) {
    torch::stable::accelerator::DeviceGuard guard(a.device.index);
    CudaResult r = run_cuda(op, a, like);
    int64_t count = 0;
    check_status(mixprec_cuda_nms_read_count(static_cast<const int64_t*>(r.count.data_ptr()),
                                             &count, r.stream),
                 op);
    if (count == a.capacity) return r.keep;
    return torch::stable::clone(torch::stable::narrow(r.keep, 0, 0, count));
  }

  static std::tuple<Tensor, Tensor> keep_padded(const char* op, const NmsArgs& a,
                                                const Tensor& like) {
    CudaResult r = run_cuda(op, a, like);
    return {r.keep, r.count};
  }
};

}  // namespace
}  // namespace nms
}  // namespace mixprec_shim

STABLE_TORCH_LIBRARY_IMPL(mixprec, CUDA, m) {
  namespace nms = mixprec_shim::nms;
  using B = nms::CudaBackend;
  m.impl("nms", TORCH_BOX(&nms::nms_op<B>));
  m.impl("batched_nms", TORCH_BOX(&nms::batched_nms_op<B>));
  m.impl("nms_padded", TORCH_BOX(&nms::nms_padded_op<B>));
}
