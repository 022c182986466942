"""The bad-input matrix of the newest Python faces (issue 39): the
optimizers' lean options (constructor, add_param_group, fp32_state,
fp32_state_dict, memory_report), mixprec.guard.ForwardGuard (constructor,
step, fallback, load_state_dict, attach, on_scaler_step), the optimizers'
step(closure), swap_ema and sync_master_weights, mixprec.optim.ema_model,
GradScaler.unscale_'s return_norm, TrainingHealth.most_overflowed
(mixprec.parity and mixprec.lightning.MixedPrecision: the _parity file). One bad argument at a time on an
otherwise valid call, written from what the docstrings promise. Each case
must

- raise the documented kind of error: TypeError for a value of the wrong
  kind (a string for a bool or a dtype, a non-integral float for an
  integer), ValueError for a value of the right kind that is out of range
  ([note: argument conversion] in mixprec/_args.py);
- name the callable (``mixprec.optim.AdamW.add_param_group``...) and the
  argument in its message;
- change nothing: the optimizer's state_dict and param groups, the params'
  values, the guard's state and the model's forwards, torch's random state
  are as before the call, and the object still works afterwards.

The valid call of each face is checked too, so a case fails for its one bad
argument. (The ops' own matrix is test_bad_input_matrix.py; random junk is
thrown at the same faces in test_property_args.py.)
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from mixprec.guard import ForwardGuard
from _lean_params import make_params, step
from mixprec.optim import SGD, AdamW

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
NAN, INF = float("nan"), float("inf")


def same(a, b) -> bool:
    """Deep equality with tensors compared bit for bit (NaNs equal)."""
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return a == b


def refused(call, exc, *words):
    """Runs ``call``, which must raise exactly ``exc`` (not a subclass of
    another kind) naming each of ``words``; torch's random state must be as
    before."""
    rng = torch.get_rng_state()
    with pytest.raises((TypeError, ValueError, RuntimeError, KeyError, NotImplementedError)) as info:
        call()
    assert type(info.value) is exc or (exc is ValueError and isinstance(info.value, ValueError)), repr(info.value)
    for w in words:
        assert w in str(info.value), f"{w!r} not in {info.value!r}"
    assert torch.equal(torch.get_rng_state(), rng), "the refused call moved torch's random state"


# ---- the optimizers' lean options ---------------------------------------------------


# (bad keyword arguments, error, words besides the callable). The lean and
# EMA options, the seed, and the flags torch's optimizers take too (a
# string for a bool is a TypeError there as well, as load_state_dict says).
LEAN_BAD = [
    (dict(param_remainders="yes"), TypeError, "param_remainders"),
    (dict(param_remainders=1), TypeError, "param_remainders"),
    (dict(param_remainders=None), TypeError, "param_remainders"),
    (dict(param_remainders=True, master_weights=False), ValueError, "param_remainders"),
    (dict(master_weights="no"), TypeError, "master_weights"),
    (dict(ema_decay=0.9, ema_use_warmup="yes"), TypeError, "ema_use_warmup"),
    (dict(ema_decay=1.5), ValueError, "ema_decay"),
    (dict(ema_decay=NAN), ValueError, "ema_decay"),
    (dict(ema_decay="0.9"), TypeError, "ema_decay"),
    (dict(ema_decay=True), TypeError, "ema_decay"),
    (dict(ema_decay=torch.tensor([0.9, 0.9])), TypeError, "ema_decay"),
    (dict(ema_decay=0.9, ema_min_decay=-0.5), ValueError, "ema_min_decay"),
    (dict(ema_decay=0.9, ema_use_warmup=True, ema_warmup_power=0.0), ValueError, "ema_warmup_power"),
    (dict(ema_decay=0.9, ema_use_warmup=True, ema_warmup_gamma=INF), ValueError, "ema_warmup_gamma"),
    (dict(ema_decay=0.9, ema_update_every=0), ValueError, "ema_update_every"),
    (dict(ema_decay=0.9, ema_update_every=1.5), TypeError, "ema_update_every"),
    (dict(ema_decay=0.9, ema_update_after_step="3"), TypeError, "ema_update_after_step"),
    (dict(ema_decay=0.9, ema_update_after_step=-1), ValueError, "ema_update_after_step"),
    (dict(master_weights=False, seed=2.5), TypeError, "seed"),
    (dict(master_weights=False, seed="7"), TypeError, "seed"),
    (dict(master_weights=False, seed=NAN), ValueError, "seed"),
    (dict(foreach="yes"), TypeError, "foreach"),
    (dict(fused=2), TypeError, "fused"),
    (dict(capturable="no"), TypeError, "capturable"),
    (dict(maximize="yes"), TypeError, "maximize"),
    (dict(lr=-1.0), ValueError, "lr must be >= 0"),
    (dict(lr="0.1"), TypeError, "lr"),
    (dict(weight_decay=None), TypeError, "weight_decay"),
]
MOMENTS = {AdamW: ("exp_avg_dtype", "exp_avg_sq_dtype"), SGD: ("momentum_dtype",)}
OWN_BAD = {
    AdamW: [
        (dict(betas=0.9), TypeError, "betas"),
        (dict(betas=(0.9,)), TypeError, "betas"),
        (dict(betas=(0.9, "0.99")), TypeError, "betas[1]"),
        (dict(betas=(1.0, 0.999)), ValueError, "betas[0]"),
        (dict(eps="1e-8"), TypeError, "eps"),
        (dict(eps=-1.0), ValueError, "eps"),
        (dict(amsgrad="yes"), TypeError, "amsgrad"),
    ],
    SGD: [
        (dict(momentum="0.9"), TypeError, "momentum"),
        (dict(momentum=-0.5), ValueError, "momentum"),
        (dict(momentum=0.9, dampening=INF), ValueError, "dampening"),
        (dict(momentum=0.9, nesterov="yes"), TypeError, "nesterov"),
        (dict(momentum=0.0, nesterov=True), ValueError, "nesterov"),
    ],
}


def _lean_cases():
    out = []
    for cls in (AdamW, SGD):
        rows = list(LEAN_BAD) + OWN_BAD[cls]
        for name in MOMENTS[cls]:
            rows += [({name: "bfloat16"}, TypeError, name), ({name: None}, TypeError, name),
                     ({name: torch.float16}, ValueError, name), ({name: torch.int8}, ValueError, name)]
        for kw, exc, word in rows:
            out.append(pytest.param(cls, kw, exc, word, id=f"{cls.__name__}-{kw}"))
    return out


LEAN_CASES = _lean_cases()


@pytest.mark.parametrize("cls", [AdamW, SGD])
def test_lean_valid_calls(cls):
    params = make_params()
    kw = dict(param_remainders=True, **{n: torch.uint8 for n in MOMENTS[cls]}, ema_decay=0.9)
    opt = cls(params, lr=1e-2, **kw)
    step(opt, params)
    extra = torch.nn.Parameter(torch.randn(5).bfloat16())
    opt.add_param_group({"params": [extra], "param_remainders": False, "master_weights": False, "seed": 3})
    step(opt, params + [extra], seed=3)
    assert set(opt.fp32_state(params[0])) >= {"master", "step", "ema"}
    assert len(opt.fp32_state_dict()["state"]) == 3
    assert opt.memory_report().remainders == 2 * (12 + 3)


@pytest.mark.parametrize("cls,kw,exc,word", LEAN_CASES)
def test_lean_constructor(cls, kw, exc, word):
    params = make_params()
    values = [p.detach().clone() for p in params]
    refused(lambda: cls(params, **{"lr": 1e-2, **kw}), exc, f"mixprec.optim.{cls.__name__}: ", word)
    assert all(same(p.detach(), v) for p, v in zip(params, values))


@pytest.mark.parametrize("cls,kw,exc,word", LEAN_CASES)
def test_lean_constructor_group(cls, kw, exc, word):
    """The same option given in a param group, after a group that draws a
    stochastic-rounding seed (master-free): the refusal leaves torch's
    random state as it was."""
    params = make_params()
    first = torch.nn.Parameter(torch.randn(2).bfloat16())
    groups = [{"params": [first], "master_weights": False}, {"params": params, **kw}]
    refused(lambda: cls(groups, lr=1e-2), exc, f"mixprec.optim.{cls.__name__}: ", word)


def _stepped(cls):
    params = make_params()
    kw = dict(param_remainders=True, **{n: torch.uint8 for n in MOMENTS[cls]})
    opt = cls(params, lr=1e-2, **kw)
    step(opt, params)
    return params, opt


def _optimizer_snapshot(opt, params):
    return (copy.deepcopy(opt.state_dict()), len(opt.param_groups), [p.detach().clone() for p in params],
            [g.get("seed") for g in opt.param_groups])


def _assert_optimizer_unchanged(opt, params, snap):
    sd, n, values, seeds = snap
    assert len(opt.param_groups) == n
    assert same(opt.state_dict(), sd)
    assert all(same(p.detach(), v) for p, v in zip(params, values))
    assert [g.get("seed") for g in opt.param_groups] == seeds
    step(opt, params, seed=5)  # still steps


@pytest.mark.parametrize("cls,kw,exc,word", LEAN_CASES)
def test_lean_add_param_group(cls, kw, exc, word):
    params, opt = _stepped(cls)
    snap = _optimizer_snapshot(opt, params)
    extra = torch.nn.Parameter(torch.randn(5).bfloat16())
    refused(lambda: opt.add_param_group({"params": [extra], **kw}), exc,
            f"mixprec.optim.{cls.__name__}.add_param_group: ", word)
    _assert_optimizer_unchanged(opt, params, snap)


ADD_GROUP_BAD = [
    ([torch.nn.Parameter(torch.randn(2))], TypeError, "param_group"),
    ({"lr": 0.1}, ValueError, "params"),
    ({"params": 3}, TypeError, "params"),
    ({"params": [torch.randn(2, requires_grad=True) * 2]}, ValueError, "params"),  # not a leaf
    ({"params": [torch.randn(2).half().requires_grad_()], "param_remainders": True}, ValueError,
     "param_remainders"),
    ({"params": [torch.randn(2).half().requires_grad_()], "master_weights": False}, ValueError, "master_weights"),
]


@pytest.mark.parametrize("cls", [AdamW, SGD])
@pytest.mark.parametrize("case", range(len(ADD_GROUP_BAD)))
def test_add_param_group_bad_groups(cls, case):
    group, exc, word = ADD_GROUP_BAD[case]
    params, opt = _stepped(cls)
    snap = _optimizer_snapshot(opt, params)
    refused(lambda: opt.add_param_group(group), exc, f"mixprec.optim.{cls.__name__}.add_param_group: ", word)
    _assert_optimizer_unchanged(opt, params, snap)


@pytest.mark.parametrize("cls", [AdamW, SGD])
def test_add_param_group_of_a_param_already_there(cls):
    params, opt = _stepped(cls)
    snap = _optimizer_snapshot(opt, params)
    refused(lambda: opt.add_param_group({"params": [params[0]]}), ValueError,
            f"mixprec.optim.{cls.__name__}.add_param_group: ", "params")
    _assert_optimizer_unchanged(opt, params, snap)


@pytest.mark.parametrize("params_arg,exc", [(torch.zeros(2, requires_grad=True), TypeError), ([], ValueError),
                                            ([1.0], TypeError)])
def test_constructor_bad_params(params_arg, exc):
    refused(lambda: AdamW(params_arg, lr=1e-2), exc, "mixprec.optim.AdamW: ", "param")


FP32_STATE_BAD = [
    (3, TypeError), ("0", TypeError), (None, TypeError), (torch.zeros(4, 3), ValueError),
    (torch.nn.Parameter(torch.zeros(3)), ValueError),
]


@pytest.mark.parametrize("cls", [AdamW, SGD])
@pytest.mark.parametrize("case", range(len(FP32_STATE_BAD)))
def test_fp32_state_bad_p(cls, case):
    bad, exc = FP32_STATE_BAD[case]
    params, opt = _stepped(cls)
    snap = _optimizer_snapshot(opt, params)
    refused(lambda: opt.fp32_state(bad), exc, f"mixprec.optim.{cls.__name__}.fp32_state: ", "p ")
    _assert_optimizer_unchanged(opt, params, snap)


@pytest.mark.parametrize("cls", [AdamW, SGD])
def test_fp32_state_takes_one_argument(cls):
    """fp32_state(p) takes p alone (by position or as p=): an extra or a
    missing argument is a TypeError naming the callable, not Python's
    "takes 2 positional arguments but 3 were given"."""
    params, opt = _stepped(cls)
    snap = _optimizer_snapshot(opt, params)
    where = f"mixprec.optim.{cls.__name__}.fp32_state: "
    refused(lambda: opt.fp32_state(params[0], params[1]), TypeError, where + "takes only p, got 1 more", "Parameter")
    refused(lambda: opt.fp32_state(params[0], True), TypeError, where + "takes only p, got 1 more", "bool")
    refused(lambda: opt.fp32_state(params[0], full=True), TypeError, where + "takes only p, got 1 more", "full=")
    refused(lambda: opt.fp32_state(params[0], p=params[0]), TypeError, where + "takes only p, got 1 more", "p=")
    refused(lambda: opt.fp32_state(), TypeError, where + "p is required")
    refused(lambda: opt.fp32_state(param=params[0]), TypeError, where + "takes only p", "param=")
    assert same(opt.fp32_state(p=params[0]), opt.fp32_state(params[0]))
    _assert_optimizer_unchanged(opt, params, snap)


@pytest.mark.parametrize("cls", [AdamW, SGD])
@pytest.mark.parametrize("method", ["fp32_state_dict", "memory_report"])
def test_read_only_methods_take_no_arguments_and_change_nothing(cls, method):
    """fp32_state_dict() and memory_report() take no argument (a
    TypeError naming the callable as the others do, not Python's "takes 1
    positional argument but 2 were given"), and reading them writes
    nothing: the tensors they give are new ones."""
    params, opt = _stepped(cls)
    snap = _optimizer_snapshot(opt, params)
    where = f"mixprec.optim.{cls.__name__}.{method}: "
    refused(lambda: getattr(opt, method)(params), TypeError, where + "takes no arguments, got 1")
    refused(lambda: getattr(opt, method)(full=True), TypeError, where + "takes no arguments, got 1", "full")
    refused(lambda: getattr(opt, method)(None, keep_vars=True), TypeError, where + "takes no arguments, got 2")
    out = getattr(opt, method)()
    if method == "fp32_state_dict":
        for st in out["state"].values():
            for v in st.values():
                if isinstance(v, torch.Tensor):
                    v.add_(1)  # a copy: the optimizer keeps its own
        state = opt.fp32_state(params[0])
        state["master"].add_(1)
    _assert_optimizer_unchanged(opt, params, snap)


# ---- mixprec.guard.ForwardGuard ---------------------------------------------------------


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


def _guard_snapshot(guard, model):
    return (copy.deepcopy(guard.state_dict()), [p.detach().clone() for p in model.parameters()],
            [("forward" in m.__dict__, len(m._forward_hooks)) for m in model.modules()],
            [p.dtype for p in model.parameters()])


def _assert_guard_unchanged(guard, model, snap):
    state, values, hooks, dtypes = snap
    assert guard.state_dict() == state
    assert all(same(p.detach(), v) for p, v in zip(model.parameters(), values))
    assert [("forward" in m.__dict__, len(m._forward_hooks)) for m in model.modules()] == hooks
    assert [p.dtype for p in model.parameters()] == dtypes
    model(torch.randn(2, 3))
    assert guard.step(found_inf=0.0) is None  # still steps


GUARD_CTOR_BAD = [
    (dict(model="model"), TypeError, "model"),
    (dict(model=torch.nn.Linear), TypeError, "model"),
    (dict(fallback="yes"), TypeError, "fallback"),
    (dict(fallback=1), TypeError, "fallback"),
    (dict(after=0), ValueError, "after"),
    (dict(after=2.5), TypeError, "after"),
    (dict(after=NAN), ValueError, "after"),
    (dict(after="2"), TypeError, "after"),
    (dict(fallback_dtype="float32"), TypeError, "fallback_dtype"),
    (dict(fallback_dtype=torch.float16), ValueError, "fallback_dtype"),
    (dict(optimizer="adamw"), TypeError, "optimizer"),
    (dict(optimizer=[None]), TypeError, "optimizer[0]"),
    (dict(backward="no"), TypeError, "backward"),
    (dict(move_params="no"), TypeError, "move_params"),
    (dict(process_group="world"), TypeError, "process_group"),
    (dict(process_group=3, move_params=False), TypeError, "process_group"),
]


def test_guard_valid_call():
    model = _model()
    opt = AdamW(model.parameters(), lr=1e-2)
    guard = ForwardGuard(model, fallback=True, after=2, fallback_dtype=torch.bfloat16, optimizer=[opt],
                         backward=True, move_params=False)
    guard.fallback("0", torch.float32, "test")
    model(torch.randn(2, 3))
    assert guard.step(found_inf=torch.zeros(1)) is None
    guard.load_state_dict(guard.state_dict())


@pytest.mark.parametrize("kw,exc,word", GUARD_CTOR_BAD, ids=[str(c[0]) for c in GUARD_CTOR_BAD])
def test_guard_constructor(kw, exc, word):
    model = _model()
    kw = dict(kw)
    target = kw.pop("model", model)
    values = [p.detach().clone() for p in model.parameters()]
    refused(lambda: ForwardGuard(target, **kw), exc, "mixprec.guard.ForwardGuard: ", word)
    assert all("forward" not in m.__dict__ and not m._forward_hooks for m in model.modules())
    assert all(same(p.detach(), v) for p, v in zip(model.parameters(), values))


GUARD_STEP_BAD = [
    (dict(found_inf="0"), TypeError, "found_inf"),
    (dict(found_inf=True), TypeError, "found_inf"),
    (dict(found_inf=[0.0]), TypeError, "found_inf"),
    (dict(found_inf=torch.zeros(2)), ValueError, "found_inf"),
    (dict(loss="1.0"), TypeError, "loss"),
    (dict(found_inf=0.0, loss=[1.0]), TypeError, "loss"),
    ({}, TypeError, "found_inf"),
]


@pytest.mark.parametrize("kw,exc,word", GUARD_STEP_BAD, ids=[str(c[0]) for c in GUARD_STEP_BAD])
def test_guard_step(kw, exc, word):
    model = _model()
    guard = ForwardGuard(model, fallback=True)
    guard.fallback("2")
    model(torch.randn(2, 3))
    snap = _guard_snapshot(guard, model)
    refused(lambda: guard.step(**kw), exc, "mixprec.guard.ForwardGuard.step: ", word)
    _assert_guard_unchanged(guard, model, snap)


def test_guard_step_takes_numpy_numbers():
    """found_inf from NumPy (an int64 / float64 / float32 scalar) is a number
    like Python's: 0 steps healthy, nonzero counts an overflow; a NumPy bool
    is refused as Python's bool is."""
    np = pytest.importorskip("numpy")
    model = _model()
    guard = ForwardGuard(model, fallback=True)
    for v in (np.int64(0), np.float64(0.0), np.float32(0.0)):
        model(torch.randn(2, 3))
        assert guard.step(found_inf=v) is None
    model(torch.randn(2, 3))
    guard.step(found_inf=np.int64(1))
    assert guard.state_dict() != ForwardGuard(_model(), fallback=True).state_dict()
    model(torch.randn(2, 3))
    refused(lambda: guard.step(found_inf=np.bool_(False)), TypeError, "mixprec.guard.ForwardGuard.step: ", "found_inf")


GUARD_FALLBACK_BAD = [
    (("nope",), ValueError, "nope"),  # KeyError too (an unknown module name)
    ((0,), TypeError, "name"),
    ((None,), TypeError, "name"),
    (("0", "float32"), TypeError, "dtype"),
    (("0", torch.float16), ValueError, "dtype"),
    (("0", None, 3), TypeError, "why"),
]


@pytest.mark.parametrize("args,exc,word", GUARD_FALLBACK_BAD, ids=[str(c[0]) for c in GUARD_FALLBACK_BAD])
def test_guard_fallback(args, exc, word):
    model = _model()
    guard = ForwardGuard(model)
    guard.fallback("2")
    snap = _guard_snapshot(guard, model)
    refused(lambda: guard.fallback(*args), exc, "mixprec.guard.ForwardGuard.fallback: ", word)
    _assert_guard_unchanged(guard, model, snap)


def _good_state():
    return {"fallback": {"0": "float32"}, "counts": {"0": 2}, "events": [("0", 1, "float32", "overflow")],
            "steps": 3}


def _edit(path, value):
    def edit(sd):
        target = sd
        for k in path[:-1]:
            target = target[k]
        if value is KeyError:
            del target[path[-1]]
        else:
            target[path[-1]] = value
        return sd
    return edit


GUARD_LOAD_BAD = [
    (lambda sd: [sd], TypeError, "state"),
    (lambda sd: {**sd, "state": {}}, ValueError, "unexpected keys"),
    (_edit(("fallback",), ["0"]), TypeError, "state['fallback']"),
    (_edit(("fallback", "0"), "float16"), ValueError, "state['fallback']['0']"),
    (_edit(("fallback", "0"), 32), TypeError, "state['fallback']['0']"),
    (lambda sd: {**sd, "fallback": {"nope": "float32"}}, ValueError, "nope"),
    (lambda sd: {**sd, "fallback": {1: "float32"}}, TypeError, "state['fallback']"),
    (_edit(("counts", "0"), -1), ValueError, "state['counts']['0']"),
    (_edit(("counts", "0"), 1.5), TypeError, "state['counts']['0']"),
    (lambda sd: {**sd, "counts": {"nope": 1}}, ValueError, "nope"),
    (_edit(("events",), "none"), TypeError, "state['events']"),
    (_edit(("events", 0), ("0", 1, "float32")), TypeError, "state['events'][0]"),
    (_edit(("events", 0), ("0", 1, "float16", "x")), ValueError, "state['events'][0]"),
    (_edit(("events", 0), ("0", -1, "float32", "x")), ValueError, "state['events'][0]"),
    (_edit(("steps",), "3"), TypeError, "state['steps']"),
    (_edit(("steps",), -2), ValueError, "state['steps']"),
    (_edit(("steps",), NAN), ValueError, "state['steps']"),
]


@pytest.mark.parametrize("case", range(len(GUARD_LOAD_BAD)))
def test_guard_load_state_dict(case):
    edit, exc, word = GUARD_LOAD_BAD[case]
    model = _model()
    guard = ForwardGuard(model)
    guard.step(found_inf=0.0)
    snap = _guard_snapshot(guard, model)
    bad = edit(_good_state())
    given = copy.deepcopy(bad)
    refused(lambda: guard.load_state_dict(bad), exc, "mixprec.guard.ForwardGuard.load_state_dict: ", word)
    assert bad == given  # the caller's dict is not touched
    _assert_guard_unchanged(guard, model, snap)


def test_guard_load_state_dict_into_a_module_in_another_dtype():
    model = _model()
    guard = ForwardGuard(model)
    guard.fallback("2", torch.bfloat16)  # the last module: its BF16 output is the model's
    snap = _guard_snapshot(guard, model)
    refused(lambda: guard.load_state_dict({**_good_state(), "fallback": {"0": "float32", "2": "float32"}}),
            ValueError, "mixprec.guard.ForwardGuard.load_state_dict: ", "state['fallback']['2']")
    _assert_guard_unchanged(guard, model, snap)


# ---- the other public callables with arguments ------------------------------------------
# (the ops, nn modules and GradScaler's numbers: test_bad_input_matrix.py;
# GradScaler's optimizer argument: test_bad_inputs.py; parity, Recipe and
# the Lightning plugin: test_bad_input_faces_parity.py)


@pytest.mark.parametrize("cls", [AdamW, SGD])
@pytest.mark.parametrize("closure,word", [(3, "int"), ("loss", "str"), (torch.zeros(1), "Tensor")])
def test_step_closure(cls, closure, word):
    """step(closure) takes a function: anything else was Python's "'int'
    object is not callable", after the swap check and before the step."""
    params, opt = _stepped(cls)
    snap = _optimizer_snapshot(opt, params)
    refused(lambda: opt.step(closure), TypeError, f"mixprec.optim.{cls.__name__}.step: ", "closure", word)
    _assert_optimizer_unchanged(opt, params, snap)


@pytest.mark.parametrize("cls", [AdamW, SGD])
@pytest.mark.parametrize("method", ["swap_ema", "sync_master_weights"])
def test_no_argument_methods(cls, method):
    """swap_ema() (which accepted an argument silently) and
    sync_master_weights() take none, as memory_report()."""
    params, opt = _stepped(cls)
    snap = _optimizer_snapshot(opt, params)
    where = f"mixprec.optim.{cls.__name__}.{method}: "
    refused(lambda: getattr(opt, method)(True), TypeError, where + "takes no arguments, got 1", "bool")
    refused(lambda: getattr(opt, method)(model=None), TypeError, where + "takes no arguments, got 1", "model=")
    _assert_optimizer_unchanged(opt, params, snap)


def _ema_setup():
    model = _model()
    opt = AdamW(model.parameters(), lr=1e-2, ema_decay=0.9)
    model(torch.randn(2, 3)).sum().backward()
    opt.step()
    return model, opt


EMA_MODEL_BAD = [
    (dict(model=None), TypeError, "model"),
    (dict(model=[torch.nn.Linear(3, 4)]), TypeError, "model"),
    (dict(optimizer="adamw"), TypeError, "optimizer"),
    (dict(optimizer=torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)), TypeError, "optimizer"),
    (dict(dtype="bfloat16"), TypeError, "dtype"),
    (dict(dtype=torch.float32.itemsize), TypeError, "dtype"),
    (dict(dtype=torch.int32), ValueError, "dtype"),
]


