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

static std::string describe(const Where& w) {
  return w.cuda ? "cuda:" + std::to_string(w.index) : std::string(w.index < 0 ? "cpu" : "another device");
}

static const char* dtype_name(ScalarType s) {
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
    switch (g.scalar_type()) {
      case ScalarType::Float: dt = MIXPREC_F32; break;
      case ScalarType::Half: dt = MIXPREC_F16; break;
      case ScalarType::BFloat16: dt = MIXPREC_BF16; break;
      default:
        STD_TORCH_CHECK(false, "mixprec::", op, ": grads[", i,
                        "] must be float32, float16 or bfloat16, got ",
                        dtype_name(g.scalar_type()));
    }
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

ScaleUpdateArgs scale_update_args(const char* op, const Tensor& scale,
                                  const Tensor& growth_tracker,
                                  const Tensor* hysteresis_tracker,
                                  const Tensor* skipped_steps,
                                  const Tensor& found_inf, double growth_factor,
                                  double backoff_factor, int64_t growth_interval,
                                  int64_t hysteresis, double min_scale,
                                  double max_scale) {
  ScaleUpdateArgs a;
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

}  // namespace mixprec_shim
