/* mixprec C API: compressed activations (the act_pack family). Included by
 * mixprec/mixprec.h.
 *
 * A tensor saved for backward is packed into blockwise integer codes with one
 * FP32 scale per block, and unpacked when backward needs it. 8-bit codes keep
 * a BF16/FP16 activation in about half its bytes, 4-bit codes in about a
 * quarter (an FP32 one in an eighth). mixprec.memory.compressed_activations
 * is the torch face; this header is the format's contract.
 *
 *     int64_t code_bytes, n_scales;
 *     mixprec_act_packed_size(n, 8, 256, &code_bytes, &n_scales);
 *     uint8_t *codes = malloc(code_bytes);  float *scales = malloc(4 * n_scales);
 *     mixprec_act_pack(x, MIXPREC_BF16, n, 8, 256, seed, codes, scales);
 *     ...
 *     mixprec_act_unpack(codes, scales, n, 8, 256, y, MIXPREC_BF16);  // y ~ x
 *
 * [note: act_pack format]
 * Elements are cut into blocks of `block` consecutive elements (the last
 * block may be shorter). With Q = 2^bits - 1 and lo / hi the block's
 * smallest and largest element, each block has a scale s and a zero point
 * z, element codes c in [0, Q] and values (c - z) * s:
 *   - a block with no element below zero (ReLU outputs; -0 counts as zero):
 *     z = 0, s = hi / Q;
 *   - any other block: s = max(hi, 0) / (Q - 1) - lo / (Q - 1), then
 *     z = ceil(-lo / s) clamped to [1, Q] (the quotient a float), so [lo,
 *     hi] lies in [-z s, (Q - z) s] up to rounding and zero is the code z
 *     exactly.
 *   s is at least 2^-126 and rounded up to 16 significant bits (its low 8
 *   bits zero), and the stored float carries z in those 8 bits: scales[b]
 *   has the bits of s | z. Every float operation above is one IEEE
 *   operation rounded to nearest. A block holding an inf or NaN is stored with
 *   the NaN scale 0x7fc00000 and codes 0, and unpacks to NaN everywhere
 *   (a non-finite forward stays non-finite in backward, so GradScaler
 *   still sees it and skips the step); so is any stored scale whose s
 *   part is not finite.
 * Rounding is stochastic and unbiased: with t = x * (1 / s) and u = (r >>
 * 8) * 2^-24 from the element's 32 random bits r, q = floor(t + u) (t, 1 /
 * s and t + u each a float rounded to nearest), c = q + z clamped to [0,
 * Q], so E[(c - z) * s] = x up to the float rounding of t + u. Unpacked,
 * (c - z) * s is clamped to the output dtype's finite range (the top code
 * may lie a step above the block's largest element, next to the dtype's
 * largest value). r is mixprec__sr_bits of a key made from
 * `seed` and the element's index in the tensor (stochastic_round.h: a
 * counter-based hash), so the codes depend only on (x, seed, bits, block):
 * not on threads, instruction set or device.
 * Exact where backward needs it exact: a zero (either sign) gets code z and
 * unpacks to +0, no element changes sign, and a non-zero element never gets
 * q = 0 (it is moved to +1 or -1 by its sign), so the set of zeros (ReLU's
 * mask) and the signs (a LeakyReLU's mask) come back exactly. The cost is a
 * bias for 0 < |x| < s (it comes back as +-s): for 8-bit codes of a ReLU
 * output, |x| < max / 255.
 * Byte layout: 8-bit: one byte per element. 4-bit: element 2k in the low
 * nibble of byte k, element 2k + 1 in the high nibble (a last odd element
 * leaves the high nibble 0). `block` is a power of two in [32, 4096], so a
 * block starts on a byte boundary in both layouts. */
#ifndef MIXPREC_ACT_PACK_H
#define MIXPREC_ACT_PACK_H

