/* The generic CPU bodies of the act_pack family, written once and stamped
 * per instruction set (zstd's `_body` compiled twice): act_pack.c
 * instantiates the pack / unpack bodies for the scalar path (supplying how
 * FP16 is widened and narrowed: the portable converters). The AVX2 and
 * AVX-512 paths pack and unpack with intrinsics instead
 * (act_pack_avx2_body.h, compiled with each ISA's flags), on the same
 * rules, and send a tensor's partial last block to the scalar body here.
 * The mask and recompute loops (MIXPREC__ACT_DEFINE_EXTRA) are stamped on
 * every ISA, the compiler vectorising them. Every
 * element goes through act_pack_rules.h, so all paths and the GPU agree bit
 * for bit. */
#ifndef MIXPREC_ACT_PACK_INTERNAL_H
#define MIXPREC_ACT_PACK_INTERNAL_H

#include "internal.h"

#include "act_pack_check.h"
#include "act_pack_rules.h"

/* Packs blocks [b0, b1) of the n elements at x; unpacks likewise. */
typedef void (*mixprec__act_pack_fn)(const void *x, mixprec_dtype dtype, int64_t n, int64_t bits,
                                     int64_t block, uint32_t key, int64_t b0, int64_t b1,
                                     uint8_t *codes, float *scales);
typedef void (*mixprec__act_unpack_fn)(const uint8_t *codes, const float *scales, int64_t n,
                                       int64_t bits, int64_t block, int64_t b0, int64_t b1,
                                       void *out, mixprec_dtype dtype);

void mixprec__act_pack_scalar(const void *, mixprec_dtype, int64_t, int64_t, int64_t, uint32_t,
                              int64_t, int64_t, uint8_t *, float *);
void mixprec__act_unpack_scalar(const uint8_t *, const float *, int64_t, int64_t, int64_t, int64_t,
                                int64_t, void *, mixprec_dtype);
#if defined(MIXPREC_X86)
void mixprec__act_pack_avx2(const void *, mixprec_dtype, int64_t, int64_t, int64_t, uint32_t,
                            int64_t, int64_t, uint8_t *, float *);
void mixprec__act_unpack_avx2(const uint8_t *, const float *, int64_t, int64_t, int64_t, int64_t,
                              int64_t, void *, mixprec_dtype);
void mixprec__act_pack_avx512(const void *, mixprec_dtype, int64_t, int64_t, int64_t, uint32_t,
                              int64_t, int64_t, uint8_t *, float *);
void mixprec__act_unpack_avx512(const uint8_t *, const float *, int64_t, int64_t, int64_t,
                                int64_t, int64_t, void *, mixprec_dtype);
#endif

/* One block of len elements, widened to float in v, packed: the statistics
 * pass (smallest, largest, and the largest magnitude's bits, >= 0x7f800000
 * for an inf or NaN), then the codes (through q, one byte per element, when
 * 4-bit codes are paired into nibbles after). Returns the stored scale. */
MIXPREC__FORCE_INLINE float mixprec__act_pack_block(const float *v, int64_t len, int64_t bits,
                                                    uint32_t block_key, uint32_t lo_first,
                                                    uint8_t *q, uint8_t *codes) {
  /* Integer maxima and minima of the order keys (act_pack_rules.h). */
  uint32_t amax_bits = 0;
  int32_t lo_key = INT32_MAX, hi_key = INT32_MIN;
  for (int64_t i = 0; i < len; i++) {
    const uint32_t u = mixprec__act_f32_bits(v[i]);
    const uint32_t a = u & 0x7fffffffu;
    const int32_t k = mixprec__act_order_key(u);
    amax_bits = a > amax_bits ? a : amax_bits;
    lo_key = k < lo_key ? k : lo_key;
    hi_key = k > hi_key ? k : hi_key;
  }
  const int64_t bytes = bits == 8 ? len : (len + 1) / 2;
  if (amax_bits >= 0x7f800000u) {
    memset(codes, 0, (size_t)bytes);
    return mixprec__act_f32_of_bits(MIXPREC__ACT_NAN_F32);
  }
  const float stored = mixprec__act_stored_scale(mixprec__act_of_order_key(lo_key),
                                                 mixprec__act_of_order_key(hi_key), bits);
  const int32_t qmax = (1 << bits) - 1;
  const int32_t z = mixprec__act_zero_of(stored);
  const float inv = mixprec__act_inverse(mixprec__act_scale_of(stored));
  uint8_t *dst = bits == 8 ? codes : q;
  /* 32-bit lane counters (len <= 4096): a 64-bit i vectorises into
   * 64-bit lanes narrowed to 32 for the hash, twice the index work. */
  const uint32_t len32 = (uint32_t)len;
  for (uint32_t i = 0; i < len32; i++) {
    const uint32_t r = mixprec__act_elem_bits(block_key, lo_first + i);
    dst[i] = (uint8_t)mixprec__act_encode(v[i], inv, z, qmax, r);
  }
  if (bits == 4) {
    for (int64_t k = 0; k < len / 2; k++) codes[k] = (uint8_t)(q[2 * k] | (q[2 * k + 1] << 4));
    if (len & 1) codes[len / 2] = q[len - 1];
  }
  return stored;
}

