"""mixprec.optim.AdamW / SGD on CUDA: parity with the CPU optimizers (with
masters and master-free), a step captured in a CUDA graph with a scaler's
device tensors, the folded clip of backward_and_step. Skipped without a GPU;
run by scripts/gpu_check.sh on the lent GPU machine."""

import copy

import pytest
import torch

import mixprec
from mixprec.optim import SGD, AdamW

from _optim_cuda import capture_step, on_cuda, step_both
from _reference import assert_same, requires_cuda

pytestmark = [pytest.mark.cuda, requires_cuda]


@pytest.mark.parametrize("cls,kw", [(mixprec.optim.AdamW, dict(lr=1e-2, amsgrad=True)),
                                    (mixprec.optim.SGD, dict(lr=1e-2, momentum=0.9, nesterov=True))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_optimizer_cuda_matches_cpu(gen, cls, kw, dtype):
    shapes = [(1,), (7,), (33, 5), (4097,), (100003,)]
    cpu = [torch.nn.Parameter(torch.randn(*s, generator=gen).to(dtype)) for s in shapes]
    gpu = on_cuda(cpu)
    oc, og = cls(cpu, **kw), cls(gpu, **kw)
    step_both(gen, oc, og, cpu, gpu, 10, dtype)
    for p, q in zip(cpu, gpu):
        assert_same(p.detach(), q.detach().cpu())
        for k, v in oc.state[p].items():
            torch.testing.assert_close(og.state[q][k].cpu(), v, rtol=2e-7, atol=0)


def test_optimizer_step_in_cuda_graph_with_scaler(gen):
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).cuda().bfloat16()
    ref = [p.detach().clone() for p in model.parameters()]
    opt = mixprec.optim.AdamW(model.parameters(), lr=torch.tensor(1e-3, device="cuda"))
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()  # creates state outside the graph
    ref_params = [torch.nn.Parameter(r) for r in ref]
    ref_opt = mixprec.optim.AdamW(ref_params, lr=torch.tensor(1e-3, device="cuda"))
    for p in ref_params:
        p.grad = torch.zeros_like(p)
    ref_opt.step()
    found_inf = torch.zeros((), device="cuda")
    grad_scale = torch.tensor(256.0, device="cuda")
    graph = capture_step(opt, found_inf, grad_scale)
    for step in range(5):
        grads = [torch.randn(p.shape, generator=gen).to("cuda", torch.bfloat16) for p in model.parameters()]
        for p, q, g in zip(model.parameters(), ref_params, grads):
            p.grad.copy_(g * 256)
            q.grad = (g * 256).clone()
        found_inf.fill_(1.0 if step == 2 else 0.0)
        graph.replay()
        ref_opt.found_inf, ref_opt.grad_scale = found_inf.clone(), grad_scale
        ref_opt.step()
        del ref_opt.found_inf, ref_opt.grad_scale
    torch.cuda.synchronize()
    for p, q in zip(model.parameters(), ref_params):
        assert torch.equal(p, q)


def test_folded_clip_on_cuda_matches_cpu(gen):
    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).bfloat16()
    nets = {"cpu": net, "cuda": copy.deepcopy(net).cuda()}
    opts = {k: mixprec.optim.AdamW(m.parameters(), lr=1e-2) for k, m in nets.items()}
    scalers = {k: mixprec.amp.GradScaler(k, init_scale=1024.0) for k in nets}
    for _ in range(3):
        x = torch.randn(16, 64, generator=gen).bfloat16()
        y = torch.randint(0, 10, (16,), generator=gen)
        norms = {}
        for k, m in nets.items():
            loss = torch.nn.functional.cross_entropy(m(x.to(k)).float(), y.to(k))
            norms[k] = mixprec.amp.backward_and_step(loss, opts[k], scalers[k], max_norm=0.1)
        torch.testing.assert_close(norms["cuda"].cpu(), norms["cpu"], rtol=1e-5, atol=0)
    for p, q in zip(nets["cpu"].parameters(), nets["cuda"].parameters()):
        torch.testing.assert_close(opts["cuda"].state[q]["master"].cpu(), opts["cpu"].state[p]["master"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("opt", ["adamw", "sgd"])
def test_master_free_cuda_matches_cpu_bit_for_bit(gen, opt):
    shapes = [(3,), (4097,), (33, 7), (100003,)]
    cpu_p = [torch.nn.Parameter(torch.randn(*s, generator=gen).bfloat16()) for s in shapes]
    gpu_p = on_cuda(cpu_p)

    def make(ps):
        if opt == "adamw":
            return AdamW(ps, lr=1e-2, amsgrad=True, master_weights=False, seed=99)
        return SGD(ps, lr=1e-2, momentum=0.9, nesterov=True, master_weights=False, seed=99)

    oc, og = make(cpu_p), make(gpu_p)
    step_both(gen, oc, og, cpu_p, gpu_p, 5)
    for c, g in zip(cpu_p, gpu_p):
        assert torch.equal(c.detach().view(torch.int16), g.detach().cpu().view(torch.int16))
