"""The master-free mode of mixprec.optim (``master_weights=False``): BF16
params updated in FP32 from their own value and written back with stochastic
rounding. Checked against torch's FP32 optimizers on upcast params, against
torch's optimizer run directly on BF16 params (which stalls), for
reproducibility, checkpoints, skipped steps and bad configurations."""

import copy

import pytest
import torch

from mixprec.amp import GradScaler
from mixprec.optim import SGD, AdamW


def _bf16_neighbours(ref: torch.Tensor):
    """The two BF16 values around each FP32 value (equal when exact)."""
    bits = ref.float().contiguous().view(torch.int32)
    lo = (bits >> 16).to(torch.int16)  # truncation toward zero
    exact = (bits & 0xFFFF) == 0
    hi = torch.where(exact, lo, lo + 1)
    return lo.view(torch.bfloat16), hi.view(torch.bfloat16)


@pytest.mark.parametrize("opt", ["adamw", "sgd"])
def test_one_step_lands_on_a_neighbour_of_torchs_fp32_step(gen, opt):
    shapes = [(1,), (9,), (33, 5), (4099,), (70001,)]
    ours_p = [torch.nn.Parameter((torch.randn(*s, generator=gen) * 0.5).bfloat16()) for s in shapes]
    ref_p = [torch.nn.Parameter(p.detach().float().clone()) for p in ours_p]
    if opt == "adamw":
        ours = AdamW(ours_p, lr=1e-2, master_weights=False, seed=3)
        ref = torch.optim.AdamW(ref_p, lr=1e-2, fused=True)
    else:
        ours = SGD(ours_p, lr=1e-2, momentum=0.9, weight_decay=1e-3, master_weights=False, seed=3)
        ref = torch.optim.SGD(ref_p, lr=1e-2, momentum=0.9, weight_decay=1e-3, fused=True)
    for _ in range(3):  # state must match too: several steps, same rounding of params
        for p, r in zip(ours_p, ref_p):
            g = torch.randn(p.shape, generator=gen).bfloat16()
            p.grad = g
            r.grad = g.float()
        # torch's step starts from our (stochastically rounded) params.
        with torch.no_grad():
            for p, r in zip(ours_p, ref_p):
                r.copy_(p.float())
        ours.step()
        ref.step()
        moved = total = 0
        for p, r in zip(ours_p, ref_p):
            lo, hi = _bf16_neighbours(r.detach())
            got = p.detach()
            ok = (got.view(torch.int16) == lo.view(torch.int16)) | (got.view(torch.int16) == hi.view(torch.int16))
            assert bool(ok.all()), f"{int((~ok).sum())} elements off the two BF16 neighbours"
            moved += int((got != r.detach().bfloat16()).sum())
            total += got.numel()
        # Stochastic, not nearest: a good share differs from round-to-nearest.
        assert moved > total // 20
    for p in ours_p:
        assert "master" not in ours.state[p]
        if opt == "adamw":
            assert ours.state[p]["exp_avg"].dtype is torch.float32


def _regression(gen, n=64, d=256):
    x = torch.randn(n, d, generator=gen)
    w_true = torch.randn(d, generator=gen)
    y = x @ w_true
    # Large initial weights: BF16's spacing there (2^-6 in [2, 4)) dwarfs
    # every update of lr 1e-3.
    w0 = (torch.rand(d, generator=gen) * 2 + 2) * torch.sign(torch.randn(d, generator=gen))
    return x, y, w0


def _train(x, y, w0, dtype, make_opt, steps):
    w = torch.nn.Parameter(w0.to(dtype).clone())
    opt = make_opt([w])
    for _ in range(steps):
        wf = w.detach().float()
        g = 2.0 / x.shape[0] * x.T @ (x @ wf - y)
        w.grad = g.to(dtype)
        opt.step()
    wf = w.detach().float()
    return float(((x @ wf - y) ** 2).mean())


def test_bf16_params_stall_under_torch_but_track_fp32_here(gen):
    x, y, w0 = _regression(gen)
    steps = 400
    loss0 = float(((x @ w0.bfloat16().float() - y) ** 2).mean())
    fp32 = _train(x, y, w0, torch.float32, lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.0), steps)
    torch_bf16 = _train(x, y, w0, torch.bfloat16, lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.0), steps)
    master = _train(x, y, w0, torch.bfloat16, lambda p: AdamW(p, lr=1e-3, weight_decay=0.0), steps)
    sr = _train(x, y, w0, torch.bfloat16, lambda p: AdamW(p, lr=1e-3, weight_decay=0.0, master_weights=False, seed=1), steps)
    print(f"loss: start {loss0:.3f} fp32 {fp32:.3f} torch-bf16 {torch_bf16:.3f} master {master:.3f} sr {sr:.3f}")
    assert fp32 < 0.75 * loss0, "the FP32 run must make progress for this test to mean anything"
    # torch on BF16 params: every update rounds away.
    assert torch_bf16 > 0.99 * loss0
    # Master weights: FP32's trajectory (the param is only its rounding).
    assert abs(master - fp32) < 0.02 * loss0
    # Stochastic rounding: FP32's progress, up to rounding noise.
    assert abs(sr - fp32) < 0.05 * loss0
    assert sr < 0.8 * loss0


