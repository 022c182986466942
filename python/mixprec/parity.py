"""Parity of mixed-precision recipes with FP32 on the user's own model.

``parity(make_model, batches, recipe="fp16")`` builds the model for FP32 and
for the recipe from the same initial weights, trains each on the same
batches, and reports what the AMP playbook asks for: the loss curves side by
side (largest and final relative gap), the task metric of each trained model
against FP32's (``evaluate=``), skipped steps, non-finite losses and
gradients, the global gradient norm, the forward-overflow report
(``mixprec.guard``), steps/s and peak memory of each, and a PNG of the
curves::

    result = mixprec.parity.parity(
        lambda: MyNet(), batches, recipe=["bf16", "fp16", "bf16+act8", "bf16+2x"],
        optimizer=lambda ps: mixprec.optim.AdamW(ps, lr=1e-3),
        evaluate=lambda model: {"accuracy": accuracy(model, val_loader)},
        seeds=3, targets={"accuracy": (0.005, "higher")}, lr_scale=2.0, png="parity.png")
    print(result)          # one row per recipe
    result["fp16"].metrics["accuracy"].mean_diff

Recipes (``recipe=`` a name, a ``Recipe``, or a list of them; one name or
``Recipe`` gives a ``ParityResult`` as before, a list a ``ParityReport`` of
one ``ParityResult`` per recipe):

* ``"fp16"`` / ``"bf16"``: autocast to that dtype, FP32 parameters,
  ``mixprec.amp.GradScaler`` (FP16; BF16 runs unscaled);
* ``"fp16-params"`` / ``"bf16-params"``: the model cast with ``.half()`` /
  ``.bfloat16()`` (use a master-weight optimizer such as
  ``mixprec.optim.AdamW``), inputs cast to it, the loss computed on FP32
  outputs;
* ``"fp32"``: FP32 as the baseline (with a modifier: the modifier's effect
  alone);
* modifiers joined with ``+``: ``act8`` / ``act4``: the forward and the loss
  inside ``mixprec.memory.compressed_activations(bits=8 / 4)``; ``<k>x``
  (``"bf16+2x"``): batches of ``k`` times the size, each the concatenation of
  ``k`` consecutive batches of the FP32 run (tensors along dim 0, tuples
  element-wise, dicts per key, lists joined: a list is taken as per-sample
  items such as detection targets), so the same samples in ``1/k`` of the
  steps (``steps`` must be a multiple of ``k``). Its learning rate: every
  param group's ``lr`` multiplied by ``lr_scale`` when that is a number, or
  replaced by ``lr_scale(lr, k)`` when it is a function (``2.0`` or
  ``lambda lr, k: lr * k`` is the linear scaling rule, ``lambda lr, k: lr *
  k ** 0.5`` the square-root rule); unchanged without one. ``Recipe(...,
  lr_scale=...)`` sets it per recipe, ``parity(lr_scale=...)`` for recipes
  with ``k > 1`` that set none. To check the rule before training,
  ``optimizer`` is called once more, on a copy of the untrained model.

``Recipe(name, dtype, params_cast, act_bits, batch_multiplier, lr_scale)``
builds any of these (``Recipe.parse("bf16+act8")`` is the named one).
``guard=True`` puts a ``mixprec.guard.ForwardGuard`` with the fallback on
each low-precision recipe's model.

Task metric: ``evaluate(model) -> {"accuracy": 0.91, ...}`` is called on the
untrained FP32 model first (to check it returns numbers before anything
trains), then on every trained model, in eval mode under ``torch.no_grad()``,
as the recipe runs it: under the recipe's autocast for ``"fp16"`` /
``"bf16"``, with the low-precision parameters for ``"*-params"`` (floating
inputs of the model's forward are cast to its dtype and its outputs back to
FP32), with the guard's FP32 fallbacks in place: the metric is that of the
model a user would deploy from this recipe. Per metric, each recipe reports
the mean over seeds of (recipe - FP32) with its min, max and standard
deviation; ``targets={"miou": 0.005}`` is met when ``|mean diff| <= 0.005``,
``targets={"accuracy": (0.005, "higher")}`` (higher is better) when ``mean
diff >= -0.005``, ``(0.005, "lower")`` when ``mean diff <= 0.005``.

Seeds: ``seeds=1`` (the default) is one run per recipe on the batches in the
order given, the model built as ``make_model()`` builds it. ``seeds=N``
runs seeds ``0 .. N-1`` (or ``seeds=[3, 7]``): for each, ``torch.manual_seed
(seed)`` before ``make_model()`` and again before training (the same dropout
stream for every recipe), and the batches in an order drawn from that seed
(a new permutation for each pass over them). Every recipe of a seed starts
from that seed's FP32 initial weights and sees its batches in its order.

Per run: the skipped steps, the steps with a non-finite loss and those with a
non-finite gradient norm, the global gradient norm of every step (the L2
norm over all parameters' gradients in FP32, divided by the GradScaler's
scale: what the optimizer step sees; its time is not counted in steps/s),
steps/s (the median over the timed steps: all but the first and the last),
and the peak memory:

Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` (torch's caching
allocator) over the run. On the CPU torch keeps no allocator statistics; the
figure is glibc's ``mallinfo2()`` (bytes in use: ``uordblks + hblkhd``)
sampled after every aten op of one training step (the last), minus its value
before the first model was built: the process's heap, which is what the CPU
allocator draws from (peaks inside a single op are missed). None where
glibc is not the allocator.

Every argument is checked before anything trains (unknown recipes, a
``make_model`` that is not a function, batches that are not ``(input,
target)`` pairs of tensors, ``steps`` / ``seeds`` below 1, targets that are
not finite, an ``evaluate`` that returns no numbers, a PNG in a missing
directory...): the error names the argument, and nothing was trained.

CLI: ``python -m mixprec.parity pkg.module:setup --recipe fp16,bf16 --recipe
bf16+2x --seeds 3 --target accuracy=0.005:higher --lr-scale 2 --steps 20
--png out.png`` where ``setup()`` returns a dict with ``make_model``,
``batches`` and optionally ``loss_fn``, ``optimizer``, ``device``,
``evaluate``, ``targets``. ``--batch-multiplier k`` gives every recipe named
``k`` times the batch (as ``+<k>x``). Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import collections.abc
import copy
import ctypes
import dataclasses
import importlib
import math
import numbers
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from ._args import as_float, as_int

__all__ = ["parity", "Recipe", "ParityResult", "ParityReport", "RunResult", "MetricDiff"]

_W = "mixprec.parity"

# base name -> (low dtype or None for FP32, parameters cast to it)
_BASES = {
    "fp32": (None, False),
    "fp16": (torch.float16, False),
    "bf16": (torch.bfloat16, False),
    "fp16-params": (torch.float16, True),
    "bf16-params": (torch.bfloat16, True),
}
_RECIPES = {k: v for k, v in _BASES.items() if k != "fp32"}  # the names of the single-recipe API before modifiers
_MULT = re.compile(r"([1-9][0-9]*)x")
_DIRECTIONS = ("both", "higher", "lower")

LrScale = Union[float, Callable[[float, int], float]]


@dataclass(frozen=True)
class Recipe:
    """One way of training the model. ``dtype``: the autocast dtype (or,
    with ``params_cast``, the parameters' dtype); None is FP32.
    ``act_bits``: 8 or 4 to run forward and loss inside
    ``mixprec.memory.compressed_activations(bits=act_bits)``.
    ``batch_multiplier`` ``k``: batches of ``k`` consecutive batches
    concatenated, ``1/k`` of the steps. ``lr_scale``: a number multiplying
    every param group's lr, or ``f(lr, k) -> lr``; None leaves the lr (or
    takes ``parity``'s ``lr_scale`` when ``k > 1``)."""

    name: str
    dtype: torch.dtype | None = None
    params_cast: bool = False
    act_bits: int | None = None
    batch_multiplier: int = 1
    lr_scale: LrScale | None = None

    @classmethod
    def parse(cls, spec: str) -> Recipe:
        """``"bf16"``, ``"fp16-params"``, ``"bf16+act8"``, ``"fp32+2x"``...
        (see the module docstring); ValueError for anything else."""
        base, *mods = spec.split("+")
        if base not in _BASES:
            raise ValueError(_recipe_grammar(spec))
        dtype, cast = _BASES[base]
        bits, k = None, 1
        for m in mods:
            mult = _MULT.fullmatch(m)
            if m in ("act8", "act4") and bits is None:
                bits = int(m[3:])
            elif mult and k == 1:
                k = int(mult.group(1))
            else:
                raise ValueError(_recipe_grammar(spec))
        return cls(spec, dtype, cast, bits, k)


def _recipe_grammar(spec) -> str:
    return (f"{_W}: recipe must be one of {sorted(_RECIPES)} (or 'fp32'), optionally followed by '+act8' or "
            f"'+act4' and '+<k>x' (e.g. 'bf16+act8+2x'), got {spec!r}")


@dataclass
class RunResult:
    name: str
    losses: list[float]
    skipped: list[int]  # steps whose optimizer step was skipped (0-based)
    steps_per_s: float  # median over the timed steps (all but the first and the last)
    peak_memory: int | None  # bytes, see the module docstring
    memory_source: str
    seed: int | None = None  # None: the unseeded run (seeds=1)
    batch_multiplier: int = 1
    nonfinite_losses: int = 0  # steps whose loss was inf/NaN
    nonfinite_grads: int = 0  # steps whose gradient norm was inf/NaN
    grad_norms: list[float] = field(default_factory=list)  # global L2 norm per step, unscaled, in FP32
    metrics: dict[str, float] = field(default_factory=dict)  # evaluate() of the trained model

    @property
    def grad_norm_median(self) -> float:
        finite = [g for g in self.grad_norms if math.isfinite(g)]
        return statistics.median(finite) if finite else math.nan

    @property
    def grad_norm_max(self) -> float:
        finite = [g for g in self.grad_norms if math.isfinite(g)]
        return max(finite) if finite else math.nan


@dataclass
class MetricDiff:
    """One metric of a recipe against FP32, per seed."""

    name: str
    fp32: list[float]
    recipe: list[float]
    target: float | None = None
    direction: str = "both"  # "higher": higher is better; "lower": lower is better

    @property
    def diffs(self) -> list[float]:
        return [r - b for r, b in zip(self.recipe, self.fp32)]

    @property
    def mean_diff(self) -> float:
        return statistics.fmean(self.diffs)

    @property
    def min_diff(self) -> float:
        return min(self.diffs)

    @property
    def max_diff(self) -> float:
        return max(self.diffs)

    @property
    def std_diff(self) -> float:
        d = self.diffs
        return statistics.stdev(d) if len(d) > 1 else 0.0

    @property
    def met(self) -> bool | None:
        """None without a target; False when the mean is NaN."""
        if self.target is None:
            return None
        d = self.mean_diff
        if self.direction == "higher":
            return d >= -self.target
        if self.direction == "lower":
            return d <= self.target
        return abs(d) <= self.target

    def describe(self) -> str:
        spread = f" [{self.min_diff:+.4g}, {self.max_diff:+.4g}] std {self.std_diff:.2g}" if len(self.diffs) > 1 else ""
        return f"{self.mean_diff:+.4g}{spread}"

    def target_text(self) -> str:
        if self.target is None:
            return ""
        bound = {"both": f"|diff| <= {self.target:g}", "higher": f"diff >= -{self.target:g}",
                 "lower": f"diff <= {self.target:g}"}[self.direction]
        return f"{bound}: {'met' if self.met else 'NOT met'}"


def _sum(runs, attr):
    return sum(len(getattr(r, attr)) if isinstance(getattr(r, attr), list) else getattr(r, attr) for r in runs)


def _norm_summary(runs) -> tuple[float, float]:
    finite = [g for r in runs for g in r.grad_norms if math.isfinite(g)]
    return (statistics.median(finite), max(finite)) if finite else (math.nan, math.nan)


def _peak(runs) -> int | None:
    peaks = [r.peak_memory for r in runs if r.peak_memory is not None]
    return max(peaks) if peaks else None


def _mib(x: int | None) -> str:
    return "n/a" if x is None else f"{x / 2**20:.1f} MiB"


@dataclass
class ParityResult:
    """One recipe against FP32. ``baseline`` / ``recipe``: the first seed's
    runs; ``baselines`` / ``runs``: every seed's. The gaps are the worst over
    the seeds; a recipe with ``k`` times the batch is compared at each of its
    steps with the mean of FP32's losses on the same ``k`` batches."""

    baseline: RunResult
    recipe: RunResult
    recipe_name: str
    max_rel_gap: float  # over the steps both runs took with finite losses
    final_rel_gap: float
    overflow: list[str] = field(default_factory=list)  # the guard's reports, one per skipped step
    fallbacks: list[str] = field(default_factory=list)
    png: str | None = None
    spec: Recipe | None = None
    seeds: list[int | None] = field(default_factory=lambda: [None])
    baselines: list[RunResult] = field(default_factory=list)
    runs: list[RunResult] = field(default_factory=list)
    metrics: dict[str, MetricDiff] = field(default_factory=dict)
    untrained: dict[str, float] = field(default_factory=dict)  # evaluate() before training (FP32, first seed)

    def __post_init__(self):
        self.baselines = self.baselines or [self.baseline]
        self.runs = self.runs or [self.recipe]

    @property
    def met(self) -> bool | None:
        """Every target met (None without targets)."""
        flags = [m.met for m in self.metrics.values() if m.met is not None]
        return all(flags) if flags else None

    def __str__(self) -> str:
        b, r, name = self.baselines, self.runs, self.recipe_name
        k = r[0].batch_multiplier
        seeds = "" if self.seeds == [None] else f", seeds {', '.join(map(str, self.seeds))}"
        b_sps = statistics.median(x.steps_per_s for x in b)
        r_sps = statistics.median(x.steps_per_s for x in r)
        lines = [
            f"parity of {name} with FP32 over {len(b[0].losses)} steps{seeds}:"
            + (f" ({name}: {len(r[0].losses)} steps of {k}x the batch)" if k > 1 else ""),
            f"  loss: FP32 first {self.baseline.losses[0]:.5g} final {self.baseline.losses[-1]:.5g}; "
            f"{name} first {self.recipe.losses[0]:.5g} final {self.recipe.losses[-1]:.5g}",
            f"  relative loss gap: max {self.max_rel_gap:.3g}, final {self.final_rel_gap:.3g}",
            f"  skipped steps: FP32 {_sum(b, 'skipped')}, {name} {_sum(r, 'skipped')}"
            + (f" (steps {self.recipe.skipped[:10]}{' ...' if len(self.recipe.skipped) > 10 else ''})"
               if self.recipe.skipped and len(r) == 1 else ""),
            f"  steps/s: FP32 {b_sps:.3g}, {name} {r_sps:.3g} ({r_sps / b_sps:.2f}x"
            + (f"; samples/s {k * r_sps / b_sps:.2f}x)" if k > 1 else ")"),
            f"  peak memory ({self.baseline.memory_source}): FP32 {_mib(_peak(b))}, {name} {_mib(_peak(r))}",
            f"  non-finite steps: loss FP32 {_sum(b, 'nonfinite_losses')}, {name} {_sum(r, 'nonfinite_losses')}; "
            f"gradient FP32 {_sum(b, 'nonfinite_grads')}, {name} {_sum(r, 'nonfinite_grads')}",
            "  gradient norm (unscaled, median / max): FP32 {:.3g} / {:.3g}, {} {:.3g} / {:.3g}".format(
                *_norm_summary(b), name, *_norm_summary(r)),
        ]
        for m in self.metrics.values():
            lines.append(
                f"  {m.name}: FP32 {statistics.fmean(m.fp32):.4g}, {name} {statistics.fmean(m.recipe):.4g}, "
                f"diff {m.describe()}" + (f"; target {m.target_text()}" if m.target is not None else ""))
        lines += [f"  overflow: {o}" for o in self.overflow[:5]]
        lines += [f"  fallback: {f}" for f in self.fallbacks]
        if self.png:
            lines.append(f"  curves: {self.png}")
        return "\n".join(lines)


@dataclass
class ParityReport:
    """Several recipes against the same FP32 runs: ``results`` (one
    ``ParityResult`` per recipe, in the order given; ``report["bf16"]``),
    ``baselines`` (FP32, one per seed), ``untrained`` (``evaluate`` of the
    untrained FP32 model of the first seed)."""

    results: list[ParityResult]
    baselines: list[RunResult]
    seeds: list[int | None]
    untrained: dict[str, float] = field(default_factory=dict)
    png: str | None = None

    def __getitem__(self, name: str) -> ParityResult:
        for r in self.results:
            if r.recipe_name == name:
                return r
        raise KeyError(name)

    def __iter__(self):
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    @property
    def met(self) -> bool | None:
        """Every recipe met every target (None without targets)."""
        flags = [r.met for r in self.results if r.met is not None]
        return all(flags) if flags else None

    def __str__(self) -> str:
        b = self.baselines
        b_sps = statistics.median(x.steps_per_s for x in b)
        names = list(self.results[0].metrics) if self.results else []
        seeds = "1 run" if self.seeds == [None] else f"seeds {', '.join(map(str, self.seeds))}"
        head = ["recipe", "steps"] + [f"{n} diff" for n in names] + [
            "skipped", "non-finite loss/grad", "grad norm med/max", "peak memory", "steps/s", "samples/s vs FP32",
            "max loss gap"]
        rows = [head]

        def row(name, runs, metric_cells, gap):
            k = runs[0].batch_multiplier
            sps = statistics.median(x.steps_per_s for x in runs)
            med, mx = _norm_summary(runs)
            return [name, str(len(runs[0].losses))] + metric_cells + [
                str(_sum(runs, "skipped")), f"{_sum(runs, 'nonfinite_losses')}/{_sum(runs, 'nonfinite_grads')}",
                f"{med:.3g}/{mx:.3g}", _mib(_peak(runs)), f"{sps:.3g}", f"{k * sps / b_sps:.2f}x", gap]

        base_cells = [f"{statistics.fmean(self.results[0].metrics[n].fp32):.4g} (FP32)" for n in names]
        rows.append(row("FP32", b, base_cells, "-"))
        for r in self.results:
            cells = []
            for n in names:
                m = r.metrics[n]
                cells.append(m.describe() + (f" {'met' if m.met else 'NOT met'}" if m.target is not None else ""))
            rows.append(row(r.recipe_name, r.runs, cells, f"{r.max_rel_gap:.3g}"))
        widths = [max(len(x[i]) for x in rows) for i in range(len(head))]
        lines = [f"parity with FP32 of {len(self.results)} recipe(s), {seeds}, memory: {b[0].memory_source}:"]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(x, widths)).rstrip() for x in rows]
        for r in self.results:
            for m in r.metrics.values():
                if m.target is not None:
                    lines.append(f"  {r.recipe_name} {m.name}: target {m.target_text()}")
            lines += [f"  {r.recipe_name} overflow: {o}" for o in r.overflow[:3]]
            lines += [f"  {r.recipe_name} fallback: {f}" for f in r.fallbacks]
        if self.untrained:
            lines.append("  untrained FP32: " + ", ".join(f"{k} {v:.4g}" for k, v in self.untrained.items()))
        if self.png:
            lines.append(f"  curves: {self.png}")
        return "\n".join(lines)


