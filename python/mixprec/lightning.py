"""Lightning precision plugin for mixprec's optimizers:
``Trainer(plugins=[mixprec.lightning.MixedPrecision("bf16-mixed", "cuda")],
gradient_clip_val=1.0)``.

[note: lightning clipping] mixprec's optimizers set
``_step_supports_amp_scaling`` with torch's meaning: their step takes
``grad_scale`` and ``found_inf`` from a GradScaler (torch's or mixprec's) and
skips itself on the device, as torch's fused optimizers do. torch's
GradScaler then only checks the grads for inf/NaN (accepting FP16 grads
there) and leaves the division to the step; without the flag it would
unscale them itself, refuse FP16 grads, and sync the host to skip. Lightning
reads the same flag as "this optimizer cannot be clipped": its
``MixedPrecision`` never unscales such an optimizer's grads and refuses
``gradient_clip_val`` outright, with a scaler (16-mixed) and without one
(bf16-mixed) alike, for torch's fused optimizers as for mixprec's. This
plugin is Lightning's with that one difference removed: the grads of every
optimizer are unscaled through the scaler after the closure, before
``on_before_optimizer_step`` and the clip (Lightning's order for torch's
other optimizers), and the step then gets no ``grad_scale`` and only reads
them (torch's scaler arranges that after an ``unscale_``), so hooks and
clipping see what they see with ``torch.optim.AdamW``. 16-mixed defaults to
mixprec's GradScaler (FP16 grads accepted, no host sync).

Pass it instead of ``precision=``; Lightning's own plugin stays in use for
every other optimizer's behaviour (this one only changes what it does for
optimizers with the flag). Import ``lightning`` (2.x) before using it.

Lightning's own plugins (``precision="bf16-mixed"``, its 16-mixed one) now
train mixprec's optimizers with clipping too: under Lightning their flag
reads False to every reader but a GradScaler ([note: lightning's reading
of the flag] in ``mixprec/optim.py``), so this plugin hands them to
Lightning's steps. It remains for torch's fused optimizers (which Lightning
still refuses) and for mixprec's GradScaler as the 16-mixed default.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from lightning.pytorch.plugins.precision import MixedPrecision as _LightningMixedPrecision
from lightning.pytorch.plugins.precision.precision import Precision as _Precision
from lightning.pytorch.utilities import GradClipAlgorithmType

from .amp import GradScaler

__all__ = ["MixedPrecision"]


def _takes_scale(optimizer: Any) -> bool:
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


class MixedPrecision(_LightningMixedPrecision):
    """Lightning's ``MixedPrecision`` (``"16-mixed"`` or ``"bf16-mixed"``,
    ``device``, optional ``scaler``) that unscales and clips the grads of
    optimizers whose step takes the loss scale (mixprec's, torch's fused
    ones) as it does those of the others: see [note: lightning clipping].
    ``scaler`` defaults to ``mixprec.amp.GradScaler(device)`` for 16-mixed;
    bf16-mixed takes none."""

    def __init__(self, precision: str, device: str = "cuda", scaler: Any = None) -> None:
        w = "mixprec.lightning.MixedPrecision"
        if not isinstance(precision, str):
            raise TypeError(f"{w}: precision must be '16-mixed' or 'bf16-mixed', got {type(precision).__name__}")
        if precision not in ("16-mixed", "bf16-mixed"):
            raise ValueError(f"{w}: precision must be '16-mixed' or 'bf16-mixed', got {precision!r}")
        if not isinstance(device, (str, torch.device)):
            raise TypeError(f"{w}: device must be a device type such as 'cuda' or 'cpu', got {type(device).__name__}")
        try:
            device = torch.device(device).type  # torch.autocast takes the type ("cuda:1" -> "cuda")
        except RuntimeError:
            raise ValueError(f"{w}: device must be a device type such as 'cuda' or 'cpu', got {device!r}") from None
        if scaler is not None:
            missing = [m for m in ("scale", "unscale_", "step", "update", "state_dict", "load_state_dict")
                       if not callable(getattr(scaler, m, None))]
            if missing or isinstance(scaler, type):
                raise TypeError(f"{w}: scaler must be a GradScaler (torch.amp.GradScaler or mixprec.amp.GradScaler) "
                                f"or None, got {type(scaler).__name__}")
            if precision == "bf16-mixed":
                raise ValueError(f"{w}: precision='bf16-mixed' scales nothing and takes no scaler, got "
                                 f"{type(scaler).__name__}")
        if scaler is None and precision == "16-mixed":
            scaler = GradScaler(device)
        super().__init__(precision, device, scaler)  # type: ignore[arg-type]

    def optimizer_step(self, optimizer: Any, model: Any, closure: Callable[[], Any], **kwargs: Any) -> Any:
        if self.scaler is None or not _takes_scale(optimizer):
            return super().optimizer_step(optimizer, model=model, closure=closure, **kwargs)
        # Lightning's own step with a scaler, with the unscale_ it does for
        # optimizers without the flag.
        closure_result = closure()
        skip = closure_result is None and model.automatic_optimization
        if not skip:
            self.scaler.unscale_(optimizer)
        self._after_closure(model, optimizer)
        if skip:
            return closure_result
        out = self.scaler.step(optimizer, **kwargs)
        self.scaler.update()
        return out

    def unscale_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def clip_gradients(
        self,
        optimizer: torch.optim.Optimizer,
        clip_val: int | float = 0.0,
        gradient_clip_algorithm: GradClipAlgorithmType = GradClipAlgorithmType.NORM,
    ) -> None:
        # Lightning's, less the refusal (the grads are unscaled by now).
        _Precision.clip_gradients(self, optimizer, clip_val, gradient_clip_algorithm)
