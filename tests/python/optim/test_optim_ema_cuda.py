"""The fused EMA (``ema_decay=``) on CUDA: bit for bit the CPU's, skipped on
the device by found_inf, and replayed in a CUDA graph where the decay
schedule follows the device step count. Skipped without a GPU; run by
scripts/gpu_check.sh on the lent GPU machine."""

import pytest
import torch

from mixprec.optim import SGD, AdamW

from _optim_cuda import capture_step, on_cuda, step_both
from _reference import assert_same, requires_cuda

pytestmark = [pytest.mark.cuda, requires_cuda]

SHAPES = [(1,), (7,), (33, 5), (4097,), (100003,)]


@pytest.mark.parametrize("cls,kw", [(AdamW, dict(lr=1e-2)), (SGD, dict(lr=1e-2, momentum=0.9))])
@pytest.mark.parametrize("dtype,mw", [(torch.float32, True), (torch.bfloat16, True), (torch.float16, True),
                                      (torch.bfloat16, False)])
@pytest.mark.parametrize("ema", [dict(ema_decay=0.99), dict(ema_decay=0.999, ema_update_every=3,
                                                             ema_update_after_step=2)])
def test_ema_cuda_matches_cpu_bitwise(gen, cls, kw, dtype, mw, ema):
    cpu = [torch.nn.Parameter((torch.randn(*s, generator=gen) * 0.5).to(dtype)) for s in SHAPES]
    gpu = on_cuda(cpu)
    oc = cls(cpu, master_weights=mw, seed=3, **kw, **ema)
    og = cls(gpu, master_weights=mw, seed=3, **kw, **ema)
    step_both(gen, oc, og, cpu, gpu, 9, dtype)
    for p, q in zip(cpu, gpu):
        assert_same(p.detach(), q.detach().cpu())
        assert_same(oc.state[p]["ema"], og.state[q]["ema"].cpu())


def test_ema_warmup_cuda_close_to_cpu(gen):
    # The warmup's pow is the device's (within 2 ulp in double): equal but
    # for a rare last-bit difference of the float weight.
    cpu = [torch.nn.Parameter(torch.randn(*s, generator=gen).bfloat16()) for s in SHAPES]
    gpu = on_cuda(cpu)
    kw = dict(lr=1e-2, ema_decay=0.9999, ema_use_warmup=True, ema_warmup_power=0.75)
    oc, og = AdamW(cpu, **kw), AdamW(gpu, **kw)
    step_both(gen, oc, og, cpu, gpu, 20)
    for p, q in zip(cpu, gpu):
        torch.testing.assert_close(og.state[q]["ema"].cpu(), oc.state[p]["ema"], rtol=1e-6, atol=1e-7)


def test_ema_skip_and_graph_replay(gen):
    params = [torch.nn.Parameter(torch.randn(*s, generator=gen, device="cpu").cuda().bfloat16()) for s in SHAPES]
    opt = AdamW(params, lr=1e-3, ema_decay=0.9, ema_use_warmup=True)
    ref_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    ref = AdamW(ref_params, lr=1e-3, ema_decay=0.9, ema_use_warmup=True)
    for p, r in zip(params, ref_params):
        p.grad = torch.zeros_like(p)
        r.grad = torch.zeros_like(r)
    opt.step()  # state outside the graph
    ref.step()
    found_inf = torch.zeros((), device="cuda")
    grad_scale = torch.tensor(4.0, device="cuda")
    graph = capture_step(opt, found_inf, grad_scale)
    for it in range(6):
        skip = it == 2
        for p, r in zip(params, ref_params):
            g = torch.randn(p.shape, generator=gen).cuda().bfloat16()
            p.grad.copy_(g * 4)
            r.grad.copy_(g)
        if skip:
            p.grad.view(-1)[0] = float("inf")
        found_inf.fill_(1.0 if skip else 0.0)
        graph.replay()
        if not skip:
            ref.step()
    torch.cuda.synchronize()
    for p, r in zip(params, ref_params):
        assert_same(p.detach(), r.detach())
        assert_same(opt.state[p]["ema"], ref.state[r]["ema"])
        assert float(opt.state[p]["step"]) == 6.0
