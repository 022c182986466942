// mixprec_softmax / log_softmax (+ backward) and mixprec_cross_entropy (+
// backward) against long double references written here, on every ISA path
// this CPU supports, for FP32/FP16/BF16, rows (inner == 1) and strided
// slices (inner > 1); special values; thread-count independence; argument
// and target checks that write nothing.
#include <cmath>
#include <limits>

#include "softmax/softmax_test_util.h"

namespace {

using mpt::Buf, mpt::Shape, mpt::kEps32, mpt::out_eps;
using mpt::ce_params, mpt::class_weights, mpt::randn;


// Reference over the middle dimension of (outer, n, inner), from the values
// as stored, in long double.
std::vector<long double> ref_softmax(const Buf &x, int64_t outer, int64_t n, int64_t inner,
                                     bool log) {
  std::vector<long double> y(size_t(outer * n * inner));
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < inner; j++) {
      const int64_t base = o * n * inner + j;
      long double m = -INFINITY, s = 0;
      for (int64_t c = 0; c < n; c++) m = std::max(m, (long double)x.value(base + c * inner));
      for (int64_t c = 0; c < n; c++) s += std::exp((long double)x.value(base + c * inner) - m);
      for (int64_t c = 0; c < n; c++) {
        const long double d = (long double)x.value(base + c * inner) - m;
        y[size_t(base + c * inner)] = log ? d - std::log(s) : std::exp(d) / s;
      }
    }
  return y;
}

class SoftmaxTest : public ::testing::TestWithParam<std::tuple<mixprec_dtype, mixprec_cpu_isa>> {
 protected:
  void SetUp() override {
    dtype_ = std::get<0>(GetParam());
    isa_ = std::get<1>(GetParam());
    if (!mixprec_cpu_isa_supported(isa_)) GTEST_SKIP() << "CPU lacks " << mpt::isa_name(isa_);
    ASSERT_EQ(mixprec_set_cpu_isa(isa_), MIXPREC_OK);
  }
  mpt::GlobalStateGuard guard_;
  mixprec_dtype dtype_ = MIXPREC_F32;
  mixprec_cpu_isa isa_ = MIXPREC_ISA_SCALAR;
};

const Shape kShapes[] = {{5, 1, 1}, {7, 3, 1}, {3, 1000, 1}, {1, 50257, 1}, {2, 21, 99},
                         {3, 5, 7}, {1, 2, 40}, {2, 300, 33}};

TEST_P(SoftmaxTest, ForwardMatchesReference) {
  std::mt19937 rng(mpt::kSeed + 11 + dtype_);
  for (const Shape &s : kShapes) {
    const int64_t N = s.outer * s.n * s.inner;
    Buf x = randn(dtype_, N, rng);
    for (int log = 0; log < 2; log++) {
      const auto ref = ref_softmax(x, s.outer, s.n, s.inner, log);
      for (mixprec_dtype yd : {MIXPREC_F32, dtype_}) {
        Buf y(yd, N);
        for (int64_t i = 0; i < N; i++) y.set_raw(i, 0x7fc0u);  // poison
        auto fn = log ? mixprec_log_softmax : mixprec_softmax;
        ASSERT_EQ(fn(x.data(), dtype_, y.data(), yd, s.outer, s.n, s.inner), MIXPREC_OK);
        const double rel = 2e-5 + out_eps(yd);
        int bad = 0;
        for (int64_t i = 0; i < N && bad < 5; i++) {
          const long double r = ref[size_t(i)];
          // log_softmax: absolute error relative to the slice's spread.
          const double tol = rel * std::fabs(double(r)) + (log ? 2e-5 : 1e-7) + 1e-30;
          if (!(std::fabs(double(y.value(i) - r)) <= tol)) {
            bad++;
            ADD_FAILURE() << "log=" << log << " shape " << s.outer << "x" << s.n << "x" << s.inner
                          << " out " << mpt::dtype_name(yd) << " i=" << i << " got " << y.value(i)
                          << " want " << double(r);
          }
        }
      }
    }
  }
}

