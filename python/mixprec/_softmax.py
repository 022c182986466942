"""softmax and log_softmax with FP32 accumulation on FP16/BF16 (and FP32)
inputs: public functions, fake kernels, autograd and the autocast policy of
``torch.ops.mixprec.{softmax, log_softmax}`` and their backward ops
(cross-entropy, which shares their kernels, is in ``_cross_entropy.py``).

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
their own.
"""

from __future__ import annotations

import torch

from ._args import as_int, check_tensor
from ._registration import _refuse_sparse, _same_device
from ._library import FLOAT_DTYPES as _FLOAT

# A sparse argument: a mixprec error naming it, not the dispatcher's page.
for _name in ("softmax", "log_softmax", "softmax_backward", "log_softmax_backward"):
    _refuse_sparse(_name)

__all__ = ["softmax", "log_softmax"]


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
    _check_float(op, "grad_output", grad_output)
    _same_device(op, "output", output, ("grad_output", grad_output))
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


for _op in ("softmax_backward", "log_softmax_backward"):
    _no_double_backward(_op)

torch.library.register_autograd("mixprec::softmax", _softmax_backward, setup_context=_softmax_setup)
torch.library.register_autograd("mixprec::log_softmax", _log_softmax_backward, setup_context=_softmax_setup)


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
    check_tensor("mixprec.ops.softmax", "x", x)
    return torch.ops.mixprec.softmax(x, as_int("mixprec.ops.softmax", "dim", dim), _default_dtype(x, dtype))


def log_softmax(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.log_softmax(x.float(), dim)`` without the float32 copy of
    ``x``; output dtype as in :func:`softmax`. Differentiable (once)."""
    check_tensor("mixprec.ops.log_softmax", "x", x)
    return torch.ops.mixprec.log_softmax(x, as_int("mixprec.ops.log_softmax", "dim", dim), _default_dtype(x, dtype))
