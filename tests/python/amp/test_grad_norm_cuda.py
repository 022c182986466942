"""mixprec::grad_norm on CUDA: read-only, equal to unscale_norm_ and to the CPU
op. Skipped without a GPU; run by scripts/gpu_check.sh on the lent GPU
machine."""

import pytest
import torch

from _reference import rand_grads, requires_cuda

pytestmark = [pytest.mark.cuda, requires_cuda]


def test_grad_norm_cuda_is_read_only_and_matches_unscale_norm(gen):
    cpu = rand_grads(gen, torch.bfloat16, [5000]) + rand_grads(gen, torch.float16, [210]) + rand_grads(gen, torch.float32, [65537])
    grads = [g.cuda() for g in cpu]
    keep = [g.clone() for g in grads]
    inv = torch.tensor([1.0 / 1024], device="cuda")
    fa, fb = torch.zeros(1, device="cuda"), torch.zeros(1, device="cuda")
    na, ta = torch.ops.mixprec.grad_norm(grads, fa, inv)
    for g, k in zip(grads, keep):
        assert torch.equal(g, k)
    nb, tb = torch.ops.mixprec.unscale_norm_(grads, fb, inv)
    assert torch.equal(na, nb) and torch.equal(ta, tb) and torch.equal(fa, fb)
    # CPU twin: norms equal to float rounding (the summation orders differ).
    cpu = [k.cpu() for k in keep]
    nc, tc = torch.ops.mixprec.grad_norm(cpu, torch.zeros(1), inv.cpu())
    torch.testing.assert_close(na.cpu(), nc, rtol=2e-6, atol=0)
