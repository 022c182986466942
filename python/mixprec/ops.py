"""Python entry points of mixprec's ops (thin wrappers over torch.ops.mixprec)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._nms import TorchvisionPatch, batched_nms, nms, nms_padded, patch_torchvision  # noqa: F401
from ._softmax import cross_entropy, log_softmax, softmax  # noqa: F401


def unscale_(
    grads: Sequence[torch.Tensor],
    found_inf: torch.Tensor,
    inv_scale: torch.Tensor,
    *,
    return_norm: bool = False,
):
    """Multiplies every tensor of ``grads`` by ``inv_scale`` in place (FP32
    math, rounded back to each tensor's dtype) and sets ``found_inf`` to 1 if
    any element was inf or NaN, like
    ``torch._amp_foreach_non_finite_check_and_unscale_``, for float32, float16
    and bfloat16 tensors (mixed dtypes allowed in one list).

    With ``return_norm=True`` also returns ``(per_tensor_norms, total_norm)``
    of the unscaled gradients from the same pass: the L2 norm of each tensor
    (float32, shape ``[len(grads)]``) and of all of them (float32, 0-dim, what
    ``torch.nn.utils.clip_grad_norm_`` computes), ready for clipping.
    """
    grads = list(grads)
    if not return_norm:
        torch.ops.mixprec.unscale_(grads, found_inf, inv_scale)
        return None
    return torch.ops.mixprec.unscale_norm_(grads, found_inf, inv_scale)


def grad_norm(
    grads: Sequence[torch.Tensor],
    found_inf: torch.Tensor,
    inv_scale: torch.Tensor,
):
    """The read-only twin of ``unscale_(..., return_norm=True)``: returns
    ``(per_tensor_norms, total_norm)`` of the gradients times ``inv_scale``
    (equal bit for bit to what ``unscale_`` would return) and sets
    ``found_inf`` on inf/NaN, but leaves the gradients as they are. Used to
    fold unscaling and clipping into the optimizer step
    (``GradScaler.clip_grad_norm_(..., fold=True)``)."""
    return torch.ops.mixprec.grad_norm(list(grads), found_inf, inv_scale)


def update_scale_(
    scale: torch.Tensor,
    growth_tracker: torch.Tensor,
    found_inf: torch.Tensor,
    growth_factor: float = 2.0,
    backoff_factor: float = 0.5,
    growth_interval: int = 2000,
    *,
    hysteresis_tracker: torch.Tensor | None = None,
    skipped_steps: torch.Tensor | None = None,
    hysteresis: int = 1,
    min_scale: float = 0.0,
    max_scale: float = float("inf"),
) -> None:
    """Dynamic loss-scale update in place, on the scale's device, without a
    host sync. With the defaults it is ``torch._amp_update_scale_``. Extras:
    ``hysteresis`` (back off only after that many overflowing steps in a row;
    needs an int32 ``hysteresis_tracker`` initialised to ``hysteresis``),
    ``min_scale`` / ``max_scale`` bounds, and an int64 ``skipped_steps``
    counter incremented on every overflowing step."""
    if hysteresis_tracker is None and skipped_steps is None and hysteresis == 1 \
            and min_scale == 0.0 and max_scale == float("inf"):
        torch.ops.mixprec.update_scale_(
            scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval
        )
        return
    if hysteresis_tracker is None:
        if hysteresis != 1:
            raise RuntimeError("mixprec.ops.update_scale_: hysteresis > 1 needs a hysteresis_tracker")
        hysteresis_tracker = torch.ones((), dtype=torch.int32, device=scale.device)
    if skipped_steps is None:
        skipped_steps = torch.zeros((), dtype=torch.int64, device=scale.device)
    torch.ops.mixprec.update_scale_ex_(
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
    )
