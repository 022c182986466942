// mixprec_act_mask and mixprec_act_unpack_norm_relu (mixprec/act_pack.h,
// [note: norm_relu recompute]) against references written here: the mask
// from each element's value (x > 0, NaN not), the recomputed ReLU output
// from the values mixprec_act_unpack gives (F32; that function has its own
// reference in test_act_pack.cc) with the header's formula, fl(fl(x * a) +
// b), kept elements at least the dtype's smallest normal, NaN as the fixed
// NaN, rounded by the test's own converters. Every ISA and 1 / 2 threads,
// past the threading limit (2^17), NCHW-like (inner > 1) and channels-last
// (inner = 1) channel layouts, odd lengths; bad arguments write nothing.
#include <cmath>
#include <cstring>
#include <vector>

#include "test_util.h"

namespace {

using mpt::Buf;

const mixprec_dtype kDtypes[] = {MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16};

uint32_t fixed_nan(mixprec_dtype d) {
  return d == MIXPREC_F32 ? 0x7fc00000u : d == MIXPREC_F16 ? 0x7e00u : 0x7fc0u;
}

// Values a BatchNorm input holds (normal around a channel offset), with
// zeros, -0, specials and subnormals sprinkled in.
void fill(Buf &x, std::mt19937 &rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (int64_t i = 0; i < x.numel(); i++) {
    const uint32_t k = rng() % 100;
    float v = g(rng) * 3.0f + 0.5f;
    if (k < 5) v = 0.0f;
    else if (k < 7) v = -0.0f;
    else if (k == 7) v = 1e-40f;
    x.set_value(i, v);
  }
}

std::vector<uint8_t> ref_mask(const Buf &x) {
  std::vector<uint8_t> m(size_t((x.numel() + 7) / 8), 0);
  for (int64_t i = 0; i < x.numel(); i++) {
    const float v = x.value(i);
    if (!std::isnan(v) && v > 0.0f) m[size_t(i / 8)] |= uint8_t(1u << (i % 8));
  }
  return m;
}

std::vector<uint8_t> lib_mask(const Buf &x) {
  std::vector<uint8_t> m(size_t((x.numel() + 7) / 8), 0xa5);
  EXPECT_EQ(mixprec_act_mask(const_cast<Buf &>(x).data(), x.dtype(), x.numel(), m.data()),
            MIXPREC_OK);
  return m;
}

struct Packed {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
};

Packed pack(Buf &x, int bits, int64_t block, uint64_t seed) {
  Packed p;
  int64_t cb = 0, ns = 0;
  EXPECT_EQ(mixprec_act_packed_size(x.numel(), bits, block, &cb, &ns), MIXPREC_OK);
  p.codes.assign(size_t(cb), 0);
  p.scales.assign(size_t(ns), 0.0f);
  EXPECT_EQ(mixprec_act_pack(x.data(), x.dtype(), x.numel(), bits, block, seed, p.codes.data(),
                             p.scales.data()),
            MIXPREC_OK);
  return p;
}

uint32_t ref_round(float f, mixprec_dtype d) {
  if (std::isnan(f)) return fixed_nan(d);
  if (d == MIXPREC_F32) return mpt::f32_bits(f);
  return d == MIXPREC_F16 ? mpt::ref_f32_to_f16(f) : mpt::ref_f32_to_bf16(f);
}

Buf ref_norm_relu(const Packed &p, int64_t n, int bits, int64_t block, const std::vector<float> &a,
                  const std::vector<float> &b, int64_t inner, const std::vector<uint8_t> &mask,
                  mixprec_dtype d) {
  Buf xf(MIXPREC_F32, n);
  EXPECT_EQ(mixprec_act_unpack(p.codes.data(), p.scales.data(), n, bits, block, xf.data(),
                               MIXPREC_F32),
            MIXPREC_OK);
  const int64_t channels = int64_t(a.size());
  const float tiny = d == MIXPREC_F16 ? 0x1p-14f : 0x1p-126f;
  Buf out(d, n);
  for (int64_t i = 0; i < n; i++) {
    const int64_t c = (i / inner) % channels;
    volatile float prod = xf.value(i) * a[size_t(c)];  // one rounding each, never fused
    const float v = prod + b[size_t(c)];
    float r = 0.0f;
    if (mask[size_t(i / 8)] >> (i % 8) & 1) r = std::isnan(v) ? NAN : (v < tiny ? tiny : v);
    out.set_raw(i, ref_round(r, d));
  }
  return out;
}

Buf lib_norm_relu(const Packed &p, int64_t n, int bits, int64_t block, const std::vector<float> &a,
                  const std::vector<float> &b, int64_t inner, const std::vector<uint8_t> &mask,
                  mixprec_dtype d) {
  Buf out(d, n, true);
  for (int64_t i = 0; i < n; i++) out.set_raw(i, d == MIXPREC_F32 ? 0x7fa5a5a5u : 0x7da5u);
  EXPECT_EQ(mixprec_act_unpack_norm_relu(p.codes.data(), p.scales.data(), n, bits, block,
                                         a.data(), b.data(), int64_t(a.size()), inner,
                                         mask.data(), out.data(), d),
            MIXPREC_OK);
  return out;
}

int64_t mismatches(const Buf &got, const Buf &want, const std::string &what) {
  int64_t bad = 0;
  for (int64_t i = 0; i < want.numel(); i++)
    if (got.raw(i) != want.raw(i) && bad++ < 5)
      ADD_FAILURE() << what << ": element " << i << " got 0x" << std::hex << got.raw(i)
                    << " want 0x" << want.raw(i);
  return bad;
}

TEST(ActMask, MatchesReferenceOnEveryIsaAndThreadCount) {
  mpt::GlobalStateGuard guard;
  std::mt19937 rng(mpt::kSeed + 901);
  for (mixprec_dtype d : kDtypes)
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{9}, int64_t{1000},
                      (int64_t(1) << 17) + 13}) {
      Buf x(d, n, true);
      fill(x, rng);
      // every special value somewhere
      const uint32_t specials[] = {0u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00001u,
                                   0xffc00000u, 1u, 0x80000001u};
      for (int k = 0; k < 8 && k < n; k++) {
        uint32_t u = specials[k];
        if (d != MIXPREC_F32) u = d == MIXPREC_BF16 ? u >> 16 | (u & 1u) : (u >> 16 == 0x7f80u ? 0x7c00u : u >> 16 == 0xff80u ? 0xfc00u : u >> 16 == 0x7fc0u ? 0x7e01u : u >> 16 == 0xffc0u ? 0xfe00u : (u >> 16) | (u & 1u));
        x.set_raw((k * 131) % n, u);
      }
      const std::vector<uint8_t> want = ref_mask(x);
      for (mixprec_cpu_isa isa : mpt::supported_isas())
        for (int threads : {1, 2}) {
          ASSERT_EQ(mixprec_set_cpu_isa(isa), MIXPREC_OK);
          mixprec_set_num_threads(threads);
          EXPECT_EQ(lib_mask(x), want) << mpt::dtype_name(d) << " n " << n << " "
                                       << mpt::isa_name(isa) << " threads " << threads;
        }
    }
}

