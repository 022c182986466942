/* mixprec C API: cross-entropy (torch.nn.functional.cross_entropy) with
 * class-index and class-probability targets, forward and backward, on
 * FP32/FP16/BF16 logits read in their own dtype and accumulated in float (no
 * FP32 copy of the logits). Included by mixprec/mixprec.h. The logits'
 * layout (outer, classes, inner) is softmax.h's (outer, n, inner).
 *
 * Example: the mean loss of (N, C) BF16 logits and int64 targets.
 *
 *     mixprec_cross_entropy_params p = mixprec_cross_entropy_params_default();
 *     p.outer = N; p.classes = C; p.inner = 1;
 *     float loss, weight_sum, *stats = malloc(2 * N * sizeof(float));
 *     mixprec_status st = mixprec_cross_entropy(logits, MIXPREC_BF16, target,
 *                                               &p, &loss, stats, &weight_sum);
 */
#ifndef MIXPREC_CROSS_ENTROPY_H
#define MIXPREC_CROSS_ENTROPY_H

#include "mixprec/mixprec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Cross-entropy with class-index targets                                    */
/* ------------------------------------------------------------------------ */

typedef enum mixprec_reduction {
  MIXPREC_REDUCTION_NONE = 0,
  MIXPREC_REDUCTION_MEAN = 1,
  MIXPREC_REDUCTION_SUM = 2
} mixprec_reduction;

/* Arguments of torch.nn.functional.cross_entropy with class-index targets.
 * The logits are a contiguous (outer, classes, inner) array: (N, C) input ->
 * outer = N, inner = 1; (N, C, d1, ..., dk) -> outer = N, inner = d1*...*dk;
 * an unbatched (C) input -> outer = 1, inner = 1. The target is a contiguous
 * int64 array of outer * inner class indices ("positions"). */
typedef struct mixprec_cross_entropy_params {
  int64_t outer, classes, inner; /* 1 <= classes <= INT32_MAX when there is
                                    a position */
  int64_t ignore_index;          /* positions with this target count nothing */
  double label_smoothing;        /* in [0, 1] */
  mixprec_reduction reduction;
  const float *weight; /* NULL or `classes` float32 class weights */
} mixprec_cross_entropy_params;

/*! mixprec_cross_entropy_params_default() :
 *  @return : torch's defaults: ignore_index -100, label_smoothing 0,
 *            reduction MEAN, no weight, all sizes 0. */
MIXPREC_API mixprec_cross_entropy_params mixprec_cross_entropy_params_default(void);

/*! mixprec_cross_entropy() :
 *  The loss of torch.nn.functional.cross_entropy(x.float(), target, weight,
 *  ignore_index=..., reduction=..., label_smoothing=eps), computed from the
 *  logits in their own dtype. Per position i with target t (not ignored),
 *  with lse = max + log(sum_c exp(x_c - max)) and w_c = weight[c] (1 without
 *  weight):
 *    loss_i = (1 - eps) * w_t * (lse - x_t)
 *             + eps / C * sum_c w_c * (lse - x_c)
 *  and loss_i = 0 for an ignored position. Reduction NONE writes loss_i to
 *  loss[outer * inner]; SUM writes sum_i loss_i to loss[0]; MEAN writes
 *  sum_i loss_i / sum_i w_t(i) over non-ignored positions to loss[0] (torch's
 *  weighted mean: NaN, as torch's, when every position is ignored). Sums
 *  are taken in double in a fixed order and rounded to float once.
 *  stats (optional, 2 * outer * inner floats) receives, for position i,
 *  stats[i] = max_c x_c and stats[outer * inner + i] = log(sum_c exp(x_c -
 *  max)) (both 0 for an ignored position): everything
 *  mixprec_cross_entropy_backward() needs besides the inputs. (The two are
 *  kept apart, not added into one log-sum-exp, because max + log(sum) loses
 *  log(sum) entirely when |max| is huge, e.g. 1e30.)
 *  weight_sum (optional, one float) receives sum_i w_t(i) over non-ignored
 *  positions (the MEAN denominator).
 *  @return : MIXPREC_OK; MIXPREC_ERR_BAD_ARGUMENT when a target is neither
 *            ignore_index nor in [0, classes) (a clear error rather than a
 *            read out of bounds), or label_smoothing outside [0, 1], or an
 *            unknown reduction; MIXPREC_ERR_BAD_SIZE, _BAD_DTYPE,
 *            _NULL_POINTER as mixprec_softmax(). Targets are checked before
 *            anything is written: on an error nothing has been written. */
MIXPREC_API mixprec_status mixprec_cross_entropy(
    const void *logits, mixprec_dtype dtype, const int64_t *target,
    const mixprec_cross_entropy_params *p, float *loss, float *stats,
    float *weight_sum);

