"""mixprec::nms / batched_nms / nms_padded: the OpTester checks (TestNMS:
every dtype against a float64 reference and torchvision on the exactly
widened float32 boxes, compile, opcheck, empty, non-contiguous, bad inputs),
then what is NMS's own: torchvision on float32 inputs over sizes and
thresholds, class ids, the FP16 overflow cases, options, threads, autocast,
patch_torchvision."""

import math

import numpy as np
import pytest
import torch
from torch.library import opcheck

import mixprec
from mixprec.ops import batched_nms, nms, nms_padded

from _op_tester import OpTester
from _reference import DTYPES

KINDS = ["random", "clustered", "duplicates", "ties", "degenerate"]


def _tv():
    return pytest.importorskip("torchvision")


# ---- data -------------------------------------------------------------------


def make(kind, n, gen, dtype=torch.float32, scale=1000.0):
    """(boxes (n, 4) and scores (n,)) of `dtype`, drawn from `gen`."""
    if kind == "clustered":
        k = max(1, n // 40)
        centers = torch.rand(k, 2, generator=gen) * scale
        c = centers[torch.randint(0, k, (n,), generator=gen)] + torch.randn(n, 2, generator=gen) * scale * 0.005
        wh = scale * 0.05 * (1 + 0.1 * torch.randn(n, 2, generator=gen)).abs()
        xy = c - wh / 2
    else:
        xy = torch.rand(n, 2, generator=gen) * scale
        wh = torch.rand(n, 2, generator=gen) * scale * 0.15 + 1e-3 * scale
    boxes = torch.cat([xy, xy + wh], 1)
    scores = torch.rand(n, generator=gen)
    if kind == "duplicates" and n > 1:
        src = torch.randint(0, n, (n // 3,), generator=gen)
        dst = torch.randint(0, n, (n // 3,), generator=gen)
        boxes[dst] = boxes[src]
        half = dst[: len(dst) // 2]
        scores[half] = scores[src[: len(half)]]
    if kind == "ties":
        scores = torch.randint(0, 8, (n,), generator=gen).float() / 8
    if kind == "degenerate" and n > 1:
        sel = torch.rand(n, generator=gen)
        boxes[sel < 0.15, 2] = boxes[sel < 0.15, 0]  # zero width
        boxes[(sel >= 0.15) & (sel < 0.3), 3] = boxes[(sel >= 0.15) & (sel < 0.3), 1]  # zero height
        pts = (sel >= 0.3) & (sel < 0.4)
        boxes[pts, 2:] = boxes[pts, :2]  # points (zero area: IoU 0/0 with another point)
        boxes[(sel >= 0.4) & (sel < 0.45)] = torch.tensor([5.0, 5.0, 5.0, 5.0])  # identical points
        inv = (sel >= 0.45) & (sel < 0.5)
        boxes[inv] = boxes[inv][:, [2, 3, 0, 1]]  # inverted (negative area)
    return boxes.to(dtype), scores.to(dtype)


# ---- float64 reference ------------------------------------------------------


def ref_nms(boxes, scores, thr, idxs=None, score_threshold=None, max_output=None):
    """Greedy NMS in float64 on the upcast inputs, torchvision's rules, NaN
    scores first. Returns (keep, margin): margin is the smallest |IoU - thr|
    of any decision taken (a decision that close may round either way in
    float32)."""
    b = boxes.double().numpy()
    s = scores.double().numpy()
    n = len(s)
    cand = np.arange(n)
    if score_threshold is not None:
        cand = cand[s > score_threshold]
    key = -s[cand]
    key[np.isnan(key)] = -np.inf
    order = cand[np.argsort(key, kind="stable")]
    x1, y1, x2, y2 = (b[order, k] for k in range(4))
    area = (x2 - x1) * (y2 - y1)
    cls = np.zeros(len(order), np.int64) if idxs is None else idxs.numpy().astype(np.int64)[order]
    supp = np.zeros(len(order), bool)
    keep, margin = [], math.inf
    with np.errstate(invalid="ignore", divide="ignore"):
        for k in range(len(order)):
            if max_output is not None and len(keep) >= max_output:
                break
            if supp[k]:
                continue
            keep.append(int(order[k]))
            r = slice(k + 1, None)
            w = np.maximum(0, np.minimum(x2[k], x2[r]) - np.maximum(x1[k], x1[r]))
            h = np.maximum(0, np.minimum(y2[k], y2[r]) - np.maximum(y1[k], y1[r]))
            inter = w * h
            iou = inter / (area[k] + area[r] - inter)
            alive = ~supp[r] & (cls[r] == cls[k])
            d = np.abs(iou - thr)[alive]
            d = d[~np.isnan(d)]
            if d.size:
                margin = min(margin, float(d.min()))
            supp[r] |= alive & (iou > thr)
    return torch.tensor(keep, dtype=torch.int64), margin


def per_class_ref(boxes, scores, idxs, thr):
    """batched NMS from mixprec's single-class nms per class, merged by
    decreasing score (stable)."""
    keep = [torch.nonzero(idxs == c).flatten()[nms(boxes[idxs == c], scores[idxs == c], thr)] for c in idxs.unique()]
    keep = torch.cat(keep).sort().values
    return keep[torch.sort(scores[keep], descending=True, stable=True).indices]


def per_class_tv(tv, boxes, scores, idxs, thr):
    """batched NMS from torchvision.ops.nms per class, merged by decreasing
    score with a stable sort (mixprec's documented order)."""
    keep = [torch.nonzero(idxs == c).flatten()[tv.ops.nms(boxes[idxs == c], scores[idxs == c], thr)] for c in idxs.unique()]
    keep = torch.cat(keep) if keep else torch.zeros(0, dtype=torch.int64)
    keep = keep.sort().values  # input order, so that the stable sort breaks ties by index
    return keep[torch.sort(scores[keep], descending=True, stable=True).indices]


# ---- float32: identical to torchvision -------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [1, 2, 9, 100, 3000])
def test_nms_f32_equals_torchvision(kind, n, gen):
    tv = _tv()
    boxes, scores = make(kind, n, gen)
    for thr in (0.0, 0.3, 0.5, 0.7, 1.0, 1.5):
        got = nms(boxes, scores, thr)
        assert got.dtype == torch.int64
        assert torch.equal(got, tv.ops.nms(boxes, scores, thr)), (kind, n, thr)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n_classes", [1, 3, 80])
def test_batched_nms_f32(kind, n_classes, gen):
    tv = _tv()
    n = 2500
    boxes, scores = make(kind, n, gen)
    idxs = torch.randint(0, n_classes, (n,), generator=gen)
    got = batched_nms(boxes, scores, idxs, 0.5)
    assert torch.equal(got, per_class_tv(tv, boxes, scores, idxs, 0.5))
    if kind not in ("ties", "duplicates"):
        # No score ties: torchvision's own batched_nms (its per-class path for
        # this size) must agree exactly.
        assert torch.equal(got, tv.ops.batched_nms(boxes, scores, idxs, 0.5))


def test_batched_nms_small_integer_boxes_equals_torchvision(gen):
    tv = _tv()
    # Small N takes torchvision's coordinate-offset path: exact for integers.
    n = 300
    xy = torch.randint(0, 200, (n, 2), generator=gen).float()
    boxes = torch.cat([xy, xy + torch.randint(1, 60, (n, 2), generator=gen).float()], 1)
    scores = torch.randperm(n, generator=gen).float() / n
    idxs = torch.randint(-5, 5, (n,), generator=gen)
    assert torch.equal(batched_nms(boxes, scores, idxs, 0.4), tv.ops.batched_nms(boxes, scores, idxs, 0.4))
    assert torch.equal(batched_nms(boxes, scores, idxs.int(), 0.4), tv.ops.batched_nms(boxes, scores, idxs, 0.4))


def test_batched_nms_class_ids_any_range(gen):
    n = 1500
    boxes, scores = make("clustered", n, gen)
    base = torch.randint(0, 7, (n,), generator=gen)
    want, _ = ref_nms(boxes, scores, 0.5, base)
    for idxs in (base, base * 10**15 - 2**62, base.int() - 2**31 + 3, base * 1000003):
        assert torch.equal(batched_nms(boxes, scores, idxs, 0.5), want)


# ---- mixed dtypes and overflow ----------------------------------------------


def test_mixed_box_and_score_dtypes(gen):
    boxes, scores = make("random", 500, gen)
    want = nms(boxes, scores, 0.5)
    assert torch.equal(nms(boxes, scores.double().float().half().float(), 0.5), nms(boxes, scores.half(), 0.5))
    assert torch.equal(nms(boxes.bfloat16(), scores, 0.5), nms(boxes.bfloat16().float(), scores, 0.5))
    assert torch.equal(nms(boxes, scores.bfloat16(), 0.5), nms(boxes, scores.bfloat16().float(), 0.5))
    assert want.numel() > 0


def test_fp16_area_overflow_keeps_right_boxes():
    # Areas of 400 x 400 (160000) and an intersection of 390 x 390 overflow
    # FP16 (max 65504): computed in FP16 the IoU is inf/inf = NaN and the
    # duplicate survives. mixprec computes it in FP32.
    boxes = torch.tensor([[0, 0, 400, 400], [10, 10, 410, 410], [1000, 1000, 1300, 1300]], dtype=torch.float16)
    scores = torch.tensor([0.9, 0.8, 0.7], dtype=torch.float16)
    b = boxes
    area16 = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    assert torch.isinf(area16).all()  # the failure mode being avoided
    want, _ = ref_nms(boxes, scores, 0.5)
    assert want.tolist() == [0, 2]
    assert nms(boxes, scores, 0.5).tolist() == [0, 2]
    assert nms(boxes.bfloat16(), scores.bfloat16(), 0.5).tolist() == [0, 2]


def test_fp16_batched_no_offset_overflow(gen):
    # torchvision's batched_nms shifts boxes by idx * (max_coord + 1): with
    # coordinates up to 2000 and 80 classes the shift passes 65504 in FP16
    # (inf coordinates) and classes collide. mixprec compares class ids.
    n = 400
    xy = torch.rand(n, 2, generator=gen) * 1800
    boxes = torch.cat([xy, xy + 20 + torch.rand(n, 2, generator=gen) * 180], 1).half()
    scores = torch.rand(n, generator=gen).half()
    idxs = torch.randint(0, 80, (n,), generator=gen)
    shifted = boxes + (idxs * (boxes.max() + 1)).to(boxes)[:, None]
    assert torch.isinf(shifted).any()
    want, margin = ref_nms(boxes, scores, 0.5, idxs)
    assert margin > 1e-6
    assert torch.equal(batched_nms(boxes, scores, idxs, 0.5), want)


def test_fp32_large_coordinates_batched_exact(gen):
    # Coordinates around 1e6 and 1000 classes: an offset of 1e9 would round
    # the coordinates to multiples of 64 in FP32. mixprec stays exact.
    n = 2000
    xy = 1e6 + torch.rand(n, 2, generator=gen) * 3000
    boxes = torch.cat([xy, xy + 5 + torch.rand(n, 2, generator=gen) * 300], 1)
    scores = torch.randperm(n, generator=gen).float()
    idxs = torch.randint(0, 1000, (n,), generator=gen)
    want, margin = ref_nms(boxes, scores, 0.5, idxs)
    assert margin > 1e-6
    assert torch.equal(batched_nms(boxes, scores, idxs, 0.5), want)


# ---- documented edge cases --------------------------------------------------


def test_single_box():
    for dt in DTYPES:
        one = nms(torch.tensor([[1.0, 2, 3, 4]], dtype=dt), torch.tensor([0.5], dtype=dt), 0.5)
        assert one.tolist() == [0]


def test_nan_scores_rank_first_like_torchvision(gen):
    boxes, scores = make("clustered", 300, gen)
    scores[::7] = float("nan")
    scores[3] = -float("nan")
    got = nms(boxes, scores, 0.5)
    want, _ = ref_nms(boxes, scores, 0.5)
    assert torch.equal(got, want)
    assert math.isnan(scores[got[0]].item())
    try:
        import torchvision as tv
    except ImportError:
        return
    assert torch.equal(got, tv.ops.nms(boxes, scores, 0.5))
    # A score threshold drops NaN scores (NaN > t is false).
    got = nms(boxes, scores, 0.5, score_threshold=-1.0)
    assert not torch.isnan(scores[got]).any()
    assert torch.equal(got, ref_nms(boxes, scores, 0.5, score_threshold=-1.0)[0])


def test_signed_zero_and_inf_scores_stable():
    boxes = torch.tensor([[0.0, 0, 1, 1]] * 2 + [[5.0, 5, 6, 6], [10.0, 10, 11, 11], [20.0, 20, 21, 21]])
    scores = torch.tensor([0.0, -0.0, -0.0, float("inf"), -float("inf")])
    assert nms(boxes, scores, 0.5).tolist() == [3, 0, 2, 4]


def test_zero_area_pairs_are_kept():
    # Two identical points: IoU = 0/0 = NaN, not > threshold: both kept.
    boxes = torch.tensor([[3.0, 3, 3, 3], [3.0, 3, 3, 3], [0.0, 0, 10, 0]])
    assert nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.0).tolist() == [0, 1, 2]


@pytest.mark.parametrize("dtype", DTYPES)
def test_score_threshold_and_max_output(dtype, gen):
    n = 800
    boxes, scores = make("clustered", n, gen, dtype)
    idxs = torch.randint(0, 5, (n,), generator=gen)
    for st in (None, 0.25, 0.9):
        for mo in (None, 0, 1, 7, 10**6):
            want, margin = ref_nms(boxes, scores, 0.45, score_threshold=st, max_output=mo)
            got = nms(boxes, scores, 0.45, score_threshold=st, max_output=mo)
            if margin > 1e-6:
                assert torch.equal(got, want), (st, mo)
            full = nms(boxes, scores, 0.45, score_threshold=st)
            assert torch.equal(got, full[: (mo if mo is not None else len(full))])
            want_b, margin = ref_nms(boxes, scores, 0.45, idxs, score_threshold=st, max_output=mo)
            got_b = batched_nms(boxes, scores, idxs, 0.45, score_threshold=st, max_output=mo)
            if margin > 1e-6:
                assert torch.equal(got_b, want_b), (st, mo)


def test_nms_padded(gen):
    n = 500
    boxes, scores = make("clustered", n, gen)
    idxs = torch.randint(0, 3, (n,), generator=gen)
    for i, mo in ((None, None), (idxs, None), (None, 20), (idxs, 1000), (idxs, 0)):
        keep, count = nms_padded(boxes, scores, 0.5, i, max_output=mo)
        full = nms(boxes, scores, 0.5) if i is None else batched_nms(boxes, scores, i, 0.5)
        cap = n if mo is None else min(n, mo)
        assert keep.shape == (cap,) and keep.dtype == torch.int64
        assert count.shape == () and count.dtype == torch.int64
        c = count.item()
        assert c == min(len(full), cap)
        assert torch.equal(keep[:c], full[:c])
        assert (keep[c:] == -1).all()


def test_threads_and_isa_do_not_change_results(gen):
    # Batched NMS runs classes on several threads above ~4M box pairs (both
    # cases here: 8 classes of ~2500 boxes take the x-pruned loop, 80 of ~500
    # the compacting one); compare with one thread (torch.set_num_threads
    # sets the OpenMP threads mixprec uses too).
    for n, n_classes in ((20000, 8), (40000, 80)):
        boxes, scores = make("clustered", n, gen)
        idxs = torch.randint(0, n_classes, (n,), generator=gen)
        a = batched_nms(boxes, scores, idxs, 0.5)
        torch_threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            b = batched_nms(boxes, scores, idxs, 0.5)
        finally:
            torch.set_num_threads(torch_threads)
        assert torch.equal(a, b)
        assert torch.equal(a, per_class_ref(boxes, scores, idxs, 0.5))


# ---- torch integration ------------------------------------------------------


def test_autocast_leaves_inputs_alone(gen):
    boxes, scores = make("clustered", 300, gen)
    want = nms(boxes, scores, 0.5)
    want_b = batched_nms(boxes, scores, torch.arange(300) % 3, 0.5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(nms(boxes, scores, 0.5), want)
        assert torch.equal(batched_nms(boxes, scores, torch.arange(300) % 3, 0.5), want_b)
        # Boxes produced inside autocast (bf16) are still handled in FP32.
        b16 = torch.nn.functional.linear(boxes, torch.eye(4))
        assert b16.dtype == torch.bfloat16
        assert torch.equal(nms(b16, scores, 0.5), nms(b16.float(), scores, 0.5))


def test_requires_grad_inputs(gen):
    boxes, scores = make("random", 100, gen)
    got = nms(boxes.clone().requires_grad_(), scores.clone().requires_grad_(), 0.5)
    assert torch.equal(got, nms(boxes, scores, 0.5)) and not got.requires_grad


def test_patch_torchvision(gen):
    tv = _tv()
    import torchvision.ops.boxes as tvb

    boxes, scores = make("clustered", 400, gen)
    idxs = torch.randint(0, 3, (400,), generator=gen)
    orig = (tv.ops.nms, tv.ops.batched_nms, tvb.nms, tvb.batched_nms)
    want = orig[0](boxes, scores, 0.5)
    with mixprec.ops.patch_torchvision():
        assert tv.ops.nms is not orig[0] and tvb.batched_nms is not orig[3]
        assert torch.equal(tv.ops.nms(boxes, scores, 0.5), want)
        assert torch.equal(tvb.batched_nms(boxes, scores, idxs, 0.5), batched_nms(boxes, scores, idxs, 0.5))
        # FP16 boxes now work on the CPU (torchvision's kernel refuses them) ...
        assert torch.equal(tv.ops.nms(boxes.half(), scores.half(), 0.5), nms(boxes.half(), scores.half(), 0.5))
        # ... and float64 still goes to torchvision.
        assert torch.equal(tv.ops.nms(boxes.double(), scores.double(), 0.5), orig[0](boxes.double(), scores.double(), 0.5))
    assert (tv.ops.nms, tv.ops.batched_nms, tvb.nms, tvb.batched_nms) == orig
    handle = mixprec.ops.patch_torchvision()
    assert tv.ops.batched_nms is not orig[1]
    handle.undo()
    assert tv.ops.batched_nms is orig[1]


# ---- the OpTester checks -------------------------------------------------------


class TestNMS(OpTester):
    """nms, batched_nms and nms_padded on one set of boxes."""

    cases = KINDS
    compile_dtype = torch.float32

    def make_inputs(self, gen, dtype, device, kind):
        n = 700
        boxes, scores = make(kind, n, gen, dtype)
        idxs = torch.randint(0, 4, (n,), generator=gen)
        return boxes.to(device), scores.to(device), idxs.to(device)

    def call(self, boxes, scores, idxs, thr=0.5):
        keep, count = nms_padded(boxes, scores, thr, idxs, max_output=50)
        return nms(boxes, scores, thr), batched_nms(boxes, scores, idxs, thr), keep, count

    def check_forward(self, args, out, kind):
        boxes, scores, idxs = (a.cpu() for a in args)
        for thr in (0.3, 0.5, 0.8):
            got, got_b, keep, count = (o.cpu() for o in (out if thr == 0.5 else self.call(*args, thr)))
            assert got.dtype == got_b.dtype == keep.dtype == torch.int64
            want, margin = ref_nms(boxes, scores, thr)
            if margin > 1e-6:
                assert torch.equal(got, want), (kind, thr)
            want, margin = ref_nms(boxes, scores, thr, idxs)
            if margin > 1e-6:
                assert torch.equal(got_b, want), (kind, thr)
            c = count.item()
            assert keep.shape == (50,) and c == min(len(got_b), 50)
            assert torch.equal(keep[:c], got_b[:c]) and (keep[c:] == -1).all()
            try:
                import torchvision as tv
            except ImportError:
                continue
            # Exactly: the boxes widened to float32 through torchvision.
            assert torch.equal(got, tv.ops.nms(boxes.float(), scores.float(), thr))

    def opcheck_cases(self, gen, dtype):
        boxes, scores = make("clustered", 60, gen, dtype)
        idxs = torch.randint(0, 3, (60,), generator=gen)
        nm, bn, npd = (getattr(torch.ops.mixprec, o).default for o in ("nms", "batched_nms", "nms_padded"))
        # One call of each op per dtype; the options and mixed dtypes spread over the dtypes.
        if dtype == torch.float32:
            return [(nm, (boxes, scores, 0.5)), (bn, (boxes, scores, idxs, 0.5)), (npd, (boxes, scores, None, 0.5))]
        if dtype == torch.float16:
            return [(nm, (boxes, scores.bfloat16(), 0.3, 0.2, 5)), (bn, (boxes, scores, idxs.int(), 0.5, None, 3)),
                    (npd, (boxes, scores.half(), idxs, 0.5, 0.1, 10))]
        return [(nm, (boxes, scores, 0.3, 0.2, 5)), (bn, (boxes, scores.float(), idxs, 0.5)),
                (npd, (boxes, scores, idxs, 0.5, 0.1, 10))]

    def empty_inputs(self, dtype, device):
        return [(torch.zeros(0, 4, dtype=dtype, device=device), torch.zeros(0, dtype=dtype, device=device),
                 torch.zeros(0, dtype=torch.int64, device=device))]

    def check_empty(self, args, out):
        for keep in out[:3]:
            assert keep.dtype == torch.int64 and keep.shape == (0,)
        assert out[3].shape == () and out[3].item() == 0

    def noncontiguous(self, args):
        boxes, scores, idxs = args

        def strided(t):
            out = torch.empty((2 * t.shape[0], *t.shape[1:]), dtype=t.dtype)[::2]
            return out.copy_(t)

        return [(boxes.t().contiguous().t(), scores, idxs), (boxes, strided(scores), strided(idxs))]

    @classmethod
    def bad_cases(cls):
        nm, bn, npd = torch.ops.mixprec.nms, torch.ops.mixprec.batched_nms, torch.ops.mixprec.nms_padded
        return [
            ("3 cols", lambda a: lambda: nm(a[0][:, :3].contiguous(), a[1], 0.5), r"mixprec::nms: boxes must have shape \(N, 4\)"),
            ("1-D boxes", lambda a: lambda: nm(a[0].flatten(), a[1], 0.5), r"mixprec::nms: boxes must have shape"),
            ("3-D boxes", lambda a: lambda: nm(a[0][None], a[1], 0.5), r"mixprec::nms: boxes must have shape"),
            ("len", lambda a: lambda: nm(a[0], a[1][:9], 0.5), r"mixprec::nms: scores must have shape \(N,\)"),
            ("2-D scores", lambda a: lambda: nm(a[0], a[1][:, None], 0.5), r"mixprec::nms: scores must have shape"),
            ("int boxes", lambda a: lambda: nm(a[0].int(), a[1], 0.5), r"mixprec::nms: boxes must be float32, float16 or bfloat16"),
            ("f64 boxes", lambda a: lambda: nm(a[0].double(), a[1], 0.5), r"mixprec::nms: boxes must be .*float64 is not supported"),
            ("int scores", lambda a: lambda: nm(a[0], a[1].long(), 0.5), r"mixprec::nms: scores must be float32"),
            ("nan thr", lambda a: lambda: nm(a[0], a[1], float("nan")), r"mixprec::nms: iou_threshold must be >= 0"),
            ("neg thr", lambda a: lambda: nm(a[0], a[1], -0.1), r"mixprec::nms: iou_threshold must be >= 0"),
            ("nan score thr", lambda a: lambda: nm(a[0], a[1], 0.5, float("nan")), r"mixprec::nms: score_threshold must not be NaN"),
            ("noncontig boxes", lambda a: lambda: nm(a[0].t().contiguous().t(), a[1], 0.5), r"mixprec::nms: boxes must be contiguous"),
            ("noncontig scores", lambda a: lambda: nm(a[0], torch.rand(2 * len(a[1]))[::2], 0.5), r"mixprec::nms: scores must be contiguous"),
            ("meta scores", lambda a: lambda: nm(a[0], a[1].to("meta"), 0.5), r"mixprec::nms: scores"),
            ("idxs float", lambda a: lambda: bn(a[0], a[1], a[2].float(), 0.5), r"mixprec::batched_nms: idxs must be int64 or int32"),
            ("idxs len", lambda a: lambda: bn(a[0], a[1], a[2][:3], 0.5), r"mixprec::batched_nms: idxs must have shape \(N,\)"),
            ("idxs 2-D", lambda a: lambda: bn(a[0], a[1], a[2][:, None], 0.5), r"mixprec::batched_nms: idxs must have shape"),
            ("bn thr", lambda a: lambda: bn(a[0], a[1], a[2], -1.0), r"mixprec::batched_nms: iou_threshold must be >= 0"),
            ("padded", lambda a: lambda: npd(a[0], a[1][:4], None, 0.5), r"mixprec::nms_padded: scores must have shape"),
            ("padded idxs", lambda a: lambda: npd(a[0], a[1], a[2].half(), 0.5), r"mixprec::nms_padded: idxs must be int64 or int32"),
            ("public neg thr", lambda a: lambda: nms(a[0], a[1], -1.0), r"mixprec::nms: iou_threshold must be >= 0"),
            ("public idxs len", lambda a: lambda: batched_nms(a[0], a[1], a[2][:3], 0.5), r"mixprec::batched_nms: idxs must have shape"),
        ]
