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
from collections.abc import Mapping
from typing import Any, Optional

import torch
from typing_extensions import TypedDict

from ._library import FLOAT_DTYPES as _PARAM_DTYPES

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


def _check_lr(lr) -> None:
    """torch's checks of ``lr``, for floats, ints and tensors (NaN fails
    ``0 <= lr`` and is refused too)."""
    if isinstance(lr, torch.Tensor) and lr.numel() != 1:
        raise ValueError("Tensor lr must be 1-element")
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")


def _torch_flags(foreach, capturable, differentiable, fused) -> dict[str, Any]:
    """torch's implementation flags, accepted so code written for torch's
    optimizers runs unchanged: mixprec's step is always one fused,
    capturable pass, so ``foreach`` / ``fused`` / ``capturable`` change
    nothing (they are kept in the param groups as torch keeps them);
    ``differentiable=True`` (autograd through the step) is not supported."""
    if differentiable:
        raise NotImplementedError(
            "mixprec.optim: differentiable=True (autograd through the optimizer step) is not supported"
        )
    return dict(foreach=foreach, capturable=bool(capturable), differentiable=False, fused=fused)


def _check_scalars(**values) -> None:
    """A tensor given for a scalar hyper-parameter has one element, said
    in torch's words for ``lr`` (torch itself fails later, on the truth
    value of a several-element tensor, naming nothing)."""
    for name, v in values.items():
        if isinstance(v, torch.Tensor) and v.numel() != 1:
            raise ValueError(f"Tensor {name} must be 1-element")


def _scalar(x, what: str) -> float:
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            raise ValueError(f"Tensor {what} must be 1-element")
        return float(x.item())
    return x


def _real(name: str, v, *, bools: bool = False) -> float:
    """``v`` as a float: a real number (Python, NumPy, or a one-element
    tensor); a string, None, a list (and a bool, unless ``bools``: torch's
    own arguments take one as 0/1) is refused naming ``name``."""
    if isinstance(v, torch.Tensor):
        if v.numel() != 1:
            raise ValueError(f"Invalid {name} value: a tensor of {v.numel()} elements (a number)")
        v = v.item()
    if (isinstance(v, bool) and not bools) or not isinstance(v, numbers.Real):
        raise TypeError(f"Invalid {name} value: {v!r} (a real number)")
    return float(v)


def _integer(name: str, v, minimum: int | None) -> int:
    """``v`` as an int (>= ``minimum`` unless None): an integer, or a float
    with an integral value; NaN, inf, a bool or a fractional value is
    refused with a ValueError naming ``name`` (not int()'s message, which
    names nothing)."""
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        v = v.item()
    ok = (
        not isinstance(v, bool) and isinstance(v, numbers.Real)
        and math.isfinite(v) and float(v).is_integer() and (minimum is None or v >= minimum)
    )
    if not ok:
        want = "an integer" if minimum is None else f"an integer >= {minimum}"
        raise ValueError(f"Invalid {name} value: {v!r} ({want})")
    return int(v)


def _flag(name: str, v) -> bool:
    """``v`` as a bool: True/False (or 0/1); anything else (a string, which
    bool() would take as True, NaN, None) is refused naming ``name``."""
    if isinstance(v, bool):
        return v
    if isinstance(v, numbers.Integral) and v in (0, 1):
        return bool(v)
    raise TypeError(f"Invalid {name} value: {v!r} (True or False)")


def _seed(v) -> int | None:
    """The stochastic-rounding seed: None (drawn when the group is added)
    or an integer."""
    return None if v is None else _integer("seed", v, None)


def _own_group_keys(group: Mapping[str, Any]) -> dict[str, Any]:
    """mixprec's own group keys (the EMA's, ``master_weights``, ``seed``)
    converted and checked: the one place for them, run on the constructor's
    defaults and on every param group added (a group may set any of them).
    The EMA's ranges are those of the C API (mixprec_ema_params), checked
    when the group keeps an EMA; the conversions always."""
    decay = group.get("ema_decay")
    out = dict(
        ema_decay=None if decay is None else _real("ema_decay", decay),
        ema_min_decay=_real("ema_min_decay", group.get("ema_min_decay", 0.0)),
        ema_use_warmup=_flag("ema_use_warmup", group.get("ema_use_warmup", False)),
        ema_warmup_gamma=_real("ema_warmup_gamma", group.get("ema_warmup_gamma", 1.0)),
        ema_warmup_power=_real("ema_warmup_power", group.get("ema_warmup_power", 2 / 3)),
        ema_update_after_step=_integer("ema_update_after_step", group.get("ema_update_after_step", 0), 0),
        ema_update_every=_integer("ema_update_every", group.get("ema_update_every", 1), 1),
        master_weights=_flag("master_weights", group.get("master_weights", True)),
        seed=_seed(group.get("seed")),
    )
    if out["ema_decay"] is not None:
        for name in ("ema_decay", "ema_min_decay"):
            if not 0.0 <= out[name] <= 1.0:
                raise ValueError(f"Invalid {name} value: {out[name]} (must be in [0, 1])")
        if out["ema_use_warmup"]:
            for name in ("ema_warmup_gamma", "ema_warmup_power"):
                if not (math.isfinite(out[name]) and out[name] > 0):
                    raise ValueError(f"Invalid {name} value: {out[name]} (must be finite and > 0)")
    return out


class _ParamChecks:
    """The checks an optimizer makes on its params (mixed into
    ``mixprec.optim``'s base class)."""

    def _check_group_args(self, group: dict[str, Any]) -> None:
        """A group just added: its own keys converted in place (a group may
        give any of them, see :func:`_own_group_keys`), then its mode."""
        group.update(_own_group_keys(group))
        self._check_group_mode(group)

    def _check_group_mode(self, group: dict[str, Any]) -> None:
        if group.get("master_weights", True):
            return
        for p in group["params"]:
            if p.dtype == torch.float16:
                raise ValueError(
                    f"{type(self).__name__}: master_weights=False is for bfloat16 (and float32) "
                    "parameters; float16 parameters need FP32 master weights"
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
