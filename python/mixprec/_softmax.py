"""softmax, log_softmax and cross_entropy with FP32 accumulation on
FP16/BF16 (and FP32) inputs: public functions, fake kernels, autograd and
the autocast policy of ``torch.ops.mixprec.{softmax, log_softmax,
cross_entropy}`` and their backward ops.

The kernels read the half-precision input once per pass and compute every
max, exponential and sum in float32; no float32 copy of the input is made
(a non-contiguous input is first made contiguous in its own dtype).

Autocast: torch's autocast runs ``softmax``/``log_softmax``/``cross_entropy``
in float32 by casting their input to float32 (a full FP32 copy). mixprec's
ops are custom ops, which autocast leaves alone: they receive the FP16/BF16
tensor as it is and compute in FP32 themselves. To match what torch's
autocast returns, ``softmax``/``log_softmax`` with ``dtype=None`` produce
float32 while autocast is enabled for the input's device; the loss of
``cross_entropy`` is always float32.

Double backward is not supported: the backward ops have no derivative of
their own. ``weight`` receives no gradient.
"""

from __future__ import annotations

import torch

__all__ = ["softmax", "log_softmax", "cross_entropy"]

_FLOAT = (torch.float32, torch.float16, torch.bfloat16)
_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


# ---- fake kernels ------------------------------------------------------------


def _check_dim(op, x, dim):
    span = max(x.dim(), 1)
    torch._check(
        -span <= dim < span,
        lambda: f"mixprec::{op}: dim {dim} is out of range for a tensor of {x.dim()} dimensions "
        f"(expected in [{-span}, {span - 1}])",
    )


def _check_float(op, name, t):
    torch._check(
        t.dtype in _FLOAT, lambda: f"mixprec::{op}: {name} must be float32, float16 or bfloat16, got {t.dtype}"
    )


@torch.library.register_fake("mixprec::softmax")
def _softmax_fake(x, dim, dtype=None):
    _check_float("softmax", "self", x)
    _check_dim("softmax", x, dim)
    return x.new_empty(x.shape, dtype=dtype or x.dtype)


@torch.library.register_fake("mixprec::log_softmax")
def _log_softmax_fake(x, dim, dtype=None):
    _check_float("log_softmax", "self", x)
    _check_dim("log_softmax", x, dim)
    return x.new_empty(x.shape, dtype=dtype or x.dtype)


def _softmax_backward_fake_impl(op, grad_output, output, dim, input_dtype):
    _check_float(op, "output", output)
    torch._check(grad_output.dtype == output.dtype, lambda: f"mixprec::{op}: grad_output must have output's dtype")
    torch._check(grad_output.shape == output.shape, lambda: f"mixprec::{op}: grad_output has the wrong shape")
    _check_dim(op, output, dim)
    return output.new_empty(output.shape, dtype=input_dtype)


@torch.library.register_fake("mixprec::softmax_backward")
def _softmax_backward_fake(grad_output, output, dim, input_dtype):
    return _softmax_backward_fake_impl("softmax_backward", grad_output, output, dim, input_dtype)


@torch.library.register_fake("mixprec::log_softmax_backward")
def _log_softmax_backward_fake(grad_output, output, dim, input_dtype):
    return _softmax_backward_fake_impl("log_softmax_backward", grad_output, output, dim, input_dtype)


def _ce_target_shape(op, x, target):
    torch._check(x.dim() >= 1, lambda: f"mixprec::{op}: self must have shape (C), (N, C) or (N, C, d1, ...)")
    want = () if x.dim() == 1 else (x.shape[0], *x.shape[2:])
    torch._check(target.dtype == torch.int64, lambda: f"mixprec::{op}: target must be int64 class indices")
    torch._check(tuple(target.shape) == tuple(want), lambda: f"mixprec::{op}: target has the wrong shape")
    return want


@torch.library.register_fake("mixprec::cross_entropy")
def _cross_entropy_fake(x, target, weight, reduction, ignore_index, label_smoothing):
    _check_float("cross_entropy", "self", x)
    shape = _ce_target_shape("cross_entropy", x, target)
    loss = x.new_empty(shape if reduction == 0 else (), dtype=torch.float32)
    stats = x.new_empty((2, *shape), dtype=torch.float32)
    wsum = x.new_empty((), dtype=torch.float32)
    return loss, stats, wsum