TEST_P(SoftmaxTest, SpecialRows) {
  const float big = dtype_ == MIXPREC_F16 ? 3e4f : 1e30f;
  const int64_t n = 37;
  Buf x(dtype_, 6 * n);
  std::mt19937 rng(mpt::kSeed + 12);
  std::normal_distribution<float> d(0.0f, 3.0f);
  for (int64_t c = 0; c < n; c++) {
    x.set_value(0 * n + c, big + d(rng));
    x.set_value(1 * n + c, -big + d(rng));
    x.set_value(2 * n + c, 1.25f);
    x.set_value(3 * n + c, c % 3 ? -INFINITY : d(rng));                   // masked
    x.set_value(4 * n + c, -INFINITY);                                     // all masked: NaN
    x.set_value(5 * n + c, c == 17 ? std::numeric_limits<float>::quiet_NaN() : d(rng));  // NaN
  }
  Buf y(MIXPREC_F32, 6 * n), ly(MIXPREC_F32, 6 * n);
  ASSERT_EQ(mixprec_softmax(x.data(), dtype_, y.data(), MIXPREC_F32, 6, n, 1), MIXPREC_OK);
  ASSERT_EQ(mixprec_log_softmax(x.data(), dtype_, ly.data(), MIXPREC_F32, 6, n, 1), MIXPREC_OK);
  const auto ref = ref_softmax(x, 4, n, 1, false);
  for (int64_t i = 0; i < 4 * n; i++) {
    EXPECT_NEAR(y.value(i), double(ref[size_t(i)]), 2e-5 * double(ref[size_t(i)]) + 1e-7) << i;
    if (i >= 3 * n && (i - 3 * n) % 3) {
      EXPECT_EQ(y.value(i), 0.0f) << "masked entry must be exactly 0";
      EXPECT_EQ(ly.value(i), -INFINITY);
    }
  }
  for (int64_t i = 4 * n; i < 6 * n; i++) {
    EXPECT_TRUE(std::isnan(y.value(i))) << i;
    EXPECT_TRUE(std::isnan(ly.value(i))) << i;
  }
  // Row sums are 1 for the finite rows.
  for (int r = 0; r < 4; r++) {
    double s = 0;
    for (int64_t c = 0; c < n; c++) s += y.value(r * n + c);
    EXPECT_NEAR(s, 1.0, 1e-5) << r;
  }
}

TEST_P(SoftmaxTest, BackwardMatchesReference) {
  std::mt19937 rng(mpt::kSeed + 13 + dtype_);
  for (const Shape &s : kShapes) {
    const int64_t N = s.outer * s.n * s.inner;
    Buf x = randn(dtype_, N, rng);
    Buf g = randn(dtype_, N, rng, 1.0f);
    for (int log = 0; log < 2; log++) {
      Buf y(dtype_, N), dx(MIXPREC_F32, N);
      ASSERT_EQ((log ? mixprec_log_softmax : mixprec_softmax)(x.data(), dtype_, y.data(), dtype_,
                                                              s.outer, s.n, s.inner),
                MIXPREC_OK);
      ASSERT_EQ((log ? mixprec_log_softmax_backward : mixprec_softmax_backward)(
                    g.data(), y.data(), dtype_, dx.data(), MIXPREC_F32, s.outer, s.n, s.inner),
                MIXPREC_OK);
      int bad = 0;
      for (int64_t o = 0; o < s.outer; o++)
        for (int64_t j = 0; j < s.inner; j++) {
          const int64_t base = o * s.n * s.inner + j;
          long double acc = 0, mag = 0;
          for (int64_t c = 0; c < s.n; c++) {
            const int64_t i = base + c * s.inner;
            acc += log ? (long double)g.value(i) : (long double)g.value(i) * y.value(i);
            mag += std::fabs(log ? (long double)g.value(i) : (long double)g.value(i) * y.value(i));
          }
          for (int64_t c = 0; c < s.n && bad < 5; c++) {
            const int64_t i = base + c * s.inner;
            const long double yi = y.value(i), gi = g.value(i);
            const long double want = log ? gi - std::exp(yi) * acc : yi * (gi - acc);
            const long double size =
                log ? std::fabs(gi) + std::exp(yi) * mag : std::fabs(yi) * (std::fabs(gi) + mag);
            const double tol = kEps32 * (8 + std::sqrt(double(s.n))) * double(size) + 1e-30;
            if (!(std::fabs(double(dx.value(i) - want)) <= tol)) {
              bad++;
              ADD_FAILURE() << "log=" << log << " i=" << i << " got " << dx.value(i) << " want "
                            << double(want);
            }
          }
        }
    }
  }
}

