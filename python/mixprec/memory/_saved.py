"""The forms a saved tensor takes inside ``compressed_activations``: kept as
it is, packed into blockwise codes (lazily: once only autograd holds it),
narrowed to a smaller integer dtype, max-pool indices in their windows, or a
mask at one bit per element. Each has ``unpack()`` and checks torch's
in-place version rule itself (a saved-tensor hook turns torch's off)."""

from __future__ import annotations

import contextlib
import weakref

import torch

from .. import _act_pack

_WHERE = "mixprec.memory.compressed_activations"

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


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A dense tensor's elements in memory order, as a 1-D view."""
    return t.as_strided((t.numel(),), (1,))


def _inplace_error(t_desc: str, saved: int, now: int) -> RuntimeError:
    return RuntimeError(
        "one of the variables needed for gradient computation has been modified by an inplace operation: "
        f"[{t_desc}] is at version {now}; expected version {saved} instead "
        f"(it was saved for backward under {_WHERE}). Hint: the in-place operation comes after the forward "
        "op that saved it; replace it with an out-of-place one."
    )


def _no_double_backward() -> None:
    if torch.is_grad_enabled():
        raise RuntimeError(
            f"{_WHERE}: double backward (backward with create_graph=True, or a gradient of a gradient) "
            "through compressed activations is not supported: the saved tensors hold packed values, not "
            "the forward's. Run that forward outside compressed_activations."
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

    def flat_range(self, start: int, stop: int) -> torch.Tensor:
        """Elements [start, stop) in memory order (the tensor is dense)."""
        return _flat(self.unpack())[start:stop]


class _Packed:
    """A saved tensor in codes + scales, with what unpacking needs.

    Packed lazily: at save time it holds a storage-sharing alias of the
    tensor (no new memory: the forward still holds the original) and is
    packed by ``resolve()`` once that alias is the last holder of the
    storage (``_Pending.sweep``: the forward has dropped the original),
    or when the ``with`` block ends. So a tensor the forward keeps using
    (a feature pyramid kept for the heads, an output kept for the loss)
    never exists in both forms at once. The rounding seed is fixed at save
    time, so the codes do not depend on when the packing happens."""

    __slots__ = (
        "codes", "scales", "shape", "strides", "dtype", "bits", "block", "alias", "version",
        "seed", "pending", "stream", "nbytes", "__weakref__",
    )

    def __init__(self, t: torch.Tensor, bits: int, block: int, seed: int, *, lazy: bool = False):
        src = t.detach()
        if not _act_pack._is_dense(src):
            src = src.contiguous()
            lazy = False  # the copy is ours alone: pack it now and free it
        self.shape, self.strides = tuple(src.shape), src.stride()
        self.dtype, self.bits, self.block, self.seed = t.dtype, bits, block, seed
        self.version = t._version
        self.alias = _version_alias(t)
        self.codes = self.scales = None
        self.nbytes = _act_pack._nbytes(src.numel(), bits, block)  # (bits, block checked by the block)
        self.stream = torch.cuda.current_stream(src.device) if src.device.type == "cuda" else None
        self.pending = src
        if not lazy:
            self.resolve()

    def resolve(self) -> None:
        """Packs the held tensor now (unless it was changed in place since
        it was saved: then unpack raises torch's error) and lets it go."""
        src, self.pending = self.pending, None
        if src is None:
            return
        if src._version != self.version:
            return  # unpack's version check raises torch's error
        stream = torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
        with torch.no_grad(), stream:
            self.codes, self.scales = torch.ops.mixprec.act_pack.default(src, self.bits, self.block, self.seed)

    def _check(self) -> None:
        if self.alias._version != self.version:  # (also where resolve() found it changed and did not pack)
            raise _inplace_error(f"{self.dtype} {list(self.shape)}", self.version, self.alias._version)
        _no_double_backward()

    def unpack(self) -> torch.Tensor:
        self._check()
        if self.pending is not None:  # backward inside the block, before this one was packed: exact
            return self.pending
        numel = 1
        for s in self.shape:
            numel *= s
        flat = torch.ops.mixprec.act_unpack.default(self.codes, self.scales, numel, self.bits, self.block, self.dtype)
        return flat.as_strided(self.shape, self.strides)

    def flat_range(self, start: int, stop: int) -> torch.Tensor:
        """Elements [start, stop) in memory order; ``start`` a multiple of
        the block (each block unpacks on its own)."""
        self._check()
        if self.pending is not None:
            return _flat(self.pending)[start:stop]
        assert start % self.block == 0, (start, self.block)
        c0, c1 = (start, stop) if self.bits == 8 else (start // 2, (stop + 1) // 2)
        s0, s1 = start // self.block, -(-stop // self.block)
        return torch.ops.mixprec.act_unpack.default(
            self.codes[c0:c1], self.scales[s0:s1], stop - start, self.bits, self.block, self.dtype
        )


# Lazy packing reads a storage's use count; without it (a torch that lacks
# this private function) every tensor is packed when it is saved.
LAZY = hasattr(torch._C, "_storage_Use_Count")


class _Pending:
    """The ``_Packed`` of one ``with`` block still waiting to be packed, each
    with its storage's address (``_cdata``, valid while the waiting alias
    holds the storage). Weak references: a graph dropped without backward
    frees them."""

    def __init__(self):
        self.items: list = []  # (weakref to a _Packed, its storage's _cdata)
        self._busy = False

    def _live(self) -> list:
        """(``_Packed``, item) of those still waiting (alive, not packed)."""
        live = []
        for item in self.items:
            p = item[0]()
            if p is not None and p.pending is not None:
                live.append((p, item))
        return live

    def waiting(self) -> list:
        """The ``_Packed`` still waiting."""
        return [p for p, _ in self._live()]

    def add(self, packed: _Packed) -> None:
        self.items.append((weakref.ref(packed), packed.pending.untyped_storage()._cdata))

    def sweep(self, force: bool = False) -> None:
        """Packs those whose storage only this block still holds (all of
        them with ``force``). Called before each op of the block: cheap
        when nothing can be packed yet (a use count per waiting tensor)."""
        if self._busy or not self.items:
            return
        self._busy = True
        try:
            live = self._live()
            if force:
                for p, _ in live:
                    p.resolve()
                self.items = []
                return
            ours: dict[int, int] = {}
            for _, (_, c) in live:
                ours[c] = ours.get(c, 0) + 1
            waiting = []
            use_count = torch._C._storage_Use_Count
            for p, item in live:
                c = item[1]
                # - 1: the storage's Python object, made by add() and kept by
                # torch for the storage's life. (Were it not kept, the count
                # would read one low and a tensor be packed early: the
                # forward's copy and the codes at once for a while, the
                # eager behaviour; never a wrong value.)
                if use_count(c) - 1 <= ours[c]:
                    p.resolve()
                    ours[c] -= 1
                else:
                    waiting.append(item)
            self.items = waiting
        finally:
            self._busy = False


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

    @property
    def nbytes(self) -> int:
        return self.small.numel() * self.small.element_size()

    def unpack(self) -> torch.Tensor:
        if self.alias._version != self.version:
            raise _inplace_error(f"{self.dtype} {list(self.small.shape)}", self.version, self.alias._version)
        return self.small.to(self.dtype)


class _PoolIndices:
    """The int64 indices ``max_pool2d`` saves (``h * W + w`` in the input
    plane), one uint8 each: the offset ``kh * kW + kw`` in the element's
    window. ``geom`` = (W, kH, kW, sH, sW, pH, pW, dH, dW) of the pool."""

    __slots__ = ("codes", "geom", "shape", "strides", "alias", "version", "__weakref__")

    def __init__(self, t: torch.Tensor, geom: tuple, codes: torch.Tensor):
        self.codes, self.geom = codes, geom
        self.shape, self.strides = tuple(t.shape), t.stride()
        self.version = t._version
        self.alias = _version_alias(t)

    @property
    def nbytes(self) -> int:
        return self.codes.numel()

    @staticmethod
    def _origins(shape, geom, device):
        W, kH, kW, sH, sW, pH, pW, dH, dW = geom
        ho = torch.arange(shape[-2], device=device, dtype=torch.int64).mul_(sH).sub_(pH).view(-1, 1)
        wo = torch.arange(shape[-1], device=device, dtype=torch.int64).mul_(sW).sub_(pW)
        return ho, wo

    # Elements per slice of the index arithmetic (whole leading-dim slices):
    # its int64 temporaries stay small whatever the batch, so they add no
    # per-sample memory.
    _CHUNK = 1 << 12

    @classmethod
    def _slices(cls, shape):
        per = 1
        for d in shape[1:]:
            per *= d
        step = max(1, cls._CHUNK // max(per, 1))
        return [(s, min(s + step, shape[0])) for s in range(0, shape[0], step)]

    @classmethod
    def encode(cls, t: torch.Tensor, geom: tuple) -> torch.Tensor | None:
        """The codes, or None where they would not be exact (checked on the
        CPU; on a GPU the pool's geometry guarantees it)."""
        W, kH, kW, sH, sW, pH, pW, dH, dW = geom
        idx = t.detach()
        if cls._fused(idx.shape, geom) and _act_pack._is_dense(idx):  # one C / CUDA pass
            codes, inexact = torch.ops.mixprec.act_pool_encode.default(idx, *geom)
            if idx.device.type == "cpu" and int(inexact[0]) != 0:
                return None
            return codes.as_strided(idx.shape, idx.stride())
        ho, wo = cls._origins(idx.shape, geom, idx.device)
        codes = torch.empty_like(idx, dtype=torch.uint8)
        with torch.no_grad():
            for a, b in cls._slices(idx.shape):
                i = idx[a:b]
                h = torch.div(i, W, rounding_mode="floor")
                w = i - h * W
                h.sub_(ho).div_(dH, rounding_mode="floor")
                w.sub_(wo).div_(dW, rounding_mode="floor")
                code = h.mul_(kW).add_(w)
                del w
                codes[a:b].copy_(code)
                del code
                # A code outside [0, 256) wrapped in uint8 and does not decode back.
                if idx.device.type == "cpu" and not torch.equal(cls._decode(codes[a:b], geom, ho, wo), i):
                    return None
        return codes

    @staticmethod
    def _fused(shape, geom) -> bool:
        """Whether act_pool_encode / _decode take it: at least 2-D, a window
        of at most 255 elements (255 is their "not in the window" code)."""
        return len(shape) >= 2 and geom[1] * geom[2] <= 255

    @staticmethod
    def _decode(codes, geom, ho, wo):
        W, kH, kW, sH, sW, pH, pW, dH, dW = geom
        c = codes.to(torch.int64)
        kh = torch.div(c, kW, rounding_mode="floor")
        c.sub_(kh * kW).mul_(dW).add_(wo)  # w
        return kh.mul_(dH).add_(ho).mul_(W).add_(c)

    def unpack(self) -> torch.Tensor:
        if self.alias._version != self.version:
            raise _inplace_error(f"torch.LongTensor {list(self.shape)}", self.version, self.alias._version)
        if self._fused(self.shape, self.geom) and _act_pack._is_dense(self.codes):
            HO, WO = self.shape[-2], self.shape[-1]
            s_ho = self.strides[-2] if HO > 1 else 1
            s_wo = self.strides[-1] if WO > 1 else 1
            flat = torch.ops.mixprec.act_pool_decode.default(_flat(self.codes), HO, WO, s_ho, s_wo, *self.geom)
            return flat.as_strided(self.shape, self.strides)
        ho, wo = self._origins(self.shape, self.geom, self.codes.device)
        idx = torch.empty_strided(self.shape, self.strides, dtype=torch.int64, device=self.codes.device)
        for a, b in self._slices(self.shape):
            idx[a:b].copy_(self._decode(self.codes[a:b], self.geom, ho, wo))
        return idx


_BIT_WEIGHTS = {}


def _bit_weights(device) -> torch.Tensor:
    w = _BIT_WEIGHTS.get(device)
    if w is None:
        w = _BIT_WEIGHTS[device] = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8, device=device)
    return w


def _pack_bits(m: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """A fresh 1-D uint8 tensor of 0s and 1s (changed in place) as bits, 8
    per byte, the first element in the lowest bit; into ``out`` if given."""
    pad = (-m.numel()) % 8
    if pad:
        m = torch.cat([m, m.new_zeros(pad)])
    return torch.sum(m.view(-1, 8).mul_(_bit_weights(m.device)), 1, dtype=torch.uint8, out=out)


def _unpack_bits(bits: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` bits of ``bits`` (``_pack_bits``' layout) as a 1-D bool tensor."""
    return bits.view(-1, 1).bitwise_and(_bit_weights(bits.device)).ne(0).view(-1)[:n]


class _Bits:
    """A bool mask (or a tensor of zeros and one value ``value``) at one bit
    per element."""

    __slots__ = ("bits", "numel", "shape", "strides", "dtype", "value", "alias", "version", "__weakref__")

    def __init__(self, t: torch.Tensor, value: torch.Tensor | None = None):
        src = t.detach()
        if not _act_pack._is_dense(src):
            src = src.contiguous()
        self.shape, self.strides = tuple(src.shape), src.stride()
        self.numel, self.dtype, self.value = src.numel(), t.dtype, value
        with torch.no_grad():
            flat = _flat(src)  # memory order (src is dense)
            m = (flat != 0).to(torch.uint8) if value is not None else flat.to(torch.uint8)
            self.bits = _pack_bits(m)
        self.version = t._version
        self.alias = _version_alias(t)

    @property
    def nbytes(self) -> int:
        return self.bits.numel()

    def unpack(self) -> torch.Tensor:
        if self.alias._version != self.version:
            raise _inplace_error(f"{self.dtype} {list(self.shape)}", self.version, self.alias._version)
        m = _unpack_bits(self.bits, self.numel)
        out = m if self.value is None else m.to(self.dtype).mul_(self.value)
        return out.as_strided(self.shape, self.strides)  # the memory order it was read in


def _two_valued(t: torch.Tensor) -> torch.Tensor | None:
    """The positive value c if ``t`` (a CPU float tensor) holds only 0 and c."""
    c = t.max()
    if not bool((c > 0) & c.isfinite()):  # inf * 0 would not come back as 0
        return None
    return c if bool(((t == 0) | (t == c)).all()) else None


# Elements per slice when a mask is made or a recomputed ReLU output is
# written (whole samples, or one sample where a sample is larger): the
# temporaries (about 10 bytes per element of the slice) stay a constant
# whatever the batch, so they add nothing per sample to the peak. Larger on
# a GPU, where each slice is a few kernel launches.
def _fused_norm_relu():
    """torch.ops.mixprec.act_unpack_norm_relu (a module attribute ``_FUSED``
    stands in for it when set: the tests' spy)."""
    return globals().get("_FUSED") or torch.ops.mixprec.act_unpack_norm_relu.default


def _slice(device) -> int:
    return 1 << (22 if device.type == "cuda" else 16)


class _NormReLU:
    """The output of a ReLU applied to a BatchNorm's output, not stored:
    backward recomputes it as ``relu(a * x + b)`` from the BatchNorm's saved
    input ``x`` (the form that BatchNorm saved it in: packed or kept) and
    the per-channel ``a = weight * invstd``, ``b = bias - mean * a``, with
    the exact set of non-zeros kept as one bit per element: an element the
    forward left positive comes back positive (at least the dtype's smallest
    normal), every other one as +0, so the ReLU's mask is exact and the
    values are as close as ``x``'s form. One bit per element in place of
    the output's codes. Made lazily, like ``_Packed``: the mask is taken
    once the forward has let go of the output."""

    __slots__ = (
        "src", "a", "b", "shape", "strides", "dtype", "numel", "mask", "alias", "version", "pending",
        "nbytes", "uses", "_left", "_last", "__weakref__",
    )

    def __init__(self, t: torch.Tensor, src, a: torch.Tensor, b: torch.Tensor, *, lazy: bool = False):
        self.src = src
        view = (1, -1) + (1,) * (t.dim() - 2)
        self.a, self.b = a.reshape(view), b.reshape(view)
        self.shape, self.strides, self.dtype = tuple(t.shape), t.stride(), t.dtype
        self.numel = t.numel()
        self.version = t._version
        self.alias = _version_alias(t)
        self.mask = None
        self.nbytes = (self.numel + 7) // 8
        # Ops that saved it (the ReLU and the next conv): backward unpacks it
        # once per op, one right after the other, so the recomputed tensor is
        # kept from the first of a backward's unpacks to its last.
        self.uses, self._left, self._last = 1, 0, None
        self.pending = t.detach()
        if not lazy:
            self.resolve()

    def resolve(self) -> None:
        """Takes the mask of the held output now and lets it go."""
        src, self.pending = self.pending, None
        if src is None or src._version != self.version:
            return  # (changed in place: unpack raises torch's error)
        if _act_pack._is_dense(src):  # one pass in C / CUDA (act_mask: the same bits)
            self.mask = torch.ops.mixprec.act_mask.default(src)
            return
        flat = _flat(src)
        mask = torch.empty(self.nbytes, dtype=torch.uint8, device=src.device)
        with torch.no_grad():
            step = _slice(src.device)
            for s in range(0, self.numel, step):
                e = min(s + step, self.numel)
                _pack_bits(flat[s:e].gt(0).to(torch.uint8), out=mask[s // 8 : (e + 7) // 8])
        self.mask = mask

    def unpack(self) -> torch.Tensor:
        if self.alias._version != self.version:
            raise _inplace_error(f"{self.dtype} {list(self.shape)}", self.version, self.alias._version)
        _no_double_backward()
        if self.pending is not None:  # backward inside the block, before the mask was taken: exact
            return self.pending
        if self._left > 0:
            out = self._last
            self._left -= 1
            if self._left == 0:
                self._last = None
            return out
        out = self._recompute()
        if self.uses > 1:
            self._last, self._left = out, self.uses - 1
        return out

    def _inner(self) -> int | None:
        """Elements per channel run in memory order: H * W (...) for a
        contiguous tensor, 1 for channels_last or (N, C); None for another
        layout."""
        shape, strides = self.shape, self.strides
        if len(shape) < 2:
            return None
        meta = torch.empty_strided(shape, strides, device="meta")
        if meta.is_contiguous():
            inner = 1
            for d in shape[2:]:
                inner *= d
            return inner
        fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(len(shape))
        if fmt is not None and meta.is_contiguous(memory_format=fmt):
            return 1
        return None

    def _recompute(self) -> torch.Tensor:
        src = self.src
        if isinstance(src, _Packed):
            src._check()
            inner = self._inner() if src.pending is None else None
            if inner is not None:  # one fused pass: act_unpack_norm_relu
                a = self.a.reshape(-1).to(torch.float32).contiguous()
                b = self.b.reshape(-1).to(torch.float32).contiguous()
                flat = _fused_norm_relu()(
                    src.codes, src.scales, a, b, self.mask, self.numel, src.bits, src.block, inner, self.dtype
                )
                return flat.as_strided(self.shape, self.strides)
        out = torch.empty_strided(self.shape, self.strides, dtype=self.dtype, device=self.mask.device)
        n = self.shape[0]
        per = self.numel // n if n else 0
        # Whole samples per slice (a dense tensor's sample is one range of
        # memory), starting on a block of the source and a byte of the mask.
        step = max(1, _slice(self.mask.device) // max(per, 1))
        align = 8 * getattr(self.src, "block", 1)
        if per % align or self.strides[0] != per:  # (a sample is not one aligned range: one slice)
            step = n
        tiny = torch.finfo(self.dtype).tiny
        for n0 in range(0, n, step):
            n1 = min(n0 + step, n)
            s, e = n0 * per, n1 * per
            shape = (n1 - n0,) + self.shape[1:]
            x = self.src.flat_range(s, e).as_strided(shape, self.strides)
            v = torch.addcmul(self.b, x, self.a)  # float32 (a and b are)
            del x
            v.clamp_(min=tiny)
            m = _unpack_bits(self.mask[s // 8 : (e + 7) // 8], e - s)
            v.mul_(m.as_strided(shape, self.strides))
            del m
            out[n0:n1].copy_(v)
        return out
