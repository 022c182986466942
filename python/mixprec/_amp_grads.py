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

from . import _distributed
from ._distributed import NormParts, local
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
    """The optimizer's gradients (this rank's shards of DTensor ones) per
    device."""
    out: dict[torch.device, list[torch.Tensor]] = defaultdict(list)
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                g = local(p.grad)
                out[g.device].append(g)
    return out


def all_fusable(optimizer: torch.optim.Optimizer) -> bool:
    return all(fusable(g) for gs in grads_by_device(optimizer).values() for g in gs)


def _squares(norms: torch.Tensor) -> torch.Tensor:
    n = norms.double()
    return (n * n).sum()


def _grads_with_groups(optimizer, where: str, process_group, all_groups: dict, refuse_fp16: bool = False):
    """(param, its reduction groups) for every param with a grad, in param
    order, after the checks that must pass before anything is written;
    ``all_groups`` collects the groups in first-appearance order, the same
    on every rank (see _distributed.reduce_found_inf)."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is None:
                continue
            if refuse_fp16 and param.grad.dtype == torch.float16:
                raise ValueError(_FP16_GRADS_MESSAGE)
            _distributed.check_placements(param.grad, where)
            groups = _distributed.reduction_groups(param, param.grad, process_group)
            all_groups.update(dict.fromkeys(groups))
            yield param, groups


def unscale_grads(
    optimizer: torch.optim.Optimizer,
    inv_scale: torch.Tensor,
    found_inf: torch.Tensor,
    *,
    allow_fp16: bool,
    want_norm: bool = False,
    read_only: bool = False,
    process_group=None,
    per_tensor: list | None = None,
    skip=None,
):
    """Unscales every grad of ``optimizer``: one fused call per device for
    all float32/float16/bfloat16 dense grads (this rank's shards of DTensor
    grads); torch's op for the rest. Returns the per-device found_inf dict,
    reduced (MAX) over the ranks that share sharded grads, and, if
    ``want_norm``, the :class:`NormParts` of the unscaled grads.
    ``read_only``: only the non-finite check (inv_scale must be 1), which the
    fused grads get from the read-only ``grad_norm`` op.
    ``allow_fp16=False`` raises torch's ValueError on a float16 gradient
    before anything is written. ``process_group``: the ranks sharing FSDP1
    flat parameters (default: the world). ``per_tensor``: a list that
    receives ``(params, per-tensor norms, their reduction groups)`` of each
    call (the overflow diagnostics of ``_amp_health``); the fused calls then
    return their per-tensor norms (the same pass, the same grads written).
    ``skip``: a predicate on a grad: true for grads already unscaled in this
    iteration (``GradScaler.clip_grad_norm_(parameters, ...)``), which are
    checked (float16 refusal) and counted in the norms but not unscaled
    again; their found_inf was recorded when they were unscaled."""
    per_device_inv_scale = _MultiDeviceReplicator(inv_scale)
    per_device_found_inf = _MultiDeviceReplicator(found_inf)
    # device -> [(grad, its reduction groups)]
    fused: dict[torch.device, list[tuple[torch.Tensor, tuple, torch.Tensor]]] = defaultdict(list)
    other: dict[torch.device, dict[torch.dtype, list[tuple[torch.Tensor, tuple, torch.Tensor]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    already: dict[torch.device, list[tuple[torch.Tensor, tuple, torch.Tensor]]] = defaultdict(list)
    parts = NormParts()
    all_groups: dict = {}  # ordered: every rank reduces over the same groups in the same order
    with torch.no_grad():
        for param, groups in _grads_with_groups(
            optimizer, "mixprec.amp.GradScaler", process_group, all_groups, refuse_fp16=not allow_fp16
        ):
            grad = local(param.grad)
            if skip is not None and skip(param.grad):
                already[grad.device].append((grad._values() if grad.is_sparse else grad, groups, param))
            elif grad.is_sparse:
                if grad.dtype is torch.float16:
                    param.grad = grad = grad.coalesce()
                other[grad.device][grad.dtype].append((grad._values(), groups, param))
            elif fusable(grad):
                fused[grad.device].append((grad, groups, param))
            else:
                other[grad.device][grad.dtype].append((grad, groups, param))
        for device, entries in fused.items():
            grads = [g for g, _, _ in entries]
            fi, inv = per_device_found_inf.get(device), per_device_inv_scale.get(device)
            per = None
            if read_only:
                per, _ = torch.ops.mixprec.grad_norm(grads, fi, inv)
            elif want_norm or per_tensor is not None:
                per, total = torch.ops.mixprec.unscale_norm_(grads, fi, inv)
                if want_norm:
                    _add_norms(parts, device, entries, per, total)
            else:
                torch.ops.mixprec.unscale_(grads, fi, inv)
            _collect(per_tensor, entries, per)
        for device, per_dtype in other.items():
            fi, inv = per_device_found_inf.get(device), per_device_inv_scale.get(device)
            for entries in per_dtype.values():
                grads = [g for g, _, _ in entries]
                if grads[0].dtype is torch.bfloat16 or grads[0].dtype is torch.float16:
                    # torch's op may lack these dtypes on this device:
                    # unscale an FP32 copy and write it back rounded.
                    wide = [g.float() for g in grads]
                    torch._amp_foreach_non_finite_check_and_unscale_(wide, fi, inv)
                    for g, w in zip(grads, wide):
                        g.copy_(w)
                else:
                    torch._amp_foreach_non_finite_check_and_unscale_(grads, fi, inv)
                if want_norm or per_tensor is not None:
                    per = torch.stack([torch.linalg.vector_norm(g, dtype=torch.float64) for g in grads])
                    if want_norm:
                        _add_norms(parts, device, entries, per, torch.linalg.vector_norm(per))
                    _collect(per_tensor, entries, per)
        if want_norm or per_tensor is not None:
            for device, entries in already.items():
                per = torch.stack([torch.linalg.vector_norm(g, dtype=torch.float64) for g, _, _ in entries])
                if want_norm:
                    _add_norms(parts, device, entries, per, torch.linalg.vector_norm(per))
                _collect(per_tensor, entries, per)
    found = per_device_found_inf._per_device_tensors
    _distributed.reduce_found_inf(found, all_groups)
    return found, parts


def _add_norms(parts: NormParts, device, entries, per: torch.Tensor, total: torch.Tensor) -> None:
    """One fused call's norms into ``parts``: its total as it is when every
    grad is whole on this rank (the common case, bit for bit what the op
    returned), else the squared per-tensor norms per reduction key."""
    keys = [groups for _, groups, _ in entries]
    if not any(keys):
        parts.add_local(device, total)
        return
    by_key: dict[tuple, list[int]] = defaultdict(list)
    for i, k in enumerate(keys):
        by_key[k].append(i)
    for k, idx in by_key.items():
        sq = _squares(per[torch.tensor(idx, device=per.device)])
        if k:
            parts.add_sharded(k, sq)
        else:
            parts.add_local(device, sq.sqrt())


def _collect(per_tensor: list | None, entries, per: torch.Tensor | None) -> None:
    if per_tensor is not None and per is not None:
        per_tensor.append(([p for _, _, p in entries], per, [groups for _, groups, _ in entries]))


def grad_norms_read_only(
    optimizer, inv_scale: torch.Tensor, found_inf: torch.Tensor, process_group=None, per_tensor: list | None = None
):
    """The read-only pass of the folded clip: per-device found_inf (reduced
    over sharding ranks) and the NormParts of ``grad * inv_scale``, the
    grads untouched (all must be fusable)."""
    per_device_inv_scale = _MultiDeviceReplicator(inv_scale)
    per_device_found_inf = _MultiDeviceReplicator(found_inf)
    entries_by_device: dict[torch.device, list[tuple[torch.Tensor, tuple, torch.Tensor]]] = defaultdict(list)
    all_groups: dict = {}  # ordered: every rank reduces over the same groups in the same order
    for p, groups in _grads_with_groups(optimizer, "mixprec.amp.GradScaler.clip_grad_norm_", process_group, all_groups):
        g = local(p.grad)
        entries_by_device[g.device].append((g, groups, p))
    parts = NormParts()
    with torch.no_grad():
        for device, entries in entries_by_device.items():
            per, total = torch.ops.mixprec.grad_norm(
                [g for g, _, _ in entries], per_device_found_inf.get(device), per_device_inv_scale.get(device)
            )
            _add_norms(parts, device, entries, per, total)
            _collect(per_tensor, entries, per)
    found = per_device_found_inf._per_device_tensors
    _distributed.reduce_found_inf(found, all_groups)
    return found, parts


class ParamList:
    """A list of parameters in the shape this module reads an optimizer in
    (``param_groups``), for ``GradScaler.clip_grad_norm_(parameters, ...)``."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.param_groups = [{"params": params}]


def plain_total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The norm a disabled scaler returns (no sharding reduction: a disabled
    scaler is a plain pass-through)."""
    if not grads:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(local(g).float()) for g in grads]))
