// mixprec_overflow_check against a reference written here: flags and the
// largest finite magnitude computed from the reference conversions.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "mixprec/mixprec.h"
#include "test_util.h"

namespace {

using mpt::Buf;

constexpr int W = MIXPREC_OVERFLOW_SLOT;

struct Ref {
  float amax = 0.0f;
  bool bad = false;
};

Ref reference(std::vector<Buf>& list) {
  Ref r;
  for (Buf& b : list)
    for (int64_t i = 0; i < b.numel(); i++) {
      const float v = b.value(i);
      if (!std::isfinite(v)) r.bad = true;
      else r.amax = std::max(r.amax, std::fabs(v));
    }
  return r;
}

std::vector<mixprec_tensor> descs(std::vector<Buf>& list) {
  std::vector<mixprec_tensor> d;
  for (Buf& b : list) d.push_back(b.tensor());
  return d;
}

mixprec_status check(std::vector<Buf>& outs, std::vector<Buf>& ins, std::vector<float>& rec,
                     int64_t slot) {
  auto o = descs(outs), i = descs(ins);
  return mixprec_overflow_check(o.data(), (int64_t)o.size(), i.data(), (int64_t)i.size(),
                                rec.data(), (int64_t)rec.size() / W, slot);
}

uint32_t inf_bits(mixprec_dtype d) {
  return d == MIXPREC_F32 ? 0x7f800000u : d == MIXPREC_F16 ? 0x7c00u : 0x7f80u;
}
uint32_t nan_bits(mixprec_dtype d) {
  return d == MIXPREC_F32 ? 0xffc00001u : d == MIXPREC_F16 ? 0xfe01u : 0xffc1u;
}

class OverflowDtype : public ::testing::TestWithParam<mixprec_dtype> {};

// Finite outputs: the amax is the reference's bit for bit, no flag is set,
// the inputs (which hold an inf) are not looked at, the other slots and the
// scratch fields are untouched.
TEST_P(OverflowDtype, FiniteOutputsGiveAmaxAndNoFlags) {
  const mixprec_dtype dt = GetParam();
  std::mt19937 rng(mpt::kSeed + 1 + dt);
  for (int64_t n : {1, 7, 33, 1000, 70000}) {
    std::vector<Buf> outs, ins;
    outs.emplace_back(dt, n, n % 2 == 1);
    outs.emplace_back(MIXPREC_F32, n / 3 + 1);
    for (Buf& b : outs) mpt::fill_random(b, rng);
    ins.emplace_back(dt, n);
    mpt::fill_random(ins[0], rng);
    ins[0].set_raw(n / 2, inf_bits(dt));
    std::vector<float> rec(3 * W, 0.0f);
    rec[2 * W + 1] = 5.0f;  // another slot's value
    ASSERT_EQ(check(outs, ins, rec, 1), MIXPREC_OK);
    const Ref r = reference(outs);
    EXPECT_EQ(mpt::f32_bits(rec[W + MIXPREC_OVERFLOW_AMAX]), mpt::f32_bits(r.amax)) << n;
    EXPECT_EQ(rec[W + MIXPREC_OVERFLOW_NONFINITE], 0.0f);
    EXPECT_EQ(rec[W + MIXPREC_OVERFLOW_INPUT_NONFINITE], 0.0f);
    EXPECT_EQ(rec[W + MIXPREC_OVERFLOW_FROM_FINITE], 0.0f);
    for (int k = 4; k < W; k++) EXPECT_EQ(rec[W + k], 0.0f);
    for (int k = 0; k < W; k++) EXPECT_EQ(rec[k], 0.0f);
    EXPECT_EQ(rec[2 * W + 1], 5.0f);
  }
}

// An inf or NaN at the first, a middle or the last index of an output:
// NONFINITE and FROM_FINITE (inputs finite), the amax of the rest.
TEST_P(OverflowDtype, NonFiniteOutputFromFiniteInputs) {
  const mixprec_dtype dt = GetParam();
  std::mt19937 rng(mpt::kSeed + 11 + dt);
  const int64_t n = 4099;
  for (int64_t at : {int64_t{0}, n / 2, n - 1})
    for (bool nan : {false, true}) {
      std::vector<Buf> outs, ins;
      outs.emplace_back(dt, n);
      ins.emplace_back(dt, 300);
      mpt::fill_random(outs[0], rng);
      mpt::fill_random(ins[0], rng);
      outs[0].set_raw(at, nan ? nan_bits(dt) : inf_bits(dt) | (at % 2 ? 0u : (dt == MIXPREC_F32 ? 0x80000000u : 0x8000u)));
      std::vector<float> rec(W, 0.0f);
      ASSERT_EQ(check(outs, ins, rec, 0), MIXPREC_OK);
      const Ref r = reference(outs);
      ASSERT_TRUE(r.bad);
      EXPECT_EQ(mpt::f32_bits(rec[MIXPREC_OVERFLOW_AMAX]), mpt::f32_bits(r.amax));
      EXPECT_EQ(rec[MIXPREC_OVERFLOW_NONFINITE], 1.0f);
      EXPECT_EQ(rec[MIXPREC_OVERFLOW_FROM_FINITE], 1.0f);
      EXPECT_EQ(rec[MIXPREC_OVERFLOW_INPUT_NONFINITE], 0.0f);
      // The same call with a NaN in the input: propagated, not produced.
      ins[0].set_raw(at % 300, nan_bits(dt));
      std::vector<float> rec2(W, 0.0f);
      ASSERT_EQ(check(outs, ins, rec2, 0), MIXPREC_OK);
      EXPECT_EQ(rec2[MIXPREC_OVERFLOW_NONFINITE], 1.0f);
      EXPECT_EQ(rec2[MIXPREC_OVERFLOW_FROM_FINITE], 0.0f);
      EXPECT_EQ(rec2[MIXPREC_OVERFLOW_INPUT_NONFINITE], 1.0f);
    }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, OverflowDtype,
                         ::testing::Values(MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16),
                         [](const auto& info) { return std::string(mpt::dtype_name(info.param)); });

// Every FP16 and BF16 bit pattern (subnormals, the largest finite values,
// both infinities, NaNs) as a one-element output.
TEST(Overflow, EverySixteenBitPattern) {
  for (mixprec_dtype dt : {MIXPREC_F16, MIXPREC_BF16})
    for (uint32_t bits = 0; bits < 65536; bits++) {
      std::vector<Buf> outs, ins;
      outs.emplace_back(dt, 1);
      outs[0].set_raw(0, bits);
      std::vector<float> rec(W, 0.0f);
      ASSERT_EQ(check(outs, ins, rec, 0), MIXPREC_OK);
      const float v = outs[0].value(0);
      if (std::isfinite(v)) {
        ASSERT_EQ(mpt::f32_bits(rec[MIXPREC_OVERFLOW_AMAX]), mpt::f32_bits(std::fabs(v)) & 0x7fffffffu) << bits;
        ASSERT_EQ(rec[MIXPREC_OVERFLOW_NONFINITE], 0.0f) << bits;
      } else {
        ASSERT_EQ(rec[MIXPREC_OVERFLOW_AMAX], 0.0f) << bits;
        ASSERT_EQ(rec[MIXPREC_OVERFLOW_NONFINITE], 1.0f) << bits;
        ASSERT_EQ(rec[MIXPREC_OVERFLOW_FROM_FINITE], 1.0f) << bits;  // no inputs: all finite
      }
    }
}

// Calls on one slot accumulate: the max of the amaxes, flags stay set.
TEST(Overflow, CallsAccumulate) {
  std::mt19937 rng(mpt::kSeed + 21);
  std::vector<float> rec(2 * W, 0.0f);
  std::vector<Buf> none;
  float want = 0.0f;
  for (int call = 0; call < 6; call++) {
    std::vector<Buf> outs;
    outs.emplace_back(MIXPREC_BF16, 500);
    mpt::fill_random(outs[0], rng, -10, 10 + call, false);
    if (call == 2) outs[0].set_raw(17, 0x7f80u);
    want = std::max(want, reference(outs).amax);
    ASSERT_EQ(check(outs, none, rec, 1), MIXPREC_OK);
    EXPECT_EQ(mpt::f32_bits(rec[W + MIXPREC_OVERFLOW_AMAX]), mpt::f32_bits(want));
    EXPECT_EQ(rec[W + MIXPREC_OVERFLOW_NONFINITE], call >= 2 ? 1.0f : 0.0f);
    EXPECT_EQ(rec[W + MIXPREC_OVERFLOW_FROM_FINITE], call >= 2 ? 1.0f : 0.0f);
  }
}

// Large lists run on threads over fixed chunks: the record is the same on
// 1 and 2 threads and on every ISA.
TEST(Overflow, ThreadsAndIsasAgree) {
  mpt::GlobalStateGuard restore;
  std::mt19937 rng(mpt::kSeed + 31);
  for (mixprec_dtype dt : {MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16})
    for (bool bad : {false, true}) {
      std::vector<Buf> outs, ins;
      outs.emplace_back(dt, 300001, true);
      outs.emplace_back(MIXPREC_F16, 70000);
      ins.emplace_back(dt, 400000);
      for (Buf& b : outs) mpt::fill_random(b, rng);
      mpt::fill_random(ins[0], rng);
      if (bad) {
        outs[0].set_raw(299999, nan_bits(dt));
        ins[0].set_raw(399999, inf_bits(dt));
      }
      std::vector<float> first;
      for (mixprec_cpu_isa isa : mpt::supported_isas())
        for (int threads : {1, 2}) {
          ASSERT_EQ(mixprec_set_cpu_isa(isa), MIXPREC_OK);
          mixprec_set_num_threads(threads);
          std::vector<float> rec(W, 0.0f);
          ASSERT_EQ(check(outs, ins, rec, 0), MIXPREC_OK);
          if (first.empty()) {
            first = rec;
            EXPECT_EQ(mpt::f32_bits(rec[MIXPREC_OVERFLOW_AMAX]), mpt::f32_bits(reference(outs).amax));
            EXPECT_EQ(rec[MIXPREC_OVERFLOW_INPUT_NONFINITE], bad ? 1.0f : 0.0f);
          }
          for (int k = 0; k < W; k++)
            EXPECT_EQ(mpt::f32_bits(rec[k]), mpt::f32_bits(first[k]))
                << mpt::isa_name(isa) << " threads " << threads << " field " << k;
        }
    }
}

// Bad arguments: the documented status, and nothing written.
TEST(Overflow, BadArgumentsWriteNothing) {
  std::vector<Buf> outs;
  outs.emplace_back(MIXPREC_F16, 10);
  outs[0].set_raw(3, 0x7c00u);
  mixprec_tensor o = outs[0].tensor();
  std::vector<float> rec(2 * W, 0.25f);
  auto untouched = [&] {
    for (float v : rec) EXPECT_EQ(v, 0.25f);
  };
  EXPECT_EQ(mixprec_overflow_check(&o, 1, nullptr, 0, nullptr, 2, 0), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(mixprec_overflow_check(nullptr, 1, nullptr, 0, rec.data(), 2, 0), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(mixprec_overflow_check(&o, 1, nullptr, 1, rec.data(), 2, 0), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(mixprec_overflow_check(&o, -1, nullptr, 0, rec.data(), 2, 0), MIXPREC_ERR_BAD_SIZE);
  EXPECT_EQ(mixprec_overflow_check(&o, 1, &o, -2, rec.data(), 2, 0), MIXPREC_ERR_BAD_SIZE);
  EXPECT_EQ(mixprec_overflow_check(&o, 1, nullptr, 0, rec.data(), 0, 0), MIXPREC_ERR_BAD_SIZE);
  EXPECT_EQ(mixprec_overflow_check(&o, 1, nullptr, 0, rec.data(), 2, 2), MIXPREC_ERR_BAD_ARGUMENT);
  EXPECT_EQ(mixprec_overflow_check(&o, 1, nullptr, 0, rec.data(), 2, -1), MIXPREC_ERR_BAD_ARGUMENT);
  mixprec_tensor bad = o;
  bad.numel = -1;
  EXPECT_EQ(mixprec_overflow_check(&bad, 1, nullptr, 0, rec.data(), 2, 0), MIXPREC_ERR_BAD_SIZE);
  bad = o;
  bad.data = nullptr;
  EXPECT_EQ(mixprec_overflow_check(&o, 1, &bad, 1, rec.data(), 2, 0), MIXPREC_ERR_NULL_POINTER);
  bad = o;
  mpt::poke_enum(&bad.dtype, 9);
  EXPECT_EQ(mixprec_overflow_check(&bad, 1, nullptr, 0, rec.data(), 2, 0), MIXPREC_ERR_BAD_DTYPE);
  untouched();
  // Empty lists and empty tensors are fine and change nothing but nothing.
  mixprec_tensor empty = {nullptr, 0, MIXPREC_BF16};
  std::vector<float> zero(W, 0.0f);
  EXPECT_EQ(mixprec_overflow_check(&empty, 1, nullptr, 0, zero.data(), 1, 0), MIXPREC_OK);
  EXPECT_EQ(mixprec_overflow_check(nullptr, 0, nullptr, 0, zero.data(), 1, 0), MIXPREC_OK);
  for (float v : zero) EXPECT_EQ(v, 0.0f);
}

}  // namespace
