/* mixprec C API: Softmax, log_softmax and cross-entropy. Included by mixprec/mixprec.h.
 *
 * FP32-accumulating softmax family for FP32/FP16/BF16 tensors: the input is
 * read in its own dtype and widened in registers, every max, exponential and
 * sum is computed in float, and only the requested outputs are written. No
 * FP32 copy of the input is ever made.
 *
 * Layout. A tensor reduced over one dimension `dim` is seen as a contiguous
 * array of shape (outer, n, inner): outer = product of the sizes before dim,
 * n = size of dim, inner = product of the sizes after dim. inner == 1 is the
 * row case (softmax over the last dimension); inner > 1 is the strided case
 * (e.g. NCHW segmentation logits with dim = 1: the n values of one pixel are
 * inner elements apart).
 *
 * Example: log-probabilities of a (4096, 32000) BF16 logit matrix, in FP32.
 *
 *     mixprec_status st = mixprec_log_softmax(logits, MIXPREC_BF16,
 *                                             logp, MIXPREC_F32,
 *                                             4096, 32000, 1);
 *
 * Accuracy. Per slice: m = max(x); s = sum(exp(x - m)); softmax =
 * exp(x - m) * (1 / s); log_softmax = (x - m) - log(s). The AVX2 path sums
 * in float over 32 lanes added in a fixed order and uses a Cephes-style
 * polynomial exp (within 2 ulp; exp(-inf) = 0 exactly, so -inf entries
 * mask; results below ~1e-38 flush to 0); the scalar path sums in double
 * and uses libm's expf. Results equal torch's FP32 ops on the upcast input
 * within FP32 rounding, then are rounded once to the output dtype. Slices
 * holding NaN, or only -inf, or +inf give NaN like torch's. The two paths
 * agree within FP32 rounding, not bit for bit; for one path, results never
 * depend on the thread count (a slice is always computed by one thread).
 */
#ifndef MIXPREC_SOFTMAX_H
#define MIXPREC_SOFTMAX_H

#include "mixprec/mixprec.h"

#ifdef __cplusplus
extern "C" {
#endif

/*! mixprec_softmax(), mixprec_log_softmax() :
 *  y = softmax(x) (resp. log_softmax(x)) over the middle dimension of the
 *  contiguous (outer, n, inner) array x of dtype x_dtype, written to y, a
 *  contiguous array of the same shape in y_dtype (any of the three dtypes;
 *  y must not overlap x unless it is exactly x with y_dtype == x_dtype: in
 *  place is allowed).
 *  @return : MIXPREC_OK; MIXPREC_ERR_BAD_SIZE for a negative size or a
 *            product that overflows int64; MIXPREC_ERR_BAD_DTYPE for an
 *            unknown dtype; MIXPREC_ERR_NULL_POINTER for NULL x or y when
 *            there is an element; MIXPREC_ERR_OUT_OF_MEMORY if scratch space
 *            could not be had. Nothing is written on an error. n == 0 or
 *            outer == 0 or inner == 0 is an empty tensor: OK, no work. */
MIXPREC_API mixprec_status mixprec_softmax(const void *x, mixprec_dtype x_dtype,
                                           void *y, mixprec_dtype y_dtype,
                                           int64_t outer, int64_t n,
                                           int64_t inner);
MIXPREC_API mixprec_status mixprec_log_softmax(const void *x,
                                               mixprec_dtype x_dtype, void *y,
                                               mixprec_dtype y_dtype,
                                               int64_t outer, int64_t n,
                                               int64_t inner);

/*! mixprec_softmax_backward(), mixprec_log_softmax_backward() :
 *  The gradient of the input from the output y (as mixprec_softmax /
 *  mixprec_log_softmax wrote it) and the gradient dy of the output, both in
 *  y_dtype, shape (outer, n, inner), contiguous; dx is written in dx_dtype.
 *  Per slice, in float:
 *    softmax:     dx = y * (dy - sum(dy * y))
 *    log_softmax: dx = dy - exp(y) * sum(dy)
 *  (torch's _softmax_backward_data / _log_softmax_backward_data). dx may be
 *  dy itself when the dtypes agree (in place).
 *  @return : as mixprec_softmax(). */
MIXPREC_API mixprec_status mixprec_softmax_backward(
    const void *dy, const void *y, mixprec_dtype y_dtype, void *dx,
    mixprec_dtype dx_dtype, int64_t outer, int64_t n, int64_t inner);
MIXPREC_API mixprec_status mixprec_log_softmax_backward(
    const void *dy, const void *y, mixprec_dtype y_dtype, void *dx,
    mixprec_dtype dx_dtype, int64_t outer, int64_t n, int64_t inner);

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

/*! mixprec_cuda_softmax(), mixprec_cuda_log_softmax(),
 *  mixprec_cuda_softmax_backward(), mixprec_cuda_log_softmax_backward() :
 *  As the CPU entry points, on device pointers of the current device,
 *  enqueued on `stream` (a cudaStream_t) without host synchronisation.
 *  Rows (inner == 1) are read once: the max and the sum are accumulated
 *  together with the online rescaling s = s * exp(m_old - m_new) + ...,
 *  the write pass reads the row again (from L2 when it fits). Results equal
 *  the CPU's within FP32 rounding (different summation order, CUDA's expf). */
MIXPREC_API mixprec_status mixprec_cuda_softmax(const void *x,
                                                mixprec_dtype x_dtype, void *y,
                                                mixprec_dtype y_dtype,
                                                int64_t outer, int64_t n,
                                                int64_t inner, void *stream);
MIXPREC_API mixprec_status mixprec_cuda_log_softmax(
    const void *x, mixprec_dtype x_dtype, void *y, mixprec_dtype y_dtype,
    int64_t outer, int64_t n, int64_t inner, void *stream);
MIXPREC_API mixprec_status mixprec_cuda_softmax_backward(
    const void *dy, const void *y, mixprec_dtype y_dtype, void *dx,
    mixprec_dtype dx_dtype, int64_t outer, int64_t n, int64_t inner,
    void *stream);
MIXPREC_API mixprec_status mixprec_cuda_log_softmax_backward(
    const void *dy, const void *y, mixprec_dtype y_dtype, void *dx,
    mixprec_dtype dx_dtype, int64_t outer, int64_t n, int64_t inner,
    void *stream);

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
 *  still checked on the host (same statuses as the CPU). */
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
 *  reductions deterministic (fixed order, no atomics). */
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

#endif /* MIXPREC_SOFTMAX_H */
