/* The act_pack family's 256-bit intrinsics body (AVX2 + F16C), included by
 * act_pack_avx2.c and act_pack_avx512.c (the same code with AVX-512's flags:
 * on Zen 4 it beat the compiler-vectorised 512-bit loops by 1.3-5.3x) and
 * stamped by MIXPREC__ACT_DEFINE_SIMD256(SUF). Every
 * value is the one act_pack_rules.h gives, bit for bit (the test suite
 * compares each ISA with an independent reference). Blocks are powers of
 * two >= 32, so every block but a tensor's last is a multiple of 32
 * elements: full blocks go through the code here, a partial last block
 * through the scalar body.
 *
 * pack, 8 full blocks at a time:
 *   - statistics on the raw bits, BF16 / FP16 16 lanes at a time without
 *     widening: the block's largest float is the signed-integer maximum of
 *     the bits when some element has its sign bit clear, else the unsigned
 *     minimum; its smallest is the unsigned maximum when some sign bit is
 *     set, else the unsigned minimum (the same elements the order keys of
 *     act_pack_rules.h pick, -0 below +0 included). A block holds an inf or
 *     NaN exactly when one of those two does. The 8 blocks' lane-wise
 *     maxima / minima are reduced together (a transposed unpack + max tree:
 *     lane j ends with block j's), and mixprec__act_stored_scale /
 *     mixprec__act_inverse run on the 8 blocks as one vector (the same IEEE
 *     operations lane by lane; 8 blocks' divisions in flight at once, where
 *     a 32-element block is too short to hide one block's chain).
 *   - codes 32 at a time, in two passes over a block: first u for all its
 *     elements (the element counter in a vector, lane offsets times
 *     0x9e3779b1 stepped by 32 * 0x9e3779b1, mixprec__mix32 in vector, u =
 *     (r >> 8) as float * 2^-24; the passes halve the loops' dependency
 *     chains), then v = x * inv + u as a separate multiply and add (one
 *     rounding each, as the scalar rule; the build's -ffp-contract=off keeps
 *     them unfused), q = floor(v) (|v| < 2^24, so the same as the scalar
 *     truncate-and-correct), the zero guard (q == 0 and x != 0 -> +-1 by
 *     x's sign: q - sign(mask, x), the mask from a float x != 0 as the
 *     scalar rule, so -0 keeps q = 0), c = q + z clamped by the saturating
 *     packs (int32 -> int16 -> uint8 is the clamp to [0, 255]; 4-bit codes
 *     then min 15) and paired into nibbles with one multiply-add (even
 *     element * 1 + odd element * 16). BF16 is widened by unpacking with
 *     zeros (elements {0-3, 8-11} and {4-7, 12-15} of 16 per vector); the
 *     lane counters follow that order, and the packs' final permute undoes
 *     it.
 * unpack, per full block: codes widened by one byte shuffle per 8 (4-bit:
 *   nibbles split to bytes first), (c - z) as float times s (exact int ->
 *   float; one rounding), clamped to +-vmax only when 255 * s can exceed it
 *   (|c - z| <= 255, so otherwise the clamp is a no-op), then F32 stored,
 *   FP16 by F16C (nearest even, as mixprec__f32_to_f16) and BF16 rounded to
 *   nearest even on the integer bits as mixprec__f32_to_bf16 (no NaN can
 *   occur here: s is finite, the non-finite blocks are filled with the
 *   fixed NaN before; even and odd elements in two vectors, so the rounded
 *   halves interleave back with one blend). 4-bit codes to FP16 / BF16: the
 *   block's 16 values computed once into byte tables, then two byte
 *   lookups per element. */
#ifndef MIXPREC_ACT_PACK_AVX2_BODY_H
#define MIXPREC_ACT_PACK_AVX2_BODY_H

#include <immintrin.h>

#include "act_pack_internal.h"

#define MIXPREC__ACT_K 0x9e3779b1u
/* F16C's rounding: nearest even (an immediate: a macro, not a const) */
#define MIXPREC__ACT_RN (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

/* ---- pack ------------------------------------------------------------------ */

/* A block's running statistics on its bits, lane-wise: the signed and the
 * unsigned maximum and the unsigned minimum (16 lanes of 16 bits, or 8 of
 * 32 for FP32). */
typedef struct {
  __m256i smax, umax, umin;
} mixprec__act_acc;

MIXPREC__FORCE_INLINE mixprec__act_acc mixprec__act_acc16(const uint16_t *h, int64_t len) {
  mixprec__act_acc a = {_mm256_set1_epi16(INT16_MIN), _mm256_setzero_si256(),
                        _mm256_set1_epi16(-1)};
  for (int64_t i = 0; i < len; i += 32) {
    const __m256i x0 = _mm256_loadu_si256((const __m256i *)(h + i));
    const __m256i x1 = _mm256_loadu_si256((const __m256i *)(h + i + 16));
    a.smax = _mm256_max_epi16(a.smax, _mm256_max_epi16(x0, x1));
    a.umax = _mm256_max_epu16(a.umax, _mm256_max_epu16(x0, x1));
    a.umin = _mm256_min_epu16(a.umin, _mm256_min_epu16(x0, x1));
  }
  return a;
}

