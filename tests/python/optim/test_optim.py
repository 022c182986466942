"""mixprec.optim.AdamW / SGD (and their ops) against torch.optim on upcast
inputs: master weights, skipped steps, GradScaler, state_dict, compile."""

import copy

import pytest
import torch
from torch.library import opcheck

import mixprec
from mixprec.optim import SGD, AdamW

SIZES = [(1,), (7,), (33, 5), (4097,), (100003,)]


def make_params(gen, dtype, sizes=SIZES):
    return [torch.nn.Parameter((torch.randn(*s, generator=gen) * 0.5).to(dtype)) for s in sizes]


def groups_of(params, **extra):
    """Two param groups with different hyper-parameters, as users write them."""
    return [{"params": params[:2], **extra}, {"params": params[2:]}]


def run_parity(gen, dtype, ours_cls, torch_cls, group_kw, kw, steps=50):
    ours_p = make_params(gen, dtype)
    ref_p = [torch.nn.Parameter(p.detach().float().clone()) for p in ours_p]
    ours = ours_cls(groups_of(ours_p, **group_kw), **kw)
    ref = torch_cls(groups_of(ref_p, **group_kw), **kw)
    for _ in range(steps):
        for p, r in zip(ours_p, ref_p):
            g = (torch.randn(p.shape, generator=gen) * 0.1).to(dtype)
            p.grad = g
            r.grad = g.float()  # the same (upcast) gradient
        ours.step()
        ref.step()
    for p, r in zip(ours_p, ref_p):
        master = ours.state[p]["master"] if dtype is not torch.float32 else p.detach()
        torch.testing.assert_close(master, r.detach(), rtol=1e-6, atol=1e-7)
        if dtype is not torch.float32:
            assert master.dtype is torch.float32
            assert torch.equal(p.detach(), master.to(dtype)), "param must be its master rounded"
    return ours, ours_p


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "kw",
    [dict(lr=1e-2), dict(lr=3e-3, weight_decay=0.0, amsgrad=True), dict(lr=1e-2, maximize=True, betas=(0.8, 0.99))],
)
def test_adamw_parity_with_torch(gen, dtype, kw):
    run_parity(gen, dtype, AdamW, torch.optim.AdamW, dict(weight_decay=0.1), kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "kw",
    [
        dict(lr=1e-2),
        dict(lr=1e-2, momentum=0.9),
        dict(lr=1e-2, momentum=0.9, nesterov=True, weight_decay=1e-3),
        dict(lr=1e-2, momentum=0.5, dampening=0.3, maximize=True),
    ],
)
def test_sgd_parity_with_torch(gen, dtype, kw):
    run_parity(gen, dtype, SGD, torch.optim.SGD, dict(lr=5e-3), kw)


def test_bf16_master_weights_do_not_stall(gen):
    """Updates below BF16 resolution are lost by torch AdamW on BF16 params;
    the FP32 master keeps them and tracks the FP32 run."""
    start = torch.full((1000,), 1.0)
    target = start + 0.01
    runs = {}
    for name in ("fp32", "torch_bf16", "mixprec_bf16"):
        dtype = torch.float32 if name == "fp32" else torch.bfloat16
        p = torch.nn.Parameter(start.clone().to(dtype))
        opt = (AdamW if name == "mixprec_bf16" else torch.optim.AdamW)([p], lr=1e-4, weight_decay=0.0)
        for _ in range(100):
            p.grad = (p.detach().float() - target).to(dtype)
            opt.step()
        runs[name] = p.detach().float()
    moved = {k: (v - start).abs().mean().item() for k, v in runs.items()}
    assert moved["torch_bf16"] == 0.0  # every update (1e-4) is below BF16's step at 1.0 (2^-7)
    assert moved["fp32"] > 5e-3
    assert abs(moved["mixprec_bf16"] - moved["fp32"]) < 2e-3  # within one BF16 ulp of the FP32 run


