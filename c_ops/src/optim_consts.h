/* The constants of one fused optimizer step, computed here once for both
 * backends (adamw.c, sgd.c and kernels/adamw.cu, kernels/sgd.cu): the CPU and
 * the GPU must round every hyper-parameter to float the same way to agree bit
 * for bit. As torch's fused CPU kernels do, each constant is computed in
 * double from the C API's double hyper-parameters and rounded to float once.
 * Depends only on the public header. */
#ifndef MIXPREC_OPTIM_CONSTS_H
#define MIXPREC_OPTIM_CONSTS_H

#include <math.h>

#include "compiler.h"
#include "mixprec/optim.h"

/* The vector width (in floats) of the torch CPU kernels whose results the
 * optimizers reproduce bit for bit: Vectorized<float>::size() of torch's
 * AVX2 build. torch's fused CPU optimizers run a vectorised body over the
 * first numel - numel % width elements of each tensor and a scalar loop over
 * the rest, and the two round differently (see adamw.c, sgd.c); the GPU reproduces the split too. 16 would be
 * torch's AVX-512 build. Any value gives correct results; only the bitwise
 * equality of the last few elements of a tensor depends on it. */
#ifndef MIXPREC__OPT_TORCH_VEC
#define MIXPREC__OPT_TORCH_VEC 8
#endif

/* Double arithmetic of the per-tensor constants. The device evaluates them
 * and nvcc would contract a product and a sum into an FMA: explicit
 * round-to-nearest intrinsics there; the host code is built without
 * contraction. */
#ifdef __CUDA_ARCH__
#define MIXPREC__DMUL(a, b) __dmul_rn((a), (b))
#define MIXPREC__DADD(a, b) __dadd_rn((a), (b))
#define MIXPREC__DDIV(a, b) __ddiv_rn((a), (b))
#define MIXPREC__DSQRT(a) __dsqrt_rn(a)
#else
#define MIXPREC__DMUL(a, b) ((a) * (b))
#define MIXPREC__DADD(a, b) ((a) + (b))
#define MIXPREC__DDIV(a, b) ((a) / (b))
#define MIXPREC__DSQRT(a) sqrt(a)
#endif

/* AdamW's hyper-parameters as the element update uses them; one per call. */
typedef struct mixprec__adamw_hyper {
  float w;      /* lerp weight 1 - beta1 */
  float w_m1;   /* w - 1, the other branch's coefficient */
  int w_small;  /* |w| < 0.5 */
  float beta2, c2, eps; /* c2 = 1 - beta2 */
  int decay_on; /* weight_decay != 0 */
  int amsgrad, maximize;
} mixprec__adamw_hyper;

MIXPREC__INLINE mixprec__adamw_hyper mixprec__adamw_hyper_of(const mixprec_adamw_params *p) {
  mixprec__adamw_hyper h;
  h.w = (float)(1.0 - p->beta1);
  h.w_m1 = h.w - 1.0f;
  h.w_small = fabsf(h.w) < 0.5f;
  h.beta2 = (float)p->beta2;
  h.c2 = (float)(1.0 - p->beta2);
  h.eps = (float)p->eps;
  h.decay_on = p->weight_decay != 0.0;
  h.amsgrad = p->amsgrad != 0;
  h.maximize = p->maximize != 0;
  return h;
}

/* AdamW's constants of one tensor at its step count t = *step + 1, from the
 * bias corrections bc1 = 1 - beta1^t and bc2 = 1 - beta2^t (each backend
 * computes the powers its own way, see kernels/optim.cuh) and the learning
 * rate (torch reads an lr tensor as a double). */
MIXPREC__HD void mixprec__adamw_tensor_consts(double lr, double weight_decay, double bc1,
                                              double bc2, float *decay, float *step_size,
                                              float *bc2_sqrt) {
  *decay = (float)MIXPREC__DADD(1.0, -MIXPREC__DMUL(lr, weight_decay));
  *step_size = (float)MIXPREC__DDIV(lr, bc1);
  *bc2_sqrt = (float)MIXPREC__DSQRT(bc2);
}