@pytest.mark.parametrize("kw,exc,word", EMA_MODEL_BAD, ids=[repr(c[0])[:50] for c in EMA_MODEL_BAD])
def test_ema_model(kw, exc, word):
    """A bad model was an AttributeError, a bad dtype torch's "Invalid
    device string" or nn.Module.to's error after the model was copied."""
    from mixprec.optim import ema_model

    model, opt = _ema_setup()
    params = list(model.parameters())
    snap = _optimizer_snapshot(opt, params)
    refused(lambda: ema_model(**{"model": model, "optimizer": opt, **kw}), exc, "mixprec.optim.ema_model: ", word)
    _assert_optimizer_unchanged(opt, params, snap)
    assert isinstance(ema_model(model, opt, dtype=torch.float32), torch.nn.Module)


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_scaler_unscale_return_norm(bad):
    """return_norm is a flag: a string was taken as True."""
    from mixprec.amp import GradScaler

    model = _model()
    opt = AdamW(model.parameters(), lr=1e-2)
    scaler = GradScaler("cpu", init_scale=4.0)
    scaler.scale(model(torch.randn(2, 3)).sum()).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    state = copy.deepcopy(scaler.state_dict())
    refused(lambda: scaler.unscale_(opt, return_norm=bad), TypeError, "mixprec.amp.GradScaler.unscale_: ",
            "return_norm")
    assert all(same(p.grad, g) for p, g in zip(model.parameters(), grads))  # not unscaled
    assert scaler.state_dict() == state
    assert torch.isfinite(scaler.unscale_(opt, return_norm=True))