MIXPREC__FORCE_INLINE mixprec__act_acc mixprec__act_acc32(const float *x, int64_t len) {
  mixprec__act_acc a = {_mm256_set1_epi32(INT32_MIN), _mm256_setzero_si256(),
                        _mm256_set1_epi32(-1)};
  for (int64_t i = 0; i < len; i += 16) {
    const __m256i x0 = _mm256_loadu_si256((const __m256i *)(x + i));
    const __m256i x1 = _mm256_loadu_si256((const __m256i *)(x + i + 8));
    a.smax = _mm256_max_epi32(a.smax, _mm256_max_epi32(x0, x1));
    a.umax = _mm256_max_epu32(a.umax, _mm256_max_epu32(x0, x1));
    a.umin = _mm256_min_epu32(a.umin, _mm256_min_epu32(x0, x1));
  }
  return a;
}

/* The lanes of two accumulators (or of partial results) interleaved by
 * UNPACK and combined, so each output lane holds one of them: the steps
 * of a transposed reduction of 8 blocks' accumulators to one lane per
 * block (no per-block horizontal reduction). */
#define MIXPREC__ACT_COMBINE(NAME, LO, HI, MAXS, MAXU, MINU)                                \
  MIXPREC__FORCE_INLINE mixprec__act_acc NAME(mixprec__act_acc a, mixprec__act_acc b) {   \
    mixprec__act_acc r;                                                                   \
    r.smax = MAXS(LO(a.smax, b.smax), HI(a.smax, b.smax));                                \
    r.umax = MAXU(LO(a.umax, b.umax), HI(a.umax, b.umax));                                \
    r.umin = MINU(LO(a.umin, b.umin), HI(a.umin, b.umin));                                \
    return r;                                                                             \
  }
MIXPREC__ACT_COMBINE(mixprec__act_c16_1, _mm256_unpacklo_epi16, _mm256_unpackhi_epi16,
                     _mm256_max_epi16, _mm256_max_epu16, _mm256_min_epu16)
MIXPREC__ACT_COMBINE(mixprec__act_c16_2, _mm256_unpacklo_epi32, _mm256_unpackhi_epi32,
                     _mm256_max_epi16, _mm256_max_epu16, _mm256_min_epu16)
MIXPREC__ACT_COMBINE(mixprec__act_c16_3, _mm256_unpacklo_epi64, _mm256_unpackhi_epi64,
                     _mm256_max_epi16, _mm256_max_epu16, _mm256_min_epu16)
MIXPREC__ACT_COMBINE(mixprec__act_c32_1, _mm256_unpacklo_epi32, _mm256_unpackhi_epi32,
                     _mm256_max_epi32, _mm256_max_epu32, _mm256_min_epu32)
MIXPREC__ACT_COMBINE(mixprec__act_c32_2, _mm256_unpacklo_epi64, _mm256_unpackhi_epi64,
                     _mm256_max_epi32, _mm256_max_epu32, _mm256_min_epu32)
#define MIXPREC__ACT_LANE_LO(a, b) _mm256_permute2x128_si256((a), (b), 0x20)
#define MIXPREC__ACT_LANE_HI(a, b) _mm256_permute2x128_si256((a), (b), 0x31)
MIXPREC__ACT_COMBINE(mixprec__act_c32_3, MIXPREC__ACT_LANE_LO, MIXPREC__ACT_LANE_HI,
                     _mm256_max_epi32, _mm256_max_epu32, _mm256_min_epu32)

/* The accumulator of block j of a batch (a neutral one past the nb full
 * blocks: its lane comes out as a NaN block, never used). */
MIXPREC__FORCE_INLINE mixprec__act_acc mixprec__act_acc_of(const void *x, mixprec_dtype dtype,
                                                           int64_t block, int64_t b, int64_t j,
                                                           int64_t nb) {
  if (dtype == MIXPREC_F32) {
    if (j >= nb) return mixprec__act_acc32((const float *)x, 0);
    return mixprec__act_acc32((const float *)x + (b + j) * block, block);
  }
  if (j >= nb) return mixprec__act_acc16((const uint16_t *)x, 0);
  return mixprec__act_acc16((const uint16_t *)x + (b + j) * block, block);
}

/* The scalars of up to 8 consecutive full blocks: stored scales, inverses
 * and zero points, and a bit per block holding an inf or NaN. */
typedef struct {
  float stored[8], inv[8];
  int32_t z[8];
  int bad;
} mixprec__act_batch;

/* mixprec__act_stored_scale and mixprec__act_inverse of 8 blocks at once
 * from their smallest and largest elements (the same IEEE operations, lane
 * by lane; a lane whose block holds an inf or NaN gets the NaN scale). */
