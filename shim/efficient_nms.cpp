// The efficient_nms family (batched detection post-processing): its schema and its
// CPU backend. The validation is efficient_nms_op.h's, shared with efficient_nms_cuda.cpp.
#include "efficient_nms_op.h"

namespace mixprec_shim {
namespace efficient_nms {
namespace {

struct CpuBackend {
  static void check_device(const char* op, const Where& w) { check_cpu_device(op, w); }

  static void run(const char* op, const EfficientNmsArgs& a, EfficientNmsOut& o) {
    const bool any = a.batch > 0;
    check_status(
        mixprec_efficient_nms_strided(a.boxes, a.boxes_dtype, a.scores, a.scores_dtype, &a.layout,
                                      a.batch, a.n, a.classes, &a.params,
                              any ? o.boxes.data_ptr() : nullptr,
                              any ? o.scores.data_ptr() : nullptr,
                              any ? static_cast<int64_t*>(o.classes.data_ptr()) : nullptr,
                              any ? static_cast<int64_t*>(o.indices.data_ptr()) : nullptr,
                              any ? static_cast<int64_t*>(o.counts.data_ptr()) : nullptr),
        op);
  }
};

}  // namespace
}  // namespace efficient_nms
}  // namespace mixprec_shim

STABLE_TORCH_LIBRARY_FRAGMENT(mixprec, m) {
  // Batched detection post-processing (TensorRT's EfficientNMS): per image,
  // candidates (n, c) with scores[b, n, c] > score_threshold (NaN never),
  // decreasing score (ties: lower n * C + c first), the first pre_nms_top_k
  // of them, class-aware (or class-agnostic) greedy NMS with the IoU in
  // float32. Returns (boxes (B, K, 4), scores (B, K), classes (B, K) int64,
  // indices (B, K) int64 = n, counts (B,) int64), K = max_detections, padded
  // with 0 / -1 after counts[b]. boxes: (B, N, 4) or (B, N, C, 4), any
  // strides (read in place); box_coding 0: x1, y1, x2, y2, 1: cx, cy, w, h
  // (then the output boxes are the decoded corners).
  m.def(
      "efficient_nms(Tensor boxes, Tensor scores, float iou_threshold=0.5,"
      " float? score_threshold=None, int max_detections=100, int pre_nms_top_k=-1,"
      " bool class_agnostic=False, int box_coding=0) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(mixprec, CPU, m) {
  namespace efficient_nms = mixprec_shim::efficient_nms;
  m.impl("efficient_nms", TORCH_BOX(&efficient_nms::efficient_nms_op<efficient_nms::CpuBackend>));
}
