"""mixprec.amp.GradScaler against torch.amp.GradScaler, step by step."""

import copy
import pickle

import pytest
import torch

import mixprec
from mixprec.amp import GradScaler

from _reference import norm64


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 6 * 6, 5)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def make_pair(gen, dtype, opt_factory):
    torch.manual_seed(int(torch.randint(0, 2**30, (1,), generator=gen)))
    a = Net().to(dtype)
    b = copy.deepcopy(a)
    return a, b, opt_factory(a.parameters()), opt_factory(b.parameters())


def run_step(model, opt, scaler, x, y, poison, clip=None):
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(x).float(), y)
    scaler.scale(loss).backward()
    if poison is not None:
        # An overflow as a real run would produce it, in one gradient.
        next(iter(model.parameters())).grad.view(-1)[3] = poison
    if clip is not None:
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    scaler.step(opt)
    scaler.update()


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "adamw_fused": lambda p: torch.optim.AdamW(p, lr=1e-3, fused=True),
    "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=True),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("clip", [None, 0.5])
def test_trajectory_matches_torch(gen, dtype, opt_name, clip):
    if opt_name == "adamw_fused" and dtype is torch.bfloat16:
        pytest.skip("torch's fused CPU AdamW state follows the param dtype; covered in fp32")
    ref_model, our_model, ref_opt, our_opt = make_pair(gen, dtype, OPTIMIZERS[opt_name])
    ref = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
    ours = GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
    poison = {4: float("inf"), 5: float("nan"), 11: float("-inf"), 12: float("inf"), 13: float("nan")}
    skipped = 0
    for step in range(20):
        x = torch.randn(4, 3, 6, 6, generator=gen).to(dtype)
        y = torch.randint(0, 5, (4,), generator=gen)
        run_step(ref_model, ref_opt, ref, x, y, poison.get(step), clip)
        run_step(our_model, our_opt, ours, x, y, poison.get(step), clip)
        skipped += step in poison
        assert ours.get_scale() == ref.get_scale(), step
        assert ours._get_growth_tracker() == ref._get_growth_tracker(), step
        assert ours.get_skipped_steps() == skipped
        for p, q in zip(ref_model.parameters(), our_model.parameters()):
            assert torch.equal(p, q), step
    assert ref.get_scale() != 2.0**10  # the run did back off and grow


def test_fp16_grads_refused_with_torch_optimizer_accepted_with_mixprec(gen):
    """torch refuses FP16 grads in unscale_ (its optimizers keep FP16 state,
    which overflows to NaN); so does mixprec's scaler with a torch optimizer,
    with the same error. mixprec's optimizers keep FP32 state: accepted,
    unscaled exactly."""
    model = Net().to(torch.float16)
    x = torch.randn(2, 3, 6, 6, generator=gen).half()
    loss = model(x).float().sum()
    for scaler in (torch.amp.GradScaler("cpu", init_scale=256.0), GradScaler("cpu", init_scale=256.0)):
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        scaler.scale(loss).backward(retain_graph=True)
        before = [p.grad.clone() for p in model.parameters()]
        with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
            scaler.unscale_(opt)
        assert all(torch.equal(p.grad, b) for p, b in zip(model.parameters(), before))
        opt.zero_grad()
    opt = mixprec.optim.SGD(model.parameters(), lr=0.01)
    ours = GradScaler("cpu", init_scale=256.0)
    ours.scale(loss).backward()
    scaled = [p.grad.clone() for p in model.parameters()]
    ours.unscale_(opt)
    for p, s in zip(model.parameters(), scaled):
        want = (s.float() * (1.0 / 256.0)).half()
        assert torch.equal(p.grad, want)


class _OptInSGD(torch.optim.SGD):
    """An optimizer that declares it keeps FP32 state (the opt-in mixprec's
    optimizers make), so the scaler hands it FP16 gradients."""

    _accepts_fp16_grads = True


