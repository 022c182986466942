/* Stand-in cuda_fp16.h: __half as the host's _Float16 (IEEE binary16;
 * conversions from float round to nearest even, as __float2half_rn). */
#ifndef MIXPREC_CUDA_EMU_FP16_H
#define MIXPREC_CUDA_EMU_FP16_H
#include "emu.h"
typedef _Float16 __half;
static inline __half __ushort_as_half(unsigned short b) { __half h; memcpy(&h, &b, 2); return h; }
static inline unsigned short __half_as_ushort(__half h) { unsigned short b; memcpy(&b, &h, 2); return b; }
static inline float __half2float(__half h) { return (float)h; }
static inline __half __float2half_rn(float f) { return (__half)f; }
static inline __half __float2half(float f) { return (__half)f; }
#endif
