// mixprec_unscale(): fused multi-tensor unscale + inf/NaN check + norms, on
// every ISA path this CPU supports, against an element-by-element reference
// written here (reference conversions from test_util.h, float multiply).
#include <algorithm>
#include <cfloat>
#include <cstdlib>
#include <tuple>

#include "test_util.h"

// The chunk kernels are internal (c_ops/src/internal.h); their vector
// variants are declared only for x86 builds, which CMake marks with
// MIXPREC_X86 on the library target alone.
#if (defined(__x86_64__) || defined(__i386__)) && !defined(MIXPREC_X86)
#define MIXPREC_X86 1
#endif
// internal.h has no extern "C" of its own (it is a C header).
extern "C" {
#include "internal.h"
}

namespace {

using mpt::Buf;
using mpt::f32_bits;
using mpt::f32_from_bits;

const mixprec_dtype kDtypes[] = {MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16};

// Bit patterns of +inf, -inf, a quiet NaN, a negative NaN and a signalling
// NaN in each dtype.
std::vector<uint32_t> nonfinite_patterns(mixprec_dtype d) {
  switch (d) {
    case MIXPREC_F16: return {0x7c00u, 0xfc00u, 0x7e00u, 0xfe00u, 0x7c01u};
    case MIXPREC_BF16: return {0x7f80u, 0xff80u, 0x7fc0u, 0xffc0u, 0x7f81u};
    default: return {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u, 0x7f800001u};
  }
}

// Result of one mixprec_unscale call on a list of buffers.
struct UnscaleResult {
  mixprec_status status;
  float found_inf;
  std::vector<float> norm_sq;
  float total;
};

UnscaleResult run_unscale(std::vector<Buf> &bufs, float inv_scale, float found_inf_in = 0.0f,
                bool want_norm = true, bool want_total = true) {
  std::vector<mixprec_tensor> list;
  for (Buf &b : bufs) list.push_back(b.tensor());
  UnscaleResult r;
  r.found_inf = found_inf_in;
  r.norm_sq.assign(bufs.size(), -123.0f);  // poison: must be overwritten
  r.total = -456.0f;
  r.status = mixprec_unscale(list.data(), int64_t(list.size()), &inv_scale, &r.found_inf,
                             want_norm ? r.norm_sq.data() : nullptr, want_total ? &r.total : nullptr);
  return r;
}

// Checks a finished run against the reference: every tensor bit for bit,
// found_inf, and per-tensor/total norms within 1e-6 relative of a long double
// sum over the stored outputs.
void check_against_reference(const std::vector<Buf> &inputs, const std::vector<Buf> &outputs,
                             float inv_scale, float found_inf_in, const UnscaleResult &r,
                             const std::string &what) {
  ASSERT_EQ(r.status, MIXPREC_OK) << what;
  bool nonfinite = false;
  long double total = 0.0L;
  for (size_t t = 0; t < inputs.size(); t++) {
    const Buf want = mpt::ref_unscale(inputs[t], inv_scale, &nonfinite);
    const std::string tw = what + " tensor " + std::to_string(t);
    EXPECT_EQ(mpt::count_mismatches(outputs[t], want, tw), 0) << tw;
    const long double n = mpt::ref_norm_sq(outputs[t]);
    mpt::expect_close_rel(r.norm_sq[t], n, 1e-6, tw + " norm_sq");
    total += n;
  }
  mpt::expect_close_rel(r.total, total, 1e-6, what + " total_norm_sq");
  const float want_flag = nonfinite ? 1.0f : found_inf_in;
  EXPECT_EQ(f32_bits(r.found_inf), f32_bits(want_flag)) << what << " found_inf";
}

// -------------------------------------------------------------------------
// Parametrised over dtype x ISA path. Paths this CPU cannot run are skipped
// (reported as skipped, not silently passed).
class UnscaleTest : public ::testing::TestWithParam<std::tuple<mixprec_dtype, mixprec_cpu_isa>> {
 protected:
  void SetUp() override {
    dtype_ = std::get<0>(GetParam());
    isa_ = std::get<1>(GetParam());
    if (!mixprec_cpu_isa_supported(isa_)) GTEST_SKIP() << mpt::isa_name(isa_) << " not supported here";
    ASSERT_EQ(mixprec_set_cpu_isa(isa_), MIXPREC_OK);
    ASSERT_EQ(mixprec_get_cpu_isa(), isa_);
  }
  std::mt19937 rng_{mpt::kSeed};
  mixprec_dtype dtype_ = MIXPREC_F32;
  mixprec_cpu_isa isa_ = MIXPREC_ISA_SCALAR;
  mpt::GlobalStateGuard guard_;
  // Salts the generator with the parameter so each instance draws its own data.
  void seed(uint32_t salt) { rng_.seed(mpt::kSeed + salt * 131u + uint32_t(dtype_) * 7u + uint32_t(isa_)); }
};

// Sizes around every vector width (8, 16, 32), the 2^16 chunk boundary and
// large odd lengths, each alone in a list, each misaligned by one element
// half the time, with a spread of inv_scale values (incl. ones that overflow
// FP16/BF16 outputs and ones that drive outputs subnormal or to zero).
TEST_P(UnscaleTest, MatchesReferenceBitForBit) {
  seed(1);
  const int64_t sizes[] = {0, 1, 2, 7, 8, 15, 16, 17, 31, 32, 33, 63, 65, 4097, 65535, 65536, 65537, 200003};
  const float scales[] = {1.0f / 65536.0f, std::ldexp(1.0f, -20), 0.1f, 1.0f, 3.0f, 1e-30f, 1234.5f};
  int k = 0;
  for (int64_t n : sizes) {
    for (float inv : scales) {
      if (n > 4097 && (k++ % 3) != 0) continue;  // keep the big sizes to a few scales
      Buf in(dtype_, n, (n & 1) != 0);
      mpt::fill_random(in, rng_);
      std::vector<Buf> bufs = {in};
      const UnscaleResult r = run_unscale(bufs, inv);
      check_against_reference({in}, bufs, inv, 0.0f, r,
                              "n=" + std::to_string(n) + " inv=" + std::to_string(inv));
      // fill_random makes only finite values: clean data leaves found_inf 0.
      EXPECT_EQ(f32_bits(r.found_inf), 0u);
    }
  }
}

// A random inv_scale per call (not just powers of two), so the multiply
// really rounds.
TEST_P(UnscaleTest, RandomInvScales) {
  seed(2);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> expo(-24, 4);
  std::uniform_int_distribution<int64_t> size(0, 3000);
  for (int it = 0; it < 40; it++) {
    const float inv = std::ldexp(mant(rng_), expo(rng_));
    Buf in(dtype_, size(rng_), it & 1);
    mpt::fill_random(in, rng_);
    std::vector<Buf> bufs = {in};
    const UnscaleResult r = run_unscale(bufs, inv);
    check_against_reference({in}, bufs, inv, 0.0f, r, "inv=" + std::to_string(inv));
  }
}

// inv_scale is not restricted by the contract: zero (signed zeros out),
// negative (flips signs), inf (0 * inf = NaN) and NaN must still match the
// reference element for element, and found_inf still looks at inputs only.
TEST_P(UnscaleTest, UnusualInvScales) {
  seed(7);
  Buf in(dtype_, 1000, true);
  mpt::fill_random(in, rng_);
  for (float inv : {0.0f, -0.0f, -1.0f, -std::ldexp(1.0f, -16), INFINITY, -INFINITY, NAN}) {
    std::vector<Buf> bufs = {in};
    const UnscaleResult r = run_unscale(bufs, inv);
    check_against_reference({in}, bufs, inv, 0.0f, r, "inv=" + std::to_string(inv));
    EXPECT_EQ(f32_bits(r.found_inf), 0u) << inv;
  }
}

// inf, -inf and NaNs (quiet, negative, signalling) at the first, middle and
// last element: found_inf becomes exactly 1.0f, the bad element becomes the
// reference's inf/NaN, and every other element is still unscaled. Also with
// the bad value in the vector body vs. the scalar tail (size 70001).
TEST_P(UnscaleTest, NonFiniteAtFirstMiddleLast) {
  seed(3);
  for (int64_t n : {int64_t(1), int64_t(17), int64_t(33), int64_t(70001)}) {
    Buf base(dtype_, n);
    mpt::fill_random(base, rng_);
    for (int64_t pos : {int64_t(0), n / 2, n - 1}) {
      for (uint32_t bad : nonfinite_patterns(dtype_)) {
        Buf in = base;
        in.set_raw(pos, bad);
        std::vector<Buf> bufs = {in};
        const float inv = 1.0f / 1024.0f;
        const UnscaleResult r = run_unscale(bufs, inv);
        const std::string what = "n=" + std::to_string(n) + " pos=" + std::to_string(pos);
        check_against_reference({in}, bufs, inv, 0.0f, r, what);
        EXPECT_EQ(r.found_inf, 1.0f) << what;
        EXPECT_FALSE(std::isfinite(r.norm_sq[0])) << what << ": norm of a tensor with inf/NaN";
        EXPECT_FALSE(std::isfinite(r.total)) << what;
        const bool is_nan = Buf::is_nan_bits(dtype_, bad);
        EXPECT_EQ(bufs[0].is_nan(pos), is_nan) << what;
        if (!is_nan) {
          EXPECT_EQ(bufs[0].raw(pos), bad) << what << ": inf * inv_scale stays the same inf";
          EXPECT_EQ(r.norm_sq[0], INFINITY) << what;
        } else {
          EXPECT_TRUE(std::isnan(r.norm_sq[0])) << what;
        }
      }
    }
  }
}

// found_inf is only ever set, never cleared: a preset 1 survives clean data,
// an arbitrary nonzero preset survives clean data unchanged, and a preset 0
// stays exactly +0.
TEST_P(UnscaleTest, FoundInfIsNeverCleared) {
  seed(4);
  Buf in(dtype_, 1000);
  mpt::fill_random(in, rng_);
  for (float preset : {1.0f, 0.5f, -3.0f, 0.0f}) {
    std::vector<Buf> bufs = {in};
    const UnscaleResult r = run_unscale(bufs, 0.25f, preset);
    check_against_reference({in}, bufs, 0.25f, preset, r, "preset " + std::to_string(preset));
    EXPECT_EQ(f32_bits(r.found_inf), f32_bits(preset));
  }
  // With an inf present a nonzero preset becomes 1.0f (the flag value).
  Buf with_inf = in;
  with_inf.set_raw(500, nonfinite_patterns(dtype_)[0]);
  std::vector<Buf> bufs = {with_inf};
  EXPECT_EQ(run_unscale(bufs, 0.25f, 0.5f).found_inf, 1.0f);
}

// Output overflow does not count: found_inf looks at the inputs only (as
// torch's check does). Finite inputs times a large inv_scale become inf.
TEST_P(UnscaleTest, OutputOverflowIsNotAnInputNonFinite) {
  const float big = dtype_ == MIXPREC_F16 ? 60000.0f : 3.0e38f;
  Buf in(dtype_, 40);
  for (int64_t i = 0; i < in.numel(); i++) in.set_value(i, (i & 1) ? -big : big);
  std::vector<Buf> bufs = {in};
  const UnscaleResult r = run_unscale(bufs, 4.0f);
  check_against_reference({in}, bufs, 4.0f, 0.0f, r, "overflowing outputs");
  EXPECT_EQ(f32_bits(r.found_inf), 0u);
  for (int64_t i = 0; i < 40; i++) EXPECT_TRUE(std::isinf(bufs[0].value(i))) << i;
}

// Subnormals in and out, never flushed: every subnormal pattern of the dtype
// (all of them for FP16/BF16, a random sample for FP32) scaled by several
// factors, and normal values pushed into the subnormal range by 2^-20.
TEST_P(UnscaleTest, SubnormalInputsAndOutputsExact) {
  seed(5);
  std::vector<uint32_t> pats;
  if (dtype_ == MIXPREC_F32) {
    std::uniform_int_distribution<uint32_t> m(1, 0x7fffffu);
    for (int i = 0; i < 4000; i++) pats.push_back(m(rng_) | ((rng_() & 1u) << 31));
    pats.push_back(1u);
    pats.push_back(0x7fffffu);
  } else {
    const uint32_t max_sub = dtype_ == MIXPREC_F16 ? 0x3ffu : 0x7fu;
    for (uint32_t m = 1; m <= max_sub; m++) {
      pats.push_back(m);
      pats.push_back(m | 0x8000u);
    }
  }
  Buf sub(dtype_, int64_t(pats.size()), true);
  for (size_t i = 0; i < pats.size(); i++) sub.set_raw(int64_t(i), pats[i]);
  for (float inv : {1.0f, 0.5f, 0.75f, 3.0f, 1024.0f, std::ldexp(1.0f, -20)}) {
    std::vector<Buf> bufs = {sub};
    const UnscaleResult r = run_unscale(bufs, inv);
    check_against_reference({sub}, bufs, inv, 0.0f, r, "subnormal in, inv=" + std::to_string(inv));
  }

  // Normal inputs that 2^-20 sends into the dtype's subnormal range.
  // FP16: 2^-4..2^0 times 2^-20 lands in [2^-24, 2^-20), FP16 subnormals;
  // FP32/BF16: 2^-115..2^-111 times 2^-20 lands below 2^-126.
  const float lo = dtype_ == MIXPREC_F16 ? std::ldexp(1.0f, -4) : std::ldexp(1.0f, -115);
  Buf in(dtype_, 5000);
  std::uniform_real_distribution<float> u(1.0f, 16.0f);
  for (int64_t i = 0; i < in.numel(); i++) in.set_value(i, (i & 1 ? -lo : lo) * u(rng_));
  std::vector<Buf> bufs = {in};
  const UnscaleResult r = run_unscale(bufs, std::ldexp(1.0f, -20));
  check_against_reference({in}, bufs, std::ldexp(1.0f, -20), 0.0f, r, "subnormal out");
  int64_t subnormal_out = 0;
  for (int64_t i = 0; i < in.numel(); i++) {
    const float v = bufs[0].value(i);
    if (v != 0.0f && std::fabs(v) < (dtype_ == MIXPREC_F16 ? std::ldexp(1.0f, -14) : FLT_MIN))
      subnormal_out++;
  }
  EXPECT_GT(subnormal_out, in.numel() / 2) << "test data must really produce subnormals";

  // One known answer per dtype, independent of any reference conversion:
  // the smallest normal halved is the largest-exponent subnormal.
  Buf one(dtype_, 17);
  const uint32_t min_normal = dtype_ == MIXPREC_F16 ? 0x0400u : dtype_ == MIXPREC_BF16 ? 0x0080u : 0x00800000u;
  for (int64_t i = 0; i < 17; i++) one.set_raw(i, min_normal);
  std::vector<Buf> ob = {one};
  ASSERT_EQ(run_unscale(ob, 0.5f).status, MIXPREC_OK);
  for (int64_t i = 0; i < 17; i++) EXPECT_EQ(ob[0].raw(i), min_normal >> 1) << i;
}

// Optional outputs: norms only, total only, neither. The data and found_inf
// must be the same whatever is asked, and each requested norm is right.
TEST_P(UnscaleTest, NormOutputsAreOptional) {
  seed(6);
  std::vector<Buf> in;
  for (int64_t n : {int64_t(100), int64_t(0), int64_t(70000), int64_t(33)}) {
    in.emplace_back(dtype_, n);
    mpt::fill_random(in.back(), rng_);
  }
  in[2].set_raw(12345, nonfinite_patterns(dtype_)[2]);
  std::vector<Buf> full = in;
  const UnscaleResult rf = run_unscale(full, 0.125f);
  check_against_reference(in, full, 0.125f, 0.0f, rf, "both norms");
  for (int mode = 0; mode < 3; mode++) {
    const bool want_norm = mode == 0, want_total = mode == 1;
    std::vector<Buf> bufs = in;
    const UnscaleResult r = run_unscale(bufs, 0.125f, 0.0f, want_norm, want_total);
    ASSERT_EQ(r.status, MIXPREC_OK);
    EXPECT_EQ(r.found_inf, 1.0f);
    for (size_t t = 0; t < in.size(); t++) {
      EXPECT_EQ(mpt::count_mismatches(bufs[t], full[t], "mode " + std::to_string(mode)), 0);
      if (want_norm) { EXPECT_EQ(f32_bits(r.norm_sq[t]), f32_bits(rf.norm_sq[t])) << t; }
      if (!want_norm) { EXPECT_EQ(r.norm_sq[t], -123.0f) << "norm_sq was not passed"; }
    }
    if (want_total) { EXPECT_EQ(f32_bits(r.total), f32_bits(rf.total)); }
    if (!want_total) { EXPECT_EQ(r.total, -456.0f) << "total_norm_sq was not passed"; }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllDtypesAllIsas, UnscaleTest,
    ::testing::Combine(::testing::Values(MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16),
                       ::testing::Values(MIXPREC_ISA_SCALAR, MIXPREC_ISA_AVX2, MIXPREC_ISA_AVX512)),
    [](const ::testing::TestParamInfo<UnscaleTest::ParamType> &info) {
      return std::string(mpt::dtype_name(std::get<0>(info.param))) + "_" +
             mpt::isa_name(std::get<1>(info.param));
    });

// -------------------------------------------------------------------------
// Lists: parametrised over ISA, each list mixing dtypes.
class UnscaleListTest : public ::testing::TestWithParam<mixprec_cpu_isa> {
 protected:
  void SetUp() override {
    if (!mixprec_cpu_isa_supported(GetParam())) GTEST_SKIP() << mpt::isa_name(GetParam()) << " not supported here";
    ASSERT_EQ(mixprec_set_cpu_isa(GetParam()), MIXPREC_OK);
  }
  mpt::GlobalStateGuard guard_;
};

// Random list of `count` tensors of odd sizes and random dtypes; `big`
// tensors are drawn from the sizes around the 2^16 chunk.
std::vector<Buf> random_list(std::mt19937 &rng, int count, int big) {
  const int64_t small[] = {0, 1, 2, 3, 7, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 127, 129, 511, 1000, 4097};
  const int64_t large[] = {65535, 65536, 65537, 131071, 200003};
  std::vector<Buf> v;
  for (int i = 0; i < count; i++) {
    const int64_t n = i < big ? large[rng() % 5] : small[rng() % 20];
    v.emplace_back(kDtypes[rng() % 3], n, (rng() & 1u) != 0);
    mpt::fill_random(v.back(), rng);
  }
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

// Hundreds of tensors of odd sizes and mixed dtypes in one call, with the
// default thread count (so it runs in parallel): every tensor, norm and the
// total must match the reference.
TEST_P(UnscaleListTest, HundredsOfMixedTensors) {
  std::mt19937 rng(mpt::kSeed + 10 + uint32_t(GetParam()));
  for (int round = 0; round < 2; round++) {
    std::vector<Buf> in = random_list(rng, 300, 6);
    if (round == 1) {  // one NaN somewhere in the middle of the list
      for (Buf &b : in)
        if (b.numel() > 100) {
          b.set_raw(b.numel() - 1, nonfinite_patterns(b.dtype())[3]);
          break;
        }
    }
    std::vector<Buf> bufs = in;
    const UnscaleResult r = run_unscale(bufs, 1.0f / 4096.0f);
    check_against_reference(in, bufs, 1.0f / 4096.0f, 0.0f, r, "round " + std::to_string(round));
    EXPECT_EQ(r.found_inf, round == 1 ? 1.0f : 0.0f);
  }
}

// Empty list (tensors may be NULL) and zero-size tensors with NULL data are
// fine; the total of nothing is +0 and found_inf is untouched.
TEST_P(UnscaleListTest, EmptyListAndEmptyTensors) {
  const float inv = 0.5f;
  float found = 0.0f, total = -1.0f;
  EXPECT_EQ(mixprec_unscale(nullptr, 0, &inv, &found, nullptr, &total), MIXPREC_OK);
  EXPECT_EQ(f32_bits(total), 0u);
  EXPECT_EQ(f32_bits(found), 0u);
  found = 1.0f;
  EXPECT_EQ(mixprec_unscale(nullptr, 0, &inv, &found, nullptr, nullptr), MIXPREC_OK);
  EXPECT_EQ(found, 1.0f);

  float x[3] = {2.0f, -4.0f, 8.0f};
  mixprec_tensor list[3] = {{nullptr, 0, MIXPREC_F16}, {x, 3, MIXPREC_F32}, {x, 0, MIXPREC_BF16}};
  float norms[3] = {-1.0f, -1.0f, -1.0f};
  found = 0.0f;
  ASSERT_EQ(mixprec_unscale(list, 3, &inv, &found, norms, &total), MIXPREC_OK);
  EXPECT_EQ(x[0], 1.0f);
  EXPECT_EQ(x[1], -2.0f);
  EXPECT_EQ(x[2], 4.0f);
  EXPECT_EQ(f32_bits(norms[0]), 0u);
  EXPECT_EQ(norms[1], 21.0f);
  EXPECT_EQ(f32_bits(norms[2]), 0u);
  EXPECT_EQ(total, 21.0f);
  EXPECT_EQ(f32_bits(found), 0u);
}

INSTANTIATE_TEST_SUITE_P(AllIsas, UnscaleListTest,
                         ::testing::Values(MIXPREC_ISA_SCALAR, MIXPREC_ISA_AVX2, MIXPREC_ISA_AVX512),
                         [](const ::testing::TestParamInfo<mixprec_cpu_isa> &info) {
                           return std::string(mpt::isa_name(info.param));
                         });

// -------------------------------------------------------------------------
// Determinism: the same list through every supported ISA path and thread
// counts 1, 2, 3 (list > 2^17 elements, so the parallel region is taken)
// gives bit-identical data, found_inf, per-tensor norms and total.
TEST(UnscaleDeterminism, BitIdenticalAcrossIsasAndThreadCounts) {
  mpt::GlobalStateGuard guard;
  std::mt19937 rng(mpt::kSeed + 20);
  std::vector<Buf> in = random_list(rng, 60, 12);
  int64_t total_elems = 0;
  for (const Buf &b : in) total_elems += b.numel();
  ASSERT_GT(total_elems, int64_t(1) << 17);
  const float inv = 0.37f;

  // Reference result first (also validates it).
  std::vector<Buf> first = in;
  ASSERT_EQ(mixprec_set_cpu_isa(MIXPREC_ISA_SCALAR), MIXPREC_OK);
  mixprec_set_num_threads(1);
  const UnscaleResult r0 = run_unscale(first, inv);
  check_against_reference(in, first, inv, 0.0f, r0, "scalar, 1 thread");

  for (mixprec_cpu_isa isa : mpt::supported_isas()) {
    ASSERT_EQ(mixprec_set_cpu_isa(isa), MIXPREC_OK);
    for (int threads : {1, 2, 3}) {
      mixprec_set_num_threads(threads);
      std::vector<Buf> bufs = in;
      const UnscaleResult r = run_unscale(bufs, inv);
      const std::string what = std::string(mpt::isa_name(isa)) + " threads=" + std::to_string(threads);
      ASSERT_EQ(r.status, MIXPREC_OK) << what;
      for (size_t t = 0; t < in.size(); t++) {
        // Exact bits here, NaN payloads included (there are none: clean data).
        int64_t diff = 0;
        for (int64_t i = 0; i < in[t].numel(); i++) diff += bufs[t].raw(i) != first[t].raw(i);
        EXPECT_EQ(diff, 0) << what << " tensor " << t;
        EXPECT_EQ(f32_bits(r.norm_sq[t]), f32_bits(r0.norm_sq[t])) << what << " norm " << t;
      }
      EXPECT_EQ(f32_bits(r.total), f32_bits(r0.total)) << what << " total";
      EXPECT_EQ(f32_bits(r.found_inf), f32_bits(r0.found_inf)) << what;
    }
  }
}

// A single huge-exponent-range tensor makes the double sum order-sensitive:
// norms must still agree to the bit between paths and thread counts.
TEST(UnscaleDeterminism, OrderSensitiveNormsStillIdentical) {
  mpt::GlobalStateGuard guard;
  std::mt19937 rng(mpt::kSeed + 21);
  std::vector<Buf> in;
  for (int i = 0; i < 3; i++) {
    in.emplace_back(MIXPREC_F32, 150001);
    mpt::fill_random(in.back(), rng, -60, 50);  // squares up to 2^102: total stays finite
  }
  std::vector<uint32_t> norm_bits;
  for (mixprec_cpu_isa isa : mpt::supported_isas()) {
    ASSERT_EQ(mixprec_set_cpu_isa(isa), MIXPREC_OK);
    for (int threads : {1, 2, 3}) {
      mixprec_set_num_threads(threads);
      std::vector<Buf> bufs = in;
      const UnscaleResult r = run_unscale(bufs, 1.0f);
      std::vector<uint32_t> bits = {f32_bits(r.total)};
      for (float n : r.norm_sq) bits.push_back(f32_bits(n));
      if (norm_bits.empty()) {
        check_against_reference(in, bufs, 1.0f, 0.0f, r, "wide range");
        norm_bits = bits;
      }
      EXPECT_EQ(bits, norm_bits) << mpt::isa_name(isa) << " threads=" << threads;
    }
  }
}

// The norm is only thread- and path-independent because every chunk kernel
// sums squares in one canonical order (element i of a chunk into double lane
// i % 16, lanes added 0..15). The public float result hides most order
// differences, so check the kernels' double partial sums directly, bit for
// bit, against that order, with data spread over a wide exponent range so a
// different order really rounds differently.
TEST(UnscaleChunkKernels, NormPartialsFollowCanonicalOrder) {
  mpt::GlobalStateGuard guard;
  struct Kernel { mixprec_cpu_isa isa; mixprec__unscale_chunk_fn fn; };
  std::vector<Kernel> kernels = {{MIXPREC_ISA_SCALAR, mixprec__unscale_chunk_scalar}};
#if defined(MIXPREC_X86)
  kernels.push_back({MIXPREC_ISA_AVX2, mixprec__unscale_chunk_avx2});
  kernels.push_back({MIXPREC_ISA_AVX512, mixprec__unscale_chunk_avx512});
#endif
  std::mt19937 rng(mpt::kSeed + 40);
  const int64_t sizes[] = {0, 1, 15, 16, 17, 31, 32, 33, 47, 100, 4097, 65536};
  int checked = 0;
  for (const Kernel &k : kernels) {
    if (!mixprec_cpu_isa_supported(k.isa)) continue;
    for (mixprec_dtype d : kDtypes) {
      for (int64_t n : sizes) {
        Buf in(d, n, (n & 1) != 0);
        if (d == MIXPREC_F32) mpt::fill_random(in, rng, -60, 40);
        else mpt::fill_random(in, rng, -24, 14);  // FP16 max 65504 < 2^15 * 2
        const float inv = 0.71f;
        bool nonfinite = false;
        const Buf want = mpt::ref_unscale(in, inv, &nonfinite);
        double lanes[16] = {0};
        for (int64_t i = 0; i < n; i++) {
          const double v = want.value(i);
          lanes[i % 16] += v * v;
        }
        double want_norm = 0.0;
        for (double l : lanes) want_norm += l;

        Buf got = in;
        int flag = 0;
        double norm = -1.0;
        k.fn(got.data(), d, n, inv, &flag, &norm);
        const std::string what = std::string(mpt::isa_name(k.isa)) + " " + mpt::dtype_name(d) +
                                 " n=" + std::to_string(n);
        EXPECT_EQ(std::memcmp(&norm, &want_norm, sizeof norm), 0)
            << what << ": partial " << norm << " canonical " << want_norm;
        EXPECT_EQ(mpt::count_mismatches(got, want, what), 0);
        ASSERT_FALSE(nonfinite) << what << ": test data must be finite";
        EXPECT_EQ(flag, 0) << what;
        // Without a norm pointer the data are the same and nothing else.
        Buf got2 = in;
        k.fn(got2.data(), d, n, inv, &flag, nullptr);
        EXPECT_EQ(mpt::count_mismatches(got2, want, what + " no norm"), 0);
        checked++;
      }
    }
  }
  EXPECT_GE(checked, 3 * 12);
}

// -------------------------------------------------------------------------
// Errors: each returns its status and writes nothing: data, found_inf and
// the norm outputs are poisoned beforehand and compared afterwards.
class UnscaleErrors : public ::testing::TestWithParam<mixprec_dtype> {
 protected:
  void SetUp() override {
    std::mt19937 rng(mpt::kSeed + 30 + uint32_t(GetParam()));
    // A valid tensor holding an inf first, so any partial processing before
    // the bad descriptor would show in its data and in found_inf.
    bufs_.emplace_back(GetParam(), 70000);
    mpt::fill_random(bufs_[0], rng);
    bufs_[0].set_raw(3, nonfinite_patterns(GetParam())[0]);
    bufs_.emplace_back(GetParam(), 33);
    mpt::fill_random(bufs_[1], rng);
    saved_ = bufs_;
    for (Buf &b : bufs_) list_.push_back(b.tensor());
  }
  // Calls mixprec_unscale with the current list_ and arguments; expects
  // `want` and that nothing was written.
  void expect_error(mixprec_status want, int64_t n, bool null_tensors, bool null_inv,
                    bool null_found, const char *what) {
    const float inv = 0.5f;
    float found = 0.25f, total = -7.0f;
    float norms[2] = {-5.0f, -6.0f};
    const mixprec_status st = mixprec_unscale(null_tensors ? nullptr : list_.data(), n,
                                              null_inv ? nullptr : &inv,
                                              null_found ? nullptr : &found, norms, &total);
    EXPECT_EQ(st, want) << what << ": got " << mixprec_status_string(st);
    EXPECT_EQ(found, 0.25f) << what << ": found_inf written";
    EXPECT_EQ(norms[0], -5.0f) << what << ": norm_sq written";
    EXPECT_EQ(norms[1], -6.0f) << what << ": norm_sq written";
    EXPECT_EQ(total, -7.0f) << what << ": total_norm_sq written";
    for (size_t t = 0; t < bufs_.size(); t++) {
      int64_t diff = 0;
      for (int64_t i = 0; i < saved_[t].numel(); i++) diff += bufs_[t].raw(i) != saved_[t].raw(i);
      EXPECT_EQ(diff, 0) << what << ": tensor " << t << " data written";
    }
  }
  std::vector<Buf> bufs_, saved_;
  std::vector<mixprec_tensor> list_;
};

TEST_P(UnscaleErrors, NullPointers) {
  expect_error(MIXPREC_ERR_NULL_POINTER, 2, true, false, false, "tensors NULL with n>0");
  expect_error(MIXPREC_ERR_NULL_POINTER, 2, false, true, false, "inv_scale NULL");
  expect_error(MIXPREC_ERR_NULL_POINTER, 2, false, false, true, "found_inf NULL");
  list_[1].data = nullptr;  // numel 33 > 0
  expect_error(MIXPREC_ERR_NULL_POINTER, 2, false, false, false, "data NULL with numel>0");
}

TEST_P(UnscaleErrors, NegativeCounts) {
  expect_error(MIXPREC_ERR_BAD_SIZE, -1, false, false, false, "n_tensors -1");
  expect_error(MIXPREC_ERR_BAD_SIZE, INT64_MIN, false, false, false, "n_tensors INT64_MIN");
  list_[1].numel = -1;
  expect_error(MIXPREC_ERR_BAD_SIZE, 2, false, false, false, "numel -1");
  list_[1].numel = INT64_MIN;
  expect_error(MIXPREC_ERR_BAD_SIZE, 2, false, false, false, "numel INT64_MIN");
}

TEST_P(UnscaleErrors, BadDtype) {
  for (int bad : {7, 3, -1, 255}) {
    mpt::poke_enum(&list_[1].dtype, bad);
    expect_error(MIXPREC_ERR_BAD_DTYPE, 2, false, false, false,
                 ("dtype " + std::to_string(bad)).c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, UnscaleErrors,
                         ::testing::Values(MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16),
                         [](const ::testing::TestParamInfo<mixprec_dtype> &info) {
                           return std::string(mpt::dtype_name(info.param));
                         });

// -------------------------------------------------------------------------
// Dispatch and thread controls.
TEST(CpuDispatch, SetGetAndUnsupported) {
  mpt::GlobalStateGuard guard;
  EXPECT_TRUE(mixprec_cpu_isa_supported(MIXPREC_ISA_AUTO));
  EXPECT_TRUE(mixprec_cpu_isa_supported(MIXPREC_ISA_SCALAR));
  ASSERT_EQ(mixprec_set_cpu_isa(MIXPREC_ISA_AUTO), MIXPREC_OK);
  const mixprec_cpu_isa best = mixprec_get_cpu_isa();
  EXPECT_NE(best, MIXPREC_ISA_AUTO) << "get never returns AUTO";
  EXPECT_TRUE(mixprec_cpu_isa_supported(best));
  // AUTO picks the best supported path (unless MIXPREC_CPU_ISA overrides).
  if (!std::getenv("MIXPREC_CPU_ISA")) {
    const std::vector<mixprec_cpu_isa> sup = mpt::supported_isas();
    EXPECT_EQ(best, sup.back());
  }
  for (mixprec_cpu_isa isa : mpt::all_isas()) {
    ASSERT_EQ(mixprec_set_cpu_isa(MIXPREC_ISA_SCALAR), MIXPREC_OK);
    if (mixprec_cpu_isa_supported(isa)) {
      EXPECT_EQ(mixprec_set_cpu_isa(isa), MIXPREC_OK);
      EXPECT_EQ(mixprec_get_cpu_isa(), isa);
    } else {
      EXPECT_EQ(mixprec_set_cpu_isa(isa), MIXPREC_ERR_UNSUPPORTED) << mpt::isa_name(isa);
      EXPECT_EQ(mixprec_get_cpu_isa(), MIXPREC_ISA_SCALAR) << "a refused set changes nothing";
    }
  }
  ASSERT_EQ(mixprec_set_cpu_isa(MIXPREC_ISA_SCALAR), MIXPREC_OK);
  for (int bad : {4, 99, -1}) {
    EXPECT_EQ(mpt::call_with_int(&mixprec_set_cpu_isa, bad), MIXPREC_ERR_BAD_ARGUMENT) << bad;
    EXPECT_EQ(mpt::call_with_int(&mixprec_cpu_isa_supported, bad), 0) << bad;
  }
  EXPECT_EQ(mixprec_get_cpu_isa(), MIXPREC_ISA_SCALAR);
}

// The environment variable steers AUTO; an unsupported or unknown name falls
// back to the best path.
TEST(CpuDispatch, EnvironmentVariableSteersAuto) {
  mpt::GlobalStateGuard guard;
  const char *old = std::getenv("MIXPREC_CPU_ISA");
  const std::string saved = old ? old : "";
  ASSERT_EQ(setenv("MIXPREC_CPU_ISA", "scalar", 1), 0);
  ASSERT_EQ(mixprec_set_cpu_isa(MIXPREC_ISA_AUTO), MIXPREC_OK);
  EXPECT_EQ(mixprec_get_cpu_isa(), MIXPREC_ISA_SCALAR);
  ASSERT_EQ(setenv("MIXPREC_CPU_ISA", "avx512", 1), 0);
  ASSERT_EQ(mixprec_set_cpu_isa(MIXPREC_ISA_AUTO), MIXPREC_OK);
  EXPECT_EQ(mixprec_get_cpu_isa(), mixprec_cpu_isa_supported(MIXPREC_ISA_AVX512)
                                       ? MIXPREC_ISA_AVX512
                                       : mpt::supported_isas().back())
      << "an unsupported request falls back to the best path";
  ASSERT_EQ(setenv("MIXPREC_CPU_ISA", "no-such-isa", 1), 0);
  ASSERT_EQ(mixprec_set_cpu_isa(MIXPREC_ISA_AUTO), MIXPREC_OK);
  EXPECT_EQ(mixprec_get_cpu_isa(), mpt::supported_isas().back());
  if (old) setenv("MIXPREC_CPU_ISA", saved.c_str(), 1);
  else unsetenv("MIXPREC_CPU_ISA");
}

TEST(CpuDispatch, NumThreads) {
  mpt::GlobalStateGuard guard;
  mixprec_set_num_threads(0);
  const int def = mixprec_get_num_threads();
  EXPECT_GE(def, 1);
  mixprec_set_num_threads(3);
  const int three = mixprec_get_num_threads();
  EXPECT_TRUE(three == 3 || three == 1) << "3 with OpenMP, 1 without: " << three;
  mixprec_set_num_threads(-5);  // treated as 0: the default again
  EXPECT_EQ(mixprec_get_num_threads(), def);
  mixprec_set_num_threads(0);
  EXPECT_EQ(mixprec_get_num_threads(), def);
}

}  // namespace
