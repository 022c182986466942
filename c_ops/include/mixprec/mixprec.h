/*
 * mixprec.h: the one public header of mixprec's C API.
 *
 * mixprec's kernels are plain C11 (CPU) and CUDA C (GPU). This header declares
 * every entry point; it needs neither torch nor CUDA. The torch shim is one
 * client of it, ctypes or another framework can be another.
 *
 * A worked example: unscale two gradients of different dtypes in place, learn
 * whether any held inf/NaN, and get their L2 norm from the same pass.
 *
 *     float g32[1000];  mixprec_bf16 g16[500];      // filled by backward
 *     mixprec_tensor list[2] = {
 *         { g32, 1000, MIXPREC_F32 },
 *         { g16, 500,  MIXPREC_BF16 },
 *     };
 *     float inv_scale = 1.0f / 65536.0f, found_inf = 0.0f, norms[2], total;
 *     mixprec_status st = mixprec_unscale(list, 2, &inv_scale, &found_inf,
 *                                         norms, &total);
 *     if (st != MIXPREC_OK) fprintf(stderr, "%s\n", mixprec_status_string(st));
 *     // found_inf != 0 -> skip the optimizer step; total -> clip.
 *
 * Conventions.
 * - Every entry point returns a mixprec_status; results go through
 *   out-parameters. Nothing aborts, exits, throws, or prints.
 * - Element counts are int64_t. Enum values are pinned and append-only.
 * - FP16 and BF16 are 16-bit storage types: no arithmetic is done on them;
 *   every computation is in float (FP32) and results are rounded back to
 *   nearest, ties to even. A NaN stays a NaN.
 * - mixprec_<op> is the CPU entry point (host pointers). mixprec_cuda_<op>
 *   (in libmixprec_cuda) takes the same arguments, all of them device pointers
 *   except the descriptor arrays and parameter structs, which stay on the host,
 *   plus a cudaStream_t passed as void *; it only enqueues work on that stream
 *   and never synchronises with the host.
 * - On any error status no output has been written.
 */
#ifndef MIXPREC_MIXPREC_H
#define MIXPREC_MIXPREC_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#  ifdef MIXPREC_BUILDING
#    define MIXPREC_API __declspec(dllexport)
#  else
#    define MIXPREC_API __declspec(dllimport)
#  endif
#else
#  define MIXPREC_API __attribute__((visibility("default")))
#endif

#define MIXPREC_VERSION_MAJOR 0
#define MIXPREC_VERSION_MINOR 1
#define MIXPREC_VERSION_PATCH 0

/* ------------------------------------------------------------------------ */
/* Status codes                                                              */
/* ------------------------------------------------------------------------ */

/* One list generates the enum and the strings; values are pinned. */
#define MIXPREC_STATUS_LIST(X)                                                 \
  X(MIXPREC_OK, 0, "success")                                                  \
  X(MIXPREC_ERR_NULL_POINTER, 1, "a required pointer argument is NULL")        \
  X(MIXPREC_ERR_BAD_DTYPE, 2, "unsupported or mismatched dtype")               \
  X(MIXPREC_ERR_BAD_SIZE, 3, "negative or inconsistent element count")         \
  X(MIXPREC_ERR_BAD_ARGUMENT, 4, "an argument is out of its valid range")      \
  X(MIXPREC_ERR_OUT_OF_MEMORY, 5, "host memory allocation failed")             \
  X(MIXPREC_ERR_CUDA, 6, "a CUDA runtime call failed")                         \
  X(MIXPREC_ERR_UNSUPPORTED, 7, "not supported by this build or this CPU")

typedef enum mixprec_status {
#define MIXPREC_X_ENUM(name, value, text) name = value,
  MIXPREC_STATUS_LIST(MIXPREC_X_ENUM)
#undef MIXPREC_X_ENUM
} mixprec_status;

/*! mixprec_status_string() :
 *  @return : a static, never-NULL English description of `status`
 *            ("unknown status" for a value outside the list). */
