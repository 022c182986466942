"""Lean optimizer state (issue 24): how ``mixprec.optim``'s AdamW / SGD hold
a parameter's FP32 master and moments in fewer bytes, and how that state is
created, saved, loaded, materialised in FP32 and counted.

Per param group (Transformer Engine's names):

- ``param_remainders=True`` (BF16 params): no FP32 master tensor; the master
  is the BF16 param plus a 16-bit remainder (``state["remainder"]``, int16,
  the param's shape), see [note: remainder encoding]. The fused step
  reconstructs the exact FP32 master, updates it and splits it again, so
  training follows the FP32-master mode's master bit for bit. 2 bytes per
  param instead of 4. FP32 params in such a group have no master to shrink
  and step as before; FP16 params are refused (a ValueError naming
  ``param_remainders``): their master is not FP16 plus 16 bits.
- ``exp_avg_dtype`` / ``exp_avg_sq_dtype`` (SGD: ``momentum_dtype``):
  ``torch.float32`` (4 bytes), ``torch.bfloat16`` (2 bytes, written with
  stochastic rounding seeded from the group's ``seed``) or ``torch.uint8``
  (8-bit blockwise: one code per element plus an FP32 absmax scale per block
  of 256 elements of the flattened tensor, ``state["exp_avg_scale"]`` etc.;
  the map is the kernel's, see [note: 8-bit moments]). ``max_exp_avg_sq``
  (amsgrad) stays FP32.

[note: remainder encoding] The kernel's (mixprec/optim.h [note:
remainders], mirrored here by ``split_master`` / ``join_master``): the
remainder is the master's low 16 bits; the param its high 16 bits rounded up
in magnitude when the low half is >= 0x8000 (as Transformer Engine's
``store_param_remainders``; the NaN and inf patterns kept in range), so the
param is the master rounded to nearest, ties away from zero: it differs
from round-to-nearest-even only at exact ties with an even high half, by
one BF16 ulp. A bijection, so the master round-trips exactly. A pair no split produced
(a param written from outside with a stale remainder) can join to NaN (param
+-0 with a negative remainder), so an outside write resets the param's
remainders to zero (the master becomes the written BF16 values exactly; the
elements the write left alone lose their sub-BF16 bits, < 1/2 BF16 ulp).

[note: 8-bit moments] The 8-bit moments are handed to the kernel as they
are (codes + scales, blocks of 256 in the order the kernel walks the tensor:
memory order, per tensor the op sees, so under FSDP2 / tensor parallel per
local shard, starting at its first element). Python only dequantises them
(``dequantize``: ``map[code] * scale``, the kernel's map) and quantises FP32
moments on load (``quantize``: the nearest code, per block the absmax
scale; a dequantised block gets back its codes and scale exactly).

[note: checkpoint format] ``state_dict()`` saves the state compact: the
remainder as its bits ([note: remainders saved as bits]), BF16 moments as BF16, and an 8-bit moment ``key`` as
``key + "_q8"`` (the uint8 codes, shaped like the param: a DTensor with
its placements for a DTensor param) and ``key + "_q8_scale"`` (FP32, shape
``[dim 0, numel / dim 0 / 256]``: the scale of each run of 256 elements of
each dim-0 row, a DTensor sharded like the param along dim 0). That row
form depends only on the param's global shape, so
torch.distributed.checkpoint reshards both tensors element by element
(rows never straddle FSDP2's dim-0 shards), and it is the kernel's own
blocks whenever a row is whole blocks and the state is contiguous: saved
and loaded as it is, bit for bit, on any layout (2 -> 1, 1 -> 2 ranks).
Where it is not (a param with fewer than 2 dims, rows of a size that is
not a multiple of 256, a channels_last or otherwise non-contiguous state,
a DTensor sharded on another dim), no layout-free compact form is exact,
and the moment is saved dequantised to FP32 under ``key`` (4 bytes per
element; the form torch's optimizers hold): reloaded on the same layout it
gives back the same codes and scales, on another one it is re-blocked
(within the 8-bit rounding). The codes are saved under their own key so
that a checkpoint of one format never fills a template of another by a
silent cast (torch.distributed.checkpoint then reports the missing key).
``load_state_dict`` takes this form, the FP32 one (``fp32_state_dict()``,
a torch optimizer's), the earlier all-FP32 8-bit one, and converts each to
the group's formats at the next step.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ._args import _takes
from ._distributed import is_dtensor, local

#: Elements per 8-bit block (one FP32 absmax scale each).
BLOCK = 256

MOMENT_DTYPES = (torch.float32, torch.bfloat16, torch.uint8)
#: The formats by the names state_dict() saves ([note: formats saved by name]).
_FORMAT_NAMES = {str(d).removeprefix("torch."): d for d in MOMENT_DTYPES}

#: Each optimizer's moment keys: state key -> group option naming its dtype.
ADAMW_MOMENTS = {"exp_avg": "exp_avg_dtype", "exp_avg_sq": "exp_avg_sq_dtype"}
SGD_MOMENTS = {"momentum_buffer": "momentum_dtype"}
#: exp_avg (and SGD's buffer) are signed; exp_avg_sq is not.
_UNSIGNED = frozenset({"exp_avg_sq"})


def scale_key(key: str) -> str:
    return f"{key}_scale"


def q8_key(key: str) -> str:
    """The saved codes of 8-bit moment ``key`` ([note: checkpoint format])."""
    return f"{key}_q8"


def q8_scale_key(key: str) -> str:
    """The saved row-form scales of 8-bit moment ``key``."""
    return f"{key}_q8_scale"


_ALL_MOMENTS = (*ADAMW_MOMENTS, *SGD_MOMENTS)


# [note: formats saved by name] The groups' state formats go into
# state_dict() as names ("float32", "bfloat16", "uint8"), not torch dtypes:
# torch.distributed.checkpoint's full_state_dict gather
# (get_state_dict(..., StateDictOptions(full_state_dict=True))) accepts only
# tensors, numbers, strings and containers in a state dict and raised
# "Unexpected value type <class 'torch.dtype'>" for every mixprec optimizer.
# load_state_dict turns names back into dtypes and still takes dtypes.
def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str) -> Any:
    """The format a saved name stands for; any other name as it is (the
    group check then names it)."""
    return _FORMAT_NAMES.get(name.removeprefix("torch."), name)


LEAN_STATE_KEYS = ("remainder", *map(scale_key, _ALL_MOMENTS))
SAVED_Q8_KEYS = (*map(q8_key, _ALL_MOMENTS), *map(q8_scale_key, _ALL_MOMENTS))

# [note: remainders saved as bits] state_dict() saves a param's int16
# remainder as its 16 bits in a bfloat16 tensor under "remainder_bits"
# (``.view(torch.int16)`` gives the remainder back): the full_state_dict
# gather of torch.distributed.checkpoint (FSDP2) all-gathers every state
# tensor, and neither gloo nor NCCL gathers int16 ("Invalid scalar type");
# BF16 they gather as raw bits. It is one form for every layout (plain and
# DTensor): DCP loads into the destination's dtypes with copy_, so a saved
# int16 meeting a BF16 destination (or the reverse) would be converted by
# value, silently; a new key instead makes DCP name a missing key.
# load_state_dict also takes "remainder" (int16: earlier checkpoints,
# Transformer Engine's dtype).
REMAINDER_BITS = "remainder_bits"


def remainder_bits(rem: torch.Tensor) -> torch.Tensor:
    """The saved form of a remainder: its bits as BF16 (a view, DTensor
    placements kept)."""
    return _like(rem, local(rem).view(torch.bfloat16))


def remainder_of_bits(bits: torch.Tensor, cls: str, key) -> torch.Tensor:
    """The int16 remainder of a saved ``remainder_bits`` (a view)."""
    if not isinstance(bits, torch.Tensor) or bits.dtype not in (torch.bfloat16, torch.int16):
        raise RuntimeError(
            f"mixprec.optim.{cls}.load_state_dict: state[{key!r}][{REMAINDER_BITS!r}] must be a bfloat16 tensor "
            f"(a remainder's bits, [note: remainders saved as bits]), got "
            f"{bits.dtype if isinstance(bits, torch.Tensor) else type(bits).__name__}")
    return _like(bits, local(bits).view(torch.int16))


# ---- group options ---------------------------------------------------------------


def _moment_dtype(w: str, name: str, value) -> torch.dtype:
    if not isinstance(value, torch.dtype):
        raise TypeError(f"{w}: {name} must be a torch.dtype (torch.float32, torch.bfloat16 or torch.uint8), got "
                        f"{type(value).__name__} {value!r}")
    if value not in MOMENT_DTYPES:
        raise ValueError(f"{w}: {name} must be torch.float32, torch.bfloat16 or torch.uint8 (8-bit blockwise), got "
                         f"{value!r}")
    return value


def lean_defaults(w: str, param_remainders, master_weights, moments: dict[str, Any]) -> dict[str, Any]:
    """The lean group keys, checked (``moments``: option name -> value;
    ``w``: the callable, for the errors)."""
    out = {"param_remainders": _remainders_flag(w, param_remainders, master_weights)}
    for name, value in moments.items():
        out[name] = _moment_dtype(w, name, value)
    return out


def _remainders_flag(w: str, value, master_weights) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{w}: param_remainders must be True or False, got {type(value).__name__} {value!r}")
    if value and not master_weights:
        raise ValueError(
            f"{w}: param_remainders=True needs master_weights=True (the remainder is the low half of an "
            "FP32 master; master_weights=False keeps none)"
        )
    return value


def check_group(w: str, group: dict[str, Any], moment_options) -> None:
    """A group's lean options as given (per-group dicts bypass ``__init__``'s
    checks; ``w`` names the callable): a value of the wrong kind raises a
    TypeError, a bad value or FP16 params under ``param_remainders`` a
    ValueError, each naming the option."""
    remainders = _remainders_flag(w, group.get("param_remainders", False), group.get("master_weights", True))
    for name in moment_options:
        _moment_dtype(w, name, group.get(name, torch.float32))
    if remainders:
        for i, p in enumerate(group["params"]):
            if p.dtype == torch.float16:
                raise ValueError(
                    f"{w}: param_remainders=True is for bfloat16 parameters; params[{i}] is float16 "
                    f"(shape {tuple(p.shape)}), whose FP32 master is not its value plus 16 bits: use "
                    "param_remainders=False (an FP32 master) for float16 parameters"
                )


def uses_remainder(group: dict[str, Any], p: torch.Tensor) -> bool:
    return bool(group.get("param_remainders", False)) and p.dtype == torch.bfloat16


def uses_stochastic_rounding(group: dict[str, Any], moment_options) -> bool:
    """Whether the group's step rounds anything stochastically (and so needs
    a seed): master-free BF16 params or BF16 moments."""
    return not group.get("master_weights", True) or any(
        group.get(n, torch.float32) == torch.bfloat16 for n in moment_options
    )


# ---- [note: remainder encoding] -------------------------------------------------


def split_master(master: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(BF16 param, int16 remainder) of an FP32 master: the kernel's
    ``mixprec__rem_split``."""
    bits = master.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    hi, lo = bits >> 16, bits & 0xFFFF
    mag = hi & 0x7FFF
    up = lo >= 0x8000
    p = torch.where(up & (mag < 0x7F80), hi + 1, hi)
    p = torch.where(up & (mag == 0x7F80), hi & 0x8000, p)
    return _as16(p, torch.bfloat16, master.shape), _as16(lo, torch.int16, master.shape)


