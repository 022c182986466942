// mixprec_cuda_act_pack / _unpack / _act_mask / _act_unpack_norm_relu /
// _act_pool_encode / _act_pool_decode against their CPU twins: codes, scales,
// masks and pool codes byte for byte, unpacked and recomputed values and pool
// indices bit for bit (the format fixes every bit, NaNs
// included: [note: act_pack format]). Built only with CUDA
// (MIXPREC_TEST_CUDA); every test skips itself without a device.
#ifdef MIXPREC_TEST_CUDA

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_util.h"
#include "mixprec/mixprec.h"
#include "test_util.h"

namespace {

using mpt::Buf;
using Dev = mpt::DeviceBuffer;

constexpr mixprec_dtype kDtypes[] = {MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16};

size_t nbytes(const Buf &b) { return size_t(b.numel()) * size_t(Buf::esize(b.dtype())); }

struct Sizes {
  int64_t code_bytes = 0, n_scales = 0;
};

Sizes packed_size(int64_t n, int64_t bits, int64_t block) {
  Sizes s;
  EXPECT_EQ(mixprec_act_packed_size(n, bits, block, &s.code_bytes, &s.n_scales), MIXPREC_OK);
  return s;
}

// The tensors the tests pack.
enum class Data {
  kSigned,  // signed values, a range per 64-element stretch, zeros, -0, subnormals
  kRelu,    // the same after a ReLU: only +0, -0 and positive values (zero point 0)
  kLeaky,   // the same after a LeakyReLU(0.01): lopsided blocks (zero point near 0)
  kBits,    // mpt::fill_random: random finite bit patterns and extremes
};

const char *data_name(Data d) {
  switch (d) {
    case Data::kSigned: return "signed";
    case Data::kRelu: return "relu";
    case Data::kLeaky: return "leaky";
    case Data::kBits: return "bits";
  }
  return "?";
}

Buf make(mixprec_dtype dt, int64_t n, Data kind, std::mt19937 &rng) {
  Buf b(dt, n);
  if (kind == Data::kBits) {
    mpt::fill_random(b, rng);
    return b;
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pct(0, 99), expo(-20, 12);
  int e = 0;
  for (int64_t i = 0; i < n; i++) {
    if (i % 64 == 0) e = expo(rng);
    const int k = pct(rng);
    float v;
    if (k < 10) v = 0.0f;
    else if (k < 13) v = -0.0f;
    else if (k < 15) v = std::ldexp(normal(rng), -140);  // subnormal in F32 and BF16
    else v = std::ldexp(normal(rng), e);
    if (kind == Data::kRelu && !(v > 0.0f)) v = (k & 1) ? 0.0f : -0.0f;
    if (kind == Data::kLeaky && v < 0.0f) v *= 0.01f;
    b.set_value(i, v);
  }
  return b;
}

uint32_t nan_bits(mixprec_dtype dt) {  // a NaN with a payload and, for BF16, the sign
  return dt == MIXPREC_F32 ? 0x7fc00123u : dt == MIXPREC_F16 ? 0x7e01u : 0xffc1u;
}
uint32_t inf_bits(mixprec_dtype dt, bool neg) {
  const uint32_t u = dt == MIXPREC_F32 ? 0x7f800000u : dt == MIXPREC_F16 ? 0x7c00u : 0x7f80u;
  return neg ? u | (dt == MIXPREC_F32 ? 0x80000000u : 0x8000u) : u;
}

// A NaN in block 1, +inf in block 2, -inf in the last block (when there are
// that many): those blocks pack to NaN scales and zero codes.
void add_nonfinite(Buf &b, int64_t block) {
  const int64_t n = b.numel();
  if (n > block) b.set_raw(block + 3 < n ? block + 3 : n - 1, nan_bits(b.dtype()));
  if (n > 2 * block) b.set_raw(2 * block, inf_bits(b.dtype(), false));
  if (n > 3 * block) b.set_raw(n - 1, inf_bits(b.dtype(), true));
}

// Bytes that differ (at most a few reported).
int64_t count_byte_mismatches(const std::vector<uint8_t> &got, const std::vector<uint8_t> &want,
                              const std::string &what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); i++)
    if (got[i] != want[i] && bad++ < 5)
      ADD_FAILURE() << what << ": code byte " << i << " of " << want.size() << " got 0x" << std::hex
                    << int(got[i]) << " want 0x" << int(want[i]) << std::dec;
  return bad;
}

int64_t count_scale_mismatches(const std::vector<float> &got, const std::vector<float> &want,
                               const std::string &what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); i++)
    if (mpt::f32_bits(got[i]) != mpt::f32_bits(want[i]) && bad++ < 5)
      ADD_FAILURE() << what << ": scale " << i << " of " << want.size() << " got 0x" << std::hex
                    << mpt::f32_bits(got[i]) << " want 0x" << mpt::f32_bits(want[i]) << std::dec;
  return bad;
}

// Unpacked elements whose bits differ (NaNs too: the format fixes them).
int64_t count_value_mismatches(const Buf &got, const Buf &want, const std::string &what) {
  int64_t bad = 0;
  for (int64_t i = 0; i < want.numel(); i++)
    if (got.raw(i) != want.raw(i) && bad++ < 5)
      ADD_FAILURE() << what << ": element " << i << " of " << want.numel() << " ("
                    << mpt::dtype_name(want.dtype()) << ") got 0x" << std::hex << got.raw(i)
                    << " want 0x" << want.raw(i) << std::dec;
  return bad;
}

class ActPackCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!mpt::HaveDevice()) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // Unpacks the packed tensor (host codes and scales) to every dtype on the
  // CPU and on the GPU and compares the bits.
  void check_unpack(const std::vector<uint8_t> &codes, const std::vector<float> &scales, int64_t n,
                    int64_t bits, int64_t block, const std::string &what) {
    Dev dc(codes.data(), codes.size()), ds(scales.data(), scales.size() * sizeof(float));
    for (mixprec_dtype od : kDtypes) {
      const std::string w = what + " unpack to " + mpt::dtype_name(od);
      Buf cpu(od, n), gpu(od, n);
      ASSERT_EQ(mixprec_act_unpack(codes.data(), scales.data(), n, bits, block, cpu.data(), od),
                MIXPREC_OK)
          << w;
      Dev dout(nbytes(gpu));
      ASSERT_EQ(cudaMemsetAsync(dout.p, 0xa5, dout.bytes, stream_), cudaSuccess);
      ASSERT_EQ(mixprec_cuda_act_unpack(static_cast<const uint8_t *>(dc.p),
                                        static_cast<const float *>(ds.p), n, bits, block, dout.p,
                                        od, stream_),
                MIXPREC_OK)
          << w;
      ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess) << w;
      dout.to_host(gpu.data());
      EXPECT_EQ(count_value_mismatches(gpu, cpu, w), 0) << w;
    }
  }

  // Packs x on the CPU and the GPU (codes and scales poisoned first: both
  // must be written whole), compares them, then the unpacks of the CPU's.
  void check(Buf &x, int64_t bits, int64_t block, uint64_t seed, const std::string &what) {
    const int64_t n = x.numel();
    const Sizes sz = packed_size(n, bits, block);
    std::vector<uint8_t> codes(size_t(sz.code_bytes), 0xa5), gcodes(codes.size());
    std::vector<float> scales(size_t(sz.n_scales), 1234.5f), gscales(scales.size());
    ASSERT_EQ(mixprec_act_pack(x.data(), x.dtype(), n, bits, block, seed, codes.data(),
                               scales.data()),
              MIXPREC_OK)
        << what;
    Dev dx(x.data(), nbytes(x)), dc(codes.size()), ds(scales.size() * sizeof(float));
    ASSERT_EQ(cudaMemsetAsync(dc.p, 0x5a, dc.bytes, stream_), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(ds.p, 0x5a, ds.bytes, stream_), cudaSuccess);
    ASSERT_EQ(mixprec_cuda_act_pack(dx.p, x.dtype(), n, bits, block, seed,
                                    static_cast<uint8_t *>(dc.p), static_cast<float *>(ds.p),
                                    stream_),
              MIXPREC_OK)
        << what;
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess) << what;
    dc.to_host(gcodes.data());
    ds.to_host(gscales.data());
    EXPECT_EQ(count_byte_mismatches(gcodes, codes, what), 0) << what;
    EXPECT_EQ(count_scale_mismatches(gscales, scales, what), 0) << what;
    check_unpack(codes, scales, n, bits, block, what);
  }

  cudaStream_t stream_ = nullptr;
};

class ActPackCuda : public ActPackCudaTest,
                    public ::testing::WithParamInterface<std::tuple<mixprec_dtype, int>> {};

// Every block size, sizes around and between block multiples (odd ones for
// the last nibble), signed / ReLU / LeakyReLU / random-bits data, with and
// without non-finite blocks, two seeds (one with high bits set).
TEST_P(ActPackCuda, PackAndUnpackMatchCpu) {
  const mixprec_dtype dt = std::get<0>(GetParam());
  const int64_t bits = std::get<1>(GetParam());
  std::mt19937 rng(mpt::kSeed + 71 + 10 * uint32_t(dt) + uint32_t(bits));
  for (int64_t block : {32, 256, 4096}) {
    const int64_t sizes[] = {1, 31, block - 1, block, block + 1, 2 * block + 10, 3 * block + 17,
                             7 * block - 3, 100003};
    for (int64_t n : sizes)
      for (Data kind : {Data::kSigned, Data::kRelu, Data::kLeaky, Data::kBits})
        for (int nonfinite = 0; nonfinite < 2; nonfinite++) {
          Buf x = make(dt, n, kind, rng);
          if (nonfinite) add_nonfinite(x, block);
          const uint64_t seed = (n & 1) ? 0x0123456789abcdefull : 42u;
          const std::string what = std::string(mpt::dtype_name(dt)) + " bits " +
                                   std::to_string(bits) + " block " + std::to_string(block) +
                                   " n " + std::to_string(n) + " " + data_name(kind) +
                                   (nonfinite ? " +nan/inf" : "");
          check(x, bits, block, seed, what);
          if (HasFatalFailure()) return;
        }
  }
}

