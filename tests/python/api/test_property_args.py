"""Property tests of the Python faces' argument checks (issue 39 item 6):
random argument types and values thrown at ForwardGuard (constructor,
step, fallback, load_state_dict) and at the optimizers' lean-state options
(constructor, add_param_group, load_state_dict, fp32_state). Every call
either works or raises TypeError / ValueError / RuntimeError (an unknown
module name: a KeyError that is also a ValueError) with a message naming
the callable, and a refused call leaves the guard, model and
optimizer exactly as they were. Bounded and derandomized (the same
examples on every run): a few seconds."""

import copy
import math

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mixprec.guard import ForwardGuard  # noqa: E402
from _lean_params import make_params, step
from mixprec.optim import SGD, AdamW  # noqa: E402

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))
REFUSALS = (TypeError, ValueError, RuntimeError)

# Junk: values of every kind a caller might pass by mistake.
JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8), st.sampled_from(["float32", "bfloat16", "float16", "0", "", "uint8", "torch.float32"]),
    st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.uint8, torch.int32, torch.float64]),
    st.builds(torch.zeros, st.sampled_from([(), (1,), (2,), (2, 2)])),
    st.lists(st.integers(0, 2), max_size=3), st.tuples(st.floats(0, 1), st.floats(0, 1)),
    st.sampled_from([torch.nn.Linear(2, 2), torch.nn.Linear, object(), math.sqrt, {}, {"a": 1}]),
)


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):  # in order: keys that are objects are other objects in a deep copy
        return (isinstance(b, dict) and len(a) == len(b)
                and all(same(ka, kb) and same(va, vb) for (ka, va), (kb, vb) in zip(a.items(), b.items())))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, (bool, int, float, str, bytes, type(None), torch.dtype)):
        return a == b or (a != a and b != b)
    return type(a) is type(b)  # modules, functions, objects: deep copies are other objects


def refused(exc, name):
    assert isinstance(exc, REFUSALS), f"{type(exc).__name__}: {exc}"
    assert name in str(exc), f"{name!r} not in {exc}"


# ---- ForwardGuard ----------------------------------------------------------------


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 2))


def _untouched(model, values):
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    assert all(same(p.detach(), v) for p, v in zip(model.parameters(), values))


@SETTINGS
@given(st.dictionaries(st.sampled_from(["fallback", "after", "fallback_dtype", "optimizer", "backward",
                                        "move_params"]), JUNK, max_size=3))
def test_guard_constructor(kw):
    model = _model()
    values = [p.detach().clone() for p in model.parameters()]
    try:
        guard = ForwardGuard(model, **kw)
    except Exception as e:  # noqa: BLE001
        refused(e, "mixprec.guard.ForwardGuard")
        _untouched(model, values)
    else:
        guard.remove()


@SETTINGS
@given(st.one_of(st.fixed_dictionaries({"found_inf": JUNK}), st.fixed_dictionaries({"loss": JUNK})))
def test_guard_step(kw):
    guard = ForwardGuard(_model())
    try:
        guard.step(**kw)
    except Exception as e:  # noqa: BLE001
        refused(e, "mixprec.guard.ForwardGuard.step")
        assert guard.steps == 0 and guard.report() is None


@SETTINGS
@given(st.one_of(JUNK, st.sampled_from(["0", "1", "<model>", "nope"])), JUNK, JUNK)
def test_guard_fallback(name, dtype, why):
    model = _model()
    guard = ForwardGuard(model)
    before = guard.state_dict()
    try:
        guard.fallback(name, dtype, why)
    except Exception as e:  # noqa: BLE001
        refused(e, "mixprec.guard.ForwardGuard.fallback")
        assert guard.state_dict() == before
        assert all("forward" not in m.__dict__ for m in model.modules())


GUARD_STATE = st.one_of(
    JUNK,
    st.dictionaries(
        st.one_of(st.sampled_from(["fallback", "counts", "events", "steps"]), JUNK.filter(lambda v: _hashable(v))),
        st.one_of(
            JUNK,
            st.dictionaries(st.one_of(st.sampled_from(["0", "1", "<model>", "nope"]), st.integers(0, 2)),
                            JUNK, max_size=2),
            st.lists(st.one_of(JUNK, st.tuples(JUNK, JUNK, JUNK, JUNK), st.tuples(
                st.sampled_from(["0", "1"]), st.integers(-1, 3), st.sampled_from(["float32", "float16"]),
                st.text(max_size=3))), max_size=2),
        ),
        max_size=4,
    ),
)


def _hashable(v):
    try:
        hash(v)
    except TypeError:
        return False
    return True


