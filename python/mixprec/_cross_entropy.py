"""cross_entropy with FP32 accumulation on FP16/BF16 (and FP32) logits:
the public function, fake kernels and autograd of
``torch.ops.mixprec.cross_entropy`` (class-index targets),
``torch.ops.mixprec.cross_entropy_soft`` (class-probability targets: Mixup,
CutMix, distillation) and their backward ops.

The kernel reads the half-precision logits once per pass, computes every
max, exponential and sum in float32 and saves two floats per position (max
and log-sum) for the backward: no float32 copy of the logits. The loss is
always float32. ``weight`` receives no gradient; double backward is not
supported.
"""

from __future__ import annotations

import torch

from ._act_pack import keep_exact
from ._args import as_int, as_real, check_tensor
from ._registration import _refuse_sparse, _same_device
from ._softmax import _check_float, _no_double_backward

__all__ = ["cross_entropy"]

_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}

# A sparse argument: a mixprec error naming it, not the dispatcher's page.
for _name in ("cross_entropy", "cross_entropy_backward", "cross_entropy_soft", "cross_entropy_soft_backward"):
    _refuse_sparse(_name)


# ---- fake kernels ------------------------------------------------------------


def _target_dtype_message(op, dtype):
    why = (
        " (a class-probability target must have self's shape; mixprec.ops.cross_entropy sends those to "
        "mixprec::cross_entropy_soft)"
        if dtype.is_floating_point
        else " (convert it with target.long())"
    )
    return f"mixprec::{op}: target must be int64 class indices, got {dtype}{why}"


def _ce_target_shape(op, x, target):
    torch._check(x.dim() >= 1, lambda: f"mixprec::{op}: self must have shape (C), (N, C) or (N, C, d1, ...)")
    want = () if x.dim() == 1 else (x.shape[0], *x.shape[2:])
    torch._check(target.dtype == torch.int64, lambda: _target_dtype_message(op, target.dtype))
    torch._check(tuple(target.shape) == tuple(want), lambda: f"mixprec::{op}: target has the wrong shape")
    return want


def _options_check(op, x, weight, reduction, label_smoothing):
    """The checks both targets' ops share (shim/cross_entropy_op.h)."""
    torch._check(0 <= reduction <= 2,
                 lambda: f"mixprec::{op}: reduction must be 0 (none), 1 (mean) or 2 (sum), got {reduction}")
    torch._check(0.0 <= label_smoothing <= 1.0,
                 lambda: f"mixprec::{op}: label_smoothing must be in [0, 1], got {label_smoothing}")
    if weight is not None:
        torch._check(weight.dtype == torch.float32,
                     lambda: f"mixprec::{op}: weight must be a float32 tensor, got {weight.dtype}")
        torch._check(weight.dim() == 1 and weight.shape[0] == x.shape[0 if x.dim() == 1 else 1],
                     lambda: f"mixprec::{op}: weight must have shape (C,) (one per class)")


def _ce_check(op, x, target, weight, reduction, label_smoothing):
    """shim/cross_entropy_op.h's ce_args, for traced and meta calls."""
    _check_float(op, "self", x)
    _same_device(op, "self", x, ("target", target), ("weight", weight))
    shape = _ce_target_shape(op, x, target)
    _options_check(op, x, weight, reduction, label_smoothing)
    return shape


@torch.library.register_fake("mixprec::cross_entropy")
def _cross_entropy_fake(x, target, weight, reduction, ignore_index, label_smoothing):
    shape = _ce_check("cross_entropy", x, target, weight, reduction, label_smoothing)
    loss = x.new_empty(shape if reduction == 0 else (), dtype=torch.float32)
    stats = x.new_empty((2, *shape), dtype=torch.float32)
    wsum = x.new_empty((), dtype=torch.float32)
    return loss, stats, wsum


@torch.library.register_fake("mixprec::cross_entropy_backward")
def _cross_entropy_backward_fake(grad_loss, x, target, weight, stats, weight_sum, reduction, ignore_index,
                                 label_smoothing):
    op = "cross_entropy_backward"
    _ce_check(op, x, target, weight, reduction, label_smoothing)
    _same_device(op, "self", x, ("grad_loss", grad_loss), ("stats", stats), ("weight_sum", weight_sum))
    torch._check(grad_loss.dtype == torch.float32, lambda: f"mixprec::{op}: grad_loss must be float32")
    torch._check(stats.dtype == torch.float32, lambda: f"mixprec::{op}: stats must be float32")
    torch._check(weight_sum.dtype == torch.float32 and weight_sum.numel() == 1,
                 lambda: f"mixprec::{op}: weight_sum must be a one-element float32 tensor")
    return x.new_empty(x.shape)