// Special blocks: all zeros (the smallest scale), all -0 (zero point 0),
// one tiny value among zeros, a block of equal negative values, the largest
// finite magnitudes of both signs, positives with one tiny or one large
// negative (zero point at either end), a block that is all NaN.
TEST_P(ActPackCuda, SpecialBlocksMatchCpu) {
  const mixprec_dtype dt = std::get<0>(GetParam());
  const int64_t bits = std::get<1>(GetParam()), block = 32;
  const int64_t n = 8 * block + 5;
  Buf x(dt, n);
  const uint32_t neg_zero = dt == MIXPREC_F32 ? 0x80000000u : 0x8000u;
  const uint32_t max_finite =
      dt == MIXPREC_F32 ? 0x7f7fffffu : dt == MIXPREC_F16 ? 0x7bffu : 0x7f7fu;
  for (int64_t i = 0; i < n; i++) {
    const int64_t b = i / block, j = i % block;
    switch (b) {
      case 0: x.set_raw(i, 0u); break;
      case 1: x.set_raw(i, neg_zero); break;
      case 2: x.set_raw(i, j == 7 ? 1u : 0u); break;  // the dtype's smallest subnormal
      case 3: x.set_value(i, -3.0f); break;
      case 4: x.set_raw(i, (j & 1) ? max_finite : max_finite | neg_zero); break;
      case 5: x.set_value(i, j == 9 ? -0.001f : 1.0f + float(j)); break;
      case 6: x.set_value(i, j == 9 ? -1000.0f : 1.0f + float(j)); break;
      default: x.set_raw(i, nan_bits(dt)); break;
    }
  }
  check(x, bits, block, 7u, std::string(mpt::dtype_name(dt)) + " special blocks");
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<mixprec_dtype, int>> &info) {
  return std::string(mpt::dtype_name(std::get<0>(info.param))) + "_bits" +
         std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(DtypesBits, ActPackCuda,
                         ::testing::Combine(::testing::Values(MIXPREC_F32, MIXPREC_F16,
                                                              MIXPREC_BF16),
                                            ::testing::Values(8, 4)),
                         param_name);

// Any code and scale bits are valid input: random codes with random scale
// bits (NaN, inf, negative, subnormal, huge) unpack to the CPU's bits.
TEST_F(ActPackCudaTest, UnpackOfArbitraryBitsMatchesCpu) {
  std::mt19937 rng(mpt::kSeed + 73);
  std::uniform_int_distribution<uint32_t> u32;
  for (int64_t bits : {8, 4})
    for (int64_t block : {32, 4096}) {
      const int64_t n = 3 * block + 33;
      const Sizes sz = packed_size(n, bits, block);
      for (int rep = 0; rep < 4; rep++) {
        std::vector<uint8_t> codes(size_t(sz.code_bytes));
        for (uint8_t &c : codes) c = uint8_t(u32(rng));
        std::vector<float> scales(size_t(sz.n_scales));
        for (float &s : scales) {
          uint32_t u = u32(rng);
          if (rep == 1) u &= 0x807fffffu;                      // subnormal or zero
          if (rep == 2) u = (u & 0x80000000u) | 0x7f000000u | (u & 0x7fffffu);  // huge
          s = mpt::f32_from_bits(u);
        }
        if (rep == 3) {
          scales[0] = mpt::f32_from_bits(0x7f800000u);
          scales[1] = mpt::f32_from_bits(0xff812345u);
        }
        check_unpack(codes, scales, n, bits, block,
                     "arbitrary bits " + std::to_string(bits) + "/" + std::to_string(block) +
                         " rep " + std::to_string(rep));
      }
    }
}

// More quantisation blocks than the capped grid has warps (65535 * 8): the
// grid-stride loop.
TEST_F(ActPackCudaTest, GridStrideMatchesCpu) {
  std::mt19937 rng(mpt::kSeed + 79);
  const int64_t block = 32, n = (int64_t(65535) * 8 + 1000) * block + 7;
  Buf x = make(MIXPREC_BF16, n, Data::kSigned, rng);
  check(x, 4, block, 99u, "grid stride");
}

// Pack then unpack captured in a CUDA graph and replayed: the same bits as
// the eager CPU calls.
TEST_F(ActPackCudaTest, GraphCaptureMatchesCpu) {
  std::mt19937 rng(mpt::kSeed + 83);
  const int64_t n = 5 * 256 + 3, bits = 4, block = 256;
  Buf x = make(MIXPREC_F16, n, Data::kSigned, rng);
  const Sizes sz = packed_size(n, bits, block);
  std::vector<uint8_t> codes(size_t(sz.code_bytes)), gcodes(codes.size());
  std::vector<float> scales(size_t(sz.n_scales)), gscales(scales.size());
  ASSERT_EQ(mixprec_act_pack(x.data(), MIXPREC_F16, n, bits, block, 5u, codes.data(),
                             scales.data()),
            MIXPREC_OK);
  Buf want(MIXPREC_F16, n), got(MIXPREC_F16, n);
  ASSERT_EQ(mixprec_act_unpack(codes.data(), scales.data(), n, bits, block, want.data(),
                               MIXPREC_F16),
            MIXPREC_OK);
  Dev dx(x.data(), nbytes(x)), dc(codes.size()), ds(scales.size() * sizeof(float)),
      dout(nbytes(got));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  const mixprec_status st1 =
      mixprec_cuda_act_pack(dx.p, MIXPREC_F16, n, bits, block, 5u, static_cast<uint8_t *>(dc.p),
                            static_cast<float *>(ds.p), stream_);
  const mixprec_status st2 = mixprec_cuda_act_unpack(
      static_cast<const uint8_t *>(dc.p), static_cast<const float *>(ds.p), n, bits, block,
      dout.p, MIXPREC_F16, stream_);
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
  EXPECT_EQ(st1, MIXPREC_OK);
  EXPECT_EQ(st2, MIXPREC_OK);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int rep = 0; rep < 2; rep++) ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  dc.to_host(gcodes.data());
  ds.to_host(gscales.data());
  dout.to_host(got.data());
  EXPECT_EQ(count_byte_mismatches(gcodes, codes, "graph"), 0);
  EXPECT_EQ(count_scale_mismatches(gscales, scales, "graph"), 0);
  EXPECT_EQ(count_value_mismatches(got, want, "graph"), 0);
}