@pytest.mark.parametrize("k,exc", [("3", TypeError), (2.5, TypeError), (None, TypeError), (-1, ValueError),
                                   (NAN, ValueError)])
def test_training_health_most_overflowed(k, exc):
    from mixprec.amp import TrainingHealth

    health = TrainingHealth([1.0, 1.0], [False, True], [1.0, INF], {"a": 2, "b": 1})
    refused(lambda: health.most_overflowed(k), exc, "mixprec.amp.TrainingHealth.most_overflowed: ", "k ")
    assert health.overflow_counts == {"a": 2, "b": 1}
    assert health.most_overflowed(1) == [("a", 2)] and health.most_overflowed(2.0) == [("a", 2), ("b", 1)]


@pytest.mark.parametrize("bad", [3, None, "scaler", torch.amp.GradScaler("cpu")], ids=["int", "None", "str", "torch"])
def test_guard_attach(bad):
    """attach(scaler) of something that is not mixprec's GradScaler is a
    TypeError naming the argument (it was a RuntimeError); mixprec's scaler
    with diagnostics off stays a RuntimeError (test_guard.py)."""
    model = _model()
    guard = ForwardGuard(model, fallback=True)
    model(torch.randn(2, 3))
    snap = _guard_snapshot(guard, model)
    refused(lambda: guard.attach(bad), TypeError, "mixprec.guard.ForwardGuard.attach: ", "scaler must be",
            type(bad).__name__)
    assert guard._scaler is None
    _assert_guard_unchanged(guard, model, snap)


