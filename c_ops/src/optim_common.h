/* Shared pieces of the fused optimizer steps (adamw.c, sgd.c): argument
 * checks, the flattened chunk list, and the per-element load/store of the
 * three dtypes. Internal; every name starts with mixprec__. */
#ifndef MIXPREC_OPTIM_COMMON_H
#define MIXPREC_OPTIM_COMMON_H

#include <math.h>
#include <stdlib.h>

#include "internal.h"

/* Work is cut into chunks of at most this many elements of one tensor. The
 * update is elementwise, so the chunking only balances threads; results do not
 * depend on it. */
#define MIXPREC__OPT_CHUNK ((int64_t)1 << 16)
/* Below this many elements in all, a parallel region costs more than it saves. */
#define MIXPREC__OPT_PARALLEL_MIN ((int64_t)1 << 16)

/* The vector width (in floats) of the torch CPU kernels whose results the
 * optimizers reproduce bit for bit: Vectorized<float>::size() of torch's
 * AVX2 build. torch's fused CPU optimizers run a vectorised body over the
 * first numel - numel % width elements of each tensor and a scalar loop over
 * the rest, and the two round differently (see adamw.c, sgd.c). 16 would be
 * torch's AVX-512 build. Any value gives correct results; only the bitwise
 * equality of the last few elements of a tensor depends on it. */
#ifndef MIXPREC__OPT_TORCH_VEC
#define MIXPREC__OPT_TORCH_VEC 8
#endif

/* First element of a tensor that torch's scalar tail loop handles. */
MIXPREC__INLINE int64_t mixprec__opt_tail_start(int64_t numel) {
  return numel - numel % MIXPREC__OPT_TORCH_VEC;
}

MIXPREC__INLINE int mixprec__opt_dtype_ok(mixprec_dtype d) {
  return d == MIXPREC_F32 || d == MIXPREC_F16 || d == MIXPREC_BF16;
}

/* A hyper-parameter must be finite and at least lo. */
MIXPREC__INLINE int mixprec__opt_finite_ge(double x, double lo) {
  return isfinite(x) && x >= lo;
}

/* Checks one descriptor's pointers, size and dtypes. The optimizer-specific
 * state pointers are checked by the caller. */
MIXPREC__INLINE mixprec_status mixprec__opt_check_tensor(const mixprec_opt_tensor *t) {
  if (t->numel < 0) return MIXPREC_ERR_BAD_SIZE;
  if (!mixprec__opt_dtype_ok(t->param_dtype) || !mixprec__opt_dtype_ok(t->grad_dtype))
    return MIXPREC_ERR_BAD_DTYPE;
  /* A master copy beside an F32 param would be a second, diverging copy. */
  if (t->param_dtype == MIXPREC_F32 && t->master) return MIXPREC_ERR_BAD_ARGUMENT;
  if (t->numel == 0) return MIXPREC_OK;
  if (!t->param || !t->grad) return MIXPREC_ERR_NULL_POINTER;
  if (t->param_dtype != MIXPREC_F32 && !t->master) return MIXPREC_ERR_NULL_POINTER;
  return MIXPREC_OK;
}

/* Gradient element i widened to float. */
MIXPREC__INLINE float mixprec__opt_load(const void *data, mixprec_dtype dtype, int64_t i) {
  switch (dtype) {
    case MIXPREC_F16: return mixprec__f16_to_f32(((const uint16_t *)data)[i]);
    case MIXPREC_BF16: return mixprec__bf16_to_f32(((const uint16_t *)data)[i]);
    default: return ((const float *)data)[i];
  }
}

/* Stores a low-precision param element, rounded to nearest even. */
MIXPREC__INLINE void mixprec__opt_store_half(void *data, mixprec_dtype dtype, int64_t i,
                                             float v) {
  if (dtype == MIXPREC_F16)
    ((uint16_t *)data)[i] = mixprec__f32_to_f16(v);
  else
    ((uint16_t *)data)[i] = mixprec__f32_to_bf16(v);
}

/* The flattened chunk list: first[t] is tensor t's first chunk, first[n] the
 * chunk count. Returns NULL when out of memory. */
MIXPREC__INLINE int64_t *mixprec__opt_chunks(const mixprec_opt_tensor *list, int64_t n,
                                             int64_t *n_chunks, int64_t *total) {
  int64_t *first = (int64_t *)malloc(sizeof(int64_t) * (size_t)(n + 1));
  if (!first) return NULL;
  int64_t c = 0, sum = 0;
  for (int64_t t = 0; t < n; t++) {
    first[t] = c;
    c += (list[t].numel + MIXPREC__OPT_CHUNK - 1) / MIXPREC__OPT_CHUNK;
    sum += list[t].numel;
  }
  first[n] = c;
  *n_chunks = c;
  *total = sum;
  return first;
}

/* Index of the tensor owning global chunk c: the last t with first[t] <= c
 * (tensors without chunks share their successor's first index). */
MIXPREC__INLINE int64_t mixprec__opt_owner(const int64_t *first, int64_t n, int64_t c) {
  int64_t lo = 0, hi = n - 1;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo + 1) / 2;
    if (first[mid] <= c) lo = mid; else hi = mid - 1;
  }
  return lo;
}

/* Nonzero when the step must be skipped: *found_inf is nonzero or NaN. */
MIXPREC__INLINE int mixprec__opt_skip(const float *found_inf) {
  return found_inf && !(*found_inf == 0.0f);
}

#endif /* MIXPREC_OPTIM_COMMON_H */
