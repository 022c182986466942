"""torch's own generic optimizer and grad-scaling test machinery, pointed at
mixprec (issue 14): every configuration torch's OptimizerInfo database
(torch.testing._internal.common_optimizers) lists for AdamW and SGD, with
torch's flags (fused, foreach), drives mixprec.optim.AdamW / SGD through the
generic checks below against torch's optimizer built from the same
OptimizerInput; and torch's scaling helpers (common_cuda's
_create_scaling_case) run mixprec's GradScaler the way torch's own
test_grad_scaling_* tests run theirs. The installed torch's library is used;
no upstream test file is copied."""

import copy

import pytest
import torch

from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

import mixprec

common_optimizers = pytest.importorskip("torch.testing._internal.common_optimizers")
common_cuda = pytest.importorskip("torch.testing._internal.common_cuda")

OURS = {torch.optim.AdamW: mixprec.optim.AdamW, torch.optim.SGD: mixprec.optim.SGD}


def _cases():
    out = []
    for info in common_optimizers.optim_db:
        if info.optim_cls not in OURS:
            continue
        inputs = common_optimizers._get_optim_inputs_including_global_cliquey_kwargs(
            "cpu", torch.float32, info, skip=("differentiable",)
        )
        for inp in inputs:
            out.append(pytest.param(info.optim_cls, inp, id=f"{info.optim_cls.__name__}-{inp.desc}"))
            # foreach is not in torch's CPU list; mixprec takes it too.
            kw = dict(inp.kwargs, foreach=True)
            kw.pop("fused", None)
            out.append(pytest.param(info.optim_cls, common_optimizers.OptimizerInput(None, kw, inp.desc + " & foreach"),
                                    id=f"{info.optim_cls.__name__}-{inp.desc}-foreach"))
    return out


def _params(dtype, seed):
    g = torch.Generator().manual_seed(seed)
    shapes = [(7, 5), (5,), (3, 4, 2), (1,)]
    return [torch.nn.Parameter(torch.randn(s, generator=g).to(dtype)) for s in shapes]


def _kwargs(inp):
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inp.kwargs.items()}


def _torch_kwargs(inp):
    kw = _kwargs(inp)
    if kw.get("foreach") and isinstance(kw.get("lr"), torch.Tensor):
        kw.pop("foreach")  # torch refuses a Tensor lr with foreach=True unless capturable
    return kw


def _grads(params, seed, step):
    g = torch.Generator().manual_seed(1000 * seed + step)
    return [torch.randn(p.shape, generator=g) for p in params]


