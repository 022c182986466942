"""mixprec::efficient_nms (batched detection post-processing) on the CPU:
against a per-image loop of score filter + stable sort + top-k +
torchvision NMS, both on the float32-widened boxes (bit-exact: the same IoU
decisions) and torchvision.ops.batched_nms on float64 boxes; every dtype,
shared and class-specific boxes, class-aware and class-agnostic, ties,
empty images, N = 0, K above the candidates, NaN scores; thread count
independence; torch.compile, torch.export of a decoding module; and the
OpTester checks (TestEfficientNMS: the torchvision loop per dtype, device
and CPU path, the boxes' gradient, compile, opcheck, empty, non-contiguous,
bad inputs)."""

import re

import pytest
import torch

import mixprec
from mixprec.ops import Detections, efficient_nms

from _op_tester import OpTester
from _reference import DTYPES, EPS, bits, cpu_lib


def _tv():
    return pytest.importorskip("torchvision")


# ---- data -------------------------------------------------------------------


def make(gen, b, n, c, dtype=torch.float32, per_class=False, ties=False, scale=640.0):
    """Detector-like outputs: boxes clustered around a few objects per image
    (many overlaps), (B, N, 4) or (B, N, C, 4), and (B, N, C) scores."""
    k = max(1, n // 25)
    centres = torch.rand(b, k, 2, generator=gen) * scale
    pick = torch.randint(0, k, (b, n), generator=gen)
    xy = torch.gather(centres, 1, pick[..., None].expand(b, n, 2)) + torch.randn(b, n, 2, generator=gen) * scale * 0.02
    wh = scale * (0.05 + 0.1 * torch.rand(b, n, 2, generator=gen))
    boxes = torch.cat([xy - wh / 2, xy + wh / 2], -1)
    if per_class:
        boxes = boxes[:, :, None, :] + torch.randn(b, n, c, 4, generator=gen) * scale * 0.01
    if ties:
        scores = torch.randint(0, 6, (b, n, c), generator=gen).float() / 6
    else:
        scores = torch.rand(b, n, c, generator=gen)
    return boxes.to(dtype), scores.to(dtype)


# ---- per-image reference ----------------------------------------------------


def reference(boxes, scores, iou, score_threshold=None, max_detections=100, top_k=None, agnostic=False, f64=False):
    """The documented loop. f64=False: torchvision.ops.nms per class on the
    float32-widened boxes (its float32 IoU: the decisions mixprec must
    reproduce bit for bit); f64=True: torchvision.ops.batched_nms on float64
    boxes."""
    tv = _tv()
    B, N, C = scores.shape
    K = max_detections
    out_b = torch.zeros(B, K, 4, dtype=boxes.dtype)
    out_s = torch.zeros(B, K, dtype=scores.dtype)
    out_c = torch.full((B, K), -1, dtype=torch.int64)
    out_i = torch.full((B, K), -1, dtype=torch.int64)
    counts = torch.zeros(B, dtype=torch.int64)
    for b in range(B):
        s = scores[b].reshape(-1).double()
        ok = ~s.isnan()
        if score_threshold is not None:
            ok &= s > score_threshold
        cand = ok.nonzero()[:, 0]
        cand = cand[torch.sort(s[cand], descending=True, stable=True).indices]
        if top_k is not None:
            cand = cand[:top_k]
        n, c = cand // C, cand % C
        bx = boxes[b, n] if boxes.dim() == 3 else boxes[b, n, c]
        cls = torch.zeros_like(c) if agnostic else c
        if f64:
            keep = tv.ops.batched_nms(bx.double(), s[cand], cls, iou)
        else:
            parts = []
            for k in cls.unique():
                pos = (cls == k).nonzero()[:, 0]
                parts.append(pos[tv.ops.nms(bx[pos].float(), s[cand][pos].float(), iou)])
            keep = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)
        keep = keep.sort().values[:K]  # candidate positions are the output order
        m = len(keep)
        counts[b] = m
        out_b[b, :m] = bx[keep]
        out_s[b, :m] = scores[b].reshape(-1)[cand[keep]]
        out_c[b, :m] = c[keep]
        out_i[b, :m] = n[keep]
    return Detections(out_b, out_s, out_c, out_i, counts)


