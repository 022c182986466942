"""``python -m mixprec.memory <module:factory> --input 3x224x224 [--budget 16GiB]``:
the memory planner's table for a model (see ``mixprec.memory.plan``).

``module:factory`` names a callable returning the model, e.g.
``torchvision.models:resnet50``; ``--kwargs`` passes it keyword arguments as
``key=value`` pairs (``num_classes=10``, ``weights=None`` is the default for
torchvision factories).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import re
import sys

import torch

from ._planner import RECIPES, format_plan, plan

_UNITS = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def _bytes(text: str) -> float:
    m = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", text)
    try:
        value = float(m.group(1)) * _UNITS[m.group(2).lower()] if m else None
    except (ValueError, KeyError):
        value = None
    if value is None or not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 16GiB, 12GB, 8000MB)")
    return value


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"not an integer >= 1: {text!r}")
    return n


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(s) for s in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a shape: {text!r} (e.g. 3x224x224)") from None
    if not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"not a shape: {text!r} (e.g. 3x224x224)")
    return shape


def _factory(spec: str):
    mod, _, name = spec.partition(":")
    if not mod or not name:
        raise argparse.ArgumentTypeError(f"not module:factory: {spec!r} (e.g. torchvision.models:resnet50)")
    try:
        fn = getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError) as e:
        raise argparse.ArgumentTypeError(f"cannot load {spec!r}: {e}") from None
    if not callable(fn):
        raise argparse.ArgumentTypeError(f"not callable: {spec!r} is a {type(fn).__name__}, not a function or class "
                                         "returning the model")
    return fn


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mixprec.memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("factory", type=_factory, help="module:callable returning the model")
    ap.add_argument("--input", type=_shape, required=True, help="one sample's shape, e.g. 3x224x224")
    ap.add_argument("--budget", type=_bytes, default=None, help="memory budget (default: torch AMP BF16 at --batch)")
    ap.add_argument("--batch", type=_positive, default=16, help="the batch the totals are given for (default 16)")
    ap.add_argument("--batches", default="2,4", help="the two batch sizes measured (default 2,4)")
    ap.add_argument("--kwargs", nargs="*", default=[], help="factory keyword arguments, key=value")
    ap.add_argument("--recipes", default=None, help="comma-separated recipe names (default: all)")
    ap.add_argument("--threads", type=_positive, default=None, help="CPU threads for torch")
    ap.add_argument("--norm-bits", type=int, choices=(4, 8, 16), default=None,
                    help="compressed_activations(norm_bits=) in the recipes that pack: the code width of what "
                         "normalisation layers save (16: kept as they are; default 8)")
    ap.add_argument("--nonlinear-bits", type=int, choices=(4, 8, 16), default=None,
                    help="compressed_activations(nonlinear_bits=) in the recipes that pack: the code width of what "
                         "attention and smooth nonlinearities (GELU, SiLU, ...) save (16: kept; default 8)")
    a = ap.parse_args(argv)
    kwargs = {}
    for kv in a.kwargs:
        k, _, v = kv.partition("=")
        try:
            kwargs[k] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            kwargs[k] = v
    if a.factory.__module__.startswith("torchvision.models"):
        kwargs.setdefault("weights", None)
    try:
        b1, b2 = (int(s) for s in a.batches.split(","))
    except ValueError:
        ap.error(f"--batches must be two sizes like 2,4, got {a.batches!r}")
    if not 1 <= b1 < b2:
        ap.error(f"--batches must be two increasing sizes >= 1 like 2,4, got {a.batches!r}")
    recipes = RECIPES
    if a.recipes:
        names = [s.strip() for s in a.recipes.split(",")]
        unknown = [n for n in names if n not in {r.name for r in RECIPES}]
        if unknown:
            ap.error(f"unknown recipes {unknown}; known: {[r.name for r in RECIPES]}")
        recipes = [r for r in RECIPES if r.name in names]
    if a.norm_bits is not None:
        recipes = [dataclasses.replace(r, name=f"{r.name}, norm {a.norm_bits}-bit", norm_bits=a.norm_bits)
                   if r.bits else r for r in recipes]
    if a.nonlinear_bits is not None:
        recipes = [dataclasses.replace(r, name=f"{r.name}, nonlinear {a.nonlinear_bits}-bit",
                                       nonlinear_bits=a.nonlinear_bits) if r.bits else r for r in recipes]
    if a.threads:
        torch.set_num_threads(a.threads)
    model = a.factory(**kwargs)
    if not isinstance(model, torch.nn.Module):
        ap.error(f"{a.factory.__module__}.{getattr(a.factory, '__name__', a.factory)} returned "
                 f"{type(model).__name__}, not a torch.nn.Module")
    rows = plan(model, a.input, batches=(b1, b2), batch=a.batch, budget=a.budget, recipes=recipes)
    budget = a.budget
    if budget is None:
        ref = [r for r in rows if r.recipe.name == "amp-bf16"]
        budget = ref[0].total if ref else None
    n = sum(p.numel() for p in model.parameters())
    print(f"{a.factory.__module__}.{a.factory.__name__}: {n / 1e6:.1f}M parameters, input {'x'.join(map(str, a.input))}, "
          f"measured at batches {b1} and {b2} on the CPU, extrapolated linearly")
    if budget is not None:
        print(f"budget: {budget / 2**30:.2f} GiB" + ("" if a.budget else f" (torch AMP BF16 at batch {a.batch})"))
    print(format_plan(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
