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

[note: remainder encoding] The FP32 master's bits are split as Transformer
Engine's ``store_param_remainders`` splits them: the param is the upper 16
bits rounded half away from zero in bit space (``hi + (lo >= 0x8000)``, lo
read as unsigned) and the remainder is the lower 16 bits (as int16; negative
exactly when the upper half was rounded up). Joining: ``hi = param - (rem <
0)``. This is a bijection between FP32 bit patterns and (param, remainder)
pairs that a split produced, so the master round-trips exactly; the param
differs from round-to-nearest-even of the master only at exact ties (lo ==
0x8000 with an even upper half), by one BF16 ulp. A pair no split produced
(a param written from outside with a stale remainder) can join to NaN (param
+-0 with a negative remainder), so an outside write resets the param's
remainders to zero (the master becomes the written BF16 values exactly; the
elements the write left alone lose their sub-BF16 bits, < 1/2 BF16 ulp).

[note: 8-bit moments] The 8-bit moments are handed to the kernel as they
are (codes + scales); Python only dequantises them for :meth:`fp32_state`
and quantises FP32 moments on load (torch's checkpoints, or a format change)
with the same map and rounding as the kernel (``dequantize`` /
``quantize`` below), so a load of a dequantised state gives back the same
codes. Blocks are per tensor the op sees: under FSDP2 / tensor parallel the
local shard, starting at its first element. A distributed checkpoint
(``torch.distributed.checkpoint``) of a sharded param therefore saves its
8-bit moments dequantised to FP32 DTensors (which DCP reshards element by
element) and a load re-blocks them on the new shards: a 2 -> 1 or 1 -> 2
reshard gives the same moments within the 8-bit error (the requantisation
of a block is exact when the blocks did not move). Plain ``state_dict()`` of
unsharded params saves codes and scales as they are.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ._distributed import is_dtensor, local

#: Elements per 8-bit block (one FP32 absmax scale each).
BLOCK = 256

MOMENT_DTYPES = (torch.float32, torch.bfloat16, torch.uint8)
_DTYPE_NAMES = {torch.float32: "torch.float32", torch.bfloat16: "torch.bfloat16", torch.uint8: "torch.uint8"}

#: Each optimizer's moment keys: state key -> group option naming its dtype.
ADAMW_MOMENTS = {"exp_avg": "exp_avg_dtype", "exp_avg_sq": "exp_avg_sq_dtype"}
SGD_MOMENTS = {"momentum_buffer": "momentum_dtype"}
#: exp_avg (and SGD's buffer) are signed; exp_avg_sq is not.
_UNSIGNED = frozenset({"exp_avg_sq"})


def scale_key(key: str) -> str:
    return f"{key}_scale"


LEAN_STATE_KEYS = ("remainder", *map(scale_key, (*ADAMW_MOMENTS, *SGD_MOMENTS)))


# ---- group options ---------------------------------------------------------------


def _moment_dtype(cls: str, name: str, value) -> torch.dtype:
    if value not in MOMENT_DTYPES or not isinstance(value, torch.dtype):
        raise ValueError(
            f"{cls}: {name} must be torch.float32, torch.bfloat16 or torch.uint8 (8-bit blockwise), got {value!r}"
        )
    return value


def lean_defaults(cls: str, param_remainders, master_weights, moments: dict[str, Any]) -> dict[str, Any]:
    """The lean group keys, checked (``moments``: option name -> value)."""
    out = {"param_remainders": _remainders_flag(cls, param_remainders, master_weights)}
    for name, value in moments.items():
        out[name] = _moment_dtype(cls, name, value)
    return out


def _remainders_flag(cls: str, value, master_weights) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{cls}: param_remainders must be True or False, got {value!r}")
    if value and not master_weights:
        raise ValueError(
            f"{cls}: param_remainders=True needs master_weights=True (the remainder is the low half of an "
            "FP32 master; master_weights=False keeps none)"
        )
    return value


def check_group(cls: str, group: dict[str, Any], moment_options) -> None:
    """A group's lean options as given (per-group dicts bypass ``__init__``'s
    checks): bad values and FP16 params under ``param_remainders`` raise a
    ValueError naming the option."""
    remainders = _remainders_flag(cls, group.get("param_remainders", False), group.get("master_weights", True))
    for name in moment_options:
        _moment_dtype(cls, name, group.get(name, torch.float32))
    if remainders:
        for i, p in enumerate(group["params"]):
            if p.dtype == torch.float16:
                raise ValueError(
                    f"{cls}: param_remainders=True is for bfloat16 parameters; params[{i}] is float16 "
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
    """(BF16 param, int16 remainder) of an FP32 master."""
    bits = master.contiguous().view(torch.int32)
    lo = bits & 0xFFFF
    hi = (bits >> 16) + (lo >= 0x8000).to(torch.int32)
    # int32 -> int16 keeps the low 16 bits (two's complement wrap).
    param = hi.to(torch.int16).view(torch.bfloat16).reshape(master.shape)
    rem = (lo - ((lo >= 0x8000).to(torch.int32) << 16)).to(torch.int16).reshape(master.shape)
    return param, rem


def join_master(param: torch.Tensor, remainder: torch.Tensor) -> torch.Tensor:
    """The FP32 master of a BF16 param and its remainder (a new tensor)."""
    hi = param.contiguous().view(torch.int16).to(torch.int32)
    rem = remainder.contiguous().to(torch.int32)
    hi = hi - (rem < 0).to(torch.int32)
    bits = (hi << 16) | (rem & 0xFFFF)
    return bits.view(torch.float32).reshape(param.shape)


# ---- [note: 8-bit moments] -------------------------------------------------------


def num_blocks(numel: int) -> int:
    return (numel + BLOCK - 1) // BLOCK


_MAPS: dict[tuple[bool, torch.device], torch.Tensor] = {}


def code_map(signed: bool, device=None) -> torch.Tensor:
    """The 256 FP32 values the codes stand for (times the block's scale),
    increasing: the kernel's map (``mixprec_optim_qmap`` in optim.h)."""
    device = torch.device("cpu") if device is None else torch.device(device)
    key = (signed, device)
    if key not in _MAPS:
        _MAPS[key] = _kernel_map(signed).to(device)
    return _MAPS[key]


def _kernel_map(signed: bool) -> torch.Tensor:
    """bitsandbytes' dynamic tree map (torchao's ``create_dynamic_map``):
    a sign, a run of zero bits giving a decimal exponent 10**-k (k = 0..6),
    and a linear fraction in (0.1, 1] filling the remaining bits; plus 0
    and 1. Computed in float64, rounded once to FP32."""
    data = []
    non_sign_bits = 7
    for i in range(7):
        items = 2 ** (i + non_sign_bits - 7 + (0 if signed else 1)) + 1
        bounds = torch.linspace(0.1, 1, items, dtype=torch.float64)
        means = (bounds[:-1] + bounds[1:]) / 2.0
        data += (10.0 ** (-6 + i) * means).tolist()
        if signed:
            data += (-(10.0 ** (-6 + i)) * means).tolist()
    data += [0.0, 1.0]
    return torch.tensor(sorted(data), dtype=torch.float64).to(torch.float32)


def dequantize(codes: torch.Tensor, scales: torch.Tensor, signed: bool) -> torch.Tensor:
    """FP32 values of 8-bit codes: ``map[code] * scale[block]``."""
    flat = codes.reshape(-1).long()
    n = flat.numel()
    qmap = code_map(signed, codes.device)
    s = scales.reshape(-1).float().repeat_interleave(BLOCK)[:n]
    return (qmap[flat] * s).reshape(codes.shape)


def quantize(values: torch.Tensor, signed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 codes shaped like ``values``, FP32 scales): per block of 256
    the absmax scale, each value divided by it and given the nearest code."""
    v = values.detach().float().reshape(-1)
    n = v.numel()
    nb = num_blocks(n)
    padded = torch.zeros(nb * BLOCK, dtype=torch.float32, device=v.device)
    padded[:n] = v
    blocks = padded.view(nb, BLOCK)
    scales = blocks.abs().amax(1)
    # A zero block keeps scale 0 (every code then reads 0).
    normed = blocks / torch.where(scales > 0, scales, torch.ones_like(scales))[:, None]
    qmap = code_map(signed, v.device)
    mid = (qmap[1:] + qmap[:-1]) * 0.5
    codes = torch.bucketize(normed.reshape(-1)[:n], mid, right=True)
    return codes.to(torch.uint8).reshape(values.shape), scales


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
    lv = local(values).detach().float()
    codes, scales = quantize(lv.reshape(local(p).shape), signed_moment(key))
    st[key] = _like(p, codes.reshape(local(p).shape))
    st[skey] = scales


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