/* SGD's hyper-parameters as the element update uses them; one per call. */
typedef struct mixprec__sgd_hyper {
  float lr, momentum, wd, damp1; /* damp1 = 1 - dampening */
  int wd_on, momentum_on, nesterov, maximize;
} mixprec__sgd_hyper;

/* lr: the learning rate the step uses (torch reads an lr tensor as a double;
 * a backend that reads it later, on the device, passes p->lr and replaces
 * h.lr there: (float)(double)x == x). */
MIXPREC__INLINE mixprec__sgd_hyper mixprec__sgd_hyper_of(const mixprec_sgd_params *p, double lr) {
  mixprec__sgd_hyper h;
  h.lr = (float)lr;
  h.momentum = (float)p->momentum;
  h.wd = (float)p->weight_decay;
  h.damp1 = (float)(1.0 - p->dampening);
  h.wd_on = p->weight_decay != 0.0;
  h.momentum_on = p->momentum != 0.0;
  h.nesterov = p->nesterov != 0;
  h.maximize = p->maximize != 0;
  return h;
}

/* The EMA of the weights (mixprec_ema_params) without its buffers: what a
 * kernel needs to compute a tensor's decay from its count on either backend. */
typedef struct mixprec__ema_hyper {
  double decay, min_decay, warmup_gamma, warmup_power;
  double after; /* update_after_step */
  double every; /* update_every (0 and 1: every step) */
  int use_warmup;
} mixprec__ema_hyper;

MIXPREC__INLINE mixprec__ema_hyper mixprec__ema_hyper_of(const mixprec_ema_params *e) {
  mixprec__ema_hyper h;
  h.decay = e->decay;
  h.min_decay = e->min_decay;
  h.warmup_gamma = e->warmup_gamma;
  h.warmup_power = e->warmup_power;
  h.after = (double)e->update_after_step;
  h.every = (double)e->update_every;
  h.use_warmup = e->use_warmup != 0;
  return h;
}

/* One tensor's EMA at one step: the lerp weight w = 1 - decay (rounded to
 * float once from double, as torch converts lerp's Scalar weight) and the
 * coefficient of torch.lerp's other branch. */
typedef struct mixprec__ema_w {
  float w, w_m1;
  int small; /* |w| < 0.5 */
} mixprec__ema_w;

/* Nonzero when a tensor whose count after the step is t updates its EMA at
 * this step; then *out is its weight. timm's ModelEmaV3.get_decay(t), in
 * double as Python computes it (the CUDA pow may differ from glibc's in the
 * last bit of the double, which changes the float weight only when the
 * value lies within ~2^-29 of a float rounding boundary; without warmup the
 * decay is a constant and both backends agree exactly). */
MIXPREC__HD int mixprec__ema_weight_at(const mixprec__ema_hyper *h, float t, mixprec__ema_w *out) {
  const double step = (double)t;
  if (h->every > 1.0 && fmod(step, h->every) != 0.0) return 0;
  const double s = MIXPREC__DADD(MIXPREC__DADD(step, -h->after), -1.0);
  double decay;
  if (!(s > 0.0)) {
    decay = 0.0;
  } else if (h->use_warmup) {
    decay = MIXPREC__DADD(1.0, -pow(MIXPREC__DADD(1.0, MIXPREC__DDIV(s, h->warmup_gamma)),
                                    -h->warmup_power));
    /* max(min(decay, self.decay), self.min_decay), Python's builtins. */
    if (h->decay < decay) decay = h->decay;
    if (h->min_decay > decay) decay = h->min_decay;
  } else {
    decay = h->decay;
  }
  out->w = (float)MIXPREC__DADD(1.0, -decay);
  out->w_m1 = out->w - 1.0f;
  out->small = fabsf(out->w) < 0.5f;
  return 1;
}

/* torch.lerp(ema, p, w) as its vectorised CPU kernel computes it (and its
 * scalar loop, once GCC contracts it: the same roundings, since
 * -(p - e) * (1 - w) == (w - 1) * (p - e) exactly). */
MIXPREC__HD float mixprec__ema_lerp(float e, float p, mixprec__ema_w w) {
  const float d = p - e;
  return w.small ? fmaf(w.w, d, e) : fmaf(w.w_m1, d, p);
}

#endif /* MIXPREC_OPTIM_CONSTS_H */
