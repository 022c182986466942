"""mixprec.parity's argument checks: all of them run before any training."""

from __future__ import annotations

import collections.abc
import copy
import dataclasses
import math
import numbers
import os

import torch

from ._args import as_float, as_int

from ._parity_run import _evaluate, _scaled_lr
from ._parity_types import _DIRECTIONS, _RECIPES, _W, Recipe, _checked_fields, _lr_rule, _parse

# ---- arguments ------------------------------------------------------------------------


def _specs(recipe, lr_scale) -> list[Recipe]:
    items = list(recipe) if isinstance(recipe, (list, tuple)) else [recipe]
    if not items:
        raise ValueError(f"{_W}: recipe is an empty list")
    rule = None if lr_scale is None else _lr_rule(_W, "lr_scale", lr_scale)
    specs = []
    for i, r in enumerate(items):
        at = "recipe" if len(items) == 1 and not isinstance(recipe, (list, tuple)) else f"recipe[{i}]"
        if isinstance(r, str):
            r = _parse(r, _W, at)
        elif not isinstance(r, Recipe):
            raise TypeError(
                f"{_W}: {at}: recipe must be a str (one of {sorted(_RECIPES)}...), a mixprec.parity.Recipe or a "
                f"list of them, got {type(r).__name__} {r!r}")
        else:  # checked when built; again for one built past the constructor (a subclass, object.__new__)
            r = dataclasses.replace(r, **_checked_fields(r, _W, f"{at}."))
        if r.lr_scale is None and r.batch_multiplier > 1 and rule is not None:
            r = dataclasses.replace(r, lr_scale=rule)
        specs.append(r)
    names = [s.name for s in specs]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise ValueError(f"{_W}: recipe names must differ, {dup!r} is given twice")
    return specs


_PAIRS = " (batches[i] is an (input, target) pair)"


def _check_leaves(x, at: str) -> None:
    if isinstance(x, torch.Tensor):
        return
    if isinstance(x, (tuple, list)):
        if not x:
            raise TypeError(f"{_W}: {at} must be a tensor or a tuple/list/dict of tensors{_PAIRS}, got an empty "
                            f"{type(x).__name__}")
        for i, v in enumerate(x):
            _check_leaves(v, f"{at}[{i}]")
        return
    if isinstance(x, dict):
        for key, v in x.items():
            _check_leaves(v, f"{at}[{key!r}]")
        return
    raise TypeError(f"{_W}: {at} must be a tensor or a tuple/list/dict of tensors{_PAIRS}, got {type(x).__name__}")


def _shape_sig(x, k: int, at: str):
    """What must agree between batches that ``<k>x`` concatenates."""
    if isinstance(x, torch.Tensor):
        if x.dim() == 0:
            raise ValueError(f"{_W}: a recipe has batch_multiplier {k}, which concatenates batches along dim 0, "
                             f"but {at} is a 0-dim tensor")
        return ("tensor", tuple(x.shape[1:]), x.dtype)
    if isinstance(x, tuple):
        return ("tuple",) + tuple(_shape_sig(v, k, f"{at}[{i}]") for i, v in enumerate(x))
    if isinstance(x, dict):
        return ("dict",) + tuple((key, _shape_sig(v, k, f"{at}[{key!r}]")) for key, v in x.items())
    return ("list",)


def _check_targets(targets) -> dict[str, tuple[float, str]]:
    if not isinstance(targets, collections.abc.Mapping):
        raise TypeError(f"{_W}: targets must be a dict of metric name -> tolerance (e.g. {{'miou': 0.005}}), "
                        f"got {type(targets).__name__}")
    out = {}
    for name, v in targets.items():
        if not isinstance(name, str):
            raise TypeError(f"{_W}: targets' keys must be metric names (str), got {name!r}")
        direction = "both"
        if isinstance(v, (tuple, list)):
            if len(v) != 2 or v[1] not in _DIRECTIONS:
                raise ValueError(f"{_W}: targets[{name!r}] must be a tolerance or (tolerance, direction) with "
                                 f"direction one of {_DIRECTIONS}, got {v!r}")
            v, direction = v
        out[name] = (as_float(_W, f"targets[{name!r}]", v, low=0.0), direction)
    return out


