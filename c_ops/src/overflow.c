/* The forward-overflow check: flags and largest finite magnitude of a
 * module's outputs, the inputs read only when an output is not finite. */
#include "internal.h"

#include "overflow_internal.h"

/* The portable scan of one dtype D (a constant once dispatched); also the
 * AVX2 path's tail. Two running maxima: of the finite magnitudes, and of all
 * of them (>= +inf: a non-finite element). */
MIXPREC__FORCE_INLINE void scan_body(const void *data, mixprec_dtype D, int64_t n,
                                     uint32_t *max_bits, int *nonfinite) {
  const uint32_t mask = mixprec__overflow_abs_mask(D);
  const uint32_t inf = mixprec__overflow_inf_bits(D);
  uint32_t m = 0, all = 0;
  for (int64_t i = 0; i < n; i++) {
    const uint32_t a = (D == MIXPREC_F32 ? ((const uint32_t *)data)[i]
                                         : (uint32_t)((const uint16_t *)data)[i]) & mask;
    m = a < inf && a > m ? a : m;
    all = a > all ? a : all;
  }
  if (m > *max_bits) *max_bits = m;
  if (all >= inf) *nonfinite = 1;
}

void mixprec__overflow_scan_scalar(const void *data, mixprec_dtype dtype, int64_t n,
                                   uint32_t *max_bits, int *nonfinite) {
  MIXPREC__DISPATCH(dtype, D, scan_body(data, D, n, max_bits, nonfinite));
}

/* Fixed chunks of one tensor each, as in unscale.c: the chunking depends
 * only on the list. (The result is a max and an or, so it would not depend
 * on the order anyway.) */
#define CHUNK ((int64_t)1 << 16)
/* Below this many elements a parallel region costs more than the scan. */
#define PARALLEL_MIN ((int64_t)1 << 18)

typedef void (*scan_fn)(const void *, mixprec_dtype, int64_t, uint32_t *, int *);

static scan_fn scan_kernel(void) {
#if defined(MIXPREC_X86)
  const mixprec_cpu_isa isa = mixprec__active_isa();
  if (isa == MIXPREC_ISA_AVX2 || isa == MIXPREC_ISA_AVX512) return mixprec__overflow_scan_avx2;
#endif
  return mixprec__overflow_scan_scalar;
}

/* The largest finite magnitude (as a float) and the non-finite flag of a
 * list. Parallel over chunks when the list is large. */
static void scan_list(const mixprec_tensor *t, int64_t n, float *amax, int *nonfinite) {
  const scan_fn scan = scan_kernel();
  int64_t total = 0, n_chunks = 0;
  for (int64_t i = 0; i < n; i++) {
    total += t[i].numel;
    n_chunks += (t[i].numel + CHUNK - 1) / CHUNK;
  }
  float best = 0.0f;
  int bad = 0;
  if (total < PARALLEL_MIN) {
    for (int64_t i = 0; i < n; i++) {
      uint32_t bits = 0;
      if (t[i].numel > 0) scan(t[i].data, t[i].dtype, t[i].numel, &bits, &bad);
      const float v = mixprec__value_of_bits(t[i].dtype, bits);
      if (v > best) best = v;
    }
  } else {
    const int n_threads = mixprec__num_threads();
    (void)n_threads;
    /* Tensor i's chunks are c in [first(i), first(i+1)); a linear walk is
     * enough for module outputs (a handful of tensors). */
#pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads) \
    reduction(max : best) reduction(| : bad)
    for (int64_t c = 0; c < n_chunks; c++) {
      int64_t i = 0, base = 0;
      while (c >= base + (t[i].numel + CHUNK - 1) / CHUNK) base += (t[i++].numel + CHUNK - 1) / CHUNK;
      const int64_t begin = (c - base) * CHUNK;
      const int64_t len = t[i].numel - begin < CHUNK ? t[i].numel - begin : CHUNK;
      uint32_t bits = 0;
      int chunk_bad = 0;
      scan((const char *)t[i].data + begin * mixprec_dtype_size(t[i].dtype), t[i].dtype, len,
           &bits, &chunk_bad);
      const float v = mixprec__value_of_bits(t[i].dtype, bits);
      if (v > best) best = v;
      bad |= chunk_bad;
    }
  }
  *amax = best;
  *nonfinite = bad;
}

mixprec_status mixprec_overflow_check(const mixprec_tensor *outputs, int64_t n_outputs,
                                      const mixprec_tensor *inputs, int64_t n_inputs,
                                      float *record, int64_t n_slots, int64_t slot) {
  const mixprec_status st =
      mixprec__overflow_check_args(outputs, n_outputs, inputs, n_inputs, record, n_slots, slot);
  if (st != MIXPREC_OK) return st;
  float amax = 0.0f, unused = 0.0f;
  int out_bad = 0, in_bad = 0;
  scan_list(outputs, n_outputs, &amax, &out_bad);
  if (out_bad) scan_list(inputs, n_inputs, &unused, &in_bad);
  float *r = record + slot * MIXPREC_OVERFLOW_SLOT;
  if (amax > r[MIXPREC_OVERFLOW_AMAX]) r[MIXPREC_OVERFLOW_AMAX] = amax;
  if (out_bad) {
    r[MIXPREC_OVERFLOW_NONFINITE] = 1.0f;
    r[in_bad ? MIXPREC_OVERFLOW_INPUT_NONFINITE : MIXPREC_OVERFLOW_FROM_FINITE] = 1.0f;
  }
  return MIXPREC_OK;
}