TEST_P(SoftmaxTest, ThreadCountDoesNotChangeBits) {
  std::mt19937 rng(mpt::kSeed + 14);
  const Shape shapes[] = {{64, 2053, 1}, {4, 21, 1681}};
  for (const Shape &s : shapes) {
    const int64_t N = s.outer * s.n * s.inner;
    Buf x = randn(dtype_, N, rng);
    Buf a(MIXPREC_F32, N), b(MIXPREC_F32, N);
    mixprec_set_num_threads(1);
    ASSERT_EQ(mixprec_softmax(x.data(), dtype_, a.data(), MIXPREC_F32, s.outer, s.n, s.inner), MIXPREC_OK);
    mixprec_set_num_threads(2);
    ASSERT_EQ(mixprec_softmax(x.data(), dtype_, b.data(), MIXPREC_F32, s.outer, s.n, s.inner), MIXPREC_OK);
    EXPECT_EQ(mpt::count_mismatches(a, b, "threads"), 0);
  }
}

// ---- cross-entropy ----------------------------------------------------------

struct CeRef {
  std::vector<long double> loss;  // per position
  long double total = 0, wsum = 0;
};

CeRef ref_ce(const Buf &x, const std::vector<int64_t> &t, const mixprec_cross_entropy_params &p) {
  CeRef r;
  const int64_t C = p.classes;
  r.loss.assign(size_t(p.outer * p.inner), 0);
  long double W = 0;
  for (int64_t c = 0; c < C; c++) W += p.weight ? p.weight[c] : 1.0f;
  for (int64_t o = 0; o < p.outer; o++)
    for (int64_t j = 0; j < p.inner; j++) {
      const int64_t pos = o * p.inner + j, base = o * C * p.inner + j;
      if (t[size_t(pos)] == p.ignore_index) continue;
      long double m = -INFINITY, s = 0, sw = 0;
      for (int64_t c = 0; c < C; c++) m = std::max(m, (long double)x.value(base + c * p.inner));
      for (int64_t c = 0; c < C; c++) s += std::exp((long double)x.value(base + c * p.inner) - m);
      const long double lse = m + std::log(s);
      for (int64_t c = 0; c < C; c++)
        sw += (p.weight ? p.weight[c] : 1.0L) * (lse - x.value(base + c * p.inner));
      const int64_t tg = t[size_t(pos)];
      const long double wt = p.weight ? p.weight[tg] : 1.0L;
      const long double l = (1 - p.label_smoothing) * wt * (lse - x.value(base + tg * p.inner)) +
                            p.label_smoothing / C * sw;
      r.loss[size_t(pos)] = l;
      r.total += l;
      r.wsum += wt;
    }
  (void)W;
  return r;
}

class CrossEntropyTest : public SoftmaxTest {};

