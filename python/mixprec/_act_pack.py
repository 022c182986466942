"""Compressed activations' ops (``torch.ops.mixprec.act_pack`` /
``act_unpack``): the functions, their fake kernels and their checks. The
format is [note: act_pack format] in ``mixprec/act_pack.h``: blocks of
``block`` elements in memory order, 8- or 4-bit codes, one float32 scale per
block, unbiased stochastic rounding from ``seed``; zeros stay zero and
non-zeros stay non-zero with their sign; a block holding an inf or NaN
unpacks to NaN. ``mixprec.memory.compressed_activations`` is the user's face.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from ._library import FLOAT_DTYPES as _FLOAT
from ._registration import _refuse_sparse, _same_device

__all__ = ["act_pack", "act_unpack", "act_mask", "act_unpack_norm_relu", "packed_nbytes", "keep_exact", "marked_exact", "BLOCK_MIN", "BLOCK_MAX"]

BLOCK_MIN, BLOCK_MAX = 32, 4096  # MIXPREC_ACT_BLOCK_MIN / _MAX

for _name in ("act_pack", "act_unpack", "act_mask", "act_unpack_norm_relu", "act_pool_encode", "act_pool_decode"):
    _refuse_sparse(_name)


def _check_format(op: str, bits, block) -> None:
    torch._check(
        isinstance(bits, int) and not isinstance(bits, bool) and bits in (8, 4),
        lambda: f"mixprec::{op}: bits must be 8 or 4, got {bits!r}",
    )
    torch._check(
        isinstance(block, int)
        and not isinstance(block, bool)
        and BLOCK_MIN <= block <= BLOCK_MAX
        and block & (block - 1) == 0,
        lambda: f"mixprec::{op}: block must be a power of two in [{BLOCK_MIN}, {BLOCK_MAX}], got {block!r}",
    )


def _code_bytes(n, bits: int):
    return n if bits == 8 else (n + 1) // 2


def _n_scales(n, block: int):
    return (n + block - 1) // block


def _nbytes(numel: int, bits: int, block: int) -> int:
    return _code_bytes(numel, bits) + 4 * _n_scales(numel, block)


def packed_nbytes(numel: int, bits: int, block: int) -> int:
    """Bytes of a packed tensor of ``numel`` elements (codes + scales)."""
    _check_format("packed_nbytes", bits, block)
    return _nbytes(numel, bits, block)


def _is_dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: the elements fill numel slots of memory in
    some order of dimensions (the shim's is_dense)."""
    if t.is_contiguous():
        return True
    dims = sorted(range(t.dim()), key=lambda d: (t.stride(d), t.shape[d]))
    expected = 1
    for d in dims:
        if t.shape[d] == 1:
            continue
        if t.stride(d) != expected:
            return False
        expected *= t.shape[d]
    return True


