/* Shared by softmax.c, cross_entropy.c and softmax_avx2.c: the slicing of an
 * (outer, n, inner) array, the work hand-out, and the slice kernels.
 *
 * Work is cut into slices: a slice is `width` (<= MIXPREC__SM_WIDTH)
 * neighbouring columns of one outer index, each column holding n values
 * `stride` elements apart (stride = inner). A row (inner == 1) is one
 * column of stride 1. One thread computes a whole slice, so results do not
 * depend on the thread count. Internal; every name starts with mixprec__. */
#ifndef MIXPREC_SOFTMAX_INTERNAL_H
#define MIXPREC_SOFTMAX_INTERNAL_H

#include "internal.h"

/* Columns per slice in the strided case: 32 FP16/BF16 values are one 64-byte
 * cache line, and four AVX2 vectors of floats. */
#define MIXPREC__SM_WIDTH 32
/* Below this many elements in all, a parallel region costs more than it saves. */
#define MIXPREC__SM_PARALLEL_MIN ((int64_t)1 << 15)
/* Slices are handed out in chunks of about this many elements, first come
 * first served: on a shared machine a thread that loses its core does not
 * hold the others up at the end (a slice is always computed whole by one
 * thread, so results do not depend on who takes it). */
#define MIXPREC__SM_CHUNK_ELEMS ((int64_t)1 << 15)

/* Nonzero when the AVX2 slice kernels are to be used (AVX-512 CPUs, where
 * chosen, run them too). */
MIXPREC__FORCE_INLINE int mixprec__sm_use_avx2(void) {
#if defined(MIXPREC_X86)
  return mixprec__active_isa() != MIXPREC_ISA_SCALAR;
#else
  return 0;
#endif
}

/* Slices of the (outer, n, inner) array: rows when inner == 1, else blocks
 * of MIXPREC__SM_WIDTH columns. */
MIXPREC__FORCE_INLINE int64_t mixprec__sm_slice_count(int64_t outer, int64_t inner) {
  return inner == 1 ? outer : outer * ((inner + MIXPREC__SM_WIDTH - 1) / MIXPREC__SM_WIDTH);
}

/* Slices per hand-out for numel elements in `slices` slices. */
MIXPREC__FORCE_INLINE int mixprec__sm_chunk_slices(int64_t numel, int64_t slices) {
  const int64_t per = numel / (slices > 0 ? slices : 1);
  const int64_t c = MIXPREC__SM_CHUNK_ELEMS / (per > 0 ? per : 1);
  return c < 1 ? 1 : c > 4096 ? 4096 : (int)c;
}

/* Slice t: returns the element offset of its first value and sets *width;
 * *pos (when not NULL) receives its first position, i.e. its first column
 * counted over (outer, inner). */
MIXPREC__FORCE_INLINE int64_t mixprec__sm_slice_at(int64_t t, int64_t n, int64_t inner,
                                             int64_t *width, int64_t *pos) {
  if (inner == 1) {
    *width = 1;
    if (pos) *pos = t;
    return t * n;
  }
  const int64_t blocks = (inner + MIXPREC__SM_WIDTH - 1) / MIXPREC__SM_WIDTH;
  const int64_t o = t / blocks, col = (t % blocks) * MIXPREC__SM_WIDTH;
  *width = inner - col < MIXPREC__SM_WIDTH ? inner - col : MIXPREC__SM_WIDTH;
  if (pos) *pos = o * inner + col;
  return o * n * inner + col;
}

/* How the slices of one call are run: how many, on how many threads, in
 * hand-outs of how many. numel: the elements the call reads. */
typedef struct mixprec__sm_plan {
  int64_t slices;
  int n_threads;
  int chunk;
} mixprec__sm_plan;

MIXPREC__FORCE_INLINE mixprec__sm_plan mixprec__sm_plan_of(int64_t outer, int64_t inner, int64_t numel) {
  mixprec__sm_plan p;
  p.slices = mixprec__sm_slice_count(outer, inner); /* 0 when outer * inner is */
  p.n_threads = numel < MIXPREC__SM_PARALLEL_MIN ? 1 : mixprec__num_threads();
  p.chunk = mixprec__sm_chunk_slices(numel, p.slices);
  return p;
}

