"""FP32-safe NMS: ``nms`` / ``batched_nms`` with torchvision's signatures, a
fixed-size ``nms_padded``, their fake kernels, and ``patch_torchvision``.

Semantics are torchvision's (boxes ``x1, y1, x2, y2``; area without +1; a box
is suppressed when its IoU with a kept box is strictly greater than
``iou_threshold``; int64 indices by decreasing score, stable for ties), with
the IoU always computed in float32: float16 and bfloat16 boxes never overflow
(torchvision's FP16 areas do above 256 x 256), and ``batched_nms`` compares
class ids instead of offsetting coordinates by class (which overflows or
rounds in FP16). For float32 boxes the result is identical to
``torchvision.ops.nms`` on the CPU.

Choices (documented, tested):
- dtypes: boxes and scores float32, float16 or bfloat16 (they may differ);
  float64 is refused (use torchvision for it; ``patch_torchvision`` does).
- NaN scores rank above every number, as in ``torch.sort`` (torchvision's CPU
  kernel does the same), unless ``score_threshold`` is given (``NaN > t`` is
  false, so they are dropped). NaN coordinates give torchvision's decisions.
- ``iou_threshold`` must be >= 0 and not NaN (RuntimeError otherwise); above 1
  nothing is suppressed.
- ``score_threshold``: only boxes with ``score > score_threshold`` take part.
  ``max_output``: at most that many indices, the first ones of the full result.
- Autocast: the ops are not registered for autocast, so ``torch.autocast``
  leaves their inputs alone; they compute in float32 whatever the input.
- On CUDA, ``nms``/``batched_nms`` copy one int64 (the kept count) to the host
  to size their output; ``nms_padded`` copies nothing (CUDA-graph capturable).
"""

from __future__ import annotations

import torch

from ._amp import _refuse_sparse
from ._library import FLOAT_DTYPES as _FLOAT
from ._library import handles as _handles

# A sparse argument: a mixprec error naming it, not the dispatcher's page.
for _name in ("nms", "batched_nms", "nms_padded"):
    _refuse_sparse(_name)


def _check(op, boxes, scores, idxs, iou_threshold, score_threshold):
    """The checks of the real kernels (shim/nms_op.h), so traced and meta
    calls fail the same way; the public functions also run them before
    ``.contiguous()``, which would otherwise copy (or fail to allocate) a
    huge expanded tensor, or densify a sparse one, before any check."""
    for name, t in (("boxes", boxes), ("scores", scores), ("idxs", idxs)):
        if t is not None:
            torch._check(
                t.layout == torch.strided, lambda: f"mixprec::{op}: {name} must be a defined strided tensor"
            )
    torch._check(boxes.dim() == 2 and boxes.shape[1] == 4, lambda: f"mixprec::{op}: boxes must have shape (N, 4)")
    torch._check(
        boxes.shape[0] <= 2**31 - 1,
        lambda: f"mixprec::{op}: boxes has {boxes.shape[0]} rows; at most 2^31 - 1 are supported",
    )
    torch._check(boxes.dtype in _FLOAT, lambda: f"mixprec::{op}: boxes must be float32, float16 or bfloat16, got {boxes.dtype}")
    torch._check(scores.dtype in _FLOAT, lambda: f"mixprec::{op}: scores must be float32, float16 or bfloat16, got {scores.dtype}")
    torch._check(
        scores.dim() == 1 and scores.shape[0] == boxes.shape[0],
        lambda: f"mixprec::{op}: scores must have shape (N,) with N = boxes.size(0)",
    )
    torch._check(scores.device == boxes.device, lambda: f"mixprec::{op}: scores is on {scores.device} but boxes is on {boxes.device}")
    if idxs is not None:
        torch._check(idxs.dtype in (torch.int64, torch.int32), lambda: f"mixprec::{op}: idxs must be int64 or int32, got {idxs.dtype}")
        torch._check(
            idxs.dim() == 1 and idxs.shape[0] == boxes.shape[0],
            lambda: f"mixprec::{op}: idxs must have shape (N,) with N = boxes.size(0)",
        )
        torch._check(idxs.device == boxes.device, lambda: f"mixprec::{op}: idxs is on {idxs.device} but boxes is on {boxes.device}")
    torch._check(iou_threshold >= 0, lambda: f"mixprec::{op}: iou_threshold must be >= 0 and not NaN, got {iou_threshold}")
    torch._check(
        score_threshold is None or score_threshold == score_threshold,
        lambda: f"mixprec::{op}: score_threshold must not be NaN",
    )


def _capacity(n, max_output):
    return n if max_output < 0 else min(n, max_output)


def _dynamic_keep(boxes, max_output):
    n = torch.library.get_ctx().new_dynamic_size()
    torch._check(n <= boxes.shape[0])
    if max_output >= 0:
        torch._check(n <= max_output)
    return boxes.new_empty((n,), dtype=torch.int64)


@torch.library.register_fake("mixprec::nms")
def _nms_fake(boxes, scores, iou_threshold, score_threshold=None, max_output=-1):
    _check("nms", boxes, scores, None, iou_threshold, score_threshold)
    return _dynamic_keep(boxes, max_output)


@torch.library.register_fake("mixprec::batched_nms")
def _batched_nms_fake(boxes, scores, idxs, iou_threshold, score_threshold=None, max_output=-1):
    _check("batched_nms", boxes, scores, idxs, iou_threshold, score_threshold)
    return _dynamic_keep(boxes, max_output)


