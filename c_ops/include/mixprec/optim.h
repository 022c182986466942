/* mixprec C API: fused optimizer steps (the optim family). Included by
 * mixprec/mixprec.h.
 *
 * One call steps a whole list of parameters: torch.optim.AdamW / SGD
 * (fused=True) extended to FP16/BF16 params with FP32 master weights (or, for
 * BF16, stochastic rounding without a master), with the unscale and the
 * skip-on-inf of torch.amp.GradScaler folded in, on the CPU and
 * (libmixprec_cuda) on the GPU.
 */
#ifndef MIXPREC_OPTIM_H
#define MIXPREC_OPTIM_H

#include "mixprec/mixprec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The formats of an optimizer's state (the lean modes: fewer bytes per
 * parameter, DESIGN.md "Optimizer state").
 *
 * Param remainders (mixprec_opt_tensor.remainder, a BF16 param without a
 * master): the FP32 master M is held as the param P and a 16-bit remainder
 * R, numel int16 each, 14 instead of 16 training-state bytes per parameter.
 * [note: remainders] With hi, lo the top and bottom 16 bits of M: R = lo, and
 *   P = hi + 1  when lo >= 0x8000 (as int16: R < 0) and hi is finite,
 *   P = hi      otherwise,
 * except that a master whose hi is the pattern of +-inf and lo >= 0x8000 (a
 * signalling NaN with its payload in the low 16 bits) has P = +-0. Each R
 * then makes hi -> P a bijection of the 16-bit words, so the step rebuilds M
 * exactly from (P, R), updates it with the formulas of the FP32-master mode
 * and splits the new M again. What holds:
 *  - the master trajectory is bit-identical to the FP32-master mode's (the
 *    same update on the same FP32 values, on every path: scalar, AVX2,
 *    AVX-512, CUDA), with EMA, found_inf skip and unscale_grads alike;
 *  - P is M rounded to nearest with ties AWAY from zero: it equals the
 *    master mode's param (round to nearest EVEN) except at an exact tie
 *    (lo == 0x8000) with hi even, where P is one ulp larger in magnitude;
 *    exhaustively over every (hi, lo) in tests/c/optim/test_optim_lean.cc.
 *    [note: why not nearest even] No 16-bit remainder can make P the
 *    master mode's round-to-nearest-even param at every M: under RNE a
 *    BF16 value b with an even mantissa is the rounding of 65537 FP32
 *    patterns (hi = b with lo in [0, 0x8000], the tie included, and
 *    hi = b - 1 with lo in [0x8000, 0xffff]), one more than R can name, so
 *    (P, R) could not give every M back. Ties away from zero (lo >= 0x8000
 *    always goes up) gives every P exactly 65536 preimages; only the exact
 *    ties with hi even, which RNE rounds down, differ by one ulp.
 *    A NaN master gives a NaN P (its top bits, not quieted), except the
 *    signalling NaNs above (P = +-0, or +-inf when lo < 0x8000), which no
 *    arithmetic produces.
 *  - an FP32 master M0 enters the mode as (P, R) by this split, and a
 *    BF16 param alone as (P, 0) (R = 0 rebuilds M = P exactly).
 * Refused: a remainder on an F16 or F32 param, or beside a master
 * (BAD_ARGUMENT).
 *
 * Moment formats (exp_avg_dtype, exp_avg_sq_dtype: AdamW's two moments,
 * SGD's momentum buffer in exp_avg_dtype; max_exp_avg_sq stays F32):
 *  MIXPREC_STATE_F32  float (the default; 0 in a zero-filled descriptor).
 *  MIXPREC_STATE_BF16 bfloat16, read exactly and written with stochastic
 *    rounding (stochastic_round.h's rounding and hash, key
 *    mix32(tensor key ^ stream * 0x632be5ab) with stream 1 for exp_avg /
 *    the momentum buffer and 2 for exp_avg_sq, the tensor key being the
 *    master-free params' (p->sr_seed, tensor index, count after the step):
 *    reproducible, independent of threads, ISA and device). The tensor
 *    needs a step count (SGD too).
 *  MIXPREC_STATE_Q8   8-bit blockwise: numel uint8 codes and, per block of
 *    256 consecutive elements (block b: elements [256 b, 256 b + 256), the
 *    last one shorter), an FP32 scale in exp_avg_scale / exp_avg_sq_scale
 *    (ceil(numel / 256) floats). [note: q8 map] An element is
 *    map(code) * scale; the map is the dynamic tree map of bitsandbytes
 *    and torchao's AdamW8bit (signed for exp_avg and the momentum buffer:
 *    0, +1 and +-the 127 midpoints below; unsigned for exp_avg_sq: 0, 1 and
 *    254 midpoints): per decade [10^(d-7), 10^(d-6)), d = 0..6, 2^d
 *    (signed) or 2^(d+1) (unsigned) equal intervals, each represented by
 *    its midpoint (computed in double, rounded to float once). Codes are in
 *    our order (code = 2^L + interval, L = d or d + 1, the signed map's sign
 *    in bit 7; code 0x80 is +1.0), so decoding is a shift and one fma, and
 *    encoding is analytic (the decade by comparison, the interval by floor,
 *    then the nearer of the two neighbours across a decade boundary, zero or
 *    one at the ends: the map's nearest value, not a table search).
 *    In the step, in registers: each element is decoded, updated in FP32
 *    as above, and the update of the param uses the new FP32 moments (as
 *    torchao does); then per block scale = max |new value| over its finite
 *    elements and each element is encoded at |x| * (1 / scale) (a float
 *    reciprocal once per block; 0 for an all-zero block). A NaN moment is
 *    stored as 0 and +-inf as the largest magnitude of its sign (the
 *    param, updated from the unrounded value, already shows it).
 *    The codes of a block are read only on a step that reads the state
 *    (not on SGD's first step).
 * Rounding and error, per step (all three formats are read exactly into
 * FP32, and the update itself is the FP32-master mode's): remainders round
 * nothing (M is exact; P is M to nearest, ties away, |P - M| <= ulp(P)/2);
 * a BF16 moment is rounded once, stochastically: |stored - x| < 1 BF16 ulp
 * of x (2^-7 relative at most), E[stored] = x (an x within an ulp of the
 * largest BF16 may become inf); a Q8 moment is rounded once
 * to the nearest map value at its block's scale: |stored - x| <= scale *
 * half the gap between the two map values around y = |x| / scale, which is
 * at most 4.5 * 10^(d-7) / 2^L for y in decade d (half its interval; L = d
 * signed, d + 1 unsigned: 4.5 / 2^L of the decade's lower end, relative),
 * and below 10^-7 at most half the smallest nonzero value (2.75e-7 signed,
 * 1.625e-7 unsigned); a NaN or inf moment is the exception noted below.
 * Refused: an unknown format (BAD_DTYPE), a Q8 buffer without its scales
 * (NULL_POINTER), scales given for a buffer that is not Q8 (BAD_ARGUMENT).
 */
typedef enum mixprec_state_dtype {
  MIXPREC_STATE_F32 = 0,
  MIXPREC_STATE_BF16 = 1,
  MIXPREC_STATE_Q8 = 2
} mixprec_state_dtype;

/* One parameter of a fused optimizer step: `numel` contiguous elements in
 * each buffer. All buffers of one tensor, and of different tensors, must not
 * overlap (except `step`, which tensors may share: see below). With numel 0
 * every pointer but `step` may be NULL.
 *
 * param          : the model parameter, F32, F16 or BF16, updated in place.
 * grad           : its gradient, F32, F16 or BF16 (may differ from param's).
 *                  Only read, unless the step's unscale_grads is set and it
 *                  has a grad_scale: then each element is overwritten with
 *                  its unscaled value (see mixprec_adamw_params), as torch's
 *                  fused kernels do, and the buffer must be writable.
 *                  Declared const for the read-only default (a caller with
 *                  const data keeps compiling); the kernels cast the const
 *                  away only on the unscale_grads path.
 * master         : the FP32 master copy. Required when param_dtype is F16;
 *                  optional for BF16: the update is computed on it and param
 *                  receives it rounded to nearest even (param's old value is
 *                  not read). Must be NULL when param_dtype is F32 (param is
 *                  then its own master).
 *                  A BF16 param with master NULL is updated WITHOUT a master
 *                  copy (saving 4 bytes per element): its value is widened
 *                  exactly to FP32, updated by the same formulas, and written
 *                  back with STOCHASTIC rounding (unbiased: an update far
 *                  below BF16 resolution still moves the param on average,
 *                  where nearest-even rounding would lose it every step). The
 *                  random bits hash (p->sr_seed, the tensor's index in `list`,
 *                  its step count after the step, the element index): results
 *                  are reproducible and do not depend on threads, ISA or
 *                  device; c_ops/src/stochastic_round.h has the definition.
 *                  Such a tensor needs a step count (SGD too).
 *                  With `remainder` (int16, numel) the BF16 param and its
 *                  remainder hold an exact FP32 master instead (no
 *                  stochastic rounding; see [note: remainders] above).
 * exp_avg        : AdamW: first moment (required; FP32 unless exp_avg_dtype
 *                  says otherwise, see mixprec_state_dtype: set
 *                  exp_avg_data for another format).
 * momentum_buffer: SGD: the momentum buffer (as exp_avg), required when
 *                  momentum != 0, else ignored. It shares exp_avg's slot (an
 *                  anonymous union): one layout serves both optimizers.
 * exp_avg_sq     : AdamW: second moment (required; format exp_avg_sq_dtype).
 *                  SGD: ignored.
 * max_exp_avg_sq : AdamW with amsgrad: running max of exp_avg_sq (FP32,
 *                  required). Otherwise ignored.
 * step           : this parameter's step count, ONE float (torch keeps a
 *                  per-parameter float32 step tensor). AdamW: required. SGD:
 *                  optional (see mixprec_sgd_step). On a step that is not
 *                  skipped it becomes *step + 1 (a float add). Every step is
 *                  read before any is written, so tensors sharing one step
 *                  pointer all use the same count and it is advanced once.
 */
typedef struct mixprec_opt_tensor {
  void *param;
  const void *grad;
  float *master;
  union {
    float *exp_avg;         /* AdamW */
    float *momentum_buffer; /* SGD */
    void *exp_avg_data;     /* either, in the format exp_avg_dtype names */
  };
  union {
    float *exp_avg_sq;
    void *exp_avg_sq_data;  /* in the format exp_avg_sq_dtype names */
  };
  float *max_exp_avg_sq;
  float *step;
  int64_t numel;
  mixprec_dtype param_dtype;
  mixprec_dtype grad_dtype;
  /* The lean state (appended; zero-filled it is none of it, and the
   * results are those of the fields above alone): see mixprec_state_dtype. */
  int16_t *remainder;
  mixprec_state_dtype exp_avg_dtype;    /* exp_avg's, or momentum_buffer's */
  mixprec_state_dtype exp_avg_sq_dtype; /* AdamW only; SGD: ignored */
  float *exp_avg_scale;                 /* MIXPREC_STATE_Q8 exp_avg only */
  float *exp_avg_sq_scale;              /* MIXPREC_STATE_Q8 exp_avg_sq only */
} mixprec_opt_tensor;

/* An exponential moving average (EMA) of the weights, fused into the step
 * (the `ema` member of mixprec_adamw_params and mixprec_sgd_params; all zero
 * means no EMA). After a tensor's new FP32 value p is computed (its master,
 * the F32 param itself, or for a master-free BF16 param the FP32 value
 * before its stochastic rounding), still in registers, the same pass does
 *   ema = lerp(ema, p, w),   w = 1 - decay rounded to float once,
 * with torch.lerp's formula (as timm's ModelEmaV3 calls torch._foreach_lerp_
 * with weight 1 - decay): diff = p - ema, then
 *   ema = fma(w, diff, ema)       if |w| < 0.5
 *       = fma(w - 1, diff, p)     otherwise (w = 1 gives ema = p exactly)
 * so the EMA costs 8 bytes per element (read and write of the FP32 buffer)
 * and no second read of the weights.
 * The decay follows ModelEmaV3.get_decay(step) with step the tensor's count
 * AFTER the step (timm's train loop passes num_updates, counted after the
 * optimizer step): s = step - update_after_step - 1 (in double);
 *   s <= 0: decay = 0 (the EMA takes the weights: timm's "copy" phase);
 *   use_warmup: decay = max(min(1 - (1 + s / warmup_gamma)^-warmup_power,
 *                               decay), min_decay);
 *   otherwise decay.
 * The update runs only on steps where step % update_every == 0
 * (torchvision's reference --model-ema-steps); on the others the buffer is
 * neither read nor written. The count is the tensor's step count (AdamW:
 * required; SGD: a tensor with an EMA needs one), read on the device by the
 * CUDA entry points, so the decay needs no host value. A skipped step
 * (found_inf) writes nothing, the EMA included, and does not advance the
 * count, so it does not count as an EMA update either. */
typedef struct mixprec_ema_params {
  /* NULL: no EMA (every other field is then ignored and unchecked).
   * Otherwise a HOST array of the step's n FP32 buffers (device pointers
   * for the CUDA entry points), bufs[i] for list[i], numel elements each,
   * disjoint from every other buffer of the step; bufs[i] NULL: list[i] has
   * no EMA. */
  float *const *bufs;
  double decay;             /* in [0, 1] */
  double min_decay;         /* in [0, 1], checked always (used with use_warmup) */
  int use_warmup;           /* nonzero: timm's warmup formula */
  double warmup_gamma;      /* finite, > 0 (used with use_warmup) */
  double warmup_power;      /* finite, > 0 (used with use_warmup) */
  int64_t update_after_step; /* >= 0 */
  int64_t update_every;     /* >= 0; 0 and 1 both mean every step */
} mixprec_ema_params;

/* Hyper-parameters of torch.optim.AdamW (defaults: lr 1e-3, betas (0.9,
 * 0.999), eps 1e-8, weight_decay 1e-2, amsgrad 0, maximize 0).
 * The three pointers are optional (NULL: absent); each points to ONE float,
 * read when the step runs (on the device for the CUDA entry point), so an LR
 * scheduler or GradScaler can change them without a host sync or, under a
 * CUDA graph, without recapture:
 *   lr_tensor  : when not NULL, *lr_tensor is the learning rate and `lr` is
 *                ignored (neither used nor checked). Its value is not checked.
 *   grad_scale : grads are divided by *grad_scale in FP32 (torch's
 *                optimizer.grad_scale, i.e. the loss scale, not its inverse).
 *   found_inf  : when *found_inf != 0 (NaN counts as nonzero) the whole step
 *                is skipped: nothing at all is written, step counts and
 *                grads included, and the status is MIXPREC_OK.
 * sr_seed: the seed of the stochastic rounding of master-free BF16 params
 * (see mixprec_opt_tensor.master); unused by every other tensor.
 * unscale_grads: 0 (the default): grads are only read, so after a step with
 *   grad_scale they still hold the scaled values. Nonzero, with grad_scale
 *   given: in the same pass every grad element is overwritten with
 *   g / *grad_scale (the FP32 quotient the update uses, before the maximize
 *   negation) rounded to the grad's dtype, nearest even (exact for F32; a
 *   NaN stays a NaN): what torch's fused AdamW/SGD leave in p.grad after
 *   GradScaler.step(). It changes nothing else: params, masters, state and
 *   step counts are bit-identical to the same call with unscale_grads 0.
 *   Ignored without grad_scale (nothing to unscale: grads are not written),
 *   and a skipped step (found_inf) writes no grad either, so they stay
 *   scaled, as torch's do. Appended last: the offsets of the fields above
 *   are those of the struct without it.
 * ema: the fused EMA of the weights (mixprec_ema_params); appended after
 *   unscale_grads in the same way. All zero (a zero-filled struct) is no
 *   EMA, and with ema.bufs NULL every result is bit-identical to a build
 *   without it. With an EMA, params, masters, state and step counts are
 *   bit-identical to the same call without one. */
typedef struct mixprec_adamw_params {
  double lr;           /* >= 0, finite (unless lr_tensor) */
  double beta1, beta2; /* each in [0, 1) */
  double eps;          /* >= 0, finite */
  double weight_decay; /* >= 0, finite */
  int amsgrad;         /* nonzero: use max_exp_avg_sq */
  int maximize;        /* nonzero: ascend (the gradient is negated) */
  const float *lr_tensor;
  const float *grad_scale;
  const float *found_inf;
  uint64_t sr_seed;
  int unscale_grads;   /* nonzero: write g / *grad_scale back to the grads */
  mixprec_ema_params ema; /* EMA of the weights (see above); bufs NULL: none */
} mixprec_adamw_params;

/* Hyper-parameters of torch.optim.SGD (defaults: lr 1e-3, momentum 0,
 * dampening 0, weight_decay 0, nesterov 0, maximize 0); lr_tensor,
 * grad_scale, found_inf, sr_seed and unscale_grads as in
 * mixprec_adamw_params.
 * first_step: see mixprec_sgd_step (used only by tensors whose step is
 * NULL). */
typedef struct mixprec_sgd_params {
  double lr;           /* >= 0, finite (unless lr_tensor) */
  double momentum;     /* >= 0, finite */
  double dampening;    /* finite; must be 0 with nesterov */
  double weight_decay; /* >= 0, finite */
  int nesterov;        /* nonzero: Nesterov momentum (needs momentum > 0) */
  int maximize;
  const float *lr_tensor;
  const float *grad_scale;
  const float *found_inf;
  int first_step;      /* nonzero: momentum buffers hold no value yet */
  uint64_t sr_seed;
  int unscale_grads;   /* as in mixprec_adamw_params */
  mixprec_ema_params ema; /* as in mixprec_adamw_params */
} mixprec_sgd_params;

/*! mixprec_adamw_params_default(), mixprec_sgd_params_default() :
 *  @return : torch's defaults (listed above), all pointers NULL, sr_seed 0,
 *            unscale_grads 0; ema: bufs NULL (off) with timm ModelEmaV3's
 *            defaults ready (decay 0.9999, min_decay 0, use_warmup 0,
 *            warmup_gamma 1, warmup_power 2/3, update_after_step 0) and
 *            update_every 1. */
MIXPREC_API mixprec_adamw_params mixprec_adamw_params_default(void);
MIXPREC_API mixprec_sgd_params mixprec_sgd_params_default(void);

/*! mixprec_adamw_step() :
 *  One fused AdamW step over a list of parameters; the equivalent of
 *  torch.optim.AdamW(fused=True).step() on FP32 params, extended to FP16/BF16
 *  params with FP32 master weights (p below is the master, or the F32 param).
 *  Per tensor, with t = *step + 1 (float) and lr from lr_tensor or lr, these
 *  are computed in double and rounded to float once, as torch's fused CPU
 *  kernel does: decay = 1 - lr*weight_decay, step_size = lr / (1 - beta1^t),
 *  bc2_sqrt = sqrt(1 - beta2^t), w = 1 - beta1, c2 = 1 - beta2, beta2, eps.
 *  Then per element, in float (fma: one rounding), as torch's AVX2 build
 *  of that kernel computes it (GCC contracts its a*b + c into FMAs, and its
 *  vectorised body and scalar tail fuse differently; the tail is each
 *  tensor's last numel % 8 elements):
 *    g = grad; g = g / *grad_scale (if given);
 *    grad = g rounded to grad_dtype     (only if unscale_grads and grad_scale)
 *    g = -g (if maximize);
 *    p = p * decay                               (only if weight_decay != 0)
 *    m = fma(w, g - m, m) if |w| < 0.5 else fma(w - 1, g - m, g)   (lerp)
 *    v = fma(c2 * g, g, v * beta2)        (tail: fma(v, beta2, (c2 * g) * g))
 *    vmax = max(vmax, v)                  (amsgrad only; NaN as torch's)
 *    denom = sqrt(amsgrad ? vmax : v) / bc2_sqrt + eps
 *    p = p - (step_size * m) / denom
 *    param = p rounded to param_dtype (nearest even) when param is F16/BF16
 *            with a master; stochastically (BF16 without a master: p was
 *            read from param)
 *    ema = lerp(ema, p, w)  (a tensor with an EMA buffer, on an EMA update
 *                            step: see mixprec_ema_params)
 *  and finally *step = t. FP32 results are bitwise equal to torch's fused
 *  CPU AdamW with ATEN_CPU_CAPABILITY avx2 (see c_ops/src/adamw.c).
 *  Results do not depend on the thread count.
 *  @param list : host array of n descriptors (n >= 0).
 *  @param p    : hyper-parameters (host pointer).
 *  @return : MIXPREC_OK (also when the step is skipped);
 *            MIXPREC_ERR_NULL_POINTER if p, list (n > 0), a step, or a buffer
 *              the contract requires (with numel > 0) is NULL (an F16
 *              param's master included);
 *            MIXPREC_ERR_BAD_SIZE for n < 0 or a negative numel;
 *            MIXPREC_ERR_BAD_DTYPE for an unknown param or grad dtype;
 *            MIXPREC_ERR_BAD_ARGUMENT for a hyper-parameter out of range (a
 *              NaN or inf included), or a master given for an F32 param;
 *            MIXPREC_ERR_OUT_OF_MEMORY if scratch space could not be had.
 *            With p->ema.bufs: BAD_ARGUMENT also for an EMA field out of
 *            its range (see mixprec_ema_params; NaN included).
 *            Everything is checked before anything is written: on an error
 *            nothing has been written. */
MIXPREC_API mixprec_status mixprec_adamw_step(const mixprec_opt_tensor *list,
                                              int64_t n,
                                              const mixprec_adamw_params *p);

/*! mixprec_sgd_step() :
 *  One fused SGD step, the equivalent of torch.optim.SGD(fused=True).step()
 *  on FP32 params, extended as mixprec_adamw_step() is. With
 *  lr, momentum, weight_decay and 1 - dampening (computed in double) each
 *  rounded to float once, per element in float:
 *    g = grad; g = g / *grad_scale (if given);
 *    grad = g rounded to grad_dtype     (only if unscale_grads and grad_scale)
 *    g = -g (if maximize);
 *    g = fma(p, weight_decay, g)                 (only if weight_decay != 0)
 *    if momentum != 0:
 *      buf = g                        on the tensor's first step, else
 *      buf = fma(1 - dampening, g, buf * momentum)
 *            (in the last numel % 8 elements: fma(buf, momentum, g * (1 - dampening)))
 *      g = nesterov ? fma(buf, momentum, g) : buf
 *    p = fma(-g, lr, p);  param = p rounded to param_dtype when F16/BF16;
 *    ema = lerp(ema, p, w)  (as in mixprec_adamw_step).
 *  (fma: one rounding, as torch's AVX2 build computes it: bitwise equal to
 *  torch's fused CPU SGD there; see c_ops/src/sgd.c.) The instruction-set
 *  paths give the same bits, except the sign of a NaN result (the portable
 *  path's fmaf and the vector fma may propagate a NaN operand's sign
 *  differently, e.g. Nesterov with a NaN momentum buffer; found by
 *  tests/fuzz/fuzz_optim, which treats any two NaNs as equal).
 *  "First step" (torch: the momentum_buffer is still None): for a tensor
 *  whose step is not NULL, it is *step == 0, read when the step runs (so a
 *  captured CUDA graph initialises the buffers on its first replay), and
 *  *step is advanced by 1; for a tensor whose step is NULL it is
 *  p->first_step. A skipped step (found_inf) advances nothing, so the next
 *  call still sees the first step; callers using p->first_step must keep it
 *  set until a step is not skipped.
 *  @return : as mixprec_adamw_step(); BAD_ARGUMENT also for nesterov with
 *            momentum <= 0 or dampening != 0; NULL_POINTER also for a
 *            master-free BF16 param, or a tensor with an EMA buffer,
 *            without a step count. */
MIXPREC_API mixprec_status mixprec_sgd_step(const mixprec_opt_tensor *list,
                                            int64_t n,
                                            const mixprec_sgd_params *p);

/*! mixprec_cuda_adamw_step(), mixprec_cuda_sgd_step() (libmixprec_cuda) :
 *  As the CPU entry points, with the same formulas and statuses. `list` and
 *  `p` stay host pointers; every buffer in the descriptors, step included,
 *  and p->lr_tensor, p->grad_scale and p->found_inf are device pointers on
 *  the current device. Enqueued on `stream` (a cudaStream_t) with no host
 *  synchronisation: a skipped step is decided on the device, so it is
 *  capturable in a CUDA graph. CUDA: written to match the CPU bit for bit
 *  (sqrt and division correctly rounded, the lerp with fmaf, the element
 *  rules of optim_math.h shared with the CPU); not yet run on a GPU. */
MIXPREC_API mixprec_status mixprec_cuda_adamw_step(
    const mixprec_opt_tensor *list, int64_t n, const mixprec_adamw_params *p,
    void *stream);
MIXPREC_API mixprec_status mixprec_cuda_sgd_step(
    const mixprec_opt_tensor *list, int64_t n, const mixprec_sgd_params *p,
    void *stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MIXPREC_OPTIM_H */