/*! mixprec_cross_entropy_backward() :
 *  Gradient of the loss with respect to the logits, written in the logits'
 *  dtype to grad_logits (contiguous (outer, classes, inner)). grad_loss is
 *  the gradient of the output: outer * inner floats for NONE, one float
 *  otherwise. stats is what mixprec_cross_entropy() wrote; weight_sum the MEAN
 *  denominator it wrote (ignored for NONE/SUM, may be NULL then). Per
 *  position with g = grad_loss (scaled by 1 / weight_sum for MEAN),
 *  p_c = exp((x_c - max) - log(sum)) (from stats), W = sum_c w_c:
 *    dx_c = g * ((1 - eps) * w_t * (p_c - [c == t])
 *                + eps / C * (W * p_c - w_c))
 *  and dx_c = 0 for an ignored position whose logits are finite (an inf or
 *  NaN logit there gives NaN, as torch's backward does).
 *  @return : as mixprec_cross_entropy() (targets are checked again). */
MIXPREC_API mixprec_status mixprec_cross_entropy_backward(
    const float *grad_loss, const void *logits, mixprec_dtype dtype,
    const int64_t *target, const mixprec_cross_entropy_params *p,
    const float *stats, const float *weight_sum, void *grad_logits);

/* ------------------------------------------------------------------------ */
/* Cross-entropy with class-probability (soft) targets                       */
/* ------------------------------------------------------------------------ */

/*! mixprec_cross_entropy_soft() :
 *  The loss of torch.nn.functional.cross_entropy(x.float(), target.float(),
 *  weight, reduction=..., label_smoothing=eps) for a class-probability
 *  target of the logits' shape (Mixup/CutMix, knowledge distillation),
 *  computed from the logits and the target in their own dtypes (dtype and
 *  target_dtype, each F32, F16 or BF16, independently). p is the class-index
 *  entry point's struct; p->ignore_index is not used (torch has no
 *  ignore_index for probability targets). Per position i, with
 *  t'_c = t_c * (1 - eps) + eps / C, w_c = weight[c] (1 without weight) and
 *  log p_c = (x_c - max) - log(sum_c exp(x_c - max)):
 *    loss_i = -sum_c w_c * t'_c * log p_c
 *  Reduction NONE writes loss_i to loss[outer * inner]; SUM writes sum_i
 *  loss_i to loss[0]; MEAN writes sum_i loss_i / (outer * inner) (torch
 *  divides by the number of positions here, not by a weight sum; an empty
 *  input gives 0 / 0 = NaN, as torch). Sums over positions are taken in
 *  double in a fixed order and rounded to float once. The target is not
 *  required to sum to 1 or to be non-negative (torch does not check either);
 *  a NaN anywhere in a position's logits or target makes its loss NaN.
 *  stats (optional, 3 * outer * inner floats) receives per position i:
 *  stats[i] = max_c x_c, stats[P + i] = log(sum_c exp(x_c - max)) and
 *  stats[2P + i] = sum_c w_c * t'_c (P = outer * inner): what
 *  mixprec_cross_entropy_soft_backward() needs besides the inputs.
 *  @return : MIXPREC_OK; MIXPREC_ERR_BAD_ARGUMENT for label_smoothing
 *            outside [0, 1] or an unknown reduction; MIXPREC_ERR_BAD_DTYPE for
 *            an unknown dtype or target_dtype; MIXPREC_ERR_BAD_SIZE for a
 *            negative size, a product that overflows int64, or classes
 *            outside [1, INT32_MAX] when there is a position;
 *            MIXPREC_ERR_NULL_POINTER for NULL p, or NULL logits, target or
 *            loss when there is a position (loss also for SUM/MEAN of an empty
 *            input); MIXPREC_ERR_OUT_OF_MEMORY if scratch space could not be
 *            had. Nothing is written on an error. */
MIXPREC_API mixprec_status mixprec_cross_entropy_soft(
    const void *logits, mixprec_dtype dtype, const void *target,
    mixprec_dtype target_dtype, const mixprec_cross_entropy_params *p,
    float *loss, float *stats);