def join_master(param: torch.Tensor, remainder: torch.Tensor) -> torch.Tensor:
    """The FP32 master of a BF16 param and its remainder (a new tensor):
    the kernel's ``mixprec__rem_join``."""
    hi = param.contiguous().view(torch.int16).to(torch.int64) & 0xFFFF
    lo = remainder.contiguous().to(torch.int64) & 0xFFFF
    mag = hi & 0x7FFF
    up = lo >= 0x8000
    hi = torch.where(up & (mag == 0), hi | 0x7F80, torch.where(up & (mag <= 0x7F80), hi - 1, hi))
    bits = (hi << 16) | lo
    return (bits - ((bits >> 31) << 32)).to(torch.int32).view(torch.float32).reshape(param.shape)


def _as16(words: torch.Tensor, dtype: torch.dtype, shape) -> torch.Tensor:
    """16-bit words (0..65535 in int64) as a 16-bit tensor of ``dtype``."""
    return (words - ((words >> 15) << 16)).to(torch.int16).view(dtype).reshape(shape)


def _memory_flat(t: torch.Tensor) -> torch.Tensor:
    """A dense tensor's elements in memory order (what the kernel walks, and
    so what the 8-bit blocks follow), as a 1-D view."""
    if t.is_contiguous():
        return t.view(-1)
    order = sorted(range(t.dim()), key=lambda d: -t.stride(d))
    return t.permute(order).contiguous().view(-1)


