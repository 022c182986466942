"""mixprec on torch.distributed: what the scaler and the optimizers need to
know about sharded parameters, in one place.

* DTensor parameters and gradients (FSDP2's ``fully_shard``, tensor
  parallel) are handed to mixprec's ops as their local shards
  (``local()``): the ops are elementwise per tensor (the optimizers) or
  reductions the callers finish themselves (found_inf, norms). Direct
  ``torch.ops.mixprec.*`` calls on DTensors go through the handlers at the
  end of this module.
* The ranks that hold shards of one model must agree: found_inf is reduced
  (MAX) and squared gradient norms summed over them before anyone uses them.
  For a DTensor gradient those ranks are the mesh dimensions it is sharded
  on (Shard or Partial placements; a Replicate dimension already holds the
  whole value); for an FSDP1 flat parameter, the scaler's process group.
  DDP gradients are already all-reduced: nothing to do.
"""

from __future__ import annotations

from collections import defaultdict

import torch

try:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import Partial, Replicate
except ImportError:  # a torch built without distributed
    dist = None
    DTensor = None


def is_dtensor(t) -> bool:
    return DTensor is not None and isinstance(t, DTensor)


def local(t: torch.Tensor) -> torch.Tensor:
    """The shard this rank holds (the tensor itself when not a DTensor)."""
    return t._local_tensor if is_dtensor(t) else t


def _is_fsdp1_flat(p: torch.Tensor) -> bool:
    return bool(getattr(p, "_fsdp_flattened", False))


def reduction_groups(param: torch.Tensor, grad: torch.Tensor, process_group) -> tuple:
    """The process groups over which this gradient's norm and inf check must
    be reduced (empty: it is whole on this rank)."""
    if is_dtensor(grad):
        mesh = grad.device_mesh
        out = []
        for dim, placement in enumerate(grad.placements):
            if isinstance(placement, Replicate):
                continue
            out.append(mesh.get_group(dim))
        return tuple(out)
    if _is_fsdp1_flat(param) and dist is not None and dist.is_initialized():
        return (process_group if process_group is not None else dist.group.WORLD,)
    return ()


def check_placements(grad: torch.Tensor, where: str) -> None:
    if is_dtensor(grad) and any(isinstance(p, Partial) for p in grad.placements):
        raise RuntimeError(
            f"{where}: a gradient with a Partial placement (not yet reduced over its mesh) cannot be "
            f"unscaled or clipped shard by shard; got placements {grad.placements}"
        )


def _all_reduce(t: torch.Tensor, op, group) -> None:
    """In place; a CPU tensor under a backend that needs CUDA tensors (NCCL)
    goes through the current CUDA device and back."""
    if t.device.type == "cpu" and dist.get_backend(group) == "nccl":
        moved = t.to(torch.device("cuda", torch.cuda.current_device()))
        dist.all_reduce(moved, op=op, group=group)
        t.copy_(moved)
    else:
        dist.all_reduce(t, op=op, group=group)


def reduce_found_inf(found_per_device: dict, groups) -> None:
    """found_inf := MAX over every rank of ``groups``, on every device, so a
    skip is everyone's skip. ``groups`` is ordered the same on every rank
    (first appearance in the optimizer's param order, mesh dims in order):
    MAX over a 2-D mesh's dp groups and then its tp groups reaches every rank
    of the mesh only if no rank does them the other way round. No host sync
    under NCCL (the collective is queued on the stream)."""
    for group in groups:
        for fi in found_per_device.values():
            _all_reduce(fi, dist.ReduceOp.MAX, group)


