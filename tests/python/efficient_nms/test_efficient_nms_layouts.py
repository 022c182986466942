"""mixprec.ops.efficient_nms on strided inputs read in place and on the raw
YOLO head (B, 4 + C, N) with centre-coded boxes (issue 23 item 14): the same
detections as the documented torchvision loop on the float32-decoded corners
(ultralytics' xywh2xyxy in float32), bit for bit, on both ISA paths; the
gradient through the decoding against torch's autograd of the decode and
gather; integer arguments refused by type (issue 23 item 10)."""

import math

import pytest
import torch
from torch.library import opcheck

from mixprec.ops import efficient_nms

from _reference import DTYPES, bits, cpu_lib
from test_efficient_nms import assert_same, make, reference


def yolo_head(gen, b, n, c, dtype, scale=640.0):
    """A detector-like head (B, 4 + C, N): cx, cy, w, h rows, then C score rows."""
    boxes, scores = make(gen, b, n, c, torch.float32, scale=scale)
    xy, wh = (boxes[..., :2] + boxes[..., 2:]) / 2, boxes[..., 2:] - boxes[..., :2]
    return torch.cat((xy, wh, scores), -1).transpose(1, 2).contiguous().to(dtype)


def decode(head):
    """ultralytics.utils.ops.xywh2xyxy on the float32-widened head: (B, N, 4)."""
    x = head[:, :4].transpose(1, 2).float()
    half = x[..., 2:] / 2
    return torch.cat((x[..., :2] - half, x[..., :2] + half), -1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("agnostic", [False, True])
def test_yolo_head_matches_decoded_reference(gen, dtype, agnostic):
    head = yolo_head(gen, 3, 500, 9, dtype)
    scores = head[:, 4:].transpose(1, 2)
    corners = decode(head)
    for thr, top_k, k in ((0.25, None, 300), (0.001, 1000, 300), (None, None, 4500)):
        got = efficient_nms(head, iou_threshold=0.7, score_threshold=thr, max_detections=k, pre_nms_top_k=top_k,
                            class_agnostic=agnostic, box_coding="center")
        want = reference(corners, scores, 0.7, thr, k, top_k, agnostic)
        assert got.boxes.dtype == dtype
        assert_same(got._replace(boxes=got.boxes.float()), want._replace(boxes=want.boxes.to(dtype).float()))
        assert int(got.counts.min()) > 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_views_equal_contiguous(gen, dtype):
    """Transposed, sliced and expanded inputs, read in place, give the
    results of their contiguous copies (rows, class rows, element by element)."""
    boxes, scores = make(gen, 2, 300, 6, dtype)
    base = efficient_nms(boxes, scores, score_threshold=0.3, max_detections=80)
    views = [
        (boxes.transpose(1, 2).contiguous().transpose(1, 2), scores.transpose(1, 2).contiguous().transpose(1, 2)),
        (torch.stack((boxes, boxes), -1)[..., 0], torch.stack((scores, -scores), -1)[..., 0]),
        (boxes[:, :, None].expand(2, 300, 6, 4), scores.permute(2, 0, 1).contiguous().permute(1, 2, 0)),
    ]
    for b, s in views:
        assert not (b.is_contiguous() and s.is_contiguous())
        assert_same(efficient_nms(b, s, score_threshold=0.3, max_detections=80), base)
    # One image broadcast to a batch: every image gets image 0's result.
    got = efficient_nms(boxes[:1].expand(5, -1, -1), scores[:1].expand(5, -1, -1), score_threshold=0.3, max_detections=80)
    for i in range(5):
        assert torch.equal(got.indices[i], base.indices[0]) and torch.equal(bits(got.boxes[i]), bits(base.boxes[0]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_boxes_read_in_place_by_row_equal_contiguous(gen, dtype):
    """Corner boxes whose rows of 4 sit at other multiples of 4 go to the NMS
    in place, by row ([note: boxes in place] in efficient_nms.c): padded
    rows (stride 8), class-first per-class boxes (B, C, N, 4) viewed as
    (B, N, C, 4), and an anchor dimension of stride 0 give the results of
    their contiguous copies, bit for bit; so does a layout that is gathered
    instead (coordinates of stride 2)."""
    boxes, scores = make(gen, 2, 257, 5, dtype, per_class=True)
    base = efficient_nms(boxes, scores, score_threshold=0.2, max_detections=60)
    views = [
        torch.cat((boxes, boxes), -1)[..., :4],  # rows of 8: (.., 8 * C, 8, 1)
        boxes.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3),  # class-first: (.., 4, 4 * N, 1)
        torch.stack((boxes, boxes), -1)[..., 0],  # coordinates of stride 2: gathered
    ]
    for b in views:
        assert not b.is_contiguous()
        assert_same(efficient_nms(b, scores, score_threshold=0.2, max_detections=60), base)
    # Every anchor the same box (anchor stride 0): the contiguous copy's result.
    one = boxes[:, :1].expand(-1, 257, -1, -1)
    assert_same(efficient_nms(one, scores, score_threshold=0.2, max_detections=60),
                efficient_nms(one.contiguous(), scores, score_threshold=0.2, max_detections=60))


def test_head_on_both_isa_paths_and_threads(gen, isa):
    lib = cpu_lib()
    head = yolo_head(gen, 2, 700, 5, torch.float16)
    want = reference(decode(head), head[:, 4:].transpose(1, 2), 0.5, 0.01, 200)
    before = lib.mixprec_get_num_threads()
    try:
        for threads in (1, 2):
            lib.mixprec_set_num_threads(threads)
            got = efficient_nms(head, score_threshold=0.01, max_detections=200, box_coding="center")
            assert_same(got._replace(boxes=got.boxes.float()), want._replace(boxes=want.boxes.half().float()))
    finally:
        lib.mixprec_set_num_threads(before)


def test_head_gradient_through_decoding(gen):
    head = yolo_head(gen, 2, 200, 4, torch.float32).requires_grad_(True)
    got = efficient_nms(head, score_threshold=0.2, max_detections=50, box_coding="center")
    wb, ws = torch.randn(got.boxes.shape, generator=gen), torch.randn(got.scores.shape, generator=gen)
    ((got.boxes * wb).sum() + (got.scores * ws).sum()).backward()
    ref = head.detach().clone().requires_grad_(True)
    corners = decode(ref)
    sc = ref[:, 4:].transpose(1, 2)
    n, c, valid = got.indices.clamp(min=0), got.classes.clamp(min=0), got.indices >= 0
    img = torch.arange(2)[:, None].expand_as(n)
    loss = (corners[img, n] * wb * valid[..., None]).sum() + (sc[img, n, c] * ws * valid).sum()
    loss.backward()
    torch.testing.assert_close(head.grad, ref.grad, rtol=0, atol=1e-6)
    assert head.grad.abs().sum() > 0


def test_opcheck_strided_and_centre(gen):
    head = yolo_head(gen, 2, 64, 3, torch.float32)
    b, s = head[:, :4].transpose(1, 2), head[:, 4:].transpose(1, 2)
    opcheck(torch.ops.mixprec.efficient_nms.default, (b, s, 0.5, 0.1, 20, -1, False, 1))


def test_head_inputs_untouched(gen):
    head = yolo_head(gen, 2, 100, 3, torch.bfloat16)
    before = head.clone()
    efficient_nms(head, score_threshold=0.1, box_coding="center")
    assert torch.equal(bits(head), bits(before))


@pytest.mark.parametrize("name", ["max_detections", "pre_nms_top_k"])
@pytest.mark.parametrize(
    "value,error",
    [(True, TypeError), (False, TypeError), (1.5, TypeError), ("3", TypeError), (None, TypeError),
     (math.nan, ValueError), (math.inf, ValueError), (-math.inf, ValueError)],
)
def test_integer_arguments_refused(gen, name, value, error):
    """_args.as_int's rule, as for every public function: a value of the
    wrong kind (a bool, a str, a non-integral float) is a TypeError, NaN and
    inf a ValueError, naming the argument, before any work (None is
    pre_nms_top_k's "all candidates")."""
    if value is None and name == "pre_nms_top_k":
        return
    boxes, scores = make(gen, 1, 10, 2)
    with pytest.raises(error, match=f"mixprec.ops.efficient_nms: {name} must be an integer"):
        efficient_nms(boxes, scores, **{name: value})


def test_integral_numbers_accepted(gen):
    import numpy as np

    boxes, scores = make(gen, 1, 30, 2)
    want = efficient_nms(boxes, scores, max_detections=10, pre_nms_top_k=20)
    for k, t in ((10.0, 20.0), (np.int64(10), np.int32(20)), (torch.tensor(10), torch.tensor(20))):
        assert_same(efficient_nms(boxes, scores, max_detections=k, pre_nms_top_k=t), want)


def test_bad_head_and_coding(gen):
    head = yolo_head(gen, 1, 10, 2, torch.float32)
    with pytest.raises(ValueError, match="box_coding must be 'corner' or 'center'"):
        efficient_nms(head, box_coding="xywh")
    with pytest.raises(ValueError, match=r"head \(B, 4 \+ C, N\)"):
        efficient_nms(head[:, :4])
    with pytest.raises(RuntimeError, match="box_coding must be 0"):
        torch.ops.mixprec.efficient_nms(head[:, :4].transpose(1, 2), head[:, 4:].transpose(1, 2), 0.5, None, 10, -1, False, 2)
