// mixprec::efficient_nms, validated once for both devices: a template over
// a backend B (efficient_nms.cpp: CPU, efficient_nms_cuda.cpp: CUDA) that only says how
// to run the C entry point:
//   B::check_device(op, where)      the tensors are B's
//   B::run(op, args, outputs)       fills the five preallocated outputs
#pragma once

#include <cmath>
#include <optional>
#include <tuple>

#include "common.h"

namespace mixprec_shim {
namespace efficient_nms {

// The C arguments after every check. boxes: (B, N, 4) or (B, N, C, 4)
// float32/float16/bfloat16; scores: (B, N, C), one of those dtypes; any
// strides (read in place, see mixprec_detect_layout); one device.
struct EfficientNmsArgs {
  const void* boxes;
  mixprec_dtype boxes_dtype;
  mixprec_detect_layout layout;
  const void* scores;
  mixprec_dtype scores_dtype;
  int64_t batch, n, classes;
  mixprec_detect_params params;
  Where device;
};

struct EfficientNmsOut {
  Tensor boxes, scores, classes, indices, counts;
};

inline mixprec_dtype efficient_nms_float_dtype(const char* op, const char* arg, const Tensor& t) {
  mixprec_dtype d;
  MIXPREC_CHECK(to_mixprec_dtype(t.scalar_type(), &d), "mixprec::", op, ": ", arg,
                " must be float32, float16 or bfloat16, got ", dtype_name(t.scalar_type()),
                t.scalar_type() == ScalarType::Double
                    ? " (mixprec computes the IoU in float32; cast the detector's outputs)"
                    : "");
  return d;
}

inline void efficient_nms_check_tensor(const char* op, const char* arg, const Tensor& t,
                                const Where& dev) {
  MIXPREC_CHECK(t.defined() && t.layout() == Layout::Strided, "mixprec::", op, ": ", arg,
                " must be a defined strided tensor");
  MIXPREC_CHECK(where(t) == dev, "mixprec::", op, ": ", arg, " is on ", describe(where(t)),
                " but boxes is on ", describe(dev));
}

inline EfficientNmsArgs efficient_nms_args(const char* op, const Tensor& boxes, const Tensor& scores,
                              double iou_threshold, std::optional<double> score_threshold,
                              int64_t max_detections, int64_t pre_nms_top_k,
                              bool class_agnostic, int64_t box_coding) {
  EfficientNmsArgs a;
  a.device = where(boxes);
  efficient_nms_check_tensor(op, "boxes", boxes, a.device);
  a.boxes_dtype = efficient_nms_float_dtype(op, "boxes", boxes);
  efficient_nms_check_tensor(op, "scores", scores, a.device);
  a.scores_dtype = efficient_nms_float_dtype(op, "scores", scores);
  MIXPREC_CHECK(scores.dim() == 3, "mixprec::", op,
                ": scores must have shape (B, N, C), got ", scores.dim(), " dimensions");
  a.batch = scores.size(0);
  a.n = scores.size(1);
  a.classes = scores.size(2);
  const bool shared = boxes.dim() == 3 && boxes.size(2) == 4;
  const bool per_class = boxes.dim() == 4 && boxes.size(3) == 4;
  MIXPREC_CHECK(shared || per_class, "mixprec::", op,
                ": boxes must have shape (B, N, 4) or (B, N, C, 4), got ", boxes.dim(),
                " dimensions", boxes.dim() >= 1 ? " with last size " : "",
                boxes.dim() >= 1 ? boxes.size(boxes.dim() - 1) : 0);
  MIXPREC_CHECK(boxes.size(0) == a.batch && boxes.size(1) == a.n &&
                    (shared || boxes.size(2) == a.classes),
                "mixprec::", op, ": boxes has shape (", boxes.size(0), ", ", boxes.size(1),
                per_class ? ", " : "", per_class ? std::to_string(boxes.size(2)) : std::string(),
                ", 4) but scores has shape (", a.batch, ", ", a.n, ", ", a.classes, ")");
  MIXPREC_CHECK(box_coding == MIXPREC_BOX_CORNER || box_coding == MIXPREC_BOX_CENTER,
                "mixprec::", op, ": box_coding must be 0 (x1, y1, x2, y2) or 1 (cx, cy, w, h), got ",
                box_coding);
  a.layout.box_strides[0] = boxes.stride(0);
  a.layout.box_strides[1] = boxes.stride(1);
  a.layout.box_strides[2] = per_class ? boxes.stride(2) : 0;
  a.layout.box_strides[3] = boxes.stride(per_class ? 3 : 2);
  for (int d = 0; d < 3; d++) a.layout.score_strides[d] = scores.stride(d);
  a.layout.box_coding = (int)box_coding;
  MIXPREC_CHECK(a.classes == 0 || a.n <= INT32_MAX / a.classes, "mixprec::", op,
                ": N * C = ", a.n, " * ", a.classes, " exceeds 2^31 - 1 candidates per image");
  MIXPREC_CHECK(a.batch <= INT32_MAX, "mixprec::", op, ": batch size ", a.batch,
                " exceeds 2^31 - 1");
  MIXPREC_CHECK(iou_threshold >= 0.0, "mixprec::", op,
                ": iou_threshold must be >= 0 and not NaN, got ", iou_threshold);
  MIXPREC_CHECK(!score_threshold.has_value() || !std::isnan(*score_threshold), "mixprec::", op,
                ": score_threshold must not be NaN");
  MIXPREC_CHECK(max_detections >= 1 && max_detections <= INT32_MAX, "mixprec::", op,
                ": max_detections must be in 1 .. 2^31 - 1, got ", max_detections);
  MIXPREC_CHECK(pre_nms_top_k != 0, "mixprec::", op,
                ": pre_nms_top_k must be >= 1, or -1 for all candidates, got 0");
  a.params = mixprec_detect_params_default();
  a.params.iou_threshold = iou_threshold;
  a.params.use_score_threshold = score_threshold.has_value();
  a.params.score_threshold = score_threshold.value_or(0.0);
  a.params.max_detections = max_detections;
  a.params.pre_nms_top_k = pre_nms_top_k < 0 ? -1 : pre_nms_top_k;
  a.params.class_agnostic = class_agnostic ? 1 : 0;
  const bool any = a.batch * a.n * a.classes > 0;
  a.boxes = any ? boxes.data_ptr() : nullptr;
  a.scores = any ? scores.data_ptr() : nullptr;
  return a;
}

inline EfficientNmsOut efficient_nms_outputs(const EfficientNmsArgs& a, const Tensor& boxes, const Tensor& scores) {
  const int64_t k = a.params.max_detections;
  EfficientNmsOut o;
  o.boxes = torch::stable::new_empty(boxes, {a.batch, k, 4});
  o.scores = torch::stable::new_empty(scores, {a.batch, k});
  o.classes = torch::stable::new_empty(boxes, {a.batch, k}, ScalarType::Long);
  o.indices = torch::stable::new_empty(boxes, {a.batch, k}, ScalarType::Long);
  o.counts = torch::stable::new_empty(boxes, {a.batch}, ScalarType::Long);
  return o;
}

template <class B>
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> efficient_nms_op(
    Tensor boxes, Tensor scores, double iou_threshold, std::optional<double> score_threshold,
    int64_t max_detections, int64_t pre_nms_top_k, bool class_agnostic, int64_t box_coding) {
  const char* op = "efficient_nms";
  EfficientNmsArgs a = efficient_nms_args(op, boxes, scores, iou_threshold, score_threshold,
                                          max_detections, pre_nms_top_k, class_agnostic,
                                          box_coding);
  B::check_device(op, a.device);
  EfficientNmsOut o = efficient_nms_outputs(a, boxes, scores);
  B::run(op, a, o);
  return {o.boxes, o.scores, o.classes, o.indices, o.counts};
}

}  // namespace efficient_nms
}  // namespace mixprec_shim
