"""The memory planner: what one training step of a model holds, per recipe,
and the largest batch that fits a budget. ``mixprec.memory.plan`` and
``python -m mixprec.memory``.

Each recipe runs one forward and backward at two small batch sizes on the
CPU under a live-tensor tracker (``_tracker.LiveTracker``); the bytes held
after the forward (what autograd saved, in the form it saved it) and the
peak of forward + backward are each a line in the batch size, extrapolated
to the batch asked. The training state (parameters, gradients, optimizer
state) is counted from the parameter count at the recipe's bytes per
parameter (torch AdamW on FP32 parameters: 16; mixprec's lean state: 8),
and the peak is taken over the run without the gradients backward leaves
in ``.grad`` (``LiveTracker.peak_excluding``), so they are not counted
twice and the peak is found where it falls without them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
from typing import Callable, Sequence

import torch
import torch.utils.checkpoint
from torch import nn

from .._args import as_bool, as_choice, as_float, as_int, as_list_of, as_low_dtype, as_name, check_module
from ._tracker import LiveTracker

__all__ = ["Recipe", "RECIPES", "RecipeRow", "plan", "format_plan", "checkpoint_blocks"]

_W_RECIPE = "mixprec.memory.Recipe"
_W_PLAN = "mixprec.memory.plan"
_W_FORMAT = "mixprec.memory.format_plan"
_W_CKPT = "mixprec.memory.checkpoint_blocks"


def _check_callable(where: str, name: str, v):
    if v is not None and not callable(v):
        raise TypeError(f"{where}: {name} must be None or a callable, got {type(v).__name__} {v!r}")
    return v


def _check_budget(where: str, v) -> float | None:
    """A budget in bytes: None, or a finite number > 0 (the CLI's "16GiB"
    is parsed there)."""
    if v is None:
        return None
    if isinstance(v, str):
        raise TypeError(f"{where}: budget must be None or a number of bytes > 0 (e.g. 16 * 2**30), got the str "
                        f"{v!r} (sizes such as '16GiB' are for python -m mixprec.memory --budget)")
    return as_float(where, "budget", v, above=0.0)


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A training recipe as the planner runs it."""

    name: str
    autocast: torch.dtype | None = None  # None: FP32
    bits: int | None = None  # compressed_activations(bits), or None
    norm_bits: int | None = None  # compressed_activations(norm_bits=): None = its default (8)
    nonlinear_bits: int | None = None  # compressed_activations(nonlinear_bits=): None = its default (8)
    checkpoint: bool = False  # torch.utils.checkpoint of every block
    state_bytes: int = 16  # training state per parameter (param + grad + optimizer)
    # torchvision's nms / roi_align through mixprec.ops.patch_torchvision():
    # a detector's RoIAlign then reads BF16 feature maps as they are, where
    # torchvision's autocast makes a float32 copy of each pyramid level.
    vision_ops: bool = False

    def __post_init__(self):
        # checked when built (TypeError / ValueError naming the field); integral floats converted (8.0 -> 8)
        w = _W_RECIPE
        as_name(w, "name", self.name)
        as_low_dtype(w, "autocast", self.autocast)
        bits = as_choice(w, "bits", self.bits, (8, 4))
        widths = {key: as_choice(w, key, getattr(self, key), (4, 8, 16)) for key in ("norm_bits", "nonlinear_bits")}
        as_bool(w, "checkpoint", self.checkpoint)
        state_bytes = as_int(w, "state_bytes", self.state_bytes, low=0)
        as_bool(w, "vision_ops", self.vision_ops)
        for key, value in dict(bits=bits, **widths, state_bytes=state_bytes).items():
            object.__setattr__(self, key, value)


RECIPES = (
    Recipe("fp32"),
    Recipe("amp-bf16", torch.bfloat16),
    Recipe("amp-fp16", torch.float16),
    Recipe("amp-bf16 + 8-bit act", torch.bfloat16, bits=8),
    Recipe("amp-bf16 + 4-bit act", torch.bfloat16, bits=4),
    Recipe("amp-bf16 + 8-bit act + lean state", torch.bfloat16, bits=8, state_bytes=8),
    Recipe("amp-bf16 + 4-bit act + lean state", torch.bfloat16, bits=4, state_bytes=8),
    Recipe("amp-bf16 + checkpoint", torch.bfloat16, checkpoint=True),
)