TEST_P(CrossEntropyTest, ForwardAndBackwardMatchReference) {
  std::mt19937 rng(mpt::kSeed + 21 + dtype_);
  const Shape shapes[] = {{16, 1000, 1}, {3, 21, 99}, {5, 1, 1}, {2, 3, 40}, {1, 50257, 1}};
  for (const Shape &s : shapes) {
    const int64_t P = s.outer * s.inner, N = P * s.n;
    Buf x = randn(dtype_, N, rng);
    std::vector<int64_t> t((size_t)P);
    std::uniform_int_distribution<int64_t> cls(0, s.n - 1);
    for (int64_t i = 0; i < P; i++) t[size_t(i)] = i % 5 == 4 ? -100 : cls(rng);
    const std::vector<float> w = class_weights(s.n, rng);
    for (int variant = 0; variant < 4; variant++) {
      mixprec_cross_entropy_params p = ce_params(s, variant, w);
      const CeRef ref = ref_ce(x, t, p);
      for (int red = 0; red < 3; red++) {
        p.reduction = static_cast<mixprec_reduction>(red);
        std::vector<float> loss(size_t(red == 0 ? P : 1), NAN), stats(size_t(2 * P), NAN);
        float wsum = NAN;
        ASSERT_EQ(mixprec_cross_entropy(x.data(), dtype_, t.data(), &p, loss.data(), stats.data(), &wsum),
                  MIXPREC_OK);
        const double tol = 4e-6 * (8 + std::sqrt(double(s.n)));
        if (red == 0) {
          for (int64_t i = 0; i < P; i++)
            EXPECT_NEAR(loss[size_t(i)], double(ref.loss[size_t(i)]), tol * (1 + double(ref.loss[size_t(i)])));
        } else {
          const long double want = red == 2 ? ref.total : ref.total / ref.wsum;
          EXPECT_NEAR(loss[0], double(want), tol * (1 + std::fabs(double(want))));
        }
        EXPECT_NEAR(wsum, double(ref.wsum), 1e-6 * double(ref.wsum));
        // Backward against d/dx of the reference, per position.
        std::vector<float> gl(size_t(red == 0 ? P : 1));
        for (auto &v : gl) v = std::uniform_real_distribution<float>(0.5f, 1.5f)(rng);
        Buf dx(dtype_, N);
        ASSERT_EQ(mixprec_cross_entropy_backward(gl.data(), x.data(), dtype_, t.data(), &p, stats.data(),
                                                 &wsum, dx.data()),
                  MIXPREC_OK);
        long double W = 0;
        for (int64_t c = 0; c < s.n; c++) W += p.weight ? p.weight[c] : 1.0f;
        int bad = 0;
        for (int64_t o = 0; o < s.outer; o++)
          for (int64_t j = 0; j < s.inner; j++) {
            const int64_t pos = o * s.inner + j, base = o * s.n * s.inner + j;
            const int64_t tg = t[size_t(pos)];
            long double g = red == 0 ? gl[size_t(pos)] : gl[0];
            if (red == 1) g /= ref.wsum;
            long double m = -INFINITY, sum = 0;
            for (int64_t c = 0; c < s.n; c++) m = std::max(m, (long double)x.value(base + c * s.inner));
            for (int64_t c = 0; c < s.n; c++) sum += std::exp((long double)x.value(base + c * s.inner) - m);
            for (int64_t c = 0; c < s.n && bad < 5; c++) {
              const int64_t i = base + c * s.inner;
              long double want = 0, size = 0;
              if (tg != p.ignore_index) {
                const long double pc = std::exp((long double)x.value(i) - m) / sum;
                const long double wt = p.weight ? p.weight[tg] : 1.0L, wc = p.weight ? p.weight[c] : 1.0L;
                const long double eps = p.label_smoothing;
                want = g * ((1 - eps) * wt * (pc - (c == tg)) + eps / s.n * (W * pc - wc));
                size = std::fabs(g) * ((1 - eps) * wt + eps / s.n * (W + wc));
              }
              // (FP16 results below 2^-14 are on its subnormal grid of 2^-24.)
              const double tiny = dtype_ == MIXPREC_F16 ? std::ldexp(1.0, -24) : 1e-30;
              const double tl = out_eps(dtype_) * std::fabs(double(want)) + 16 * kEps32 * double(size) + tiny;
              if (!(std::fabs(double(dx.value(i) - want)) <= tl)) {
                bad++;
                ADD_FAILURE() << "variant " << variant << " red " << red << " i=" << i << " got "
                              << dx.value(i) << " want " << double(want);
              }
            }
          }
      }
    }
  }
}