def _soft_check(op, x, target, weight, reduction, label_smoothing):
    """shim/cross_entropy_op.h's soft_args, for traced and meta calls;
    returns the loss positions' shape."""
    _check_float(op, "self", x)
    _same_device(op, "self", x, ("target", target), ("weight", weight))
    torch._check(x.dim() >= 1, lambda: f"mixprec::{op}: self must have shape (C), (N, C) or (N, C, d1, ...)")
    torch._check(
        target.dtype in (torch.float32, torch.float16, torch.bfloat16),
        lambda: f"mixprec::{op}: target holds class probabilities and must be float32, float16 or bfloat16, "
        f"got {target.dtype}",
    )
    torch._check(
        tuple(target.shape) == tuple(x.shape),
        lambda: f"mixprec::{op}: target has shape {list(target.shape)} but class probabilities must have "
        f"self's shape {list(x.shape)}",
    )
    _options_check(op, x, weight, reduction, label_smoothing)
    return () if x.dim() == 1 else (x.shape[0], *x.shape[2:])


@torch.library.register_fake("mixprec::cross_entropy_soft")
def _cross_entropy_soft_fake(x, target, weight, reduction, label_smoothing):
    shape = _soft_check("cross_entropy_soft", x, target, weight, reduction, label_smoothing)
    loss = x.new_empty(shape if reduction == 0 else (), dtype=torch.float32)
    return loss, x.new_empty((3, *shape), dtype=torch.float32)


@torch.library.register_fake("mixprec::cross_entropy_soft_backward")
def _cross_entropy_soft_backward_fake(grad_loss, x, target, weight, stats, reduction, label_smoothing, self_grad,
                                      target_grad):
    op = "cross_entropy_soft_backward"
    shape = _soft_check(op, x, target, weight, reduction, label_smoothing)
    _same_device(op, "self", x, ("grad_loss", grad_loss), ("stats", stats))
    torch._check(grad_loss.dtype == torch.float32, lambda: f"mixprec::{op}: grad_loss must be a float32 tensor")
    torch._check(stats.dtype == torch.float32 and tuple(stats.shape) == (3, *shape),
                 lambda: f"mixprec::{op}: stats must be the float32 tensor of shape (3, ...) that "
                 "mixprec::cross_entropy_soft returned")
    dx = x.new_empty(x.shape if self_grad else (0,))
    dt = target.new_empty(target.shape if target_grad else (0,))
    return dx, dt


# ---- autograd ----------------------------------------------------------------


_no_double_backward("cross_entropy_backward")


def _ce_setup(ctx, inputs, output):
    x, target, weight, reduction, ignore_index, label_smoothing = inputs
    _loss, stats, wsum = output
    # Saved: the logits as given (no copy), the int64 targets, and two floats
    # per position (max, log-sum): nothing the size of an FP32 copy of the
    # logits.
    keep_exact(x)  # a packed copy's error would be exponentiated
    ctx.save_for_backward(x, target, weight, stats, wsum)
    ctx.args = (reduction, ignore_index, label_smoothing)
    ctx.mark_non_differentiable(stats, wsum)


def _ce_backward(ctx, grad_loss, _grad_stats, _grad_wsum):
    x, target, weight, stats, wsum = ctx.saved_tensors
    if grad_loss is None:
        return None, None, None, None, None, None
    reduction, ignore_index, label_smoothing = ctx.args
    dx = torch.ops.mixprec.cross_entropy_backward(
        grad_loss.float(), x, target, weight, stats, wsum, reduction, ignore_index, label_smoothing
    )
    return dx, None, None, None, None, None


torch.library.register_autograd("mixprec::cross_entropy", _ce_backward, setup_context=_ce_setup)

_no_double_backward("cross_entropy_soft_backward")


def _soft_setup(ctx, inputs, output):
    x, target, weight, reduction, label_smoothing = inputs
    _loss, stats = output
    # The logits and the target as given (no FP32 copy), three floats per
    # position.
    keep_exact(x)
    ctx.save_for_backward(x, target, weight, stats)
    ctx.args = (reduction, label_smoothing)
    ctx.mark_non_differentiable(stats)


