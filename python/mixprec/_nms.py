"""FP32-safe NMS: ``nms`` / ``batched_nms`` with torchvision's signatures, a
fixed-size ``nms_padded``, their fake kernels, and ``patch_torchvision``. The
contracts are the functions' docstrings; what they share is
[note: nms semantics].

[note: nms semantics] torchvision's rules (boxes ``x1, y1, x2, y2``; area
without +1; suppressed when the IoU with a kept box is strictly greater than
``iou_threshold``, which must be >= 0 and not NaN (above 1 nothing is
suppressed); int64 indices by decreasing score, stable for ties; NaN scores
rank above every number, as ``torch.sort`` and torchvision's CPU kernel,
unless ``score_threshold`` drops them), with the IoU always in float32:
float16 / bfloat16 boxes never overflow (torchvision's FP16 areas do above 256
x 256) and ``batched_nms`` compares class ids instead of offsetting
coordinates by class. float32 boxes give ``torchvision.ops.nms``'s result
exactly. Boxes and scores are float32, float16 or bfloat16 (they may differ;
float64 is left to torchvision). No autocast rule: the inputs are left alone.
On CUDA ``nms`` / ``batched_nms`` copy one int64 (the kept count) to the host
to size their output; ``nms_padded`` copies nothing.
"""

import torch
from torch.nn.modules.utils import _pair

from ._args import _takes, as_int, as_real
from ._registration import _refuse_sparse
from ._library import FLOAT_DTYPES as _FLOAT
from ._library import handles as _handles

# A sparse argument: a mixprec error naming it, not the dispatcher's page.
for _name in ("nms", "batched_nms", "nms_padded"):
    _refuse_sparse(_name)


def _check(op, boxes, scores, idxs, iou_threshold, score_threshold):
    """The checks of the real kernels (shim/nms_op.h), so traced and meta
    calls fail the same way; the public functions also run them before
    ``.contiguous()``, which would otherwise copy (or fail to allocate) a
    huge expanded tensor, or densify a sparse one, before any check. The
    messages' lambdas close over plain values only (dynamo refuses tensors
    there, and the public functions compile with fullgraph=True)."""
    for name, t in (("boxes", boxes), ("scores", scores), ("idxs", idxs)):
        if t is not None:
            torch._check(
                t.layout == torch.strided, lambda: f"mixprec::{op}: {name} must be a defined strided tensor"
            )
    rows, bdtype, sdtype, bdev, sdev = boxes.shape[0], boxes.dtype, scores.dtype, boxes.device, scores.device
    torch._check(boxes.dim() == 2 and boxes.shape[1] == 4, lambda: f"mixprec::{op}: boxes must have shape (N, 4)")
    torch._check(rows <= 2**31 - 1, lambda: f"mixprec::{op}: boxes has {rows} rows; at most 2^31 - 1 are supported")
    torch._check(bdtype in _FLOAT, lambda: f"mixprec::{op}: boxes must be float32, float16 or bfloat16, got {bdtype}")
    torch._check(sdtype in _FLOAT, lambda: f"mixprec::{op}: scores must be float32, float16 or bfloat16, got {sdtype}")
    torch._check(
        scores.dim() == 1 and scores.shape[0] == rows,
        lambda: f"mixprec::{op}: scores must have shape (N,) with N = boxes.size(0)",
    )
    torch._check(sdev == bdev, lambda: f"mixprec::{op}: scores is on {sdev} but boxes is on {bdev}")
    if idxs is not None:
        idtype, idev = idxs.dtype, idxs.device
        torch._check(idtype in (torch.int64, torch.int32), lambda: f"mixprec::{op}: idxs must be int64 or int32, got {idtype}")
        torch._check(
            idxs.dim() == 1 and idxs.shape[0] == rows,
            lambda: f"mixprec::{op}: idxs must have shape (N,) with N = boxes.size(0)",
        )
        torch._check(idev == bdev, lambda: f"mixprec::{op}: idxs is on {idev} but boxes is on {bdev}")
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


def _opt(op, max_output):
    return -1 if max_output is None else as_int(f"mixprec.ops.{op}", "max_output", max_output)


def _thr(op, score_threshold):
    return None if score_threshold is None else as_real(f"mixprec.ops.{op}", "score_threshold", score_threshold)


def _iou(op, iou_threshold):
    return as_real(f"mixprec.ops.{op}", "iou_threshold", iou_threshold)


