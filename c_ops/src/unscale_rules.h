/* The element rule of unscale_ / unscale_norm_ / grad_norm, one MIXPREC__HD
 * function called by the CPU scalar path and SIMD tails (unscale.c) and the
 * CUDA kernel (kernels/unscale.cu) alike. Internal; depends only on
 * compiler.h. */
#ifndef MIXPREC_UNSCALE_RULES_H
#define MIXPREC_UNSCALE_RULES_H

#include <stdint.h>
#include <string.h>

#include "compiler.h"

/* [note: unscale element] torch's _amp_foreach_non_finite_check_and_unscale_
 * per element: the value widened to float (exact) is tested for inf/NaN on
 * its bits (immune to fast-math folding), sets *nonfinite (never clears
 * it), and is multiplied by inv_scale in float, rounded once (never fused:
 * -ffp-contract=off on the CPU, __fmul_rn on the GPU). The caller rounds the
 * product to the storage dtype. */
MIXPREC__HD float mixprec__unscale_elem(float v, float inv_scale, int *nonfinite) {
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u) *nonfinite = 1;
#if defined(__CUDA_ARCH__)
  return __fmul_rn(v, inv_scale);
#else
  return v * inv_scale;
#endif
}

#endif /* MIXPREC_UNSCALE_RULES_H */
