/* mixprec_cuda_unscale and mixprec_cuda_grad_norm against their CPU twins.
 * Built only with CUDA (MIXPREC_TEST_CUDA); every test that needs a device
 * skips itself when there is none. */
#ifdef MIXPREC_TEST_CUDA

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <random>
#include <vector>

#include "cuda_util.h"
#include "mixprec/mixprec.h"

namespace {

using mpt::HaveDevice;

int ElemSize(mixprec_dtype dtype) { return dtype == MIXPREC_F32 ? 4 : 2; }

uint32_t F32Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

/* Storage bits of element i (a float's bits, or a 16-bit pattern). */
uint32_t GetBits(mixprec_dtype dtype, const uint8_t *data, int64_t i) {
  if (dtype == MIXPREC_F32) {
    uint32_t u;
    std::memcpy(&u, data + i * 4, 4);
    return u;
  }
  uint16_t h;
  std::memcpy(&h, data + i * 2, 2);
  return h;
}

void SetBits(mixprec_dtype dtype, uint8_t *data, int64_t i, uint32_t bits) {
  if (dtype == MIXPREC_F32) {
    std::memcpy(data + i * 4, &bits, 4);
  } else {
    uint16_t h = (uint16_t)bits;
    std::memcpy(data + i * 2, &h, 2);
  }
}

uint32_t ToBits(mixprec_dtype dtype, float f) {
  switch (dtype) {
    case MIXPREC_F16:
      return mixprec_f32_to_f16(f).bits;
    case MIXPREC_BF16:
      return mixprec_f32_to_bf16(f).bits;
    default:
      return F32Bits(f);
  }
}

bool IsNanBits(mixprec_dtype dtype, uint32_t bits) {
  switch (dtype) {
    case MIXPREC_F16:
      return (bits & 0x7fffu) > 0x7c00u;
    case MIXPREC_BF16:
      return (bits & 0x7fffu) > 0x7f80u;
    default:
      return (bits & 0x7fffffffu) > 0x7f800000u;
  }
}

/* A host tensor; `offset` elements of padding before the data put it off
 * 16-byte alignment on the device too. */
struct HostTensor {
  mixprec_dtype dtype;
  int64_t numel;
  int64_t offset;
  std::vector<uint8_t> bytes;
};

HostTensor MakeTensor(mixprec_dtype dtype, int64_t numel, int64_t offset) {
  HostTensor t;
  t.dtype = dtype;
  t.numel = numel;
  t.offset = offset;
  t.bytes.assign((size_t)(numel * ElemSize(dtype)), 0);
  return t;
}

/* Scaled-gradient-like values: zeros of both signs, subnormals, and
 * magnitudes whose unscaled results land on subnormals and on rounding ties
 * of the 16-bit types. The top stays low enough (2^40 for F32/BF16) that
 * the norms are finite floats, so the norm comparison means something. */
float RandomValue(std::mt19937_64 &rng, mixprec_dtype dtype) {
  const int r = (int)(rng() % 100);
  const float sign = (rng() & 1) ? -1.0f : 1.0f;
  if (r < 3) return sign * 0.0f;
  const int emin = dtype == MIXPREC_F16 ? -24 : -140;
  const int emax = dtype == MIXPREC_F16 ? 14 : 40;
  const int e = emin + (int)(rng() % (uint64_t)(emax - emin + 1));
  const float m = 1.0f + (float)(rng() >> 40) / (float)(1 << 24);
  return sign * std::ldexp(m, e);
}

void FillRandom(HostTensor &t, std::mt19937_64 &rng) {
  for (int64_t i = 0; i < t.numel; i++)
    SetBits(t.dtype, t.bytes.data(), i, ToBits(t.dtype, RandomValue(rng, t.dtype)));
}

struct Outputs {
  mixprec_status status = MIXPREC_OK;
  std::vector<std::vector<uint8_t>> data;
  float found_inf = 0.0f;
  std::vector<float> norms;
  float total = 0.0f;
};

struct RunOptions {
  float inv_scale = 1.0f / 65536.0f;
  float found_inf_init = 0.0f;
  bool norms = true;
  bool total = true;
  bool read_only = false;  // mixprec_cuda_grad_norm instead of mixprec_cuda_unscale
};

const float kPoison = std::numeric_limits<float>::quiet_NaN();

Outputs RunCpu(const std::vector<HostTensor> &ts, const RunOptions &o) {
  Outputs out;
  std::vector<mixprec_tensor> list(ts.size());
  out.data.resize(ts.size());
  for (size_t i = 0; i < ts.size(); i++) {
    out.data[i] = ts[i].bytes;
    list[i] = {ts[i].numel ? out.data[i].data() : nullptr, ts[i].numel, ts[i].dtype};
  }
  out.found_inf = o.found_inf_init;
  out.norms.assign(ts.size(), kPoison);
  out.total = kPoison;
  out.status = mixprec_unscale(list.data(), (int64_t)list.size(), &o.inv_scale,
                               &out.found_inf, o.norms ? out.norms.data() : nullptr,
                               o.total ? &out.total : nullptr);
  return out;
}

using mpt::DeviceArena;

/* The whole sequence on `stream`; results copied back after one
 * synchronisation of that stream. `graph` captures the call into a CUDA graph
 * and launches the graph instead. */
Outputs RunGpu(const std::vector<HostTensor> &ts, const RunOptions &o,
               cudaStream_t stream, bool graph = false) {
  Outputs out;
  DeviceArena arena;
  std::vector<mixprec_tensor> list(ts.size());
  std::vector<uint8_t *> dev(ts.size());
  for (size_t i = 0; i < ts.size(); i++) {
    const size_t es = (size_t)ElemSize(ts[i].dtype);
    uint8_t *base = (uint8_t *)arena.Alloc((size_t)(ts[i].numel + ts[i].offset) * es);
    EXPECT_NE(base, nullptr);
    if (base == nullptr) return out;
    dev[i] = base + ts[i].offset * es;
    EXPECT_EQ(cudaSuccess, cudaMemcpy(dev[i], ts[i].bytes.data(), ts[i].bytes.size(),
                                      cudaMemcpyHostToDevice));
    list[i] = {ts[i].numel ? dev[i] : nullptr, ts[i].numel, ts[i].dtype};
  }
  float *scalars = (float *)arena.Alloc(3 * sizeof(float));
  float *norms = (float *)arena.Alloc((ts.size() + 1) * sizeof(float));
  const float init[3] = {o.inv_scale, o.found_inf_init, kPoison};
  EXPECT_EQ(cudaSuccess, cudaMemcpy(scalars, init, sizeof init, cudaMemcpyHostToDevice));
  EXPECT_EQ(cudaSuccess, cudaMemset(norms, 0xff, (ts.size() + 1) * sizeof(float)));
  const int64_t ws_bytes = mixprec_cuda_unscale_workspace_size(
      list.data(), (int64_t)list.size(), o.norms || o.total);
  EXPECT_GE(ws_bytes, 0);
  void *ws = ws_bytes > 0 ? arena.Alloc((size_t)ws_bytes) : nullptr;
  /* The copies above ran on the legacy stream, which a non-blocking stream
   * does not wait for. */
  EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize());

