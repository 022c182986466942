"""torch.ops.mixprec.act_pack / act_unpack against an independent pure-torch
reference of the format ([note: act_pack format] in mixprec/act_pack.h),
on every CPU path; opcheck; compile; bad input."""

import pytest
import torch
from torch.library import opcheck

from mixprec import _act_pack

from _reference import DTYPES, bits as bits_of, cpu_lib

M32 = 0xFFFFFFFF


# ---- the reference: the header's note, in torch int64 / float32 ops ------------


def _mix32(x):
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & M32
    return x ^ (x >> 16)


def _mix32_int(x: int) -> int:
    return int(_mix32(torch.tensor([x], dtype=torch.int64))[0])


def _key(seed: int) -> int:
    seed &= 2**64 - 1
    h = _mix32_int((seed & M32) ^ 0x9E3779B9)
    h = _mix32_int(h ^ (seed >> 32))
    h = _mix32_int(h ^ 0x61637470)
    h = _mix32_int(h ^ 0)
    return _mix32_int(h ^ 0)  # the bits of the float 0.0


def _random_bits(seed: int, n: int):
    i = torch.arange(n, dtype=torch.int64)
    lo, hi = i & M32, i >> 32
    return _mix32((_key(seed) + lo * 0x9E3779B1 + hi * 0x85EBCA77) & M32)


def _f32(v):
    return torch.tensor([v], dtype=torch.float32)


def _bits(f):
    return int(f.view(torch.int32)[0]) & M32


def _from_bits(u):
    return torch.tensor([u - 2**32 if u >= 2**31 else u], dtype=torch.int32).view(torch.float32)