def _memory_flat_assign(dst: torch.Tensor, flat: torch.Tensor) -> None:
    """Writes ``flat`` (memory order) into the dense tensor ``dst``."""
    if dst.is_contiguous():
        dst.view(-1).copy_(flat)
        return
    order = sorted(range(dst.dim()), key=lambda d: -dst.stride(d))
    dst.permute(order).copy_(flat.view([dst.shape[d] for d in order]))


def num_blocks(numel: int) -> int:
    return (numel + BLOCK - 1) // BLOCK


_MAPS: dict[tuple[bool, torch.device], torch.Tensor] = {}


def code_map(signed: bool, device=None) -> torch.Tensor:
    """The FP32 value (times the block's scale) of each of the 256 codes,
    by code: the kernel's map (c_ops/src/optim_math.h ``mixprec__q8_decode``,
    [note: q8 map] in mixprec/optim.h)."""
    device = torch.device("cpu") if device is None else torch.device(device)
    key = (signed, device)
    if key not in _MAPS:
        _MAPS[key] = _kernel_map(signed).to(device)
    return _MAPS[key]


def _kernel_map(signed: bool) -> torch.Tensor:
    """bitsandbytes' dynamic tree map (torchao's ``create_dynamic_map``) in
    the kernel's code order: per decade d = 0..6 ([10^(d-7), 10^(d-6))) 2^L
    intervals (L = d signed, d + 1 unsigned), code 2^L + j standing for
    ``fma(j, step, first)`` with step = 9 * 10^(d-7) / 2^L and first =
    10^(d-7) + step / 2 each rounded to FP32 once (the double sum below is
    exact, so rounding it once is the kernel's fmaf); the signed map's
    bit 7 is the sign, code 0x80 is +1 and code 0 zero; the unsigned map's
    code 1 is 1."""
    def f32(x: float) -> float:
        return torch.tensor(x, dtype=torch.float64).float().item()

    out = torch.zeros(256, dtype=torch.float64)
    for q in range(1, 128) if signed else range(2, 256):
        L = q.bit_length() - 1
        d = L if signed else L - 1
        lower = (1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1)[d]  # the C's double literals
        step = lower * 9.0 / (1 << L)
        out[q] = f32((q - (1 << L)) * f32(step) + f32(lower + step * 0.5))
    if signed:
        out[0x81:] = -out[1:0x80]
        out[0x80] = 1.0
    else:
        out[1] = 1.0
    return out.to(torch.float32)