# ---- peak memory ------------------------------------------------------------------


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _heap_probe() -> Callable[[], int] | None:
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2

    def in_use() -> int:
        m = fn()
        return int(m.uordblks + m.hblkhd)

    return in_use


class _PeakHeap(TorchDispatchMode):
    def __init__(self, probe):
        super().__init__()
        self.probe = probe
        self.peak = probe()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.peak = max(self.peak, self.probe())
        return out


# ---- one run -------------------------------------------------------------------------


def _to(batch, device, dtype=None):
    if isinstance(batch, torch.Tensor):
        t = batch.to(device)
        return t.to(dtype) if dtype is not None and t.is_floating_point() else t
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to(b, device, dtype) for b in batch)
    if isinstance(batch, dict):
        return {k: _to(v, device, dtype) for k, v in batch.items()}
    return batch


def _cast(x, dtype):
    if isinstance(x, torch.Tensor):
        return x.to(dtype) if x.is_floating_point() else x
    if isinstance(x, (tuple, list)):
        return type(x)(_cast(v, dtype) for v in x)
    if isinstance(x, dict):
        return {k: _cast(v, dtype) for k, v in x.items()}
    return x


def _concat(items: list):
    """``k`` inputs (or targets) as one: see ``<k>x`` in the module docstring."""
    first = items[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(items)
    if isinstance(first, dict):
        return {key: _concat([it[key] for it in items]) for key in first}
    if isinstance(first, tuple):
        return tuple(_concat(list(z)) for z in zip(*items))
    return [e for it in items for e in it]


def _scaled_lr(rule: LrScale, lr: float, k: int) -> float:
    return lr * rule if isinstance(rule, float) else rule(lr, k)


def _apply_lr(opt, rule: LrScale | None, k: int) -> None:
    if rule is None:
        return
    for g in opt.param_groups:
        lr = g["lr"]
        new = _scaled_lr(rule, float(lr), k)
        g["lr"] = torch.as_tensor(new, dtype=lr.dtype, device=lr.device) if isinstance(lr, torch.Tensor) else new


def _grad_norm(opt) -> float:
    grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
    if not grads:
        return 0.0
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.detach().float()) for g in grads])))


