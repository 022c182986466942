"""mixprec::overflow_check_ and the guard on CUDA: the record equals the
CPU's bit for bit (scratch fields cleared), one call per module, the guard
names the overflowing module and falls back on a CUDA model. Skipped without
a GPU; run by scripts/gpu_check.sh on the lent GPU machine."""

import pytest
import torch

import mixprec
from mixprec import _overflow as ov
from mixprec.guard import ForwardGuard

from _models import amp_steps, batches, vit
from _reference import requires_cuda

pytestmark = [pytest.mark.cuda, requires_cuda]


@pytest.mark.parametrize("bad", ["none", "output", "output+input", "input"])
def test_record_matches_cpu(gen, bad):
    outs = [(torch.randn(n, generator=gen) * 3000).to(d) for n, d in
            ((100_003, torch.float16), (17, torch.bfloat16), (70_000, torch.float32))]
    ins = [torch.randn(40_000, generator=gen).half()]
    if "output" in bad:
        outs[0][50_001] = float("inf")
    if "input" in bad:
        ins[0][39_999] = float("nan")
    cpu, gpu = ov.new_record(3), ov.new_record(3, "cuda")
    for _ in range(2):  # the second call finds the scratch cleared by the first
        ov.overflow_check_(outs, ins, cpu, 1)
        ov.overflow_check_([t.cuda() for t in outs], [t.cuda() for t in ins], gpu, 1)
    assert torch.equal(gpu.cpu().view(torch.int32), cpu.view(torch.int32))


def test_guard_names_and_falls_back_on_cuda():
    model = vit().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = mixprec.amp.GradScaler("cuda", diagnostics=True)
    guard = ForwardGuard(model, fallback=True).attach(scaler)
    amp_steps(model, opt, scaler, [(x.cuda(), y.cuda()) for x, y in batches(3)], device="cuda")
    assert guard.reports()[0].module == "blocks.1.attn" and len(guard.reports()) == 1
    assert guard.fallback_set == {"blocks.1.attn": torch.float32}
