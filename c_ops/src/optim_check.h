/* Argument checks of the fused optimizer steps, shared verbatim by the CPU
 * entry points (adamw.c, sgd.c) and their CUDA twins (kernels/optim.cuh), so
 * both backends return the same status for the same arguments. Depends only
 * on the public header. */
#ifndef MIXPREC_OPTIM_CHECK_H
#define MIXPREC_OPTIM_CHECK_H

#include <math.h>

#include "compiler.h"
#include "mixprec/mixprec.h"

MIXPREC__INLINE int mixprec__opt_dtype_ok(mixprec_dtype d) {
  return d == MIXPREC_F32 || d == MIXPREC_F16 || d == MIXPREC_BF16;
}

/* A hyper-parameter must be finite and at least lo. */
MIXPREC__INLINE int mixprec__opt_finite_ge(double x, double lo) {
  return isfinite(x) && x >= lo;
}

/* Checks one descriptor's pointers, size and dtypes. The optimizer-specific
 * state pointers are checked by the caller. */
MIXPREC__INLINE mixprec_status mixprec__opt_check_tensor(const mixprec_opt_tensor *t) {
  if (t->numel < 0) return MIXPREC_ERR_BAD_SIZE;
  if (!mixprec__opt_dtype_ok(t->param_dtype) || !mixprec__opt_dtype_ok(t->grad_dtype))
    return MIXPREC_ERR_BAD_DTYPE;
  /* A master copy beside an F32 param would be a second, diverging copy. */
  if (t->param_dtype == MIXPREC_F32 && t->master) return MIXPREC_ERR_BAD_ARGUMENT;
  if (t->numel == 0) return MIXPREC_OK;
  if (!t->param || !t->grad) return MIXPREC_ERR_NULL_POINTER;
  /* BF16 without a master: the stochastic-rounding mode. F16 has no such
   * mode: its 5-bit exponent makes master-free training fragile. */
  if (t->param_dtype == MIXPREC_F16 && !t->master) return MIXPREC_ERR_NULL_POINTER;
  return MIXPREC_OK;
}

MIXPREC__INLINE int mixprec__opt_state_dtype_ok(mixprec_state_dtype d) {
  return d == MIXPREC_STATE_F32 || d == MIXPREC_STATE_BF16 || d == MIXPREC_STATE_Q8;
}

/* The lean state of one descriptor (mixprec_state_dtype in mixprec/optim.h);
 * use_v: the optimizer has a second moment (AdamW). Whether the state
 * buffers themselves are there is the caller's check. */
MIXPREC__INLINE mixprec_status mixprec__opt_check_lean(const mixprec_opt_tensor *t, int use_v) {
  const mixprec_state_dtype dm = t->exp_avg_dtype;
  const mixprec_state_dtype dv = use_v ? t->exp_avg_sq_dtype : MIXPREC_STATE_F32;
  if (!mixprec__opt_state_dtype_ok(dm) || !mixprec__opt_state_dtype_ok(dv))
    return MIXPREC_ERR_BAD_DTYPE;
  /* A remainder completes a BF16 param into a master: never beside one. */
  if (t->remainder && (t->param_dtype != MIXPREC_BF16 || t->master))
    return MIXPREC_ERR_BAD_ARGUMENT;
  if ((t->exp_avg_scale && dm != MIXPREC_STATE_Q8) ||
      (t->exp_avg_sq_scale && (!use_v || dv != MIXPREC_STATE_Q8)))
    return MIXPREC_ERR_BAD_ARGUMENT;
  if (t->numel == 0) return MIXPREC_OK;
  if ((dm == MIXPREC_STATE_Q8 && !t->exp_avg_scale) ||
      (dv == MIXPREC_STATE_Q8 && !t->exp_avg_sq_scale))
    return MIXPREC_ERR_NULL_POINTER;
  /* BF16 state is rounded with the count after the step. */
  if ((dm == MIXPREC_STATE_BF16 || dv == MIXPREC_STATE_BF16) && !t->step)
    return MIXPREC_ERR_NULL_POINTER;
  return MIXPREC_OK;
}

/* Nonzero when the tensor takes the lean path (any lean state). */
MIXPREC__INLINE int mixprec__opt_is_lean(const mixprec_opt_tensor *t, int use_v) {
  return t->remainder != NULL || t->exp_avg_dtype != MIXPREC_STATE_F32 ||
         (use_v && t->exp_avg_sq_dtype != MIXPREC_STATE_F32);
}

/* Nonzero for a master-free BF16 tensor (stochastic rounding). */
MIXPREC__INLINE int mixprec__opt_is_sr(const mixprec_opt_tensor *t) {
  return t->param_dtype == MIXPREC_BF16 && !t->master && !t->remainder;
}

/* The EMA's hyper-parameters (mixprec_ema_params); nothing when it is off. */
MIXPREC__INLINE mixprec_status mixprec__ema_check(const mixprec_ema_params *e) {
  if (!e->bufs) return MIXPREC_OK;
  if (!(e->decay >= 0.0 && e->decay <= 1.0) || !(e->min_decay >= 0.0 && e->min_decay <= 1.0) ||
      e->update_after_step < 0 || e->update_every < 0)
    return MIXPREC_ERR_BAD_ARGUMENT;
  if (e->use_warmup && (!mixprec__opt_finite_ge(e->warmup_gamma, 0.0) || !(e->warmup_gamma > 0.0) ||
                        !mixprec__opt_finite_ge(e->warmup_power, 0.0) || !(e->warmup_power > 0.0)))
    return MIXPREC_ERR_BAD_ARGUMENT;
  return MIXPREC_OK;
}