def assert_same(got, want):
    assert isinstance(got, Detections)
    assert torch.equal(got.counts, want.counts), (got.counts, want.counts)
    assert torch.equal(got.indices, want.indices)
    assert torch.equal(got.classes, want.classes)
    assert got.boxes.dtype == want.boxes.dtype and got.scores.dtype == want.scores.dtype
    assert torch.equal(bits(got.boxes), bits(want.boxes))
    assert torch.equal(bits(got.scores), bits(want.scores))


# ---- results ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("agnostic", [False, True])
def test_matches_float64_batched_nms(gen, dtype, agnostic):
    """The brief's reference: torchvision.ops.batched_nms on float64 boxes
    (an IoU decision within float32 rounding of the threshold may differ:
    coarse bfloat16 coordinates make IoUs of exactly 0.5 common, so the
    thresholds here are not simple fractions; the exact float32 comparison is
    TestEfficientNMS.test_forward)."""
    boxes, scores = make(gen, 4, 500, 8, dtype)
    for iou in (0.3013, 0.4987, 0.7011):
        got = efficient_nms(boxes, scores, iou_threshold=iou, score_threshold=0.3, max_detections=100, pre_nms_top_k=1000, class_agnostic=agnostic)
        assert_same(got, reference(boxes, scores, iou, 0.3, 100, 1000, agnostic, f64=True))


def test_coco_sized_batch(gen):
    """C = 80, N = 2000 per image, pre-NMS top-k 1000, 100 detections."""
    boxes, scores = make(gen, 2, 2000, 80, torch.bfloat16)
    got = efficient_nms(boxes, scores, iou_threshold=0.5, score_threshold=0.05, max_detections=100, pre_nms_top_k=1000)
    assert_same(got, reference(boxes, scores, 0.5, 0.05, 100, 1000))
    assert got.counts.tolist() == [100, 100]


@pytest.mark.parametrize("dtype", DTYPES)
def test_ties_by_flat_index(gen, dtype):
    """Many equal scores (6 levels): equal scores are taken in flat index
    order n * C + c, also at the pre-NMS top-k boundary."""
    boxes, scores = make(gen, 2, 400, 5, dtype, ties=True)
    for top_k in (None, 777, 50, 1):
        for agnostic in (False, True):
            got = efficient_nms(boxes, scores, iou_threshold=0.45, score_threshold=0.1, max_detections=300, pre_nms_top_k=top_k, class_agnostic=agnostic)
            assert_same(got, reference(boxes, scores, 0.45, 0.1, 300, top_k, agnostic))


def test_signed_zero_scores_tie(gen):
    boxes, _ = make(gen, 1, 6, 1)
    boxes = torch.tensor([[[0, 0, 1, 1], [10, 10, 11, 11], [20, 20, 21, 21], [30, 30, 31, 31], [40, 40, 41, 41], [50, 50, 51, 51]]]).float()
    scores = torch.tensor([[[-0.0], [0.0], [-0.0], [0.5], [0.0], [-1.0]]])
    got = efficient_nms(boxes, scores, max_detections=6)
    assert got.indices[0].tolist() == [3, 0, 1, 2, 4, 5]


def test_score_threshold_is_strict():
    boxes = torch.tensor([[[0, 0, 1, 1], [5, 5, 6, 6], [9, 9, 10, 10]]]).float()
    scores = torch.tensor([[[0.25], [0.5], [0.75]]])
    got = efficient_nms(boxes, scores, score_threshold=0.5, max_detections=3)
    assert got.counts.tolist() == [1] and got.indices[0].tolist() == [2, -1, -1]
    # A float threshold between float32 values: compared as float vs double.
    got = efficient_nms(boxes, scores, score_threshold=0.49999999999, max_detections=3)
    assert got.indices[0].tolist() == [2, 1, -1]


def test_nan_scores_never_selected(gen):
    boxes, scores = make(gen, 2, 100, 3)
    scores[0, ::3, 1] = float("nan")
    scores[1] = float("nan")
    for thr in (None, 0.2):
        got = efficient_nms(boxes, scores, score_threshold=thr, max_detections=200)
        assert_same(got, reference(boxes, scores, 0.5, thr, 200))
        assert not got.scores.isnan().any()
        assert got.counts[1] == 0