def _call(op, boxes, scores, idxs, iou_threshold, score_threshold, max_output):
    """The public functions' one path: the number arguments converted, the
    checks made before ``.contiguous()`` (see _check), then the op
    (``nms`` takes no idxs)."""
    iou_threshold, score_threshold = _iou(op, iou_threshold), _thr(op, score_threshold)
    max_output = _opt(op, max_output)
    _check(op, boxes, scores, idxs, iou_threshold, score_threshold)
    tensors = (boxes.contiguous(), scores.contiguous())
    if op != "nms":
        tensors += (None if idxs is None else idxs.contiguous(),)
    return getattr(torch.ops.mixprec, op)(*tensors, iou_threshold, score_threshold, max_output)


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
    return _call("nms", boxes, scores, None, iou_threshold, score_threshold, max_output)


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
    return _call("batched_nms", boxes, scores, idxs, iou_threshold, score_threshold, max_output)


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
    return _call("nms_padded", boxes, scores, idxs, iou_threshold, score_threshold, max_output)


def _supported(boxes, scores):
    return (
        boxes.dtype in _FLOAT
        and scores.dtype in _FLOAT
        and _handles(boxes.device)
    )


# ---- patch_torchvision -----------------------------------------------------------
#
# TorchScript compiles the functions it finds in torchvision's module globals
# when a detector is scripted, so the replacements below are written in the
# scriptable subset: annotated, no tuples of dtypes, no keyword-only
# arguments, the Python-only checks behind `if not torch.jit.is_scripting()`
# (TorchScript does not compile that branch; the C++ kernels make the same
# checks). Which device mixprec handles is fixed when the patch is applied
# (TorchScript refuses a closed-over bool, not a closed-over function: the
# device test is one of two functions).


def _is_float(t: torch.Tensor) -> bool:
    return t.dtype == torch.float32 or t.dtype == torch.float16 or t.dtype == torch.bfloat16


def _on_cpu(t: torch.Tensor) -> bool:
    return t.device.type == "cpu"


