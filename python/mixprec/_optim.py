"""Fake kernels of the fused optimizer ops ``torch.ops.mixprec.adamw_step_`` /
``sgd_step_``: the checks the real kernels make on list lengths, dtypes,
devices and shapes, so a traced call fails the way an eager one does. The
optimizer classes over these ops are in ``optim.py``.

With ``unscale_grads=True`` and a ``grad_scale`` (and a step that is not
skipped) the ops also overwrite each grad with ``grad / grad_scale`` in its
dtype, as torch's fused optimizers do; the fakes only check (every mutated
list, grads included, keeps its metadata). With ``emas`` (one FP32 buffer
per param) the same pass moves each EMA toward the new FP32 weights
(``mixprec.optim``'s ``ema_decay``); the fakes check those arguments too.
The lean state (``remainders``, bfloat16 / uint8 moments with their
``exp_avg_scales`` / ``exp_avg_sq_scales`` / ``buf_scales``; formats in
``mixprec/optim.h``) is checked the same way.
"""

from __future__ import annotations

import math

import torch

from ._registration import _bump_versions_on_mutation, _refuse_sparse, _same_device
from ._library import FLOAT_DTYPES as _FLOAT


def _check_opt(op, params, grads, masters, steps, states, scalars=(), emas=()):
    n = len(params)
    torch._check(n > 0, lambda: f"mixprec::{op}: params must be a non-empty list of tensors")
    # A meta tensor among CPU ones sends the call here (the Meta kernel):
    # refuse it, or the step would silently do nothing.
    lists = [("grads", grads), ("masters", masters), ("steps", steps), *states, ("emas", emas)]
    _same_device(
        op, "params[0]", params[0],
        *((f"params[{i}]", t) for i, t in enumerate(params)),
        *((f"{name}[{i}]", t) for name, lst in lists for i, t in enumerate(lst)),
        *scalars,
    )
    for name, lst in (("grads", grads), ("masters", masters), ("steps", steps)):
        torch._check(len(lst) == n, lambda: f"mixprec::{op}: {name} has {len(lst)} tensors but params has {n}")
    for name, lst in (*states, ("emas", emas)):
        torch._check(len(lst) in (0, n), lambda: f"mixprec::{op}: {name} has {len(lst)} tensors but params has {n}")
    dev = params[0].device
    for i, p in enumerate(params):
        torch._check(p.dtype in _FLOAT, lambda: f"mixprec::{op}: params[{i}] must be float32, float16 or bfloat16")
        torch._check(p.device == dev, lambda: f"mixprec::{op}: params[{i}] is on {p.device} but params[0] is on {dev}")
        torch._check(grads[i].shape == p.shape, lambda: f"mixprec::{op}: grads[{i}] must have the shape of params[{i}]")
        torch._check(
            p.dtype != torch.float16 or masters[i].numel() > 0 or p.numel() == 0,
            lambda: f"mixprec::{op}: masters[{i}] is empty but params[{i}] is float16: only bfloat16 params "
            "can go without an FP32 master (stochastic rounding)",
        )
    for i, e in enumerate(emas):
        torch._check(e.dtype == torch.float32, lambda: f"mixprec::{op}: emas[{i}] must be float32, got {e.dtype}")
        torch._check(e.shape == params[i].shape, lambda: f"mixprec::{op}: emas[{i}] must have the shape of params[{i}]")


_STATE_DTYPES = (torch.float32, torch.bfloat16, torch.uint8)


def _check_lean(op, params, masters, remainders, states, scales):
    """The lean-state checks of the real kernels (shim/optim_op.h): remainders
    beside bfloat16 params without a master; moments in float32, bfloat16 or
    uint8, a uint8 one with its ceil(numel / 256) float32 scales."""
    n = len(params)
    torch._check(len(remainders) in (0, n),
                 lambda: f"mixprec::{op}: remainders has {len(remainders)} tensors but params has {n}")
    for name, lst in scales:
        torch._check(len(lst) in (0, n), lambda: f"mixprec::{op}: {name} has {len(lst)} tensors but params has {n}")
    for i, r in enumerate(remainders):
        if r.numel() == 0:
            continue
        torch._check(r.dtype == torch.int16, lambda: f"mixprec::{op}: remainders[{i}] must be int16, got {r.dtype}")
        torch._check(r.shape == params[i].shape,
                     lambda: f"mixprec::{op}: remainders[{i}] must have the same shape and strides as params[{i}]")
        torch._check(params[i].dtype == torch.bfloat16,
                     lambda: f"mixprec::{op}: remainders[{i}] is given but params[{i}] is {params[i].dtype}: "
                     "remainders are for bfloat16 params only")
        torch._check(masters[i].numel() == 0,
                     lambda: f"mixprec::{op}: remainders[{i}] is given beside masters[{i}]")
    for (name, lst), (sname, slst) in zip(states, scales):
        for i, t in enumerate(lst):
            torch._check(t.dtype in _STATE_DTYPES,
                         lambda: f"mixprec::{op}: {name}[{i}] must be float32, bfloat16 or uint8 (8-bit blockwise), "
                         f"got {t.dtype}")
            has = bool(slst) and slst[i].numel() > 0
            blocks = (t.numel() + 255) // 256
            if t.dtype == torch.uint8 and t.numel() > 0:
                torch._check(has, lambda: f"mixprec::{op}: {name}[{i}] is uint8 (8-bit blockwise) but {sname}[{i}] "
                             f"is missing: it needs {blocks} float32 scales")
                torch._check(slst[i].dtype == torch.float32 and slst[i].numel() == blocks,
                             lambda: f"mixprec::{op}: {sname}[{i}] must be a contiguous float32 tensor of "
                             f"ceil(numel / 256) = {blocks} elements")
            else:
                torch._check(not has, lambda: f"mixprec::{op}: {sname}[{i}] is given but {name}[{i}] is not uint8")


