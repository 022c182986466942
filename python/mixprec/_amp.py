"""Loss-scaling ops: ``unscale_`` (fused unscale + inf/NaN check, optionally
with the gradient L2 norms from the same pass), its read-only twin
``grad_norm``, and ``update_scale_`` (dynamic loss-scale update on the
device): the public functions over ``torch.ops.mixprec`` and their fake
kernels. ``GradScaler`` (``amp.py``) is built on them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch

from ._args import as_bool, as_float, as_int
from ._library import FLOAT_DTYPES as _FLOAT
from ._registration import _IMPL_LIB, _bump_versions_on_mutation, _one_element, _refuse_sparse, _same_device

__all__ = ["unscale_", "grad_norm", "update_scale_"]


# ---- version counters and sparse arguments ------------------------------------

for _name in ("unscale_", "unscale_norm_", "grad_norm", "update_scale_", "update_scale_ex_"):
    _bump_versions_on_mutation(_name)
    _refuse_sparse(_name)


# ---- a loss scale that requires grad -------------------------------------------


def _refuse_leaf_requiring_grad(name: str, arg: str, lib: torch.library.Library = _IMPL_LIB) -> None:
    """Autograd kernel for ``mixprec::<name>`` refusing, as every torch
    in-place op does (``torch._amp_update_scale_`` included), to write its
    first argument ``arg`` when that is a leaf that requires grad while grad
    mode is on; then redispatches below autograd. The C++ op cannot see
    requires_grad (the stable ABI has no getter for it)."""
    op = getattr(torch.ops.mixprec, name).default
    after = torch._C._after_autograd_keyset

    def autograd(keyset, *args, **kwargs):
        t = args[0] if args else kwargs.get(arg)
        if isinstance(t, torch.Tensor) and t.requires_grad and t.is_leaf and torch.is_grad_enabled():
            raise RuntimeError(
                f"mixprec::{name}: {arg} is a leaf tensor that requires grad and cannot be written in place "
                "(as torch: a leaf Variable that requires grad is being used in an in-place operation); "
                "pass a scale that does not require grad, or call it under torch.no_grad()"
            )
        with torch._C._AutoDispatchBelowAutograd():
            return op.redispatch(keyset & after, *args, **kwargs)

    lib.impl(name, autograd, "Autograd", with_keyset=True)


for _name in ("update_scale_", "update_scale_ex_"):
    _refuse_leaf_requiring_grad(_name, "scale")


# ---- fake kernels ------------------------------------------------------------


def _check_unscale(op, grads, found_inf, inv_scale):
    """The device and dtype checks of the real kernels, so a traced or
    meta-dispatched call fails the same way an eager one does."""
    for name, t in (("found_inf", found_inf), ("inv_scale", inv_scale)):
        _one_element(op, name, t, torch.float32)
    _same_device(op, "found_inf", found_inf, ("inv_scale", inv_scale))
    torch._check(len(grads) > 0, lambda: f"mixprec::{op}: grads must be a non-empty list of tensors")
    for i, g in enumerate(grads):
        torch._check(
            g.layout == torch.strided,
            lambda: f"mixprec::{op}: grads[{i}] must be a strided tensor (sparse gradients are not supported)",
        )
        torch._check(
            g.dtype in _FLOAT,
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


def _check_update_scale(op, scale, growth_tracker, hysteresis_tracker, skipped_steps, found_inf,
                        growth_factor, backoff_factor, growth_interval, hysteresis, min_scale, max_scale):
    """shim/amp_op.h's update_scale_args, for traced and meta calls."""
    _one_element(op, "scale", scale, torch.float32)
    _one_element(op, "growth_tracker", growth_tracker, torch.int32)
    _one_element(op, "found_inf", found_inf, torch.float32)
    if hysteresis_tracker is not None:
        _one_element(op, "hysteresis_tracker", hysteresis_tracker, torch.int32)
    if skipped_steps is not None:
        _one_element(op, "skipped_steps", skipped_steps, torch.int64)
    _same_device(op, "scale", scale, ("growth_tracker", growth_tracker), ("hysteresis_tracker", hysteresis_tracker),
                 ("skipped_steps", skipped_steps), ("found_inf", found_inf))
    torch._check(math.isfinite(growth_factor) and growth_factor > 0,
                 lambda: f"mixprec::{op}: growth_factor must be finite and positive, got {growth_factor}")
    torch._check(math.isfinite(backoff_factor) and backoff_factor > 0,
                 lambda: f"mixprec::{op}: backoff_factor must be finite and positive, got {backoff_factor}")
    torch._check(1 <= growth_interval <= 2**31 - 1,
                 lambda: f"mixprec::{op}: growth_interval must be in [1, 2^31), got {growth_interval}")
    torch._check(1 <= hysteresis <= 2**31 - 1,
                 lambda: f"mixprec::{op}: hysteresis must be in [1, 2^31), got {hysteresis}")
    torch._check(min_scale >= 0 and max_scale >= min_scale,
                 lambda: f"mixprec::{op}: need 0 <= min_scale <= max_scale, got min_scale={min_scale} "
                 f"max_scale={max_scale}")


