"""load_state_dict of mixprec.optim's optimizers is atomic (issue 39): a
state dict that cannot be installed (remainders for float16 params, a
tensor of the wrong shape or dtype, an unknown moment format, the wrong
number of groups or params, a hyper-parameter out of range, ...) raises an
error naming ``load_state_dict`` and the offending key, and leaves the
optimizer exactly as before: its state_dict() is unchanged, its params
too, the state dict handed in is not modified, and the next step gives the
same bits as an optimizer that never saw the call."""

import copy

import pytest
import torch

from mixprec.optim import SGD, AdamW

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32


def same(a, b):
    """Deep equality, tensors bit for bit (dtype and shape included)."""
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a.view(-1).view(torch.uint8) if a.is_floating_point() and a.numel() else a,
                                b.view(-1).view(torch.uint8) if b.is_floating_point() and b.numel() else b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, (bool, int, float, str, bytes, type(None), torch.dtype)):
        return a == b or (a != a and b != b)
    return type(a) is type(b)  # a module or other object: a deep copy is another object


def build(kind, dtype, **kw):
    """A (params, optimizer) pair after two steps, the same on every call."""
    g = torch.Generator().manual_seed(3)
    params = [torch.nn.Parameter(torch.randn(3, 4, generator=g).to(dtype)),
              torch.nn.Parameter(torch.randn(4, generator=g).to(dtype))]
    if kind == "adamw":
        opt = AdamW(params, lr=1e-2, seed=5, **kw)
    else:
        opt = SGD(params, lr=1e-2, momentum=0.9, seed=5, **kw)
    for _ in range(2):
        step(params, opt, g)
    return params, opt


def step(params, opt, g):
    for p in params:
        p.grad = torch.randn(p.shape, generator=g).to(p.dtype)
    opt.step()


def saved(kind, dtype, **kw):
    return copy.deepcopy(build(kind, dtype, **kw)[1].state_dict())


def _edit_state(key, value):
    def edit(sd):
        sd["state"][0][key] = value(sd["state"][0]) if callable(value) else value
    return edit


def _edit_group(key, value):
    def edit(sd):
        sd["param_groups"][0][key] = value
    return edit


