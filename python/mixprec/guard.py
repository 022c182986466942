"""Forward-overflow guard: name the module whose FP16 forward overflowed, and
run it in FP32 (or BF16) from the next step on.

A GradScaler fixes the range of the gradients; it cannot fix a forward that
overflows FP16 (attention logits, a large activation, a squared norm): the
loss is inf/NaN on every step, every step is skipped and the scale halves
towards zero. ``ForwardGuard`` hooks every module of a model; each forward
call runs ``torch.ops.mixprec.overflow_check_`` on the module's floating
outputs (one read-only kernel, no host sync), which records on the device
whether an output was inf/NaN, whether that came from finite inputs, and the
largest finite magnitude. Nothing is read on a healthy step; after a skipped
step the guard reads the record once and names the first module (in
execution order) whose output went non-finite from finite inputs, innermost
first::

    guard = mixprec.guard.ForwardGuard(model, fallback=True, optimizer=opt)
    scaler = mixprec.amp.GradScaler("cuda", diagnostics=True)
    guard.attach(scaler)            # the guard steps at every scaler.update()
    for x, y in loader:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt); scaler.update(); opt.zero_grad()
    print(guard.report())           # or print(scaler.health())

Without a mixprec scaler call ``guard.step(found_inf=...)`` (or
``guard.step(loss=loss)``) once per iteration, after the optimizer step.

[note: guard cost] The healthy path: one op call per module forward (one
read of its outputs; activations and max-pools are skipped, see [note:
range-safe modules], and nn.Sequential containers, see [note: sequential
containers]; and one per module output gradient with
``backward=True``), one ``zero_()`` of the
record per step, and the read of the step's found_inf flag (free on the CPU;
one 4-byte device-to-host copy on CUDA, the same read torch's GradScaler
makes in ``step()``). No collective: see [note: guard ranks].

[note: guard ranks] Under DDP / FSDP2 every rank sees the same found_inf (the
gradients are all-reduced, mixprec's scaler reduces the flag), so every rank
takes the skipped-step branch in the same step, and only there the flags of
the record are all-reduced (MAX) so that all ranks move the same modules to
FP32 in the same step. Healthy steps need no collective. ``step(loss=...)``
without found_inf cannot know that (a rank's loss may be finite while
another's is not) and all-reduces the flag every step when a process group
is in use. A ``.half()`` model under DDP / FSDP2: its parameters keep their
dtype (``move_params=False``, the default with more than one rank): DDP's
gradient buckets are typed by the parameters' dtypes when DDP is built
(its reducer then refuses an FP32 gradient for an FP16 bucket) and FSDP2
shards are DTensors of a fixed dtype, so a fallback module runs on FP32
copies of its parameters made at each call instead; the gradients reach the
parameters in their dtype, the buckets, optimizer state and masters stay as
they are, the same on every rank. FSDP2 with
``MixedPrecisionPolicy(param_dtype=torch.float16)`` (FP32 shards, FP16
unsharded parameters in the forward, no autocast) is the same case: the
fallback module runs on FP32 copies of its FP16 unsharded parameters and its
outputs go back to FP16 for the next layers.

[note: guard fallback] A module in fallback runs with autocast off (FP32) or
autocast to BF16, its floating inputs upcast to FP32. In a model cast with
``.half()`` (with ``move_params``, the default in one process) its
parameters and buffers move to the fallback dtype in place (same
``Parameter`` objects, so optimizers keep them); the optimizer's state
for them follows: for a mixprec optimizer the FP32 master (its ``master``
tensor, or in ``param_remainders`` mode the BF16 param joined with its
remainder, as ``opt.fp32_state(p)["master"]`` gives it) becomes the
parameter itself (exact: no rounding) and leaves the state (master or
remainder), its moments keep the dtypes their group's options ask for; for
other optimizers (torch's) state tensors of the parameter's old dtype and
shape are upcast; the outputs are cast back to the dtype of the
module's first floating input, which is what the next layer's parameters
take. Under autocast the outputs stay FP32: autocast casts them for the ops
that want FP16 and keeps them for the ops it runs in FP32.

Checkpoints: ``guard.state_dict()`` holds the fallback set, the overflow
counts and the events. To restore: build the model and guard as before, then
``guard.load_state_dict(sd)`` BEFORE ``model.load_state_dict`` and
``optimizer.load_state_dict`` (so parameters already have their FP32 dtype
when their saved values are copied in).
"""

from __future__ import annotations