@torch.library.register_fake("mixprec::update_scale_")
def _update_scale_fake(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    _check_update_scale("update_scale_", scale, growth_tracker, None, None, found_inf, growth_factor,
                        backoff_factor, growth_interval, 1, 0.0, float("inf"))
    return None


@torch.library.register_fake("mixprec::update_scale_ex_")
def _update_scale_ex_fake(scale, growth_tracker, hysteresis_tracker, skipped_steps, found_inf, growth_factor,
                          backoff_factor, growth_interval, hysteresis, min_scale, max_scale):
    _check_update_scale("update_scale_ex_", scale, growth_tracker, hysteresis_tracker, skipped_steps, found_inf,
                        growth_factor, backoff_factor, growth_interval, hysteresis, min_scale, max_scale)
    return None


# ---- public functions ----------------------------------------------------------


def _grad_list(where: str, grads) -> list:
    """``grads`` as a list (a number was Python's "'int' object is not
    iterable"); its elements are the op's to check."""
    if not isinstance(grads, Iterable) or isinstance(grads, (str, bytes)):
        raise TypeError(f"{where}: grads must be a list of tensors, got {type(grads).__name__}")
    return list(grads)


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
    and bfloat16 tensors (mixed dtypes allowed in one list). Any strides are
    taken, as torch takes them (a non-dense gradient such as ``g[:, :5]``
    runs on a dense copy in its own dtype, written back: the same bits); a
    gradient listed twice, or one whose elements share memory (expanded),
    raises, since it would be written twice. Two views whose address ranges
    interleave without sharing an element (``g[:, ::2]`` and ``g[:, 1::2]``
    of one buffer) are refused too, where torch takes them: the overlap check
    compares address ranges; pass the base tensor instead.

    With ``return_norm=True`` also returns ``(per_tensor_norms, total_norm)``
    of the unscaled gradients from the same pass: the L2 norm of each tensor
    (float32, shape ``[len(grads)]``) and of all of them (float32, 0-dim, what
    ``torch.nn.utils.clip_grad_norm_`` computes), ready for clipping.
    """
    grads = _grad_list("mixprec.ops.unscale_", grads)
    if not as_bool("mixprec.ops.unscale_", "return_norm", return_norm):
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
    (``GradScaler.clip_grad_norm_(..., fold=True)``). The gradients are only
    read: one may be listed twice (counted twice), as ``torch._foreach_norm``
    takes it. An expanded gradient (stride-0 dimensions, such as
    ``g.expand(...)``) is read in place, each stored element counted as
    often as it appears (no dense copy of its logical size is made); one
    whose elements overlap otherwise (``as_strided``) and whose dense copy
    would be far larger than the memory it views is refused, naming it."""
    grads = _grad_list("mixprec.ops.grad_norm", grads)
    views, counts = [], []
    for i, g in enumerate(grads):
        v, m = _without_broadcast_dims(g)
        if isinstance(v, torch.Tensor) and v.layout is torch.strided and not v.is_contiguous():
            _check_copy_size(i, v)
        views.append(v)
        counts.append(m)
    if all(m == 1 for m in counts):
        return torch.ops.mixprec.grad_norm(views, found_inf, inv_scale)
    per, _ = torch.ops.mixprec.grad_norm(views, found_inf, inv_scale)
    # ||g|| = sqrt(m) ||v|| for g = v repeated m times; the total as the
    # kernel's, the square root of the sum of the squared norms (float64
    # here, so no square overflows on the way).
    per64 = per.double() * torch.tensor([math.sqrt(m) for m in counts], dtype=torch.float64, device=per.device)
    return per64.float(), per64.square().sum().sqrt().float()


def _without_broadcast_dims(g):
    """(``g`` without its stride-0 dimensions: index 0 there, kept as size-1
    dimensions; how many times each of its elements appears in ``g``)."""
    if not isinstance(g, torch.Tensor) or g.layout is not torch.strided or g.numel() == 0:
        return g, 1
    dims = [d for d in range(g.dim()) if g.stride(d) == 0 and g.size(d) > 1]
    if not dims:
        return g, 1
    m = 1
    for d in dims:
        m *= g.size(d)
    return g[tuple(slice(0, 1) if d in dims else slice(None) for d in range(g.dim()))], m


#: A dense copy of an overlapping gradient (what the op makes of one) is
#: refused above this size when it is also more than 4x the memory it views.
_COPY_LIMIT = 1 << 28


def _check_copy_size(i: int, v: torch.Tensor) -> None:
    nbytes = v.numel() * v.element_size()
    if nbytes <= _COPY_LIMIT:
        return
    span = 1 + sum((n - 1) * st for n, st in zip(v.shape, v.stride()))
    if nbytes > 4 * span * v.element_size():
        raise ValueError(
            f"mixprec.ops.grad_norm: grads[{i}] has overlapping elements (shape {tuple(v.shape)}, strides "
            f"{tuple(v.stride())}) and would be read through a dense copy of {nbytes} bytes, more than 4x the "
            f"{span * v.element_size()} bytes it views; pass a tensor without overlapping elements"
        )


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
    # The dispatcher takes a bool for an int or float argument; the op checks
    # the ranges (see [note: argument conversion] in _args.py).
    where = "mixprec.ops.update_scale_"
    growth_factor = as_float(where, "growth_factor", growth_factor)
    backoff_factor = as_float(where, "backoff_factor", backoff_factor)
    growth_interval = as_int(where, "growth_interval", growth_interval)
    hysteresis = as_int(where, "hysteresis", hysteresis)
    min_scale = as_float(where, "min_scale", min_scale)
    max_scale = as_float(where, "max_scale", max_scale, finite=False)
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
    torch.ops.mixprec.update_scale_ex_(scale, growth_tracker, hysteresis_tracker, skipped_steps, found_inf,
                                       growth_factor, backoff_factor, growth_interval, hysteresis, min_scale, max_scale)