def _on_cpu_or_cuda(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" or t.device.type == "cuda"


def _forget_scripted(module_names):
    """TorchScript caches the free functions it compiled, by function object:
    one compiled before the patch (torchvision's _multiscale_roi_align,
    maskrcnn_loss, ...) would keep calling the ops it was compiled with. The
    cache entries of torchvision's functions are dropped, so the next
    torch.jit.script compiles them against the current globals. Module
    methods are cached per module type and cannot be recompiled under the same
    class name: a detector CLASS scripted in this process before the patch
    keeps its methods' ops (RoIHeads.postprocess_detections and
    RegionProposalNetwork.filter_proposals call batched_nms directly), so
    apply the patch before scripting."""
    try:
        from torch.jit import _state
    except ImportError:  # pragma: no cover - very old torch
        return
    for fn in list(_state._jit_caching_layer.keys()):
        if getattr(fn, "__module__", "") in module_names:
            _state._jit_caching_layer.pop(fn, None)


class TorchvisionPatch:
    """What :func:`patch_torchvision` returns: ``undo()`` restores
    torchvision's functions; also a context manager."""

    def __init__(self, saved, module_names=()):
        self._saved = saved
        self._module_names = tuple(module_names)

    @_takes(module="mixprec.ops")
    def undo(self) -> None:
        for (mod, name), fn in self._saved.items():
            setattr(mod, name, fn)
        self._saved = {}
        _forget_scripted(self._module_names)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.undo()
        return False


@_takes(where="mixprec.ops.patch_torchvision")
def patch_torchvision() -> TorchvisionPatch:
    """Makes torchvision's ``nms``, ``batched_nms`` and ``roi_align`` use
    mixprec's ops for float32/float16/bfloat16 inputs on the CPU (and CUDA
    when mixprec's CUDA library is loaded); other inputs (float64, quantized,
    other devices) still go to torchvision. Patched are the names torchvision
    and its detection models call: ``torchvision.ops.{nms, batched_nms,
    roi_align}``, ``torchvision.ops.boxes.{nms, batched_nms}``, the module
    function ``roi_align`` of ``torchvision.ops.roi_align`` (which
    ``torchvision.ops.RoIAlign`` calls), ``torchvision.ops.poolers.roi_align``
    (``MultiScaleRoIAlign``) and ``torchvision.models.detection.roi_heads.
    roi_align`` (Mask R-CNN's mask targets). One line::

        mixprec.ops.patch_torchvision()            # or: with ...patch_torchvision():

    The replacements are TorchScript-compatible: ``torch.jit.script`` of a
    torchvision detector works with the patch active and the scripted model
    calls mixprec's ops (apply the patch before the first torch.jit.script of
    a detector class in the process: TorchScript keeps the methods it
    compiled per class). Returns a handle whose ``undo()`` (or the end of
    the ``with``) restores torchvision; both drop TorchScript's cache of
    torchvision's compiled free functions so that later scripting follows
    the current state."""
    import importlib
    import sys

    import torchvision.ops
    import torchvision.ops.boxes as tv_boxes
    import torchvision.ops.poolers as tv_poolers
    from torch import Tensor
    from torch.jit.annotations import BroadcastingList2
    from typing import List, Union

    from ._library import cuda_ops_loaded
    from ._roi_align import _as_rois, _check_forward

    tv_roi_mod = sys.modules["torchvision.ops.roi_align"]
    heads = importlib.import_module("torchvision.models.detection.roi_heads")

    orig_nms = tv_boxes.nms
    orig_batched = tv_boxes.batched_nms
    orig_roi_align = tv_roi_mod.roi_align
    _on = _on_cpu_or_cuda if cuda_ops_loaded() else _on_cpu

    def patched_nms(boxes: Tensor, scores: Tensor, iou_threshold: float) -> Tensor:
        if _is_float(boxes) and _is_float(scores) and _on(boxes) and not boxes.is_quantized:
            if not torch.jit.is_scripting():
                if not torch.compiler.is_compiling():
                    _check("nms", boxes, scores, None, float(iou_threshold), None)
            return torch.ops.mixprec.nms(boxes.contiguous(), scores.contiguous(), float(iou_threshold), None, -1)
        return orig_nms(boxes, scores, iou_threshold)

    def patched_batched_nms(boxes: Tensor, scores: Tensor, idxs: Tensor, iou_threshold: float) -> Tensor:
        if (
            _is_float(boxes)
            and _is_float(scores)
            and _on(boxes)
            and (idxs.dtype == torch.int64 or idxs.dtype == torch.int32)
        ):
            if not torch.jit.is_scripting():
                if not torch.compiler.is_compiling():
                    _check("batched_nms", boxes, scores, idxs, float(iou_threshold), None)
            return torch.ops.mixprec.batched_nms(
                boxes.contiguous(), scores.contiguous(), idxs.contiguous(), float(iou_threshold), None, -1
            )
        return orig_batched(boxes, scores, idxs, iou_threshold)

    def patched_roi_align(
        input: Tensor,
        boxes: Union[Tensor, List[Tensor]],
        output_size: BroadcastingList2[int],
        spatial_scale: float = 1.0,
        sampling_ratio: int = -1,
        aligned: bool = False,
    ) -> Tensor:
        rois = _as_rois(boxes)
        if _is_float(input) and _is_float(rois) and _on(input) and not input.is_quantized:
            size = _pair(output_size)
            if not torch.jit.is_scripting():
                if not torch.compiler.is_compiling():
                    _check_forward(input, rois, float(spatial_scale), int(size[0]), int(size[1]), int(sampling_ratio))
            return torch.ops.mixprec.roi_align(
                input.contiguous(), rois.contiguous(), float(spatial_scale), size[0], size[1], sampling_ratio, aligned
            )
        return orig_roi_align(input, rois, output_size, spatial_scale, sampling_ratio, aligned)

    patched_nms.__doc__ = orig_nms.__doc__
    patched_batched_nms.__doc__ = orig_batched.__doc__
    patched_roi_align.__doc__ = orig_roi_align.__doc__
    saved = {}
    targets = [
        (torchvision.ops, "nms", patched_nms),
        (tv_boxes, "nms", patched_nms),
        (torchvision.ops, "batched_nms", patched_batched_nms),
        (tv_boxes, "batched_nms", patched_batched_nms),
        (torchvision.ops, "roi_align", patched_roi_align),
        (tv_roi_mod, "roi_align", patched_roi_align),
        (tv_poolers, "roi_align", patched_roi_align),
        (heads, "roi_align", patched_roi_align),
    ]
    for mod, name, fn in targets:
        saved[(mod, name)] = getattr(mod, name)
        setattr(mod, name, fn)
    names = {m.__name__ for m, _, _ in targets} | {"torchvision.models.detection.roi_heads"}
    names |= {n for n in sys.modules if n.startswith("torchvision.")}
    _forget_scripted(names)
    return TorchvisionPatch(saved, names)


__all__ = ["nms", "batched_nms", "nms_padded", "patch_torchvision", "TorchvisionPatch"]