@pytest.mark.parametrize("cls,kw", [(AdamW, dict(lr=1e-2, amsgrad=True)), (SGD, dict(lr=1e-2, momentum=0.9))])
@pytest.mark.parametrize("bad", [1.0, 2.0, float("nan")])
def test_skipped_step_changes_nothing(gen, cls, kw, bad):
    params = make_params(gen, torch.bfloat16)
    opt = cls(params, **kw)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen).bfloat16()
    opt.step()  # create the state
    before = [copy.deepcopy(opt.state[p]) for p in params], [p.detach().clone() for p in params]
    opt.found_inf = torch.tensor(bad)
    opt.grad_scale = torch.tensor(1024.0)
    opt.step()
    del opt.found_inf, opt.grad_scale
    for p, st, pb in zip(params, before[0], before[1]):
        assert torch.equal(p.detach().view(torch.int16), pb.view(torch.int16))
        for k, v in st.items():
            assert torch.equal(opt.state[p][k], v), k


def test_grad_scale_divides_grads(gen):
    a = make_params(gen, torch.float32)
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    oa, ob = AdamW(a, lr=1e-2), AdamW(b, lr=1e-2)
    for p, q in zip(a, b):
        g = torch.randn(p.shape, generator=gen)
        p.grad = g * 512.0
        q.grad = g.clone()
    oa.grad_scale = torch.tensor(512.0)
    oa.step()
    ob.step()
    for p, q in zip(a, b):
        assert torch.equal(p, q)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(20, 64)
        self.fc2 = torch.nn.Linear(64, 5)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def test_with_grad_scaler_and_overflows_matches_reference_loop(gen):
    """mixprec GradScaler + AdamW over a run with overflows, against torch's
    GradScaler + fused AdamW in FP32 (reference loop)."""
    torch.manual_seed(3)
    model = Net()
    ref = copy.deepcopy(model)
    opt, ref_opt = AdamW(model.parameters(), lr=1e-2), torch.optim.AdamW(ref.parameters(), lr=1e-2, fused=True)
    sc = mixprec.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=4)
    ref_sc = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=4)
    for step in range(30):
        x = torch.randn(16, 20, generator=gen)
        y = torch.randint(0, 5, (16,), generator=gen)
        for m, o, s in ((model, opt, sc), (ref, ref_opt, ref_sc)):
            o.zero_grad()
            s.scale(torch.nn.functional.cross_entropy(m(x), y)).backward()
            if step in (5, 6, 17):
                m.fc1.weight.grad[0, 0] = float("inf") if step != 6 else float("nan")
            s.step(o)
            s.update()
        assert sc.get_scale() == ref_sc.get_scale()
    assert sc.get_skipped_steps() == 3
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert opt.state[model.fc1.weight]["step"].item() == 27.0


def test_bf16_model_with_grad_scaler_and_clipping(gen):
    torch.manual_seed(4)
    model = Net().to(torch.bfloat16)
    opt = AdamW(model.parameters(), lr=1e-2)
    sc = mixprec.amp.GradScaler("cpu", init_scale=2.0**10)
    losses = []
    for step in range(40):
        x = torch.randn(32, 20, generator=gen).bfloat16()
        y = (x[:, :5].float().argmax(1))
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        sc.scale(loss).backward()
        norm = sc.clip_grad_norm_(opt, 1.0)
        assert torch.isfinite(norm)
        sc.step(opt)
        sc.update()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5  # it learns
    for p in model.parameters():
        assert torch.equal(p.detach(), opt.state[p]["master"].bfloat16())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_dict_round_trip(gen, dtype):
    params = make_params(gen, dtype)
    opt = AdamW(params, lr=1e-2, amsgrad=True)
    for _ in range(3):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(dtype)
        opt.step()
    sd = copy.deepcopy(opt.state_dict())
    clone = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt2 = AdamW(clone, lr=1e-2, amsgrad=True)
    opt2.load_state_dict(sd)
    for p, q in zip(params, clone):
        for k, v in opt.state[p].items():
            assert opt2.state[q][k].dtype == v.dtype and torch.equal(opt2.state[q][k], v), k
    grads = [torch.randn(p.shape, generator=gen).to(dtype) for p in params]
    for o, ps in ((opt, params), (opt2, clone)):
        for p, g in zip(ps, grads):
            p.grad = g.clone()
        o.step()
    for p, q in zip(params, clone):
        assert torch.equal(p, q)


