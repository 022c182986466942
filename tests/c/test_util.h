// Shared helpers of the C API's GoogleTest suite: bit access, reference
// conversions written independently of the library, typed host buffers and
// an ISA/thread guard. Header-only; every test file includes it.
#ifndef MIXPREC_TEST_UTIL_H
#define MIXPREC_TEST_UTIL_H

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mixprec/mixprec.h"

namespace mpt {

// Every test seeds its own generator from this constant plus a per-test
// salt, so a failure reproduces, yet each test sees different data.
constexpr uint32_t kSeed = 0x6d697870u;  // "mixp"

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline bool f16_bits_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu); }
inline bool bf16_bits_is_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu); }
inline bool f32_bits_is_nan(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

// ---- Reference conversions (never call the library) ----------------------

// GCC's _Float16 conversions (libgcc soft-fp on x86-64 without AVX512-FP16)
// are correctly rounded, ties to even, with gradual underflow: the reference
// for FP16.
inline float ref_f16_to_f32(uint16_t h) {
  _Float16 x;
  std::memcpy(&x, &h, sizeof h);
  return static_cast<float>(x);
}
inline uint16_t ref_f32_to_f16(float f) {
  _Float16 x = static_cast<_Float16>(f);
  uint16_t h;
  std::memcpy(&h, &x, sizeof h);
  return h;
}

// bfloat16 is by definition the top half of a float.
inline float ref_bf16_to_f32(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }

// Round-to-nearest-even to bf16 by comparing distances to the two bf16
// neighbours in double (both differences are exact there), not by the
// library's add-and-shift trick. Overflow follows IEEE: the value is rounded
// as if the exponent were unbounded (the neighbour above the largest finite
// bf16 is 2^128) and becomes inf. NaN gives the canonical quiet NaN.
inline uint16_t ref_f32_to_bf16(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  if (std::isnan(f)) return uint16_t(sign | 0x7fc0u);
  if (std::isinf(f)) return uint16_t(sign | 0x7f80u);
  const uint32_t a_bits = u & 0x7fffffffu;
  const uint16_t lo = uint16_t(a_bits >> 16);  // largest bf16 <= |f|
  const double a = std::fabs(double(f));
  const double v_lo = double(ref_bf16_to_f32(lo));
  const double v_hi = lo == 0x7f7fu ? std::ldexp(1.0, 128) : double(ref_bf16_to_f32(uint16_t(lo + 1)));
  const double below = a - v_lo, above = v_hi - a;
  uint16_t r;
  if (below < above) r = lo;
  else if (above < below) r = uint16_t(lo + 1);
  else r = (lo & 1u) ? uint16_t(lo + 1) : lo;
  return uint16_t(sign | r);  // lo + 1 == 0x7f80 is inf: overflow
}

// ---- Calling a C entry point with an out-of-range enum value -------------
// In C++ converting e.g. 8 to mixprec_status is undefined (it is outside the
// enum's value range) and UBSan may trap it; in C any int is fine. The C ABI
// passes an enum exactly as an int, so we call through an int prototype.
template <typename R, typename E>
R call_with_int(R (*fn)(E), int value) {
  return reinterpret_cast<R (*)(int)>(fn)(value);
}

// Stores an arbitrary int into an enum-typed field without a C++ enum load.
template <typename E>
void poke_enum(E *field, int value) {
  static_assert(sizeof(E) == sizeof(int), "C enums are int-sized on this ABI");
  std::memcpy(field, &value, sizeof value);
}

inline const char *dtype_name(mixprec_dtype d) {
  switch (d) {
    case MIXPREC_F32: return "F32";
    case MIXPREC_F16: return "F16";
    case MIXPREC_BF16: return "BF16";
  }
  return "bad";
}
inline const char *isa_name(mixprec_cpu_isa i) {
  switch (i) {
    case MIXPREC_ISA_AUTO: return "AUTO";
    case MIXPREC_ISA_SCALAR: return "SCALAR";
    case MIXPREC_ISA_AVX2: return "AVX2";
    case MIXPREC_ISA_AVX512: return "AVX512";
  }
  return "bad";
}

// ---- Typed host buffer ---------------------------------------------------

// numel elements of one dtype, held as raw bits. `misalign` shifts the data
// pointer by one element off the allocator's 16-byte alignment, so vector
// paths see unaligned addresses (the contract allows any element alignment).
class Buf {
 public:
  Buf() = default;
  Buf(mixprec_dtype dtype, int64_t n, bool misalign = false)
      : dtype_(dtype), n_(n), off_(misalign ? 1 : 0),
        store_(size_t(n + off_) * size_t(esize(dtype)) / 4 + 2, 0u) {}

  static int esize(mixprec_dtype d) { return d == MIXPREC_F32 ? 4 : 2; }
  mixprec_dtype dtype() const { return dtype_; }
  int64_t numel() const { return n_; }
  void *data() { return n_ ? bytes() + off_ * esize(dtype_) : nullptr; }

  uint32_t raw(int64_t i) const {
    if (dtype_ == MIXPREC_F32) {
      uint32_t u;
      std::memcpy(&u, cbytes() + (off_ + i) * 4, 4);
      return u;
    }
    uint16_t h;
    std::memcpy(&h, cbytes() + (off_ + i) * 2, 2);
    return h;
  }
  void set_raw(int64_t i, uint32_t v) {
    if (dtype_ == MIXPREC_F32) {
      std::memcpy(bytes() + (off_ + i) * 4, &v, 4);
    } else {
      uint16_t h = uint16_t(v);
      std::memcpy(bytes() + (off_ + i) * 2, &h, 2);
    }
  }
  // Element i widened to float with the reference conversions.
  float value(int64_t i) const {
    switch (dtype_) {
      case MIXPREC_F16: return ref_f16_to_f32(uint16_t(raw(i)));
      case MIXPREC_BF16: return ref_bf16_to_f32(uint16_t(raw(i)));
      default: return f32_from_bits(raw(i));
    }
  }
  // Stores f rounded to the dtype with the reference conversions.
  void set_value(int64_t i, float f) { set_raw(i, narrow(dtype_, f)); }
  bool is_nan(int64_t i) const { return is_nan_bits(dtype_, raw(i)); }

  static uint32_t narrow(mixprec_dtype d, float f) {
    switch (d) {
      case MIXPREC_F16: return ref_f32_to_f16(f);
      case MIXPREC_BF16: return ref_f32_to_bf16(f);
      default: return f32_bits(f);
    }
  }
  static bool is_nan_bits(mixprec_dtype d, uint32_t b) {
    switch (d) {
      case MIXPREC_F16: return f16_bits_is_nan(uint16_t(b));
      case MIXPREC_BF16: return bf16_bits_is_nan(uint16_t(b));
      default: return f32_bits_is_nan(b);
    }
  }

  mixprec_tensor tensor() { return mixprec_tensor{data(), n_, dtype_}; }

 private:
  char *bytes() { return reinterpret_cast<char *>(store_.data()); }
  const char *cbytes() const { return reinterpret_cast<const char *>(store_.data()); }

  mixprec_dtype dtype_ = MIXPREC_F32;
  int64_t n_ = 0;
  int64_t off_ = 0;
  std::vector<uint32_t> store_;
};

// Fills b with finite random values typical of gradients times a loss scale:
// random sign, mantissa and a binary exponent spread over [emin, emax],
// sprinkled with exact zeros, negative zeros and (unless random_bits is
// false) random finite bit patterns of the dtype (which include its
// subnormals and extremes: FP32/BF16 values up to ~3.4e38).
inline void fill_random(Buf &b, std::mt19937 &rng, int emin = -30, int emax = 14,
                        bool random_bits = true) {
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> expo(emin, emax);
  std::uniform_int_distribution<int> kind(0, 99);
  std::uniform_int_distribution<uint32_t> bits32;
  for (int64_t i = 0; i < b.numel(); i++) {
    const int k = kind(rng);
    if (k == 0) {
      b.set_raw(i, 0);
    } else if (k == 1) {
      b.set_value(i, -0.0f);
    } else if (k < 6 && random_bits) {
      uint32_t r;
      do {
        r = bits32(rng);
        if (b.dtype() != MIXPREC_F32) r &= 0xffffu;
      } while (b.dtype() == MIXPREC_F16 ? (r & 0x7c00u) == 0x7c00u
               : b.dtype() == MIXPREC_BF16 ? (r & 0x7f80u) == 0x7f80u
                                           : (r & 0x7f800000u) == 0x7f800000u);
      b.set_raw(i, r);
    } else {
      float v = std::ldexp(mant(rng), expo(rng));
      if (rng() & 1u) v = -v;
      b.set_value(i, v);
    }
  }
}

// ---- Reference unscale ----------------------------------------------------

// The contract, element by element: widen, flag inf/NaN inputs, multiply by
// inv_scale in float, round back to the dtype. Returns the expected buffer;
// *nonfinite is set to true if any input was inf/NaN.
inline Buf ref_unscale(const Buf &in, float inv_scale, bool *nonfinite) {
  Buf out(in.dtype(), in.numel());
  for (int64_t i = 0; i < in.numel(); i++) {
    const float v = in.value(i);
    if (!std::isfinite(v)) *nonfinite = true;
    const float y = v * inv_scale;
    out.set_value(i, y);
  }
  return out;
}

// Sum of squares of the stored (rounded) values, in long double.
inline long double ref_norm_sq(const Buf &b) {
  long double s = 0.0L;
  for (int64_t i = 0; i < b.numel(); i++) {
    const long double v = b.value(i);
    s += v * v;
  }
  return s;
}

// L2 norm of the stored values, in long double.
inline long double ref_norm(const Buf &b) { return std::sqrt(ref_norm_sq(b)); }

// Checks a float L2 norm returned by the library against sqrt(sumsq), where
// sumsq is the long double sum of squares of the n stored values it covers.
// Allowed: `rel` relative error (the library sums squares in float blocks,
// <= ~5e-7 relative on the sum, half that on the norm), plus the loss the
// contract admits for squares below FLT_MIN: each such float square is off
// by at most 2^-150, which moves the norm by at most
// min(sqrt(E), E / norm) with E = n * 2^-150 (zero in practice unless every
// value is below ~1e-19), plus one float subnormal step.
// Exact bits are required when the reference is 0 or +inf; NaN must give
// NaN. A norm past float's range must be +inf, except within `rel` of the
// overflow threshold 2^128, where either side is accepted.
inline void expect_norm_close(float got, long double sumsq, int64_t n, double rel,
                              const std::string &what) {
  if (std::isnan(sumsq)) {
    EXPECT_TRUE(std::isnan(got)) << what << ": got " << got << " want NaN";
    return;
  }
  ASSERT_GE(sumsq, 0.0L) << what << ": a sum of squares is never negative";
  if (std::isinf(sumsq) || sumsq == 0.0L) {
    const float want_f = float(std::sqrt(sumsq));
    EXPECT_EQ(f32_bits(got), f32_bits(want_f)) << what << ": got " << got << " want " << want_f;
    return;
  }
  const long double want = std::sqrt(sumsq);
  const long double top = std::ldexp(1.0L, 128);  // float rounds [2^128 - 2^103, ...) to inf
  EXPECT_FALSE(std::isnan(got)) << what << ": got NaN, want " << double(want);
  EXPECT_FALSE(std::signbit(got)) << what << ": a norm is never negative: " << got;
  if (std::isinf(got)) {
    EXPECT_GE(want, top * (1.0L - rel)) << what << ": got inf, want " << double(want);
    return;
  }
  if (want > top * (1.0L + rel)) {
    ADD_FAILURE() << what << ": got " << got << " want inf (" << double(want) << ")";
    return;
  }
  const long double e = (long double)n * std::ldexp(1.0L, -150);
  const long double underflow = std::min(std::sqrt(e), e / want);
  const long double err = std::fabs((long double)got - want);
  const long double tol = rel * want + underflow + std::ldexp(1.0L, -149);
  EXPECT_LE(double(err), double(tol)) << what << ": got " << got << " want " << double(want)
                                      << " (rel err " << double(err / want) << ")";
}

// Number of elements whose bits differ (a NaN matches any NaN); the first few
// mismatches are reported with their index and bits.
inline int64_t count_mismatches(const Buf &got, const Buf &want, const std::string &what) {
  EXPECT_EQ(got.numel(), want.numel()) << what;
  EXPECT_EQ(got.dtype(), want.dtype()) << what;
  int64_t bad = 0;
  for (int64_t i = 0; i < want.numel() && i < got.numel(); i++) {
    const bool ok = want.is_nan(i) ? got.is_nan(i) : got.raw(i) == want.raw(i);
    if (!ok && bad++ < 5) {
      ADD_FAILURE() << what << ": element " << i << " of " << want.numel() << " ("
                    << dtype_name(want.dtype()) << ") got bits 0x" << std::hex << got.raw(i)
                    << " want 0x" << want.raw(i) << std::dec;
    }
  }
  return bad;
}

// Checks a float result against a long double reference within rel relative
// error, plus one float subnormal step (a sum far below FLT_MIN is rounded to
// float's subnormal grid; below 2^-150 it is 0). Exact match is required when
// the reference is 0, inf or NaN.
inline void expect_close_rel(float got, long double want, double rel, const std::string &what) {
  if (std::isnan(double(want))) {
    EXPECT_TRUE(std::isnan(got)) << what << ": got " << got << " want NaN";
    return;
  }
  const float want_f = float(want);
  if (std::isinf(want_f) || want == 0.0L) {
    EXPECT_EQ(f32_bits(got), f32_bits(want_f)) << what << ": got " << got << " want " << want_f;
    return;
  }
  const long double err = std::fabs((long double)got - want);
  const long double tol = rel * std::fabs(want) + std::ldexp(1.0L, -149);
  EXPECT_LE(double(err), double(tol)) << what << ": got " << got << " want " << double(want);
}

// ---- ISA / thread state ---------------------------------------------------

inline std::vector<mixprec_cpu_isa> all_isas() {
  return {MIXPREC_ISA_SCALAR, MIXPREC_ISA_AVX2, MIXPREC_ISA_AVX512};
}
inline std::vector<mixprec_cpu_isa> supported_isas() {
  std::vector<mixprec_cpu_isa> v;
  for (mixprec_cpu_isa i : all_isas())
    if (mixprec_cpu_isa_supported(i)) v.push_back(i);
  return v;
}

// Restores the library's global dispatch and thread settings when a test
// ends, whatever it did, so tests cannot leak state into one another.
struct GlobalStateGuard {
  ~GlobalStateGuard() {
    mixprec_set_cpu_isa(MIXPREC_ISA_AUTO);
    mixprec_set_num_threads(0);
  }
};

}  // namespace mpt

#endif  // MIXPREC_TEST_UTIL_H
