/* The one step driver of the fused CPU optimizers (adamw.c, sgd.c) and the
 * per-element pieces their scalar loops share. Internal; every name starts
 * with mixprec__. */
#ifndef MIXPREC_OPTIM_DRIVER_H
#define MIXPREC_OPTIM_DRIVER_H

#include "optim_common.h"

/* What the driver needs of one optimizer (a constant table per optimizer,
 * zstd-style: the driver is inlined into each entry point).
 *   scalars_size: bytes of one tensor's per-step scalars; the struct's first
 *                 member is the tensor's float count after the step.
 *   prepare:      fills the optimizer's per-step state `run` (its constants,
 *                 body kernel and lean kernels) from its params p, once the
 *                 step's element count `total` is known.
 *   scalars:      fills tensor i's scalars sc from p and run.
 *   chunk:        updates elements [begin, end) of tensor t with its scalars. */
typedef struct mixprec__opt_traits {
  size_t scalars_size;
  void (*prepare)(const void *p, const mixprec_opt_tensor *list, int64_t n, int64_t total,
                  void *run);
  void (*scalars)(const void *p, const void *run, const mixprec_opt_tensor *list, int64_t i,
                  void *sc);
  void (*chunk)(const mixprec_opt_tensor *t, int64_t begin, int64_t end, const void *sc,
                const void *run);
} mixprec__opt_traits;

/* One fused step of list[0, n) after its checks passed: nothing when
 * found_inf says skip or n is 0; else every tensor's scalars (every count
 * read before any is written: tensors may share one), the flattened chunk
 * list on OpenMP threads (results independent of the thread count), then
 * each non-NULL count set to its new value. `run` is the caller's storage
 * for tr->prepare.
 * @return : MIXPREC_OK, or MIXPREC_ERR_OUT_OF_MEMORY (nothing written). */
MIXPREC__FORCE_INLINE mixprec_status mixprec__opt_step_drive(const mixprec__opt_traits *tr,
                                                            const mixprec_opt_tensor *list,
                                                            int64_t n, const void *p,
                                                            const float *found_inf, void *run) {
  if (mixprec__opt_skip(found_inf) || n == 0) return MIXPREC_OK;
  char *sc = (char *)malloc(tr->scalars_size * (size_t)n);
  if (!sc) return MIXPREC_ERR_OUT_OF_MEMORY;
  int64_t n_chunks, total;
  int64_t *first = mixprec__opt_chunks(list, n, &n_chunks, &total);
  if (!first) {
    free(sc);
    return MIXPREC_ERR_OUT_OF_MEMORY;
  }
  tr->prepare(p, list, n, total, run);
  for (int64_t i = 0; i < n; i++) tr->scalars(p, run, list, i, sc + tr->scalars_size * (size_t)i);

  int n_threads = mixprec__num_threads();
  (void)n_threads;
#pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads) \
    if (total >= MIXPREC__OPT_PARALLEL_MIN && n_chunks > 1)
  for (int64_t c = 0; c < n_chunks; c++) {
    int64_t begin, end;
    const int64_t t = mixprec__opt_chunk_range(list, first, n, c, &begin, &end);
    tr->chunk(&list[t], begin, end, sc + tr->scalars_size * (size_t)t, run);
  }

  for (int64_t i = 0; i < n; i++)
    if (list[i].step) *list[i].step = *(const float *)(const void *)(sc + tr->scalars_size * (size_t)i);
  free(first);
  free(sc);
  return MIXPREC_OK;
}

/* The step's learning rate: torch reads the lr tensor as a double
 * (lr.item<double>()). */
MIXPREC__FORCE_INLINE double mixprec__opt_lr(const float *lr_tensor, double lr) {
  return lr_tensor ? (double)*lr_tensor : lr;
}

/* Sets the grad fields both optimizers' constants have (has_scale, scale,
 * unscale, stream: mixprec__adamw_consts) from params p and the step's
 * element count. [note: a macro] the two constants structs differ in their
 * hyper-parameters only, and optim_common.h keeps them apart for the
 * vector bodies. */
#define MIXPREC__OPT_GRAD_CONSTS(k, p, total)                       \
  do {                                                              \
    (k)->has_scale = (p)->grad_scale != NULL;                       \
    (k)->scale = (p)->grad_scale ? *(p)->grad_scale : 1.0f;         \
    (k)->unscale = (p)->grad_scale != NULL && (p)->unscale_grads != 0; \
    (k)->stream = (total) >= MIXPREC__OPT_STREAM_MIN;               \
  } while (0)

/* Sets the fields both optimizers' params have to their defaults (lr 1e-3,
 * no maximize, no lr / scale / found_inf tensors, seed 0, grads read only,
 * no EMA). */
#define MIXPREC__OPT_PARAMS_DEFAULT(p)          \
  do {                                          \
    (p)->lr = 1e-3;                             \
    (p)->maximize = 0;                          \
    (p)->lr_tensor = NULL;                      \
    (p)->grad_scale = NULL;                     \
    (p)->found_inf = NULL;                      \
    (p)->sr_seed = 0;                           \
    (p)->unscale_grads = 0;                     \
    (p)->ema = mixprec__ema_params_default();   \
  } while (0)

/* Grad element i as the update reads it: unscaled in FP32, written back
 * (rounded to the grad's dtype) when k->unscale, then negated for
 * maximize. k is either optimizer's constants. */
#define MIXPREC__OPT_GRAD_IN(t, i, k)                                                          \
  mixprec__opt_grad_in((t), (i), (k)->has_scale, (k)->scale, (k)->unscale, (k)->h.maximize)

MIXPREC__FORCE_INLINE float mixprec__opt_grad_in(const mixprec_opt_tensor *t, int64_t i,
                                                int has_scale, float scale, int unscale,
                                                int maximize) {
  float g = mixprec__opt_unscale(mixprec__load_f32(t->grad, t->grad_dtype, i), has_scale, scale);
  if (unscale) mixprec__opt_store_grad(t->grad, t->grad_dtype, i, g);
  return maximize ? -g : g;
}

/* The FP32 value of a plain (not lean) tensor's param element: the
 * master-free BF16 param widened, else the master or the F32 param P. */
MIXPREC__FORCE_INLINE float mixprec__opt_param_get(const mixprec_opt_tensor *t, const float *P,
                                                  int64_t i, int sr) {
  return sr ? mixprec__load_f32(t->param, MIXPREC_BF16, i) : P[i];
}

/* Stores a plain tensor's new FP32 param element p: stochastically rounded
 * (master-free BF16, key sr_key), else to P and, for a low-precision
 * param (half), rounded to nearest even into the param. */
MIXPREC__FORCE_INLINE void mixprec__opt_param_put(const mixprec_opt_tensor *t, float *P, int64_t i,
                                                 int sr, int half, uint32_t sr_key, float p) {
  if (sr) {
    mixprec__opt_store_bf16_sr(t->param, i, sr_key, p);
  } else {
    P[i] = p;
    if (half) mixprec__opt_store_half(t->param, t->param_dtype, i, p);
  }
}

/* The end of torch's vectorised body within [begin, end) of a tensor of
 * numel elements: [begin, mid) is body, [mid, end) tail. */
MIXPREC__FORCE_INLINE int64_t mixprec__opt_tail_split(int64_t numel, int64_t begin, int64_t end) {
  const int64_t tail = mixprec__opt_tail_start(numel);
  return end < tail ? end : (begin > tail ? begin : tail);
}

#endif /* MIXPREC_OPTIM_DRIVER_H */