def test_load_torch_adamw_state_dict(gen):
    params = make_params(gen, torch.float32)
    torch_opt = torch.optim.AdamW(params, lr=1e-2)
    for _ in range(3):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        torch_opt.step()
    ours_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    ours = AdamW(ours_params, lr=1e-2)
    ours.load_state_dict(torch_opt.state_dict())
    for p, q in zip(params, ours_params):
        g = torch.randn(p.shape, generator=gen)
        p.grad, q.grad = g, g.clone()
    torch_opt.step()
    ours.step()
    for p, q in zip(params, ours_params):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7)
        assert ours.state[q]["step"].item() == 4.0


def test_load_torch_sgd_state_dict_into_bf16_model(gen):
    params = make_params(gen, torch.float32)
    torch_opt = torch.optim.SGD(params, lr=1e-2, momentum=0.9)
    for _ in range(2):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        torch_opt.step()
    bf16 = [torch.nn.Parameter(p.detach().bfloat16()) for p in params]
    ours = SGD(bf16, lr=1e-2, momentum=0.9)
    ours.load_state_dict(torch_opt.state_dict())
    for p, q in zip(params, bf16):
        st = ours.state[q]
        assert st["momentum_buffer"].dtype is torch.float32
        assert torch.equal(st["momentum_buffer"], torch_opt.state[p]["momentum_buffer"])
        assert set(st) == set(torch_opt.state[p])  # torch's keys: no step count added at load time
    for p, q in zip(params, bf16):
        p.grad = torch.randn(p.shape, generator=gen)
        q.grad = p.grad.bfloat16()
    ours.step()
    for q in bf16:
        assert ours.state[q]["step"].item() == 2.0  # the loaded buffer's first step was behind us


@pytest.mark.parametrize("hook", [None, "edit", "replace", "drop"])
@pytest.mark.parametrize("source", ["torch", "mixprec"])
def test_sgd_state_keys_after_load_match_torch(gen, hook, source):
    """After load_state_dict (with a pre-hook that edits, replaces or drops
    part of the dict, or none) mixprec's SGD holds the keys torch's SGD
    holds after the same load (it added a "step" count at load time), and
    the steps that follow are torch's."""
    def edit(opt, sd):
        sd["param_groups"][0]["lr"] = 0.02

    def replace(opt, sd):
        sd = copy.deepcopy(sd)
        sd["param_groups"][0]["lr"] = 0.03
        return sd

    def drop(opt, sd):
        sd["state"] = {k: v for k, v in sd["state"].items() if k != 0}

    shapes = [(5, 3), (7,)]
    params = make_params(gen, torch.float32, shapes)
    ours_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    src_cls = torch.optim.SGD if source == "torch" else SGD
    src = src_cls([torch.nn.Parameter(p.detach().clone()) for p in params], lr=1e-2, momentum=0.9)
    for _ in range(2):
        for p in src.param_groups[0]["params"]:
            p.grad = torch.randn(p.shape, generator=gen)
        src.step()
    ref = torch.optim.SGD(params, lr=1e-2, momentum=0.9)
    ours = SGD(ours_params, lr=1e-2, momentum=0.9)
    for o in (ref, ours):
        if hook is not None:
            o.register_load_state_dict_pre_hook({"edit": edit, "replace": replace, "drop": drop}[hook])
        o.load_state_dict(copy.deepcopy(src.state_dict()))
    for p, q in zip(params, ours_params):
        assert set(ours.state.get(q, {})) == set(ref.state.get(p, {}))
    assert ours.param_groups[0]["lr"] == ref.param_groups[0]["lr"]
    for _ in range(3):
        for p, q in zip(params, ours_params):
            p.grad = torch.randn(p.shape, generator=gen)
            q.grad = p.grad.clone()
        ref.step()
        ours.step()
    for p, q in zip(params, ours_params):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7)


def test_lr_scheduler_and_tensor_lr(gen):
    params = make_params(gen, torch.bfloat16, [(64,)])
    ref = [torch.nn.Parameter(params[0].detach().float().clone())]
    opt = AdamW(params, lr=torch.tensor(1e-2))
    ref_opt = torch.optim.AdamW(ref, lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=2, gamma=0.5)
    for _ in range(6):
        g = torch.randn(64, generator=gen).bfloat16()
        params[0].grad, ref[0].grad = g, g.float()
        opt.step()
        ref_opt.step()
        sched.step()
        ref_sched.step()
    torch.testing.assert_close(opt.state[params[0]]["master"], ref[0].detach(), rtol=1e-6, atol=1e-7)


