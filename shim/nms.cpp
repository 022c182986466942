// The nms family: its schemas, and its CPU backend. The validation is
// nms_op.h's, shared with the CUDA backend in nms_cuda.cpp.
#include <cstring>
#include <memory>

#include "nms_op.h"

namespace mixprec_shim {
namespace nms {
namespace {

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

struct CpuBackend {
  static void check_device(const char* op, const Where& w) { check_cpu_device(op, w); }

  // The kept indices in a tensor of exactly their number (copied with
  // memcpy: a torch copy would start a parallel region for a few hundred
  // KiB).
  static Tensor keep(const char* op, const NmsArgs& a, const Tensor& like) {
    std::unique_ptr<int64_t[]> buf(new int64_t[static_cast<size_t>(a.capacity) + 1]);
    const int64_t count = run_cpu(op, a, buf.get());
    Tensor keep = torch::stable::new_empty(like, {count}, ScalarType::Long);
    if (count)
      std::memcpy(keep.data_ptr(), buf.get(), sizeof(int64_t) * static_cast<size_t>(count));
    return keep;
  }

  static std::tuple<Tensor, Tensor> keep_padded(const char* op, const NmsArgs& a,
                                                const Tensor& like) {
    Tensor keep = torch::stable::new_empty(like, {a.capacity}, ScalarType::Long);
    const int64_t count =
        run_cpu(op, a, a.capacity ? static_cast<int64_t*>(keep.data_ptr()) : nullptr);
    Tensor n = torch::stable::new_empty(like, {}, ScalarType::Long);
    *static_cast<int64_t*>(n.data_ptr()) = count;
    return {keep, n};
  }
};

}  // namespace
}  // namespace nms
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
  namespace nms = mixprec_shim::nms;
  using B = nms::CpuBackend;
  m.impl("nms", TORCH_BOX(&nms::nms_op<B>));
  m.impl("batched_nms", TORCH_BOX(&nms::batched_nms_op<B>));
  m.impl("nms_padded", TORCH_BOX(&nms::nms_padded_op<B>));
}