  cudaGraph_t g = nullptr;
  if (graph) {
    EXPECT_EQ(cudaSuccess, cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  }
  out.status = (o.read_only ? mixprec_cuda_grad_norm : mixprec_cuda_unscale)(
      list.data(), (int64_t)list.size(), scalars, scalars + 1, o.norms ? norms : nullptr,
      o.total ? scalars + 2 : nullptr, ws, ws_bytes, stream);
  if (graph) {
    EXPECT_EQ(cudaSuccess, cudaStreamEndCapture(stream, &g));
    cudaGraphExec_t exec = nullptr;
    EXPECT_EQ(cudaSuccess, cudaGraphInstantiate(&exec, g, 0));
    EXPECT_EQ(cudaSuccess, cudaGraphLaunch(exec, stream));
    EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(stream));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(g);
  }
  EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(stream));
  EXPECT_EQ(cudaSuccess, cudaGetLastError());

  out.data.resize(ts.size());
  for (size_t i = 0; i < ts.size(); i++) {
    out.data[i].resize(ts[i].bytes.size());
    EXPECT_EQ(cudaSuccess, cudaMemcpy(out.data[i].data(), dev[i], ts[i].bytes.size(),
                                      cudaMemcpyDeviceToHost));
  }
  float back[3];
  EXPECT_EQ(cudaSuccess, cudaMemcpy(back, scalars, sizeof back, cudaMemcpyDeviceToHost));
  out.found_inf = back[1];
  out.total = back[2];
  out.norms.resize(ts.size());
  if (!ts.empty()) {
    EXPECT_EQ(cudaSuccess, cudaMemcpy(out.norms.data(), norms, ts.size() * sizeof(float),
                                      cudaMemcpyDeviceToHost));
  }
  return out;
}