@torch.library.register_fake("mixprec::nms_padded")
def _nms_padded_fake(boxes, scores, idxs, iou_threshold, score_threshold=None, max_output=-1):
    _check("nms_padded", boxes, scores, idxs, iou_threshold, score_threshold)
    cap = _capacity(boxes.shape[0], max_output)
    return boxes.new_empty((cap,), dtype=torch.int64), boxes.new_empty((), dtype=torch.int64)


def _opt(max_output):
    return -1 if max_output is None else int(max_output)


def _thr(score_threshold):
    return None if score_threshold is None else float(score_threshold)


def nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    iou_threshold: float,
    *,
    score_threshold: float | None = None,
    max_output: int | None = None,
) -> torch.Tensor:
    """``torchvision.ops.nms`` with the IoU in float32 for float32, float16
    and bfloat16 boxes: int64 indices of the kept boxes, by decreasing score.
    ``score_threshold``: keep only boxes with a higher score; ``max_output``:
    return at most that many."""
    iou_threshold, score_threshold = float(iou_threshold), _thr(score_threshold)
    _check("nms", boxes, scores, None, iou_threshold, score_threshold)
    return torch.ops.mixprec.nms(
        boxes.contiguous(), scores.contiguous(), float(iou_threshold), _thr(score_threshold), _opt(max_output)
    )


def batched_nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    idxs: torch.Tensor,
    iou_threshold: float,
    *,
    score_threshold: float | None = None,
    max_output: int | None = None,
) -> torch.Tensor:
    """``torchvision.ops.batched_nms``: boxes only suppress boxes of the same
    class (``idxs``, int64 or int32). Exact in every dtype: coordinates are
    never offset by class."""
    iou_threshold, score_threshold = float(iou_threshold), _thr(score_threshold)
    _check("batched_nms", boxes, scores, idxs, iou_threshold, score_threshold)
    return torch.ops.mixprec.batched_nms(
        boxes.contiguous(),
        scores.contiguous(),
        idxs.contiguous(),
        float(iou_threshold),
        _thr(score_threshold),
        _opt(max_output),
    )


def nms_padded(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    iou_threshold: float,
    idxs: torch.Tensor | None = None,
    *,
    score_threshold: float | None = None,
    max_output: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fixed-size NMS for export and CUDA graphs: returns ``(indices, count)``
    where ``indices`` has ``min(N, max_output)`` entries (``N`` without
    ``max_output``), the kept ones first and -1 after them, and ``count`` is a
    0-dim int64 tensor on the boxes' device. With ``idxs``, class-aware. Never
    synchronises with the host."""
    iou_threshold, score_threshold = float(iou_threshold), _thr(score_threshold)
    _check("nms_padded", boxes, scores, idxs, iou_threshold, score_threshold)
    return torch.ops.mixprec.nms_padded(
        boxes.contiguous(),
        scores.contiguous(),
        None if idxs is None else idxs.contiguous(),
        float(iou_threshold),
        _thr(score_threshold),
        _opt(max_output),
    )


def _supported(boxes, scores):
    return (
        boxes.dtype in _FLOAT
        and scores.dtype in _FLOAT
        and _handles(boxes.device)
    )


class TorchvisionPatch:
    """What :func:`patch_torchvision` returns: ``undo()`` restores
    torchvision's functions; also a context manager."""

    def __init__(self, saved):
        self._saved = saved

    def undo(self) -> None:
        for (mod, name), fn in self._saved.items():
            setattr(mod, name, fn)
        self._saved = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.undo()
        return False


def patch_torchvision() -> TorchvisionPatch:
    """Makes ``torchvision.ops.nms`` and ``torchvision.ops.batched_nms`` (and
    their ``torchvision.ops.boxes`` originals, which torchvision's detection
    models call) use mixprec's ops for float32/float16/bfloat16 boxes on the
    CPU (and CUDA when mixprec's CUDA library is loaded); other inputs
    (float64, other devices) still go to torchvision. One line::

        mixprec.ops.patch_torchvision()            # or: with ...patch_torchvision():

    Returns a handle whose ``undo()`` (or the end of the ``with``) restores
    torchvision."""
    import torchvision.ops
    import torchvision.ops.boxes as tv_boxes

    orig_nms = tv_boxes.nms
    orig_batched = tv_boxes.batched_nms

    def patched_nms(boxes, scores, iou_threshold):
        if _supported(boxes, scores):
            return nms(boxes, scores, iou_threshold)
        return orig_nms(boxes, scores, iou_threshold)

    def patched_batched_nms(boxes, scores, idxs, iou_threshold):
        if _supported(boxes, scores) and idxs.dtype in (torch.int64, torch.int32):
            return batched_nms(boxes, scores, idxs, iou_threshold)
        return orig_batched(boxes, scores, idxs, iou_threshold)

    patched_nms.__doc__ = orig_nms.__doc__
    patched_batched_nms.__doc__ = orig_batched.__doc__
    saved = {}
    for mod in (torchvision.ops, tv_boxes):
        for name, fn in (("nms", patched_nms), ("batched_nms", patched_batched_nms)):
            saved[(mod, name)] = getattr(mod, name)
            setattr(mod, name, fn)
    return TorchvisionPatch(saved)


__all__ = ["nms", "batched_nms", "nms_padded", "patch_torchvision", "TorchvisionPatch"]