MIXPREC__FORCE_INLINE void mixprec__act_scales8(__m256 lo, __m256 hi, int64_t bits,
                                                mixprec__act_batch *out) {
  const int32_t qmax = (1 << bits) - 1;
  const __m256 zero = _mm256_setzero_ps();
  const __m256i lob = _mm256_castps_si256(lo), hib = _mm256_castps_si256(hi);
  const __m256i absmask = _mm256_set1_epi32(0x7fffffff), maxfin = _mm256_set1_epi32(0x7f7fffff);
  const __m256i bad = _mm256_or_si256(_mm256_cmpgt_epi32(_mm256_and_si256(lob, absmask), maxfin),
                                      _mm256_cmpgt_epi32(_mm256_and_si256(hib, absmask), maxfin));
  out->bad = _mm256_movemask_ps(_mm256_castsi256_ps(bad));
  const __m256 is_signed = _mm256_cmp_ps(lo, zero, _CMP_LT_OQ);
  const __m256 top = _mm256_max_ps(hi, zero); /* hi > 0 ? hi : +0 */
  const __m256 neglo = _mm256_xor_ps(lo, _mm256_set1_ps(-0.0f));
  const __m256 q1 = _mm256_set1_ps((float)(qmax - 1));
  const __m256 s_signed = _mm256_add_ps(_mm256_div_ps(top, q1), _mm256_div_ps(neglo, q1));
  const __m256 s_unsigned = _mm256_div_ps(top, _mm256_set1_ps((float)qmax));
  __m256 s = _mm256_blendv_ps(s_unsigned, s_signed, is_signed);
  s = _mm256_max_ps(s, _mm256_set1_ps(MIXPREC__ACT_MIN_SCALE)); /* s < MIN ? MIN : s */
  /* up to a multiple of 256 in the bits: (u & 0xff) ? (u | 0xff) + 1 : u */
  const __m256i u = _mm256_and_si256(_mm256_add_epi32(_mm256_castps_si256(s), _mm256_set1_epi32(0xff)),
                                     _mm256_set1_epi32(~0xff));
  const __m256 su = _mm256_castsi256_ps(u);
  const __m256 w = _mm256_div_ps(neglo, su);
  __m256i z = _mm256_cvttps_epi32(w);
  z = _mm256_sub_epi32(z, _mm256_castps_si256(_mm256_cmp_ps(_mm256_cvtepi32_ps(z), w, _CMP_LT_OQ)));
  z = _mm256_min_epi32(_mm256_max_epi32(z, _mm256_set1_epi32(1)), _mm256_set1_epi32(qmax));
  z = _mm256_and_si256(z, _mm256_castps_si256(is_signed));
  __m256i stored = _mm256_or_si256(u, z);
  stored = _mm256_blendv_epi8(stored, _mm256_set1_epi32((int)MIXPREC__ACT_NAN_F32), bad);
  _mm256_storeu_si256((__m256i *)out->stored, stored);
  _mm256_storeu_si256((__m256i *)out->z, z);
  _mm256_storeu_ps(out->inv, _mm256_div_ps(_mm256_set1_ps(1.0f), su));
}

/* The batch of nb (1..8) full blocks from block b: the accumulators of
 * blocks 2k and 2k + 1 combined as soon as both are there, then pairs of
 * pairs, then the 128-bit halves, so lane j ends up with block j's
 * statistics; the selection of the smallest and largest element per lane
 * (as at the top), widened to float, and mixprec__act_scales8. */
MIXPREC__FORCE_INLINE void mixprec__act_batch_of(const void *x, mixprec_dtype dtype, int64_t block,
                                                 int64_t b, int64_t nb, int64_t bits,
                                                 mixprec__act_batch *out) {
#define MIXPREC__ACT_PAIR(C1, J)                                                            \
  C1(mixprec__act_acc_of(x, dtype, block, b, (J), nb),                                      \
     mixprec__act_acc_of(x, dtype, block, b, (J) + 1, nb))
  __m256 lo, hi;
  if (dtype == MIXPREC_F32) {
    const mixprec__act_acc q0 =
        mixprec__act_c32_2(MIXPREC__ACT_PAIR(mixprec__act_c32_1, 0), MIXPREC__ACT_PAIR(mixprec__act_c32_1, 2));
    const mixprec__act_acc q1 =
        mixprec__act_c32_2(MIXPREC__ACT_PAIR(mixprec__act_c32_1, 4), MIXPREC__ACT_PAIR(mixprec__act_c32_1, 6));
    const mixprec__act_acc r = mixprec__act_c32_3(q0, q1);
    /* largest: the signed maximum unless its sign bit is set (no element
     * >= +0), then the unsigned minimum; smallest: the unsigned maximum if
     * its sign bit is set, else the unsigned minimum */
    const __m256 smx = _mm256_castsi256_ps(r.smax), umx = _mm256_castsi256_ps(r.umax),
                 umn = _mm256_castsi256_ps(r.umin);
    hi = _mm256_blendv_ps(smx, umn, smx);
    lo = _mm256_blendv_ps(umn, umx, umx);
  } else {
    const mixprec__act_acc q0 =
        mixprec__act_c16_2(MIXPREC__ACT_PAIR(mixprec__act_c16_1, 0), MIXPREC__ACT_PAIR(mixprec__act_c16_1, 2));
    const mixprec__act_acc q1 =
        mixprec__act_c16_2(MIXPREC__ACT_PAIR(mixprec__act_c16_1, 4), MIXPREC__ACT_PAIR(mixprec__act_c16_1, 6));
    const mixprec__act_acc r = mixprec__act_c16_3(q0, q1);
    const __m128i smx = _mm_max_epi16(_mm256_castsi256_si128(r.smax), _mm256_extracti128_si256(r.smax, 1));
    const __m128i umx = _mm_max_epu16(_mm256_castsi256_si128(r.umax), _mm256_extracti128_si256(r.umax, 1));
    const __m128i umn = _mm_min_epu16(_mm256_castsi256_si128(r.umin), _mm256_extracti128_si256(r.umin, 1));
    const __m128i h8 = _mm_blendv_epi8(smx, umn, _mm_srai_epi16(smx, 15));
    const __m128i l8 = _mm_blendv_epi8(umn, umx, _mm_srai_epi16(umx, 15));
    if (dtype == MIXPREC_BF16) {
      lo = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(l8), 16));
      hi = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h8), 16));
    } else { /* F16C widens as mixprec__f16_to_f32 (exact, NaN quieted) */
      lo = _mm256_cvtph_ps(l8);
      hi = _mm256_cvtph_ps(h8);
    }
  }
