// The CUDA softmax / log_softmax / cross-entropy entry points against their
// CPU twins (which test_softmax.cc checks against references). Built only
// with CUDA (MIXPREC_TEST_CUDA); each test skips itself without a device.
#ifdef MIXPREC_TEST_CUDA

#include <cuda_runtime.h>

#include <cmath>

#include "cuda_util.h"
#include "softmax/softmax_test_util.h"

namespace {

using mpt::Buf;
using mpt::out_eps;
using mpt::Shape;

using mpt::HaveDevice;

using Dev = mpt::DeviceBuffer;

size_t nbytes(const Buf &b) { return size_t(b.numel()) * size_t(Buf::esize(b.dtype())); }

Buf randn(mixprec_dtype d, int64_t n, std::mt19937 &rng, float scale = 4.0f) {
  Buf b(d, n);
  std::normal_distribution<float> dist(0.0f, scale);
  for (int64_t i = 0; i < n; i++) b.set_value(i, dist(rng));
  return b;
}

Buf from_device(const Dev &d, mixprec_dtype dt, int64_t n) {
  Buf b(dt, n);
  d.to_host(b.data());
  return b;
}

// CPU and GPU agree within FP32 rounding (different sum orders, CUDA's
// expf) plus one rounding step of the output dtype.
void expect_close(const Buf &gpu, const Buf &cpu, double atol, const char *what) {
  int bad = 0;
  const double tiny = gpu.dtype() == MIXPREC_F16 ? std::ldexp(1.0, -24) : 1e-30;
  for (int64_t i = 0; i < cpu.numel() && bad < 5; i++) {
    const double a = gpu.value(i), b = cpu.value(i);
    if (std::isnan(b)) {
      if (!std::isnan(a)) bad++, ADD_FAILURE() << what << " i=" << i << " want NaN got " << a;
      continue;
    }
    if (std::isinf(b)) {
      if (a != b) bad++, ADD_FAILURE() << what << " i=" << i << " want " << b << " got " << a;
      continue;
    }
    const double tol = (2 * out_eps(gpu.dtype()) + 3e-5) * std::fabs(b) + atol + tiny;
    if (!(std::fabs(a - b) <= tol)) bad++, ADD_FAILURE() << what << " i=" << i << " gpu " << a << " cpu " << b;
  }
}

const Shape kShapes[] = {{37, 1, 1},   {9, 3, 1},     {64, 1000, 1}, {2, 50257, 1},
                         {4, 32000, 1}, {3, 21, 999}, {2, 5, 7},     {70000, 2, 3}};

class SoftmaxCuda : public ::testing::TestWithParam<mixprec_dtype> {
 protected:
  void SetUp() override {
    if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(SoftmaxCuda, ForwardAndBackwardMatchCpu) {
  const mixprec_dtype dt = GetParam();
  std::mt19937 rng(mpt::kSeed + 31 + dt);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (const Shape &s : kShapes) {
    const int64_t N = s.outer * s.n * s.inner;
    Buf x = randn(dt, N, rng);
    x.set_value(N / 2, -INFINITY);
    Buf g = randn(dt, N, rng, 1.0f);
    Dev dx(x.data(), nbytes(x)), dg(g.data(), nbytes(g));
    for (int log = 0; log < 2; log++)
      for (mixprec_dtype yd : {MIXPREC_F32, dt}) {
        Buf ycpu(yd, N);
        auto cpu = log ? mixprec_log_softmax : mixprec_softmax;
        auto gpu = log ? mixprec_cuda_log_softmax : mixprec_cuda_softmax;
        ASSERT_EQ(cpu(x.data(), dt, ycpu.data(), yd, s.outer, s.n, s.inner), MIXPREC_OK);
        Dev dy(nbytes(ycpu));
        ASSERT_EQ(gpu(dx.p, dt, dy.p, yd, s.outer, s.n, s.inner, stream), MIXPREC_OK);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        expect_close(from_device(dy, yd, N), ycpu, log ? 2e-5 : 1e-7, log ? "log_softmax" : "softmax");
        if (yd != dt) continue;
        // Backward from the CPU's output (the same bits on both sides).
        Buf gxc(dt, N);
        auto cpub = log ? mixprec_log_softmax_backward : mixprec_softmax_backward;
        auto gpub = log ? mixprec_cuda_log_softmax_backward : mixprec_cuda_softmax_backward;
        ASSERT_EQ(cpub(g.data(), ycpu.data(), dt, gxc.data(), dt, s.outer, s.n, s.inner), MIXPREC_OK);
        Dev dyc(ycpu.data(), nbytes(ycpu)), dgx(nbytes(gxc));
        ASSERT_EQ(gpub(dg.p, dyc.p, dt, dgx.p, dt, s.outer, s.n, s.inner, stream), MIXPREC_OK);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        expect_close(from_device(dgx, dt, N), gxc, 1e-5, "backward");
      }
  }
  cudaStreamDestroy(stream);
}

TEST_P(SoftmaxCuda, CrossEntropyMatchesCpu) {
  const mixprec_dtype dt = GetParam();
  std::mt19937 rng(mpt::kSeed + 32 + dt);
  const Shape shapes[] = {{256, 1000, 1}, {4, 50257, 1}, {2, 21, 4099}, {33, 1, 1}, {3, 7, 70}};
  for (const Shape &s : shapes) {
    const int64_t P = s.outer * s.inner, N = P * s.n;
    Buf x = randn(dt, N, rng);
    std::vector<int64_t> t((size_t)P);
    std::uniform_int_distribution<int64_t> cls(0, s.n - 1);
    for (int64_t i = 0; i < P; i++) t[(size_t)i] = i % 7 == 3 ? -100 : cls(rng);
    const std::vector<float> w = mpt::class_weights(s.n, rng, 0.2f);
    Dev dxl(x.data(), nbytes(x)), dt_(t.data(), t.size() * 8), dw(w.data(), w.size() * 4);
    for (int variant = 0; variant < 4; variant++)
      for (int red = 0; red < 3; red++) {
        mixprec_cross_entropy_params p = mpt::ce_params(s, variant, w, 0.1);
        p.reduction = static_cast<mixprec_reduction>(red);
        const int64_t nl = red == 0 ? P : 1;
        std::vector<float> loss((size_t)nl), stats((size_t)(2 * P)), gl((size_t)nl, 0.75f);
        float wsum;
        ASSERT_EQ(mixprec_cross_entropy(x.data(), dt, t.data(), &p, loss.data(), stats.data(), &wsum),
                  MIXPREC_OK);
        Buf gx(dt, N);
        ASSERT_EQ(mixprec_cross_entropy_backward(gl.data(), x.data(), dt, t.data(), &p, stats.data(), &wsum,
                                                 gx.data()),
                  MIXPREC_OK);
        mixprec_cross_entropy_params pd = p;
        pd.weight = variant & 1 ? static_cast<const float *>(dw.p) : nullptr;
        const int64_t ws = mixprec_cuda_cross_entropy_workspace_size(&pd);
        ASSERT_GE(ws, 0);
        Dev dloss(loss.size() * 4), dstats(stats.size() * 4), dwsum(4), dws((size_t)ws),
            dgl(gl.data(), gl.size() * 4), dgx(nbytes(gx));
        ASSERT_EQ(mixprec_cuda_cross_entropy(dxl.p, dt, static_cast<const int64_t *>(dt_.p), &pd,
                                             static_cast<float *>(dloss.p), static_cast<float *>(dstats.p),
                                             static_cast<float *>(dwsum.p), dws.p, ws, nullptr),
                  MIXPREC_OK);
        ASSERT_EQ(mixprec_cuda_cross_entropy_backward(
                      static_cast<const float *>(dgl.p), dxl.p, dt, static_cast<const int64_t *>(dt_.p), &pd,
                      static_cast<const float *>(dstats.p), static_cast<const float *>(dwsum.p), dgx.p, nullptr),
                  MIXPREC_OK);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<float> gloss(loss.size());
        float gwsum;
        dloss.to_host(gloss.data());
        dwsum.to_host(&gwsum);
        for (size_t i = 0; i < loss.size(); i++)
          EXPECT_NEAR(gloss[i], loss[i], 1e-4 * (1 + std::fabs(loss[i]))) << "red " << red << " i " << i;
        EXPECT_NEAR(gwsum, wsum, 1e-6 * wsum);
        expect_close(from_device(dgx, dt, N), gx, 1e-6, "ce backward");
      }
  }
}

TEST_P(SoftmaxCuda, CrossEntropyOutOfRangeTargetGivesNaN) {
  const mixprec_dtype dt = GetParam();
  std::mt19937 rng(mpt::kSeed + 33);
  Buf x = randn(dt, 4 * 10, rng);
  std::vector<int64_t> t = {1, 12, 3, -100};
  Dev dxl(x.data(), nbytes(x)), dtg(t.data(), 32);
  mixprec_cross_entropy_params p = mixprec_cross_entropy_params_default();
  p.outer = 4;
  p.classes = 10;
  p.inner = 1;
  p.reduction = MIXPREC_REDUCTION_NONE;
  const int64_t ws = mixprec_cuda_cross_entropy_workspace_size(&p);
  Dev dloss(16), dstats(32), dwsum(4), dws((size_t)ws), dgx(nbytes(x));
  std::vector<float> gl(4, 1.0f);
  Dev dgl(gl.data(), 16);
  ASSERT_EQ(mixprec_cuda_cross_entropy(dxl.p, dt, static_cast<const int64_t *>(dtg.p), &p,
                                       static_cast<float *>(dloss.p), static_cast<float *>(dstats.p),
                                       static_cast<float *>(dwsum.p), dws.p, ws, nullptr),
            MIXPREC_OK);
  ASSERT_EQ(mixprec_cuda_cross_entropy_backward(static_cast<const float *>(dgl.p), dxl.p, dt,
                                                static_cast<const int64_t *>(dtg.p), &p,
                                                static_cast<const float *>(dstats.p), nullptr, dgx.p, nullptr),
            MIXPREC_OK);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  float loss[4];
  dloss.to_host(loss);
  EXPECT_FALSE(std::isnan(loss[0]));
  EXPECT_TRUE(std::isnan(loss[1]));
  EXPECT_EQ(loss[3], 0.0f);
  Buf g = from_device(dgx, dt, 40);
  for (int c = 0; c < 10; c++) {
    EXPECT_TRUE(std::isnan(g.value(10 + c)));
    EXPECT_EQ(g.value(30 + c), 0.0f);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SoftmaxCuda, ::testing::Values(MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16),
                         [](const auto &info) { return std::string(mpt::dtype_name(info.param)); });

}  // namespace

#endif  // MIXPREC_TEST_CUDA
