// CUDA implementations of the NMS ops: validate (nms_args in common.cpp),
// then enqueue mixprec_cuda_nms on torch's current stream. Scratch, outputs
// and the count come from torch's caching allocator. nms / batched_nms read
// the kept count back (one 8-byte copy, one host sync) to size their output;
// nms_padded does not synchronise at all.
#include <torch/csrc/stable/accelerator.h>
#include <torch/headeronly/core/ScalarType.h>

#include <tuple>

#include "cuda_common.h"

namespace mixprec_shim {
namespace {

using torch::headeronly::ScalarType;

struct CudaResult {
  Tensor keep;   // capacity entries, -1 after the kept ones
  Tensor count;  // 0-dim int64 on the device
  void* stream;
};

CudaResult run_cuda(const char* op, const NmsArgs& a, const Tensor& like) {
  check_cuda_device(op, a.device);
  torch::stable::accelerator::DeviceGuard guard(a.device.index);
  void* stream = current_cuda_stream(op, a.device.index);
  const int64_t ws_bytes = mixprec_cuda_nms_workspace_size(a.n);
  STD_TORCH_CHECK(ws_bytes >= 0, "mixprec::", op, ": could not size the workspace for ", a.n,
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

Tensor sized(const char* op, CudaResult r, int64_t capacity) {
  int64_t count = 0;
  check_status(mixprec_cuda_nms_read_count(static_cast<const int64_t*>(r.count.data_ptr()),
                                           &count, r.stream),
               op);
  if (count == capacity) return r.keep;
  return torch::stable::clone(torch::stable::narrow(r.keep, 0, 0, count));
}

Tensor nms_cuda(Tensor boxes, Tensor scores, double iou_threshold,
                std::optional<double> score_threshold, int64_t max_output) {
  NmsArgs a = nms_args("nms", boxes, scores, nullptr, iou_threshold, score_threshold, max_output);
  torch::stable::accelerator::DeviceGuard guard(a.device.index);
  return sized("nms", run_cuda("nms", a, boxes), a.capacity);
}

Tensor batched_nms_cuda(Tensor boxes, Tensor scores, Tensor idxs, double iou_threshold,
                        std::optional<double> score_threshold, int64_t max_output) {
  NmsArgs a = nms_args("batched_nms", boxes, scores, &idxs, iou_threshold, score_threshold,
                       max_output);
  torch::stable::accelerator::DeviceGuard guard(a.device.index);
  return sized("batched_nms", run_cuda("batched_nms", a, boxes), a.capacity);
}

std::tuple<Tensor, Tensor> nms_padded_cuda(Tensor boxes, Tensor scores,
                                           std::optional<Tensor> idxs, double iou_threshold,
                                           std::optional<double> score_threshold,
                                           int64_t max_output) {
  NmsArgs a = nms_args("nms_padded", boxes, scores, idxs.has_value() ? &*idxs : nullptr,
                       iou_threshold, score_threshold, max_output);
  CudaResult r = run_cuda("nms_padded", a, boxes);
  return {r.keep, r.count};
}

}  // namespace
}  // namespace mixprec_shim

STABLE_TORCH_LIBRARY_IMPL(mixprec, CUDA, m) {
  m.impl("nms", TORCH_BOX(&mixprec_shim::nms_cuda));
  m.impl("batched_nms", TORCH_BOX(&mixprec_shim::batched_nms_cuda));
  m.impl("nms_padded", TORCH_BOX(&mixprec_shim::nms_padded_cuda));
}
