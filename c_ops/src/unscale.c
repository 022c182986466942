/* Fused multi-tensor unscale + non-finite check (+ optional L2 norm). */
#include <math.h>
#include <stdlib.h>

#include "internal.h"
#include "unscale_check.h"
#include "unscale_rules.h"

/* Work is cut into chunks of at most this many elements of one tensor. The
 * chunking depends only on the list, never on the thread count, so the norm
 * partial sums (one per chunk, added in chunk order) are reproducible. */
#define CHUNK ((int64_t)1 << 16)
/* Below this many elements in all, a parallel region costs more than it saves. */
#define PARALLEL_MIN ((int64_t)1 << 17)

/* Stores v rounded to dtype and returns the stored value widened back. */
MIXPREC__FORCE_INLINE float store_f32(void *data, mixprec_dtype dtype, int64_t i, float v) {
  mixprec__store_f32(data, dtype, i, v);
  return mixprec__load_f32(data, dtype, i);
}

void mixprec__norm_flush(mixprec__norm_acc *acc, const void *data,
                         mixprec_dtype dtype, int64_t begin, int64_t end) {
  for (int l = 0; l < MIXPREC__NORM_LANES; l++) {
    float f = acc->f[l];
    if (mixprec__f32_bits_nonfinite(mixprec__f32_bits(f))) {
      /* The float sum overflowed (or a value is inf/NaN): redo it in double. */
      double d = 0.0;
      for (int64_t i = begin + l; i < end; i += MIXPREC__NORM_LANES) {
        double v = (double)mixprec__load_f32(data, dtype, i);
        d += v * v;
      }
      acc->d[l] += d;
    } else {
      acc->d[l] += (double)f;
    }
    acc->f[l] = 0.0f;
  }
}

void mixprec__norm_flush_scaled(mixprec__norm_acc *acc, const void *data,
                                mixprec_dtype dtype, int64_t begin, int64_t end,
                                float inv_scale) {
  for (int l = 0; l < MIXPREC__NORM_LANES; l++) {
    float f = acc->f[l];
    if (mixprec__f32_bits_nonfinite(mixprec__f32_bits(f))) {
      double d = 0.0;
      int seen = 0; /* the pass itself has set the flag already */
      for (int64_t i = begin + l; i < end; i += MIXPREC__NORM_LANES) {
        const float u = mixprec__unscale_elem(mixprec__load_f32(data, dtype, i), inv_scale, &seen);
        double v = (double)mixprec__round_to(dtype, u);
        d += v * v;
      }
      acc->d[l] += d;
    } else {
      acc->d[l] += (double)f;
    }
    acc->f[l] = 0.0f;
  }
}

void mixprec__norm_tail(const void *data, mixprec_dtype dtype, int64_t begin,
                        int64_t n, float inv_scale, int *nonfinite,
                        mixprec__norm_acc *acc) {
  for (int64_t i = begin; i < n; i++) {
    float v = mixprec__round_to(dtype,
                        mixprec__unscale_elem(mixprec__load_f32(data, dtype, i), inv_scale, nonfinite));
    float sq = v * v;
    acc->f[i % MIXPREC__NORM_LANES] += sq;
    if (i % MIXPREC__NORM_BLOCK == MIXPREC__NORM_BLOCK - 1)
      mixprec__norm_flush_scaled(acc, data, dtype, i + 1 - MIXPREC__NORM_BLOCK, i + 1, inv_scale);
  }
  if (n % MIXPREC__NORM_BLOCK != 0)
    mixprec__norm_flush_scaled(acc, data, dtype, n - n % MIXPREC__NORM_BLOCK, n, inv_scale);
}

void mixprec__norm_chunk_scalar(const void *data, mixprec_dtype dtype, int64_t n,
                                float inv_scale, int *nonfinite, double *norm) {
  mixprec__norm_acc acc = {{0}, {0}};
  mixprec__norm_tail(data, dtype, 0, n, inv_scale, nonfinite, &acc);
  *norm = mixprec__sum_lanes(&acc);
}

void mixprec__unscale_tail(void *data, mixprec_dtype dtype, int64_t begin,
                           int64_t n, float inv_scale, int *nonfinite,
                           mixprec__norm_acc *acc) {
  for (int64_t i = begin; i < n; i++) {
    float v = store_f32(data, dtype, i,
                        mixprec__unscale_elem(mixprec__load_f32(data, dtype, i), inv_scale, nonfinite));
    if (acc) {
      float sq = v * v;
      acc->f[i % MIXPREC__NORM_LANES] += sq;
      if (i % MIXPREC__NORM_BLOCK == MIXPREC__NORM_BLOCK - 1)
        mixprec__norm_flush(acc, data, dtype, i + 1 - MIXPREC__NORM_BLOCK, i + 1);
    }
  }
  if (acc && n % MIXPREC__NORM_BLOCK != 0)
    mixprec__norm_flush(acc, data, dtype, n - n % MIXPREC__NORM_BLOCK, n);
}