def ref_pack(x, nbits, block, seed):
    """(codes as int64 per element, stored scales float32) of x's memory order."""
    v = x.detach().float().contiguous().reshape(-1)
    n = v.numel()
    r = _random_bits(seed, n)
    qmax = (1 << nbits) - 1
    codes = torch.zeros(n, dtype=torch.int64)
    scales = torch.empty((n + block - 1) // block, dtype=torch.float32)
    for b in range(scales.numel()):
        blk = v[b * block : (b + 1) * block]
        if not torch.isfinite(blk).all():
            scales[b] = float("nan")
            continue
        lo, hi = blk.min().reshape(1), blk.max().reshape(1)
        signed = bool(lo < 0)
        top = hi.clamp_min(0)
        s = top / _f32(qmax - 1) + (-lo) / _f32(qmax - 1) if signed else top / _f32(qmax)
        s = s.clamp_min(2.0**-126)
        u = _bits(s)
        u = ((u | 0xFF) + 1) if u & 0xFF else u
        s = _from_bits(u)
        z = min(max(int(torch.ceil((-lo) / s)), 1), qmax) if signed else 0
        inv = _f32(1.0) / s
        rnd = (r[b * block : b * block + blk.numel()] >> 8).float() * 2.0**-24
        q = torch.floor(blk * inv + rnd).long()
        unit = torch.where(blk > 0, 1, -1)
        q = torch.where((q == 0) & (blk != 0), unit, q)
        codes[b * block : b * block + blk.numel()] = (q + z).clamp(0, qmax)
        scales[b] = _from_bits(u | z)
    return codes, scales


def as_bytes(codes, nbits):
    if nbits == 8:
        return codes.to(torch.uint8)
    c = codes
    if c.numel() % 2:
        c = torch.cat([c, c.new_zeros(1)])
    return (c[0::2] | (c[1::2] << 4)).to(torch.uint8)


def ref_unpack(codes_per_elem, scales, nbits, block, dtype):
    n = codes_per_elem.numel()
    out = torch.empty(n, dtype=torch.float32)
    for b in range(scales.numel()):
        sl = slice(b * block, min(n, (b + 1) * block))
        u = _bits(scales[b : b + 1])
        s = _from_bits(u & ~0xFF & M32)
        if not torch.isfinite(s).all():
            out[sl] = float("nan")
            continue
        out[sl] = (codes_per_elem[sl] - (u & 0xFF)).float() * s
    top = torch.finfo(dtype).max
    return out.clamp(-top, top).to(dtype)


def activation(gen, n, dtype, kind):
    x = torch.randn(n, generator=gen) * 3
    if kind == "relu":
        x = x.clamp_min(0)
    x[torch.rand(n, generator=gen) < 0.1] = 0.0
    if kind == "wide":  # magnitudes over many octaves, finite in every dtype
        x = (x * torch.exp(torch.randn(n, generator=gen) * 3)).clamp(-6e4, 6e4)
    return x.to(dtype)


# ---- forward against the reference, on every CPU path ---------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("nbits,block", [(8, 256), (8, 32), (4, 64), (4, 4096)])
@pytest.mark.parametrize("kind", ["signed", "relu", "wide"])
def test_pack_matches_reference(gen, isa, dtype, nbits, block, kind):
    n = 3 * block + 37  # a partial last block, odd
    x = activation(gen, n, dtype, kind)
    seed = int(torch.randint(-(2**62), 2**62, (1,), generator=gen))
    codes, scales = _act_pack.act_pack(x, nbits, block, seed)
    ref_codes, ref_scales = ref_pack(x, nbits, block, seed)
    assert torch.equal(bits_of(scales), bits_of(ref_scales))
    assert torch.equal(codes, as_bytes(ref_codes, nbits))
    y = _act_pack.act_unpack(codes, scales, n, nbits, block, dtype)
    assert torch.equal(bits_of(y), bits_of(ref_unpack(ref_codes, ref_scales, nbits, block, dtype)))
    # What backward relies on: zeros exact (as +0), signs kept, error within a scale.
    xf, yf = x.float(), y.float()
    assert torch.equal(yf == 0, xf == 0)
    assert torch.equal(torch.sign(yf), torch.sign(xf))
    step = (scales.view(torch.int32) & ~0xFF).view(torch.float32)  # s without the zero point
    per_elem_scale = step.repeat_interleave(block)[:n]
    tol = per_elem_scale * (1 + 2**-6) + xf.abs() * 2**-7  # + the dtype's rounding of the result
    assert ((yf - xf).abs() <= tol).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_large_parallel_same_bits_on_any_thread_count(gen, isa, dtype):
    n = (1 << 18) + 300  # above the parallel threshold (2^17)
    x = activation(gen, n, dtype, "signed")
    codes, scales = _act_pack.act_pack(x, 8, 256, 7)
    ref_codes, ref_scales = ref_pack(x[:4096], 8, 256, 7)
    assert torch.equal(codes[:4096], as_bytes(ref_codes, 8))
    lib = cpu_lib()
    try:
        lib.mixprec_set_num_threads(1)
        c1, s1 = _act_pack.act_pack(x, 8, 256, 7)
        y1 = _act_pack.act_unpack(codes, scales, n, 8, 256, dtype)
    finally:
        lib.mixprec_set_num_threads(0)
    assert torch.equal(c1, codes) and torch.equal(bits_of(s1), bits_of(scales))
    assert torch.equal(bits_of(y1), bits_of(_act_pack.act_unpack(codes, scales, n, 8, 256, dtype)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nonfinite_block_unpacks_to_nan_and_others_unaffected(gen, dtype):
    x = activation(gen, 1024, dtype, "signed")
    x[300] = float("inf")
    x[900] = float("nan")
    codes, scales = _act_pack.act_pack(x, 8, 256, 1)
    assert torch.isnan(scales[1]) and torch.isnan(scales[3])
    assert torch.isfinite(scales[0]) and torch.isfinite(scales[2])
    y = _act_pack.act_unpack(codes, scales, 1024, 8, 256, dtype)
    assert torch.isnan(y[256:512]).all() and torch.isnan(y[768:]).all()
    assert torch.isfinite(y[:256]).all() and torch.isfinite(y[512:768]).all()


def test_stochastic_rounding_is_unbiased(gen):
    x = (torch.rand(256, generator=gen) * 2 - 1) * 5
    x[0], x[1] = 5.0, -5.0  # pin the block's range
    acc = torch.zeros(256, dtype=torch.float64)
    seeds = 1000
    for s in range(seeds):
        c, sc = _act_pack.act_pack(x, 8, 256, s)
        acc += _act_pack.act_unpack(c, sc, 256, 8, 256, torch.float32).double()
    mean = acc / seeds
    scale = 10.0 / 254  # the signed block's step: range / (Q - 1)
    big = x.abs() > scale  # below one step the zero-preserving rule biases by design
    # Each draw's error is at most one step, so the mean of 1000 is within a few
    # steps / sqrt(1000) of x; over the block the mean error is far smaller.
    assert ((mean - x.double())[big].abs() <= 4 * scale / seeds**0.5).all()
    rel = ((mean - x.double())[big].sum() / x.double()[big].abs().sum()).abs()
    assert rel < 1e-3


def test_tiny_values_never_become_zero():
    x = torch.tensor([1e-40, -3e-42, 2e-45, 0.0] * 16, dtype=torch.float32)
    for nbits in (8, 4):
        c, s = _act_pack.act_pack(x, nbits, 32, 3)
        y = _act_pack.act_unpack(c, s, x.numel(), nbits, 32, torch.float32)
        assert torch.equal(y == 0, x == 0) and torch.equal(torch.sign(y), torch.sign(x))


def test_channels_last_is_packed_in_memory_order(gen):
    x = torch.randn(2, 8, 5, 7, generator=gen).to(memory_format=torch.channels_last)
    codes, scales = _act_pack.act_pack(x, 8, 64, 5)
    mem = x.permute(0, 2, 3, 1).contiguous()  # the same memory, as a contiguous tensor
    c2, s2 = _act_pack.act_pack(mem, 8, 64, 5)
    assert torch.equal(codes, c2) and torch.equal(scales, s2)


def test_empty():
    codes, scales = _act_pack.act_pack(torch.empty(0, dtype=torch.bfloat16), 8, 256, 0)
    assert codes.shape == (0,) and scales.shape == (0,)
    y = _act_pack.act_unpack(codes, scales, 0, 8, 256, torch.bfloat16)
    assert y.shape == (0,) and y.dtype == torch.bfloat16


def test_packed_nbytes():
    assert _act_pack.packed_nbytes(1000, 8, 256) == 1000 + 4 * 4
    assert _act_pack.packed_nbytes(1001, 4, 64) == 501 + 4 * 16
    assert _act_pack.packed_nbytes(1001, 4, 32) == 501 + 4 * 32


# ---- registration: opcheck, compile ---------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_opcheck(gen, dtype):
    x = activation(gen, 1000, dtype, "signed")
    opcheck(torch.ops.mixprec.act_pack.default, (x, 4, 64, 11))
    codes, scales = _act_pack.act_pack(x, 4, 64, 11)
    opcheck(torch.ops.mixprec.act_unpack.default, (codes, scales, 1000, 4, 64, dtype))


def test_compile_matches_eager(gen):
    x = activation(gen, 5000, torch.bfloat16, "relu")

    def roundtrip(t):
        c, s = torch.ops.mixprec.act_pack(t, 8, 256, 9)
        return torch.ops.mixprec.act_unpack(c, s, t.numel(), 8, 256, t.dtype)

    torch._dynamo.reset()
    y = torch.compile(roundtrip, fullgraph=True)(x)
    assert torch.equal(bits_of(y), bits_of(roundtrip(x)))


# ---- bad input: a clear error naming the op and the argument, nothing written ----


def _bad_pack_cases():
    x = torch.randn(100)
    return [
        ((x.double(), 8, 256, 0), r"act_pack: x must be float32, float16 or bfloat16"),
        ((x.long(), 8, 256, 0), r"act_pack: x must be float32"),
        ((x, 3, 256, 0), r"act_pack: bits must be 8 or 4, got 3"),
        ((x, 16, 256, 0), r"act_pack: bits must be 8 or 4, got 16"),
        ((x, 8, 100, 0), r"act_pack: block must be a power of two in \[32, 4096\], got 100"),
        ((x, 8, 16, 0), r"act_pack: block must be a power of two"),
        ((x, 8, 8192, 0), r"act_pack: block must be a power of two"),
        ((torch.randn(10, 20)[:, ::2], 8, 256, 0), r"act_pack: x must be dense in memory"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_pack_cases())))
def test_bad_pack(case):
    args, msg = _bad_pack_cases()[case]
    before = args[0].clone()
    with pytest.raises(RuntimeError, match=msg) as e:
        torch.ops.mixprec.act_pack(*args)
    assert ".h:" not in str(e.value) and ".cpp:" not in str(e.value)
    assert torch.equal(args[0], before)


def _bad_unpack_cases():
    c, s = _act_pack.act_pack(torch.randn(1000), 8, 256, 0)
    return [
        ((c, s, 999, 8, 256, torch.float32), r"act_unpack: codes must have shape \[999\]"),
        ((c, s[:3], 1000, 8, 256, torch.float32), r"act_unpack: scales must have shape \[4\]"),
        ((c.float(), s, 1000, 8, 256, torch.float32), r"act_unpack: codes must be a uint8 tensor"),
        ((c, s.double(), 1000, 8, 256, torch.float32), r"act_unpack: scales must be a float32 tensor"),
        ((c, s, 1000, 8, 256, torch.int32), r"act_unpack: dtype must be float32, float16 or bfloat16"),
        ((c, s, 1000, 5, 256, torch.float32), r"act_unpack: bits must be 8 or 4, got 5"),
        ((c, s, 1000, 8, 48, torch.float32), r"act_unpack: block must be a power of two"),
        ((c, s, -1, 8, 256, torch.float32), r"act_unpack: numel must be >= 0"),
        ((torch.stack([c, c], 1)[:, 0], s, 1000, 8, 256, torch.float32), r"act_unpack: codes must be contiguous"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_unpack_cases())))
def test_bad_unpack(case):
    args, msg = _bad_unpack_cases()[case]
    with pytest.raises(RuntimeError, match=msg):
        torch.ops.mixprec.act_unpack(*args)


def test_bad_input_on_meta_matches_cpu():
    x = torch.randn(100, device="meta")
    with pytest.raises(RuntimeError, match=r"act_pack: bits must be 8 or 4"):
        torch.ops.mixprec.act_pack(x, 3, 256, 0)
    c, s = torch.ops.mixprec.act_pack(x, 4, 32, 0)
    assert c.shape == (50,) and s.shape == (4,) and c.dtype == torch.uint8


@pytest.mark.parametrize(
    "dtype,values",
    [
        (torch.float16, [65504.0, -1000.0]),
        (torch.float16, [65504.0, -30000.0]),
        (torch.bfloat16, [3.3895e38, -3e38]),
        (torch.float32, [3.4028235e38, 1.0]),
    ],
    ids=["f16-4bit-edge", "f16-edge", "bf16-edge", "f32-max"],
)
def test_largest_finite_values_never_come_back_inf(dtype, values):
    """The top code may lie a step above the block's largest element; next to
    the dtype's largest value that step must not round to inf (found by
    tests/c/act_pack's reference; 7-23 of 32 seeds gave inf before)."""
    x = torch.tensor(values * 16, dtype=torch.float32).to(dtype)
    for nbits in (8, 4):
        for seed in range(32):
            c, s = _act_pack.act_pack(x, nbits, 32, seed)
            y = _act_pack.act_unpack(c, s, x.numel(), nbits, 32, dtype)
            assert torch.isfinite(y).all(), (nbits, seed)


def test_tiny_negative_next_to_huge_keeps_its_sign():
    """-lo / s underflows to 0 beside 1e30: the zero point must still be >= 1
    so the negative element keeps its sign (found by tests/c/act_pack)."""
    x = torch.tensor([1e30, -1.4e-45] * 16, dtype=torch.float32)
    c, s = _act_pack.act_pack(x, 8, 32, 0)
    y = _act_pack.act_unpack(c, s, x.numel(), 8, 32, torch.float32)
    assert torch.equal(torch.sign(y), torch.sign(x))
