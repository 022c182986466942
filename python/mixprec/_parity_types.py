"""mixprec.parity's recipes and result types (see mixprec.parity)."""

from __future__ import annotations

import math
import numbers
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Union

import torch

from ._args import as_bool, as_choice, as_float, as_int, as_low_dtype, as_name

_W = "mixprec.parity.parity"  # the callable errors name (parity's arguments)
_W_PARSE = "mixprec.parity.Recipe.parse"
_W_RECIPE = "mixprec.parity.Recipe"

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

    def __post_init__(self):
        # checked when built (TypeError / ValueError naming the field), the numbers converted as parity uses them
        for key, value in _checked_fields(self, _W_RECIPE, "").items():
            object.__setattr__(self, key, value)

    @classmethod
    def parse(cls, spec: str) -> Recipe:
        """``"bf16"``, ``"fp16-params"``, ``"bf16+act8"``, ``"fp32+2x"``...
        (see the module docstring); TypeError for a non-str, ValueError for
        any other str."""
        if not isinstance(spec, str):
            raise TypeError(f"{_W_PARSE}: spec must be a str such as 'bf16+act8', got {type(spec).__name__} {spec!r}")
        return _parse(spec, _W_PARSE, "spec", cls)


def _lr_rule(where: str, name: str, v) -> LrScale:
    """A recipe's lr rule: a function ``f(lr, k)`` or a finite number > 0."""
    if callable(v) and not isinstance(v, (numbers.Real, torch.Tensor)):
        return v
    return as_float(where, name, v, above=0.0)


def _checked_fields(r: Recipe, where: str, at: str) -> dict[str, Any]:
    """The one check of a ``Recipe``'s fields (its constructor's, and
    ``parity``'s of a recipe built past it): errors name ``where`` and the
    field as ``<at><field>``; returns ``act_bits``, ``batch_multiplier``
    and ``lr_scale`` converted (``8.0`` -> ``8``, a tensor -> a float)."""
    as_name(where, f"{at}name", r.name)
    as_low_dtype(where, f"{at}dtype", r.dtype)
    if as_bool(where, f"{at}params_cast", r.params_cast) and r.dtype is None:
        raise ValueError(f"{where}: {at}params_cast=True needs a dtype (the parameters' low dtype)")
    bits = as_choice(where, f"{at}act_bits", r.act_bits, (8, 4))
    k = as_int(where, f"{at}batch_multiplier", r.batch_multiplier, low=1)
    rule = None if r.lr_scale is None else _lr_rule(where, f"{at}lr_scale", r.lr_scale)
    return {"act_bits": bits, "batch_multiplier": k, "lr_scale": rule}


def _parse(spec: str, where: str, name: str, cls: type[Recipe] | None = None) -> Recipe:
    """``Recipe.parse``, its errors naming the callable ``where`` and the argument ``name``."""
    base, *mods = spec.split("+")
    if base not in _BASES:
        raise ValueError(_recipe_grammar(spec, where, name))
    dtype, cast = _BASES[base]
    bits, k = None, 1
    for m in mods:
        mult = _MULT.fullmatch(m)
        if m in ("act8", "act4") and bits is None:
            bits = int(m[3:])
        elif mult and k == 1:
            k = int(mult.group(1))
        else:
            raise ValueError(_recipe_grammar(spec, where, name))
    return (cls or Recipe)(spec, dtype, cast, bits, k)


def _recipe_grammar(spec, where: str, name: str) -> str:
    return (f"{where}: {name} must be one of {sorted(_RECIPES)} (or 'fp32'), optionally followed by '+act8' or "
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

    def __post_init__(self):
        # checked when built: an unknown direction was a KeyError in target_text()
        w = "mixprec.parity.MetricDiff"
        if not isinstance(self.direction, str):
            raise TypeError(f"{w}: direction must be 'both', 'higher' or 'lower', got {type(self.direction).__name__} "
                            f"{self.direction!r}")
        if self.direction not in ("both", "higher", "lower"):
            raise ValueError(f"{w}: direction must be 'both', 'higher' or 'lower', got {self.direction!r}")

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