def test_padding_and_empty_images(gen):
    boxes, scores = make(gen, 3, 50, 4)
    scores[1] = 0.01  # nothing above the threshold in image 1
    got = efficient_nms(boxes, scores, score_threshold=0.5, max_detections=500)
    want = reference(boxes, scores, 0.5, 0.5, 500)
    assert_same(got, want)
    assert got.counts[1] == 0
    for b in range(3):
        m = int(got.counts[b])
        assert m < 500  # K above the candidates
        assert (got.classes[b, m:] == -1).all() and (got.indices[b, m:] == -1).all()
        assert (bits(got.boxes[b, m:]) == 0).all() and (bits(got.scores[b, m:]) == 0).all()


def test_iou_threshold_extremes(gen):
    boxes, scores = make(gen, 2, 80, 3)
    # Above 1: nothing is suppressed; 0: any overlap suppresses.
    got = efficient_nms(boxes, scores, iou_threshold=1.5, max_detections=240)
    assert got.counts.tolist() == [240, 240]
    for iou in (0.0, 1.0):
        for agnostic in (False, True):
            got = efficient_nms(boxes, scores, iou_threshold=iou, max_detections=240, class_agnostic=agnostic)
            assert_same(got, reference(boxes, scores, iou, None, 240, None, agnostic))


def test_fp16_coordinates_beyond_fp16_area(gen):
    """Boxes of side 400 in FP16: their area (160000) overflows FP16 but not
    mixprec's float32 IoU; the result equals the float32 one."""
    boxes, scores = make(gen, 2, 200, 4, torch.float32, scale=30000.0)
    b16 = boxes.half()
    got = efficient_nms(b16, scores, score_threshold=0.2)
    want = efficient_nms(b16.float(), scores, score_threshold=0.2)
    assert torch.equal(got.indices, want.indices) and torch.equal(got.counts, want.counts)
    assert torch.equal(got.boxes.float(), want.boxes)


def test_mixed_dtypes_and_noncontiguous(gen):
    boxes, scores = make(gen, 2, 120, 5)
    got = efficient_nms(boxes.bfloat16(), scores.half(), score_threshold=0.3)
    assert got.boxes.dtype == torch.bfloat16 and got.scores.dtype == torch.float16
    assert_same(got, reference(boxes.bfloat16(), scores.half(), 0.5, 0.3))
    # Non-contiguous inputs (a transposed scores layout) are read in place,
    # by the public function and by the op itself.
    st = scores.transpose(1, 2).contiguous().transpose(1, 2)
    bt = boxes.transpose(0, 1).contiguous().transpose(0, 1)
    assert not st.is_contiguous() and not bt.is_contiguous()
    want = efficient_nms(boxes, scores, score_threshold=0.3)
    assert_same(efficient_nms(boxes, st, score_threshold=0.3), want)
    assert_same(Detections(*torch.ops.mixprec.efficient_nms(bt, st, 0.5, 0.3)), want)


@pytest.mark.parametrize("batch", [1, 5])
def test_thread_count_does_not_matter(gen, batch):
    lib = cpu_lib()
    boxes, scores = make(gen, batch, 1500, 20)
    before = lib.mixprec_get_num_threads()
    try:
        lib.mixprec_set_num_threads(1)
        one = efficient_nms(boxes, scores, score_threshold=0.05, max_detections=300)
        lib.mixprec_set_num_threads(2)
        two = efficient_nms(boxes, scores, score_threshold=0.05, max_detections=300)
    finally:
        lib.mixprec_set_num_threads(before)
    assert_same(one, two)


