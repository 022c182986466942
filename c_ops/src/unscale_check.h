/* Argument checks of mixprec_unscale / mixprec_grad_norm, shared verbatim by
 * the CPU (unscale.c) and the CUDA host code (kernels/unscale.cu), so both
 * return the same status for the same arguments. The GPU then checks the
 * pointers' alignment. Depends only on the public header. */
#ifndef MIXPREC_UNSCALE_CHECK_H
#define MIXPREC_UNSCALE_CHECK_H

#include <stddef.h>

#include "compiler.h"
#include "mixprec/amp.h"

/* The tensor list: counts, dtypes, and data pointers of non-empty tensors
 * (also all mixprec_cuda_unscale_workspace_size checks). */
MIXPREC__INLINE mixprec_status mixprec__check_tensor_list(const mixprec_tensor *tensors,
                                                          int64_t n_tensors) {
  if (n_tensors < 0) return MIXPREC_ERR_BAD_SIZE;
  if (n_tensors > 0 && tensors == NULL) return MIXPREC_ERR_NULL_POINTER;
  for (int64_t i = 0; i < n_tensors; i++) {
    if (tensors[i].numel < 0) return MIXPREC_ERR_BAD_SIZE;
    if (mixprec_dtype_size(tensors[i].dtype) == 0) return MIXPREC_ERR_BAD_DTYPE;
    if (tensors[i].numel > 0 && tensors[i].data == NULL) return MIXPREC_ERR_NULL_POINTER;
  }
  return MIXPREC_OK;
}

MIXPREC__INLINE mixprec_status mixprec__unscale_check(const mixprec_tensor *tensors,
                                                      int64_t n_tensors, const float *inv_scale,
                                                      const float *found_inf) {
  if (n_tensors < 0) return MIXPREC_ERR_BAD_SIZE;
  if (inv_scale == NULL || found_inf == NULL) return MIXPREC_ERR_NULL_POINTER;
  return mixprec__check_tensor_list(tensors, n_tensors);
}

#endif /* MIXPREC_UNSCALE_CHECK_H */
