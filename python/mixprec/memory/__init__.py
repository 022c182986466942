"""Activation memory: keep what backward needs in fewer bits.

For CV models most of training memory is the activations autograd saves for
backward. Inside ``compressed_activations`` every floating activation saved
for backward is packed into 8-bit (default) or 4-bit blockwise codes with one
float32 scale per block, and unpacked when backward needs it::

    import mixprec.memory
    with mixprec.memory.compressed_activations(bits=8):
        loss = criterion(model(x), y)
    loss.backward()          # outside the context: unpacks as it goes

No change to the model: it works through ``torch.autograd.graph.
saved_tensors_hooks``, so it applies to any module, functional call or
custom autograd function run inside the ``with`` block.

What is packed, and what is kept exactly:

* packed: float32 / float16 / bfloat16 tensors of at least ``min_numel``
  elements that autograd saves and that came out of a differentiable op (a
  conv, BN, ReLU, GELU, LayerNorm, attention output...). A tensor saved by
  several ops (ReLU's output that is also the next conv's input) is packed
  once. Its original is freed as soon as the forward no longer uses it.
* narrowed losslessly: integer tensors of at least ``min_numel`` elements on
  the CPU (max-pool indices) go to the narrowest of uint8 / int16 / int32
  that holds their values (ResNet's stem max-pool: int64 -> int16).
* kept exactly: parameters and what is only a cast or view of one (autocast's
  weight copies), tensors with no autograd history (the input batch, frozen
  weights, buffers), bool tensors (dropout masks), integer tensors on a GPU,
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

Under ``torch.compile``: what a compiled region saves is kept uncompressed,
with a warning (AOTAutograd hands the hook plain tensors in which parameters
and activations cannot be told apart); eager parts of the model are packed.

Checks torch makes are kept: a saved tensor modified in place before
backward raises torch's "modified by an inplace operation" error; double
backward (``create_graph=True``) through a packed tensor is refused, since
the packed values are not the forward's.
"""

from __future__ import annotations

import itertools
import sys
import warnings
import weakref
from typing import Any

import torch
import torch.utils.checkpoint

from .. import _act_pack
from .._args import as_int
from .._library import cuda_ops_loaded

__all__ = ["compressed_activations", "plan", "format_plan", "Recipe", "RECIPES", "LiveTracker", "checkpoint_blocks"]

_WHERE = "mixprec.memory.compressed_activations"

# Default block per code width: 4-bit codes have 1/17 of the 8-bit ones'
# resolution, so they get smaller blocks (a scale per 32 elements: 0.125
# bytes per element on top of 0.5; resnet18's worst per-layer gradient cosine
# 0.979 against 0.976 at 64).
_DEFAULT_BLOCK = {8: 256, 4: 32}

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

# Per-process stream of pack calls: every packed tensor draws its own
# stochastic-rounding bits, reproducibly for a given program and seed.
_CALLS = itertools.count()


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


def _version_alias(t: torch.Tensor) -> torch.Tensor:
    """A tensor without storage that shares ``t``'s version counter, so an
    in-place change of ``t`` after it was packed is seen at unpack time
    without keeping ``t``'s memory alive. ``set_()`` bumps the shared
    counter; it is put back at once."""
    version = t._version
    alias = t.detach()
    alias.set_()
    torch._C._autograd._unsafe_set_version_counter((alias,), (version,))
    return alias


def _inplace_error(t_desc: str, saved: int, now: int) -> RuntimeError:
    return RuntimeError(
        "one of the variables needed for gradient computation has been modified by an inplace operation: "
        f"[{t_desc}] is at version {now}; expected version {saved} instead "
        f"(it was saved for backward under {_WHERE}). Hint: the in-place operation comes after the forward "
        "op that saved it; replace it with an out-of-place one."
    )


