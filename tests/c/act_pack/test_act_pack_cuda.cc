// mixprec_cuda_act_pack / _unpack against their CPU twins: codes and scales
// byte for byte, unpacked values bit for bit (the format fixes every bit,
// NaNs included: [note: act_pack format]). Built only with CUDA
// (MIXPREC_TEST_CUDA); every test skips itself without a device.
#ifdef MIXPREC_TEST_CUDA

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
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

}  // namespace

#endif  // MIXPREC_TEST_CUDA