TEST_P(CrossEntropyTest, TargetOutOfRangeWritesNothing) {
  std::mt19937 rng(mpt::kSeed + 22);
  Buf x = randn(dtype_, 4 * 10 * 3, rng);
  std::vector<int64_t> t = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, -100, 2};
  mixprec_cross_entropy_params p = mixprec_cross_entropy_params_default();
  p.outer = 4;
  p.classes = 10;
  p.inner = 3;
  p.reduction = MIXPREC_REDUCTION_NONE;
  for (int64_t bad : {int64_t(10), int64_t(-1), int64_t(-101), INT64_MAX}) {
    auto tb = t;
    tb[7] = bad;
    std::vector<float> loss(12, 42.0f), stats(24, 42.0f);
    float wsum = 42.0f;
    EXPECT_EQ(mixprec_cross_entropy(x.data(), dtype_, tb.data(), &p, loss.data(), stats.data(), &wsum),
              MIXPREC_ERR_BAD_ARGUMENT);
    for (float v : loss) EXPECT_EQ(v, 42.0f);
    for (float v : stats) EXPECT_EQ(v, 42.0f);
    EXPECT_EQ(wsum, 42.0f);
    Buf dx(dtype_, 120);
    for (int64_t i = 0; i < 120; i++) dx.set_raw(i, 0x1234u);
    std::vector<float> gl(12, 1.0f);
    EXPECT_EQ(mixprec_cross_entropy_backward(gl.data(), x.data(), dtype_, tb.data(), &p, stats.data(), &wsum,
                                             dx.data()),
              MIXPREC_ERR_BAD_ARGUMENT);
    for (int64_t i = 0; i < 120; i++) EXPECT_EQ(dx.raw(i), 0x1234u);
  }
}

INSTANTIATE_TEST_SUITE_P(
    DtypesIsas, SoftmaxTest,
    ::testing::Combine(::testing::Values(MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16),
                       ::testing::Values(MIXPREC_ISA_SCALAR, MIXPREC_ISA_AVX2)),
    [](const auto &info) {
      return std::string(mpt::dtype_name(std::get<0>(info.param))) + "_" +
             mpt::isa_name(std::get<1>(info.param));
    });
INSTANTIATE_TEST_SUITE_P(
    DtypesIsas, CrossEntropyTest,
    ::testing::Combine(::testing::Values(MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16),
                       ::testing::Values(MIXPREC_ISA_SCALAR, MIXPREC_ISA_AVX2)),
    [](const auto &info) {
      return std::string(mpt::dtype_name(std::get<0>(info.param))) + "_" +
             mpt::isa_name(std::get<1>(info.param));
    });

// ---- the two CPU paths agree ------------------------------------------------