def dequantize(codes: torch.Tensor, scales: torch.Tensor, signed: bool) -> torch.Tensor:
    """FP32 values of 8-bit codes, ``map[code] * scale[block]``, laid out
    like ``codes`` (blocks of 256 in memory order, as the kernel walks
    them)."""
    flat = _memory_flat(codes).long()
    n = flat.numel()
    qmap = code_map(signed, codes.device)
    s = scales.reshape(-1).float().repeat_interleave(BLOCK)[:n]
    out = torch.empty_like(codes, dtype=torch.float32)
    _memory_flat_assign(out, qmap[flat] * s)
    return out


def quantize(values: torch.Tensor, signed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 codes laid out like ``values``, FP32 scales): per block of 256
    (memory order) the absmax scale, each value divided by it and given the
    nearest code. A block that is exactly ``map[c] * s`` (a dequantised
    one) gets back its codes and ``s``, also when its largest magnitude is
    negative, which the signed map holds only as ``map[0] * s`` (-0.993 s):
    where the absmax scale does not reproduce the block exactly, ``absmax /
    -map[0]`` and its FP32 neighbours (2 ulps either way: the division
    rounds) are tried, and the first that does is kept."""
    v = _memory_flat(values.detach().float())
    n = v.numel()
    nb = num_blocks(n)
    padded = torch.zeros(nb * BLOCK, dtype=torch.float32, device=v.device)
    padded[:n] = v
    blocks = padded.view(nb, BLOCK)
    finite = blocks.abs() <= torch.finfo(torch.float32).max
    absmax = torch.where(finite, blocks.abs(), 0.0).amax(1)  # the kernel's: finite values only
    qmap = code_map(signed, v.device)
    values_sorted, order = qmap.sort()
    mid = (values_sorted[1:] + values_sorted[:-1]) * 0.5

    def encode(scales):
        # A zero block keeps scale 0 (every code then reads 0).
        normed = blocks / torch.where(scales > 0, scales, torch.ones_like(scales))[:, None]
        return order[torch.bucketize(normed, mid, right=True)]

    def exact(c, scales):
        return (qmap[c] * scales[:, None] == blocks).all(1)

    codes = encode(absmax)
    scales = absmax
    if signed:
        done = exact(codes, absmax) | (absmax == 0)
        alt = absmax / -values_sorted[0]
        up, down = torch.full_like(alt, float("inf")), torch.zeros_like(alt)
        for cand in (alt, alt.nextafter(up), alt.nextafter(down), alt.nextafter(up).nextafter(up),
                     alt.nextafter(down).nextafter(down)):
            cand_codes = encode(cand)
            use = ~done & exact(cand_codes, cand)
            codes = torch.where(use[:, None], cand_codes, codes)
            scales = torch.where(use, cand, scales)
            done = done | use
    out = torch.empty_like(values, dtype=torch.uint8)
    _memory_flat_assign(out, codes.reshape(-1)[:n].to(torch.uint8))
    return out, scales


def signed_moment(key: str) -> bool:
    return key not in _UNSIGNED


# ---- state creation and conversion -----------------------------------------------


def new_moment(p: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Zero state for ``p`` in ``dtype`` (laid out like the param; a DTensor
    with its placements when it is one), and its scales for uint8 (the local
    tensor's blocks: a plain tensor)."""
    t = torch.zeros_like(p, dtype=dtype, memory_format=torch.preserve_format)
    if dtype != torch.uint8:
        return t, None
    return t, torch.zeros(num_blocks(local(p).numel()), dtype=torch.float32, device=local(p).device)


def moment_fp32(st: dict[str, Any], key: str) -> torch.Tensor | None:
    """State ``key`` in FP32 (a new tensor, DTensor when the state is one),
    or None when the param has none."""
    t = st.get(key)
    if not isinstance(t, torch.Tensor):
        return None
    if t.dtype != torch.uint8:
        return t.detach().to(torch.float32, copy=True)
    codes = local(t)
    values = dequantize(codes, st[scale_key(key)], signed_moment(key))
    return _like(t, values)


def _like(template: torch.Tensor, local_values: torch.Tensor) -> torch.Tensor:
    """``local_values`` wrapped as ``template`` is (DTensor placements kept)."""
    if not is_dtensor(template):
        return local_values
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(local_values, template.device_mesh, template.placements, run_check=False,
                              shape=template.shape, stride=template.stride())


