/* The one element access by dtype of c_ops/src and kernels/: a float32,
 * float16 or bfloat16 value from its storage bits or from a buffer, and back,
 * rounded to nearest even. Anything that is not FP16 or BF16 is FP32 (the
 * entry points have checked the dtype first, as for MIXPREC__DISPATCH). With
 * a constant dtype (a dispatched D, a template argument) the branches fold
 * away. Included by internal.h (CPU) and kernels/common.cuh (CUDA) after
 * their converters mixprec__f16_to_f32 / _bf16_to_f32 / f32_to_f16 /
 * f32_to_bf16: the CPU's are portable bit arithmetic, CUDA's the hardware's
 * (common.cuh says where their NaN payloads differ). Internal; not
 * installed. */
#ifndef MIXPREC_ELEMENT_H
#define MIXPREC_ELEMENT_H

#include <stdint.h>
#include <string.h>

#include "compiler.h"
#include "mixprec/mixprec.h"

#ifdef __CUDACC__
#  define MIXPREC__ELEM_FN MIXPREC__DEVICE
#else
#  define MIXPREC__ELEM_FN MIXPREC__FORCE_INLINE
#endif

/* A 16-bit element's bits widened to float (exact): FP16, else BF16. */
MIXPREC__ELEM_FN float mixprec__half_to_f32(mixprec_dtype dtype, uint16_t h) {
  return dtype == MIXPREC_F16 ? mixprec__f16_to_f32(h) : mixprec__bf16_to_f32(h);
}

/* v rounded to nearest even to FP16, else BF16: the 16 bits to store. */
MIXPREC__ELEM_FN uint16_t mixprec__f32_to_half(mixprec_dtype dtype, float v) {
  return dtype == MIXPREC_F16 ? mixprec__f32_to_f16(v) : mixprec__f32_to_bf16(v);
}

/* The value of an element's storage bits (a 16-bit element in the low half). */
MIXPREC__ELEM_FN float mixprec__value_of_bits(mixprec_dtype dtype, uint32_t bits) {
  float f;
  switch (dtype) {
    case MIXPREC_F16: return mixprec__f16_to_f32((uint16_t)bits);
    case MIXPREC_BF16: return mixprec__bf16_to_f32((uint16_t)bits);
    default: memcpy(&f, &bits, sizeof f); return f;
  }
}

/* The storage bits of v rounded to dtype (a 16-bit element in the low half). */
MIXPREC__ELEM_FN uint32_t mixprec__bits_of_value(mixprec_dtype dtype, float v) {
  if (dtype == MIXPREC_F16 || dtype == MIXPREC_BF16) return mixprec__f32_to_half(dtype, v);
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  return u;
}

/* v rounded to dtype and widened back: the value a store of v keeps. */
MIXPREC__ELEM_FN float mixprec__round_to(mixprec_dtype dtype, float v) {
  switch (dtype) {
    case MIXPREC_F16: return mixprec__f16_to_f32(mixprec__f32_to_f16(v));
    case MIXPREC_BF16: return mixprec__bf16_to_f32(mixprec__f32_to_bf16(v));
    default: return v;
  }
}

/* Element i of a buffer of dtype, widened to float. */
MIXPREC__ELEM_FN float mixprec__load_f32(const void *data, mixprec_dtype dtype, int64_t i) {
  switch (dtype) {
    case MIXPREC_F16: return mixprec__f16_to_f32(((const uint16_t *)data)[i]);
    case MIXPREC_BF16: return mixprec__bf16_to_f32(((const uint16_t *)data)[i]);
    default: return ((const float *)data)[i];
  }
}

/* Stores v as element i of a buffer of dtype, rounded to nearest even. */
MIXPREC__ELEM_FN void mixprec__store_f32(void *data, mixprec_dtype dtype, int64_t i, float v) {
  switch (dtype) {
    case MIXPREC_F16: ((uint16_t *)data)[i] = mixprec__f32_to_f16(v); break;
    case MIXPREC_BF16: ((uint16_t *)data)[i] = mixprec__f32_to_bf16(v); break;
    default: ((float *)data)[i] = v; break;
  }
}

#endif /* MIXPREC_ELEMENT_H */