/* One block's values as float into v (len elements from code byte 0). */
MIXPREC__FORCE_INLINE void mixprec__act_unpack_block(const uint8_t *codes, float stored,
                                                     int64_t len, int64_t bits, float vmax,
                                                     float *v) {
  const int32_t z = mixprec__act_zero_of(stored);
  const float s = mixprec__act_scale_of(stored);
  if (bits == 8) {
    for (int64_t i = 0; i < len; i++) v[i] = mixprec__act_decode(codes[i], z, s, vmax);
  } else {
    for (int64_t k = 0; k < len / 2; k++) {
      v[2 * k] = mixprec__act_decode(codes[k] & 15, z, s, vmax);
      v[2 * k + 1] = mixprec__act_decode(codes[k] >> 4, z, s, vmax);
    }
    if (len & 1) v[len - 1] = mixprec__act_decode(codes[len / 2] & 15, z, s, vmax);
  }
}

/* Defines mixprec__act_pack_<SUF> and mixprec__act_unpack_<SUF>. WIDEN16(h,
 * v, len) widens len FP16 values to float; NARROW16(v, h, len) rounds len
 * floats to FP16 (nearest even). BF16 and F32 are the same code on every
 * path. */
#define MIXPREC__ACT_DEFINE(SUF, WIDEN16, NARROW16)                                              \
  void mixprec__act_pack_##SUF(const void *x, mixprec_dtype dtype, int64_t n, int64_t bits,      \
                               int64_t block, uint32_t key, int64_t b0, int64_t b1,              \
                               uint8_t *codes, float *scales) {                                  \
    float buf[MIXPREC_ACT_BLOCK_MAX];                                                            \
    uint8_t q[MIXPREC_ACT_BLOCK_MAX];                                                            \
    for (int64_t b = b0; b < b1; b++) {                                                          \
      const int64_t first = b * block;                                                           \
      const int64_t len = n - first < block ? n - first : block;                                 \
      const float *v = buf;                                                                      \
      if (dtype == MIXPREC_F32) {                                                                \
        v = (const float *)x + first;                                                            \
      } else if (dtype == MIXPREC_BF16) {                                                        \
        const uint16_t *h = (const uint16_t *)x + first;                                         \
        for (int64_t i = 0; i < len; i++) buf[i] = mixprec__bf16_to_f32(h[i]);                   \
      } else {                                                                                   \
        WIDEN16((const uint16_t *)x + first, buf, len);                                          \
      }                                                                                          \
      const int64_t byte0 = bits == 8 ? first : first / 2;                                       \
      scales[b] = mixprec__act_pack_block(v, len, bits, mixprec__act_block_key(key, first),      \
                                          (uint32_t)first, q, codes + byte0);                    \
    }                                                                                            \
  }                                                                                              \
  void mixprec__act_unpack_##SUF(const uint8_t *codes, const float *scales, int64_t n,           \
                                 int64_t bits, int64_t block, int64_t b0, int64_t b1, void *out, \
                                 mixprec_dtype dtype) {                                          \
    float buf[MIXPREC_ACT_BLOCK_MAX];                                                            \
    for (int64_t b = b0; b < b1; b++) {                                                          \
      const int64_t first = b * block;                                                           \
      const int64_t len = n - first < block ? n - first : block;                                 \
      const float stored = scales[b];                                                            \
      if (mixprec__act_scale_nonfinite(stored)) {                                                \
        mixprec__act_fill_nan(out, dtype, first, len);                                           \
        continue;                                                                                \
      }                                                                                          \
      float *v = dtype == MIXPREC_F32 ? (float *)out + first : buf;                              \
      mixprec__act_unpack_block(codes + (bits == 8 ? first : first / 2), stored, len, bits,      \
                                mixprec__act_max_of(dtype), v);                                  \
      if (dtype == MIXPREC_BF16) {                                                               \
        uint16_t *h = (uint16_t *)out + first;                                                   \
        for (int64_t i = 0; i < len; i++) h[i] = mixprec__f32_to_bf16(buf[i]);                   \
      } else if (dtype == MIXPREC_F16) {                                                         \
        NARROW16(buf, (uint16_t *)out + first, len);                                             \
      }                                                                                          \
    }                                                                                            \
  }

