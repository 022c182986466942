/* What the CPU (overflow.c) and CUDA (kernels/overflow.cu) overflow checks
 * share: the argument checks (so both return the same status for the same
 * arguments) and the one element rule. Depends only on the public headers
 * (and unscale_check.h, whose tensor-list check it shares). */
#ifndef MIXPREC_OVERFLOW_INTERNAL_H
#define MIXPREC_OVERFLOW_INTERNAL_H

#include <stddef.h>

#include "compiler.h"
#include "mixprec/overflow.h"
#include "unscale_check.h" /* mixprec__check_tensor_list: the same list rules */

/* [note: overflow bits]
 * The element rule of the check, on storage bits: with the sign cleared, a
 * value is inf/NaN exactly when its bits are >= the bits of +inf of its
 * dtype, and for finite values the order of the magnitudes is the order of
 * the bits as unsigned integers (IEEE formats are sign-magnitude with the
 * exponent above the mantissa). So the largest finite magnitude is the
 * largest masked bit pattern below +inf, found with integer max (exact, and
 * the same in any order, hence on any thread count, ISA or GPU grid), and
 * widened to float once at the end. */
MIXPREC__HD uint32_t mixprec__overflow_abs_mask(mixprec_dtype dtype) {
  return dtype == MIXPREC_F32 ? 0x7fffffffu : 0x7fffu;
}
MIXPREC__HD uint32_t mixprec__overflow_inf_bits(mixprec_dtype dtype) {
  return dtype == MIXPREC_F32 ? 0x7f800000u : dtype == MIXPREC_F16 ? 0x7c00u : 0x7f80u;
}

MIXPREC__INLINE mixprec_status mixprec__overflow_check_args(const mixprec_tensor *outputs,
                                                            int64_t n_outputs,
                                                            const mixprec_tensor *inputs,
                                                            int64_t n_inputs, const float *record,
                                                            int64_t n_slots, int64_t slot) {
  if (record == NULL) return MIXPREC_ERR_NULL_POINTER;
  if (n_slots < 1) return MIXPREC_ERR_BAD_SIZE;
  if (slot < 0 || slot >= n_slots) return MIXPREC_ERR_BAD_ARGUMENT;
  mixprec_status st = mixprec__check_tensor_list(outputs, n_outputs);
  if (st != MIXPREC_OK) return st;
  return mixprec__check_tensor_list(inputs, n_inputs);
}

/* Folds n elements at data into *max_bits (the largest finite magnitude's
 * masked bits) and *nonfinite (set to 1, never cleared). Every path gives
 * the same result: integer max, see [note: overflow bits]. */
void mixprec__overflow_scan_scalar(const void *data, mixprec_dtype dtype, int64_t n,
                                   uint32_t *max_bits, int *nonfinite);
#if defined(MIXPREC_X86)
void mixprec__overflow_scan_avx2(const void *data, mixprec_dtype dtype, int64_t n,
                                 uint32_t *max_bits, int *nonfinite);
#endif

#endif /* MIXPREC_OVERFLOW_INTERNAL_H */