TEST(ActMask, EverySixteenBitPattern) {
  for (mixprec_dtype d : {MIXPREC_F16, MIXPREC_BF16}) {
    Buf x(d, 65536);
    for (int64_t i = 0; i < 65536; i++) x.set_raw(i, uint32_t(i));
    EXPECT_EQ(lib_mask(x), ref_mask(x)) << mpt::dtype_name(d);
  }
}

TEST(ActNormRelu, MatchesReferenceOnEveryIsaAndThreadCount) {
  mpt::GlobalStateGuard guard;
  std::mt19937 rng(mpt::kSeed + 902);
  struct Layout { int64_t channels, inner; };
  const Layout layouts[] = {{3, 49}, {64, 1}, {5, 1000}, {1, 7}, {7, 1}, {2, 4096 + 3}};
  for (mixprec_dtype d : kDtypes)
    for (int bits : {8, 4})
      for (int64_t block : {int64_t{32}, int64_t{256}})
        for (const Layout &l : layouts)
          for (int64_t n : {int64_t{37}, int64_t{4096 * 3 + 5}, (int64_t(1) << 17) + 333}) {
            Buf x(d, n);
            fill(x, rng);
            if (n > 500) x.set_raw(300, d == MIXPREC_F32 ? 0x7f800000u : d == MIXPREC_F16 ? 0x7c00u : 0x7f80u);
            std::normal_distribution<float> g(0.0f, 1.0f);
            std::vector<float> a(size_t(l.channels)), b(size_t(l.channels));
            for (auto &v : a) v = g(rng);
            for (auto &v : b) v = g(rng);
            // the ReLU's mask: positive where the exact BN output is, plus noise
            std::vector<uint8_t> mask(size_t((n + 7) / 8), 0);
            for (int64_t i = 0; i < n; i++)
              if (rng() % 2) mask[size_t(i / 8)] |= uint8_t(1u << (i % 8));
            const Packed p = pack(x, bits, block, rng());
            const Buf want = ref_norm_relu(p, n, bits, block, a, b, l.inner, mask, d);
            for (mixprec_cpu_isa isa : mpt::supported_isas())
              for (int threads : {1, 2}) {
                ASSERT_EQ(mixprec_set_cpu_isa(isa), MIXPREC_OK);
                mixprec_set_num_threads(threads);
                const std::string what = std::string(mpt::dtype_name(d)) + " bits " +
                                         std::to_string(bits) + " block " + std::to_string(block) +
                                         " C " + std::to_string(l.channels) + " inner " +
                                         std::to_string(l.inner) + " n " + std::to_string(n) +
                                         " " + mpt::isa_name(isa) + " threads " +
                                         std::to_string(threads);
                ASSERT_EQ(mismatches(lib_norm_relu(p, n, bits, block, a, b, l.inner, mask, d),
                                     want, what),
                          0);
              }
          }
}

