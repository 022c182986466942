// NMS ops: schemas (a fragment of the mixprec library) and the CPU
// implementations. Validation is nms_args() in common.cpp, shared with the
// CUDA implementations in nms_cuda.cpp.
#include <torch/headeronly/core/ScalarType.h>

#include <cstring>
#include <memory>
#include <tuple>

#include "common.h"

namespace mixprec_shim {
namespace {

using torch::headeronly::ScalarType;

// Runs the C API into `out` (a.capacity entries, padded with -1).
int64_t run_cpu(const char* op, const NmsArgs& a, int64_t* out) {
  int64_t count = 0;
  mixprec_status st =
      a.classes ? mixprec_batched_nms(a.boxes, a.boxes_dtype, a.scores, a.scores_dtype, a.classes,
                                      a.classes_dtype, a.n, &a.params, out, &count)
                : mixprec_nms(a.boxes, a.boxes_dtype, a.scores, a.scores_dtype, a.n, &a.params,
                              out, &count);
  check_status(st, op);
  return count;
}

// The kept indices in a tensor of exactly their number (copied with memcpy:
// a torch copy would start a parallel region for a few hundred KiB).
Tensor exact(const char* op, const NmsArgs& a, const Tensor& like) {
  std::unique_ptr<int64_t[]> buf(new int64_t[static_cast<size_t>(a.capacity) + 1]);
  const int64_t count = run_cpu(op, a, buf.get());
  Tensor keep = torch::stable::new_empty(like, {count}, ScalarType::Long);
  if (count) std::memcpy(keep.data_ptr(), buf.get(), sizeof(int64_t) * static_cast<size_t>(count));
  return keep;
}

Tensor nms_cpu(Tensor boxes, Tensor scores, double iou_threshold,
               std::optional<double> score_threshold, int64_t max_output) {
  NmsArgs a = nms_args("nms", boxes, scores, nullptr, iou_threshold, score_threshold, max_output);
  return exact("nms", a, boxes);
}

Tensor batched_nms_cpu(Tensor boxes, Tensor scores, Tensor idxs, double iou_threshold,
                       std::optional<double> score_threshold, int64_t max_output) {
  NmsArgs a = nms_args("batched_nms", boxes, scores, &idxs, iou_threshold, score_threshold,
                       max_output);
  return exact("batched_nms", a, boxes);
}

std::tuple<Tensor, Tensor> nms_padded_cpu(Tensor boxes, Tensor scores, std::optional<Tensor> idxs,
                                          double iou_threshold,
                                          std::optional<double> score_threshold,
                                          int64_t max_output) {
  NmsArgs a = nms_args("nms_padded", boxes, scores, idxs.has_value() ? &*idxs : nullptr,
                       iou_threshold, score_threshold, max_output);
  Tensor keep = torch::stable::new_empty(boxes, {a.capacity}, ScalarType::Long);
  const int64_t count =
      run_cpu("nms_padded", a, a.capacity ? static_cast<int64_t*>(keep.data_ptr()) : nullptr);
  Tensor n = torch::stable::new_empty(boxes, {}, ScalarType::Long);
  *static_cast<int64_t*>(n.data_ptr()) = count;
  return {keep, n};
}

}  // namespace
}  // namespace mixprec_shim

STABLE_TORCH_LIBRARY_FRAGMENT(mixprec, m) {
  // torchvision.ops.nms with the IoU in float32 for float32/float16/bfloat16
  // boxes: int64 indices of the kept boxes by decreasing score (stable).
  // score_threshold: only boxes with score > it take part; max_output >= 0:
  // keep at most that many (the first ones).
  m.def(
      "nms(Tensor boxes, Tensor scores, float iou_threshold, float? score_threshold=None,"
      " int max_output=-1) -> Tensor");
  // torchvision.ops.batched_nms: boxes only suppress boxes with the same idxs
  // (int64 or int32); coordinates are never offset by class.
  m.def(
      "batched_nms(Tensor boxes, Tensor scores, Tensor idxs, float iou_threshold,"
      " float? score_threshold=None, int max_output=-1) -> Tensor");
  // Fixed-size output for export and CUDA graphs: (indices padded with -1 to
  // min(N, max_output) entries, or N when max_output < 0; 0-dim int64 count
  // on the boxes' device). idxs None: one class. No host sync on CUDA.
  m.def(
      "nms_padded(Tensor boxes, Tensor scores, Tensor? idxs, float iou_threshold,"
      " float? score_threshold=None, int max_output=-1) -> (Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(mixprec, CPU, m) {
  m.impl("nms", TORCH_BOX(&mixprec_shim::nms_cpu));
  m.impl("batched_nms", TORCH_BOX(&mixprec_shim::batched_nms_cpu));
  m.impl("nms_padded", TORCH_BOX(&mixprec_shim::nms_padded_cpu));
}
