// The small vocabulary every family's validation (shim/<family>_op.h) is
// written in: C status to RuntimeError, dtype names and the mixprec dtype of
// a torch dtype, where a tensor lives, and the few tensor checks more than one
// family makes. The checks of an op itself live in its family's _op.h.
#pragma once

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/Layout.h>
#include <torch/headeronly/core/ScalarType.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "mixprec/mixprec.h"

namespace mixprec_shim {

namespace detail {
template <typename... Args>
std::string check_message(const Args&... args) {
  std::ostringstream oss;
  ((oss << args), ...);
  return std::move(oss).str();
}
}  // namespace detail

}  // namespace mixprec_shim

// MIXPREC_CHECK(cond, parts...): unless cond, throws std::runtime_error (a
// RuntimeError in Python) whose message is exactly the parts joined.
// STD_TORCH_CHECK prefixes its message with the C++ function name, source
// path and line ("check_scalar, /path/shim/common.h:109, mixprec::..."),
// which users should never see: every mixprec message goes through this.
#define MIXPREC_CHECK(cond, ...)                                                \
  do {                                                                          \
    if (!(cond)) {                                                              \
      throw std::runtime_error(::mixprec_shim::detail::check_message(__VA_ARGS__)); \
    }                                                                           \
  } while (0)