def _soft_backward(ctx, grad_loss, _grad_stats):
    x, target, weight, stats = ctx.saved_tensors
    want_x, want_t = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    if grad_loss is None or not (want_x or want_t):
        return None, None, None, None, None
    reduction, label_smoothing = ctx.args
    dx, dt = torch.ops.mixprec.cross_entropy_soft_backward(
        grad_loss.float(), x, target, weight, stats, reduction, label_smoothing, want_x, want_t
    )
    return (dx if want_x else None), (dt if want_t else None), None, None, None


torch.library.register_autograd("mixprec::cross_entropy_soft", _soft_backward, setup_context=_soft_setup)


# ---- public function -----------------------------------------------------------


def cross_entropy(
    input: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """``torch.nn.functional.cross_entropy(input.float(), target, ...)``,
    reading FP16/BF16 logits once without an FP32 copy, for class-index and
    class-probability targets.

    Shapes as torch's: input (C), (N, C) or (N, C, d1, ...); target (), (N)
    or (N, d1, ...) int64. The loss is always float32. Backward writes the
    gradient in the logits' dtype from the logits and two saved floats per
    position (the max and the log-sum of exponentials). ``mean`` divides by the sum of the targets'
    weights over non-ignored positions: NaN when all are ignored, like torch.
    A target outside ``[0, C)`` that is not ``ignore_index`` raises on the
    CPU; on CUDA it makes that position's loss NaN (no host sync).

    Class probabilities (soft targets, as timm's and torchvision's
    Mixup/CutMix make): a target of ``input``'s shape, float32, float16 or
    bfloat16 whatever the logits' dtype (float64 is taken as float32: the
    loss is float32), as torch decides (same shape means probabilities).
    Per position ``-sum_c weight[c] * t'[c] * log_softmax(input)[c]`` with
    ``t' = t * (1 - label_smoothing) + label_smoothing / C``; ``mean``
    divides by the number of positions (N * d1 * ...), not by a weight sum,
    as torch; ``ignore_index`` does not apply (a value >= 0 raises, any
    negative one is accepted and changes nothing, as torch). A target that requires grad gets torch's gradient
    ``-g * (1 - label_smoothing) * weight[c] * log_softmax(input)[c]``.
    """
    check_tensor("mixprec.ops.cross_entropy", "input", input)
    check_tensor("mixprec.ops.cross_entropy", "target", target)
    check_tensor("mixprec.ops.cross_entropy", "weight", weight, none=True)
    if not isinstance(reduction, str):
        raise TypeError(f"mixprec.ops.cross_entropy: reduction must be a str, got {type(reduction).__name__}")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"mixprec.ops.cross_entropy: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    ignore_index = as_int("mixprec.ops.cross_entropy", "ignore_index", ignore_index)
    label_smoothing = as_real("mixprec.ops.cross_entropy", "label_smoothing", label_smoothing)
    if tuple(target.shape) == tuple(input.shape):
        # torch's rule: a target of the input's shape holds class probabilities.
        # torch refuses exactly the values that could name a class (>= 0);
        # a negative one matches no probability column, so it changes nothing.
        if int(ignore_index) >= 0:
            raise RuntimeError(
                f"mixprec::cross_entropy_soft: ignore_index ({ignore_index}) is not supported for "
                "class-probability targets (torch neither: it refuses any ignore_index >= 0)"
            )
        if target.dtype == torch.float64:
            target = target.float()
        if weight is not None and weight.dtype != torch.float32:
            weight = weight.float()
        loss, _stats = torch.ops.mixprec.cross_entropy_soft(
            input, target, weight, _REDUCTIONS[reduction], float(label_smoothing)
        )
        return loss
    if target.dtype != torch.int64:
        # A float target is torch's class-probability form; any other dtype
        # (int32, uint8, ...) is just not int64.
        raise RuntimeError(_target_dtype_message("cross_entropy", target.dtype))
    if weight is not None and weight.dtype != torch.float32:
        weight = weight.float()
    loss, _stats, _wsum = torch.ops.mixprec.cross_entropy(
        input, target, weight, _REDUCTIONS[reduction], int(ignore_index), float(label_smoothing)
    )
    return loss
