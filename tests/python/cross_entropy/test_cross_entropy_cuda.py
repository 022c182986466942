"""CUDA cross_entropy: parity with torch on the FP32 upcast input, gradients,
peak GPU memory against the upcast path, out-of-range targets (NaN, no
sync), CUDA graph capture. Skipped without a GPU; run by
scripts/gpu_check.sh."""

import pytest
import torch
import torch.nn.functional as F

import mixprec

from _reference import DTYPES, EPS, assert_near, ce_peaks, requires_cuda

pytestmark = [pytest.mark.cuda, requires_cuda]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(256, 1000), (4, 50257), (2, 21, 64, 65), (33, 1), (9,)])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_cross_entropy_matches_torch(gen, dtype, shape, reduction):
    x = (torch.randn(shape, generator=gen) * 4).to(dtype).cuda()
    C = shape[0] if len(shape) == 1 else shape[1]
    tshape = () if len(shape) == 1 else (shape[0], *shape[2:])
    t = torch.randint(0, C, tshape, generator=gen)
    if t.dim():
        t[torch.rand(tshape, generator=gen) < 0.2] = -100
    t = t.cuda()
    w = (torch.rand(C, generator=gen) + 0.2).cuda()
    for weight, ls in ((None, 0.0), (w, 0.1)):
        xm = x.clone().requires_grad_()
        loss = mixprec.ops.cross_entropy(xm, t, weight, reduction=reduction, label_smoothing=ls)
        xr = x.float().requires_grad_()
        ref = F.cross_entropy(xr, t, weight, reduction=reduction, label_smoothing=ls)
        assert_near(loss, ref, torch.float32, rtol=1e-4, atol=1e-5)
        g = torch.rand(ref.shape, generator=gen).cuda() + 0.5
        (gx,) = torch.autograd.grad(loss, xm, g)
        (gr,) = torch.autograd.grad(ref, xr, g)
        tol = EPS[dtype] * gr.abs() + 1e-5 * gr.abs().amax() + 1e-7
        assert ((gx.float() - gr).abs() <= tol).all()
        # Deterministic: a second run gives the same bits.
        again = mixprec.ops.cross_entropy(x, t, weight, reduction=reduction, label_smoothing=ls)
        assert torch.equal(again, loss.detach())


def test_out_of_range_target_gives_nan_without_sync(gen):
    x = torch.randn(8, 5, generator=gen).bfloat16().cuda().requires_grad_()
    t = torch.tensor([0, 1, 2, 3, 4, 5, 0, 1]).cuda()
    loss = mixprec.ops.cross_entropy(x, t, reduction="none")
    assert torch.isnan(loss[5]) and not torch.isnan(loss[:5]).any()
    assert torch.isnan(mixprec.ops.cross_entropy(x, t))
    loss.sum().backward()
    assert torch.isnan(x.grad[5]).all() and not torch.isnan(x.grad[:5]).any()


