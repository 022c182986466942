"""Parity of a mixed-precision recipe with FP32 on the user's own model.

``parity(make_model, batches, recipe="fp16")`` builds the model twice from
the same initial weights, trains the FP32 baseline and the recipe on the same
batches for the same steps, and reports what the AMP playbook asks for: the
loss curves side by side (largest and final relative gap), the skipped steps,
the forward-overflow report (``mixprec.guard``), steps/s and peak memory of
each, and a PNG of the curves::

    result = mixprec.parity.parity(lambda: MyNet(), batches, recipe="fp16",
                                   optimizer=lambda ps: mixprec.optim.AdamW(ps, lr=1e-3),
                                   guard=True, png="parity.png")
    print(result)

Recipes: ``"fp16"`` / ``"bf16"``: autocast to that dtype, FP32 parameters,
``mixprec.amp.GradScaler`` (FP16; BF16 runs unscaled); ``"fp16-params"`` /
``"bf16-params"``: the model cast with ``.half()`` / ``.bfloat16()`` (use a
master-weight optimizer such as ``mixprec.optim.AdamW``), inputs cast to it,
the loss computed on FP32 outputs. ``guard=True`` puts a
``mixprec.guard.ForwardGuard`` with the fallback on the recipe's model.

Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` (torch's caching
allocator) over the run. On the CPU torch keeps no allocator statistics; the
figure is glibc's ``mallinfo2()`` (bytes in use: ``uordblks + hblkhd``)
sampled after every aten op of one training step (the last), minus its value
before the model was built: the process's heap, which is what the CPU
allocator draws from (peaks inside a single op are missed). None where
glibc is not the allocator.

CLI: ``python -m mixprec.parity pkg.module:setup --recipe fp16 --steps 20
--png out.png`` where ``setup()`` returns a dict with ``make_model``,
``batches`` and optionally ``loss_fn``, ``optimizer``, ``device``.
"""

from __future__ import annotations

import argparse
import collections.abc
import copy
import ctypes
import importlib
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from ._args import as_int

__all__ = ["parity", "ParityResult", "RunResult"]

_RECIPES = {
    "fp16": (torch.float16, False),
    "bf16": (torch.bfloat16, False),
    "fp16-params": (torch.float16, True),
    "bf16-params": (torch.bfloat16, True),
}


@dataclass
class RunResult:
    name: str
    losses: list[float]
    skipped: list[int]  # steps whose optimizer step was skipped (0-based)
    steps_per_s: float  # median over the timed steps (all but the first and the last)
    peak_memory: int | None  # bytes, see the module docstring
    memory_source: str


@dataclass
class ParityResult:
    baseline: RunResult
    recipe: RunResult
    recipe_name: str
    max_rel_gap: float  # over the steps both runs took with finite losses
    final_rel_gap: float
    overflow: list[str] = field(default_factory=list)  # the guard's reports, one per skipped step
    fallbacks: list[str] = field(default_factory=list)
    png: str | None = None

    def __str__(self) -> str:
        b, r = self.baseline, self.recipe

        def mem(x):
            return "n/a" if x.peak_memory is None else f"{x.peak_memory / 2**20:.1f} MiB"

        lines = [
            f"parity of {self.recipe_name} with FP32 over {len(b.losses)} steps:",
            f"  loss: FP32 first {b.losses[0]:.5g} final {b.losses[-1]:.5g}; "
            f"{self.recipe_name} first {r.losses[0]:.5g} final {r.losses[-1]:.5g}",
            f"  relative loss gap: max {self.max_rel_gap:.3g}, final {self.final_rel_gap:.3g}",
            f"  skipped steps: FP32 {len(b.skipped)}, {self.recipe_name} {len(r.skipped)}"
            + (f" (steps {r.skipped[:10]}{' ...' if len(r.skipped) > 10 else ''})" if r.skipped else ""),
            f"  steps/s: FP32 {b.steps_per_s:.3g}, {self.recipe_name} {r.steps_per_s:.3g} "
            f"({r.steps_per_s / b.steps_per_s:.2f}x)",
            f"  peak memory ({b.memory_source}): FP32 {mem(b)}, {self.recipe_name} {mem(r)}",
        ]
        lines += [f"  overflow: {o}" for o in self.overflow[:5]]
        lines += [f"  fallback: {f}" for f in self.fallbacks]
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


def _run(name, model, batches, loss_fn, make_opt, device, recipe, guard_on):
    from . import amp as _amp
    from .guard import ForwardGuard

    low, params_cast = _RECIPES[recipe] if recipe else (None, False)
    if params_cast:
        model = model.to(low)
    opt = make_opt(model.parameters())
    scaler = _amp.GradScaler(device.type, enabled=low == torch.float16, diagnostics=True)
    guard = None
    if recipe and guard_on:
        guard = ForwardGuard(model, fallback=True, optimizer=opt)
        if scaler.is_enabled():
            guard.attach(scaler)
    cuda = device.type == "cuda"
    probe = None if cuda else _heap_probe()
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    losses, skipped, times = [], [], []
    peak = None
    n = len(batches)
    for i, (x, y) in enumerate(batches):
        x, y = _to(x, device, low if params_cast else None), _to(y, device)
        mode = _PeakHeap(probe) if (probe is not None and i == n - 1) else None
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        if mode is not None:
            mode.__enter__()
        try:
            with torch.autocast(device.type, dtype=low, enabled=bool(recipe) and not params_cast):
                out = model(x)
            loss = loss_fn(out.float() if isinstance(out, torch.Tensor) else out, y)
            before = scaler.get_skipped_steps() if scaler.is_enabled() else 0
            scaler.scale(loss).backward()
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
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
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
    result = RunResult(name, losses, skipped, sps, peak, source)
    return result, guard