#undef MIXPREC__ACT_PAIR
  mixprec__act_scales8(lo, hi, bits, out);
}

/* mixprec__mix32 on 8 lanes. */
MIXPREC__FORCE_INLINE __m256i mixprec__act_mix32_v(__m256i x) {
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)0x7feb352du));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)0x846ca68bu));
  return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

/* u = (r >> 8) * 2^-24 of 8 elements from their hash inputs ctr =
 * block_key + lo32(index) * 0x9e3779b1. */
MIXPREC__FORCE_INLINE __m256 mixprec__act_u_v(__m256i ctr) {
  const __m256i r = mixprec__act_mix32_v(ctr);
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(r, 8)), _mm256_set1_ps(0x1p-24f));
}

/* mixprec__act_encode of 8 elements before the clamp (q + z). */
MIXPREC__FORCE_INLINE __m256i mixprec__act_encode_v(__m256 x, __m256 u, __m256 inv, __m256i z) {
  const __m256 v = _mm256_add_ps(_mm256_mul_ps(x, inv), u);
  __m256i q = _mm256_cvttps_epi32(_mm256_floor_ps(v));
  const __m256i nz = _mm256_castps_si256(_mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_NEQ_UQ));
  const __m256i guard = _mm256_and_si256(_mm256_cmpeq_epi32(q, _mm256_setzero_si256()), nz);
  /* guard lanes: sign(-1, x) is -1 for x > 0 and +1 for x < 0 */
  q = _mm256_sub_epi32(q, _mm256_sign_epi32(guard, _mm256_castps_si256(x)));
  return _mm256_add_epi32(q, z);
}

/* The codes of one full block (len a multiple of 32) at codes (its first
 * byte), with ub scratch for len floats. Two passes: the random offsets u
 * of the whole block (they depend only on the index), then the codes; each
 * loop's dependency chains are half as long, so more iterations overlap.
 * BF16 is loaded as 16 elements per 32-byte load, interleaved by the
 * unpacks (vectors of elements {0-3, 8-11} and {4-7, 12-15}); FP32 / FP16
 * in order. The lane counters and ub follow the same layout. */