def _run(name, model, data, loss_fn, make_opt, device, spec: Recipe | None, guard_on, lr_rule, seed):
    """Trains ``model`` on ``data`` (a list of groups of ``k`` batches) as
    ``spec`` says (None: the FP32 baseline); returns (RunResult, guard)."""
    from . import amp as _amp
    from .guard import ForwardGuard

    low, params_cast = (spec.dtype, spec.params_cast) if spec is not None else (None, False)
    bits = spec.act_bits if spec is not None else None
    k = spec.batch_multiplier if spec is not None else 1
    if params_cast:
        model = model.to(low)
    opt = make_opt(model.parameters())
    _apply_lr(opt, lr_rule, k)
    scaler = _amp.GradScaler(device.type, enabled=low == torch.float16, diagnostics=True)
    guard = None
    if low is not None and guard_on:
        guard = ForwardGuard(model, fallback=True, optimizer=opt)
        if scaler.is_enabled():
            guard.attach(scaler)
    if bits is not None:
        from .memory import compressed_activations
    cuda = device.type == "cuda"
    probe = None if cuda else _heap_probe()
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    if seed is not None:
        torch.manual_seed(seed)  # the same dropout stream for every recipe of this seed
    losses, skipped, times, norms = [], [], [], []
    peak = None
    n = len(data)
    for i, group in enumerate(data):
        if k == 1:
            x, y = group[0]
        else:
            x, y = _concat([b[0] for b in group]), _concat([b[1] for b in group])
        x, y = _to(x, device, low if params_cast else None), _to(y, device)
        mode = _PeakHeap(probe) if (probe is not None and i == n - 1) else None
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        if mode is not None:
            mode.__enter__()
        try:
            with torch.autocast(device.type, dtype=low, enabled=low is not None and not params_cast):
                if bits is not None:
                    with compressed_activations(bits=bits, seed=seed or 0):
                        out = model(x)
                        loss = loss_fn(out.float() if isinstance(out, torch.Tensor) else out, y)
                else:
                    out = model(x)
                    loss = loss_fn(out.float() if isinstance(out, torch.Tensor) else out, y)
            before = scaler.get_skipped_steps() if scaler.is_enabled() else 0
            scaler.scale(loss).backward()
            t_norm = time.perf_counter()
            norm = _grad_norm(opt) / (scaler.get_scale() if scaler.is_enabled() else 1.0)
            t_norm = time.perf_counter() - t_norm
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            if guard is not None and not scaler.is_enabled():
                guard.step(loss=loss)
        finally:
            if mode is not None:
                mode.__exit__(None, None, None)
        if cuda:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0 - t_norm)
        losses.append(loss.item())
        norms.append(norm)
        if scaler.is_enabled():
            if scaler.get_skipped_steps() > before:
                skipped.append(i)
        elif not math.isfinite(losses[-1]):
            skipped.append(i)
        if mode is not None:
            peak = mode.peak
    timed = times[1:-1] if len(times) > 2 else times
    sps = 1.0 / statistics.median(timed)
    if cuda:
        peak, source = torch.cuda.max_memory_allocated(device), "torch.cuda.max_memory_allocated"
    else:
        source = "glibc mallinfo2 heap in use, sampled per aten op" if probe is not None else "unavailable"
    result = RunResult(name, losses, skipped, sps, peak, source, seed, k,
                       sum(not math.isfinite(v) for v in losses), sum(not math.isfinite(v) for v in norms), norms)
    if guard is not None:
        guard.remove()  # the evaluation is no training step; the fallbacks stay
    return result, guard, model


