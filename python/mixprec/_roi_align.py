"""RoIAlign with FP32 accumulation: ``roi_align`` with torchvision's
signature, the ``RoIAlign`` module, the fake kernels and the autograd of
``torch.ops.mixprec.{roi_align, roi_align_backward}``. The contract is
:func:`roi_align`'s docstring.

[note: roi_align precision] Every coordinate, weight and sum is float32
whatever the feature dtype, with torchvision's float operations in its
order (no FMA): float32 is torchvision bit for bit; float16 / bfloat16 are
torchvision's float32 result on the upcast input rounded once, with no
float32 copy of the features (the CPU backward accumulates in a float32
workspace of 16 channel planes per thread, CUDA in registers).

[note: roi_align determinism] The CPU backward gives each (image, 16
channels) block to one thread; the CUDA backward is a gather without atomics
(one thread per input element, contributions in the CPU's order), so CPU and
CUDA gradients are written to be bit-identical (CUDA not yet run on a GPU).

[note: roi_align batch index] The index is truncated toward zero as
torchvision's; one that names no image (torchvision reads outside the input)
raises on the CPU and gives NaN outputs on CUDA, where a check would
synchronise.
"""

from typing import List, Union

import torch
from torch import Tensor, nn
from torch.jit.annotations import BroadcastingList2
from torch.nn.modules.utils import _pair

from ._args import as_int, as_real
from ._registration import _refuse_sparse, _same_device
from ._library import FLOAT_DTYPES as _FLOAT

for _name in ("roi_align", "roi_align_backward"):
    _refuse_sparse(_name)

__all__ = ["roi_align", "RoIAlign"]


# ---- checks shared by the fake kernels and the Python entry point ------------


def _check_rois(op, rois, ref_name, ref):
    torch._check(rois.layout == torch.strided, lambda: f"mixprec::{op}: rois must be a defined strided tensor")
    torch._check(
        rois.dtype in _FLOAT,
        lambda: f"mixprec::{op}: rois must be float32, float16 or bfloat16, got {rois.dtype}",
    )
    _same_device(op, ref_name, ref, ("rois", rois))
    torch._check(
        rois.dim() == 2 and rois.shape[1] == 5,
        lambda: f"mixprec::{op}: rois must have shape (K, 5) (batch index, x1, y1, x2, y2), got {list(rois.shape)}",
    )


def _check_options(op, spatial_scale, pooled_height, pooled_width, sampling_ratio):
    torch._check(
        0 <= pooled_height < 2**31 and 0 <= pooled_width < 2**31,
        lambda: f"mixprec::{op}: output_size must be >= 0 (and below 2^31), got ({pooled_height}, {pooled_width})",
    )
    torch._check(sampling_ratio < 2**31, lambda: f"mixprec::{op}: sampling_ratio must be below 2^31, got {sampling_ratio}")
    finite = spatial_scale - spatial_scale == 0 and abs(spatial_scale) <= 3.4028234663852886e38
    torch._check(finite, lambda: f"mixprec::{op}: spatial_scale must be finite (as a float32), got {spatial_scale}")


def _check_map(op, n_rois, pooled_height, pooled_width, channels, height, width):
    torch._check(
        n_rois == 0 or pooled_height == 0 or pooled_width == 0 or channels == 0 or (height > 0 and width > 0),
        lambda: f"mixprec::{op}: cannot sample rois from an empty feature map (height {height}, width {width})",
    )


def _check_forward(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio):
    op = "roi_align"
    torch._check(input.layout == torch.strided, lambda: f"mixprec::{op}: input must be a defined strided tensor")
    torch._check(
        input.dtype in _FLOAT,
        lambda: f"mixprec::{op}: input must be float32, float16 or bfloat16, got {input.dtype}"
        + (" (float64 is not supported: use torchvision.ops.roi_align for float64)" if input.dtype == torch.float64 else ""),
    )
    torch._check(input.dim() == 4, lambda: f"mixprec::{op}: input must have shape (N, C, H, W), got {list(input.shape)}")
    _check_rois(op, rois, "input", input)
    _check_options(op, spatial_scale, pooled_height, pooled_width, sampling_ratio)
    _check_map(op, rois.shape[0], pooled_height, pooled_width, input.shape[1], input.shape[2], input.shape[3])


