"""What a user's loop gets wrong with the optimizers, refused clearly and
without touching anything (issue 23 items 2 and 10), over both classes and
every param mode: a step inside ``swap_ema()``, ``swap_ema()`` / ``ema_model``
without an EMA or with another model, and every public constructor
argument (and param-group key) given a value of the wrong kind: NaN, inf,
a bool, a string, a non-integral float for an integer, a tensor of several
elements. torch's own arguments behave as torch's optimizer does with the
same value (raise the same exception type, or accept it); mixprec's own
arguments raise ValueError or TypeError naming the argument."""

import copy
import math

import pytest
import torch

import mixprec
from mixprec.optim import SGD, AdamW, ema_model

from _reference import bits

CLASSES = {"adamw": (AdamW, torch.optim.AdamW), "sgd": (SGD, torch.optim.SGD)}
# param dtype, master_weights
MODES = [(torch.float32, True), (torch.bfloat16, True), (torch.float16, True), (torch.bfloat16, False)]
MODE_IDS = ["f32", "bf16", "f16", "bf16-sr"]


def _model(dtype, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 9), torch.nn.Tanh(), torch.nn.Linear(9, 3)).to(dtype)


def _train(model, opt, gen, steps=1):
    for _ in range(steps):
        model.zero_grad()
        x = torch.randn(5, 6, generator=gen).to(next(model.parameters()).dtype)
        model(x).float().pow(2).sum().backward()
        opt.step()


def _snapshot(model, opt):
    params = [bits(p.detach()).clone() for p in model.parameters()]
    state = [{k: bits(v).clone() if v.is_floating_point() else v.clone() for k, v in opt.state[p].items()}
             for p in model.parameters()]
    return params, state


def _assert_same(a, b):
    for x, y in zip(a[0], b[0]):
        assert torch.equal(x, y)
    for sa, sb in zip(a[1], b[1]):
        assert sa.keys() == sb.keys()
        for k in sa:
            assert torch.equal(sa[k], sb[k]), k


# ---- the EMA ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_step_inside_swap_ema_raises_and_changes_nothing(kind, mode, gen):
    dtype, mw = mode
    model = _model(dtype)
    opt = CLASSES[kind][0](model.parameters(), lr=1e-2, master_weights=mw, seed=3, ema_decay=0.9)
    _train(model, opt, gen, steps=3)
    before = _snapshot(model, opt)
    twin = copy.deepcopy(model)  # never enters the block
    topt = CLASSES[kind][0](twin.parameters(), lr=1e-2, master_weights=mw, seed=3, ema_decay=0.9)
    topt.load_state_dict(copy.deepcopy(opt.state_dict()))
    with opt.swap_ema():
        swapped = [bits(p.detach()).clone() for p in model.parameters()]
        model.zero_grad()
        model(torch.randn(5, 6, generator=gen).to(dtype)).float().sum().backward()
        with pytest.raises(RuntimeError, match=rf"{type(opt).__name__}.step\(\) inside swap_ema\(\)"):
            opt.step()
        for p, s in zip(model.parameters(), swapped):
            assert torch.equal(bits(p.detach()), s)  # still the EMA, untouched
    _assert_same(_snapshot(model, opt), before)
    # Training goes on as if the block had not been there.
    _train(model, opt, torch.Generator().manual_seed(9), steps=2)
    _train(twin, topt, torch.Generator().manual_seed(9), steps=2)
    for p, q in zip(model.parameters(), twin.parameters()):
        assert torch.equal(bits(p.detach()), bits(q.detach()))
        assert torch.equal(bits(opt.state[p]["ema"]), bits(topt.state[q]["ema"]))