def _evaluate(evaluate, model, spec: Recipe | None, device) -> dict[str, float]:
    """``evaluate(model)`` as the recipe runs the model: see the module docstring."""
    low = spec.dtype if spec is not None else None
    modes = [(m, m.training) for m in model.modules()]
    handles = []
    if spec is not None and spec.params_cast:
        handles.append(model.register_forward_pre_hook(lambda m, a, kw: (_cast(a, low), _cast(kw, low)),
                                                       with_kwargs=True))
        handles.append(model.register_forward_hook(lambda m, a, out: _cast(out, torch.float32)))
    model.eval()
    try:
        with torch.no_grad(), torch.autocast(device.type, dtype=low, enabled=low is not None and not spec.params_cast):
            out = evaluate(model)
    finally:
        for h in handles:
            h.remove()
        for m, t in modes:
            m.training = t
    return _metrics(out)


def _metrics(out) -> dict[str, float]:
    what = "evaluate must return a dict of metric name -> number (e.g. {'accuracy': 0.91})"
    if not isinstance(out, collections.abc.Mapping):
        raise TypeError(f"{_W}: {what}, got {type(out).__name__}")
    if not out:
        raise ValueError(f"{_W}: {what}, got an empty dict")
    res = {}
    for key, v in out.items():
        if not isinstance(key, str):
            raise TypeError(f"{_W}: {what}, got the key {key!r}")
        if isinstance(v, torch.Tensor) and v.numel() == 1 and not v.is_complex() and v.dtype is not torch.bool:
            v = v.item()
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"{_W}: {what}, got {key!r}: {type(v).__name__} {v!r}")
        res[key] = float(v)
    return res