def test_mixed_dtype_grads_one_pass(gen):
    a = torch.nn.Parameter(torch.randn(100, generator=gen))
    b = torch.nn.Parameter(torch.randn(50, generator=gen).bfloat16())
    c = torch.nn.Parameter(torch.randn(10, generator=gen).half())
    d = torch.nn.Parameter(torch.randn(10, generator=gen).double())
    opt = _OptInSGD([a, b, c, d], lr=0.1)
    ga, gb, gc, gd = (torch.randn_like(t) * 64 for t in (a, b, c, d))
    for p, g in zip((a, b, c, d), (ga, gb, gc, gd)):
        p.grad = g.clone()
    s = GradScaler("cpu", init_scale=64.0)
    s.scale(torch.ones(()))
    norm = s.unscale_(opt, return_norm=True)
    for p, g in zip((a, b, c, d), (ga, gb, gc, gd)):
        want = (g.double() / 64.0) if g.dtype is torch.float64 else (g.float() * (1 / 64.0)).to(g.dtype)
        assert torch.equal(p.grad, want.to(g.dtype))
    want_norm = norm64(p.grad for p in (a, b, c, d))
    torch.testing.assert_close(norm.double(), want_norm, rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_clip_grad_norm_matches_torch(gen, dtype):
    ref_model, our_model, ref_opt, our_opt = make_pair(gen, dtype, OPTIMIZERS["sgd"])
    ref = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    ours = GradScaler("cpu", init_scale=2.0**12)
    for step in range(5):
        x = torch.randn(4, 3, 6, 6, generator=gen).to(dtype)
        y = torch.randint(0, 5, (4,), generator=gen)
        for model, opt, sc in ((ref_model, ref_opt, ref), (our_model, our_opt, ours)):
            opt.zero_grad()
            sc.scale(torch.nn.functional.cross_entropy(model(x).float(), y)).backward()
        ref.unscale_(ref_opt)
        # What our grads are after unscaling, via torch's own op.
        unscaled = [p.grad.clone() for p in our_model.parameters()]
        inv = torch.full((1,), ours.get_scale()).double().reciprocal().float()
        torch._amp_foreach_non_finite_check_and_unscale_(unscaled, torch.zeros(1), inv)
        # Independent reference: the float64 norm of the unscaled grads (torch
        # itself computes a BF16 model's norm in BF16).
        norm64 = torch.nn.utils.get_total_norm([g.double() for g in unscaled])
        torch.nn.utils.clip_grad_norm_(ref_model.parameters(), 0.1)
        our_norm = ours.clip_grad_norm_(our_opt, 0.1)
        torch.testing.assert_close(our_norm.double(), norm64, rtol=1e-6, atol=0)
        coef = torch.clamp(0.1 / (our_norm + 1e-6), max=1.0)
        for g, q in zip(unscaled, our_model.parameters()):
            assert torch.equal(q.grad, g * coef)
        if dtype is torch.float32:
            for p, q in zip(ref_model.parameters(), our_model.parameters()):
                # The two runs drift apart by rounding only (norms differ in the last bit).
                torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-9)
        for sc, opt in ((ref, ref_opt), (ours, our_opt)):
            sc.step(opt)
            sc.update()


def test_state_dict_round_trip_and_cross_load(gen):
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ours = GradScaler("cpu", init_scale=2.0**8, growth_interval=2, hysteresis=2, max_scale=2.0**20)
    for poison in (None, float("inf"), float("inf"), None, None, None):
        x = torch.randn(2, 3, 6, 6, generator=gen)
        run_step(model, opt, ours, x, torch.tensor([0, 1]), poison)
    sd = ours.state_dict()
    assert set(sd) >= {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}
    assert sd["_skipped_steps"] == 2 and sd["hysteresis"] == 2

    again = GradScaler("cpu")
    again.load_state_dict(sd)
    assert again.state_dict() == sd
    again.scale(torch.ones(()))  # lazily creates the tensors from the loaded values
    assert again.state_dict() == sd

    # torch's scaler loads ours (ignoring the extra keys) ...
    theirs = torch.amp.GradScaler("cpu")
    theirs.load_state_dict(sd)
    assert theirs.get_scale() == ours.get_scale()
    assert theirs._get_growth_tracker() == ours._get_growth_tracker()
    # ... and ours loads torch's.
    back = GradScaler("cpu")
    back.load_state_dict(theirs.state_dict())
    for key, value in theirs.state_dict().items():
        assert back.state_dict()[key] == value