// The CPU's status for every bad argument (before anything is launched:
// the outputs keep their poison), n == 0 with NULL pointers, and
// misaligned x / out / scales refused with MIXPREC_ERR_BAD_ARGUMENT.
TEST_F(ActPackCudaTest, StatusesMatchCpu) {
  const int64_t n = 100;
  const mixprec_dtype bad_dtype = static_cast<mixprec_dtype>(3);  // in the enum's range, unknown
  std::vector<float> hx(n + 1, 1.0f), hscales(8), hout(n + 1);
  std::vector<uint8_t> hcodes(n + 8);
  Dev dx(hx.data(), hx.size() * sizeof(float)), dcodes(hcodes.size()), dscales(16 * sizeof(float)),
      dout((n + 1) * sizeof(float));
  std::vector<uint8_t> poison(hcodes.size(), 0x77);
  ASSERT_EQ(cudaMemcpy(dcodes.p, poison.data(), poison.size(), cudaMemcpyHostToDevice),
            cudaSuccess);

  struct Case {
    const char *what;
    bool null_data, null_codes, null_scales;
    mixprec_dtype dtype;
    int64_t n, bits, block;
  };
  const Case cases[] = {
      {"n < 0", false, false, false, MIXPREC_F32, -1, 8, 256},
      {"bits 6", false, false, false, MIXPREC_F32, n, 6, 256},
      {"bits 0", false, false, false, MIXPREC_F32, n, 0, 256},
      {"block 16", false, false, false, MIXPREC_F32, n, 8, 16},
      {"block 48", false, false, false, MIXPREC_F32, n, 8, 48},
      {"block 8192", false, false, false, MIXPREC_F32, n, 4, 8192},
      {"block 0", false, false, false, MIXPREC_F32, n, 4, 0},
      {"bad dtype", false, false, false, bad_dtype, n, 8, 32},
      {"NULL data", true, false, false, MIXPREC_F32, n, 8, 32},
      {"NULL codes", false, true, false, MIXPREC_F32, n, 8, 32},
      {"NULL scales", false, false, true, MIXPREC_F32, n, 8, 32},
      {"n < 0 and bad bits", false, false, false, MIXPREC_F32, -5, 3, 32},
      {"bad bits and dtype", false, false, false, bad_dtype, n, 3, 32},
      {"bad dtype and NULL", true, false, false, bad_dtype, n, 8, 32},
      {"n 0 all NULL", true, true, true, MIXPREC_F32, 0, 8, 32},
      {"n 0 bad bits", true, true, true, MIXPREC_F32, 0, 5, 32},
  };
  for (const Case &c : cases) {
    const mixprec_status cpu_pack = mixprec_act_pack(
        c.null_data ? nullptr : hx.data(), c.dtype, c.n, c.bits, c.block, 1u,
        c.null_codes ? nullptr : hcodes.data(), c.null_scales ? nullptr : hscales.data());
    const mixprec_status gpu_pack = mixprec_cuda_act_pack(
        c.null_data ? nullptr : dx.p, c.dtype, c.n, c.bits, c.block, 1u,
        c.null_codes ? nullptr : static_cast<uint8_t *>(dcodes.p),
        c.null_scales ? nullptr : static_cast<float *>(dscales.p), stream_);
    EXPECT_EQ(gpu_pack, cpu_pack) << "pack: " << c.what;
    const mixprec_status cpu_unpack = mixprec_act_unpack(
        c.null_codes ? nullptr : hcodes.data(), c.null_scales ? nullptr : hscales.data(), c.n,
        c.bits, c.block, c.null_data ? nullptr : hout.data(), c.dtype);
    const mixprec_status gpu_unpack = mixprec_cuda_act_unpack(
        c.null_codes ? nullptr : static_cast<const uint8_t *>(dcodes.p),
        c.null_scales ? nullptr : static_cast<const float *>(dscales.p), c.n, c.bits, c.block,
        c.null_data ? nullptr : dout.p, c.dtype, stream_);
    EXPECT_EQ(gpu_unpack, cpu_unpack) << "unpack: " << c.what;
    if (c.n != 0) {
      EXPECT_NE(cpu_pack, MIXPREC_OK) << c.what;
      EXPECT_NE(cpu_unpack, MIXPREC_OK) << c.what;
    }
  }

  // Misaligned pointers (the CPU takes them; a device access would fault).
  uint8_t *codes = static_cast<uint8_t *>(dcodes.p);
  float *scales = static_cast<float *>(dscales.p);
  char *x = static_cast<char *>(dx.p), *out = static_cast<char *>(dout.p);
  for (mixprec_dtype dt : kDtypes)
    for (int64_t bits : {8, 4}) {
      const std::string w = std::string(mpt::dtype_name(dt)) + " bits " + std::to_string(bits);
      EXPECT_EQ(mixprec_cuda_act_pack(x + 1, dt, n, bits, 32, 1u, codes, scales, stream_),
                MIXPREC_ERR_BAD_ARGUMENT)
          << w << " x + 1";
      EXPECT_EQ(mixprec_cuda_act_unpack(codes, scales, n, bits, 32, out + 1, dt, stream_),
                MIXPREC_ERR_BAD_ARGUMENT)
          << w << " out + 1";
      if (dt == MIXPREC_F32) {
        EXPECT_EQ(mixprec_cuda_act_pack(x + 2, dt, n, bits, 32, 1u, codes, scales, stream_),
                  MIXPREC_ERR_BAD_ARGUMENT)
            << w << " x + 2";
        EXPECT_EQ(mixprec_cuda_act_unpack(codes, scales, n, bits, 32, out + 2, dt, stream_),
                  MIXPREC_ERR_BAD_ARGUMENT)
            << w << " out + 2";
      }
      float *bad_scales = reinterpret_cast<float *>(reinterpret_cast<char *>(scales) + 2);
      EXPECT_EQ(mixprec_cuda_act_pack(x, dt, n, bits, 32, 1u, codes, bad_scales, stream_),
                MIXPREC_ERR_BAD_ARGUMENT)
          << w << " scales + 2";
      EXPECT_EQ(mixprec_cuda_act_unpack(codes, bad_scales, n, bits, 32, out, dt, stream_),
                MIXPREC_ERR_BAD_ARGUMENT)
          << w << " scales + 2";
      // Codes need no alignment: codes + 1 is fine.
      EXPECT_EQ(mixprec_cuda_act_pack(x, dt, n, bits, 32, 1u, codes + 1, scales, stream_),
                MIXPREC_OK)
          << w << " codes + 1";
    }
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  // Only the codes + 1 calls wrote codes: byte 0 keeps its poison.
  uint8_t first = 0;
  ASSERT_EQ(cudaMemcpy(&first, dcodes.p, 1, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(first, 0x77);
}


// ---- [note: norm_relu recompute]: act_mask / act_unpack_norm_relu ----------

int64_t mask_bytes(int64_t n) { return n / 8 + (n % 8 != 0); }

// Mask bytes as the CPU's against the GPU's: the first mask_bytes(n) equal,
// the poisoned bytes after them untouched.
void expect_mask_equal(const std::vector<uint8_t> &got, const std::vector<uint8_t> &want,
                       int64_t n, uint8_t poison, const std::string &what) {
  const size_t nb = size_t(mask_bytes(n));
  ASSERT_GE(got.size(), nb) << what;
  EXPECT_EQ(count_byte_mismatches(std::vector<uint8_t>(got.begin(), got.begin() + long(nb)), want,
                                  what + " mask"),
            0)
      << what;
  for (size_t i = nb; i < got.size(); i++)
    if (got[i] != poison) {
      ADD_FAILURE() << what << ": byte " << i << " after the mask's " << nb << " was written";
      break;
    }
}

// Every special class of each dtype: +-0, +-inf, NaNs of both signs, the
// smallest and largest subnormals and normals of both signs.
std::vector<uint32_t> special_bits(mixprec_dtype dt) {
  if (dt == MIXPREC_F32)
    return {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u,
            0x7f800001u, 0xff800001u, 0x7fffffffu, 0xffffffffu, 0x00000001u, 0x80000001u,
            0x007fffffu, 0x807fffffu, 0x00800000u, 0x80800000u, 0x7f7fffffu, 0xff7fffffu,
            0x3f800000u, 0xbf800000u};
  if (dt == MIXPREC_F16)
    return {0x0000u, 0x8000u, 0x7c00u, 0xfc00u, 0x7e00u, 0xfe00u, 0x7c01u, 0xfc01u,
            0x7fffu, 0xffffu, 0x0001u, 0x8001u, 0x03ffu, 0x83ffu, 0x0400u, 0x8400u,
            0x7bffu, 0xfbffu, 0x3c00u, 0xbc00u};
  return {0x0000u, 0x8000u, 0x7f80u, 0xff80u, 0x7fc0u, 0xffc0u, 0x7f81u, 0xff81u,
          0x7fffu, 0xffffu, 0x0001u, 0x8001u, 0x007fu, 0x807fu, 0x0080u, 0x8080u,
          0x7f7fu, 0xff7fu, 0x3f80u, 0xbf80u};
}

class ActMaskCuda : public ActPackCudaTest,
                    public ::testing::WithParamInterface<mixprec_dtype> {
 protected:
  // The mask of x on the CPU and on the GPU (poisoned, 4 bytes to spare).
  // On the device x is followed by 8 positive elements, which must not show
  // in the last byte's unused bits.
  void check_mask(Buf &x, const std::string &what) {
    const int64_t n = x.numel();
    std::vector<uint8_t> want(size_t(mask_bytes(n)), 0x3c), got(size_t(mask_bytes(n)) + 4);
    ASSERT_EQ(mixprec_act_mask(x.data(), x.dtype(), n, want.data()), MIXPREC_OK) << what;
    Buf padded(x.dtype(), n + 8);
    for (int64_t i = 0; i < n + 8; i++) {
      if (i < n) padded.set_raw(i, x.raw(i));
      else padded.set_value(i, 1.0f);
    }
    Dev dx(padded.data(), nbytes(padded)), dm(got.size());
    ASSERT_EQ(cudaMemsetAsync(dm.p, 0xa5, dm.bytes, stream_), cudaSuccess);
    ASSERT_EQ(mixprec_cuda_act_mask(dx.p, x.dtype(), n, static_cast<uint8_t *>(dm.p), stream_),
              MIXPREC_OK)
        << what;
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess) << what;
    dm.to_host(got.data());
    expect_mask_equal(got, want, n, 0xa5, what);
  }
};

// Sizes around multiples of 8, random finite bits with the special classes
// sprinkled in (so some bytes mix them), and every 16-bit pattern.
TEST_P(ActMaskCuda, MatchesCpu) {
  const mixprec_dtype dt = GetParam();
  std::mt19937 rng(mpt::kSeed + 89 + uint32_t(dt));
  const std::vector<uint32_t> specials = special_bits(dt);
  std::uniform_int_distribution<size_t> pick(0, specials.size() - 1);
  for (int64_t n : {1, 2, 7, 8, 9, 15, 16, 17, 63, 255, 257, 1001, 4099, 100003}) {
    Buf x(dt, n);
    mpt::fill_random(x, rng);
    for (int64_t i = 0; i < n; i++)
      if (rng() % 4 == 0) x.set_raw(i, specials[pick(rng)]);
    check_mask(x, std::string(mpt::dtype_name(dt)) + " n " + std::to_string(n));
    if (HasFatalFailure()) return;
  }
  // Every special at every bit position of a byte.
  {
    const int64_t n = int64_t(specials.size()) * 8 + 3;
    Buf x(dt, n);
    for (int64_t i = 0; i < n; i++) x.set_raw(i, specials[size_t(i / 8 + i) % specials.size()]);
    check_mask(x, std::string(mpt::dtype_name(dt)) + " specials");
  }
  // Every 16-bit pattern (for F32, the same patterns in the high half and
  // in the low half).
  {
    const int64_t n = 65536 + 5;
    Buf x(dt, n);
    for (int64_t i = 0; i < n; i++) {
      const uint32_t h = uint32_t(i & 0xffff);
      x.set_raw(i, dt == MIXPREC_F32 ? ((i & 1) ? h << 16 : h | (h << 16)) : h);
    }
    check_mask(x, std::string(mpt::dtype_name(dt)) + " all 16-bit patterns");
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ActMaskCuda,
                         ::testing::Values(MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16),
                         [](const ::testing::TestParamInfo<mixprec_dtype> &info) {
                           return std::string(mpt::dtype_name(info.param));
                         });

// A BatchNorm's a (= weight * invstd) and b (= bias - mean * a) for
// `channels` channels; with `special`, channel 1 has a = +inf, channel 2
// b = NaN, channel 3 a = 1e6 (an F16 output overflows), channel 4 a = 0 and
// b tiny (kept elements below the dtype's smallest normal), channel 5
// b = -inf.
void make_affine(int64_t channels, bool special, std::mt19937 &rng, std::vector<float> &a,
                 std::vector<float> &b) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  a.assign(size_t(channels), 0.0f);
  b.assign(size_t(channels), 0.0f);
  for (int64_t c = 0; c < channels; c++) {
    a[size_t(c)] = std::ldexp(normal(rng), int(rng() % 9) - 4);
    b[size_t(c)] = normal(rng);
  }
  if (!special) return;
  if (channels > 1) a[1] = std::numeric_limits<float>::infinity();
  if (channels > 2) b[2] = std::numeric_limits<float>::quiet_NaN();
  if (channels > 3) a[3] = 1e6f;
  if (channels > 4) {
    a[4] = 0.0f;
    b[4] = 1e-30f;
  }
  if (channels > 5) b[5] = -std::numeric_limits<float>::infinity();
}

// The recompute of (codes, scales) with a, b and mask on the CPU and the
// GPU (output poisoned: every element must be written), bit for bit.
void check_norm_relu(cudaStream_t stream, const std::vector<uint8_t> &codes,
                     const std::vector<float> &scales, int64_t n, int64_t bits, int64_t block, const std::vector<float> &a,
                     const std::vector<float> &b, int64_t inner,
                     const std::vector<uint8_t> &mask, mixprec_dtype od,
                     const std::string &what) {
  const int64_t channels = int64_t(a.size());
  Buf cpu(od, n), gpu(od, n);
  ASSERT_EQ(mixprec_act_unpack_norm_relu(codes.data(), scales.data(), n, bits, block, a.data(),
                                         b.data(), channels, inner, mask.data(), cpu.data(),
                                         od),
            MIXPREC_OK)
      << what;
  Dev dc(codes.data(), codes.size()), ds(scales.data(), scales.size() * sizeof(float)),
      da(a.data(), a.size() * sizeof(float)), db(b.data(), b.size() * sizeof(float)),
      dm(mask.data(), mask.size()), dout(nbytes(gpu));
  ASSERT_EQ(cudaMemsetAsync(dout.p, 0xa5, dout.bytes, stream), cudaSuccess);
  ASSERT_EQ(mixprec_cuda_act_unpack_norm_relu(
                static_cast<const uint8_t *>(dc.p), static_cast<const float *>(ds.p), n, bits,
                block, static_cast<const float *>(da.p), static_cast<const float *>(db.p),
                channels, inner, static_cast<const uint8_t *>(dm.p), dout.p, od, stream),
            MIXPREC_OK)
      << what;
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess) << what;
  dout.to_host(gpu.data());
  EXPECT_EQ(count_value_mismatches(gpu, cpu, what), 0) << what;
}

class NormReluCuda : public ActPackCudaTest,
                     public ::testing::WithParamInterface<std::tuple<mixprec_dtype, int>> {};

