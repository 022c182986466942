// mixprec_unscale(): fused multi-tensor unscale + inf/NaN check + norms, on
// every ISA path this CPU supports, against an element-by-element reference
// written here (reference conversions from test_util.h, float multiply).
#include <algorithm>
#include <cfloat>
#include <cstdio>
#include <cstdlib>
#include <tuple>

#include "test_util.h"

// The chunk kernels are internal (c_ops/src/internal.h).
#include "internal_api.h"

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
  std::vector<float> norms;  // L2 norm of each tensor as stored after unscale
  float total;               // L2 norm of all of them
};

UnscaleResult run_unscale(std::vector<Buf> &bufs, float inv_scale, float found_inf_in = 0.0f,
                bool want_norm = true, bool want_total = true) {
  std::vector<mixprec_tensor> list;
  for (Buf &b : bufs) list.push_back(b.tensor());
  UnscaleResult r;
  r.found_inf = found_inf_in;
  r.norms.assign(bufs.size(), -123.0f);  // poison: must be overwritten
  r.total = -456.0f;
  r.status = mixprec_unscale(list.data(), int64_t(list.size()), &inv_scale, &r.found_inf,
                             want_norm ? r.norms.data() : nullptr, want_total ? &r.total : nullptr);
  return r;
}

void expect_canonical_norms(const std::vector<Buf> &outputs, const UnscaleResult &r,
                            const std::string &what);

// Checks a finished run against the reference: every tensor bit for bit,
// found_inf, and per-tensor/total L2 norms within 1e-6 relative of the square
// root of a long double sum of squares over the stored outputs; and, bit for
// bit, the norms the canonical summation order gives (see chunk_sum below).
void check_against_reference(const std::vector<Buf> &inputs, const std::vector<Buf> &outputs,
                             float inv_scale, float found_inf_in, const UnscaleResult &r,
                             const std::string &what) {
  ASSERT_EQ(r.status, MIXPREC_OK) << what;
  bool nonfinite = false;
  long double total = 0.0L;
  int64_t total_n = 0;
  for (size_t t = 0; t < inputs.size(); t++) {
    const Buf want = mpt::ref_unscale(inputs[t], inv_scale, &nonfinite);
    const std::string tw = what + " tensor " + std::to_string(t);
    EXPECT_EQ(mpt::count_mismatches(outputs[t], want, tw), 0) << tw;
    const long double sq = mpt::ref_norm_sq(outputs[t]);
    mpt::expect_norm_close(r.norms[t], sq, outputs[t].numel(), 1e-6, tw + " norm");
    total += sq;
    total_n += outputs[t].numel();
  }
  mpt::expect_norm_close(r.total, total, total_n, 1e-6, what + " total_norm");
  expect_canonical_norms(outputs, r, what);
  const float want_flag = nonfinite ? 1.0f : found_inf_in;
  EXPECT_EQ(f32_bits(r.found_inf), f32_bits(want_flag)) << what << " found_inf";
}

// -------------------------------------------------------------------------
// The canonical summation order of the norms (internal.h, unscale.c),
// written here independently of the library:
//  - a tensor is cut into chunks of 2^16 elements;
//  - in a chunk, element i goes to lane i % 16 and block i / 128;
//  - per lane and block, squares are summed in float (v * v rounded, then
//    the add rounded: never fused);
//  - at each block end (and the chunk end) a lane's float sum is added to the
//    lane's double sum, unless it is inf/NaN: then that lane's squares in
//    that block are summed again in double (from 0, in order) and that is
//    added instead;
//  - the chunk sum is lanes 0..15 added in order, in double;
//  - a tensor's sum is its chunk sums in chunk order, its norm
//    (float)sqrt(sum); the total is the tensors' sums in order, then sqrt.
// The alternative orders exist only to prove that the test data tell them
// apart from the canonical one (a test that cannot fail proves nothing).
constexpr int64_t kChunk = int64_t(1) << 16;
constexpr int kLanes = 16;

enum class Order {
  kCanonical,
  kAllDouble,      // every square in double, per lane over the whole chunk
  kNoFallback,     // float block sums, no double redo when they overflow
  kFallbackBlock,  // one overflowing lane redoes the whole block in double
  kBlock64,        // blocks of 64 elements
  kBlock256,       // blocks of 256 elements
};
const Order kAltOrders[] = {Order::kAllDouble, Order::kNoFallback, Order::kFallbackBlock,
                            Order::kBlock64, Order::kBlock256};
const char *order_name(Order o) {
  switch (o) {
    case Order::kCanonical: return "canonical";
    case Order::kAllDouble: return "all-double";
    case Order::kNoFallback: return "no-fallback";
    case Order::kFallbackBlock: return "whole-block-fallback";
    case Order::kBlock64: return "block-64";
    case Order::kBlock256: return "block-256";
  }
  return "?";
}

