"""The checks ``mixprec.optim``'s ``load_state_dict`` makes on the whole
incoming state dict before anything is installed (issue 39: a refused
state dict changes nothing).

torch's loader installs the state and the groups first and the problems
show later (a wrong shape at the next step, in the op's words), or half
way: mixprec's own conversions of the installed state (a remainder group
over float16 params, a moment format it cannot make) used to raise after
the groups' options and the state were replaced. Everything here runs in
the last load pre-hook (after the user's hooks, on the dict torch then
installs), so a refusal leaves the optimizer exactly as it was.

The errors name ``mixprec.optim.<Class>.load_state_dict`` and the key:
``TypeError`` for a container of the wrong kind, ``ValueError`` for the
groups (their number, their sizes, their options) and ``RuntimeError``
for a param's saved state that does not fit it (as before, and as torch's
``Module.load_state_dict`` says size mismatches).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ._distributed import local
from ._optim_lean import (
    REMAINDER_BITS, check_saved_moment, dtype_of, num_blocks, q8_key, q8_scale_key,
    remainder_of_bits, scale_key,
)

#: State keys installed as FP32 tensors of the param's shape.
_TENSOR_KEYS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "master", "ema")


def _kind(v) -> str:
    if isinstance(v, torch.Tensor):
        return f"a {v.dtype} tensor of shape {tuple(v.shape)}"
    return f"{type(v).__name__} {v!r}"[:120]


def check_state_dict(opt, sd) -> None:
    """Raises (naming ``load_state_dict`` and the key) unless every part of
    ``sd`` can be installed into ``opt``: the groups (number, sizes, ids,
    options as the constructor checks them, the lean modes against the
    params' dtypes) and each param's saved state (tensors of its shape, of a
    format the group can take)."""
    cls = type(opt).__name__
    w = f"mixprec.optim.{cls}.load_state_dict"
    if not isinstance(sd, Mapping):
        raise TypeError(f"{w}: state_dict must be a dict (as state_dict() returns), got {_kind(sd)}")
    for key, kind in (("state", Mapping), ("param_groups", Sequence)):
        if key not in sd:
            raise ValueError(f"{w}: state_dict has no {key!r} entry (keys: {sorted(map(str, sd))})")
        if not isinstance(sd[key], kind) or isinstance(sd[key], (str, bytes)):
            want = "a dict" if kind is Mapping else "a list of dicts"
            raise TypeError(f"{w}: state_dict[{key!r}] must be {want}, got {_kind(sd[key])}")
    saved_groups, groups = sd["param_groups"], opt.param_groups
    if len(saved_groups) != len(groups):
        raise ValueError(f"{w}: state_dict['param_groups'] has {len(saved_groups)} groups, the optimizer "
                         f"{len(groups)}")
    id_map: dict[Any, tuple[torch.Tensor, dict[str, Any], int]] = {}
    for gi, (sg, g) in enumerate(zip(saved_groups, groups)):
        where = f"{w}: state_dict['param_groups'][{gi}]"
        if not isinstance(sg, Mapping):
            raise TypeError(f"{where} must be a dict, got {_kind(sg)}")
        ids = sg.get("params")
        if not isinstance(ids, Sequence) or isinstance(ids, (str, bytes)):
            raise TypeError(f"{where}['params'] must be a list of parameter ids, got {_kind(ids)}")
        if len(ids) != len(g["params"]):
            raise ValueError(f"{where}['params'] has {len(ids)} ids, the optimizer's group {gi} has "
                             f"{len(g['params'])} parameters")
        new_group = _check_group(opt, where, sg, g)
        for j, (k, p) in enumerate(zip(ids, g["params"])):
            try:
                hash(k)
            except TypeError:
                raise TypeError(f"{where}['params'][{j}] must be a parameter id (an int or a name), got "
                                f"{_kind(k)}") from None
            if k in id_map:
                raise ValueError(f"{where}['params'][{j}]: the id {k!r} appears twice in the state dict's groups")
            id_map[k] = (p, new_group, gi)
    for key, st in sd["state"].items():
        if key not in id_map:
            continue  # torch's loader keeps it as it is (an entry a hook added)
        p, group, gi = id_map[key]
        where = f"{w}: state_dict['state'][{key!r}]"
        if not isinstance(st, Mapping):
            raise RuntimeError(f"{where} must be a dict (a parameter's state), got {_kind(st)}")
        _check_param_state(opt, where, key, st, p, group)


def _check_group(opt, where: str, sg: Mapping, g: dict[str, Any]) -> dict[str, Any]:
    """The group torch's loader would install (the saved options over the
    optimizer's params), checked as ``__init__`` / ``add_param_group``
    check theirs (``_check_group_options``, the errors after ``where``);
    returns it (options converted) for the state checks."""
    group = {**getattr(opt, "defaults", {}), **sg, "params": g["params"]}
    for k in opt._MOMENTS.values():
        if isinstance(group.get(k), str):
            group[k] = dtype_of(group[k])
            if isinstance(group[k], str):  # a name, but of no format ([note: formats saved by name])
                raise ValueError(f"{where}: {k} must be 'float32', 'bfloat16' or 'uint8', got {group[k]!r}")
    opt._check_group_options(where, group)
    return group


def _check_param_state(opt, where: str, key, st: Mapping, p: torch.Tensor, group: dict[str, Any]) -> None:
    shape = tuple(p.shape)
    what = f"its parameter is {p.dtype} of shape {shape}"
    if "step" in st:
        s = st["step"]
        ok = False
        if isinstance(s, torch.Tensor):
            ok = s.numel() == 1 and not s.is_complex() and s.dtype is not torch.bool
            s = s.detach().reshape(-1)[0].item() if ok else s
        if not isinstance(s, bool) and isinstance(s, numbers.Real):
            ok = math.isfinite(s) and s >= 0
        if not ok:
            raise RuntimeError(f"{where}['step'] must be a step count (a number >= 0 or a one-element tensor), "
                               f"got {_kind(st['step'])}")
    for k in _TENSOR_KEYS:
        if k not in st:
            continue
        v = st[k]
        if not isinstance(v, torch.Tensor):
            raise RuntimeError(f"{where}[{k!r}] must be a tensor, got {_kind(v)}")
        if tuple(v.shape) != shape:
            raise RuntimeError(f"{where}[{k!r}] has shape {tuple(v.shape)}; {what}")
        eight_bit = k in opt._MOMENTS and v.dtype == torch.uint8
        if not (v.is_floating_point() or eight_bit):
            raise RuntimeError(f"{where}[{k!r}] is {v.dtype}: a state tensor must be floating point"
                               + (" (or uint8 with its scales, 8-bit blockwise)" if k in opt._MOMENTS else ""))
        sk = scale_key(k)
        if eight_bit:
            sc = st.get(sk)
            blocks = num_blocks(local(v).numel())
            if not isinstance(sc, torch.Tensor) or sc.dtype != torch.float32 or sc.numel() != blocks:
                raise RuntimeError(f"{where}[{k!r}] is uint8 (8-bit blockwise): {where}[{sk!r}] must be a "
                                   f"float32 tensor of ceil(numel / 256) = {blocks} scales, got "
                                   f"{_kind(sc) if sk in st else 'none'}")
    for k in opt._MOMENTS:
        sk = scale_key(k)
        if sk in st and not (isinstance(st.get(k), torch.Tensor) and st[k].dtype == torch.uint8):
            raise RuntimeError(f"{where}[{sk!r}] is given but {where}[{k!r}] is not a uint8 (8-bit) moment")
        if q8_key(k) in st or q8_scale_key(k) in st:
            check_saved_moment(type(opt).__name__, k, p, st.get(q8_key(k)), st.get(q8_scale_key(k)))
    for k, rem in (("remainder", st.get("remainder")), (REMAINDER_BITS, st.get(REMAINDER_BITS))):
        if k not in st:
            continue
        if k == REMAINDER_BITS:
            rem = remainder_of_bits(rem, type(opt).__name__, key)
        elif not isinstance(rem, torch.Tensor) or rem.dtype != torch.int16:
            raise RuntimeError(f"{where}['remainder'] must be an int16 tensor, got {_kind(rem)}")
        if tuple(rem.shape) != shape:
            raise RuntimeError(f"{where}[{k!r}] has shape {tuple(rem.shape)}; {what}")
        if p.dtype != torch.bfloat16:
            raise RuntimeError(f"{where}[{k!r}]: remainders (the low half of an FP32 master) are for bfloat16 "
                               f"parameters only; {what}")
