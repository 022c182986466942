"""A write to a parameter from outside the optimizer is seen by its FP32
master (issue 12.2).

Users zero, re-initialise, prune, swap in EMA weights or load checkpoints
into a BF16/FP16 model between steps. torch's optimizers then step from the
written value; before the fix mixprec's stepped from the stale FP32 master
and put the old weights back. Reference: torch's optimizer on an FP32 copy of
the model that received the same write (the written values rounded to the
model's dtype, which is what the low-precision param holds).
"""

import copy

import pytest
import torch

import mixprec

from _reference import requires_cuda

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, requires_cuda])]
LR = 1e-6


def _pair(dtype, device, kind, seed=0):
    torch.manual_seed(seed)
    ref = torch.nn.Sequential(torch.nn.Linear(24, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5)).to(device)
    ours = copy.deepcopy(ref).to(dtype)
    with torch.no_grad():  # the reference starts from the rounded weights
        for r, o in zip(ref.parameters(), ours.parameters()):
            r.copy_(o.float())
    if kind == "adamw":
        return ref, ours, torch.optim.AdamW(ref.parameters(), lr=LR), mixprec.optim.AdamW(ours.parameters(), lr=LR)
    return (ref, ours, torch.optim.SGD(ref.parameters(), lr=LR, momentum=0.9),
            mixprec.optim.SGD(ours.parameters(), lr=LR, momentum=0.9))


def _step(model, opt, x, y, dtype):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x.to(dtype)).float(), y).backward()
    opt.step()


def _write_zero(model, gen):
    model[0].weight.zero_()


def _write_copy(model, gen):
    w = torch.randn(model[0].weight.shape, generator=gen).to(model[0].weight.device)
    model[0].weight.copy_(w)


def _write_mask(model, gen):
    mask = (torch.rand(model[2].weight.shape, generator=gen) > 0.5).to(model[2].weight.device)
    model[2].weight.mul_(mask)


def _write_reinit(model, gen):
    torch.manual_seed(int(torch.randint(0, 1000, (1,), generator=gen)))
    torch.nn.init.kaiming_uniform_(model[0].weight)
    torch.nn.init.zeros_(model[0].bias)