// Sum of squares of the chunk out[begin, begin + n) in `order`.
double chunk_sum(const Buf &out, int64_t begin, int64_t n, Order order = Order::kCanonical) {
  double lane[kLanes] = {0};
  if (order == Order::kAllDouble) {
    for (int64_t i = 0; i < n; i++) {
      const double v = out.value(begin + i);
      lane[i % kLanes] += v * v;
    }
  } else {
    const int64_t block = order == Order::kBlock64 ? 64 : order == Order::kBlock256 ? 256 : 128;
    for (int64_t b = 0; b < n; b += block) {
      const int64_t e = std::min(n, b + block);
      float f[kLanes];
      double d[kLanes];
      bool any_bad = false;
      for (int l = 0; l < kLanes; l++) {
        float fs = 0.0f;
        double ds = 0.0;
        for (int64_t i = b + l; i < e; i += kLanes) {
          const float v = out.value(begin + i);
          const float sq = v * v;  // rounded to float here ...
          fs = fs + sq;            // ... and the sum again
          const double dv = v;
          ds = ds + dv * dv;
        }
        f[l] = fs;
        d[l] = ds;
        if (!std::isfinite(fs)) any_bad = true;
      }
      for (int l = 0; l < kLanes; l++) {
        switch (order) {
          case Order::kNoFallback: lane[l] += double(f[l]); break;
          case Order::kFallbackBlock: lane[l] += any_bad ? d[l] : double(f[l]); break;
          default: lane[l] += std::isfinite(f[l]) ? double(f[l]) : d[l]; break;
        }
      }
    }
  }
  double s = 0.0;
  for (int l = 0; l < kLanes; l++) s += lane[l];
  return s;
}

// A whole tensor: chunk sums in chunk order.
double tensor_sum(const Buf &out, Order order = Order::kCanonical) {
  double s = 0.0;
  for (int64_t begin = 0; begin < out.numel(); begin += kChunk)
    s += chunk_sum(out, begin, std::min(kChunk, out.numel() - begin), order);
  return s;
}

bool same_double(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }
// Same bits, or both NaN (NaN payloads of double arithmetic are not pinned).
bool same_or_both_nan(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || same_double(a, b);
}

// The norms and total a run must return, bit for bit, by the canonical order
// over the stored outputs.
void expect_canonical_norms(const std::vector<Buf> &outputs, const UnscaleResult &r,
                            const std::string &what) {
  ASSERT_EQ(r.norms.size(), outputs.size()) << what;
  double all = 0.0;
  for (size_t t = 0; t < outputs.size(); t++) {
    const double s = tensor_sum(outputs[t]);
    const float want = float(std::sqrt(s));
    EXPECT_TRUE(same_or_both_nan(r.norms[t], want))
        << what << " tensor " << t << ": norm " << r.norms[t] << " (0x" << std::hex
        << f32_bits(r.norms[t]) << ") canonical " << want << " (0x" << f32_bits(want) << std::dec
        << ")";
    all += s;
  }
  const float want_total = float(std::sqrt(all));
  EXPECT_TRUE(same_or_both_nan(r.total, want_total))
      << what << ": total " << r.total << " canonical " << want_total;
}

// Runs a copy of `in` through mixprec_unscale on every supported ISA path
// (the scalar path first) and returns each path's outputs and results.
struct IsaRun {
  mixprec_cpu_isa isa;
  std::vector<Buf> out;
  UnscaleResult r;
};
std::vector<IsaRun> run_every_isa(const std::vector<Buf> &in, float inv_scale,
                                  float found_inf_in = 0.0f) {
  std::vector<IsaRun> runs;
  for (mixprec_cpu_isa isa : mpt::supported_isas()) {
    EXPECT_EQ(mixprec_set_cpu_isa(isa), MIXPREC_OK);
    IsaRun run{isa, in, {}};
    run.r = run_unscale(run.out, inv_scale, found_inf_in);
    runs.push_back(std::move(run));
  }
  mixprec_set_cpu_isa(MIXPREC_ISA_AUTO);
  return runs;
}