import math
import numbers
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_leaves

from . import _overflow
from ._args import _takes, as_bool, as_int, check_module
from ._library import FLOAT_DTYPES as _FLOAT

__all__ = ["ForwardGuard", "OverflowReport", "FallbackEvent"]

_LOW = (torch.float16, torch.bfloat16)

# [note: range-safe modules] Modules whose output elements are each bounded
# by an input element's magnitude (or a constant): a finite input cannot give
# a non-finite output, so they are never to blame and are not hooked (exact
# types only: a subclass may override forward). This skips about a quarter
# of the bytes a ViT's checks read (its GELU outputs) and every ReLU of a
# ResNet.
_RANGE_SAFE = (
    nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Hardswish, nn.Hardsigmoid, nn.Hardtanh,
    nn.Identity, nn.Flatten, nn.Unflatten, nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d,
    nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d,
)


def _range_safe(m: nn.Module) -> bool:
    if type(m) is nn.LeakyReLU:
        return abs(m.negative_slope) <= 1.0
    return type(m) in _RANGE_SAFE


# Dropouts (exact types) in eval mode or with p == 0 return their input
# tensor itself: nothing to check, and not an in-place module either (which
# would turn the skip of [note: sequential containers] off for the whole
# model). In training with p > 0 they scale by 1 / (1 - p), which can
# overflow FP16, and are checked.
_DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_DTYPES_BY_NAME = {v: k for k, v in _DTYPE_NAMES.items()}
_MAX = {torch.float16: 65504.0, torch.bfloat16: 3.3895313892515355e38, torch.float32: 3.4028234663852886e38}


class _NoSuchModule(KeyError, ValueError):
    """A module name the guarded model does not have: a KeyError (as it
    always was) that is also the ValueError of the other argument checks."""


class FallbackEvent(NamedTuple):
    """A module moved to ``dtype`` before step ``step + 1`` (steps count from 0)."""

    module: str
    step: int
    dtype: str
    why: str


@dataclass
class OverflowReport:
    """What ``ForwardGuard.report()`` returns for the latest skipped step."""

    step: int  # the step (0-based, as counted by guard.step) that overflowed
    kind: str  # "forward", "gradient" or "unknown"
    module: str | None  # the first module, in execution order, that produced the overflow
    module_type: str | None
    dtype: str | None  # its output dtype
    amax: float  # largest finite |output| (|output gradient| for kind="gradient") of that module
    also: list[str]  # further modules flagged in the same step
    in_fallback: bool  # the module already ran in its fallback dtype

    def __str__(self) -> str:
        if self.kind == "unknown":
            return (
                f"step {self.step}: the step was skipped but no guarded module produced inf/NaN from finite "
                "inputs (the overflow is in code outside modules, e.g. the loss, or in the inputs)"
            )
        limit = _MAX.get(getattr(torch, self.dtype or "", None), None)
        mag = f"largest finite |value| {self.amax:.4g}" + (f" ({self.dtype} max {limit:g})" if limit else "")
        if self.kind == "forward":
            head = (
                f"step {self.step}: forward overflow in {self.module} ({self.module_type}): its {self.dtype} "
                f"output has inf/NaN from finite inputs; {mag}"
            )
            if self.in_fallback:
                head += "; it already runs in its fallback dtype"
        elif self.module is None:
            head = (
                f"step {self.step}: no forward overflow; gradient overflow (or an overflow in code outside "
                "modules, e.g. the loss); the loss scale backs off for this"
            )
            if self.also:
                head += "; parameters whose gradients overflowed: " + ", ".join(self.also[:5]) + (
                    " ..." if len(self.also) > 5 else "")
            return head
        else:
            head = (
                f"step {self.step}: no forward overflow; gradient overflow: the gradient w.r.t. the output of "
                f"{self.module} ({self.module_type}, {self.dtype}) is the first non-finite one in backward "
                f"order (made by what consumes that output); {mag}; the loss scale backs off for this"
            )
        if self.also:
            head += "; also: " + ", ".join(self.also[:5]) + (" ..." if len(self.also) > 5 else "")
        return head


def _floats(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x] if x.dtype in _FLOAT else []
    if isinstance(x, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in x):
        return [t for t in x if t.dtype in _FLOAT]
    return [t for t in tree_leaves(x) if isinstance(t, torch.Tensor) and t.dtype in _FLOAT]


