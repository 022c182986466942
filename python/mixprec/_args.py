"""Conversion of the public Python API's number arguments, written once.

[note: argument conversion] ``int(x)`` and ``float(x)`` accept what a
training loop should never pass on: ``int(2.7)`` silently truncates,
``int(nan)`` fails with "cannot convert float NaN to integer" (naming
nothing), ``True`` is an int and ``"1e-3"`` a float to ``float()``, and a NaN
scale or max_norm turns every gradient into NaN without an error. These
helpers take what is unambiguous (Python and NumPy numbers, one-element
tensors, integral floats for integers) and raise otherwise, before anything
is written, with the function and the argument named: ``TypeError`` for a
value of the wrong kind (bool, str, None, a list; a non-integral float such as
2.5 for an integer, as torch's argument parser and ``operator.index`` say),
``ValueError`` for a number out of range (NaN, inf, below a bound; as
``int(nan)`` says).
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Any

import torch

__all__ = ["as_int", "as_float", "as_real", "as_bool", "as_name", "as_choice", "as_low_dtype", "as_list_of",
           "check_tensor", "check_module", "_takes"]


def _number(where: str, name: str, v, kind: str) -> float | int:
    if isinstance(v, bool) or (isinstance(v, torch.Tensor) and v.dtype is torch.bool):
        raise TypeError(f"{where}: {name} must be {kind}, got the bool {v!r}")
    if isinstance(v, (torch.SymInt, torch.SymFloat)):
        return v  # traced (torch.export with dynamic shapes): checked by the op's fake kernel
    if isinstance(v, torch.Tensor):
        if v.numel() != 1 or v.is_complex():
            raise TypeError(f"{where}: {name} must be {kind}, got a tensor of shape {tuple(v.shape)} ({v.dtype})")
        return v.item()
    if isinstance(v, numbers.Real):
        return v
    raise TypeError(f"{where}: {name} must be {kind}, got {type(v).__name__} {v!r}")


def as_int(where: str, name: str, v, *, low: int | None = None, high: int | None = None) -> int:
    """``v`` as an int: an integer, or a float with an integral value
    (2000.0). TypeError: bools, non-numbers, non-integral floats (2.5);
    ValueError: NaN, inf, outside the inclusive bounds ``low`` / ``high``."""
    x = _number(where, name, v, "an integer")
    if not isinstance(x, numbers.Integral):
        x = float(x)
        if not math.isfinite(x):
            raise ValueError(f"{where}: {name} must be an integer, got {v!r}")
        if not x.is_integer():
            raise TypeError(f"{where}: {name} must be an integer, got the non-integral {v!r}")
    x = int(x)
    if low is not None and x < low:
        raise ValueError(f"{where}: {name} must be >= {low}, got {x}")
    if high is not None and x > high:
        raise ValueError(f"{where}: {name} must be <= {high}, got {x}")
    return x


def as_float(
    where: str,
    name: str,
    v,
    *,
    finite: bool = True,
    low: float | None = None,
    above: float | None = None,
) -> float:
    """``v`` as a float; NaN always raises, inf unless ``finite=False``.
    ``low``: inclusive bound; ``above``: exclusive bound."""
    x = float(_number(where, name, v, "a real number"))
    if math.isnan(x) or (finite and math.isinf(x)):
        raise ValueError(f"{where}: {name} must be {'finite' if finite else 'a number, not NaN'}, got {v!r}")
    if low is not None and x < low:
        raise ValueError(f"{where}: {name} must be >= {low}, got {x!r}")
    if above is not None and not x > above:
        raise ValueError(f"{where}: {name} must be > {above}, got {x!r}")
    return x


def as_real(where: str, name: str, v) -> float:
    """``v`` as a float, checking only its kind (bools, strings, lists and
    tensors of several elements raise TypeError): NaN and inf pass, for the
    ops whose own checks give them their documented meaning (an NMS
    ``iou_threshold`` of inf suppresses nothing, as torchvision's; NaN is
    refused there with the op's message)."""
    x = _number(where, name, v, "a real number")
    return x if isinstance(x, torch.SymFloat) else float(x)


def as_bool(where: str, name: str, v) -> bool:
    """``v`` if it is a bool: a flag given as a string ("no") or a number
    was read as its truthiness; TypeError."""
    if isinstance(v, bool):
        return v
    raise TypeError(f"{where}: {name} must be a bool, got {type(v).__name__} {v!r}")


def as_name(where: str, name: str, v) -> str:
    """``v`` if it is a non-empty str (a recipe's name): TypeError for
    another kind, ValueError for ''."""
    if not isinstance(v, str):
        raise TypeError(f"{where}: {name} must be a non-empty str, got {type(v).__name__} {v!r}")
    if not v:
        raise ValueError(f"{where}: {name} must be a non-empty str, got ''")
    return v


def as_choice(where: str, name: str, v, choices: tuple[int, ...]) -> int | None:
    """None, or ``v`` as an int (``as_int``) that is one of ``choices``
    (code widths: "bits must be None, 8 or 4")."""
    if v is None:
        return None
    n = as_int(where, name, v)
    if n not in choices:
        allowed = ", ".join(map(str, (None,) + choices[:-1])) + f" or {choices[-1]}"
        raise ValueError(f"{where}: {name} must be {allowed}, got {v!r}")
    return n


def as_low_dtype(where: str, name: str, v) -> torch.dtype | None:
    """None (FP32), torch.bfloat16 or torch.float16: a recipe's autocast /
    low dtype. TypeError for a non-dtype (a str such as 'bf16'),
    ValueError for another dtype."""
    if v is not None and not isinstance(v, torch.dtype):
        raise TypeError(f"{where}: {name} must be None (FP32) or a torch.dtype, got {type(v).__name__} {v!r}")
    if v not in (None, torch.bfloat16, torch.float16):
        raise ValueError(f"{where}: {name} must be None (FP32), torch.bfloat16 or torch.float16, got {v!r}")
    return v


def as_list_of(where: str, name: str, v, cls, what: str, *, empty: bool = False) -> list:
    """``v`` (an iterable of ``cls``: not a str, not one ``cls``) as a list,
    each entry checked (``name[i]`` named); with ``empty=False`` at least one."""
    from collections.abc import Iterable

    def shown(x) -> str:  # (no tensor's repr in a message: it can be huge)
        return type(x).__name__ + ("" if isinstance(x, torch.Tensor) else f" {x!r}")

    if isinstance(v, (str, bytes, cls)) or not isinstance(v, Iterable):
        raise TypeError(f"{where}: {name} must be a sequence of {what}, got {shown(v)}")
    items = list(v)
    for i, x in enumerate(items):
        if not isinstance(x, cls):
            raise TypeError(f"{where}: {name}[{i}] must be a {what}, got {shown(x)}")
    if not items and not empty:
        raise ValueError(f"{where}: {name} must hold at least one {what}, got none")
    return items


def check_module(where: str, name: str, v) -> None:
    """TypeError unless ``v`` is an ``nn.Module`` (a model argument)."""
    if not isinstance(v, torch.nn.Module):
        raise TypeError(f"{where}: {name} must be a torch.nn.Module, got {type(v).__name__}")


def check_tensor(where: str, name: str, v, *, none: bool = False) -> None:
    """TypeError unless ``v`` is a tensor (or None with ``none``): a number
    or a string there failed on its first attribute (``'int' object has no
    attribute 'shape'``), naming nothing."""
    if not (isinstance(v, torch.Tensor) or (none and v is None)):
        raise TypeError(f"{where}: {name} must be a tensor{' or None' if none else ''}, got {type(v).__name__}")


def _takes(*names: str, module: str = "mixprec.optim", where: str | None = None):
    """``method(self, *names)`` with each of ``names`` required (given by
    position or by keyword): an extra positional argument, an unknown or
    repeated keyword or a missing argument is refused with a TypeError naming
    the method (Python's own, "takes 2 positional arguments but 3 were
    given", names neither the class nor mixprec), as
    ``{module}.{type(self).__name__}.{method}``. With ``where`` (the
    callable's full name) it wraps a plain function instead (no ``self``)."""

    def check(name: str, args: tuple, kwargs: dict) -> None:
        extra = [type(a).__name__ for a in args[len(names):]]
        extra += [f"{k}=" for k in kwargs if k not in names[len(args):]]
        if extra:
            takes = f"takes only {', '.join(names)}, got {len(extra)} more" if names else \
                f"takes no arguments, got {len(extra)}"
            raise TypeError(f"{name}: {takes} ({', '.join(extra)})")
        missing = [n for i, n in enumerate(names) if i >= len(args) and n not in kwargs]
        if missing:
            raise TypeError(f"{name}: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} required")

    def wrap(fn):
        if where is not None:
            @functools.wraps(fn)
            def checked_function(*args: Any, **kwargs: Any):
                check(where, args, kwargs)
                return fn(*args, **kwargs)

            return checked_function

        @functools.wraps(fn)
        def checked(self, *args: Any, **kwargs: Any):
            check(f"{module}.{type(self).__name__}.{fn.__name__}", args, kwargs)
            return fn(self, *args, **kwargs)

        return checked

    return wrap