@pytest.mark.parametrize("bad,exc", [("1", TypeError), ([0.0], TypeError), (torch.zeros(2), ValueError),
                                     (None, TypeError)])
def test_guard_on_scaler_step(bad, exc):
    """The scaler's listener hook checks found_inf as step() does (its
    messages are step's: the hook is step)."""
    model = _model()
    guard = ForwardGuard(model, fallback=True)
    model(torch.randn(2, 3))
    snap = _guard_snapshot(guard, model)
    refused(lambda: guard.on_scaler_step(bad), exc, "mixprec.guard.ForwardGuard.", "found_inf")
    _assert_guard_unchanged(guard, model, snap)


# ---- mixprec.amp.GradScaler: constructor, load_state_dict, no-argument methods ------------


def _scaler_step(scaler, model, opt, found_inf=False):
    loss = model(torch.randn(2, 3)).sum()
    scaler.scale(loss * (INF if found_inf else 1.0)).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()


def _stepped_scaler(**kw):
    from mixprec.amp import GradScaler

    model = _model()
    opt = AdamW(model.parameters(), lr=1e-2)
    scaler = GradScaler("cpu", init_scale=4.0, growth_interval=3, hysteresis=2, diagnostics=True, **kw)
    for inf in (False, True, True, False):
        _scaler_step(scaler, model, opt, inf)
    return scaler, model, opt