MIXPREC_API const char *mixprec_status_string(mixprec_status status);

/*! mixprec_version() :
 *  @return : MIXPREC_VERSION_MAJOR * 10000 + MINOR * 100 + PATCH of the
 *            library actually loaded (may differ from this header's). */
MIXPREC_API int mixprec_version(void);

/* ------------------------------------------------------------------------ */
/* Dtypes                                                                    */
/* ------------------------------------------------------------------------ */

typedef enum mixprec_dtype {
  MIXPREC_F32 = 0,
  MIXPREC_F16 = 1, /* IEEE 754 binary16 */
  MIXPREC_BF16 = 2 /* bfloat16: the top 16 bits of a float */
} mixprec_dtype;

/* Storage-only 16-bit types: wrapping the bits in a struct stops accidental
 * arithmetic on them. Layout is exactly one uint16_t. */
typedef struct mixprec_f16 { uint16_t bits; } mixprec_f16;
typedef struct mixprec_bf16 { uint16_t bits; } mixprec_bf16;

/*! mixprec_dtype_size() :
 *  @return : bytes per element of `dtype`, or 0 for an unknown dtype. */
MIXPREC_API int mixprec_dtype_size(mixprec_dtype dtype);

/*! mixprec_f16_to_f32(), mixprec_f32_to_f16(), mixprec_bf16_to_f32(),
 *  mixprec_f32_to_bf16() :
 *  Exact widening; narrowing rounds to nearest, ties to even, overflows to
 *  inf, keeps subnormals (no flush to zero) and keeps NaN a (quiet) NaN of the
 *  same sign. The kernels use these same conversions. */
MIXPREC_API float mixprec_f16_to_f32(mixprec_f16 h);
MIXPREC_API mixprec_f16 mixprec_f32_to_f16(float f);
MIXPREC_API float mixprec_bf16_to_f32(mixprec_bf16 h);
MIXPREC_API mixprec_bf16 mixprec_f32_to_bf16(float f);

/* ------------------------------------------------------------------------ */
/* CPU dispatch and threads                                                  */
/* ------------------------------------------------------------------------ */

/* Instruction-set paths of the CPU kernels, best first. Results are
 * bit-identical across paths. */
typedef enum mixprec_cpu_isa {
  MIXPREC_ISA_AUTO = 0,   /* the best path this CPU supports */
  MIXPREC_ISA_SCALAR = 1, /* portable C, any CPU */
  MIXPREC_ISA_AVX2 = 2,   /* x86-64 AVX2 + FMA + F16C */
  MIXPREC_ISA_AVX512 = 3  /* x86-64 AVX-512 F/BW/VL (+ F16C) */
} mixprec_cpu_isa;

/*! mixprec_cpu_isa_supported() :
 *  @return : 1 if this CPU (and this build) can run `isa`, else 0. */
MIXPREC_API int mixprec_cpu_isa_supported(mixprec_cpu_isa isa);

/*! mixprec_set_cpu_isa() :
 *  Forces the CPU kernels onto one path (for tests and benchmarks); AUTO
 *  restores the default, which is the best supported path, or the one named by
 *  the environment variable MIXPREC_CPU_ISA (scalar, avx2, avx512) if set.
 *  Not thread-safe with respect to kernels running concurrently.
 *  @return : MIXPREC_ERR_UNSUPPORTED if this CPU cannot run `isa`,
 *            MIXPREC_ERR_BAD_ARGUMENT for an unknown value. */
MIXPREC_API mixprec_status mixprec_set_cpu_isa(mixprec_cpu_isa isa);

/*! mixprec_get_cpu_isa() :
 *  @return : the path the CPU kernels use now (never AUTO). */
MIXPREC_API mixprec_cpu_isa mixprec_get_cpu_isa(void);

