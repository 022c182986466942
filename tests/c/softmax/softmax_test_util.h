// Helpers shared by the softmax-family C tests (tests/c/softmax,
// tests/c/cross_entropy, CPU and CUDA): tolerances, the (outer, n, inner)
// shape, random logits and the cross-entropy parameter variants.
#ifndef MIXPREC_TESTS_SOFTMAX_TEST_UTIL_H
#define MIXPREC_TESTS_SOFTMAX_TEST_UTIL_H

#include <cmath>
#include <random>
#include <vector>

#include "mixprec/cross_entropy.h"
#include "test_util.h"

namespace mpt {

constexpr double kEps32 = 1.0 / (1 << 23);

// The rounding unit of a stored output.
inline double out_eps(mixprec_dtype d) {
  return d == MIXPREC_F16 ? 1.0 / 1024 : d == MIXPREC_BF16 ? 1.0 / 128 : 0.0;
}

struct Shape {
  int64_t outer, n, inner;
};

// n normal values (0, scale) in dtype d, stored misaligned.
inline Buf randn(mixprec_dtype d, int64_t n, std::mt19937 &rng, float scale = 4.0f) {
  Buf b(d, n, /*misalign=*/true);
  std::normal_distribution<float> dist(0.0f, scale);
  for (int64_t i = 0; i < n; i++) b.set_value(i, dist(rng));
  return b;
}

// n class weights in [lo, 2).
inline std::vector<float> class_weights(int64_t n, std::mt19937 &rng, float lo = 0.1f) {
  std::vector<float> w((size_t)n);
  std::uniform_real_distribution<float> wd(lo, 2.0f);
  for (auto &v : w) v = wd(rng);
  return w;
}

// The parameters of variant 0-3 over shape s: bit 0 the class weights w,
// bit 1 label smoothing `smoothing`.
inline mixprec_cross_entropy_params ce_params(const Shape &s, int variant, const std::vector<float> &w,
                                              double smoothing = 0.15) {
  mixprec_cross_entropy_params p = mixprec_cross_entropy_params_default();
  p.outer = s.outer;
  p.classes = s.n;
  p.inner = s.inner;
  p.weight = variant & 1 ? w.data() : nullptr;
  p.label_smoothing = variant & 2 ? smoothing : 0.0;
  return p;
}

}  // namespace mpt

#endif  // MIXPREC_TESTS_SOFTMAX_TEST_UTIL_H
