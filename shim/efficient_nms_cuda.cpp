// The CUDA backend of the efficient_nms family: after efficient_nms_op.h's validation,
// enqueue mixprec_cuda_efficient_nms on torch's current stream with scratch
// from torch's caching allocator. Never synchronises with the host, so the
// op is capturable in a CUDA graph.
#include <torch/csrc/stable/accelerator.h>

#include "cuda_common.h"
#include "efficient_nms_op.h"

namespace mixprec_shim {
namespace efficient_nms {
namespace {

struct CudaBackend {
  static void check_device(const char* op, const Where& w) { check_cuda_device(op, w); }

  static void run(const char* op, const EfficientNmsArgs& a, EfficientNmsOut& o) {
    torch::stable::accelerator::DeviceGuard guard(a.device.index);
    void* stream = current_cuda_stream(op, a.device.index);
    const int64_t cap = a.params.pre_nms_top_k > 0 && a.params.pre_nms_top_k < a.n * a.classes
                            ? a.params.pre_nms_top_k
                            : a.n * a.classes;
    MIXPREC_CHECK(cap <= MIXPREC_CUDA_DETECT_MAX_CANDIDATES, "mixprec::", op,
                  ": on CUDA at most ", MIXPREC_CUDA_DETECT_MAX_CANDIDATES,
                  " candidates per image reach the NMS; N * C = ", a.n * a.classes,
                  ": pass pre_nms_top_k <= ", MIXPREC_CUDA_DETECT_MAX_CANDIDATES);
    MIXPREC_CHECK(a.batch * a.n * a.classes <= INT32_MAX, "mixprec::", op,
                  ": on CUDA B * N * C must not exceed 2^31 - 1, got ", a.batch * a.n * a.classes);
    const int64_t ws_bytes =
        mixprec_cuda_efficient_nms_workspace_size(a.batch, a.n, a.classes, &a.params);
    MIXPREC_CHECK(ws_bytes >= 0, "mixprec::", op, ": could not size the workspace");
    Tensor workspace =
        torch::stable::new_empty(o.counts, {ws_bytes > 0 ? ws_bytes : 1}, ScalarType::Byte);
    const bool any = a.batch > 0;
    check_status(mixprec_cuda_efficient_nms_strided(
                     a.boxes, a.boxes_dtype, a.scores, a.scores_dtype, &a.layout, a.batch,
                     a.n, a.classes, &a.params, any ? o.boxes.data_ptr() : nullptr,
                     any ? o.scores.data_ptr() : nullptr,
                     any ? static_cast<int64_t*>(o.classes.data_ptr()) : nullptr,
                     any ? static_cast<int64_t*>(o.indices.data_ptr()) : nullptr,
                     any ? static_cast<int64_t*>(o.counts.data_ptr()) : nullptr,
                     workspace.data_ptr(), ws_bytes, stream),
                 op);
  }
};

}  // namespace
}  // namespace efficient_nms
}  // namespace mixprec_shim

STABLE_TORCH_LIBRARY_IMPL(mixprec, CUDA, m) {
  namespace efficient_nms = mixprec_shim::efficient_nms;
  m.impl("efficient_nms", TORCH_BOX(&efficient_nms::efficient_nms_op<efficient_nms::CudaBackend>));
}