# ---- arguments ------------------------------------------------------------------------


def _specs(recipe, lr_scale) -> list[Recipe]:
    items = list(recipe) if isinstance(recipe, (list, tuple)) else [recipe]
    if not items:
        raise ValueError(f"{_W}: recipe is an empty list")
    rule = None if lr_scale is None else _lr_rule("lr_scale", lr_scale)
    specs = []
    for i, r in enumerate(items):
        at = "recipe" if len(items) == 1 and not isinstance(recipe, (list, tuple)) else f"recipe[{i}]"
        if isinstance(r, str):
            r = Recipe.parse(r)
        elif not isinstance(r, Recipe):
            raise TypeError(
                f"{_W}: {at}: recipe must be a str (one of {sorted(_RECIPES)}...), a mixprec.parity.Recipe or a "
                f"list of them, got {type(r).__name__} {r!r}")
        else:
            if not isinstance(r.name, str) or not r.name:
                raise TypeError(f"{_W}: {at}.name must be a non-empty str, got {r.name!r}")
            if r.dtype not in (None, torch.float16, torch.bfloat16):
                raise ValueError(
                    f"{_W}: {at}.dtype must be None (FP32), torch.float16 or torch.bfloat16, got {r.dtype!r}")
            if not isinstance(r.params_cast, bool) or (r.params_cast and r.dtype is None):
                raise ValueError(
                    f"{_W}: {at}.params_cast must be a bool, True only with a dtype, got {r.params_cast!r}")
            if r.act_bits is not None and (isinstance(r.act_bits, bool) or r.act_bits not in (8, 4)):
                raise ValueError(f"{_W}: {at}.act_bits must be None, 8 or 4, got {r.act_bits!r}")
            r = dataclasses.replace(r, batch_multiplier=as_int(_W, f"{at}.batch_multiplier", r.batch_multiplier, low=1),
                                    act_bits=None if r.act_bits is None else int(r.act_bits))
            if r.lr_scale is not None:
                r = dataclasses.replace(r, lr_scale=_lr_rule(f"{at}.lr_scale", r.lr_scale))
        if r.lr_scale is None and r.batch_multiplier > 1 and rule is not None:
            r = dataclasses.replace(r, lr_scale=rule)
        specs.append(r)
    names = [s.name for s in specs]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise ValueError(f"{_W}: recipe names must differ, {dup!r} is given twice")
    return specs