MIXPREC__FORCE_INLINE void mixprec__act_encode_block(const void *x, mixprec_dtype dtype,
                                                     int64_t first, int64_t len, int64_t bits,
                                                     uint32_t block_key, float inv_s, int32_t z_s,
                                                     float *ub, uint8_t *codes) {
  const int bf16 = dtype == MIXPREC_BF16;
  {
    const __m256i k = _mm256_set1_epi32((int)MIXPREC__ACT_K);
    const __m256i lane = bf16 ? _mm256_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11)
                              : _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const uint32_t base = block_key + (uint32_t)first * MIXPREC__ACT_K;
    __m256i ctr = _mm256_add_epi32(_mm256_set1_epi32((int)base), _mm256_mullo_epi32(lane, k));
    const __m256i step = _mm256_set1_epi32((int)(32u * MIXPREC__ACT_K));
    const __m256i offb = _mm256_set1_epi32((int)((bf16 ? 4u : 8u) * MIXPREC__ACT_K));
    const __m256i offc = _mm256_set1_epi32((int)(16u * MIXPREC__ACT_K));
    const __m256i offd = _mm256_set1_epi32((int)((bf16 ? 20u : 24u) * MIXPREC__ACT_K));
    for (int64_t i = 0; i < len; i += 32) {
      _mm256_store_ps(ub + i, mixprec__act_u_v(ctr));
      _mm256_store_ps(ub + i + 8, mixprec__act_u_v(_mm256_add_epi32(ctr, offb)));
      _mm256_store_ps(ub + i + 16, mixprec__act_u_v(_mm256_add_epi32(ctr, offc)));
      _mm256_store_ps(ub + i + 24, mixprec__act_u_v(_mm256_add_epi32(ctr, offd)));
      ctr = _mm256_add_epi32(ctr, step);
    }
  }
  const __m256 inv = _mm256_set1_ps(inv_s);
  const __m256i z = _mm256_set1_epi32(z_s);
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t i = 0; i < len; i += 32) {
    __m256 xa, xb, xc, xd;
    if (dtype == MIXPREC_F32) {
      const float *f = (const float *)x + first + i;
      xa = _mm256_loadu_ps(f);
      xb = _mm256_loadu_ps(f + 8);
      xc = _mm256_loadu_ps(f + 16);
      xd = _mm256_loadu_ps(f + 24);
    } else if (bf16) {
      const uint16_t *h = (const uint16_t *)x + first + i;
      const __m256i zero = _mm256_setzero_si256();
      const __m256i r0 = _mm256_loadu_si256((const __m256i *)h);
      const __m256i r1 = _mm256_loadu_si256((const __m256i *)(h + 16));
      xa = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, r0));
      xb = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, r0));
      xc = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, r1));
      xd = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, r1));
    } else {
      const uint16_t *h = (const uint16_t *)x + first + i;
      xa = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
      xb = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + 8)));
      xc = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + 16)));
      xd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + 24)));
    }
    const __m256i ca = mixprec__act_encode_v(xa, _mm256_load_ps(ub + i), inv, z);
    const __m256i cb = mixprec__act_encode_v(xb, _mm256_load_ps(ub + i + 8), inv, z);
    const __m256i cc = mixprec__act_encode_v(xc, _mm256_load_ps(ub + i + 16), inv, z);
    const __m256i cd = mixprec__act_encode_v(xd, _mm256_load_ps(ub + i + 24), inv, z);
    /* Saturating int32 -> int16 -> uint8: the clamp to [0, 255]. Bytes in
     * 8-element groups (qwords) 0, 2, 1, 3 (BF16) or 4-element groups
     * (dwords) 0, 2, 4, 6, 1, 3, 5, 7 (FP32 / FP16). */
    __m256i c8 = _mm256_packus_epi16(_mm256_packs_epi32(ca, cb), _mm256_packs_epi32(cc, cd));
    if (bits == 8) {
      c8 = bf16 ? _mm256_permute4x64_epi64(c8, 0xd8) : _mm256_permutevar8x32_epi32(c8, perm);
      _mm256_storeu_si256((__m256i *)(codes + i), c8);
    } else {
      if (!bf16) c8 = _mm256_permutevar8x32_epi32(c8, perm);
      c8 = _mm256_min_epu8(c8, _mm256_set1_epi8(15));
      /* byte k of a pair of elements: even + 16 * odd (<= 255) */
      __m256i n4 = _mm256_maddubs_epi16(c8, _mm256_set1_epi16(0x1001));
      n4 = _mm256_packus_epi16(n4, n4);
      n4 = bf16 ? _mm256_permutevar8x32_epi32(n4, perm) : _mm256_permute4x64_epi64(n4, 0x08);
      _mm_storeu_si128((__m128i *)(codes + i / 2), _mm256_castsi256_si128(n4));
    }
  }
}

/* Full blocks [b0, bf) of one dtype and width, 8 at a time: their
 * statistics, then their scales in one vector (8 blocks' divisions in
 * flight at once: a block of 32 elements is too short to hide one block's
 * chain of divisions), then their codes. */
MIXPREC__FORCE_INLINE void mixprec__act_pack_full(const void *x, mixprec_dtype dtype,
                                                  int64_t bits, int64_t block, uint32_t key,
                                                  int64_t b0, int64_t bf, uint8_t *codes,
                                                  float *scales) {
  float ub[MIXPREC_ACT_BLOCK_MAX] __attribute__((aligned(32)));
  const int64_t esize = dtype == MIXPREC_F32 ? 4 : 2;
  for (int64_t g = b0; g < bf; g += 8) {
    const int64_t nb = bf - g < 8 ? bf - g : 8;
    mixprec__act_batch p;
    mixprec__act_batch_of(x, dtype, block, g, nb, bits, &p);
    for (int64_t j = 0; j < nb; j++) {
      const int64_t first = (g + j) * block;
      uint8_t *dst = codes + (bits == 8 ? first : first / 2);
      /* The next batch's block j into the cache while this one is coded:
       * the statistics pass would otherwise wait on memory (the hardware
       * prefetcher idles while the codes are computed from L1). */
      if (g + 8 + j < bf) {
        const char *nx = (const char *)x + (first + 8 * block) * esize;
        for (int64_t o = 0; o < block * esize; o += 64) _mm_prefetch(nx + o, _MM_HINT_T0);
      }
      scales[g + j] = p.stored[j];
      if (p.bad >> j & 1)
        memset(dst, 0, (size_t)(bits == 8 ? block : block / 2));
      else
        mixprec__act_encode_block(x, dtype, first, block, bits, mixprec__act_block_key(key, first),
                                  p.inv[j], p.z[j], ub, dst);
    }
  }
}