// Scalar (double sums, libm expf) and AVX2 (float lanes, polynomial exp)
// are not bit-identical, but agree within FP32 rounding on the same input.
TEST(SoftmaxIsaParity, ScalarAndAvx2Agree) {
  if (!mixprec_cpu_isa_supported(MIXPREC_ISA_AVX2)) GTEST_SKIP() << "no AVX2";
  mpt::GlobalStateGuard guard;
  std::mt19937 rng(mpt::kSeed + 41);
  const Shape shapes[] = {{64, 1000, 1}, {3, 21, 257}, {17, 13, 1}};
  for (const Shape &s : shapes)
    for (mixprec_dtype dt : {MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16}) {
      const int64_t N = s.outer * s.n * s.inner, P = s.outer * s.inner;
      Buf x = randn(dt, N, rng);
      std::vector<int64_t> t((size_t)P);
      for (int64_t i = 0; i < P; i++) t[(size_t)i] = (i * 7) % s.n;
      Buf y[2] = {Buf(MIXPREC_F32, N), Buf(MIXPREC_F32, N)}, ly[2] = {Buf(MIXPREC_F32, N), Buf(MIXPREC_F32, N)};
      Buf gx[2] = {Buf(dt, N), Buf(dt, N)};
      std::vector<float> loss[2], stats[2];
      mixprec_cross_entropy_params p = mixprec_cross_entropy_params_default();
      p.outer = s.outer;
      p.classes = s.n;
      p.inner = s.inner;
      p.reduction = MIXPREC_REDUCTION_NONE;
      p.label_smoothing = 0.1;
      const mixprec_cpu_isa isas[2] = {MIXPREC_ISA_SCALAR, MIXPREC_ISA_AVX2};
      for (int k = 0; k < 2; k++) {
        ASSERT_EQ(mixprec_set_cpu_isa(isas[k]), MIXPREC_OK);
        ASSERT_EQ(mixprec_softmax(x.data(), dt, y[k].data(), MIXPREC_F32, s.outer, s.n, s.inner), MIXPREC_OK);
        ASSERT_EQ(mixprec_log_softmax(x.data(), dt, ly[k].data(), MIXPREC_F32, s.outer, s.n, s.inner),
                  MIXPREC_OK);
        loss[k].assign((size_t)P, 0.0f);
        stats[k].assign((size_t)(2 * P), 0.0f);
        float ws;
        ASSERT_EQ(mixprec_cross_entropy(x.data(), dt, t.data(), &p, loss[k].data(), stats[k].data(), &ws),
                  MIXPREC_OK);
        std::vector<float> gl((size_t)P, 1.0f);
        ASSERT_EQ(mixprec_cross_entropy_backward(gl.data(), x.data(), dt, t.data(), &p, stats[k].data(), &ws,
                                                 gx[k].data()),
                  MIXPREC_OK);
      }
      for (int64_t i = 0; i < N; i++) {
        EXPECT_NEAR(y[0].value(i), y[1].value(i), 4e-6 * std::fabs(y[0].value(i)) + 1e-9) << i;
        EXPECT_NEAR(ly[0].value(i), ly[1].value(i), 4e-6 * (1 + std::fabs(ly[0].value(i)))) << i;
        EXPECT_NEAR(gx[0].value(i), gx[1].value(i),
                    2 * out_eps(dt) * std::fabs(gx[0].value(i)) + 2e-6 + (dt == MIXPREC_F16 ? 6e-8 : 0)) << i;
      }
      for (int64_t i = 0; i < P; i++)
        EXPECT_NEAR(loss[0][(size_t)i], loss[1][(size_t)i], 4e-6 * (1 + std::fabs(loss[0][(size_t)i]))) << i;
    }
}

// ---- argument checks (no ISA dependence) ------------------------------------

mixprec_status softmax_with_dtype(mixprec_dtype d) {
  float v = 1.0f, out = 0.0f;
  return mixprec_softmax(&v, d, &out, MIXPREC_F32, 1, 1, 1);
}

