"""CUDA softmax / log_softmax: parity with torch on the FP32 upcast input and
with mixprec's CPU ops, gradients, special rows, torch's current stream,
opcheck (with cross_entropy's). Skipped without a GPU; run by
scripts/gpu_check.sh."""

import pytest
import torch

import mixprec

from _reference import DTYPES, EPS, assert_near, requires_cuda

pytestmark = [pytest.mark.cuda, requires_cuda]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,dim", [((64, 1000), -1), ((4, 32000), -1), ((2, 50257), 1), ((513, 3), 1),
                                       ((4, 21, 33, 35), 1), ((3, 5, 7), 0), ((70000, 2, 3), 1)])
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_forward_backward_match_torch(gen, dtype, shape, dim, name):
    x = (torch.randn(shape, generator=gen) * 4).to(dtype).cuda()
    x.view(-1)[7] = float("-inf")
    ours, ref_op = getattr(mixprec.ops, name), getattr(torch, name)
    xr = x.float().requires_grad_()
    ref = ref_op(xr, dim)
    xm = x.clone().requires_grad_()
    y = ours(xm, dim, torch.float32)
    assert_near(y, ref, torch.float32, atol=2e-5 if name == "log_softmax" else 1e-7)
    assert_near(ours(x, dim), ref.to(dtype), dtype, atol=2e-5 if name == "log_softmax" else 1e-7)
    g = torch.randn(shape, generator=gen).cuda()
    (gx,) = torch.autograd.grad(y, xm, g)
    (gr,) = torch.autograd.grad(ref, xr, g)
    assert gx.dtype == dtype
    scale = gr.abs().amax(dim, keepdim=True)
    assert ((gx.double() - gr.double()).abs() <= EPS[dtype] * gr.abs().double() + 1e-4 * scale.double() + 1e-6).all()
    # And the CPU kernels give the same within FP32 rounding.
    assert_near(ours(x.cpu(), dim, torch.float32), y.detach(), torch.float32, atol=2e-5 if name == "log_softmax" else 1e-7)


def test_runs_on_current_stream(gen):
    x = torch.randn(1024, 4096, generator=gen).half().cuda()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = mixprec.ops.softmax(x, -1, torch.float32)
    s.synchronize()
    assert_near(y, torch.softmax(x.float(), -1), torch.float32)


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_opcheck_cuda(gen, dtype):
    x = torch.randn(6, 9, 5, generator=gen).to(dtype).cuda().requires_grad_()
    t = torch.randint(0, 9, (6, 5), generator=gen).cuda()
    torch.library.opcheck(torch.ops.mixprec.cross_entropy, (x, t, None, 1, -100, 0.1))
    torch.library.opcheck(torch.ops.mixprec.softmax, (x, 1, None))
    torch.library.opcheck(torch.ops.mixprec.log_softmax, (x, 1, torch.float32))


@pytest.mark.parametrize("n", [16, 17, 2048])  # vector path, element path, block per row
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_special_rows_like_torch(name, n):
    inf, nan = float("inf"), float("nan")
    x = torch.zeros(6, n)
    x[0] = -inf
    x[1, 0] = nan
    x[2, :8] = -inf
    x[2, 8] = nan
    x[3, 0] = inf
    x[4, 1:] = -inf  # one finite entry: probability 1
    x[5] = torch.linspace(-50, 50, n)
    ours = getattr(mixprec.ops, name)
    for dtype in DTYPES:
        ref = getattr(torch, name)(x.to(dtype).float(), 1)
        y = ours(x.to(dtype).cuda(), 1, torch.float32).cpu()
        assert torch.equal(torch.isnan(y), torch.isnan(ref)), dtype
        fin = torch.isfinite(ref)
        torch.testing.assert_close(y[fin], ref[fin], rtol=2e-5, atol=1e-6)
        assert torch.equal(y[torch.isinf(ref)], ref[torch.isinf(ref)])