void ExpectSameData(const HostTensor &t, const std::vector<uint8_t> &cpu,
                    const std::vector<uint8_t> &gpu, size_t which) {
  ASSERT_EQ(cpu.size(), gpu.size());
  for (int64_t i = 0; i < t.numel; i++) {
    const uint32_t c = GetBits(t.dtype, cpu.data(), i);
    const uint32_t g = GetBits(t.dtype, gpu.data(), i);
    /* NaN payloads differ between CPU and GPU arithmetic; NaN-ness may not. */
    const bool ok = IsNanBits(t.dtype, c) ? IsNanBits(t.dtype, g) : c == g;
    if (!ok) {
      ADD_FAILURE() << "tensor " << which << " (dtype " << t.dtype << ", numel " << t.numel
                    << ", offset " << t.offset << ") element " << i << ": cpu 0x" << std::hex
                    << c << " gpu 0x" << g << std::dec;
      return;
    }
  }
}

/* L2 norms of the same `numel` stored values, from the CPU and the GPU.
 * Their sums differ in order and in precision: the CPU adds squares in float
 * in blocks of 8 per lane (<= ~5e-7 relative on the sum of squares), the GPU
 * in double. So: 1e-6 relative, plus what the CPU's float squares below
 * FLT_MIN may lose (2^-150 each at most, E = numel * 2^-150 on the sum,
 * hence min(sqrt(E), E / norm) on the norm: nothing unless every value is
 * below ~1e-19, where the GPU's exact norm is compared with the CPU's
 * underflowed one), plus one float subnormal step. */
void ExpectNormClose(float cpu, float gpu, int64_t numel, const char *what, size_t which) {
  if (std::isnan(cpu)) {
    EXPECT_TRUE(std::isnan(gpu)) << what << " " << which << ": gpu " << gpu;
  } else if (std::isinf(cpu)) {
    EXPECT_EQ(cpu, gpu) << what << " " << which;
  } else {
    EXPECT_FALSE(std::signbit(gpu)) << what << " " << which << ": gpu " << gpu;
    const double hi = std::max(std::fabs((double)cpu), std::fabs((double)gpu));
    const double e = (double)numel * std::ldexp(1.0, -150);
    const double underflow = hi > 0.0 ? std::min(std::sqrt(e), e / hi) : 0.0;
    EXPECT_LE(std::fabs((double)gpu - (double)cpu),
              1e-6 * std::fabs((double)cpu) + underflow + std::ldexp(1.0, -149))
        << what << " " << which << ": cpu " << cpu << " gpu " << gpu;
  }
}

void ExpectSameResults(const std::vector<HostTensor> &ts, const Outputs &cpu, const Outputs &gpu,
                       const RunOptions &o) {
  ASSERT_EQ(MIXPREC_OK, cpu.status);
  ASSERT_EQ(MIXPREC_OK, gpu.status);
  ASSERT_EQ(cpu.data.size(), gpu.data.size());
  EXPECT_EQ(F32Bits(cpu.found_inf), F32Bits(gpu.found_inf));
  int64_t numel = 0;
  for (size_t i = 0; i < ts.size(); i++) {
    ExpectSameData(ts[i], cpu.data[i], gpu.data[i], i);
    if (o.norms) ExpectNormClose(cpu.norms[i], gpu.norms[i], ts[i].numel, "norm", i);
    numel += ts[i].numel;
  }
  if (o.total) ExpectNormClose(cpu.total, gpu.total, numel, "total", 0);
}

