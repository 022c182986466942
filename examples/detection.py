"""Playbook project 3: object detection, FP32 against BF16 autocast and FP16
autocast + mixprec.amp.GradScaler, and FP16 post-processing against
mixprec's FP32-safe NMS on the same detections.

A torchvision Faster R-CNN (fasterrcnn_mobilenet_v3_large_320_fpn,
weights=None, weights_backbone=None: random init, nothing is downloaded; its
box head narrowed to a 128-wide TwoMLPHead, see "Sizes") learns to find
three classes in synthetic scenes this script draws itself: squares, discs
and triangles (classes 1-3), each class in its own hue (jittered), of random
size and position, overlapping (a shape drawn later covers an earlier one;
every shape keeps its drawn box, clipped to the image), on a textured noisy
background. The boxes come from the drawing. Every scene is a function of
its seed: the runs are reproducible.

Recipes, compared on paired seeds (seed k: its own initial weights, its own
FP32 pre-training and its own stream of training scenes, the same for every
recipe):

  fp32       FP32 forward and backward, torch.optim.AdamW
  bf16       torch.autocast(dtype=torch.bfloat16) around the forward (the
             detector returns its losses), FP32 parameters, AdamW
  fp16       torch.autocast(dtype=torch.float16) and mixprec.amp.GradScaler
             (scale, unscale + gradient clipping, skipped steps on overflow)

Every recipe also evaluates in its own precision (autocast at inference).

Post-processing. The detector's own NMS is switched off (roi_heads.nms_thresh
= 1.0: torchvision suppresses only IoU > threshold, so nothing; up to 1000
detections per image with score > 0.05 come out, in the recipe's box dtype)
and the NMS is done here, per class at IoU 0.5, top 100 per image, in the
ways the post-processing table compares on the SAME detections (seed 0's
fp32 model on the validation scenes):

  torchvision FP32      torchvision.ops.batched_nms on float32 boxes: the
                        reference
  torchvision FP16      boxes and scores cast to float16, then
                        torchvision.ops.batched_nms as it runs on CUDA for
                        half boxes (its CPU kernel refuses float16, so the
                        same arithmetic is written here in torch ops): the
                        coordinate trick in FP16 (boxes offset by class x
                        (max coordinate + 1), in FP16), the intersection's
                        width and height in FP16, areas and IoU in FP32
  naive FP16            the same with areas and IoU in FP16 too (areas
                        overflow to inf above 65504 px^2, i.e. 256 x 256):
                        torchvision's kernel before 0.9 (pytorch/vision#3371)
                        and hand-written half NMS
  mixprec FP32 boxes    mixprec.ops.batched_nms on the float32 boxes
  mixprec FP16 boxes    mixprec.ops.batched_nms on the float16 boxes (IoU in
                        FP32, classes compared instead of offset): what an
                        FP16 pipeline gets with mixprec

At the training resolution (128 px) FP16 coordinates are exact to 1/16 px
(1/4 px after the class offsets, up to 3 x 129 px) and areas stay far below
65504, so per image FP16 post-processing loses little there (FP16 scores
still tie). --canvas
(default 4096) re-runs the comparison with the same boxes scaled to a canvas
of that side (a 4K image, or a detector whose boxes are in the original
image's pixels): FP16 spacing is 2 px above 2048 and 4 px above 4096, the
class offsets move boxes up to 3 x 4097 + 4096 px (16.4k), where it is 8-16
px, and most boxes' areas overflow FP16.
Metrics are taken after scaling the kept boxes back, so every row is
comparable with the reference. Each is run per image (as torchvision's
detectors call batched_nms) and as one call for all validation scenes with
idxs = scene x 4 + label (as batched post-processing code does): there the
coordinate trick's offsets reach 127 x (max coordinate + 1), 16.4k px at
128 px (FP16 spacing 8-16 px) and past FP16's 65504 (inf) on the canvas.
torchvision switches to a per-class loop above 100,000 coordinates on CUDA
(4,000 on the CPU); the FP16 rows follow its CUDA rule.

Metrics: mAP@0.5 and mAP@[.5:.95] from torchmetrics' MeanAveragePrecision
(pycocotools backend); recall: the share of ground-truth boxes matched at IoU
>= 0.5 by the kept detections (top 100, any score; matched greedily by
decreasing score to same-class ground truth); P / R: precision and recall of
the detections with score >= --score-thresh (0.1) only. The playbook's bar
is mAP@0.5 and recall within 1 pp of FP32, every seed. The post-processing
table also counts kept-set differences from the reference (detections kept
by one and not the other) and "duplicates": kept same-class pairs whose FP32
IoU exceeds 0.5, which the reference never keeps.

Sizes. The 2-core CPU this was written on (an AMD EPYC with AVX2, no
AVX-512, shared with other jobs) has no fast BF16 or FP16 kernels:
torch.ops.mkldnn._is_mkldnn_bf16_supported() is False, BF16/FP16
convolutions fall back to aten::_slow_conv2d (per channel for MobileNet's
depthwise convolutions) and BF16/FP16 matmuls run at a few GFLOP/s. With
torchvision's default box head (a 1024-wide MLP on 12544 RoI features, 512
RoIs per image) one BF16 step at 128 px, batch 4, took ~35 s against ~2.6 s
FP32, so the box head is 128 wide and the RPN / RoI heads sample 64 per
image (100 proposals per image in training). Even so a BF16 or FP16 step is
several times an FP32 one, and a detector trained from scratch needs
thousands of steps, far more than a 10-minute run allows. The full run
therefore pre-trains each seed in FP32 (--pretrain steps, shared by the
recipes), then each recipe trains --steps more steps from there in its own
precision and is evaluated in it: it measures BF16/FP16 fine-tuning and
inference against FP32 from a common point, not training from scratch
(--pretrain 0 does that, on a GPU: --device cuda --pretrain 0 --steps 3000).
Defaults: 128 px, batch 4, AdamW lr 2e-3, 240 FP32 pre-training steps, 12
steps per recipe, 2 seeds, 32 validation scenes, 1 thread (on the shared
2-core machine several times faster than torch's default of one per core).
The --device cuda path has not been run (no GPU in the session that wrote
it); the post-processing always runs on the CPU.

Usage: python examples/detection.py [--quick] [--device cpu|cuda] [--seeds N] [--steps N]
           [--pretrain N] [--batch N] [--size N] [--val N] [--canvas N] [--lr LR] [--threads N]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import mixprec  # noqa: E402

CLASSES = ("background", "square", "disc", "triangle")
RECIPES = ("fp32", "bf16", "fp16")
PARITY_PP = 1.0
NMS_IOU = 0.5
MAX_DET = 100
POST_ROWS = ("torchvision FP32", "torchvision FP16", "naive FP16", "mixprec FP32 boxes", "mixprec FP16 boxes")


# ---- synthetic scenes --------------------------------------------------------


def draw_scene(size: int, seed: int) -> tuple[torch.Tensor, dict]:
    """One scene: a (3, size, size) float32 image in [0, 1] and its target
    {"boxes": (K, 4) float32 x1 y1 x2 y2 in pixels, "labels": (K,) int64}.
    A function of (size, seed) only."""
    g = torch.Generator().manual_seed(seed)

    def u(lo, hi, n=()):
        return lo + (hi - lo) * torch.rand(n, generator=g)

    ax = torch.arange(size, dtype=torch.float32) + 0.5
    yy, xx = torch.meshgrid(ax, ax, indexing="ij")
    # Background: a grey-ish gradient, a low-frequency wave and a fine texture.
    img = u(0.3, 0.6, (3, 1, 1)) + u(-0.15, 0.15, (3, 1, 1)) * (xx / size - 0.5)
    th, f, ph = u(0, math.pi), u(1, 4), u(0, 2 * math.pi)
    img = img + u(0.05, 0.12) * torch.sin(2 * math.pi * f * (xx * torch.cos(th) + yy * torch.sin(th)) / size + ph)
    img = img + 0.06 * torch.sin(xx * u(0.8, 1.6)) * torch.sin(yy * u(0.8, 1.6))
    # Class hues: red-ish squares, green-ish discs, blue-ish triangles.
    hues = torch.tensor([[0.85, 0.2, 0.2], [0.2, 0.8, 0.25], [0.25, 0.3, 0.9]])
    boxes, labels = [], []
    for _ in range(int(torch.randint(2, 6, (), generator=g))):
        cls = int(torch.randint(1, len(CLASSES), (), generator=g))
        r = float(u(0.1, 0.25)) * size  # half-size in pixels
        cx, cy = float(u(0, size)), float(u(0, size))
        if cls == 1:  # square
            mask = ((xx - cx).abs() < r) & ((yy - cy).abs() < r)
            box = [cx - r, cy - r, cx + r, cy + r]
        elif cls == 2:  # disc
            mask = (xx - cx) ** 2 + (yy - cy) ** 2 < r * r
            box = [cx - r, cy - r, cx + r, cy + r]
        else:  # triangle, rotated
            ang = float(u(0, 2 * math.pi)) + torch.tensor([0.0, 2 * math.pi / 3, 4 * math.pi / 3])
            vx, vy = cx + 1.2 * r * torch.cos(ang), cy + 1.2 * r * torch.sin(ang)
            mask = torch.ones_like(xx, dtype=torch.bool)
            for i in range(3):
                j = (i + 1) % 3
                mask &= (vx[j] - vx[i]) * (yy - vy[i]) - (vy[j] - vy[i]) * (xx - vx[i]) > 0
            box = [float(vx.min()), float(vy.min()), float(vx.max()), float(vy.max())]
        box = [min(max(v, 0.0), float(size)) for v in box]
        if box[2] - box[0] < 4 or box[3] - box[1] < 4:
            continue  # mostly outside the image
        fill = (hues[cls - 1] + u(-0.12, 0.12, (3,))).clamp(0, 1)[:, None, None]
        img = torch.where(mask, fill * (1 + 0.08 * torch.sin(xx * 0.7 + yy * 0.5)), img)
        boxes.append(box)
        labels.append(cls)
    img = (img + 0.05 * torch.randn(img.shape, generator=g)).clamp(0, 1)
    return img, {"boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
                 "labels": torch.tensor(labels, dtype=torch.int64)}


def draw_scenes(size: int, seeds) -> tuple[list, list]:
    xs, ts = zip(*(draw_scene(size, s) for s in seeds))
    return list(xs), list(ts)


VAL_SCENES = 2**40


def train_stream_seed(seed: int, i: int) -> int:
    """Scene i of training seed `seed`'s stream (pre-training, then the recipes')."""
    return 1_000_003 * (seed + 1) + i


# ---- progress -----------------------------------------------------------------


class Progress:
    """A tqdm bar per run on a terminal; a few plain lines otherwise (logs, CI)."""

    def __init__(self, name, total):
        self.name, self.total = name, total
        self.t0 = time.perf_counter()
        self.done, self.last_quarter, self.bar = 0, -1, None
        if sys.stdout.isatty():
            from tqdm import tqdm  # scripts/requirements.txt; only needed on a terminal

            self.bar = tqdm(total=total, desc=f"  {name:<20}", unit="step", file=sys.stdout, dynamic_ncols=True)

    def update(self, done, loss):
        if self.bar is not None:
            self.bar.set_postfix_str(f"loss {loss:.4f}", refresh=False)
            self.bar.update(done - self.done)
            self.done = done
            if done >= self.total:
                self.bar.close()
            return
        quarter = 4 * done // self.total
        if quarter == self.last_quarter and done != self.total:
            return
        self.last_quarter = quarter
        print(f"  {self.name:<20}{100 * done // self.total:3d}%  step {done}/{self.total}  loss {loss:.4f}"
              f"  {time.perf_counter() - self.t0:6.1f}s", flush=True)


# ---- model and training -------------------------------------------------------


def make_model(size: int, device, init_state=None):
    """The detector, with `init_state`'s weights (or a fresh random init from
    torch's global generator). Its own NMS is off (nms_thresh 1.0): eval
    returns the pre-NMS detections (score > 0.05, up to 1000 per image)."""
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn
    from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead

    model = fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=len(CLASSES), min_size=size, max_size=size,
        rpn_pre_nms_top_n_train=300, rpn_post_nms_top_n_train=100, rpn_batch_size_per_image=64,
        rpn_pre_nms_top_n_test=300, rpn_post_nms_top_n_test=100, box_batch_size_per_image=64,
        box_score_thresh=0.05, box_nms_thresh=1.0, box_detections_per_img=1000)
    # The builder takes no box head: the default one (1024 wide) is replaced.
    model.roi_heads.box_head = TwoMLPHead(256 * 7 * 7, 128)
    model.roi_heads.box_predictor = FastRCNNPredictor(128, len(CLASSES))
    if init_state is not None:
        model.load_state_dict(init_state)
    return model.to(device)


def autocast(recipe, device):
    if recipe == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if recipe == "bf16" else torch.float16)


def to_device(xs, ts, device):
    return [x.to(device) for x in xs], [{k: v.to(device) for k, v in t.items()} for t in ts]


def train_steps(model, opt, scaler, recipe, stream, steps, batch, device, bar, first=0):
    """`steps` steps on the stream's scenes [first*batch, ...). Returns
    (losses, non-finite losses, skipped optimizer steps)."""
    xs, ts = stream
    losses, nonfinite, skipped = [], 0, 0
    model.train()
    for step in range(steps):
        lo = (first + step) * batch
        x, t = to_device(xs[lo : lo + batch], ts[lo : lo + batch], device)
        opt.zero_grad(set_to_none=True)
        with autocast(recipe, device):
            loss = sum(model(x, t).values())
        finite = bool(torch.isfinite(loss))
        nonfinite += not finite
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.clip_grad_norm_(opt, max_norm=10.0)
            before = scaler.get_scale()
            scaler.step(opt)
            scaler.update()
            skipped += scaler.get_scale() < before
        elif finite:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
            opt.step()
        losses.append(float(loss.detach()))
        bar.update(step + 1, losses[-1])
    return losses, nonfinite, skipped


@torch.no_grad()
def detect(model, recipe, val, device, chunk=8):
    """Pre-NMS detections per validation scene, in the recipe's precision:
    [{"boxes", "scores", "labels"}] on the CPU, boxes in the dtype the model
    gave them (float16 / bfloat16 under autocast: torchvision decodes the box
    deltas in their dtype)."""
    model.eval()
    xs, _ = val
    out = []
    for i in range(0, len(xs), chunk):
        x = [v.to(device) for v in xs[i : i + chunk]]
        with autocast(recipe, device):
            dets = model(x)
        out += [{k: v.cpu() for k, v in d.items()} for d in dets]
    model.train()
    return out


# ---- NMS variants ---------------------------------------------------------------


def fp16_nms(boxes, scores, iou_threshold, areas_fp16=False):
    """torchvision.ops.nms on float16 boxes and scores with the arithmetic of
    torchvision's CUDA kernel for half (its CPU kernel refuses float16),
    written in torch ops: box edges and the intersection's width and height
    in FP16, the intersection, areas and IoU in FP32 (at::acc_type, since
    torchvision 0.9, pytorch/vision#3383). areas_fp16: every step in FP16,
    areas overflowing to inf above 65504 px^2 (256 x 256), as torchvision's
    kernel before 0.9 and hand-written half NMS code. Greedy, by decreasing
    FP16 score, ties in input order."""
    boxes, scores = boxes.half(), scores.half()
    order = torch.sort(scores.float(), descending=True, stable=True).indices
    x1, y1, x2, y2 = boxes[order].unbind(1)
    area = (x2 - x1) * (y2 - y1) if areas_fp16 else (x2.float() - x1.float()) * (y2 - y1).float()
    removed = torch.zeros(len(order), dtype=torch.bool)
    keep = []
    for i in range(len(order)):
        if removed[i]:
            continue
        keep.append(i)
        w = (torch.minimum(x2[i], x2[i + 1 :]) - torch.maximum(x1[i], x1[i + 1 :])).clamp(min=0)
        h = (torch.minimum(y2[i], y2[i + 1 :]) - torch.maximum(y1[i], y1[i + 1 :])).clamp(min=0)
        inter = w * h if areas_fp16 else w.float() * h.float()
        removed[i + 1 :] |= (inter / (area[i] + area[i + 1 :] - inter)).float() > iou_threshold
    return order[torch.tensor(keep, dtype=torch.int64)]


def fp16_batched_nms(boxes, scores, idxs, iou_threshold, areas_fp16=False):
    """torchvision.ops.batched_nms on float16 boxes as it runs on CUDA: up to
    100,000 box coordinates its coordinate trick in FP16 (offsets = idxs *
    (max coordinate + 1), added to the boxes in FP16: past 65504 they are
    inf), above that one fp16_nms per class."""
    boxes, scores = boxes.half(), scores.half()
    if boxes.numel() == 0:
        return torch.empty(0, dtype=torch.int64)
    if boxes.numel() > 100_000:
        keep = torch.cat([torch.nonzero(idxs == c).flatten()[fp16_nms(boxes[idxs == c], scores[idxs == c],
                                                                       iou_threshold, areas_fp16)]
                          for c in torch.unique(idxs)])
        return keep[torch.sort(scores[keep].float(), descending=True, stable=True).indices]
    one = torch.tensor(1, dtype=torch.float16)
    shifted = boxes + (idxs.to(boxes) * (boxes.max() + one))[:, None]
    return fp16_nms(shifted, scores, iou_threshold, areas_fp16)


def nms_by(how, b32, s32, idxs):
    """`how`'s class-aware NMS: (kept indices, the boxes in the dtype that
    NMS saw, for the output)."""
    import torchvision

    if how == "torchvision FP32":
        return torchvision.ops.batched_nms(b32, s32, idxs, NMS_IOU), b32
    if how in ("torchvision FP16", "naive FP16"):
        return fp16_batched_nms(b32, s32, idxs, NMS_IOU, areas_fp16=how == "naive FP16"), b32.half()
    if how == "mixprec FP32 boxes":
        return mixprec.ops.batched_nms(b32, s32, idxs, NMS_IOU), b32
    return mixprec.ops.batched_nms(b32.half(), s32.half(), idxs, NMS_IOU), b32.half()  # mixprec FP16 boxes


def top(keep, scores):
    """The first MAX_DET of the kept indices by decreasing FP32 score, ties
    by index: scores tie often (the full run's 8251 detections of seed 0
    had 604 distinct scores within their images: many RoIs get the same
    logits from the little-trained head, with different boxes), and
    torchvision's batched_nms orders ties arbitrarily on its per-class path
    (an unstable sort), which would make the top MAX_DET depend on it."""
    keep = keep.sort().values
    return keep[torch.sort(scores.float()[keep], descending=True, stable=True).indices][:MAX_DET]


def postprocess(dets, how, scale, one_call=False):
    """`how`'s NMS on the detections with boxes scaled by `scale`, top
    MAX_DET per image (see top); the kept boxes scaled back (in FP32) for the metrics.
    Per image (as torchvision's detectors do), or `one_call`: one NMS call
    for all images, idxs = image * len(CLASSES) + label (as batched
    post-processing code does). Returns (predictions, kept indices per
    image)."""
    if one_call:
        sizes = [len(d["boxes"]) for d in dets]
        img = torch.repeat_interleave(torch.arange(len(dets)), torch.tensor(sizes))
        b32 = torch.cat([d["boxes"].float() for d in dets]) * scale
        s32, lab = torch.cat([d["scores"].float() for d in dets]), torch.cat([d["labels"] for d in dets])
        keep_all, out_all = nms_by(how, b32, s32, img * len(CLASSES) + lab)
        starts = [0] + torch.tensor(sizes).cumsum(0).tolist()
        keeps = [top(keep_all[img[keep_all] == i] - starts[i], d["scores"]) for i, d in enumerate(dets)]
        outs = [out_all[starts[i] : starts[i + 1]] for i in range(len(dets))]
    else:
        keeps, outs = [], []
        for d in dets:
            keep, out = nms_by(how, d["boxes"].float() * scale, d["scores"].float(), d["labels"])
            keeps.append(top(keep, d["scores"]))
            outs.append(out)
    preds = [{"boxes": o[k].float() / scale, "scores": d["scores"].float()[k], "labels": d["labels"][k]}
             for d, k, o in zip(dets, keeps, outs)]
    return preds, keeps


# ---- metrics --------------------------------------------------------------------


def _matches(preds, targets, score_thresh):
    """(true positives, detections, ground-truth boxes) over the images: the
    detections with score >= score_thresh, by decreasing score, each matched
    to the unmatched same-class ground-truth box of highest IoU if that IoU
    is >= 0.5."""
    import torchvision

    tp = n_det = n_gt = 0
    for p, t in zip(preds, targets):
        n_gt += len(t["boxes"])
        sel = p["scores"] >= score_thresh
        pb, pl, ps = p["boxes"][sel], p["labels"][sel], p["scores"][sel]
        n_det += len(pb)
        if len(pb) == 0 or len(t["boxes"]) == 0:
            continue
        iou = torchvision.ops.box_iou(pb, t["boxes"])
        iou[pl[:, None] != t["labels"][None, :]] = -1
        used = torch.zeros(len(t["boxes"]), dtype=torch.bool)
        for i in torch.argsort(ps, descending=True, stable=True).tolist():
            cand = iou[i].clone()
            cand[used] = -1
            j = int(cand.argmax())
            if cand[j] >= 0.5:
                used[j] = True
                tp += 1
    return tp, n_det, n_gt


def metrics(preds, targets, score_thresh):
    """mAP@0.5 and mAP@[.5:.95] (torchmetrics, pycocotools backend);
    recall: the share of ground-truth boxes matched at IoU >= 0.5 by the
    (at most MAX_DET) kept detections of any score (COCO's recall at IoU 0.5,
    what mAP@0.5's curve ends at); precision and recall of the detections
    with score >= score_thresh (see _matches)."""
    from torchmetrics.detection import MeanAveragePrecision

    m = MeanAveragePrecision(iou_type="bbox", backend="pycocotools")
    m.update(preds, targets)
    r = m.compute()
    tp_all, _, n_gt = _matches(preds, targets, -math.inf)
    tp, n_det, _ = _matches(preds, targets, score_thresh)
    return {"map50": float(r["map_50"]), "map": float(r["map"]), "recall": tp_all / n_gt if n_gt else 0.0,
            "precision_t": tp / n_det if n_det else 0.0, "recall_t": tp / n_gt if n_gt else 0.0}


def duplicates(preds):
    """Kept same-class pairs whose FP32 IoU exceeds NMS_IOU."""
    import torchvision

    n = 0
    for p in preds:
        iou = torchvision.ops.box_iou(p["boxes"], p["boxes"])
        same = p["labels"][:, None] == p["labels"][None, :]
        n += int(((iou > NMS_IOU) & same).triu(1).sum())
    return n


def post_table(dets, targets, scale, one_call, score_thresh):
    rows, ref_kept = [], None
    for how in POST_ROWS:
        t0 = time.perf_counter()
        preds, kept = postprocess(dets, how, scale, one_call)
        secs = time.perf_counter() - t0
        m = metrics(preds, targets, score_thresh)
        if ref_kept is None:
            ref_kept = kept
        diff = sum(len(set(a.tolist()) ^ set(b.tolist())) for a, b in zip(kept, ref_kept))
        same = all(torch.equal(a, b) for a, b in zip(kept, ref_kept))
        rows.append({"how": how, "scale": scale, **m, "kept": sum(len(k) for k in kept), "diff": diff,
                     "identical": same, "duplicates": duplicates(preds), "seconds": secs, "keep": kept})
    for r in rows:
        r["map50_pp"] = 100 * (r["map50"] - rows[0]["map50"])
    return rows


# ---- main ----------------------------------------------------------------------


def positive_int(s):
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}")
    return v


def nonneg_int(s):
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {s!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {s!r}")
    return v


def positive_float(s):
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {s!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {s!r}")
    return v


def unit_float(s):
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {s!r}") from None
    if not 0 <= v <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {s!r}")
    return v


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 64x64, batch 2, 4 FP32 pre-training steps, 1 step per recipe, 1 seed, "
                         "4 validation scenes (< 30 s)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--seeds", type=positive_int, default=None, help="paired seeds (default 2, quick 1)")
    ap.add_argument("--pretrain", type=nonneg_int, default=None,
                    help="FP32 pre-training steps per seed, shared by the recipes (default 240, quick 4)")
    ap.add_argument("--steps", type=positive_int, default=None,
                    help="training steps of each recipe after the pre-training (default 12, quick 1)")
    ap.add_argument("--batch", type=positive_int, default=None, help="scenes per step (default 4, quick 2)")
    ap.add_argument("--size", type=positive_int, default=None,
                    help="scene side in pixels, a multiple of 32, at least 64 (default 128, quick 64)")
    ap.add_argument("--val", type=positive_int, default=None, help="validation scenes (default 32, quick 4)")
    ap.add_argument("--canvas", type=positive_int, default=4096,
                    help="side of the canvas the post-processing comparison is repeated at (default 4096)")
    ap.add_argument("--score-thresh", type=unit_float, default=0.1,
                    help="score a detection needs to count for the P / R columns (default 0.1)")
    ap.add_argument("--lr", type=positive_float, default=2e-3, help="AdamW learning rate (default 2e-3)")
    ap.add_argument("--threads", type=positive_int, default=None,
                    help="torch CPU threads while it runs (default 1 on the CPU: on a 2-core machine shared with "
                         "other jobs it is several times faster than 2)")
    args = ap.parse_args(argv)
    q = args.quick
    args.seeds = args.seeds or (1 if q else 2)
    args.pretrain = args.pretrain if args.pretrain is not None else (4 if q else 240)
    args.steps = args.steps or (1 if q else 12)
    args.batch = args.batch or (2 if q else 4)
    args.size = args.size or (64 if q else 128)
    args.val = args.val or (4 if q else 32)
    if args.size % 32 or args.size < 64:
        ap.error(f"--size must be a multiple of 32 and at least 64 (the backbone downsamples 32x), got {args.size}")
    if args.threads is None and args.device == "cpu":
        args.threads = 1
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda asked for, but torch sees no CUDA device")
    if args.device == "cuda" and not mixprec.cuda_ops_loaded():
        ap.error("--device cuda asked for, but libmixprec_cuda.so is not loaded (build it with nvcc)")
    return args


def main(argv=None):
    args = parse_args(argv)
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        return run(args)
    finally:
        torch.set_num_threads(threads)


def run(args):
    device = torch.device(args.device)
    t_start = time.perf_counter()
    print(f"Detection: torchvision fasterrcnn_mobilenet_v3_large_320_fpn (random init, 128-wide box head), "
          f"{len(CLASSES) - 1} classes, {args.size}x{args.size} synthetic scenes, {args.seeds} paired "
          f"seed{'s' if args.seeds > 1 else ''}, device {device}, {torch.get_num_threads()} threads")
    print(f"batch {args.batch}; {args.pretrain} FP32 pre-training steps per seed, then {args.steps} steps per recipe, "
          f"AdamW lr {args.lr:g}; {args.val} validation scenes; NMS per class at IoU {NMS_IOU}, top {MAX_DET}")
    val = draw_scenes(args.size, range(VAL_SCENES, VAL_SCENES + args.val))
    per_seed = {r: [] for r in RECIPES}
    dets0 = None
    for seed in range(args.seeds):
        torch.manual_seed(seed)
        model = make_model(args.size, device)
        n = (args.pretrain + args.steps) * args.batch
        stream = draw_scenes(args.size, (train_stream_seed(seed, i) for i in range(n)))
        if args.pretrain:
            opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
            train_steps(model, opt, None, "fp32", stream, args.pretrain, args.batch, device,
                        Progress(f"pretrain fp32 s{seed}", args.pretrain))
        init_state = copy.deepcopy(model.state_dict())
        for recipe in RECIPES:
            torch.manual_seed(10_000 + seed)  # the RPN / RoI samplers' draws, the same for every recipe
            model = make_model(args.size, device, init_state)
            opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
            scaler = mixprec.amp.GradScaler(device.type) if recipe == "fp16" else None
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            losses, nonfinite, skipped = train_steps(model, opt, scaler, recipe, stream, args.steps, args.batch,
                                                     device, Progress(f"{recipe} s{seed}", args.steps),
                                                     first=args.pretrain)
            if device.type == "cuda":
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - t0
            dets = detect(model, recipe, val, device)
            preds, _ = postprocess(dets, "mixprec FP32 boxes", 1.0)
            m = metrics(preds, val[1], args.score_thresh)
            nonfinite_out = sum(int((~torch.isfinite(d["boxes"].float())).sum() + (~torch.isfinite(d["scores"])).sum())
                                for d in dets)
            per_seed[recipe].append({**m, "seed": seed, "nonfinite": nonfinite, "skipped": skipped,
                                     "nonfinite_out": nonfinite_out, "steps_per_s": args.steps / elapsed,
                                     "final_loss": sum(losses[-3:]) / len(losses[-3:]),
                                     "box_dtype": str(dets[0]["boxes"].dtype).replace("torch.", "")})
            if recipe == "fp32" and seed == 0:
                dets0 = dets

    fp32 = per_seed["fp32"]
    rows = []
    for recipe in RECIPES:
        runs = per_seed[recipe]
        row = {"recipe": recipe}
        for k in ("map50", "map", "recall", "precision_t", "recall_t", "steps_per_s", "final_loss"):
            row[k] = sum(r[k] for r in runs) / len(runs)
        for k in ("map50", "recall", "precision_t"):
            row[f"{k}_pp"] = [100 * (r[k] - f[k]) for r, f in zip(runs, fp32)]
        row["map50s"] = [r["map50"] for r in runs]
        row["nonfinite"] = sum(r["nonfinite"] + r["nonfinite_out"] for r in runs)
        row["skipped"] = sum(r["skipped"] for r in runs)
        row["box_dtype"] = runs[0]["box_dtype"]
        row["within"] = all(abs(d) <= PARITY_PP + 1e-9 for k in ("map50_pp", "recall_pp") for d in row[k])
        rows.append(row)

    print(f"\n(a) parity on {args.val} held-out scenes, mean over {args.seeds} paired seed(s); recall: IoU 0.5, top "
          f"{MAX_DET} kept detections; P / R @{args.score_thresh:g}: precision / recall of the detections with score "
          f">= {args.score_thresh:g}; per-seed differences to fp32 in pp; within {PARITY_PP:g} pp: mAP@0.5 and recall, "
          f"every seed; non-finite: losses + output boxes/scores")
    print(f"| recipe | mAP@0.5 | mAP@[.5:.95] | recall | P @{args.score_thresh:g} | R @{args.score_thresh:g} "
          f"| mAP@0.5 vs fp32 (pp) | recall vs fp32 (pp) | P vs fp32 (pp) | within {PARITY_PP:g} pp "
          f"| non-finite | skipped steps | steps/s | final loss | box dtype |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        base = r["recipe"] == "fp32"

        def per(k):
            return "-" if base else " ".join(f"{d:+.2f}" for d in r[k])

        print(f"| {r['recipe']} | {100 * r['map50']:.2f}% | {100 * r['map']:.2f}% | {100 * r['recall']:.2f}% "
              f"| {100 * r['precision_t']:.2f}% | {100 * r['recall_t']:.2f}% | {per('map50_pp')} | {per('recall_pp')} "
              f"| {per('precision_t_pp')} "
              f"| {'-' if base else ('yes' if r['within'] else 'NO')} | {r['nonfinite']} | {r['skipped']} "
              f"| {r['steps_per_s']:.3f} | {r['final_loss']:.4f} | {r['box_dtype']} |")
    f_maps = rows[0]["map50s"]
    if len(f_maps) > 1:
        print(f"FP32 alone, seed to seed: mAP@0.5 {', '.join(f'{100 * m:.2f}' for m in f_maps)} "
              f"(spread {100 * (max(f_maps) - min(f_maps)):.2f} pp)")

    post = []
    for scale, one_call, label in ((1.0, False, f"{args.size} px, per image"),
                                   (args.canvas / args.size, False, f"{args.canvas} px canvas, per image"),
                                   (1.0, True, f"{args.size} px, one call"),
                                   (args.canvas / args.size, True, f"{args.canvas} px canvas, one call")):
        post.append((label, post_table(dets0, val[1], scale, one_call, args.score_thresh)))
    n_pre = sum(len(d["boxes"]) for d in dets0)
    print(f"\n(b) post-processing of the same detections (seed 0's fp32 model, {n_pre} pre-NMS detections with "
          f"score > 0.05 on {args.val} scenes); kept-set difference: detections kept by one and not by "
          f"torchvision FP32; duplicates: kept same-class pairs with FP32 IoU > {NMS_IOU}")
    print("| coordinates | NMS | kept | kept-set diff | identical to FP32 | duplicates | mAP@0.5 | vs FP32 (pp) "
          f"| mAP@[.5:.95] | recall | P @{args.score_thresh:g} | R @{args.score_thresh:g} |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for label, prow in post:
        for r in prow:
            print(f"| {label} | {r['how']} | {r['kept']} | {r['diff']} | {'yes' if r['identical'] else 'no'} "
                  f"| {r['duplicates']} | {100 * r['map50']:.2f}% | {r['map50_pp']:+.2f} | {100 * r['map']:.2f}% "
                  f"| {100 * r['recall']:.2f}% | {100 * r['precision_t']:.2f}% | {100 * r['recall_t']:.2f}% |")
    if device.type == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        print("CPU note: without AVX-512 torch runs BF16/FP16 convolutions and matmuls in slow reference paths,\n"
              "so bf16 and fp16 are slower than fp32 here; steps/s measure torch's kernels on a shared CPU (noisy).")
    print(f"total time {time.perf_counter() - t_start:.0f} s")
    return {"parity": rows, "post": post, "dets": dets0, "val_targets": val[1], "args": vars(args)}


if __name__ == "__main__":
    main()
