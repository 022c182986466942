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


@pytest.mark.parametrize("torch_cls,inp", _cases())
def test_steps_like_torch(torch_cls, inp):
    """FP32 params: 4 steps equal torch's optimizer with the same kwargs."""
    ours, ref = _params(torch.float32, 0), _params(torch.float32, 0)
    opt = OURS[torch_cls](ours, **_kwargs(inp))
    ref_opt = torch_cls(ref, **_torch_kwargs(inp))
    for step in range(4):
        for p, r, g in zip(ours, ref, _grads(ours, 0, step)):
            p.grad, r.grad = g.clone(), g.clone()
        opt.step()
        ref_opt.step()
    for p, r in zip(ours, ref):
        torch.testing.assert_close(p, r, rtol=2e-6, atol=1e-7)


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
    for step in range(2):
        for p, r, g in zip(ours, ref, _grads(ours, 3, step)):
            p.grad, r.grad = g.clone(), g.clone()
        opt.step()
        ref_opt.step()
    for p, r in zip(ours, ref):
        torch.testing.assert_close(p, r, rtol=2e-6, atol=1e-7)
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