TEST(SoftmaxArgs, StatusesAndNothingWritten) {
  float x[6] = {1, 2, 3, 4, 5, 6}, y[6] = {7, 7, 7, 7, 7, 7};
  EXPECT_EQ(mixprec_softmax(x, MIXPREC_F32, y, MIXPREC_F32, 2, -3, 1), MIXPREC_ERR_BAD_SIZE);
  EXPECT_EQ(mixprec_softmax(x, MIXPREC_F32, y, MIXPREC_F32, -1, 3, 1), MIXPREC_ERR_BAD_SIZE);
  EXPECT_EQ(mixprec_softmax(x, MIXPREC_F32, y, MIXPREC_F32, INT64_MAX, 3, 2), MIXPREC_ERR_BAD_SIZE);
  EXPECT_EQ(mixprec_softmax(nullptr, MIXPREC_F32, y, MIXPREC_F32, 2, 3, 1), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(mixprec_softmax(x, MIXPREC_F32, nullptr, MIXPREC_F32, 2, 3, 1), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(mpt::call_with_int(softmax_with_dtype, 9), MIXPREC_ERR_BAD_DTYPE);
  EXPECT_EQ(mixprec_log_softmax_backward(x, x, MIXPREC_F32, nullptr, MIXPREC_F32, 2, 3, 1),
            MIXPREC_ERR_NULL_POINTER);
  for (float v : y) EXPECT_EQ(v, 7.0f);
  // Empty tensors are fine with NULL pointers.
  EXPECT_EQ(mixprec_softmax(nullptr, MIXPREC_BF16, nullptr, MIXPREC_F32, 0, 3, 1), MIXPREC_OK);
  EXPECT_EQ(mixprec_softmax(nullptr, MIXPREC_BF16, nullptr, MIXPREC_F32, 4, 0, 1), MIXPREC_OK);
}

TEST(CrossEntropyArgs, Statuses) {
  float x[6] = {1, 2, 3, 4, 5, 6}, loss[2], stats[4], ws;
  int64_t t[2] = {0, 2};
  mixprec_cross_entropy_params p = mixprec_cross_entropy_params_default();
  EXPECT_EQ(p.ignore_index, -100);
  EXPECT_EQ(p.reduction, MIXPREC_REDUCTION_MEAN);
  p.outer = 2;
  p.classes = 3;
  p.inner = 1;
  EXPECT_EQ(mixprec_cross_entropy(x, MIXPREC_F32, t, nullptr, loss, stats, &ws), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(mixprec_cross_entropy(x, MIXPREC_F32, t, &p, loss, stats, &ws), MIXPREC_OK);
  p.label_smoothing = 1.5;
  EXPECT_EQ(mixprec_cross_entropy(x, MIXPREC_F32, t, &p, loss, stats, &ws), MIXPREC_ERR_BAD_ARGUMENT);
  p.label_smoothing = NAN;
  EXPECT_EQ(mixprec_cross_entropy(x, MIXPREC_F32, t, &p, loss, stats, &ws), MIXPREC_ERR_BAD_ARGUMENT);
  p.label_smoothing = 0;
  mpt::poke_enum(&p.reduction, 7);
  EXPECT_EQ(mixprec_cross_entropy(x, MIXPREC_F32, t, &p, loss, stats, &ws), MIXPREC_ERR_BAD_ARGUMENT);
  p.reduction = MIXPREC_REDUCTION_SUM;
  p.classes = 0;
  EXPECT_EQ(mixprec_cross_entropy(x, MIXPREC_F32, t, &p, loss, stats, &ws), MIXPREC_ERR_BAD_SIZE);
  p.classes = 3;
  EXPECT_EQ(mixprec_cross_entropy(x, MIXPREC_F32, nullptr, &p, loss, stats, &ws), MIXPREC_ERR_NULL_POINTER);
  // All ignored: MEAN is 0/0 = NaN like torch, SUM is 0.
  int64_t ign[2] = {-100, -100};
  EXPECT_EQ(mixprec_cross_entropy(x, MIXPREC_F32, ign, &p, loss, stats, &ws), MIXPREC_OK);
  EXPECT_EQ(loss[0], 0.0f);
  p.reduction = MIXPREC_REDUCTION_MEAN;
  EXPECT_EQ(mixprec_cross_entropy(x, MIXPREC_F32, ign, &p, loss, stats, &ws), MIXPREC_OK);
  EXPECT_TRUE(std::isnan(loss[0]));
  EXPECT_EQ(ws, 0.0f);
}

}  // namespace