@SETTINGS
@given(GUARD_STATE)
def test_guard_load_state_dict(state):
    model = _model()
    guard = ForwardGuard(model)
    guard.step(found_inf=0.0)
    before, given_state = guard.state_dict(), copy.deepcopy(state)
    try:
        guard.load_state_dict(state)
    except Exception as e:  # noqa: BLE001
        refused(e, "mixprec.guard.ForwardGuard.load_state_dict")
        assert guard.state_dict() == before
        assert all("forward" not in m.__dict__ for m in model.modules())
    else:
        guard.step(found_inf=0.0)  # a loaded guard works
        x = torch.randn(2, 3)
        model(x)
    assert same(state, given_state)


# ---- lean optimizer options ------------------------------------------------------


LEAN_OPTIONS = st.dictionaries(
    st.sampled_from(["param_remainders", "master_weights", "exp_avg_dtype", "exp_avg_sq_dtype", "momentum_dtype",
                     "seed", "ema_decay"]),
    JUNK, max_size=3,
)
DTYPES = st.sampled_from([torch.bfloat16, torch.float16, torch.float32])


@SETTINGS
@given(st.sampled_from([AdamW, SGD]), DTYPES, LEAN_OPTIONS)
def test_lean_options_in_the_constructor(cls, dtype, kw):
    params = make_params(dtype)
    values = [p.detach().clone() for p in params]
    if cls is SGD:
        kw.pop("exp_avg_dtype", None), kw.pop("exp_avg_sq_dtype", None)
    else:
        kw.pop("momentum_dtype", None)
    try:
        opt = cls(params, lr=1e-2, **kw)
    except Exception as e:  # noqa: BLE001
        assert isinstance(e, REFUSALS), f"{type(e).__name__}: {e}"
        assert all(same(p.detach(), v) for p, v in zip(params, values))
    else:
        step(opt, params)  # an accepted configuration steps


@SETTINGS
@given(st.sampled_from([AdamW, SGD]), DTYPES, DTYPES, LEAN_OPTIONS)
def test_add_param_group_with_lean_options(cls, dtype, new_dtype, kw):
    params = make_params(dtype)
    opt = cls(params, lr=1e-2)
    step(opt, params)
    before, n = copy.deepcopy(opt.state_dict()), len(opt.param_groups)
    extra = torch.nn.Parameter(torch.randn(5).to(new_dtype))
    try:
        opt.add_param_group({"params": [extra], **kw})
    except Exception as e:  # noqa: BLE001
        assert isinstance(e, REFUSALS), f"{type(e).__name__}: {e}"
        assert len(opt.param_groups) == n and same(opt.state_dict(), before)
        step(opt, params, seed=3)
    else:
        step(opt, params + [extra], seed=3)


def _paths(sd):
    """The keys a mutation may replace: each group option, each state entry."""
    out = [("param_groups", 0, k) for k in sd["param_groups"][0]]
    out += [("state", i, k) for i, s in sd["state"].items() for k in s]
    out += [("state", 0), ("param_groups", 0), ("state",), ("param_groups",)]
    return out


@SETTINGS
@given(st.sampled_from([AdamW, SGD]), DTYPES, st.sampled_from(["plain", "lean"]), st.data())
def test_load_state_dict_of_mutated_dicts(cls, dtype, mode, data):
    lean = {}
    if mode == "lean":
        lean = dict(param_remainders=dtype is torch.bfloat16,
                    **({"exp_avg_dtype": torch.uint8} if cls is AdamW else {"momentum_dtype": torch.bfloat16}))
    kw = dict(momentum=0.9) if cls is SGD else {}
    params = make_params(dtype)
    opt = cls(params, lr=1e-2, **kw, **lean)
    step(opt, params)
    sd = copy.deepcopy(opt.state_dict())
    path = data.draw(st.sampled_from(_paths(sd)))
    value = data.draw(JUNK)
    target = sd
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    given_sd, before = copy.deepcopy(sd), copy.deepcopy(opt.state_dict())
    values = [p.detach().clone() for p in params]
    try:
        opt.load_state_dict(sd)
    except Exception as e:  # noqa: BLE001
        refused(e, f"mixprec.optim.{cls.__name__}.load_state_dict")
        assert same(opt.state_dict(), before)
        assert all(same(p.detach(), v) for p, v in zip(params, values))
    step(opt, params, seed=3)  # refused or accepted, the optimizer steps
    assert same(sd, given_sd)


@SETTINGS
@given(JUNK)
def test_fp32_state_of_junk(p):
    params = make_params(torch.bfloat16)
    opt = AdamW(params, lr=1e-2, param_remainders=True)
    step(opt, params)
    before = copy.deepcopy(opt.state_dict())
    with pytest.raises(REFUSALS) as info:
        opt.fp32_state(p)
    assert "fp32_state" in str(info.value)
    assert same(opt.state_dict(), before)