@torch.library.register_fake("mixprec::roi_align")
def _roi_align_fake(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    _check_forward(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio)
    return input.new_empty((rois.shape[0], input.shape[1], pooled_height, pooled_width))


@torch.library.register_fake("mixprec::roi_align_backward")
def _roi_align_backward_fake(
    grad, rois, spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width, sampling_ratio, aligned
):
    op = "roi_align_backward"
    torch._check(grad.layout == torch.strided, lambda: f"mixprec::{op}: grad must be a defined strided tensor")
    torch._check(grad.dtype in _FLOAT, lambda: f"mixprec::{op}: grad must be float32, float16 or bfloat16, got {grad.dtype}")
    torch._check(
        batch_size >= 0 and channels >= 0 and height >= 0 and width >= 0,
        lambda: f"mixprec::{op}: batch_size, channels, height and width must be >= 0",
    )
    _check_rois(op, rois, "grad", grad)
    _check_options(op, spatial_scale, pooled_height, pooled_width, sampling_ratio)
    torch._check(
        grad.dim() == 4 and tuple(grad.shape) == (rois.shape[0], channels, pooled_height, pooled_width),
        lambda: f"mixprec::{op}: grad must have shape (K, channels, pooled_height, pooled_width), got {list(grad.shape)}",
    )
    _check_map(op, rois.shape[0], pooled_height, pooled_width, channels, height, width)
    return grad.new_empty((batch_size, channels, height, width))


# ---- autograd -------------------------------------------------------------------


def _setup(ctx, inputs, output):
    input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned = inputs
    ctx.save_for_backward(rois)
    ctx.args = (spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned)
    ctx.input_shape = tuple(input.shape)


def _backward(ctx, grad):
    (rois,) = ctx.saved_tensors
    spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned = ctx.args
    n, c, h, w = ctx.input_shape
    grad_input = torch.ops.mixprec.roi_align_backward(
        grad, rois, spatial_scale, pooled_height, pooled_width, n, c, h, w, sampling_ratio, aligned
    )
    return grad_input, None, None, None, None, None, None


def _no_double_backward(ctx, *grads):
    raise RuntimeError("mixprec::roi_align_backward: double backward is not supported")


torch.library.register_autograd("mixprec::roi_align", _backward, setup_context=_setup)
torch.library.register_autograd(
    "mixprec::roi_align_backward", _no_double_backward, setup_context=lambda ctx, inputs, output: None
)


# ---- public functions (TorchScript-compatible) --------------------------------------


def _boxes_to_rois(boxes: List[Tensor]) -> Tensor:
    """torchvision's convert_boxes_to_roi_format: the boxes of image i get
    the batch index i (in the boxes' dtype) in front."""
    ids = [torch.full_like(b[:, :1], i) for i, b in enumerate(boxes)]
    if len(boxes) == 1:
        return torch.cat([ids[0], boxes[0]], dim=1)
    return torch.cat([torch.cat(ids, dim=0), torch.cat(boxes, dim=0)], dim=1)


def _check_box_list(boxes: List[Tensor]) -> None:
    torch._check(len(boxes) > 0, lambda: "mixprec::roi_align: boxes is an empty list (give one Tensor[L, 4] per image)")
    for i, b in enumerate(boxes):
        torch._check(
            isinstance(b, torch.Tensor) and b.dim() == 2 and b.shape[1] == 4,
            lambda: f"mixprec::roi_align: boxes[{i}] must be a Tensor[L, 4], got "
            + (str(list(b.shape)) if isinstance(b, torch.Tensor) else type(b).__name__),
        )
        torch._check(
            b.dtype == boxes[0].dtype and b.device == boxes[0].device,
            lambda: f"mixprec::roi_align: boxes[{i}] is {b.dtype} on {b.device} but boxes[0] is {boxes[0].dtype} on {boxes[0].device}",
        )


def _as_rois(boxes: Union[Tensor, List[Tensor]]) -> Tensor:
    """``boxes`` as rois ``Tensor[K, 5]``: a tensor as it is, a list of
    per-image boxes checked (eagerly) and joined. Scriptable."""
    if isinstance(boxes, torch.Tensor):
        return boxes
    else:
        if not torch.jit.is_scripting():
            if not torch.compiler.is_compiling():
                _check_box_list(boxes)
        return _boxes_to_rois(boxes)


def _eager_args(output_size, spatial_scale, sampling_ratio):
    """The number arguments checked for their kind ([note: argument
    conversion] in _args.py); their ranges are the op's checks. Eager only:
    TorchScript and torch.compile type them themselves."""
    where = "mixprec.ops.roi_align"
    if isinstance(output_size, (tuple, list)):
        if len(output_size) != 2:
            raise ValueError(f"{where}: output_size must be an int or a pair (h, w), got {output_size!r}")
        output_size = tuple(as_int(where, "output_size", v) for v in output_size)
    else:
        output_size = as_int(where, "output_size", output_size)
    return output_size, as_real(where, "spatial_scale", spatial_scale), as_int(where, "sampling_ratio", sampling_ratio)


def roi_align(
    input: Tensor,
    boxes: Union[Tensor, List[Tensor]],
    output_size: BroadcastingList2[int],
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
    aligned: bool = False,
) -> Tensor:
    """``torchvision.ops.roi_align`` computed in float32 for float32, float16
    and bfloat16 features (output in the input's dtype; float64 refused,
    ``patch_torchvision`` leaves it to torchvision), differentiable with
    respect to ``input`` (no double backward, as torchvision). Scriptable.

    ``boxes``: ``Tensor[K, 5]`` (batch index, x1, y1, x2, y2) or a list of
    ``Tensor[L, 4]``, one per image, in any of the three dtypes (widened
    exactly; torchvision requires the features'). ``output_size``: an int or
    (h, w); 0 gives an empty output, negative raises. ``sampling_ratio`` > 0
    samples per bin side, <= 0 adaptive (``ceil(roi_size / output_size)``);
    ``aligned`` shifts by -0.5 pixel. A box with a non-finite coordinate gives
    NaN outputs and no gradient; rois on an empty (H or W = 0) map raise.
    Non-contiguous and channels_last inputs are made contiguous in their own
    dtype first (as torchvision). See [note: roi_align precision],
    [note: roi_align determinism], [note: roi_align batch index]."""
    if not torch.jit.is_scripting():
        if not torch.compiler.is_compiling():
            output_size, spatial_scale, sampling_ratio = _eager_args(output_size, spatial_scale, sampling_ratio)
    size = _pair(output_size)
    rois = _as_rois(boxes)
    # The checks run before .contiguous() (which could copy a huge expanded
    # tensor first); TorchScript does not compile this branch, and under
    # torch.compile the fake kernel makes them. rois goes in as it is: the op
    # copies it only after its checks and the output's allocation.
    if not torch.jit.is_scripting():
        if not torch.compiler.is_compiling():
            _check_forward(input, rois, float(spatial_scale), int(size[0]), int(size[1]), int(sampling_ratio))
    return torch.ops.mixprec.roi_align(
        input.contiguous(), rois, float(spatial_scale), size[0], size[1], sampling_ratio, aligned
    )


class RoIAlign(nn.Module):
    """``torchvision.ops.RoIAlign`` on :func:`roi_align`."""

    def __init__(
        self, output_size: BroadcastingList2[int], spatial_scale: float, sampling_ratio: int, aligned: bool = False
    ):
        super().__init__()
        self.output_size = output_size
        self.spatial_scale = spatial_scale
        self.sampling_ratio = sampling_ratio
        self.aligned = aligned

    def forward(self, input: Tensor, rois: Union[Tensor, List[Tensor]]) -> Tensor:
        return roi_align(input, rois, self.output_size, self.spatial_scale, self.sampling_ratio, self.aligned)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}(output_size={self.output_size}, spatial_scale={self.spatial_scale}, "
            f"sampling_ratio={self.sampling_ratio}, aligned={self.aligned})"
        )
