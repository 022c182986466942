"""The bad-input matrix of mixprec.parity.parity and of
mixprec.lightning.MixedPrecision's constructor (issue 39; the optimizers and
the guard are in test_bad_input_faces.py): one bad argument at a time on an
otherwise valid call. Each must raise TypeError for a value of the wrong
kind or ValueError for one out of range, naming the callable and the
argument, before anything is built or trained: make_model is not called,
the batches and torch's random state are as before, no plot is written."""

from __future__ import annotations

import math

import pytest
import torch

from mixprec.parity import Recipe, parity

NAN = float("nan")


class _Factory:
    """make_model that counts its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return torch.nn.Linear(3, 2)


def _batches():
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 3, generator=g), torch.randint(0, 2, (4,), generator=g)) for _ in range(2)]


def _acc(model):
    return {"acc": 0.5}


# Recipe's fields, one bad at a time: (fields, error, the field named).
RECIPE_BAD = [
    (dict(name=3), TypeError, "name"),
    (dict(name=""), ValueError, "name"),
    (dict(dtype="bf16"), TypeError, "dtype"),
    (dict(dtype=torch.float64), ValueError, "dtype"),
    (dict(params_cast="yes"), TypeError, "params_cast"),
    (dict(dtype=None, params_cast=True), ValueError, "params_cast"),
    (dict(act_bits="8"), TypeError, "act_bits"),
    (dict(act_bits=True), TypeError, "act_bits"),
    (dict(act_bits=6), ValueError, "act_bits"),
    (dict(batch_multiplier=0), ValueError, "batch_multiplier"),
    (dict(batch_multiplier=1.5), TypeError, "batch_multiplier"),
    (dict(lr_scale="2"), TypeError, "lr_scale"),
    (dict(lr_scale=-1.0), ValueError, "lr_scale"),
]


def _unchecked(**fields):
    """A Recipe holding ``fields`` past its constructor's check (as
    object.__new__ or a subclass could build one): parity checks them again."""
    r = Recipe("x", torch.bfloat16)
    for key, value in fields.items():
        object.__setattr__(r, key, value)
    return r


# (keyword arguments over the valid call's, error, words). The first group
# is refused before the model is built; _BUILT's after the first model is
# built and before it trains.
PARITY_BAD = [
    (dict(make_model=torch.nn.Linear(3, 2)), TypeError, "make_model"),
    (dict(make_model=3), TypeError, "make_model"),
    (dict(batches=3), TypeError, "batches"),
    (dict(batches=iter(_batches())), TypeError, "batches"),
    (dict(batches=[]), ValueError, "batches"),
    (dict(batches=[(torch.zeros(4, 3),)]), TypeError, "batches[0]"),
    (dict(batches=[(torch.zeros(4, 3), 1)]), TypeError, "batches[0][1]"),
    (dict(recipe=3), TypeError, "recipe"),
    (dict(recipe="fp8"), ValueError, "recipe"),
    (dict(recipe="bf16+act3"), ValueError, "recipe"),
    (dict(recipe=[]), ValueError, "recipe"),
    (dict(recipe=["bf16", "bf16"]), ValueError, "recipe"),
    (dict(recipe=[Recipe("x", torch.bfloat16), 5]), TypeError, "recipe[1]"),
    *[(dict(recipe=_unchecked(**fields)), exc, f"recipe.{field}") for fields, exc, field in RECIPE_BAD],
    (dict(recipe="bf16+2x", steps=3), ValueError, "steps"),
    (dict(loss_fn="ce"), TypeError, "loss_fn"),
    (dict(optimizer=torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)), TypeError, "optimizer"),
    (dict(optimizer="adamw"), TypeError, "optimizer"),
    (dict(steps=0), ValueError, "steps"),
    (dict(steps=2.5), TypeError, "steps"),
    (dict(steps="2"), TypeError, "steps"),
    (dict(steps=NAN), ValueError, "steps"),
    (dict(guard="yes"), TypeError, "guard"),
    (dict(guard=1), TypeError, "guard"),
    (dict(device=3), TypeError, "device"),
    (dict(device="nowhere"), ValueError, "device"),
    (dict(png=3), TypeError, "png"),
    (dict(png="/no/such/directory/plot.png"), ValueError, "png"),
    (dict(evaluate="acc"), TypeError, "evaluate"),
    (dict(evaluate=torch.nn.Linear(3, 2)), TypeError, "evaluate"),
    (dict(seeds=0), ValueError, "seeds"),
    (dict(seeds=1.5), TypeError, "seeds"),
    (dict(seeds=[]), ValueError, "seeds"),
    (dict(seeds=[1, 1]), ValueError, "seeds"),
    (dict(seeds=[1, -2]), ValueError, "seeds[1]"),
    (dict(seeds=[1, "2"]), TypeError, "seeds[1]"),
    (dict(targets=0.01), TypeError, "targets"),
    (dict(targets={"acc": 0.01}), ValueError, "targets"),  # no evaluate
    (dict(evaluate=_acc, targets={"acc": "0.01"}), TypeError, "targets['acc']"),
    (dict(evaluate=_acc, targets={"acc": -0.01}), ValueError, "targets['acc']"),
    (dict(evaluate=_acc, targets={"acc": (0.01, "up")}), ValueError, "targets['acc']"),
    (dict(evaluate=_acc, targets={1: 0.01}), TypeError, "targets"),
    (dict(lr_scale="2"), TypeError, "lr_scale"),
    (dict(lr_scale=0.0), ValueError, "lr_scale"),
    (dict(lr_scale=NAN), ValueError, "lr_scale"),
]
_BUILT = [
    (dict(evaluate=_acc, targets={"miou": 0.01}), ValueError, "targets"),
    (dict(evaluate=lambda m: 0.5), TypeError, "evaluate"),
    (dict(recipe="bf16+2x", lr_scale=lambda lr, k: -lr), ValueError, "lr_scale"),
    (dict(optimizer=lambda ps: "adamw", recipe="bf16+2x", lr_scale=2.0), TypeError, "optimizer"),
]


def test_parity_valid_call():
    make = _Factory()
    result = parity(make, _batches(), recipe="bf16", steps=2, evaluate=_acc, targets={"acc": 0.01}, seeds=[1, 2])
    assert make.calls > 0 and len(result.runs) == 2


@pytest.mark.parametrize("kw,exc,word", PARITY_BAD + _BUILT, ids=[repr(c[0])[:60] for c in PARITY_BAD + _BUILT])
def test_parity(kw, exc, word, tmp_path):
    make = _Factory()
    kw = dict(kw)
    make_model = kw.pop("make_model", make)
    batches = kw.pop("batches", _batches())
    given = [tuple(t.clone() for t in b) if isinstance(b, tuple) and all(isinstance(t, torch.Tensor) for t in b)
             else b for b in batches] if isinstance(batches, list) else batches
    rng = torch.get_rng_state()
    with pytest.raises((TypeError, ValueError)) as info:
        parity(make_model, batches, **kw)
    assert type(info.value) is exc, repr(info.value)
    assert str(info.value).startswith("mixprec.parity.parity: "), repr(info.value)  # the callable, then the argument
    assert word in str(info.value), f"{word!r} not in {info.value!r}"
    built = any(kw == b[0] for b in _BUILT)
    assert make.calls == (1 if built else 0)  # refused before anything trained (before building, but for _BUILT)
    assert torch.equal(torch.get_rng_state(), rng)
    if isinstance(batches, list):
        for b, g in zip(batches, given):
            if isinstance(b, tuple) and all(isinstance(t, torch.Tensor) for t in b):
                assert all(torch.equal(t, u) for t, u in zip(b, g))
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("spec,exc", [(3, TypeError), (None, TypeError), (["bf16"], TypeError),
                                      ("fp8", ValueError), ("bf16+act3", ValueError), ("", ValueError)])
def test_recipe_parse(spec, exc):
    """Recipe.parse is a callable of its own: its errors name it and its
    argument (a non-str was an AttributeError from str.split)."""
    with pytest.raises((TypeError, ValueError)) as info:
        Recipe.parse(spec)
    assert type(info.value) is exc, repr(info.value)
    assert str(info.value).startswith("mixprec.parity.Recipe.parse: spec "), repr(info.value)
    assert Recipe.parse("bf16+act8+2x") == Recipe("bf16+act8+2x", torch.bfloat16, False, 8, 2)


@pytest.mark.parametrize("fields,exc,field", RECIPE_BAD, ids=[repr(c[0])[:50] for c in RECIPE_BAD])
def test_recipe_constructor(fields, exc, field):
    """Recipe(...) checks its fields when built (it was accepted, and only
    parity refused it later), with parity's rules."""
    kw = {"name": "x", "dtype": torch.bfloat16, **fields}
    rng = torch.get_rng_state()
    with pytest.raises((TypeError, ValueError)) as info:
        Recipe(**kw)
    assert type(info.value) is exc, repr(info.value)
    assert str(info.value).startswith(f"mixprec.parity.Recipe: {field}"), repr(info.value)
    assert torch.equal(torch.get_rng_state(), rng)