def _peak(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def test_peak_memory_below_upcast_path(gen):
    x = torch.randn(8, 21, 512, 512, generator=gen).bfloat16().cuda().requires_grad_()
    t = torch.randint(0, 21, (8, 512, 512), generator=gen).cuda()
    up, mp = ce_peaks(x, t, _peak, warm=True)
    print(f"\nGPU peak forward+backward, bf16 logits {tuple(x.shape)}: upcast+torch {up / 2**20:.1f} MiB, "
          f"mixprec {mp / 2**20:.1f} MiB")
    assert mp < 0.5 * up


@pytest.mark.parametrize("soft", [False, True])
def test_cuda_graph_capture(gen, soft):
    x = torch.randn(64, 1000, generator=gen).bfloat16().cuda()
    t = (_soft((64, 1000), gen, torch.float32) if soft else torch.randint(0, 1000, (64,), generator=gen)).cuda()
    mixprec.ops.cross_entropy(x, t)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            out = mixprec.ops.cross_entropy(x, t)
    g.replay()
    torch.cuda.synchronize()
    assert_near(out, F.cross_entropy(x.float(), t), torch.float32, rtol=1e-5)


# ---- class-probability (soft) targets ----------------------------------------------


def _soft(shape, gen, dtype):
    cdim = 0 if len(shape) == 1 else 1
    return torch.softmax(torch.randn(shape, generator=gen) * 3, cdim).to(dtype)


@pytest.mark.parametrize("tdtype", DTYPES, ids=lambda d: f"t{str(d)[6:]}")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(256, 1000), (4, 50257), (2, 21, 64, 65), (33, 1), (9,), (5, 2000)])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_soft_cross_entropy_matches_torch(gen, dtype, tdtype, shape, reduction):
    x = (torch.randn(shape, generator=gen) * 4).to(dtype).cuda()
    t = _soft(shape, gen, tdtype).cuda()
    C = shape[0] if len(shape) == 1 else shape[1]
    w = (torch.rand(C, generator=gen) + 0.2).cuda()
    for weight, ls in ((None, 0.0), (w, 0.1)):
        xm, tm = x.clone().requires_grad_(), t.clone().requires_grad_()
        loss = mixprec.ops.cross_entropy(xm, tm, weight, reduction=reduction, label_smoothing=ls)
        xr, tr = x.double().requires_grad_(), t.double().requires_grad_()
        ref = F.cross_entropy(xr, tr, None if weight is None else weight.double(), reduction=reduction,
                              label_smoothing=ls)
        assert_near(loss, ref.float(), torch.float32, rtol=1e-4, atol=1e-5)
        g = torch.rand(ref.shape, generator=gen).cuda() + 0.5
        gx, gt = torch.autograd.grad(loss, (xm, tm), g)
        rx, rt = torch.autograd.grad(ref, (xr, tr), g.double())
        assert gx.dtype == dtype and gt.dtype == tdtype
        for got, want, d in ((gx, rx, dtype), (gt, rt, tdtype)):
            tol = EPS[d] * want.abs() + 1e-5 * want.abs().amax() + 1e-7
            assert ((got.double() - want).abs() <= tol).all()
        again = mixprec.ops.cross_entropy(x, t, weight, reduction=reduction, label_smoothing=ls)
        assert torch.equal(again, loss.detach())


def test_soft_cpu_and_cuda_agree(gen):
    x = torch.randn(16, 3000, generator=gen).bfloat16()
    t = _soft((16, 3000), gen, torch.float32)
    cpu = mixprec.ops.cross_entropy(x, t, label_smoothing=0.1, reduction="none")
    gpu = mixprec.ops.cross_entropy(x.cuda(), t.cuda(), label_smoothing=0.1, reduction="none")
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-5, atol=1e-5)


def test_soft_peak_memory_below_upcast_path(gen):
    x = torch.randn(4096, 32000, generator=gen).bfloat16().cuda().requires_grad_()
    t = _soft((4096, 32000), gen, torch.bfloat16).cuda()
    up, mp = ce_peaks(x, t, _peak, warm=True)
    print(f"\nGPU peak forward+backward, bf16 logits + bf16 soft target {tuple(x.shape)}: upcast+torch "
          f"{up / 2**20:.1f} MiB, mixprec {mp / 2**20:.1f} MiB")
    assert mp < 0.5 * up


def test_soft_opcheck_cuda(gen):
    x = torch.randn(6, 9, 5, generator=gen).half().cuda().requires_grad_()
    t = _soft((6, 9, 5), gen, torch.bfloat16).cuda().requires_grad_()
    w = torch.rand(9, generator=gen).cuda()
    torch.library.opcheck(torch.ops.mixprec.cross_entropy_soft, (x, t, w, 1, 0.1))
    torch.library.opcheck(torch.ops.mixprec.cross_entropy_soft, (x, t, None, 0, 0.0))