// Packed BatchNorm inputs (signed data with zeros, -0, subnormals, a NaN /
// +inf / -inf block), random masks (bits past n random too), NCHW-like
// inner = 7 * 7 and inner = 1 with 3 to 64 channels, sizes that are not
// multiples of 8, of the block or of channels * inner; plain and special
// a / b. Output dtype = packed dtype, as the torch face uses it, and F32.
TEST_P(NormReluCuda, MatchesCpu) {
  const mixprec_dtype dt = std::get<0>(GetParam());
  const int64_t bits = std::get<1>(GetParam());
  std::mt19937 rng(mpt::kSeed + 97 + 10 * uint32_t(dt) + uint32_t(bits));
  struct Shape {
    int64_t channels, inner, n;
  };
  const Shape shapes[] = {
      {3, 49, 3 * 49 * 5},        {7, 49, 7 * 49 * 3},  {64, 49, 64 * 49 * 2 + 13},
      {3, 1, 1001},               {17, 1, 17 * 61},     {64, 1, 64 * 33 + 5},
      {5, 7, 1},                  {5, 7, 9},            {6, 3, 31},
  };
  for (int64_t block : {32, 256})
    for (const Shape &sh : shapes)
      for (int special = 0; special < 2; special++) {
        const int64_t n = sh.n;
        Buf x = make(dt, n, Data::kSigned, rng);
        if (special) add_nonfinite(x, block);
        const Sizes sz = packed_size(n, bits, block);
        std::vector<uint8_t> codes(size_t(sz.code_bytes));
        std::vector<float> scales(size_t(sz.n_scales));
        ASSERT_EQ(mixprec_act_pack(x.data(), dt, n, bits, block, 11u + uint64_t(n), codes.data(),
                                   scales.data()),
                  MIXPREC_OK);
        std::vector<float> a, b;
        make_affine(sh.channels, special != 0, rng, a, b);
        std::vector<uint8_t> mask(size_t(mask_bytes(n)));
        for (uint8_t &m : mask) m = uint8_t(rng());
        for (mixprec_dtype od : {dt, MIXPREC_F32}) {
          if (od == MIXPREC_F32 && dt == MIXPREC_F32 && special) continue;
          const std::string what = std::string(mpt::dtype_name(dt)) + "->" +
                                   mpt::dtype_name(od) + " bits " + std::to_string(bits) +
                                   " block " + std::to_string(block) + " C " +
                                   std::to_string(sh.channels) + " inner " +
                                   std::to_string(sh.inner) + " n " + std::to_string(n) +
                                   (special ? " special" : "");
          check_norm_relu(stream_, codes, scales, n, bits, block, a, b, sh.inner, mask, od, what);
          if (HasFatalFailure()) return;
        }
      }
}

// The mask of a real ReLU(BatchNorm) output, as the torch face makes it:
// every kept element must come back positive, every other +0.
TEST_P(NormReluCuda, MaskOfReluOutputMatchesCpu) {
  const mixprec_dtype dt = std::get<0>(GetParam());
  const int64_t bits = std::get<1>(GetParam()), block = 256, channels = 16, inner = 49;
  const int64_t n = channels * inner * 3 + 7;
  std::mt19937 rng(mpt::kSeed + 101 + 10 * uint32_t(dt) + uint32_t(bits));
  Buf x = make(dt, n, Data::kSigned, rng);
  std::vector<float> a, b;
  make_affine(channels, false, rng, a, b);
  Buf y(dt, n);
  for (int64_t i = 0; i < n; i++) {
    const size_t c = size_t((i / inner) % channels);
    y.set_value(i, x.value(i) * a[c] + b[c]);
  }
  std::vector<uint8_t> mask(size_t(mask_bytes(n)));
  ASSERT_EQ(mixprec_act_mask(y.data(), dt, n, mask.data()), MIXPREC_OK);
  const Sizes sz = packed_size(n, bits, block);
  std::vector<uint8_t> codes(size_t(sz.code_bytes));
  std::vector<float> scales(size_t(sz.n_scales));
  ASSERT_EQ(mixprec_act_pack(x.data(), dt, n, bits, block, 3u, codes.data(), scales.data()),
            MIXPREC_OK);
  check_norm_relu(stream_, codes, scales, n, bits, block, a, b, inner, mask, dt,
                  std::string(mpt::dtype_name(dt)) + " relu mask");
}

INSTANTIATE_TEST_SUITE_P(DtypesBits, NormReluCuda,
                         ::testing::Combine(::testing::Values(MIXPREC_F32, MIXPREC_F16,
                                                              MIXPREC_BF16),
                                            ::testing::Values(8, 4)),
                         param_name);

// Any code and scale bits (NaN, inf, subnormal, huge scales) recompute to
// the CPU's bits.
TEST_F(ActPackCudaTest, NormReluOfArbitraryBitsMatchesCpu) {
  std::mt19937 rng(mpt::kSeed + 103);
  std::uniform_int_distribution<uint32_t> u32;
  for (int64_t bits : {8, 4})
    for (int64_t block : {32, 256}) {
      const int64_t n = 3 * block + 33, channels = 5, inner = 7;
      const Sizes sz = packed_size(n, bits, block);
      std::vector<uint8_t> codes(size_t(sz.code_bytes));
      for (uint8_t &c : codes) c = uint8_t(u32(rng));
      std::vector<float> scales(size_t(sz.n_scales));
      for (float &s : scales) s = mpt::f32_from_bits(u32(rng));
      scales[0] = mpt::f32_from_bits(0x7f800000u);
      scales[1] = mpt::f32_from_bits((u32(rng) & 0x807fffffu));  // subnormal or zero
      scales[2] = mpt::f32_from_bits((u32(rng) & 0x807fffffu) | 0x7f000000u);  // huge
      std::vector<float> a, b;
      make_affine(channels, false, rng, a, b);
      std::vector<uint8_t> mask(size_t(mask_bytes(n)));
      for (uint8_t &m : mask) m = uint8_t(u32(rng));
      for (mixprec_dtype od : kDtypes) {
        check_norm_relu(stream_, codes, scales, n, bits, block, a, b, inner, mask, od,
                        "arbitrary bits " + std::to_string(bits) + "/" + std::to_string(block) +
                            " to " + mpt::dtype_name(od));
        if (HasFatalFailure()) return;
      }
    }
}

// More elements (and mask bytes) than the capped grid (4096 blocks of 256
// threads) has threads: the grid-stride loops.
TEST_F(ActPackCudaTest, MaskAndNormReluGridStrideMatchCpu) {
  std::mt19937 rng(mpt::kSeed + 107);
  {
    const int64_t n = int64_t(4096) * 256 * 8 + 8 * 1000 + 5;
    Buf x(MIXPREC_BF16, n);
    std::uniform_int_distribution<uint32_t> u32;
    for (int64_t i = 0; i < n; i++) x.set_raw(i, u32(rng) & 0xffffu);
    std::vector<uint8_t> want(size_t(mask_bytes(n))), got(want.size() + 4);
    ASSERT_EQ(mixprec_act_mask(x.data(), MIXPREC_BF16, n, want.data()), MIXPREC_OK);
    Dev dx(x.data(), nbytes(x)), dm(got.size());
    ASSERT_EQ(cudaMemsetAsync(dm.p, 0xa5, dm.bytes, stream_), cudaSuccess);
    ASSERT_EQ(mixprec_cuda_act_mask(dx.p, MIXPREC_BF16, n, static_cast<uint8_t *>(dm.p), stream_),
              MIXPREC_OK);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    dm.to_host(got.data());
    expect_mask_equal(got, want, n, 0xa5, "grid stride mask");
  }
  {
    const int64_t n = int64_t(4096) * 256 + 3000 + 3, bits = 4, block = 256, channels = 64;
    Buf x = make(MIXPREC_F16, n, Data::kSigned, rng);
    const Sizes sz = packed_size(n, bits, block);
    std::vector<uint8_t> codes(size_t(sz.code_bytes));
    std::vector<float> scales(size_t(sz.n_scales));
    ASSERT_EQ(mixprec_act_pack(x.data(), MIXPREC_F16, n, bits, block, 9u, codes.data(),
                               scales.data()),
              MIXPREC_OK);
    std::vector<float> a, b;
    make_affine(channels, true, rng, a, b);
    std::vector<uint8_t> mask(size_t(mask_bytes(n)));
    for (uint8_t &m : mask) m = uint8_t(rng());
    check_norm_relu(stream_, codes, scales, n, bits, block, a, b, 14 * 14, mask, MIXPREC_F16,
                    "grid stride norm_relu");
  }
}

// Mask then recompute captured in a CUDA graph and replayed twice: the
// eager CPU calls' bits.
TEST_F(ActPackCudaTest, MaskAndNormReluGraphCaptureMatchesCpu) {
  std::mt19937 rng(mpt::kSeed + 109);
  const int64_t n = 5 * 256 + 3, bits = 8, block = 256, channels = 6, inner = 9;
  Buf x = make(MIXPREC_BF16, n, Data::kSigned, rng);
  const Sizes sz = packed_size(n, bits, block);
  std::vector<uint8_t> codes(size_t(sz.code_bytes));
  std::vector<float> scales(size_t(sz.n_scales));
  ASSERT_EQ(mixprec_act_pack(x.data(), MIXPREC_BF16, n, bits, block, 5u, codes.data(),
                             scales.data()),
            MIXPREC_OK);
  std::vector<float> a, b;
  make_affine(channels, false, rng, a, b);
  std::vector<uint8_t> mask(size_t(mask_bytes(n))), gmask(mask.size());
  ASSERT_EQ(mixprec_act_mask(x.data(), MIXPREC_BF16, n, mask.data()), MIXPREC_OK);
  Buf want(MIXPREC_BF16, n), got(MIXPREC_BF16, n);
  ASSERT_EQ(mixprec_act_unpack_norm_relu(codes.data(), scales.data(), n, bits, block, a.data(),
                                         b.data(), channels, inner, mask.data(), want.data(),
                                         MIXPREC_BF16),
            MIXPREC_OK);
  Dev dx(x.data(), nbytes(x)), dc(codes.data(), codes.size()),
      ds(scales.data(), scales.size() * sizeof(float)), da(a.data(), a.size() * sizeof(float)),
      db(b.data(), b.size() * sizeof(float)), dm(mask.size()), dout(nbytes(got));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  const mixprec_status st1 =
      mixprec_cuda_act_mask(dx.p, MIXPREC_BF16, n, static_cast<uint8_t *>(dm.p), stream_);
  const mixprec_status st2 = mixprec_cuda_act_unpack_norm_relu(
      static_cast<const uint8_t *>(dc.p), static_cast<const float *>(ds.p), n, bits, block,
      static_cast<const float *>(da.p), static_cast<const float *>(db.p), channels, inner,
      static_cast<const uint8_t *>(dm.p), dout.p, MIXPREC_BF16, stream_);
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
  EXPECT_EQ(st1, MIXPREC_OK);
  EXPECT_EQ(st2, MIXPREC_OK);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int rep = 0; rep < 2; rep++) ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  dm.to_host(gmask.data());
  dout.to_host(got.data());
  EXPECT_EQ(count_byte_mismatches(gmask, mask, "graph mask"), 0);
  EXPECT_EQ(count_value_mismatches(got, want, "graph norm_relu"), 0);
}

