"""Overflow diagnostics and a training-health record for ``GradScaler``
(``GradScaler(..., diagnostics=True)`` or ``named_parameters=...``).

The unscale pass already computes every gradient's L2 norm (the fused
kernel's per-tensor norms, ``torch.ops.mixprec.unscale_norm_`` /
``grad_norm``): a gradient with an inf or NaN element has a non-finite norm,
and a finite gradient a finite one (the kernel sums the squares in double
where float would overflow). So which parameters overflowed, and each one's
norm, come out of that pass with no second read of the gradients. Each
step's record (the scale it ran with, whether it was skipped, the global
gradient norm, the per-parameter overflow counts) is kept in small tensors
on the scale's device: nothing synchronises with the host until you read
it (``last_overflow()``, ``last_grad_norms()``, ``health()``).

Sharded gradients (FSDP2 / DTensor, FSDP1 flat parameters): the per-tensor
norms are those of the whole gradients (squares summed over the shard
groups, one all-reduce per group), so every rank reports the same
parameters.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from . import _distributed
from ._args import as_int

__all__ = ["Overflow", "TrainingHealth"]

_COMPACT_EVERY = 512  # steps: history rows are stacked into one tensor this often
_SLOT_CACHE = 16  # parameter lists whose slots are remembered (the same lists come back every step)


class Overflow(NamedTuple):
    """One parameter whose gradient was not finite in the last unscale pass."""

    index: int  # position in its optimizer's parameters (flattened param_groups, as in state_dict)
    name: str  # from ``named_parameters``, else ``str(index)``
    grad_norm: float  # L2 norm of the unscaled gradient: inf or nan


@dataclass
class TrainingHealth:
    """What ``GradScaler.health()`` returns: one entry per ``update()`` (those
    without ``new_scale``)."""

    scale: list[float]  # the loss scale each step ran with
    skipped: list[bool]  # the step overflowed (optimizer step skipped)
    grad_norm: list[float]  # global L2 norm of the unscaled gradients (before clipping)
    overflow_counts: dict[str, int] = field(default_factory=dict)  # name -> overflowing steps, most first
    forward: str | None = None  # the summary of listeners such as mixprec.guard.ForwardGuard

    @property
    def steps(self) -> int:
        return len(self.scale)

    @property
    def skipped_steps(self) -> int:
        return sum(self.skipped)

    def most_overflowed(self, k: int = 5) -> list[tuple[str, int]]:
        k = as_int("mixprec.amp.TrainingHealth.most_overflowed", "k", k, low=0)
        return [(n, c) for n, c in self.overflow_counts.items() if c > 0][:k]

    def __str__(self) -> str:
        if not self.steps:
            return "training health: no steps recorded"
        finite = [n for n in self.grad_norm if math.isfinite(n)]
        lines = [
            f"training health over {self.steps} steps: {self.skipped_steps} skipped "
            f"({100.0 * self.skipped_steps / self.steps:.1f}%)",
            f"  loss scale: first {self.scale[0]:g}, last {self.scale[-1]:g}, "
            f"min {min(self.scale):g}, max {max(self.scale):g}",
        ]
        if finite:
            s = sorted(finite)
            lines.append(
                f"  grad norm (finite steps): median {s[len(s) // 2]:.4g}, max {s[-1]:.4g}, last {finite[-1]:.4g}"
            )
        worst = self.most_overflowed()
        if worst:
            lines.append("  overflowed most often: " + ", ".join(f"{n} ({c}x)" for n, c in worst))
        if self.forward:
            lines.append(self.forward)
        return "\n".join(lines)


_NAMED_PARAMETERS_TAKES = (
    "mixprec.amp.GradScaler: named_parameters takes (name, parameter) pairs, e.g. model.named_parameters(), "
    "or a dict of name -> parameter"
)


def named_pairs(named_parameters) -> list[tuple[str, torch.Tensor]]:
    """``named_parameters`` as a list of (name, tensor), refusing what would
    otherwise fail as "too many values to unpack" (``model.parameters()``, a
    list of tensors) or silently pair a 2-row tensor's rows as (name, param)."""
    if isinstance(named_parameters, torch.Tensor):
        raise TypeError(f"{_NAMED_PARAMETERS_TAKES}; got a tensor")
    if isinstance(named_parameters, Mapping):
        items = list(named_parameters.items())
    elif isinstance(named_parameters, Iterable) and not isinstance(named_parameters, (str, bytes)):
        items = list(named_parameters)
    else:
        raise TypeError(f"{_NAMED_PARAMETERS_TAKES}; got {type(named_parameters).__name__}")
    for i, item in enumerate(items):
        if isinstance(item, torch.Tensor):
            raise TypeError(
                f"{_NAMED_PARAMETERS_TAKES}; item {i} is a tensor, not a (name, parameter) pair "
                "(model.parameters() has no names: pass model.named_parameters())"
            )
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise TypeError(f"{_NAMED_PARAMETERS_TAKES}; item {i} is {type(item).__name__}, not a (name, parameter) pair")
        name, p = item
        if not isinstance(name, str) or not isinstance(p, torch.Tensor):
            raise TypeError(
                f"{_NAMED_PARAMETERS_TAKES}; item {i} is ({type(name).__name__}, {type(p).__name__}), "
                "not (str, Tensor)"
            )
    return [(name, p) for name, p in items]


