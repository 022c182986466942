/* The size and dtype checks of the softmax entry points, shared verbatim by
 * the CPU (softmax.c) and the CUDA host code (kernels/softmax.cu), so both
 * return the same status for the same arguments. Depends only on the public
 * header. */
#ifndef MIXPREC_SOFTMAX_CHECK_H
#define MIXPREC_SOFTMAX_CHECK_H

#include <stdint.h>

#include "compiler.h"
#include "mixprec/softmax.h"

/* The two dtypes (input and output) and the (outer, n, inner) sizes;
 * *numel receives their product (0 for an empty tensor, when the caller has
 * nothing to do and no pointer to check). */
MIXPREC__INLINE mixprec_status mixprec__softmax_check_shape(mixprec_dtype a, mixprec_dtype b,
                                                            int64_t outer, int64_t n,
                                                            int64_t inner, int64_t *numel) {
  if (mixprec_dtype_size(a) == 0 || mixprec_dtype_size(b) == 0) return MIXPREC_ERR_BAD_DTYPE;
  if (outer < 0 || n < 0 || inner < 0) return MIXPREC_ERR_BAD_SIZE;
  *numel = 0;
  if (outer == 0 || n == 0 || inner == 0) return MIXPREC_OK;
  if (n > INT64_MAX / inner || outer > INT64_MAX / (n * inner)) return MIXPREC_ERR_BAD_SIZE;
  *numel = outer * n * inner;
  return MIXPREC_OK;
}

#endif /* MIXPREC_SOFTMAX_CHECK_H */
