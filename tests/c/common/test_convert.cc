// Conversions between float and the 16-bit storage types, status strings and
// dtype sizes. The kernels use these conversions, so they are checked
// exhaustively where the input space is 2^16 and against independent
// references (GCC's _Float16, a double-arithmetic bf16 rounder) elsewhere.
#include <cfloat>
#include <set>
#include <string>

#include "test_util.h"

#include "internal_api.h"

namespace {

using mpt::f32_bits;
using mpt::f32_from_bits;

uint16_t lib_f32_to_f16(float f) { return mixprec_f32_to_f16(f).bits; }
float lib_f16_to_f32(uint16_t h) { return mixprec_f16_to_f32(mixprec_f16{h}); }
uint16_t lib_f32_to_bf16(float f) { return mixprec_f32_to_bf16(f).bits; }
float lib_bf16_to_f32(uint16_t h) { return mixprec_bf16_to_f32(mixprec_bf16{h}); }

// Narrowing a NaN must give a quiet NaN of the same sign (the contract).
void expect_quiet_nan16(uint16_t got, bool negative, uint16_t exp_mask, uint16_t quiet_bit,
                        const std::string &what) {
  EXPECT_EQ(got & exp_mask, exp_mask) << what << " -> 0x" << std::hex << got;
  EXPECT_NE(got & quiet_bit, 0) << what << " -> 0x" << std::hex << got << " is not quiet";
  EXPECT_EQ((got & 0x8000u) != 0, negative) << what << " -> 0x" << std::hex << got << " lost its sign";
}

// Compares library f32->f16 with _Float16 for one input; returns true if equal
// (NaN inputs: quiet NaN of the same sign).
bool f16_narrow_ok(float f) {
  const uint16_t got = lib_f32_to_f16(f);
  if (std::isnan(f)) {
    return mpt::f16_bits_is_nan(got) && (got & 0x0200u) && ((got >> 15) == (f32_bits(f) >> 31));
  }
  return got == mpt::ref_f32_to_f16(f);
}

bool bf16_narrow_ok(float f) {
  const uint16_t got = lib_f32_to_bf16(f);
  if (std::isnan(f)) {
    return mpt::bf16_bits_is_nan(got) && (got & 0x0040u) && ((got >> 15) == (f32_bits(f) >> 31));
  }
  return got == mpt::ref_f32_to_bf16(f);
}

// Runs check over inputs, reporting the first few failures with their bits.
template <typename Check>
void check_all(const std::vector<float> &inputs, Check check, uint16_t (*lib)(float),
               uint16_t (*ref)(float), const char *what) {
  int64_t bad = 0;
  for (float f : inputs) {
    if (!check(f) && bad++ < 8) {
      ADD_FAILURE() << what << "(0x" << std::hex << f32_bits(f) << " = " << f << ") = 0x"
                    << lib(f) << ", reference 0x" << ref(f) << std::dec;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << inputs.size() << " inputs wrong";
}

// ---------------------------------------------------------------- FP16 ----

// Widening must be exact for every finite pattern (incl. ±0 and all 2046
// subnormals) and ±inf; a NaN stays a NaN with its sign and payload (the
// quiet bit may be set).
TEST(ConvertF16, AllPatternsWidenExactly) {
  int nan_count = 0;
  for (uint32_t h = 0; h <= 0xffffu; h++) {
    const float got = lib_f16_to_f32(uint16_t(h));
    const float want = mpt::ref_f16_to_f32(uint16_t(h));
    if (mpt::f16_bits_is_nan(uint16_t(h))) {
      nan_count++;
      ASSERT_TRUE(std::isnan(got)) << "f16 0x" << std::hex << h;
      ASSERT_EQ(f32_bits(got) >> 31, h >> 15) << "sign of NaN f16 0x" << std::hex << h;
      // Payload below the quiet bit moves up by 13 bits unchanged.
      ASSERT_EQ(f32_bits(got) & 0x003fe000u, (h & 0x1ffu) << 13) << "payload of f16 0x" << std::hex << h;
    } else {
      ASSERT_EQ(f32_bits(got), f32_bits(want))
          << "f16 0x" << std::hex << h << ": got " << got << " want " << want;
    }
  }
  EXPECT_EQ(nan_count, 2 * 1023);
}

// Known answers, so the test does not lean on _Float16 alone.
TEST(ConvertF16, WidenKnownValues) {
  EXPECT_EQ(lib_f16_to_f32(0x0000), 0.0f);
  EXPECT_EQ(f32_bits(lib_f16_to_f32(0x8000)), 0x80000000u);  // -0 keeps its sign
  EXPECT_EQ(lib_f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(lib_f16_to_f32(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(lib_f16_to_f32(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(lib_f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(lib_f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(lib_f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f32_bits(lib_f16_to_f32(0x7c00)), 0x7f800000u);
  EXPECT_EQ(f32_bits(lib_f16_to_f32(0xfc00)), 0xff800000u);
}

// Narrowing a widened FP16 value gives back the same bits; a NaN comes back
// as a quiet NaN of the same sign.
TEST(ConvertF16, AllPatternsRoundTrip) {
  for (uint32_t h = 0; h <= 0xffffu; h++) {
    const uint16_t back = lib_f32_to_f16(lib_f16_to_f32(uint16_t(h)));
    if (mpt::f16_bits_is_nan(uint16_t(h))) {
      expect_quiet_nan16(back, h & 0x8000u, 0x7c00u, 0x0200u, "f16 NaN round trip");
      ASSERT_TRUE(mpt::f16_bits_is_nan(back));
    } else {
      ASSERT_EQ(back, h) << "f16 0x" << std::hex << h << " round-trips to 0x" << back;
    }
  }
}

// The edges of the FP16 range with their exact expected bits, then the same
// inputs (and their negatives and float neighbours) against _Float16.
TEST(ConvertF16, NarrowBoundaries) {
  const float two_m24 = std::ldexp(1.0f, -24), two_m25 = std::ldexp(1.0f, -25);
  const float two_m14 = std::ldexp(1.0f, -14);
  struct Case { float in; uint16_t want; const char *why; };
  const Case cases[] = {
      {65504.0f, 0x7bff, "max finite"},
      {65519.99f, 0x7bff, "just below the overflow midpoint rounds down"},
      {65520.0f, 0x7c00, "overflow midpoint ties away to inf (even side)"},
      {65536.0f, 0x7c00, "2^16 overflows"},
      {FLT_MAX, 0x7c00, "FLT_MAX overflows"},
      {INFINITY, 0x7c00, "inf"},
      {two_m24, 0x0001, "smallest subnormal exact"},
      {two_m25, 0x0000, "half the smallest subnormal ties to even zero"},
      {std::nextafter(two_m25, 1.0f), 0x0001, "just above 2^-25 rounds up"},
      {std::nextafter(two_m25, 0.0f), 0x0000, "just below 2^-25 rounds to zero"},
      {1.5f * two_m24, 0x0002, "1.5 ulp ties to even (2)"},
      {2.5f * two_m24, 0x0002, "2.5 ulp ties to even (2)"},
      {3.5f * two_m24, 0x0004, "3.5 ulp ties to even (4)"},
      {two_m14, 0x0400, "smallest normal"},
      {std::nextafter(two_m14, 0.0f), 0x0400, "just below 2^-14 rounds up to normal"},
      {1023.5f * two_m24, 0x0400, "largest-subnormal tie rounds up to the smallest normal"},
      {1022.5f * two_m24, 0x03fe, "subnormal tie to even"},
      {1.0f + std::ldexp(1.0f, -11), 0x3c00, "tie at 1 rounds to even (down)"},
      {1.0f + 3 * std::ldexp(1.0f, -11), 0x3c02, "tie at 1+2^-10 rounds to even (up)"},
      {std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f), 0x3c01, "above tie rounds up"},
      {2047.5f, 0x6800, "step 1 in [1024,2048): tie between odd 2047 and 2048 goes up"},
      {2046.5f, 0x67fe, "tie between even 2046 and 2047 goes down"},
      {FLT_MIN, 0x0000, "float min normal underflows to zero"},
      {f32_from_bits(0x00000001u), 0x0000, "float subnormal underflows to zero"},
      {0.0f, 0x0000, "+0"},
  };
  for (const Case &c : cases) {
    EXPECT_EQ(lib_f32_to_f16(c.in), c.want) << c.why << " (input " << c.in << ")";
    EXPECT_EQ(lib_f32_to_f16(-c.in), uint16_t(c.want | 0x8000u)) << "negated: " << c.why;
  }
  std::vector<float> inputs;
  for (const Case &c : cases) {
    for (float v : {c.in, std::nextafter(c.in, 0.0f), std::nextafter(c.in, INFINITY)}) {
      inputs.push_back(v);
      inputs.push_back(-v);
    }
  }
  check_all(inputs, f16_narrow_ok, lib_f32_to_f16, mpt::ref_f32_to_f16, "f32_to_f16");
}

// Every midpoint between two adjacent FP16 values (exactly representable in
// float) and the float just below and above it: the tie-to-even rule and both
// rounding directions at every exponent, subnormal and the overflow edge.
TEST(ConvertF16, AllTiesAndTheirNeighbours) {
  std::vector<float> inputs;
  inputs.reserve(6 * 0x7c00);
  for (uint32_t h = 0; h < 0x7c00u; h++) {
    const double lo = mpt::ref_f16_to_f32(uint16_t(h));
    // Above 0x7bff the next value (if the exponent were unbounded) is 2^16.
    const double hi = h == 0x7bffu ? 65536.0 : double(mpt::ref_f16_to_f32(uint16_t(h + 1)));
    const float mid = float((lo + hi) / 2);
    ASSERT_EQ(double(mid), (lo + hi) / 2) << "midpoint not exact in float";
    for (float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      inputs.push_back(v);
      inputs.push_back(-v);
    }
  }
  check_all(inputs, f16_narrow_ok, lib_f32_to_f16, mpt::ref_f32_to_f16, "f32_to_f16 ties");
}

// Random float bit patterns: half uniform over all 2^32 (mostly far outside
// FP16's range, plus NaNs), half with the exponent drawn from the band that
// maps onto FP16 normals and subnormals, where rounding really happens.
TEST(ConvertF16, RandomFloatsMatchFloat16) {
  std::mt19937 rng(mpt::kSeed + 1);
  std::uniform_int_distribution<uint32_t> bits;
  std::uniform_int_distribution<uint32_t> band(127 - 27, 127 + 16);  // 2^-27 .. 2^16
  std::vector<float> inputs;
  const int n = 2000000;
  inputs.reserve(2 * n);
  for (int i = 0; i < n; i++) {
    inputs.push_back(f32_from_bits(bits(rng)));
    const uint32_t r = bits(rng);
    inputs.push_back(f32_from_bits((r & 0x807fffffu) | (band(rng) << 23)));
  }
  check_all(inputs, f16_narrow_ok, lib_f32_to_f16, mpt::ref_f32_to_f16, "f32_to_f16 random");
}

// NaN inputs of every kind (quiet/signalling, both signs, payloads that
// vanish when truncated to 10 bits) must come out a quiet NaN, never inf.
// The given NaNs plus 10000 random ones (seed kSeed + seed) narrowed by
// `narrow`: each must be a NaN (`is_nan`), quiet, with the input's sign.
template <class Narrow, class IsNan>
void check_nans_narrow(int seed, std::vector<uint32_t> nans, Narrow narrow, IsNan is_nan, uint16_t exp_mask,
                       uint16_t quiet_bit, const char *what) {
  std::mt19937 rng(mpt::kSeed + seed);
  std::uniform_int_distribution<uint32_t> mant(1, 0x7fffffu);
  for (int i = 0; i < 10000; i++) nans.push_back(((rng() & 1u) << 31) | 0x7f800000u | mant(rng));
  for (uint32_t u : nans) {
    const uint16_t got = narrow(f32_from_bits(u));
    ASSERT_TRUE(is_nan(got)) << "0x" << std::hex << u << " -> 0x" << got;
    expect_quiet_nan16(got, u >> 31, exp_mask, quiet_bit, what);
  }
}

TEST(ConvertF16, NaNStaysQuietNaNWithSign) {
  check_nans_narrow(2,
                    {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fa00000u, 0x7f801fffu,
                     0xffbfffffu, 0x7fffffffu},
                    lib_f32_to_f16, mpt::f16_bits_is_nan, 0x7c00u, 0x0200u, "f32_to_f16 NaN");
}

// ---------------------------------------------------------------- BF16 ----

// bf16 -> f32 is the bits shifted up, for every pattern (NaNs included).
TEST(ConvertBF16, AllPatternsWidenByShift) {
  for (uint32_t h = 0; h <= 0xffffu; h++) {
    ASSERT_EQ(f32_bits(lib_bf16_to_f32(uint16_t(h))), h << 16) << "bf16 0x" << std::hex << h;
  }
}

// Narrowing a widened bf16 is the identity for every non-NaN pattern (incl.
// subnormals, ±0, ±inf); a NaN comes back a quiet NaN of the same sign.
TEST(ConvertBF16, AllPatternsRoundTrip) {
  for (uint32_t h = 0; h <= 0xffffu; h++) {
    const uint16_t back = lib_f32_to_bf16(lib_bf16_to_f32(uint16_t(h)));
    if (mpt::bf16_bits_is_nan(uint16_t(h))) {
      ASSERT_TRUE(mpt::bf16_bits_is_nan(back)) << "bf16 0x" << std::hex << h << " -> 0x" << back;
      expect_quiet_nan16(back, h & 0x8000u, 0x7f80u, 0x0040u, "bf16 NaN round trip");
    } else {
      ASSERT_EQ(back, h) << "bf16 0x" << std::hex << h << " round-trips to 0x" << back;
    }
  }
}

// Sanity of the test's own reference on values whose answers are known.
TEST(ConvertBF16, ReferenceSelfCheck) {
  EXPECT_EQ(mpt::ref_f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(mpt::ref_f32_to_bf16(f32_from_bits(0x3f808000u)), 0x3f80);  // tie, even below
  EXPECT_EQ(mpt::ref_f32_to_bf16(f32_from_bits(0x3f818000u)), 0x3f82);  // tie, even above
  EXPECT_EQ(mpt::ref_f32_to_bf16(f32_from_bits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(mpt::ref_f32_to_bf16(FLT_MAX), 0x7f80);
  EXPECT_EQ(mpt::ref_f32_to_bf16(f32_from_bits(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(mpt::ref_f32_to_bf16(f32_from_bits(0x80008000u)), 0x8000);  // subnormal tie to -0
  EXPECT_EQ(mpt::ref_f32_to_bf16(f32_from_bits(0x00018000u)), 0x0002);
}

// Known answers at the edges: overflow, subnormals (no flush), ties.
TEST(ConvertBF16, NarrowBoundaries) {
  struct Case { uint32_t in; uint16_t want; const char *why; };
  const Case cases[] = {
      {0x7f7f7fffu, 0x7f7f, "just below the overflow midpoint stays finite"},
      {0x7f7f8000u, 0x7f80, "overflow midpoint: odd 0x7f7f rounds up to inf"},
      {0x7f7fffffu, 0x7f80, "FLT_MAX overflows to inf"},
      {0x7f800000u, 0x7f80, "inf"},
      {0x00000001u, 0x0000, "smallest float subnormal rounds to 0"},
      {0x00008000u, 0x0000, "tie at the smallest bf16 subnormal goes to even 0"},
      {0x00008001u, 0x0001, "just above it rounds up"},
      {0x00018000u, 0x0002, "tie between 1 and 2 goes to 2"},
      {0x007fffffu, 0x0080, "largest float subnormal rounds up to the smallest normal"},
      {0x00400000u, 0x0040, "bf16 subnormal exact (no flush)"},
      {0x3f808000u, 0x3f80, "tie, even below"},
      {0x3f818000u, 0x3f82, "tie, even above"},
      {0x3f807fffu, 0x3f80, "below tie"},
      {0x3f808001u, 0x3f81, "above tie"},
      {0x3fffffffu, 0x4000, "carry into the exponent"},
  };
  for (const Case &c : cases) {
    EXPECT_EQ(lib_f32_to_bf16(f32_from_bits(c.in)), c.want) << c.why;
    EXPECT_EQ(lib_f32_to_bf16(f32_from_bits(c.in | 0x80000000u)), uint16_t(c.want | 0x8000u))
        << "negated: " << c.why;
    EXPECT_EQ(mpt::ref_f32_to_bf16(f32_from_bits(c.in)), c.want) << "reference: " << c.why;
  }
}

// For every finite bf16 value, the float exactly halfway to the next one and
// floats just around it and around the bf16 value itself: all tie and
// rounding cases at every exponent, against the double-arithmetic reference.
TEST(ConvertBF16, AllTiesAndTheirNeighbours) {
  std::vector<float> inputs;
  inputs.reserve(10 * 0x7f80);
  for (uint32_t h = 0; h < 0x7f80u; h++) {
    for (uint32_t low : {0x8000u, 0x7fffu, 0x8001u, 0x0001u, 0xffffu}) {
      const uint32_t u = (h << 16) | low;
      inputs.push_back(f32_from_bits(u));
      inputs.push_back(f32_from_bits(u | 0x80000000u));
    }
  }
  check_all(inputs, bf16_narrow_ok, lib_f32_to_bf16, mpt::ref_f32_to_bf16, "f32_to_bf16 ties");
}

TEST(ConvertBF16, RandomFloatsMatchReference) {
  std::mt19937 rng(mpt::kSeed + 3);
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<float> inputs;
  const int n = 4000000;
  inputs.reserve(n);
  for (int i = 0; i < n; i++) inputs.push_back(f32_from_bits(bits(rng)));
  check_all(inputs, bf16_narrow_ok, lib_f32_to_bf16, mpt::ref_f32_to_bf16, "f32_to_bf16 random");
}

TEST(ConvertBF16, NaNStaysQuietNaNWithSign) {
  // 0x7f800001: a payload that truncation to 7 bits would lose (-> inf).
  check_nans_narrow(4,
                    {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7f80ffffu, 0x7fbfffffu,
                     0xff80ffffu, 0x7fffffffu},
                    lib_f32_to_bf16, mpt::bf16_bits_is_nan, 0x7f80u, 0x0040u, "f32_to_bf16 NaN");
}

// ------------------------------------------------------- status / dtype ----

// ------------------------------------------------- element.h accesses ----

// element.h's accesses by dtype (what every CPU kernel and, on CUDA's
// converters, every CUDA kernel loads and stores through) agree with the
// converters above on all 2^16 patterns of each 16-bit dtype and on FP32
// values incl. NaN payloads, and a store keeps what round_to says.
TEST(Element, SixteenBitAccessesAreTheConverters) {
  for (mixprec_dtype dt : {MIXPREC_F16, MIXPREC_BF16}) {
    float (*widen)(uint16_t) = dt == MIXPREC_F16 ? lib_f16_to_f32 : lib_bf16_to_f32;
    uint16_t (*narrow)(float) = dt == MIXPREC_F16 ? lib_f32_to_f16 : lib_f32_to_bf16;
    int64_t bad = 0;
    for (uint32_t h = 0; h <= 0xffffu; h++) {
      const uint16_t buf[3] = {0x1234u, (uint16_t)h, 0x4321u};
      const float w = widen((uint16_t)h);
      bad += f32_bits(mixprec__value_of_bits(dt, h)) != f32_bits(w);
      bad += f32_bits(mixprec__half_to_f32(dt, (uint16_t)h)) != f32_bits(w);
      bad += f32_bits(mixprec__load_f32(buf, dt, 1)) != f32_bits(w);
      // A value goes back to its pattern (a NaN to the converter's NaN).
      bad += mixprec__bits_of_value(dt, w) != narrow(w);
      bad += mixprec__f32_to_half(dt, w) != narrow(w);
      uint16_t out[3] = {0xaaaau, 0xaaaau, 0xaaaau};
      mixprec__store_f32(out, dt, 1, w);
      bad += out[0] != 0xaaaau || out[1] != narrow(w) || out[2] != 0xaaaau;
      if (!std::isnan(w)) bad += narrow(w) != h;
    }
    EXPECT_EQ(bad, 0) << "dtype " << dt;
  }
}

TEST(Element, StoresRoundToNearestEvenAndRoundToSaysWhatIsKept) {
  std::mt19937 rng(mpt::kSeed + 7);
  std::uniform_int_distribution<uint32_t> bits;
  std::uniform_int_distribution<uint32_t> band(127 - 27, 127 + 16);  // where FP16 rounds
  std::vector<float> vals;
  for (int i = 0; i < 100000; i++) {
    vals.push_back(f32_from_bits(bits(rng)));
    vals.push_back(f32_from_bits((bits(rng) & 0x807fffffu) | (band(rng) << 23)));
  }
  for (float v : {0.0f, -0.0f, 65504.0f, 65520.0f, 1e-8f, -3e38f, INFINITY, -INFINITY, NAN,
                  f32_from_bits(0x7f800001u), f32_from_bits(0x3f808000u), f32_from_bits(0x3f818000u)})
    vals.push_back(v);
  int64_t bad = 0;
  for (float v : vals) {
    for (mixprec_dtype dt : {MIXPREC_F16, MIXPREC_BF16}) {
      float (*widen)(uint16_t) = dt == MIXPREC_F16 ? lib_f16_to_f32 : lib_bf16_to_f32;
      uint16_t (*narrow)(float) = dt == MIXPREC_F16 ? lib_f32_to_f16 : lib_f32_to_bf16;
      uint16_t out[1];
      mixprec__store_f32(out, dt, 0, v);
      bad += out[0] != narrow(v);
      bad += f32_bits(mixprec__round_to(dt, v)) != f32_bits(widen(out[0]));
    }
    // FP32 (and any dtype that is not FP16/BF16) keeps the bits, payloads included.
    float f[2] = {1.0f, 2.0f};
    mixprec__store_f32(f, MIXPREC_F32, 1, v);
    bad += f32_bits(f[1]) != f32_bits(v) || f32_bits(f[0]) != f32_bits(1.0f);
    bad += f32_bits(mixprec__load_f32(f, MIXPREC_F32, 1)) != f32_bits(v);
    bad += f32_bits(mixprec__round_to(MIXPREC_F32, v)) != f32_bits(v);
    bad += mixprec__bits_of_value(MIXPREC_F32, v) != f32_bits(v);
    bad += f32_bits(mixprec__value_of_bits(MIXPREC_F32, f32_bits(v))) != f32_bits(v);
  }
  EXPECT_EQ(bad, 0);
}

TEST(Status, StringsNonNullAndDistinct) {
  std::set<std::string> seen;
  const mixprec_status all[] = {MIXPREC_OK,           MIXPREC_ERR_NULL_POINTER,
                                MIXPREC_ERR_BAD_DTYPE, MIXPREC_ERR_BAD_SIZE,
                                MIXPREC_ERR_BAD_ARGUMENT, MIXPREC_ERR_OUT_OF_MEMORY,
                                MIXPREC_ERR_CUDA,     MIXPREC_ERR_UNSUPPORTED};
  for (mixprec_status s : all) {
    const char *str = mixprec_status_string(s);
    ASSERT_NE(str, nullptr) << "status " << int(s);
    EXPECT_GT(std::strlen(str), 0u) << "status " << int(s);
    EXPECT_STRNE(str, "unknown status") << "status " << int(s);
    EXPECT_TRUE(seen.insert(str).second) << "duplicate string for status " << int(s) << ": " << str;
  }
  EXPECT_EQ(seen.size(), 8u);
}

// Enum values are pinned: they are part of the ABI.
TEST(Status, ValuesArePinned) {
  EXPECT_EQ(int(MIXPREC_OK), 0);
  EXPECT_EQ(int(MIXPREC_ERR_NULL_POINTER), 1);
  EXPECT_EQ(int(MIXPREC_ERR_BAD_DTYPE), 2);
  EXPECT_EQ(int(MIXPREC_ERR_BAD_SIZE), 3);
  EXPECT_EQ(int(MIXPREC_ERR_BAD_ARGUMENT), 4);
  EXPECT_EQ(int(MIXPREC_ERR_OUT_OF_MEMORY), 5);
  EXPECT_EQ(int(MIXPREC_ERR_CUDA), 6);
  EXPECT_EQ(int(MIXPREC_ERR_UNSUPPORTED), 7);
  EXPECT_EQ(int(MIXPREC_F32), 0);
  EXPECT_EQ(int(MIXPREC_F16), 1);
  EXPECT_EQ(int(MIXPREC_BF16), 2);
  EXPECT_EQ(sizeof(mixprec_f16), 2u);
  EXPECT_EQ(sizeof(mixprec_bf16), 2u);
}

TEST(Status, UnknownValueGivesUnknownStatus) {
  for (int v : {8, 9, 100, -1, 0x7fffffff}) {
    const char *str = mpt::call_with_int(&mixprec_status_string, v);
    ASSERT_NE(str, nullptr) << v;
    EXPECT_STREQ(str, "unknown status") << v;
  }
}

TEST(Status, Version) {
  EXPECT_EQ(mixprec_version(), MIXPREC_VERSION_MAJOR * 10000 + MIXPREC_VERSION_MINOR * 100 +
                                   MIXPREC_VERSION_PATCH);
}

TEST(Dtype, Sizes) {
  EXPECT_EQ(mixprec_dtype_size(MIXPREC_F32), 4);
  EXPECT_EQ(mixprec_dtype_size(MIXPREC_F16), 2);
  EXPECT_EQ(mixprec_dtype_size(MIXPREC_BF16), 2);
  for (int v : {3, 7, -1, 1000}) EXPECT_EQ(mpt::call_with_int(&mixprec_dtype_size, v), 0) << v;
}

}  // namespace