/* ---- The slice kernels (scalar: softmax.c, cross_entropy.c; AVX2:
 * softmax_avx2.c, cross_entropy_avx2.c), declared once per ISA ----------
 *
 * softmax_fwd / softmax_bwd: forward / backward over one slice; scratch
 *   (AVX2 rows only) holds n floats.
 * ce_stats: per column j, mx[j] = max_c x_c, se[j] = sum_c exp(x_c - mx[j])
 *   and, if wx is not NULL, wx[j] = sum_c w_c * (x_c - mx[j]) (w_c = 1
 *   without weight).
 * ce_grad: per column j, dx_c = a[j] * exp((x_c - mx[j]) - lg[j]) - b[j] *
 *   w_c, minus bt[j] where c == tc[j] (the target; -1 for an ignored
 *   position).
 * ce_soft_stats: soft targets t (x's layout), t'_c = t_c * keep + add; per
 *   column j, mx[j], se[j] as above, tw[j] = sum_c w_c t'_c and twx[j] =
 *   sum_c w_c t'_c (x_c - mx[j]).
 * ce_soft_grad: per column j, with lp_c = (x_c - mx[j]) - lg[j]: dx_c = a[j]
 *   * exp(lp_c) - g[j] * w_c t'_c (when dx is not NULL) and dt_c = cdt[j] *
 *   w_c * lp_c in td (when dt is not NULL). [note: soft cross-entropy]. */
#define MIXPREC__SM_DECLARE_KERNELS(isa)                                                        \
  void mixprec__softmax_fwd_##isa(const void *x, mixprec_dtype xd, void *y, mixprec_dtype yd,  \
                                  int64_t n, int64_t stride, int64_t width, int log,           \
                                  float *scratch);                                             \
  void mixprec__softmax_bwd_##isa(const void *dy, const void *y, mixprec_dtype yd, void *dx,   \
                                  mixprec_dtype dxd, int64_t n, int64_t stride, int64_t width, \
                                  int log);                                                    \
  void mixprec__ce_stats_##isa(const void *x, mixprec_dtype xd, int64_t n, int64_t stride,     \
                               int64_t width, const float *weight, float *mx, float *se,       \
                               float *wx);                                                     \
  void mixprec__ce_grad_##isa(const void *x, mixprec_dtype xd, void *dx, int64_t n,            \
                              int64_t stride, int64_t width, const float *mx, const float *lg, \
                              const float *a, const float *b, const float *weight,             \
                              const int32_t *tc, const float *bt);                             \
  void mixprec__ce_soft_stats_##isa(const void *x, mixprec_dtype xd, const void *t,            \
                                    mixprec_dtype td, int64_t n, int64_t stride,               \
                                    int64_t width, const float *weight, float keep, float add, \
                                    float *mx, float *se, float *tw, float *twx);              \
  void mixprec__ce_soft_grad_##isa(const void *x, mixprec_dtype xd, const void *t,             \
                                   mixprec_dtype td, void *dx, void *dt, int64_t n,            \
                                   int64_t stride, int64_t width, const float *mx,             \
                                   const float *lg, const float *a, const float *g,            \
                                   const float *cdt, const float *weight, float keep,          \
                                   float add)

MIXPREC__SM_DECLARE_KERNELS(scalar);
#if defined(MIXPREC_X86)
MIXPREC__SM_DECLARE_KERNELS(avx2);
/* The kernel `name` (softmax_fwd, ce_stats, ...) of the ISA this CPU runs. */
#  define MIXPREC__SM_KERNEL(name) (mixprec__sm_use_avx2() ? mixprec__##name##_avx2 : mixprec__##name##_scalar)
#else
#  define MIXPREC__SM_KERNEL(name) mixprec__##name##_scalar
#endif

#endif /* MIXPREC_SOFTMAX_INTERNAL_H */