SCALER_CTOR_BAD = [
    (dict(device=3), TypeError, "device"),
    (dict(device=None), TypeError, "device"),
    (dict(device="nowhere"), ValueError, "device"),
    (dict(enabled="yes"), TypeError, "enabled"),
    (dict(enabled=1), TypeError, "enabled"),
    (dict(device="cuda", enabled="no"), TypeError, "enabled"),  # not read as True (nor warned about)
    (dict(diagnostics="yes"), TypeError, "diagnostics"),
    (dict(diagnostics=None), TypeError, "diagnostics"),
    (dict(process_group="world"), TypeError, "process_group"),
    (dict(process_group=3), TypeError, "process_group"),
]


def test_scaler_constructor_valid_calls():
    from mixprec.amp import GradScaler

    assert GradScaler("cpu", enabled=True, diagnostics=True).is_enabled()
    assert GradScaler(torch.device("cpu")).is_enabled()
    assert not GradScaler("cpu", enabled=False).is_enabled()
    assert not GradScaler("cuda", enabled=False, process_group=None).is_enabled()


@pytest.mark.parametrize("kw,exc,word", SCALER_CTOR_BAD, ids=[str(c[0]) for c in SCALER_CTOR_BAD])
def test_scaler_constructor(kw, exc, word):
    """device, enabled, diagnostics and process_group are checked first (a
    str for a flag was read as its truth, device=3 kept as "3"), before
    the no-CUDA warning."""
    import warnings

    from mixprec.amp import GradScaler

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        refused(lambda: GradScaler(**{"device": "cpu", **kw}), exc, "mixprec.amp.GradScaler: ", word)
    assert not caught, [str(w.message) for w in caught]