def set_moment(st: dict[str, Any], key: str, p: torch.Tensor, dtype: torch.dtype) -> None:
    """Makes ``st[key]`` (present, any float or uint8 format) ``dtype``,
    values kept (rounded to nearest even for BF16, quantised for uint8)."""
    t = st[key]
    skey = scale_key(key)
    if t.dtype == dtype and (dtype != torch.uint8 or skey in st):
        return
    values = moment_fp32(st, key) if t.dtype == torch.uint8 else t
    st.pop(skey, None)
    if dtype != torch.uint8:
        st[key] = values.detach().to(dtype, copy=True)
        return
    codes, scales = quantize(local(values), signed_moment(key))
    st[key] = _like(p, codes)
    st[skey] = scales


# ---- [note: checkpoint format] --------------------------------------------------


def row_blocks(codes: torch.Tensor) -> int | None:
    """Blocks per dim-0 row of an 8-bit moment in the saved row form, or
    None when the kernel's blocks are not rows' runs of 256 (the moment is
    then saved in FP32)."""
    if codes.dim() < 2 or codes.numel() == 0:
        return None
    per_row = codes.numel() // codes.shape[0]
    if per_row % BLOCK or not local(codes).is_contiguous():
        return None
    if is_dtensor(codes):
        from torch.distributed.tensor import Replicate, Shard

        # _StridedShard (FSDP2 over tensor parallel) is a Shard subclass:
        # only plain dim-0 shards keep whole rows in each local tensor.
        if not all(type(pl) is Replicate or (type(pl) is Shard and pl.dim == 0) for pl in codes.placements):
            return None
    return per_row // BLOCK


def saved_moment(st: dict[str, Any], key: str) -> dict[str, torch.Tensor]:
    """What ``state_dict()`` saves for the 8-bit moment ``key``: the codes
    and the row-form scales, or its FP32 values."""
    codes = st[key]
    k = row_blocks(codes)
    if k is None:
        return {key: moment_fp32(st, key)}
    rows = st[scale_key(key)].view(local(codes).shape[0], k)
    if is_dtensor(codes):
        from torch.distributed.tensor import DTensor

        rows = DTensor.from_local(rows, codes.device_mesh, codes.placements, run_check=False,
                                  shape=(codes.shape[0], k), stride=(k, 1))
    return {q8_key(key): codes, q8_scale_key(key): rows}


def check_saved_moment(cls: str, key: str, p: torch.Tensor, codes, rows) -> None:
    """A RuntimeError naming the keys when a saved row-form 8-bit moment
    (codes, row scales) does not fit ``p``."""
    where = (f"mixprec.optim.{cls}.load_state_dict: the saved {q8_key(key)} / {q8_scale_key(key)} of a parameter "
             f"of shape {tuple(p.shape)}")
    if not isinstance(codes, torch.Tensor) or not isinstance(rows, torch.Tensor):
        raise RuntimeError(f"{where}: both must be tensors (one of the pair is missing)")
    if codes.dtype != torch.uint8 or tuple(codes.shape) != tuple(p.shape) or is_dtensor(codes) != is_dtensor(p):
        raise RuntimeError(f"{where}: the codes must be uint8 of the parameter's shape, and a DTensor exactly "
                           f"when the parameter is one; got {codes.dtype} of shape {tuple(codes.shape)}")
    k = row_blocks(codes)
    lc, lr = local(codes), local(rows)
    if (k is None or rows.dtype != torch.float32 or tuple(rows.shape) != (codes.shape[0], k)
            or lr.numel() != num_blocks(lc.numel())):
        raise RuntimeError(f"{where}: the scales must be float32 of shape (dim 0, numel / dim 0 / 256) sharded "
                           f"like the codes on dim 0; got {rows.dtype} of shape {tuple(rows.shape)} "
                           f"({lr.numel()} local for {lc.numel()} local codes)")


def load_saved_moment(st: dict[str, Any], key: str, p: torch.Tensor, codes, rows) -> None:
    """Installs a checked saved row-form 8-bit moment as ``st[key]`` /
    ``st[scale_key(key)]`` (copies on ``p``'s device)."""
    st[key] = codes.to(device=p.device, copy=True)
    st[scale_key(key)] = local(rows).to(device=local(p).device, dtype=torch.float32, copy=True).reshape(-1)


def set_remainder(st: dict[str, Any], p: torch.Tensor) -> None:
    """Turns a master (if any) into the param and its remainder; a param
    without one gets zero remainders (its master is its value)."""
    master = st.pop("master", None)
    lp = local(p)
    if isinstance(master, torch.Tensor):
        hi, rem = split_master(local(master).to(device=lp.device, dtype=torch.float32))
        lp.detach().copy_(hi.reshape(lp.shape))
        st["remainder"] = _like(p, rem.reshape(lp.shape))
    elif "remainder" not in st:
        st["remainder"] = torch.zeros_like(p, dtype=torch.int16, memory_format=torch.preserve_format)


