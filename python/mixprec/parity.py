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
directory...): the error names ``mixprec.parity.parity`` and the argument, and
nothing was trained.

CLI: ``python -m mixprec.parity pkg.module:setup --recipe fp16,bf16 --recipe
bf16+2x --seeds 3 --target accuracy=0.005:higher --lr-scale 2 --steps 20
--png out.png`` where ``setup()`` returns a dict with ``make_model``,
``batches`` and optionally ``loss_fn``, ``optimizer``, ``device``,
``evaluate``, ``targets``. ``--batch-multiplier k`` gives every recipe named
``k`` times the batch (as ``+<k>x``). Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ._parity_checks import _check_built, _check_parity_args
from ._parity_run import _evaluate, _heap_probe, _run
from ._parity_types import _MULT, _W, LrScale, MetricDiff, ParityReport, ParityResult, Recipe, RunResult

__all__ = ["parity", "Recipe", "ParityResult", "ParityReport", "RunResult", "MetricDiff"]


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


def _count_arg(text: str) -> int:
    """An option that counts (--steps, --seeds, --batch-multiplier): an
    integer >= 1, else argparse's usage error naming the option (exit 2)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mixprec.parity", description=__doc__.split("\n\n")[0])
    ap.add_argument("setup", help="pkg.module:function returning dict(make_model=..., batches=..., ...)")
    ap.add_argument("--recipe", action="append", default=None,
                    help="a recipe (fp16, bf16, fp16-params, bf16-params, fp32, with +act8/+act4/+<k>x); repeat it "
                         "or give a comma list for several (default fp16)")
    ap.add_argument("--steps", type=_count_arg, default=None)
    ap.add_argument("--seeds", type=_count_arg, default=1, help="run seeds 0..N-1 (default 1: one unseeded run)")
    ap.add_argument("--target", action="append", type=_target_arg, default=[],
                    help="name=tolerance[:higher|lower] for a metric of setup()'s evaluate; repeatable")
    ap.add_argument("--batch-multiplier", type=_count_arg, default=None, help="every recipe with k times the batch (+<k>x)")
    ap.add_argument("--lr-scale", type=float, default=None, help="lr factor for the recipes with k > 1")
    ap.add_argument("--guard", action="store_true", help="put a ForwardGuard with the fallback on the recipe's model")
    ap.add_argument("--png", default=None)
    a = ap.parse_args(argv)
    names = [n.strip() for r in (a.recipe or ["fp16"]) for n in r.split(",") if n.strip()]
    if a.batch_multiplier is not None:
        k = a.batch_multiplier
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