const mixprec_dtype kDtypes[] = {MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16};

/* Sizes around the vector width, the chunk size and odd values. */
const int64_t kSizes[] = {0, 1, 2, 3, 7, 8, 9, 15, 17, 31, 33, 4097, 16383, 16384, 16385,
                          32768 + 5, 100003};

class CudaUnscale : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    seed_ = std::random_device{}();
    rng_.seed(seed_);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  void CompareWithCpu(const std::vector<HostTensor> &ts, const RunOptions &o) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed_);
    const Outputs cpu = RunCpu(ts, o);
    const Outputs gpu = RunGpu(ts, o, stream_);
    ExpectSameResults(ts, cpu, gpu, o);
  }

  std::vector<HostTensor> RandomList(size_t n, bool mixed, mixprec_dtype dtype,
                                     int64_t max_numel) {
    std::vector<HostTensor> ts;
    for (size_t i = 0; i < n; i++) {
      const mixprec_dtype d = mixed ? kDtypes[rng_() % 3] : dtype;
      int64_t numel;
      if (i < sizeof kSizes / sizeof kSizes[0] && kSizes[i] <= max_numel)
        numel = kSizes[i];
      else
        numel = (int64_t)(rng_() % (uint64_t)(max_numel + 1));
      ts.push_back(MakeTensor(d, numel, (int64_t)(rng_() % 8)));
      FillRandom(ts.back(), rng_);
    }
    return ts;
  }

  cudaStream_t stream_ = nullptr;
  unsigned seed_ = 0;
  std::mt19937_64 rng_;
};

TEST_F(CudaUnscale, EachDtypeMatchesCpuBitwise) {
  for (mixprec_dtype d : kDtypes) {
    for (float inv : {1.0f / 65536.0f, 1.0f / 3000.0f, 0.75f}) {
      SCOPED_TRACE(::testing::Message() << "dtype " << d << " inv_scale " << inv);
      std::vector<HostTensor> ts;
      for (int64_t n : kSizes) {
        for (int64_t offset : {0, 1, 3}) {
          ts.push_back(MakeTensor(d, n, offset));
          FillRandom(ts.back(), rng_);
        }
      }
      RunOptions o;
      o.inv_scale = inv;
      CompareWithCpu(ts, o);
    }
  }
}

/* The read-only twin: the same found_inf and norms as the in-place op on
 * the GPU, bit for bit, and every tensor left as it was; also captured in a
 * graph. */
TEST_F(CudaUnscale, GradNormEqualsUnscaleAndWritesNothing) {
  for (bool graph : {false, true}) {
    std::vector<HostTensor> ts = RandomList(70, true, MIXPREC_F32, 70000);
    SetBits(ts[5].dtype, ts[5].bytes.data(), 0, ts[5].dtype == MIXPREC_F32 ? 0x7f800000u
                                                 : ts[5].dtype == MIXPREC_F16 ? 0x7c00u : 0x7f80u);
    RunOptions o;
    const Outputs w = RunGpu(ts, o, stream_, graph);
    o.read_only = true;
    const Outputs r = RunGpu(ts, o, stream_, graph);
    EXPECT_EQ(w.status, MIXPREC_OK);
    EXPECT_EQ(r.status, MIXPREC_OK);
    EXPECT_EQ(r.found_inf, 1.0f);
    EXPECT_EQ(w.found_inf, r.found_inf);
    EXPECT_EQ(F32Bits(w.total), F32Bits(r.total));
    for (size_t i = 0; i < ts.size(); i++) {
      EXPECT_EQ(F32Bits(w.norms[i]), F32Bits(r.norms[i])) << "tensor " << i;
      EXPECT_TRUE(r.data[i] == ts[i].bytes) << "tensor " << i << " was written";
    }
  }
}

TEST_F(CudaUnscale, MixedDtypeListsMatchCpu) {
  for (size_t n : {1, 5, 37, 300}) {
    SCOPED_TRACE(::testing::Message() << "n_tensors " << n);
    CompareWithCpu(RandomList(n, true, MIXPREC_F32, 70000), RunOptions());
  }
}