/* ---- unpack ---------------------------------------------------------------- */

/* 16 codes (bytes) in both 128-bit lanes -> two vectors of 8 int32 codes:
 * in order (FP32 / FP16: elements 0-7 and 8-15) or even / odd (BF16:
 * elements 0, 2, .., 14 and 1, 3, .., 15, so the rounded halves interleave
 * back into order with one blend). */
MIXPREC__FORCE_INLINE void mixprec__act_codes16(__m256i g, int bf16, __m256i *c1, __m256i *c2) {
  const __m256i m1 =
      bf16 ? _mm256_setr_epi8(0, -1, -1, -1, 2, -1, -1, -1, 4, -1, -1, -1, 6, -1, -1, -1,  //
                              8, -1, -1, -1, 10, -1, -1, -1, 12, -1, -1, -1, 14, -1, -1, -1)
           : _mm256_setr_epi8(0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3, -1, -1, -1,  //
                              4, -1, -1, -1, 5, -1, -1, -1, 6, -1, -1, -1, 7, -1, -1, -1);
  const __m256i m2 =
      bf16 ? _mm256_setr_epi8(1, -1, -1, -1, 3, -1, -1, -1, 5, -1, -1, -1, 7, -1, -1, -1,  //
                              9, -1, -1, -1, 11, -1, -1, -1, 13, -1, -1, -1, 15, -1, -1, -1)
           : _mm256_setr_epi8(8, -1, -1, -1, 9, -1, -1, -1, 10, -1, -1, -1, 11, -1, -1, -1,  //
                              12, -1, -1, -1, 13, -1, -1, -1, 14, -1, -1, -1, 15, -1, -1, -1);
  *c1 = _mm256_shuffle_epi8(g, m1);
  *c2 = _mm256_shuffle_epi8(g, m2);
}

/* Round to nearest even to BF16 on the integer bits, the result in the high
 * half of each lane (mixprec__f32_to_bf16 for a non-NaN). */
MIXPREC__FORCE_INLINE __m256i mixprec__act_bf16_hi(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  return _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
}

/* 16 values from 16 codes g (bytes, in both lanes) to out + i. */
MIXPREC__FORCE_INLINE void mixprec__act_decode16(__m256i g, __m256i z, __m256 s, __m256 vmax,
                                                 int clamp, mixprec_dtype dtype, void *out,
                                                 int64_t i) {
  const int bf16 = dtype == MIXPREC_BF16;
  __m256i c1, c2;
  mixprec__act_codes16(g, bf16, &c1, &c2);
  __m256 v1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(c1, z)), s);
  __m256 v2 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(c2, z)), s);
  if (clamp) {
    const __m256 vmin = _mm256_sub_ps(_mm256_setzero_ps(), vmax);
    v1 = _mm256_max_ps(_mm256_min_ps(v1, vmax), vmin);
    v2 = _mm256_max_ps(_mm256_min_ps(v2, vmax), vmin);
  }
  if (dtype == MIXPREC_F32) {
    _mm256_storeu_ps((float *)out + i, v1);
    _mm256_storeu_ps((float *)out + i + 8, v2);
  } else if (bf16) {
    const __m256i lo = _mm256_srli_epi32(mixprec__act_bf16_hi(v1), 16);
    const __m256i h = _mm256_blend_epi16(lo, mixprec__act_bf16_hi(v2), 0xaa);
    _mm256_storeu_si256((__m256i *)((uint16_t *)out + i), h);
  } else {
    _mm_storeu_si128((__m128i *)((uint16_t *)out + i), _mm256_cvtps_ph(v1, MIXPREC__ACT_RN));
    _mm_storeu_si128((__m128i *)((uint16_t *)out + i + 8), _mm256_cvtps_ph(v2, MIXPREC__ACT_RN));
  }
}

/* 4-bit codes to FP16 / BF16: a block has 16 values, so they are computed
 * once (the same decode and rounding as above) into two 16-byte tables,
 * low and high bytes, and each element is two byte lookups. */