namespace mixprec_shim {

using torch::headeronly::Layout;
using torch::headeronly::ScalarType;
using torch::stable::Tensor;

// Raises RuntimeError "mixprec::<op>: <C status text>" unless st is OK.
inline void check_status(mixprec_status st, const char* op) {
  MIXPREC_CHECK(st == MIXPREC_OK, "mixprec::", op, ": ", mixprec_status_string(st));
}

// "float32", "float16", ... for error messages.
inline const char* dtype_name(ScalarType s) {
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

// The mixprec dtype of float32 / float16 / bfloat16; false for any other.
inline bool to_mixprec_dtype(ScalarType s, mixprec_dtype* d) {
  switch (s) {
    case ScalarType::Float: *d = MIXPREC_F32; return true;
    case ScalarType::Half: *d = MIXPREC_F16; return true;
    case ScalarType::BFloat16: *d = MIXPREC_BF16; return true;
    default: return false;
  }
}

// MIXPREC_SHIM_DISPATCH(dtype, T, body...): the shim's one dtype switch
// (c_ops' MIXPREC__DISPATCH is internal): runs `body` once with T the storage
// type of `dtype` (float, mixprec_f16, mixprec_bf16); anything else runs as
// float, the op having checked the dtype first. to_float widens a T.
#define MIXPREC_SHIM_DISPATCH(dtype, T, ...) \
  do {                                       \
    switch (dtype) {                         \
      case MIXPREC_F16: {                    \
        using T = mixprec_f16;               \
        __VA_ARGS__;                         \
      } break;                               \
      case MIXPREC_BF16: {                   \
        using T = mixprec_bf16;              \
        __VA_ARGS__;                         \
      } break;                               \
      default: {                             \
        using T = float;                     \
        __VA_ARGS__;                         \
      } break;                               \
    }                                        \
  } while (0)

inline float to_float(float v) { return v; }
inline float to_float(mixprec_f16 v) { return mixprec_f16_to_f32(v); }
inline float to_float(mixprec_bf16 v) { return mixprec_bf16_to_f32(v); }

// Device of a tensor as (is_cuda, index); CPU tensors have index -1.
struct Where {
  bool cuda;
  int32_t index;
  bool operator==(const Where& o) const { return cuda == o.cuda && index == o.index; }
};

inline Where where(const Tensor& t) {
  if (t.is_cpu()) return {false, -1};
  return {t.is_cuda(), t.get_device_index()};
}

// "cpu", "cuda:1", ... for error messages.
inline std::string describe(const Where& w) {
  return w.cuda ? "cuda:" + std::to_string(w.index)
                : std::string(w.index < 0 ? "cpu" : "another device");
}

// The device check of every CPU backend (the CUDA one is in cuda_common.h).
inline void check_cpu_device(const char* op, const Where& w) {
  MIXPREC_CHECK(!w.cuda && w.index < 0, "mixprec::", op,
                  ": the CPU kernel got tensors that are not on the CPU");
}

// Strided and "non-overlapping and dense": the elements fill numel slots of
// memory exactly, in some order of dimensions (contiguous, channels_last,
// transposed). An elementwise kernel may then walk them as one flat array.
inline bool is_dense(const Tensor& t) {
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

// A one-element tensor of dtype `want` on `dev`; `ref` names the argument
// that fixed the device, for the message.
inline void check_scalar(const char* op, const char* arg, const Tensor& t, ScalarType want,
                         const Where& dev, const char* ref) {
  MIXPREC_CHECK(t.layout() == Layout::Strided, "mixprec::", op, ": ", arg,
                  " must be a strided (dense) tensor");
  MIXPREC_CHECK(t.scalar_type() == want, "mixprec::", op, ": ", arg, " must be ",
                  dtype_name(want), ", got ", dtype_name(t.scalar_type()));
  MIXPREC_CHECK(t.numel() == 1, "mixprec::", op, ": ", arg,
                  " must have exactly one element, got ", t.numel());
  if (ref) {
    MIXPREC_CHECK(where(t) == dev, "mixprec::", op, ": ", arg, " is on ",
                    describe(where(t)), " but ", ref, " is on ", describe(dev));
  } else {
    MIXPREC_CHECK(where(t) == dev, "mixprec::", op, ": ", arg, " is on ",
                    describe(where(t)), " but must be on ", describe(dev));
  }
}

// A floating tensor argument: strided, one of the three dtypes.
inline mixprec_dtype float_arg(const char* op, const char* arg, const Tensor& t) {
  MIXPREC_CHECK(t.defined() && t.layout() == Layout::Strided, "mixprec::", op, ": ", arg,
                  " must be a defined strided tensor");
  mixprec_dtype d;
  MIXPREC_CHECK(to_mixprec_dtype(t.scalar_type(), &d), "mixprec::", op, ": ", arg,
                  " must be float32, float16 or bfloat16, got ", dtype_name(t.scalar_type()));
  return d;
}

inline void same_device(const char* op, const char* arg, const Tensor& t, const Where& dev,
                        const char* ref) {
  MIXPREC_CHECK(where(t) == dev, "mixprec::", op, ": ", arg, " is on ", describe(where(t)),
                  " but ", ref, " is on ", describe(dev));
}

// The memory an argument covers, for the aliasing checks: bytes [lo, hi)
// from the data pointer to one past the last element (exact for a dense
// tensor, a bounding range otherwise); `name` + `index` say which argument
// it is ("grads", 2 -> "grads[2]"; index -1 -> "found_inf").
struct Span {
  uintptr_t lo, hi;
  const char* name;
  int64_t index;
};

inline void add_span(std::vector<Span>& spans, const Tensor& t, const char* name,
                     int64_t index = -1) {
  if (!t.defined() || t.numel() == 0) return;
  int64_t extent = 1;
  for (int64_t d = 0; d < t.dim(); d++) extent += (t.sizes()[d] - 1) * t.strides()[d];
  const uintptr_t lo = reinterpret_cast<uintptr_t>(t.data_ptr());
  spans.push_back({lo, lo + static_cast<uintptr_t>(extent) * t.element_size(), name, index});
}

inline std::string span_name(const Span& s) {
  return s.index < 0 ? std::string(s.name) : std::string(s.name) + "[" + std::to_string(s.index) + "]";
}

// Raises "mixprec::<op>: A and B share memory ..." when two of the spans
// overlap (the same tensor twice, a view of another argument): an op that
// writes one of them would read or write it twice. O(n log n).
inline void check_disjoint(const char* op, std::vector<Span> spans) {
  std::vector<size_t> order(spans.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return spans[a].lo < spans[b].lo || (spans[a].lo == spans[b].lo && a < b); });
  size_t widest = 0;  // the span reaching furthest among those seen so far
  for (size_t k = 0; k < order.size(); k++) {
    const size_t i = order[k];
    if (k > 0 && spans[i].lo < spans[widest].hi) {
      const Span& a = spans[std::min(i, widest)];
      const Span& b = spans[std::max(i, widest)];
      MIXPREC_CHECK(false, "mixprec::", op, ": ", span_name(a), " and ", span_name(b),
                    " share memory (the same tensor twice, or views of one buffer); "
                    "the arguments must not overlap");
    }
    if (k == 0 || spans[i].hi > spans[widest].hi) widest = i;
  }
}

// The contiguous tensor a kernel reads: t itself or a copy in t's own dtype
// (never an FP32 copy).
inline Tensor dense(const Tensor& t) { return t.is_contiguous() ? t : torch::stable::contiguous(t); }

inline std::vector<int64_t> sizes_of(const Tensor& t) {
  auto s = t.sizes();
  return std::vector<int64_t>(s.begin(), s.end());
}

inline std::string shape_str(const Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); d++) s += (d ? ", " : "") + std::to_string(t.sizes()[d]);
  return s + "]";
}

}  // namespace mixprec_shim
