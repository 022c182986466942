"""Optimizer state and checkpoints: where ``mixprec.optim``'s optimizers
create their per-param state (step count, FP32 master, FP32 state laid out
like the param) and how a state dict loads (FP32 state stays FP32).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ._distributed import is_dtensor, local

_FP32_STATE_KEYS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "master", "ema")


class _StateAndCheckpoints:
    """Mixed into ``mixprec.optim``'s base class (before
    ``torch.optim.Optimizer``, whose ``__setstate__`` and
    ``load_state_dict`` these extend)."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        """As torch's optimizers do in theirs: a loaded (or unpickled) group
        that lacks a newer key gets its default, so a state dict from an
        older torch or mixprec steps. Inside :meth:`load_state_dict` (torch's
        loader calls this with the state it built) the FP32 state is put
        back: see [note: load hooks]."""
        loading = self.__dict__.get("_mixprec_loading")
        snap = self.__dict__.get("_mixprec_installing") if loading else None
        if snap is not None:
            snap["installing"] = True
        super().__setstate__(state)
        for group in self.param_groups:
            for k, v in getattr(self, "defaults", {}).items():
                group.setdefault(k, v)
        if loading:
            self._restore_fp32_state(loading.pop())
        if snap is not None:
            snap["installing"] = False

    def _base_state(self, p: torch.Tensor, master_weights: bool = True) -> dict[str, torch.Tensor]:
        state = self.state[p]
        if "step" not in state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
        if p.dtype != torch.float32 and master_weights and "master" not in state:
            state["master"] = p.detach().float()
        if p.dtype == torch.bfloat16 and not master_weights:
            # A master loaded from a checkpoint: its value lives on in the
            # parameter (rounded); this mode keeps none.
            state.pop("master", None)
        return state

    @staticmethod
    def _fitted(st: dict[str, Any], key: str, op_p: torch.Tensor) -> torch.Tensor:
        """``st[key]`` (local) laid out like ``op_p``. State created before
        the param changed layout (``model.to(memory_format=channels_last)``
        after some steps) is re-laid out once, values unchanged."""
        t = st[key]
        lt = local(t)
        if lt.stride() != op_p.stride() and not is_dtensor(t) and lt.shape == op_p.shape:
            lt = st[key] = torch.empty_like(op_p, dtype=lt.dtype).copy_(lt)
        return lt

    def _master_of(self, p: torch.Tensor, st: dict[str, torch.Tensor], op_p: torch.Tensor) -> torch.Tensor:
        """The local FP32 master handed to the op (an empty tensor: none)."""
        return self._fitted(st, "master", op_p) if "master" in st else op_p.new_empty(0, dtype=torch.float32)

    @staticmethod
    def _fp32_zeros(p: torch.Tensor) -> torch.Tensor:
        """New FP32 state laid out like ``p``: a DTensor with the param's
        mesh and placements when the param is one (so
        torch.distributed.checkpoint saves and reshards it)."""
        return torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format)

    def _op_state(self, states, key: str, op_params) -> list[torch.Tensor]:
        return [self._fitted(st, key, w) for st, w in zip(states, op_params)]

    # [note: load hooks] torch's load_state_dict runs the pre-hooks (which
    # may edit or replace the incoming state dict), casts every floating
    # tensor of the state to its param's dtype, installs the state through
    # __setstate__, then runs the post-hooks (which may edit the state in
    # place, or add entries that are not a param's dict). The FP32 state of
    # a BF16/FP16 param must not go through that cast, so: a pre-hook added
    # last, for this call only, keeps the state dict the user's pre-hooks
    # made; __setstate__ (called by torch's loader before any post-hook)
    # puts that dict's FP32 state back uncast. The hooks run exactly as
    # with torch's optimizers, and nothing done after them undoes a post-
    # hook's edit.

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads a state dict of this class or of torch's optimizer of the
        same kind, through torch's loader and its hooks. torch casts
        floating state to each parameter's dtype; this keeps FP32 state (and
        master weights) in FP32, exactly ([note: load hooks])."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(
                f"mixprec.optim.{type(self).__name__}.load_state_dict: state_dict must be a dict (as state_dict() "
                f"returns), got {type(state_dict).__name__}"
            )
        if not isinstance(state_dict, dict):
            state_dict = dict(state_dict)
        loading: list[dict[str, Any]] = []

        def keep(optimizer, sd):
            self._check_loading(sd)  # everything checked before torch's loader installs anything
            loading.append(sd)

        hooks = self._optimizer_load_state_dict_pre_hooks
        handle = torch.utils.hooks.RemovableHandle(hooks)
        hooks[handle.id] = keep
        self.__dict__["_mixprec_loading"] = loading
        before = self._load_snapshot()
        try:
            super().load_state_dict(state_dict)
        except BaseException:
            # Not expected after the checks; should the install itself fail,
            # the optimizer goes back to what it held (the installed state
            # is new dicts and tensors: the old ones are untouched). A
            # post-hook's failure (after the install) is left as torch
            # leaves it.
            if before["installing"]:
                self._load_rollback(before)
            raise
        finally:
            handle.remove()
            self.__dict__.pop("_mixprec_loading", None)
            self.__dict__.pop("_mixprec_installing", None)

    def _load_snapshot(self) -> dict[str, Any]:
        versions = self.__dict__.get("_mixprec_versions")
        seeds = self.__dict__.get("_mixprec_drawn_seeds")
        snap = dict(
            state=self.state, param_groups=self.param_groups, installing=False,
            versions=None if versions is None else {**versions, "by_id": dict(versions.get("by_id", {}))},
            seeds=None if seeds is None else list(seeds),
        )
        self.__dict__["_mixprec_installing"] = snap
        return snap

    def _load_rollback(self, snap: dict[str, Any]) -> None:
        self.__dict__["state"] = snap["state"]
        self.__dict__["param_groups"] = snap["param_groups"]
        for key, name in (("versions", "_mixprec_versions"), ("seeds", "_mixprec_drawn_seeds")):
            if snap[key] is None:
                self.__dict__.pop(name, None)
            else:
                self.__dict__[name] = snap[key]

    def _restore_fp32_state(self, state_dict: dict[str, Any]) -> None:
        """The FP32 state and the step counts of the state dict torch's
        loader just installed (after the pre-hooks), as FP32 tensors on
        each param's device."""
        # Saved state keys map to params by position in the groups' "params"
        # lists, as torch's loader maps them: integers from state_dict(),
        # parameter names (FQNs) from torch.distributed.checkpoint's
        # set_optimizer_state_dict.
        id_map = dict(
            zip(
                (k for g in state_dict.get("param_groups", []) for k in g["params"]),
                (p for g in self.param_groups for p in g["params"]),
            )
        )
        for key, saved in state_dict.get("state", {}).items():
            p = id_map.get(key)
            if p is None or not isinstance(saved, dict):
                continue
            st = self.state[p]
            for k, v in saved.items():
                if k in _FP32_STATE_KEYS and isinstance(v, torch.Tensor):
                    st[k] = v.to(device=p.device, dtype=torch.float32, copy=True)
            if "step" in st:
                step = st["step"]
                st["step"] = (
                    step.detach().to(device=local(p).device, dtype=torch.float32).reshape(()).clone()
                    if isinstance(step, torch.Tensor)
                    else torch.tensor(float(step), dtype=torch.float32, device=local(p).device)
                )
        # A loaded master is the truth about its param from here on (and the
        # seeds are the checkpoint's, shared by every rank that loads it).
        self._record_param_versions(list(id_map.values()))
        self._drawn_seed_groups().clear()
        self._after_load()

    def _check_loading(self, state_dict: dict[str, Any]) -> None:
        """Checks of the incoming state dict before anything is installed."""

    @staticmethod
    def _check_loaded_hyper(group: dict[str, Any]) -> None:
        """A loaded group's own hyper-parameters (the subclass's)."""

    def _after_load(self) -> None:
        pass
