// The CUDA soft-target cross-entropy entry points against their CPU twins
// (which test_cross_entropy.cc checks against a long double reference): every
// (logits, target) dtype pair, rows (warp and block per row) and strided
// positions, weight / label smoothing / reductions, both gradients; the host
// statuses. Built only with CUDA (MIXPREC_TEST_CUDA); each test skips itself
// without a device.
#ifdef MIXPREC_TEST_CUDA

#include <cuda_runtime.h>

#include <cmath>

#include "cuda_util.h"
#include "softmax/softmax_test_util.h"

namespace {

using mpt::Buf;
using mpt::out_eps;
using mpt::Shape;
using Dev = mpt::DeviceBuffer;

size_t nbytes(const Buf &b) { return size_t(b.numel()) * size_t(Buf::esize(b.dtype())); }

// CPU and GPU agree within FP32 rounding (other sum orders, CUDA's expf)
// plus one rounding step of the output dtype; atol relative to the largest,
// and at least `floor` (the FP32 rounding of terms that cancel in the result).
void expect_close(const Buf &gpu, const Buf &cpu, double rel_max, const char *what, double floor = 0) {
  double mx = 0;
  for (int64_t i = 0; i < cpu.numel(); i++) mx = std::max(mx, std::fabs(double(cpu.value(i))));
  int bad = 0;
  for (int64_t i = 0; i < cpu.numel() && bad < 5; i++) {
    const double a = gpu.value(i), b = cpu.value(i);
    // One rounding step of the output dtype includes FP16's subnormal step (2^-24) below 2^-14.
    const double sub = gpu.dtype() == MIXPREC_F16 ? 2 * 5.9604644775390625e-08 : 0.0;
    const double tol = (2 * out_eps(gpu.dtype()) + 3e-5) * std::fabs(b) + rel_max * mx + floor + sub + 1e-30;
    if (!(std::fabs(a - b) <= tol)) {
      bad++;
      ADD_FAILURE() << what << " i=" << i << " gpu " << a << " cpu " << b;
    }
  }
}

class SoftCrossEntropyCuda : public ::testing::TestWithParam<std::tuple<mixprec_dtype, mixprec_dtype>> {
 protected:
  void SetUp() override {
    if (!mpt::HaveDevice()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(SoftCrossEntropyCuda, MatchesCpu) {
  const mixprec_dtype xd = std::get<0>(GetParam()), td = std::get<1>(GetParam());
  std::mt19937 rng(mpt::kSeed + 51 + 3 * xd + td);
  const Shape shapes[] = {{256, 1000, 1}, {4, 50257, 1}, {2, 21, 4099}, {33, 1, 1}, {3, 7, 70}, {5, 1003, 1}};
  for (const Shape &s : shapes) {
    const int64_t P = s.outer * s.inner, N = P * s.n;
    Buf x(xd, N), t(td, N);
    std::normal_distribution<float> dist(0.0f, 4.0f);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (int64_t i = 0; i < N; i++) {
      x.set_value(i, dist(rng));
      t.set_value(i, u(rng) * u(rng) * 2.0f / float(s.n));  // not normalised: torch does not ask it
    }
    const std::vector<float> w = mpt::class_weights(s.n, rng, 0.2f);
    Dev dx_in(x.data(), nbytes(x)), dt_in(t.data(), nbytes(t)), dw(w.data(), w.size() * 4);
    for (int variant = 0; variant < 4; variant++)
      for (int red = 0; red < 3; red++) {
        mixprec_cross_entropy_params p = mpt::ce_params(s, variant, w, 0.1);
        p.reduction = static_cast<mixprec_reduction>(red);
        const int64_t nl = red == 0 ? P : 1;
        std::vector<float> loss((size_t)nl), stats((size_t)(3 * P)), gl((size_t)nl, 0.75f);
        ASSERT_EQ(mixprec_cross_entropy_soft(x.data(), xd, t.data(), td, &p, loss.data(), stats.data()), MIXPREC_OK);
        Buf gx(xd, N), gt(td, N);
        ASSERT_EQ(mixprec_cross_entropy_soft_backward(gl.data(), x.data(), xd, t.data(), td, &p, stats.data(),
                                                      gx.data(), gt.data()),
                  MIXPREC_OK);
        mixprec_cross_entropy_params pd = p;
        pd.weight = variant & 1 ? static_cast<const float *>(dw.p) : nullptr;
        const int64_t ws = mixprec_cuda_cross_entropy_workspace_size(&pd);
        ASSERT_GE(ws, 0);
        Dev dloss(loss.size() * 4), dstats(stats.size() * 4), dws((size_t)ws), dgl(gl.data(), gl.size() * 4),
            dgx(nbytes(gx)), dgt(nbytes(gt));
        ASSERT_EQ(mixprec_cuda_cross_entropy_soft(dx_in.p, xd, dt_in.p, td, &pd, static_cast<float *>(dloss.p),
                                                  static_cast<float *>(dstats.p), dws.p, ws, nullptr),
                  MIXPREC_OK);
        ASSERT_EQ(mixprec_cuda_cross_entropy_soft_backward(static_cast<const float *>(dgl.p), dx_in.p, xd, dt_in.p,
                                                           td, &pd, static_cast<const float *>(dstats.p), dgx.p,
                                                           dgt.p, nullptr),
                  MIXPREC_OK);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<float> gloss(loss.size());
        dloss.to_host(gloss.data());
        for (size_t i = 0; i < loss.size(); i++)
          EXPECT_NEAR(gloss[i], loss[i], 1e-4 * (1 + std::fabs(loss[i]))) << "red " << red << " i " << i;
        Buf ggx(xd, N), ggt(td, N);
        dgx.to_host(ggx.data());
        dgt.to_host(ggt.data());
        // A logit's gradient is a * p_c - g * w_c t'_c (cross_entropy_rules.h), terms of at most
        // |g| * T, T = sum_c w_c t'_c; they cancel exactly at one class ({33, 1, 1}: the exact answer
        // 0, which the CPU's AVX2 path misses by its rounding residue, ~1e-8). Their FP32 rounding is
        // the floor of the tolerance, or the largest-gradient term would reject the exact answer.
        double tmax = 0, wmax = 1;
        for (int64_t i = 0; i < N; i++) tmax = std::max(tmax, std::fabs(double(t.value(i))));
        if (variant & 1)
          for (float wc : w) wmax = std::max(wmax, double(std::fabs(wc)));
        const double gmax = red == MIXPREC_REDUCTION_MEAN ? 0.75 / double(P) : 0.75;
        const double terms = gmax * wmax * (double(s.n) * tmax + p.label_smoothing);
        expect_close(ggx, gx, 1e-6, "grad logits", 8 * 1.1920929e-7 * terms);
        expect_close(ggt, gt, 1e-6, "grad target");
      }
  }
}

INSTANTIATE_TEST_SUITE_P(DtypePairs, SoftCrossEntropyCuda,
                         ::testing::Combine(::testing::Values(MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16),
                                            ::testing::Values(MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16)),
                         [](const auto &info) {
                           return std::string(mpt::dtype_name(std::get<0>(info.param))) + "_t" +
                                  mpt::dtype_name(std::get<1>(info.param));
                         });

// Host-side statuses, the CPU's plus alignment and workspace size.
TEST(SoftCrossEntropyCudaArgs, HostStatuses) {
  if (!mpt::HaveDevice()) GTEST_SKIP() << "no CUDA device";
  Dev x(4 * 12), t(4 * 12), loss(8), stats(4 * 6), ws(64);
  mixprec_cross_entropy_params p = mixprec_cross_entropy_params_default();
  p.outer = 2;
  p.classes = 6;
  p.inner = 1;
  const int64_t need = mixprec_cuda_cross_entropy_workspace_size(&p);
  ASSERT_GE(need, 0);
  float *l = static_cast<float *>(loss.p), *st = static_cast<float *>(stats.p);
  EXPECT_EQ(mixprec_cuda_cross_entropy_soft(x.p, MIXPREC_F32, t.p, MIXPREC_F32, nullptr, l, st, ws.p, 64, nullptr),
            MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(mixprec_cuda_cross_entropy_soft(x.p, MIXPREC_F32, t.p, static_cast<mixprec_dtype>(5), &p, l, st, ws.p,
                                            64, nullptr),
            MIXPREC_ERR_BAD_DTYPE);
  EXPECT_EQ(mixprec_cuda_cross_entropy_soft(x.p, MIXPREC_F32, static_cast<char *>(t.p) + 2, MIXPREC_F32, &p, l, st,
                                            ws.p, 64, nullptr),
            MIXPREC_ERR_BAD_ARGUMENT);
  EXPECT_EQ(mixprec_cuda_cross_entropy_soft(x.p, MIXPREC_F32, t.p, MIXPREC_F32, &p, l, st, ws.p, need - 1, nullptr),
            MIXPREC_ERR_BAD_SIZE);
  EXPECT_EQ(mixprec_cuda_cross_entropy_soft(x.p, MIXPREC_F32, t.p, MIXPREC_F32, &p, l, st, ws.p, 64, nullptr),
            MIXPREC_OK);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace

#endif  // MIXPREC_TEST_CUDA