#include "mixprec/mixprec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The code widths and block sizes the format takes. */
#define MIXPREC_ACT_BLOCK_MIN 32
#define MIXPREC_ACT_BLOCK_MAX 4096

/*! mixprec_act_packed_size() :
 *  The sizes of a packed tensor of n elements.
 *  @param bits  : 8 or 4.
 *  @param block : a power of two in [MIXPREC_ACT_BLOCK_MIN, MIXPREC_ACT_BLOCK_MAX].
 *  @param code_bytes : out, bytes of codes (n for 8 bits, ceil(n / 2) for 4).
 *  @param n_scales   : out, floats of scales (ceil(n / block)).
 *  @return : MIXPREC_OK; MIXPREC_ERR_NULL_POINTER if an out pointer is NULL;
 *            MIXPREC_ERR_BAD_SIZE if n < 0; MIXPREC_ERR_BAD_ARGUMENT for other
 *            bits or block. Nothing is written unless the status is OK. */
MIXPREC_API mixprec_status mixprec_act_packed_size(int64_t n, int64_t bits, int64_t block,
                                                   int64_t *code_bytes, int64_t *n_scales);

/*! mixprec_act_pack() :
 *  Packs the n elements at x (F32, F16 or BF16) into codes and scales in
 *  the format of [note: act_pack format], with stochastic rounding from
 *  `seed`. Parallel over blocks on the library's threads; the result does not
 *  depend on their number or on the instruction set.
 *  @param codes  : code_bytes bytes (mixprec_act_packed_size), written whole.
 *  @param scales : n_scales floats, written whole.
 *  x may be NULL when n is 0. x must not overlap codes or scales.
 *  @return : MIXPREC_OK; MIXPREC_ERR_NULL_POINTER if x (n > 0), codes (n > 0)
 *            or scales (n > 0) is NULL; MIXPREC_ERR_BAD_SIZE if n < 0;
 *            MIXPREC_ERR_BAD_ARGUMENT for bits or block; MIXPREC_ERR_BAD_DTYPE
 *            for an unknown dtype. Nothing is written unless the status is OK. */
MIXPREC_API mixprec_status mixprec_act_pack(const void *x, mixprec_dtype dtype, int64_t n,
                                            int64_t bits, int64_t block, uint64_t seed,
                                            uint8_t *codes, float *scales);

/*! mixprec_act_unpack() :
 *  Writes the n values of a packed tensor to out as `dtype` (q * s in float,
 *  then rounded to nearest even for F16/BF16). Any dtype may unpack any
 *  packed tensor; the torch face unpacks to the dtype that was packed. Any
 *  code or scale bits are valid input (a fuzzed buffer decodes to some
 *  values, never out of bounds).
 *  @return : as mixprec_act_pack() (out takes x's role). Nothing is written
 *            unless the status is OK. */
MIXPREC_API mixprec_status mixprec_act_unpack(const uint8_t *codes, const float *scales, int64_t n,
                                              int64_t bits, int64_t block, void *out,
                                              mixprec_dtype dtype);

/*! mixprec_act_mask() :
 *  The set of positive elements of the n elements at x (F32, F16 or BF16) as
 *  bits: bit (i & 7) of mask[i >> 3] is 1 exactly when x[i] > 0 (+inf
 *  included; +-0, negatives and NaN give 0). ceil(n / 8) bytes, written
 *  whole (the last byte's unused high bits 0). What a ReLU that follows a
 *  BatchNorm keeps of its output: [note: norm_relu recompute].
 *  @return : MIXPREC_OK; MIXPREC_ERR_BAD_SIZE if n < 0; MIXPREC_ERR_BAD_DTYPE;
 *            MIXPREC_ERR_NULL_POINTER if x or mask is NULL with n > 0.
 *            Nothing is written unless the status is OK. */
MIXPREC_API mixprec_status mixprec_act_mask(const void *x, mixprec_dtype dtype, int64_t n,
                                            uint8_t *mask);

