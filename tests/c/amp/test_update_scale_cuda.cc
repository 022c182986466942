/* mixprec_cuda_update_scale against its CPU twin, mixprec_update_scale.
 * Built only with CUDA (MIXPREC_TEST_CUDA); every test that needs a device
 * skips itself when there is none. */
#ifdef MIXPREC_TEST_CUDA

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "cuda_util.h"
#include "mixprec/mixprec.h"
#include "test_util.h"

namespace {

using mpt::HaveDevice;

struct ScaleState {
  float scale;
  int32_t growth;
  int32_t hysteresis;
  int64_t skipped;
};

class CudaUpdateScale : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ASSERT_EQ(cudaSuccess, cudaMalloc(&dev_, sizeof(ScaleState) + 16));
  }
  void TearDown() override {
    if (dev_ != nullptr) cudaFree(dev_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  /* Steps CPU and GPU through the same found_inf values, comparing the
   * whole state after every step. */
  void RunSequence(const mixprec_update_scale_params &p, ScaleState init,
                   const std::vector<float> &found, bool with_hysteresis, bool with_skipped) {
    ScaleState cpu = init;
    ScaleState *d = (ScaleState *)dev_;
    float *d_found = (float *)((uint8_t *)dev_ + sizeof(ScaleState));
    ASSERT_EQ(cudaSuccess, cudaMemcpy(d, &init, sizeof init, cudaMemcpyHostToDevice));
    ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
    for (size_t step = 0; step < found.size(); step++) {
      SCOPED_TRACE(::testing::Message() << "step " << step << " found_inf " << found[step]);
      ASSERT_EQ(MIXPREC_OK,
                mixprec_update_scale(&cpu.scale, &cpu.growth,
                                     with_hysteresis ? &cpu.hysteresis : nullptr,
                                     with_skipped ? &cpu.skipped : nullptr, &found[step], &p));
      ASSERT_EQ(cudaSuccess, cudaMemcpyAsync(d_found, &found[step], sizeof(float),
                                             cudaMemcpyHostToDevice, stream_));
      ASSERT_EQ(MIXPREC_OK,
                mixprec_cuda_update_scale(&d->scale, &d->growth,
                                          with_hysteresis ? &d->hysteresis : nullptr,
                                          with_skipped ? &d->skipped : nullptr, d_found, &p,
                                          stream_));
      ScaleState gpu;
      ASSERT_EQ(cudaSuccess,
                cudaMemcpyAsync(&gpu, d, sizeof gpu, cudaMemcpyDeviceToHost, stream_));
      ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(stream_));
      ASSERT_EQ(mpt::f32_bits(cpu.scale), mpt::f32_bits(gpu.scale)) << cpu.scale << " vs " << gpu.scale;
      ASSERT_EQ(cpu.growth, gpu.growth);
      ASSERT_EQ(cpu.hysteresis, gpu.hysteresis);
      ASSERT_EQ(cpu.skipped, gpu.skipped);
    }
  }

  cudaStream_t stream_ = nullptr;
  void *dev_ = nullptr;
};

TEST_F(CudaUpdateScale, TorchDefaultsMatchCpu) {
  mixprec_update_scale_params p = mixprec_update_scale_params_default();
  p.growth_interval = 3;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> found = {0, 0, 0, 0, 0, 1, 0, 0, nan, 0, 0, 0, 0, 0, 0,
                                    3.0f, -0.0f, -0.0f, 0, 2.0f, 0, 0, 0, 0, 0};
  RunSequence(p, {65536.0f, 0, 1, 0}, found, false, false);
  RunSequence(p, {65536.0f, 0, 1, 0}, found, true, true);
}

TEST_F(CudaUpdateScale, HysteresisAndBoundsMatchCpu) {
  mixprec_update_scale_params p = mixprec_update_scale_params_default();
  p.growth_factor = 4.0f;
  p.backoff_factor = 0.25f;
  p.growth_interval = 2;
  p.hysteresis = 3;
  p.min_scale = 1000.0f;
  p.max_scale = 3.0e6f;
  std::vector<float> found;
  for (int i = 0; i < 20; i++) found.push_back(0.0f);  /* climbs to max_scale */
  for (int i = 0; i < 12; i++) found.push_back(1.0f);  /* falls to min_scale */
  for (int k = 0; k < 6; k++) {                        /* overflows between clean steps */
    found.push_back(1.0f);
    found.push_back(1.0f);
    found.push_back(0.0f);
  }
  std::mt19937_64 rng(std::random_device{}());
  for (int i = 0; i < 300; i++) found.push_back(rng() % 4 == 0 ? 1.0f : 0.0f);
  RunSequence(p, {65536.0f, 0, 3, 0}, found, true, true);
  RunSequence(p, {65536.0f, 1, 1, 17}, found, true, false);
}

