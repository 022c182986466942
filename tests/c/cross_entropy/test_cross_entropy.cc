// mixprec_cross_entropy_soft (+ backward), class-probability targets,
// against a long double reference written here: every (logits, target)
// dtype pair, every ISA path this CPU supports, rows and strided slices,
// weight / label smoothing / every reduction, both gradients; results
// independent of the thread count; the statuses the header documents, with
// nothing written on an error. (Class-index cross-entropy: test_softmax.cc.)
#include <cmath>
#include <limits>

#include "softmax/softmax_test_util.h"

namespace {

using mpt::Buf, mpt::Shape, mpt::kEps32, mpt::out_eps;
using mpt::ce_params, mpt::class_weights, mpt::randn;

double tiny_of(mixprec_dtype d) { return d == MIXPREC_F16 ? std::ldexp(1.0, -24) : 1e-30; }

// Per position: the loss and, per element, log p and the weighted smoothed
// target w_c t'_c; sums of the sizes of the terms for the tolerances.
struct SoftRef {
  std::vector<long double> loss, logp, wt, T, size;
  long double total = 0, total_size = 0;
};

SoftRef ref_soft(const Buf &x, const Buf &t, const mixprec_cross_entropy_params &p) {
  SoftRef r;
  const int64_t C = p.classes, P = p.outer * p.inner;
  r.loss.assign(size_t(P), 0);
  r.T.assign(size_t(P), 0);
  r.size.assign(size_t(P), 0);
  r.logp.assign(size_t(P * C), 0);
  r.wt.assign(size_t(P * C), 0);
  const long double keep = (float)(1.0 - p.label_smoothing), add = (float)(p.label_smoothing / double(C));
  for (int64_t o = 0; o < p.outer; o++)
    for (int64_t j = 0; j < p.inner; j++) {
      const int64_t pos = o * p.inner + j, base = o * C * p.inner + j;
      long double m = -INFINITY, s = 0;
      for (int64_t c = 0; c < C; c++) m = std::max(m, (long double)x.value(base + c * p.inner));
      for (int64_t c = 0; c < C; c++) s += std::exp((long double)x.value(base + c * p.inner) - m);
      long double l = 0, T = 0, size = 0;
      for (int64_t c = 0; c < C; c++) {
        const int64_t i = base + c * p.inner;
        const long double lp = ((long double)x.value(i) - m) - std::log(s);
        const long double w = (p.weight ? p.weight[c] : 1.0L) * ((long double)t.value(i) * keep + add);
        r.logp[size_t(i)] = lp;
        r.wt[size_t(i)] = w;
        l -= w * lp;
        T += w;
        // |w t' log p|, plus |w t'| for the log-sum's absolute error (about
        // 1 ulp of a sum near 1 when the loss is small).
        size += std::fabs(w * lp) + std::fabs(w);
      }
      r.loss[size_t(pos)] = l;
      r.T[size_t(pos)] = T;
      r.size[size_t(pos)] = size;
      r.total += l;
      r.total_size += size;
    }
  return r;
}

// Class probabilities: a softmax of random values over each position's
// classes (every other position), or two-hot lam / 1 - lam (mixup).
Buf probabilities(mixprec_dtype d, const Shape &s, std::mt19937 &rng) {
  Buf b(d, s.outer * s.n * s.inner, /*misalign=*/true);
  std::normal_distribution<double> dist(0.0, 3.0);
  std::uniform_int_distribution<int64_t> cls(0, s.n - 1);
  std::uniform_real_distribution<double> lam(0.0, 1.0);
  for (int64_t o = 0; o < s.outer; o++)
    for (int64_t j = 0; j < s.inner; j++) {
      const int64_t base = o * s.n * s.inner + j;
      if ((o + j) % 2) {
        std::vector<double> e(size_t(s.n));
        double sum = 0;
        for (auto &v : e) sum += (v = std::exp(dist(rng)));
        for (int64_t c = 0; c < s.n; c++) b.set_value(base + c * s.inner, float(e[size_t(c)] / sum));
      } else {
        const int64_t a = cls(rng), bb = cls(rng);
        const double l = lam(rng);
        for (int64_t c = 0; c < s.n; c++)
          b.set_value(base + c * s.inner, float((c == a ? l : 0.0) + (c == bb ? 1.0 - l : 0.0)));
      }
    }
  return b;
}

class SoftCrossEntropyTest
    : public ::testing::TestWithParam<std::tuple<mixprec_dtype, mixprec_dtype, mixprec_cpu_isa>> {
 protected:
  void SetUp() override {
    xd_ = std::get<0>(GetParam());
    td_ = std::get<1>(GetParam());
    isa_ = std::get<2>(GetParam());
    if (!mixprec_cpu_isa_supported(isa_)) GTEST_SKIP() << "CPU lacks " << mpt::isa_name(isa_);
    ASSERT_EQ(mixprec_set_cpu_isa(isa_), MIXPREC_OK);
  }
  mpt::GlobalStateGuard guard_;
  mixprec_dtype xd_ = MIXPREC_F32, td_ = MIXPREC_F32;
  mixprec_cpu_isa isa_ = MIXPREC_ISA_SCALAR;
};

TEST_P(SoftCrossEntropyTest, ForwardAndBothGradientsMatchReference) {
  std::mt19937 rng(mpt::kSeed + 31 + 3 * xd_ + td_);
  const Shape shapes[] = {{16, 1000, 1}, {3, 21, 99}, {5, 1, 1}, {2, 3, 40}, {1, 50257, 1}, {4, 13, 1}};
  for (const Shape &s : shapes) {
    const int64_t P = s.outer * s.inner, N = P * s.n;
    Buf x = randn(xd_, N, rng);
    Buf t = probabilities(td_, s, rng);
    const std::vector<float> w = class_weights(s.n, rng);
    for (int variant = 0; variant < 4; variant++) {
      mixprec_cross_entropy_params p = ce_params(s, variant, w);
      const SoftRef ref = ref_soft(x, t, p);
      const double ktol = 2 * kEps32 * (16 + std::sqrt(double(s.n)));
      for (int red = 0; red < 3; red++) {
        p.reduction = static_cast<mixprec_reduction>(red);
        std::vector<float> loss(size_t(red == 0 ? P : 1), NAN), stats(size_t(3 * P), NAN);
        ASSERT_EQ(mixprec_cross_entropy_soft(x.data(), xd_, t.data(), td_, &p, loss.data(), stats.data()),
                  MIXPREC_OK);
        if (red == 0) {
          for (int64_t i = 0; i < P; i++)
            EXPECT_NEAR(loss[size_t(i)], double(ref.loss[size_t(i)]), ktol * double(ref.size[size_t(i)]) + 1e-30)
                << "position " << i << " variant " << variant;
        } else {
          const long double want = red == 2 ? ref.total : ref.total / P;
          const long double size = red == 2 ? ref.total_size : ref.total_size / P;
          EXPECT_NEAR(loss[0], double(want), ktol * double(size) + 1e-30) << "variant " << variant << " red " << red;
        }
        for (int64_t i = 0; i < P; i++)
          EXPECT_NEAR(stats[size_t(2 * P + i)], double(ref.T[size_t(i)]), ktol * std::fabs(double(ref.T[size_t(i)])));
        std::vector<float> gl(size_t(red == 0 ? P : 1));
        for (auto &v : gl) v = std::uniform_real_distribution<float>(0.5f, 1.5f)(rng);
        Buf dx(xd_, N), dt(td_, N);
        for (int64_t i = 0; i < N; i++) {
          dx.set_value(i, NAN);
          dt.set_value(i, NAN);
        }
        ASSERT_EQ(mixprec_cross_entropy_soft_backward(gl.data(), x.data(), xd_, t.data(), td_, &p, stats.data(),
                                                      dx.data(), dt.data()),
                  MIXPREC_OK);
        int bad = 0;
        for (int64_t o = 0; o < s.outer; o++)
          for (int64_t j = 0; j < s.inner && bad < 5; j++) {
            const int64_t pos = o * s.inner + j, base = o * s.n * s.inner + j;
            long double g = red == 0 ? gl[size_t(pos)] : gl[0];
            if (red == 1) g /= P;
            for (int64_t c = 0; c < s.n && bad < 5; c++) {
              const int64_t i = base + c * s.inner;
              const long double lp = ref.logp[size_t(i)], pc = std::exp(lp), wt = ref.wt[size_t(i)];
              const long double T = ref.T[size_t(pos)];
              const long double want_x = g * (T * pc - wt);
              const double tol_x = out_eps(xd_) * std::fabs(double(want_x)) +
                                   ktol * double(std::fabs(g) * (T * pc * (4 + std::fabs(lp)) + std::fabs(wt))) +
                                   tiny_of(xd_);
              const long double wc = p.weight ? p.weight[c] : 1.0L;
              const long double want_t = -g * (1 - p.label_smoothing) * wc * lp;
              const double tol_t = out_eps(td_) * std::fabs(double(want_t)) +
                                   ktol * double(std::fabs(g) * wc * (std::fabs(lp) + 1)) + tiny_of(td_);
              if (!(std::fabs(double(dx.value(i) - want_x)) <= tol_x) ||
                  !(std::fabs(double(dt.value(i) - want_t)) <= tol_t)) {
                bad++;
                ADD_FAILURE() << "shape " << s.outer << "x" << s.n << "x" << s.inner << " variant " << variant
                              << " red " << red << " i=" << i << " dx " << dx.value(i) << " want "
                              << double(want_x) << " dt " << dt.value(i) << " want " << double(want_t);
              }
            }
          }
        // One gradient alone gives the same bits as both together.
        Buf dx1(xd_, N), dt1(td_, N);
        ASSERT_EQ(mixprec_cross_entropy_soft_backward(gl.data(), x.data(), xd_, t.data(), td_, &p, stats.data(),
                                                      dx1.data(), nullptr),
                  MIXPREC_OK);
        ASSERT_EQ(mixprec_cross_entropy_soft_backward(gl.data(), x.data(), xd_, t.data(), td_, &p, stats.data(),
                                                      nullptr, dt1.data()),
                  MIXPREC_OK);
        for (int64_t i = 0; i < N && bad < 5; i++)
          if (dx1.raw(i) != dx.raw(i) || dt1.raw(i) != dt.raw(i)) {
            bad++;
            ADD_FAILURE() << "alone differs at " << i;
          }
      }
    }
  }
}

TEST_P(SoftCrossEntropyTest, ThreadCountDoesNotChangeBits) {
  std::mt19937 rng(mpt::kSeed + 41);
  const Shape s{4, 21, 1681};
  const int64_t P = s.outer * s.inner, N = P * s.n;
  Buf x = randn(xd_, N, rng);
  Buf t = probabilities(td_, s, rng);
  mixprec_cross_entropy_params p = mixprec_cross_entropy_params_default();
  p.outer = s.outer;
  p.classes = s.n;
  p.inner = s.inner;
  p.label_smoothing = 0.1;
  std::vector<float> loss[2], stats[2];
  Buf dx[2] = {Buf(xd_, N), Buf(xd_, N)}, dt[2] = {Buf(td_, N), Buf(td_, N)};
  for (int k = 0; k < 2; k++) {
    mixprec_set_num_threads(k + 1);
    loss[k].assign(1, NAN);
    stats[k].assign(size_t(3 * P), NAN);
    ASSERT_EQ(mixprec_cross_entropy_soft(x.data(), xd_, t.data(), td_, &p, loss[k].data(), stats[k].data()),
              MIXPREC_OK);
    const float gl = 1.25f;
    ASSERT_EQ(mixprec_cross_entropy_soft_backward(&gl, x.data(), xd_, t.data(), td_, &p, stats[k].data(),
                                                  dx[k].data(), dt[k].data()),
              MIXPREC_OK);
  }
  EXPECT_EQ(std::memcmp(loss[0].data(), loss[1].data(), 4), 0);
  EXPECT_EQ(std::memcmp(stats[0].data(), stats[1].data(), size_t(12 * P)), 0);
  for (int64_t i = 0; i < N; i++) {
    ASSERT_EQ(dx[0].raw(i), dx[1].raw(i)) << i;
    ASSERT_EQ(dt[0].raw(i), dt[1].raw(i)) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    DtypePairsIsas, SoftCrossEntropyTest,
    ::testing::Combine(::testing::Values(MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16),
                       ::testing::Values(MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16),
                       ::testing::Values(MIXPREC_ISA_SCALAR, MIXPREC_ISA_AVX2)),
    [](const auto &info) {
      return std::string(mpt::dtype_name(std::get<0>(info.param))) + "_t" +
             mpt::dtype_name(std::get<1>(info.param)) + "_" + mpt::isa_name(std::get<2>(info.param));
    });

// The statuses of the header's contract; nothing written on an error.
TEST(SoftCrossEntropyArgs, StatusesAndNothingWrittenOnError) {
  float x[6] = {1, 2, 3, 4, 5, 6}, t[6] = {0.5f, 0.25f, 0.25f, 1, 0, 0};
  mixprec_cross_entropy_params p = mixprec_cross_entropy_params_default();
  p.outer = 2;
  p.classes = 3;
  p.inner = 1;
  p.reduction = MIXPREC_REDUCTION_NONE;
  float loss[2] = {-7, -7}, stats[6];
  for (float &v : stats) v = -7;
  auto untouched = [&] {
    for (float v : loss) EXPECT_EQ(v, -7);
    for (float v : stats) EXPECT_EQ(v, -7);
  };
  const mixprec_dtype F = MIXPREC_F32;
  EXPECT_EQ(mixprec_cross_entropy_soft(x, F, t, F, nullptr, loss, stats), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(mixprec_cross_entropy_soft(x, F, t, static_cast<mixprec_dtype>(7), &p, loss, stats),
            MIXPREC_ERR_BAD_DTYPE);
  EXPECT_EQ(mixprec_cross_entropy_soft(x, static_cast<mixprec_dtype>(-1), t, F, &p, loss, stats),
            MIXPREC_ERR_BAD_DTYPE);
  EXPECT_EQ(mixprec_cross_entropy_soft(nullptr, F, t, F, &p, loss, stats), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(mixprec_cross_entropy_soft(x, F, nullptr, F, &p, loss, stats), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(mixprec_cross_entropy_soft(x, F, t, F, &p, nullptr, stats), MIXPREC_ERR_NULL_POINTER);
  mixprec_cross_entropy_params q = p;
  q.label_smoothing = NAN;
  EXPECT_EQ(mixprec_cross_entropy_soft(x, F, t, F, &q, loss, stats), MIXPREC_ERR_BAD_ARGUMENT);
  q = p;
  q.label_smoothing = 1.5;
  EXPECT_EQ(mixprec_cross_entropy_soft(x, F, t, F, &q, loss, stats), MIXPREC_ERR_BAD_ARGUMENT);
  q = p;
  q.reduction = static_cast<mixprec_reduction>(3);
  EXPECT_EQ(mixprec_cross_entropy_soft(x, F, t, F, &q, loss, stats), MIXPREC_ERR_BAD_ARGUMENT);
  q = p;
  q.outer = -1;
  EXPECT_EQ(mixprec_cross_entropy_soft(x, F, t, F, &q, loss, stats), MIXPREC_ERR_BAD_SIZE);
  q = p;
  q.classes = 0;
  EXPECT_EQ(mixprec_cross_entropy_soft(x, F, t, F, &q, loss, stats), MIXPREC_ERR_BAD_SIZE);
  q = p;
  q.outer = INT64_MAX / 2;
  q.inner = 4;
  EXPECT_EQ(mixprec_cross_entropy_soft(x, F, t, F, &q, loss, stats), MIXPREC_ERR_BAD_SIZE);
  untouched();
  // Backward: the same checks, and grad_loss / stats needed when an output is.
  Buf dx(F, 6), dtb(F, 6);
  for (int64_t i = 0; i < 6; i++) {
    dx.set_value(i, -7);
    dtb.set_value(i, -7);
  }
  const float gl[2] = {1, 1};
  EXPECT_EQ(mixprec_cross_entropy_soft_backward(nullptr, x, F, t, F, &p, stats, dx.data(), dtb.data()),
            MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(mixprec_cross_entropy_soft_backward(gl, x, F, t, F, &p, nullptr, dx.data(), dtb.data()),
            MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(mixprec_cross_entropy_soft_backward(gl, x, F, t, static_cast<mixprec_dtype>(3), &p, stats, dx.data(),
                                                dtb.data()),
            MIXPREC_ERR_BAD_DTYPE);
  q = p;
  q.label_smoothing = -0.5;
  EXPECT_EQ(mixprec_cross_entropy_soft_backward(gl, x, F, t, F, &q, stats, dx.data(), dtb.data()),
            MIXPREC_ERR_BAD_ARGUMENT);
  // Neither output wanted: OK, a no-op even without grad_loss and stats.
  EXPECT_EQ(mixprec_cross_entropy_soft_backward(nullptr, x, F, t, F, &p, nullptr, nullptr, nullptr), MIXPREC_OK);
  for (int64_t i = 0; i < 6; i++) {
    EXPECT_EQ(dx.value(i), -7);
    EXPECT_EQ(dtb.value(i), -7);
  }
  // Valid: loss_0 = -sum t log p of row (1, 2, 3).
  ASSERT_EQ(mixprec_cross_entropy_soft(x, F, t, F, &p, loss, stats), MIXPREC_OK);
  const double lse = 3 + std::log(std::exp(-2.0) + std::exp(-1.0) + 1.0);
  EXPECT_NEAR(loss[0], 0.5 * (lse - 1) + 0.25 * (lse - 2) + 0.25 * (lse - 3), 1e-6);
  EXPECT_NEAR(loss[1], lse - 4 + 3, 1e-6);  // row (4, 5, 6), target on class 0
}

TEST(SoftCrossEntropyArgs, EmptyInputReducesLikeTorch) {
  mixprec_cross_entropy_params p = mixprec_cross_entropy_params_default();
  p.outer = 0;
  p.classes = 5;
  p.inner = 1;
  float loss = -7;
  ASSERT_EQ(mixprec_cross_entropy_soft(nullptr, MIXPREC_BF16, nullptr, MIXPREC_F32, &p, &loss, nullptr), MIXPREC_OK);
  EXPECT_TRUE(std::isnan(loss));  // mean of nothing: 0 / 0
  p.reduction = MIXPREC_REDUCTION_SUM;
  ASSERT_EQ(mixprec_cross_entropy_soft(nullptr, MIXPREC_BF16, nullptr, MIXPREC_F32, &p, &loss, nullptr), MIXPREC_OK);
  EXPECT_EQ(loss, 0.0f);
  p.reduction = MIXPREC_REDUCTION_NONE;
  EXPECT_EQ(mixprec_cross_entropy_soft(nullptr, MIXPREC_BF16, nullptr, MIXPREC_F32, &p, nullptr, nullptr), MIXPREC_OK);
  EXPECT_EQ(mixprec_cross_entropy_soft_backward(nullptr, nullptr, MIXPREC_BF16, nullptr, MIXPREC_F32, &p, nullptr,
                                                nullptr, nullptr),
            MIXPREC_OK);
}

}  // namespace
