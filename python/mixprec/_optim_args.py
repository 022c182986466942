"""Argument checks of ``mixprec.optim``'s optimizers: torch's checks of the
hyper-parameters, the EMA's group keys, and the per-param checks made at
each step (dtype, sparse gradients, a float16 param in a master-free group).
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import torch
from typing_extensions import TypedDict

from ._args import as_int, as_real
from ._library import FLOAT_DTYPES as _PARAM_DTYPES
from ._optim_lean import check_group

# The EMA's group keys with timm ModelEmaV3's defaults (ema_decay None: no EMA).
_EMA_DEFAULTS = dict(
    ema_decay=None, ema_min_decay=0.0, ema_use_warmup=False, ema_warmup_gamma=1.0, ema_warmup_power=2 / 3,
    ema_update_after_step=0, ema_update_every=1,
)




class SharedOptions(TypedDict, total=False):
    """The keyword-only options AdamW and SGD share (their ``**options``),
    documented in :class:`mixprec.optim.AdamW`; defaults in
    :data:`SHARED_DEFAULTS`."""

    master_weights: bool
    param_remainders: bool
    seed: Optional[int]
    ema_decay: Optional[float]
    ema_min_decay: float
    ema_use_warmup: bool
    ema_warmup_gamma: float
    ema_warmup_power: float
    ema_update_after_step: int
    ema_update_every: int
    foreach: Optional[bool]
    capturable: bool
    differentiable: bool
    fused: Optional[bool]


SHARED_DEFAULTS: dict[str, Any] = dict(
    master_weights=True, param_remainders=False, seed=None, **_EMA_DEFAULTS,
    foreach=None, capturable=False, differentiable=False, fused=None,
)
assert SHARED_DEFAULTS.keys() == SharedOptions.__annotations__.keys()


def shared_options(init):
    """Decorates an optimizer's ``__init__(..., **options:
    Unpack[SharedOptions])``: its signature (``help()``, IDEs,
    LightningCLI's introspection) lists the shared keywords with their
    defaults, and ``options`` arrives complete (defaults filled in); an
    unknown keyword raises Python's TypeError."""
    sig = inspect.signature(init)
    head = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    hints = typing.get_type_hints(SharedOptions)
    shared = [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=v, annotation=hints[k])
              for k, v in SHARED_DEFAULTS.items()]
    own = {p.name for p in head}

    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        unknown = [k for k in kwargs if k not in own and k not in SHARED_DEFAULTS]
        if unknown:
            raise TypeError(f"{init.__qualname__}() got an unexpected keyword argument {unknown[0]!r}")
        options = {k: kwargs.pop(k, v) for k, v in SHARED_DEFAULTS.items()}
        init(self, *args, **kwargs, **options)

    wrapper.__signature__ = sig.replace(parameters=[*head, *shared])
    return wrapper


def _check_lr(w: str, lr) -> None:
    """torch's checks of ``lr`` in torch's words, for floats, ints and
    tensors (NaN fails ``0 <= lr`` and is refused too), after ``w`` (the
    callable) and with the argument named."""
    if isinstance(lr, torch.Tensor):
        if lr.numel() != 1:
            raise ValueError(f"{w}: Tensor lr must be 1-element, got shape {tuple(lr.shape)}")
        x = lr.item()
    else:
        x = lr
    if not isinstance(x, numbers.Real):  # bools are taken as 0/1, as torch's
        raise TypeError(f"{w}: lr must be a real number or a one-element tensor, got {type(lr).__name__} {lr!r}")
    if not 0.0 <= x:
        raise ValueError(f"{w}: Invalid learning rate: {lr} (lr must be >= 0)")


def _flag(w: str, name: str, v, *, none: bool = False) -> bool | None:
    """``v`` as a bool: True/False (or 0/1, as torch's flags take them);
    anything else (a string, which bool() would take as True, NaN, None
    unless ``none``) is a TypeError naming ``w`` and ``name``."""
    if v is None and none:
        return None
    if isinstance(v, bool):
        return v
    if isinstance(v, numbers.Integral) and v in (0, 1):
        return bool(v)
    want = "True, False or None" if none else "True or False"
    raise TypeError(f"{w}: {name} must be {want}, got {type(v).__name__} {v!r}")


def _torch_flags(w: str, foreach, capturable, differentiable, fused) -> dict[str, Any]:
    """torch's implementation flags, accepted so code written for torch's
    optimizers runs unchanged: mixprec's step is always one fused,
    capturable pass, so ``foreach`` / ``fused`` / ``capturable`` change
    nothing (they are kept in the param groups as torch keeps them);
    ``differentiable=True`` (autograd through the step) is not supported.
    Each must be a bool (``foreach`` / ``fused`` also None), as
    ``load_state_dict`` checks them."""
    _flag(w, "foreach", foreach, none=True)
    _flag(w, "fused", fused, none=True)
    if _flag(w, "differentiable", differentiable):
        raise NotImplementedError(
            f"{w}: differentiable=True (autograd through the optimizer step) is not supported"
        )
    return dict(foreach=foreach, capturable=_flag(w, "capturable", capturable), differentiable=False, fused=fused)


def _hyper(w: str, name: str, v) -> float:
    """A hyper-parameter torch's optimizers take too (``eps``, ``betas[i]``,
    ``momentum``...) as a float for its range check: a real number (a bool
    as 0/1, as torch takes it) or a one-element tensor (a tensor of several
    elements said in torch's words for ``lr``; torch itself fails later, on
    the truth value of a several-element tensor, naming nothing). NaN and
    inf pass: the caller's range check refuses them as torch's does."""
    if isinstance(v, torch.Tensor):
        if v.numel() != 1:
            raise ValueError(f"{w}: Tensor {name} must be 1-element, got shape {tuple(v.shape)}")
        v = v.item()
    if not isinstance(v, numbers.Real):
        raise TypeError(f"{w}: {name} must be a real number, got {type(v).__name__} {v!r}")
    return float(v)


