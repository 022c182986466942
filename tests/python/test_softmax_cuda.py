"""CUDA softmax / log_softmax / cross_entropy: parity with torch on the FP32
upcast input and with mixprec's CPU ops, gradients, peak GPU memory against
the upcast path, torch's current stream, out-of-range targets (NaN, no
sync). Skipped without a GPU; run by scripts/gpu_check.sh."""

import pytest
import torch
import torch.nn.functional as F

import mixprec
from conftest import requires_cuda

pytestmark = [pytest.mark.cuda, requires_cuda]

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
EPS = {torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}


def close(out, ref, dtype, rtol=3e-5, atol=1e-6):
    ref = ref.double().cpu()
    out = out.double().cpu()
    assert torch.equal(torch.isnan(out), torch.isnan(ref))
    fin = torch.isfinite(ref)
    assert torch.equal(out[~fin & ~torch.isnan(ref)], ref[~fin & ~torch.isnan(ref)])
    tol = (rtol + 2 * EPS[dtype]) * ref.abs() + atol
    err = (out - ref).abs()
    assert (err[fin] <= tol[fin]).all(), f"max err {err[fin].max().item():.3g}"


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
    close(y, ref, torch.float32, atol=2e-5 if name == "log_softmax" else 1e-7)
    close(ours(x, dim), ref.to(dtype), dtype, atol=2e-5 if name == "log_softmax" else 1e-7)
    g = torch.randn(shape, generator=gen).cuda()
    (gx,) = torch.autograd.grad(y, xm, g)
    (gr,) = torch.autograd.grad(ref, xr, g)
    assert gx.dtype == dtype
    scale = gr.abs().amax(dim, keepdim=True)
    assert ((gx.double() - gr.double()).abs() <= EPS[dtype] * gr.abs().double() + 1e-4 * scale.double() + 1e-6).all()
    # And the CPU kernels give the same within FP32 rounding.
    close(ours(x.cpu(), dim, torch.float32), y.detach(), torch.float32, atol=2e-5 if name == "log_softmax" else 1e-7)


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
        close(loss, ref, torch.float32, rtol=1e-4, atol=1e-5)
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

    def upcast():
        F.cross_entropy(x.float(), t).backward()
        x.grad = None

    def ours():
        mixprec.ops.cross_entropy(x, t).backward()
        x.grad = None

    upcast(), ours()  # warm the caching allocator's bookkeeping
    up, mp = _peak(upcast), _peak(ours)
    print(f"\nGPU peak forward+backward, bf16 logits {tuple(x.shape)}: upcast+torch {up / 2**20:.1f} MiB, "
          f"mixprec {mp / 2**20:.1f} MiB")
    assert mp < 0.5 * up


def test_runs_on_current_stream(gen):
    x = torch.randn(1024, 4096, generator=gen).half().cuda()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = mixprec.ops.softmax(x, -1, torch.float32)
    s.synchronize()
    close(y, torch.softmax(x.float(), -1), torch.float32)


def test_cuda_graph_capture(gen):
    x = torch.randn(64, 1000, generator=gen).bfloat16().cuda()
    t = torch.randint(0, 1000, (64,), generator=gen).cuda()
    mixprec.ops.cross_entropy(x, t)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            out = mixprec.ops.cross_entropy(x, t)
    g.replay()
    torch.cuda.synchronize()
    close(out, F.cross_entropy(x.float(), t), torch.float32, rtol=1e-5)


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
