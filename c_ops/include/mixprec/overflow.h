/* mixprec C API: the forward-overflow check (the overflow family). Included
 * by mixprec/mixprec.h.
 *
 * A read-only pass over a module's floating outputs (and, when one of them is
 * not finite, its inputs) that records into one slot of a preallocated
 * buffer whether an output had an inf or NaN, the largest finite magnitude
 * among the outputs, and whether the non-finite output came from finite
 * inputs: the flags mixprec.guard reads after a skipped step to name the
 * module whose forward overflowed. Nothing is synchronised with the host.
 *
 *     float record[MIXPREC_OVERFLOW_SLOT * 2] = {0};   // two modules
 *     mixprec_tensor out = {y, n, MIXPREC_F16}, in = {x, n, MIXPREC_F16};
 *     mixprec_overflow_check(&out, 1, &in, 1, record, 2, 1);  // module 1
 *     if (record[1 * MIXPREC_OVERFLOW_SLOT + MIXPREC_OVERFLOW_FROM_FINITE])
 *       ...  // module 1 overflowed from finite inputs
 */
#ifndef MIXPREC_OVERFLOW_H
#define MIXPREC_OVERFLOW_H

#include "mixprec/mixprec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Floats per slot of the record, and what each holds. Fields 0-3 are the
 * result; fields 4-7 are scratch of the CUDA kernel (it combines the blocks
 * of one call there and clears them again before it returns): they must be
 * zero when a slot is first used (start from a zeroed record) and are never
 * touched on the CPU. Values only ever grow, so one slot may take several
 * calls (a module run twice in a step, micro-batches): zero the record to
 * start over. */
#define MIXPREC_OVERFLOW_SLOT 8
enum {
  MIXPREC_OVERFLOW_NONFINITE = 0,       /* 1.0f: an output element was inf/NaN */
  MIXPREC_OVERFLOW_AMAX = 1,            /* largest finite |output element| */
  MIXPREC_OVERFLOW_INPUT_NONFINITE = 2, /* 1.0f: a call with a non-finite
                                           output also had a non-finite input */
  MIXPREC_OVERFLOW_FROM_FINITE = 3      /* 1.0f: a call had a non-finite output
                                           and only finite inputs */
};

/*! mixprec_overflow_check() :
 *  Reads every element of the `outputs` tensors (widened exactly to float;
 *  the test is on the bits, as mixprec_unscale's) and accumulates into
 *  record[slot * MIXPREC_OVERFLOW_SLOT + k]:
 *    k = NONFINITE: set to 1.0f if any output element is inf or NaN;
 *    k = AMAX: max of itself and the largest |v| over the finite output
 *      elements (exact: a max of stored values, no rounding; +0 if none);
 *    k = INPUT_NONFINITE / FROM_FINITE: only when this call found a
 *      non-finite output, the `inputs` are read too, and one of the two is
 *      set to 1.0f: INPUT_NONFINITE if an input element is inf or NaN, else
 *      FROM_FINITE. With finite outputs the inputs are not read at all.
 *  Nothing is cleared (values only grow). The result does not depend on the
 *  number of threads or the instruction set. Tensors are only read; they may
 *  overlap each other (an in-place module's input is its output) but not
 *  the record.
 *  @param outputs / inputs : arrays of n_outputs / n_inputs descriptors of
 *            F32/F16/BF16 data (counts >= 0; an array may be NULL when its
 *            count is 0).
 *  @param record : n_slots * MIXPREC_OVERFLOW_SLOT floats.
 *  @param slot   : the slot written, 0 <= slot < n_slots.
 *  @return : MIXPREC_OK; MIXPREC_ERR_NULL_POINTER if record, a list with a
 *            positive count, or the data of a non-empty tensor is NULL;
 *            MIXPREC_ERR_BAD_SIZE for a negative count or numel, or
 *            n_slots < 1; MIXPREC_ERR_BAD_ARGUMENT for a slot outside
 *            [0, n_slots); MIXPREC_ERR_BAD_DTYPE for an unknown dtype.
 *            Nothing is written unless the status is MIXPREC_OK. */
MIXPREC_API mixprec_status mixprec_overflow_check(const mixprec_tensor *outputs,
                                                  int64_t n_outputs,
                                                  const mixprec_tensor *inputs,
                                                  int64_t n_inputs, float *record,
                                                  int64_t n_slots, int64_t slot);

/* ---- CUDA (libmixprec_cuda) ---------------------------------------------- */

/*! mixprec_cuda_overflow_check() :
 *  As mixprec_overflow_check(), on the GPU: `outputs` and `inputs` are host
 *  arrays of device pointers, `record` a device pointer (its scratch fields
 *  zero, see MIXPREC_OVERFLOW_SLOT). One kernel launch for a call of up to
 *  256 tensors in all (more take one launch per 256), on `stream`; no host
 *  synchronisation; capturable in a CUDA graph. The GPU cannot skip the
 *  inputs when the outputs are finite without a second launch, so it reads
 *  them in the same launch and combines the flags in the last block to
 *  finish; the record ends bit for bit as the CPU's. Calls on one slot must
 *  be ordered (one stream): two in flight at once would share its scratch.
 *  CUDA: written to match the CPU bit for bit; not yet run on a GPU.
 *  @return : as mixprec_overflow_check(); MIXPREC_ERR_BAD_ARGUMENT also for a
 *            pointer not aligned to its element size; MIXPREC_ERR_CUDA if
 *            the launch failed. */
MIXPREC_API mixprec_status mixprec_cuda_overflow_check(const mixprec_tensor *outputs,
                                                       int64_t n_outputs,
                                                       const mixprec_tensor *inputs,
                                                       int64_t n_inputs, float *record,
                                                       int64_t n_slots, int64_t slot,
                                                       void *stream);

#ifdef __cplusplus
}
#endif

#endif /* MIXPREC_OVERFLOW_H */
