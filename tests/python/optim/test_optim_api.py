"""Drop-in API fidelity of mixprec.optim.AdamW / SGD and GradScaler against
torch's (issue 14, items 1-3 and 5-7): constructor flags, argument checks
with torch's exception types and wording, loading older state dicts,
non-dense params and layout changes, clear errors for what is refused, and
GradScaler.clip_grad_norm_'s torch-style arguments."""

import copy
import math

import pytest
import torch

import mixprec
from mixprec.optim import SGD, AdamW

PAIRS = {"adamw": (AdamW, torch.optim.AdamW), "sgd": (SGD, torch.optim.SGD)}


def _params():
    return [torch.nn.Parameter(torch.randn(4, 3))]


@pytest.mark.parametrize("flags", [dict(fused=True), dict(foreach=True), dict(capturable=True), dict(fused=False),
                                   dict(foreach=False, capturable=False, differentiable=False)])
@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_torch_flags_accepted(kind, flags):
    """nanoGPT's AdamW(..., fused=True), timm's --opt-foreach: accepted,
    kept in the groups as torch keeps them, and the step is the same."""
    ours_cls, torch_cls = PAIRS[kind]
    p = _params()
    opt = ours_cls(p, lr=0.1, **flags)
    for k, v in flags.items():
        assert opt.param_groups[0][k] == v
    p[0].grad = torch.ones_like(p[0])
    before = p[0].detach().clone()
    opt.step()
    ref = torch.nn.Parameter(before.clone())
    ref.grad = torch.ones_like(ref)
    torch_cls([ref], lr=0.1).step()
    torch.testing.assert_close(p[0], ref, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_differentiable_raises(kind):
    with pytest.raises(NotImplementedError, match="differentiable"):
        PAIRS[kind][0](_params(), differentiable=True)
    # the same error through add_param_group (was a ValueError there), nothing added
    opt = PAIRS[kind][0](_params())
    before = len(opt.param_groups)
    with pytest.raises(NotImplementedError, match="add_param_group: differentiable=True"):
        opt.add_param_group({"params": _params(), "differentiable": True})
    assert len(opt.param_groups) == before


BAD = [
    (dict(lr=-1.0), "Invalid learning rate"),
    (dict(lr=-1), "Invalid learning rate"),
    (dict(lr=float("nan")), "Invalid learning rate"),
    (dict(lr=torch.tensor([0.1, 0.2])), "Tensor lr must be 1-element"),
    (dict(lr=torch.tensor(-0.1)), "Invalid learning rate"),
    (dict(weight_decay=-0.1), "Invalid weight_decay value"),
]


@pytest.mark.parametrize("kw,msg", BAD)
@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_bad_arguments_like_torch(kind, kw, msg):
    """torch's ValueError and wording, at construction (a 2-element lr tensor
    was a reshape error at step())."""
    ours_cls, torch_cls = PAIRS[kind]
    nan_lr = isinstance(kw.get("lr"), float) and math.isnan(kw["lr"])
    if not (kind == "sgd" and nan_lr):  # torch's SGD lets a NaN lr through; mixprec refuses it
        with pytest.raises(ValueError, match=msg):
            torch_cls(_params(), **kw)
    with pytest.raises(ValueError, match=msg):
        ours_cls(_params(), **kw)


@pytest.mark.parametrize("kw,msg", [(dict(betas=(1.0, 0.999)), "Invalid beta parameter at index 0"),
                                    (dict(betas=(0.9, -0.1)), "Invalid beta parameter at index 1"),
                                    (dict(eps=-1e-8), "Invalid epsilon value"),
                                    (dict(eps=float("nan")), "Invalid epsilon value")])
def test_adamw_bad_arguments_like_torch(kw, msg):
    for cls in (torch.optim.AdamW, AdamW):
        with pytest.raises(ValueError, match=msg):
            cls(_params(), **kw)


def test_sgd_bad_momentum_like_torch():
    for cls in (torch.optim.SGD, SGD):
        with pytest.raises(ValueError, match="Invalid momentum value"):
            cls(_params(), momentum=-0.5)


def test_tensor_lr_and_betas_work():
    p = _params()
    opt = AdamW(p, lr=torch.tensor(0.01), betas=(torch.tensor(0.9), torch.tensor(0.99)))
    assert opt.param_groups[0]["betas"] == (pytest.approx(0.9), pytest.approx(0.99))
    p[0].grad = torch.randn_like(p[0])
    opt.step()


@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_load_old_state_dict_fills_defaults(kind):
    """A state dict saved before maximize/foreach/capturable/differentiable/
    fused/master_weights/seed existed loads and steps like a fresh one."""
    ours_cls, _ = PAIRS[kind]
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3).bfloat16()
    opt = ours_cls(model.parameters(), lr=0.01)
    model(torch.randn(2, 5).bfloat16()).float().sum().backward()
    opt.step()
    sd = copy.deepcopy(opt.state_dict())
    for g in sd["param_groups"]:
        for k in ("maximize", "foreach", "capturable", "differentiable", "fused", "master_weights", "seed"):
            g.pop(k, None)
    twin = copy.deepcopy(model)  # its own params: two optimizers on one param would see each other's writes
    for p, q in zip(model.parameters(), twin.parameters()):
        q.grad = p.grad.clone()
    fresh = ours_cls(twin.parameters(), lr=0.01)
    fresh.load_state_dict(sd)
    for k in ("maximize", "foreach", "capturable", "differentiable", "fused", "master_weights", "seed"):
        assert k in fresh.param_groups[0]
    assert sd["state"][0]["step"] == 1
    fresh.step()
    opt.step()
    for (a, b) in zip(opt.state.values(), fresh.state.values()):
        assert torch.equal(a["master"], b["master"])
    for p, q in zip(model.parameters(), twin.parameters()):
        assert torch.equal(p, q)