def master_fp32(p: torch.Tensor, st: dict[str, Any]) -> torch.Tensor:
    """The FP32 master of ``p`` (a new tensor): the master, the joined
    remainder, or the param widened."""
    if "master" in st:
        return st["master"].detach().to(torch.float32, copy=True)
    if "remainder" in st:
        return _like(p, join_master(local(p).detach(), local(st["remainder"])))
    return p.detach().to(torch.float32, copy=True)


# ---- the memory report -----------------------------------------------------------


@dataclasses.dataclass
class MemoryReport:
    """Bytes of training state held on this process (local shards of
    DTensors), by kind. ``params`` / ``grads``: the optimizer's parameters and
    their gradients (a param without a gradient counts the gradient backward
    will allocate: its numel times its dtype's size); ``masters``: FP32 master
    copies; ``remainders``: the int16 remainders; ``moments``: exp_avg,
    exp_avg_sq, max_exp_avg_sq, momentum buffers, their 8-bit scales and the
    step counts; ``ema``: the FP32 EMA of the weights. State is created at a
    param's first step: before it only params and grads count."""

    numel: int = 0
    params: int = 0
    grads: int = 0
    masters: int = 0
    remainders: int = 0
    moments: int = 0
    ema: int = 0

    KINDS = ("params", "grads", "masters", "remainders", "moments", "ema")

    @property
    def total(self) -> int:
        return sum(getattr(self, k) for k in self.KINDS)

    @_takes()
    def per_param(self) -> dict[str, float]:
        """Bytes per parameter element, by kind and ``"total"``."""
        n = max(self.numel, 1)
        out = {k: getattr(self, k) / n for k in self.KINDS}
        out["total"] = self.total / n
        return out

    def __str__(self) -> str:
        per = self.per_param()
        rows = [f"{'kind':<11} {'bytes':>14} {'B/param':>8}"]
        for k in (*self.KINDS, "total"):
            b = self.total if k == "total" else getattr(self, k)
            rows.append(f"{k:<11} {b:>14,} {per[k]:>8.3f}")
        rows.append(f"{self.numel:,} parameter elements")
        return "\n".join(rows)


def _nbytes(t) -> int:
    if not isinstance(t, torch.Tensor):
        return 0
    lt = local(t)
    return lt.numel() * lt.element_size()


_STATE_KINDS = {"master": "masters", "remainder": "remainders", "ema": "ema"}


def memory_report(opt) -> MemoryReport:
    rep = MemoryReport()
    seen = set()
    for group in opt.param_groups:
        for p in group["params"]:
            if id(p) in seen:
                continue
            seen.add(id(p))
            lp = local(p)
            rep.numel += lp.numel()
            rep.params += _nbytes(p)
            rep.grads += _nbytes(p.grad) if p.grad is not None else lp.numel() * lp.element_size()
            for key, t in opt.state.get(p, {}).items():
                kind = _STATE_KINDS.get(key, "moments")
                setattr(rep, kind, getattr(rep, kind) + _nbytes(t))
    return rep


# ---- the optimizer side ----------------------------------------------------------