def _scaler_dict(**edit):
    sd = {"scale": 8.0, "growth_factor": 4.0, "backoff_factor": 0.25, "growth_interval": 5, "_growth_tracker": 2,
          "hysteresis": 3, "min_scale": 1.0, "max_scale": 1024.0, "_hysteresis_tracker": 2, "_skipped_steps": 7}
    for k, v in edit.items():
        if v is KeyError:
            del sd[k]
        else:
            sd[k] = v
    return sd


SCALER_LOAD_BAD = [
    (3, TypeError, "state_dict"),
    ([("scale", 8.0)], TypeError, "state_dict"),
    (_scaler_dict(scale="x"), TypeError, "state_dict['scale']"),
    (_scaler_dict(scale=NAN), ValueError, "state_dict['scale']"),
    (_scaler_dict(scale=-1.0), ValueError, "state_dict['scale']"),
    (_scaler_dict(scale=0.0), ValueError, "state_dict['scale']"),
    (_scaler_dict(scale=INF), ValueError, "state_dict['scale']"),
    (_scaler_dict(scale=None), TypeError, "state_dict['scale']"),
    (_scaler_dict(scale=KeyError), ValueError, "'scale'"),
    (_scaler_dict(growth_factor=1.0), ValueError, "state_dict['growth_factor']"),
    (_scaler_dict(growth_factor="2"), TypeError, "state_dict['growth_factor']"),
    (_scaler_dict(backoff_factor=1.5), ValueError, "state_dict['backoff_factor']"),
    (_scaler_dict(backoff_factor=0.0), ValueError, "state_dict['backoff_factor']"),
    (_scaler_dict(growth_interval=2.5), TypeError, "state_dict['growth_interval']"),
    (_scaler_dict(growth_interval=0), ValueError, "state_dict['growth_interval']"),
    (_scaler_dict(_growth_tracker=-1), ValueError, "state_dict['_growth_tracker']"),
    (_scaler_dict(_growth_tracker=2**40), ValueError, "state_dict['_growth_tracker']"),
    (_scaler_dict(hysteresis=0), ValueError, "state_dict['hysteresis']"),
    (_scaler_dict(hysteresis=True), TypeError, "state_dict['hysteresis']"),
    (_scaler_dict(min_scale=-1.0), ValueError, "state_dict['min_scale']"),
    (_scaler_dict(min_scale=4096.0), ValueError, "state_dict['min_scale']"),
    (_scaler_dict(max_scale=NAN), ValueError, "state_dict['max_scale']"),
    (_scaler_dict(_hysteresis_tracker="1"), TypeError, "state_dict['_hysteresis_tracker']"),
    # the last key bad: nothing before it is applied either
    (_scaler_dict(_skipped_steps=-1), ValueError, "state_dict['_skipped_steps']"),
    (_scaler_dict(_skipped_steps=1.5), TypeError, "state_dict['_skipped_steps']"),
]