def test_pickle(gen):
    s = GradScaler("cpu", init_scale=32.0, growth_interval=7)
    s.scale(torch.ones(()))
    s2 = pickle.loads(pickle.dumps(s))
    assert s2.get_scale() == 32.0 and s2.get_growth_interval() == 7 and s2.get_skipped_steps() == 0


def test_errors_like_torch(gen):
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    s = GradScaler("cpu")
    s.scale(model(torch.randn(1, 3, 6, 6, generator=gen)).sum()).backward()
    s.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        s.unscale_(opt)
    s.step(opt)
    with pytest.raises(RuntimeError, match="after step"):
        s.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        s.step(opt)
    s.update()
    with pytest.raises(AssertionError):
        GradScaler("cpu", growth_factor=0.9)
    assert isinstance(s, torch.amp.GradScaler)


def test_disabled_is_passthrough(gen):
    s = GradScaler("cpu", enabled=False)
    t = torch.randn(3, generator=gen)
    assert s.scale(t) is t
    assert s.state_dict() == {}
    with pytest.warns(UserWarning):
        cuda = GradScaler("cuda") if not torch.cuda.is_available() else None
    if cuda is not None:
        assert not cuda.is_enabled()


def test_hysteresis_and_bounds_in_training(gen):
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    s = GradScaler("cpu", init_scale=1024.0, growth_interval=1, hysteresis=2, min_scale=256.0, max_scale=4096.0)
    scales = []
    for poison in (float("inf"), float("inf"), float("inf"), float("inf"), None, None, None, None):
        run_step(model, opt, s, torch.randn(2, 3, 6, 6, generator=gen), torch.tensor([1, 2]), poison)
        scales.append(s.get_scale())
    assert scales == [1024.0, 512.0, 256.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0]
    assert s.get_skipped_steps() == 4


def test_amp_scaling_optimizer_gets_device_tensors(gen):
    """For optimizers with _step_supports_amp_scaling the skip decision stays
    on the device: step() never reads found_inf on the host."""
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    s = GradScaler("cpu", init_scale=2.0**10)
    seen = {}
    real_step = opt.step

    def spy(*a, **k):
        seen["found_inf"] = opt.found_inf
        seen["grad_scale"] = opt.grad_scale
        return real_step(*a, **k)

    opt.step = spy
    s.scale(model(torch.randn(2, 3, 6, 6, generator=gen)).sum()).backward()
    before = [p.clone() for p in model.parameters()]
    next(iter(model.parameters())).grad.view(-1)[0] = float("nan")
    original_item = torch.Tensor.item
    calls = []
    torch.Tensor.item = lambda self: calls.append(1) or original_item(self)
    try:
        s.step(opt)
        s.update()
    finally:
        torch.Tensor.item = original_item
    assert calls == []
    assert isinstance(seen["found_inf"], torch.Tensor) and seen["found_inf"].item() == 1.0
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p, b)  # the fused optimizer skipped the step


def test_training_step_under_torch_compile(gen):
    model = Net()
    ref_model = copy.deepcopy(model)
    compiled = torch.compile(model, backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.05)
    s, ref = GradScaler("cpu", init_scale=2.0**10), torch.amp.GradScaler("cpu", init_scale=2.0**10)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def unscale_and_norm(grads, found_inf, inv_scale):
        per, total = torch.ops.mixprec.unscale_norm_(grads, found_inf, inv_scale)
        return total

    for step in range(4):
        x = torch.randn(4, 3, 6, 6, generator=gen)
        y = torch.randint(0, 5, (4,), generator=gen)
        for m, o, sc in ((compiled, opt, s), (ref_model, ref_opt, ref)):
            o.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(m(x), y)
            sc.scale(loss).backward()
            sc.step(o)
            sc.update()
        for p, q in zip(model.parameters(), ref_model.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    grads = [p.grad.clone() for p in model.parameters()]
    fi = torch.zeros(1)
    norm = unscale_and_norm(grads, fi, torch.tensor([0.5]))
    want = torch.nn.utils.get_total_norm([p.grad * 0.5 for p in model.parameters()])
    torch.testing.assert_close(norm, want, rtol=1e-5, atol=0)