def _betas(w: str, betas) -> tuple[Any, Any]:
    """AdamW's ``betas``: a pair of numbers (one-element tensors as their
    values)."""
    if isinstance(betas, (str, bytes)) or not isinstance(betas, Sequence) or len(betas) != 2:
        raise TypeError(f"{w}: betas must be a pair of numbers (beta1, beta2), got {type(betas).__name__} {betas!r}")
    for i, b in enumerate(betas):
        _hyper(w, f"betas[{i}]", b)
    return tuple(b.item() if isinstance(b, torch.Tensor) else b for b in betas)


def _real(w: str, name: str, v) -> float:
    """One of mixprec's own real options as a float: a real number (Python,
    NumPy, or a one-element tensor); a bool, a string, None, a list, a
    tensor of several elements is a TypeError naming ``w`` and ``name``
    (NaN and inf pass: the ranges are checked where they matter)."""
    return as_real(w, name, v)


def _seed(w: str, v) -> int | None:
    """The stochastic-rounding seed: None (drawn when the group is added)
    or an integer."""
    return None if v is None else as_int(w, "seed", v)


def _own_group_keys(w: str, group: Mapping[str, Any]) -> dict[str, Any]:
    """mixprec's own group keys (the EMA's, ``master_weights``, ``seed``)
    converted and checked: the one place for them, run on the constructor's
    defaults and on every param group added (a group may set any of them).
    The EMA's ranges are those of the C API (mixprec_ema_params), checked
    when the group keeps an EMA; the conversions always. Errors name ``w``
    (the callable) and the key: TypeError for a value of the wrong kind,
    ValueError for one out of range ([note: argument conversion] in
    ``_args``)."""
    decay = group.get("ema_decay")
    out = dict(
        ema_decay=None if decay is None else _real(w, "ema_decay", decay),
        ema_min_decay=_real(w, "ema_min_decay", group.get("ema_min_decay", 0.0)),
        ema_use_warmup=_flag(w, "ema_use_warmup", group.get("ema_use_warmup", False)),
        ema_warmup_gamma=_real(w, "ema_warmup_gamma", group.get("ema_warmup_gamma", 1.0)),
        ema_warmup_power=_real(w, "ema_warmup_power", group.get("ema_warmup_power", 2 / 3)),
        ema_update_after_step=as_int(w, "ema_update_after_step", group.get("ema_update_after_step", 0), low=0),
        ema_update_every=as_int(w, "ema_update_every", group.get("ema_update_every", 1), low=1),
        master_weights=_flag(w, "master_weights", group.get("master_weights", True)),
        seed=_seed(w, group.get("seed")),
    )
    if out["ema_decay"] is not None:
        for name in ("ema_decay", "ema_min_decay"):
            if not 0.0 <= out[name] <= 1.0:
                raise ValueError(f"{w}: {name} must be a number in [0, 1], got {out[name]}")
        if out["ema_use_warmup"]:
            for name in ("ema_warmup_gamma", "ema_warmup_power"):
                if not (math.isfinite(out[name]) and out[name] > 0):
                    raise ValueError(f"{w}: {name} must be a finite number > 0 (ema_use_warmup=True), got {out[name]}")
    return out


class _ParamChecks:
    """The checks an optimizer makes on its params (mixed into
    ``mixprec.optim``'s base class)."""

    def _check_group_options(self, w: str, group: dict[str, Any]) -> None:
        """A group as it will be installed (just added, or about to be
        loaded), checked as the constructor checks its arguments: ``lr``,
        torch's flags, the class's own hyper-parameters
        (``_check_hyper``), mixprec's own keys (converted in place, see
        :func:`_own_group_keys`), the lean options and the group's mode
        against its params' dtypes. ``w`` names the callable (and, for a
        loaded group, where it is) in every error."""
        if "lr" in group:
            _check_lr(w, group["lr"])
        for k in ("capturable", "differentiable"):
            _flag(w, k, group.get(k, False))
        for k in ("foreach", "fused"):
            _flag(w, k, group.get(k), none=True)
        if group.get("differentiable", False):  # the constructor's error, whichever way the group came in
            raise NotImplementedError(
                f"{w}: differentiable=True (autograd through the optimizer step) is not supported"
            )
        self._check_hyper(w, group)
        group.update(_own_group_keys(w, group))
        check_group(w, group, self._MOMENTS.values())
        self._check_group_mode(w, group)

    def _check_group_mode(self, w: str, group: dict[str, Any]) -> None:
        if group.get("master_weights", True):
            return
        for p in group["params"]:
            if p.dtype == torch.float16:
                raise ValueError(
                    f"{w}: master_weights=False is for bfloat16 (and float32) parameters; float16 parameters "
                    "need FP32 master weights"
                )

    def _check_param(self, p: torch.Tensor, group_index: int, index: int) -> None:
        if p.dtype not in _PARAM_DTYPES:
            raise RuntimeError(
                f"{type(self).__name__}: param_groups[{group_index}]['params'][{index}] is {p.dtype} "
                f"(shape {tuple(p.shape)}); parameters must be float32, float16 or bfloat16"
            )
        if p.grad is not None and p.grad.is_sparse:
            raise RuntimeError(
                f"{type(self).__name__}: param_groups[{group_index}]['params'][{index}] (shape "
                f"{tuple(p.shape)}) has a sparse gradient; mixprec's optimizers take dense gradients "
                "(torch.optim.SparseAdam is torch's for sparse ones)"
            )