class _Kept:
    """A saved tensor kept as it is (torch's own version check, which a
    saved-tensor hook turns off, is done here)."""

    __slots__ = ("tensor", "version")

    def __init__(self, t: torch.Tensor):
        self.tensor = t
        self.version = t._version

    def unpack(self) -> torch.Tensor:
        if self.tensor._version != self.version:
            t = self.tensor
            raise _inplace_error(f"{t.type()} {list(t.shape)}", self.version, t._version)
        return self.tensor


class _Packed:
    """A saved tensor in codes + scales, with what unpacking needs."""

    __slots__ = ("codes", "scales", "shape", "strides", "dtype", "bits", "block", "alias", "version", "__weakref__")

    def __init__(self, t: torch.Tensor, bits: int, block: int, seed: int):
        src = t.detach()
        if not _act_pack._is_dense(src):
            src = src.contiguous()
        with torch.no_grad():
            self.codes, self.scales = torch.ops.mixprec.act_pack.default(src, bits, block, seed)
        self.shape, self.strides = tuple(src.shape), src.stride()
        self.dtype, self.bits, self.block = t.dtype, bits, block
        self.version = t._version
        self.alias = _version_alias(t)

    @property
    def nbytes(self) -> int:
        return self.codes.numel() + 4 * self.scales.numel()

    def unpack(self) -> torch.Tensor:
        if self.alias._version != self.version:
            raise _inplace_error(f"{self.dtype} {list(self.shape)}", self.version, self.alias._version)
        if torch.is_grad_enabled():
            raise RuntimeError(
                f"{_WHERE}: double backward (backward with create_graph=True, or a gradient of a gradient) "
                "through compressed activations is not supported: the saved tensors hold packed values, not "
                "the forward's. Run that forward outside compressed_activations."
            )
        numel = 1
        for s in self.shape:
            numel *= s
        flat = torch.ops.mixprec.act_unpack.default(self.codes, self.scales, numel, self.bits, self.block, self.dtype)
        return flat.as_strided(self.shape, self.strides)


def _narrowable(t: torch.Tensor, min_numel: int) -> bool:
    """Integer tensors kept losslessly in a narrower integer dtype: max-pool
    indices (int64 positions in a plane of the input: int16 for planes up to
    32767 elements, uint8 up to 255). On the CPU only: the range check reads
    the values, which on a GPU would synchronise."""
    return (
        type(t) is torch.Tensor
        and t.dtype in (torch.int64, torch.int32)
        and t.device.type == "cpu"
        and t.numel() >= max(min_numel, 1)
    )


class _Narrowed:
    """An integer tensor in the narrowest of uint8 / int16 / int32 that holds
    its values exactly (``small is`` the tensor itself when none does)."""

    __slots__ = ("small", "dtype", "alias", "version", "__weakref__")

    def __init__(self, t: torch.Tensor):
        lo, hi = (int(v) for v in torch.aminmax(t.detach()))
        self.small = t
        for dt in (torch.uint8, torch.int16, torch.int32):
            info = torch.iinfo(dt)
            if info.bits < torch.iinfo(t.dtype).bits and info.min <= lo and hi <= info.max:
                self.small = t.detach().to(dt)
                break
        self.dtype = t.dtype
        self.version = t._version
        self.alias = _version_alias(t) if self.small is not t else None

    def unpack(self) -> torch.Tensor:
        if self.alias._version != self.version:
            raise _inplace_error(f"{self.dtype} {list(self.small.shape)}", self.version, self.alias._version)
        return self.small.to(self.dtype)