def test_recipe_constructor_converts_numbers():
    r = Recipe("x", torch.bfloat16, act_bits=8.0, batch_multiplier=torch.tensor(2), lr_scale=torch.tensor(2.0))
    assert (r.act_bits, r.batch_multiplier, r.lr_scale) == (8, 2, 2.0)
    assert type(r.act_bits) is int and type(r.batch_multiplier) is int and type(r.lr_scale) is float
    assert Recipe("y", lr_scale=lambda lr, k: lr * k).lr_scale(1.0, 2) == 2.0


# ---- mixprec.lightning.MixedPrecision ---------------------------------------------------

LIGHTNING_BAD = [
    (("32",), {}, ValueError, "precision"),
    (("bf16",), {}, ValueError, "precision"),
    ((16,), {}, TypeError, "precision"),
    ((None,), {}, TypeError, "precision"),
    (("bf16-mixed", 3), {}, TypeError, "device"),
    (("bf16-mixed", None), {}, TypeError, "device"),
    (("bf16-mixed", "nowhere"), {}, ValueError, "device"),
    (("16-mixed", "cpu", "scaler"), {}, TypeError, "scaler"),
    (("16-mixed", "cpu"), dict(scaler=object()), TypeError, "scaler"),
]


def _lightning():
    pytest.importorskip("lightning")
    import mixprec.lightning

    return mixprec.lightning


