"""Gradient routing for ``GradScaler``: which gradients go to mixprec's fused
ops (one call per device for every dense FP32/FP16/BF16 gradient, whatever
the mix of dtypes) and which to torch's op (float64, sparse, overlapping
views, devices without mixprec kernels), and how the per-device results
(found_inf, L2 norms) come back together without a host sync.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch.amp.grad_scaler import _MultiDeviceReplicator

from ._library import FLOAT_DTYPES, handles

_FP16_GRADS_MESSAGE = (
    "Attempting to unscale FP16 gradients. (mixprec.amp.GradScaler: this optimizer keeps its state in "
    "the parameters' dtype, where float16 moments overflow to NaN; use mixprec.optim.AdamW / SGD, which "
    "keep FP32 master weights and state and take float16 gradients, or train float32 parameters under "
    "torch.autocast.)"
)


def is_dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense in some dimension order (what the fused
    kernel can walk as one flat array)."""
    if t.is_contiguous():
        return True
    dims = sorted(
        (i for i in range(t.dim()) if t.size(i) != 1),
        key=lambda i: (t.stride(i), t.size(i)),
    )
    expected = 1
    for i in dims:
        if t.stride(i) != expected:
            return False
        expected *= t.size(i)
    return True


def fusable(g: torch.Tensor) -> bool:
    """True when mixprec's fused ops take this gradient."""
    return not g.is_sparse and g.dtype in FLOAT_DTYPES and handles(g.device) and is_dense(g)


def accepts_fp16_grads(optimizer: torch.optim.Optimizer) -> bool:
    """Optimizers that keep FP32 state (and FP32 master weights) for float16
    parameters say so with ``_accepts_fp16_grads = True`` (mixprec's do);
    handing float16 gradients to any other is refused, as torch's
    ``GradScaler.unscale_`` refuses it."""
    return bool(getattr(optimizer, "_accepts_fp16_grads", False))


def grads_by_device(optimizer: torch.optim.Optimizer) -> dict[torch.device, list[torch.Tensor]]:
    out: dict[torch.device, list[torch.Tensor]] = defaultdict(list)
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                out[p.grad.device].append(p.grad)
    return out


def all_fusable(optimizer: torch.optim.Optimizer) -> bool:
    return all(fusable(g) for gs in grads_by_device(optimizer).values() for g in gs)


def unscale_grads(
    optimizer: torch.optim.Optimizer,
    inv_scale: torch.Tensor,
    found_inf: torch.Tensor,
    *,
    allow_fp16: bool,
    want_norm: bool = False,
    read_only: bool = False,
):
    """Unscales every grad of ``optimizer``: one fused call per device for
    all float32/float16/bfloat16 dense grads; torch's op for the rest.
    Returns the per-device found_inf dict and, if ``want_norm``, the list of
    partial L2 norms per device. ``read_only``: only the non-finite check
    (inv_scale must be 1), which the fused grads get from the read-only
    ``grad_norm`` op. ``allow_fp16=False`` raises torch's ValueError on a
    float16 gradient before anything is written."""
    per_device_inv_scale = _MultiDeviceReplicator(inv_scale)
    per_device_found_inf = _MultiDeviceReplicator(found_inf)
    fused: dict[torch.device, list[torch.Tensor]] = defaultdict(list)
    other: dict[torch.device, dict[torch.dtype, list[torch.Tensor]]] = defaultdict(lambda: defaultdict(list))
    norms: dict[torch.device, list[torch.Tensor]] = defaultdict(list)
    with torch.no_grad():
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad
                if not allow_fp16 and grad.dtype == torch.float16:
                    raise ValueError(_FP16_GRADS_MESSAGE)
                if grad.is_sparse:
                    if grad.dtype is torch.float16:
                        param.grad = grad = grad.coalesce()
                    other[grad.device][grad.dtype].append(grad._values())
                elif fusable(grad):
                    fused[grad.device].append(grad)
                else:
                    other[grad.device][grad.dtype].append(grad)
        for device, grads in fused.items():
            fi, inv = per_device_found_inf.get(device), per_device_inv_scale.get(device)
            if read_only:
                torch.ops.mixprec.grad_norm(grads, fi, inv)
            elif want_norm:
                _, total = torch.ops.mixprec.unscale_norm_(grads, fi, inv)
                norms[device].append(total)
            else:
                torch.ops.mixprec.unscale_(grads, fi, inv)
        for device, per_dtype in other.items():
            fi, inv = per_device_found_inf.get(device), per_device_inv_scale.get(device)
            for grads in per_dtype.values():
                if grads[0].dtype is torch.bfloat16 or grads[0].dtype is torch.float16:
                    # torch's op may lack these dtypes on this device:
                    # unscale an FP32 copy and write it back rounded.
                    wide = [g.float() for g in grads]
                    torch._amp_foreach_non_finite_check_and_unscale_(wide, fi, inv)
                    for g, w in zip(grads, wide):
                        g.copy_(w)
                else:
                    torch._amp_foreach_non_finite_check_and_unscale_(grads, fi, inv)
                if want_norm:
                    per = [torch.linalg.vector_norm(g, dtype=torch.float64) for g in grads]
                    norms[device].append(torch.linalg.vector_norm(torch.stack(per)))
    return per_device_found_inf._per_device_tensors, norms


def grad_norms_read_only(optimizer, inv_scale: torch.Tensor, found_inf: torch.Tensor):
    """The read-only pass of the folded clip: per-device found_inf and L2
    norms of ``grad * inv_scale``, the grads untouched (all must be
    fusable)."""
    per_device_inv_scale = _MultiDeviceReplicator(inv_scale)
    per_device_found_inf = _MultiDeviceReplicator(found_inf)
    norms: dict[torch.device, list[torch.Tensor]] = defaultdict(list)
    with torch.no_grad():
        for device, gs in grads_by_device(optimizer).items():
            _, total = torch.ops.mixprec.grad_norm(gs, per_device_found_inf.get(device), per_device_inv_scale.get(device))
            norms[device].append(total)
    return per_device_found_inf._per_device_tensors, norms


def combine_norms(norms: dict[torch.device, list[torch.Tensor]], dev: torch.device) -> torch.Tensor:
    """The L2 norm of several partial L2 norms (devices, fallback groups),
    in float64 so no square overflows, on ``dev``, without a host sync."""
    parts = [n.to(dev, non_blocking=True).double() for group in norms.values() for n in group]
    if not parts:
        return torch.zeros((), dtype=torch.float32, device=dev)
    if len(parts) == 1:
        return parts[0].float()
    return torch.linalg.vector_norm(torch.stack(parts)).float()


def plain_total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    if not grads:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