def _lr_rule(name, v) -> LrScale:
    if callable(v) and not isinstance(v, (numbers.Real, torch.Tensor)):
        return v
    return as_float(_W, name, v, above=0.0)


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


def _order(batches, steps: int, seed: int | None) -> list:
    """The batches of one seed's runs: cyclic in the given order (unseeded) or a
    new seeded permutation for each pass."""
    n = len(batches)
    if seed is None:
        return [batches[i % n] for i in range(steps)]
    g = torch.Generator().manual_seed(seed)
    idx: list[int] = []
    while len(idx) < steps:
        idx += torch.randperm(n, generator=g).tolist()
    return [batches[i] for i in idx[:steps]]


def _build(make_model, seed):
    if seed is not None:
        torch.manual_seed(seed)
    model = make_model()
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{_W}: make_model must return a torch.nn.Module, got {type(model).__name__}")
    return model


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


def _gaps(base: list[float], rec: list[float], k: int) -> tuple[float, float]:
    ref = [statistics.fmean(base[j * k:(j + 1) * k]) for j in range(len(rec))]
    gaps = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(rec, ref) if math.isfinite(a) and math.isfinite(b)]
    return (max(gaps) if gaps else math.nan), abs(rec[-1] - ref[-1]) / max(abs(ref[-1]), 1e-12)


