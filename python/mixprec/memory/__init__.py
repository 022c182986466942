"""Activation memory: keep what backward needs in fewer bits.

For CV models most of training memory is the activations autograd saves for
backward. Inside ``compressed_activations`` every floating activation saved
for backward is packed into 8-bit (default) or 4-bit blockwise codes with one
float32 scale per block, and unpacked when backward needs it::

    import mixprec.memory
    with mixprec.memory.compressed_activations(bits=8):
        loss = criterion(model(x), y)
    loss.backward()          # outside the context: unpacks as it goes

Code widths with ``bits=4``: 4-bit codes for the inputs of convs and
linears, ReLU outputs and whatever else is not named here; 8-bit codes
for what normalisation layers save (``norm_bits``) and what attention and
smooth nonlinearities (GELU, SiLU, Sigmoid, Tanh, Softmax...) save
(``nonlinear_bits``). The first kind reaches backward only as one weight's
gradient or a ReLU mask; the second is what backward passes the gradient
on through, so its rounding error would reach every layer below (and,
through a nonlinear function, as a bias): at 4 bits for all, BatchNorm
weights fall to 0.98 and ViT's first in-projection to 0.97 in gradient
cosine; with this policy every parameter of resnet18 / resnet50 / vit_b_16
is at 0.99 or above (``compressed_activations``' docstring has the figures).
``norm_bits=4, nonlinear_bits=4`` packs everything at 4 bits.

No change to the model: it works through ``torch.autograd.graph.
saved_tensors_hooks``, so it applies to any module, functional call or
custom autograd function run inside the ``with`` block.

What is packed, and what is kept exactly:

* packed: float32 / float16 / bfloat16 tensors of at least ``min_numel``
  elements that autograd saves and that came out of a differentiable op (a
  conv, BN, ReLU, GELU, LayerNorm, attention output...). A tensor saved by
  several ops (ReLU's output that is also the next conv's input) is packed
  once. It is packed when the forward lets go of it (at the next op once
  only autograd holds its storage, or at the end of the ``with`` block), so
  a tensor the forward keeps using (an FPN's levels kept for the heads) is
  never held as original and codes at once; the original is freed then.
* recomputed, not stored (``recompute_relu=True``, the default): the output
  of a ReLU applied directly to a BatchNorm's output (conv -> BN -> ReLU, in
  place or not, module or functional) keeps only its set of non-zeros, one
  bit per element. Backward recomputes it as ``relu(a * x + b)`` from the
  BatchNorm's saved input ``x`` (already packed, or kept with
  ``norm_bits=16``) and the BatchNorm's per-channel ``a = weight * invstd``,
  ``b = bias - mean * a`` (the batch's statistics in training, the running
  ones in eval): the mask comes back exactly, the values as close as ``x``'s
  form. In a ResNet-50 those outputs are 19% of the bytes saved; for
  DeepLabV3 at 512 the saved bytes at 8 bits fall from 0.52x to 0.44x of
  BF16 autocast. On the CPU the statistics are checked against the output
  on a corner of the first sample before they are relied on; a BatchNorm
  run by cuDNN or MIOpen (their nodes keep their statistics otherwise) is
  packed as before.
* stored losslessly in fewer bytes:

  - the indices an ``nn.MaxPool2d`` saves, one byte each (the position in
    its window, ``kh * kW + kw``, for windows of up to 256 elements; int64
    -> uint8, on the CPU and on a GPU, no host sync);
  - other integer tensors of at least ``min_numel`` elements on the CPU
    (a functional ``F.max_pool2d``'s indices) in the narrowest of uint8 /
    int16 / int32 that holds their values;
  - bool tensors (CUDA dropout's masks) at one bit per element; and on the
    CPU the mask tensor dropout multiplies by (no autograd history, only
    zeros and one value ``1 / (1 - p)``) as one bit per element plus that
    value.
* kept exactly: parameters and what is only a cast or view of one (autocast's
  weight copies), tensors with no autograd history (the input batch, frozen
  weights, buffers) other than dropout's masks, integer tensors on a GPU
  other than max-pool indices,
  tensors below ``min_numel`` elements (BN / LayerNorm statistics,
  biases), log-softmax outputs (the cross-entropy's saved log-probabilities,
  which backward exponentiates), the inputs ``torch.utils.checkpoint`` keeps
  to recompute a region from, and tensor subclasses.

What comes back: zeros exactly (so ReLU's mask is exact), the sign of every
element (a LeakyReLU's mask), every other value within one step of its
block (``max / 255`` for 8-bit codes of a non-negative block, ``(max - min)
/ 254`` for another; 15 and 14 for 4-bit), rounded stochastically so the
unpacked value is unbiased (except below one step, where a non-zero value
comes back as one step rather than zero). A block
holding an inf or NaN unpacks to NaN, so a non-finite forward still gives
non-finite gradients (GradScaler then skips the step).

Under ``torch.compile`` (torch 2.13 and 2.14 tested): what a compiled region
saves is packed too, by AOTAutograd itself (the block's hooks are modules
it inlines into the graphs it compiles; ``_compiled.py``): its float
intermediates of at least ``min_numel`` elements at the same widths, the
region's inputs, parameters and their casts kept. Unlike eager, the
decisions and the rounding seed of each saved tensor are fixed when the
region is compiled (a new ``with`` block does not recompile; every call
rounds with the same bits), nothing is counted in ``stats``, a region
compiled for dynamic shapes (``dynamic=True``, or torch's automatic
dynamic after a second batch size) keeps its tensors (compile with
``dynamic=False`` or drop the last partial batch), and where
inductor recomputes BatchNorm -> ReLU in backward from the BatchNorm's
packed input the ReLU mask is recomputed from the codes, so an element
within one code step of the threshold may flip. At 8 bits, worst
per-parameter gradient cosine against the same step unpacked: resnet18
0.9996 compiled, 0.9997 eager; resnet50 0.9932 / 0.9951 (its stem bias,
BF16's floor); but a conv -> BN -> ReLU -> global mean net, where BN's
backward cancels nearly all of a uniform gradient, 0.985 on the conv
weights compiled against 0.9999 eager. ``norm_bits=16`` keeps those
inputs exact (1.0000 there). On a torch without hook inlining
(before 2.13: not tested) a compiled region's saved tensors are kept
uncompressed.

Checks torch makes are kept: a saved tensor modified in place before
backward raises torch's "modified by an inplace operation" error; double
backward (``create_graph=True``) through a packed tensor is refused, since
the packed values are not the forward's.
"""