TEST_F(CudaUnscale, LongListsTakeSeveralLaunches) {
  /* Past the single-launch capacities, both with and without a short last
   * group, and one list with a few large tensors among many small ones. */
  for (size_t n : {255, 256, 257, 1023, 1024, 1025, 1100, 2600}) {
    SCOPED_TRACE(::testing::Message() << "n_tensors " << n);
    CompareWithCpu(RandomList(n, true, MIXPREC_F32, 5000), RunOptions());
  }
  std::vector<HostTensor> ts = RandomList(2100, true, MIXPREC_F32, 300);
  for (size_t i = 0; i < ts.size(); i += 700) {
    ts[i] = MakeTensor(kDtypes[i % 3], 1000003, 1);
    FillRandom(ts[i], rng_);
  }
  CompareWithCpu(ts, RunOptions());
}

TEST_F(CudaUnscale, EmptyTensorsAndEmptyList) {
  std::vector<HostTensor> none;
  CompareWithCpu(none, RunOptions());
  const Outputs gpu = RunGpu(none, RunOptions(), stream_);
  EXPECT_EQ(MIXPREC_OK, gpu.status);
  EXPECT_EQ(0.0f, gpu.found_inf);
  EXPECT_EQ(0.0f, gpu.total);

  std::vector<HostTensor> empties;
  for (mixprec_dtype d : kDtypes) empties.push_back(MakeTensor(d, 0, 0));
  CompareWithCpu(empties, RunOptions());
  const Outputs g2 = RunGpu(empties, RunOptions(), stream_);
  for (float n : g2.norms) EXPECT_EQ(0.0f, n);
  EXPECT_EQ(0.0f, g2.total);

  std::vector<HostTensor> some = RandomList(20, true, MIXPREC_F32, 40);
  for (size_t i = 0; i < some.size(); i += 3) some[i] = MakeTensor(some[i].dtype, 0, 0);
  CompareWithCpu(some, RunOptions());
}

TEST_F(CudaUnscale, NonFiniteAtFirstMiddleLast) {
  for (mixprec_dtype d : kDtypes) {
    const uint32_t nan_payload = d == MIXPREC_F32 ? 0x7f800001u : d == MIXPREC_F16 ? 0xfc01u : 0xff81u;
    const uint32_t specials[] = {ToBits(d, INFINITY), ToBits(d, -INFINITY),
                                 ToBits(d, std::numeric_limits<float>::quiet_NaN()), nan_payload};
    for (uint32_t special : specials) {
      for (int where = 0; where < 3; where++) {
        SCOPED_TRACE(::testing::Message() << "dtype " << d << " bits 0x" << std::hex << special
                                          << std::dec << " position " << where);
        std::vector<HostTensor> ts = RandomList(9, false, d, 40000);
        HostTensor &t = ts[6];
        t = MakeTensor(d, 50001, 1);
        FillRandom(t, rng_);
        const int64_t idx = where == 0 ? 0 : where == 1 ? t.numel / 2 : t.numel - 1;
        SetBits(d, t.bytes.data(), idx, special);
        const Outputs cpu = RunCpu(ts, RunOptions());
        const Outputs gpu = RunGpu(ts, RunOptions(), stream_);
        EXPECT_EQ(1.0f, gpu.found_inf);
        ExpectSameResults(ts, cpu, gpu, RunOptions());
        EXPECT_FALSE(std::isfinite(gpu.norms[6]));
        EXPECT_FALSE(std::isfinite(gpu.total));
      }
    }
  }
}

/* Finite values far beyond what a float sum of squares holds (around 1e20,
 * whose squares overflow float, and one near 3e38 per list) give finite
 * norms on both sides, equal within 1e-6; found_inf stays 0. */
