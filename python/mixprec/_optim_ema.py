"""The EMA of the weights kept by ``mixprec.optim``'s optimizers
(``ema_decay=``): its op arguments, :meth:`swap_ema` for evaluation in
place, and :func:`ema_model` for a separate EMA module.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Iterator

import torch

from ._args import _takes, check_module

__all__ = ["ema_model"]


class _WeightsEma:
    """Mixed into ``mixprec.optim``'s base class."""

    def _ema_args(self, group, params, states, op_params) -> dict[str, Any]:
        """The op's EMA keywords for one (group, device) list ({} without an
        EMA). A missing EMA starts as the FP32 weights as they are now (the
        master, the FP32 param, or the BF16 param widened): what timm's
        ``deepcopy(model)`` holds before the first update."""
        if group.get("ema_decay") is None:
            return {}
        for p, st in zip(params, states):
            if "ema" not in st:
                st["ema"] = self._fp32_weights(p, st)
        return dict(
            emas=self._op_state(states, "ema", op_params), ema_decay=float(group["ema_decay"]),
            ema_min_decay=float(group["ema_min_decay"]), ema_use_warmup=bool(group["ema_use_warmup"]),
            ema_warmup_gamma=float(group["ema_warmup_gamma"]), ema_warmup_power=float(group["ema_warmup_power"]),
            ema_update_after_step=int(group["ema_update_after_step"]),
            ema_update_every=int(group["ema_update_every"]),
        )

    def _ema_pairs(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(param, its FP32 EMA) for every param that has one."""
        for group in self.param_groups:
            for p in group["params"]:
                st = self.state.get(p)
                if st and "ema" in st:
                    yield p, st["ema"]

    def _keeps_ema(self) -> bool:
        return any(g.get("ema_decay") is not None for g in self.param_groups)

    def _refuse_step_in_swap(self) -> None:
        """[note: step in swap_ema] Inside ``swap_ema()`` the params hold the
        EMA weights, so the gradients of a backward taken there are the EMA
        model's: applying them to the training weights (or to the EMA) would
        be an update nobody asked for, and letting the restore throw it away
        is what happened silently before. The step raises instead, before
        anything is written; step after the block."""
        if self.__dict__.get("_mixprec_in_swap_ema"):
            raise RuntimeError(
                f"{type(self).__name__}.step() inside swap_ema(): the params hold the EMA weights there (and "
                "gradients taken there are the EMA's); leave the with-block first, then step on the training weights"
            )

    @_takes()
    @contextlib.contextmanager
    @torch.no_grad()
    def swap_ema(self) -> Iterator[None]:
        """Context manager: the params hold their EMA (rounded to nearest
        even to each param's dtype) inside the block, and their training
        values, bit for bit, after it (also when the block raises). For
        evaluating the EMA weights: ``with opt.swap_ema(): evaluate(model)``.
        Only parameters are swapped: buffers (BatchNorm running stats) are
        the model's own, which is timm ModelEmaV3's ``exclude_buffers=True``
        (the optimizer never sees buffers). Params without an EMA yet (no
        step taken) keep their values. Masters and state are untouched; the
        restore is recorded as the optimizer's own write, so the next step
        does not take it for an outside one. ``step()`` inside the block
        raises ([note: step in swap_ema]); so does ``swap_ema()`` on an
        optimizer that keeps no EMA (no group has ``ema_decay``)."""
        if not self._keeps_ema():
            raise RuntimeError(
                f"{type(self).__name__}.swap_ema(): this optimizer keeps no EMA of the weights; build it with "
                "ema_decay=... (or give a param group an ema_decay)"
            )
        saved = []
        depth = self.__dict__.get("_mixprec_in_swap_ema", 0)
        self.__dict__["_mixprec_in_swap_ema"] = depth + 1
        try:
            for p, ema in self._ema_pairs():
                saved.append((p, p.detach().clone()))
                p.detach().copy_(ema)
            yield
        finally:
            for p, v in saved:
                p.detach().copy_(v)
            self._record_param_versions([p for p, _ in saved])
            self.__dict__["_mixprec_in_swap_ema"] = depth


@torch.no_grad()
def ema_model(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
              dtype: torch.dtype | None = None) -> torch.nn.Module:
    """A separate copy of ``model`` holding the optimizer's EMA weights, for
    code that wants an EMA module (timm's ``ModelEmaV3(model).module``,
    torchvision's ``ExponentialMovingAverage``): ``copy.deepcopy(model)`` in
    eval mode, each parameter that has an EMA in ``optimizer`` set to it
    (rounded to nearest even to the parameter's dtype, or to ``dtype`` when
    given: ``dtype=torch.float32`` gives the FP32 EMA itself and makes every
    floating parameter and buffer of the copy FP32). Buffers (BatchNorm
    running stats) are the model's, copied as they are now (timm's
    ``exclude_buffers=True``). A snapshot: call again for a fresh one after
    more steps (or use :meth:`AdamW.swap_ema`, which needs no copy).

    Raises when ``optimizer`` is not one of mixprec's, keeps no EMA, or
    optimizes none of ``model``'s parameters (another model: a plain copy
    would pass for the EMA). A model the optimizer trains only part of (a
    frozen backbone) is fine: the rest is copied as it is."""
    check_module("mixprec.optim.ema_model", "model", model)
    if not isinstance(optimizer, _WeightsEma):
        raise TypeError(
            f"mixprec.optim.ema_model: optimizer must be mixprec.optim.AdamW or SGD, got {type(optimizer).__name__}"
        )
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"mixprec.optim.ema_model: dtype must be None or a torch.dtype, got {type(dtype).__name__} "
                        f"{dtype!r}")
    if dtype is not None and not dtype.is_floating_point:
        raise ValueError(f"mixprec.optim.ema_model: dtype must be a floating dtype, got {dtype}")
    if not optimizer._keeps_ema():
        raise RuntimeError(
            "mixprec.optim.ema_model: the optimizer keeps no EMA of the weights; build it with ema_decay=..."
        )
    trained = {id(p) for g in optimizer.param_groups for p in g["params"]}
    if not any(id(p) in trained for p in model.parameters()):
        raise RuntimeError(
            "mixprec.optim.ema_model: none of model's parameters is optimized by this optimizer; pass the "
            "model it trains"
        )
    emas = {id(p): e for p, e in optimizer._ema_pairs()}
    copy_ = copy.deepcopy(model)
    if dtype is not None:
        copy_.to(dtype)
    for p, q in zip(model.parameters(), copy_.parameters()):
        e = emas.get(id(p))
        if e is not None:
            q.detach().copy_(e)
    return copy_.eval()