def _worst(values: list[float]) -> float:
    return math.nan if any(math.isnan(v) for v in values) else max(values)


# ---- the comparison -------------------------------------------------------------------


def parity(
    make_model: Callable[[], torch.nn.Module],
    batches: Sequence[Any],
    *,
    recipe: str | Recipe | Sequence[str | Recipe] = "fp16",
    loss_fn: Callable[[Any, Any], torch.Tensor] = F.cross_entropy,
    optimizer: Callable[[Any], torch.optim.Optimizer] | None = None,
    steps: int | None = None,
    guard: bool = False,
    device: torch.device | str | None = None,
    png: str | None = None,
    evaluate: Callable[[torch.nn.Module], dict[str, float]] | None = None,
    seeds: int | Sequence[int] = 1,
    targets: dict[str, float | tuple[float, str]] | None = None,
    lr_scale: LrScale | None = None,
) -> ParityResult | ParityReport:
    """Trains ``make_model()`` in FP32 and with each recipe from the same
    initial weights on the same ``batches`` (``(input, target)`` pairs,
    reused cyclically up to ``steps``), for each seed; see the module
    docstring. Returns a ``ParityResult`` when ``recipe`` is one name or
    ``Recipe``, a ``ParityReport`` when it is a list."""
    specs, steps, seed_list, tg = _check_parity_args(
        make_model, batches, recipe, loss_fn, optimizer, steps, guard, device, png, evaluate, seeds, targets, lr_scale)
    make_opt = optimizer or (lambda ps: torch.optim.AdamW(ps, lr=1e-3))
    probe = _heap_probe()
    base_heap = probe() if probe else 0
    rng = _rng_state()
    try:
        model = _build(make_model, seed_list[0])
        dev = torch.device(device) if device is not None else next(model.parameters()).device
        model = model.to(dev)
        untrained = _check_built(model, make_opt, specs, evaluate, tg, dev)
    except BaseException:
        _set_rng_state(rng)  # a refused call leaves the random state as it found it
        raise
    try:
        results, baselines = _compare(model, make_model, batches, specs, steps, seed_list, tg, loss_fn, make_opt,
                                      dev, guard, evaluate, untrained, probe, base_heap)
    finally:
        if seed_list != [None]:
            _set_rng_state(rng)  # seeded runs leave the caller's random state as it was
    single = not isinstance(recipe, (list, tuple))
    out = results[0] if single else ParityReport(results, baselines, list(seed_list), untrained)
    if png:
        _plot(results, baselines, png)
        out.png = png
        for r in results:
            r.png = png
    return out


def _rng_state():
    return torch.get_rng_state(), (torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None)


def _set_rng_state(state) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state_all(state[1])


def _compare(model, make_model, batches, specs, steps, seed_list, tg, loss_fn, make_opt, dev, guard, evaluate,
             untrained, probe, base_heap) -> tuple[list[ParityResult], list[RunResult]]:
    """The runs of every seed, FP32's first, and their comparison."""

    baselines: list[RunResult] = []
    runs: dict[str, list[RunResult]] = {s.name: [] for s in specs}
    guards: dict[str, list] = {s.name: [] for s in specs}
    for si, seed in enumerate(seed_list):
        if si > 0:
            model = _build(make_model, seed).to(dev)
        start = copy.deepcopy(model.state_dict())
        data = _order(batches, steps, seed)
        base, _, model = _run("fp32", model, [[b] for b in data], loss_fn, make_opt, dev, None, False, None, seed)
        if evaluate is not None:
            base.metrics = _evaluate(evaluate, model, None, dev)
        baselines.append(base)
        del model
        for spec in specs:
            m = _build(make_model, seed).to(dev)
            m.load_state_dict(start)
            k = spec.batch_multiplier
            groups = [data[j:j + k] for j in range(0, steps, k)]
            rec, g, m = _run(spec.name, m, groups, loss_fn, make_opt, dev, spec, guard, spec.lr_scale, seed)
            if evaluate is not None:
                rec.metrics = _evaluate(evaluate, m, spec, dev)
            runs[spec.name].append(rec)
            guards[spec.name].append(g)
            del m
        model = None
        del start
    if probe is not None and dev.type != "cuda":
        for r in baselines + [r for rs in runs.values() for r in rs]:
            r.peak_memory = None if r.peak_memory is None else r.peak_memory - base_heap

    results = []
    for spec in specs:
        rs = runs[spec.name]
        gaps = [_gaps(b.losses, r.losses, spec.batch_multiplier) for b, r in zip(baselines, rs)]
        overflow, fallbacks = [], []
        for seed, g in zip(seed_list, guards[spec.name]):
            if g is None:
                continue
            tag = f"seed {seed}: " if len(seed_list) > 1 else ""
            overflow += [tag + str(r) for r in g.reports()]
            fallbacks += [f"{tag}{e.module} -> {e.dtype} after step {e.step} ({e.why})" for e in g.events]
        metrics = {}
        for name in (untrained if evaluate is not None else ()):
            t, d = tg.get(name, (None, "both"))
            metrics[name] = MetricDiff(name, [b.metrics.get(name, math.nan) for b in baselines],
                                       [r.metrics.get(name, math.nan) for r in rs], t, d)
        results.append(ParityResult(
            baselines[0], rs[0], spec.name, _worst([g[0] for g in gaps]), _worst([g[1] for g in gaps]),
            overflow, fallbacks, None, spec, list(seed_list), list(baselines), rs, metrics, untrained))
    return results, baselines


