"""Python entry points of mixprec's ops (thin wrappers over torch.ops.mixprec),
one family per private module: loss scaling (``_amp``), NMS (``_nms``),
softmax (``_softmax``) and cross-entropy (``_cross_entropy``)."""

from __future__ import annotations

from ._amp import grad_norm, unscale_, update_scale_  # noqa: F401
from ._cross_entropy import cross_entropy  # noqa: F401
from ._efficient_nms import Detections, efficient_nms  # noqa: F401
from ._nms import TorchvisionPatch, batched_nms, nms, nms_padded, patch_torchvision  # noqa: F401
from ._roi_align import RoIAlign, roi_align  # noqa: F401
from ._softmax import log_softmax, softmax  # noqa: F401

__all__ = [
    "unscale_", "grad_norm", "update_scale_", "nms", "batched_nms", "nms_padded", "efficient_nms", "Detections", "patch_torchvision",
    "TorchvisionPatch", "softmax", "log_softmax", "cross_entropy",
]
__all__ += ["roi_align", "RoIAlign"]