/*! mixprec_set_num_threads() :
 *  Upper bound on the OpenMP threads a CPU kernel uses; 0 restores the
 *  default (OpenMP's own). Results never depend on the thread count. */
MIXPREC_API void mixprec_set_num_threads(int n);
MIXPREC_API int mixprec_get_num_threads(void);

/* ------------------------------------------------------------------------ */
/* Loss scaling                                                              */
/* ------------------------------------------------------------------------ */

/* One tensor of a multi-tensor list: `numel` contiguous elements of `dtype`
 * at `data` (any alignment of the element type). numel may be 0, in which case
 * data may be NULL. */
typedef struct mixprec_tensor {
  void *data;
  int64_t numel;
  mixprec_dtype dtype;
} mixprec_tensor;

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
 *  Arguments and statuses as mixprec_unscale(). */
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
  int64_t hysteresis;      /* >= 1: back off only after this many overflowing
                              steps without a clean step between them */
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
 *    skipped_steps (if not NULL) counts overflowing steps.
 *  hysteresis_tracker may be NULL only when hysteresis == 1.
 *  @return : MIXPREC_ERR_NULL_POINTER, MIXPREC_ERR_BAD_ARGUMENT for
 *            growth_interval outside [1, INT32_MAX], hysteresis < 1, factors that are not finite
 *            and positive, min_scale < 0 or min_scale > max_scale. */
MIXPREC_API mixprec_status mixprec_update_scale(
    float *scale, int32_t *growth_tracker, int32_t *hysteresis_tracker,
    int64_t *skipped_steps, const float *found_inf,
    const mixprec_update_scale_params *params);

/* ------------------------------------------------------------------------ */
/* CUDA entry points (defined in libmixprec_cuda only)                       */
/* ------------------------------------------------------------------------ */

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
 *  device pointers. The norms equal the CPU's within float rounding (their
 *  summation order differs). All tensors and outputs must be on the current device.
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
 *  same arguments, workspace size and norms (equal to mixprec_cuda_unscale's
 *  bit for bit), the tensors are not written. */
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
 *  (params stays a host pointer). */
MIXPREC_API mixprec_status mixprec_cuda_update_scale(
    float *scale, int32_t *growth_tracker, int32_t *hysteresis_tracker,
    int64_t *skipped_steps, const float *found_inf,
    const mixprec_update_scale_params *params, void *stream);

/* ------------------------------------------------------------------------ */
/* Optimizers                                                                */
/* ------------------------------------------------------------------------ */

/* One parameter of a fused optimizer step: `numel` contiguous elements in
 * each buffer. All buffers of one tensor, and of different tensors, must not
 * overlap (except `step`, which tensors may share: see below). With numel 0
 * every pointer but `step` may be NULL.
 *
 * param          : the model parameter, F32, F16 or BF16, updated in place.
 * grad           : its gradient, F32, F16 or BF16 (may differ from param's);
 *                  only read (torch's fused kernels write the unscaled
 *                  gradient back; mixprec does not).
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
 * exp_avg        : AdamW: first moment (FP32, required). SGD: the momentum
 *                  buffer (FP32), required when momentum != 0, else ignored.
 * exp_avg_sq     : AdamW: second moment (FP32, required). SGD: ignored.
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
  float *exp_avg;
  float *exp_avg_sq;
  float *max_exp_avg_sq;
  float *step;
  int64_t numel;
  mixprec_dtype param_dtype;
  mixprec_dtype grad_dtype;
} mixprec_opt_tensor;

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
 *                is skipped: nothing at all is written, step counts
 *                included, and the status is MIXPREC_OK.
 * sr_seed: the seed of the stochastic rounding of master-free BF16 params
 * (see mixprec_opt_tensor.master); unused by every other tensor. */
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
} mixprec_adamw_params;

