"""mixprec::efficient_nms on CUDA: identical to the CPU op (the same float32
decisions, the same tie order) for every dtype, box layout and option;
CUDA-graph capture; the candidate cap; device errors; opcheck. Skipped
without a CUDA device and libmixprec_cuda.so."""

import pytest
import torch
from torch.library import opcheck

from mixprec.ops import efficient_nms

from _reference import DTYPES, bits, requires_cuda
from test_efficient_nms import make

pytestmark = [pytest.mark.cuda, requires_cuda]


def assert_same(got, want):
    assert all(t.device.type == "cuda" for t in got)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        if g.is_floating_point():
            assert torch.equal(bits(g.cpu()), bits(w))
        else:
            assert torch.equal(g.cpu(), w)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_class", [False, True])
@pytest.mark.parametrize("shape", [(1, 1000, 80), (8, 500, 20), (3, 64, 1), (2, 65, 3), (32, 200, 80)])
def test_cuda_equals_cpu(gen, dtype, per_class, shape):
    boxes, scores = make(gen, *shape, dtype, per_class, ties=shape[0] % 2 == 0)
    for thr, top_k, k, agn, iou in ((0.05, 1000, 100, False, 0.5), (None, 4096, 300, True, 0.45),
                                    (0.5, 16384, 2000, False, 0.7), (0.9, 1, 5, True, 0.0)):
        want = efficient_nms(boxes, scores, iou_threshold=iou, score_threshold=thr, max_detections=k,
                             pre_nms_top_k=top_k, class_agnostic=agn)
        got = efficient_nms(boxes.cuda(), scores.cuda(), iou_threshold=iou, score_threshold=thr,
                            max_detections=k, pre_nms_top_k=top_k, class_agnostic=agn)
        assert_same(got, want)


def test_cuda_nan_empty_and_padding(gen):
    boxes, scores = make(gen, 4, 300, 5)
    scores[0, ::3] = float("nan")
    scores[1] = 0.01
    boxes[2, ::7, 1] = float("nan")
    want = efficient_nms(boxes, scores, score_threshold=0.3, max_detections=700)
    assert_same(efficient_nms(boxes.cuda(), scores.cuda(), score_threshold=0.3, max_detections=700), want)
    for b, n, c in ((0, 10, 3), (2, 0, 3), (2, 10, 0)):
        got = efficient_nms(torch.rand(b, n, 4).cuda(), torch.rand(b, n, c).cuda(), max_detections=4)
        assert got.boxes.shape == (b, 4, 4) and (got.counts == 0).all() and (got.indices == -1).all()


def test_cuda_graph_capture(gen):
    boxes, scores = make(gen, 8, 2000, 20)
    b, s = boxes.cuda(), scores.cuda()
    kw = dict(iou_threshold=0.5, score_threshold=0.05, max_detections=100, pre_nms_top_k=1000)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        efficient_nms(b, s, **kw)  # warm up the allocator
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = efficient_nms(b, s, **kw)
    for _ in range(2):
        nb, ns = make(gen, 8, 2000, 20)
        b.copy_(nb)
        s.copy_(ns)
        graph.replay()
        torch.cuda.synchronize()
        assert_same(out, efficient_nms(nb, ns, **kw))


def test_cuda_candidate_cap_and_device_errors(gen):
    boxes, scores = make(gen, 2, 300, 80)  # 24000 candidates per image
    with pytest.raises(RuntimeError, match=r"mixprec::efficient_nms: on CUDA at most 16384 candidates"):
        efficient_nms(boxes.cuda(), scores.cuda())
    got = efficient_nms(boxes.cuda(), scores.cuda(), pre_nms_top_k=16384)
    assert_same(got, efficient_nms(boxes, scores, pre_nms_top_k=16384))
    with pytest.raises(RuntimeError, match=r"mixprec::efficient_nms: scores is on cpu but boxes is on cuda"):
        torch.ops.mixprec.efficient_nms(boxes.cuda(), scores)
    with pytest.raises(RuntimeError, match=r"mixprec::efficient_nms: max_detections"):
        torch.ops.mixprec.efficient_nms(boxes.cuda(), scores.cuda(), 0.5, None, 0)


def test_cuda_opcheck(gen):
    boxes, scores = make(gen, 2, 50, 4)
    opcheck(torch.ops.mixprec.efficient_nms.default, (boxes.cuda().half(), scores.cuda(), 0.5, 0.1, 20))
    opcheck(torch.ops.mixprec.efficient_nms.default, (boxes.cuda(), scores.cuda().bfloat16(), 0.4, None, 30, 100, True))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("coding", ["corner", "center"])
def test_cuda_head_and_strided_equal_cpu(gen, dtype, coding):
    """The raw YOLO head (B, 4 + C, N) and strided views, read in place on
    the GPU, give the CPU's bits (class-rows reads, the decode)."""
    from test_efficient_nms_layouts import yolo_head

    head = yolo_head(gen, 4, 2000, 80, dtype)
    for thr, top_k, k in ((0.25, None, 300), (0.001, 8000, 300)):
        want = efficient_nms(head, score_threshold=thr, max_detections=k, pre_nms_top_k=top_k, iou_threshold=0.7,
                             box_coding=coding)
        got = efficient_nms(head.cuda(), score_threshold=thr, max_detections=k, pre_nms_top_k=top_k,
                            iou_threshold=0.7, box_coding=coding)
        assert_same(got, want)
    boxes, scores = make(gen, 3, 300, 6, dtype)
    sv = scores.permute(2, 0, 1).contiguous().permute(1, 2, 0)
    want = efficient_nms(boxes, sv, score_threshold=0.3, max_detections=80)
    assert_same(efficient_nms(boxes.cuda(), sv.cuda(), score_threshold=0.3, max_detections=80), want)
