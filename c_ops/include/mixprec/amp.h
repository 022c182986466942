/* mixprec C API: loss scaling (the amp family). Included by mixprec/mixprec.h.
 *
 * The fused multi-tensor unscale + non-finite check (with the gradient norm
 * from the same pass), its read-only twin for clipping folded into the
 * optimizer step, and the dynamic loss-scale update of torch.amp.GradScaler,
 * each on the CPU and (libmixprec_cuda) on the GPU. The worked example in
 * mixprec/mixprec.h unscales a list of gradients.
 */
#ifndef MIXPREC_AMP_H
#define MIXPREC_AMP_H

#include "mixprec/mixprec.h"

#ifdef __cplusplus
extern "C" {
#endif

/*! mixprec_unscale() :
 *  Fused multi-tensor unscale and non-finite check, in place; the equivalent
 *  of torch._amp_foreach_non_finite_check_and_unscale_, plus an optional
 *  gradient norm from the same pass.
 *  For every element v of every tensor: the value is widened to float; if it
 *  is inf or NaN, *found_inf is set to 1.0f; the element is replaced by
 *  (float)v * (*inv_scale) rounded back to its dtype.
 *  *found_inf is only ever set to 1.0f, never cleared: zero it first (a value
 *  already nonzero stays).
 *  If norms is not NULL, norms[i] receives the L2 norm of tensor i's
 *  unscaled elements as stored (after rounding); if total_norm is not NULL it
 *  receives the L2 norm of all of them together (what
 *  torch.nn.utils.clip_grad_norm_ computes). Squares are summed in float in
 *  blocks of 8 per lane and in double across blocks (a block whose float sum
 *  overflows is summed in double), the square root is taken in double and
 *  rounded to float: a finite gradient gives a finite norm. Both are inf/NaN
 *  when a gradient element is. The sums follow one fixed order: they do not
 *  depend on the number of threads or the instruction set.
 *  Tensors may have different dtypes; they must not overlap one another.
 *  @param tensors   : array of n_tensors descriptors (n_tensors >= 0).
 *  @param inv_scale : pointer to one float, the reciprocal of the loss scale.
 *  @param found_inf : pointer to one float flag (see above).
 *  @return : MIXPREC_OK; MIXPREC_ERR_NULL_POINTER if tensors (with
 *            n_tensors > 0), inv_scale, found_inf, or the data of a tensor with
 *            numel > 0 is NULL; MIXPREC_ERR_BAD_SIZE for negative counts;
 *            MIXPREC_ERR_BAD_DTYPE for an unknown dtype;
 *            MIXPREC_ERR_OUT_OF_MEMORY if scratch space could not be had.
 *            Nothing is written unless the status is MIXPREC_OK. */
MIXPREC_API mixprec_status mixprec_unscale(const mixprec_tensor *tensors,
                                           int64_t n_tensors,
                                           const float *inv_scale,
                                           float *found_inf, float *norms,
                                           float *total_norm);

/*! mixprec_grad_norm() :
 *  The read-only twin of mixprec_unscale(): sets *found_inf and computes
 *  norms / total_norm exactly as mixprec_unscale() would (bit for bit: the
 *  norms of the unscaled values rounded to each tensor's dtype, same order),
 *  but leaves the tensors as they are. For clipping folded into the
 *  optimizer step: the step divides the (still scaled) grads by
 *  scale / clip_coef, so the grads are read twice and written never.
 *  Arguments and statuses as mixprec_unscale(), except that the tensors,
 *  only read, may overlap one another and inv_scale (the same gradient
 *  twice, as torch._foreach_norm takes it); found_inf must overlap none. */
MIXPREC_API mixprec_status mixprec_grad_norm(const mixprec_tensor *tensors,
                                             int64_t n_tensors,
                                             const float *inv_scale,
                                             float *found_inf, float *norms,
                                             float *total_norm);

/* Parameters of the dynamic loss-scale update. With hysteresis = 1,
 * min_scale = 0 and max_scale = inf it is exactly torch's
 * _amp_update_scale_. */
typedef struct mixprec_update_scale_params {
  /* Factors are double because torch multiplies the float scale by a double
   * factor and rounds the product to float; doing the same keeps factors such
   * as 0.9 bit-compatible. */
  double growth_factor;    /* > 1 in practice; torch: 2.0 */
  double backoff_factor;   /* in (0, 1) in practice; torch: 0.5 */
  int64_t growth_interval; /* >= 1; torch: 2000 */
  int64_t hysteresis;      /* in [1, INT32_MAX] (the tracker is int32): back
                              off only after this many overflowing steps
                              without a clean step between them */
  float min_scale;         /* backoff never goes below this (0: no bound) */
  float max_scale;         /* growth never goes above this (inf: no bound) */
} mixprec_update_scale_params;

/*! mixprec_update_scale_params_default() :
 *  @return : torch's defaults: growth 2.0, backoff 0.5, interval 2000,
 *            hysteresis 1, min_scale 0, max_scale inf. */
MIXPREC_API mixprec_update_scale_params mixprec_update_scale_params_default(void);

/* The names of the two above in mixprec 0.1.0 (mixprec_scale_update_*), kept
 * so that code and binaries written against it still build and link. */
typedef mixprec_update_scale_params mixprec_scale_update_params;
MIXPREC_API mixprec_update_scale_params mixprec_scale_update_params_default(void);

/*! mixprec_update_scale() :
 *  One dynamic loss-scale update, in place, from the step's found_inf (any
 *  nonzero value, NaN included, counts as an overflow):
 *    overflow: growth_tracker = 0; hysteresis_tracker -= 1 (not below 0);
 *      if it is now 0, scale = max(scale * backoff_factor, min_scale).
 *    clean step: hysteresis_tracker = hysteresis; growth_tracker += 1; when
 *      it equals growth_interval, growth_tracker = 0 and, if
 *      scale * growth_factor is finite, scale = min(that, max_scale). (As in
 *      torch, a tracker already above the interval never triggers growth.)
 *    skipped_steps (if not NULL) counts overflowing steps (saturating at
 *      INT64_MAX).
 *  hysteresis_tracker may be NULL only when hysteresis == 1.
 *  @return : MIXPREC_ERR_NULL_POINTER, MIXPREC_ERR_BAD_ARGUMENT for
 *            growth_interval or hysteresis outside [1, INT32_MAX] (never
 *            truncated), factors that are not finite
 *            and positive, min_scale < 0 or min_scale > max_scale. */
MIXPREC_API mixprec_status mixprec_update_scale(
    float *scale, int32_t *growth_tracker, int32_t *hysteresis_tracker,
    int64_t *skipped_steps, const float *found_inf,
    const mixprec_update_scale_params *params);

/* ---- CUDA (libmixprec_cuda) ---------------------------------------------- */

/*! mixprec_cuda_unscale_workspace_size() :
 *  @return : bytes of device scratch mixprec_cuda_unscale() needs for this
 *            list when it computes norms (0 when norms and total_norm
 *            will both be NULL: pass want_norm = 0). Host-only, no CUDA call.
 *            Returns -1 for an invalid list (see mixprec_unscale). */
MIXPREC_API int64_t mixprec_cuda_unscale_workspace_size(
    const mixprec_tensor *tensors, int64_t n_tensors, int want_norm);

/*! mixprec_cuda_unscale() :
 *  As mixprec_unscale(); `tensors` is a host array of device pointers;
 *  inv_scale, found_inf, norms (n_tensors floats) and total_norm are
 *  device pointers. CUDA: written to match the CPU (the unscaled values bit
 *  for bit, the same element rule; the norms within float rounding, their
 *  summation order differs); not yet run on a GPU. All tensors and outputs must be on the current device.
 *  `workspace` is device scratch of at least
 *  mixprec_cuda_unscale_workspace_size() bytes (may be NULL when that is 0);
 *  it lets the norms be summed in a fixed order (no atomics: deterministic).
 *  Enqueued on `stream` (a cudaStream_t); no host synchronisation; capturable
 *  in a CUDA graph. Long lists take several launches, all on `stream`. */
MIXPREC_API mixprec_status mixprec_cuda_unscale(const mixprec_tensor *tensors,
                                                int64_t n_tensors,
                                                const float *inv_scale,
                                                float *found_inf,
                                                float *norms,
                                                float *total_norm,
                                                void *workspace,
                                                int64_t workspace_bytes,
                                                void *stream);

/*! mixprec_cuda_grad_norm() :
 *  The read-only twin of mixprec_cuda_unscale() (see mixprec_grad_norm()):
 *  same arguments, workspace size and norms (written to equal
 *  mixprec_cuda_unscale's bit for bit: the same kernel without its stores),
 *  the tensors are not written. */
MIXPREC_API mixprec_status mixprec_cuda_grad_norm(const mixprec_tensor *tensors,
                                                  int64_t n_tensors,
                                                  const float *inv_scale,
                                                  float *found_inf,
                                                  float *norms,
                                                  float *total_norm,
                                                  void *workspace,
                                                  int64_t workspace_bytes,
                                                  void *stream);

/*! mixprec_cuda_update_scale() :
 *  As mixprec_update_scale(), on device pointers, enqueued on `stream`
 *  (params stays a host pointer). CUDA: written to match the CPU bit for
 *  bit (the same mixprec__update_scale_step); not yet run on a GPU. */
MIXPREC_API mixprec_status mixprec_cuda_update_scale(
    float *scale, int32_t *growth_tracker, int32_t *hysteresis_tracker,
    int64_t *skipped_steps, const float *found_inf,
    const mixprec_update_scale_params *params, void *stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MIXPREC_AMP_H */
