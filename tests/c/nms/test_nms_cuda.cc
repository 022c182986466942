/* mixprec_cuda_nms against its CPU twin mixprec_nms / mixprec_batched_nms:
 * the same indices, padding and count, for every dtype, classes, thresholds
 * and limits. Built only with CUDA (MIXPREC_TEST_CUDA); every test skips
 * itself without a device. */
#ifdef MIXPREC_TEST_CUDA

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cuda_util.h"
#include "mixprec/mixprec.h"

namespace {

using mpt::HaveDevice;
using mpt::Store;


template <typename T>
T *ToDevice(const std::vector<T> &h) {
  T *d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, h.size() * sizeof(T) + 16), cudaSuccess);
  if (!h.empty()) EXPECT_EQ(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

struct Case {
  int64_t n;
  bool clustered;
  bool specials;
  int64_t n_classes;  // 0: plain NMS
};

void Make(std::mt19937 &rng, const Case &c, std::vector<float> &boxes, std::vector<float> &scores,
          std::vector<int64_t> &cls) {
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::normal_distribution<float> g(0.0f, 1.0f);
  boxes.resize(size_t(4 * c.n));
  scores.resize(size_t(c.n));
  cls.resize(size_t(c.n));
  const int64_t k = c.n / 30 + 1;
  std::vector<float> cx(static_cast<size_t>(k)), cy(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; i++) cx[size_t(i)] = u(rng) * 1000, cy[size_t(i)] = u(rng) * 1000;
  for (int64_t i = 0; i < c.n; i++) {
    float x, y, w, h;
    if (c.clustered) {
      const size_t j = rng() % size_t(k);
      x = cx[j] + 4 * g(rng), y = cy[j] + 4 * g(rng), w = 40 + 4 * g(rng), h = 40 + 4 * g(rng);
    } else {
      x = u(rng) * 1000, y = u(rng) * 1000, w = 1 + 150 * u(rng), h = 1 + 150 * u(rng);
    }
    float v[4] = {x, y, x + w, y + h};
    float s = rng() % 4 == 0 ? float(rng() % 8) / 8 : u(rng);
    if (c.specials) {
      const uint32_t r = rng() % 100;
      if (r < 3) v[rng() % 4] = std::numeric_limits<float>::quiet_NaN();
      else if (r < 6) v[2] = v[0], v[3] = v[1];
      else if (r < 8) std::swap(v[0], v[2]);
      const uint32_t q = rng() % 100;
      if (q < 3) s = std::numeric_limits<float>::quiet_NaN();
      else if (q < 5) s = -0.0f;
      else if (q < 7) s = -INFINITY;
    }
    for (int j = 0; j < 4; j++) boxes[size_t(4 * i + j)] = v[j];
    scores[size_t(i)] = s;
    cls[size_t(i)] = c.n_classes ? int64_t(rng() % uint32_t(c.n_classes)) * 1000003 - 7 : 0;
  }
}

void Compare(mixprec_dtype dt, const Case &c, const mixprec_nms_params &p, bool cls32, std::mt19937 &rng) {
  std::vector<float> boxes, scores;
  std::vector<int64_t> cls;
  Make(rng, c, boxes, scores, cls);
  std::vector<int32_t> cls_i32(cls.begin(), cls.end());
  const std::vector<uint8_t> hb = Store(dt, boxes), hs = Store(dt == MIXPREC_F32 ? MIXPREC_BF16 : dt, scores);
  const mixprec_dtype sdt = dt == MIXPREC_F32 ? MIXPREC_BF16 : dt;  // mixed dtypes for F32 boxes
  const void *hc = c.n_classes ? (cls32 ? (const void *)cls_i32.data() : (const void *)cls.data()) : nullptr;
  const mixprec_index_dtype cdt = cls32 ? MIXPREC_I32 : MIXPREC_I64;
  const int64_t cap = mixprec_nms_capacity(c.n, &p);

  std::vector<int64_t> want(size_t(cap) + 1, 777);
  int64_t want_n = -1;
  ASSERT_EQ(hc ? mixprec_batched_nms(hb.data(), dt, hs.data(), sdt, hc, cdt, c.n, &p, want.data(), &want_n)
               : mixprec_nms(hb.data(), dt, hs.data(), sdt, c.n, &p, want.data(), &want_n),
            MIXPREC_OK);

  uint8_t *db = ToDevice(hb), *ds = ToDevice(hs);
  void *dc = nullptr;
  if (hc) dc = cls32 ? (void *)ToDevice(cls_i32) : (void *)ToDevice(cls);
  std::vector<int64_t> poison(size_t(cap) + 1, 555);
  int64_t *dkeep = ToDevice(poison);
  int64_t *dcount = ToDevice(std::vector<int64_t>{-5});
  const int64_t ws = mixprec_cuda_nms_workspace_size(c.n);
  ASSERT_GE(ws, 0);
  void *dws = nullptr;
  ASSERT_EQ(cudaMalloc(&dws, size_t(ws) + 1), cudaSuccess);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(mixprec_cuda_nms(db, dt, ds, sdt, dc, cdt, c.n, &p, dkeep, dcount, dws, ws, stream), MIXPREC_OK);
  int64_t got_n = -1;
  ASSERT_EQ(mixprec_cuda_nms_read_count(dcount, &got_n, stream), MIXPREC_OK);
  std::vector<int64_t> got(size_t(cap) + 1);
  ASSERT_EQ(cudaMemcpy(got.data(), dkeep, got.size() * 8, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(got_n, want_n) << "n=" << c.n << " classes=" << c.n_classes;
  for (int64_t i = 0; i < cap; i++)
    ASSERT_EQ(got[size_t(i)], want[size_t(i)]) << "index " << i << " n=" << c.n << " classes=" << c.n_classes
                                               << " thr=" << p.iou_threshold << " max=" << p.max_output;
  EXPECT_EQ(got[size_t(cap)], 555) << "wrote past the capacity";
  cudaStreamDestroy(stream);
  cudaFree(db), cudaFree(ds), cudaFree(dc), cudaFree(dkeep), cudaFree(dcount), cudaFree(dws);
}

class NmsCuda : public ::testing::TestWithParam<mixprec_dtype> {};

TEST_P(NmsCuda, EqualsCpu) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(0x6e6d73u + unsigned(GetParam()));
  const Case cases[] = {{0, false, false, 0},   {1, false, false, 0},    {63, true, true, 0},
                        {64, true, false, 0},   {65, false, true, 0},    {1000, true, true, 0},
                        {5000, false, false, 0}, {20000, true, false, 0}, {3000, true, true, 80},
                        {3000, false, false, 3}, {20000, true, false, 1000}};
  for (const Case &c : cases) {
    for (double thr : {0.0, 1.0 / 3.0, 0.5, 0.7, 2.0}) {
      mixprec_nms_params p = mixprec_nms_params_default();
      p.iou_threshold = thr;
      Compare(GetParam(), c, p, false, rng);
      if (c.n_classes) Compare(GetParam(), c, p, true, rng);
    }
    mixprec_nms_params p = mixprec_nms_params_default();
    p.use_score_threshold = 1;
    p.score_threshold = 0.3;
    p.max_output = 17;
    Compare(GetParam(), c, p, false, rng);
    p.max_output = 0;
    Compare(GetParam(), c, p, false, rng);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, NmsCuda, ::testing::Values(MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16));

TEST(NmsCudaArgs, RefusesBadArguments) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  mixprec_nms_params p = mixprec_nms_params_default();
  int64_t *dkeep = ToDevice(std::vector<int64_t>(4, 0));
  float *dboxes = ToDevice(std::vector<float>(16, 1.0f));
  const int64_t ws = mixprec_cuda_nms_workspace_size(4);
  ASSERT_GT(ws, 0);
  EXPECT_EQ(mixprec_cuda_nms_workspace_size(-1), -1);
  void *dws = nullptr;
  ASSERT_EQ(cudaMalloc(&dws, size_t(ws)), cudaSuccess);
  EXPECT_EQ(mixprec_cuda_nms(dboxes, MIXPREC_F32, dboxes, MIXPREC_F32, nullptr, MIXPREC_I64, 4, &p,
                             dkeep, dkeep + 3, dws, ws - 1, nullptr),
            MIXPREC_ERR_BAD_ARGUMENT);
  EXPECT_EQ(mixprec_cuda_nms(dboxes, MIXPREC_F32, dboxes, MIXPREC_F32, nullptr, MIXPREC_I64, 4, &p,
                             dkeep, dkeep + 3, (char *)dws + 8, ws, nullptr),
            MIXPREC_ERR_BAD_ARGUMENT);
  p.iou_threshold = -1;
  EXPECT_EQ(mixprec_cuda_nms(dboxes, MIXPREC_F32, dboxes, MIXPREC_F32, nullptr, MIXPREC_I64, 4, &p,
                             dkeep, dkeep + 3, dws, ws, nullptr),
            MIXPREC_ERR_BAD_ARGUMENT);
  p = mixprec_nms_params_default();
  EXPECT_EQ(mixprec_cuda_nms(nullptr, MIXPREC_F32, dboxes, MIXPREC_F32, nullptr, MIXPREC_I64, 4, &p,
                             dkeep, dkeep + 3, dws, ws, nullptr),
            MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(mixprec_cuda_nms_read_count(nullptr, nullptr, nullptr), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(dkeep), cudaFree(dboxes), cudaFree(dws);
}

}  // namespace

#endif  // MIXPREC_TEST_CUDA