from __future__ import annotations

import hashlib
import itertools
import sys
import warnings
import weakref
from typing import Any

import torch
import torch.utils.checkpoint
from torch.overrides import TorchFunctionMode

from .. import _act_pack
from .._args import as_int
from .._library import cuda_ops_loaded
from . import _compiled, _saved
from ._saved import (
    _Bits,
    _Kept,
    _narrowable,
    _NormReLU,
    _Narrowed,
    _Packed,
    _Pending,
    _PoolIndices,
    _two_valued,
)

__all__ = ["compressed_activations", "plan", "format_plan", "Recipe", "RECIPES", "LiveTracker", "checkpoint_blocks"]

_WHERE = "mixprec.memory.compressed_activations"

# Default block per code width: 4-bit codes have 1/17 of the 8-bit ones'
# resolution, so they get smaller blocks (a scale per 32 elements: 0.125
# bytes per element on top of 0.5; resnet18's worst per-layer gradient cosine
# 0.979 against 0.976 at 64).
_DEFAULT_BLOCK = {8: 256, 4: 32}

# The default code width of what normalisation layers, attention and smooth
# nonlinearities save (``norm_bits`` / ``nonlinear_bits``), with bits=4 too:
# their backward passes the gradient on through these values, so their error
# reaches every layer below (see compressed_activations' docstring).
_SENSITIVE_BITS = 8

# Nodes that only view or cast their one input: a saved tensor made from a
# parameter through these alone is a parameter's copy (autocast's weight
# cast, a Linear's transposed weight) and is kept exactly.
_VIEW_OR_CAST = frozenset(
    {
        "ToCopyBackward0",
        "TBackward0",
        "ViewBackward0",
        "UnsafeViewBackward0",
        "ReshapeAliasBackward0",
        "PermuteBackward0",
        "TransposeBackward0",
        "ExpandBackward0",
        "UnsqueezeBackward0",
        "SqueezeBackward0",
        "SqueezeBackward1",
        "SqueezeBackward2",
        "AliasBackward0",
        "CloneBackward0",
        "SliceBackward0",
        "SelectBackward0",
    }
)

# Saved tensors that backward needs exactly, by the node that made them.
_EXACT_OUTPUTS = frozenset({"LogSoftmaxBackward0"})

# torch.utils.checkpoint saves the inputs of a region it will recompute from
# its own code: those stay exact, or the recomputed forward would not be the
# forward that ran (its ReLU masks would move).
_CHECKPOINT_FILE = torch.utils.checkpoint.__file__

# A torch.compile'd region saves its tensors from AOTAutograd's runtime
# wrapper, as plain tensors with no autograd history: parameters, weight
# casts and activations look alike there, so they are all kept (and said so).
_AOT_MARK = "_aot_autograd"