WRITES = {"zero_": _write_zero, "copy_": _write_copy, "mask": _write_mask, "reinit": _write_reinit}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["adamw", "sgd"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("write", sorted(WRITES))
def test_outside_write_is_followed(write, dtype, kind, device):
    ref, ours, ref_opt, opt = _pair(dtype, device, kind)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 24, generator=g).to(device)
    y = torch.randint(0, 5, (16,), generator=g).to(device)
    _step(ref, ref_opt, x, y, torch.float32)
    _step(ours, opt, x, y, dtype)
    with torch.no_grad():
        WRITES[write](ours, torch.Generator().manual_seed(2))
        for r, o in zip(ref.parameters(), ours.parameters()):
            r.copy_(o.float())  # the same write, as the low-precision param holds it
    for _ in range(2):
        _step(ref, ref_opt, x, y, torch.float32)
        _step(ours, opt, x, y, dtype)
    for r, o in zip(ref.parameters(), ours.parameters()):
        master = opt.state[o]["master"]
        # One lr-sized step from the written value (the forward in BF16/FP16
        # changes the gradient, not where the step starts).
        torch.testing.assert_close(master, r.detach(), rtol=0, atol=3 * LR + 1e-7)
        torch.testing.assert_close(o.float(), master.to(dtype).float(), rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_untouched_elements_keep_their_fp32_bits(device):
    """A partial write (a pruning mask) re-seeds only the elements it
    changed; the others keep the master's bits below the param's precision."""
    _, ours, _, opt = _pair(torch.bfloat16, device, "adamw")
    opt.param_groups[0]["lr"] = 1e-3
    g = torch.Generator().manual_seed(3)
    x = torch.randn(16, 24, generator=g).to(device)
    y = torch.randint(0, 5, (16,), generator=g).to(device)
    for _ in range(3):
        _step(ours, opt, x, y, torch.bfloat16)
    w = ours[2].weight
    before = opt.state[w]["master"].clone()
    assert not torch.equal(before, w.float())  # the master holds more than the param
    mask = torch.ones_like(w, dtype=torch.bool)
    mask[:, ::2] = False
    with torch.no_grad():
        w.mul_(mask)
    opt._follow_outside_writes((0, w.device), [w], [w], [opt.state[w]])
    after = opt.state[w]["master"]
    assert torch.equal(after[mask], before[mask])
    assert torch.equal(after[~mask], torch.zeros_like(after[~mask]))


def test_no_write_no_resync():
    """Without an outside write the master is never reset from the param:
    mixprec's steps equal the same steps with the check bypassed, bit for
    bit."""
    _, a, _, opt_a = _pair(torch.bfloat16, "cpu", "adamw")
    _, b, _, opt_b = _pair(torch.bfloat16, "cpu", "adamw")
    opt_b._follow_outside_writes = lambda *args: None
    for o in (opt_a, opt_b):
        o.param_groups[0]["lr"] = 1e-3
    g = torch.Generator().manual_seed(4)
    for _ in range(4):
        x = torch.randn(16, 24, generator=g)
        y = torch.randint(0, 5, (16,), generator=g)
        _step(a, opt_a, x, y, torch.bfloat16)
        _step(b, opt_b, x, y, torch.bfloat16)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(opt_a.state[pa]["master"], opt_b.state[pb]["master"])
        assert torch.equal(pa, pb)


def test_model_load_state_dict_then_optimizer_load_keeps_master():
    """Resuming: model.load_state_dict (an outside write) then
    optimizer.load_state_dict: the checkpoint's FP32 master wins, bit for
    bit; loading the model after the optimizer gives the same masters
    (they round to the loaded params)."""
    _, src, _, src_opt = _pair(torch.bfloat16, "cpu", "adamw")
    src_opt.param_groups[0]["lr"] = 1e-3
    g = torch.Generator().manual_seed(5)
    x = torch.randn(16, 24, generator=g)
    y = torch.randint(0, 5, (16,), generator=g)
    for _ in range(3):
        _step(src, src_opt, x, y, torch.bfloat16)
    model_sd, opt_sd = copy.deepcopy(src.state_dict()), copy.deepcopy(src_opt.state_dict())
    for order in ("model_first", "optimizer_first"):
        _, dst, _, dst_opt = _pair(torch.bfloat16, "cpu", "adamw", seed=9)
        dst_opt.param_groups[0]["lr"] = 1e-3
        _step(dst, dst_opt, x, y, torch.bfloat16)  # some history of its own
        if order == "model_first":
            dst.load_state_dict(model_sd)
            dst_opt.load_state_dict(opt_sd)
        else:
            dst_opt.load_state_dict(opt_sd)
            dst.load_state_dict(model_sd)
        _step(src_c := copy.deepcopy(src), src_opt_c := _clone_opt(src_c, opt_sd), x, y, torch.bfloat16)
        _step(dst, dst_opt, x, y, torch.bfloat16)
        for ps, pd in zip(src_c.parameters(), dst.parameters()):
            assert torch.equal(src_opt_c.state[ps]["master"], dst_opt.state[pd]["master"]), order
            assert torch.equal(ps, pd), order


def _clone_opt(model, sd):
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-3)
    opt.load_state_dict(copy.deepcopy(sd))
    return opt


def test_write_through_data_needs_sync_master_weights():
    """p.data has its own version counter (torch's meaning of .data), so such
    a write is invisible; sync_master_weights() makes the masters follow."""
    _, ours, _, opt = _pair(torch.bfloat16, "cpu", "sgd")
    g = torch.Generator().manual_seed(6)
    x = torch.randn(16, 24, generator=g)
    y = torch.randint(0, 5, (16,), generator=g)
    _step(ours, opt, x, y, torch.bfloat16)
    ours[0].weight.data.zero_()
    opt.sync_master_weights()
    _step(ours, opt, x, y, torch.bfloat16)
    assert ours[0].weight.abs().max().item() < 1e-5