// The CPU's status for every bad argument, nothing written (the outputs
// keep their poison), n == 0 with NULL pointers, and misaligned x / out /
// scales / a / b refused with MIXPREC_ERR_BAD_ARGUMENT (codes and mask need
// no alignment).
TEST_F(ActPackCudaTest, MaskAndNormReluStatusesMatchCpu) {
  const int64_t n = 100;
  const mixprec_dtype bad_dtype = static_cast<mixprec_dtype>(3);  // in the enum's range, unknown
  std::vector<float> hx(n + 1, 1.0f), hscales(8, 0.5f), ha(8, 1.0f), hb(8, 0.0f),
      hout(n + 1, 7.0f);
  std::vector<uint8_t> hcodes(n + 8, 3), hmask(n / 8 + 8, 0xffu);
  std::vector<uint8_t> hmask_out(hmask.size(), 0x77);
  Dev dx(hx.data(), hx.size() * sizeof(float)), dcodes(hcodes.data(), hcodes.size()),
      dscales(hscales.data(), hscales.size() * sizeof(float)),
      da(ha.data(), ha.size() * sizeof(float)), db(hb.data(), hb.size() * sizeof(float)),
      dmask(hmask.data(), hmask.size()), dmask_out(hmask.size()), dout((n + 1) * sizeof(float));
  std::vector<uint8_t> poison(dout.bytes, 0x77);
  ASSERT_EQ(cudaMemcpy(dout.p, poison.data(), dout.bytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dmask_out.p, poison.data(), dmask_out.bytes, cudaMemcpyHostToDevice),
            cudaSuccess);
  auto expect_poisoned = [&](const std::string &what) {
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess) << what;
    std::vector<uint8_t> o(dout.bytes), m(dmask_out.bytes);
    dout.to_host(o.data());
    dmask_out.to_host(m.data());
    EXPECT_EQ(o, std::vector<uint8_t>(o.size(), 0x77)) << what << ": out written";
    EXPECT_EQ(m, std::vector<uint8_t>(m.size(), 0x77)) << what << ": mask written";
  };

  struct MaskCase {
    const char *what;
    bool null_x, null_mask;
    mixprec_dtype dtype;
    int64_t n;
  };
  const MaskCase mask_cases[] = {
      {"n < 0", false, false, MIXPREC_F32, -1},
      {"bad dtype", false, false, bad_dtype, n},
      {"NULL x", true, false, MIXPREC_F32, n},
      {"NULL mask", false, true, MIXPREC_F16, n},
      {"n < 0 and bad dtype", false, false, bad_dtype, -3},
      {"bad dtype and NULL", true, true, bad_dtype, n},
      {"n < 0 and NULL", true, true, MIXPREC_F32, -1},
      {"n 0 all NULL", true, true, MIXPREC_BF16, 0},
      {"n 0 bad dtype", true, true, bad_dtype, 0},
  };
  for (const MaskCase &c : mask_cases) {
    std::vector<uint8_t> hm(hmask_out);
    const mixprec_status cpu = mixprec_act_mask(c.null_x ? nullptr : hx.data(), c.dtype, c.n,
                                                c.null_mask ? nullptr : hm.data());
    const mixprec_status gpu =
        mixprec_cuda_act_mask(c.null_x ? nullptr : dx.p, c.dtype, c.n,
                              c.null_mask ? nullptr : static_cast<uint8_t *>(dmask_out.p),
                              stream_);
    EXPECT_EQ(gpu, cpu) << "mask: " << c.what;
    if (c.n != 0) EXPECT_NE(cpu, MIXPREC_OK) << "mask: " << c.what;
    EXPECT_EQ(hm, hmask_out) << "mask: " << c.what << ": the CPU wrote its mask";
  }
  expect_poisoned("mask statuses");

  enum Null { kNone = 0, kCodes = 1, kScales = 2, kA = 4, kB = 8, kMask = 16, kOut = 32, kAll = 63 };
  struct NrCase {
    const char *what;
    int nulls;
    mixprec_dtype dtype;
    int64_t n, bits, block, channels, inner;
  };
  const NrCase nr_cases[] = {
      {"n < 0", kNone, MIXPREC_F32, -1, 8, 256, 3, 7},
      {"bits 6", kNone, MIXPREC_F32, n, 6, 256, 3, 7},
      {"bits 0", kNone, MIXPREC_F32, n, 0, 256, 3, 7},
      {"block 16", kNone, MIXPREC_F32, n, 8, 16, 3, 7},
      {"block 48", kNone, MIXPREC_F32, n, 8, 48, 3, 7},
      {"block 8192", kNone, MIXPREC_F32, n, 4, 8192, 3, 7},
      {"channels 0", kNone, MIXPREC_F32, n, 8, 32, 0, 7},
      {"channels -1", kNone, MIXPREC_F16, n, 8, 32, -1, 7},
      {"inner 0", kNone, MIXPREC_F32, n, 8, 32, 3, 0},
      {"inner -5", kNone, MIXPREC_BF16, n, 4, 32, 3, -5},
      {"bad dtype", kNone, bad_dtype, n, 8, 32, 3, 7},
      {"NULL codes", kCodes, MIXPREC_F32, n, 8, 32, 3, 7},
      {"NULL scales", kScales, MIXPREC_F32, n, 8, 32, 3, 7},
      {"NULL a", kA, MIXPREC_F32, n, 8, 32, 3, 7},
      {"NULL b", kB, MIXPREC_F16, n, 4, 32, 3, 7},
      {"NULL mask", kMask, MIXPREC_BF16, n, 8, 32, 3, 7},
      {"NULL out", kOut, MIXPREC_F32, n, 4, 32, 3, 7},
      {"n < 0 and bad bits", kNone, MIXPREC_F32, -5, 3, 32, 3, 7},
      {"bad bits and dtype", kNone, bad_dtype, n, 3, 32, 3, 7},
      {"bad channels and dtype", kNone, bad_dtype, n, 8, 32, 0, 7},
      {"bad inner and NULL", kAll, MIXPREC_F32, n, 8, 32, 3, 0},
      {"bad dtype and NULL", kOut, bad_dtype, n, 8, 32, 3, 7},
      {"n 0 all NULL", kAll, MIXPREC_F32, 0, 8, 32, 3, 7},
      {"n 0 bad bits", kAll, MIXPREC_F32, 0, 5, 32, 3, 7},
      {"n 0 channels 0", kAll, MIXPREC_F16, 0, 8, 32, 0, 7},
      {"n 0 bad dtype", kAll, bad_dtype, 0, 8, 32, 3, 7},
  };
  for (const NrCase &c : nr_cases) {
    std::vector<float> ho(hout);
    const mixprec_status cpu = mixprec_act_unpack_norm_relu(
        (c.nulls & kCodes) ? nullptr : hcodes.data(), (c.nulls & kScales) ? nullptr : hscales.data(),
        c.n, c.bits, c.block, (c.nulls & kA) ? nullptr : ha.data(),
        (c.nulls & kB) ? nullptr : hb.data(), c.channels, c.inner,
        (c.nulls & kMask) ? nullptr : hmask.data(), (c.nulls & kOut) ? nullptr : ho.data(),
        c.dtype);
    const mixprec_status gpu = mixprec_cuda_act_unpack_norm_relu(
        (c.nulls & kCodes) ? nullptr : static_cast<const uint8_t *>(dcodes.p),
        (c.nulls & kScales) ? nullptr : static_cast<const float *>(dscales.p), c.n, c.bits,
        c.block, (c.nulls & kA) ? nullptr : static_cast<const float *>(da.p),
        (c.nulls & kB) ? nullptr : static_cast<const float *>(db.p), c.channels, c.inner,
        (c.nulls & kMask) ? nullptr : static_cast<const uint8_t *>(dmask.p),
        (c.nulls & kOut) ? nullptr : dout.p, c.dtype, stream_);
    EXPECT_EQ(gpu, cpu) << "norm_relu: " << c.what;
    if (c.n != 0) EXPECT_NE(cpu, MIXPREC_OK) << "norm_relu: " << c.what;
    EXPECT_EQ(ho, hout) << "norm_relu: " << c.what << ": the CPU wrote its out";
  }
  expect_poisoned("norm_relu statuses");

  // Misaligned pointers (the CPU takes them; a device access would fault).
  const uint8_t *codes = static_cast<const uint8_t *>(dcodes.p);
  const uint8_t *mask = static_cast<const uint8_t *>(dmask.p);
  const float *scales = static_cast<const float *>(dscales.p);
  const float *a = static_cast<const float *>(da.p), *b = static_cast<const float *>(db.p);
  const char *x = static_cast<const char *>(dx.p);
  char *out = static_cast<char *>(dout.p);
  uint8_t *mask_out = static_cast<uint8_t *>(dmask_out.p);
  auto off = [](const float *p, int k) {
    return reinterpret_cast<const float *>(reinterpret_cast<const char *>(p) + k);
  };
  for (mixprec_dtype dt : kDtypes) {
    const std::string w = mpt::dtype_name(dt);
    std::vector<int> offsets = {1};
    if (dt == MIXPREC_F32) offsets = {1, 2, 3};
    for (int k : offsets) {
      const std::string wk = w + " + " + std::to_string(k);
      EXPECT_EQ(mixprec_cuda_act_mask(x + k, dt, n, mask_out, stream_), MIXPREC_ERR_BAD_ARGUMENT)
          << wk << " x";
      EXPECT_EQ(mixprec_cuda_act_unpack_norm_relu(codes, scales, n, 8, 32, a, b, 3, 7, mask,
                                                  out + k, dt, stream_),
                MIXPREC_ERR_BAD_ARGUMENT)
          << wk << " out";
    }
    for (int k : {1, 2, 3}) {
      const std::string wk = w + " + " + std::to_string(k);
      for (int bits : {8, 4}) {
        EXPECT_EQ(mixprec_cuda_act_unpack_norm_relu(codes, off(scales, k), n, bits, 32, a, b, 3,
                                                    7, mask, out, dt, stream_),
                  MIXPREC_ERR_BAD_ARGUMENT)
            << wk << " scales";
        EXPECT_EQ(mixprec_cuda_act_unpack_norm_relu(codes, scales, n, bits, 32, off(a, k), b, 3,
                                                    7, mask, out, dt, stream_),
                  MIXPREC_ERR_BAD_ARGUMENT)
            << wk << " a";
        EXPECT_EQ(mixprec_cuda_act_unpack_norm_relu(codes, scales, n, bits, 32, a, off(b, k), 3,
                                                    7, mask, out, dt, stream_),
                  MIXPREC_ERR_BAD_ARGUMENT)
            << wk << " b";
      }
    }
  }
  expect_poisoned("misaligned");

  // Codes and mask need no alignment: codes + 1 / mask + 1 (and a mask
  // output at an odd byte) are fine.
  EXPECT_EQ(mixprec_cuda_act_mask(x, MIXPREC_F32, n, mask_out + 1, stream_), MIXPREC_OK);
  EXPECT_EQ(mixprec_cuda_act_unpack_norm_relu(codes + 1, scales, n, 4, 32, a, b, 3, 7, mask + 1,
                                              out, MIXPREC_F16, stream_),
            MIXPREC_OK);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  uint8_t first = 0;
  ASSERT_EQ(cudaMemcpy(&first, dmask_out.p, 1, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(first, 0x77);
}

// ---- max-pool index codes ([note: pool codes]) ---------------------------

// A 2-D max pool's geometry and input plane size.
struct PoolGeometry {
  const char *name;
  int64_t H, W, kH, kW, sH, sW, pH, pW, dH, dW;
};

const PoolGeometry kPoolGeometries[] = {
    {"k3 s2 p1", 13, 11, 3, 3, 2, 2, 1, 1, 1, 1},
    {"k2 s2 p0", 8, 9, 2, 2, 2, 2, 0, 0, 1, 1},
    {"k3 s1 p1 d2", 12, 10, 3, 3, 1, 1, 1, 1, 2, 2},
    {"k5 s3 p2", 17, 14, 5, 5, 3, 3, 2, 2, 1, 1},
    {"k2x3 s1x2 p1x0 d1x3", 9, 16, 2, 3, 1, 2, 1, 0, 1, 3},
    {"k3x2 s2x1 p0x1 d2x1", 15, 7, 3, 2, 2, 1, 0, 1, 2, 1},
    {"k15x17 s4 p7x8 (255 offsets)", 40, 37, 15, 17, 4, 4, 7, 8, 1, 1},
    {"k7 global", 7, 7, 7, 7, 1, 1, 0, 0, 1, 1},
};

int64_t pool_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

// The saved indices of a pool over `planes` planes (N * C) in a layout:
// contiguous (N, C, HO, WO) or channels_last (N, HO, WO, C).
struct PoolTensor {
  int64_t HO = 0, WO = 0, s_ho = 0, s_wo = 0, n = 0;
  int64_t geom[9] = {};
  std::vector<int64_t> idx;
  std::vector<uint8_t> want;  // the code each element must get (255: corrupted)
  int64_t corrupted = 0;
};

// Element (plane p = nb * C + c, ho, wo)'s memory position.
int64_t pool_pos(bool channels_last, int64_t nb, int64_t c, int64_t C, int64_t ho, int64_t wo,
                 int64_t HO, int64_t WO) {
  return channels_last ? ((nb * HO + ho) * WO + wo) * C + c : ((nb * C + c) * HO + ho) * WO + wo;
}

// A host max pool (the first largest element of each window in (kh, kw)
// order, padding skipped) over random planes (small integers: many ties),
// then about one index in `corrupt_every` corrupted so that its code is
// 255: a row below or above the window, a column right or left of it in a
// window row, off the dilation grid, negative, huge.
PoolTensor make_pool(const PoolGeometry &g, int64_t N, int64_t C, bool channels_last,
                     int corrupt_every, std::mt19937 &rng) {
  PoolTensor t;
  t.HO = pool_out(g.H, g.kH, g.sH, g.pH, g.dH);
  t.WO = pool_out(g.W, g.kW, g.sW, g.pW, g.dW);
  t.s_wo = channels_last ? C : 1;
  t.s_ho = t.WO * t.s_wo;
  t.n = N * C * t.HO * t.WO;
  const int64_t geom[9] = {g.W, g.kH, g.kW, g.sH, g.sW, g.pH, g.pW, g.dH, g.dW};
  std::memcpy(t.geom, geom, sizeof geom);
  t.idx.assign(size_t(t.n), -12345);
  t.want.assign(size_t(t.n), 0xee);
  std::uniform_int_distribution<int> val(0, 15), pct(0, corrupt_every > 0 ? corrupt_every - 1 : 0),
      kind(0, 7);
  std::vector<int> plane(size_t(g.H * g.W));
  for (int64_t nb = 0; nb < N; nb++)
    for (int64_t c = 0; c < C; c++) {
      for (int &v : plane) v = val(rng);
      for (int64_t ho = 0; ho < t.HO; ho++)
        for (int64_t wo = 0; wo < t.WO; wo++) {
          const int64_t h0 = ho * g.sH - g.pH, w0 = wo * g.sW - g.pW;
          int best = -1;
          int64_t bh = -1, bw = -1, bk = -1;
          for (int64_t kh = 0; kh < g.kH; kh++)
            for (int64_t kw = 0; kw < g.kW; kw++) {
              const int64_t h = h0 + kh * g.dH, w = w0 + kw * g.dW;
              if (h < 0 || h >= g.H || w < 0 || w >= g.W) continue;
              if (plane[size_t(h * g.W + w)] > best) {
                best = plane[size_t(h * g.W + w)];
                bh = h, bw = w, bk = kh * g.kW + kw;
              }
            }
          EXPECT_GE(bk, 0) << g.name << ": a window without an input element";
          const size_t i = size_t(pool_pos(channels_last, nb, c, C, ho, wo, t.HO, t.WO));
          t.idx[i] = bh * g.W + bw;
          t.want[i] = uint8_t(bk);
          if (corrupt_every <= 0 || pct(rng) != 0) continue;
          // The corruption: an index whose code must be 255.
          int64_t bad;
          int k = kind(rng);
          if (k == 2 && w0 + g.kW * g.dW >= g.W) k = 0;
          if (k == 3 && w0 - 1 < 0) k = 1;
          if (k == 4 && g.dH == 1 && g.dW == 1) k = 5;
          switch (k) {
            case 0: bad = (h0 + g.kH * g.dH) * g.W + bw; break;    // row below the window
            case 1: bad = (h0 - 1) * g.W + bw; break;              // row above (maybe < 0)
            case 2: bad = bh * g.W + w0 + g.kW * g.dW; break;      // right of the window
            case 3: bad = bh * g.W + w0 - 1; break;                // left of the window
            case 4:                                                // off the dilation grid
              bad = g.dH > 1 && h0 + 1 >= 0 && h0 + 1 < g.H   ? (h0 + 1) * g.W + bw
                    : g.dW > 1 && w0 + 1 >= 0 && w0 + 1 < g.W ? bh * g.W + w0 + 1
                                                              : -1;
              break;
            case 5: bad = -1 - int64_t(rng() % 1000); break;      // negative
            case 6: bad = std::numeric_limits<int64_t>::min() + int64_t(rng() % 3); break;
            default: bad = std::numeric_limits<int64_t>::max() - int64_t(rng() % 3); break;
          }
          t.idx[i] = bad;
          t.want[i] = 255;
          t.corrupted++;
        }
    }
  return t;
}

class PoolCudaTest : public ActPackCudaTest {
 protected:
  // Encodes idx[0, n) on the CPU and the GPU (codes and *inexact poisoned
  // first) and compares codes and *inexact; returns the CPU's.
  void encode_both(const std::vector<int64_t> &idx, int64_t n, const PoolTensor &t,
                   std::vector<uint8_t> &codes, int64_t &inexact, const std::string &what) {
    codes.assign(static_cast<size_t>(n), 0xa5);
    inexact = -777;
    ASSERT_EQ(mixprec_act_pool_encode(idx.data(), n, t.HO, t.WO, t.s_ho, t.s_wo, t.geom,
                                      codes.data(), &inexact),
              MIXPREC_OK)
        << what;
    Dev di(idx.data(), static_cast<size_t>(n) * sizeof(int64_t)), dc(static_cast<size_t>(n)), dx(sizeof(int64_t));
    const int64_t poison = 0x5a5a5a5a5a5a5a5all;
    ASSERT_EQ(cudaMemsetAsync(dc.p, 0x5a, dc.bytes, stream_), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dx.p, &poison, sizeof poison, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(mixprec_cuda_act_pool_encode(static_cast<const int64_t *>(di.p), n, t.HO, t.WO,
                                           t.s_ho, t.s_wo, t.geom, static_cast<uint8_t *>(dc.p),
                                           static_cast<int64_t *>(dx.p), stream_),
              MIXPREC_OK)
        << what;
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess) << what;
    std::vector<uint8_t> gcodes(static_cast<size_t>(n));
    int64_t ginexact = 0;
    dc.to_host(gcodes.data());
    dx.to_host(&ginexact);
    EXPECT_EQ(count_byte_mismatches(gcodes, codes, what + " pool codes"), 0) << what;
    EXPECT_EQ(ginexact, inexact) << what << ": *inexact";
  }

  // Decodes codes[0, n) on the CPU and the GPU (output poisoned first) and
  // compares the indices; returns the CPU's.
  void decode_both(const std::vector<uint8_t> &codes, int64_t n, const PoolTensor &t,
                   std::vector<int64_t> &idx, const std::string &what) {
    idx.assign(static_cast<size_t>(n), -5555);
    ASSERT_EQ(mixprec_act_pool_decode(codes.data(), n, t.HO, t.WO, t.s_ho, t.s_wo, t.geom,
                                      idx.data()),
              MIXPREC_OK)
        << what;
    Dev dc(codes.data(), static_cast<size_t>(n)), di(static_cast<size_t>(n) * sizeof(int64_t));
    ASSERT_EQ(cudaMemsetAsync(di.p, 0x5a, di.bytes, stream_), cudaSuccess);
    ASSERT_EQ(mixprec_cuda_act_pool_decode(static_cast<const uint8_t *>(dc.p), n, t.HO, t.WO,
                                           t.s_ho, t.s_wo, t.geom, static_cast<int64_t *>(di.p),
                                           stream_),
              MIXPREC_OK)
        << what;
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess) << what;
    std::vector<int64_t> gidx(static_cast<size_t>(n));
    di.to_host(gidx.data());
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
      if (gidx[size_t(i)] != idx[size_t(i)] && bad++ < 5)
        ADD_FAILURE() << what << ": decoded index " << i << " of " << n << " got "
                      << gidx[size_t(i)] << " want " << idx[size_t(i)];
    EXPECT_EQ(bad, 0) << what;
  }
};

