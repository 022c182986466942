"""Drop-in dynamic loss scaling: ``mixprec.amp.GradScaler``.

Same constructor, methods, defaults, state_dict keys and step-by-step
behaviour as ``torch.amp.GradScaler`` (it is a subclass, so isinstance checks
keep working), with these differences:

* FP16 and BF16 gradients are unscaled (torch refuses FP16 in ``unscale_`` and
  has no BF16 unscale on CUDA), in one fused pass per device whatever the mix
  of dtypes.
* ``unscale_(optimizer, return_norm=True)`` and ``clip_grad_norm_`` return the
  total gradient L2 norm computed in that same pass: clipping needs no second
  read of the gradients.
* ``skipped_steps`` is a device-side int64 count of overflowing (skipped)
  steps, readable without a host sync until you ask for its value.
* Optional ``hysteresis`` (back off only after N overflowing steps in a row),
  ``min_scale`` and ``max_scale``; the defaults reproduce torch exactly.
* For optimizers with ``_step_supports_amp_scaling`` (torch's fused ones,
  mixprec's) nothing synchronises with the host, as in torch.
* Overflow diagnostics (``diagnostics=True`` or ``named_parameters=``):
  which parameters' gradients were inf/NaN, every gradient's norm, and a
  training-health record (scale, skips, global grad norm per step, the
  parameters that overflowed most often), from the unscale pass itself.
"""

from __future__ import annotations

import inspect
import warnings
import weakref
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import torch
from torch.amp.grad_scaler import OptState, _refresh_per_optimizer_state

from . import _amp_clip, _amp_grads
from ._amp_health import Overflow, Recorder, TrainingHealth, named_pairs
from ._args import _takes, as_bool, as_float, as_int
from ._library import handles

__all__ = ["GradScaler", "OptState", "Overflow", "TrainingHealth", "backward_and_step"]

# The scaler's methods keep Python state between calls (which optimizer was
# unscaled, stepped; the per-device found_inf tensors). torch.compile loses
# mutations of that state across the graph breaks inside these methods (an
# unscale_ traced by dynamo left no record, so step() divided by the scale a
# second time), so they always run eagerly, as torch's own GradScaler does
# (dynamo skips torch.amp): one graph break per call, the ops inside
# unchanged.
_eager = torch._dynamo.disable

_WHERE = "mixprec.amp.GradScaler"
_INT32_MAX = 2**31 - 1
_RECIPE = "the order is scaler.scale(loss).backward(); scaler.clip_grad_norm_(...); scaler.step(optimizer); scaler.update()"

# [note: gradients unscaled by parameters] torch's recipe unscales through
# the optimizer (``scaler.unscale_(opt)``) and then clips the parameters'
# gradients (``torch.nn.utils.clip_grad_norm_(model.parameters(), m)``). A
# port writes ``scaler.clip_grad_norm_(model.parameters(), m)``: the scaler
# does not know the optimizer, so it unscales exactly those gradients (the
# fused op, torch's rounding), keeps their found_inf, and remembers them
# until update(): the optimizer's unscale_ / step() then skips them (no
# second division) and adds their found_inf to its own (an overflow in them
# skips the step). The result is torch's recipe bit for bit: the same
# unscaled values, torch's own clip on them (its norm, its dtype), the same
# step. Gradients of an optimizer that was already unscaled are only
# clipped; of one already stepped, or folded (``fold=True``), refused.


def _is_optimizer(x) -> bool:
    """torch's GradScaler takes anything with ``param_groups`` and ``step()``
    (wrappers such as DeepSpeed's are not Optimizer subclasses)."""
    return isinstance(x, torch.optim.Optimizer) or (
        hasattr(x, "param_groups") and callable(getattr(x, "step", None)))


def _check_optimizer(where: str, optimizer) -> None:
    if not _is_optimizer(optimizer):
        raise TypeError(
            f"{where}: optimizer must be a torch.optim.Optimizer (or have param_groups and step()), "
            f"got {type(optimizer).__name__}"
        )