// Every path gave the same bits as the first (scalar) one: data (NaN
// payloads included), found_inf, norms, total.
void expect_runs_identical(const std::vector<IsaRun> &runs, const std::string &what) {
  for (size_t k = 1; k < runs.size(); k++) {
    const IsaRun &a = runs[0], &b = runs[k];
    const std::string w = what + " " + mpt::isa_name(b.isa) + " vs " + mpt::isa_name(a.isa);
    ASSERT_EQ(b.r.status, a.r.status) << w;
    EXPECT_EQ(f32_bits(b.r.found_inf), f32_bits(a.r.found_inf)) << w << " found_inf";
    EXPECT_EQ(f32_bits(b.r.total), f32_bits(a.r.total)) << w << " total";
    for (size_t t = 0; t < a.out.size(); t++) {
      EXPECT_EQ(f32_bits(b.r.norms[t]), f32_bits(a.r.norms[t])) << w << " norm " << t;
      int64_t diff = 0;
      for (int64_t i = 0; i < a.out[t].numel(); i++) {
        if (b.out[t].raw(i) != a.out[t].raw(i) && diff++ < 3)
          ADD_FAILURE() << w << " tensor " << t << " element " << i << ": 0x" << std::hex
                        << b.out[t].raw(i) << " vs 0x" << a.out[t].raw(i) << std::dec;
      }
      EXPECT_EQ(diff, 0) << w << " tensor " << t;
    }
  }
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
        EXPECT_FALSE(std::isfinite(r.norms[0])) << what << ": norm of a tensor with inf/NaN";
        EXPECT_FALSE(std::isfinite(r.total)) << what;
        const bool is_nan = Buf::is_nan_bits(dtype_, bad);
        EXPECT_EQ(bufs[0].is_nan(pos), is_nan) << what;
        if (!is_nan) {
          EXPECT_EQ(bufs[0].raw(pos), bad) << what << ": inf * inv_scale stays the same inf";
          EXPECT_EQ(r.norms[0], INFINITY) << what;
        } else {
          EXPECT_TRUE(std::isnan(r.norms[0])) << what;
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
      if (want_norm) { EXPECT_EQ(f32_bits(r.norms[t]), f32_bits(rf.norms[t])) << t; }
      if (!want_norm) { EXPECT_EQ(r.norms[t], -123.0f) << "norms was not passed"; }
    }
    if (want_total) { EXPECT_EQ(f32_bits(r.total), f32_bits(rf.total)); }
    if (!want_total) { EXPECT_EQ(r.total, -456.0f) << "total_norm was not passed"; }
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
// random_bits = false leaves out fill_random's random finite bit patterns
// (FP32/BF16 values up to 3.4e38 that make most large tensors' norms inf).
std::vector<Buf> random_list(std::mt19937 &rng, int count, int big, bool random_bits = true) {
  const int64_t small[] = {0, 1, 2, 3, 7, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 127, 129, 511, 1000, 4097};
  const int64_t large[] = {65535, 65536, 65537, 131071, 200003};
  std::vector<Buf> v;
  for (int i = 0; i < count; i++) {
    const int64_t n = i < big ? large[rng() % 5] : small[rng() % 20];
    v.emplace_back(kDtypes[rng() % 3], n, (rng() & 1u) != 0);
    mpt::fill_random(v.back(), rng, -30, 14, random_bits);
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

  // Halved: {2, -3, 6}, whose L2 norm is exactly 7 (not 49, the square).
  float x[3] = {4.0f, -6.0f, 12.0f};
  mixprec_tensor list[3] = {{nullptr, 0, MIXPREC_F16}, {x, 3, MIXPREC_F32}, {x, 0, MIXPREC_BF16}};
  float norms[3] = {-1.0f, -1.0f, -1.0f};
  found = 0.0f;
  ASSERT_EQ(mixprec_unscale(list, 3, &inv, &found, norms, &total), MIXPREC_OK);
  EXPECT_EQ(x[0], 2.0f);
  EXPECT_EQ(x[1], -3.0f);
  EXPECT_EQ(x[2], 6.0f);
  EXPECT_EQ(f32_bits(norms[0]), 0u);
  EXPECT_EQ(norms[1], 7.0f);
  EXPECT_EQ(f32_bits(norms[2]), 0u);
  EXPECT_EQ(total, 7.0f);
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
// gives bit-identical data, found_inf, per-tensor norms and total, and those
// norms are the canonical order's, bit for bit. The data leave out random bit
// patterns (whose norms are mostly inf, which would match trivially) but
// carry a few finite values around 1e25 in FP32/BF16 tensors, whose squares
// overflow float, so the double fallback is part of what must agree.
TEST(UnscaleDeterminism, BitIdenticalAcrossIsasAndThreadCounts) {
  mpt::GlobalStateGuard guard;
  std::mt19937 rng(mpt::kSeed + 20);
  std::vector<Buf> in = random_list(rng, 60, 12, false);
  int64_t total_elems = 0;
  for (Buf &b : in) {
    total_elems += b.numel();
    if (b.dtype() != MIXPREC_F16 && b.numel() > 0)
      for (int k = 0; k < 4; k++)
        b.set_value(int64_t(rng() % uint64_t(b.numel())), (k & 1 ? -1.0f : 1.0f) * 1e25f * float(k + 1));
  }
  ASSERT_GT(total_elems, int64_t(1) << 17);
  const float inv = 0.37f;

  // Reference result first (also validates it).
  std::vector<Buf> first = in;
  ASSERT_EQ(mixprec_set_cpu_isa(MIXPREC_ISA_SCALAR), MIXPREC_OK);
  mixprec_set_num_threads(1);
  const UnscaleResult r0 = run_unscale(first, inv);
  check_against_reference(in, first, inv, 0.0f, r0, "scalar, 1 thread");
  // The comparison below only means something if the norms are finite.
  EXPECT_TRUE(std::isfinite(r0.total));
  for (size_t t = 0; t < in.size(); t++) EXPECT_TRUE(std::isfinite(r0.norms[t])) << t;

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
        EXPECT_EQ(f32_bits(r.norms[t]), f32_bits(r0.norms[t])) << what << " norm " << t;
      }
      EXPECT_EQ(f32_bits(r.total), f32_bits(r0.total)) << what << " total";
      EXPECT_EQ(f32_bits(r.found_inf), f32_bits(r0.found_inf)) << what;
    }
  }
}

// A huge exponent range makes the sum order-sensitive: norms must still
// agree to the bit between paths and thread counts, and equal the canonical
// order's (several chunks per tensor, the last one partial).
TEST(UnscaleDeterminism, OrderSensitiveNormsStillIdentical) {
  mpt::GlobalStateGuard guard;
  std::mt19937 rng(mpt::kSeed + 21);
  std::vector<Buf> in;
  for (int i = 0; i < 3; i++) {
    in.emplace_back(i == 2 ? MIXPREC_BF16 : MIXPREC_F32, 150001, i == 1);
    mpt::fill_random(in.back(), rng, -60, 50, false);  // squares up to 2^102: finite in float
  }
  std::vector<uint32_t> norm_bits;
  for (mixprec_cpu_isa isa : mpt::supported_isas()) {
    ASSERT_EQ(mixprec_set_cpu_isa(isa), MIXPREC_OK);
    for (int threads : {1, 2, 3}) {
      mixprec_set_num_threads(threads);
      std::vector<Buf> bufs = in;
      const UnscaleResult r = run_unscale(bufs, 1.0f);
      std::vector<uint32_t> bits = {f32_bits(r.total)};
      for (float n : r.norms) bits.push_back(f32_bits(n));
      if (norm_bits.empty()) {
        check_against_reference(in, bufs, 1.0f, 0.0f, r, "wide range");
        EXPECT_TRUE(std::isfinite(r.total));
        norm_bits = bits;
      }
      EXPECT_EQ(bits, norm_bits) << mpt::isa_name(isa) << " threads=" << threads;
    }
  }
}