/*! mixprec_act_unpack_norm_relu() :
 *  [note: norm_relu recompute] A ReLU's output recomputed from the packed
 *  input x of the BatchNorm before it (codes, scales, n, bits, block as
 *  mixprec_act_unpack takes them) and the bits of mixprec_act_mask of the
 *  ReLU's output: element i (memory order), of channel c = (i / inner) %
 *  channels, is
 *      v = x_i * a[c] + b[c]          (two IEEE roundings, never fused)
 *      out[i] = mask bit i ? max(v, tiny) : +0
 *  rounded to dtype (nearest even), where x_i is the float value
 *  mixprec_act_unpack gives for dtype F32 and tiny the dtype's smallest
 *  normal (2^-126 for F32 / BF16, 2^-14 for F16), so every kept element
 *  comes back positive and the ReLU's mask is exact. A NaN v (a block
 *  holding an inf or NaN, or non-finite a / b) of a kept element gives the
 *  dtype's one fixed NaN (as mixprec_act_unpack's non-finite blocks). inner
 *  = H * W for an NCHW tensor, 1 for channels_last or (N, C).
 *  a, b: `channels` floats each (a = weight * invstd, b = bias - mean * a).
 *  @return : MIXPREC_OK; MIXPREC_ERR_BAD_SIZE if n < 0;
 *            MIXPREC_ERR_BAD_ARGUMENT for bits, block, channels < 1 or
 *            inner < 1; MIXPREC_ERR_BAD_DTYPE; MIXPREC_ERR_NULL_POINTER if
 *            any pointer is NULL with n > 0. Nothing is written unless the
 *            status is OK. */
MIXPREC_API mixprec_status mixprec_act_unpack_norm_relu(const uint8_t *codes, const float *scales,
                                                        int64_t n, int64_t bits, int64_t block,
                                                        const float *a, const float *b,
                                                        int64_t channels, int64_t inner,
                                                        const uint8_t *mask, void *out,
                                                        mixprec_dtype dtype);

/*! mixprec_act_pool_encode() :
 *  [note: pool codes] The int64 indices a 2-D max pool saves (h * W + w in
 *  its input plane of width W) as one byte each: the offset
 *  ((h - h0) / dH) * kW + (w - w0) / dW of the chosen element in its output
 *  element's window, whose origin is h0 = ho * sH - pH, w0 = wo * sW - pW.
 *  Element i of idx (n elements, memory order of a dense tensor whose last
 *  two dimensions are the pool's output rows and columns) is at ho =
 *  (i / s_ho) % HO, wo = (i / s_wo) % WO (s_ho, s_wo: those dimensions'
 *  strides in elements: WO and 1 when contiguous, WO * C and C when
 *  channels_last). An index outside its window, not on its dilation grid,
 *  negative or >= 2^52 gets the code 255 and counts in *inexact (kH * kW <= 255, so
 *  255 is no valid offset).
 *  geom = {W, kH, kW, sH, sW, pH, pW, dH, dW}.
 *  @return : MIXPREC_OK; MIXPREC_ERR_BAD_SIZE if n < 0;
 *            MIXPREC_ERR_BAD_ARGUMENT for HO, WO, s_ho, s_wo, W, kH, kW, sH,
 *            sW, dH or dW < 1, pH or pW < 0, or kH * kW > 255;
 *            MIXPREC_ERR_NULL_POINTER if idx, codes (n > 0), geom or inexact
 *            is NULL. Nothing is written unless the status is OK. */
MIXPREC_API mixprec_status mixprec_act_pool_encode(const int64_t *idx, int64_t n, int64_t HO,
                                                   int64_t WO, int64_t s_ho, int64_t s_wo,
                                                   const int64_t *geom, uint8_t *codes,
                                                   int64_t *inexact);