def test_non_dict_state_entries_do_not_crash():
    model = torch.nn.Linear(5, 3)
    opt = AdamW(model.parameters())
    model(torch.randn(2, 5)).sum().backward()
    opt.step()
    sd = opt.state_dict()
    sd["state"]["extra"] = 3  # what a post-hook may leave there
    opt.load_state_dict(sd)
    opt.step()


@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_non_dense_params_step_like_torch(kind):
    """Parameter(randn(10, 5, 2)[..., 0]) (a strided view) and a transposed
    weight are stepped, equal to torch's."""
    ours_cls, torch_cls = PAIRS[kind]
    g = torch.Generator().manual_seed(1)
    base = torch.randn(10, 5, 2, generator=g)
    w = torch.randn(6, 4, generator=g)
    ours = [torch.nn.Parameter(base.clone()[..., 0]), torch.nn.Parameter(w.clone().t())]
    ref = [torch.nn.Parameter(base.clone()[..., 0]), torch.nn.Parameter(w.clone().t())]
    assert not ours[0].is_contiguous() and not ours[1].is_contiguous()
    kw = dict(lr=0.05, momentum=0.9) if kind == "sgd" else dict(lr=0.05)
    opt, ref_opt = ours_cls(ours, **kw), torch_cls(ref, **kw)
    for _ in range(3):
        grads = [torch.randn(p.shape, generator=g) for p in ours]
        for p, r, gr in zip(ours, ref, grads):
            p.grad, r.grad = gr.clone(), gr.clone()
        opt.step()
        ref_opt.step()
    for p, r in zip(ours, ref):
        torch.testing.assert_close(p, r, rtol=1e-6, atol=1e-7)
        assert p.stride() == r.stride()


def test_channels_last_after_state_keeps_working():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, 3).bfloat16()
    ref = copy.deepcopy(conv).float()
    opt, ref_opt = AdamW(conv.parameters(), lr=1e-2), torch.optim.AdamW(ref.parameters(), lr=1e-2)
    x = torch.randn(2, 3, 9, 9).bfloat16()
    for step in range(3):
        if step == 1:
            conv = conv.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        for m, o, inp in ((conv, opt, x), (ref, ref_opt, x.float())):
            o.zero_grad()
            m(inp).float().square().mean().backward()
            if m is conv:
                grads = [p.grad.float() for p in conv.parameters()]
            else:
                for p, gr in zip(ref.parameters(), grads):
                    p.grad = gr.clone()
            o.step()
    for p, r in zip(conv.parameters(), ref.parameters()):
        torch.testing.assert_close(opt.state[p]["master"], r.detach(), rtol=1e-5, atol=1e-6)
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)


