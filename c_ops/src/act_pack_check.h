/* Argument checks of the act_pack family, shared verbatim by the CPU
 * (act_pack.c) and the CUDA host code (kernels/act_pack.cu), so both return
 * the same status for the same arguments. Depends only on the public header. */
#ifndef MIXPREC_ACT_PACK_CHECK_H
#define MIXPREC_ACT_PACK_CHECK_H

#include <stddef.h>

#include "compiler.h"
#include "mixprec/act_pack.h"

/* bits 8 or 4; block a power of two in [MIXPREC_ACT_BLOCK_MIN, _MAX]. */
MIXPREC__INLINE int mixprec__act_format_ok(int64_t bits, int64_t block) {
  return (bits == 8 || bits == 4) && block >= MIXPREC_ACT_BLOCK_MIN &&
         block <= MIXPREC_ACT_BLOCK_MAX && (block & (block - 1)) == 0;
}

/* Codes of n elements: n bytes at 8 bits, ceil(n / 2) at 4 (n >= 0, no
 * overflow: n <= INT64_MAX). */
MIXPREC__INLINE int64_t mixprec__act_code_bytes(int64_t n, int64_t bits) {
  return bits == 8 ? n : n / 2 + (n & 1);
}

MIXPREC__INLINE int64_t mixprec__act_n_scales(int64_t n, int64_t block) {
  return n / block + (n % block != 0);
}

/* The checks of mixprec_act_pack / _unpack: `data` is x (pack) or out
 * (unpack). The order is the contract's: size, format, dtype, pointers. */
MIXPREC__INLINE mixprec_status mixprec__act_check(const void *data, mixprec_dtype dtype, int64_t n,
                                                  int64_t bits, int64_t block, const void *codes,
                                                  const void *scales) {
  if (n < 0) return MIXPREC_ERR_BAD_SIZE;
  if (!mixprec__act_format_ok(bits, block)) return MIXPREC_ERR_BAD_ARGUMENT;
  if (mixprec_dtype_size(dtype) == 0) return MIXPREC_ERR_BAD_DTYPE;
  if (n > 0 && (data == NULL || codes == NULL || scales == NULL)) return MIXPREC_ERR_NULL_POINTER;
  return MIXPREC_OK;
}

/* The checks of mixprec_act_mask (and its CUDA twin), in the contract's order. */
MIXPREC__INLINE mixprec_status mixprec__act_mask_check(const void *x, mixprec_dtype dtype, int64_t n,
                                                       const void *mask) {
  if (n < 0) return MIXPREC_ERR_BAD_SIZE;
  if (mixprec_dtype_size(dtype) == 0) return MIXPREC_ERR_BAD_DTYPE;
  if (n > 0 && (x == NULL || mask == NULL)) return MIXPREC_ERR_NULL_POINTER;
  return MIXPREC_OK;
}

/* The checks of mixprec_act_unpack_norm_relu (and its CUDA twin). */
MIXPREC__INLINE mixprec_status mixprec__act_norm_relu_check(const void *codes, const void *scales,
                                                            int64_t n, int64_t bits, int64_t block,
                                                            const void *a, const void *b,
                                                            int64_t channels, int64_t inner,
                                                            const void *mask, const void *out,
                                                            mixprec_dtype dtype) {
  if (n < 0) return MIXPREC_ERR_BAD_SIZE;
  if (!mixprec__act_format_ok(bits, block) || channels < 1 || inner < 1)
    return MIXPREC_ERR_BAD_ARGUMENT;
  if (mixprec_dtype_size(dtype) == 0) return MIXPREC_ERR_BAD_DTYPE;
  if (n > 0 && (codes == NULL || scales == NULL || a == NULL || b == NULL || mask == NULL ||
                out == NULL))
    return MIXPREC_ERR_NULL_POINTER;
  return MIXPREC_OK;
}

/* The checks of mixprec_act_pool_encode / _decode (and their CUDA twins):
 * `in` is idx (encode) or codes (decode), `out` codes or idx. */
MIXPREC__INLINE mixprec_status mixprec__act_pool_check(const void *in, int64_t n, int64_t HO,
                                                       int64_t WO, int64_t s_ho, int64_t s_wo,
                                                       const int64_t *geom, const void *out,
                                                       const void *inexact, int encode) {
  if (n < 0) return MIXPREC_ERR_BAD_SIZE;
  if (geom == NULL || (encode && inexact == NULL)) return MIXPREC_ERR_NULL_POINTER;
  if (HO < 1 || WO < 1 || s_ho < 1 || s_wo < 1) return MIXPREC_ERR_BAD_ARGUMENT;
  for (int k = 0; k < 9; k++)
    if (geom[k] < (k == 5 || k == 6 ? 0 : 1)) return MIXPREC_ERR_BAD_ARGUMENT;
  if (geom[1] > 255 || geom[2] > 255 || geom[1] * geom[2] > 255) return MIXPREC_ERR_BAD_ARGUMENT;
  if (n > 0 && (in == NULL || out == NULL)) return MIXPREC_ERR_NULL_POINTER;
  return MIXPREC_OK;
}

#endif /* MIXPREC_ACT_PACK_CHECK_H */