TEST_F(CudaUnscale, HugeFiniteValuesGiveFiniteNorms) {
  for (mixprec_dtype d : {MIXPREC_F32, MIXPREC_BF16}) {
    SCOPED_TRACE(::testing::Message() << "dtype " << d);
    std::vector<HostTensor> ts;
    for (int64_t n : {1000, 70001, 33, 129}) {
      ts.push_back(MakeTensor(d, n, n & 1));
      for (int64_t i = 0; i < n; i++) {
        const float m = 0.5f + (float)(rng_() % 1000) / 666.0f;
        SetBits(d, ts.back().bytes.data(), i, ToBits(d, ((rng_() & 1) ? -m : m) * 1e20f));
      }
    }
    SetBits(d, ts[0].bytes.data(), 500, ToBits(d, 3.0e38f));
    SetBits(d, ts[1].bytes.data(), 70000, ToBits(d, -1.0e37f));
    for (float inv : {1.0f, 0.75f}) {
      RunOptions o;
      o.inv_scale = inv;
      const Outputs cpu = RunCpu(ts, o);
      const Outputs gpu = RunGpu(ts, o, stream_);
      ExpectSameResults(ts, cpu, gpu, o);
      EXPECT_EQ(0u, F32Bits(gpu.found_inf));
      for (size_t i = 0; i < ts.size(); i++) {
        EXPECT_TRUE(std::isfinite(cpu.norms[i])) << i;
        EXPECT_TRUE(std::isfinite(gpu.norms[i])) << i;
      }
      EXPECT_TRUE(std::isfinite(cpu.total));
      EXPECT_TRUE(std::isfinite(gpu.total));
    }
  }
}

/* A NaN inv_scale with payload bits: every output NaN on both sides, the
 * norms NaN, found_inf untouched by finite inputs. */
TEST_F(CudaUnscale, NanInvScaleGivesNan) {
  std::vector<HostTensor> ts = RandomList(30, true, MIXPREC_F32, 70000);
  for (uint32_t bits : {0x7fffffffu, 0xffc00001u}) {
    RunOptions o;
    std::memcpy(&o.inv_scale, &bits, sizeof bits);
    SCOPED_TRACE(::testing::Message() << "inv_scale bits 0x" << std::hex << bits);
    const Outputs cpu = RunCpu(ts, o);
    const Outputs gpu = RunGpu(ts, o, stream_);
    ExpectSameResults(ts, cpu, gpu, o);
    EXPECT_EQ(0u, F32Bits(gpu.found_inf));
    for (size_t t = 0; t < ts.size(); t++) {
      for (int64_t i = 0; i < ts[t].numel; i++) {
        if (!IsNanBits(ts[t].dtype, GetBits(ts[t].dtype, gpu.data[t].data(), i))) {
          ADD_FAILURE() << "tensor " << t << " element " << i << " is not NaN";
          break;
        }
      }
      if (ts[t].numel > 0) {
        EXPECT_TRUE(std::isnan(gpu.norms[t])) << t;
      }
    }
    EXPECT_TRUE(std::isnan(gpu.total));
  }
}

TEST_F(CudaUnscale, FoundInfIsOnlyEverSetToOne) {
  std::vector<HostTensor> ts = RandomList(10, true, MIXPREC_F32, 3000);
  RunOptions o;
  o.found_inf_init = 2.0f;
  Outputs gpu = RunGpu(ts, o, stream_);
  EXPECT_EQ(2.0f, gpu.found_inf);
  CompareWithCpu(ts, o);
  ts[3] = MakeTensor(MIXPREC_F16, 100, 1);
  FillRandom(ts[3], rng_);
  SetBits(MIXPREC_F16, ts[3].bytes.data(), 50, 0x7c00u);
  gpu = RunGpu(ts, o, stream_);
  EXPECT_EQ(1.0f, gpu.found_inf);
  CompareWithCpu(ts, o);
}

TEST_F(CudaUnscale, NormsAreDeterministic) {
  std::vector<HostTensor> ts = RandomList(1500, true, MIXPREC_F32, 20000);
  ts.push_back(MakeTensor(MIXPREC_BF16, 3000001, 5));
  FillRandom(ts.back(), rng_);
  const Outputs a = RunGpu(ts, RunOptions(), stream_);
  const Outputs b = RunGpu(ts, RunOptions(), stream_);
  ASSERT_EQ(MIXPREC_OK, a.status);
  for (size_t i = 0; i < ts.size(); i++)
    ASSERT_EQ(F32Bits(a.norms[i]), F32Bits(b.norms[i])) << "tensor " << i;
  EXPECT_EQ(F32Bits(a.total), F32Bits(b.total));
  ExpectSameResults(ts, RunCpu(ts, RunOptions()), a, RunOptions());
}