// The ReLU's mask comes back exact: an element is positive exactly where
// its bit is set, whatever a * x + b gives there (kept elements at least
// the smallest normal; dropped ones +0).
TEST(ActNormRelu, MaskIsExact) {
  std::mt19937 rng(mpt::kSeed + 903);
  for (mixprec_dtype d : kDtypes) {
    const int64_t n = 5000, channels = 4, inner = 25;
    Buf x(d, n);
    fill(x, rng);
    std::vector<float> a = {1.0f, -2.0f, 1e-30f, 0.0f}, b = {-0.5f, 0.25f, -1e-30f, 0.0f};
    std::vector<uint8_t> mask(size_t((n + 7) / 8));
    for (auto &m : mask) m = uint8_t(rng());
    const Packed p = pack(x, 8, 256, 7);
    const Buf y = lib_norm_relu(p, n, 8, 256, a, b, inner, mask, d);
    for (int64_t i = 0; i < n; i++) {
      const bool keep = mask[size_t(i / 8)] >> (i % 8) & 1;
      const float v = y.value(i);
      ASSERT_TRUE(keep ? v > 0.0f : mpt::f32_bits(v) == 0u) << mpt::dtype_name(d) << " " << i;
    }
  }
}

TEST(ActNormRelu, BadArgumentsWriteNothing) {
  const int64_t n = 100;
  Buf x(MIXPREC_BF16, n);
  std::mt19937 rng(mpt::kSeed + 904);
  fill(x, rng);
  const Packed p = pack(x, 8, 32, 1);
  std::vector<float> a(3, 1.0f), b(3, 0.0f);
  std::vector<uint8_t> mask(13, 0xff);
  std::vector<uint16_t> out(n, 0x1234);
  auto call = [&](int64_t nn, int64_t bits, int64_t block, int64_t channels, int64_t inner,
                  mixprec_dtype d, bool null_mask) {
    return mixprec_act_unpack_norm_relu(p.codes.data(), p.scales.data(), nn, bits, block,
                                        a.data(), b.data(), channels, inner,
                                        null_mask ? nullptr : mask.data(), out.data(), d);
  };
  EXPECT_EQ(call(-1, 8, 32, 3, 1, MIXPREC_BF16, false), MIXPREC_ERR_BAD_SIZE);
  EXPECT_EQ(call(n, 3, 32, 3, 1, MIXPREC_BF16, false), MIXPREC_ERR_BAD_ARGUMENT);
  EXPECT_EQ(call(n, 8, 48, 3, 1, MIXPREC_BF16, false), MIXPREC_ERR_BAD_ARGUMENT);
  EXPECT_EQ(call(n, 8, 32, 0, 1, MIXPREC_BF16, false), MIXPREC_ERR_BAD_ARGUMENT);
  EXPECT_EQ(call(n, 8, 32, 3, 0, MIXPREC_BF16, false), MIXPREC_ERR_BAD_ARGUMENT);
  EXPECT_EQ(call(n, 8, 32, 3, 1, mixprec_dtype(99), false), MIXPREC_ERR_BAD_DTYPE);
  EXPECT_EQ(call(n, 8, 32, 3, 1, MIXPREC_BF16, true), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(call(0, 8, 32, 3, 1, MIXPREC_BF16, true), MIXPREC_OK);
  for (uint16_t v : out) ASSERT_EQ(v, 0x1234);
  std::vector<uint8_t> m(13, 0x5a);
  EXPECT_EQ(mixprec_act_mask(x.data(), MIXPREC_BF16, -1, m.data()), MIXPREC_ERR_BAD_SIZE);
  EXPECT_EQ(mixprec_act_mask(x.data(), mixprec_dtype(99), n, m.data()), MIXPREC_ERR_BAD_DTYPE);
  EXPECT_EQ(mixprec_act_mask(nullptr, MIXPREC_BF16, n, m.data()), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(mixprec_act_mask(x.data(), MIXPREC_BF16, n, nullptr), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(mixprec_act_mask(nullptr, MIXPREC_BF16, 0, nullptr), MIXPREC_OK);
  for (uint8_t v : m) ASSERT_EQ(v, 0x5a);
}

}  // namespace
