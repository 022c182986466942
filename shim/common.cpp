#include "common.h"

#include <torch/headeronly/core/Layout.h>
#include <torch/headeronly/core/ScalarType.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

namespace mixprec_shim {

using torch::headeronly::Layout;
using torch::headeronly::ScalarType;

void check_status(mixprec_status st, const char* op) {
  STD_TORCH_CHECK(st == MIXPREC_OK, "mixprec::", op, ": ", mixprec_status_string(st));
}

Where where(const Tensor& t) {
  if (t.is_cpu()) return {false, -1};
  return {t.is_cuda(), t.get_device_index()};
}

std::string describe(const Where& w) {
  return w.cuda ? "cuda:" + std::to_string(w.index) : std::string(w.index < 0 ? "cpu" : "another device");
}

const char* dtype_name(ScalarType s) {
  switch (s) {
    case ScalarType::Float: return "float32";
    case ScalarType::Half: return "float16";
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::Double: return "float64";
    case ScalarType::Int: return "int32";
    case ScalarType::Long: return "int64";
    default: return "an unsupported dtype";
  }
}

bool to_mixprec_dtype(ScalarType s, mixprec_dtype* d) {
  switch (s) {
    case ScalarType::Float: *d = MIXPREC_F32; return true;
    case ScalarType::Half: *d = MIXPREC_F16; return true;
    case ScalarType::BFloat16: *d = MIXPREC_BF16; return true;
    default: return false;
  }
}

// Strided and "non-overlapping and dense": the elements fill numel slots of
// memory exactly, in some order of dimensions (contiguous, channels_last,
// transposed). An elementwise kernel may then walk them as one flat array.
static bool is_dense(const Tensor& t) {
  if (t.is_contiguous()) return true;
  auto sizes = t.sizes();
  auto strides = t.strides();
  const int64_t n = t.dim();
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return strides[a] < strides[b] || (strides[a] == strides[b] && sizes[a] < sizes[b]);
  });
  int64_t expected = 1;
  for (int64_t d : order) {
    if (sizes[d] == 1) continue;
    if (strides[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}

static void check_scalar_f32(const char* op, const char* arg, const Tensor& t,
                             const Where& dev) {
  STD_TORCH_CHECK(t.layout() == Layout::Strided, "mixprec::", op, ": ", arg,
                  " must be a strided (dense) tensor");
  STD_TORCH_CHECK(t.scalar_type() == ScalarType::Float, "mixprec::", op, ": ", arg,
                  " must be float32, got ", dtype_name(t.scalar_type()));
  STD_TORCH_CHECK(t.numel() == 1, "mixprec::", op, ": ", arg,
                  " must have exactly one element, got ", t.numel());
  STD_TORCH_CHECK(where(t) == dev, "mixprec::", op, ": ", arg, " is on ",
                  describe(where(t)), " but must be on ", describe(dev));
}

UnscaleArgs unscale_args(const char* op, const std::vector<Tensor>& grads,
                         const Tensor& found_inf, const Tensor& inv_scale) {
  UnscaleArgs a;
  a.device = where(found_inf);
  check_scalar_f32(op, "found_inf", found_inf, a.device);
  check_scalar_f32(op, "inv_scale", inv_scale, a.device);
  STD_TORCH_CHECK(!grads.empty(), "mixprec::", op, ": grads must be a non-empty list of tensors");
  a.list.reserve(grads.size());
  for (size_t i = 0; i < grads.size(); i++) {
    const Tensor& g = grads[i];
    STD_TORCH_CHECK(g.defined(), "mixprec::", op, ": grads[", i, "] is undefined");
    STD_TORCH_CHECK(g.layout() == Layout::Strided, "mixprec::", op, ": grads[", i,
                    "] must be a strided tensor (sparse gradients are not supported)");
    mixprec_dtype dt;
    STD_TORCH_CHECK(to_mixprec_dtype(g.scalar_type(), &dt), "mixprec::", op, ": grads[", i,
                    "] must be float32, float16 or bfloat16, got ", dtype_name(g.scalar_type()));
    STD_TORCH_CHECK(where(g) == a.device, "mixprec::", op, ": grads[", i, "] is on ",
                    describe(where(g)), " but found_inf is on ", describe(a.device));
    STD_TORCH_CHECK(is_dense(g), "mixprec::", op, ": grads[", i,
                    "] must be contiguous or dense in some dimension order "
                    "(e.g. channels_last); call .contiguous() on it");
    // Strides are never negative in torch, so a dense tensor's data_ptr() is
    // the lowest address of its elements whatever the dimension order.
    a.list.push_back({g.numel() ? g.data_ptr() : nullptr, g.numel(), dt});
  }
  a.found_inf = static_cast<float*>(found_inf.data_ptr());
  a.inv_scale = static_cast<const float*>(inv_scale.data_ptr());
  return a;
}

static void check_scalar(const char* op, const char* arg, const Tensor& t,
                         ScalarType want, const Where& dev) {
  STD_TORCH_CHECK(t.layout() == Layout::Strided, "mixprec::", op, ": ", arg,
                  " must be a strided (dense) tensor");
  STD_TORCH_CHECK(t.scalar_type() == want, "mixprec::", op, ": ", arg, " must be ",
                  dtype_name(want), ", got ", dtype_name(t.scalar_type()));
  STD_TORCH_CHECK(t.numel() == 1, "mixprec::", op, ": ", arg,
                  " must have exactly one element, got ", t.numel());
  STD_TORCH_CHECK(where(t) == dev, "mixprec::", op, ": ", arg, " is on ",
                  describe(where(t)), " but scale is on ", describe(dev));
}

UpdateScaleArgs update_scale_args(const char* op, const Tensor& scale,
                                  const Tensor& growth_tracker,
                                  const Tensor* hysteresis_tracker,
                                  const Tensor* skipped_steps,
                                  const Tensor& found_inf, double growth_factor,
                                  double backoff_factor, int64_t growth_interval,
                                  int64_t hysteresis, double min_scale,
                                  double max_scale) {
  UpdateScaleArgs a;
  a.device = where(scale);
  check_scalar(op, "scale", scale, ScalarType::Float, a.device);
  check_scalar(op, "growth_tracker", growth_tracker, ScalarType::Int, a.device);
  check_scalar(op, "found_inf", found_inf, ScalarType::Float, a.device);
  a.hysteresis_tracker = nullptr;
  a.skipped_steps = nullptr;
  if (hysteresis_tracker) {
    check_scalar(op, "hysteresis_tracker", *hysteresis_tracker, ScalarType::Int, a.device);
    a.hysteresis_tracker = static_cast<int32_t*>(hysteresis_tracker->data_ptr());
  }
  if (skipped_steps) {
    check_scalar(op, "skipped_steps", *skipped_steps, ScalarType::Long, a.device);
    a.skipped_steps = static_cast<int64_t*>(skipped_steps->data_ptr());
  }
  STD_TORCH_CHECK(std::isfinite(growth_factor) && growth_factor > 0, "mixprec::", op,
                  ": growth_factor must be finite and positive, got ", growth_factor);
  STD_TORCH_CHECK(std::isfinite(backoff_factor) && backoff_factor > 0, "mixprec::", op,
                  ": backoff_factor must be finite and positive, got ", backoff_factor);
  STD_TORCH_CHECK(growth_interval >= 1 && growth_interval <= INT32_MAX, "mixprec::", op,
                  ": growth_interval must be in [1, 2^31), got ", growth_interval);
  STD_TORCH_CHECK(hysteresis >= 1 && hysteresis <= INT32_MAX, "mixprec::", op,
                  ": hysteresis must be >= 1, got ", hysteresis);
  STD_TORCH_CHECK(min_scale >= 0 && max_scale >= min_scale, "mixprec::", op,
                  ": need 0 <= min_scale <= max_scale, got min_scale=", min_scale,
                  " max_scale=", max_scale);
  a.scale = static_cast<float*>(scale.data_ptr());
  a.growth_tracker = static_cast<int32_t*>(growth_tracker.data_ptr());
  a.found_inf = static_cast<const float*>(found_inf.data_ptr());
  a.params.growth_factor = growth_factor;
  a.params.backoff_factor = backoff_factor;
  a.params.growth_interval = growth_interval;
  a.params.hysteresis = hysteresis;
  a.params.min_scale = static_cast<float>(min_scale);
  a.params.max_scale = static_cast<float>(max_scale);
  return a;
}

static bool same_layout(const Tensor& a, const Tensor& b) {
  if (a.dim() != b.dim()) return false;
  auto sa = a.sizes(), sb = b.sizes(), ta = a.strides(), tb = b.strides();
  for (int64_t d = 0; d < a.dim(); d++) {
    if (sa[d] != sb[d]) return false;
    if (sa[d] != 1 && ta[d] != tb[d]) return false;
  }
  return true;
}

static mixprec_dtype float_dtype(const char* op, const char* list, size_t i, const Tensor& t) {
  mixprec_dtype d;
  STD_TORCH_CHECK(to_mixprec_dtype(t.scalar_type(), &d), "mixprec::", op, ": ", list, "[", i,
                  "] must be float32, float16 or bfloat16, got ", dtype_name(t.scalar_type()));
  return d;
}

// An element-for-element companion of params[i] (grad, master, state).
static void check_companion(const char* op, const char* list, size_t i, const Tensor& t,
                            const Tensor& param, const Where& dev) {
  STD_TORCH_CHECK(t.defined() && t.layout() == Layout::Strided, "mixprec::", op, ": ", list, "[",
                  i, "] must be a defined strided tensor (sparse is not supported)");
  STD_TORCH_CHECK(where(t) == dev, "mixprec::", op, ": ", list, "[", i, "] is on ",
                  describe(where(t)), " but params[", i, "] is on ", describe(dev));
  STD_TORCH_CHECK(same_layout(t, param), "mixprec::", op, ": ", list, "[", i,
                  "] must have the same shape and strides as params[", i, "]");
}

OptArgs opt_args(const char* op, const std::vector<Tensor>& params,
                 const std::vector<Tensor>& grads, const std::vector<Tensor>& masters,
                 const std::vector<Tensor>* states[], const char* const state_names[],
                 int n_states, const std::vector<Tensor>& steps,
                 const std::optional<Tensor>& lr_tensor, const std::optional<Tensor>& grad_scale,
                 const std::optional<Tensor>& found_inf) {
  OptArgs a;
  const size_t n = params.size();
  STD_TORCH_CHECK(n > 0, "mixprec::", op, ": params must be a non-empty list of tensors");
  STD_TORCH_CHECK(grads.size() == n, "mixprec::", op, ": grads has ", grads.size(),
                  " tensors but params has ", n);
  STD_TORCH_CHECK(masters.size() == n, "mixprec::", op, ": masters has ", masters.size(),
                  " tensors but params has ", n);
  STD_TORCH_CHECK(steps.size() == n, "mixprec::", op, ": steps has ", steps.size(),
                  " tensors but params has ", n);
  for (int k = 0; k < n_states; k++)
    STD_TORCH_CHECK(states[k]->empty() || states[k]->size() == n, "mixprec::", op, ": ",
                    state_names[k], " has ", states[k]->size(), " tensors but params has ", n);
  a.device = where(params[0]);
  a.list.resize(n);
  for (size_t i = 0; i < n; i++) {
    const Tensor& p = params[i];
    STD_TORCH_CHECK(p.defined() && p.layout() == Layout::Strided, "mixprec::", op, ": params[", i,
                    "] must be a defined strided tensor");
    STD_TORCH_CHECK(where(p) == a.device, "mixprec::", op, ": params[", i, "] is on ",
                    describe(where(p)), " but params[0] is on ", describe(a.device));
    STD_TORCH_CHECK(is_dense(p), "mixprec::", op, ": params[", i,
                    "] must be contiguous or dense in some dimension order");
    mixprec_opt_tensor& d = a.list[i];
    d.numel = p.numel();
    d.param_dtype = float_dtype(op, "params", i, p);
    d.param = d.numel ? p.data_ptr() : nullptr;
    check_companion(op, "grads", i, grads[i], p, a.device);
    d.grad_dtype = float_dtype(op, "grads", i, grads[i]);
    d.grad = d.numel ? grads[i].data_ptr() : nullptr;
    const Tensor& m = masters[i];
    if (d.param_dtype == MIXPREC_F32 || (m.defined() && m.numel() == 0 && d.numel == 0)) {
      STD_TORCH_CHECK(!m.defined() || m.numel() == 0, "mixprec::", op, ": masters[", i,
                      "] must be an empty tensor: params[", i, "] is float32 (its own master)");
      d.master = nullptr;
    } else if (!m.defined() || m.numel() == 0) {
      // No master: the stochastic-rounding mode, for bfloat16 only.
      STD_TORCH_CHECK(d.param_dtype == MIXPREC_BF16, "mixprec::", op, ": masters[", i,
                      "] is empty but params[", i,
                      "] is float16: only bfloat16 params can go without an FP32 master"
                      " (stochastic rounding)");
      d.master = nullptr;
    } else {
      check_companion(op, "masters", i, m, p, a.device);
      STD_TORCH_CHECK(m.scalar_type() == ScalarType::Float, "mixprec::", op, ": masters[", i,
                      "] must be float32, got ", dtype_name(m.scalar_type()));
      d.master = d.numel ? static_cast<float*>(m.data_ptr()) : nullptr;
    }
    float* state_ptr[3] = {nullptr, nullptr, nullptr};
    for (int k = 0; k < n_states; k++) {
      if (states[k]->empty()) continue;
      const Tensor& t = (*states[k])[i];
      check_companion(op, state_names[k], i, t, p, a.device);
      STD_TORCH_CHECK(t.scalar_type() == ScalarType::Float, "mixprec::", op, ": ",
                      state_names[k], "[", i, "] must be float32, got ",
                      dtype_name(t.scalar_type()));
      state_ptr[k] = d.numel ? static_cast<float*>(t.data_ptr()) : nullptr;
    }
    d.exp_avg = state_ptr[0];
    d.exp_avg_sq = state_ptr[1];
    d.max_exp_avg_sq = state_ptr[2];
    const Tensor& st = steps[i];
    STD_TORCH_CHECK(st.defined() && st.scalar_type() == ScalarType::Float && st.numel() == 1,
                    "mixprec::", op, ": steps[", i, "] must be a one-element float32 tensor");
    STD_TORCH_CHECK(where(st) == a.device, "mixprec::", op, ": steps[", i, "] is on ",
                    describe(where(st)), " but params[", i, "] is on ", describe(a.device));
    d.step = static_cast<float*>(st.data_ptr());
  }
  const std::optional<Tensor>* scalars[3] = {&lr_tensor, &grad_scale, &found_inf};
  const char* scalar_names[3] = {"lr", "grad_scale", "found_inf"};
  const float* scalar_ptr[3] = {nullptr, nullptr, nullptr};
  for (int k = 0; k < 3; k++) {
    if (!scalars[k]->has_value()) continue;
    check_scalar_f32(op, scalar_names[k], **scalars[k], a.device);
    scalar_ptr[k] = static_cast<const float*>((*scalars[k])->data_ptr());
  }
  a.lr_tensor = scalar_ptr[0];
  a.grad_scale = scalar_ptr[1];
  a.found_inf = scalar_ptr[2];
  return a;
}

static mixprec_dtype nms_float_dtype(const char* op, const char* arg, const Tensor& t) {
  mixprec_dtype d;
  STD_TORCH_CHECK(to_mixprec_dtype(t.scalar_type(), &d), "mixprec::", op, ": ", arg,
                  " must be float32, float16 or bfloat16, got ", dtype_name(t.scalar_type()),
                  t.scalar_type() == ScalarType::Double
                      ? " (float64 is not supported: mixprec computes the IoU in float32; "
                        "use torchvision.ops for float64)"
                      : "");
  return d;
}

static void nms_check_tensor(const char* op, const char* arg, const Tensor& t, const Where& dev) {
  STD_TORCH_CHECK(t.defined() && t.layout() == Layout::Strided, "mixprec::", op, ": ", arg,
                  " must be a defined strided tensor");
  STD_TORCH_CHECK(where(t) == dev, "mixprec::", op, ": ", arg, " is on ", describe(where(t)),
                  " but boxes is on ", describe(dev));
  STD_TORCH_CHECK(t.is_contiguous(), "mixprec::", op, ": ", arg,
                  " must be contiguous; call .contiguous() on it");
}

NmsArgs nms_args(const char* op, const Tensor& boxes, const Tensor& scores, const Tensor* idxs,
                 double iou_threshold, std::optional<double> score_threshold, int64_t max_output) {
  NmsArgs a;
  a.device = where(boxes);
  nms_check_tensor(op, "boxes", boxes, a.device);
  STD_TORCH_CHECK(boxes.dim() == 2 && boxes.size(1) == 4, "mixprec::", op,
                  ": boxes must have shape (N, 4), got ", boxes.dim(), " dimensions",
                  boxes.dim() >= 2 ? " with size(1) = " : "", boxes.dim() >= 2 ? boxes.size(1) : 0);
  a.n = boxes.size(0);
  STD_TORCH_CHECK(a.n <= INT32_MAX, "mixprec::", op, ": boxes has ", a.n,
                  " rows; at most 2^31 - 1 are supported");
  a.boxes_dtype = nms_float_dtype(op, "boxes", boxes);
  nms_check_tensor(op, "scores", scores, a.device);
  STD_TORCH_CHECK(scores.dim() == 1 && scores.size(0) == a.n, "mixprec::", op,
                  ": scores must have shape (N,) with N = boxes.size(0) = ", a.n, ", got ",
                  scores.dim(), " dimensions and ", scores.numel(), " elements");
  a.scores_dtype = nms_float_dtype(op, "scores", scores);
  a.classes = nullptr;
  a.classes_dtype = MIXPREC_I64;
  if (idxs) {
    nms_check_tensor(op, "idxs", *idxs, a.device);
    STD_TORCH_CHECK(idxs->dim() == 1 && idxs->size(0) == a.n, "mixprec::", op,
                    ": idxs must have shape (N,) with N = boxes.size(0) = ", a.n, ", got ",
                    idxs->dim(), " dimensions and ", idxs->numel(), " elements");
    STD_TORCH_CHECK(idxs->scalar_type() == ScalarType::Long || idxs->scalar_type() == ScalarType::Int,
                    "mixprec::", op, ": idxs must be int64 or int32, got ",
                    dtype_name(idxs->scalar_type()));
    a.classes_dtype = idxs->scalar_type() == ScalarType::Int ? MIXPREC_I32 : MIXPREC_I64;
    a.classes = a.n ? idxs->data_ptr() : nullptr;
  }
  STD_TORCH_CHECK(iou_threshold >= 0.0, "mixprec::", op,
                  ": iou_threshold must be >= 0 and not NaN, got ", iou_threshold);
  STD_TORCH_CHECK(!score_threshold.has_value() || !std::isnan(*score_threshold), "mixprec::", op,
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

}  // namespace mixprec_shim