class GradScaler(torch.amp.GradScaler):
    """Drop-in for ``torch.amp.GradScaler`` backed by mixprec's fused kernels.

    Args (same as torch's): ``device`` ("cuda" by default), ``init_scale``
    (2**16), ``growth_factor`` (2.0), ``backoff_factor`` (0.5),
    ``growth_interval`` (2000), ``enabled`` (True).
    Keyword-only extras: ``hysteresis`` (1: back off on every overflow),
    ``min_scale`` (0.0), ``max_scale`` (inf), ``process_group`` (the ranks
    that share FSDP1 flat parameters, as torch's ``ShardedGradScaler`` takes
    it; default the world), ``diagnostics`` (False) and
    ``named_parameters`` (e.g. ``model.named_parameters()``; implies
    ``diagnostics=True`` and gives the reports parameter names).

    Diagnostics: every unscale pass then also returns each gradient's L2
    norm (the fused kernel's per-tensor norms: the same single read of the
    gradients; an inf/NaN gradient has a non-finite norm), kept on the
    scale's device with the step's scale, skip flag and global norm, and a
    per-parameter count of overflowing steps: no host sync until
    ``last_overflow()``, ``last_grad_norms()`` or ``health()`` is called.
    Each step adds a few tiny device ops; off by default.

    Sharded models (FSDP2 / tensor-parallel DTensor gradients, FSDP1 flat
    parameters): found_inf is reduced (MAX) over the ranks that hold shards
    of one gradient, and the norms of ``unscale_(return_norm=True)`` /
    ``clip_grad_norm_`` are the global norm, so every rank skips and clips
    alike (torch's ``ShardedGradScaler`` for FSDP1, DTensor's found_inf
    reduction for FSDP2).
    """

    def __init__(
        self,
        device: str = "cuda",
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
        *,
        hysteresis: int = 1,
        min_scale: float = 0.0,
        max_scale: float = float("inf"),
        process_group=None,
        diagnostics: bool = False,
        named_parameters=None,
    ) -> None:
        # The kinds first, before the CUDA warning and any state (device=3
        # was kept as "3", enabled="no" read as True).
        if not isinstance(device, (str, torch.device)):
            raise TypeError(f"{_WHERE}: device must be a device type string such as 'cuda' or 'cpu' (or a "
                            f"torch.device), got {type(device).__name__} {device!r}")
        try:
            torch.device(device)
        except RuntimeError as e:
            raise ValueError(f"{_WHERE}: device must be a device type such as 'cuda' or 'cpu', got {device!r}") from e
        enabled = as_bool(_WHERE, "enabled", enabled)
        diagnostics = as_bool(_WHERE, "diagnostics", diagnostics)
        if process_group is not None and not (
                torch.distributed.is_available() and isinstance(process_group, torch.distributed.ProcessGroup)):
            raise TypeError(f"{_WHERE}: process_group must be a torch.distributed ProcessGroup or None, got "
                            f"{type(process_group).__name__}")
        self._device = str(device)
        self._enabled = enabled
        if self._device == "cuda" and enabled and not torch.cuda.is_available():
            warnings.warn(
                "mixprec.amp.GradScaler is enabled, but CUDA is not available.  Disabling.",
                stacklevel=2,
            )
            self._enabled = False
        if self._enabled:
            # torch checks only the two factors' ranges (and only when
            # enabled); a NaN or bool passed those and surfaced steps later
            # (see [note: argument conversion] in _args.py).
            init_scale = as_float(_WHERE, "init_scale", init_scale, above=0.0)
            growth_factor = as_float(_WHERE, "growth_factor", growth_factor)
            backoff_factor = as_float(_WHERE, "backoff_factor", backoff_factor)
            if growth_factor <= 1.0:
                raise AssertionError("The growth factor must be > 1.0.")
            if backoff_factor >= 1.0:
                raise AssertionError("The backoff factor must be < 1.0.")
            if backoff_factor <= 0.0:
                raise ValueError(f"{_WHERE}: backoff_factor must be > 0 (a zero scale unscales by inf), got {backoff_factor}")
            growth_interval = as_int(_WHERE, "growth_interval", growth_interval, low=1, high=_INT32_MAX)
            hysteresis = as_int(_WHERE, "hysteresis", hysteresis, low=1, high=_INT32_MAX)
            min_scale = as_float(_WHERE, "min_scale", min_scale, low=0.0)
            max_scale = as_float(_WHERE, "max_scale", max_scale, finite=False)
            if not min_scale <= max_scale:
                raise ValueError(f"{_WHERE}: need 0 <= min_scale <= max_scale, got {min_scale}, {max_scale}")
        self._init_scale = init_scale
        self._scale: torch.Tensor | None = None
        self._growth_factor = growth_factor
        self._backoff_factor = backoff_factor
        self._growth_interval = growth_interval
        self._init_growth_tracker = 0
        self._growth_tracker: torch.Tensor | None = None
        # Converted above when enabled; a disabled scaler never reads them.
        self._hysteresis = hysteresis
        self._min_scale = min_scale
        self._max_scale = max_scale
        self._process_group = process_group
        self._init_hysteresis_tracker = self._hysteresis
        self._hysteresis_tracker: torch.Tensor | None = None
        self._init_skipped_steps = 0
        self._skipped_steps: torch.Tensor | None = None
        self._per_optimizer_states: dict[int, dict[str, Any]] = defaultdict(_refresh_per_optimizer_state)
        self._health = Recorder(named_parameters) if (diagnostics or named_parameters is not None) else None
        self._reset_iteration()

    def _reset_iteration(self) -> None:
        """What one iteration (until update()) remembers beyond torch's
        per-optimizer stages; see [note: gradients unscaled by parameters]."""
        # id(optimizer) -> weakref: the optimizers unscaled / stepped / folded this iteration
        self._optimizers: dict[int, weakref.ref] = {}
        # id(grad) -> (weakref to it, found_inf per device of its unscale)
        self._loose: dict[int, tuple[weakref.ref, dict]] = {}

    def _seen(self, optimizer) -> None:
        self._optimizers[id(optimizer)] = weakref.ref(optimizer)

    def _loose_entry(self, grad: torch.Tensor):
        entry = self._loose.get(id(grad))
        return entry if entry is not None and entry[0]() is grad else None

    def _optimizer_stage_of_grads(self) -> dict[int, tuple[torch.Tensor, str]]:
        """id(grad) -> (grad, how its optimizer handled it this iteration:
        "unscaled", "folded" (still scaled) or "stepped")."""
        out: dict[int, tuple[torch.Tensor, str]] = {}
        for key, ref in self._optimizers.items():
            opt = ref()
            if opt is None:
                continue
            stage = self._per_optimizer_states[key]["stage"]
            if stage is OptState.READY:
                continue
            how = "stepped" if stage is OptState.STEPPED else (
                "folded" if getattr(opt, "_grads_read_only", False) else "unscaled")
            for g in opt.param_groups:
                for p in g["params"]:
                    if p.grad is not None:
                        out[id(p.grad)] = (p.grad, how)
        return out

    # ------------------------------------------------------------ state ----
    def _lazy_init_scale_growth_tracker(self, dev: torch.device) -> None:
        if self._growth_tracker is not None:
            raise AssertionError("_growth_tracker initialized before _scale")
        self._scale = torch.full((), self._init_scale, dtype=torch.float32, device=dev)
        self._growth_tracker = torch.full((), self._init_growth_tracker, dtype=torch.int32, device=dev)
        self._hysteresis_tracker = torch.full((), self._init_hysteresis_tracker, dtype=torch.int32, device=dev)
        self._skipped_steps = torch.full((), self._init_skipped_steps, dtype=torch.int64, device=dev)

    @property
    def skipped_steps(self) -> torch.Tensor | None:
        """Device-side int64 count of overflowing (skipped) steps so far, or
        None before the first ``scale()``. Reading it does not sync; ``int()``
        of it does."""
        return self._skipped_steps

    @_takes(module="mixprec.amp")
    def get_skipped_steps(self) -> int:
        """Number of steps skipped so far (synchronises once)."""
        if not self._enabled:
            return 0
        if self._skipped_steps is None:
            return self._init_skipped_steps
        return int(self._skipped_steps.item())

    # ----------------------------------------------------------- unscale ----
    def _unscale_grads_(self, optimizer: torch.optim.Optimizer, inv_scale: torch.Tensor, found_inf: torch.Tensor,
                        allow_fp16: bool, want_norm: bool = False, read_only: bool = False,
                        per_tensor: list | None = None):
        """torch's hook (its ``_unscale_grads_`` returns the per-device
        found_inf dict); mixprec's returns the per-device norms too."""
        return _amp_grads.unscale_grads(
            optimizer, inv_scale, found_inf, allow_fp16=allow_fp16, want_norm=want_norm, read_only=read_only,
            process_group=self._process_group,
            per_tensor=per_tensor,
        )

    @_eager
    def unscale_(self, optimizer: torch.optim.Optimizer, *, return_norm: bool = False) -> torch.Tensor | None:
        """Divides ("unscales") the optimizer's gradients by the scale, as
        torch's ``unscale_``, for FP32 and BF16 gradients, and for FP16
        gradients when the optimizer keeps FP32 state (mixprec's optimizers;
        any other raises torch's ``ValueError: Attempting to unscale FP16
        gradients.``).

        With ``return_norm=True`` returns the total L2 norm of the unscaled
        gradients (0-dim float32 tensor on the scale's device, inf/NaN when a
        gradient overflowed), computed in the same pass, no host sync."""
        _check_optimizer(f"{_WHERE}.unscale_", optimizer)
        if not isinstance(return_norm, bool):
            raise TypeError(f"{_WHERE}.unscale_: return_norm must be a bool, got {type(return_norm).__name__} "
                            f"{return_norm!r}")
        if not self._enabled:
            if not return_norm:
                return None
            grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
            return _amp_grads.plain_total_norm(grads)
        self._check_scale_growth_tracker("unscale_")
        optimizer_state = self._per_optimizer_states[id(optimizer)]
        if optimizer_state["stage"] is OptState.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        elif optimizer_state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        assert self._scale is not None
        inv_scale = self._scale.double().reciprocal().float()
        found_inf = torch.full((), 0.0, dtype=torch.float32, device=self._scale.device)
        allow_fp16 = _amp_grads.accepts_fp16_grads(optimizer)
        per_tensor = [] if self._health is not None else None
        if self._loose:
            found, norms = self._unscale_rest(optimizer, inv_scale, found_inf, allow_fp16, return_norm, per_tensor)
        else:
            found, norms = self._unscale_grads_(
                optimizer, inv_scale, found_inf, allow_fp16, want_norm=return_norm, per_tensor=per_tensor
            )
        self._record(optimizer, per_tensor)
        optimizer_state["found_inf_per_device"] = found
        optimizer_state["stage"] = OptState.UNSCALED
        self._seen(optimizer)
        if not return_norm:
            return None
        return norms.total(self._scale.device)

    def _unscale_rest(self, optimizer, inv_scale, found_inf, allow_fp16, want_norm, per_tensor):
        """unscale_ when some of the optimizer's grads were already unscaled
        by ``clip_grad_norm_(parameters, ...)``: the others only, and the
        found_inf of those added in. See [note: gradients unscaled by
        parameters]."""
        earlier = []
        for g in optimizer.param_groups:
            for p in g["params"]:
                entry = None if p.grad is None else self._loose_entry(p.grad)
                if entry is not None and all(e is not entry[1] for e in earlier):
                    earlier.append(entry[1])
        found, norms = _amp_grads.unscale_grads(
            optimizer, inv_scale, found_inf, allow_fp16=allow_fp16, want_norm=want_norm,
            process_group=self._process_group, per_tensor=per_tensor,
            skip=lambda grad: self._loose_entry(grad) is not None,
        )
        for per_device in earlier:
            for device, f in per_device.items():
                found[device] = found[device] + f if device in found else f.clone()
        return found, norms

    def _clip_parameters(self, parameters, max_norm, norm_type, error_if_nonfinite, foreach):
        """``clip_grad_norm_`` given parameters: see [note: gradients
        unscaled by parameters]."""
        where = f"{_WHERE}.clip_grad_norm_"
        try:
            params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        except TypeError:
            params = [parameters]  # named below
        for i, p in enumerate(params):
            if not isinstance(p, torch.Tensor):
                raise TypeError(
                    f"{where}: parameters must be an optimizer, a tensor or an iterable of tensors; "
                    f"item {i} is {type(p).__name__}"
                )
        if self._enabled:
            self._check_scale_growth_tracker("clip_grad_norm_")
            handled = self._optimizer_stage_of_grads()
            todo = []
            for p in params:
                if p.grad is None or self._loose_entry(p.grad) is not None:
                    continue
                how = handled.get(id(p.grad))
                if how is not None and how[0] is p.grad:
                    if how[1] == "stepped":
                        raise RuntimeError(
                            f"{where}: scaler.step(optimizer) has already run in this iteration for these "
                            f"parameters, so the step used unclipped gradients; clip before step() ({_RECIPE})"
                        )
                    if how[1] == "folded":
                        raise RuntimeError(
                            f"{where}: these gradients were already clipped with fold=True in this iteration "
                            "(they are still scaled in p.grad and the step will unscale and clip them); "
                            "clip once per iteration"
                        )
                    continue  # unscaled through its optimizer: clip only
                todo.append(p)
            if todo:
                assert self._scale is not None
                inv_scale = self._scale.double().reciprocal().float()
                found_inf = torch.full((), 0.0, dtype=torch.float32, device=self._scale.device)
                # float16 gradients are taken here: whether their optimizer
                # may have them is checked when it is unscaled / stepped.
                found, _ = _amp_grads.unscale_grads(
                    _amp_grads.ParamList(todo), inv_scale, found_inf, allow_fp16=True,
                    process_group=self._process_group,
                )
                for p in todo:
                    self._loose[id(p.grad)] = (weakref.ref(p.grad), found)
        return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type, error_if_nonfinite, foreach)

    @_eager
    def clip_grad_norm_(
        self,
        optimizer,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = False,
        foreach: bool | None = None,
        *,
        fold: bool = False,
    ) -> torch.Tensor:
        """``unscale_(optimizer)`` + ``torch.nn.utils.clip_grad_norm_`` over the
        optimizer's gradients (L2 norm), reading the gradients once instead of
        twice: the norm comes from the unscale pass. Returns the total norm
        (before clipping). Grads are multiplied by
        ``min(1, max_norm / (norm + 1e-6))`` exactly like torch.

        Takes what ``torch.nn.utils.clip_grad_norm_`` takes as far as it
        can: ``norm_type`` other than 2 (inf, 1, ...) unscales, then runs
        torch's function on the optimizer's parameters (correct, not fused);
        ``foreach`` is passed on there (the fused L2 path has no use for it).
        After ``unscale_(optimizer)`` it clips the unscaled gradients with
        torch's function (torch's recipe, unscale_ then clip).

        Instead of an optimizer, parameters (a tensor, a list, a generator,
        torch's calling convention, e.g. ``model.parameters()``): their
        gradients are unscaled if this iteration has not unscaled them yet,
        then clipped by torch's function: the same norm, clipped gradients
        and step as ``scaler.unscale_(opt);
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)``, bit
        for bit (``step()`` does not unscale them again and skips on their
        overflow). Passing the optimizer is the faster path (one read of the
        gradients instead of two).

        ``fold=True`` (mixprec optimizers; otherwise ignored) folds the
        unscale and the clip into the optimizer step instead: one read-only
        pass computes the norm (``mixprec.ops.grad_norm``, the same value
        bit for bit) and the step divides the still-scaled gradients by
        ``scale / clip_coef`` in FP32. The gradients are read twice and
        written never (unfolded: read three times, written twice), but they
        stay scaled and unclipped in ``p.grad``, also after the step (the
        unfolded path leaves them unscaled and clipped): use it when nothing
        reads them between this call and the next backward. FP32 gradients:
        the step equals the unfolded path's to FP32 rounding (one rounding of
        ``g / (scale / coef)`` instead of two). FP16/BF16 gradients: the
        unfolded path rounds the unscaled and the clipped gradient to the
        gradient's dtype, the folded one never does, so the steps differ by
        that rounding. Measured (a 3-layer Linear/GELU net, mixprec AdamW
        lr 1e-2, clip active, the 4th step from the same state, 5 seeds):
        FP32 masters differ by at most 1.5e-6 x lr (FP32 rounding); BF16
        masters by up to 1.8e-3 x lr (2.2e-4 x lr on average over the
        elements, nearly all of which differ); FP16 by up to 4.2e-4 x lr."""
        where = f"{_WHERE}.clip_grad_norm_"
        max_norm = as_float(where, "max_norm", max_norm, finite=False, low=0.0)
        try:
            norm_value = float(norm_type)  # torch takes "inf" too
        except (TypeError, ValueError):
            raise TypeError(f"{where}: norm_type must be a real number or 'inf', got {norm_type!r}") from None
        if isinstance(norm_type, bool):
            raise TypeError(f"{where}: norm_type must be a real number or 'inf', got {norm_type!r}")
        if norm_value != norm_value:
            raise ValueError(f"{where}: norm_type must be a real number or 'inf', got {norm_type!r}")
        if not _is_optimizer(optimizer):
            return self._clip_parameters(optimizer, max_norm, norm_type, error_if_nonfinite, foreach)
        params = [p for g in optimizer.param_groups for p in g["params"]]
        stage = self._per_optimizer_states[id(optimizer)]["stage"] if self._enabled else OptState.READY
        if stage is OptState.STEPPED:
            raise RuntimeError(
                f"{where}: scaler.step(optimizer) has already run in this iteration, so the step used unclipped "
                f"gradients; clip before step() ({_RECIPE})"
            )
        if stage is OptState.UNSCALED:
            if getattr(optimizer, "_grads_read_only", False):
                raise RuntimeError(
                    f"{where}: already called with fold=True on this optimizer in this iteration (its gradients "
                    "are still scaled in p.grad; the step unscales and clips them); clip once per iteration"
                )
            return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type, error_if_nonfinite, foreach)
        if norm_value != 2.0 or self._loose:
            if self._enabled:
                self.unscale_(optimizer)
            return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type, error_if_nonfinite, foreach)
        if fold and self._enabled and self._can_fold(optimizer):
            return self._clip_folded(optimizer, float(max_norm), error_if_nonfinite)
        total = self.unscale_(optimizer, return_norm=True)
        assert total is not None
        _amp_clip.check_finite(total, error_if_nonfinite)
        _amp_clip.scale_grads(optimizer, total, max_norm)
        return total

    def _can_fold(self, optimizer: torch.optim.Optimizer) -> bool:
        """Folding needs an optimizer that divides grads by ``grad_scale`` in
        FP32 without writing them (mixprec's), and grads the fused read-only
        op takes (dense FP32/FP16/BF16 on a device mixprec handles)."""
        from .optim import _FusedMasterWeightOptimizer

        return (
            isinstance(optimizer, _FusedMasterWeightOptimizer)
            and self._per_optimizer_states[id(optimizer)]["stage"] is OptState.READY
            and _amp_grads.all_fusable(optimizer)
        )

    def _clip_folded(self, optimizer: torch.optim.Optimizer, max_norm: float, error_if_nonfinite: bool) -> torch.Tensor:
        self._check_scale_growth_tracker("clip_grad_norm_")
        optimizer_state = self._per_optimizer_states[id(optimizer)]
        assert self._scale is not None
        inv_scale = self._scale.double().reciprocal().float()
        found_inf = torch.full((), 0.0, dtype=torch.float32, device=self._scale.device)
        per_tensor = [] if self._health is not None else None
        found, norms = _amp_grads.grad_norms_read_only(
            optimizer, inv_scale, found_inf, self._process_group, per_tensor=per_tensor
        )
        self._record(optimizer, per_tensor)
        total = norms.total(self._scale.device)
        _amp_clip.check_finite(total, error_if_nonfinite)
        # step() hands this to the optimizer as its grad_scale (the UNSCALED
        # stage passes optimizer.grad_scale through unchanged).
        optimizer.grad_scale = _amp_clip.folded_grad_scale(self._scale, total, max_norm)  # type: ignore[attr-defined]
        optimizer._grads_read_only = True  # type: ignore[attr-defined]  (step() reads, never writes, the grads)
        optimizer_state["found_inf_per_device"] = found
        optimizer_state["stage"] = OptState.UNSCALED
        self._seen(optimizer)
        return total

    # -------------------------------------------------------------- step ----
    @_eager
    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> float | None:
        """As torch's: unscales if needed, then steps unless a gradient was
        inf/NaN. Optimizers with ``_step_supports_amp_scaling`` get
        ``grad_scale`` / ``found_inf`` tensors and skip on the device;
        mixprec's (like torch's fused ones) write the unscaled gradients back
        in the same pass, except on a skipped step and after a folded clip,
        where ``p.grad`` keeps the scaled values."""
        _check_optimizer(f"{_WHERE}.step", optimizer)
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._check_scale_growth_tracker("step")
        optimizer_state = self._per_optimizer_states[id(optimizer)]
        if optimizer_state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        self._seen(optimizer)
        if self._loose and optimizer_state["stage"] is OptState.READY:
            # Some grads were unscaled by clip_grad_norm_(parameters): the
            # rest now, so the optimizer gets no grad_scale to divide by.
            self.unscale_(optimizer)

        if getattr(optimizer, "_step_supports_amp_scaling", False):
            kwargs_ = kwargs
            has_grad_scaler_kwarg = "grad_scaler" in inspect.signature(optimizer.step).parameters
            if has_grad_scaler_kwarg:
                warnings.warn(
                    "GradScaler is going to stop passing itself as a keyword argument to the passed "
                    "optimizer. In the near future GradScaler registers `grad_scale: Tensor` and "
                    "`found_inf: Tensor` to the passed optimizer and let the optimizer use them directly.",
                    FutureWarning,
                    stacklevel=2,
                )
                kwargs_.update({"grad_scaler": self})
            else:
                if optimizer_state["stage"] is OptState.READY:
                    self._check_inf_per_device(optimizer)
                scaler = self._get_scale_async()
                assert scaler is not None
                found_inf = sum(
                    t.to(scaler.device, non_blocking=True) for t in optimizer_state["found_inf_per_device"].values()
                )
                optimizer.grad_scale = (  # type: ignore[attr-defined]
                    getattr(optimizer, "grad_scale", None)
                    if optimizer_state["stage"] == OptState.UNSCALED
                    else scaler * getattr(optimizer, "grad_scale", 1)
                )
                optimizer.found_inf = found_inf  # type: ignore[attr-defined]
            retval = optimizer.step(*args, **kwargs_)
            optimizer_state["stage"] = OptState.STEPPED
            if not has_grad_scaler_kwarg:
                del optimizer.grad_scale  # type: ignore[attr-defined]
                del optimizer.found_inf  # type: ignore[attr-defined]
            optimizer.__dict__.pop("_grads_read_only", None)
            return retval

        if optimizer_state["stage"] is OptState.READY:
            self.unscale_(optimizer)
        if len(optimizer_state["found_inf_per_device"]) == 0:
            raise AssertionError("No inf checks were recorded for this optimizer.")
        retval = self._maybe_opt_step(optimizer, optimizer_state, *args, **kwargs)
        optimizer_state["stage"] = OptState.STEPPED
        return retval

    def _check_inf_per_device(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        _scale, _ = self._check_scale_growth_tracker("_check_inf_per_device")
        dummy_inv_scale = torch.full((), 1.0, dtype=torch.float32, device=_scale.device)
        found_inf = torch.full((), 0.0, dtype=torch.float32, device=_scale.device)
        # torch multiplies every grad by 1.0 in place here; the fused grads
        # are only read.
        per_tensor = [] if self._health is not None else None
        found, _ = self._unscale_grads_(
            optimizer, dummy_inv_scale, found_inf, True, read_only=True, per_tensor=per_tensor
        )
        # The check ran with inv_scale 1: its norms are of the scaled grads.
        self._record(optimizer, per_tensor, factor=_scale.double().reciprocal())
        self._per_optimizer_states[id(optimizer)]["found_inf_per_device"] = found
        return found

    # ------------------------------------------------------------ update ----
    @_eager
    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        """As torch's ``update``: backs off on overflow, grows after
        ``growth_interval`` clean steps (plus hysteresis and bounds if set),
        on the device, no host sync. Counts skipped steps."""
        if not self._enabled:
            return
        _scale, _growth_tracker = self._check_scale_growth_tracker("update")
        if new_scale is not None and not isinstance(new_scale, torch.Tensor):
            # torch takes a float only (an int failed on .device); a NaN,
            # inf or zero scale would poison every later step.
            new_scale = as_float(f"{_WHERE}.update", "new_scale", new_scale, above=0.0)
        if new_scale is not None:
            if isinstance(new_scale, float):
                _scale.fill_(new_scale)
            else:
                reason = (
                    "new_scale should be a float or a 1-element torch.cuda.FloatTensor or "
                    "torch.FloatTensor with requires_grad=False."
                )
                if new_scale.device.type != self._device:
                    raise AssertionError(reason)
                if new_scale.numel() != 1:
                    raise AssertionError(reason)
                if new_scale.requires_grad is True:
                    raise AssertionError(reason)
                _scale.copy_(new_scale)
        else:
            found_infs = [
                found_inf.to(device=_scale.device, non_blocking=True)
                for state in self._per_optimizer_states.values()
                for found_inf in state["found_inf_per_device"].values()
            ]
            if len(found_infs) == 0:
                raise AssertionError("No inf checks were recorded prior to update.")
            found_inf_combined = found_infs[0]
            for extra in found_infs[1:]:
                found_inf_combined = found_inf_combined + extra
            if self._health is not None:
                self._health.end_step(_scale, found_inf_combined)
            assert self._hysteresis_tracker is not None and self._skipped_steps is not None
            if handles(_scale.device):
                torch.ops.mixprec.update_scale_ex_(
                    _scale,
                    _growth_tracker,
                    self._hysteresis_tracker,
                    self._skipped_steps,
                    found_inf_combined,
                    float(self._growth_factor),
                    float(self._backoff_factor),
                    int(self._growth_interval),
                    self._hysteresis,
                    self._min_scale,
                    self._max_scale,
                )
            else:
                self._update_with_torch(_scale, _growth_tracker, found_inf_combined)
        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)
        self._reset_iteration()

    def _update_with_torch(self, scale: torch.Tensor, tracker: torch.Tensor, found_inf: torch.Tensor) -> None:
        """The same rule with torch ops, for devices without mixprec kernels."""
        if self._hysteresis != 1 or self._min_scale != 0.0 or self._max_scale != float("inf"):
            raise RuntimeError(
                f"mixprec.amp.GradScaler: hysteresis/min_scale/max_scale need mixprec kernels, "
                f"which are not available on {scale.device}"
            )
        self._skipped_steps += (found_inf != 0).to(torch.int64)
        torch._amp_update_scale_(
            scale, tracker, found_inf, self._growth_factor, self._backoff_factor, self._growth_interval
        )

    # -------------------------------------------------------- diagnostics ----
    def _record(self, optimizer, per_tensor, factor: torch.Tensor | None = None) -> None:
        if self._health is not None and per_tensor:
            assert self._scale is not None
            self._health.record(optimizer, per_tensor, self._scale.device, factor)

    def _diagnostics(self, what: str) -> Recorder:
        if self._health is None:
            raise RuntimeError(
                f"mixprec.amp.GradScaler.{what}: diagnostics are off; construct the scaler with "
                "diagnostics=True or named_parameters=model.named_parameters()"
            )
        return self._health

    def add_step_listener(self, listener) -> None:
        """Registers ``listener`` (held weakly; e.g. a
        ``mixprec.guard.ForwardGuard``): every ``update()`` calls
        ``listener.on_scaler_step(found_inf)`` with the step's combined
        found_inf (a tensor on the scale's device, nonzero for a skipped
        step; nothing is read from the device), and ``health()`` appends
        ``listener.health_summary()`` (a ``str`` or None) to its summary.
        Registering the same object again does nothing. Needs diagnostics
        (``diagnostics=True`` or ``named_parameters=``)."""
        for attr in ("on_scaler_step", "health_summary"):
            if not callable(getattr(listener, attr, None)):
                raise TypeError(
                    f"mixprec.amp.GradScaler.add_step_listener: listener must have a callable {attr}(), "
                    f"got {type(listener).__name__}"
                )
        self._diagnostics("add_step_listener").add_listener(listener)

    @_takes(module="mixprec.amp")
    def last_overflow(self) -> list[Overflow]:
        """The parameters whose gradients had an inf or NaN in the latest
        unscale pass (this iteration's if it has been unscaled, else the
        last step's), each as ``Overflow(index, name, grad_norm)``: its
        position in its optimizer's parameters, its name (``named_parameters``)
        or ``str(index)``, and its unscaled gradient's L2 norm (inf or nan).
        Empty when nothing overflowed. Synchronises once."""
        return self._diagnostics("last_overflow").last_overflow()

    @_takes(module="mixprec.amp")
    def last_grad_norms(self) -> dict[str, float]:
        """Every parameter's unscaled gradient L2 norm from the latest
        unscale pass, by name (see ``last_overflow``). Synchronises once."""
        return self._diagnostics("last_grad_norms").last_grad_norms()

    @_takes(module="mixprec.amp")
    def health(self) -> TrainingHealth:
        """The record of every ``update()`` so far: the scale each step ran
        with, whether it was skipped, the global gradient norm (unscaled,
        before clipping; nan for a step without an unscale pass), and how
        many steps each parameter's gradient overflowed in (most first).
        ``print()`` it for a summary. Synchronises once."""
        return self._diagnostics("health").health()

    # ------------------------------------------------------ persistence ----
    def _get_hysteresis_tracker(self) -> int:
        if self._hysteresis_tracker is None:
            return self._init_hysteresis_tracker
        return int(self._hysteresis_tracker.item())

    @_takes(module="mixprec.amp")
    def state_dict(self) -> dict[str, Any]:
        """torch's keys (scale, growth_factor, backoff_factor, growth_interval,
        _growth_tracker) plus mixprec's (hysteresis, min_scale, max_scale,
        _hysteresis_tracker, _skipped_steps), which torch's GradScaler ignores
        when it loads this dict."""
        if not self._enabled:
            return {}
        return {
            "scale": self.get_scale(),
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": self._get_growth_tracker(),
            "hysteresis": self._hysteresis,
            "min_scale": self._min_scale,
            "max_scale": self._max_scale,
            "_hysteresis_tracker": self._get_hysteresis_tracker(),
            "_skipped_steps": self.get_skipped_steps(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads a state dict of this class or of ``torch.amp.GradScaler``
        (mixprec's extra keys then keep their current values). Everything
        is checked first (the keys torch's dict has, each value's kind and
        range, as the constructor checks them): a refused dict changes
        nothing."""
        w = f"{_WHERE}.load_state_dict"
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"{w}: state_dict must be a dict (from state_dict()), got {type(state_dict).__name__}")
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError(
                "The source state dict is empty, possibly because it was saved "
                "from a disabled instance of GradScaler."
            )
        missing = [k for k in ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")
                   if k not in state_dict]
        if missing:
            raise ValueError(f"{w}: state_dict lacks {', '.join(map(repr, missing))} (not a GradScaler's state_dict)")

        def get(key, convert, default, **bounds):
            return convert(w, f"state_dict[{key!r}]", state_dict[key], **bounds) if key in state_dict else default

        scale = get("scale", as_float, None, above=0.0)
        growth_factor = get("growth_factor", as_float, None, above=1.0)
        backoff_factor = get("backoff_factor", as_float, None, above=0.0)
        if not backoff_factor < 1.0:
            raise ValueError(f"{w}: state_dict['backoff_factor'] must be < 1.0, got {backoff_factor!r}")
        growth_interval = get("growth_interval", as_int, None, low=1, high=_INT32_MAX)
        growth_tracker = get("_growth_tracker", as_int, None, low=0, high=_INT32_MAX)
        hysteresis = get("hysteresis", as_int, self._hysteresis, low=1, high=_INT32_MAX)
        min_scale = get("min_scale", as_float, self._min_scale, low=0.0)
        max_scale = get("max_scale", as_float, self._max_scale, finite=False)
        if not min_scale <= max_scale:
            raise ValueError(f"{w}: need 0 <= state_dict['min_scale'] <= state_dict['max_scale'], got "
                             f"{min_scale}, {max_scale}")
        hysteresis_tracker = get("_hysteresis_tracker", as_int, hysteresis, low=0, high=_INT32_MAX)
        skipped = get("_skipped_steps", as_int, self._init_skipped_steps, low=0, high=2**63 - 1)
        # Then applied, as torch's load_state_dict and the extra keys.
        self._init_scale = scale
        self._growth_factor = growth_factor
        self._backoff_factor = backoff_factor
        self._growth_interval = growth_interval
        self._init_growth_tracker = growth_tracker
        self._hysteresis = hysteresis
        self._min_scale = min_scale
        self._max_scale = max_scale
        self._init_hysteresis_tracker = hysteresis_tracker
        self._init_skipped_steps = skipped
        if self._scale is not None:
            self._scale.fill_(scale)
        if self._growth_tracker is not None:
            self._growth_tracker.fill_(growth_tracker)
        if self._hysteresis_tracker is not None:
            self._hysteresis_tracker.fill_(self._init_hysteresis_tracker)
        if self._skipped_steps is not None:
            self._skipped_steps.fill_(self._init_skipped_steps)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        if self._enabled:
            state["_init_hysteresis_tracker"] = self._get_hysteresis_tracker()
            state["_init_skipped_steps"] = self.get_skipped_steps()
            state["_hysteresis_tracker"] = None
            state["_skipped_steps"] = None
        state["_process_group"] = None  # not picklable; pass it again after unpickling
        state["_optimizers"] = {}  # weak references: empty at the start or end of an iteration anyway
        state["_loose"] = {}
        return state


@_eager
def backward_and_step(
    loss: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    *,
    max_norm: float | None = None,
    set_to_none: bool = True,
    fold: bool = True,
) -> torch.Tensor | None:
    """The whole mixed-precision update of one iteration, in the order the
    AMP recipe prescribes: scale the loss, backward, unscale (with the
    gradient norm from the same pass) and clip to ``max_norm`` if given, step
    (skipped on the device if a gradient overflowed), update the scale, zero
    the gradients. Returns the total gradient norm before clipping (a device
    tensor, no sync) when ``max_norm`` is given, else None. With a mixprec
    optimizer the unscale and the clip are folded into the step
    (``clip_grad_norm_(..., fold=True)``): the gradients are never written,
    so they stay scaled; ``set_to_none=True`` (the default) drops them.

    ``scaler`` may also be torch's ``torch.amp.GradScaler``: then this is
    torch's recipe (``unscale_``, ``torch.nn.utils.clip_grad_norm_`` over
    the optimizer's parameters, step, update). Every argument is checked
    before the backward runs, so a wrong one raises with the gradients
    untouched.

    Typical use with a BF16/FP16 model and FP32 master weights::

        model = model.to(torch.bfloat16)
        opt = mixprec.optim.AdamW(model.parameters(), lr=1e-3)
        scaler = mixprec.amp.GradScaler("cuda")
        for x, y in loader:
            loss = F.cross_entropy(model(x).float(), y)   # loss in FP32
            mixprec.amp.backward_and_step(loss, opt, scaler, max_norm=1.0)
    """
    where = "mixprec.amp.backward_and_step"
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"{where}: loss must be a tensor, got {type(loss).__name__}")
    _check_optimizer(where, optimizer)
    if not isinstance(scaler, torch.amp.GradScaler):
        raise TypeError(
            f"{where}: scaler must be a mixprec.amp.GradScaler (or a torch.amp.GradScaler), got {type(scaler).__name__}"
        )
    if max_norm is not None:
        max_norm = as_float(where, "max_norm", max_norm, finite=False, low=0.0)
    for name, v in (("set_to_none", set_to_none), ("fold", fold)):
        if not isinstance(v, bool):
            raise TypeError(f"{where}: {name} must be a bool, got {type(v).__name__} {v!r}")
    scaler.scale(loss).backward()
    norm = None
    if max_norm is not None:
        if isinstance(scaler, GradScaler):
            norm = scaler.clip_grad_norm_(optimizer, max_norm, fold=fold)
        else:
            scaler.unscale_(optimizer)
            params = [p for g in optimizer.param_groups for p in g["params"]]
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=set_to_none)
    return norm