TEST_F(CudaUnscale, EitherNormOutputAlone) {
  std::vector<HostTensor> ts = RandomList(40, true, MIXPREC_F32, 30000);
  RunOptions only_norms;
  only_norms.total = false;
  CompareWithCpu(ts, only_norms);
  RunOptions only_total;
  only_total.norms = false;
  CompareWithCpu(ts, only_total);
  RunOptions neither;
  neither.norms = neither.total = false;
  CompareWithCpu(ts, neither);
  const Outputs gpu = RunGpu(ts, neither, stream_);
  EXPECT_TRUE(std::isnan(gpu.total));
}

TEST_F(CudaUnscale, CapturesIntoAGraph) {
  std::vector<HostTensor> ts = RandomList(1300, true, MIXPREC_F32, 9000);
  ts[700] = MakeTensor(MIXPREC_BF16, 40000, 3);
  FillRandom(ts[700], rng_);
  SetBits(MIXPREC_BF16, ts[700].bytes.data(), 39999, 0x7fc0u);
  const Outputs cpu = RunCpu(ts, RunOptions());
  const Outputs gpu = RunGpu(ts, RunOptions(), stream_, true);
  ExpectSameResults(ts, cpu, gpu, RunOptions());
}

TEST_F(CudaUnscale, TensorOver2Pow31Elements) {
  const int64_t n = ((int64_t)1 << 31) + 16384 * 3 + 4099;
  size_t free_b = 0, total_b = 0;
  ASSERT_EQ(cudaSuccess, cudaMemGetInfo(&free_b, &total_b));
  if (free_b < (size_t)n * 2 + ((size_t)1 << 30)) GTEST_SKIP() << "not enough device memory";
  std::vector<HostTensor> ts;
  try {
    ts.push_back(MakeTensor(MIXPREC_BF16, n, 1));
    HostTensor pattern = MakeTensor(MIXPREC_BF16, (int64_t)1 << 20, 0);
    FillRandom(pattern, rng_);
    uint8_t *dst = ts[0].bytes.data();
    for (size_t done = 0; done < ts[0].bytes.size(); done += pattern.bytes.size())
      std::memcpy(dst + done, pattern.bytes.data(),
                  std::min(pattern.bytes.size(), ts[0].bytes.size() - done));
    SetBits(MIXPREC_BF16, dst, n - 1, 0x7f80u);
    ts.push_back(MakeTensor(MIXPREC_F16, 1000, 0));
    FillRandom(ts.back(), rng_);
    CompareWithCpu(ts, RunOptions());
  } catch (const std::bad_alloc &) {
    GTEST_SKIP() << "not enough host memory";
  }
}