def test_scaler_load_state_dict_valid_calls():
    from mixprec.amp import GradScaler

    scaler, model, opt = _stepped_scaler()
    scaler.load_state_dict(_scaler_dict())
    assert scaler.state_dict() == _scaler_dict()
    scaler.load_state_dict(_scaler_dict(scale=torch.tensor(16.0), hysteresis=KeyError, min_scale=KeyError,
                                        max_scale=KeyError, _hysteresis_tracker=KeyError, _skipped_steps=KeyError))
    assert scaler.state_dict() == _scaler_dict(scale=16.0, _hysteresis_tracker=3)  # reset to hysteresis when absent
    theirs = torch.amp.GradScaler("cpu", init_scale=32.0, growth_interval=9)
    scaler.load_state_dict(theirs.state_dict())
    assert scaler.state_dict() == _scaler_dict(scale=32.0, growth_factor=2.0, backoff_factor=0.5,
                                               growth_interval=9, _growth_tracker=0, _hysteresis_tracker=3)
    _scaler_step(scaler, model, opt)
    GradScaler("cpu", enabled=False).load_state_dict({})  # a disabled scaler loads nothing, as torch's


@pytest.mark.parametrize("case", range(len(SCALER_LOAD_BAD)))
def test_scaler_load_state_dict(case):
    """Everything is checked before anything is applied: a refused dict
    leaves state_dict() as it was (torch's part was applied first, and
    fill_ of a str scale was torch's error; a NaN or negative scale was
    taken)."""
    bad, exc, word = SCALER_LOAD_BAD[case]
    scaler, model, opt = _stepped_scaler()
    state = copy.deepcopy(scaler.state_dict())
    given = copy.deepcopy(bad)
    refused(lambda: scaler.load_state_dict(bad), exc, "mixprec.amp.GradScaler.load_state_dict: ", word)
    assert same(bad, given)
    assert scaler.state_dict() == state
    _scaler_step(scaler, model, opt)  # still steps


@pytest.mark.parametrize("method", ["get_skipped_steps", "last_overflow", "last_grad_norms", "health", "state_dict"])
def test_scaler_no_argument_methods(method):
    scaler, model, opt = _stepped_scaler()
    state = copy.deepcopy(scaler.state_dict())
    where = f"mixprec.amp.GradScaler.{method}: "
    refused(lambda: getattr(scaler, method)(1), TypeError, where + "takes no arguments, got 1 (int)")
    refused(lambda: getattr(scaler, method)(keep_vars=True), TypeError, where + "takes no arguments, got 1",
            "keep_vars=")
    assert scaler.state_dict() == state
    getattr(scaler, method)()


@pytest.mark.parametrize("method", ["remove", "report", "reports", "health_summary", "state_dict"])
def test_guard_no_argument_methods(method):
    model = _model()
    guard = ForwardGuard(model, fallback=True)
    model(torch.randn(2, 3))
    snap = _guard_snapshot(guard, model)
    where = f"mixprec.guard.ForwardGuard.{method}: "
    refused(lambda: getattr(guard, method)(1), TypeError, where + "takes no arguments, got 1 (int)")
    refused(lambda: getattr(guard, method)(full=True), TypeError, where + "takes no arguments, got 1", "full=")
    _assert_guard_unchanged(guard, model, snap)  # the hooks were not removed


@pytest.mark.parametrize("cls", [AdamW, SGD])
def test_optimizer_state_dict_takes_no_arguments(cls):
    params, opt = _stepped(cls)
    snap = _optimizer_snapshot(opt, params)
    where = f"mixprec.optim.{cls.__name__}.state_dict: "
    refused(lambda: opt.state_dict(1), TypeError, where + "takes no arguments, got 1 (int)")
    refused(lambda: opt.state_dict(keep_vars=True), TypeError, where + "takes no arguments, got 1", "keep_vars=")
    _assert_optimizer_unchanged(opt, params, snap)


def test_memory_report_per_param_takes_no_arguments():
    params, opt = _stepped(AdamW)
    report = opt.memory_report()
    refused(lambda: report.per_param(1), TypeError, "mixprec.optim.MemoryReport.per_param: takes no arguments, got 1")
    assert report.per_param()["total"] > 0


def test_patch_torchvision_takes_no_arguments():
    import sys

    from mixprec import ops

    loaded = "torchvision" in sys.modules
    refused(lambda: ops.patch_torchvision(True), TypeError,
            "mixprec.ops.patch_torchvision: takes no arguments, got 1 (bool)")
    assert ("torchvision" in sys.modules) == loaded  # nothing imported, nothing patched


