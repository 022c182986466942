/* The element rules of the act_pack family ([note: act_pack format] in
 * mixprec/act_pack.h), MIXPREC__HD: the scalar C body, the SIMD bodies
 * (act_pack_internal.h, stamped per ISA) and the CUDA kernels
 * (kernels/act_pack.cu) all call these, so the codes and the unpacked values
 * are the same bits everywhere. The CPU build's -ffp-contract=off and CUDA's
 * __f*_rn keep every product and sum one IEEE rounding. */
#ifndef MIXPREC_ACT_PACK_RULES_H
#define MIXPREC_ACT_PACK_RULES_H

#include <stdint.h>
#include <string.h>

#include "compiler.h"
#include "mixprec/mixprec.h"
#include "stochastic_round.h"

#ifdef __CUDA_ARCH__
#  define MIXPREC__ACT_MUL(a, b) __fmul_rn((a), (b))
#  define MIXPREC__ACT_ADD(a, b) __fadd_rn((a), (b))
#  define MIXPREC__ACT_DIV(a, b) __fdiv_rn((a), (b))
#else
#  define MIXPREC__ACT_MUL(a, b) ((a) * (b))
#  define MIXPREC__ACT_ADD(a, b) ((a) + (b))
#  define MIXPREC__ACT_DIV(a, b) ((a) / (b))
#endif

/* The stored scale of a block with an inf or NaN (a quiet NaN), and what
 * every element of such a block unpacks to, per dtype: one fixed NaN, so
 * the CPU and the GPU give the same bits (their multiplies do not agree on
 * NaN payloads). */
#define MIXPREC__ACT_NAN_F32 0x7fc00000u
#define MIXPREC__ACT_NAN_F16 0x7e00u
#define MIXPREC__ACT_NAN_BF16 0x7fc0u

/* The smallest scale: a normal float, so 1 / s is finite and q * s of a
 * non-zero q is not zero. */
#define MIXPREC__ACT_MIN_SCALE 0x1p-126f

MIXPREC__HD uint32_t mixprec__act_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

MIXPREC__HD float mixprec__act_f32_of_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* The order key of a float's bits: the bits with the magnitude flipped when
 * negative, as a signed integer, so keys of finite floats order as the
 * floats (-0 just below +0) and a block's smallest and largest element are
 * integer minima and maxima (which vectorise, and fold in any order on a
 * GPU); and back. */
MIXPREC__HD int32_t mixprec__act_order_key(uint32_t u) {
  return (int32_t)(u ^ ((uint32_t)((int32_t)u >> 31) & 0x7fffffffu));
}
MIXPREC__HD float mixprec__act_of_order_key(int32_t k) {
  return mixprec__act_f32_of_bits((uint32_t)k ^ (k < 0 ? 0x7fffffffu : 0u));
}

/* The block's scale and zero point from its smallest and largest element
 * (finite), as the stored float: s (at least 2^-126, rounded up to 16
 * significant bits, its low 8 bits zero) with z in its low 8 bits. */
MIXPREC__HD float mixprec__act_stored_scale(float lo, float hi, int64_t bits) {
  const int32_t qmax = (1 << bits) - 1;
  const int is_signed = lo < 0.0f;
  const float top = hi > 0.0f ? hi : 0.0f;
  float s = is_signed ? MIXPREC__ACT_ADD(MIXPREC__ACT_DIV(top, (float)(qmax - 1)),
                                         MIXPREC__ACT_DIV(-lo, (float)(qmax - 1)))
                      : MIXPREC__ACT_DIV(top, (float)qmax);
  s = s < MIXPREC__ACT_MIN_SCALE ? MIXPREC__ACT_MIN_SCALE : s;
  uint32_t u = mixprec__act_f32_bits(s);
  u = (u & 0xffu) ? (u | 0xffu) + 1u : u; /* up to 15 bits: never below the range */
  int32_t z = 0;
  if (is_signed) {
    const float w = MIXPREC__ACT_DIV(-lo, mixprec__act_f32_of_bits(u));
    z = (int32_t)w;
    z += (float)z < w ? 1 : 0;
    z = z < 1 ? 1 : z; /* -lo / s may underflow to 0: a negative element needs z >= 1 */
    z = z > qmax ? qmax : z;
  }
  return mixprec__act_f32_of_bits(u | (uint32_t)z);
}

/* A stored scale's parts: s (low 8 bits cleared), the zero point, and
 * whether the block is a non-finite one (s not finite: a NaN from pack, or
 * fuzzed bits). */
MIXPREC__HD float mixprec__act_scale_of(float stored) {
  return mixprec__act_f32_of_bits(mixprec__act_f32_bits(stored) & ~0xffu);
}
MIXPREC__HD int32_t mixprec__act_zero_of(float stored) {
  return (int32_t)(mixprec__act_f32_bits(stored) & 0xffu);
}
MIXPREC__HD int mixprec__act_scale_nonfinite(float stored) {
  return (mixprec__act_f32_bits(stored) & 0x7f800000u) == 0x7f800000u;
}

/* The inverse scale the codes are computed with. */
MIXPREC__HD float mixprec__act_inverse(float s) { return MIXPREC__ACT_DIV(1.0f, s); }

/* The key of a pack call: the optimizers' counter-based hash with its own
 * domain ("actp" in place of the tensor index), so the two never share a
 * stream for the same seed. */
MIXPREC__HD uint32_t mixprec__act_key(uint64_t seed) {
  return mixprec__sr_key(seed, 0x61637470u, 0.0f);
}