def test_lightning_valid_calls():
    L = _lightning()
    import mixprec

    assert L.MixedPrecision("bf16-mixed", "cpu").scaler is None
    assert isinstance(L.MixedPrecision("16-mixed", "cpu").scaler, mixprec.amp.GradScaler)
    scaler = torch.amp.GradScaler("cpu")
    assert L.MixedPrecision("16-mixed", "cpu", scaler).scaler is scaler


@pytest.mark.parametrize("args,kw,exc,word", LIGHTNING_BAD, ids=[repr(c[:2])[:50] for c in LIGHTNING_BAD])
def test_lightning_plugin(args, kw, exc, word):
    L = _lightning()
    with pytest.raises((TypeError, ValueError)) as info:
        L.MixedPrecision(*args, **kw)
    assert type(info.value) is exc, repr(info.value)
    assert "mixprec.lightning.MixedPrecision: " in str(info.value) and word in str(info.value), repr(info.value)


def test_lightning_scaler_class_or_bf16_scaler():
    L = _lightning()
    import mixprec

    for args, exc in ((("16-mixed", "cpu", mixprec.amp.GradScaler), TypeError),
                      (("bf16-mixed", "cpu", mixprec.amp.GradScaler("cpu")), ValueError)):
        with pytest.raises((TypeError, ValueError)) as info:
            L.MixedPrecision(*args)
        assert type(info.value) is exc and "scaler" in str(info.value), repr(info.value)
    assert math.isfinite(mixprec.amp.GradScaler("cpu").get_scale())