def _steps_like_torch(ours, ref, opt, ref_opt, *, seed, steps):
    """FP32 params: ``steps`` steps of both optimizers on the same gradients,
    then ours equal torch's within FP32 rounding."""
    for step in range(steps):
        for p, r, g in zip(ours, ref, _grads(ours, seed, step)):
            p.grad, r.grad = g.clone(), g.clone()
        opt.step()
        ref_opt.step()
    for p, r in zip(ours, ref):
        torch.testing.assert_close(p, r, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("torch_cls,inp", _cases())
def test_steps_like_torch(torch_cls, inp):
    """FP32 params: 4 steps equal torch's optimizer with the same kwargs."""
    ours, ref = _params(torch.float32, 0), _params(torch.float32, 0)
    opt = OURS[torch_cls](ours, **_kwargs(inp))
    ref_opt = torch_cls(ref, **_torch_kwargs(inp))
    _steps_like_torch(ours, ref, opt, ref_opt, seed=0, steps=4)


@pytest.mark.parametrize("torch_cls,inp", _cases())
def test_half_params_master_like_torch_on_fp32(torch_cls, inp):
    """BF16 params: the FP32 masters equal torch's optimizer on the FP32
    upcast of the same params given the same (BF16) gradients."""
    ours = _params(torch.bfloat16, 1)
    ref = [torch.nn.Parameter(p.detach().float()) for p in ours]
    opt = OURS[torch_cls](ours, **_kwargs(inp))
    ref_opt = torch_cls(ref, **_torch_kwargs(inp))
    for step in range(3):
        for p, r, g in zip(ours, ref, _grads(ours, 1, step)):
            p.grad, r.grad = g.bfloat16(), g.bfloat16().float()
        opt.step()
        ref_opt.step()
    for p, r in zip(ours, ref):
        torch.testing.assert_close(opt.state[p]["master"], r.detach(), rtol=2e-6, atol=1e-7)
        assert torch.equal(p, opt.state[p]["master"].bfloat16())


@pytest.mark.parametrize("torch_cls,inp", _cases())
def test_state_dict_round_trip(torch_cls, inp):
    """state_dict after 2 steps, loaded into a fresh optimizer over copies
    of the params: the next steps are bitwise the same as continuing."""
    params = _params(torch.bfloat16, 2)
    opt = OURS[torch_cls](params, **_kwargs(inp))
    for step in range(2):
        for p, g in zip(params, _grads(params, 2, step)):
            p.grad = g.bfloat16()
        opt.step()
    clones = [torch.nn.Parameter(p.detach().clone()) for p in params]
    fresh = OURS[torch_cls](clones, **_kwargs(inp))
    fresh.load_state_dict(copy.deepcopy(opt.state_dict()))
    for step in range(2, 4):
        for p, c, g in zip(params, clones, _grads(params, 2, step)):
            p.grad, c.grad = g.bfloat16(), g.bfloat16()
        opt.step()
        fresh.step()
    for p, c in zip(params, clones):
        assert torch.equal(p, c)
        assert torch.equal(opt.state[p]["master"], fresh.state[c]["master"])


@pytest.mark.parametrize("torch_cls,inp", _cases())
def test_param_groups_and_zero_grad(torch_cls, inp):
    """Two param groups with different lr (torch's generic check of
    per-group hyper-parameters), then zero_grad(set_to_none) as torch's."""
    ours, ref = _params(torch.float32, 3), _params(torch.float32, 3)
    kw = _kwargs(inp)
    lr = float(kw.pop("lr", 1e-3))
    tkw = _torch_kwargs(inp)
    tkw.pop("lr", None)
    opt = OURS[torch_cls]([{"params": ours[:2]}, {"params": ours[2:], "lr": lr * 3}], lr=lr, **kw)
    ref_opt = torch_cls([{"params": ref[:2]}, {"params": ref[2:], "lr": lr * 3}], lr=lr, **tkw)
    _steps_like_torch(ours, ref, opt, ref_opt, seed=3, steps=2)
    opt.zero_grad()
    assert all(p.grad is None for p in ours)


def _run_scaling(data, model, optimizer, scaler, loss_fn, skip_iter, try_scaling_api):
    """What torch's test_grad_scaling_* tests do with these helpers: the
    scaled run gets an inf at skip_iter; the control run skips that step."""
    for i, (inp, target) in enumerate(data):
        optimizer.zero_grad()
        loss = loss_fn(model(inp), target)
        if try_scaling_api:
            scaler.scale(loss).backward()
            if i == skip_iter and scaler.is_enabled():
                with torch.no_grad():
                    model[1].weight.grad.fill_(float("inf"))
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            if (not scaler.is_enabled()) or (i != skip_iter):
                optimizer.step()


@pytest.mark.parametrize("optimizer_ctor,kwargs", [
    (mixprec.optim.SGD, {}), (mixprec.optim.SGD, {"momentum": 0.9}),
    (mixprec.optim.AdamW, {"lr": 0.01}), (mixprec.optim.AdamW, {"lr": 0.01, "amsgrad": True}),
])
@pytest.mark.parametrize("unscale_first", [False, True])
def test_torch_scaling_case_with_mixprec_scaler(optimizer_ctor, kwargs, unscale_first):
    torch.manual_seed(0)
    (mod_control, mod_scaling, opt_control, opt_scaling, data, loss_fn, skip_iter) = common_cuda._create_scaling_case(
        device="cpu", optimizer_ctor=optimizer_ctor, optimizer_kwargs=kwargs
    )
    scaler = mixprec.amp.GradScaler("cpu", init_scale=128.0, growth_factor=2.0, growth_interval=1)
    _run_scaling(data, mod_control, opt_control, scaler, loss_fn, skip_iter, False)
    if unscale_first:
        # torch's variant where the user unscales (e.g. to clip) before step.
        orig_step = scaler.step

        def step(opt, *a, **k):
            scaler.unscale_(opt)
            return orig_step(opt, *a, **k)

        scaler.step = step
    _run_scaling(data, mod_scaling, opt_scaling, scaler, loss_fn, skip_iter, True)
    # 4 iterations, one skipped: 3 growths, 1 backoff (torch's expectation).
    assert scaler.get_scale() == 128.0 * 2.0 ** 3 * 0.5 ** 1
    assert scaler.get_skipped_steps() == 1
    for c, s in zip(mod_control.parameters(), mod_scaling.parameters()):
        torch.testing.assert_close(c, s, rtol=1e-5, atol=1e-7)


# ---- torch's hook and mutation rules, for every configuration -----------------------


def _pre_edit(opt, sd):
    sd["param_groups"][0]["lr"] = 0.002


def _pre_replace(opt, sd):
    sd = copy.deepcopy(sd)
    sd["param_groups"][0]["lr"] = 0.003
    return sd


def _post_mark(opt):
    # Non-dict entries in optimizer.state, as torch's own test adds them.
    opt.state["ran_load_state_dict_pre_hook2"] = opt.param_groups[0]["lr"] == 0.003
    opt.state["ran_load_state_dict_post_hook"] = True


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("torch_cls,inp", _cases())
def test_load_state_dict_hooks_as_torch(torch_cls, inp, dtype):
    """The logic of torch's test_load_state_dict_pre_hook_and_prepend,
    _post_hook and _pre_post_hook, run on mixprec's optimizer (and, for
    FP32, on torch's beside it: the same answers), after a step so there is
    state to load; the optimizer then steps and saves as usual."""
    classes = [OURS[torch_cls]] + ([torch_cls] if dtype is torch.float32 else [])
    for cls in classes:
        kw = _kwargs(inp) if cls is not torch_cls else _torch_kwargs(inp)

        def make():
            p = torch.nn.Parameter(torch.rand(2, 3).to(dtype))
            o = cls([p], **kw)
            p.grad = torch.rand(2, 3).to(dtype)
            o.step()
            return p, o

        _, opt = make()
        sd = opt.state_dict()
        opt.register_load_state_dict_pre_hook(_pre_edit)
        opt.load_state_dict(sd)
        assert opt.param_groups[0]["lr"] == 0.002
        opt.register_load_state_dict_pre_hook(_pre_replace, prepend=True)
        opt.load_state_dict(sd)
        assert opt.param_groups[0]["lr"] == 0.002  # the in-place edit runs last

        for pre in (False, True):
            p, opt = make()
            if pre:
                opt.register_load_state_dict_pre_hook(_pre_replace)
            opt.register_load_state_dict_post_hook(_post_mark)
            opt.load_state_dict(opt.state_dict())
            assert bool(opt.state["ran_load_state_dict_pre_hook2"]) is pre
            assert opt.state["ran_load_state_dict_post_hook"] is True
            opt.step()
            opt.state_dict()


def _drop_head_state(opt, sd):
    """Fine-tuning with a re-shaped head (param 0): its saved state must not load."""
    sd["state"] = {k: v for k, v in sd["state"].items() if k != 0}


def _halve_moments(opt):
    for st in opt.state.values():
        for k in ("exp_avg", "momentum_buffer"):
            if isinstance(st, dict) and isinstance(st.get(k), torch.Tensor):
                st[k].mul_(0.5)


@pytest.mark.parametrize("torch_cls,inp", _cases())
def test_load_state_dict_hooks_that_edit_state(torch_cls, inp):
    """A pre-hook that drops the saved state of a re-shaped head and a
    post-hook that edits the loaded moments in place: BF16 params with FP32
    masters follow torch's optimizer on the FP32 upcast with the same hooks
    (the head starts afresh, step count included; the halved moments stay
    halved)."""
    ours = _params(torch.bfloat16, 4)
    ref = [torch.nn.Parameter(p.detach().float()) for p in ours]
    # torch's fused SGD cannot step a momentum list where one param starts
    # afresh (TypeError: expected Tensor ... got NoneType): its for-loop path
    # is the reference there (the same update rule).
    ref_kw = _torch_kwargs(inp)
    if torch_cls is torch.optim.SGD:
        ref_kw.pop("fused", None)
    opt, ref_opt = OURS[torch_cls](ours, **_kwargs(inp)), torch_cls(ref, **ref_kw)
    for step in range(2):
        for p, r, g in zip(ours, ref, _grads(ours, 4, step)):
            p.grad, r.grad = g.bfloat16(), g.bfloat16().float()
        opt.step()
        ref_opt.step()
    head = torch.randn(3, 5, generator=torch.Generator().manual_seed(8)).bfloat16()
    ours2 = [torch.nn.Parameter(head.clone())] + [torch.nn.Parameter(p.detach().clone()) for p in ours[1:]]
    # The reference's own FP32 weights (what our masters hold), the head afresh.
    ref2 = [torch.nn.Parameter(head.float())] + [torch.nn.Parameter(r.detach().clone()) for r in ref[1:]]
    opt2, ref_opt2 = OURS[torch_cls](ours2, **_kwargs(inp)), torch_cls(ref2, **ref_kw)
    for o in (opt2, ref_opt2):
        o.register_load_state_dict_pre_hook(_drop_head_state)
        o.register_load_state_dict_post_hook(_halve_moments)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))
    ref_opt2.load_state_dict(copy.deepcopy(ref_opt.state_dict()))
    assert 0 not in {i for i, p in enumerate(ours2) if p in opt2.state}
    for k in ("exp_avg", "momentum_buffer"):
        for p, q in zip(ours[1:], ours2[1:]):
            if k in opt.state[p]:
                assert opt2.state[q][k].dtype is torch.float32
                assert torch.equal(opt2.state[q][k], opt.state[p][k] * 0.5)
    for step in range(2, 4):
        for p, r, g in zip(ours2, ref2, _grads(ours2, 4, step)):
            p.grad, r.grad = g.bfloat16(), g.bfloat16().float()
        opt2.step()
        ref_opt2.step()
    for p, r in zip(ours2, ref2):
        torch.testing.assert_close(opt2.state[p]["master"], r.detach(), rtol=2e-6, atol=1e-7)
        if "step" in ref_opt2.state[r]:
            assert float(opt2.state[p]["step"]) == float(ref_opt2.state[r]["step"])
    assert float(opt2.state[ours2[0]]["step"]) == 2  # the head started afresh


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("torch_cls,inp", _cases())
def test_grads_are_never_inplaced_into(torch_cls, inp, dtype):
    """torch's test_grads_are_never_inplaced_into: a step without a scaler
    writes no gradient, so their version counters stay (and their bits);
    the params it writes are bumped."""
    params = _params(dtype, 5)
    opt = OURS[torch_cls](params, **_kwargs(inp))
    for step in range(3):
        for p, g in zip(params, _grads(params, 5, step)):
            p.grad = g.to(dtype)
        grads = [p.grad for p in params]
        versions = [g._version for g in grads]
        before = [g.clone() for g in grads]
        pv = [p._version for p in params]
        opt.step()
        assert [g._version for g in grads] == versions
        assert all(torch.equal(g, b) for g, b in zip(grads, before))
        assert all(p._version > v for p, v in zip(params, pv))