def test_params_without_grads_are_skipped(gen):
    params = make_params(gen, torch.bfloat16)
    opt = SGD(params, lr=0.1, momentum=0.9)
    params[1].grad = torch.ones_like(params[1])
    before = [p.detach().clone() for p in params]
    opt.step()
    assert not torch.equal(params[1], before[1])
    for i in (0, 2, 3, 4):
        assert torch.equal(params[i], before[i]) and params[i] not in opt.state


def test_step_under_torch_compile(gen):
    params = make_params(gen, torch.bfloat16, [(17,), (4, 8)])
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt, ref_opt = AdamW(params, lr=1e-2), AdamW(ref, lr=1e-2)

    @torch.compile(backend="aot_eager")
    def compiled_step():
        opt.step()

    for _ in range(3):
        for p, q in zip(params, ref):
            g = torch.randn(p.shape, generator=gen).bfloat16()
            p.grad, q.grad = g, g.clone()
        compiled_step()
        ref_opt.step()
    for p, q in zip(params, ref):
        assert torch.equal(p, q)
        assert torch.equal(opt.state[p]["master"], ref_opt.state[q]["master"])


def _adamw_args(gen, amsgrad):
    ps = [torch.randn(5, generator=gen).bfloat16(), torch.randn(3, generator=gen)]
    return (
        ps,
        [torch.randn(5, generator=gen).bfloat16(), torch.randn(3, generator=gen)],
        [ps[0].float(), torch.empty(0)],
        [torch.zeros(5), torch.zeros(3)],
        [torch.zeros(5), torch.zeros(3)],
        [torch.zeros(5), torch.zeros(3)] if amsgrad else [],
        [torch.zeros(()), torch.zeros(())],
        1e-3, 0.9, 0.999, 0.01, 1e-8, amsgrad, False, None, torch.tensor(2.0), torch.tensor(0.0),
    )


def test_opcheck_optimizer_ops(gen):
    opcheck(torch.ops.mixprec.adamw_step_.default, _adamw_args(gen, False))
    opcheck(torch.ops.mixprec.adamw_step_.default, _adamw_args(gen, True))
    ps = [torch.randn(6, generator=gen).half()]
    opcheck(
        torch.ops.mixprec.sgd_step_.default,
        (ps, [torch.randn(6, generator=gen).half()], [ps[0].float()], [torch.zeros(6)], [torch.zeros(())],
         1e-2, 0.9, 0.0, 0.0, False, False, torch.tensor(1e-2), None, None),
    )


def _snap(args):
    return [t.clone() for a in args if isinstance(a, list) for t in a]


@pytest.mark.parametrize(
    "mutate,words",
    [
        (lambda a: a[1].__setitem__(1, torch.randn(4)), ("grads[1]", "shape")),
        (lambda a: a[1].__setitem__(0, torch.randn(5, dtype=torch.float64)), ("grads[0]", "float32, float16 or bfloat16")),
        (lambda a: (a[0].__setitem__(0, a[0][0].half()), a[2].__setitem__(0, torch.empty(0))),
         ("masters[0]", "float16", "stochastic rounding")),
        (lambda a: a[2].__setitem__(1, torch.zeros(3)), ("masters[1]", "empty")),
        (lambda a: a[3].pop(), ("exp_avgs", "tensors but params has")),
        (lambda a: a[4].__setitem__(0, torch.zeros(5, dtype=torch.float16)),
         ("exp_avg_sqs[0]", "float32, bfloat16 or uint8")),
        (lambda a: a[6].__setitem__(1, torch.zeros(2)), ("steps[1]",)),
        (lambda a: a[0].__setitem__(1, torch.randn(3, dtype=torch.float64)), ("params[1]",)),
    ],
)
def test_optimizer_op_bad_inputs(gen, mutate, words):
    args = list(_adamw_args(gen, False))
    mutate(args)
    before = _snap(args)
    with pytest.raises(RuntimeError) as info:
        torch.ops.mixprec.adamw_step_(*args)
    assert "mixprec::adamw_step_" in str(info.value)
    for w in words:
        assert w in str(info.value), str(info.value)
    for a, b in zip(_snap(args), before):
        assert torch.equal(a.view(-1).view(torch.uint8) if a.numel() else a, b.view(-1).view(torch.uint8) if b.numel() else b)