class compressed_activations(torch.autograd.graph.saved_tensors_hooks):
    """Packs the activations saved for backward inside the ``with`` block
    (see the module's docstring for what is packed and what is kept).

    Args:
        bits: 8 (default; about half the bytes of BF16 activations) or 4
            (about a quarter; a larger gradient error).
        block: elements per float32 scale, a power of two in [32, 4096];
            default 256 for 8 bits, 32 for 4 bits.
        seed: the stochastic rounding's seed; with the same seed and program
            the codes are the same on any thread count or device.
        min_numel: tensors with fewer elements are kept as they are.

    After the block, ``stats`` holds what was saved: ``packed`` / ``kept``
    (tensors, each storage once; parameters not counted), ``packed_bytes``
    (the originals' bytes), ``packed_nbytes`` (their codes and scales),
    ``kept_bytes``. The activation memory of the step is ``packed_nbytes +
    kept_bytes``.
    """

    def __init__(self, bits: int = 8, *, block: int | None = None, seed: int = 0, min_numel: int = 16384):
        self.bits = as_int(_WHERE, "bits", bits)
        if self.bits not in (8, 4):
            raise ValueError(f"{_WHERE}: bits must be 8 or 4, got {bits!r}")
        if block is None:
            self.block = _DEFAULT_BLOCK[self.bits]
        else:
            self.block = as_int(_WHERE, "block", block)
            if not (_act_pack.BLOCK_MIN <= self.block <= _act_pack.BLOCK_MAX and self.block & (self.block - 1) == 0):
                raise ValueError(
                    f"{_WHERE}: block must be a power of two in [{_act_pack.BLOCK_MIN}, {_act_pack.BLOCK_MAX}], "
                    f"got {block!r}"
                )
        self.seed = as_int(_WHERE, "seed", seed, low=-(2**63), high=2**64 - 1) & (2**64 - 1)
        self.min_numel = as_int(_WHERE, "min_numel", min_numel, low=0)
        self.stats: dict[str, int] = {"packed": 0, "kept": 0, "packed_bytes": 0, "packed_nbytes": 0, "kept_bytes": 0}
        self._seen: dict[int, tuple[Any, int, Any]] = {}
        self._kept_ids: dict[int, Any] = {}
        self._warned_compiled = False
        super().__init__(self._pack, self._unpack)

    def __enter__(self):
        self._seen.clear()
        self._kept_ids.clear()
        super().__enter__()
        return self

    def __exit__(self, *exc):
        self._seen.clear()
        self._kept_ids.clear()
        return super().__exit__(*exc)

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
        k = next(_CALLS)
        s = (self.seed * 0x9E3779B97F4A7C15 + k * 0xBF58476D1CE4E5B9 + 1) & (2**64 - 1)
        return s - 2**64 if s >= 2**63 else s  # the op's int is int64

    def _pack(self, t: torch.Tensor):
        caller = sys._getframe(1).f_code.co_filename
        if _AOT_MARK in caller:
            self._warn_compiled()
            self._count_kept(t)
            return _Kept(t)
        if caller != _CHECKPOINT_FILE and _narrowable(t, self.min_numel):
            return self._narrow(t)
        if caller == _CHECKPOINT_FILE or not self._packable(t):
            self._count_kept(t)
            return _Kept(t)
        entry = self._seen.get(id(t))
        if entry is not None and entry[0]() is t and entry[1] == t._version:
            packed = entry[2]()
            if packed is not None:
                return packed
        packed = _Packed(t, self.bits, self.block, self._seed())
        key = id(t)
        self._seen[key] = (weakref.ref(t, lambda _r, k=key, s=self._seen: s.pop(k, None)), t._version, weakref.ref(packed))
        self.stats["packed"] += 1
        self.stats["packed_bytes"] += t.numel() * t.element_size()
        self.stats["packed_nbytes"] += packed.nbytes
        return packed

    def _narrow(self, t: torch.Tensor):
        entry = self._seen.get(id(t))
        if entry is not None and entry[0]() is t and entry[1] == t._version and entry[2]() is not None:
            return entry[2]()
        packed = _Narrowed(t)
        if packed.small is t:  # no narrower dtype holds it
            self._count_kept(t)
            return _Kept(t)
        key = id(t)
        self._seen[key] = (weakref.ref(t, lambda _r, k=key, s=self._seen: s.pop(k, None)), t._version, weakref.ref(packed))
        self.stats["packed"] += 1
        self.stats["packed_bytes"] += t.numel() * t.element_size()
        self.stats["packed_nbytes"] += packed.small.numel() * packed.small.element_size()
        return packed

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
