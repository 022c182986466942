/* Stand-in cuda_bf16.h: __nv_bfloat16 as its 16 bits; __float2bfloat16_rn
 * rounds to nearest even (ties by the even bit), NaN stays a NaN. */
#ifndef MIXPREC_CUDA_EMU_BF16_H
#define MIXPREC_CUDA_EMU_BF16_H
#include "emu.h"
struct __nv_bfloat16 { unsigned short x; };
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {0x7fff}; /* the canonical NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return {(unsigned short)(u >> 16)};
}
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
static inline float __bfloat162float(__nv_bfloat16 h) {
  uint32_t u = (uint32_t)h.x << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.x; }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short b) { return {b}; }
#endif