/* The random bits of element i are mixprec__sr_bits(key, i); split in two so
 * a loop over one block adds only its low index bits: a block never crosses
 * a multiple of 2^32 (block is a power of two), so hi32(i) is the block's
 * and lo32(i) = lo32(block start) + offset. */
MIXPREC__HD uint32_t mixprec__act_block_key(uint32_t key, int64_t first) {
  return key + (uint32_t)((uint64_t)first >> 32) * 0x85ebca77u;
}
MIXPREC__HD uint32_t mixprec__act_elem_bits(uint32_t block_key, uint32_t lo_index) {
  return mixprec__mix32(block_key + lo_index * 0x9e3779b1u);
}

/* The stored code of x in a block of inverse scale inv, zero point z and
 * Q = qmax, with the element's random bits r: q = floor(x * inv + u), u in
 * [0, 1) from the top 24 bits of r; a non-zero x never gets q = 0 (its
 * sign's unit instead); c = q + z clamped to [0, Q]. The floor is a
 * truncation corrected by one (|t + u| < 2^24: exact). */
MIXPREC__HD int32_t mixprec__act_encode(float x, float inv, int32_t z, int32_t qmax, uint32_t r) {
  const float u = MIXPREC__ACT_MUL((float)(r >> 8), 0x1p-24f);
  const float v = MIXPREC__ACT_ADD(MIXPREC__ACT_MUL(x, inv), u);
  int32_t q = (int32_t)v;
  q -= (float)q > v ? 1 : 0;
  const int32_t unit = x > 0.0f ? 1 : -1;
  q = (q == 0 && x != 0.0f) ? unit : q;
  int32_t c = q + z;
  c = c > qmax ? qmax : c;
  return c < 0 ? 0 : c;
}

/* The largest finite value of the dtype a block unpacks to. */
MIXPREC__HD float mixprec__act_max_of(mixprec_dtype dtype) {
  return dtype == MIXPREC_F16 ? 65504.0f : dtype == MIXPREC_BF16 ? 0x1.fep127f : 0x1.fffffep127f;
}

/* The value of a stored code c in a block of finite scale s, zero point z,
 * within +-vmax (mixprec__act_max_of the output dtype): the top code of a
 * block may lie one step above its largest element, which next to the
 * dtype's largest finite value must not come back as inf. */
MIXPREC__HD float mixprec__act_decode(int32_t c, int32_t z, float s, float vmax) {
  float v = MIXPREC__ACT_MUL((float)(c - z), s);
  v = v > vmax ? vmax : v;
  return v < -vmax ? -vmax : v;
}

/* x > 0 from its bits (a 16-bit element in the low half): +inf counts,
 * +-0, negatives and NaN do not. */
MIXPREC__HD int mixprec__act_positive(uint32_t u, mixprec_dtype dtype) {
  if (dtype == MIXPREC_F32) return u - 1u < 0x7f800000u;
  return (u & 0xffffu) - 1u < (dtype == MIXPREC_F16 ? 0x7c00u : 0x7f80u);
}

/* The dtype's smallest normal: what a kept element of a recomputed ReLU
 * output is at least. */
MIXPREC__HD float mixprec__act_tiny_of(mixprec_dtype dtype) {
  return dtype == MIXPREC_F16 ? 0x1p-14f : 0x1p-126f;
}

/* [note: norm_relu recompute] One element before the rounding to the
 * output dtype: relu(x * a + b) with the ReLU's mask given, a kept element
 * at least tiny; a NaN comes out as MIXPREC__ACT_NAN_F32 (the caller writes
 * the dtype's fixed NaN for it). */
MIXPREC__HD float mixprec__act_norm_relu(float x, float a, float b, int keep, float tiny) {
  const float v = MIXPREC__ACT_ADD(MIXPREC__ACT_MUL(x, a), b);
  if (!keep) return 0.0f;
  if (v != v) return mixprec__act_f32_of_bits(MIXPREC__ACT_NAN_F32);
  return v < tiny ? tiny : v;
}

/* [note: pool codes] The code of a max-pool index at output (ho, wo), geom
 * = {W, kH, kW, sH, sW, pH, pW, dH, dW}: 255 when it is not in the window
 * (or is negative, or 2^52 or more: no plane is that large). */
MIXPREC__HD uint8_t mixprec__act_pool_code(int64_t index, int64_t ho, int64_t wo,
                                           const int64_t *geom) {
  const int64_t W = geom[0], kH = geom[1], kW = geom[2];
  if (index < 0 || index >= ((int64_t)1 << 52)) return 255;
  const int64_t dh = index / W - (ho * geom[3] - geom[5]);
  const int64_t dw = index % W - (wo * geom[4] - geom[6]);
  if (dh < 0 || dw < 0 || dh % geom[7] != 0 || dw % geom[8] != 0) return 255;
  const int64_t kh = dh / geom[7], kw = dw / geom[8];
  if (kh >= kH || kw >= kW) return 255;
  return (uint8_t)(kh * kW + kw);
}

/* The index a code stands for at output (ho, wo). */
MIXPREC__HD int64_t mixprec__act_pool_index(uint8_t code, int64_t ho, int64_t wo,
                                            const int64_t *geom) {
  const int64_t kW = geom[2];
  const int64_t h = ho * geom[3] - geom[5] + (code / kW) * geom[7];
  const int64_t w = wo * geom[4] - geom[6] + (code % kW) * geom[8];
  return h * geom[0] + w;
}

#endif /* MIXPREC_ACT_PACK_RULES_H */