// -------------------------------------------------------------------------
// The chunk kernels directly. The public float norm hides most order
// differences, so the kernels' double partial sums are checked bit for bit
// against the canonical order (chunk_sum above) on every supported path, for
// every length 0..300, block and chunk boundaries, aligned and misaligned
// starts, with data that tell the canonical order from its near misses.

struct ChunkKernel {
  mixprec_cpu_isa isa;
  mixprec__unscale_chunk_fn fn;
};
std::vector<ChunkKernel> supported_chunk_kernels() {
  std::vector<ChunkKernel> all = {{MIXPREC_ISA_SCALAR, mixprec__unscale_chunk_scalar}};
#if defined(MIXPREC_X86)
  all.push_back({MIXPREC_ISA_AVX2, mixprec__unscale_chunk_avx2});
  all.push_back({MIXPREC_ISA_AVX512, mixprec__unscale_chunk_avx512});
#endif
  std::vector<ChunkKernel> v;
  for (const ChunkKernel &k : all)
    if (mixprec_cpu_isa_supported(k.isa)) v.push_back(k);
  return v;
}

enum class ChunkData {
  kWide,      // finite, exponents spread wide: rounding depends on the order
  kWild,      // plus random finite bit patterns: huge and subnormal values
  kOverflow,  // moderate values and some ~2^62..2^64 whose float sums overflow
  kTiny,      // squares below FLT_MIN: float underflow is part of the order
};
const ChunkData kChunkData[] = {ChunkData::kWide, ChunkData::kWild, ChunkData::kOverflow,
                                ChunkData::kTiny};

void fill_chunk_data(Buf &b, std::mt19937 &rng, ChunkData mode) {
  const bool f16 = b.dtype() == MIXPREC_F16;
  switch (mode) {
    case ChunkData::kWide:
      if (f16) mpt::fill_random(b, rng, -24, 14, false);  // FP16 max 65504 < 2^15 * 2
      else mpt::fill_random(b, rng, -60, 40, false);
      break;
    case ChunkData::kWild:
      mpt::fill_random(b, rng, f16 ? -24 : -30, 14, true);
      break;
    case ChunkData::kOverflow: {
      if (f16) {
        mpt::fill_random(b, rng, 6, 14, false);  // FP16 cannot overflow a float square
        break;
      }
      mpt::fill_random(b, rng, -20, 20, false);
      std::uniform_real_distribution<float> m(1.0f, 2.0f);
      for (int64_t i = 0; i < b.numel(); i++)
        if (rng() % 6 == 0) b.set_value(i, (rng() & 1 ? -1.0f : 1.0f) * std::ldexp(m(rng), 62 + int(rng() % 2)));
      break;
    }
    case ChunkData::kTiny:
      if (f16) mpt::fill_random(b, rng, -24, -8, false);
      else mpt::fill_random(b, rng, -85, -60, false);
      break;
  }
}
const char *chunk_data_name(ChunkData m) {
  switch (m) {
    case ChunkData::kWide: return "wide";
    case ChunkData::kWild: return "wild";
    case ChunkData::kOverflow: return "overflow";
    case ChunkData::kTiny: return "tiny";
  }
  return "?";
}

// Elements whose bits differ (NaN matches NaN), without reporting.
int64_t mismatches(const Buf &got, const Buf &want) {
  int64_t bad = 0;
  for (int64_t i = 0; i < want.numel(); i++)
    bad += want.is_nan(i) ? !got.is_nan(i) : got.raw(i) != want.raw(i);
  return bad;
}