class Recorder:
    """The scaler's record of its unscale passes and steps."""

    def __init__(self, named_parameters=None) -> None:
        # id(param) -> (weakref to it, its name); the weakref tells a reused id apart.
        self._names: dict[int, tuple[weakref.ref, str]] = {}
        if named_parameters is not None:
            for name, p in named_pairs(named_parameters):
                self._names[id(p)] = (weakref.ref(p), name)
        self._slots: dict[int, tuple[weakref.ref, int]] = {}  # id(param) -> its row in the counts
        self._slot_names: list[str] = []
        self._slot_index: list[int] = []
        # (optimizer id, param ids) -> (the optimizer (weak), the params (held, so their ids stay
        # theirs), their slots on the device)
        self._slot_cache: dict[tuple, tuple[weakref.ref, list, torch.Tensor]] = {}
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []  # (slots, float64 norms) this iteration
        self._last: tuple[torch.Tensor, torch.Tensor] | None = None
        self._counts: torch.Tensor | None = None
        self._rows: list[torch.Tensor] = []  # per step: [scale, skipped, grad_norm] (float64)
        self._history: torch.Tensor | None = None
        self._listeners: list[weakref.ref] = []

    # ---- step listeners (mixprec.guard) ------------------------------------------
    # An object with on_scaler_step(found_inf) (called at every update(), with
    # the step's combined found_inf on the scale's device) and
    # health_summary() -> str | None (appended to health()). Held weakly.
    def add_listener(self, listener) -> None:
        if not any(r() is listener for r in self._listeners):
            self._listeners.append(weakref.ref(listener))

    def _notify(self, found_inf: torch.Tensor) -> None:
        self._listeners = [r for r in self._listeners if r() is not None]
        for r in self._listeners:
            r().on_scaler_step(found_inf)

    def _listener_summary(self) -> str | None:
        parts = [s for s in (r().health_summary() for r in self._listeners if r() is not None) if s]
        return "\n".join(parts) or None

    # ---- registration ----------------------------------------------------------
    def _name(self, p: torch.Tensor, index: int) -> str:
        entry = self._names.get(id(p))
        if entry is not None and entry[0]() is p:
            return entry[1]
        return str(index)

    def _slot(self, p: torch.Tensor, index: int) -> int:
        entry = self._slots.get(id(p))
        if entry is not None and entry[0]() is p:
            return entry[1]
        slot = len(self._slot_names)
        self._slots[id(p)] = (weakref.ref(p), slot)
        self._slot_names.append(self._name(p, index))
        self._slot_index.append(index)
        return slot

    # ---- one unscale pass --------------------------------------------------------
    def record(self, optimizer, entries, dev: torch.device, factor: torch.Tensor | None = None) -> None:
        """``entries``: (params, their per-tensor norms, their reduction
        groups) of one pass, as ``_amp_grads.unscale_grads(per_tensor=...)``
        collects them; ``factor`` multiplies the norms (the read-only inf
        check runs with inv_scale 1: its norms are of the scaled grads)."""
        if not entries:
            return
        params = [p for ps, _, _ in entries for p in ps]
        groups = [g for _, _, gs in entries for g in gs]
        n = torch.cat([per.to(dev, non_blocking=True).double() for _, per, _ in entries])
        if factor is not None:
            n = n * factor.to(dev).double()
        if any(groups):  # norms of the whole tensors, not of this rank's shards
            n = _distributed.whole_tensor_squares(n * n, groups).sqrt()
        self._pending.append((self._slots_of(optimizer, params, dev), n))

    def _slots_of(self, optimizer, params: list, dev: torch.device) -> torch.Tensor:
        key = (id(optimizer), *map(id, params))
        hit = self._slot_cache.get(key)
        if hit is not None and hit[0]() is optimizer and hit[2].device == dev:
            return hit[2]
        position = {id(p): i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}
        slots = torch.tensor([self._slot(p, position.get(id(p), -1)) for p in params], dtype=torch.int64, device=dev)
        if len(self._slot_cache) >= _SLOT_CACHE:
            self._slot_cache.pop(next(iter(self._slot_cache)))
        self._slot_cache[key] = (weakref.ref(optimizer), list(params), slots)
        return slots

    # ---- one step ------------------------------------------------------------------
    def end_step(self, scale: torch.Tensor, found_inf: torch.Tensor) -> None:
        """At ``update()``, before the scale changes: ``scale`` is the scale
        this step ran with, ``found_inf`` the combined flag."""
        dev = scale.device
        if self._pending:
            slots = torch.cat([s for s, _ in self._pending])
            norms = torch.cat([n for _, n in self._pending])
            self._last = (slots, norms)
            total = norms.square().sum().sqrt()
            counts = self._counts
            if counts is None or counts.numel() != len(self._slot_names) or counts.device != dev:
                counts = torch.zeros(len(self._slot_names), dtype=torch.int64, device=dev)
                if self._counts is not None:  # new parameters appeared: grow
                    counts[: self._counts.numel()] = self._counts.to(dev)
                self._counts = counts
            counts.index_add_(0, slots, (~torch.isfinite(norms)).to(torch.int64))
        else:
            self._last = None
            total = torch.full((), math.nan, dtype=torch.float64, device=dev)
        self._pending = []
        if self._listeners:
            self._notify(found_inf)
        row = torch.stack([scale.detach().double().reshape(()), (found_inf.to(dev) != 0).double().reshape(()), total])
        self._rows.append(row)
        if len(self._rows) >= _COMPACT_EVERY:
            self._compact()

    def _compact(self) -> None:
        if self._rows:
            new = torch.stack(self._rows)
            self._history = new if self._history is None else torch.cat([self._history.to(new.device), new])
            self._rows = []

    # ---- reading (these synchronise) ------------------------------------------------
    def _latest(self):
        if self._pending:
            return torch.cat([s for s, _ in self._pending]), torch.cat([n for _, n in self._pending])
        return self._last

    def last_grad_norms(self) -> dict[str, float]:
        latest = self._latest()
        if latest is None:
            return {}
        slots, norms = latest
        return {self._slot_names[s]: v for s, v in zip(slots.tolist(), norms.tolist())}

    def last_overflow(self) -> list[Overflow]:
        latest = self._latest()
        if latest is None:
            return []
        slots, norms = latest
        bad = ~torch.isfinite(norms)
        return [
            Overflow(self._slot_index[s], self._slot_names[s], v)
            for s, v in zip(slots[bad].tolist(), norms[bad].tolist())
        ]

    def health(self) -> TrainingHealth:
        self._compact()
        if self._history is None:
            return TrainingHealth([], [], [], {}, self._listener_summary())
        scale, skipped, norm = self._history.cpu().unbind(1)
        counts: dict[str, int] = {}
        if self._counts is not None:
            for name, c in zip(self._slot_names, self._counts.tolist()):
                counts[name] = counts.get(name, 0) + c
        ordered = dict(sorted(counts.items(), key=lambda kv: -kv[1]))
        return TrainingHealth(
            scale.tolist(), [bool(s) for s in skipped.tolist()], norm.tolist(), ordered, self._listener_summary()
        )

    def __getstate__(self):
        # Parameters are matched by identity, which does not survive
        # pickling: an unpickled scaler starts a fresh record (no names).
        return {}

    def __setstate__(self, state) -> None:
        self.__init__()
