"""Fused master-weight optimizers: ``mixprec.optim.AdamW`` and ``mixprec.optim.SGD``.

Drop them in after ``model.to(torch.bfloat16)`` (or float16): each low-precision
parameter gets an FP32 master copy and FP32 state in the optimizer, one fused
pass per device reads the gradient (any of FP32/FP16/BF16), divides it by the
loss scale if a GradScaler hands one over, updates master and state in FP32
and writes the parameter back rounded to nearest even. FP32 parameters work
too (no master copy). A step is skipped on the device when the GradScaler
found an inf/NaN: no host sync (``_step_supports_amp_scaling = True``).
When a GradScaler hands over the loss scale, the same pass writes the
unscaled gradient back into ``p.grad`` (as torch's fused optimizers do), so
code reading gradients after ``scaler.step(opt)`` sees what torch shows.
They stay scaled (only read) after a skipped step (as torch's fused
optimizers leave them) and on the folded path (``clip_grad_norm_(...,
fold=True)``, ``mixprec.amp.backward_and_step``), which opts out of writing
them.

The update rules are torch's (``torch.optim.AdamW`` / ``torch.optim.SGD``),
and a state_dict of torch's optimizers loads into these (master weights are
then taken from the parameters).

``master_weights=False`` is the memory-saving mode for BF16 parameters: no
master copy (4 bytes per parameter less); the update is computed in FP32 from
the BF16 value and written back with stochastic rounding, so updates far
below BF16's resolution still move the parameter on average (torch's AdamW
on BF16 parameters rounds them away and stalls). The rounding is seeded
(``seed``) and reproducible: the same seed, data and step count give the same
bits on any thread count, CPU ISA or device.

``ema_decay=`` keeps an FP32 exponential moving average of the weights (of
the FP32 master, or of the FP32 param) updated in the same fused pass that
writes the master, while the new value is still in registers: 8 bytes per
parameter, no second read of the weights (timm's ``ModelEmaV3`` on a BF16
model keeps its EMA in BF16, where ``(1 - decay) * (w - ema)`` is below the
resolution and the EMA never moves). The decay follows timm's
``ModelEmaV3.get_decay`` (``ema_min_decay``, ``ema_use_warmup``,
``ema_warmup_gamma``, ``ema_warmup_power``, ``ema_update_after_step``) at the
optimizer's step count; ``ema_update_every`` is torchvision's
``--model-ema-steps``. :meth:`AdamW.swap_ema` swaps it into the model for
evaluation; :func:`ema_model` builds a separate EMA module.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import torch
from typing_extensions import Unpack

from ._amp_grads import is_dense
from ._distributed import local
from ._optim_args import (
    _EMA_DEFAULTS, SharedOptions, _betas, _check_lr, _flag, _hyper, _own_group_keys, _ParamChecks, _torch_flags,
    shared_options,
)
from ._optim_ema import _WeightsEma, ema_model
from ._optim_lean import ADAMW_MOMENTS, SGD_MOMENTS, LeanState, MemoryReport, lean_defaults
from ._optim_seeds import _RoundingSeeds
from ._optim_state import _StateAndCheckpoints
from ._optim_writes import _OutsideWrites

__all__ = ["AdamW", "SGD", "ema_model", "MemoryReport"]


# [note: lightning's reading of the flag] ``_step_supports_amp_scaling``
# tells a GradScaler (torch's, mixprec's) that the step takes ``grad_scale``
# and ``found_inf`` and skips itself on the device: True for them. Lightning
# reads the same flag as "this optimizer unscales inside its step and cannot
# be clipped": its MixedPrecision plugin then neither unscales the grads
# nor allows ``gradient_clip_val``, with a scaler (16-mixed) and without one
# (bf16-mixed, which scales nothing), so ``Trainer(precision="bf16-mixed",
# gradient_clip_val=1.0)`` refused mixprec's optimizers. The flag is read
# by whoever asks, so it answers by the reading code's place in the stack:
# from the reader outwards, the first frame of a GradScaler's module gets
# True, the first frame of Lightning's packages False, and a stack with
# neither True. The reader itself need not be Lightning's (its check may
# move to a helper elsewhere; a plugin of the user's may copy it): under
# Lightning's Trainer or Fabric every reader but a GradScaler gets False.
# Lightning's plugin then drives mixprec's optimizers as it drives
# torch.optim.AdamW: it unscales through the scaler after the closure,
# clips, then calls scaler.step, where the scaler (reading True) hands
# over found_inf and no grad_scale after that unscale_ (the grads are only
# read). Under Lightning, False is the safe answer to a reader not known
# here: the grads may be unscaled and clipped from outside, and a
# GradScaler of another module unscales them itself, then steps as for
# torch.optim.AdamW (a host sync more, the same numbers).
_LIGHTNING_PACKAGES = frozenset({"lightning", "pytorch_lightning", "lightning_fabric"})
_SCALER_MODULES = frozenset({"torch.amp.grad_scaler", "mixprec.amp"})


class _AmpScalingFlag:
    """The class attribute ``_step_supports_amp_scaling``: see [note:
    lightning's reading of the flag]."""

    def __get__(self, obj, cls=None) -> bool:
        frame = sys._getframe(1)
        while frame is not None:
            module = frame.f_globals.get("__name__")
            if isinstance(module, str):
                if module in _SCALER_MODULES:
                    return True
                if module.partition(".")[0] in _LIGHTNING_PACKAGES:
                    return False
            frame = frame.f_back
        return True


class _FusedMasterWeightOptimizer(LeanState, _StateAndCheckpoints, _RoundingSeeds, _OutsideWrites, _WeightsEma,
                                  _ParamChecks, torch.optim.Optimizer):
    """Shared machinery: per-device grouping, GradScaler hand-over and the
    step; state and checkpoints (``_optim_state``), rounding seeds
    (``_optim_seeds``), outside writes (``_optim_writes``), the EMA
    (``_optim_ema``), the param checks (``_optim_args``) and the lean state
    formats (``_optim_lean``) are mixed in."""

    _step_supports_amp_scaling = _AmpScalingFlag()
    # FP32 master weights and state: float16 gradients are safe here (see
    # mixprec.amp.GradScaler.unscale_).
    _accepts_fp16_grads = True

    @classmethod
    def _shared_defaults(cls, w: str, lr, options: dict[str, Any], moments: dict[str, Any]) -> dict[str, Any]:
        """The group defaults both optimizers take (``options``: the
        :class:`SharedOptions`, complete; ``moments``: the class's moment
        dtype options), checked; ``w`` names the constructor."""
        _check_lr(w, lr)
        own = _own_group_keys(w, {k: options[k] for k in (*_EMA_DEFAULTS, "master_weights", "seed")})
        lean = lean_defaults(w, options["param_remainders"], options["master_weights"], moments)
        flags = _torch_flags(w, options["foreach"], options["capturable"], options["differentiable"], options["fused"])
        return {**own, **lean, **flags}

    def __init__(self, params, defaults: dict[str, Any]) -> None:
        # [note: who adds a group] torch's constructor adds each group
        # through add_param_group; its errors name the constructor then.
        # A refused group puts back torch's random state, which the groups
        # added before it may have drawn their rounding seeds from.
        w = self.__dict__["_mixprec_adding"] = f"mixprec.optim.{type(self).__name__}"
        rng = torch.get_rng_state()
        try:
            super().__init__(params, defaults)
        except BaseException as e:
            torch.set_rng_state(rng)
            if not isinstance(e, (TypeError, ValueError)) or str(e).startswith(w):
                raise
            # torch's checks of params (a tensor, an empty list), in its words
            raise type(e)(f"{w}: params: {e}") from None
        finally:
            self.__dict__.pop("_mixprec_adding", None)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's, plus: every option of the group is checked as the
        constructor checks its arguments, and a refused group is not kept
        (errors name the call and the option); a master-free group may not
        hold float16 params, and gets its stochastic-rounding seed now
        (drawn from torch's default generator when not given, so
        torch.manual_seed makes it reproducible)."""
        w = self.__dict__.get("_mixprec_adding") or f"mixprec.optim.{type(self).__name__}.add_param_group"
        arg = "param_group" if w.endswith("add_param_group") else "each param group in params"
        if not isinstance(param_group, dict):
            raise TypeError(f"{w}: {arg} must be a dict, got {type(param_group).__name__}")
        if "params" not in param_group:
            raise ValueError(f"{w}: {arg} needs a 'params' entry (keys: {sorted(map(str, param_group))})")
        n = len(self.param_groups)
        try:
            super().add_param_group(param_group)
        except (TypeError, ValueError) as e:  # torch's checks of the group's params, in its words
            del self.param_groups[n:]
            where = "param_group['params']" if w.endswith("add_param_group") else "params"
            raise type(e)(f"{w}: {where}: {e}") from None
        group = self.param_groups[-1]
        try:
            self._check_group_options(w, group)
        except BaseException:
            del self.param_groups[n:]  # a refused group is not kept
            raise
        self._draw_seed(group)

    @staticmethod
    def _op_param(p: torch.Tensor) -> torch.Tensor:
        """What the op steps for ``p``: its local tensor, or a contiguous copy
        of it when it is not dense (a strided view such as
        ``randn(10, 5, 2)[..., 0]``), written back after the op."""
        lp = local(p)
        return lp if is_dense(lp) else lp.contiguous()

    @staticmethod
    def _grad_of(p: torch.Tensor, op_p: torch.Tensor) -> torch.Tensor:
        """The local gradient handed to the op, laid out like ``op_p``."""
        g = local(p.grad)
        if g.stride() != op_p.stride():
            # The fused kernel walks param, grad and state as one flat array.
            g = torch.empty_like(op_p, dtype=g.dtype).copy_(g)
        return g

    def _writes_unscaled_grads(self) -> bool:
        """A GradScaler hands over grad_scale with the grads still scaled:
        the op writes ``g / grad_scale`` back into each grad in the same
        pass (as torch's fused optimizers do), unless the scaler folded the
        clip into the step (``clip_grad_norm_(fold=True)``,
        ``backward_and_step``), where the grads are only read."""
        return getattr(self, "grad_scale", None) is not None and not getattr(self, "_grads_read_only", False)

    def _scaler_tensors(self, device: torch.device):
        """grad_scale / found_inf handed over by a GradScaler, on ``device``."""
        grad_scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        if grad_scale is not None:
            grad_scale = grad_scale.to(device, torch.float32, non_blocking=True).reshape(())
        if found_inf is not None:
            found_inf = found_inf.to(device, torch.float32, non_blocking=True).reshape(())
        return grad_scale, found_inf

    @staticmethod
    def _lr_args(lr, device: torch.device):
        if isinstance(lr, torch.Tensor):
            return 0.0, lr.to(device, torch.float32, non_blocking=True).reshape(())
        return float(lr), None

    def _by_device(self, group: dict[str, Any], group_index: int) -> dict[torch.device, tuple[int, list[torch.Tensor]]]:
        """The group's params with a grad, per device, with the group index
        of each device's first one."""
        out: dict[torch.device, tuple[int, list[torch.Tensor]]] = {}
        for i, p in enumerate(group["params"]):
            if p.grad is None:
                continue
            self._check_param(p, group_index, i)
            out.setdefault(p.device, (i, []))[1].append(p)
        return out

    # Eager under torch.compile: the step is one fused op per device already,
    # and its bookkeeping (lazy state, the params' version counters) is
    # Python state that must not be traced into a graph.
    @torch._dynamo.disable
    @torch.no_grad()
    def step(self, closure=None):
        """One fused step per param group and device (grads, masters and
        state of the group's params on that device in one op call)."""
        if closure is not None and not callable(closure):
            raise TypeError(f"mixprec.optim.{type(self).__name__}.step: closure must be None or a function that "
                            f"re-evaluates the model and returns the loss, got {type(closure).__name__}")
        self._refuse_step_in_swap()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._share_drawn_seeds()
        for gi, group in enumerate(self.param_groups):
            master_weights = self._keeps_master(group)
            for device, (first, params) in self._by_device(group, gi).items():
                self._lean_prepare(group, params)
                states = [self._base_state(p, master_weights) for p in params]
                locs = list(map(local, params))
                self._follow_outside_writes((gi, device), params, locs, states)
                op_params = [self._op_param(p) for p in params]
                grads = [self._grad_of(p, w) for p, w in zip(params, op_params)]
                masters = [self._master_of(p, st, w) for p, st, w in zip(params, states, op_params)]
                steps = [st["step"] for st in states]
                ema = self._ema_args(group, params, states, op_params)
                lr, lr_tensor = self._lr_args(group["lr"], device)
                grad_scale, found_inf = self._scaler_tensors(device)
                write_grads = self._writes_unscaled_grads()
                self._step_device(
                    group, params, op_params, states, grads, masters, steps, lr, lr_tensor, grad_scale,
                    found_inf, self._sr_seed(group, gi, first), write_grads, ema,
                )
                for p, w, g in zip(params, op_params, grads):
                    if w is not local(p):
                        local(p).copy_(w)
                    if write_grads and g is not local(p.grad):
                        local(p.grad).copy_(g)  # the op wrote the re-laid-out copy
                self._record_versions((gi, device), params, locs)
        return loss

    def _step_device(self, group, params, op_params, states, grads, masters, steps, lr, lr_tensor, grad_scale,
                     found_inf, sr_seed, unscale_grads, ema) -> None:
        """Creates the optimizer's own state where missing and calls its op.
        ``params`` and ``states`` as the optimizer holds them (DTensors
        under FSDP2 / tensor parallel); ``op_params``, ``grads`` and
        ``masters``: the local, dense tensors the op takes (state goes in
        through :meth:`_op_state`); ``ema``: the op's EMA keywords."""
        raise NotImplementedError


def _check_weight_decay(w: str, weight_decay) -> None:
    if not 0.0 <= _hyper(w, "weight_decay", weight_decay):
        raise ValueError(f"{w}: Invalid weight_decay value: {weight_decay} (weight_decay must be >= 0)")


class AdamW(_FusedMasterWeightOptimizer):
    """``torch.optim.AdamW`` with FP32 master weights and state for FP16/BF16
    parameters, fused into one pass per device.

    Args are torch's: ``lr`` (float or 0-dim tensor) 1e-3, ``betas``
    (0.9, 0.999), ``eps`` 1e-8, ``weight_decay`` 1e-2, ``amsgrad`` False,
    keyword ``maximize`` False. Keyword ``master_weights`` (True): False
    keeps no FP32 master for BF16 parameters and rounds their updates
    stochastically (float16 parameters are then refused); ``seed`` (None:
    drawn from torch's generator) seeds that rounding. Both may be set per
    param group.

    EMA of the weights (keywords, per param group too): ``ema_decay`` (None:
    no EMA; timm's ``--model-ema-decay`` default is 0.9998, ModelEmaV3's
    0.9999), and timm ModelEmaV3's ``ema_min_decay`` 0, ``ema_use_warmup``
    False, ``ema_warmup_gamma`` 1, ``ema_warmup_power`` 2/3,
    ``ema_update_after_step`` 0; ``ema_update_every`` 1 (torchvision's
    ``--model-ema-steps``). With it, ``state[p]["ema"]`` is an FP32 EMA of
    the FP32 weights, ``ema.lerp_(w, 1 - decay)`` with ``decay =
    ModelEmaV3.get_decay(step)`` at the param's step count after the step
    (timm's ``num_updates``), on steps that are multiples of
    ``ema_update_every``, in the same fused pass as the update. The first
    update (step 1 + ``ema_update_after_step``) copies the weights, as
    timm's. A step skipped by the GradScaler (inf/NaN) changes neither the
    EMA nor the step count, so it is not counted (timm's train loop would
    count it and average in the unchanged weights). Master-free BF16
    params: the EMA is of the FP32 value before its stochastic rounding
    (the unbiased value the rounding scatters around). The EMA is in
    ``state_dict()``; :meth:`swap_ema` and :func:`ema_model` use it.

    Lean state (keywords, per param group too; Transformer Engine's names):
    ``param_remainders`` (False) keeps each BF16 param's FP32 master as the
    param plus a 16-bit remainder (``state[p]["remainder"]``): 2 bytes per
    param instead of 4, the master and training bit-identical to the
    FP32-master mode (the param differs from the master rounded to nearest
    even only at exact ties, by one ulp: it is rounded ties-away); float16
    params are refused, float32 ones have no master to shrink.
    ``exp_avg_dtype`` / ``exp_avg_sq_dtype`` (torch.float32): torch.bfloat16
    (2 bytes, written with stochastic rounding seeded by ``seed``) or
    torch.uint8 (8-bit blockwise: 1 byte plus an FP32 scale per 256
    elements, ``state[p]["exp_avg_scale"]``; bitsandbytes' / torchao's
    dynamic map). The rounding and the map are in mixprec/optim.h.
    :meth:`memory_report` counts the bytes; :meth:`fp32_state` and
    :meth:`fp32_state_dict` give the state in FP32 (torch's format, with the
    FP32 master), ``state_dict()`` saves the compact form (remainders, BF16
    moments, 8-bit codes with per-row-block scales that
    torch.distributed.checkpoint reshards exactly; see [note: checkpoint
    format] in mixprec/_optim_lean.py) and ``load_state_dict`` takes
    either, and torch's own (quantised to the group's formats).
    """

    _MOMENTS = ADAMW_MOMENTS
    _SCALE_ARGS = {"exp_avg": "exp_avg_scales", "exp_avg_sq": "exp_avg_sq_scales"}

    @shared_options
    def __init__(
        self,
        params,
        lr: float | torch.Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        exp_avg_dtype: torch.dtype = torch.float32,
        exp_avg_sq_dtype: torch.dtype = torch.float32,
        **options: Unpack[SharedOptions],
    ) -> None:
        w = "mixprec.optim.AdamW"
        moments = dict(exp_avg_dtype=exp_avg_dtype, exp_avg_sq_dtype=exp_avg_sq_dtype)
        shared = self._shared_defaults(w, lr, options, moments)
        self._check_hyper(w, dict(betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize))
        betas = _betas(w, betas)
        defaults = dict(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize, **shared,
        )
        super().__init__(params, defaults)

    @staticmethod
    def _check_hyper(w: str, group: dict[str, Any]) -> None:
        """AdamW's own hyper-parameters in torch's ranges, with torch's
        words for them after ``w`` (the constructor's, a group added or
        loaded)."""
        betas = _betas(w, group.get("betas", (0.9, 0.999)))
        for i, b in enumerate(betas):
            if not 0.0 <= b < 1.0:
                raise ValueError(f"{w}: Invalid beta parameter at index {i}: {b} (betas[{i}] must be in [0, 1))")
        eps = group.get("eps", 1e-8)
        if not 0.0 <= _hyper(w, "eps", eps):
            raise ValueError(f"{w}: Invalid epsilon value: {eps} (eps must be >= 0)")
        _check_weight_decay(w, group.get("weight_decay", 1e-2))
        for k in ("amsgrad", "maximize"):
            _flag(w, k, group.get(k, False))

    def _step_device(self, group, params, op_params, states, grads, masters, steps, lr, lr_tensor, grad_scale,
                     found_inf, sr_seed, unscale_grads, ema) -> None:
        for p, st in zip(params, states):
            if "exp_avg" not in st:
                self._new_moment(st, "exp_avg", p, group)
                self._new_moment(st, "exp_avg_sq", p, group)
            if group["amsgrad"] and "max_exp_avg_sq" not in st:
                st["max_exp_avg_sq"] = self._fp32_zeros(p)
        beta1, beta2 = group["betas"]
        torch.ops.mixprec.adamw_step_(
            op_params, grads, masters,
            self._lean_state(states, "exp_avg", op_params), self._lean_state(states, "exp_avg_sq", op_params),
            self._op_state(states, "max_exp_avg_sq", op_params) if group["amsgrad"] else [],
            steps, lr, float(beta1), float(beta2), float(group["weight_decay"]), float(group["eps"]),
            bool(group["amsgrad"]), bool(group["maximize"]), lr_tensor, grad_scale, found_inf, sr_seed,
            unscale_grads, **ema, **self._lean_kwargs(group, states, op_params),
        )


class SGD(_FusedMasterWeightOptimizer):
    """``torch.optim.SGD`` (momentum, dampening, nesterov, weight decay,
    maximize) with FP32 master weights and momentum for FP16/BF16
    parameters, fused into one pass per device.

    Args are torch's: ``lr`` 1e-3, ``momentum`` 0, ``dampening`` 0,
    ``weight_decay`` 0, ``nesterov`` False, keyword ``maximize`` False;
    keywords ``master_weights``, ``seed`` and the ``ema_*`` ones as in
    :class:`AdamW`; ``param_remainders`` as in :class:`AdamW`, and
    ``momentum_dtype`` (torch.float32, torch.bfloat16 or torch.uint8) the
    momentum buffer's format, as :class:`AdamW`'s ``exp_avg_dtype``.
    """

    _MOMENTS = SGD_MOMENTS
    _SCALE_ARGS = {"momentum_buffer": "buf_scales"}

    @shared_options
    def __init__(
        self,
        params,
        lr: float | torch.Tensor = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        momentum_dtype: torch.dtype = torch.float32,
        **options: Unpack[SharedOptions],
    ) -> None:
        w = "mixprec.optim.SGD"
        shared = self._shared_defaults(w, lr, options, dict(momentum_dtype=momentum_dtype))
        self._check_hyper(w, dict(momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                  nesterov=nesterov, maximize=maximize))
        defaults = dict(
            lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
            nesterov=nesterov, maximize=maximize, **shared,
        )
        super().__init__(params, defaults)

    @staticmethod
    def _check_hyper(w: str, group: dict[str, Any]) -> None:
        """SGD's own hyper-parameters in torch's ranges, with torch's words
        for them after ``w`` (the constructor's, a group added or
        loaded)."""
        momentum = _hyper(w, "momentum", group.get("momentum", 0.0))
        if not 0.0 <= momentum:
            raise ValueError(f"{w}: Invalid momentum value: {group['momentum']} (momentum must be >= 0)")
        dampening = _hyper(w, "dampening", group.get("dampening", 0.0))
        if not math.isfinite(dampening):
            # torch checks nothing here: a NaN or inf turns the weights NaN
            # at the second step.
            raise ValueError(f"{w}: Invalid dampening value: {group['dampening']} (dampening must be finite)")
        _check_weight_decay(w, group.get("weight_decay", 0.0))
        _flag(w, "maximize", group.get("maximize", False))
        if _flag(w, "nesterov", group.get("nesterov", False)) and (momentum <= 0 or dampening != 0):
            raise ValueError(f"{w}: Nesterov momentum requires a momentum and zero dampening (nesterov=True with "
                             f"momentum {group.get('momentum', 0.0)}, dampening {group.get('dampening', 0.0)})")

    def _base_state(self, p: torch.Tensor, master_weights: bool = True) -> dict[str, torch.Tensor]:
        # torch's SGD keeps no step count, so a state loaded from it (or
        # edited by a load hook) has a momentum buffer and no "step": the
        # first step is behind us, the count starts at 1 here, at the step.
        # Not at load time, so that after load_state_dict the state has
        # torch's keys, as torch's SGD holds it (issue 39).
        st = self.state[p]
        if "step" not in st and isinstance(st.get("momentum_buffer"), torch.Tensor):
            st["step"] = torch.ones((), dtype=torch.float32, device=p.device)
        return super()._base_state(p, master_weights)

    def _step_device(self, group, params, op_params, states, grads, masters, steps, lr, lr_tensor, grad_scale,
                     found_inf, sr_seed, unscale_grads, ema) -> None:
        momentum = float(group["momentum"])
        bufs = []
        if momentum != 0.0:
            for p, st in zip(params, states):
                if st.get("momentum_buffer") is None:
                    self._new_moment(st, "momentum_buffer", p, group)
            bufs = self._lean_state(states, "momentum_buffer", op_params)
        torch.ops.mixprec.sgd_step_(
            op_params, grads, masters, bufs, steps,
            lr, momentum, float(group["dampening"]), float(group["weight_decay"]),
            bool(group["nesterov"]), bool(group["maximize"]),
            lr_tensor, grad_scale, found_inf, sr_seed, unscale_grads, **ema,
            **self._lean_kwargs(group, states, op_params),
        )
