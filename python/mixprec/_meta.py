"""Fake (meta) kernels for mixprec's ops, so torch.compile, torch.export and
FakeTensor tracing know their outputs without running them."""

from __future__ import annotations

import torch


_GRAD_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check_unscale(op, grads, found_inf, inv_scale):
    """The device and dtype checks of the real kernels, so a traced or
    meta-dispatched call fails the same way an eager one does."""
    for name, t in (("found_inf", found_inf), ("inv_scale", inv_scale)):
        torch._check(t.dtype == torch.float32, lambda: f"mixprec::{op}: {name} must be float32, got {t.dtype}")
        torch._check(t.numel() == 1, lambda: f"mixprec::{op}: {name} must have exactly one element")
        torch._check(
            t.device == found_inf.device,
            lambda: f"mixprec::{op}: {name} is on {t.device} but must be on {found_inf.device}",
        )
    torch._check(len(grads) > 0, lambda: f"mixprec::{op}: grads must be a non-empty list of tensors")
    for i, g in enumerate(grads):
        torch._check(
            g.dtype in _GRAD_DTYPES,
            lambda: f"mixprec::{op}: grads[{i}] must be float32, float16 or bfloat16, got {g.dtype}",
        )
        torch._check(
            g.device == found_inf.device,
            lambda: f"mixprec::{op}: grads[{i}] is on {g.device} but found_inf is on {found_inf.device}",
        )


@torch.library.register_fake("mixprec::unscale_")
def _unscale_fake(grads, found_inf, inv_scale):
    _check_unscale("unscale_", grads, found_inf, inv_scale)
    return None


def _norm_outputs(op, grads, found_inf, inv_scale):
    _check_unscale(op, grads, found_inf, inv_scale)
    per_tensor = found_inf.new_empty((len(grads),), dtype=torch.float32)
    total = found_inf.new_empty((), dtype=torch.float32)
    return per_tensor, total


@torch.library.register_fake("mixprec::unscale_norm_")
def _unscale_norm_fake(grads, found_inf, inv_scale):
    return _norm_outputs("unscale_norm_", grads, found_inf, inv_scale)


@torch.library.register_fake("mixprec::grad_norm")
def _grad_norm_fake(grads, found_inf, inv_scale):
    return _norm_outputs("grad_norm", grads, found_inf, inv_scale)


@torch.library.register_fake("mixprec::update_scale_")
def _update_scale_fake(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    return None


@torch.library.register_fake("mixprec::update_scale_ex_")
def _update_scale_ex_fake(
    scale,
    growth_tracker,
    hysteresis_tracker,
    skipped_steps,
    found_inf,
    growth_factor,
    backoff_factor,
    growth_interval,
    hysteresis,
    min_scale,
    max_scale,
):
    return None


def _check_opt(op, params, grads, masters, steps, states):
    n = len(params)
    torch._check(n > 0, lambda: f"mixprec::{op}: params must be a non-empty list of tensors")
    for name, lst in (("grads", grads), ("masters", masters), ("steps", steps)):
        torch._check(len(lst) == n, lambda: f"mixprec::{op}: {name} has {len(lst)} tensors but params has {n}")
    for name, lst in states:
        torch._check(len(lst) in (0, n), lambda: f"mixprec::{op}: {name} has {len(lst)} tensors but params has {n}")
    dev = params[0].device
    for i, p in enumerate(params):
        torch._check(p.dtype in _GRAD_DTYPES, lambda: f"mixprec::{op}: params[{i}] must be float32, float16 or bfloat16")
        torch._check(p.device == dev, lambda: f"mixprec::{op}: params[{i}] is on {p.device} but params[0] is on {dev}")
        torch._check(grads[i].shape == p.shape, lambda: f"mixprec::{op}: grads[{i}] must have the shape of params[{i}]")
        torch._check(
            p.dtype != torch.float16 or masters[i].numel() > 0 or p.numel() == 0,
            lambda: f"mixprec::{op}: masters[{i}] is empty but params[{i}] is float16: only bfloat16 params "
            "can go without an FP32 master (stochastic rounding)",
        )


@torch.library.register_fake("mixprec::adamw_step_")
def _adamw_step_fake(params, grads, masters, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr, beta1, beta2,
                     weight_decay, eps, amsgrad, maximize, lr_tensor, grad_scale, found_inf, sr_seed=0):
    _check_opt("adamw_step_", params, grads, masters, steps,
               (("exp_avgs", exp_avgs), ("exp_avg_sqs", exp_avg_sqs), ("max_exp_avg_sqs", max_exp_avg_sqs)))
    return None


@torch.library.register_fake("mixprec::sgd_step_")
def _sgd_step_fake(params, grads, masters, momentum_buffers, steps, lr, momentum, dampening, weight_decay,
                   nesterov, maximize, lr_tensor, grad_scale, found_inf, sr_seed=0):
    _check_opt("sgd_step_", params, grads, masters, steps, (("momentum_buffers", momentum_buffers),))
    return None