TEST_F(CudaUpdateScale, GrowthThatOverflowsKeepsTheScale) {
  mixprec_update_scale_params p = mixprec_update_scale_params_default();
  p.growth_interval = 1;
  RunSequence(p, {3.0e38f, 0, 1, 0}, {0, 0, 1, 0, 0}, false, true);
  RunSequence(p, {INFINITY, 0, 1, 0}, {0, 1, 0}, false, true);
}

TEST_F(CudaUpdateScale, BadArgumentsWriteNothing) {
  ScaleState *d = (ScaleState *)dev_;
  float *d_found = (float *)((uint8_t *)dev_ + sizeof(ScaleState));
  const ScaleState init = {1024.0f, 5, 2, 9};
  const float one = 1.0f;
  ASSERT_EQ(cudaSuccess, cudaMemcpy(d, &init, sizeof init, cudaMemcpyHostToDevice));
  ASSERT_EQ(cudaSuccess, cudaMemcpy(d_found, &one, sizeof one, cudaMemcpyHostToDevice));
  ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
  const mixprec_update_scale_params good = mixprec_update_scale_params_default();
  auto call = [&](const mixprec_update_scale_params *p, bool hyst) {
    return mixprec_cuda_update_scale(&d->scale, &d->growth, hyst ? &d->hysteresis : nullptr,
                                     &d->skipped, d_found, p, stream_);
  };
  EXPECT_EQ(MIXPREC_ERR_NULL_POINTER, call(nullptr, true));
  EXPECT_EQ(MIXPREC_ERR_NULL_POINTER,
            mixprec_cuda_update_scale(nullptr, &d->growth, nullptr, nullptr, d_found, &good,
                                      stream_));
  EXPECT_EQ(MIXPREC_ERR_NULL_POINTER,
            mixprec_cuda_update_scale(&d->scale, &d->growth, nullptr, nullptr, nullptr, &good,
                                      stream_));
  mixprec_update_scale_params p = good;
  p.hysteresis = 2;
  EXPECT_EQ(MIXPREC_ERR_NULL_POINTER, call(&p, false));
  const float bad_factors[] = {0.0f, -1.0f, INFINITY, std::numeric_limits<float>::quiet_NaN()};
  for (float f : bad_factors) {
    p = good;
    p.growth_factor = f;
    EXPECT_EQ(MIXPREC_ERR_BAD_ARGUMENT, call(&p, true)) << f;
    p = good;
    p.backoff_factor = f;
    EXPECT_EQ(MIXPREC_ERR_BAD_ARGUMENT, call(&p, true)) << f;
  }
  p = good;
  p.growth_interval = 0;
  EXPECT_EQ(MIXPREC_ERR_BAD_ARGUMENT, call(&p, true));
  p = good;
  p.hysteresis = 0;
  EXPECT_EQ(MIXPREC_ERR_BAD_ARGUMENT, call(&p, true));
  p = good;
  p.min_scale = -1.0f;
  EXPECT_EQ(MIXPREC_ERR_BAD_ARGUMENT, call(&p, true));
  p = good;
  p.min_scale = 10.0f;
  p.max_scale = 5.0f;
  EXPECT_EQ(MIXPREC_ERR_BAD_ARGUMENT, call(&p, true));
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(stream_));
  ScaleState back;
  ASSERT_EQ(cudaSuccess, cudaMemcpy(&back, d, sizeof back, cudaMemcpyDeviceToHost));
  EXPECT_EQ(mpt::f32_bits(init.scale), mpt::f32_bits(back.scale));
  EXPECT_EQ(init.growth, back.growth);
  EXPECT_EQ(init.hysteresis, back.hysteresis);
  EXPECT_EQ(init.skipped, back.skipped);
}

}  // namespace

#endif /* MIXPREC_TEST_CUDA */