def _check_ema(op, emas, decay, min_decay, use_warmup, gamma, power, after, every):
    """The EMA argument checks of the real kernels (shim/optim_op.h)."""
    if not emas:
        return
    torch._check(0.0 <= decay <= 1.0, lambda: f"mixprec::{op}: ema_decay must be in [0, 1], got {decay}")
    torch._check(0.0 <= min_decay <= 1.0, lambda: f"mixprec::{op}: ema_min_decay must be in [0, 1], got {min_decay}")
    if use_warmup:
        torch._check(math.isfinite(gamma) and gamma > 0,
                     lambda: f"mixprec::{op}: ema_warmup_gamma must be finite and > 0, got {gamma}")
        torch._check(math.isfinite(power) and power > 0,
                     lambda: f"mixprec::{op}: ema_warmup_power must be finite and > 0, got {power}")
    torch._check(after >= 0, lambda: f"mixprec::{op}: ema_update_after_step must be >= 0, got {after}")
    torch._check(every >= 1, lambda: f"mixprec::{op}: ema_update_every must be >= 1, got {every}")


@torch.library.register_fake("mixprec::adamw_step_")
def _adamw_step_fake(params, grads, masters, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr, beta1, beta2,
                     weight_decay, eps, amsgrad, maximize, lr_tensor, grad_scale, found_inf, sr_seed=0,
                     unscale_grads=False, emas=None, ema_decay=0.9999, ema_min_decay=0.0, ema_use_warmup=False,
                     ema_warmup_gamma=1.0, ema_warmup_power=2 / 3, ema_update_after_step=0, ema_update_every=1,
                     remainders=None, exp_avg_scales=None, exp_avg_sq_scales=None):
    _check_lean("adamw_step_", params, masters, remainders or (),
                (("exp_avgs", exp_avgs), ("exp_avg_sqs", exp_avg_sqs)),
                (("exp_avg_scales", exp_avg_scales or ()), ("exp_avg_sq_scales", exp_avg_sq_scales or ())))
    _check_opt("adamw_step_", params, grads, masters, steps,
               (("exp_avgs", exp_avgs), ("exp_avg_sqs", exp_avg_sqs), ("max_exp_avg_sqs", max_exp_avg_sqs)),
               (("lr_tensor", lr_tensor), ("grad_scale", grad_scale), ("found_inf", found_inf)), emas or ())
    _check_ema("adamw_step_", emas, ema_decay, ema_min_decay, ema_use_warmup, ema_warmup_gamma, ema_warmup_power,
               ema_update_after_step, ema_update_every)
    return None


@torch.library.register_fake("mixprec::sgd_step_")
def _sgd_step_fake(params, grads, masters, momentum_buffers, steps, lr, momentum, dampening, weight_decay,
                   nesterov, maximize, lr_tensor, grad_scale, found_inf, sr_seed=0, unscale_grads=False,
                   emas=None, ema_decay=0.9999, ema_min_decay=0.0, ema_use_warmup=False, ema_warmup_gamma=1.0,
                   ema_warmup_power=2 / 3, ema_update_after_step=0, ema_update_every=1, remainders=None,
                   buf_scales=None):
    _check_lean("sgd_step_", params, masters, remainders or (), (("momentum_buffers", momentum_buffers),),
                (("buf_scales", buf_scales or ()),))
    _check_opt("sgd_step_", params, grads, masters, steps, (("momentum_buffers", momentum_buffers),),
               (("lr_tensor", lr_tensor), ("grad_scale", grad_scale), ("found_inf", found_inf)), emas or ())
    _check_ema("sgd_step_", emas, ema_decay, ema_min_decay, ema_use_warmup, ema_warmup_gamma, ema_warmup_power,
               ema_update_after_step, ema_update_every)
    return None


# As the amp ops: the version counters of everything the step writes are
# bumped (autograd sees a saved param overwritten), and a sparse argument
# gets a message naming it.
# Grads are written only on the unscale path (with a grad_scale): a step
# without a scaler leaves their counters alone, as torch's optimizers do.
for _name in ("adamw_step_", "sgd_step_"):
    _bump_versions_on_mutation(
        _name, written_if={"grads": lambda arg: bool(arg("unscale_grads")) and arg("grad_scale") is not None}
    )
    _refuse_sparse(_name)