/* The other two of the family, stamped per ISA like the bodies above (the
 * compiler vectorises their loops): mixprec__act_mask_<SUF> writes the mask
 * bytes [k0, k1) of n elements at x ([note: norm_relu recompute]);
 * mixprec__act_norm_relu_<SUF> turns len decoded floats v of elements
 * [first, first + len) into the recomputed ReLU output at out (element
 * first), with keep[j] the mask bit of element first + j (0 or 1). */
typedef void (*mixprec__act_mask_fn)(const void *x, mixprec_dtype dtype, int64_t n, int64_t k0,
                                     int64_t k1, uint8_t *mask);
typedef void (*mixprec__act_norm_relu_fn)(float *v, const uint8_t *keep, const float *a,
                                          const float *b, int64_t channels, int64_t inner,
                                          int64_t first, int64_t len, void *out,
                                          mixprec_dtype dtype);
#define MIXPREC__ACT_DECLARE_EXTRA(SUF)                                                         \
  void mixprec__act_mask_##SUF(const void *, mixprec_dtype, int64_t, int64_t, int64_t,          \
                               uint8_t *);                                                       \
  void mixprec__act_norm_relu_##SUF(float *, const uint8_t *, const float *, const float *,     \
                                    int64_t, int64_t, int64_t, int64_t, void *, mixprec_dtype);
MIXPREC__ACT_DECLARE_EXTRA(scalar)
#if defined(MIXPREC_X86)
MIXPREC__ACT_DECLARE_EXTRA(avx2)
MIXPREC__ACT_DECLARE_EXTRA(avx512)
#endif

/* Mask bytes from 16-bit elements: 8 per byte, from their bits. */
MIXPREC__FORCE_INLINE void mixprec__act_mask16(const uint16_t *h, int64_t nbytes, uint32_t top,
                                               uint8_t *mask) {
  for (int64_t k = 0; k < nbytes; k++) {
    uint32_t m = 0;
    for (int j = 0; j < 8; j++) m |= (uint32_t)((uint32_t)h[8 * k + j] - 1u < top) << j;
    mask[k] = (uint8_t)m;
  }
}
MIXPREC__FORCE_INLINE void mixprec__act_mask32(const uint32_t *u, int64_t nbytes, uint8_t *mask) {
  for (int64_t k = 0; k < nbytes; k++) {
    uint32_t m = 0;
    for (int j = 0; j < 8; j++) m |= (uint32_t)(u[8 * k + j] - 1u < 0x7f800000u) << j;
    mask[k] = (uint8_t)m;
  }
}

/* relu(v * a + b) over a run of one channel (a, b scalars: AJ = a) or of
 * consecutive channels (a, b arrays: AJ = a[j]), mixprec__act_norm_relu per
 * element, written straight to the output: float (F32, and F16 before its
 * narrowing pass) or BF16 rounded in the same loop (the rule's NaN is the
 * fixed F32 NaN, whose rounding is the fixed BF16 NaN: no case of its own). */
#define MIXPREC__ACT_NR_LOOPS(NAME, A_T, AJ, BJ)                                               \
  MIXPREC__FORCE_INLINE void NAME##_f32(const float *restrict v, const uint8_t *restrict keep, \
                                        A_T a, A_T b, int64_t len, float tiny,                 \
                                        float *restrict o) {                                   \
    for (int64_t j = 0; j < len; j++) o[j] = mixprec__act_norm_relu(v[j], AJ, BJ, keep[j], tiny); \
  }                                                                                            \
  MIXPREC__FORCE_INLINE void NAME##_bf16(const float *restrict v, const uint8_t *restrict keep, \
                                         A_T a, A_T b, int64_t len, float tiny,                \
                                         uint16_t *restrict h) {                               \
    for (int64_t j = 0; j < len; j++) {                                                        \
      const uint32_t u = mixprec__act_f32_bits(mixprec__act_norm_relu(v[j], AJ, BJ, keep[j], tiny)); \
      h[j] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);                               \
    }                                                                                          \
  }
MIXPREC__ACT_NR_LOOPS(mixprec__act_nr_const, float, a, b)
MIXPREC__ACT_NR_LOOPS(mixprec__act_nr_rows, const float *restrict, a[j], b[j])
#undef MIXPREC__ACT_NR_LOOPS

