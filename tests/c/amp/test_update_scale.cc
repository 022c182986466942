// mixprec_update_scale(): dynamic loss-scale update. Checked against two
// references written here: torch's _amp_update_scale_ (for hysteresis 1,
// min 0, max inf, where the contract says it is exactly torch's) and the
// header's rule with hysteresis and bounds.
#include <algorithm>
#include <cfloat>
#include <functional>
#include <limits>

#include "test_util.h"

namespace {

using mpt::f32_bits;

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// torch's _amp_update_scale_ (aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp):
// float scale times a double factor, rounded to float; growth only if the
// rounded product is finite; `if (*found_inf)` so NaN counts as an overflow.
// Returns true when a growth was refused because the product was not finite.
bool torch_update_scale(float &scale, int32_t &growth_tracker, float found_inf,
                        double growth_factor, double backoff_factor, int64_t growth_interval) {
  if (found_inf) {
    scale = static_cast<float>(scale * backoff_factor);
    growth_tracker = 0;
  } else {
    const int32_t successful = growth_tracker + 1;
    if (successful == growth_interval) {
      const float new_scale = static_cast<float>(scale * growth_factor);
      growth_tracker = 0;
      if (std::isfinite(new_scale)) {
        scale = new_scale;
      } else {
        return true;
      }
    } else {
      growth_tracker = successful;
    }
  }
  return false;
}

// The rule as mixprec/amp.h states it, hysteresis and bounds included.
struct State {
  float scale;
  int32_t growth;
  int32_t hyst;
  int64_t skipped;
};
void contract_update(State &s, float found_inf, const mixprec_update_scale_params &p) {
  const bool overflow = found_inf != 0.0f || std::isnan(found_inf);
  if (overflow) {
    s.growth = 0;
    if (s.hyst > 0) s.hyst -= 1;  // saturates at 0: no int32 underflow
    if (s.hyst <= 0) {
      const float b = static_cast<float>(s.scale * p.backoff_factor);
      s.scale = b < p.min_scale ? p.min_scale : b;  // max(b, min_scale)
    }
    s.skipped += 1;
  } else {
    s.hyst = int32_t(p.hysteresis);
    s.growth += 1;
    if (s.growth >= p.growth_interval) {
      s.growth = 0;
      const float g = static_cast<float>(s.scale * p.growth_factor);
      if (std::isfinite(g)) s.scale = g > p.max_scale ? p.max_scale : g;  // min(g, max_scale)
    }
  }
}

// found_inf of one step: overflows use every kind of nonzero value (1, 2,
// NaN of either sign, inf, negative, tiny), clean steps +0 and -0.
float draw_found_inf(std::mt19937 &rng, double p_overflow) {
  static const float bad[] = {1.0f, 1.0f, 2.0f, kNaN, -kNaN, kInf, -1.0f, 1e-30f, FLT_MIN};
  static const float good[] = {0.0f, 0.0f, 0.0f, -0.0f};
  std::uniform_real_distribution<double> u(0.0, 1.0);
  if (u(rng) < p_overflow) return bad[rng() % (sizeof bad / sizeof bad[0])];
  return good[rng() % 4];
}

mixprec_update_scale_params torch_params(double growth, double backoff, int64_t interval) {
  mixprec_update_scale_params p = mixprec_update_scale_params_default();
  p.growth_factor = growth;
  p.backoff_factor = backoff;
  p.growth_interval = interval;
  return p;
}

TEST(UpdateScale, DefaultParamsAreTorchs) {
  const mixprec_update_scale_params p = mixprec_update_scale_params_default();
  EXPECT_EQ(p.growth_factor, 2.0);
  EXPECT_EQ(p.backoff_factor, 0.5);
  EXPECT_EQ(p.growth_interval, 2000);
  EXPECT_EQ(p.hysteresis, 1);
  EXPECT_EQ(f32_bits(p.min_scale), 0u);
  EXPECT_EQ(p.max_scale, kInf);
}

// ------------------------------------------------------- torch parity ----

struct TorchCase {
  const char *name;
  double growth, backoff;
  int64_t interval;
  double p_overflow;
  float init_scale;
  bool expect_refused_growth;  // the trajectory must hit "product not finite"
  bool expect_underflow;       // the trajectory must back off into subnormals and zero
};

class UpdateScaleTorchParity : public ::testing::TestWithParam<TorchCase> {};

// A long random trajectory through mixprec_update_scale equals torch's rule
// bit for bit at every step, in all pointer variants the contract allows
// with hysteresis 1: hysteresis_tracker NULL or not, skipped_steps NULL or not.
TEST_P(UpdateScaleTorchParity, RandomTrajectoryBitExact) {
  const TorchCase &c = GetParam();
  const mixprec_update_scale_params p = torch_params(c.growth, c.backoff, c.interval);
  for (int variant = 0; variant < 3; variant++) {
    std::mt19937 rng(mpt::kSeed + 100 + uint32_t(c.interval) + uint32_t(c.p_overflow * 1000));
    float ref_scale = c.init_scale, scale = c.init_scale;
    int32_t ref_growth = 0, growth = 0, hyst = 1, ref_hyst = 1;
    int64_t skipped = 0, ref_skipped = 0, refused = 0, grew = 0, shrank = 0, subnormal = 0;
    float min_seen = ref_scale;
    int32_t *hyst_ptr = variant == 1 ? nullptr : &hyst;
    int64_t *skipped_ptr = variant == 2 ? nullptr : &skipped;
    for (int step = 0; step < 30000; step++) {
      const float fi = draw_found_inf(rng, c.p_overflow);
      const float before = ref_scale;
      refused += torch_update_scale(ref_scale, ref_growth, fi, c.growth, c.backoff, c.interval);
      grew += ref_scale > before;
      shrank += ref_scale < before;
      subnormal += ref_scale != 0.0f && std::fabs(ref_scale) < FLT_MIN;
      min_seen = std::min(min_seen, ref_scale);
      const bool overflow = fi != 0.0f || std::isnan(fi);
      ref_skipped += overflow;
      ref_hyst = overflow ? (ref_hyst > 0 ? ref_hyst - 1 : 0) : 1;  // the header's rule, hysteresis 1
      ASSERT_EQ(mixprec_update_scale(&scale, &growth, hyst_ptr, skipped_ptr, &fi, &p), MIXPREC_OK);
      ASSERT_EQ(f32_bits(scale), f32_bits(ref_scale))
          << c.name << " variant " << variant << " step " << step << ": scale " << scale
          << " torch " << ref_scale << " found_inf " << fi;
      ASSERT_EQ(growth, ref_growth) << c.name << " step " << step;
      if (hyst_ptr) { ASSERT_EQ(hyst, ref_hyst) << c.name << " step " << step; }
    }
    if (skipped_ptr) { EXPECT_EQ(skipped, ref_skipped) << c.name; }
    // The trajectory must exercise what it is meant to.
    EXPECT_GT(grew, 0) << c.name << ": never grew";
    EXPECT_GT(shrank, 0) << c.name << ": never backed off";
    if (c.expect_refused_growth) { EXPECT_GT(refused, 0) << c.name << ": trajectory never hit the overflow guard"; }
    if (c.expect_underflow) {
      EXPECT_GT(subnormal, 0) << c.name;
      EXPECT_EQ(min_seen, 0.0f) << c.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Factors, UpdateScaleTorchParity,
    ::testing::Values(
        // torch defaults, growing every 2000 clean steps.
        TorchCase{"default", 2.0, 0.5, 2000, 0.0004, 65536.0f, false, false},
        TorchCase{"interval1", 2.0, 0.5, 1, 0.3, 65536.0f, true, false},  // climbs to 2^127 and sticks
        TorchCase{"interval3", 2.0, 0.5, 3, 0.2, 65536.0f, false, false},
        // 1.37 / 0.9 are not exact in float: catches a float (not double) product.
        TorchCase{"odd_1_37_0_9", 1.37, 0.9, 2, 0.3, 1000.0f, false, false},
        TorchCase{"odd_near_max", 1.37, 0.9, 1, 0.2, 3.0e38f, true, false},
        TorchCase{"tiny_steps", 1.0001, 0.9999, 1, 0.5, 1.0f, false, false},
        // Backs off through the subnormals to zero, then stays at zero.
        TorchCase{"underflow", 2.0, 0.5, 1, 0.9, 1e-30f, false, true},
        TorchCase{"coarse_3_0_1", 3.0, 0.1, 1, 0.05, 1.0f, true, false}),
    [](const ::testing::TestParamInfo<TorchCase> &info) { return std::string(info.param.name); });

// Growth whose float product is not finite keeps the scale (and still resets
// the growth tracker); one that rounds down to FLT_MAX is taken.
TEST(UpdateScale, GrowthThatWouldOverflowKeepsScale) {
  const float zero = 0.0f;
  struct Case { float scale; double growth; float want; };
  const Case cases[] = {
      {std::ldexp(1.0f, 127), 2.0, std::ldexp(1.0f, 127)},
      {FLT_MAX, 2.0, FLT_MAX},
      {3.0e38f, 1.37, 3.0e38f},
      {FLT_MAX / 2, 2.0, FLT_MAX},      // exactly FLT_MAX: finite, taken
      {FLT_MAX, 1.0000000001, FLT_MAX}, // double product above FLT_MAX rounds to it
  };
  for (const Case &c : cases) {
    const mixprec_update_scale_params p = torch_params(c.growth, 0.5, 1);
    float scale = c.scale;
    int32_t growth = 0;
    ASSERT_EQ(mixprec_update_scale(&scale, &growth, nullptr, nullptr, &zero, &p), MIXPREC_OK);
    EXPECT_EQ(f32_bits(scale), f32_bits(c.want)) << c.scale << " * " << c.growth;
    EXPECT_EQ(growth, 0);
  }
}

// Any nonzero found_inf is an overflow (NaN too), +0 and -0 are clean.
TEST(UpdateScale, WhatCountsAsOverflow) {
  const mixprec_update_scale_params p = torch_params(2.0, 0.5, 100);
  for (float fi : {1.0f, 2.0f, -1.0f, kNaN, -kNaN, kInf, -kInf, std::ldexp(1.0f, -149)}) {
    float scale = 64.0f;
    int32_t growth = 7;
    int64_t skipped = 10;
    ASSERT_EQ(mixprec_update_scale(&scale, &growth, nullptr, &skipped, &fi, &p), MIXPREC_OK);
    EXPECT_EQ(scale, 32.0f) << fi;
    EXPECT_EQ(growth, 0) << fi;
    EXPECT_EQ(skipped, 11) << fi;
  }
  for (float fi : {0.0f, -0.0f}) {
    float scale = 64.0f;
    int32_t growth = 7;
    int64_t skipped = 10;
    ASSERT_EQ(mixprec_update_scale(&scale, &growth, nullptr, &skipped, &fi, &p), MIXPREC_OK);
    EXPECT_EQ(scale, 64.0f);
    EXPECT_EQ(growth, 8);
    EXPECT_EQ(skipped, 10);
  }
}

// ------------------------------------------------ hysteresis and bounds ----

// Hysteresis 3: the scale backs off only on the 3rd overflow with no clean
// step between; a clean step re-arms the tracker; once exhausted every
// further overflow backs off.
TEST(UpdateScale, HysteresisThree) {
  mixprec_update_scale_params p = torch_params(2.0, 0.5, 1000);
  p.hysteresis = 3;
  float scale = 1024.0f;
  int32_t growth = 0, hyst = 3;
  int64_t skipped = 0;
  struct Step { float fi; float scale; int32_t hyst; };
  const Step script[] = {
      {1, 1024, 2}, {1, 1024, 1},            // two overflows: no backoff yet
      {0, 1024, 3},                          // clean step re-arms
      {1, 1024, 2}, {kNaN, 1024, 1},         // two more: still none
      {2, 512, 0},                           // third in a row: back off
      {1, 256, 0}, {1, 128, 0},              // tracker exhausted (stays 0): every overflow backs off
      {0, 128, 3}, {1, 128, 2}, {0, 128, 3}, // clean between overflows: never backs off
      {1, 128, 2}, {1, 128, 1}, {1, 64, 0},
  };
  int n = 0, overflows = 0;
  for (const Step &s : script) {
    ASSERT_EQ(mixprec_update_scale(&scale, &growth, &hyst, &skipped, &s.fi, &p), MIXPREC_OK);
    EXPECT_EQ(scale, s.scale) << "step " << n;
    EXPECT_EQ(hyst, s.hyst) << "step " << n;
    overflows += s.fi != 0.0f;
    n++;
  }
  EXPECT_EQ(skipped, overflows);
}

// min_scale bounds backoff (max(scale*backoff, min)), max_scale bounds
// growth (min(scale*growth, max)); both are applied only when that branch
// fires.
TEST(UpdateScale, MinAndMaxClamp) {
  mixprec_update_scale_params p = torch_params(2.0, 0.5, 1);
  p.min_scale = 1.0f;
  p.max_scale = 100.0f;
  const float bad = 1.0f, good = 0.0f;
  float scale = 1.5f;
  int32_t growth = 0;
  ASSERT_EQ(mixprec_update_scale(&scale, &growth, nullptr, nullptr, &bad, &p), MIXPREC_OK);
  EXPECT_EQ(scale, 1.0f) << "0.75 clamps up to min_scale";
  ASSERT_EQ(mixprec_update_scale(&scale, &growth, nullptr, nullptr, &bad, &p), MIXPREC_OK);
  EXPECT_EQ(scale, 1.0f) << "stays at min_scale";
  scale = 80.0f;
  ASSERT_EQ(mixprec_update_scale(&scale, &growth, nullptr, nullptr, &good, &p), MIXPREC_OK);
  EXPECT_EQ(scale, 100.0f) << "160 clamps down to max_scale";
  ASSERT_EQ(mixprec_update_scale(&scale, &growth, nullptr, nullptr, &good, &p), MIXPREC_OK);
  EXPECT_EQ(scale, 100.0f) << "stays at max_scale";
  scale = 30.0f;
  ASSERT_EQ(mixprec_update_scale(&scale, &growth, nullptr, nullptr, &good, &p), MIXPREC_OK);
  EXPECT_EQ(scale, 60.0f) << "inside the bounds: plain growth";
  ASSERT_EQ(mixprec_update_scale(&scale, &growth, nullptr, nullptr, &bad, &p), MIXPREC_OK);
  EXPECT_EQ(scale, 30.0f) << "inside the bounds: plain backoff";
  // min == max pins the scale.
  p.min_scale = p.max_scale = 8.0f;
  scale = 8.0f;
  ASSERT_EQ(mixprec_update_scale(&scale, &growth, nullptr, nullptr, &good, &p), MIXPREC_OK);
  EXPECT_EQ(scale, 8.0f);
  ASSERT_EQ(mixprec_update_scale(&scale, &growth, nullptr, nullptr, &bad, &p), MIXPREC_OK);
  EXPECT_EQ(scale, 8.0f);
  // A non-finite growth product keeps the scale even below max_scale = inf.
  p.min_scale = 0.0f;
  p.max_scale = kInf;
  scale = FLT_MAX;
  ASSERT_EQ(mixprec_update_scale(&scale, &growth, nullptr, nullptr, &good, &p), MIXPREC_OK);
  EXPECT_EQ(scale, FLT_MAX);
}

struct ContractCase {
  const char *name;
  int64_t hysteresis;
  float min_scale, max_scale;
  double growth, backoff;
  int64_t interval;
  double p_overflow;
};

class UpdateScaleContract : public ::testing::TestWithParam<ContractCase> {};

// Random trajectories with hysteresis and bounds equal the header's rule
// step by step: scale bits, both trackers and skipped_steps.
TEST_P(UpdateScaleContract, RandomTrajectoryMatchesRule) {
  const ContractCase &c = GetParam();
  mixprec_update_scale_params p = mixprec_update_scale_params_default();
  p.hysteresis = c.hysteresis;
  p.min_scale = c.min_scale;
  p.max_scale = c.max_scale;
  p.growth_factor = c.growth;
  p.backoff_factor = c.backoff;
  p.growth_interval = c.interval;
  std::mt19937 rng(mpt::kSeed + 200 + uint32_t(c.hysteresis) * 17u + uint32_t(c.interval));
  State ref{65536.0f, 0, int32_t(c.hysteresis), 0};
  State got = ref;
  int64_t backoffs = 0, clamps = 0;
  for (int step = 0; step < 30000; step++) {
    const float fi = draw_found_inf(rng, c.p_overflow);
    const float before = ref.scale;
    contract_update(ref, fi, p);
    backoffs += ref.scale < before;
    clamps += ref.scale == c.min_scale || ref.scale == c.max_scale;
    ASSERT_EQ(mixprec_update_scale(&got.scale, &got.growth, &got.hyst, &got.skipped, &fi, &p), MIXPREC_OK);
    ASSERT_EQ(f32_bits(got.scale), f32_bits(ref.scale)) << c.name << " step " << step << ": " << got.scale
                                                        << " vs " << ref.scale;
    ASSERT_EQ(got.growth, ref.growth) << c.name << " step " << step;
    ASSERT_EQ(got.hyst, ref.hyst) << c.name << " step " << step;
    ASSERT_EQ(got.skipped, ref.skipped) << c.name << " step " << step;
  }
  EXPECT_GT(backoffs, 0) << "trajectory must back off";
  if (c.min_scale > 0.0f || std::isfinite(c.max_scale)) { EXPECT_GT(clamps, 0) << "trajectory must hit a bound"; }
}

INSTANTIATE_TEST_SUITE_P(
    HysteresisAndBounds, UpdateScaleContract,
    ::testing::Values(
        ContractCase{"h1_unbounded", 1, 0.0f, kInf, 2.0, 0.5, 3, 0.2},
        ContractCase{"h2_unbounded", 2, 0.0f, kInf, 2.0, 0.5, 3, 0.3},
        ContractCase{"h3_min", 3, 256.0f, kInf, 2.0, 0.5, 2, 0.6},
        ContractCase{"h3_max", 3, 0.0f, 1048576.0f, 2.0, 0.5, 2, 0.15},
        ContractCase{"h5_both_odd", 5, 0.75f, 3.0e6f, 1.37, 0.9, 2, 0.4},
        ContractCase{"h2_both", 2, 1.0f, 65536.0f * 4, 2.0, 0.5, 1, 0.35}),
    [](const ::testing::TestParamInfo<ContractCase> &info) { return std::string(info.param.name); });

// ---------------------------------------------------------- bad input ----

// Each invalid argument returns its documented status and writes nothing:
// scale, both trackers and skipped_steps are poisoned and compared.
TEST(UpdateScale, InvalidArgumentsWriteNothing) {
  using Mut = std::function<void(mixprec_update_scale_params &)>;
  struct Case { const char *name; Mut mut; };
  const double dnan = std::numeric_limits<double>::quiet_NaN();
  const double dinf = std::numeric_limits<double>::infinity();
  const Case bad_params[] = {
      {"growth_interval 0", [](auto &p) { p.growth_interval = 0; }},
      {"growth_interval -3", [](auto &p) { p.growth_interval = -3; }},
      {"hysteresis 0", [](auto &p) { p.hysteresis = 0; }},
      {"hysteresis -1", [](auto &p) { p.hysteresis = -1; }},
      // Above INT32_MAX the int32 tracker would truncate it (2^32 + 2 acting
      // as 2): refused, not truncated.
      {"hysteresis 2^31", [](auto &p) { p.hysteresis = int64_t(INT32_MAX) + 1; }},
      {"hysteresis 2^32 + 2", [](auto &p) { p.hysteresis = (int64_t(1) << 32) + 2; }},
      {"hysteresis INT64_MAX", [](auto &p) { p.hysteresis = INT64_MAX; }},
      {"growth_interval 2^31", [](auto &p) { p.growth_interval = int64_t(INT32_MAX) + 1; }},
      {"growth NaN", [=](auto &p) { p.growth_factor = dnan; }},
      {"growth inf", [=](auto &p) { p.growth_factor = dinf; }},
      {"growth -inf", [=](auto &p) { p.growth_factor = -dinf; }},
      {"growth 0", [](auto &p) { p.growth_factor = 0.0; }},
      {"growth -2", [](auto &p) { p.growth_factor = -2.0; }},
      {"backoff NaN", [=](auto &p) { p.backoff_factor = dnan; }},
      {"backoff inf", [=](auto &p) { p.backoff_factor = dinf; }},
      {"backoff 0", [](auto &p) { p.backoff_factor = 0.0; }},
      {"backoff -0.5", [](auto &p) { p.backoff_factor = -0.5; }},
      {"min_scale -1", [](auto &p) { p.min_scale = -1.0f; }},
      {"min_scale NaN", [](auto &p) { p.min_scale = std::numeric_limits<float>::quiet_NaN(); }},
      {"max_scale NaN", [](auto &p) { p.max_scale = std::numeric_limits<float>::quiet_NaN(); }},
      {"min > max", [](auto &p) { p.min_scale = 2.0f; p.max_scale = 1.0f; }},
      {"max < 0 = min", [](auto &p) { p.max_scale = -1.0f; }},
  };
  for (int fi_kind = 0; fi_kind < 2; fi_kind++) {  // both branches of the rule
    const float fi = fi_kind ? 1.0f : 0.0f;
    for (const Case &c : bad_params) {
      mixprec_update_scale_params p = torch_params(2.0, 0.5, 1);
      p.hysteresis = 2;
      c.mut(p);
      float scale = 3.0f;
      int32_t growth = 5, hyst = 1;
      int64_t skipped = 9;
      EXPECT_EQ(mixprec_update_scale(&scale, &growth, &hyst, &skipped, &fi, &p), MIXPREC_ERR_BAD_ARGUMENT)
          << c.name;
      EXPECT_EQ(scale, 3.0f) << c.name;
      EXPECT_EQ(growth, 5) << c.name;
      EXPECT_EQ(hyst, 1) << c.name;
      EXPECT_EQ(skipped, 9) << c.name;
    }
  }

  // NULL pointers.
  const mixprec_update_scale_params p1 = torch_params(2.0, 0.5, 1);
  mixprec_update_scale_params p3 = p1;
  p3.hysteresis = 3;
  const float one = 1.0f;
  float scale = 3.0f;
  int32_t growth = 5, hyst = 1;
  int64_t skipped = 9;
  EXPECT_EQ(mixprec_update_scale(nullptr, &growth, &hyst, &skipped, &one, &p1), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(mixprec_update_scale(&scale, nullptr, &hyst, &skipped, &one, &p1), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(mixprec_update_scale(&scale, &growth, &hyst, &skipped, nullptr, &p1), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(mixprec_update_scale(&scale, &growth, &hyst, &skipped, &one, nullptr), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(mixprec_update_scale(&scale, &growth, nullptr, &skipped, &one, &p3), MIXPREC_ERR_NULL_POINTER)
      << "hysteresis > 1 needs a hysteresis tracker";
  EXPECT_EQ(scale, 3.0f);
  EXPECT_EQ(growth, 5);
  EXPECT_EQ(hyst, 1);
  EXPECT_EQ(skipped, 9);
}

// Unusual but valid parameters are accepted (the contract only rejects
// non-finite or non-positive factors): growth < 1, backoff > 1, a large
// finite factor, min == max, min 0 with max 0.
TEST(UpdateScale, UnusualValidParamsAccepted) {
  const float good = 0.0f, bad = 1.0f;
  struct Case { double growth, backoff; float min_s, max_s; const float *fi; float want; };
  const Case cases[] = {
      {0.5, 0.5, 0.0f, kInf, &good, 2.0f},  // "growth" that shrinks
      {2.0, 2.0, 0.0f, kInf, &bad, 8.0f},   // "backoff" that grows
      {1e10, 0.5, 0.0f, kInf, &good, 4e10f},
      {2.0, 0.5, 4.0f, 4.0f, &good, 4.0f},
      {2.0, 0.5, 0.0f, 0.0f, &good, 0.0f},
  };
  // The largest hysteresis, INT32_MAX, is valid: an overflow only counts the
  // tracker down.
  {
    mixprec_update_scale_params p = torch_params(2.0, 0.5, 10);
    p.hysteresis = INT32_MAX;
    float scale = 4.0f;
    int32_t growth = 3, hyst = INT32_MAX;
    ASSERT_EQ(mixprec_update_scale(&scale, &growth, &hyst, nullptr, &bad, &p), MIXPREC_OK);
    EXPECT_EQ(scale, 4.0f);
    EXPECT_EQ(hyst, INT32_MAX - 1);
    ASSERT_EQ(mixprec_update_scale(&scale, &growth, &hyst, nullptr, &good, &p), MIXPREC_OK);
    EXPECT_EQ(hyst, INT32_MAX);
  }
  for (const Case &c : cases) {
    mixprec_update_scale_params p = torch_params(c.growth, c.backoff, 1);
    p.min_scale = c.min_s;
    p.max_scale = c.max_s;
    float scale = 4.0f;
    int32_t growth = 0;
    ASSERT_EQ(mixprec_update_scale(&scale, &growth, nullptr, nullptr, c.fi, &p), MIXPREC_OK)
        << c.growth << " " << c.backoff;
    EXPECT_EQ(scale, c.want) << c.growth << " " << c.backoff;
  }
}

// Found by tests/fuzz/fuzz_update_scale: the skipped-step counter at
// INT64_MAX was incremented past it (signed overflow, undefined behaviour);
// it saturates instead, and the rest of the update still happens.
TEST(UpdateScale, SkippedStepsSaturate) {
  const float bad = 1.0f;
  mixprec_update_scale_params p = torch_params(2.0, 0.5, 10);
  float scale = 8.0f;
  int32_t growth = 3;
  int64_t skipped = INT64_MAX - 1;
  ASSERT_EQ(mixprec_update_scale(&scale, &growth, nullptr, &skipped, &bad, &p), MIXPREC_OK);
  EXPECT_EQ(skipped, INT64_MAX);
  EXPECT_EQ(scale, 4.0f);
  ASSERT_EQ(mixprec_update_scale(&scale, &growth, nullptr, &skipped, &bad, &p), MIXPREC_OK);
  EXPECT_EQ(skipped, INT64_MAX);
  EXPECT_EQ(scale, 2.0f);
  EXPECT_EQ(growth, 0);
}

}  // namespace
