"""mixprec::grad_norm (mixprec.ops.grad_norm) on the CPU: read-only, equal to
unscale_norm_, against a float64 reference; opcheck; bad inputs."""

import pytest
import torch
from torch.library import opcheck

import mixprec


def test_grad_norm_op_is_read_only_and_equals_unscale_norm(gen):
    grads = [torch.randn(s, generator=gen).to(d) * 300 for s, d in
             (((5, 7), torch.bfloat16), ((1000,), torch.float16), ((33,), torch.float32), ((0,), torch.float32))]
    grads.append(torch.randn(4, 6, generator=gen).t())  # dense, not contiguous
    inv = torch.tensor(1.0 / 512)
    fa, fb = torch.zeros(()), torch.zeros(())
    keep = [g.clone() for g in grads]
    na, ta = mixprec.ops.grad_norm(grads, fa, inv)
    for g, k in zip(grads, keep):
        assert torch.equal(g, k)
    nb, tb = mixprec.ops.unscale_(grads, fb, inv, return_norm=True)
    assert torch.equal(na, nb) and torch.equal(ta, tb) and float(fa) == float(fb) == 0.0
    ref = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(k.double() / 512) for k in keep]))
    torch.testing.assert_close(ta.double(), ref, rtol=1e-3, atol=0)  # half rounding of the unscaled values
    keep[0][0, 0] = float("nan")
    fc = torch.zeros(())
    mixprec.ops.grad_norm(keep, fc, inv)
    assert float(fc) == 1.0
    clean = [torch.randn(9, generator=gen).bfloat16(), torch.randn(3, 5, generator=gen)]
    opcheck(torch.ops.mixprec.grad_norm.default, (clean, torch.zeros(()), inv))
    with pytest.raises(RuntimeError, match="mixprec::grad_norm: grads\\[1\\]"):
        mixprec.ops.grad_norm([keep[0], keep[1].double()], torch.zeros(()), inv)