# Blocks entered with seed=None in this process.
_BLOCKS = itertools.count()


def _fresh_seed() -> int:
    """A seed for a seed=None block: torch's CPU RNG state (hashed, not
    advanced) and the block's number in the process."""
    state = torch.get_rng_state()
    h = int.from_bytes(hashlib.blake2b(state.numpy().tobytes(), digest_size=8).digest(), "little")
    return (h ^ (next(_BLOCKS) * 0x9E3779B97F4A7C15)) & (2**64 - 1)


def _from_parameter(t: torch.Tensor) -> bool:
    node = t.grad_fn
    for _ in range(16):
        if node is None:
            return False
        name = type(node).__name__
        if name == "AccumulateGrad":
            return True
        if name not in _VIEW_OR_CAST:
            return False
        nexts = [n for n, _ in node.next_functions if n is not None]
        if len(nexts) != 1:
            return False
        node = nexts[0]
    return False



_POOL_FUNCS = frozenset({torch.nn.functional.max_pool2d, torch.nn.functional.max_pool2d_with_indices, torch.max_pool2d})

# Normalisation layers: what they save (their input) gets ``norm_bits``.
_NORM_FUNCS = frozenset(
    {
        torch.nn.functional.batch_norm,
        torch.batch_norm,
        torch.nn.functional.group_norm,
        torch.group_norm,
        torch.nn.functional.layer_norm,
        torch.layer_norm,
        torch.nn.functional.instance_norm,
        torch.instance_norm,
    }
)


_BN_FUNCS = frozenset({torch.nn.functional.batch_norm, torch.batch_norm})