@torch.library.register_fake("mixprec::cross_entropy_backward")
def _cross_entropy_backward_fake(grad_loss, x, target, weight, stats, weight_sum, reduction, ignore_index,
                                 label_smoothing):
    _check_float("cross_entropy_backward", "self", x)
    _ce_target_shape("cross_entropy_backward", x, target)
    return x.new_empty(x.shape)


# ---- autograd ----------------------------------------------------------------


def _softmax_setup(ctx, inputs, output):
    x, dim, _dtype = inputs
    ctx.dim = dim
    ctx.input_dtype = x.dtype
    ctx.save_for_backward(output)


def _softmax_backward(ctx, grad):
    (out,) = ctx.saved_tensors
    return torch.ops.mixprec.softmax_backward(grad, out, ctx.dim, ctx.input_dtype), None, None


def _log_softmax_backward(ctx, grad):
    (out,) = ctx.saved_tensors
    return torch.ops.mixprec.log_softmax_backward(grad, out, ctx.dim, ctx.input_dtype), None, None


def _no_double_backward(op):
    def backward(ctx, *grads):
        raise RuntimeError(f"mixprec::{op}: double backward is not supported")

    def setup(ctx, inputs, output):
        pass

    torch.library.register_autograd(f"mixprec::{op}", backward, setup_context=setup)


for _op in ("softmax_backward", "log_softmax_backward", "cross_entropy_backward"):
    _no_double_backward(_op)

torch.library.register_autograd("mixprec::softmax", _softmax_backward, setup_context=_softmax_setup)
torch.library.register_autograd("mixprec::log_softmax", _log_softmax_backward, setup_context=_softmax_setup)


def _ce_setup(ctx, inputs, output):
    x, target, weight, reduction, ignore_index, label_smoothing = inputs
    _loss, stats, wsum = output
    # Saved: the logits as given (no copy), the int64 targets, and two floats
    # per position (max, log-sum): nothing the size of an FP32 copy of the
    # logits.
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


# ---- public functions ----------------------------------------------------------


def _default_dtype(x: torch.Tensor, dtype):
    if dtype is not None:
        return dtype
    if x.device.type in ("cpu", "cuda") and torch.is_autocast_enabled(x.device.type):
        return torch.float32
    return None


def softmax(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.softmax(x.float(), dim)`` without the float32 copy of ``x``:
    reads float32/float16/bfloat16 ``x`` in its own dtype, computes in
    float32 (max-subtracted), writes ``dtype`` (default: ``x``'s dtype, or
    float32 inside ``torch.autocast``). Differentiable (once)."""
    return torch.ops.mixprec.softmax(x, dim, _default_dtype(x, dtype))


def log_softmax(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.log_softmax(x.float(), dim)`` without the float32 copy of
    ``x``; output dtype as in :func:`softmax`. Differentiable (once)."""
    return torch.ops.mixprec.log_softmax(x, dim, _default_dtype(x, dtype))


def cross_entropy(
    input: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """``torch.nn.functional.cross_entropy(input.float(), target, ...)`` for
    class-index targets, reading FP16/BF16 logits once without an FP32 copy.

    Shapes as torch's: input (C), (N, C) or (N, C, d1, ...); target (), (N)
    or (N, d1, ...) int64. The loss is always float32. Backward writes the
    gradient in the logits' dtype from the logits and two saved floats per
    position (the max and the log-sum of exponentials). ``mean`` divides by the sum of the targets'
    weights over non-ignored positions: NaN when all are ignored, like torch.
    A target outside ``[0, C)`` that is not ``ignore_index`` raises on the
    CPU; on CUDA it makes that position's loss NaN (no host sync).
    """
    if reduction not in _REDUCTIONS:
        raise ValueError(f"mixprec.ops.cross_entropy: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    if target.is_floating_point():
        raise RuntimeError(
            "mixprec::cross_entropy: target must be int64 class indices, got "
            f"{target.dtype} (class-probability targets are not supported)"
        )
    if weight is not None and weight.dtype != torch.float32:
        weight = weight.float()
    loss, _stats, _wsum = torch.ops.mixprec.cross_entropy(
        input, target, weight, _REDUCTIONS[reduction], int(ignore_index), float(label_smoothing)
    )
    return loss