/* Hyper-parameters of torch.optim.SGD (defaults: lr 1e-3, momentum 0,
 * dampening 0, weight_decay 0, nesterov 0, maximize 0); lr_tensor,
 * grad_scale, found_inf and sr_seed as in mixprec_adamw_params.
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
} mixprec_sgd_params;

/*! mixprec_adamw_params_default(), mixprec_sgd_params_default() :
 *  @return : torch's defaults (listed above), all pointers NULL, sr_seed 0. */
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
 *    g = grad; g = g / *grad_scale (if given); g = -g (if maximize);
 *    p = p * decay                               (only if weight_decay != 0)
 *    m = fma(w, g - m, m) if |w| < 0.5 else fma(w - 1, g - m, g)   (lerp)
 *    v = fma(c2 * g, g, v * beta2)        (tail: fma(v, beta2, (c2 * g) * g))
 *    vmax = max(vmax, v)                  (amsgrad only; NaN as torch's)
 *    denom = sqrt(amsgrad ? vmax : v) / bc2_sqrt + eps
 *    p = p - (step_size * m) / denom
 *    param = p rounded to param_dtype (nearest even) when param is F16/BF16
 *            with a master; stochastically (BF16 without a master: p was
 *            read from param)
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
 *    g = grad; g = g / *grad_scale (if given); g = -g (if maximize);
 *    g = fma(p, weight_decay, g)                 (only if weight_decay != 0)
 *    if momentum != 0:
 *      buf = g                        on the tensor's first step, else
 *      buf = fma(1 - dampening, g, buf * momentum)
 *            (in the last numel % 8 elements: fma(buf, momentum, g * (1 - dampening)))
 *      g = nesterov ? fma(buf, momentum, g) : buf
 *    p = fma(-g, lr, p);  param = p rounded to param_dtype when F16/BF16.
 *  (fma: one rounding, as torch's AVX2 build computes it: bitwise equal to
 *  torch's fused CPU SGD there; see c_ops/src/sgd.c.)
 *  "First step" (torch: the momentum_buffer is still None): for a tensor
 *  whose step is not NULL, it is *step == 0, read when the step runs (so a
 *  captured CUDA graph initialises the buffers on its first replay), and
 *  *step is advanced by 1; for a tensor whose step is NULL it is
 *  p->first_step. A skipped step (found_inf) advances nothing, so the next
 *  call still sees the first step; callers using p->first_step must keep it
 *  set until a step is not skipped.
 *  @return : as mixprec_adamw_step(); BAD_ARGUMENT also for nesterov with
 *            momentum <= 0 or dampening != 0; NULL_POINTER also for a
 *            master-free BF16 param without a step count. */
MIXPREC_API mixprec_status mixprec_sgd_step(const mixprec_opt_tensor *list,
                                            int64_t n,
                                            const mixprec_sgd_params *p);

/*! mixprec_cuda_adamw_step(), mixprec_cuda_sgd_step() (libmixprec_cuda) :
 *  As the CPU entry points, with the same formulas and statuses. `list` and
 *  `p` stay host pointers; every buffer in the descriptors, step included,
 *  and p->lr_tensor, p->grad_scale and p->found_inf are device pointers on
 *  the current device. Enqueued on `stream` (a cudaStream_t) with no host
 *  synchronisation: a skipped step is decided on the device, so it is
 *  capturable in a CUDA graph. Results must equal the CPU's bit for bit
 *  (sqrt and division correctly rounded, the lerp with fmaf). */
MIXPREC_API mixprec_status mixprec_cuda_adamw_step(
    const mixprec_opt_tensor *list, int64_t n, const mixprec_adamw_params *p,
    void *stream);
MIXPREC_API mixprec_status mixprec_cuda_sgd_step(
    const mixprec_opt_tensor *list, int64_t n, const mixprec_sgd_params *p,
    void *stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

/* The rest of the C API, one header per feature (each includes this one). */
#include "mixprec/nms.h"     /* greedy and class-aware NMS */
#include "mixprec/softmax.h" /* softmax, log_softmax, cross-entropy */

#endif /* MIXPREC_MIXPREC_H */