def test_torchvision_patch_undo_takes_no_arguments():
    from mixprec import ops
    from mixprec._nms import TorchvisionPatch

    holder, original = type("Holder", (), {})(), print
    patch = TorchvisionPatch({(holder, "f"): original})
    refused(lambda: patch.undo(True), TypeError, "mixprec.ops.TorchvisionPatch.undo: takes no arguments, got 1 (bool)")
    assert patch._saved and not hasattr(holder, "f")  # nothing restored
    patch.undo()
    assert holder.f is original and patch._saved == {}
    assert ops.patch_torchvision is not None


@pytest.mark.parametrize("args", [(3, torch.randn(2, 3)), (torch.randn(2, 3), "t"), (None, None)])
def test_soft_target_cross_entropy_refuses_non_tensors(args):
    from mixprec import nn as mnn

    name = "x" if not isinstance(args[0], torch.Tensor) else "target"
    refused(lambda: mnn.SoftTargetCrossEntropy()(*args), TypeError,
            f"mixprec.nn.SoftTargetCrossEntropy: {name} must be a tensor")


# ---- mixprec.ops and mixprec.nn: non-tensors and flags ---------------------------------------


def _ops_cases():
    from mixprec import ops

    x, t = torch.randn(4, 5).half(), torch.tensor([0, 1, 2, 3])
    boxes = torch.rand(1, 8, 4)
    boxes[..., 2:] += boxes[..., :2]
    scores = torch.rand(1, 8, 3)
    return [
        ("softmax", lambda: ops.softmax(3, 1), TypeError, "x"),
        ("log_softmax", lambda: ops.log_softmax([1.0, 2.0], 0), TypeError, "x"),
        ("cross_entropy", lambda: ops.cross_entropy(3, t), TypeError, "input"),
        ("cross_entropy", lambda: ops.cross_entropy(x, [0, 1, 2, 3]), TypeError, "target"),
        ("cross_entropy", lambda: ops.cross_entropy(x, t, weight="w"), TypeError, "weight"),
        ("cross_entropy", lambda: ops.cross_entropy(x, t, reduction=["mean"]), TypeError, "reduction"),
        ("unscale_", lambda: ops.unscale_(3, torch.zeros(1), torch.ones(1)), TypeError, "grads"),
        ("grad_norm", lambda: ops.grad_norm(None, torch.zeros(1), torch.ones(1)), TypeError, "grads"),
        ("efficient_nms", lambda: ops.efficient_nms(boxes, scores, class_agnostic="y"), TypeError, "class_agnostic"),
        ("efficient_nms", lambda: ops.efficient_nms(boxes, scores, class_agnostic=1), TypeError, "class_agnostic"),
    ]


@pytest.mark.parametrize("case", range(10))
def test_ops_non_tensors_and_flags(case):
    """A number for a tensor was an AttributeError or "'int' object is not
    iterable"; a str for a flag was read as True."""
    name, call, exc, word = _ops_cases()[case]
    refused(call, exc, f"mixprec.ops.{name}: ", word)


@pytest.mark.parametrize("bad", ["y", 1, None])
def test_ops_unscale_return_norm(bad):
    from mixprec import ops

    grads = [torch.full((3,), 4.0), torch.full((2,), 8.0).bfloat16()]
    found_inf, inv = torch.zeros(1), torch.full((1,), 0.5)
    refused(lambda: ops.unscale_(grads, found_inf, inv, return_norm=bad), TypeError, "mixprec.ops.unscale_: ",
            "return_norm")
    assert same(grads, [torch.full((3,), 4.0), torch.full((2,), 8.0).bfloat16()])  # not unscaled
    assert found_inf.item() == 0.0
    _per, total = ops.unscale_(grads, found_inf, inv, return_norm=True)
    assert torch.isfinite(total)


NN_BAD = [
    ("Softmax", dict(dim="1"), TypeError, "dim"),
    ("Softmax", dict(dim=1.5), TypeError, "dim"),
    ("Softmax", dict(dim=None), TypeError, "dim"),
    ("LogSoftmax", dict(dim="1"), TypeError, "dim"),
    ("CrossEntropyLoss", dict(weight="w"), TypeError, "weight"),
    ("CrossEntropyLoss", dict(weight=[1.0, 2.0]), TypeError, "weight"),
]


@pytest.mark.parametrize("cls,kw,exc,word", NN_BAD, ids=[f"{c[0]}-{c[1]}" for c in NN_BAD])
def test_nn_constructors(cls, kw, exc, word):
    """Softmax(dim) is checked when built (it was refused only at forward);
    a non-tensor weight was torch's register_buffer error."""
    import mixprec.nn as mnn

    refused(lambda: getattr(mnn, cls)(**kw), exc, f"mixprec.nn.{cls}: ", word)
    assert mnn.Softmax(1)(torch.randn(2, 3)).shape == (2, 3)
    assert mnn.CrossEntropyLoss(weight=torch.ones(3))(torch.randn(2, 3), torch.tensor([0, 2])).isfinite()


@pytest.mark.parametrize("direction,exc", [("up", ValueError), ("Higher", ValueError), (None, TypeError),
                                           (1, TypeError)])
def test_metric_diff_direction(direction, exc):
    """An unknown direction was accepted and a KeyError in target_text()."""
    from mixprec.parity import MetricDiff

    refused(lambda: MetricDiff("acc", [0.5], [0.5], 0.1, direction=direction), exc, "mixprec.parity.MetricDiff: ",
            "direction")
    for d in ("both", "higher", "lower"):
        assert MetricDiff("acc", [0.5], [0.4], 0.2, direction=d).target_text().endswith(": met")