def _bind_batch_norm(func, args, kwargs):
    """(input, weight, bias, running_mean, running_var, training, eps) of a
    batch_norm call, or None."""

    def f_bn(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
        return input, weight, bias, running_mean, running_var, training, eps

    def t_bn(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled):
        return input, weight, bias, running_mean, running_var, training, eps

    try:
        return (f_bn if func is torch.nn.functional.batch_norm else t_bn)(*args, **kwargs)
    except TypeError:
        return None


# Attention and smooth nonlinearities: what they save gets ``nonlinear_bits``.
# Their backward multiplies the incoming gradient by a function of these
# values (softmax probabilities recomputed from q and k, GELU'(x), ...), so
# their error is passed on to every layer below; and that function is not
# linear, so stochastic rounding's unbiased values still give a biased
# gradient. (ReLU is left out: its backward reads only the zeros, exact.)
_NONLINEAR_FUNCS = frozenset(
    f
    for f in (
        torch.nn.functional.scaled_dot_product_attention,
        torch.nn.functional.multi_head_attention_forward,
        torch.nn.functional.gelu,
        torch.nn.functional.silu,
        torch.nn.functional.mish,
        torch.nn.functional.elu,
        torch.nn.functional.selu,
        torch.nn.functional.celu,
        torch.nn.functional.softplus,
        torch.nn.functional.hardswish,
        torch.nn.functional.glu,
        torch.nn.functional.logsigmoid,
        torch.nn.functional.softmax,
        torch.nn.functional.sigmoid,
        torch.nn.functional.tanh,
        torch.softmax,
        torch.sigmoid,
        torch.tanh,
        torch.Tensor.softmax,
        torch.Tensor.sigmoid,
        torch.Tensor.tanh,
    )
    if f is not None
)


_LAYER_NORM_FUNCS = frozenset({torch.nn.functional.layer_norm, torch.layer_norm})


def _layer_norm_row(func, args, kwargs) -> int | None:
    """Elements per row a layer_norm call normalises (its normalized_shape's
    product), or None for another function or a call it cannot read."""
    if func not in _LAYER_NORM_FUNCS:
        return None
    shape = args[1] if len(args) > 1 else kwargs.get("normalized_shape")
    if isinstance(shape, int):
        shape = (shape,)
    try:
        row = 1
        for d in shape:
            row *= int(d)
    except (TypeError, ValueError):
        return None
    return row if row > 0 else None


def _row_block(block: int, row: int | None) -> int:
    """``block``, or the largest power of two below it that divides ``row``
    (at least the format's smallest block), so that no block holds elements
    of two LayerNorm rows: rows of very different scale (ViT's class token
    beside the patches) would otherwise share one step."""
    if row is None or row % block == 0:
        return block
    b = block
    while b > _act_pack.BLOCK_MIN and row % b:
        b //= 2
    return b if row % b == 0 else block


def _pool_geometry(args, kwargs):
    """((input shape but H, W), (W, kH, kW, sH, sW, pH, pW, dH, dW)) of a
    max_pool2d call, or None."""

    def bind(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
        return input, kernel_size, stride, padding, dilation

    try:
        x, k, st, pad, dil = bind(*args, **kwargs)
        pair = torch.nn.modules.utils._pair
        kH, kW = pair(k)
        sH, sW = pair(st if st is not None and (not isinstance(st, (list, tuple)) or len(st)) else k)
        (pH, pW), (dH, dW) = pair(pad), pair(dil)
        geom = (int(x.shape[-1]), int(kH), int(kW), int(sH), int(sW), int(pH), int(pW), int(dH), int(dW))
    except (TypeError, ValueError, AttributeError, IndexError):
        return None
    if not isinstance(x, torch.Tensor) or x.dim() not in (3, 4) or geom[1] * geom[2] > 256 or min(geom[1:]) < 0:
        return None
    return tuple(x.shape[:-2]), geom


def _affine_matches(x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``y`` is ``a * x + b`` per channel on a corner of the first
    sample (all channels, up to 8 positions per other dimension): a check
    that the statistics were read right, before relying on them."""
    idx = (slice(0, 1), slice(None)) + (slice(0, 8),) * (x.dim() - 2)
    view = (1, -1) + (1,) * (x.dim() - 2)
    xs, ys = x[idx].float(), y[idx].float()
    pred = xs * a.view(view) + b.view(view)
    err = (pred - ys).abs()
    tol = 2.0**-6 * (pred.abs() + b.abs().view(view)) + 1e-6
    return bool(((err <= tol) | ~torch.isfinite(pred)).all())


# The BatchNorm layers whose statistics were read right once (by their
# weight's identity, while it lives; per input shape, strides, dtypes and
# mode): checked again only when one of those changes.
_AFFINE_OK: dict[int, tuple[Any, set]] = {}


def _affine_checked(weight, x, training, y, a, b) -> bool:
    """_affine_matches, once per layer and kind of call."""
    kind = (tuple(x.shape), x.stride(), x.dtype, y.dtype, bool(training))
    entry = _AFFINE_OK.get(id(weight)) if isinstance(weight, torch.Tensor) else None
    if entry is not None and entry[0]() is weight and kind in entry[1]:
        return True
    if not _affine_matches(x, y, a, b):
        return False
    if isinstance(weight, torch.Tensor):
        if entry is None or entry[0]() is not weight:
            key = id(weight)
            entry = _AFFINE_OK[key] = (weakref.ref(weight, lambda _r, k=key: _AFFINE_OK.pop(k, None)), set())
        entry[1].add(kind)
    return True


class _PoolGeometry(TorchFunctionMode):
    """Tells the hooks the geometry of the max_pool2d running now (nn.MaxPool2d
    and F.max_pool2d alike), so its indices can be coded in its windows, and
    whether a normalisation layer (what it saves gets ``norm_bits``) or an
    attention / smooth nonlinearity (``nonlinear_bits``) is running. Only
    the outermost torch function is seen: everything nn.MultiheadAttention
    saves (its in- and out-projections' inputs too) is attention's."""

    def __init__(self, ctx):
        super().__init__()
        self.ctx = ctx

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.compiler.is_compiling():
            # torch.compile tracing the region: its saved tensors are packed
            # by the policy of _compiled.py, from the graph; this mode's
            # bookkeeping is for the eager hooks.
            return func(*args, **kwargs)
        self.ctx._pending.sweep()
        if func in _POOL_FUNCS:
            self.ctx._pool = _pool_geometry(args, kwargs)
            try:
                return func(*args, **kwargs)
            finally:
                self.ctx._pool = None
        if func in _NORM_FUNCS:
            self.ctx._norm_input = None
            self.ctx._in_norm += 1
            row, self.ctx._norm_row = self.ctx._norm_row, _layer_norm_row(func, args, kwargs)
            try:
                out = func(*args, **kwargs)
            finally:
                self.ctx._in_norm -= 1
                self.ctx._norm_row = row
            if func in _BN_FUNCS and self.ctx.recompute_relu:
                self.ctx._note_batch_norm(func, args, kwargs, out)
            return out
        if func in _NONLINEAR_FUNCS:
            self.ctx._in_nonlinear += 1
            try:
                return func(*args, **kwargs)
            finally:
                self.ctx._in_nonlinear -= 1
        return func(*args, **kwargs)


class compressed_activations(torch.autograd.graph.saved_tensors_hooks):
    """Packs the activations saved for backward inside the ``with`` block
    (see the module's docstring for what is packed and what is kept).

    Args:
        bits: 8 (default; about half the bytes of BF16 activations) or 4:
            the code width of the conv / linear inputs, ReLU outputs and
            everything else not named below. With 4, what normalisation
            layers, attention and smooth nonlinearities save stays at 8 bits
            (``norm_bits`` / ``nonlinear_bits``): 0.41x the BF16 bytes
            per sample on resnet50, 0.43x on vit_b_16 (0.31x / 0.30x with
            everything at 4 bits; see below).
        block: elements per float32 scale, a power of two in [32, 4096];
            default 256 for 8-bit codes, 32 for 4-bit ones (per tensor, by
            its width); for a LayerNorm's input, the largest power of two
            down to 32 that divides the row it normalises, if smaller, so no
            block holds two rows (a ViT's class token, far smaller than the
            patches, would come back as noise in a block shared with them).
        seed: the stochastic rounding's seed. None (default): every
            ``with`` block rounds with new bits, from torch's RNG state (read,
            not drawn from: dropout masks and the rest of the program's
            random numbers are the same with and without this block) and a
            per-process count of blocks; a fresh process under
            ``torch.manual_seed`` repeats them, a second run in the same
            process does not. An int: the block's k-th packed tensor always
            rounds with the same bits, so pass a different seed per step
            (e.g. ``run_seed * 2**32 + step``) or the steps' rounding errors
            are correlated; with the same seed and program
            the codes are the same on any thread count or device.
        min_numel: tensors with fewer elements are kept as they are.
        norm_bits: the code width for what normalisation layers save (the
            inputs of BatchNorm / GroupNorm / LayerNorm / InstanceNorm):
            4, 8, or 16 to keep them as they are; default (None) 8, with
            ``bits=4`` too.
        recompute_relu: True (default): a ReLU's output that follows a
            BatchNorm is stored as a one-bit mask and recomputed in backward
            from the BatchNorm's saved input (see the module's docstring);
            False: packed like any other activation.
        nonlinear_bits: the code width for what attention
            (``F.scaled_dot_product_attention``; ``nn.MultiheadAttention``:
            all it saves, its projections' inputs too) and smooth
            nonlinearities (GELU, SiLU, Mish, ELU, SELU, CELU, Softplus,
            Hardswish, GLU, LogSigmoid, Sigmoid, Tanh, Softmax) save: 4, 8,
            or 16 to keep them as they are; default (None) 8, with ``bits=4``
            too. The function is seen as it is called (a module calls it
            too); one a custom function calls inside itself is not.

    The policy, and why (bench/results/memory_cpu_grad.md: per-parameter
    gradient cosine against the uncompressed BF16-autocast step, resnet18 /
    resnet50 at 16 x 224, vit_b_16 at 8 x 224). A tensor whose only use in
    backward is one weight's gradient (a conv's or linear's input) or its
    zeros (ReLU's output) costs that one gradient an unbiased error: 4-bit
    codes (block 32) give it a cosine of 0.990-0.993 and nothing else.
    Normalisation layers, attention and smooth nonlinearities pass the
    gradient on through their saved values (BatchNorm / LayerNorm
    re-normalise them, attention recomputes softmax from q and k, GELU's
    backward reads GELU'(x)): at 4 bits that error reaches every layer
    below and adds up, and through a nonlinear function it is biased
    (on vit_b_16 the mean gradient of 4 rounding seeds still has a cosine of
    0.98 on the first block's in-projection weight, against 0.969 for one).
    So with everything at 4 bits the worst parameters are BatchNorm
    weights (a sum over the batch that cancels: 47 of resnet50's 161 below
    0.99, worst 0.979) and the first ViT block's in-projection weight
    (0.969, after the error of the 11 blocks above it); at 8 bits for
    those three kinds every parameter is at 0.99 or above, the worst one a
    linear / conv weight fed by 4-bit codes (0.992 resnet18 and resnet50,
    0.990 vit_b_16). The cost is bytes: per sample 1.32x those of
    all-4-bit codes on resnet50 (17.9 MB against 13.6; BF16 43.8), 1.43x on
    vit_b_16 (28.4 against 19.8; BF16 66.4).
    ``norm_bits=4, nonlinear_bits=4`` gives all-4-bit codes back.

    After the block, ``stats`` holds what was saved: ``packed`` / ``kept``
    (tensors, each storage once; parameters not counted), ``packed_bytes``
    (the originals' bytes), ``packed_nbytes`` (their codes and scales),
    ``kept_bytes``. The activation memory of the step is ``packed_nbytes +
    kept_bytes``.
    """

    def __init__(
        self, bits: int = 8, *, block: int | None = None, seed: int | None = None, min_numel: int = 16384,
        norm_bits: int | None = None, nonlinear_bits: int | None = None, recompute_relu: bool = True,
    ):
        self.bits = as_int(_WHERE, "bits", bits)
        if self.bits not in (8, 4):
            raise ValueError(f"{_WHERE}: bits must be 8 or 4, got {bits!r}")
        self.norm_bits = self._width("norm_bits", norm_bits)
        self.nonlinear_bits = self._width("nonlinear_bits", nonlinear_bits)
        if not isinstance(recompute_relu, bool):
            raise TypeError(f"{_WHERE}: recompute_relu must be a bool, got {type(recompute_relu).__name__}")
        self.recompute_relu = recompute_relu
        self._block_given = block is not None
        if block is None:
            self.block = _DEFAULT_BLOCK[self.bits]
        else:
            self.block = as_int(_WHERE, "block", block)
            if not (_act_pack.BLOCK_MIN <= self.block <= _act_pack.BLOCK_MAX and self.block & (self.block - 1) == 0):
                raise ValueError(
                    f"{_WHERE}: block must be a power of two in [{_act_pack.BLOCK_MIN}, {_act_pack.BLOCK_MAX}], "
                    f"got {block!r}"
                )
        self.seed = None if seed is None else as_int(_WHERE, "seed", seed, low=-(2**63), high=2**64 - 1) & (2**64 - 1)
        self._base, self._calls = 0, 0  # this block's seed and its pack calls so far
        self.min_numel = as_int(_WHERE, "min_numel", min_numel, low=0)
        self.stats: dict[str, int] = {"packed": 0, "kept": 0, "packed_bytes": 0, "packed_nbytes": 0, "kept_bytes": 0}
        self._seen: dict[int, tuple[Any, int, Any]] = {}
        self._kept_ids: dict[int, Any] = {}
        self._warned_compiled = False
        self._pool: tuple | None = None  # (input shape but H, W; geometry) of the max_pool2d running now
        self._in_norm = 0  # > 0 while a normalisation layer runs
        self._in_nonlinear = 0  # > 0 while attention or a smooth nonlinearity runs
        self._norm_row = None  # elements per row of the layer_norm running now
        self._mode = None
        self._pending = _Pending()
        # The last batch_norm whose output a ReLU may be recomputed from:
        # (its autograd node, its input's saved form, a, b, the input's shape
        # and strides); one at a time.
        self._bn: tuple | None = None
        self._norm_input = None  # (weakref, form) of what the running normalisation layer saved first
        if _compiled.INLINE:
            # GraphModule hooks, one pair per configuration: torch.compile
            # inlines them into what it compiles (see _compiled.py); in eager
            # they call this block's _pack and the forms' unpack.
            self._hooks = _compiled.hooks_for(
                _compiled._Config(self.bits, self.block, self._block_given, self.norm_bits, self.nonlinear_bits,
                                  self.min_numel)
            )
            super().__init__(*self._hooks)
        else:
            self._hooks = None
            super().__init__(self._pack, self._unpack)

    @staticmethod
    def _width(name: str, value) -> int:
        """A code width argument: 4, 8, 16 (kept as they are), or None (8)."""
        if value is None:
            return _SENSITIVE_BITS
        width = as_int(_WHERE, name, value)
        if width not in (4, 8, 16):
            raise ValueError(f"{_WHERE}: {name} must be 4, 8, 16 (kept as they are) or None, got {value!r}")
        return width

    def __enter__(self):
        self._seen.clear()
        self._bn = None
        self._norm_input = None
        self._pending = _Pending()
        self._calls = 0
        self._base = self.seed if self.seed is not None else _fresh_seed()
        self._kept_ids.clear()
        self._pool, self._in_norm, self._in_nonlinear, self._norm_row = None, 0, 0, None
        # Max-pool indices are coded relative to their windows: the pool's
        # geometry is read from the call (a thread-local torch-function mode).
        self._mode = _PoolGeometry(self)
        self._mode.__enter__()
        if self._hooks is not None:
            _compiled.push(self._hooks, self)
        try:
            super().__enter__()
        except BaseException:
            if self._hooks is not None:
                _compiled.pop(self._hooks, self)
            self._mode.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        self._pending.sweep(force=True)
        self._seen.clear()
        self._bn = None
        self._norm_input = None
        self._kept_ids.clear()
        try:
            return super().__exit__(*exc)
        finally:
            if self._hooks is not None:
                _compiled.pop(self._hooks, self)
            self._mode.__exit__(None, None, None)
            self._mode, self._pool = None, None

    # ---- what is packed --------------------------------------------------

    def _packable(self, t: torch.Tensor) -> bool:
        if type(t) is not torch.Tensor or t.dtype not in _act_pack._FLOAT:
            return False
        if t.numel() < max(self.min_numel, 1):
            return False
        dev = t.device.type
        if dev != "cpu" and not (dev == "cuda" and cuda_ops_loaded()):
            return False
        if t.grad_fn is None or _from_parameter(t):
            return False
        return type(t.grad_fn).__name__ not in _EXACT_OUTPUTS and not _act_pack.marked_exact(t)

    def _seed(self) -> int:
        k = self._calls
        self._calls += 1
        s = (self._base * 0x9E3779B97F4A7C15 + k * 0xBF58476D1CE4E5B9 + 1) & (2**64 - 1)
        return s - 2**64 if s >= 2**63 else s  # the op's int is int64

    def _pack(self, t: torch.Tensor, depth: int = 1):
        # (depth: frames up to the code saving t; the hook module adds one)
        form = self._form(t, sys._getframe(depth).f_code.co_filename)
        if self._in_norm and self._norm_input is None:
            # The first tensor a normalisation layer saves is its input.
            self._norm_input = (weakref.ref(t), form)
        return form

    def _form(self, t: torch.Tensor, caller: str):
        """The form ``t`` is saved in (``caller``: the file of the code saving it)."""
        if _AOT_MARK in caller:
            self._warn_compiled()
            self._count_kept(t)
            return _Kept(t)
        if caller != _CHECKPOINT_FILE:
            lossless = self._lossless(t)
            if lossless is not None:
                return lossless
        if caller == _CHECKPOINT_FILE or not self._packable(t):
            self._count_kept(t)
            return _Kept(t)
        packed = self._cached(t)
        if packed is not None:
            if isinstance(packed, _NormReLU):
                packed.uses += 1
            return packed
        if self.recompute_relu and type(t.grad_fn).__name__ == "ReluBackward0":
            derived = self._norm_relu(t)
            if derived is not None:
                return self._remember(t, derived)
        bits, block = self._width_now(), self.block
        if bits == 16:
            self._count_kept(t)
            return _Kept(t)
        if bits != self.bits and not self._block_given:
            block = _DEFAULT_BLOCK[bits]
        if self._in_norm and not self._block_given:
            block = _row_block(block, self._norm_row)
        # (No sweep here: the op saving ``t`` started after the last one, and
        # nothing the forward holds is released while it runs.)
        packed = _Packed(t, bits, block, self._seed(), lazy=_saved.LAZY)
        if packed.pending is not None:
            self._pending.add(packed)
        return self._remember(t, packed)

    def _width_now(self) -> int:
        """The code width for what the op running now saves (16: kept)."""
        if self._in_norm:
            return self.norm_bits
        if self._in_nonlinear:
            return self.nonlinear_bits
        return self.bits

    # ---- ReLU after BatchNorm: recomputed from the BatchNorm's input -----

    def _note_batch_norm(self, func, args, kwargs, out) -> None:
        """After a batch_norm call: if its output can be recomputed from the
        form its input was saved in, records how (``a``, ``b`` per channel),
        so a ReLU applied to that output saves only a mask (``_norm_relu``)."""
        node = getattr(out, "grad_fn", None)
        self._bn = None
        if type(out) is not torch.Tensor or type(node).__name__ != "NativeBatchNormBackward0":
            return  # (cuDNN's and MIOpen's nodes keep their statistics otherwise: packed as usual)
        bound = _bind_batch_norm(func, args, kwargs)
        if bound is None:
            return
        x, weight, bias, running_mean, running_var, training, eps = bound
        if type(x) is not torch.Tensor or x.dim() < 2 or x.shape != out.shape or x.stride() != out.stride():
            return
        # The form this call's node saved its input in, if this block's hook
        # saved it (not, e.g., inside a torch.utils.checkpoint region, whose
        # own hooks save it: its node's statistics are not read then).
        entry, self._norm_input = self._norm_input, None
        src = entry[1] if entry is not None and entry[0]() is x else None
        if not isinstance(src, (_Packed, _Kept)) or not _act_pack._is_dense(x) or x.numel() == 0:
            return
        if isinstance(src, _Packed) and src.strides != x.stride():
            return
        with torch.no_grad():
            if training:
                mean, invstd = node._saved_result1, node._saved_result2
            elif isinstance(running_mean, torch.Tensor) and isinstance(running_var, torch.Tensor):
                mean, invstd = running_mean, torch.rsqrt(running_var.float() + float(eps))
            else:
                return
            c = x.shape[1]
            if mean.numel() != c or invstd.numel() != c:
                return
            a = invstd.float() if weight is None else invstd.float() * weight.float()
            b = -mean.float() * a if bias is None else bias.float() - mean.float() * a
            if x.device.type == "cpu" and not _affine_checked(weight, x, training, out, a, b):
                return
        self._bn = (node, src, a, b, tuple(x.shape), x.stride())

    def _norm_relu(self, t: torch.Tensor):
        """A ReLU's output as a mask plus the BatchNorm input it is
        recomputed from, or None where it is not such an output."""
        nexts = t.grad_fn.next_functions
        prev = nexts[0][0] if len(nexts) == 1 else None
        entry = self._bn
        if entry is None or prev is None or entry[0] is not prev:
            return None
        _, src, a, b, shape, strides = entry  # (x's, which its form keeps: checked when noted)
        if tuple(t.shape) != shape or t.stride() != strides or not _act_pack._is_dense(t):
            return None
        derived = _NormReLU(t, src, a, b, lazy=_saved.LAZY)
        if derived.pending is not None:
            self._pending.add(derived)
        return derived

    def _cached(self, t: torch.Tensor):
        """The packed form of ``t`` at its current version, if it was packed (saved by an earlier op)."""
        entry = self._seen.get(id(t))
        if entry is not None and entry[0]() is t and entry[1] == t._version:
            return entry[2]()
        return None

    def _remember(self, t: torch.Tensor, packed):
        """Counts ``packed`` (the form of ``t`` that is saved) and keeps it for the next op saving ``t``."""
        key = id(t)
        self._seen[key] = (weakref.ref(t, lambda _r, k=key, s=self._seen: s.pop(k, None)), t._version, weakref.ref(packed))
        self.stats["packed"] += 1
        self.stats["packed_bytes"] += t.numel() * t.element_size()
        self.stats["packed_nbytes"] += packed.nbytes
        return packed

    def _lossless(self, t: torch.Tensor):
        """Max-pool indices, integer, bool and dropout-mask tensors in fewer
        bytes, exactly; None for anything else."""
        if type(t) is not torch.Tensor or t.numel() < max(self.min_numel, 1):
            return None
        pool = self._pool
        if t.dtype == torch.int64 and pool is not None and tuple(t.shape[:-2]) == pool[0]:
            kind = "pool"
        elif _narrowable(t, self.min_numel):
            kind = "narrow"
        elif t.dtype == torch.bool and t.device.type in ("cpu", "cuda"):
            kind = "bits"
        elif (t.dtype in _act_pack._FLOAT and t.grad_fn is None and not t.requires_grad
              and t.device.type == "cpu" and _act_pack._is_dense(t)):
            kind = "mask"  # CPU dropout's mask: zeros and 1 / (1 - p), no history
        else:
            return None
        packed = self._cached(t)
        if packed is not None:
            return packed
        if kind == "pool":
            codes = _PoolIndices.encode(t, pool[1])
            if codes is not None:
                packed = _PoolIndices(t, pool[1], codes)
            elif _narrowable(t, self.min_numel):
                kind = "narrow"
        if kind == "narrow":
            packed = _Narrowed(t)
            if packed.small is t:  # no narrower dtype holds it
                packed = None
        elif kind == "bits":
            packed = _Bits(t)
        elif kind == "mask":
            value = _two_valued(t.detach())
            if value is None:
                return None
            packed = _Bits(t, value)
        if packed is None:
            self._count_kept(t)
            return _Kept(t)
        return self._remember(t, packed)

    def _warn_compiled(self) -> None:
        if not self._warned_compiled:
            self._warned_compiled = True
            warnings.warn(
                f"{_WHERE}: the tensors a torch.compile'd region saves for backward are kept uncompressed "
                "(only what eager autograd saves is packed in this release): run the model eagerly inside "
                "the block to save activation memory, or compile only the parts around it",
                stacklevel=3,
            )

    def _count_kept(self, t: torch.Tensor) -> None:
        if type(t) is not torch.Tensor or t.device.type == "meta" or (t.is_leaf and t.requires_grad):
            return  # parameters are the model's, not the step's
        try:
            key = t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):
            return
        if key in self._kept_ids:
            return
        self._kept_ids[key] = None
        self.stats["kept"] += 1
        self.stats["kept_bytes"] += t.untyped_storage().nbytes()

    @staticmethod
    def _unpack(p):
        return p.unpack()


from ._planner import RECIPES, Recipe, checkpoint_blocks, format_plan, plan  # noqa: E402
from ._tracker import LiveTracker  # noqa: E402
