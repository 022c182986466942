/* mixprec C API: softmax and log_softmax. Included by mixprec/mixprec.h
 * (cross-entropy: mixprec/cross_entropy.h).
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
/* CUDA entry points (libmixprec_cuda only)                                  */
/* ------------------------------------------------------------------------ */

/*! mixprec_cuda_softmax(), mixprec_cuda_log_softmax(),
 *  mixprec_cuda_softmax_backward(), mixprec_cuda_log_softmax_backward() :
 *  As the CPU entry points, on device pointers of the current device,
 *  enqueued on `stream` (a cudaStream_t) without host synchronisation.
 *  Rows (inner == 1) are read once: the max and the sum are accumulated
 *  together with the online rescaling s = s * exp(m_old - m_new) + ...,
 *  the write pass reads the row again (from L2 when it fits). Results equal
 *  the CPU's within FP32 rounding (different summation order, CUDA's expf).
 *  CUDA: written to that end; not yet run on a GPU. */
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

#ifdef __cplusplus
} /* extern "C" */
#endif

/* Cross-entropy lived in this header before it had its own: code that
 * included only softmax.h for it keeps compiling. */
#include "mixprec/cross_entropy.h"

#endif /* MIXPREC_SOFTMAX_H */