// The indices of real max pools (every geometry, contiguous and
// channels_last, odd plane counts and sizes, a prefix of the tensor that
// ends mid-row), clean and with corrupted indices: codes and *inexact are
// the CPU's and what the pool's windows say (255 and counted for each
// corrupted index, inexact 0 for a clean pool), and decoding the codes gives
// the CPU's indices, the original ones wherever the code is exact.
TEST_F(PoolCudaTest, EncodeDecodeOfMaxPoolIndicesMatchCpu) {
  std::mt19937 rng(mpt::kSeed + 113);
  struct Layout {
    int64_t N, C;
    bool channels_last;
  };
  const Layout layouts[] = {{2, 3, false}, {1, 1, false}, {2, 5, true}, {3, 1, true}, {1, 7, true}};
  for (const PoolGeometry &g : kPoolGeometries)
    for (const Layout &L : layouts)
      for (int corrupt_every : {0, 7, 2}) {
        const PoolTensor t = make_pool(g, L.N, L.C, L.channels_last, corrupt_every, rng);
        if (HasFailure()) return;
        const std::string what = std::string(g.name) + " N " + std::to_string(L.N) + " C " +
                                 std::to_string(L.C) +
                                 (L.channels_last ? " channels_last" : " contiguous") +
                                 " corrupt 1/" + std::to_string(corrupt_every) + " HO " +
                                 std::to_string(t.HO) + " WO " + std::to_string(t.WO);
        for (int64_t n : {t.n, t.n - 3, int64_t(1)}) {
          if (n < 1) continue;
          const std::string w = what + " n " + std::to_string(n);
          std::vector<uint8_t> codes;
          int64_t inexact = 0;
          encode_both(t.idx, n, t, codes, inexact, w);
          if (HasFatalFailure()) return;
          int64_t want_inexact = 0;
          for (int64_t i = 0; i < n; i++) want_inexact += t.want[size_t(i)] == 255;
          if (corrupt_every == 0 && n == t.n) EXPECT_EQ(want_inexact, 0) << w;
          if (corrupt_every == 0 && n == t.n) EXPECT_EQ(t.corrupted, 0) << w;
          EXPECT_EQ(inexact, want_inexact) << w << ": the CPU's *inexact";
          std::vector<uint8_t> want(t.want.begin(), t.want.begin() + n);
          EXPECT_EQ(count_byte_mismatches(codes, want, w + " codes vs windows"), 0) << w;
          std::vector<int64_t> back;
          decode_both(codes, n, t, back, w);
          if (HasFatalFailure()) return;
          int64_t bad = 0;
          for (int64_t i = 0; i < n; i++)
            if (codes[size_t(i)] != 255 && back[size_t(i)] != t.idx[size_t(i)] && bad++ < 5)
              ADD_FAILURE() << w << ": element " << i << " decodes to " << back[size_t(i)]
                            << ", was " << t.idx[size_t(i)];
          if (HasFailure()) return;
        }
      }
}