/*! mixprec_act_pool_decode() :
 *  The indices back from codes: (h0 + (c / kW) * dH) * W + w0 + (c % kW) * dW
 *  for element i at (ho, wo) as above. Any code decodes (a code >= kH * kW
 *  gives an index past the window, never an error).
 *  @return : as mixprec_act_pool_encode (idx takes codes' role, out the
 *            indices). Nothing is written unless the status is OK. */
MIXPREC_API mixprec_status mixprec_act_pool_decode(const uint8_t *codes, int64_t n, int64_t HO,
                                                   int64_t WO, int64_t s_ho, int64_t s_wo,
                                                   const int64_t *geom, int64_t *idx);

/* ---- CUDA (libmixprec_cuda) ---------------------------------------------- */

/*! mixprec_cuda_act_pack() / mixprec_cuda_act_unpack() :
 *  As the CPU entry points, on the GPU: every pointer a device pointer, one
 *  launch on `stream`, no host synchronisation, capturable in a CUDA graph.
 *  The codes and scales are bit for bit the CPU's (same rules, same random
 *  bits). CUDA: written to match the CPU bit for bit; not yet run on a GPU.
 *  @return : as the CPU's; MIXPREC_ERR_BAD_ARGUMENT also for x or out not
 *            aligned to its element size or scales not aligned to 4 bytes;
 *            MIXPREC_ERR_CUDA if the launch failed. */
MIXPREC_API mixprec_status mixprec_cuda_act_pack(const void *x, mixprec_dtype dtype, int64_t n,
                                                 int64_t bits, int64_t block, uint64_t seed,
                                                 uint8_t *codes, float *scales, void *stream);
MIXPREC_API mixprec_status mixprec_cuda_act_unpack(const uint8_t *codes, const float *scales,
                                                   int64_t n, int64_t bits, int64_t block,
                                                   void *out, mixprec_dtype dtype, void *stream);

/*! mixprec_cuda_act_mask() / mixprec_cuda_act_unpack_norm_relu() :
 *  As the CPU entry points, on the GPU (device pointers, one launch on
 *  `stream`, no host synchronisation), bit for bit the CPU's output.
 *  @return : as the CPU's; MIXPREC_ERR_BAD_ARGUMENT also for x, out, a, b
 *            or scales not aligned to its element size; MIXPREC_ERR_CUDA if
 *            the launch failed. */
MIXPREC_API mixprec_status mixprec_cuda_act_mask(const void *x, mixprec_dtype dtype, int64_t n,
                                                 uint8_t *mask, void *stream);
MIXPREC_API mixprec_status mixprec_cuda_act_unpack_norm_relu(
    const uint8_t *codes, const float *scales, int64_t n, int64_t bits, int64_t block,
    const float *a, const float *b, int64_t channels, int64_t inner, const uint8_t *mask,
    void *out, mixprec_dtype dtype, void *stream);

/*! mixprec_cuda_act_pool_encode() / mixprec_cuda_act_pool_decode() :
 *  As the CPU entry points, on the GPU (device pointers for idx, codes and
 *  inexact; geom on the host), bit for bit the CPU's; *inexact (a device
 *  int64) is written, not read back: no host synchronisation.
 *  @return : as the CPU's; MIXPREC_ERR_BAD_ARGUMENT also for idx or inexact
 *            not aligned to 8 bytes; MIXPREC_ERR_CUDA if the launch failed. */
MIXPREC_API mixprec_status mixprec_cuda_act_pool_encode(const int64_t *idx, int64_t n, int64_t HO,
                                                        int64_t WO, int64_t s_ho, int64_t s_wo,
                                                        const int64_t *geom, uint8_t *codes,
                                                        int64_t *inexact, void *stream);
MIXPREC_API mixprec_status mixprec_cuda_act_pool_decode(const uint8_t *codes, int64_t n,
                                                        int64_t HO, int64_t WO, int64_t s_ho,
                                                        int64_t s_wo, const int64_t *geom,
                                                        int64_t *idx, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* MIXPREC_ACT_PACK_H */
