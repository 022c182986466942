"""``mixprec.ops.efficient_nms`` (TensorRT's EfficientNMS plugin as one torch op
for eager, ``torch.compile`` and ``torch.export``), its fake kernel and its
autograd. The contract is :func:`efficient_nms`'s docstring (the C header
``c_ops/include/mixprec/efficient_nms.h`` points here).

[note: efficient_nms choices] Where TensorRT's plugin and torchvision differ,
torchvision wins: IoU > threshold suppresses (the plugin: >=), score >
threshold is a candidate (``postprocess_detections``), ties go to the lower
flat index ``n * C + c`` (a stable sort, on CPU and CUDA), and classes /
indices are int64 (the plugin: int32) because torch indexes with int64. The
class-agnostic NMS runs over (box, class) pairs as the plugin's, so with
shared boxes a box's lower-scored classes are suppressed by its best one.

[note: efficient_nms on CUDA] The whole batch in one fixed set of launches,
nothing copied to the host, no synchronisation (capturable in a CUDA graph);
at most :data:`CUDA_MAX_CANDIDATES` candidates per image enter its NMS.
Written to match the CPU bit for bit; not yet run on a GPU.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._args import as_bool, as_int, as_real
from ._registration import _refuse_sparse
from ._library import FLOAT_DTYPES as _FLOAT

_refuse_sparse("efficient_nms")

#: Most candidates per image the CUDA kernel takes (MIXPREC_CUDA_DETECT_MAX_CANDIDATES).
CUDA_MAX_CANDIDATES = 16384


class Detections(NamedTuple):
    """What :func:`efficient_nms` returns (fixed shapes, padded past ``counts``)."""

    boxes: torch.Tensor  #: (B, K, 4), the boxes' dtype; 0 past counts
    scores: torch.Tensor  #: (B, K), the scores' dtype; 0 past counts
    classes: torch.Tensor  #: (B, K) int64 class ids; -1 past counts
    indices: torch.Tensor  #: (B, K) int64 box indices n into N; -1 past counts
    counts: torch.Tensor  #: (B,) int64 detections per image


_CODINGS = {"corner": 0, "center": 1}


def _check(boxes, scores, iou_threshold, score_threshold, max_detections, pre_nms_top_k, box_coding=0):
    """The checks of the real kernels (shim/efficient_nms_op.h), so traced and meta
    calls fail the same way; the public function runs them before
    ``.contiguous()``. The messages' lambdas close over plain values only
    (dynamo refuses tensors there)."""
    op = "efficient_nms"
    bdev, sdev = boxes.device, scores.device
    bshape, sshape = tuple(boxes.shape), tuple(scores.shape)
    for name, layout, dtype in (("boxes", boxes.layout, boxes.dtype), ("scores", scores.layout, scores.dtype)):
        torch._check(layout == torch.strided, lambda: f"mixprec::{op}: {name} must be a defined strided tensor")
        torch._check(
            dtype in _FLOAT, lambda: f"mixprec::{op}: {name} must be float32, float16 or bfloat16, got {dtype}"
        )
    torch._check(sdev == bdev, lambda: f"mixprec::{op}: scores is on {sdev} but boxes is on {bdev}")
    torch._check(len(sshape) == 3, lambda: f"mixprec::{op}: scores must have shape (B, N, C), got {len(sshape)} dimensions")
    shared = len(bshape) == 3 and bshape[2] == 4
    per_class = len(bshape) == 4 and bshape[3] == 4
    torch._check(shared or per_class, lambda: f"mixprec::{op}: boxes must have shape (B, N, 4) or (B, N, C, 4), got {bshape}")
    b, n, c = sshape
    torch._check(
        bshape[0] == b and bshape[1] == n and (shared or bshape[2] == c),
        lambda: f"mixprec::{op}: boxes has shape {bshape} but scores has shape {sshape}",
    )
    torch._check(n * c <= 2**31 - 1, lambda: f"mixprec::{op}: N * C exceeds 2^31 - 1 candidates per image")
    torch._check(iou_threshold >= 0, lambda: f"mixprec::{op}: iou_threshold must be >= 0 and not NaN, got {iou_threshold}")
    torch._check(
        score_threshold is None or score_threshold == score_threshold,
        lambda: f"mixprec::{op}: score_threshold must not be NaN",
    )
    torch._check(
        1 <= max_detections <= 2**31 - 1,
        lambda: f"mixprec::{op}: max_detections must be in 1 .. 2^31 - 1, got {max_detections}",
    )
    torch._check(pre_nms_top_k != 0, lambda: f"mixprec::{op}: pre_nms_top_k must be >= 1, or -1 for all candidates, got 0")
    torch._check(
        box_coding in (0, 1),
        lambda: f"mixprec::{op}: box_coding must be 0 (x1, y1, x2, y2) or 1 (cx, cy, w, h), got {box_coding}",
    )


@torch.library.register_fake("mixprec::efficient_nms")
def _efficient_nms_fake(
    boxes,
    scores,
    iou_threshold=0.5,
    score_threshold=None,
    max_detections=100,
    pre_nms_top_k=-1,
    class_agnostic=False,
    box_coding=0,
):
    _check(boxes, scores, iou_threshold, score_threshold, max_detections, pre_nms_top_k, box_coding)
    b, k = scores.shape[0], max_detections
    return (
        boxes.new_empty((b, k, 4)),
        scores.new_empty((b, k)),
        boxes.new_empty((b, k), dtype=torch.int64),
        boxes.new_empty((b, k), dtype=torch.int64),
        boxes.new_empty((b,), dtype=torch.int64),
    )


def _setup_context(ctx, inputs, output):
    boxes, scores = inputs[0], inputs[1]
    ctx.box_shape, ctx.score_shape = boxes.shape, scores.shape
    ctx.center = len(inputs) > 7 and inputs[7] == 1
    ctx.save_for_backward(output[2], output[3])


def _backward(ctx, g_boxes, g_scores, _g_classes, _g_indices, _g_counts):
    """The output boxes and scores are gathered input values: their gradients
    scatter-add back to the rows they came from (padding adds nothing). With
    centre coding an output box is (cx - w/2, cy - h/2, cx + w/2, cy + h/2):
    its gradient maps back through that."""
    classes, indices = ctx.saved_tensors
    bsz, k = indices.shape
    valid = indices >= 0
    img = torch.arange(bsz, device=indices.device)[:, None].expand(bsz, k)
    n, c = indices.clamp(min=0), classes.clamp(min=0)
    grad_boxes = grad_scores = None
    if g_boxes is not None and ctx.needs_input_grad[0]:
        g = torch.where(valid[..., None], g_boxes, torch.zeros_like(g_boxes))
        if ctx.center:
            g = torch.cat((g[..., :2] + g[..., 2:], 0.5 * (g[..., 2:] - g[..., :2])), -1)
        grad_boxes = g_boxes.new_zeros(ctx.box_shape)
        where = (img, n) if len(ctx.box_shape) == 3 else (img, n, c)
        grad_boxes = grad_boxes.index_put(where, g, accumulate=True)
    if g_scores is not None and ctx.needs_input_grad[1]:
        g = torch.where(valid, g_scores, torch.zeros_like(g_scores))
        grad_scores = g_scores.new_zeros(ctx.score_shape).index_put((img, n, c), g, accumulate=True)
    return grad_boxes, grad_scores, None, None, None, None, None, None


torch.library.register_autograd("mixprec::efficient_nms", _backward, setup_context=_setup_context)


def efficient_nms(
    boxes: torch.Tensor,
    scores: torch.Tensor | None = None,
    *,
    iou_threshold: float = 0.5,
    score_threshold: float | None = None,
    max_detections: int = 100,
    pre_nms_top_k: int | None = None,
    class_agnostic: bool = False,
    box_coding: str = "corner",
) -> Detections:
    """Batched post-processing of a detector's outputs. Per image b the
    result is exactly this loop's (the IoU in float32)::

        s = scores[b].flatten()                          # index j = n * C + c
        cand = ((s > score_threshold) & ~s.isnan()).nonzero()[:, 0]
        cand = cand[s[cand].sort(descending=True, stable=True).indices]
        cand = cand[:pre_nms_top_k]
        n, c = cand // C, cand % C
        bx = boxes[b, n] if boxes.dim() == 3 else boxes[b, n, c]
        keep = torchvision.ops.batched_nms(bx, s[cand], 0 * c if class_agnostic else c, iou_threshold)
        keep = keep.sort().values[:max_detections]      # kept candidates, in that order

    ``boxes``: (B, N, 4) shared by the classes, or (B, N, C, 4)
    class-specific; ``scores``: (B, N, C); float32, float16 or bfloat16, any
    strides (read in place). ``scores=None``: ``boxes`` is a YOLO head
    (B, 4 + C, N), channels first (``head[:, :4]`` boxes, ``head[:, 4:]``
    scores). ``box_coding``: ``"corner"`` (x1, y1, x2, y2) or ``"center"``
    (cx, cy, w, h; each candidate decoded in float32 as ultralytics'
    ``xywh2xyxy``, and the output boxes are those corners).
    ``score_threshold=None``: no threshold (a NaN score is never a
    candidate); ``pre_nms_top_k=None``: all candidates (see
    [note: efficient_nms on CUDA] for the CUDA limit).

    Returns :class:`Detections`, fixed shapes with K = ``max_detections`` >= 1:
    ``boxes`` (B, K, 4) and ``scores`` (B, K) in their input dtypes (the
    input values bit for bit), ``classes`` and ``indices`` (B, K) int64 (c and
    n), ``counts`` (B,) int64; past ``counts[b]``: boxes and scores 0,
    classes and indices -1. Gradients of the output boxes and scores
    scatter-add back into the inputs; no autocast rule (float32 inside
    whatever the dtype). Integer arguments go through ``_args.as_int``.
    Rationale: [note: efficient_nms choices]."""
    op = "mixprec.ops.efficient_nms"
    if box_coding not in _CODINGS:
        raise ValueError(f"{op}: box_coding must be 'corner' or 'center', got {box_coding!r}")
    if scores is None:
        if not isinstance(boxes, torch.Tensor) or boxes.dim() != 3 or boxes.shape[1] < 5:
            shape = tuple(boxes.shape) if isinstance(boxes, torch.Tensor) else type(boxes).__name__
            raise ValueError(f"{op}: without scores, boxes must be a head (B, 4 + C, N) with C >= 1, got {shape}")
        boxes, scores = boxes[:, :4].transpose(1, 2), boxes[:, 4:].transpose(1, 2)
    iou_threshold = as_real(op, "iou_threshold", iou_threshold)
    score_threshold = None if score_threshold is None else as_real(op, "score_threshold", score_threshold)
    max_detections = as_int(op, "max_detections", max_detections)
    top_k = -1 if pre_nms_top_k is None else as_int(op, "pre_nms_top_k", pre_nms_top_k)
    class_agnostic = as_bool(op, "class_agnostic", class_agnostic)
    coding = _CODINGS[box_coding]
    _check(boxes, scores, iou_threshold, score_threshold, max_detections, top_k, coding)
    out = torch.ops.mixprec.efficient_nms(
        boxes, scores, iou_threshold, score_threshold, max_detections, top_k, class_agnostic, coding
    )
    return Detections(*out)


__all__ = ["efficient_nms", "Detections"]