void mixprec__unscale_chunk_scalar(void *data, mixprec_dtype dtype, int64_t n,
                                   float inv_scale, int *nonfinite,
                                   double *norm) {
  mixprec__norm_acc acc = {{0}, {0}};
  mixprec__unscale_tail(data, dtype, 0, n, inv_scale, nonfinite, norm ? &acc : NULL);
  if (norm) *norm = mixprec__sum_lanes(&acc);
}

static mixprec__unscale_chunk_fn chunk_kernel(float inv_scale) {
  /* The vector paths round to BF16 without a NaN test, which is exact unless
   * the scale itself is a NaN carrying payload bits (see unscale_avx2.c). */
  if (inv_scale != inv_scale) return mixprec__unscale_chunk_scalar;
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

/* The read-only kernel of the active ISA (AVX-512 CPUs take the AVX2 one). */
static mixprec__norm_chunk_fn norm_kernel(float inv_scale) {
  if (inv_scale != inv_scale) return mixprec__norm_chunk_scalar;
  switch (mixprec__active_isa()) {
#if defined(MIXPREC_X86)
    case MIXPREC_ISA_AVX512:
    case MIXPREC_ISA_AVX2:
      return mixprec__norm_chunk_avx2;
#endif
    default:
      return mixprec__norm_chunk_scalar;
  }
}

static mixprec_status run(const mixprec_tensor *tensors, int64_t n_tensors,
                          const float *inv_scale, float *found_inf, float *norms,
                          float *total_norm, int write);

mixprec_status mixprec_unscale(const mixprec_tensor *tensors, int64_t n_tensors,
                               const float *inv_scale, float *found_inf,
                               float *norms, float *total_norm) {
  return run(tensors, n_tensors, inv_scale, found_inf, norms, total_norm, 1);
}

mixprec_status mixprec_grad_norm(const mixprec_tensor *tensors, int64_t n_tensors,
                                 const float *inv_scale, float *found_inf,
                                 float *norms, float *total_norm) {
  return run(tensors, n_tensors, inv_scale, found_inf, norms, total_norm, 0);
}

/* write: unscale in place (mixprec_unscale); else only read (the norms are
 * then always computed, into scratch if the caller wants neither). */
static mixprec_status run(const mixprec_tensor *tensors, int64_t n_tensors,
                          const float *inv_scale, float *found_inf, float *norms,
                          float *total_norm, int write) {
  const mixprec_status st = mixprec__unscale_check(tensors, n_tensors, inv_scale, found_inf);
  if (st != MIXPREC_OK) return st;
  const int want_norm = !write || norms != NULL || total_norm != NULL;

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
  const mixprec__unscale_chunk_fn kernel = chunk_kernel(s);
  const mixprec__norm_chunk_fn read_kernel = norm_kernel(s);
  int any_nonfinite = 0;
  int n_threads = mixprec__num_threads();
  (void)n_threads;
#pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads) \
    if (total >= PARALLEL_MIN && n_chunks > 1) reduction(| : any_nonfinite)
  for (int64_t c = 0; c < n_chunks; c++) {
    int64_t t = mixprec__chunk_owner(first, n_tensors, c);
    int64_t begin = (c - first[t]) * CHUNK;
    int64_t len = tensors[t].numel - begin < CHUNK ? tensors[t].numel - begin : CHUNK;
    char *base = (char *)tensors[t].data + begin * mixprec_dtype_size(tensors[t].dtype);
    int nonfinite = 0;
    if (write)
      kernel(base, tensors[t].dtype, len, s, &nonfinite, partial ? &partial[c] : NULL);
    else
      read_kernel(base, tensors[t].dtype, len, s, &nonfinite, &partial[c]);
    any_nonfinite |= nonfinite;
  }

  if (any_nonfinite) *found_inf = 1.0f;
  if (want_norm) {
    double sum_all = 0.0;
    for (int64_t t = 0; t < n_tensors; t++) {
      double sum = 0.0;
      for (int64_t c = first[t]; c < first[t + 1]; c++) sum += partial[c];
      if (norms) norms[t] = (float)sqrt(sum);
      sum_all += sum;
    }
    if (total_norm) *total_norm = (float)sqrt(sum_all);
  }
  free(partial);
  free(first);
  return MIXPREC_OK;
}