class LeanState:
    """Mixed into ``mixprec.optim``'s base class (before its state and
    checkpoint mixin, whose ``state_dict`` / ``load_state_dict`` these
    extend). ``_MOMENTS``: the class's moment keys and the options naming
    their dtypes."""

    _MOMENTS: dict[str, str] = {}

    # -- configuration

    def _keeps_master(self, group: dict[str, Any]) -> bool:
        """Whether the group's BF16/FP16 params hold an FP32 master tensor."""
        return group.get("master_weights", True) and not group.get("param_remainders", False)

    def _rounds_stochastically(self, group: dict[str, Any]) -> bool:
        return uses_stochastic_rounding(group, self._MOMENTS.values())

    # -- state in the group's formats

    def _lean_prepare(self, group: dict[str, Any], params) -> None:
        """Before a step: every param of a remainder group holds its master
        as a remainder (a master from a checkpoint or an earlier mode is
        split), and existing moments are in the group's dtypes (a changed
        option or a loaded state converts them once)."""
        for p in params:
            st = self.state[p]
            self._check_remainder_param(group, p)
            if uses_remainder(group, p):
                set_remainder(st, p)
            elif "remainder" in st:
                rem = st.pop("remainder")
                if self._keeps_master(group) or p.dtype != torch.bfloat16:
                    st["master"] = _like(p, join_master(local(p).detach(), local(rem)))
            for key, option in self._MOMENTS.items():
                if isinstance(st.get(key), torch.Tensor):
                    set_moment(st, key, p, group.get(option, torch.float32))

    def _check_remainder_param(self, group: dict[str, Any], p: torch.Tensor) -> None:
        if group.get("param_remainders", False) and p.dtype == torch.float16:
            raise ValueError(
                f"mixprec.optim.{type(self).__name__}.step: param_remainders=True is for bfloat16 parameters; a "
                f"float16 parameter (shape {tuple(p.shape)}) is in its group (it was converted after the optimizer "
                "was built?)"
            )

    def _new_moment(self, st: dict[str, Any], key: str, p: torch.Tensor, group: dict[str, Any]) -> None:
        dtype = group.get(self._MOMENTS.get(key, ""), torch.float32) if key in self._MOMENTS else torch.float32
        st[key], scales = new_moment(p, dtype)
        if scales is not None:
            st[scale_key(key)] = scales

    def _lean_state(self, states, key: str, op_params) -> list[torch.Tensor]:
        """The op's list for state ``key``: as ``_op_state``, except that an
        8-bit state whose layout no longer matches the param's is
        re-quantised in the new layout (its blocks follow memory order)."""
        out = []
        for st, w in zip(states, op_params):
            t = st[key]
            lt = local(t)
            if lt.dtype == torch.uint8 and lt.stride() != w.stride() and not is_dtensor(t) and lt.shape == w.shape:
                fresh = torch.empty_like(w, dtype=torch.float32).copy_(
                    dequantize(lt, st[scale_key(key)], signed_moment(key)))
                st[key], st[scale_key(key)] = quantize(fresh, signed_moment(key))
            out.append(self._fitted(st, key, w))
        return out

    def _lean_kwargs(self, group: dict[str, Any], states, op_params) -> dict[str, Any]:
        """The op's lean keywords for one (group, device) list: remainders
        (an empty int16 tensor where a param has none) and each 8-bit
        moment's scales (an empty FP32 tensor where it is not 8-bit); {}
        when the list has neither (the op's default path)."""
        kw: dict[str, Any] = {}
        if any("remainder" in st for st in states):
            kw["remainders"] = [
                self._fitted(st, "remainder", w) if "remainder" in st else w.new_empty(0, dtype=torch.int16)
                for st, w in zip(states, op_params)
            ]
        for key, arg in self._SCALE_ARGS.items():
            if any(scale_key(key) in st for st in states):
                kw[arg] = [
                    st[scale_key(key)] if scale_key(key) in st else w.new_empty(0, dtype=torch.float32)
                    for st, w in zip(states, op_params)
                ]
        return kw

    _SCALE_ARGS: dict[str, str] = {}

    def _fp32_weights(self, p: torch.Tensor, st: dict[str, Any]) -> torch.Tensor:
        """The FP32 weights of ``p`` as the step sees them (a new tensor)."""
        return master_fp32(p, st)

    def _forget_remainder(self, st: dict[str, Any]) -> None:
        """After an outside write (see [note: remainder encoding])."""
        if "remainder" in st:
            local(st["remainder"]).zero_()

    # -- what users call

    @_takes()
    def memory_report(self) -> MemoryReport:
        """Bytes of training state on this process by kind (params, grads,
        masters, remainders, moments with their scales and step counts,
        EMA), in total and per parameter element: see :class:`MemoryReport`
        (``print(opt.memory_report())`` for a table)."""
        return memory_report(self)

    @_takes("p")
    @torch.no_grad()
    def fp32_state(self, p: torch.Tensor) -> dict[str, Any]:
        """``p``'s state materialised in FP32, as torch's optimizer of the
        same kind holds it (``step``, ``exp_avg`` / ``exp_avg_sq`` /
        ``max_exp_avg_sq`` or ``momentum_buffer``), plus ``master`` (the
        FP32 master, joined from the remainder in remainder mode; for
        master-free and FP32 params the param widened) and ``ema`` when
        kept. New tensors (DTensors for DTensor params): writing them
        changes nothing here. A tensor that is not one of the optimizer's
        parameters raises (before its first step a parameter has no moments:
        only ``master``)."""
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"mixprec.optim.{type(self).__name__}.fp32_state: p must be a parameter (a tensor), got {type(p).__name__}")
        if not any(q is p for g in self.param_groups for q in g["params"]):
            raise ValueError(
                f"mixprec.optim.{type(self).__name__}.fp32_state: p (a tensor of shape {tuple(p.shape)}) is not one of this "
                "optimizer's parameters"
            )
        st = self.state.get(p, {})
        out: dict[str, Any] = {}
        for key, v in st.items():
            if key in LEAN_STATE_KEYS or key == "master":
                continue
            if key in ("exp_avg", "exp_avg_sq", "momentum_buffer"):
                out[key] = moment_fp32(st, key)
            elif isinstance(v, torch.Tensor):
                out[key] = v.detach().clone() if key == "step" else v.detach().to(torch.float32, copy=True)
            else:
                out[key] = v
        out["master"] = master_fp32(p, st)
        return out

    @_takes()
    def fp32_state_dict(self) -> dict[str, Any]:
        """``state_dict()`` with every param's state as :meth:`fp32_state`
        gives it: the form torch's optimizers load (torch's AdamW / SGD keep
        the extra ``master`` key and ignore it). Back to torch's optimizer
        (FP32 training), dequantised::

            sd = opt.fp32_state_dict()
            model.float()
            params = [p for g in opt.param_groups for p in g["params"]]
            with torch.no_grad():
                for i, p in enumerate(params):
                    if i in sd["state"]:
                        p.copy_(sd["state"][i]["master"])
            torch_opt = torch.optim.AdamW(model.parameters(), lr=...)
            torch_opt.load_state_dict(sd)
        """
        sd = torch.optim.Optimizer.state_dict(self)
        params = [p for g in self.param_groups for p in g["params"]]
        sd["state"] = {i: self.fp32_state(params[i]) for i in sd["state"]}
        for g in sd["param_groups"]:
            for k in ("param_remainders", *self._MOMENTS.values()):
                g.pop(k, None)
        return sd

    @_takes()
    def state_dict(self) -> dict[str, Any]:
        """torch's, with the state compact: remainders, BF16 moments as they
        are, 8-bit moments as codes and row-form scales ([note: checkpoint
        format]; FP32 where no layout-free form is exact). For torch's
        optimizers use :meth:`fp32_state_dict`."""
        sd = super().state_dict()
        for i, st in sd["state"].items():
            if not isinstance(st, dict):
                continue  # an entry a hook added (torch's own tests add some)
            if isinstance(st.get("remainder"), torch.Tensor):
                st = sd["state"][i] = dict(st)
                st[REMAINDER_BITS] = remainder_bits(st.pop("remainder"))
            for key in self._MOMENTS:
                if isinstance(st.get(key), torch.Tensor) and st[key].dtype == torch.uint8:
                    st = sd["state"][i] = dict(st)
                    saved = saved_moment(st, key)
                    del st[key], st[scale_key(key)]
                    st.update(saved)
        for g in sd["param_groups"]:
            for k in self._MOMENTS.values():
                if isinstance(g.get(k), torch.dtype):
                    g[k] = dtype_name(g[k])
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As the base class's; the groups' state formats may be saved as
        names (``state_dict()``) or as torch dtypes (older checkpoints)."""
        groups = state_dict.get("param_groups") if isinstance(state_dict, dict) else None
        if isinstance(groups, list) and any(
            isinstance(g, dict) and isinstance(g.get(k), str) for g in groups for k in self._MOMENTS.values()
        ):
            state_dict = dict(state_dict)
            state_dict["param_groups"] = [
                {**g, **{k: dtype_of(g[k]) for k in self._MOMENTS.values() if isinstance(g.get(k), str)}}
                if isinstance(g, dict) else g
                for g in groups
            ]
        super().load_state_dict(state_dict)

    def _check_loading(self, state_dict: dict[str, Any]) -> None:
        """Before torch's loader installs anything (after the user's
        pre-hooks): the whole state dict is checked (groups, their options
        against the params' dtypes, each param's saved state: see
        ``_optim_load``); a refusal names the key and leaves the optimizer
        as it was."""
        from ._optim_load import check_state_dict

        check_state_dict(self, state_dict)

    def _restore_fp32_state(self, state_dict: dict[str, Any]) -> None:
        """Inside load_state_dict, on the state dict the pre-hooks made and
        before the post-hooks ([note: load hooks]): the base class's restore
        (FP32 state kept FP32 where torch would cast it), keeping the
        compact state as saved (remainders, BF16 moments, 8-bit codes with
        their scales, [note: checkpoint format]); each param's state is then
        converted to its group's options (torch's FP32 moments quantised, a
        saved master split into a remainder, ...)."""
        saved_groups = state_dict.get("param_groups", [])
        id_map = dict(zip((k for g in saved_groups for k in g["params"]),
                          (p for g in self.param_groups for p in g["params"])))
        keep = (*LEAN_STATE_KEYS, *self._MOMENTS)
        compact, q8 = {}, {}
        for key, st in state_dict.get("state", {}).items():
            if isinstance(st, dict):
                compact[key] = {
                    k: v for k, v in st.items()
                    if k in keep and isinstance(v, torch.Tensor) and (k in LEAN_STATE_KEYS or v.dtype != torch.float32)
                }
                if REMAINDER_BITS in st:
                    compact[key]["remainder"] = remainder_of_bits(st[REMAINDER_BITS], type(self).__name__, key)
                q8[key] = {m: (st.get(q8_key(m)), st.get(q8_scale_key(m))) for m in self._MOMENTS
                           if q8_key(m) in st or q8_scale_key(m) in st}
        super()._restore_fp32_state(state_dict)
        for key, saved in compact.items():
            p = id_map.get(key)
            if p is None:
                continue
            st = self.state[p]
            for k in (*SAVED_Q8_KEYS, REMAINDER_BITS):
                st.pop(k, None)  # as torch's loader installed them: the scales cast to the param's dtype
            for k, v in saved.items():
                st[k] = v.to(device=local(p).device if not is_dtensor(v) else p.device, copy=True)
            for m, (codes, rows) in q8[key].items():
                load_saved_moment(st, m, p, codes, rows)
        for group in self.param_groups:
            self._lean_prepare(group, [p for p in group["params"] if p in self.state])
        self._record_param_versions([p for g in self.param_groups for p in g["params"]])