def _check_parity_args(make_model, batches, recipe, loss_fn, optimizer, steps, guard, device, png) -> int:
    """Every argument of ``parity`` checked before anything trains; returns the step count."""
    w = "mixprec.parity"
    if not isinstance(recipe, str):
        raise TypeError(f"{w}: recipe must be a str, one of {sorted(_RECIPES)}, got {type(recipe).__name__} {recipe!r}")
    if recipe not in _RECIPES:
        raise ValueError(f"{w}: recipe must be one of {sorted(_RECIPES)}, got {recipe!r}")
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
    if not callable(loss_fn):
        raise TypeError(f"{w}: loss_fn must be callable (output, target) -> loss, got {type(loss_fn).__name__}")
    if optimizer is not None and (isinstance(optimizer, torch.optim.Optimizer) or not callable(optimizer)):
        raise TypeError(
            f"{w}: optimizer must be a function params -> optimizer (e.g. lambda ps: torch.optim.AdamW(ps)), got "
            f"{type(optimizer).__name__}" + (" (an optimizer instance: each run needs its own)"
                                            if isinstance(optimizer, torch.optim.Optimizer) else "")
        )
    steps = len(batches) if steps is None else as_int(w, "steps", steps, low=1)
    if not isinstance(guard, bool):
        raise TypeError(f"{w}: guard must be a bool, got {type(guard).__name__} {guard!r}")
    if device is not None:
        if not isinstance(device, (str, torch.device)):
            raise TypeError(f"{w}: device must be a str or torch.device, got {type(device).__name__}")
        try:
            torch.device(device)
        except RuntimeError as e:
            raise ValueError(f"{w}: device {device!r} is not a device: {e}") from None
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
    return steps


def parity(
    make_model: Callable[[], torch.nn.Module],
    batches: Sequence[Any],
    *,
    recipe: str = "fp16",
    loss_fn: Callable[[Any, Any], torch.Tensor] = F.cross_entropy,
    optimizer: Callable[[Any], torch.optim.Optimizer] | None = None,
    steps: int | None = None,
    guard: bool = False,
    device: torch.device | str | None = None,
    png: str | None = None,
) -> ParityResult:
    """Trains ``make_model()`` in FP32 and with ``recipe`` from the same
    initial weights on the same ``batches`` (``(input, target)`` pairs,
    reused cyclically up to ``steps``); see the module docstring."""
    steps = _check_parity_args(make_model, batches, recipe, loss_fn, optimizer, steps, guard, device, png)
    data = [batches[i % len(batches)] for i in range(steps)]
    make_opt = optimizer or (lambda ps: torch.optim.AdamW(ps, lr=1e-3))
    probe = _heap_probe()
    base_heap = probe() if probe else 0
    model = make_model()
    dev = torch.device(device) if device is not None else next(model.parameters()).device
    model = model.to(dev)
    start = copy.deepcopy(model.state_dict())
    base, _ = _run("fp32", model, data, loss_fn, make_opt, dev, None, False)
    del model
    model = make_model().to(dev)
    model.load_state_dict(start)
    rec, g = _run(recipe, model, data, loss_fn, make_opt, dev, recipe, guard)
    if probe is not None and dev.type != "cuda":
        for r in (base, rec):
            r.peak_memory = None if r.peak_memory is None else r.peak_memory - base_heap
    gaps = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(rec.losses, base.losses)
            if math.isfinite(a) and math.isfinite(b)]
    result = ParityResult(
        base, rec, recipe,
        max(gaps) if gaps else math.nan,
        abs(rec.losses[-1] - base.losses[-1]) / max(abs(base.losses[-1]), 1e-12),
        [str(r) for r in g.reports()] if g is not None else [],
        [f"{e.module} -> {e.dtype} after step {e.step} ({e.why})" for e in g.events] if g is not None else [],
    )
    if png:
        _plot(result, png)
        result.png = png
    return result


def _plot(result: ParityResult, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    steps = range(len(result.baseline.losses))
    ax.plot(steps, result.baseline.losses, label="FP32", color="black")
    rl = [v if math.isfinite(v) else float("nan") for v in result.recipe.losses]
    ax.plot(steps, rl, label=result.recipe_name, color="tab:orange", linestyle="--")
    for s in result.recipe.skipped:
        ax.axvline(s, color="tab:red", alpha=0.25, linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(f"FP32 vs {result.recipe_name}: max rel. gap {result.max_rel_gap:.2g}, "
                 f"{len(result.recipe.skipped)} skipped (red)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mixprec.parity", description=__doc__.split("\n\n")[0])
    ap.add_argument("setup", help="pkg.module:function returning dict(make_model=..., batches=..., ...)")
    ap.add_argument("--recipe", default="fp16", choices=sorted(_RECIPES))
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--guard", action="store_true", help="put a ForwardGuard with the fallback on the recipe's model")
    ap.add_argument("--png", default=None)
    a = ap.parse_args(argv)
    mod, _, fn = a.setup.partition(":")
    setup = getattr(importlib.import_module(mod), fn or "setup")()
    kw = {k: setup[k] for k in ("loss_fn", "optimizer", "device") if k in setup}
    result = parity(setup["make_model"], setup["batches"], recipe=a.recipe, steps=a.steps, guard=a.guard,
                    png=a.png, **kw)
    print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