TEST(UnscaleChunkKernels, NormPartialsFollowCanonicalOrder) {
  mpt::GlobalStateGuard guard;
  const std::vector<ChunkKernel> kernels = supported_chunk_kernels();
  std::mt19937 rng(mpt::kSeed + 40);
  std::vector<int64_t> sizes;
  for (int64_t n = 0; n <= 300; n++) sizes.push_back(n);
  for (int64_t n : {383, 384, 385, 511, 512, 513, 1000, 4097, 65535, 65536}) sizes.push_back(n);

  int64_t cases = 0, bad_cases = 0, finite_partials = 0, fallback_cases = 0;
  int64_t differs[sizeof kAltOrders / sizeof kAltOrders[0]] = {0};
  for (mixprec_dtype d : kDtypes) {
    for (ChunkData mode : kChunkData) {
      for (int64_t n : sizes) {
        for (bool misalign : {false, true}) {
          Buf in(d, n, misalign);
          fill_chunk_data(in, rng, mode);
          const float inv = mode == ChunkData::kOverflow ? 1.0f : 0.71f;
          bool nonfinite = false;
          const Buf want = mpt::ref_unscale(in, inv, &nonfinite);
          ASSERT_FALSE(nonfinite) << "test data must be finite";
          const double want_norm = chunk_sum(want, 0, n);
          if (std::isfinite(want_norm)) finite_partials++;
          for (size_t a = 0; a < sizeof kAltOrders / sizeof kAltOrders[0]; a++)
            differs[a] += !same_double(chunk_sum(want, 0, n, kAltOrders[a]), want_norm);
          if (!same_double(chunk_sum(want, 0, n, Order::kNoFallback), want_norm)) fallback_cases++;

          for (const ChunkKernel &k : kernels) {
            const std::string what = std::string(mpt::isa_name(k.isa)) + " " + mpt::dtype_name(d) +
                                     " " + chunk_data_name(mode) + " n=" + std::to_string(n) +
                                     (misalign ? " misaligned" : "");
            Buf got = in;
            int flag = 0;
            double norm = -1.0;
            k.fn(got.data(), d, n, inv, &flag, &norm);
            // Without a norm pointer the data are the same and nothing else.
            Buf got2 = in;
            int flag2 = 0;
            k.fn(got2.data(), d, n, inv, &flag2, nullptr);
            const int64_t bad_data = mismatches(got, want), bad_data2 = mismatches(got2, want);
            const bool ok = same_double(norm, want_norm) && bad_data == 0 && bad_data2 == 0 &&
                            flag == 0 && flag2 == 0;
            cases++;
            if (!ok && bad_cases++ < 20) {
              ADD_FAILURE() << what << ": partial " << norm << " canonical " << want_norm
                            << " (bits equal: " << same_double(norm, want_norm) << "), "
                            << bad_data << " and " << bad_data2 << " (no norm) data mismatches, flags "
                            << flag << " " << flag2;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(bad_cases, 0) << "of " << cases << " kernel calls";
  EXPECT_EQ(cases, int64_t(kernels.size()) * 3 * 4 * 2 * int64_t(sizes.size()));
  EXPECT_GT(finite_partials, 3000);
  // The data really tell each near miss from the canonical order.
  for (size_t a = 0; a < sizeof kAltOrders / sizeof kAltOrders[0]; a++)
    EXPECT_GT(differs[a], 50) << order_name(kAltOrders[a]) << " is indistinguishable on the test data";
  EXPECT_GT(fallback_cases, 50) << "the overflow fallback was hardly exercised";
}

// Inputs holding inf or NaN through the chunk kernels: the flag is set, the
// data match the reference, and the partial is inf/NaN as the canonical order
// gives it (NaN payloads of the double sums are not pinned).
TEST(UnscaleChunkKernels, NonFiniteInputsSetTheFlag) {
  mpt::GlobalStateGuard guard;
  std::mt19937 rng(mpt::kSeed + 41);
  int64_t checked = 0;
  for (const ChunkKernel &k : supported_chunk_kernels()) {
    for (mixprec_dtype d : kDtypes) {
      for (int64_t n : {1, 16, 17, 127, 128, 129, 300, 65536}) {
        for (uint32_t bad : nonfinite_patterns(d)) {
          Buf in(d, n, (n & 1) != 0);
          fill_chunk_data(in, rng, ChunkData::kWide);
          in.set_raw(int64_t(rng() % uint64_t(n)), bad);
          bool nonfinite = false;
          const Buf want = mpt::ref_unscale(in, 0.5f, &nonfinite);
          ASSERT_TRUE(nonfinite);
          const double want_norm = chunk_sum(want, 0, n);
          const std::string what = std::string(mpt::isa_name(k.isa)) + " " + mpt::dtype_name(d) +
                                   " n=" + std::to_string(n) + " bits 0x" + std::to_string(bad);
          Buf got = in;
          int flag = 0;
          double norm = 0.0;
          k.fn(got.data(), d, n, 0.5f, &flag, &norm);
          EXPECT_EQ(flag, 1) << what;
          EXPECT_EQ(mpt::count_mismatches(got, want, what), 0);
          EXPECT_FALSE(std::isfinite(norm)) << what;
          EXPECT_TRUE(same_or_both_nan(norm, want_norm)) << what << ": " << norm << " vs " << want_norm;
          // The flag is only ever set: a preset 1 stays.
          Buf got2 = in;
          int flag2 = 1;
          k.fn(got2.data(), d, n, 0.5f, &flag2, nullptr);
          EXPECT_EQ(flag2, 1) << what;
          checked++;
        }
      }
    }
  }
  EXPECT_GE(checked, 3 * 8 * 5);
}

// Ordinary values around 2^55..2^60 and, in a few lane/block pairs, three or
// more values around 2^63 whose float square sum overflows while the other
// lanes of the same block stay finite (one of them close to FLT_MAX):
// positions in the first block, a middle block, the last partial block and
// the scalar tail of the vector paths. Only the overflowing lanes may be
// redone in double; the kernels must give the canonical partial bit for bit
// and the public API a finite norm equal (1e-6) to the long double one.
TEST(UnscaleChunkKernels, SomeLanesOverflowTheFloatBlockSum) {
  mpt::GlobalStateGuard guard;
  std::mt19937 rng(mpt::kSeed + 42);
  std::uniform_real_distribution<float> m(1.0f, 2.0f);
  std::uniform_real_distribution<float> big(1.25f, 1.9f);
  const int64_t n = 128 * 3 + 40;  // AVX2 tail: the last 8, AVX-512 F16/BF16: the last 8
  // (lane, block) pairs that overflow; elements lane + 16 k + 128 block.
  const int overflow_at[][2] = {{5, 0}, {0, 1}, {15, 1}, {12, 2}, {2, 3}, {7, 3}};
  for (mixprec_dtype d : {MIXPREC_F32, MIXPREC_BF16}) {
    for (bool misalign : {false, true}) {
      Buf in(d, n, misalign);
      for (int64_t i = 0; i < n; i++)
        in.set_value(i, (rng() & 1 ? -1.0f : 1.0f) * std::ldexp(m(rng), 55 + int(rng() % 6)));
      for (const auto &lb : overflow_at) {
        const int64_t start = lb[0] + 128 * lb[1];
        std::vector<int64_t> lane_elems;
        for (int64_t i = start; i < std::min(n, int64_t(128) * (lb[1] + 1)); i += 16) lane_elems.push_back(i);
        ASSERT_GE(lane_elems.size(), 3u);
        // Three huge ones, the last element of the lane always among them
        // (for lane 7 of block 3 that is element 423, in the scalar tail).
        std::shuffle(lane_elems.begin(), lane_elems.end() - 1, rng);
        for (size_t j = 0; j < 3; j++) {
          const int64_t i = j == 0 ? lane_elems.back() : lane_elems[j - 1];
          in.set_value(i, (rng() & 1 ? -1.0f : 1.0f) * std::ldexp(big(rng), 63));
        }
      }
      // Lane 9 of block 2: two values whose squares sum to ~0.85 FLT_MAX,
      // finite, so that lane stays in float.
      in.set_value(128 * 2 + 9, std::ldexp(1.3f, 63));
      in.set_value(128 * 2 + 9 + 16, -std::ldexp(1.3f, 63));

      bool nonfinite = false;
      const Buf want = mpt::ref_unscale(in, 1.0f, &nonfinite);
      ASSERT_FALSE(nonfinite);
      const double canonical = chunk_sum(want, 0, n);
      const std::string what = std::string(mpt::dtype_name(d)) + (misalign ? " misaligned" : "");
      ASSERT_TRUE(std::isfinite(canonical)) << what;
      // The data tell the canonical order from its near misses.
      EXPECT_TRUE(std::isinf(chunk_sum(want, 0, n, Order::kNoFallback))) << what;
      EXPECT_FALSE(same_double(chunk_sum(want, 0, n, Order::kFallbackBlock), canonical)) << what;
      EXPECT_FALSE(same_double(chunk_sum(want, 0, n, Order::kAllDouble), canonical)) << what;

      for (const ChunkKernel &k : supported_chunk_kernels()) {
        Buf got = in;
        int flag = 0;
        double norm = -1.0;
        k.fn(got.data(), d, n, 1.0f, &flag, &norm);
        EXPECT_TRUE(same_double(norm, canonical))
            << what << " " << mpt::isa_name(k.isa) << ": partial " << norm << " canonical " << canonical;
        EXPECT_EQ(flag, 0) << what;
        EXPECT_EQ(mpt::count_mismatches(got, want, what), 0);
      }

      const std::vector<IsaRun> runs = run_every_isa({in}, 1.0f);
      for (const IsaRun &run : runs) {
        const std::string w = what + " " + mpt::isa_name(run.isa);
        check_against_reference({in}, run.out, 1.0f, 0.0f, run.r, w);
        EXPECT_EQ(f32_bits(run.r.found_inf), 0u) << w;
        EXPECT_TRUE(std::isfinite(run.r.norms[0])) << w;
      }
      expect_runs_identical(runs, what);
    }
  }
}

// -------------------------------------------------------------------------
// Norms of finite gradients are finite, even when the values (around 1e20,
// whose squares overflow float, and up to 3e38) are far beyond what a float
// sum of squares can hold. FP32 and BF16, on every ISA path, two scales.
TEST(UnscaleNorms, HugeFiniteValuesGiveFiniteNorms) {
  mpt::GlobalStateGuard guard;
  std::mt19937 rng(mpt::kSeed + 50);
  std::uniform_real_distribution<float> m(0.5f, 2.0f);
  for (mixprec_dtype d : {MIXPREC_F32, MIXPREC_BF16}) {
    // One value near 3e38 per list, so that the total norm (about 3e38) is
    // still a finite float.
    std::vector<Buf> in;
    const int64_t sizes[] = {1000, 70001, 33, 129, 1};
    for (int64_t n : sizes) {
      in.emplace_back(d, n, (n & 1) != 0);
      Buf &b = in.back();
      for (int64_t i = 0; i < n; i++)
        b.set_value(i, (rng() & 1 ? -1.0f : 1.0f) * m(rng) * (n == 33 ? 1e30f : 1e20f));
    }
    in[0].set_value(500, 3.0e38f);     // vector body
    in[1].set_value(70000, -1.0e37f);  // the scalar tail of the second chunk
    in[3].set_value(128, 2.0e36f);     // first element of the second block
    in[4].set_value(0, -1.5e37f);
    for (float inv : {1.0f, 0.75f}) {
      const std::string what = std::string(mpt::dtype_name(d)) + " inv=" + std::to_string(inv);
      const std::vector<IsaRun> runs = run_every_isa(in, inv);
      for (const IsaRun &run : runs) {
        const std::string w = what + " " + mpt::isa_name(run.isa);
        check_against_reference(in, run.out, inv, 0.0f, run.r, w);
        EXPECT_EQ(f32_bits(run.r.found_inf), 0u) << w << ": no input was inf/NaN";
        for (size_t t = 0; t < in.size(); t++)
          EXPECT_TRUE(std::isfinite(run.r.norms[t])) << w << " tensor " << t << ": " << run.r.norms[t];
        EXPECT_TRUE(std::isfinite(run.r.total)) << w << ": " << run.r.total;
        EXPECT_GT(run.r.norms[0], 2.0e38f * inv) << w;
      }
      expect_runs_identical(runs, what);
    }
  }
}

// A NaN inv_scale (with payload bits, either sign, quiet or signalling) makes
// every output a NaN, on every path with the same bits (the vector paths'
// BF16 rounding has no NaN test, so unscale.c must route this case to the
// scalar kernel), and the norms NaN; found_inf still looks at the inputs
// only: finite inputs leave it at 0 (or at a preset value).
TEST(UnscaleNorms, NanInvScaleGivesNanEverywhere) {
  mpt::GlobalStateGuard guard;
  std::mt19937 rng(mpt::kSeed + 51);
  for (uint32_t nan_bits : {0x7fffffffu, 0xffc00001u, 0x7f800001u, 0xffbfffffu}) {
    const float inv = f32_from_bits(nan_bits);
    ASSERT_TRUE(std::isnan(inv));
    for (mixprec_dtype d : kDtypes) {
      std::vector<Buf> in;
      for (int64_t n : {1, 17, 129, 1000, 140001}) {
        in.emplace_back(d, n, (n & 1) != 0);
        mpt::fill_random(in.back(), rng);
      }
      char hex[16];
      std::snprintf(hex, sizeof hex, "0x%08x", nan_bits);
      const std::string what = std::string(mpt::dtype_name(d)) + " inv_scale " + hex;
      for (float preset : {0.0f, 0.5f}) {
        const std::vector<IsaRun> runs = run_every_isa(in, inv, preset);
        for (const IsaRun &run : runs) {
          const std::string w = what + " " + mpt::isa_name(run.isa);
          ASSERT_EQ(run.r.status, MIXPREC_OK) << w;
          EXPECT_EQ(f32_bits(run.r.found_inf), f32_bits(preset)) << w << ": inputs are finite";
          for (size_t t = 0; t < in.size(); t++) {
            int64_t not_nan = 0;
            for (int64_t i = 0; i < in[t].numel(); i++) not_nan += !run.out[t].is_nan(i);
            EXPECT_EQ(not_nan, 0) << w << " tensor " << t;
            EXPECT_TRUE(std::isnan(run.r.norms[t])) << w << " tensor " << t;
          }
          EXPECT_TRUE(std::isnan(run.r.total)) << w;
          if (preset == 0.0f) check_against_reference(in, run.out, inv, 0.0f, run.r, w);
        }
        expect_runs_identical(runs, what);
      }
    }
  }
}

// NaN inputs of every payload and both signs: every BF16 NaN (all 127
// nonzero 7-bit payloads), every FP16 NaN (all 1023 10-bit payloads) and a
// sample of FP32 NaNs, in the vector body and in the scalar tail, through
// every path with several scales: the outputs are NaN with the same bits on
// every path, and on x86 (whose multiply returns a NaN operand quieted) the
// input NaN made quiet, sign and payload kept.
TEST(UnscaleNorms, NanInputsOfEveryPayload) {
  mpt::GlobalStateGuard guard;
  std::mt19937 rng(mpt::kSeed + 52);
  for (mixprec_dtype d : kDtypes) {
    std::vector<uint32_t> nans;
    uint32_t quiet_bit = 0;
    if (d == MIXPREC_BF16) {
      for (uint32_t p = 1; p <= 0x7fu; p++) nans.insert(nans.end(), {0x7f80u | p, 0xff80u | p});
      quiet_bit = 0x40u;
    } else if (d == MIXPREC_F16) {
      for (uint32_t p = 1; p <= 0x3ffu; p++) nans.insert(nans.end(), {0x7c00u | p, 0xfc00u | p});
      quiet_bit = 0x200u;
    } else {
      for (uint32_t p : {1u, 2u, 0x3fffffu, 0x400000u, 0x400001u, 0x7fffffu, 0x12345u, 0x654321u})
        nans.insert(nans.end(), {0x7f800000u | p, 0xff800000u | p});
      for (int k = 0; k < 500; k++) nans.push_back(0x7f800000u | (rng() & 0x807fffffu) | 1u);
      quiet_bit = 0x400000u;
    }
    const int64_t count = int64_t(nans.size());
    // A: the NaNs first, then finite values. B: finite values, then the NaNs
    // in reverse to the last element (the tail). C: over a chunk boundary,
    // scattered, with the list large enough to run in parallel.
    std::vector<Buf> in;
    in.emplace_back(d, count + 45);
    in.emplace_back(d, count + 7, true);
    in.emplace_back(d, 140001, true);
    for (Buf &b : in) mpt::fill_random(b, rng);
    for (int64_t j = 0; j < count; j++) {
      in[0].set_raw(j, nans[size_t(j)]);
      in[1].set_raw(in[1].numel() - 1 - j, nans[size_t(j)]);
      in[2].set_raw(j < 2 ? 65535 + j : int64_t(rng() % 140001u), nans[size_t(j)]);
    }
    for (float inv : {1.0f, 0.5f, 1.0f / 65536.0f, 0.0f, -1.0f, INFINITY, 3.0e38f}) {
      const std::string what = std::string(mpt::dtype_name(d)) + " inv=" + std::to_string(inv);
      const std::vector<IsaRun> runs = run_every_isa(in, inv);
      for (const IsaRun &run : runs) {
        const std::string w = what + " " + mpt::isa_name(run.isa);
        check_against_reference(in, run.out, inv, 0.0f, run.r, w);
        EXPECT_EQ(run.r.found_inf, 1.0f) << w;
        for (size_t t = 0; t < in.size(); t++) {
          EXPECT_TRUE(std::isnan(run.r.norms[t])) << w << " tensor " << t;
          int64_t bad = 0;
          for (int64_t i = 0; i < in[t].numel(); i++) {
            if (!in[t].is_nan(i)) continue;
            bool ok = run.out[t].is_nan(i);
#if defined(__x86_64__) || defined(__i386__)
            ok = ok && run.out[t].raw(i) == (in[t].raw(i) | quiet_bit);
#endif
            if (!ok && bad++ < 3)
              ADD_FAILURE() << w << " tensor " << t << " element " << i << ": in 0x" << std::hex
                            << in[t].raw(i) << " out 0x" << run.out[t].raw(i) << std::dec;
          }
          EXPECT_EQ(bad, 0) << w << " tensor " << t;
        }
      }
      expect_runs_identical(runs, what);
    }
    (void)quiet_bit;
  }
}

// The total of a long list is the L2 norm of all of it, i.e. the square root
// of the sum of the per-tensor norms squared (in long double here, 1e-6): not
// their sum, not a squared norm. Tensors of very different magnitudes and
// dtypes, empty ones among them, some spanning several chunks.
TEST(UnscaleNorms, TotalIsL2OfTensorNorms) {
  mpt::GlobalStateGuard guard;
  std::mt19937 rng(mpt::kSeed + 53);
  std::vector<Buf> in;
  for (int i = 0; i < 1500; i++) {
    const mixprec_dtype d = kDtypes[rng() % 3];
    const int64_t n = i % 300 == 7 ? 65536 + int64_t(rng() % 70000) : int64_t(rng() % 600);
    in.emplace_back(d, n, (rng() & 1u) != 0);
    const int k = d == MIXPREC_F16 ? -14 + int(rng() % 24) : -40 + int(rng() % 80);
    mpt::fill_random(in.back(), rng, k - 4, k, false);
  }
  for (mixprec_cpu_isa isa : mpt::supported_isas()) {
    ASSERT_EQ(mixprec_set_cpu_isa(isa), MIXPREC_OK);
    std::vector<Buf> bufs = in;
    const float inv = 0.25f;
    const UnscaleResult r = run_unscale(bufs, inv);
    const std::string what = mpt::isa_name(isa);
    check_against_reference(in, bufs, inv, 0.0f, r, what);
    long double sq = 0.0L, sum = 0.0L;
    for (float n : r.norms) {
      ASSERT_TRUE(std::isfinite(n)) << what;
      sq += (long double)n * n;
      sum += n;
    }
    const long double want = std::sqrt(sq);
    ASSERT_TRUE(std::isfinite(r.total)) << what;
    EXPECT_LE(double(std::fabs((long double)r.total - want)), 1e-6 * double(want))
        << what << ": total " << r.total << " sqrt(sum norms^2) " << double(want);
    // The data make the wrong combinations far off.
    EXPECT_GT(double(sum), 1.5 * double(want));
    EXPECT_GT(std::fabs(double(sq) - double(r.total)), 1e-3 * double(sq));
  }

  // 1000 copies of one two-element tensor whose float norm is off its exact
  // value by nearly half a float step in the same direction: the total must
  // be the square root of the double sums (canonical, bit for bit), which
  // here differs from one rebuilt from the rounded per-tensor norms.
  const int copies = 1000;
  std::uniform_real_distribution<float> u(1.0f, 2.0f);
  Buf pair(MIXPREC_F32, 2);
  float canonical = 0.0f;
  for (int tries = 0;; tries++) {
    ASSERT_LT(tries, 100000) << "no suitable pair found";
    pair.set_value(0, u(rng));
    pair.set_value(1, u(rng));
    const double s = chunk_sum(pair, 0, 2);
    const double rounded = double(float(std::sqrt(s))) * double(float(std::sqrt(s)));
    double all = 0.0, all_rounded = 0.0;
    for (int i = 0; i < copies; i++) {
      all += s;
      all_rounded += rounded;
    }
    canonical = float(std::sqrt(all));
    if (canonical != float(std::sqrt(all_rounded))) break;
  }
  std::vector<Buf> same(copies, pair);
  for (mixprec_cpu_isa isa : mpt::supported_isas()) {
    ASSERT_EQ(mixprec_set_cpu_isa(isa), MIXPREC_OK);
    std::vector<Buf> bufs = same;
    const UnscaleResult r = run_unscale(bufs, 1.0f);
    check_against_reference(same, bufs, 1.0f, 0.0f, r, std::string("copies ") + mpt::isa_name(isa));
    EXPECT_EQ(f32_bits(r.total), f32_bits(canonical)) << mpt::isa_name(isa);
  }
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
    EXPECT_EQ(norms[0], -5.0f) << what << ": norms written";
    EXPECT_EQ(norms[1], -6.0f) << what << ": norms written";
    EXPECT_EQ(total, -7.0f) << what << ": total_norm written";
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
