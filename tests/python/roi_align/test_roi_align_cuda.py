"""mixprec's roi_align on CUDA: bit-identical to the CPU op forward and
backward (the backward is an atomics-free gather in the CPU scatter's
order), so also to torchvision's CPU kernel on float32; deterministic from
run to run (torchvision's CUDA backward uses atomicAdd); a batch index out of
range gives NaN rows instead of a read outside the input; opcheck;
torch.compile; patch_torchvision routes CUDA tensors; a BF16 Mask R-CNN
forward + backward on the GPU. Skipped without a CUDA device and
libmixprec_cuda.so."""

import pytest
import torch
from torch.library import opcheck

from mixprec.ops import patch_torchvision, roi_align

from _reference import assert_same, requires_cuda

pytestmark = [pytest.mark.cuda, requires_cuda]

tv = pytest.importorskip("torchvision")

OPTIONS = [((7, 7), 0.25, 2, False), ((7, 7), 0.0625, -1, False), ((14, 14), 0.125, 0, True), ((3, 5), 1.0, 3, True)]


def make(gen, n=2, c=37, h=50, w=61, k=300, scale=1.0, dtype=torch.float32):
    x = torch.randn(n, c, h, w, generator=gen)
    xy = (torch.rand(k, 2, generator=gen) * 1.1 - 0.05) * torch.tensor([w, h]) / scale
    wh = torch.rand(k, 2, generator=gen) * torch.tensor([w, h]) / scale * 0.5
    b = torch.randint(0, n, (k, 1), generator=gen).float()
    return x.to(dtype), torch.cat([b, xy, xy + wh], 1).to(dtype)


def fwd_bwd(x, rois, opts, go):
    x = x.detach().clone().requires_grad_()
    out = roi_align(x, rois, *opts)
    out.backward(go)
    return out.detach(), x.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("opts", OPTIONS)
def test_cuda_equals_cpu(gen, dtype, opts):
    x, rois = make(gen, scale=opts[1], dtype=dtype)
    go = torch.randn(rois.shape[0], x.shape[1], *torch.nn.modules.utils._pair(opts[0]), generator=gen).to(dtype)
    o_cpu, g_cpu = fwd_bwd(x, rois, opts, go)
    o_gpu, g_gpu = fwd_bwd(x.cuda(), rois.cuda(), opts, go.cuda())
    assert o_gpu.device.type == "cuda" and o_gpu.dtype == dtype
    assert_same(o_gpu.cpu(), o_cpu)
    assert_same(g_gpu.cpu(), g_cpu)
    if dtype == torch.float32:
        assert_same(o_cpu, tv.ops.roi_align(x, rois, *opts))
    # deterministic: a second run gives the same bits
    o2, g2 = fwd_bwd(x.cuda(), rois.cuda(), opts, go.cuda())
    assert torch.equal(o2, o_gpu) and torch.equal(g2, g_gpu)


def test_large_boxes_many_rois(gen):
    """Mask R-CNN sizes: 1024 rois on a 256-channel 200x336 map."""
    x, rois = make(gen, n=2, c=256, h=200, w=336, k=1024, scale=0.25, dtype=torch.bfloat16)
    go = torch.randn(1024, 256, 7, 7, generator=gen).bfloat16()
    o_cpu, g_cpu = fwd_bwd(x, rois, ((7, 7), 0.25, 2, False), go)
    o_gpu, g_gpu = fwd_bwd(x.cuda(), rois.cuda(), ((7, 7), 0.25, 2, False), go.cuda())
    assert_same(o_gpu.cpu(), o_cpu)
    assert_same(g_gpu.cpu(), g_cpu)


def test_bad_batch_index_gives_nan_rows(gen):
    x, rois = make(gen, n=2, k=4)
    rois[1, 0] = 5.0
    rois[2, 0] = -3.0
    out = roi_align(x.cuda(), rois.cuda(), 3).cpu()
    assert torch.isnan(out[[1, 2]]).all() and not torch.isnan(out[[0, 3]]).any()
    xg = x.cuda().requires_grad_()
    roi_align(xg, rois.cuda(), 3).sum().backward()
    ok = [0, 3]
    xr = x.cuda().requires_grad_()
    roi_align(xr, rois[ok].cuda(), 3).sum().backward()
    assert_same(xg.grad.cpu(), xr.grad.cpu())


def test_mixed_devices_refused(gen):
    x, rois = make(gen, n=2, k=4)
    with pytest.raises(RuntimeError, match="mixprec::roi_align: rois is on cpu but input is on cuda"):
        roi_align(x.cuda(), rois, 3)


def test_opcheck_and_compile(gen):
    x, rois = make(gen, n=2, c=5, h=20, w=24, k=9, dtype=torch.bfloat16)
    x, rois = x.cuda(), rois.cuda()
    opcheck(torch.ops.mixprec.roi_align, (x, rois, 0.5, 3, 4, 2, True))
    g = torch.randn(9, 5, 3, 4, generator=gen).bfloat16().cuda()
    opcheck(torch.ops.mixprec.roi_align_backward, (g, rois, 0.5, 3, 4, 2, 5, 20, 24, 2, True))

    def f(t):
        return roi_align(t, rois, (3, 4), 0.5, 2, True).float().sum()

    a = x.clone().requires_grad_()
    b = x.clone().requires_grad_()
    f(a).backward()
    torch.compile(f, fullgraph=True)(b).backward()
    assert_same(b.grad, a.grad)


def test_patch_bf16_maskrcnn_on_gpu(gen):
    torch.manual_seed(0)
    m = tv.models.detection.maskrcnn_resnet50_fpn(weights=None, weights_backbone=None, min_size=320, max_size=320)
    m = m.cuda().bfloat16().train()
    imgs = [torch.rand(3, 320, 320, generator=gen).cuda().bfloat16() for _ in range(2)]
    targets = [
        {"boxes": torch.tensor([[10.0, 20.0, 200.0, 220.0]]).cuda(), "labels": torch.tensor([1]).cuda(),
         "masks": (torch.rand(1, 320, 320, generator=gen) > 0.5).to(torch.uint8).cuda()}
        for _ in range(2)
    ]
    with patch_torchvision(), torch.profiler.profile() as prof:
        losses = m(imgs, targets)
        sum(losses.values()).backward()
    names = {e.name for e in prof.events()}
    assert "mixprec::roi_align" in names and "mixprec::roi_align_backward" in names
    assert all(torch.isfinite(v.float()) for v in losses.values())