/*! mixprec_cross_entropy_soft_backward() :
 *  Gradients of the loss of mixprec_cross_entropy_soft(): with respect to the
 *  logits, written in their dtype to grad_logits, and with respect to the
 *  target, written in target_dtype to grad_target (contiguous (outer,
 *  classes, inner) each; either may be NULL when it is not wanted, both NULL
 *  is a no-op). grad_loss is the gradient of the output: outer * inner
 *  floats for NONE, one float otherwise; stats is what
 *  mixprec_cross_entropy_soft() wrote. Per position, with g = grad_loss
 *  (divided by outer * inner for MEAN), T = stats[2P + i] = sum_c w_c t'_c,
 *  p_c the softmax from stats:
 *    grad_logits_c = g * (T * p_c - w_c * t'_c)
 *    grad_target_c = -g * (1 - eps) * w_c * log p_c
 *  (torch's gradients of the same loss).
 *  @return : MIXPREC_OK; MIXPREC_ERR_NULL_POINTER for NULL grad_loss or
 *            stats when an output is wanted and there is a position; the
 *            other statuses as mixprec_cross_entropy_soft(). Nothing is
 *            written on an error. */
MIXPREC_API mixprec_status mixprec_cross_entropy_soft_backward(
    const float *grad_loss, const void *logits, mixprec_dtype dtype,
    const void *target, mixprec_dtype target_dtype,
    const mixprec_cross_entropy_params *p, const float *stats,
    void *grad_logits, void *grad_target);

/* ------------------------------------------------------------------------ */
/* CUDA entry points (libmixprec_cuda only)                                  */
/* ------------------------------------------------------------------------ */

/*! mixprec_cuda_cross_entropy_workspace_size() :
 *  @return : bytes of device scratch mixprec_cuda_cross_entropy() needs for
 *            these params (the fixed-order reduction's partial sums), or -1
 *            for invalid sizes. Host-only. */
MIXPREC_API int64_t mixprec_cuda_cross_entropy_workspace_size(
    const mixprec_cross_entropy_params *p);

/*! mixprec_cuda_cross_entropy(), mixprec_cuda_cross_entropy_backward() :
 *  As the CPU entry points; p stays a host pointer, p->weight, logits,
 *  target, loss, stats, weight_sum, grad_loss and grad_logits are device
 *  pointers; `workspace` holds at least
 *  mixprec_cuda_cross_entropy_workspace_size() bytes. The reductions are
 *  deterministic (fixed order, no atomics).
 *  A target out of range cannot be reported without a host sync: instead
 *  that position's loss (and therefore a SUM/MEAN loss) is NaN, its stats are
 *  NaN, and backward writes NaN into its whole gradient slice. Training
 *  then stops on a NaN loss (or GradScaler skips the step) instead of
 *  reading out of bounds. Sizes, dtypes, reduction and label_smoothing are
 *  still checked on the host (same statuses as the CPU).
 *  CUDA: written to match the CPU within FP32 rounding (the per-position
 *  loss and gradient formulas are the CPU's own functions, the summation
 *  orders differ); not yet run on a GPU. */
MIXPREC_API mixprec_status mixprec_cuda_cross_entropy(
    const void *logits, mixprec_dtype dtype, const int64_t *target,
    const mixprec_cross_entropy_params *p, float *loss, float *stats,
    float *weight_sum, void *workspace, int64_t workspace_bytes,
    void *stream);
MIXPREC_API mixprec_status mixprec_cuda_cross_entropy_backward(
    const float *grad_loss, const void *logits, mixprec_dtype dtype,
    const int64_t *target, const mixprec_cross_entropy_params *p,
    const float *stats, const float *weight_sum, void *grad_logits,
    void *stream);

/*! mixprec_cuda_cross_entropy_soft(), mixprec_cuda_cross_entropy_soft_backward() :
 *  As the CPU entry points, on device pointers (logits, target, p->weight,
 *  loss, stats, grad_loss, grad_logits, grad_target; p stays a host
 *  pointer), enqueued on `stream`; stats is required here (not optional).
 *  `workspace` holds at least
 *  mixprec_cuda_cross_entropy_workspace_size(p) bytes (the same scratch as
 *  the class-index op). Same statuses as the CPU, plus
 *  MIXPREC_ERR_BAD_ARGUMENT for a pointer not aligned to its dtype and
 *  MIXPREC_ERR_BAD_SIZE for workspace_bytes too small or a grid too large;
 *  reductions deterministic (fixed order, no atomics).
 *  CUDA: written to match the CPU within FP32 rounding; not yet run on a
 *  GPU. */
MIXPREC_API mixprec_status mixprec_cuda_cross_entropy_soft(
    const void *logits, mixprec_dtype dtype, const void *target,
    mixprec_dtype target_dtype, const mixprec_cross_entropy_params *p,
    float *loss, float *stats, void *workspace, int64_t workspace_bytes,
    void *stream);
MIXPREC_API mixprec_status mixprec_cuda_cross_entropy_soft_backward(
    const float *grad_loss, const void *logits, mixprec_dtype dtype,
    const void *target, mixprec_dtype target_dtype,
    const mixprec_cross_entropy_params *p, const float *stats,
    void *grad_logits, void *grad_target, void *stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MIXPREC_CROSS_ENTROPY_H */
