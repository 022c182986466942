"""A BF16 torchvision Mask R-CNN (random weights, small images) under
mixprec.ops.patch_torchvision() on the CPU, where torchvision's own kernels
refuse bfloat16 (roi_align_forward_kernel has no BFloat16):

- eval: the BF16 model runs end to end; on the SAME proposals (the FP32
  model's RPN output, rounded to bfloat16) its pooled box features, class
  logits, box deltas, mask logits and decoded boxes match the FP32 model's
  within bfloat16's precision (the BF16 backbone's relative error is ~1%,
  so the comparison is relative L2 error, and decoded boxes in pixels).
  Random weights give near-uniform class scores, so the final top-k
  detections of two precisions cannot be matched one to one; the
  per-proposal outputs the detections are made from can.
- train: forward + backward run with mixprec's roi_align and its backward
  (seen in the profiler) and every gradient is finite.
- TorchScript: torch.jit.script of maskrcnn_resnet50_fpn and
  fasterrcnn_resnet50_fpn works with the patch active, the scripted graph
  calls mixprec's ops, and the scripted FP32 model's detections equal the
  eager (unpatched) model's bit for bit (FP32 roi_align and NMS are
  bit-identical to torchvision's)."""

import copy

import pytest
import torch

from mixprec.ops import patch_torchvision

tv = pytest.importorskip("torchvision")
det = tv.models.detection

SIZE = 128
KW = dict(
    weights=None,
    weights_backbone=None,
    min_size=SIZE,
    max_size=SIZE,
    rpn_pre_nms_top_n_test=150,
    rpn_post_nms_top_n_test=60,
    rpn_pre_nms_top_n_train=150,
    rpn_post_nms_top_n_train=60,
    box_batch_size_per_image=32,
    box_score_thresh=0.0,
    box_detections_per_img=30,
)


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    m32 = det.maskrcnn_resnet50_fpn(**KW).eval()
    return m32, copy.deepcopy(m32).bfloat16()


def _images(seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(3, SIZE, SIZE, generator=g), torch.rand(3, SIZE - 16, SIZE, generator=g)]


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_bf16_maskrcnn_eval_matches_fp32_on_same_proposals(models):
    m32, mb = models
    imgs = _images(1)
    with torch.no_grad():
        il, _ = m32.transform(imgs)
        f32 = m32.backbone(il.tensors)
        props, _ = m32.rpn(il, f32)
        sizes = il.image_sizes
        h32 = m32.roi_heads
        x32 = h32.box_roi_pool(f32, props, sizes)
        c32, r32 = h32.box_predictor(h32.box_head(x32))
        k32 = h32.mask_predictor(h32.mask_head(h32.mask_roi_pool(f32, props, sizes)))
        with patch_torchvision():
            fb = mb.backbone(il.tensors.bfloat16())
            pb = [p.bfloat16() for p in props]
            hb = mb.roi_heads
            xb = hb.box_roi_pool(fb, pb, sizes)
            cb, rb = hb.box_predictor(hb.box_head(xb))
            kb = hb.mask_predictor(hb.mask_head(hb.mask_roi_pool(fb, pb, sizes)))
            out = mb([i.bfloat16() for i in imgs])
    feat_err = max(_rel(fb[k], f32[k]) for k in f32)
    assert feat_err < 0.03, feat_err
    assert xb.dtype == torch.bfloat16 and xb.shape == x32.shape
    # pooling adds no error of its own beyond bf16 rounding of its inputs
    assert _rel(xb, x32) < feat_err + 0.01
    for name, a, b in (("class logits", cb, c32), ("box deltas", rb, r32), ("mask logits", kb, k32)):
        assert _rel(a, b) < 0.05, (name, _rel(a, b))
    boxes32 = h32.box_coder.decode(r32, props)
    boxesb = h32.box_coder.decode(rb.float(), [p.float() for p in pb])
    err = (boxesb - boxes32).abs().flatten()
    # bfloat16 resolves 0.5-1 px at these coordinates; exp() of the w/h
    # deltas amplifies a few
    assert float(err.median()) < 1.0 and float(err.quantile(0.95)) < 4.0, (err.median(), err.quantile(0.95))
    for o in out:
        assert o["boxes"].dtype == torch.bfloat16 and o["boxes"].shape[0] > 0
        assert torch.isfinite(o["boxes"].float()).all() and o["masks"].shape[1:] in {(1, SIZE, SIZE), (1, SIZE - 16, SIZE)}


def test_bf16_maskrcnn_train_forward_backward(models):
    _, mb = models
    mb = copy.deepcopy(mb).train()
    g = torch.Generator().manual_seed(2)
    imgs = _images(3)
    # torchvision's roi_heads accepts float32/float64/float16 target boxes,
    # not bfloat16: the targets stay float32 (mixprec's roi_align takes
    # float32 boxes with bfloat16 features)
    targets = [
        {
            "boxes": torch.tensor([[10.0, 20.0, 70.0, 90.0], [40.0, 30.0, 120.0, 110.0]]),
            "labels": torch.tensor([1, 2]),
            "masks": (torch.rand(2, SIZE, SIZE, generator=g) > 0.5).to(torch.uint8),
        },
        {
            "boxes": torch.tensor([[20.0, 25.0, 100.0, 100.0]]),
            "labels": torch.tensor([3]),
            "masks": (torch.rand(1, SIZE - 16, SIZE, generator=g) > 0.5).to(torch.uint8),
        },
    ]
    with patch_torchvision(), torch.profiler.profile() as prof:
        losses = mb([i.bfloat16() for i in imgs], targets)
        sum(losses.values()).backward()
    names = {e.name for e in prof.events()}
    assert {"mixprec::roi_align", "mixprec::roi_align_backward", "mixprec::batched_nms"} <= names
    assert not any(n.startswith("torchvision::roi_align") for n in names)
    assert all(torch.isfinite(v.float()) for v in losses.values()), losses
    grads = [p.grad for p in mb.parameters() if p.grad is not None]
    assert len(grads) > 100 and all(torch.isfinite(g.float()).all() for g in grads)
    assert float(mb.roi_heads.mask_head[0][0].weight.grad.float().abs().sum()) > 0


@pytest.mark.parametrize("builder", ["maskrcnn_resnet50_fpn", "fasterrcnn_resnet50_fpn"])
def test_script_detector_with_patch(models, builder):
    if builder == "maskrcnn_resnet50_fpn":
        m = models[0]
    else:
        torch.manual_seed(0)
        m = det.fasterrcnn_resnet50_fpn(**KW).eval()
    imgs = _images(4)[:1]
    with torch.no_grad():
        ref = m(imgs)
    with patch_torchvision():
        s = torch.jit.script(m)
        graph = str(s.inlined_graph)
        with torch.no_grad(), torch.profiler.profile() as prof:
            _, out = s(imgs)
    # compiled in (the fallback for float64 stays torchvision's), and called
    assert "mixprec::roi_align" in graph and "mixprec::batched_nms" in graph
    names = {e.name for e in prof.events()}
    assert {"mixprec::roi_align", "mixprec::batched_nms"} <= names
    assert not any(n.startswith("torchvision::") for n in names), names
    assert len(out) == len(ref)
    for a, b in zip(out, ref):
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), k