MIXPREC__FORCE_INLINE void mixprec__act_decode_block_lut(const uint8_t *codes, float stored,
                                                         int64_t len, mixprec_dtype dtype,
                                                         void *out, int64_t first) {
  const __m256i z = _mm256_set1_epi32(mixprec__act_zero_of(stored));
  const __m256 s = _mm256_set1_ps(mixprec__act_scale_of(stored));
  const __m256 vmax = _mm256_set1_ps(mixprec__act_max_of(dtype));
  const __m256 vmin = _mm256_sub_ps(_mm256_setzero_ps(), vmax);
  const __m256i c0 = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i c1 = _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15);
  __m256 v0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(c0, z)), s);
  __m256 v1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(c1, z)), s);
  v0 = _mm256_max_ps(_mm256_min_ps(v0, vmax), vmin);
  v1 = _mm256_max_ps(_mm256_min_ps(v1, vmax), vmin);
  __m256i w; /* the 16 values as uint16, in order */
  if (dtype == MIXPREC_BF16) {
    const __m256i r0 = _mm256_srli_epi32(mixprec__act_bf16_hi(v0), 16);
    const __m256i r1 = _mm256_srli_epi32(mixprec__act_bf16_hi(v1), 16);
    w = _mm256_permute4x64_epi64(_mm256_packus_epi32(r0, r1), 0xd8);
  } else {
    w = _mm256_set_m128i(_mm256_cvtps_ph(v1, MIXPREC__ACT_RN), _mm256_cvtps_ph(v0, MIXPREC__ACT_RN));
  }
  /* low bytes of values 0-15 in the low half, high bytes in the high half */
  const __m256i lh = _mm256_permute4x64_epi64(
      _mm256_packus_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0xff)), _mm256_srli_epi16(w, 8)),
      0xd8);
  const __m256i tlo = _mm256_permute4x64_epi64(lh, 0x44), thi = _mm256_permute4x64_epi64(lh, 0xee);
  uint16_t *o = (uint16_t *)out + first;
  for (int64_t i = 0; i < len; i += 32) {
    const __m128i b = _mm_loadu_si128((const __m128i *)(codes + i / 2));
    const __m128i nib = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(b, nib);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), nib);
    /* element codes 0-15 | 16-31 */
    const __m256i idx = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
    const __m256i l = _mm256_shuffle_epi8(tlo, idx), h = _mm256_shuffle_epi8(thi, idx);
    const __m256i e0 = _mm256_unpacklo_epi8(l, h); /* elements 0-7 | 16-23 */
    const __m256i e1 = _mm256_unpackhi_epi8(l, h); /* elements 8-15 | 24-31 */
    _mm256_storeu_si256((__m256i *)(o + i), _mm256_permute2x128_si256(e0, e1, 0x20));
    _mm256_storeu_si256((__m256i *)(o + i + 16), _mm256_permute2x128_si256(e0, e1, 0x31));
  }
}

/* One full block (len a multiple of 32) of finite scale. */
MIXPREC__FORCE_INLINE void mixprec__act_decode_block(const uint8_t *codes, float stored,
                                                     int64_t len, int64_t bits,
                                                     mixprec_dtype dtype, void *out,
                                                     int64_t first, int clamp) {
  const __m256i z = _mm256_set1_epi32(mixprec__act_zero_of(stored));
  const __m256 s = _mm256_set1_ps(mixprec__act_scale_of(stored));
  const __m256 vmax = _mm256_set1_ps(mixprec__act_max_of(dtype));
  for (int64_t i = 0; i < len; i += 32) {
    __m256i g0, g1;
    if (bits == 8) {
      g0 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(codes + i)));
      g1 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(codes + i + 16)));
    } else {
      const __m128i b = _mm_loadu_si128((const __m128i *)(codes + i / 2));
      const __m128i nib = _mm_set1_epi8(15);
      const __m128i lo = _mm_and_si128(b, nib);
      const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), nib);
      g0 = _mm256_broadcastsi128_si256(_mm_unpacklo_epi8(lo, hi));
      g1 = _mm256_broadcastsi128_si256(_mm_unpackhi_epi8(lo, hi));
    }
    mixprec__act_decode16(g0, z, s, vmax, clamp, dtype, out, first + i);
    mixprec__act_decode16(g1, z, s, vmax, clamp, dtype, out, first + i + 16);
  }
}

MIXPREC__FORCE_INLINE void mixprec__act_unpack_full(const uint8_t *codes, const float *scales,
                                                    int64_t bits, int64_t block, int64_t b0,
                                                    int64_t bf, void *out,
                                                    mixprec_dtype dtype) {
  const float vmax = mixprec__act_max_of(dtype);
  for (int64_t b = b0; b < bf; b++) {
    const int64_t first = b * block;
    const float stored = scales[b];
    if (mixprec__act_scale_nonfinite(stored)) {
      mixprec__act_fill_nan(out, dtype, first, block);
      continue;
    }
    const uint8_t *src = codes + (bits == 8 ? first : first / 2);
    if (bits == 4 && dtype != MIXPREC_F32) {
      mixprec__act_decode_block_lut(src, stored, block, dtype, out, first);
      continue;
    }
    /* |c - z| <= 255: (c - z) * s is within +-vmax whenever 255 * s is
     * (rounding is monotone; s may be negative in fuzzed input), and the
     * clamp is a no-op. */
    const float top = MIXPREC__ACT_MUL(mixprec__act_scale_of(stored), 255.0f);
    if (top <= vmax && top >= -vmax)
      mixprec__act_decode_block(src, stored, block, bits, dtype, out, first, 0);
    else
      mixprec__act_decode_block(src, stored, block, bits, dtype, out, first, 1);
  }
}