def _sr_run(seed, steps, gen_seed=0, split_at=None):
    gen = torch.Generator().manual_seed(gen_seed)
    ps = [torch.nn.Parameter(torch.randn(1000, generator=gen).bfloat16()), torch.nn.Parameter(torch.randn(7, 3, generator=gen).bfloat16())]
    opt = AdamW(ps, lr=1e-3, master_weights=False, seed=seed)
    grads = [[torch.randn(p.shape, generator=gen).bfloat16() for p in ps] for _ in range(steps)]
    for s in range(steps):
        if split_at is not None and s == split_at:
            # Checkpoint and restore into a fresh optimizer (and fresh params).
            sd = copy.deepcopy(opt.state_dict())
            ps = [torch.nn.Parameter(p.detach().clone()) for p in ps]
            opt = AdamW(ps, lr=1e-3, master_weights=False, seed=seed + 999)  # seed comes from the checkpoint
            opt.load_state_dict(sd)
        for p, g in zip(ps, grads[s]):
            p.grad = g
        opt.step()
    return [p.detach().clone() for p in ps]


def test_reproducible_seeded_and_checkpointable():
    a = _sr_run(11, 6)
    b = _sr_run(11, 6)
    c = _sr_run(12, 6)
    d = _sr_run(11, 6, split_at=3)
    for x, y in zip(a, b):
        assert torch.equal(x.view(torch.int16), y.view(torch.int16))
    assert any(not torch.equal(x, y) for x, y in zip(a, c)), "another seed must round differently"
    for x, y in zip(a, d):
        assert torch.equal(x.view(torch.int16), y.view(torch.int16)), "resuming from a checkpoint must not change the bits"


def test_seed_drawn_from_torch_generator():
    torch.manual_seed(5)
    s1 = AdamW([torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))], master_weights=False).param_groups[0]["seed"]
    torch.manual_seed(5)
    s2 = AdamW([torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))], master_weights=False).param_groups[0]["seed"]
    assert s1 == s2 and isinstance(s1, int)
    # With masters nothing is drawn (the user's random stream is untouched).
    torch.manual_seed(5)
    AdamW([torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))])
    after = torch.rand(1)
    torch.manual_seed(5)
    assert torch.equal(after, torch.rand(1))


def test_float16_params_need_masters():
    p = torch.nn.Parameter(torch.zeros(3, dtype=torch.float16))
    with pytest.raises(ValueError, match="float16"):
        AdamW([p], master_weights=False)
    opt = SGD([torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))], master_weights=False)
    with pytest.raises(ValueError, match="float16"):
        opt.add_param_group({"params": [p]})
    # Per group: a master-free BF16 group beside an FP16 group with masters.
    q = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    opt = AdamW([{"params": [q], "master_weights": False}, {"params": [p]}], lr=0.1)
    q.grad = torch.ones_like(q)
    p.grad = torch.ones_like(p)
    opt.step()
    assert "master" not in opt.state[q] and "master" in opt.state[p]
    assert float(q.detach().float().max()) < 1.0 and float(p.detach().float().max()) < 0.0


def test_master_loaded_from_checkpoint_is_dropped(gen):
    p = torch.nn.Parameter(torch.randn(10, generator=gen).bfloat16())
    with_master = AdamW([p])
    p.grad = torch.randn(10, generator=gen).bfloat16()
    with_master.step()
    sd = with_master.state_dict()
    q = torch.nn.Parameter(p.detach().clone())
    free = AdamW([q], master_weights=False, seed=1)
    free.load_state_dict(sd)
    # The loaded group carries the saved group's options: master_weights is
    # the checkpoint's (True) unless the user re-sets it, as torch does for lr.
    free.param_groups[0]["master_weights"] = False
    free.param_groups[0]["seed"] = 1
    q.grad = torch.randn(10, generator=gen).bfloat16()
    free.step()
    assert "master" not in free.state[q]
    assert float(free.state[q]["step"]) == 2.0


def test_skipped_steps_leave_everything_unchanged(gen):
    ps = [torch.nn.Parameter(torch.randn(50, generator=gen).bfloat16()) for _ in range(3)]
    opt = AdamW(ps, lr=1e-2, master_weights=False, seed=4)
    scaler = GradScaler("cpu", init_scale=1024.0)
    for step in range(4):
        loss = sum((p.float() ** 2).sum() for p in ps)
        scaler.scale(loss).backward()
        if step == 2:
            ps[1].grad[3] = float("inf")
        before = [p.detach().clone() for p in ps]
        state_before = copy.deepcopy(opt.state)
        scaler.step(opt)
        scaler.update()
        if step == 2:
            for p, b in zip(ps, before):
                assert torch.equal(p.detach().view(torch.int16), b.view(torch.int16))
            for p in ps:
                for k, v in state_before[p].items():
                    assert torch.equal(opt.state[p][k], v), k
        opt.zero_grad()
    assert float(opt.state[ps[0]]["step"]) == 3.0
    assert scaler.get_scale() == 512.0


def test_saves_the_master_copy(gen):
    ps = [torch.nn.Parameter(torch.randn(1000, generator=gen).bfloat16())]
    for mw, want in ((True, 12), (False, 8)):
        opt = AdamW(ps, master_weights=mw, seed=0)
        ps[0].grad = torch.randn(1000, generator=gen).bfloat16()
        opt.step()
        state_bytes = sum(v.numel() * v.element_size() for v in opt.state[ps[0]].values() if v.dim() > 0)
        assert state_bytes == want * 1000
