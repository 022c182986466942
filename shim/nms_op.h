// The NMS ops (nms, batched_nms, nms_padded), validated once for both
// devices: each op is a template over a backend B (nms.cpp: CPU,
// nms_cuda.cpp: CUDA) that only says how to run the C entry point:
//   B::check_device(op, where)         the tensors are B's
//   B::keep(op, args, like)            -> int64 indices of the kept boxes
//   B::keep_padded(op, args, like)     -> (indices padded with -1, count)
// like: the tensor whose device the outputs go to.
#pragma once

#include <cmath>
#include <optional>
#include <tuple>

#include "common.h"

namespace mixprec_shim {
namespace nms {

// The C arguments of mixprec::nms / batched_nms / nms_padded after every
// check. boxes: (N, 4) contiguous float32/float16/bfloat16; scores: (N,)
// contiguous, one of those dtypes; idxs (batched, may be null): (N,)
// contiguous int64/int32; all on one device; iou_threshold >= 0, thresholds
// not NaN.
struct NmsArgs {
  const void* boxes;
  mixprec_dtype boxes_dtype;
  const void* scores;
  mixprec_dtype scores_dtype;
  const void* classes;  // null: one class
  mixprec_index_dtype classes_dtype;
  int64_t n;
  int64_t capacity;  // entries of the padded output
  mixprec_nms_params params;
  Where device;
};

inline mixprec_dtype nms_float_dtype(const char* op, const char* arg, const Tensor& t) {
  mixprec_dtype d;
  MIXPREC_CHECK(to_mixprec_dtype(t.scalar_type(), &d), "mixprec::", op, ": ", arg,
                  " must be float32, float16 or bfloat16, got ", dtype_name(t.scalar_type()),
                  t.scalar_type() == ScalarType::Double
                      ? " (float64 is not supported: mixprec computes the IoU in float32; "
                        "use torchvision.ops for float64)"
                      : "");
  return d;
}

inline void nms_check_tensor(const char* op, const char* arg, const Tensor& t, const Where& dev) {
  MIXPREC_CHECK(t.defined() && t.layout() == Layout::Strided, "mixprec::", op, ": ", arg,
                  " must be a defined strided tensor");
  MIXPREC_CHECK(where(t) == dev, "mixprec::", op, ": ", arg, " is on ", describe(where(t)),
                  " but boxes is on ", describe(dev));
  MIXPREC_CHECK(t.is_contiguous(), "mixprec::", op, ": ", arg,
                  " must be contiguous; call .contiguous() on it");
}

inline NmsArgs nms_args(const char* op, const Tensor& boxes, const Tensor& scores,
                        const Tensor* idxs, double iou_threshold,
                        std::optional<double> score_threshold, int64_t max_output) {
  NmsArgs a;
  a.device = where(boxes);
  nms_check_tensor(op, "boxes", boxes, a.device);
  MIXPREC_CHECK(boxes.dim() == 2 && boxes.size(1) == 4, "mixprec::", op,
                  ": boxes must have shape (N, 4), got ", boxes.dim(), " dimensions",
                  boxes.dim() >= 2 ? " with size(1) = " : "", boxes.dim() >= 2 ? boxes.size(1) : 0);
  a.n = boxes.size(0);
  MIXPREC_CHECK(a.n <= INT32_MAX, "mixprec::", op, ": boxes has ", a.n,
                  " rows; at most 2^31 - 1 are supported");
  a.boxes_dtype = nms_float_dtype(op, "boxes", boxes);
  nms_check_tensor(op, "scores", scores, a.device);
  MIXPREC_CHECK(scores.dim() == 1 && scores.size(0) == a.n, "mixprec::", op,
                  ": scores must have shape (N,) with N = boxes.size(0) = ", a.n, ", got ",
                  scores.dim(), " dimensions and ", scores.numel(), " elements");
  a.scores_dtype = nms_float_dtype(op, "scores", scores);
  a.classes = nullptr;
  a.classes_dtype = MIXPREC_I64;
  if (idxs) {
    nms_check_tensor(op, "idxs", *idxs, a.device);
    MIXPREC_CHECK(idxs->dim() == 1 && idxs->size(0) == a.n, "mixprec::", op,
                    ": idxs must have shape (N,) with N = boxes.size(0) = ", a.n, ", got ",
                    idxs->dim(), " dimensions and ", idxs->numel(), " elements");
    MIXPREC_CHECK(idxs->scalar_type() == ScalarType::Long || idxs->scalar_type() == ScalarType::Int,
                    "mixprec::", op, ": idxs must be int64 or int32, got ",
                    dtype_name(idxs->scalar_type()));
    a.classes_dtype = idxs->scalar_type() == ScalarType::Int ? MIXPREC_I32 : MIXPREC_I64;
    a.classes = a.n ? idxs->data_ptr() : nullptr;
  }
  MIXPREC_CHECK(iou_threshold >= 0.0, "mixprec::", op,
                  ": iou_threshold must be >= 0 and not NaN, got ", iou_threshold);
  MIXPREC_CHECK(!score_threshold.has_value() || !std::isnan(*score_threshold), "mixprec::", op,
                  ": score_threshold must not be NaN");
  a.params = mixprec_nms_params_default();
  a.params.iou_threshold = iou_threshold;
  a.params.use_score_threshold = score_threshold.has_value();
  a.params.score_threshold = score_threshold.value_or(0.0);
  a.params.max_output = max_output < 0 ? -1 : max_output;
  a.capacity = mixprec_nms_capacity(a.n, &a.params);
  a.boxes = a.n ? boxes.data_ptr() : nullptr;
  a.scores = a.n ? scores.data_ptr() : nullptr;
  return a;
}

template <class B>
Tensor nms_op(Tensor boxes, Tensor scores, double iou_threshold,
              std::optional<double> score_threshold, int64_t max_output) {
  const char* op = "nms";
  NmsArgs a = nms_args(op, boxes, scores, nullptr, iou_threshold, score_threshold, max_output);
  B::check_device(op, a.device);
  return B::keep(op, a, boxes);
}

template <class B>
Tensor batched_nms_op(Tensor boxes, Tensor scores, Tensor idxs, double iou_threshold,
                      std::optional<double> score_threshold, int64_t max_output) {
  const char* op = "batched_nms";
  NmsArgs a = nms_args(op, boxes, scores, &idxs, iou_threshold, score_threshold, max_output);
  B::check_device(op, a.device);
  return B::keep(op, a, boxes);
}

template <class B>
std::tuple<Tensor, Tensor> nms_padded_op(Tensor boxes, Tensor scores, std::optional<Tensor> idxs,
                                         double iou_threshold,
                                         std::optional<double> score_threshold,
                                         int64_t max_output) {
  const char* op = "nms_padded";
  NmsArgs a = nms_args(op, boxes, scores, idxs.has_value() ? &*idxs : nullptr, iou_threshold,
                       score_threshold, max_output);
  B::check_device(op, a.device);
  return B::keep_padded(op, a, boxes);
}

}  // namespace nms
}  // namespace mixprec_shim
