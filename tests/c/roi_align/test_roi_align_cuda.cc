/* mixprec_cuda_roi_align / _backward against the CPU entry points: the same
 * bits forward and backward (the gather equals the CPU scatter), every
 * dtype, fixed and adaptive grids, aligned, strided gradients; a batch index
 * out of range gives NaN outputs and no gradient. Built only with CUDA
 * (MIXPREC_TEST_CUDA); every test skips itself without a device. */
#ifdef MIXPREC_TEST_CUDA

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_util.h"
#include "mixprec/mixprec.h"
#include "mixprec/roi_align.h"

namespace {

using mpt::DeviceBuffer;
using mpt::HaveDevice;
using mpt::Store;


struct Cfg {
  int64_t ph, pw;
  double scale;
  int64_t sr;
  int aligned;
};

TEST(RoiAlignCuda, EqualsCpuBitForBit) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(0x726f69u);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  const Cfg cfgs[] = {{7, 7, 0.25, 2, 0}, {7, 7, 0.0625, -1, 0}, {14, 14, 0.125, 0, 1}, {3, 5, 1.0, 3, 1}};
  const int64_t N = 2, C = 19, H = 45, W = 38, K = 300;
  for (const Cfg &c : cfgs)
    for (mixprec_dtype dt : {MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16}) {
      std::vector<float> feat(size_t(N * C * H * W)), rois(size_t(K * 5));
      for (auto &v : feat) v = g(rng);
      for (int64_t k = 0; k < K; k++) {
        float *r = &rois[size_t(k * 5)];
        r[0] = float(k % N);
        r[1] = (u(rng) * 1.2f - 0.1f) * W / float(c.scale);
        r[2] = (u(rng) * 1.2f - 0.1f) * H / float(c.scale);
        r[3] = r[1] + u(rng) * W / float(c.scale) * 0.5f;
        r[4] = r[2] + u(rng) * H / float(c.scale) * 0.5f;
      }
      mixprec_roi_align_params p = mixprec_roi_align_params_default(c.ph, c.pw);
      p.spatial_scale = c.scale;
      p.sampling_ratio = c.sr;
      p.aligned = c.aligned;
      const size_t es = dt == MIXPREC_F32 ? 4 : 2;
      const int64_t on = K * C * c.ph * c.pw, in = N * C * H * W;
      std::vector<uint8_t> hf = Store(dt, feat), hr = Store(dt, rois), cpu(static_cast<size_t>(on) * es),
                           gpu(static_cast<size_t>(on) * es);
      ASSERT_EQ(mixprec_roi_align(hf.data(), dt, N, C, H, W, hr.data(), dt, K, &p, cpu.data(), dt),
                MIXPREC_OK);
      DeviceBuffer df(hf.data(), hf.size()), dr(hr.data(), hr.size()), dout(gpu.size());
      ASSERT_EQ(mixprec_cuda_roi_align(df.p, dt, N, C, H, W, dr.p, dt, K, &p, dout.p, dt, nullptr),
                MIXPREC_OK);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      dout.to_host(gpu.data());
      ASSERT_EQ(std::memcmp(cpu.data(), gpu.data(), cpu.size()), 0) << "forward dtype " << dt;

      std::vector<float> go{};
      go.resize(size_t(on));
      for (auto &v : go) v = g(rng);
      std::vector<uint8_t> hg = Store(dt, go), gcpu(static_cast<size_t>(in) * es), ggpu(static_cast<size_t>(in) * es);
      const int64_t st[4] = {C * c.ph * c.pw, c.ph * c.pw, c.pw, 1};
      ASSERT_EQ(mixprec_roi_align_backward(hg.data(), dt, st, hr.data(), dt, K, N, C, H, W, &p,
                                           gcpu.data(), dt),
                MIXPREC_OK);
      const int64_t ws = mixprec_cuda_roi_align_backward_workspace_size(K, N);
      ASSERT_GT(ws, 0);
      DeviceBuffer dg(hg.data(), hg.size()), dgi(ggpu.size()), dws{static_cast<size_t>(ws)};
      ASSERT_EQ(mixprec_cuda_roi_align_backward(dg.p, dt, st, dr.p, dt, K, N, C, H, W, &p, dgi.p, dt,
                                                dws.p, ws, nullptr),
                MIXPREC_OK);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      dgi.to_host(ggpu.data());
      ASSERT_EQ(std::memcmp(gcpu.data(), ggpu.data(), gcpu.size()), 0) << "backward dtype " << dt;
    }
}

TEST(RoiAlignCuda, BadBatchIndexGivesNaNNotAFault) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  const int64_t C = 2, H = 8, W = 8;
  std::vector<float> feat(size_t(C * H * W), 1.0f);
  std::vector<float> rois = {0, 1, 1, 5, 5, 7, 1, 1, 5, 5, -3, 0, 0, 2, 2};
  mixprec_roi_align_params p = mixprec_roi_align_params_default(2, 2);
  DeviceBuffer df(feat.data(), feat.size() * 4), dr(rois.data(), rois.size() * 4), dout(3 * C * 4 * 4);
  ASSERT_EQ(mixprec_cuda_roi_align(df.p, MIXPREC_F32, 1, C, H, W, dr.p, MIXPREC_F32, 3, &p, dout.p,
                                   MIXPREC_F32, nullptr),
            MIXPREC_OK);
  std::vector<float> out(size_t(3 * C * 4));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dout.to_host(out.data());
  for (int i = 0; i < C * 4; i++) EXPECT_EQ(out[size_t(i)], 1.0f);
  for (size_t i = size_t(C * 4); i < out.size(); i++) EXPECT_TRUE(std::isnan(out[i]));
}

}  // namespace

#endif  // MIXPREC_TEST_CUDA