#define MIXPREC__ACT_DEFINE_EXTRA(SUF)                                                          \
  void mixprec__act_mask_##SUF(const void *x, mixprec_dtype dtype, int64_t n, int64_t k0,       \
                               int64_t k1, uint8_t *mask) {                                     \
    const int64_t full = n / 8 < k1 ? n / 8 : k1; /* bytes of 8 elements */                     \
    if (full > k0) {                                                                            \
      if (dtype == MIXPREC_F32)                                                                 \
        mixprec__act_mask32((const uint32_t *)x + 8 * k0, full - k0, mask + k0);                \
      else                                                                                      \
        mixprec__act_mask16((const uint16_t *)x + 8 * k0, full - k0,                            \
                            dtype == MIXPREC_F16 ? 0x7c00u : 0x7f80u, mask + k0);               \
    }                                                                                           \
    for (int64_t k = full > k0 ? full : k0; k < k1; k++) { /* the partial last byte */          \
      uint32_t m = 0;                                                                           \
      for (int64_t i = 8 * k; i < n && i < 8 * k + 8; i++) {                                    \
        const uint32_t u = dtype == MIXPREC_F32 ? ((const uint32_t *)x)[i]                      \
                                                : ((const uint16_t *)x)[i];                     \
        m |= (uint32_t)mixprec__act_positive(u, dtype) << (i - 8 * k);                          \
      }                                                                                         \
      mask[k] = (uint8_t)m;                                                                     \
    }                                                                                           \
  }                                                                                             \
  void mixprec__act_norm_relu_##SUF(float *v, const uint8_t *keep, const float *a,              \
                                    const float *b, int64_t channels, int64_t inner,            \
                                    int64_t first, int64_t len, void *out,                      \
                                    mixprec_dtype dtype) {                                      \
    const float tiny = mixprec__act_tiny_of(dtype);                                             \
    /* F32 and BF16 written in the pass; F16 made in v, then narrowed */                        \
    float *of = dtype == MIXPREC_F32 ? (float *)out + first : v;                                \
    uint16_t *oh = (uint16_t *)out + first;                                                     \
    const int bf16 = dtype == MIXPREC_BF16;                                                     \
    if (inner == 1) {                                                                           \
      int64_t c = first % channels;                                                             \
      for (int64_t i = 0; i < len;) {                                                           \
        const int64_t run = channels - c < len - i ? channels - c : len - i;                    \
        if (bf16)                                                                               \
          mixprec__act_nr_rows_bf16(v + i, keep + i, a + c, b + c, run, tiny, oh + i);          \
        else                                                                                    \
          mixprec__act_nr_rows_f32(v + i, keep + i, a + c, b + c, run, tiny, of + i);           \
        i += run;                                                                               \
        c = 0;                                                                                  \
      }                                                                                         \
    } else {                                                                                    \
      int64_t r = first % inner, c = (first / inner) % channels;                                \
      for (int64_t i = 0; i < len;) {                                                           \
        const int64_t run = inner - r < len - i ? inner - r : len - i;                          \
        if (bf16)                                                                               \
          mixprec__act_nr_const_bf16(v + i, keep + i, a[c], b[c], run, tiny, oh + i);           \
        else                                                                                    \
          mixprec__act_nr_const_f32(v + i, keep + i, a[c], b[c], run, tiny, of + i);            \
        i += run;                                                                               \
        r = 0;                                                                                  \
        c = c + 1 == channels ? 0 : c + 1;                                                      \
      }                                                                                         \
    }                                                                                           \
    if (dtype == MIXPREC_F16)                                                                   \
      for (int64_t j = 0; j < len; j++)                                                         \
        oh[j] = v[j] != v[j] ? (uint16_t)MIXPREC__ACT_NAN_F16 : mixprec__f32_to_f16(v[j]);      \
  }

/* A non-finite block's elements: the one NaN of their dtype. */
MIXPREC__FORCE_INLINE void mixprec__act_fill_nan(void *out, mixprec_dtype dtype, int64_t first,
                                                 int64_t len) {
  if (dtype == MIXPREC_F32) {
    uint32_t *o = (uint32_t *)out + first;
    for (int64_t i = 0; i < len; i++) o[i] = MIXPREC__ACT_NAN_F32;
  } else {
    uint16_t *o = (uint16_t *)out + first;
    const uint16_t nan = dtype == MIXPREC_F16 ? MIXPREC__ACT_NAN_F16 : MIXPREC__ACT_NAN_BF16;
    for (int64_t i = 0; i < len; i++) o[i] = nan;
  }
}

#endif /* MIXPREC_ACT_PACK_INTERNAL_H */