// Arbitrary indices (mostly near the plane, some anywhere) and arbitrary
// codes (every value 0..255 at every position, then random ones): the CPU's
// codes, *inexact and indices; a decoded index is the window formula of
// the header for every code.
TEST_F(PoolCudaTest, ArbitraryIndicesAndCodesMatchCpu) {
  std::mt19937 rng(mpt::kSeed + 127);
  std::uniform_int_distribution<uint64_t> u64;
  for (const PoolGeometry &g : kPoolGeometries)
    for (bool channels_last : {false, true}) {
      const int64_t C = channels_last ? 3 : 2;
      PoolTensor t = make_pool(g, 2, C, channels_last, 0, rng);
      const std::string what = std::string(g.name) + (channels_last ? " channels_last" : "");
      const int64_t n = t.n;
      std::uniform_int_distribution<int64_t> near(-3 * g.W, (g.H + 3) * g.W);
      std::vector<int64_t> idx(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; i++)
        idx[size_t(i)] = (i % 5 == 4) ? int64_t(u64(rng)) : near(rng);
      std::vector<uint8_t> codes;
      int64_t inexact = 0;
      encode_both(idx, n, t, codes, inexact, what + " arbitrary indices");
      if (HasFatalFailure()) return;
      for (int rep = 0; rep < 2; rep++) {
        std::vector<uint8_t> c(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; i++)
          c[size_t(i)] = rep == 0 ? uint8_t((i * 7 + i / 256) & 255) : uint8_t(rng());
        std::vector<int64_t> back;
        decode_both(c, n, t, back, what + " arbitrary codes rep " + std::to_string(rep));
        if (HasFatalFailure()) return;
        int64_t bad = 0;
        for (int64_t i = 0; i < n; i++) {
          const int64_t ho = (i / t.s_ho) % t.HO, wo = (i / t.s_wo) % t.WO, k = c[size_t(i)];
          const int64_t want =
              (ho * g.sH - g.pH + (k / g.kW) * g.dH) * g.W + wo * g.sW - g.pW + (k % g.kW) * g.dW;
          if (back[size_t(i)] != want && bad++ < 5)
            ADD_FAILURE() << what << ": code " << k << " at " << i << " decodes to "
                          << back[size_t(i)] << ", the formula gives " << want;
        }
        if (HasFailure()) return;
      }
    }
}

// More elements than the capped grid (4096 blocks of 256 threads) has
// threads: the grid-stride loops, and *inexact summed over many blocks.
TEST_F(PoolCudaTest, GridStrideMatchesCpu) {
  std::mt19937 rng(mpt::kSeed + 131);
  const PoolGeometry g = {"k3 s2 p1 64x64", 64, 64, 3, 3, 2, 2, 1, 1, 1, 1};
  for (bool channels_last : {false, true}) {
    const PoolTensor t = make_pool(g, 5, 221, channels_last, 3, rng);  // 1,131,520 elements
    ASSERT_GT(t.n, int64_t(4096) * 256);
    const std::string what = std::string("grid stride") + (channels_last ? " channels_last" : "");
    std::vector<uint8_t> codes;
    int64_t inexact = 0;
    encode_both(t.idx, t.n, t, codes, inexact, what);
    if (HasFatalFailure()) return;
    EXPECT_EQ(inexact, t.corrupted) << what;
    EXPECT_GT(t.corrupted, 0) << what;
    std::vector<int64_t> back;
    decode_both(codes, t.n, t, back, what);
    if (HasFatalFailure()) return;
  }
}

// Encode then decode captured in a CUDA graph and replayed twice: *inexact
// is zeroed inside the graph (the count is not doubled by the replay), the
// eager CPU calls' codes, count and indices.
TEST_F(PoolCudaTest, GraphCaptureMatchesCpu) {
  std::mt19937 rng(mpt::kSeed + 137);
  const PoolTensor t = make_pool(kPoolGeometries[0], 2, 3, true, 4, rng);
  const int64_t n = t.n;
  std::vector<uint8_t> codes(static_cast<size_t>(n)), gcodes(static_cast<size_t>(n));
  int64_t inexact = -1, ginexact = -1;
  ASSERT_EQ(mixprec_act_pool_encode(t.idx.data(), n, t.HO, t.WO, t.s_ho, t.s_wo, t.geom,
                                    codes.data(), &inexact),
            MIXPREC_OK);
  ASSERT_GT(inexact, 0);
  std::vector<int64_t> back(static_cast<size_t>(n)), gback(static_cast<size_t>(n));
  ASSERT_EQ(mixprec_act_pool_decode(codes.data(), n, t.HO, t.WO, t.s_ho, t.s_wo, t.geom,
                                    back.data()),
            MIXPREC_OK);
  Dev di(t.idx.data(), static_cast<size_t>(n) * sizeof(int64_t)), dc(static_cast<size_t>(n)), dx(sizeof(int64_t)),
      dback(static_cast<size_t>(n) * sizeof(int64_t));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  const mixprec_status st1 = mixprec_cuda_act_pool_encode(
      static_cast<const int64_t *>(di.p), n, t.HO, t.WO, t.s_ho, t.s_wo, t.geom,
      static_cast<uint8_t *>(dc.p), static_cast<int64_t *>(dx.p), stream_);
  const mixprec_status st2 =
      mixprec_cuda_act_pool_decode(static_cast<const uint8_t *>(dc.p), n, t.HO, t.WO, t.s_ho,
                                   t.s_wo, t.geom, static_cast<int64_t *>(dback.p), stream_);
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
  EXPECT_EQ(st1, MIXPREC_OK);
  EXPECT_EQ(st2, MIXPREC_OK);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int rep = 0; rep < 2; rep++) ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  dc.to_host(gcodes.data());
  dx.to_host(&ginexact);
  dback.to_host(gback.data());
  EXPECT_EQ(count_byte_mismatches(gcodes, codes, "graph pool codes"), 0);
  EXPECT_EQ(ginexact, inexact) << "graph *inexact";
  EXPECT_EQ(gback, back) << "graph decoded indices";
}