class NormParts:
    """Partial L2 norms of one optimizer's gradients, reduced where sharded.
    ``local`` parts are whole on this rank (their L2 norms combine exactly as
    before any sharding existed); ``sharded`` parts are squared sums keyed by
    the groups to sum them over."""

    def __init__(self) -> None:
        self.local: dict[torch.device, list[torch.Tensor]] = defaultdict(list)
        self.sharded: dict[tuple, list[torch.Tensor]] = defaultdict(list)

    def add_local(self, device: torch.device, norm: torch.Tensor) -> None:
        self.local[device].append(norm)

    def add_sharded(self, groups: tuple, squared: torch.Tensor) -> None:
        self.sharded[groups].append(squared.double())

    def total(self, dev: torch.device) -> torch.Tensor:
        """The global L2 norm on ``dev`` (float32, 0-dim)."""
        parts = [n.to(dev, non_blocking=True).double() for group in self.local.values() for n in group]
        if not self.sharded:
            if not parts:
                return torch.zeros((), dtype=torch.float32, device=dev)
            if len(parts) == 1:
                return parts[0].float()
            return torch.linalg.vector_norm(torch.stack(parts)).float()
        sq = torch.zeros((), dtype=torch.float64, device=dev)
        for p in parts:
            sq = sq + p * p
        for groups, squares in self.sharded.items():
            s = torch.stack([t.to(dev) for t in squares]).sum()
            for g in groups:
                _all_reduce(s, dist.ReduceOp.SUM, g)
            sq = sq + s
        return sq.sqrt().float()


def whole_tensor_squares(sq: torch.Tensor, groups: list[tuple]) -> torch.Tensor:
    """Squared L2 norms of whole tensors from their local shards' squared
    norms ``sq`` (float64, one per tensor): each summed over its tensor's
    shard groups (``groups[i]``, empty when whole on this rank), one
    all-reduce per distinct groups key, keys in first-appearance order and
    each key's groups in mesh-dim order (the same on every rank)."""
    by_key: dict[tuple, list[int]] = defaultdict(list)
    for i, k in enumerate(groups):
        if k:
            by_key[k].append(i)
    for key, idx in by_key.items():
        where = torch.tensor(idx, device=sq.device)
        s = sq[where]
        for g in key:
            _all_reduce(s, dist.ReduceOp.SUM, g)
        sq = sq.index_copy(0, where, s)
    return sq


# ---- torch.ops.mixprec.* called directly on DTensors ----------------------------
# DTensor has no sharding rule for mixprec's list ops (its rule language
# cannot say "reduce found_inf over the mesh" or "the norm of the whole
# tensor"), so each op gets a handler in DTensor's dispatcher table, the
# mechanism torch itself uses for _amp_foreach_non_finite_check_and_unscale_:
# the op runs on the local shards, then found_inf is reduced (MAX) over the
# shard groups and the norms become the norms of the whole tensors. The
# table is private to torch (present from 2.10 to 2.14 at least); without it
# direct calls on DTensors keep raising DTensor's NotImplementedError, and
# the scaler and optimizers, which pass local shards themselves, still work.


def _locals(x):
    if isinstance(x, (list, tuple)):
        return type(x)(_locals(t) for t in x)
    return local(x) if is_dtensor(x) else x


def _grad_groups(grads) -> list[tuple]:
    return [reduction_groups(g, g, None) for g in grads]


def _elementwise_handler(op_call, args, kwargs):
    return op_call(*_locals(args), **{k: _locals(v) for k, v in kwargs.items()})


def _unscale_handler(op_call, args, kwargs):
    grads, found_inf = args[0], args[1]
    out = op_call(*_locals(args), **{k: _locals(v) for k, v in kwargs.items()})
    per_grad = _grad_groups(grads)
    for g in grads:
        check_placements(g, f"mixprec::{op_call._schema.name.split('::')[-1]}")
    ordered: dict = {}  # first-appearance order, the same on every rank
    for groups in per_grad:
        ordered.update(dict.fromkeys(groups))
    reduce_found_inf({None: local(found_inf)}, ordered)
    if out is None:
        return None
    per, _total = out
    sq = whole_tensor_squares(per.double() * per.double(), per_grad)
    return sq.sqrt().float(), sq.sum().sqrt().float()


def register_dtensor_handlers() -> bool:
    """Installs the handlers above; False where this torch has no table."""
    if DTensor is None:
        return False
    table = getattr(getattr(DTensor, "_op_dispatcher", None), "_custom_op_handlers", None)
    if not isinstance(table, dict):
        return False
    ops = torch.ops.mixprec
    for name in ("adamw_step_", "sgd_step_"):
        table[getattr(ops, name).default] = _elementwise_handler
    for name in ("unscale_", "unscale_norm_", "grad_norm"):
        table[getattr(ops, name).default] = _unscale_handler
    return True