# name -> (optimizer kind, its params' dtype and options, the source state dict
# (kind, dtype, options) or None for its own, an edit of it, exception, match)
CASES = {
    # The case: a remainders checkpoint into an FP16 model.
    "remainders into float16": (
        ("adamw", F16, {}), ("adamw", BF16, dict(param_remainders=True)), None, ValueError, "param_remainders"),
    "remainder bits for a float32 param": (
        ("adamw", F32, {}), None,
        _edit_state("remainder_bits", torch.zeros(3, 4, dtype=BF16)), RuntimeError, "remainder_bits.*bfloat16"),
    "remainder bits for a float16 param": (
        ("adamw", F16, {}), None,
        _edit_state("remainder_bits", torch.zeros(3, 4, dtype=BF16)), RuntimeError, "remainder_bits.*bfloat16"),
    "exp_avg of another shape": (
        ("adamw", BF16, {}), None, _edit_state("exp_avg", torch.zeros(5, 5)), RuntimeError, r"\['exp_avg'\].*shape"),
    "master of another shape": (
        ("adamw", BF16, {}), None, _edit_state("master", torch.zeros(4, 3)), RuntimeError, r"\['master'\].*shape"),
    "exp_avg_sq not a tensor": (
        ("adamw", BF16, {}), None, _edit_state("exp_avg_sq", [0.0] * 12), RuntimeError, r"\['exp_avg_sq'\]"),
    "integer moment": (
        ("adamw", BF16, {}), None, _edit_state("exp_avg", torch.zeros(3, 4, dtype=torch.int32)),
        RuntimeError, r"\['exp_avg'\].*int32"),
    "uint8 moment without its scales": (
        ("adamw", BF16, {}), None, _edit_state("exp_avg", torch.zeros(3, 4, dtype=torch.uint8)),
        RuntimeError, "exp_avg_scale"),
    "scales without a uint8 moment": (
        ("adamw", BF16, {}), None, _edit_state("exp_avg_scale", torch.ones(1)), RuntimeError, "exp_avg_scale"),
    "step a string": (("adamw", BF16, {}), None, _edit_state("step", "3"), RuntimeError, r"\['step'\]"),
    "step negative": (("adamw", BF16, {}), None, _edit_state("step", torch.tensor(-1.0)), RuntimeError, "step"),
    "state of a param not a dict": (
        ("adamw", BF16, {}), None, lambda sd: sd["state"].update({0: [1, 2]}), RuntimeError, r"\['state'\]\[0\]"),
    "unknown moment format": (
        ("adamw", BF16, {}), None, _edit_group("exp_avg_dtype", "int8"), ValueError, "exp_avg_dtype"),
    "moment format a dtype it cannot take": (
        ("adamw", BF16, {}), None, _edit_group("exp_avg_sq_dtype", torch.float16), ValueError, "exp_avg_sq_dtype"),
    "param_remainders not a flag": (
        ("adamw", BF16, {}), None, _edit_group("param_remainders", "yes"), TypeError, "param_remainders"),
    "master-free group over float16 params": (
        ("adamw", F16, {}), None, _edit_group("master_weights", False), ValueError, "master_weights"),
    "ema_decay out of range": (
        ("adamw", BF16, {}), None, _edit_group("ema_decay", 2.0), ValueError, "ema_decay"),
    "negative lr": (("adamw", BF16, {}), None, _edit_group("lr", -1.0), ValueError, "learning rate"),
    "beta of 1": (("adamw", BF16, {}), None, _edit_group("betas", (0.9, 1.0)), ValueError, r"betas\[1\]"),
    "betas a string": (("adamw", BF16, {}), None, _edit_group("betas", "0.9"), TypeError, "betas"),
    "capturable a tensor": (
        ("adamw", BF16, {}), None, _edit_group("capturable", torch.zeros(2)), TypeError, "capturable"),
    "differentiable": (("adamw", BF16, {}), None, _edit_group("differentiable", True), NotImplementedError, "differentiable"),
    "lr a module": (("adamw", BF16, {}), None, _edit_group("lr", torch.nn.Linear(1, 1)), TypeError, "lr"),
    "one group too many": (
        ("adamw", BF16, {}), None, lambda sd: sd["param_groups"].append(copy.deepcopy(sd["param_groups"][0])),
        ValueError, "param_groups.*2 groups"),
    "one param too few": (
        ("adamw", BF16, {}), None, _edit_group("params", [0]), ValueError, r"\['params'\] has 1"),
    "the same id twice": (("adamw", BF16, {}), None, _edit_group("params", [0, 0]), ValueError, "twice"),
    "no state entry": (("adamw", BF16, {}), None, lambda sd: sd.pop("state"), ValueError, "'state'"),
    "groups not a list": (("adamw", BF16, {}), None, lambda sd: sd.update(param_groups=3), TypeError, "param_groups"),
    "sgd: momentum buffer of another shape": (
        ("sgd", BF16, {}), None, _edit_state("momentum_buffer", torch.zeros(12)), RuntimeError, "momentum_buffer"),
    "sgd: negative momentum": (("sgd", BF16, {}), None, _edit_group("momentum", -0.5), ValueError, "momentum"),
    "sgd: remainders into float16": (
        ("sgd", F16, {}), ("sgd", BF16, dict(param_remainders=True)), None, ValueError, "param_remainders"),
    "sgd: 8-bit momentum of the wrong scales": (
        ("sgd", BF16, dict(momentum_dtype=torch.uint8)), ("sgd", F32, dict(momentum_dtype=torch.uint8)),
        # a (3, 4) param keeps its 8-bit buffer under its own key (rows of 4
        # are no whole blocks): codes and scales as the kernel holds them
        lambda sd: sd["state"][0].update(momentum_buffer=torch.zeros(3, 4, dtype=torch.uint8),
                                         momentum_buffer_scale=torch.ones(3)),
        RuntimeError, "momentum_buffer_scale"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_refused_state_dict_changes_nothing(name):
    (kind, dtype, kw), source, edit, exc, match = CASES[name]
    params, opt = build(kind, dtype, **kw)
    twin_params, twin = build(kind, dtype, **kw)
    sd = saved(*source[:2], **source[2]) if source else copy.deepcopy(opt.state_dict())
    if edit is not None:
        edit(sd)
    given = copy.deepcopy(sd)
    before = copy.deepcopy(opt.state_dict())
    values = [p.detach().clone() for p in params]

    with pytest.raises(exc, match=match) as info:
        opt.load_state_dict(sd)
    assert f"mixprec.optim.{type(opt).__name__}.load_state_dict" in str(info.value)

    assert same(opt.state_dict(), before)
    assert all(same(p.detach(), v) for p, v in zip(params, values))
    assert same(sd, given)  # the caller's dict is not touched
    # the next steps are those of an optimizer that never saw the call
    g, tg = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    for _ in range(2):
        step(params, opt, g)
        step(twin_params, twin, tg)
    assert all(same(p.detach(), q.detach()) for p, q in zip(params, twin_params))
    assert same(opt.state_dict(), twin.state_dict())


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
@pytest.mark.parametrize("src,dst", [(F32, BF16), (BF16, BF16), (F16, F16)])
def test_valid_state_dicts_still_load(kind, src, dst):
    """The checks refuse nothing that loaded before: a state dict of the same
    optimizer, of torch's (FP32) and the lean modes' ones."""
    _, a = build(kind, src)
    params, b = build(kind, dst)
    b.load_state_dict(a.state_dict())
    step(params, b, torch.Generator().manual_seed(1))
    tp = [torch.nn.Parameter(p.detach().float()) for p in params]
    ref = (torch.optim.AdamW(tp, lr=1e-2) if kind == "adamw" else torch.optim.SGD(tp, lr=1e-2, momentum=0.9))
    step(tp, ref, torch.Generator().manual_seed(1))
    b.load_state_dict(ref.state_dict())
    if dst == BF16:
        lean = dict(param_remainders=True, **({"exp_avg_dtype": torch.uint8} if kind == "adamw"
                                              else {"momentum_dtype": torch.uint8}))
        _, c = build(kind, BF16, **lean)
        b.load_state_dict(c.state_dict())
        step(params, b, torch.Generator().manual_seed(1))
        assert all("remainder" in b.state[p] for p in params)


def test_non_dict_is_refused_naming_the_argument():
    _, opt = build("adamw", BF16)
    before = copy.deepcopy(opt.state_dict())
    for bad in (None, [1, 2], "state", 3):
        with pytest.raises(TypeError, match=r"AdamW\.load_state_dict: state_dict must be a dict"):
            opt.load_state_dict(bad)
    assert same(opt.state_dict(), before)


def test_a_failure_inside_the_install_rolls_back(monkeypatch):
    """Should the install fail after the checks passed (a bug, or a user's
    subclass), the optimizer still holds what it held."""
    params, opt = build("adamw", BF16)
    before = copy.deepcopy(opt.state_dict())
    sd = copy.deepcopy(build("adamw", BF16, param_remainders=True)[1].state_dict())

    def boom(*a, **k):
        raise RuntimeError("install failed")

    monkeypatch.setattr(type(opt), "_lean_prepare", boom)
    with pytest.raises(RuntimeError, match="install failed"):
        opt.load_state_dict(sd)
    monkeypatch.undo()
    assert same(opt.state_dict(), before)
    step(params, opt, torch.Generator().manual_seed(0))