@dataclasses.dataclass
class RecipeRow:
    recipe: Recipe
    saved_per_sample: float  # bytes held after the forward, per sample
    peak_per_sample: float  # peak of forward + backward (grads excluded), per sample
    peak_fixed: float  # the peak line's intercept
    state: int  # params + grads + optimizer state, bytes
    batch: int  # the batch the totals are for
    total: float  # state + peak at `batch`
    largest_batch: int | None  # at the budget, or None without one
    step_seconds: float  # the larger measured batch's step, on this machine


def checkpoint_blocks(model: nn.Module) -> contextlib.AbstractContextManager:
    """Runs every child with parameters of the model's outermost
    ``nn.Sequential`` modules through ``torch.utils.checkpoint``
    (non-reentrant) while active: ResNet's bottlenecks, ViT's encoder blocks,
    DeepLab's backbone blocks and head layers."""
    check_module(_W_CKPT, "model", model)

    @contextlib.contextmanager
    def wrap():
        wrapped = []

        def visit(m):
            if isinstance(m, nn.Sequential) and len(m) >= 2:
                for child in m:
                    if next(child.parameters(), None) is None:
                        continue  # an activation or pooling: nothing to recompute (and may work in place)
                    orig = child.forward

                    def fwd(*a, _orig=orig, **k):
                        return torch.utils.checkpoint.checkpoint(_orig, *a, use_reentrant=False, **k)

                    child.forward = fwd
                    wrapped.append(child)
                return
            for c in m.children():
                visit(c)

        visit(model)
        try:
            yield
        finally:
            for child in wrapped:
                del child.forward

    return wrap()


def _default_loss(out) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out.float().square().mean()
    if isinstance(out, dict):
        out = list(out.values())
    parts = [_default_loss(o) for o in out if isinstance(o, (torch.Tensor, dict, list, tuple))]
    return sum(parts)


def _measure(model, recipe, make_batch, batch, loss_fn):
    from . import compressed_activations  # the package's, not a copy

    got = make_batch(batch)
    if not (isinstance(got, (tuple, list)) and len(got) == 2 and isinstance(got[0], (tuple, list))
            and isinstance(got[1], dict)):
        raise TypeError(f"{_W_PLAN}: make_batch({batch}) must return (args, kwargs): a tuple and a dict, "
                        f"got {type(got).__name__}")
    args, kwargs = got
    for p in model.parameters():
        p.grad = None
    gc.collect()
    ac = torch.autocast("cpu", dtype=recipe.autocast) if recipe.autocast else contextlib.nullcontext()
    ca = (compressed_activations(bits=recipe.bits, norm_bits=recipe.norm_bits, nonlinear_bits=recipe.nonlinear_bits)
          if recipe.bits else contextlib.nullcontext())
    ck = checkpoint_blocks(model) if recipe.checkpoint else contextlib.nullcontext()
    if recipe.vision_ops:
        from ..ops import patch_torchvision

        vo = patch_torchvision()
    else:
        vo = contextlib.nullcontext()
    import time

    t0 = time.perf_counter()
    with vo, LiveTracker() as tr:
        with ck:
            with ac, ca:
                loss = loss_fn(model(*args, **kwargs))
            gc.collect()
            tr.mark("forward")
            loss.backward()
        del loss
    seconds = time.perf_counter() - t0
    # The gradients are in the training state (counted per parameter): the
    # peak is taken over the run without them, wherever it falls.
    peak = tr.peak_excluding([p.grad for p in model.parameters() if p.grad is not None])
    for p in model.parameters():
        p.grad = None
    return tr.marks["forward"], peak, seconds