def test_complex_param_and_sparse_grad_name_the_param():
    c = torch.nn.Parameter(torch.randn(3, dtype=torch.complex64))
    c.grad = torch.randn_like(c)
    opt = AdamW([torch.nn.Parameter(torch.randn(2)), c])
    opt.param_groups[0]["params"][0].grad = torch.randn(2)
    with pytest.raises(RuntimeError, match=r"param_groups\[0\]\['params'\]\[1\] is torch.complex64"):
        opt.step()
    emb = torch.nn.Embedding(10, 4, sparse=True)
    emb(torch.tensor([1, 2])).sum().backward()
    opt = SGD(emb.parameters(), lr=0.1)
    before = emb.weight.detach().clone()
    with pytest.raises(RuntimeError, match=r"params'\]\[0\].*sparse gradient"):
        opt.step()
    assert torch.equal(emb.weight, before)


def _scaled_setup(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = mixprec.amp.GradScaler("cpu", init_scale=256.0)
    scaler.scale(model(torch.randn(4, 8)).square().sum()).backward()
    return model, opt, scaler


@pytest.mark.parametrize("norm_type", [2.0, float("inf"), 1.0])
def test_clip_grad_norm_norm_types_match_torch(norm_type):
    """Against torch's GradScaler.unscale_ + torch.nn.utils.clip_grad_norm_
    on the same scaled gradients."""
    model, opt, scaler = _scaled_setup()
    ref_model, ref_opt, _ = _scaled_setup()
    for p, r in zip(model.parameters(), ref_model.parameters()):
        r.grad = p.grad.clone()
    ref_scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    ref_scaler.scale(torch.ones(()))  # creates its scale tensor, as the forward's scale() would
    ref_scaler.unscale_(ref_opt)
    want = torch.nn.utils.clip_grad_norm_(ref_model.parameters(), 0.5, norm_type=norm_type)
    got = scaler.clip_grad_norm_(opt, 0.5, norm_type=norm_type)
    torch.testing.assert_close(got.double(), want.double(), rtol=1e-6, atol=0)
    for p, r in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-6, atol=1e-8)


def test_clip_grad_norm_takes_parameters_like_torch():
    model, opt, scaler = _scaled_setup()
    scaler.unscale_(opt)
    grads = [p.grad.clone() for p in model.parameters()]
    got = scaler.clip_grad_norm_((p for p in model.parameters()), 0.5, error_if_nonfinite=True, foreach=True)
    ref = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for r, g in zip(ref, grads):
        r.grad = g
    want = torch.nn.utils.clip_grad_norm_(ref, 0.5)
    torch.testing.assert_close(got, want)
    for p, r in zip(model.parameters(), ref):
        torch.testing.assert_close(p.grad, r.grad)


def test_state_dict_into_torch_optimizer_recipe_keeps_fp32():
    """Moving a run from mixprec to torch's optimizer (issue 14.4): torch's
    loader casts floating state to each param's dtype, so load into FP32
    params; the README's recipe keeps masters and moments bit for bit."""
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 4).bfloat16()
    opt = AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        model(torch.randn(3, 6).bfloat16()).float().sum().backward()
        opt.step()
        opt.zero_grad()
    sd = copy.deepcopy(opt.state_dict())
    masters = [opt.state[p]["master"].clone() for p in model.parameters()]
    # The recipe: FP32 params holding the masters, then torch's loader.
    model = model.float()
    with torch.no_grad():
        for p, m in zip(model.parameters(), masters):
            p.copy_(m)
    torch_opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch_opt.load_state_dict(sd)
    for p, (_, st) in zip(model.parameters(), sorted(sd["state"].items())):
        mine = torch_opt.state[p]
        assert mine["exp_avg"].dtype == torch.float32
        assert torch.equal(mine["exp_avg"], st["exp_avg"]) and torch.equal(mine["exp_avg_sq"], st["exp_avg_sq"])
        assert torch.equal(p.detach(), st["master"])
    model(torch.randn(3, 6)).sum().backward()
    torch_opt.step()  # and it steps


