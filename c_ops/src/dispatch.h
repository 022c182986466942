/* The one dtype dispatch of c_ops/src and kernels/ (in the spirit of
 * torchvision's THO_DISPATCH_V2 and apex's type_shim.h). Internal; not
 * installed. Included by internal.h (C) and kernels/common.cuh (CUDA).
 *
 *   MIXPREC__DISPATCH(dtype, D, body...)
 *
 * runs `body` once, with D declared as the value of `dtype`: a compile-time
 * constant in C++/CUDA (`constexpr`, so `kernel<D>` is a template argument)
 * and a `const mixprec_dtype` in C, which a MIXPREC__FORCE_INLINE body then
 * folds into its own dtype branches (one copy of the loop per dtype, as the
 * hand-written switches did). Anything that is not FP16 or BF16 runs as FP32:
 * the entry points have checked the dtype before any dispatch.
 *
 * `body` may `return` from the enclosing function; `break` and `continue`
 * inside it end the dispatch (it is a loop of one pass). Dispatches nest:
 * MIXPREC__DISPATCH(xd, X, MIXPREC__DISPATCH(td, T, f<X, T>(...))) stamps
 * the nine pairs. */
#ifndef MIXPREC_DISPATCH_H
#define MIXPREC_DISPATCH_H

#include "mixprec/mixprec.h"

#ifdef __cplusplus
#  define MIXPREC__DTYPE_CONST(D, value) constexpr mixprec_dtype D = value
#else
#  define MIXPREC__DTYPE_CONST(D, value) const mixprec_dtype D = value
#endif

#define MIXPREC__DISPATCH_CASE(D, value, ...) \
  {                                           \
    MIXPREC__DTYPE_CONST(D, value);           \
    (void)D;                                  \
    __VA_ARGS__;                              \
  }

#define MIXPREC__DISPATCH(dtype, D, ...)                              \
  do {                                                                \
    switch (dtype) {                                                  \
      case MIXPREC_F16:                                               \
        MIXPREC__DISPATCH_CASE(D, MIXPREC_F16, __VA_ARGS__) break;    \
      case MIXPREC_BF16:                                              \
        MIXPREC__DISPATCH_CASE(D, MIXPREC_BF16, __VA_ARGS__) break;   \
      default:                                                        \
        MIXPREC__DISPATCH_CASE(D, MIXPREC_F32, __VA_ARGS__) break;    \
    }                                                                 \
  } while (0)

#endif /* MIXPREC_DISPATCH_H */
