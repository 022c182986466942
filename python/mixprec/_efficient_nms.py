"""Batched detection post-processing: ``efficient_nms``, the job of
TensorRT's EfficientNMS plugin for eager torch, ``torch.compile`` and
``torch.export``, with its fake kernel.

One call handles a whole batch of detector outputs, ``boxes`` (B, N, 4)
(shared by the classes) or (B, N, C, 4) (class-specific, as Faster R-CNN's
box head) and ``scores`` (B, N, C), in float32, float16 or bfloat16. Per
image b, exactly what this loop computes (with the IoU in float32)::

    s = scores[b].flatten()                          # index j = n * C + c
    cand = ((s > score_threshold) & ~s.isnan()).nonzero()[:, 0]
    cand = cand[s[cand].sort(descending=True, stable=True).indices]
    cand = cand[:pre_nms_top_k]
    n, c = cand // C, cand % C
    bx = boxes[b, n] if boxes.dim() == 3 else boxes[b, n, c]
    keep = torchvision.ops.batched_nms(bx, s[cand], c if class-aware else 0 * c, iou_threshold)
    keep = keep.sort().values[:max_detections]      # kept candidates, in that order

Choices (documented, tested):
- ``score > score_threshold`` (strict, as torchvision's
  ``postprocess_detections``); ``score_threshold=None``: no threshold. A NaN
  score is never a candidate.
- Ties: equal scores are ordered by the flat index ``n * C + c`` (a stable
  sort), on the CPU and on CUDA alike.
- ``pre_nms_top_k``: the first that many candidates of an image enter the
  NMS (``None``: all; on CUDA at most 16384 may, so set it when N * C is
  larger; EfficientNMS itself takes 4096).
- ``class_agnostic=False``: a box only suppresses boxes of its class
  (``batched_nms`` by class id); ``True``: one NMS over all (box, class)
  pairs, as EfficientNMS's ``class_agnostic`` (with shared boxes a box's
  lower-scored classes are then suppressed by its best one).
- IoU > ``iou_threshold`` suppresses (strict, torchvision's rule; TensorRT's
  plugin uses >=), computed in float32 with torchvision's operations, so the
  decisions equal ``torchvision.ops.nms`` on the float32-widened boxes.
- Outputs (fixed shapes, K = ``max_detections`` >= 1), as a ``Detections``
  named tuple: ``boxes`` (B, K, 4) in the boxes' dtype and ``scores`` (B, K)
  in the scores' dtype (the input values, bit for bit), ``classes`` (B, K)
  and ``indices`` (B, K) int64 (the class c and the box index n, as torch
  indexing wants; EfficientNMS gives int32), ``counts`` (B,) int64. Entries
  past ``counts[b]`` hold boxes 0, scores 0, classes -1, indices -1.
- Autograd: the output boxes and scores are input values gathered, so their
  gradients scatter-add back into ``boxes`` and ``scores`` (a box kept for
  two classes gets both); no autocast rule: the op computes in float32
  whatever the input dtype.
- Layouts: ``boxes`` and ``scores`` are read in place whatever their
  strides (no copy). The raw head of a YOLO model, ``(B, 4 + C, N)``
  channels-first, goes in as one tensor, ``efficient_nms(head,
  box_coding="center")``: ``head[:, :4]`` are the boxes, ``head[:, 4:]`` the
  scores. ``box_coding="center"`` (TensorRT's ``box_coding=1``) reads boxes as
  ``cx, cy, w, h`` and decodes each candidate's box in float32 as
  ultralytics' ``xywh2xyxy`` (``cx - w / 2``, ...); the NMS then runs on
  those corners and the output boxes are them, rounded to the boxes' dtype.
- CUDA: the whole batch in one fixed set of launches, nothing copied to the
  host, no synchronisation: capturable in a CUDA graph. Written to match the
  CPU bit for bit; not yet run on a GPU.
"""

from __future__ import annotations

import math
import operator
from typing import NamedTuple

import torch

from ._args import as_real
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


def _int_arg(name, value):
    """An integer argument as torch's argument parser takes it (an int, a
    numpy or 0-dim integer tensor), plus integral floats; a bool, NaN, inf
    or 1.5 is a TypeError naming the argument."""
    op = "mixprec.ops.efficient_nms"
    if isinstance(value, bool):
        raise TypeError(f"{op}: {name} must be an int, not bool ({value})")
    if isinstance(value, float):
        if not math.isfinite(value) or value != math.floor(value):
            raise TypeError(f"{op}: {name} must be an integer, got {value!r}")
        return int(value)
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{op}: {name} must be an int, not {type(value).__name__}") from None


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
    """Batched post-processing of a detector's outputs (TensorRT's
    EfficientNMS): per image, candidates (box, class) with score >
    ``score_threshold``, the best ``pre_nms_top_k`` of them, class-aware (or
    ``class_agnostic``) NMS at ``iou_threshold`` with the IoU in float32, and
    the first ``max_detections`` survivors by decreasing score.

    ``boxes``: (B, N, 4) or (B, N, C, 4); ``scores``: (B, N, C); any strides.
    ``scores=None``: ``boxes`` is a YOLO head (B, 4 + C, N), channels first.
    ``box_coding``: ``"corner"`` (x1, y1, x2, y2) or ``"center"`` (cx, cy, w,
    h). Returns :class:`Detections` ``(boxes (B, K, 4), scores (B, K),
    classes (B, K), indices (B, K), counts (B,))`` with fixed shapes (see the
    module docstring for the exact semantics and the padding)."""
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
    max_detections = _int_arg("max_detections", max_detections)
    top_k = -1 if pre_nms_top_k is None else _int_arg("pre_nms_top_k", pre_nms_top_k)
    coding = _CODINGS[box_coding]
    _check(boxes, scores, iou_threshold, score_threshold, max_detections, top_k, coding)
    out = torch.ops.mixprec.efficient_nms(
        boxes, scores, iou_threshold, score_threshold, max_detections, top_k, bool(class_agnostic), coding
    )
    return Detections(*out)


__all__ = ["efficient_nms", "Detections"]