// The CPU's status for every bad argument, nothing written (codes, indices
// and *inexact keep their poison on both sides); n == 0 (NULL idx / codes
// allowed) writes *inexact = 0 and nothing else; misaligned idx or inexact
// refused with MIXPREC_ERR_BAD_ARGUMENT after the shared checks; codes need
// no alignment.
TEST_F(PoolCudaTest, StatusesMatchCpu) {
  const int64_t n = 60, HO = 5, WO = 6;
  const int64_t good[9] = {12, 3, 3, 2, 2, 1, 1, 1, 1};
  std::vector<int64_t> hidx(static_cast<size_t>(n) + 2);
  for (size_t i = 0; i < hidx.size(); i++) hidx[i] = int64_t(i % 20);
  std::vector<uint8_t> hcodes(static_cast<size_t>(n) + 8, 4);
  const uint8_t kPoison = 0x77;
  const int64_t kPoison64 = 0x7777777777777777ll;
  Dev didx(hidx.data(), hidx.size() * sizeof(int64_t)), dcodes(hcodes.data(), hcodes.size()),
      dcodes_out(hcodes.size()), didx_out(hidx.size() * sizeof(int64_t)),
      dinexact(2 * sizeof(int64_t));
  auto poison_all = [&] {
    std::vector<uint8_t> p(didx_out.bytes, kPoison);
    ASSERT_EQ(cudaMemcpy(dcodes_out.p, p.data(), dcodes_out.bytes, cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(didx_out.p, p.data(), didx_out.bytes, cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dinexact.p, p.data(), dinexact.bytes, cudaMemcpyHostToDevice),
              cudaSuccess);
  };
  auto expect_poisoned = [&](const std::string &what, bool inexact_too) {
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess) << what;
    std::vector<uint8_t> c(dcodes_out.bytes), i(didx_out.bytes), x(dinexact.bytes);
    dcodes_out.to_host(c.data());
    didx_out.to_host(i.data());
    dinexact.to_host(x.data());
    EXPECT_EQ(c, std::vector<uint8_t>(c.size(), kPoison)) << what << ": codes written";
    EXPECT_EQ(i, std::vector<uint8_t>(i.size(), kPoison)) << what << ": indices written";
    if (inexact_too)
      EXPECT_EQ(x, std::vector<uint8_t>(x.size(), kPoison)) << what << ": *inexact written";
  };
  poison_all();

  enum Null { kNone = 0, kIn = 1, kOut = 2, kGeom = 4, kInexact = 8, kAll = 15 };
  struct Case {
    std::string what;
    int nulls;
    int64_t n, HO, WO, s_ho, s_wo;
    int geom_k;       // the geom entry replaced (-1: none)
    int64_t geom_v;   // by this value
  };
  std::vector<Case> cases = {
      {"n < 0", kNone, -1, HO, WO, WO, 1, -1, 0},
      {"HO 0", kNone, n, 0, WO, WO, 1, -1, 0},
      {"WO -2", kNone, n, HO, -2, WO, 1, -1, 0},
      {"s_ho 0", kNone, n, HO, WO, 0, 1, -1, 0},
      {"s_wo 0", kNone, n, HO, WO, WO, 0, -1, 0},
      {"s_wo -3", kNone, n, HO, WO, WO, -3, -1, 0},
      {"kH 16 kW 16", kNone, n, HO, WO, WO, 1, 99, 0},
      {"kH 256", kNone, n, HO, WO, WO, 1, 98, 0},
      {"kW 256 (kH 1)", kNone, n, HO, WO, WO, 1, 97, 0},
      {"NULL geom", kGeom, n, HO, WO, WO, 1, -1, 0},
      {"NULL in", kIn, n, HO, WO, WO, 1, -1, 0},
      {"NULL out", kOut, n, HO, WO, WO, 1, -1, 0},
      {"NULL inexact", kInexact, n, HO, WO, WO, 1, -1, 0},
      {"n < 0 and NULL", kAll, -4, HO, WO, WO, 1, -1, 0},
      {"n < 0 and HO 0", kNone, -4, 0, WO, WO, 1, -1, 0},
      {"HO 0 and NULL in", kIn, n, 0, WO, WO, 1, -1, 0},
      {"pH -1 and NULL out", kOut, n, HO, WO, WO, 1, 5, -1},
      {"NULL geom and HO 0", kGeom, n, 0, WO, WO, 1, -1, 0},
      {"NULL inexact and W 0", kInexact, n, HO, WO, WO, 1, 0, 0},
      {"n 0 NULL in and out", kIn | kOut, 0, HO, WO, WO, 1, -1, 0},
      {"n 0 all NULL", kAll, 0, HO, WO, WO, 1, -1, 0},
      {"n 0 sW 0", kIn | kOut, 0, HO, WO, WO, 1, 4, 0},
      {"n 0 NULL geom", kIn | kOut | kGeom, 0, HO, WO, WO, 1, -1, 0},
  };
  const char *names[9] = {"W", "kH", "kW", "sH", "sW", "pH", "pW", "dH", "dW"};
  for (int k = 0; k < 9; k++) {
    const int64_t lo = (k == 5 || k == 6) ? 0 : 1;
    cases.push_back({std::string(names[k]) + " " + std::to_string(lo - 1), kNone, n, HO, WO, WO,
                     1, k, lo - 1});
    cases.push_back({std::string(names[k]) + " -1000000", kNone, n, HO, WO, WO, 1, k, -1000000});
  }
  for (const Case &c : cases) {
    int64_t geom[9];
    std::memcpy(geom, good, sizeof geom);
    if (c.geom_k == 99) geom[1] = geom[2] = 16;
    if (c.geom_k == 98) geom[1] = 256, geom[2] = 1;
    if (c.geom_k == 97) geom[1] = 1, geom[2] = 256;
    if (c.geom_k >= 0 && c.geom_k < 9) geom[c.geom_k] = c.geom_v;
    const int64_t *gp = (c.nulls & kGeom) ? nullptr : geom;

    // Encode.
    std::vector<uint8_t> hc(hcodes.size(), kPoison);
    int64_t hx = kPoison64;
    const mixprec_status cpu_e = mixprec_act_pool_encode(
        (c.nulls & kIn) ? nullptr : hidx.data(), c.n, c.HO, c.WO, c.s_ho, c.s_wo, gp,
        (c.nulls & kOut) ? nullptr : hc.data(), (c.nulls & kInexact) ? nullptr : &hx);
    const mixprec_status gpu_e = mixprec_cuda_act_pool_encode(
        (c.nulls & kIn) ? nullptr : static_cast<const int64_t *>(didx.p), c.n, c.HO, c.WO,
        c.s_ho, c.s_wo, gp, (c.nulls & kOut) ? nullptr : static_cast<uint8_t *>(dcodes_out.p),
        (c.nulls & kInexact) ? nullptr : static_cast<int64_t *>(dinexact.p), stream_);
    EXPECT_EQ(gpu_e, cpu_e) << "encode: " << c.what;
    EXPECT_EQ(hc, std::vector<uint8_t>(hc.size(), kPoison)) << "encode: " << c.what
                                                            << ": the CPU wrote codes";
    if (cpu_e == MIXPREC_OK) {
      EXPECT_EQ(c.n, 0) << "encode: " << c.what;
      EXPECT_EQ(hx, 0) << "encode: " << c.what << ": the CPU's *inexact";
      int64_t gx = -1;
      ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(&gx, dinexact.p, sizeof gx, cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(gx, 0) << "encode: " << c.what << ": *inexact";
      expect_poisoned("encode: " + c.what, false);
      poison_all();
    } else {
      EXPECT_EQ(hx, kPoison64) << "encode: " << c.what << ": the CPU wrote *inexact";
      expect_poisoned("encode: " + c.what, true);
    }

    // Decode (inexact plays no part: kInexact is ignored).
    std::vector<int64_t> hi(hidx.size(), kPoison64);
    const mixprec_status cpu_d = mixprec_act_pool_decode(
        (c.nulls & kIn) ? nullptr : hcodes.data(), c.n, c.HO, c.WO, c.s_ho, c.s_wo, gp,
        (c.nulls & kOut) ? nullptr : hi.data());
    const mixprec_status gpu_d = mixprec_cuda_act_pool_decode(
        (c.nulls & kIn) ? nullptr : static_cast<const uint8_t *>(dcodes.p), c.n, c.HO, c.WO,
        c.s_ho, c.s_wo, gp, (c.nulls & kOut) ? nullptr : static_cast<int64_t *>(didx_out.p),
        stream_);
    EXPECT_EQ(gpu_d, cpu_d) << "decode: " << c.what;
    if (c.nulls == kInexact && c.geom_k < 0) {
      // Only encode takes inexact: this decode is good and writes n indices.
      EXPECT_EQ(cpu_d, MIXPREC_OK) << "decode: " << c.what;
      ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
      std::vector<int64_t> gi(hi.size());
      didx_out.to_host(gi.data());
      EXPECT_EQ(gi, hi) << "decode: " << c.what;
      poison_all();
      continue;
    }
    if (c.n != 0) EXPECT_NE(cpu_d, MIXPREC_OK) << "decode: " << c.what;
    EXPECT_EQ(hi, std::vector<int64_t>(hi.size(), kPoison64))
        << "decode: " << c.what << ": the CPU wrote indices";
    expect_poisoned("decode: " + c.what, true);
  }

  // Misaligned idx (encode's input, decode's output) or inexact: refused
  // after the shared checks, nothing written.
  const char *idx_in = static_cast<const char *>(didx.p);
  char *idx_out = static_cast<char *>(didx_out.p);
  char *inexact = static_cast<char *>(dinexact.p);
  uint8_t *codes_out = static_cast<uint8_t *>(dcodes_out.p);
  const uint8_t *codes_in = static_cast<const uint8_t *>(dcodes.p);
  for (int k = 1; k < 8; k++) {
    const std::string w = " + " + std::to_string(k);
    EXPECT_EQ(mixprec_cuda_act_pool_encode(reinterpret_cast<const int64_t *>(idx_in + k), n, HO,
                                           WO, WO, 1, good, codes_out,
                                           reinterpret_cast<int64_t *>(inexact), stream_),
              MIXPREC_ERR_BAD_ARGUMENT)
        << "encode idx" << w;
    EXPECT_EQ(mixprec_cuda_act_pool_encode(static_cast<const int64_t *>(didx.p), n, HO, WO, WO, 1,
                                           good, codes_out,
                                           reinterpret_cast<int64_t *>(inexact + k), stream_),
              MIXPREC_ERR_BAD_ARGUMENT)
        << "encode inexact" << w;
    EXPECT_EQ(mixprec_cuda_act_pool_encode(static_cast<const int64_t *>(didx.p), 0, HO, WO, WO, 1,
                                           good, codes_out,
                                           reinterpret_cast<int64_t *>(inexact + k), stream_),
              MIXPREC_ERR_BAD_ARGUMENT)
        << "encode n 0 inexact" << w;
    EXPECT_EQ(mixprec_cuda_act_pool_decode(codes_in, n, HO, WO, WO, 1, good,
                                           reinterpret_cast<int64_t *>(idx_out + k), stream_),
              MIXPREC_ERR_BAD_ARGUMENT)
        << "decode idx" << w;
    // The shared checks first: their status, not the alignment's.
    EXPECT_EQ(mixprec_cuda_act_pool_encode(reinterpret_cast<const int64_t *>(idx_in + k), -1, HO,
                                           WO, WO, 1, good, codes_out,
                                           reinterpret_cast<int64_t *>(inexact), stream_),
              MIXPREC_ERR_BAD_SIZE)
        << "encode n < 0 and idx" << w;
    EXPECT_EQ(mixprec_cuda_act_pool_encode(static_cast<const int64_t *>(didx.p), n, HO, WO, WO, 1,
                                           good, nullptr,
                                           reinterpret_cast<int64_t *>(inexact + k), stream_),
              MIXPREC_ERR_NULL_POINTER)
        << "encode NULL codes and inexact" << w;
    EXPECT_EQ(mixprec_cuda_act_pool_decode(nullptr, n, HO, WO, WO, 1, good,
                                           reinterpret_cast<int64_t *>(idx_out + k), stream_),
              MIXPREC_ERR_NULL_POINTER)
        << "decode NULL codes and idx" << w;
  }
  expect_poisoned("misaligned", true);

  // Codes need no alignment: codes + 1 in and out are fine.
  EXPECT_EQ(mixprec_cuda_act_pool_encode(static_cast<const int64_t *>(didx.p), n, HO, WO, WO, 1,
                                         good, codes_out + 1,
                                         reinterpret_cast<int64_t *>(inexact), stream_),
            MIXPREC_OK);
  EXPECT_EQ(mixprec_cuda_act_pool_decode(codes_in + 1, n, HO, WO, WO, 1, good,
                                         static_cast<int64_t *>(didx_out.p), stream_),
            MIXPREC_OK);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  uint8_t first = 0;
  ASSERT_EQ(cudaMemcpy(&first, dcodes_out.p, 1, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(first, kPoison);
  std::vector<uint8_t> want(static_cast<size_t>(n) + 1, kPoison), got(want.size());
  int64_t want_inexact = -1;
  ASSERT_EQ(mixprec_act_pool_encode(hidx.data(), n, HO, WO, WO, 1, good, want.data() + 1,
                                    &want_inexact),
            MIXPREC_OK);
  ASSERT_EQ(cudaMemcpy(got.data(), dcodes_out.p, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(got, want) << "codes + 1";
  int64_t got_inexact = -1;
  ASSERT_EQ(cudaMemcpy(&got_inexact, dinexact.p, sizeof got_inexact, cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(got_inexact, want_inexact) << "codes + 1: *inexact";
}

}  // namespace

#endif  // MIXPREC_TEST_CUDA