/* ---- entry points ---------------------------------------------------------- */

/* The end of the full blocks among [b0, b1): all of them but a tensor's
 * partial last block. */
MIXPREC__FORCE_INLINE int64_t mixprec__act_full_end(int64_t n, int64_t block, int64_t b0,
                                                    int64_t b1) {
  return (b1 > b0 && b1 * block > n) ? b1 - 1 : b1;
}

/* One function per dtype and width (the dtype and width constants in each
 * body), then the entry points: the full blocks there, a partial last block
 * through the scalar body. */
#define MIXPREC__ACT_CASE_FNS(SUF, NAME, DT, BITS)                                             \
  static __attribute__((noinline)) void mixprec__act_pack_##SUF##_##NAME(                     \
      const void *x, int64_t block, uint32_t key, int64_t b0, int64_t bf, uint8_t *codes,      \
      float *scales) {                                                                         \
    if (block == 32) /* the 4-bit default: one chunk a block, no loops */                     \
      mixprec__act_pack_full(x, DT, BITS, 32, key, b0, bf, codes, scales);                     \
    else                                                                                       \
      mixprec__act_pack_full(x, DT, BITS, block, key, b0, bf, codes, scales);                  \
  }                                                                                            \
  static __attribute__((noinline)) void mixprec__act_unpack_##SUF##_##NAME(                   \
      const uint8_t *codes, const float *scales, int64_t block, int64_t b0, int64_t bf,        \
      void *out) {                                                                             \
    if (block == 32)                                                                           \
      mixprec__act_unpack_full(codes, scales, BITS, 32, b0, bf, out, DT);                      \
    else                                                                                       \
      mixprec__act_unpack_full(codes, scales, BITS, block, b0, bf, out, DT);                   \
  }

#define MIXPREC__ACT_DISPATCH(SUF, WHAT, ...)                                                  \
  switch (dtype) {                                                                             \
    case MIXPREC_BF16:                                                                         \
      (bits == 8 ? mixprec__act_##WHAT##_##SUF##_bf16_8 : mixprec__act_##WHAT##_##SUF##_bf16_4)(__VA_ARGS__); \
      break;                                                                                   \
    case MIXPREC_F16:                                                                          \
      (bits == 8 ? mixprec__act_##WHAT##_##SUF##_f16_8 : mixprec__act_##WHAT##_##SUF##_f16_4)(__VA_ARGS__); \
      break;                                                                                   \
    default:                                                                                   \
      (bits == 8 ? mixprec__act_##WHAT##_##SUF##_f32_8 : mixprec__act_##WHAT##_##SUF##_f32_4)(__VA_ARGS__); \
      break;                                                                                   \
  }

/* Defines mixprec__act_pack_<SUF> / mixprec__act_unpack_<SUF>. */
#define MIXPREC__ACT_DEFINE_SIMD256(SUF)                                                       \
  MIXPREC__ACT_CASE_FNS(SUF, bf16_8, MIXPREC_BF16, 8)                                          \
  MIXPREC__ACT_CASE_FNS(SUF, bf16_4, MIXPREC_BF16, 4)                                          \
  MIXPREC__ACT_CASE_FNS(SUF, f16_8, MIXPREC_F16, 8)                                            \
  MIXPREC__ACT_CASE_FNS(SUF, f16_4, MIXPREC_F16, 4)                                            \
  MIXPREC__ACT_CASE_FNS(SUF, f32_8, MIXPREC_F32, 8)                                            \
  MIXPREC__ACT_CASE_FNS(SUF, f32_4, MIXPREC_F32, 4)                                            \
  void mixprec__act_pack_##SUF(const void *x, mixprec_dtype dtype, int64_t n, int64_t bits,    \
                               int64_t block, uint32_t key, int64_t b0, int64_t b1,            \
                               uint8_t *codes, float *scales) {                                \
    const int64_t bf = mixprec__act_full_end(n, block, b0, b1);                                \
    if (bf > b0) MIXPREC__ACT_DISPATCH(SUF, pack, x, block, key, b0, bf, codes, scales)        \
    if (bf < b1) mixprec__act_pack_scalar(x, dtype, n, bits, block, key, bf, b1, codes, scales); \
  }                                                                                            \
  void mixprec__act_unpack_##SUF(const uint8_t *codes, const float *scales, int64_t n,         \
                                 int64_t bits, int64_t block, int64_t b0, int64_t b1,          \
                                 void *out, mixprec_dtype dtype) {                             \
    const int64_t bf = mixprec__act_full_end(n, block, b0, b1);                                \
    if (bf > b0) MIXPREC__ACT_DISPATCH(SUF, unpack, codes, scales, block, b0, bf, out)         \
    if (bf < b1)                                                                               \
      mixprec__act_unpack_scalar(codes, scales, n, bits, block, bf, b1, out, dtype);           \
  }

#endif /* MIXPREC_ACT_PACK_AVX2_BODY_H */