def _cast_floats(x, dtype):
    if isinstance(x, torch.Tensor):
        return x.to(dtype) if x.dtype in _FLOAT and x.dtype != dtype else x
    if isinstance(x, tuple):
        return tuple(_cast_floats(v, dtype) for v in x)
    if isinstance(x, list):
        return [_cast_floats(v, dtype) for v in x]
    if isinstance(x, dict):
        return {k: _cast_floats(v, dtype) for k, v in x.items()}
    return x


def _upcast_params(mod: nn.Module, dtype: torch.dtype) -> list:
    """Replaces ``mod``'s FP16/BF16 parameters of another dtype than
    ``dtype`` by differentiable ``dtype`` copies (the gradients flow back to
    the parameters); returns what to put back."""
    swapped = []
    for m in mod.modules():
        for k, p in m._parameters.items():
            if p is not None and p.dtype in _LOW and p.dtype != dtype:
                swapped.append((m, k, p))
                m._parameters[k] = p.to(dtype)
    return swapped


class ForwardGuard:
    """Opt-in overflow guard on ``model`` (see the module docstring).

    Args:
        model: the module to guard (the inner module of a DDP wrapper).
        fallback: move a module to ``fallback_dtype`` after it overflowed in
            the forward ``after`` times (skipped steps).
        after: K, the number of overflowing steps before the fallback.
        fallback_dtype: ``torch.float32`` (default) or ``torch.bfloat16``.
        optimizer: the optimizer(s) over the model's parameters, to keep their
            state consistent when a ``.half()`` model's parameters move.
        backward: also check the gradient w.r.t. each module's first floating
            output, to name the module where a gradient overflow appeared
            (eager only: under torch.compile the forward checks are traced
            into the graph, with no graph break, and the backward ones
            skipped). Off by default: it costs a read of every output
            gradient (see bench/results/guard_cpu.md), and without it a
            skipped step with no forward overflow is still reported as a
            gradient overflow, with the parameters the attached scaler's
            diagnostics name.
        move_params: for a model cast with ``.half()`` (FP16/BF16
            parameters): True moves a fallback module's parameters to the
            fallback dtype (and its optimizer state, see [note: guard
            fallback]); False leaves them (and the optimizer) as they are
            and runs the module on copies upcast at each call (autograd
            takes the gradients back to the parameters in their dtype).
            Default: True in one process, False when torch.distributed runs
            more than one rank (DDP's buckets and FSDP2's shards are built
            for the parameters' dtype: a parameter changing dtype under them
            breaks the next backward), see [note: guard ranks].
        process_group: for the cross-rank agreement (default: the world group
            when torch.distributed is initialised).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        fallback: bool = False,
        after: int = 1,
        fallback_dtype: torch.dtype = torch.float32,
        optimizer: torch.optim.Optimizer | list[torch.optim.Optimizer] | None = None,
        backward: bool = False,
        move_params: bool | None = None,
        process_group=None,
    ) -> None:
        w = "mixprec.guard.ForwardGuard"
        check_module(w, "model", model)
        after = as_int(w, "after", after, low=1)
        as_bool(w, "fallback", fallback)
        as_bool(w, "backward", backward)
        if move_params is not None and not isinstance(move_params, bool):
            raise TypeError(f"{w}: move_params must be a bool or None, got {type(move_params).__name__} {move_params!r}")
        if not isinstance(fallback_dtype, torch.dtype):
            raise TypeError(f"{w}: fallback_dtype must be a torch.dtype, got {type(fallback_dtype).__name__}")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            if isinstance(optimizer, (str, bytes, nn.Module)) or not isinstance(optimizer, (list, tuple)):
                raise TypeError(
                    f"{w}: optimizer must be a torch.optim.Optimizer, a list of them or None, got "
                    f"{type(optimizer).__name__}"
                )
            for i, o in enumerate(optimizer):
                if not isinstance(o, torch.optim.Optimizer):
                    raise TypeError(f"{w}: optimizer[{i}] must be a torch.optim.Optimizer, got {type(o).__name__}")
        if process_group is not None and not (dist.is_available() and isinstance(process_group, dist.ProcessGroup)):
            raise TypeError(f"{w}: process_group must be a torch.distributed ProcessGroup or None, got "
                            f"{type(process_group).__name__}")
        if fallback_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(
                f"mixprec.guard.ForwardGuard: fallback_dtype must be torch.float32 or torch.bfloat16, "
                f"got {fallback_dtype}"
            )
        self.model = model
        self.fallback_enabled = fallback
        self.after = after
        self.fallback_dtype = fallback_dtype
        if optimizer is None:
            self._optimizers = []
        elif isinstance(optimizer, torch.optim.Optimizer):
            self._optimizers = [optimizer]
        else:
            self._optimizers = list(optimizer)
        self.backward = backward
        self.process_group = process_group
        self.enabled = True
        self.steps = 0
        named = list(model.named_modules())
        self._names = [n or "<model>" for n, _ in named]
        self._modules = [m for _, m in named]
        self._index = {n: i for i, n in enumerate(self._names)}
        n = len(named)
        # ancestors[i]: slots of the modules containing module i (by name).
        self._ancestors: list[list[int]] = [[] for _ in range(n)]
        for i, (name, _) in enumerate(named):
            parts = name.split(".") if name else []
            for k in range(len(parts)):
                a = self._index.get(".".join(parts[:k]) or "<model>")
                if a is not None and a != i:
                    self._ancestors[i].append(a)
        self._n = n
        self._records: dict[torch.device, torch.Tensor] = {}
        self._order: dict[int, int] = {}  # slot -> position of its first forward call
        self._border: dict[int, int] = {}  # slot -> position of its first output gradient
        self._dtypes: dict[int, torch.dtype] = {}
        self.counts = [0] * n
        self.fallback_set: dict[str, torch.dtype] = {}
        self.events: list[FallbackEvent] = []
        self._last: OverflowReport | None = None
        self._scaler = None
        self._from_scaler = False
        self._reports: list[OverflowReport] = []
        self._half_model = any(p.dtype in _LOW for p in model.parameters())
        sharded = any(type(p).__name__ == "DTensor" for p in model.parameters())
        if move_params is None:
            group = self._group()
            move_params = not sharded and (group is None or dist.get_world_size(group) == 1)
        elif move_params and sharded and self._half_model:
            raise ValueError(
                "mixprec.guard.ForwardGuard: move_params=True cannot move FSDP2's sharded (DTensor) parameters "
                "to another dtype; use move_params=False (the module runs on upcast copies), or build the model "
                "in FP32 and let autocast or fully_shard(mp_policy=MixedPrecisionPolicy(param_dtype=...)) cast it"
            )
        self.move_params = bool(move_params)
        self._originals: dict[int, Any] = {}
        # [note: sequential containers] An nn.Sequential (exact type) only
        # chains its children, so when its output is inf/NaN from finite
        # inputs, the first child whose output went non-finite had a finite
        # input: that child (or one of its own modules) is flagged, and the
        # Sequential, an ancestor of a flagged module, is never the one
        # named. Its check (a second read of its last child's output) is
        # skipped, until a module is seen returning one of its inputs (an
        # in-place module: its check sees its input already non-finite, so
        # only a container can be flagged for it).
        self._inplace_seen = False
        self._handles = [
            m.register_forward_hook(self._make_hook(i)) for i, m in enumerate(self._modules) if not _range_safe(m)
        ]

    # ---- the hot path ------------------------------------------------------------
    def _record(self, dev: torch.device) -> torch.Tensor:
        rec = self._records.get(dev)
        if rec is None:
            rec = self._records[dev] = _overflow.new_record(2 * self._n, dev)
        return rec

    def _make_hook(self, slot: int):
        check = torch.ops.mixprec.overflow_check_.default
        guard = self
        chain = type(self._modules[slot]) is nn.Sequential
        dropout = type(self._modules[slot]) in _DROPOUTS

        def grad_hook(g: torch.Tensor) -> None:
            if g.dtype in _FLOAT:
                check([g], [], guard._record(g.device), slot + guard._n)
                if slot not in guard._border:
                    guard._border[slot] = len(guard._border)

        def hook(module, args, out):
            if not guard.enabled or (chain and not guard._inplace_seen):
                return None  # see [note: sequential containers]
            if dropout and (not module.training or module.p == 0):
                return None  # a passthrough: see _DROPOUTS
            outs = _floats(out)
            if not outs:
                return None
            first = outs[0]
            if not guard._inplace_seen and any(a is first for a in args):
                guard._inplace_seen = True
            check(outs, _floats(args), guard._record(first.device), slot)
            if slot not in guard._order:
                guard._order[slot] = len(guard._order)
                guard._dtypes[slot] = first.dtype
            # A tensor hook on an intermediate breaks a torch.compile graph
            # at every module: compiled code keeps the forward checks only.
            if guard.backward and first.requires_grad and torch.is_grad_enabled() and not torch.compiler.is_compiling():
                first.register_hook(grad_hook)
            return None

        return hook

    @_takes(module="mixprec.guard")
    def remove(self) -> None:
        """Removes the hooks (fallbacks stay)."""
        for h in self._handles:
            h.remove()
        self._handles = []

    # ---- once per step ---------------------------------------------------------------
    def attach(self, scaler) -> ForwardGuard:
        """Steps the guard at every ``scaler.update()`` of a
        ``mixprec.amp.GradScaler`` built with ``diagnostics=True`` (or
        ``named_parameters=``), and adds the guard's report to
        ``scaler.health()``."""
        def refuse(got=""):
            return RuntimeError(
                "mixprec.guard.ForwardGuard.attach: needs a mixprec.amp.GradScaler with diagnostics=True "
                f"(or named_parameters=...){got}; with any other scaler call guard.step(found_inf=...) after each step"
            )

        add = getattr(scaler, "add_step_listener", None)
        if add is None:
            raise TypeError(
                "mixprec.guard.ForwardGuard.attach: scaler must be a mixprec.amp.GradScaler with diagnostics=True "
                f"(or named_parameters=...), got {type(scaler).__name__}; with any other scaler call "
                "guard.step(found_inf=...) after each step")
        try:
            add(self)
        except RuntimeError as e:  # diagnostics off
            raise refuse() from e
        self._scaler = weakref.ref(scaler)
        return self

    def on_scaler_step(self, found_inf: torch.Tensor) -> None:  # the GradScaler hook (_amp_health)
        self.step(found_inf=found_inf)

    @_takes(module="mixprec.guard")
    def health_summary(self) -> str | None:  # for GradScaler.health()
        if not self._reports and not self.events:
            return None
        lines = [f"forward guard: {len(self._reports)} overflowing steps"]
        if self._last is not None:
            lines.append("  latest: " + str(self._last))
        for e in self.events:
            lines.append(f"  fallback: {e.module} -> {e.dtype} after step {e.step} ({e.why})")
        return "\n".join(lines)

    def _group(self):
        if self.process_group is not None:
            return self.process_group
        if dist.is_available() and dist.is_initialized():
            return dist.group.WORLD
        return None

    def step(self, found_inf: torch.Tensor | float | None = None, *, loss: torch.Tensor | None = None) -> OverflowReport | None:
        """Ends a step: if it overflowed (``found_inf`` nonzero, or ``loss``
        not finite) reads the record, names the module (see ``report()``),
        counts it and, with the fallback on, moves modules that reached
        ``after`` overflows to the fallback dtype for the next step. Returns
        the step's report, or None for a healthy step. Clears the record."""
        w = "mixprec.guard.ForwardGuard.step"
        if found_inf is not None:
            if isinstance(found_inf, torch.Tensor):
                if found_inf.numel() != 1:
                    raise ValueError(
                        f"{w}: found_inf must be a one-element tensor (the scaler's), got shape {tuple(found_inf.shape)}"
                    )
            elif isinstance(found_inf, bool) or not isinstance(found_inf, numbers.Real):  # NumPy scalars too
                raise TypeError(
                    f"{w}: found_inf must be a one-element tensor or a number (0: healthy), got "
                    f"{type(found_inf).__name__} {found_inf!r}"
                )
        if loss is not None and not isinstance(loss, torch.Tensor):
            raise TypeError(f"{w}: loss must be a tensor, got {type(loss).__name__}")
        group = self._group()
        if found_inf is not None:
            bad = bool(found_inf != 0) if isinstance(found_inf, torch.Tensor) else found_inf != 0
        elif loss is not None:
            bad_t = ~torch.isfinite(loss.detach()).all()
            if group is not None:  # ranks must agree: see [note: guard ranks]
                bad_t = bad_t.float()
                dist.all_reduce(bad_t, op=dist.ReduceOp.MAX, group=group)
            bad = bool(bad_t)
        else:
            raise TypeError("mixprec.guard.ForwardGuard.step: pass found_inf (from the scaler) or loss")
        self._from_scaler = found_inf is not None
        report = self._diagnose(group) if bad else None
        for rec in self._records.values():
            rec.zero_()
        self.steps += 1
        return report

    def _diagnose(self, group) -> OverflowReport:
        n = self._n
        total = None
        for rec in self._records.values():
            r = rec.to("cpu" if group is None else rec.device)
            total = r if total is None else torch.maximum(total, r.to(total.device))
        if total is None:
            total = torch.zeros((2 * n, _overflow.RECORD_WIDTH))
        if group is not None:  # the same decision on every rank: [note: guard ranks]
            total = total.clone()
            dist.all_reduce(total, op=dist.ReduceOp.MAX, group=group)
        total = total.cpu()
        fwd = total[:n, _overflow.FROM_FINITE].tolist()
        amax = total[:, _overflow.AMAX].tolist()
        bwd = total[n:, _overflow.NONFINITE].tolist()
        flagged = {i for i, v in enumerate(fwd) if v != 0}
        covered = {a for i in flagged for a in self._ancestors[i]}
        minimal = [i for i in flagged if i not in covered]
        big = len(self._order) + n
        minimal.sort(key=lambda i: (self._order.get(i, big), i))
        step = self.steps
        if minimal:
            first = minimal[0]
            name = self._names[first]
            report = OverflowReport(
                step, "forward", name, type(self._modules[first]).__name__,
                _DTYPE_NAMES.get(self._dtypes.get(first), None), amax[first],
                [self._names[i] for i in minimal[1:]], name in self.fallback_set,
            )
            for i in minimal:
                if self._names[i] not in self.fallback_set:
                    self.counts[i] += 1
            if self.fallback_enabled:
                for i in minimal:
                    nm = self._names[i]
                    if nm not in self.fallback_set and self.counts[i] >= self.after:
                        why = f"forward overflow in {self.counts[i]} step(s), last at step {step}"
                        self._apply(i, self.fallback_dtype, why)
        else:
            bad_b = [i for i, v in enumerate(bwd) if v != 0]
            if bad_b:
                # Backward order is the reverse of the forward's: the first
                # gradient to go non-finite belongs to the latest module.
                bad_b.sort(key=lambda i: (self._border.get(i, big), i))
                first = bad_b[0]
                report = OverflowReport(
                    step, "gradient", self._names[first], type(self._modules[first]).__name__,
                    _DTYPE_NAMES.get(self._dtypes.get(first), None), amax[n + first],
                    [self._names[i] for i in bad_b[1:]], self._names[first] in self.fallback_set,
                )
            elif self._from_scaler:
                # Skipped by the scaler, nothing flagged in the forward: the
                # gradients overflowed (or code outside modules did).
                params = []
                scaler = self._scaler() if self._scaler is not None else None
                if scaler is not None:
                    params = [o.name for o in scaler.last_overflow()]
                report = OverflowReport(step, "gradient", None, None, None, math.nan, params, False)
            else:
                report = OverflowReport(step, "unknown", None, None, None, math.nan, [], False)
        self._last = report
        self._reports.append(report)
        return report

    # ---- reading ----------------------------------------------------------------------
    @_takes(module="mixprec.guard")
    def report(self) -> OverflowReport | None:
        """The latest skipped step's report (None if no step overflowed)."""
        return self._last

    @_takes(module="mixprec.guard")
    def reports(self) -> list[OverflowReport]:
        return list(self._reports)

    # ---- the fallback ------------------------------------------------------------------
    def fallback(self, name: str, dtype: torch.dtype | None = None, why: str = "pinned by the user") -> None:
        """Runs module ``name`` (as in ``model.named_modules()``; ``"<model>"``
        for the root) in ``dtype`` (default: the guard's fallback dtype)
        from now on."""
        w = "mixprec.guard.ForwardGuard.fallback"
        if not isinstance(name, str):
            raise TypeError(f"{w}: name must be a module's name (a str), got {type(name).__name__}")
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise TypeError(f"{w}: dtype must be a torch.dtype or None, got {type(dtype).__name__}")
        if dtype is not None and dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"{w}: dtype must be torch.float32 or torch.bfloat16 (as the guard's fallback_dtype), got {dtype}")
        if not isinstance(why, str):
            raise TypeError(f"{w}: why must be a str, got {type(why).__name__}")
        if name not in self._index:
            raise _NoSuchModule(f"{w}: no module named {name!r} in the model")
        if name in self.fallback_set:
            return
        self._apply(self._index[name], dtype or self.fallback_dtype, why)

    def _apply(self, i: int, dtype: torch.dtype, why: str) -> None:
        mod, name = self._modules[i], self._names[i]
        if self._half_model and self.move_params:
            self._move_params(mod, dtype)
        orig = mod.__dict__.get("forward", None)
        self._originals[i] = orig
        inner = orig if orig is not None else type(mod).forward.__get__(mod)

        def forward(*args, **kwargs):
            lead = next((t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.dtype in _FLOAT), None)
            dev = lead.device.type if lead is not None else "cpu"
            # Parameters still in FP16/BF16 (move_params=False, or FSDP2's
            # mixed-precision policy) run as upcast copies for this call.
            swapped = _upcast_params(mod, dtype if self._half_model else torch.float32)
            # The outputs go back to the low input dtype where the next
            # layers run in it without autocast: a .half() model, FSDP2's
            # param_dtype policy (low-precision parameters, or inputs it
            # cast, with autocast off). See [note: guard fallback].
            back = None
            if lead is not None and lead.dtype in _LOW and (
                    self._half_model or swapped or not torch.is_autocast_enabled(dev)):
                back = lead.dtype
            args, kwargs = _cast_floats(args, torch.float32), _cast_floats(kwargs, torch.float32)
            try:
                if dtype == torch.float32:
                    with torch.autocast(dev, enabled=False):
                        out = inner(*args, **kwargs)
                elif self._half_model:
                    args, kwargs = _cast_floats(args, dtype), _cast_floats(kwargs, dtype)
                    with torch.autocast(dev, enabled=False):
                        out = inner(*args, **kwargs)
                else:
                    with torch.autocast(dev, dtype=dtype):
                        out = inner(*args, **kwargs)
            finally:
                for m, k, p in swapped:
                    m._parameters[k] = p
            return _cast_floats(out, back) if back is not None else out

        mod.forward = forward
        self.fallback_set[name] = dtype
        self.events.append(FallbackEvent(name, self.steps, _DTYPE_NAMES[dtype], why))

    def _move_params(self, mod: nn.Module, dtype: torch.dtype) -> None:
        for p in mod.parameters():
            if p.dtype not in _LOW or p.dtype == dtype:
                continue
            opt = next((o for o in self._optimizers if p in o.state), None)
            st = opt.state[p] if opt is not None else None
            if opt is not None and callable(getattr(opt, "fp32_state", None)):
                # A mixprec optimizer: its FP32 master (a master tensor, or
                # the param joined with its remainder in param_remainders
                # mode: see _optim_lean) is the value the param rounds.
                # Its moments keep the dtypes of its group's options.
                master = opt.fp32_state(p)["master"]
                if dtype == torch.float32:
                    new = master  # exact: no rounding
                    st.pop("master", None)
                    st.pop("remainder", None)
                else:  # float16 -> bfloat16: the master stays the master
                    new = master.to(dtype)
            else:
                old = p.dtype
                master = st.get("master") if st else None
                if master is not None and dtype == torch.float32:
                    new = master.detach().clone()
                    st.pop("master")
                else:
                    new = p.detach().to(dtype)
                if st:  # torch's optimizers keep their state in the param's dtype
                    for k, v in list(st.items()):
                        if isinstance(v, torch.Tensor) and v.dtype == old and v.shape == p.shape:
                            st[k] = v.to(dtype)
            p.data = new
            p.grad = None
        for m in mod.modules():
            for k, b in m._buffers.items():
                if b is not None and b.dtype in _LOW and b.dtype != dtype:
                    m._buffers[k] = b.to(dtype)

    # ---- checkpoints --------------------------------------------------------------------
    @_takes(module="mixprec.guard")
    def state_dict(self) -> dict[str, Any]:
        """The fallback set (name -> dtype name), the overflow counts by name,
        the events and the step count: plain Python values."""
        return {
            "fallback": {n: _DTYPE_NAMES[d] for n, d in self.fallback_set.items()},
            "counts": {self._names[i]: c for i, c in enumerate(self.counts) if c},
            "events": [tuple(e) for e in self.events],
            "steps": self.steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores a ``state_dict()``: the listed modules move to their
        fallback dtype now (call it before loading the model's and the
        optimizer's state). Modules of the set already in fallback (in the
        same dtype) stay. Everything is checked first (types, module names,
        the dtypes the constructor allows): a refused dict changes
        nothing."""
        w = "mixprec.guard.ForwardGuard.load_state_dict"
        fallback, counts, events, steps = self._checked_state(w, state)
        for name, dt in fallback.items():
            if name not in self.fallback_set:
                self._apply(self._index[name], dt, "restored from a checkpoint")
        # As before: counts and events are the dict's (none when absent; the
        # restored fallbacks add no event), the step count kept when absent.
        self.counts = [(counts or {}).get(n, 0) for n in self._names]
        self.events = events or []
        if steps is not None:
            self.steps = steps

    def _checked_state(self, w: str, state):
        """The parts of a ``state_dict()`` (None where a key is absent),
        converted and checked: TypeError / ValueError naming the key,
        KeyError for a module the model does not have."""
        if not isinstance(state, Mapping):
            raise TypeError(f"{w}: state must be a dict (as state_dict() returns), got {type(state).__name__}")
        unknown = [k for k in state if k not in ("fallback", "counts", "events", "steps")]
        if unknown:
            raise ValueError(
                f"{w}: unexpected keys {unknown} (a guard's state_dict() has 'fallback', 'counts', 'events' and "
                "'steps'; was a model's or an optimizer's state dict passed?)"
            )
        fallback: dict[str, torch.dtype] = {}
        saved = state.get("fallback", {})
        if not isinstance(saved, Mapping):
            raise TypeError(f"{w}: state['fallback'] must be a dict of module name -> dtype name, got "
                            f"{type(saved).__name__}")
        for name, dt in saved.items():
            if not isinstance(name, str):
                raise TypeError(f"{w}: state['fallback'] keys must be module names (str), got {type(name).__name__}")
            dtype = dt if isinstance(dt, torch.dtype) else (
                _DTYPES_BY_NAME.get(dt.removeprefix("torch.")) if isinstance(dt, str) else None)
            if dtype is None and not isinstance(dt, str):
                raise TypeError(f"{w}: state['fallback'][{name!r}] must be a dtype name ('float32' or 'bfloat16'), "
                                f"got {type(dt).__name__} {dt!r}")
            if dtype not in (torch.float32, torch.bfloat16):
                raise ValueError(f"{w}: state['fallback'][{name!r}] must be 'float32' or 'bfloat16' (the fallback "
                                 f"dtypes the constructor allows), got {dt!r}")
            fallback[name] = dtype
        missing = [n for n in fallback if n not in self._index]
        if missing:
            raise _NoSuchModule(f"{w}: no modules named {missing} in the model")
        for name, dtype in fallback.items():
            if name in self.fallback_set and self.fallback_set[name] != dtype:
                raise ValueError(
                    f"{w}: state['fallback'][{name!r}] is {_DTYPE_NAMES[dtype]} but the module already runs in "
                    f"{_DTYPE_NAMES[self.fallback_set[name]]} (a fallback is not undone: load into a new guard)"
                )
        counts = None
        if "counts" in state:
            saved = state["counts"]
            if not isinstance(saved, Mapping):
                raise TypeError(f"{w}: state['counts'] must be a dict of module name -> count, got "
                                f"{type(saved).__name__}")
            counts = {}
            for name, c in saved.items():
                if not isinstance(name, str):
                    raise TypeError(f"{w}: state['counts'] keys must be module names (str), got {type(name).__name__}")
                counts[name] = as_int(w, f"state['counts'][{name!r}]", c, low=0)
            missing = [n for n in counts if n not in self._index]
            if missing:
                raise _NoSuchModule(f"{w}: no modules named {missing} in the model (state['counts'])")
        events = None
        if "events" in state:
            saved = state["events"]
            if not isinstance(saved, (list, tuple)):
                raise TypeError(f"{w}: state['events'] must be a list of (module, step, dtype, why), got "
                                f"{type(saved).__name__}")
            events = []
            for i, e in enumerate(saved):
                if not isinstance(e, (list, tuple)) or len(e) != 4:
                    raise TypeError(f"{w}: state['events'][{i}] must be a (module, step, dtype, why) tuple, got {e!r}")
                module, step, dt, why = e
                if not (isinstance(module, str) and isinstance(dt, str) and isinstance(why, str)):
                    raise TypeError(f"{w}: state['events'][{i}] must hold (str, int, str, str), got {e!r}")
                if _DTYPES_BY_NAME.get(dt) not in (torch.float32, torch.bfloat16):
                    raise ValueError(f"{w}: state['events'][{i}]'s dtype must be 'float32' or 'bfloat16', got {dt!r}")
                events.append(FallbackEvent(module, as_int(w, f"state['events'][{i}] step", step, low=0), dt, why))
        steps = as_int(w, "state['steps']", state["steps"], low=0) if "steps" in state else None
        return fallback, counts, events, steps
