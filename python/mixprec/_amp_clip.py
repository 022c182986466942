"""Gradient clipping for ``GradScaler.clip_grad_norm_``, two ways:

* unfolded: the norm comes from the unscale pass, then every gradient is
  multiplied by torch's clip coefficient ``min(1, max_norm / (norm + 1e-6))``
  (what ``torch.nn.utils.clip_grad_norm_`` does, minus its second read);
* folded (mixprec optimizers): a read-only pass gives the norm, and the
  optimizer divides the still-scaled gradients by ``scale / clip_coef`` in
  FP32 inside its step: the gradients are never written.
"""

from __future__ import annotations

import torch

from ._amp_grads import grads_by_device


def clip_coef(total: torch.Tensor, max_norm: float) -> torch.Tensor:
    """torch's clip coefficient, on the norm's device (no host sync)."""
    return torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)


def check_finite(total: torch.Tensor, error_if_nonfinite: bool) -> None:
    if error_if_nonfinite and bool(torch.logical_not(torch.isfinite(total))):
        raise RuntimeError(
            "mixprec.amp.GradScaler.clip_grad_norm_: the total norm of gradients is non-finite, "
            "so it cannot be clipped. Set error_if_nonfinite=False to skip the step instead."
        )


def scale_grads(optimizer: torch.optim.Optimizer, total: torch.Tensor, max_norm: float) -> None:
    """The multiply step of torch.nn.utils.clip_grad_norm_, per device."""
    coef = clip_coef(total, max_norm)
    with torch.no_grad():
        for device, grads in grads_by_device(optimizer).items():
            torch._foreach_mul_(grads, coef.to(device))


def folded_grad_scale(scale: torch.Tensor, total: torch.Tensor, max_norm: float) -> torch.Tensor:
    """What the optimizer divides the scaled gradients by to unscale and
    clip them in one FP32 division."""
    return scale / clip_coef(total, max_norm)