@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_scaler_step_inside_swap_ema_raises(kind, gen):
    model = _model(torch.bfloat16)
    opt = CLASSES[kind][0](model.parameters(), lr=1e-2, ema_decay=0.9)
    _train(model, opt, gen)
    scaler = mixprec.amp.GradScaler("cpu", init_scale=256.0)
    with opt.swap_ema():
        model.zero_grad()
        scaler.scale(model(torch.randn(5, 6, generator=gen).bfloat16()).float().sum()).backward()
        with pytest.raises(RuntimeError, match=r"inside swap_ema\(\)"):
            scaler.step(opt)


@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_swap_ema_without_an_ema_raises(kind, gen):
    model = _model(torch.bfloat16)
    opt = CLASSES[kind][0](model.parameters(), lr=1e-2)
    _train(model, opt, gen)
    before = _snapshot(model, opt)
    with pytest.raises(RuntimeError, match=r"swap_ema\(\).*no EMA.*ema_decay"):
        with opt.swap_ema():
            pass
    _assert_same(_snapshot(model, opt), before)


@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_ema_model_refuses_an_optimizer_without_ema_or_another_model(kind, gen):
    model = _model(torch.bfloat16)
    plain = CLASSES[kind][0](model.parameters(), lr=1e-2)
    _train(model, plain, gen)
    with pytest.raises(RuntimeError, match=r"ema_model: the optimizer keeps no EMA.*ema_decay"):
        ema_model(model, plain)
    model2 = _model(torch.bfloat16)
    opt = CLASSES[kind][0](model2.parameters(), lr=1e-2, ema_decay=0.9)
    _train(model2, opt, gen)
    other = _model(torch.bfloat16)  # same structure, other parameters
    for m in (other, torch.nn.Linear(3, 3).bfloat16()):
        with pytest.raises(RuntimeError, match=r"ema_model: none of model's parameters is optimized by"):
            ema_model(m, opt)
    # A model of which the optimizer trains only a part (a frozen backbone) is fine.
    ema = ema_model(model2, opt)
    for p, q in zip(model2.parameters(), ema.parameters()):
        assert torch.equal(bits(q.detach()), bits(opt.state[p]["ema"].bfloat16()))


# ---- argument conversion ---------------------------------------------------------------

# Arguments torch's optimizers take too: ours must do with a value what torch does.
TORCH_ARGS = {
    "adamw": ["lr", "eps", "weight_decay", "betas[0]", "betas[1]"],
    "sgd": ["lr", "momentum", "dampening", "weight_decay"],
}
# mixprec's own: (name, what it takes), checked with a clear error.
OWN_ARGS = [
    ("ema_decay", "real"), ("ema_min_decay", "real"), ("ema_warmup_gamma", "real"),
    ("ema_warmup_power", "real"), ("ema_update_after_step", "int"), ("ema_update_every", "int"),
    ("ema_use_warmup", "bool"), ("master_weights", "bool"), ("seed", "int"),
]
BAD = {
    "nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "bool": True, "str": "0.5",
    "half": 2.5, "list": [0.5], "tensor2": torch.tensor([0.5, 0.5]), "none": None,
}
# Values each own argument accepts (bool args: bools only).
OK = {"real": (0.5, 1, torch.tensor(0.25)), "int": (3, 2.0), "bool": (True, False)}


def _kwargs_for(kind, name, value):
    if name.startswith("betas["):
        b = [0.9, 0.999]
        b[int(name[6])] = value
        return {"betas": tuple(b)}
    kw = {name: value}
    if name.startswith("ema_") and name != "ema_decay":
        kw["ema_decay"] = 0.9  # the EMA keys are checked with an EMA (and without one: see below)
        if name in ("ema_warmup_gamma", "ema_warmup_power"):
            kw["ema_use_warmup"] = True
    if name == "seed":
        kw["master_weights"] = False
    return kw


