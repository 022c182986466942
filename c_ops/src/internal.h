/* Internal declarations of the CPU C API: conversions, ISA dispatch, chunk
 * kernels. Not installed; every name here starts with mixprec__. */
#ifndef MIXPREC_INTERNAL_H
#define MIXPREC_INTERNAL_H

#include <stdint.h>
#include <string.h>

#include "mixprec/mixprec.h"

#if defined(__GNUC__)
#  define MIXPREC__INLINE static inline __attribute__((always_inline))
#else
#  define MIXPREC__INLINE static inline
#endif

MIXPREC__INLINE uint32_t mixprec__f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

MIXPREC__INLINE float mixprec__f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Non-finite tests on bits: immune to -ffast-math folding isnan away. */
MIXPREC__INLINE int mixprec__f32_bits_nonfinite(uint32_t u) {
  return (u & 0x7f800000u) == 0x7f800000u;
}
MIXPREC__INLINE int mixprec__f16_bits_nonfinite(uint16_t h) {
  return (h & 0x7c00u) == 0x7c00u;
}
MIXPREC__INLINE int mixprec__bf16_bits_nonfinite(uint16_t h) {
  return (h & 0x7f80u) == 0x7f80u;
}

MIXPREC__INLINE float mixprec__bf16_to_f32(uint16_t h) {
  return mixprec__f32_from_bits((uint32_t)h << 16);
}

/* Round to nearest even on the integer bits; a NaN is quieted, sign kept. */
MIXPREC__INLINE uint16_t mixprec__f32_to_bf16(float f) {
  uint32_t u = mixprec__f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

MIXPREC__INLINE float mixprec__f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t out;
  if (exp == 0x1fu) {
    /* inf, or a NaN made quiet as the F16C instruction does. */
    out = sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u);
  } else if (exp != 0) {
    out = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    out = sign;
  } else {
    /* Subnormal half: normalise the mantissa into a normal float. */
    uint32_t e = 113u;
    while (!(mant & 0x400u)) {
      mant <<= 1;
      e--;
    }
    out = sign | (e << 23) | ((mant & 0x3ffu) << 13);
  }
  return mixprec__f32_from_bits(out);
}

MIXPREC__INLINE uint16_t mixprec__f32_to_f16(float f) {
  uint32_t u = mixprec__f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((u >> 13) & 0x3ffu));
  if (u >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520: inf */
  if (u < 0x38800000u) {                                   /* below 2^-14 */
    if (u < 0x33000000u) return sign; /* below 2^-25 (2^-25 ties to 0) */
    uint32_t e = u >> 23;
    uint32_t m = (u & 0x7fffffu) | 0x800000u;
    uint32_t s = 126u - e; /* result counts units of 2^-24 */
    uint32_t r = m >> s;
    uint32_t rem = m & ((1u << s) - 1u);
    uint32_t half = 1u << (s - 1u);
    if (rem > half || (rem == half && (r & 1u))) r++;
    return (uint16_t)(sign | r);
  }
  uint32_t odd = (u >> 13) & 1u;
  u += 0xc8000000u + 0xfffu + odd; /* rebias 127 -> 15 and round */
  return (uint16_t)(sign | (u >> 13));
}

/* ---- CPU kernels: one chunk of one tensor ---------------------------- */

/* The canonical summation order of squared values within a chunk: element i
 * (counted from the chunk start) goes to lane i % MIXPREC__NORM_LANES; lanes
 * are added 0..15 at the end. Every ISA path follows it, so norms are
 * bit-identical across paths and thread counts. */
#define MIXPREC__NORM_LANES 16

/* Unscales n elements at data in place. Sets *nonfinite to 1 if any input
 * element is inf/NaN (never clears it). If norm is not NULL, stores the
 * chunk's sum of squares of the rounded results in *norm. */
typedef void (*mixprec__unscale_chunk_fn)(void *data, mixprec_dtype dtype,
                                          int64_t n, float inv_scale,
                                          int *nonfinite, double *norm);

void mixprec__unscale_chunk_scalar(void *data, mixprec_dtype dtype, int64_t n,
                                   float inv_scale, int *nonfinite,
                                   double *norm);
#if defined(MIXPREC_X86)
void mixprec__unscale_chunk_avx2(void *data, mixprec_dtype dtype, int64_t n,
                                 float inv_scale, int *nonfinite, double *norm);
void mixprec__unscale_chunk_avx512(void *data, mixprec_dtype dtype, int64_t n,
                                   float inv_scale, int *nonfinite,
                                   double *norm);
#endif

/* Lane sums -> one double, in the canonical order. */
MIXPREC__INLINE double mixprec__sum_lanes(const double *lanes) {
  double s = 0.0;
  for (int i = 0; i < MIXPREC__NORM_LANES; i++) s += lanes[i];
  return s;
}

/* Scalar continuation used by every path for the elements after the last
 * full vector: element i of the chunk goes to lanes[i % 16]. */
void mixprec__unscale_tail(void *data, mixprec_dtype dtype, int64_t begin,
                           int64_t n, float inv_scale, int *nonfinite,
                           double *lanes);

mixprec_cpu_isa mixprec__active_isa(void);
int mixprec__num_threads(void);

#endif /* MIXPREC_INTERNAL_H */