@pytest.mark.parametrize("op", ["adamw_step_", "sgd_step_"])
def test_optimizer_ops_bump_versions_and_refuse_meta_mixes(op):
    """Like the amp ops: what the step writes gets its version counter
    bumped (autograd can see a saved param overwritten), and a meta tensor
    among CPU ones is an error naming it instead of a silent no-op."""
    p = torch.randn(8)
    g = torch.randn(8)
    bufs = [torch.zeros(8)]
    step = [torch.zeros(())]
    if op == "adamw_step_":
        call = lambda fi: torch.ops.mixprec.adamw_step_(  # noqa: E731
            [p], [g], [torch.empty(0)], bufs, [torch.zeros(8)], [], step, 1e-2, 0.9, 0.999, 0.0, 1e-8, False, False,
            None, None, fi)
    else:
        call = lambda fi: torch.ops.mixprec.sgd_step_(  # noqa: E731
            [p], [g], [torch.empty(0)], bufs, step, 1e-2, 0.9, 0.0, 0.0, False, False, None, None, fi)
    before = p.clone()
    with pytest.raises(RuntimeError, match=rf"mixprec::{op}: found_inf is on meta but params\[0\] is on cpu"):
        call(torch.zeros((), device="meta"))
    assert torch.equal(p, before) and step[0].item() == 0
    v = p._version
    call(torch.zeros(()))
    assert p._version > v and not torch.equal(p, before)


def _sgd(p, g, bufs=(), lr=1e-2, momentum=0.0, nesterov=False, steps=None):
    torch.ops.mixprec.sgd_step_([p], [g], [torch.empty(0)], list(bufs), steps or [torch.zeros(())], lr, momentum,
                                0.0, 0.0, nesterov, False, None, None, None)


@pytest.mark.parametrize("kw,msg", [
    (dict(lr=-0.01), r"sgd_step_: lr must be finite and >= 0, got -0.01"),
    (dict(lr=float("nan")), r"sgd_step_: lr must be finite and >= 0, got nan"),
    (dict(nesterov=True), r"sgd_step_: nesterov needs momentum > 0"),
])
def test_optimizer_op_hyper_parameter_errors_name_the_argument(kw, msg):
    p, g = torch.randn(8), torch.randn(8)
    before = p.clone()
    with pytest.raises(RuntimeError, match=msg) as e:
        _sgd(p, g, **kw)
    assert ".h:" not in str(e.value) and ".cpp:" not in str(e.value)
    assert torch.equal(p, before)


def test_optimizer_op_aliasing_refused():
    """The C contract says no two tensors of one step overlap; torch does not
    check, mixprec does (a grad that is its own param, exp_avg aliasing
    exp_avg_sq)."""
    p, g = torch.randn(8), torch.randn(8)
    before = p.clone()
    with pytest.raises(RuntimeError, match=r"params\[0\] and grads\[0\] share memory"):
        _sgd(p, p)
    ea = torch.zeros(8)
    with pytest.raises(RuntimeError, match=r"exp_avgs\[0\] and exp_avg_sqs\[0\] share memory"):
        torch.ops.mixprec.adamw_step_([p], [g], [torch.empty(0)], [ea], [ea], [], [torch.zeros(())], 1e-2, 0.9, 0.999,
                                      0.0, 1e-8, False, False, None, None, None)
    assert torch.equal(p, before) and torch.equal(ea, torch.zeros(8))


@pytest.mark.parametrize("cls", [AdamW, SGD])
def test_signature_lists_every_keyword(cls):
    """The keywords both optimizers share are declared once (``**options``)
    but listed in the signature with their defaults, as explicit ones
    would be (help(), IDEs, LightningCLI's introspection); an unknown
    keyword raises Python's TypeError."""
    import inspect

    want = dict(
        maximize=False, master_weights=True, param_remainders=False, seed=None, ema_decay=None, ema_min_decay=0.0,
        ema_use_warmup=False, ema_warmup_gamma=1.0, ema_warmup_power=2 / 3, ema_update_after_step=0,
        ema_update_every=1, foreach=None, capturable=False, differentiable=False, fused=None,
    )
    want.update({"exp_avg_dtype": torch.float32, "exp_avg_sq_dtype": torch.float32} if cls is AdamW
                else {"momentum_dtype": torch.float32})
    params = inspect.signature(cls).parameters
    got = {k: p.default for k, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert got == want
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    with pytest.raises(TypeError, match="unexpected keyword argument 'ema_dacay'"):
        cls(_params(), ema_dacay=0.9)
    opt = cls(_params(), seed=5, ema_decay=0.5, fused=True)
    assert opt.param_groups[0]["seed"] == 5 and opt.param_groups[0]["ema_decay"] == 0.5
    assert opt.param_groups[0]["fused"] is True
