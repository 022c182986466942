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


def test_grad_norm_reads_an_expanded_grad_in_place():
    """A stride-0 (expanded) gradient of huge logical size: its norm is read
    from the stored elements, each counted as often as it appears (the op
    used to make a dense copy: 4 TiB here, an allocator failure)."""
    inv = torch.tensor(0.5)
    huge = torch.full((1,), 3.0).expand(2**40)
    fi = torch.zeros(())
    per, total = mixprec.ops.grad_norm([huge, torch.ones(4)], fi, inv)
    assert per.tolist() == [1.5 * 2**20, 1.0] and float(fi) == 0.0
    torch.testing.assert_close(total, torch.tensor((2.25 * 2**40 + 1.0) ** 0.5))
    # inf/NaN in the stored elements is found as in a dense grad
    fi = torch.zeros(())
    mixprec.ops.grad_norm([torch.tensor([float("inf")]).expand(2**40)], fi, inv)
    assert float(fi) == 1.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_grad_norm_of_expanded_grads_matches_the_dense_copy(gen, dtype):
    base = torch.randn(3, 1, 5, generator=gen).to(dtype)
    grads = [base.expand(3, 7, 5), torch.randn(6, generator=gen).to(dtype)[None].expand(4, 6),
             torch.randn(4, 4, generator=gen).to(dtype), base.expand(3, 7, 5).transpose(0, 2)]
    inv = torch.tensor(1.0 / 8)
    fa, fb = torch.zeros(()), torch.zeros(())
    na, ta = mixprec.ops.grad_norm(grads, fa, inv)
    nb, tb = mixprec.ops.grad_norm([g.contiguous() for g in grads], fb, inv)
    torch.testing.assert_close(na, nb, rtol=1e-6, atol=0)
    torch.testing.assert_close(ta, tb, rtol=1e-6, atol=0)
    assert float(fa) == float(fb) == 0.0


def test_grad_norm_refuses_an_overlapping_grad_too_large_to_copy():
    """Overlapping without stride 0 (as_strided windows): read through a
    dense copy as before when it is small, refused naming the grad when
    the copy would be far larger than the memory viewed."""
    storage = torch.randn(2**21)
    small = storage[:64].as_strided((8, 8), (1, 1))
    n, _ = mixprec.ops.grad_norm([small], torch.zeros(()), torch.ones(()))
    torch.testing.assert_close(n, torch.linalg.vector_norm(small.contiguous())[None])
    big = storage.as_strided((2**20, 2**12), (1, 1))
    with pytest.raises(ValueError, match=r"mixprec.ops.grad_norm: grads\[1\] has overlapping elements"):
        mixprec.ops.grad_norm([small, big], torch.zeros(()), torch.ones(()))