def act_pack(x: torch.Tensor, bits: int = 8, block: int = 256, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Packs ``x`` (float32 / float16 / bfloat16, dense in memory) into
    ``(codes, scales)``: uint8 ``[numel]`` (8 bits) or ``[ceil(numel / 2)]``
    (4 bits) and float32 ``[ceil(numel / block)]``, in ``x``'s memory order.
    ``seed`` (any int64) picks the stochastic rounding's bits; the result does
    not depend on threads, instruction set or device."""
    return torch.ops.mixprec.act_pack.default(x, bits, block, seed)


def act_unpack(
    codes: torch.Tensor, scales: torch.Tensor, numel: int, bits: int, block: int, dtype: torch.dtype
) -> torch.Tensor:
    """The ``numel`` values of a packed tensor as a flat ``dtype`` tensor (in
    the packed tensor's memory order)."""
    return torch.ops.mixprec.act_unpack.default(codes, scales, numel, bits, block, dtype)


@torch.library.register_fake("mixprec::act_pack")
def _act_pack_fake(x, bits, block, seed):
    op = "act_pack"
    torch._check(x.dtype in _FLOAT, lambda: f"mixprec::{op}: x must be float32, float16 or bfloat16, got {x.dtype}")
    _check_format(op, bits, block)
    torch._check(
        _is_dense(x),
        lambda: f"mixprec::{op}: x must be dense in memory (contiguous, channels_last or another permutation "
        "without gaps); call .contiguous() on it",
    )
    n = x.numel()
    return x.new_empty((_code_bytes(n, bits),), dtype=torch.uint8), x.new_empty((_n_scales(n, block),), dtype=torch.float32)


@torch.library.register_fake("mixprec::act_unpack")
def _act_unpack_fake(codes, scales, numel, bits, block, dtype):
    op = "act_unpack"
    _check_format(op, bits, block)
    torch._check(numel >= 0, lambda: f"mixprec::{op}: numel must be >= 0, got {numel}")
    torch._check(dtype in _FLOAT, lambda: f"mixprec::{op}: dtype must be float32, float16 or bfloat16, got {dtype}")
    torch._check(codes.dtype == torch.uint8, lambda: f"mixprec::{op}: codes must be a uint8 tensor")
    torch._check(scales.dtype == torch.float32, lambda: f"mixprec::{op}: scales must be a float32 tensor, got {scales.dtype}")
    torch._check(
        codes.dim() == 1 and codes.shape[0] == _code_bytes(numel, bits),
        lambda: f"mixprec::{op}: codes must have shape [{_code_bytes(numel, bits)}] for numel {numel} at {bits} bits, "
        f"got {list(codes.shape)}",
    )
    torch._check(
        scales.dim() == 1 and scales.shape[0] == _n_scales(numel, block),
        lambda: f"mixprec::{op}: scales must have shape [{_n_scales(numel, block)}] for numel {numel} and block {block}, "
        f"got {list(scales.shape)}",
    )
    torch._check(codes.is_contiguous(), lambda: f"mixprec::{op}: codes must be contiguous")
    torch._check(scales.is_contiguous(), lambda: f"mixprec::{op}: scales must be contiguous")
    _same_device(op, "codes", codes, ("scales", scales))
    return codes.new_empty((numel,), dtype=dtype)


def act_mask(x: torch.Tensor) -> torch.Tensor:
    """The set of ``x``'s positive elements (memory order; +inf counts, +-0
    and NaN do not) as bits: uint8 ``[ceil(numel / 8)]``, element ``i`` in
    bit ``i % 8`` of byte ``i // 8``."""
    return torch.ops.mixprec.act_mask.default(x)


def act_unpack_norm_relu(
    codes: torch.Tensor,
    scales: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    mask: torch.Tensor,
    numel: int,
    bits: int,
    block: int,
    inner: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """A ReLU's output recomputed from its BatchNorm's packed input: element
    ``i`` (memory order) of channel ``c = (i // inner) % a.numel()`` is
    ``max(x_i * a[c] + b[c], tiny)`` where ``mask`` (``act_mask`` of the
    ReLU's output) has its bit, else +0; ``x_i`` the float32 value
    ``act_unpack`` gives. [note: norm_relu recompute] in mixprec/act_pack.h."""
    return torch.ops.mixprec.act_unpack_norm_relu.default(codes, scales, a, b, mask, numel, bits, block, inner, dtype)


@torch.library.register_fake("mixprec::act_mask")
def _act_mask_fake(x):
    op = "act_mask"
    torch._check(x.dtype in _FLOAT, lambda: f"mixprec::{op}: x must be float32, float16 or bfloat16, got {x.dtype}")
    torch._check(
        _is_dense(x),
        lambda: f"mixprec::{op}: x must be dense in memory (contiguous, channels_last or another permutation "
        "without gaps); call .contiguous() on it",
    )
    return x.new_empty(((x.numel() + 7) // 8,), dtype=torch.uint8)


@torch.library.register_fake("mixprec::act_unpack_norm_relu")
def _act_unpack_norm_relu_fake(codes, scales, a, b, mask, numel, bits, block, inner, dtype):
    op = "act_unpack_norm_relu"
    _check_format(op, bits, block)
    torch._check(numel >= 0, lambda: f"mixprec::{op}: numel must be >= 0, got {numel}")
    torch._check(inner >= 1, lambda: f"mixprec::{op}: inner must be >= 1, got {inner}")
    torch._check(dtype in _FLOAT, lambda: f"mixprec::{op}: dtype must be float32, float16 or bfloat16, got {dtype}")
    torch._check(codes.dtype == torch.uint8, lambda: f"mixprec::{op}: codes must be a uint8 tensor")
    torch._check(scales.dtype == torch.float32, lambda: f"mixprec::{op}: scales must be a float32 tensor")
    torch._check(
        codes.dim() == 1 and codes.shape[0] == _code_bytes(numel, bits) and codes.is_contiguous(),
        lambda: f"mixprec::{op}: codes must be a contiguous [{_code_bytes(numel, bits)}] tensor for numel {numel} "
        f"at {bits} bits, got {list(codes.shape)}",
    )
    torch._check(
        scales.dim() == 1 and scales.shape[0] == _n_scales(numel, block) and scales.is_contiguous(),
        lambda: f"mixprec::{op}: scales must be a contiguous [{_n_scales(numel, block)}] tensor for numel {numel} "
        f"and block {block}, got {list(scales.shape)}",
    )
    torch._check(a.dim() == 1 and a.numel() >= 1, lambda: f"mixprec::{op}: a must be a 1-D tensor of at least one element")
    for name, t in (("a", a), ("b", b)):
        torch._check(t.dtype == torch.float32, lambda: f"mixprec::{op}: {name} must be a float32 tensor")
        torch._check(
            t.dim() == 1 and t.numel() == a.numel() and t.is_contiguous(),
            lambda: f"mixprec::{op}: {name} must be a contiguous 1-D tensor of {a.numel()} elements (a's), "
            f"got {list(t.shape)}",
        )
    torch._check(
        mask.dtype == torch.uint8 and mask.dim() == 1 and mask.shape[0] == (numel + 7) // 8 and mask.is_contiguous(),
        lambda: f"mixprec::{op}: mask must be a contiguous uint8 [{(numel + 7) // 8}] tensor for numel {numel}, "
        f"got {list(mask.shape)}",
    )
    _same_device(op, "codes", codes, ("scales", scales), ("a", a), ("b", b), ("mask", mask))
    return codes.new_empty((numel,), dtype=dtype)


_POOL_NAMES = ("W", "kH", "kW", "sH", "sW", "pH", "pW", "dH", "dW")


def _check_pool_geom(op: str, geom) -> None:
    for name, v, lo in zip(_POOL_NAMES, geom, (1, 1, 1, 1, 1, 0, 0, 1, 1)):
        torch._check(v >= lo, lambda: f"mixprec::{op}: {name} must be >= {lo}, got {v}")
    torch._check(
        geom[1] <= 255 and geom[2] <= 255 and geom[1] * geom[2] <= 255,
        lambda: f"mixprec::{op}: the window must have at most 255 elements (kH * kW), got {geom[1]} x {geom[2]}",
    )


@torch.library.register_fake("mixprec::act_pool_encode")
def _act_pool_encode_fake(idx, W, kH, kW, sH, sW, pH, pW, dH, dW):
    op = "act_pool_encode"
    torch._check(idx.dtype == torch.int64, lambda: f"mixprec::{op}: idx must be an int64 tensor, got {idx.dtype}")
    torch._check(idx.dim() >= 2, lambda: f"mixprec::{op}: idx must have at least 2 dimensions, got {list(idx.shape)}")
    torch._check(
        _is_dense(idx),
        lambda: f"mixprec::{op}: idx must be dense in memory (contiguous, channels_last or another permutation "
        "without gaps); call .contiguous() on it",
    )
    _check_pool_geom(op, (W, kH, kW, sH, sW, pH, pW, dH, dW))
    return idx.new_empty((idx.numel(),), dtype=torch.uint8), idx.new_empty((1,), dtype=torch.int64)


@torch.library.register_fake("mixprec::act_pool_decode")
def _act_pool_decode_fake(codes, HO, WO, s_ho, s_wo, W, kH, kW, sH, sW, pH, pW, dH, dW):
    op = "act_pool_decode"
    torch._check(
        codes.dtype == torch.uint8 and codes.dim() == 1 and codes.is_contiguous(),
        lambda: f"mixprec::{op}: codes must be a contiguous 1-D uint8 tensor",
    )
    torch._check(
        HO >= 1 and WO >= 1 and s_ho >= 1 and s_wo >= 1,
        lambda: f"mixprec::{op}: HO, WO, s_ho and s_wo must be >= 1, got {HO}, {WO}, {s_ho}, {s_wo}",
    )
    _check_pool_geom(op, (W, kH, kW, sH, sW, pH, pW, dH, dW))
    return codes.new_empty((codes.numel(),), dtype=torch.int64)


# ---- tensors mixprec's own autograd saves and needs exactly ---------------------

# The cross-entropy's logits (its backward exponentiates them): id -> weakref.
_exact: dict[int, Any] = {}


def keep_exact(t: torch.Tensor) -> None:
    """Marks ``t``, about to be saved by one of mixprec's autograd functions,
    as kept exactly by ``mixprec.memory.compressed_activations``."""
    if type(t) is not torch.Tensor:
        return
    key = id(t)
    _exact[key] = weakref.ref(t, lambda _r, k=key: _exact.pop(k, None))


def marked_exact(t: torch.Tensor) -> bool:
    ref = _exact.get(id(t))
    return ref is not None and ref() is t
