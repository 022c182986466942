/* Internal declarations of the CPU C API: conversions, ISA dispatch, chunk
 * kernels. Not installed; every name here starts with mixprec__. */
#ifndef MIXPREC_INTERNAL_H
#define MIXPREC_INTERNAL_H

#include <stdint.h>
#include <string.h>

#include "compiler.h"
#include "dispatch.h"
#include "mixprec/mixprec.h"

MIXPREC__FORCE_INLINE uint32_t mixprec__f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

MIXPREC__FORCE_INLINE float mixprec__f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Non-finite tests on bits: immune to -ffast-math folding isnan away. */
MIXPREC__FORCE_INLINE int mixprec__f32_bits_nonfinite(uint32_t u) {
  return (u & 0x7f800000u) == 0x7f800000u;
}
MIXPREC__FORCE_INLINE int mixprec__f16_bits_nonfinite(uint16_t h) {
  return (h & 0x7c00u) == 0x7c00u;
}
MIXPREC__FORCE_INLINE int mixprec__bf16_bits_nonfinite(uint16_t h) {
  return (h & 0x7f80u) == 0x7f80u;
}

MIXPREC__FORCE_INLINE float mixprec__bf16_to_f32(uint16_t h) {
  return mixprec__f32_from_bits((uint32_t)h << 16);
}

/* Round to nearest even on the integer bits; a NaN is quieted, sign kept. */
MIXPREC__FORCE_INLINE uint16_t mixprec__f32_to_bf16(float f) {
  uint32_t u = mixprec__f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

MIXPREC__FORCE_INLINE float mixprec__f16_to_f32(uint16_t h) {
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

MIXPREC__FORCE_INLINE uint16_t mixprec__f32_to_f16(float f) {
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

/* mixprec__load_f32 / mixprec__store_f32 and the other element accesses by
 * dtype, on the converters above. */
#include "element.h"

/* ---- CPU kernels: one chunk of one tensor ---------------------------- */

/* The canonical order of the norm's sum of squares within a chunk, followed
 * by every ISA path so that norms are bit-identical across paths and thread
 * counts:
 *  - element i (counted from the chunk start) belongs to lane i % 16 and to
 *    block i / 128;
 *  - per lane and block, squares v*v are added in float, in order of i (a
 *    float multiply and a float add: two roundings, never fused);
 *  - at the end of each block (and of the chunk) each lane's float sum is
 *    added to that lane's double sum; if the float sum is not finite, the
 *    lane's squares in that block are summed again in double instead (so a
 *    finite gradient above 1.8e19 never turns the norm into inf);
 *  - the chunk's sum is lanes 0..15 added in order, in double.
 * Float sums of at most 8 squares lose at most ~5e-7 relative; squares below
 * FLT_MIN (values below ~1e-19) lose precision, which cannot move a norm
 * that matters for clipping. */
#define MIXPREC__NORM_LANES 16
#define MIXPREC__NORM_BLOCK 128

typedef struct mixprec__norm_acc {
  float f[MIXPREC__NORM_LANES];
  double d[MIXPREC__NORM_LANES];
} mixprec__norm_acc;

/* Unscales n elements at data in place. Sets *nonfinite to 1 if any input
 * element is inf/NaN (never clears it). If norm is not NULL, stores the
 * chunk's sum of squares of the rounded results in *norm (canonical order).
 * inv_scale is never NaN here (unscale.c sends a NaN scale to the scalar
 * path, the only one that does not assume it). */
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

/* Adds block [begin, end) of the chunk at data (values as stored) into
 * acc->d lane by lane, as the canonical order says, and clears acc->f. */
void mixprec__norm_flush(mixprec__norm_acc *acc, const void *data,
                         mixprec_dtype dtype, int64_t begin, int64_t end);

/* mixprec__norm_flush for a chunk left as it was (mixprec_grad_norm): the
 * values are data * inv_scale rounded to dtype, recomputed here. */
void mixprec__norm_flush_scaled(mixprec__norm_acc *acc, const void *data,
                                mixprec_dtype dtype, int64_t begin, int64_t end,
                                float inv_scale);

/* The read-only chunk kernels of mixprec_grad_norm: as the unscale chunk
 * kernels (same *nonfinite, same *norm bit for bit) without writing data.
 * norm is never NULL. */
typedef void (*mixprec__norm_chunk_fn)(const void *data, mixprec_dtype dtype,
                                       int64_t n, float inv_scale,
                                       int *nonfinite, double *norm);
void mixprec__norm_chunk_scalar(const void *data, mixprec_dtype dtype, int64_t n,
                                float inv_scale, int *nonfinite, double *norm);
#if defined(MIXPREC_X86)
void mixprec__norm_chunk_avx2(const void *data, mixprec_dtype dtype, int64_t n,
                              float inv_scale, int *nonfinite, double *norm);
#endif

/* mixprec__unscale_tail without the stores (acc never NULL). */
void mixprec__norm_tail(const void *data, mixprec_dtype dtype, int64_t begin,
                        int64_t n, float inv_scale, int *nonfinite,
                        mixprec__norm_acc *acc);

/* Scalar continuation used by every path for the elements [begin, n) after
 * its last full vector (begin is a multiple of 16): unscales them, adds their
 * squares into acc (if not NULL) and flushes each block it completes and, at
 * n, the last partial block. Returns nothing; the caller sums acc->d. */
void mixprec__unscale_tail(void *data, mixprec_dtype dtype, int64_t begin,
                           int64_t n, float inv_scale, int *nonfinite,
                           mixprec__norm_acc *acc);

/* acc->d lanes -> one double, in the canonical order. */
MIXPREC__FORCE_INLINE double mixprec__sum_lanes(const mixprec__norm_acc *acc) {
  double s = 0.0;
  for (int i = 0; i < MIXPREC__NORM_LANES; i++) s += acc->d[i];
  return s;
}

/* Multi-tensor lists are cut into chunks of one tensor each; first[t] is
 * tensor t's first global chunk. Returns the tensor owning chunk c: the last
 * t with first[t] <= c (tensors without chunks share their successor's first
 * index and are skipped by taking the last match). */
MIXPREC__FORCE_INLINE int64_t mixprec__chunk_owner(const int64_t *first, int64_t n, int64_t c) {
  int64_t lo = 0, hi = n - 1;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo + 1) / 2;
    if (first[mid] <= c) lo = mid; else hi = mid - 1;
  }
  return lo;
}

mixprec_cpu_isa mixprec__active_isa(void);
int mixprec__num_threads(void);

#endif /* MIXPREC_INTERNAL_H */