def _outcome(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return e
    return None


# torch's own words for an argument in its messages.
SAID = {"lr": "learning rate", "betas[0]": "beta", "betas[1]": "beta", "eps": "epsilon"}


@pytest.mark.parametrize("bad", sorted(BAD))
@pytest.mark.parametrize("kind,name", [(k, n) for k in sorted(TORCH_ARGS) for n in TORCH_ARGS[k]])
def test_torch_arguments_convert_as_torch(kind, name, bad):
    """Accepted where torch's optimizer accepts the value, refused where it
    refuses it (the same exception type, or a ValueError / TypeError that
    names the argument where torch's names nothing: the truth value of a
    several-element tensor). The departures are earlier refusals, each
    naming the argument, of values torch's constructor lets through to a
    broken step: NaN for SGD's lr, momentum and weight decay (the weights
    turn NaN), anything but a finite number for its dampening (torch checks
    nothing there). A finite number or a bool torch takes is never refused."""
    ours, theirs = CLASSES[kind]
    kw = _kwargs_for(kind, name, BAD[bad])
    if kind == "sgd" and name == "dampening":
        kw["momentum"] = 0.9
    want = _outcome(lambda: theirs([torch.nn.Parameter(torch.randn(3))], **kw))
    got = _outcome(lambda: ours([torch.nn.Parameter(torch.randn(3))], **kw))
    if want is None and got is None:
        return
    named = isinstance(got, (ValueError, TypeError)) and (
        name.split("[")[0] in str(got) or SAID.get(name, "?") in str(got))
    if want is not None:
        assert got is not None, f"torch refuses ({want!r}), mixprec accepts"
        assert type(got) is type(want) or named, f"torch: {want!r}, mixprec: {got!r}"
    else:
        assert bad not in ("half", "bool"), f"torch accepts, mixprec: {got!r}"
        assert named, f"torch accepts, mixprec: {got!r}"


@pytest.mark.parametrize("bad", sorted(BAD))
@pytest.mark.parametrize("name,kind_of", OWN_ARGS)
@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_own_arguments_refuse_bad_values_naming_them(kind, name, kind_of, bad):
    value = BAD[bad]
    if name == "ema_decay" and value is None:
        pytest.skip("ema_decay=None is 'no EMA'")
    if name == "seed" and value is None:
        pytest.skip("seed=None draws one")
    if kind_of == "real" and bad == "half":
        pytest.skip("2.5 is a real number (its range is checked elsewhere)")
    if kind_of == "bool" and bad == "bool":
        pytest.skip("True is a bool")
    cls = CLASSES[kind][0]
    p = torch.nn.Parameter(torch.randn(3).bfloat16())
    with pytest.raises((ValueError, TypeError), match=name):
        cls([p], lr=1e-2, **_kwargs_for(kind, name, value))
    # The same value as a param-group key is refused the same way.
    with pytest.raises((ValueError, TypeError), match=name):
        group = {"params": [p], **_kwargs_for(kind, name, value)}
        cls([group], lr=1e-2)


@pytest.mark.parametrize("name,kind_of", OWN_ARGS)
@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_own_arguments_accept_good_values(kind, name, kind_of, gen):
    cls = CLASSES[kind][0]
    for value in OK[kind_of]:
        p = torch.nn.Parameter(torch.randn(3).bfloat16())
        opt = cls([p], lr=1e-2, **_kwargs_for(kind, name, value))
        g = opt.param_groups[0][name]
        assert type(g) is {"real": float, "int": int, "bool": bool}[kind_of]
        want = value.item() if isinstance(value, torch.Tensor) else value
        assert g == want
        p.grad = torch.randn(3, generator=gen).bfloat16()
        opt.step()


@pytest.mark.parametrize("name", ["ema_update_after_step", "ema_update_every", "seed"])
def test_ema_keys_checked_without_an_ema_too(name):
    """Without ema_decay (or in a group with master weights, for the seed)
    the integer keys are unused, but a NaN given for one is still a mistake
    worth naming (it was a bare int() error)."""
    with pytest.raises(ValueError, match=name):
        AdamW([torch.nn.Parameter(torch.randn(3))], **{name: float("nan")})
