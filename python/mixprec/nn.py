"""Drop-in ``torch.nn`` modules backed by mixprec's FP32-accumulating ops:
:class:`CrossEntropyLoss`, :class:`SoftTargetCrossEntropy` (timm's), :class:`Softmax`,
:class:`LogSoftmax`.

They take the constructor arguments of their torch counterparts (minus the
deprecated ``size_average``/``reduce``) and accept FP16/BF16 inputs without
an FP32 copy of them. See :mod:`mixprec.ops` for the semantics.
"""

from __future__ import annotations

import torch

from . import _cross_entropy, _softmax
from ._args import as_int, check_tensor

__all__ = ["CrossEntropyLoss", "SoftTargetCrossEntropy", "Softmax", "LogSoftmax"]


class CrossEntropyLoss(torch.nn.Module):
    """``torch.nn.CrossEntropyLoss`` for class-index targets and for
    class-probability targets of the input's shape (Mixup/CutMix: timm's
    ``SoftTargetCrossEntropy`` is this with the defaults); the loss is
    float32 whatever the logits' dtype."""

    def __init__(
        self,
        weight: torch.Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
    ) -> None:
        check_tensor("mixprec.nn.CrossEntropyLoss", "weight", weight, none=True)
        super().__init__()
        if reduction not in ("none", "mean", "sum"):
            raise ValueError(f"mixprec.nn.CrossEntropyLoss: invalid reduction {reduction!r}")
        self.register_buffer("weight", weight)
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return _cross_entropy.cross_entropy(
            input,
            target,
            weight=self.weight,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            label_smoothing=self.label_smoothing,
        )

    def extra_repr(self) -> str:
        return f"ignore_index={self.ignore_index}, reduction={self.reduction}, label_smoothing={self.label_smoothing}"


class SoftTargetCrossEntropy(torch.nn.Module):
    """timm's ``timm.loss.SoftTargetCrossEntropy`` (the loss timm trains with
    under Mixup/CutMix): ``sum(-target * log_softmax(x, dim=-1), dim=-1).mean()``
    with the classes on the LAST dimension, as timm has them; the loss is
    float32, computed from the half logits without an FP32 copy."""

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        check_tensor("mixprec.nn.SoftTargetCrossEntropy", "x", x)
        check_tensor("mixprec.nn.SoftTargetCrossEntropy", "target", target)
        if x.dim() > 2:
            # (N, ..., C) -> (N, C, ...): a view; made contiguous in its own dtype.
            x, target = x.movedim(-1, 1), target.movedim(-1, 1)
        return _cross_entropy.cross_entropy(x, target)


class _DimModule(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        # Checked here, not first at forward (far from the cause).
        dim = as_int(f"mixprec.nn.{type(self).__name__}", "dim", dim)
        super().__init__()
        self.dim = dim

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Softmax(_DimModule):
    """``torch.nn.Softmax(dim)``; output in the input's dtype (float32 under
    autocast), computed in float32."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return _softmax.softmax(input, self.dim)


class LogSoftmax(_DimModule):
    """``torch.nn.LogSoftmax(dim)``; output as :class:`Softmax`."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return _softmax.log_softmax(input, self.dim)
