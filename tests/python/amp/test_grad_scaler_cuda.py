"""mixprec.amp.GradScaler on CUDA with BF16 and FP16 models. Skipped without a
GPU; run by scripts/gpu_check.sh on the lent GPU machine."""

import pytest
import torch

import mixprec

from _reference import norm64, requires_cuda

pytestmark = [pytest.mark.cuda, requires_cuda]


def test_grad_scaler_cuda_bf16_fp16(gen):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).cuda()
    for dtype in (torch.bfloat16, torch.float16):
        m = model.to(dtype)
        # FP16 grads go only to optimizers with FP32 state (mixprec's); a
        # torch optimizer gets torch's ValueError (tested on the CPU).
        opt = mixprec.optim.SGD(m.parameters(), lr=0.01)
        s = mixprec.amp.GradScaler("cuda", init_scale=256.0)
        x = torch.randn(8, 16, generator=gen).to("cuda", dtype)
        s.scale(m(x).float().sum()).backward()
        scaled = [p.grad.clone() for p in m.parameters()]
        norm = s.unscale_(opt, return_norm=True)
        for p, g in zip(m.parameters(), scaled):
            assert torch.equal(p.grad, (g.float() * (1 / 256.0)).to(dtype))
        want = norm64(p.grad for p in m.parameters())
        torch.testing.assert_close(norm.double(), want, rtol=1e-6, atol=0)
        s.step(opt)
        s.update()