@pytest.mark.parametrize("scaler_cls", [mixprec.amp.GradScaler, torch.amp.GradScaler])
@pytest.mark.parametrize("torch_cls", sorted(OURS, key=lambda c: c.__name__))
def test_grads_written_by_a_scaled_step_are_bumped(torch_cls, scaler_cls):
    """The other side of the rule: a GradScaler's step has the op write
    g / grad_scale into each grad (as torch's fused optimizers do), and
    those grads' version counters move."""
    params = _params(torch.float32, 6)
    opt = OURS[torch_cls](params, lr=1e-2)
    scaler = scaler_cls("cpu", init_scale=256.0)
    # A loss whose gradient is each _grads tensor: scaled, backward, as a loop does.
    loss = sum((p * g).sum() for p, g in zip(params, _grads(params, 6, 0)))
    scaler.scale(loss).backward()
    grads = [p.grad for p in params]
    versions = [g._version for g in grads]
    scaler.step(opt)
    assert all(g._version > v for g, v in zip(grads, versions))
    for g, want in zip(grads, _grads(params, 6, 0)):
        torch.testing.assert_close(g, want, rtol=0, atol=0)


def _state_dict_pre(opt):
    opt.state["test"] = 1


def _state_dict_post(opt, sd):
    sd["ran_state_dict_pre_hook"] = "test" in sd["state"]
    sd["state"].pop("test", None)
    return sd