def test_matches_mixprec_batched_nms(gen):
    """The per-image loop a mixprec user writes today gives the same boxes."""
    boxes, scores = make(gen, 3, 400, 7, torch.bfloat16)
    got = efficient_nms(boxes, scores, score_threshold=0.4, max_detections=60)
    for b in range(3):
        s = scores[b].reshape(-1)
        cand = (s > 0.4).nonzero()[:, 0]
        keep = mixprec.ops.batched_nms(boxes[b, cand // 7], s[cand], cand % 7, 0.5, max_output=60)
        m = int(got.counts[b])
        assert m == len(keep)
        assert torch.equal(got.indices[b, :m], cand[keep] // 7) and torch.equal(got.classes[b, :m], cand[keep] % 7)


# ---- bad inputs -------------------------------------------------------------


def test_nan_boxes_like_torchvision(gen):
    """NaN coordinates: the IoU decisions of torchvision's kernel."""
    boxes, scores = make(gen, 2, 100, 3)
    boxes[0, ::7, 0] = float("nan")
    boxes[1, ::5, 3] = float("nan")
    got = efficient_nms(boxes, scores, score_threshold=0.2, max_detections=300)
    assert_same(got, reference(boxes, scores, 0.5, 0.2, 300))


# ---- torch integration ------------------------------------------------------


def test_fake_kernel_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        boxes, scores = torch.empty(4, 100, 80, 4, dtype=torch.float16), torch.empty(4, 100, 80, dtype=torch.bfloat16)
        out = torch.ops.mixprec.efficient_nms(boxes, scores, 0.5, 0.05, 300)
    assert [tuple(t.shape) for t in out] == [(4, 300, 4), (4, 300), (4, 300), (4, 300), (4,)]
    assert [t.dtype for t in out] == [torch.float16, torch.bfloat16, torch.int64, torch.int64, torch.int64]


def test_torch_compile_fullgraph(gen):
    boxes, scores = make(gen, 2, 200, 5)

    def f(b, s):
        d = efficient_nms(b.sigmoid() * 640, s.sigmoid(), score_threshold=0.55, max_detections=30)
        return d.boxes * 2, d.scores, d.classes, d.counts

    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    for got, want in zip(cf(boxes, scores), f(boxes, scores)):
        assert torch.equal(got, want)


class YoloHead(torch.nn.Module):
    """A YOLO-style decoder: raw (B, N, 4 + C) outputs (cx, cy, w, h, class
    logits) -> corner boxes, sigmoid scores -> efficient_nms."""

    def forward(self, raw):
        cxcy, wh = raw[..., :2], raw[..., 2:4].exp()
        boxes = torch.cat([cxcy - wh / 2, cxcy + wh / 2], -1)
        scores = raw[..., 4:].sigmoid()
        d = efficient_nms(boxes, scores, iou_threshold=0.45, score_threshold=0.25, max_detections=50, pre_nms_top_k=400)
        return d.boxes, d.scores, d.classes, d.counts


def _raw(gen, b, n, c):
    raw = torch.randn(b, n, 4 + c, generator=gen)
    raw[..., :2] = torch.rand(b, n, 2, generator=gen) * 320
    raw[..., 2:4] += 3.5
    return raw


def test_torch_export(gen):
    raw = _raw(gen, 2, 300, 10)
    model = YoloHead()
    ep = torch.export.export(model, (raw,))
    assert any(
        n.op == "call_function" and "efficient_nms" in str(n.target) for n in ep.graph.nodes
    ), ep.graph
    other = _raw(gen, 2, 300, 10)
    for got, want in zip(ep.module()(other), model(other)):
        assert torch.equal(got, want)


def test_torch_export_dynamic_batch(gen):
    batch = torch.export.Dim("batch", min=1, max=64)
    n = torch.export.Dim("n", min=8, max=100000)
    ep = torch.export.export(YoloHead(), (_raw(gen, 2, 300, 10),), dynamic_shapes=({0: batch, 1: n},))
    raw = _raw(gen, 5, 1000, 10)
    for got, want in zip(ep.module()(raw), YoloHead()(raw)):
        assert torch.equal(got, want)


def test_autocast_leaves_inputs_alone(gen):
    boxes, scores = make(gen, 2, 100, 4)
    want = efficient_nms(boxes, scores, score_threshold=0.3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = efficient_nms(boxes, scores, score_threshold=0.3)
    assert_same(got, want)


@pytest.mark.parametrize("per_class", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients_scatter_back(gen, per_class, dtype):
    """Gradients of the output boxes/scores equal those of the reference's
    gather (boxes[b, n] or boxes[b, n, c], scores[b, n, c])."""
    boxes, scores = make(gen, 3, 60, 4, dtype, per_class)
    boxes.requires_grad_()
    scores.requires_grad_()
    d = efficient_nms(boxes, scores, score_threshold=0.2, max_detections=40, class_agnostic=not per_class)
    assert d.boxes.requires_grad and d.scores.requires_grad and not d.indices.requires_grad
    wb, ws = torch.randn(d.boxes.shape, generator=gen).to(dtype), torch.randn(d.scores.shape, generator=gen).to(dtype)
    gb, gs = torch.autograd.grad((d.boxes * wb).sum() + (d.scores * ws).sum(), (boxes, scores))
    want_b, want_s = torch.zeros_like(boxes, dtype=torch.float64), torch.zeros_like(scores, dtype=torch.float64)
    for b in range(3):
        for k in range(int(d.counts[b])):
            n, c = int(d.indices[b, k]), int(d.classes[b, k])
            (want_b[b, n, c] if per_class else want_b[b, n]).add_(wb[b, k].double())
            want_s[b, n, c] += ws[b, k].double()
    assert torch.equal(gs.double(), want_s)
    tol = 0 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(gb.double(), want_b, rtol=tol, atol=tol)


# ---- the OpTester checks -------------------------------------------------------


def _message(msg):
    return "mixprec::efficient_nms: " + re.escape(msg)


class TestEfficientNMS(OpTester):
    """A case is (class-specific boxes, class-agnostic); call is
    mixprec.ops.efficient_nms. Forward: the documented torchvision loop on
    the float32-widened boxes, bit for bit, for three threshold / top-k / K
    sets; backward: the output boxes' gradient scattered back to the boxes
    the detections came from."""

    cases = [(False, False), (False, True), (True, False), (True, True)]
    # The CPU paths of the candidate scan: scalar and AVX2 (AVX-512 machines
    # take the AVX2 one).
    isas = ["scalar", "avx2"]
    grad_argnums = (0,)

    @staticmethod
    def case_id(case):
        per_class, agnostic = case
        return ("per-class" if per_class else "shared") + ("-agnostic" if agnostic else "")

    def make_inputs(self, gen, dtype, device, case):
        per_class, agnostic = case
        boxes, scores = make(gen, 3, 300, 6, dtype, per_class)
        return boxes.to(device), scores.to(device), agnostic

    def call(self, boxes, scores, agnostic, score_threshold=0.5, max_detections=50, pre_nms_top_k=600):
        return efficient_nms(boxes, scores, iou_threshold=0.5, score_threshold=score_threshold,
                             max_detections=max_detections, pre_nms_top_k=pre_nms_top_k, class_agnostic=agnostic)

    def check_forward(self, args, out, case):
        boxes, scores, agnostic = args
        for thr, k, top_k in ((0.5, 50, 600), (None, 2000, None), (0.9, 7, 20)):
            got = out if thr == 0.5 else self.call(*args, thr, k, top_k)
            want = reference(boxes.cpu(), scores.cpu(), 0.5, thr, k, top_k, agnostic)
            assert_same(Detections(*(t.cpu() for t in got)), want)
            assert int(got.counts.min()) > 0

    def check_backward(self, args, out, g, grads, case):
        boxes = args[0]
        per_class = boxes.dim() == 4
        want = torch.zeros(boxes.shape, dtype=torch.float64)
        size = torch.zeros(boxes.shape, dtype=torch.float64)
        g = g.cpu().double()
        indices, classes, counts = out.indices.cpu(), out.classes.cpu(), out.counts.cpu()
        for b in range(boxes.shape[0]):
            for k in range(int(counts[b])):
                n, c = int(indices[b, k]), int(classes[b, k])
                at = (b, n, c) if per_class else (b, n)
                want[at] += g[b, k]
                size[at] += g[b, k].abs()
        got = grads[0].cpu()
        assert got.dtype == boxes.dtype and got.shape == boxes.shape
        assert (size > 0).any()
        # Exact where no detection came from; elsewhere a sum of at most C
        # terms rounded in the boxes' dtype (a box kept for several classes).
        assert ((got.double() - want).abs() <= 4 * EPS[boxes.dtype] * size).all()

    def opcheck_cases(self, gen, dtype):
        boxes, scores = make(gen, 2, 40, 3, dtype)
        op = torch.ops.mixprec.efficient_nms.default
        cases = [(op, (boxes, scores)),
                 (op, (boxes.clone().requires_grad_(), scores.clone().requires_grad_(), 0.5, 0.1, 20))]
        if dtype == torch.float16:
            cases.append((op, (boxes, scores.bfloat16(), 0.4, 0.2, 7, 30, True)))
        if dtype == torch.bfloat16:
            pb, ps = make(gen, 3, 20, 4, dtype, per_class=True)
            cases.append((op, (pb, ps, 0.5, None, 50)))
        return cases

    def empty_inputs(self, dtype, device):
        out = []
        for b, n, c in ((0, 10, 3), (2, 0, 3), (2, 10, 0), (0, 0, 0)):
            scores = torch.rand(b, n, c).to(dtype).to(device)
            for shape in ((b, n, 4), (b, n, c, 4)):
                out.append((torch.rand(shape).to(dtype).to(device), scores, False, None, 5, None))
        return out

    def check_empty(self, args, got):
        b = args[1].shape[0]
        assert got.boxes.shape == (b, 5, 4) and got.scores.shape == (b, 5)
        assert got.classes.shape == got.indices.shape == (b, 5) and got.counts.shape == (b,)
        assert (got.counts == 0).all() and (got.classes == -1).all() and (got.indices == -1).all()

    def noncontiguous(self, args):
        boxes, scores, agnostic = args
        bt = boxes.transpose(0, 1).contiguous().transpose(0, 1)
        st = scores.transpose(1, 2).contiguous().transpose(1, 2)
        return [(bt, scores, agnostic), (boxes, st, agnostic), (bt, st, agnostic)]

    @classmethod
    def bad_cases(cls):
        op = torch.ops.mixprec.efficient_nms
        range_k = "max_detections must be in 1 .. 2^31 - 1, got "
        iou = "iou_threshold must be >= 0 and not NaN, got "
        cases = [
            ("max_detections 0", lambda b, s: op(b, s, 0.5, None, 0), range_k + "0"),
            ("max_detections -3", lambda b, s: op(b, s, 0.5, None, -3), range_k + "-3"),
            ("pre_nms_top_k 0", lambda b, s: op(b, s, 0.5, None, 10, 0), "pre_nms_top_k must be >= 1, or -1"),
            ("iou nan", lambda b, s: op(b, s, float("nan")), iou + "nan"),
            ("iou negative", lambda b, s: op(b, s, -0.1), iou + "-0.1"),
            ("score_threshold nan", lambda b, s: op(b, s, 0.5, float("nan")), "score_threshold must not be NaN"),
            ("boxes float64", lambda b, s: op(b.double(), s), "boxes must be float32, float16 or bfloat16, got float64"),
            ("scores float64", lambda b, s: op(b, s.double()), "scores must be float32, float16 or bfloat16, got float64"),
            ("scores 2-D", lambda b, s: op(b, s[0]), "scores must have shape (B, N, C)"),
            ("boxes last size", lambda b, s: op(torch.rand(3, 300, 6), s), "boxes must have shape (B, N, 4) or (B, N, C, 4)"),
            ("boxes batch", lambda b, s: op(b[:1], s), "boxes has shape (1, 300, 4) but scores has shape (3, 300, 6)"),
            ("boxes rows", lambda b, s: op(b[:, :5].contiguous(), s), "boxes has shape (3, 5, 4) but scores"),
            ("boxes classes", lambda b, s: op(torch.rand(3, 300, 4, 4), s), "boxes has shape (3, 300, 4, 4) but scores"),
            ("meta scores", lambda b, s: op(b, s.to("meta")), "scores is on meta but boxes is on cpu"),
            ("meta boxes", lambda b, s: op(b.to("meta"), s), "scores is on cpu but boxes is on meta"),
            ("public max_detections 0", lambda b, s: efficient_nms(b, s, max_detections=0), range_k + "0"),
            ("public meta scores", lambda b, s: efficient_nms(b, s.to("meta")), "scores is on meta but boxes is on cpu"),
            ("public sparse boxes", lambda b, s: efficient_nms(b.to_sparse(), s), "boxes must be a defined strided tensor"),
        ]
        return [(name, (lambda fn: lambda a: lambda: fn(a[0], a[1]))(fn), _message(msg)) for name, fn, msg in cases]