def plan(
    model: nn.Module,
    input_shape: Sequence[int] | None = None,
    *,
    batches: tuple[int, int] = (2, 4),
    batch: int = 16,
    budget: float | None = None,
    recipes: Sequence[Recipe] = RECIPES,
    make_batch: Callable[[int], tuple[tuple, dict]] | None = None,
    loss_fn: Callable[[object], torch.Tensor] | None = None,
) -> list[RecipeRow]:
    """Per recipe: the bytes per sample a training step holds after the
    forward and at its peak, the training state, the total at ``batch``, and
    the largest batch within ``budget`` bytes (default: the total of torch's
    AMP BF16 recipe at ``batch``, the budget a user of that recipe has).

    ``model`` is trained in place (its BatchNorm statistics move) on random
    inputs of ``input_shape`` (one sample, e.g. ``(3, 224, 224)``), or on what
    ``make_batch(n) -> (args, kwargs)`` gives; ``loss_fn(output)`` makes the
    scalar to differentiate (default: the mean square of every floating
    output). Runs on the CPU; two batch sizes per recipe (``batches``)."""
    # Every argument is checked before anything runs (the model is not touched on a refusal).
    check_module(_W_PLAN, "model", model)
    shape = None
    if input_shape is not None:
        if isinstance(input_shape, (str, bytes)) or not isinstance(input_shape, Sequence):
            raise TypeError(f"{_W_PLAN}: input_shape must be a sequence of ints (one sample's shape, e.g. "
                            f"(3, 224, 224)) or None, got {type(input_shape).__name__} {input_shape!r}")
        shape = tuple(as_int(_W_PLAN, f"input_shape[{i}]", s, low=1) for i, s in enumerate(input_shape))
    if isinstance(batches, (str, bytes)) or not isinstance(batches, Sequence) or len(batches) != 2:
        raise TypeError(f"{_W_PLAN}: batches must be a pair of increasing sizes >= 1 such as (2, 4), "
                        f"got {type(batches).__name__} {batches!r}")
    b1, b2 = (as_int(_W_PLAN, f"batches[{i}]", b, low=1) for i, b in enumerate(batches))
    if not b1 < b2:
        raise ValueError(f"{_W_PLAN}: batches must be two increasing sizes >= 1, got {batches!r}")
    batch = as_int(_W_PLAN, "batch", batch, low=1)
    budget = _check_budget(_W_PLAN, budget)
    recipes = as_list_of(_W_PLAN, "recipes", recipes, Recipe, "mixprec.memory.Recipe")
    _check_callable(_W_PLAN, "make_batch", make_batch)
    _check_callable(_W_PLAN, "loss_fn", loss_fn)
    if make_batch is None:
        if shape is None:
            raise TypeError(f"{_W_PLAN}: pass input_shape or make_batch")
        gen = torch.Generator().manual_seed(0)

        def make_batch(n):
            return (torch.randn((n,) + shape, generator=gen),), {}

    loss_fn = loss_fn or _default_loss
    model.train()
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    rows = []
    for r in recipes:
        s1, p1, _ = _measure(model, r, make_batch, b1, loss_fn)
        s2, p2, t2 = _measure(model, r, make_batch, b2, loss_fn)
        saved = (s2 - s1) / (b2 - b1)
        slope = (p2 - p1) / (b2 - b1)
        fixed = p1 - slope * b1
        state = n_params * r.state_bytes
        rows.append(RecipeRow(r, saved, slope, fixed, state, batch, state + fixed + slope * batch, None, t2))
    if budget is None:
        ref = [row for row in rows if row.recipe.name == "amp-bf16"]
        budget = ref[0].total if ref else None
    if budget is not None:
        for row in rows:
            room = budget - row.state - row.peak_fixed
            row.largest_batch = max(0, int(room // row.peak_per_sample)) if row.peak_per_sample > 0 else None
    return rows


def format_plan(rows: Sequence[RecipeRow], budget: float | None = None) -> str:
    """``plan``'s rows as a Markdown table (``budget``, in bytes, is checked
    and not printed: the rows' largest batches are at plan's budget)."""
    rows = as_list_of(_W_FORMAT, "rows", rows, RecipeRow, "RecipeRow (what mixprec.memory.plan returns)")
    _check_budget(_W_FORMAT, budget)
    mb = 1e6
    lines = [
        f"| recipe | saved MB / sample | peak MB / sample | state MB | total MB at batch {rows[0].batch} "
        "| largest batch at the budget | step s (measured batch) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.recipe.name} | {r.saved_per_sample / mb:.3g} | {r.peak_per_sample / mb:.3g} | {r.state / mb:.3g} "
            f"| {r.total / mb:.4g} | {r.largest_batch if r.largest_batch is not None else '-'} | {r.step_seconds:.2f} |"
        )
    return "\n".join(lines)