def _plot(results: list[ParityResult], baselines: list[RunResult], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def finite(v):
        return [x if math.isfinite(x) else float("nan") for x in v]

    fig, ax = plt.subplots(figsize=(8, 4.5))
    colors = ["tab:orange", "tab:blue", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan"]
    for i, b in enumerate(baselines):
        ax.plot(range(len(b.losses)), finite(b.losses), color="black", alpha=1.0 if i == 0 else 0.4,
                label="FP32" if i == 0 else None)
    for ci, r in enumerate(results):
        for i, run in enumerate(r.runs):
            k = run.batch_multiplier
            # a step of k batches is drawn at the first of its k FP32 steps
            ax.plot([j * k for j in range(len(run.losses))], finite(run.losses), color=colors[ci % len(colors)],
                    linestyle="--", alpha=1.0 if i == 0 else 0.4, label=r.recipe_name if i == 0 else None)
    if len(results) == 1:
        for s in results[0].recipe.skipped:
            ax.axvline(s * results[0].recipe.batch_multiplier, color="tab:red", alpha=0.25, linewidth=1)
    ax.set_xlabel("FP32 step (batches seen)")
    ax.set_ylabel("loss")
    if len(results) == 1 and len(baselines) == 1:
        r = results[0]
        ax.set_title(f"FP32 vs {r.recipe_name}: max rel. gap {r.max_rel_gap:.2g}, "
                     f"{len(r.recipe.skipped)} skipped (red)")
    else:
        ax.set_title(f"FP32 vs {len(results)} recipe(s), {len(baselines)} seed(s) (the first seed opaque)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _target_arg(text: str) -> tuple[str, tuple[str, str]]:
    name, eq, rest = text.partition("=")
    value, _, direction = rest.partition(":")
    if not eq or not name:
        raise argparse.ArgumentTypeError(f"--target must be name=tolerance[:higher|lower], got {text!r}")
    try:
        tol = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--target {text!r}: {value!r} is not a number") from None
    return name, (tol, direction or "both")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mixprec.parity", description=__doc__.split("\n\n")[0])
    ap.add_argument("setup", help="pkg.module:function returning dict(make_model=..., batches=..., ...)")
    ap.add_argument("--recipe", action="append", default=None,
                    help="a recipe (fp16, bf16, fp16-params, bf16-params, fp32, with +act8/+act4/+<k>x); repeat it "
                         "or give a comma list for several (default fp16)")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--seeds", type=int, default=1, help="run seeds 0..N-1 (default 1: one unseeded run)")
    ap.add_argument("--target", action="append", type=_target_arg, default=[],
                    help="name=tolerance[:higher|lower] for a metric of setup()'s evaluate; repeatable")
    ap.add_argument("--batch-multiplier", type=int, default=None, help="every recipe with k times the batch (+<k>x)")
    ap.add_argument("--lr-scale", type=float, default=None, help="lr factor for the recipes with k > 1")
    ap.add_argument("--guard", action="store_true", help="put a ForwardGuard with the fallback on the recipe's model")
    ap.add_argument("--png", default=None)
    a = ap.parse_args(argv)
    names = [n.strip() for r in (a.recipe or ["fp16"]) for n in r.split(",") if n.strip()]
    if a.batch_multiplier is not None:
        k = as_int(_W, "--batch-multiplier", a.batch_multiplier, low=1)
        names = [n if k == 1 or any(_MULT.fullmatch(m) for m in n.split("+")[1:]) else f"{n}+{k}x" for n in names]
    mod, _, fn = a.setup.partition(":")
    setup = getattr(importlib.import_module(mod), fn or "setup")()
    kw = {k: setup[k] for k in ("loss_fn", "optimizer", "device", "evaluate", "targets") if k in setup}
    if a.target:
        kw["targets"] = {**kw.get("targets", {}), **dict(a.target)}
    one = a.recipe is not None and len(a.recipe) == 1 and "," not in a.recipe[0]
    result = parity(setup["make_model"], setup["batches"], recipe=names[0] if (one or a.recipe is None) else names,
                    steps=a.steps, guard=a.guard, png=a.png, seeds=a.seeds, lr_scale=a.lr_scale, **kw)
    print(result)
    return 0 if result.met is not False else 1


if __name__ == "__main__":
    sys.exit(main())