TEST_F(CudaUnscale, BadArgumentsWriteNothing) {
  DeviceArena arena;
  float *scalars = (float *)arena.Alloc(4 * sizeof(float));
  uint16_t *data = (uint16_t *)arena.Alloc(64 * sizeof(uint16_t));
  ASSERT_NE(scalars, nullptr);
  ASSERT_NE(data, nullptr);
  const float init[4] = {0.5f, 0.0f, -1.0f, -1.0f};
  const uint16_t inf16 = 0x7c00u;
  ASSERT_EQ(cudaSuccess, cudaMemcpy(scalars, init, sizeof init, cudaMemcpyHostToDevice));
  ASSERT_EQ(cudaSuccess, cudaMemset(data, 0, 64 * sizeof(uint16_t)));
  ASSERT_EQ(cudaSuccess, cudaMemcpy(data, &inf16, 2, cudaMemcpyHostToDevice));
  void *ws = arena.Alloc(1024);
  ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
  float *inv = scalars, *found = scalars + 1, *norm = scalars + 2, *total = scalars + 3;

  mixprec_tensor ok = {data, 64, MIXPREC_F16};
  mixprec_tensor bad_numel = {data, -1, MIXPREC_F16};
  mixprec_tensor bad_dtype = {data, 64, (mixprec_dtype)7};
  mixprec_tensor null_data = {nullptr, 64, MIXPREC_F16};
  mixprec_tensor misaligned_f32 = {(uint8_t *)data + 2, 8, MIXPREC_F32};
  mixprec_tensor lists[][2] = {{ok, bad_numel}, {ok, bad_dtype}, {ok, null_data}};
  const mixprec_status want[] = {MIXPREC_ERR_BAD_SIZE, MIXPREC_ERR_BAD_DTYPE,
                                 MIXPREC_ERR_NULL_POINTER};
  for (int i = 0; i < 3; i++) {
    EXPECT_EQ(want[i], mixprec_cuda_unscale(lists[i], 2, inv, found, norm, total, ws, 1024, stream_));
    EXPECT_EQ(-1, mixprec_cuda_unscale_workspace_size(lists[i], 2, 1));
  }
  EXPECT_EQ(MIXPREC_ERR_BAD_SIZE,
            mixprec_cuda_unscale(&ok, -1, inv, found, norm, total, ws, 1024, stream_));
  EXPECT_EQ(MIXPREC_ERR_NULL_POINTER,
            mixprec_cuda_unscale(nullptr, 1, inv, found, norm, total, ws, 1024, stream_));
  EXPECT_EQ(MIXPREC_ERR_NULL_POINTER,
            mixprec_cuda_unscale(&ok, 1, nullptr, found, norm, total, ws, 1024, stream_));
  EXPECT_EQ(MIXPREC_ERR_NULL_POINTER,
            mixprec_cuda_unscale(&ok, 1, inv, nullptr, norm, total, ws, 1024, stream_));
  EXPECT_EQ(MIXPREC_ERR_NULL_POINTER,
            mixprec_cuda_unscale(&ok, 1, inv, found, norm, total, nullptr, 1024, stream_));
  EXPECT_EQ(MIXPREC_ERR_BAD_ARGUMENT,
            mixprec_cuda_unscale(&ok, 1, inv, found, norm, total, ws, 8, stream_));
  EXPECT_EQ(MIXPREC_ERR_BAD_ARGUMENT,
            mixprec_cuda_unscale(&ok, 1, inv, found, norm, total, (uint8_t *)ws + 4, 1000,
                                 stream_));
  /* CUDA-only: a float that is not 4-byte aligned would fault on the device. */
  EXPECT_EQ(MIXPREC_ERR_BAD_ARGUMENT,
            mixprec_cuda_unscale(&misaligned_f32, 1, inv, found, norm, total, ws, 1024, stream_));

  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(stream_));
  float back[4];
  uint16_t first;
  ASSERT_EQ(cudaSuccess, cudaMemcpy(back, scalars, sizeof back, cudaMemcpyDeviceToHost));
  ASSERT_EQ(cudaSuccess, cudaMemcpy(&first, data, 2, cudaMemcpyDeviceToHost));
  EXPECT_EQ(0, std::memcmp(back, init, sizeof back));
  EXPECT_EQ(inf16, first);
}

TEST(CudaUnscaleWorkspace, SizeFollowsTheList) {
  uint8_t dummy[16];
  mixprec_tensor ts[4] = {{dummy, 0, MIXPREC_F32},
                          {dummy, 1, MIXPREC_F16},
                          {dummy, 100000, MIXPREC_BF16},
                          {dummy, (int64_t)1 << 40, MIXPREC_F32}};
  EXPECT_EQ(0, mixprec_cuda_unscale_workspace_size(nullptr, 0, 1));
  EXPECT_EQ(0, mixprec_cuda_unscale_workspace_size(ts, 4, 0));
  const int64_t one = mixprec_cuda_unscale_workspace_size(ts, 2, 1);
  const int64_t all = mixprec_cuda_unscale_workspace_size(ts, 4, 1);
  EXPECT_GE(one, (int64_t)(3 * sizeof(double)));
  EXPECT_EQ(0, one % (int64_t)sizeof(double));
  EXPECT_GT(all, one + (int64_t)(((int64_t)1 << 40) / (1 << 20)) * (int64_t)sizeof(double));
  EXPECT_EQ(-1, mixprec_cuda_unscale_workspace_size(ts, -1, 1));
  EXPECT_EQ(-1, mixprec_cuda_unscale_workspace_size(nullptr, 2, 1));
}

}  // namespace

#endif /* MIXPREC_TEST_CUDA */