def _check_parity_args(make_model, batches, recipe, loss_fn, optimizer, steps, guard, device, png, evaluate, seeds,
                       targets, lr_scale):
    """Every argument of ``parity`` that can be checked without building the
    model, before anything is built or trained."""
    w = _W
    if not isinstance(recipe, (str, Recipe, list, tuple)):
        raise TypeError(f"{w}: recipe must be a str, one of {sorted(_RECIPES)}, a mixprec.parity.Recipe or a list of "
                        f"them, got {type(recipe).__name__} {recipe!r}")
    specs = _specs(recipe, lr_scale)
    if isinstance(make_model, torch.nn.Module) or not callable(make_model):
        raise TypeError(
            f"{w}: make_model must be a function that returns a new model (e.g. lambda: Net()), got "
            f"{type(make_model).__name__}" + (" (a model: each run needs its own copy)" if isinstance(make_model, torch.nn.Module) else "")
        )
    if not isinstance(batches, collections.abc.Sequence) or isinstance(batches, (str, bytes)):
        raise TypeError(
            f"{w}: batches must be a list or tuple of (input, target) pairs, got {type(batches).__name__}"
            + (" (a generator or iterator: pass list(...) so both runs see the same batches)"
               if isinstance(batches, collections.abc.Iterator) else "")
        )
    if len(batches) == 0:
        raise ValueError(f"{w}: batches is empty")
    for i, b in enumerate(batches):
        if not isinstance(b, (tuple, list)) or len(b) != 2:
            raise TypeError(f"{w}: batches[{i}] must be an (input, target) pair, got {type(b).__name__}")
        _check_leaves(b[0], f"batches[{i}][0]")
        _check_leaves(b[1], f"batches[{i}][1]")
    if not callable(loss_fn):
        raise TypeError(f"{w}: loss_fn must be callable (output, target) -> loss, got {type(loss_fn).__name__}")
    if optimizer is not None and (isinstance(optimizer, torch.optim.Optimizer) or not callable(optimizer)):
        raise TypeError(
            f"{w}: optimizer must be a function params -> optimizer (e.g. lambda ps: torch.optim.AdamW(ps)), got "
            f"{type(optimizer).__name__}" + (" (an optimizer instance: each run needs its own)"
                                            if isinstance(optimizer, torch.optim.Optimizer) else "")
        )
    steps = len(batches) if steps is None else as_int(w, "steps", steps, low=1)
    for s in specs:
        k = s.batch_multiplier
        if steps % k:
            raise ValueError(f"{w}: recipe {s.name!r} has batch_multiplier {k}: steps ({steps}) must be a multiple "
                             f"of it (the same samples in 1/{k} of the steps)")
        if k > 1:
            sig = [_shape_sig(v, k, f"batches[0][{j}]") for j, v in enumerate(batches[0])]
            for i, b in enumerate(batches):
                if [_shape_sig(v, k, f"batches[{i}][{j}]") for j, v in enumerate(b)] != sig:
                    raise ValueError(
                        f"{w}: recipe {s.name!r} has batch_multiplier {k}, which concatenates consecutive batches "
                        f"along dim 0: batches[{i}] differs from batches[0] in structure, dtype or a shape beyond "
                        f"dim 0")
    if not isinstance(guard, bool):
        raise TypeError(f"{w}: guard must be a bool, got {type(guard).__name__} {guard!r}")
    if device is not None:
        if not isinstance(device, (str, torch.device)):
            raise TypeError(f"{w}: device must be a str or torch.device, got {type(device).__name__}")
        try:
            torch.device(device)
        except RuntimeError as e:
            raise ValueError(f"{w}: device {device!r} is not a device: {e}") from None
    if evaluate is not None and (isinstance(evaluate, torch.nn.Module) or not callable(evaluate)):
        raise TypeError(f"{w}: evaluate must be a function model -> dict of metrics (e.g. lambda m: "
                        f"{{'accuracy': acc(m)}}), got {type(evaluate).__name__}")
    if isinstance(seeds, (list, tuple)):
        if not seeds:
            raise ValueError(f"{w}: seeds is an empty list")
        seed_list = [as_int(w, f"seeds[{i}]", s, low=0, high=2**63 - 1) for i, s in enumerate(seeds)]
        if len(set(seed_list)) != len(seed_list):
            raise ValueError(f"{w}: seeds must differ, got {seed_list}")
    else:
        n = as_int(w, "seeds", seeds, low=1)
        seed_list = [None] if n == 1 else list(range(n))
    tg = {}
    if targets is not None:
        tg = _check_targets(targets)
        if tg and evaluate is None:
            raise ValueError(f"{w}: targets {sorted(tg)} need evaluate= (the function that measures them)")
    if png is not None:
        if not isinstance(png, (str, os.PathLike)):
            raise TypeError(f"{w}: png must be a path (str or os.PathLike), got {type(png).__name__}")
        parent = os.path.dirname(os.path.abspath(os.fspath(png)))
        if not os.path.isdir(parent):
            raise ValueError(f"{w}: png's directory {parent!r} does not exist")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise RuntimeError(f"{w}: png needs matplotlib (pip install matplotlib)") from None
    return specs, steps, seed_list, tg


def _check_built(model, make_opt, specs, evaluate, targets, dev) -> dict[str, float]:
    """The checks that need the first model (before it trains): what
    ``evaluate`` returns, the targets' names, the lr rules."""
    untrained = {}
    if evaluate is not None:
        untrained = _evaluate(evaluate, model, None, dev)
        missing = sorted(set(targets) - set(untrained))
        if missing:
            raise ValueError(f"{_W}: targets {missing} are not among evaluate's metrics {sorted(untrained)}")
    ruled = [s for s in specs if s.lr_scale is not None]
    if ruled:
        probe = make_opt(copy.deepcopy(model).parameters())
        if not isinstance(probe, torch.optim.Optimizer):
            raise TypeError(f"{_W}: optimizer must return a torch.optim.Optimizer, got {type(probe).__name__}")
        for s in ruled:
            for g in probe.param_groups:
                lr = float(g["lr"])
                new = _scaled_lr(s.lr_scale, lr, s.batch_multiplier)
                if isinstance(new, bool) or not isinstance(new, numbers.Real) or not (math.isfinite(new) and new > 0):
                    raise ValueError(f"{_W}: recipe {s.name!r}: lr_scale gives the lr {new!r} for lr {lr!r} "
                                     f"(batch_multiplier {s.batch_multiplier}); it must be a finite number > 0")
        del probe
    return untrained
