"""The bad-input matrix of mixprec.memory's planner faces (issue 39):
``plan``, ``format_plan``, ``Recipe``, ``LiveTracker.mark`` /
``peak_excluding``, ``checkpoint_blocks`` and ``python -m mixprec.memory``.
One bad argument at a time on an otherwise valid call, written from what
the docstrings promise. Each case must

- raise the documented kind of error: TypeError for a value of the wrong
  kind (a string for a number or a bool, a non-integral float for an
  integer), ValueError for a value of the right kind that is out of range
  ([note: argument conversion] in mixprec/_args.py);
- start its message with the callable's full name and name the argument;
- change nothing: the model is not run (no forward, parameters, buffers,
  gradients and training flag as before), ``make_batch`` and ``loss_fn``
  are never called, a LiveTracker's counts and marks are as before, and
  torch's random state has not moved.

The valid call of each face is checked too, so a case fails for its one bad
argument. (The optimizers', guard's and parity's matrix: tests/python/api/.)
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import mixprec
import mixprec.memory as mm

NAN, INF = float("nan"), float("inf")
FP32 = next(r for r in mm.RECIPES if r.name == "fp32")
# The tree the package under test comes from (the CLI runs the same one).
PYTHONPATH = str(Path(mixprec.__file__).resolve().parents[1])


def refused(call, exc, where, *words):
    """Runs ``call``, which must raise exactly ``exc`` (ValueError: or a
    subclass) with a message starting with ``where: `` and naming each of
    ``words``; torch's random state must be as before."""
    rng = torch.get_rng_state()
    with pytest.raises((TypeError, ValueError, RuntimeError, KeyError, NotImplementedError)) as info:
        call()
    assert type(info.value) is exc or (exc is ValueError and isinstance(info.value, ValueError)), repr(info.value)
    msg = str(info.value)
    assert msg.startswith(f"{where}: "), msg
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    assert torch.equal(torch.get_rng_state(), rng), "the refused call moved torch's random state"


# ---- plan -----------------------------------------------------------------------------


