"""What p.grad holds after scaler.step(opt) (issue 12.4): with mixprec's
optimizers the unscaled gradient, as torch's optimizers leave it (torch's
fused ones write g / grad_scale back in their step, the others get it from
unscale_). Before the fix mixprec left it multiplied by the scale. The
folded path (fold=True, backward_and_step) opts out: grads stay scaled and
only read; a skipped step leaves them scaled, as torch's fused optimizers
do."""

import copy

import pytest
import torch

import mixprec

SCALE = 2.0**8


def _models(dtype, seed=0):
    torch.manual_seed(seed)
    ref = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.ReLU(), torch.nn.Linear(24, 5))
    ours = copy.deepcopy(ref).to(dtype)
    with torch.no_grad():
        for r, o in zip(ref.parameters(), ours.parameters()):
            r.copy_(o.float())
    return ref, ours


def _data(dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(16, 12, generator=g), torch.randint(0, 5, (16,), generator=g)


TORCH = {
    "adamw_fused": lambda p: torch.optim.AdamW(p, lr=1e-3, fused=True),
    "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=True),
    "sgd_fused": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, fused=True),
}
OURS = {
    "adamw_fused": lambda p: mixprec.optim.AdamW(p, lr=1e-3),
    "adamw_foreach": lambda p: mixprec.optim.AdamW(p, lr=1e-3),
    "sgd_fused": lambda p: mixprec.optim.SGD(p, lr=1e-2, momentum=0.9),
}


@pytest.mark.parametrize("name", sorted(TORCH))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_grads_after_step_equal_torch(name, dtype):
    ref, ours = _models(dtype)
    ref_opt, opt = TORCH[name](ref.parameters()), OURS[name](ours.parameters())
    ref_scaler = torch.amp.GradScaler("cpu", init_scale=SCALE)
    scaler = mixprec.amp.GradScaler("cpu", init_scale=SCALE)
    x, y = _data(dtype)
    for model, o, s, inp in ((ref, ref_opt, ref_scaler, x), (ours, opt, scaler, x.to(dtype))):
        s.scale(torch.nn.functional.cross_entropy(model(inp).float(), y)).backward()
    scaled = [p.grad.clone() for p in ours.parameters()]
    # Same gradients going in (the reference gets ours, upcast).
    for r, p in zip(ref.parameters(), ours.parameters()):
        r.grad = p.grad.float().clone()
    ref_scaler.step(ref_opt)
    scaler.step(opt)
    for r, p, g in zip(ref.parameters(), ours.parameters(), scaled):
        want = (g.float() / SCALE).to(dtype)
        assert torch.equal(p.grad, want)  # exactly the quotient the step used, rounded
        assert torch.equal(p.grad, r.grad.to(dtype))  # torch's grads (FP32 model), rounded to the param's dtype


@pytest.mark.parametrize("fold_via", ["clip_grad_norm_", "backward_and_step"])
def test_folded_path_leaves_grads_scaled(fold_via):
    _, ours = _models(torch.bfloat16)
    opt = mixprec.optim.AdamW(ours.parameters(), lr=1e-3)
    scaler = mixprec.amp.GradScaler("cpu", init_scale=SCALE)
    x, y = _data(torch.bfloat16)
    loss = torch.nn.functional.cross_entropy(ours(x.bfloat16()).float(), y)
    if fold_via == "backward_and_step":
        grads = {}
        hooks = [p.register_post_accumulate_grad_hook(lambda p: grads.__setitem__(id(p), p.grad.clone()))
                 for p in ours.parameters()]
        mixprec.amp.backward_and_step(loss, opt, scaler, max_norm=1e9, set_to_none=False)
        for h in hooks:
            h.remove()
        for p in ours.parameters():
            assert torch.equal(p.grad, torch.zeros_like(p.grad))  # zero_grad(set_to_none=False) ran
        return
    scaler.scale(loss).backward()
    scaled = [p.grad.clone() for p in ours.parameters()]
    scaler.clip_grad_norm_(opt, 1e9, fold=True)
    scaler.step(opt)
    for p, g in zip(ours.parameters(), scaled):
        assert torch.equal(p.grad, g)  # read only
    assert not hasattr(opt, "_grads_read_only")
    # The next, unfolded step writes again.
    opt.zero_grad()
    scaler.update()
    scaler.scale(torch.nn.functional.cross_entropy(ours(x.bfloat16()).float(), y)).backward()
    scaled = [p.grad.clone() for p in ours.parameters()]
    scaler.step(opt)
    s = scaler.get_scale()
    for p, g in zip(ours.parameters(), scaled):
        assert torch.equal(p.grad, (g.float() / s).to(p.grad.dtype))


def test_skipped_step_leaves_grads_scaled_like_torch_fused():
    ref, ours = _models(torch.bfloat16)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, fused=True)
    opt = mixprec.optim.AdamW(ours.parameters(), lr=1e-3)
    ref_scaler, scaler = torch.amp.GradScaler("cpu", init_scale=SCALE), mixprec.amp.GradScaler("cpu", init_scale=SCALE)
    x, y = _data(torch.bfloat16)
    scaler.scale(torch.nn.functional.cross_entropy(ours(x.bfloat16()).float(), y)).backward()
    ours[0].weight.grad[0, 0] = float("inf")
    for r, p in zip(ref.parameters(), ours.parameters()):
        r.grad = p.grad.float().clone()
    ref_scaler.scale(torch.ones(()))
    scaled = [p.grad.clone() for p in ours.parameters()]
    ref_scaled = [r.grad.clone() for r in ref.parameters()]
    ref_scaler.step(ref_opt)
    scaler.step(opt)
    for p, g in zip(ours.parameters(), scaled):
        assert torch.equal(p.grad, g)
    for r, g in zip(ref.parameters(), ref_scaled):
        assert torch.equal(r.grad, g)  # torch's fused AdamW: the same


def test_grads_written_through_a_relayout_copy():
    """A grad whose strides differ from its param's goes to the op as a copy;
    the unscaled values still land in p.grad."""
    p = torch.nn.Parameter(torch.randn(6, 4).bfloat16())
    opt = mixprec.optim.SGD([p], lr=0.1)
    scaler = mixprec.amp.GradScaler("cpu", init_scale=SCALE)
    scaler.scale(torch.ones(()))
    g = (torch.randn(4, 6) * SCALE).bfloat16().t()  # transposed: other strides than p
    p.grad = g.clone()
    scaler.step(opt)
    assert torch.equal(p.grad, (g.float() / SCALE).bfloat16())
