"""Argument checks of ``mixprec.optim``'s optimizers: torch's checks of the
hyper-parameters, the EMA's group keys, and the per-param checks made at
each step (dtype, sparse gradients, a float16 param in a master-free group).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ._library import FLOAT_DTYPES as _PARAM_DTYPES

# The EMA's group keys with timm ModelEmaV3's defaults (ema_decay None: no EMA).
_EMA_DEFAULTS = dict(
    ema_decay=None, ema_min_decay=0.0, ema_use_warmup=False, ema_warmup_gamma=1.0, ema_warmup_power=2 / 3,
    ema_update_after_step=0, ema_update_every=1,
)


def _check_lr(lr) -> None:
    """torch's checks of ``lr``, for floats, ints and tensors (NaN fails
    ``0 <= lr`` and is refused too)."""
    if isinstance(lr, torch.Tensor) and lr.numel() != 1:
        raise ValueError("Tensor lr must be 1-element")
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")


def _torch_flags(foreach, capturable, differentiable, fused) -> dict[str, Any]:
    """torch's implementation flags, accepted so code written for torch's
    optimizers runs unchanged: mixprec's step is always one fused,
    capturable pass, so ``foreach`` / ``fused`` / ``capturable`` change
    nothing (they are kept in the param groups as torch keeps them);
    ``differentiable=True`` (autograd through the step) is not supported."""
    if differentiable:
        raise NotImplementedError(
            "mixprec.optim: differentiable=True (autograd through the optimizer step) is not supported"
        )
    return dict(foreach=foreach, capturable=bool(capturable), differentiable=False, fused=fused)


def _scalar(x, what: str) -> float:
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            raise ValueError(f"Tensor {what} must be 1-element")
        return float(x.item())
    return x


def _ema_defaults(ema_decay, ema_min_decay, ema_use_warmup, ema_warmup_gamma, ema_warmup_power,
                  ema_update_after_step, ema_update_every) -> dict[str, Any]:
    """The EMA's group keys, checked (the ranges of the C API,
    mixprec_ema_params)."""
    if ema_decay is not None:
        if not 0.0 <= ema_decay <= 1.0:
            raise ValueError(f"Invalid ema_decay value: {ema_decay} (must be in [0, 1])")
        if not 0.0 <= ema_min_decay <= 1.0:
            raise ValueError(f"Invalid ema_min_decay value: {ema_min_decay} (must be in [0, 1])")
        if ema_use_warmup:
            for name, v in (("ema_warmup_gamma", ema_warmup_gamma), ("ema_warmup_power", ema_warmup_power)):
                if not (math.isfinite(v) and v > 0):
                    raise ValueError(f"Invalid {name} value: {v} (must be finite and > 0)")
        if int(ema_update_after_step) != ema_update_after_step or ema_update_after_step < 0:
            raise ValueError(f"Invalid ema_update_after_step value: {ema_update_after_step} (an integer >= 0)")
        if int(ema_update_every) != ema_update_every or ema_update_every < 1:
            raise ValueError(f"Invalid ema_update_every value: {ema_update_every} (an integer >= 1)")
    return dict(
        ema_decay=None if ema_decay is None else float(ema_decay), ema_min_decay=float(ema_min_decay),
        ema_use_warmup=bool(ema_use_warmup), ema_warmup_gamma=float(ema_warmup_gamma),
        ema_warmup_power=float(ema_warmup_power), ema_update_after_step=int(ema_update_after_step),
        ema_update_every=int(ema_update_every),
    )


class _ParamChecks:
    """The checks an optimizer makes on its params (mixed into
    ``mixprec.optim``'s base class)."""

    def _check_group_mode(self, group: dict[str, Any]) -> None:
        if group.get("master_weights", True):
            return
        for p in group["params"]:
            if p.dtype == torch.float16:
                raise ValueError(
                    f"{type(self).__name__}: master_weights=False is for bfloat16 (and float32) "
                    "parameters; float16 parameters need FP32 master weights"
                )

    def _check_param(self, p: torch.Tensor, group_index: int, index: int) -> None:
        if p.dtype not in _PARAM_DTYPES:
            raise RuntimeError(
                f"{type(self).__name__}: param_groups[{group_index}]['params'][{index}] is {p.dtype} "
                f"(shape {tuple(p.shape)}); parameters must be float32, float16 or bfloat16"
            )
        if p.grad is not None and p.grad.is_sparse:
            raise RuntimeError(
                f"{type(self).__name__}: param_groups[{group_index}]['params'][{index}] (shape "
                f"{tuple(p.shape)}) has a sparse gradient; mixprec's optimizers take dense gradients "
                "(torch.optim.SparseAdam is torch's for sparse ones)"
            )