def test_optimizer_rejects_sparse_and_bad_dtypes(gen):
    p = torch.nn.Parameter(torch.randn(4, 4, generator=gen))
    p.grad = torch.randn(4, 4, generator=gen).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        AdamW([p]).step()
    q = torch.nn.Parameter(torch.randn(3, dtype=torch.float64))
    q.grad = torch.ones(3, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="float32, float16 or bfloat16"):
        SGD([q], lr=0.1).step()
    with pytest.raises(ValueError):
        AdamW([p], betas=(1.0, 0.999))


def test_backward_and_step_equals_the_manual_loop(gen):
    torch.manual_seed(5)
    a = Net().to(torch.bfloat16)
    b = copy.deepcopy(a)
    oa, ob = AdamW(a.parameters(), lr=1e-2), AdamW(b.parameters(), lr=1e-2)
    sa = mixprec.amp.GradScaler("cpu", init_scale=2.0**9, growth_interval=3)
    sb = mixprec.amp.GradScaler("cpu", init_scale=2.0**9, growth_interval=3)
    for step in range(8):
        x = torch.randn(8, 20, generator=gen).bfloat16()
        y = torch.randint(0, 5, (8,), generator=gen)
        norm = mixprec.amp.backward_and_step(torch.nn.functional.cross_entropy(a(x).float(), y), oa, sa, max_norm=0.5)
        sb.scale(torch.nn.functional.cross_entropy(b(x).float(), y)).backward()
        want = sb.clip_grad_norm_(ob, 0.5, fold=True)
        sb.step(ob)
        sb.update()
        ob.zero_grad()
        assert torch.equal(norm, want)
        assert all(p.grad is None for p in a.parameters())
    assert sa.get_scale() == sb.get_scale()
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_folded_clip_matches_the_unfolded_path(gen, dtype):
    """clip_grad_norm_(fold=True) against the unfolded unscale + clip + step,
    from the same state each step: the same norm bit for bit, grads left
    scaled (never written), overflowing steps skipped alike, and masters
    equal to FP32 rounding for an FP32 model. For BF16/FP16 models the
    unfolded path rounds the grads to the half dtype twice (unscaled, then
    clipped) where the folded one divides in FP32 once, so the updates
    differ by up to ~2^-8 relative: lr * 1e-2 absolute. (Over many steps
    half models drift apart through param roundings whatever the path.)"""
    torch.manual_seed(7)
    a = Net().to(dtype)
    oa = AdamW(a.parameters(), lr=1e-2)
    sa = mixprec.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
    skipped = 0
    for step in range(12):
        b, ob, sb = copy.deepcopy((a, oa, sa))
        x = torch.randn(8, 20, generator=gen).to(dtype)
        y = torch.randint(0, 5, (8,), generator=gen)
        for m, o, s in ((a, oa, sa), (b, ob, sb)):
            o.zero_grad()
            s.scale(torch.nn.functional.cross_entropy(m(x).float(), y)).backward()
            if step in (4, 9):
                next(m.parameters()).grad.view(-1)[0] = float("inf")
        before = [p.grad.clone() for p in a.parameters()]
        na = sa.clip_grad_norm_(oa, 0.5, fold=True)
        for p, g in zip(a.parameters(), before):
            assert torch.equal(p.grad.view(torch.uint8), g.view(torch.uint8)), "folded clip wrote a grad"
        nb = sb.clip_grad_norm_(ob, 0.5)
        assert torch.equal(na, nb) or (not torch.isfinite(na) and not torch.isfinite(nb))
        sa.step(oa)
        sb.step(ob)
        sa.update()
        sb.update()
        assert sa.get_scale() == sb.get_scale()
        skipped += step in (4, 9)
        assert sa.get_skipped_steps() == sb.get_skipped_steps() == skipped
        for p, q in zip(a.parameters(), b.parameters()):
            pm = oa.state[p]["master"] if dtype is not torch.float32 else p.detach()
            qm = ob.state[q]["master"] if dtype is not torch.float32 else q.detach()
            if dtype is torch.float32:
                torch.testing.assert_close(pm, qm, rtol=1e-5, atol=1e-6)
            else:
                torch.testing.assert_close(pm, qm, rtol=0, atol=1e-4)
            assert torch.equal(oa.state[p]["step"], ob.state[q]["step"])
