/* Fused multi-tensor unscale + non-finite check (+ optional L2 norm). */
#include <stdlib.h>

#include "internal.h"

/* Work is cut into chunks of at most this many elements of one tensor. The
 * chunking depends only on the list, never on the thread count, so the norm
 * partial sums (one per chunk, added in chunk order) are reproducible. */
#define CHUNK ((int64_t)1 << 16)
/* Below this many elements in all, a parallel region costs more than it saves. */
#define PARALLEL_MIN ((int64_t)1 << 17)

MIXPREC__INLINE float load_f32(const void *data, mixprec_dtype dtype,
                               int64_t i, int *nonfinite) {
  switch (dtype) {
    case MIXPREC_F16: {
      uint16_t h = ((const uint16_t *)data)[i];
      if (mixprec__f16_bits_nonfinite(h)) *nonfinite = 1;
      return mixprec__f16_to_f32(h);
    }
    case MIXPREC_BF16: {
      uint16_t h = ((const uint16_t *)data)[i];
      if (mixprec__bf16_bits_nonfinite(h)) *nonfinite = 1;
      return mixprec__bf16_to_f32(h);
    }
    default: {
      float f = ((const float *)data)[i];
      if (mixprec__f32_bits_nonfinite(mixprec__f32_bits(f))) *nonfinite = 1;
      return f;
    }
  }
}

/* Stores v rounded to dtype and returns the stored value widened back. */
MIXPREC__INLINE float store_f32(void *data, mixprec_dtype dtype, int64_t i,
                                float v) {
  switch (dtype) {
    case MIXPREC_F16: {
      uint16_t h = mixprec__f32_to_f16(v);
      ((uint16_t *)data)[i] = h;
      return mixprec__f16_to_f32(h);
    }
    case MIXPREC_BF16: {
      uint16_t h = mixprec__f32_to_bf16(v);
      ((uint16_t *)data)[i] = h;
      return mixprec__bf16_to_f32(h);
    }
    default:
      ((float *)data)[i] = v;
      return v;
  }
}

void mixprec__unscale_tail(void *data, mixprec_dtype dtype, int64_t begin,
                           int64_t n, float inv_scale, int *nonfinite,
                           double *lanes) {
  for (int64_t i = begin; i < n; i++) {
    float v = store_f32(data, dtype, i, load_f32(data, dtype, i, nonfinite) * inv_scale);
    if (lanes) lanes[i % MIXPREC__NORM_LANES] += (double)v * (double)v;
  }
}

void mixprec__unscale_chunk_scalar(void *data, mixprec_dtype dtype, int64_t n,
                                   float inv_scale, int *nonfinite,
                                   double *norm) {
  double lanes[MIXPREC__NORM_LANES] = {0};
  mixprec__unscale_tail(data, dtype, 0, n, inv_scale, nonfinite,
                        norm ? lanes : NULL);
  if (norm) *norm = mixprec__sum_lanes(lanes);
}

static mixprec__unscale_chunk_fn chunk_kernel(void) {
  switch (mixprec__active_isa()) {
#if defined(MIXPREC_X86)
    case MIXPREC_ISA_AVX512:
      return mixprec__unscale_chunk_avx512;
    case MIXPREC_ISA_AVX2:
      return mixprec__unscale_chunk_avx2;
#endif
    default:
      return mixprec__unscale_chunk_scalar;
  }
}

/* Index of the tensor owning global chunk c: the last t with first[t] <= c.
 * Tensors with no chunk (numel 0) share their successor's first index and
 * are skipped by taking the last match. */
static int64_t owner_of(const int64_t *first, int64_t n_tensors, int64_t c) {
  int64_t lo = 0, hi = n_tensors - 1;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo + 1) / 2;
    if (first[mid] <= c) lo = mid; else hi = mid - 1;
  }
  return lo;
}

mixprec_status mixprec_unscale(const mixprec_tensor *tensors, int64_t n_tensors,
                               const float *inv_scale, float *found_inf,
                               float *norm_sq, float *total_norm_sq) {
  if (n_tensors < 0) return MIXPREC_ERR_BAD_SIZE;
  if ((n_tensors > 0 && !tensors) || !inv_scale || !found_inf)
    return MIXPREC_ERR_NULL_POINTER;
  for (int64_t t = 0; t < n_tensors; t++) {
    if (tensors[t].numel < 0) return MIXPREC_ERR_BAD_SIZE;
    if (mixprec_dtype_size(tensors[t].dtype) == 0) return MIXPREC_ERR_BAD_DTYPE;
    if (tensors[t].numel > 0 && !tensors[t].data) return MIXPREC_ERR_NULL_POINTER;
  }
  const int want_norm = norm_sq != NULL || total_norm_sq != NULL;

  /* first[t] = index of tensor t's first chunk; first[n] = chunk count. */
  int64_t *first = (int64_t *)malloc(sizeof(int64_t) * (size_t)(n_tensors + 1));
  if (!first) return MIXPREC_ERR_OUT_OF_MEMORY;
  int64_t n_chunks = 0, total = 0;
  for (int64_t t = 0; t < n_tensors; t++) {
    first[t] = n_chunks;
    n_chunks += (tensors[t].numel + CHUNK - 1) / CHUNK;
    total += tensors[t].numel;
  }
  first[n_tensors] = n_chunks;
  double *partial = NULL;
  if (want_norm && n_chunks > 0) {
    partial = (double *)malloc(sizeof(double) * (size_t)n_chunks);
    if (!partial) {
      free(first);
      return MIXPREC_ERR_OUT_OF_MEMORY;
    }
  }

  const float s = *inv_scale;
  const mixprec__unscale_chunk_fn kernel = chunk_kernel();
  int any_nonfinite = 0;
  int n_threads = mixprec__num_threads();
  (void)n_threads;
#pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads) \
    if (total >= PARALLEL_MIN && n_chunks > 1) reduction(| : any_nonfinite)
  for (int64_t c = 0; c < n_chunks; c++) {
    int64_t t = owner_of(first, n_tensors, c);
    int64_t begin = (c - first[t]) * CHUNK;
    int64_t len = tensors[t].numel - begin < CHUNK ? tensors[t].numel - begin : CHUNK;
    char *base = (char *)tensors[t].data + begin * mixprec_dtype_size(tensors[t].dtype);
    int nonfinite = 0;
    kernel(base, tensors[t].dtype, len, s, &nonfinite, partial ? &partial[c] : NULL);
    any_nonfinite |= nonfinite;
  }

  if (any_nonfinite) *found_inf = 1.0f;
  if (want_norm) {
    double sum_all = 0.0;
    for (int64_t t = 0; t < n_tensors; t++) {
      double sum = 0.0;
      for (int64_t c = first[t]; c < first[t + 1]; c++) sum += partial[c];
      if (norm_sq) norm_sq[t] = (float)sum;
      sum_all += sum;
    }
    if (total_norm_sq) *total_norm_sq = (float)sum_all;
  }
  free(partial);
  free(first);
  return MIXPREC_OK;
}