/* Tensor i's EMA buffer (NULL: none, also when the EMA is off). */
MIXPREC__INLINE float *mixprec__ema_buf(const mixprec_ema_params *e, int64_t i) {
  return e->bufs ? e->bufs[i] : NULL;
}

/* The argument checks of mixprec_adamw_step / mixprec_sgd_step, shared with
 * their CUDA twins (kernels/optim.cuh) so both return the same status. */
/* What both steps check first, in this order: the params pointer p, the
 * list's size and pointer, then the learning rate (a NULL-params caller
 * never reaches the lr, read through p after the first check). */
MIXPREC__INLINE mixprec_status mixprec__opt_check_list(const void *p, const mixprec_opt_tensor *list,
                                                        int64_t n) {
  if (!p) return MIXPREC_ERR_NULL_POINTER;
  if (n < 0) return MIXPREC_ERR_BAD_SIZE;
  if (n > 0 && !list) return MIXPREC_ERR_NULL_POINTER;
  return MIXPREC_OK;
}

/* A learning rate read from lr_tensor is not checked here; else lr >= 0 and
 * finite, as torch.optim checks it. */
MIXPREC__INLINE int mixprec__opt_lr_ok(const float *lr_tensor, double lr) {
  return lr_tensor || mixprec__opt_finite_ge(lr, 0.0);
}

/* One descriptor's checks shared by both steps: the tensor itself, then
 * (need_step) its step counter, then its lean state (use_v as in
 * mixprec__opt_check_lean). */
MIXPREC__INLINE mixprec_status mixprec__opt_check_entry(const mixprec_opt_tensor *t, int use_v,
                                                         int need_step) {
  mixprec_status st = mixprec__opt_check_tensor(t);
  if (st != MIXPREC_OK) return st;
  if (need_step && !t->step) return MIXPREC_ERR_NULL_POINTER;
  return mixprec__opt_check_lean(t, use_v);
}

MIXPREC__INLINE mixprec_status mixprec__adamw_check(const mixprec_opt_tensor *list, int64_t n,
                                                     const mixprec_adamw_params *p) {
  mixprec_status st = mixprec__opt_check_list(p, list, n);
  if (st != MIXPREC_OK) return st;
  /* torch.optim.AdamW's checks (0 <= lr, 0 <= eps, 0 <= beta < 1,
   * 0 <= weight_decay), plus finiteness. */
  if (!mixprec__opt_lr_ok(p->lr_tensor, p->lr)) return MIXPREC_ERR_BAD_ARGUMENT;
  if (!mixprec__opt_finite_ge(p->eps, 0.0) || !mixprec__opt_finite_ge(p->weight_decay, 0.0) ||
      !(p->beta1 >= 0.0 && p->beta1 < 1.0) || !(p->beta2 >= 0.0 && p->beta2 < 1.0))
    return MIXPREC_ERR_BAD_ARGUMENT;
  if (mixprec__ema_check(&p->ema) != MIXPREC_OK) return MIXPREC_ERR_BAD_ARGUMENT;
  for (int64_t i = 0; i < n; i++) {
    const mixprec_opt_tensor *t = &list[i];
    st = mixprec__opt_check_entry(t, 1, 1);
    if (st != MIXPREC_OK) return st;
    if (t->numel > 0 &&
        (!t->exp_avg || !t->exp_avg_sq || (p->amsgrad && !t->max_exp_avg_sq)))
      return MIXPREC_ERR_NULL_POINTER;
  }
  return MIXPREC_OK;
}

MIXPREC__INLINE mixprec_status mixprec__sgd_check(const mixprec_opt_tensor *list, int64_t n,
                                                   const mixprec_sgd_params *p) {
  mixprec_status st = mixprec__opt_check_list(p, list, n);
  if (st != MIXPREC_OK) return st;
  /* torch.optim.SGD's checks (0 <= lr, 0 <= momentum, 0 <= weight_decay,
   * nesterov needs momentum > 0 and dampening == 0), plus finiteness. */
  if (!mixprec__opt_lr_ok(p->lr_tensor, p->lr)) return MIXPREC_ERR_BAD_ARGUMENT;
  if (!mixprec__opt_finite_ge(p->momentum, 0.0) ||
      !mixprec__opt_finite_ge(p->weight_decay, 0.0) || !isfinite(p->dampening))
    return MIXPREC_ERR_BAD_ARGUMENT;
  if (p->nesterov && (!(p->momentum > 0.0) || p->dampening != 0.0))
    return MIXPREC_ERR_BAD_ARGUMENT;
  if (mixprec__ema_check(&p->ema) != MIXPREC_OK) return MIXPREC_ERR_BAD_ARGUMENT;
  for (int64_t i = 0; i < n; i++) {
    const mixprec_opt_tensor *t = &list[i];
    st = mixprec__opt_check_entry(t, 0, 0);
    if (st != MIXPREC_OK) return st;
    if (t->numel > 0 && p->momentum != 0.0 && !t->momentum_buffer) return MIXPREC_ERR_NULL_POINTER;
    if (t->numel > 0 && mixprec__opt_is_sr(t) && !t->step) return MIXPREC_ERR_NULL_POINTER;
    if (t->numel > 0 && mixprec__ema_buf(&p->ema, i) && !t->step) return MIXPREC_ERR_NULL_POINTER;
  }
  return MIXPREC_OK;
}

#endif /* MIXPREC_OPTIM_CHECK_H */