class Spy:
    """A make_batch or loss_fn that counts its calls."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *a):
        self.calls += 1
        return self.fn(*a)


def _model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 8))
    model.eval()  # plan trains it in place (model.train()): a refusal must not
    runs = []
    model.register_forward_pre_hook(lambda m, a: runs.append(1))
    return model, runs


def _model_snapshot(model):
    return ({k: v.detach().clone() for k, v in model.state_dict().items()},
            [m.training for m in model.modules()], [p.grad for p in model.parameters()])


def _assert_model_unchanged(model, runs, snap):
    sd, flags, grads = snap
    assert not runs, "the refused call ran the model"
    now = model.state_dict()
    assert list(now) == list(sd) and all(torch.equal(now[k], sd[k]) for k in sd)
    assert [m.training for m in model.modules()] == flags
    assert all(g is None for g in grads) and all(p.grad is None for p in model.parameters())


def _spies():
    return (Spy(lambda n: ((torch.randn(n, 8),), {})),
            Spy(lambda out: out.float().square().mean()))


def _plan_kwargs(make_batch, loss_fn):
    return dict(input_shape=(8,), batches=(2, 3), batch=4, budget=None, recipes=[FP32], make_batch=make_batch,
                loss_fn=loss_fn)


def test_plan_valid_call():
    model, runs = _model()
    make_batch, loss_fn = _spies()
    rows = mm.plan(model, **{**_plan_kwargs(make_batch, loss_fn), "batch": 4.0, "budget": 1e6})
    assert [r.recipe for r in rows] == [FP32] and rows[0].batch == 4 and rows[0].largest_batch is not None
    assert make_batch.calls == 2 and loss_fn.calls == 2 and len(runs) == 2
    # input_shape alone (the random batch), batches as a list, a generator of recipes
    model2, _ = _model()
    rows = mm.plan(model2, torch.Size([8]), batches=[2, 3], recipes=(r for r in [FP32]), budget=10**6)
    assert len(rows) == 1 and "| fp32 |" in mm.format_plan(rows, budget=10**6)


# (bad keyword arguments, error, words besides the callable)
PLAN_BAD = [
    (dict(model=3), TypeError, "model"),
    (dict(model=None), TypeError, "model"),
    (dict(model=torch.zeros(2)), TypeError, "model"),
    (dict(model=nn.Linear), TypeError, "model"),  # the class, not a module
    (dict(input_shape="8"), TypeError, "input_shape"),
    (dict(input_shape=8), TypeError, "input_shape"),
    (dict(input_shape=(8.5,)), TypeError, "input_shape[0]"),
    (dict(input_shape=(8, "3")), TypeError, "input_shape[1]"),
    (dict(input_shape=(8, None)), TypeError, "input_shape[1]"),
    (dict(input_shape=(True,)), TypeError, "input_shape[0]"),
    (dict(input_shape=(0,)), ValueError, "input_shape[0]"),
    (dict(input_shape=(8, -1)), ValueError, "input_shape[1]"),
    (dict(batches=(2,)), TypeError, "batches"),
    (dict(batches=(2, 3, 4)), TypeError, "batches"),
    (dict(batches=2), TypeError, "batches"),
    (dict(batches="24"), TypeError, "batches"),
    (dict(batches=None), TypeError, "batches"),
    (dict(batches=(2.5, 4)), TypeError, "batches[0]"),
    (dict(batches=(2, "4")), TypeError, "batches[1]"),
    (dict(batches=(0, 2)), ValueError, "batches[0]"),
    (dict(batches=(4, 2)), ValueError, "batches"),
    (dict(batches=(2, 2)), ValueError, "batches"),
    (dict(batch=0), ValueError, "batch"),
    (dict(batch=-1), ValueError, "batch"),
    (dict(batch=2.5), TypeError, "batch"),
    (dict(batch="16"), TypeError, "batch"),
    (dict(batch=None), TypeError, "batch"),
    (dict(batch=True), TypeError, "batch"),
    (dict(batch=NAN), ValueError, "batch"),
    (dict(budget=-1.0), ValueError, "budget"),
    (dict(budget=0), ValueError, "budget"),
    (dict(budget=NAN), ValueError, "budget"),
    (dict(budget=INF), ValueError, "budget"),
    (dict(budget="1G"), TypeError, "budget"),
    (dict(budget="16GiB"), TypeError, "budget"),
    (dict(budget=[1e9]), TypeError, "budget"),
    (dict(budget=True), TypeError, "budget"),
    (dict(recipes=[]), ValueError, "recipes"),
    (dict(recipes=()), ValueError, "recipes"),
    (dict(recipes=[3]), TypeError, "recipes[0]"),
    (dict(recipes=[FP32, None]), TypeError, "recipes[1]"),
    (dict(recipes=["fp32"]), TypeError, "recipes[0]"),
    (dict(recipes=3), TypeError, "recipes"),
    (dict(recipes=None), TypeError, "recipes"),
    (dict(recipes="fp32"), TypeError, "recipes"),
    (dict(recipes=FP32), TypeError, "recipes"),  # one Recipe, not a sequence of them
    (dict(make_batch=3), TypeError, "make_batch"),
    (dict(make_batch="x"), TypeError, "make_batch"),
    (dict(loss_fn=3), TypeError, "loss_fn"),
    (dict(loss_fn="mean"), TypeError, "loss_fn"),
    (dict(input_shape=None, make_batch=None), TypeError, "input_shape"),
]


@pytest.mark.parametrize("kw,exc,word", [pytest.param(*c, id=str(c[0])) for c in PLAN_BAD])
def test_plan_bad(kw, exc, word):
    model, runs = _model()
    make_batch, loss_fn = _spies()
    kwargs = {**_plan_kwargs(make_batch, loss_fn), **kw}
    target = kwargs.pop("model", model)
    snap = _model_snapshot(model)
    refused(lambda: mm.plan(target, **kwargs), exc, "mixprec.memory.plan", word)
    _assert_model_unchanged(model, runs, snap)
    assert make_batch.calls == 0 and loss_fn.calls == 0


def test_plan_bad_make_batch_result():
    """make_batch(n) must give (args, kwargs): anything else is named."""
    model, _ = _model()
    refused(lambda: mm.plan(model, make_batch=lambda n: torch.zeros(n, 8), recipes=[FP32], batches=(2, 3)),
            TypeError, "mixprec.memory.plan", "make_batch")


# ---- format_plan ------------------------------------------------------------------------


def _rows():
    return [mm._planner.RecipeRow(FP32, 1e3, 2e3, 5e3, 16_000, 16, 1e5, 40, 0.01)]


def test_format_plan_valid_call():
    rows = _rows()
    for budget in (None, 1e9, 10**9):
        text = mm.format_plan(rows, budget=budget)
        assert "total MB at batch 16" in text and "| fp32 |" in text
    assert mm.format_plan(tuple(rows)) == mm.format_plan(rows)


FORMAT_BAD = [
    (dict(rows=3), TypeError, "rows"),
    (dict(rows=None), TypeError, "rows"),
    (dict(rows="fp32"), TypeError, "rows"),
    (dict(rows=[3]), TypeError, "rows[0]"),
    (dict(rows=[FP32]), TypeError, "rows[0]"),  # a Recipe, not a row
    (dict(rows=[]), ValueError, "rows"),
    (dict(rows=[], budget="x"), ValueError, "rows"),
    (dict(budget="x"), TypeError, "budget"),
    (dict(budget=-1.0), ValueError, "budget"),
    (dict(budget=NAN), ValueError, "budget"),
]


@pytest.mark.parametrize("kw,exc,word", [pytest.param(*c, id=str(c[0])) for c in FORMAT_BAD])
def test_format_plan_bad(kw, exc, word):
    rows = _rows()
    kwargs = {"rows": rows, **kw}
    refused(lambda: mm.format_plan(**kwargs), exc, "mixprec.memory.format_plan", word)
    assert rows == _rows()


def test_format_plan_single_row_is_refused():
    refused(lambda: mm.format_plan(_rows()[0]), TypeError, "mixprec.memory.format_plan", "rows")


# ---- Recipe -----------------------------------------------------------------------------


def test_recipe_valid():
    for r in mm.RECIPES:
        assert dataclasses.replace(r) == r
    r = mm.Recipe("x", torch.float16, bits=8.0, norm_bits=16, nonlinear_bits=4, checkpoint=True,
                  state_bytes=torch.tensor(8), vision_ops=True)
    assert r.bits == 8 and type(r.bits) is int and r.state_bytes == 8 and type(r.state_bytes) is int
    assert mm.Recipe("y", state_bytes=0).state_bytes == 0


RECIPE_BAD = [
    (dict(name=3), TypeError, "name"),
    (dict(name=None), TypeError, "name"),
    (dict(name=""), ValueError, "name"),
    (dict(autocast="bf16"), TypeError, "autocast"),
    (dict(autocast=1), TypeError, "autocast"),
    (dict(autocast=torch.float32), ValueError, "autocast"),
    (dict(autocast=torch.int8), ValueError, "autocast"),
    (dict(bits=3), ValueError, "bits"),
    (dict(bits=0), ValueError, "bits"),
    (dict(bits=16), ValueError, "bits"),
    (dict(bits=2.5), TypeError, "bits"),
    (dict(bits="8"), TypeError, "bits"),
    (dict(bits=True), TypeError, "bits"),
    (dict(bits=8, norm_bits=12), ValueError, "norm_bits"),
    (dict(bits=8, norm_bits="8"), TypeError, "norm_bits"),
    (dict(bits=8, nonlinear_bits=2), ValueError, "nonlinear_bits"),
    (dict(bits=8, nonlinear_bits=8.5), TypeError, "nonlinear_bits"),
    (dict(checkpoint="yes"), TypeError, "checkpoint"),
    (dict(checkpoint=1), TypeError, "checkpoint"),
    (dict(checkpoint=None), TypeError, "checkpoint"),
    (dict(state_bytes=-1), ValueError, "state_bytes"),
    (dict(state_bytes=2.5), TypeError, "state_bytes"),
    (dict(state_bytes="16"), TypeError, "state_bytes"),
    (dict(state_bytes=None), TypeError, "state_bytes"),
    (dict(vision_ops="no"), TypeError, "vision_ops"),
]


@pytest.mark.parametrize("kw,exc,word", [pytest.param(*c, id=str(c[0])) for c in RECIPE_BAD])
def test_recipe_bad(kw, exc, word):
    kwargs = {"name": "x", **kw}
    refused(lambda: mm.Recipe(**kwargs), exc, "mixprec.memory.Recipe", word)
    # dataclasses.replace builds through the same check (the CLI's --norm-bits does)
    refused(lambda: dataclasses.replace(FP32, **kw), exc, "mixprec.memory.Recipe", word)


def test_recipe_by_position():
    refused(lambda: mm.Recipe(3), TypeError, "mixprec.memory.Recipe", "name")
    refused(lambda: mm.Recipe("x", "bf16"), TypeError, "mixprec.memory.Recipe", "autocast")


# ---- LiveTracker ------------------------------------------------------------------------


def _tracked():
    with mm.LiveTracker() as t:
        keep = torch.empty(1000)
        tmp = torch.empty(2000)
        t.mark("mid")
        del tmp
    return t, keep


def _tracker_snapshot(t):
    return (t.current, t.peak, dict(t.marks), list(t._events), dict(t._live), dict(t._serial))


def test_tracker_valid_calls():
    t, keep = _tracked()
    assert t.marks["mid"] == 12000 and t.peak == 12000
    assert t.peak_excluding([keep]) == 8000 and t.peak_excluding(()) == 12000
    assert t.peak_excluding(p for p in [keep]) == 8000
    t.mark("end")
    assert t.marks["end"] == 4000


MARK_BAD = [3, None, b"mid", ("mid",), 1.5]
PEAK_BAD = [
    (3, "tensors"), (None, "tensors"), ("abc", "tensors"), (torch.empty(3), "tensors"),
    ([3], "tensors[0]"), ([None], "tensors[0]"), ([torch.empty(2), "g"], "tensors[1]"),
]


@pytest.mark.parametrize("name", MARK_BAD, ids=repr)
def test_tracker_mark_bad(name):
    t, keep = _tracked()
    snap = _tracker_snapshot(t)
    refused(lambda: t.mark(name), TypeError, "mixprec.memory.LiveTracker.mark", "name")
    assert _tracker_snapshot(t) == snap
    del keep


@pytest.mark.parametrize("bad,word", PEAK_BAD, ids=[repr(type(c[0]).__name__) + c[1] for c in PEAK_BAD])
def test_tracker_peak_excluding_bad(bad, word):
    t, keep = _tracked()
    snap = _tracker_snapshot(t)
    refused(lambda: t.peak_excluding(bad), TypeError, "mixprec.memory.LiveTracker.peak_excluding", word)
    assert _tracker_snapshot(t) == snap
    assert t.peak_excluding([keep]) == 8000  # still works


# ---- checkpoint_blocks ------------------------------------------------------------------


@pytest.mark.parametrize("bad", [3, None, torch.zeros(2), nn.Linear, [nn.Linear(2, 2)]],
                         ids=["int", "None", "tensor", "class", "list"])
def test_checkpoint_blocks_bad(bad):
    """Refused at the call, not at ``with`` (it failed there with
    AttributeError: 'children')."""
    refused(lambda: mm.checkpoint_blocks(bad), TypeError, "mixprec.memory.checkpoint_blocks", "model")


def test_checkpoint_blocks_valid_call():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    with mm.checkpoint_blocks(model):
        assert "forward" in vars(model[0]) and "forward" not in vars(model[1])
    assert "forward" not in vars(model[0])


# ---- python -m mixprec.memory -----------------------------------------------------------


@pytest.mark.parametrize(
    "args,msg",
    [
        (["math:pi", "--input", "8"], "not callable"),
        (["builtins:dict", "--input", "8"], "not a torch.nn.Module"),
        (["torch.nn:Linear", "--input", "8", "--budget", "0GiB"], "not a size"),
        (["torch.nn:Linear", "--input", "8", "--budget", "1.2.3GB"], "not a size"),
        (["torch.nn:Linear", "--input", "8", "--batches", "4,2"], "--batches"),
        (["torch.nn:Linear", "--input", "8", "--batch", "0"], "--batch"),
        (["torch.nn:Linear", "--input", "8", "--threads", "-1"], "--threads"),
    ],
    ids=["not-callable", "not-a-module", "budget-0", "budget-junk", "batches-order", "batch-0", "threads"],
)
def test_cli_bad_arguments(args, msg):
    """argparse's usage error (exit 2, the option named), not a traceback;
    the factory's own arguments are given so a case fails for its one bad
    option."""
    args = args + ["--kwargs", "in_features=8", "out_features=8"] if args[0] == "torch.nn:Linear" else args
    r = subprocess.run([sys.executable, "-m", "mixprec.memory", *args], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": PYTHONPATH})
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert msg in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "usage:" in r.stderr