@pytest.mark.parametrize("torch_cls,inp", _cases())
def test_step_and_state_dict_hooks_as_torch(torch_cls, inp):
    """The logic of torch's test_step_pre_hook / _post_hook / _all_hooks and
    test_state_dict_pre_hook / _post_hook / _pre_post_hook: every hook runs,
    in torch's order, and a removed one no longer does."""
    p = torch.nn.Parameter(torch.randn(2, 3).bfloat16())
    opt = OURS[torch_cls]([p], **_kwargs(inp))
    calls = []
    handles = [
        register_optimizer_step_pre_hook(lambda o, a, k: calls.append("global pre")),
        register_optimizer_step_post_hook(lambda o, a, k: calls.append("global post")),
        opt.register_step_pre_hook(lambda o, a, k: calls.append("pre")),
        opt.register_step_post_hook(lambda o, a, k: calls.append("post")),
    ]
    try:
        p.grad = torch.randn(2, 3).bfloat16()
        opt.step()
        assert calls == ["global pre", "pre", "post", "global post"]
    finally:
        for h in handles:
            h.remove()
    opt.step()
    assert len(calls) == 4
    h = opt.register_state_dict_pre_hook(_state_dict_pre)
    assert opt.state_dict()["state"]["test"] == 1
    opt.register_state_dict_post_hook(_state_dict_post)
    sd = opt.state_dict()
    assert sd["ran_state_dict_pre_hook"] is True and "test" not in sd["state"]
    h.remove()
    opt.state.pop("test")
    assert opt.state_dict()["ran_state_dict_pre_hook"] is False


@pytest.mark.parametrize("torch_cls,inp", _cases())
def test_deepcopy_copies_all_public_attrs(torch_cls, inp):
    """torch's test of the same name, after a few steps; and the copy
    steps like the original."""
    params = _params(torch.bfloat16, 7)
    opt = OURS[torch_cls](params, **_kwargs(inp))
    for step in range(3):
        for p, g in zip(params, _grads(params, 7, step)):
            p.grad = g.bfloat16()
        opt.step()
    public = lambda o: {k for k in o.__dict__ if not k.startswith("_")}  # noqa: E731
    assert public(opt) == public(copy.deepcopy(opt))
