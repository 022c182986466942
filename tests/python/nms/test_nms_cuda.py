"""mixprec's NMS ops on CUDA: identical to the CPU ops (the same float32
decisions) for every dtype, class layout and option; against torchvision's
CUDA nms; stream and CUDA-graph behaviour; device errors. Skipped without a
CUDA device and libmixprec_cuda.so."""

import pytest
import torch
from torch.library import opcheck

from mixprec.ops import batched_nms, nms, nms_padded

from _reference import DTYPES, requires_cuda

pytestmark = [pytest.mark.cuda, requires_cuda]


def make(n, gen, clustered, dtype=torch.float32, ties=False):
    if clustered:
        k = max(1, n // 40)
        c = (torch.rand(k, 2, generator=gen) * 1000)[torch.randint(0, k, (n,), generator=gen)]
        xy = c + torch.randn(n, 2, generator=gen) * 5
        wh = 50 + torch.randn(n, 2, generator=gen).abs() * 5
    else:
        xy = torch.rand(n, 2, generator=gen) * 1000
        wh = 1 + torch.rand(n, 2, generator=gen) * 150
    boxes = torch.cat([xy, xy + wh], 1)
    scores = torch.randint(0, 16, (n,), generator=gen).float() / 16 if ties else torch.rand(n, generator=gen)
    return boxes.to(dtype), scores.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 63, 64, 65, 1000, 5000, 20000])
@pytest.mark.parametrize("clustered", [False, True])
def test_cuda_equals_cpu(dtype, n, clustered, gen):
    boxes, scores = make(n, gen, clustered, dtype, ties=n % 2 == 1)
    idxs = torch.randint(0, 80, (n,), generator=gen)
    for thr in (0.0, 0.3, 0.5, 0.7, 1.5):
        want = nms(boxes, scores, thr)
        got = nms(boxes.cuda(), scores.cuda(), thr)
        assert got.device.type == "cuda" and got.dtype == torch.int64
        assert torch.equal(got.cpu(), want), (n, thr)
    want = batched_nms(boxes, scores, idxs, 0.5)
    assert torch.equal(batched_nms(boxes.cuda(), scores.cuda(), idxs.cuda(), 0.5).cpu(), want)
    assert torch.equal(batched_nms(boxes.cuda(), scores.cuda(), idxs.int().cuda(), 0.5).cpu(), want)
    for st, mo in ((0.3, None), (None, 5), (0.5, 0), (0.1, 10**6)):
        want = batched_nms(boxes, scores, idxs, 0.5, score_threshold=st, max_output=mo)
        got = batched_nms(boxes.cuda(), scores.cuda(), idxs.cuda(), 0.5, score_threshold=st, max_output=mo)
        assert torch.equal(got.cpu(), want)
        k_cpu, c_cpu = nms_padded(boxes, scores, 0.5, idxs, score_threshold=st, max_output=mo)
        k_gpu, c_gpu = nms_padded(boxes.cuda(), scores.cuda(), 0.5, idxs.cuda(), score_threshold=st, max_output=mo)
        assert c_gpu.device.type == "cuda"
        assert torch.equal(k_gpu.cpu(), k_cpu) and c_gpu.item() == c_cpu.item()


def test_cuda_nan_and_degenerate_equal_cpu(gen):
    boxes, scores = make(3000, gen, True)
    scores[::13] = float("nan")
    scores[1::17] = -0.0
    boxes[::19, 2:] = boxes[::19, :2]
    boxes[5::23, 0] = float("nan")
    for dt in DTYPES:
        b, s = boxes.to(dt), scores.to(dt)
        assert torch.equal(nms(b.cuda(), s.cuda(), 0.5).cpu(), nms(b, s, 0.5))


def test_cuda_equals_torchvision_cuda(gen):
    tv = pytest.importorskip("torchvision")
    for n in (1000, 20000):
        boxes, _ = make(n, gen, True)
        scores = torch.randperm(n, generator=gen).float() / n  # no ties: torchvision's GPU sort is not stable
        b, s = boxes.cuda(), scores.cuda()
        assert torch.equal(nms(b, s, 0.5), tv.ops.nms(b, s, 0.5))
        idxs = torch.randint(0, 80, (n,), generator=gen).cuda()
        assert torch.equal(batched_nms(b, s, idxs, 0.5), tv.ops.batched_nms(b, s, idxs, 0.5))


def test_cuda_runs_on_current_stream(gen):
    boxes, scores = make(5000, gen, True)
    want = nms(boxes, scores, 0.5)
    b, s = boxes.cuda(), scores.cuda()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        keep, count = nms_padded(b, s, 0.5)
        got = nms(b, s, 0.5)
    torch.cuda.current_stream().wait_stream(stream)
    assert torch.equal(got.cpu(), want)
    assert torch.equal(keep[: count.item()].cpu(), want)


def test_cuda_graph_capture_padded(gen):
    boxes, scores = make(2000, gen, True)
    idxs = torch.randint(0, 10, (2000,), generator=gen)
    b, s, i = boxes.cuda(), scores.cuda(), idxs.cuda()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        nms_padded(b, s, 0.5, i, max_output=300)  # warm up the allocator
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        keep, count = nms_padded(b, s, 0.5, i, max_output=300)
    for _ in range(2):
        nb, ns = make(2000, gen, True)
        b.copy_(nb)
        s.copy_(ns)
        graph.replay()
        torch.cuda.synchronize()
        want = batched_nms(nb, ns, idxs, 0.5, max_output=300)
        c = count.item()
        assert c == len(want)
        assert torch.equal(keep[:c].cpu(), want) and (keep[c:] == -1).all()


def test_cuda_device_errors(gen):
    boxes, scores = make(10, gen, False)
    with pytest.raises(RuntimeError, match=r"mixprec::nms: scores is on cpu but boxes is on cuda"):
        torch.ops.mixprec.nms(boxes.cuda(), scores, 0.5)
    with pytest.raises(RuntimeError, match=r"mixprec::batched_nms: idxs is on cpu"):
        torch.ops.mixprec.batched_nms(boxes.cuda(), scores.cuda(), torch.zeros(10, dtype=torch.int64), 0.5)
    with pytest.raises(RuntimeError, match=r"mixprec::nms: iou_threshold must be >= 0"):
        torch.ops.mixprec.nms(boxes.cuda(), scores.cuda(), float("nan"))
    with pytest.raises(RuntimeError, match=r"mixprec::nms: boxes must be float32, float16 or bfloat16"):
        torch.ops.mixprec.nms(boxes.double().cuda(), scores.cuda(), 0.5)


def test_cuda_opcheck(gen):
    boxes, scores = make(100, gen, True)
    idxs = torch.randint(0, 3, (100,), generator=gen)
    b, s, i = boxes.cuda(), scores.cuda(), idxs.cuda()
    opcheck(torch.ops.mixprec.nms.default, (b.half(), s, 0.5))
    opcheck(torch.ops.mixprec.batched_nms.default, (b.bfloat16(), s, i, 0.5, 0.1, 20))
    opcheck(torch.ops.mixprec.nms_padded.default, (b, s, i, 0.5, None, 50))
