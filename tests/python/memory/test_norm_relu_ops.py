"""torch.ops.mixprec.act_mask / act_unpack_norm_relu ([note: norm_relu
recompute] in mixprec/act_pack.h) against pure-torch references on every CPU
path: the mask from ``x > 0``, the recomputed ReLU output from act_unpack's
float32 values with ``relu(x * a + b)`` (two roundings), kept elements at
least the dtype's smallest normal; opcheck, compile, bad input; and
recompute_relu's backward through the fused op equal to the torch path it
replaces."""

import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

from mixprec import _act_pack
import mixprec.memory as mm
from mixprec.memory import _saved

from _reference import DTYPES, bits as bits_of


def _ref_mask(x):
    flat = x.flatten() if x.is_contiguous() else x.permute(0, 2, 3, 1).flatten()
    m = (flat.float() > 0).to(torch.uint8)
    pad = (-m.numel()) % 8
    m = torch.cat([m, m.new_zeros(pad)]).view(-1, 8).to(torch.int32)
    return (m * torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.int32)).sum(1).to(torch.uint8)


def _ref_norm_relu(codes, scales, a, b, mask, n, nbits, block, inner, dtype):
    x = _act_pack.act_unpack(codes, scales, n, nbits, block, torch.float32)
    c = (torch.arange(n) // inner) % a.numel()
    v = (x * a[c]) + b[c]  # two roundings (torch's CPU mul and add are separate ops)
    keep = (mask.repeat_interleave(8)[:n] >> torch.arange(8, dtype=torch.uint8).repeat(mask.numel())[:n]) & 1
    tiny = torch.finfo(dtype).tiny
    out = torch.where(keep.bool(), v.clamp_min(tiny), torch.zeros(()))
    return out.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("channels_last", [False, True])
def test_mask_matches_reference(gen, isa, dtype, channels_last):
    x = torch.randn(3, 5, 7, 9, generator=gen).to(dtype)
    x[0, 0, 0, :4] = torch.tensor([0.0, -0.0, float("inf"), float("nan")])
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    before = x.clone()
    got = _act_pack.act_mask(x)
    assert torch.equal(got, _ref_mask(x))
    assert torch.equal(bits_of(x), bits_of(before))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("nbits,block", [(8, 256), (4, 32)])
@pytest.mark.parametrize("shape,inner", [((4, 6, 11, 13), 143), ((300, 17), 1), ((2, 3, 200, 200), 40000)])
def test_norm_relu_matches_reference(gen, isa, dtype, nbits, block, shape, inner):
    x = (torch.randn(shape, generator=gen) * 2 + 0.3).to(dtype)
    n, channels = x.numel(), shape[1]
    a = torch.randn(channels, generator=gen)
    b = torch.randn(channels, generator=gen)
    codes, scales = _act_pack.act_pack(x, nbits, block, 5)
    mask = torch.randint(0, 256, ((n + 7) // 8,), generator=gen, dtype=torch.uint8)
    got = _act_pack.act_unpack_norm_relu(codes, scales, a, b, mask, n, nbits, block, inner, dtype)
    want = _ref_norm_relu(codes, scales, a, b, mask, n, nbits, block, inner, dtype)
    assert torch.equal(bits_of(got), bits_of(want))


def test_opcheck(gen):
    x = torch.randn(2, 4, 5, 5, generator=gen).to(torch.bfloat16)
    opcheck(torch.ops.mixprec.act_mask.default, (x,))
    codes, scales = _act_pack.act_pack(x, 8, 32, 1)
    mask = _act_pack.act_mask(x)
    a, b = torch.randn(4, generator=gen), torch.randn(4, generator=gen)
    opcheck(torch.ops.mixprec.act_unpack_norm_relu.default, (codes, scales, a, b, mask, 200, 8, 32, 25, torch.bfloat16))


def test_compile_matches_eager(gen):
    x = torch.randn(2, 4, 8, 8, generator=gen).to(torch.bfloat16)
    a, b = torch.randn(4, generator=gen), torch.randn(4, generator=gen)

    def f(t):
        c, s = torch.ops.mixprec.act_pack(t, 8, 256, 3)
        m = torch.ops.mixprec.act_mask(t)
        return torch.ops.mixprec.act_unpack_norm_relu(c, s, a, b, m, t.numel(), 8, 256, 64, t.dtype)

    torch._dynamo.reset()
    assert torch.equal(bits_of(torch.compile(f, fullgraph=True)(x)), bits_of(f(x)))


def _bad_cases():
    x = torch.randn(2, 3, 4, 4)
    c, s = _act_pack.act_pack(x, 8, 32, 0)
    m = _act_pack.act_mask(x)
    a, b = torch.ones(3), torch.zeros(3)
    op = torch.ops.mixprec.act_unpack_norm_relu
    f32 = torch.float32
    return [
        (lambda: torch.ops.mixprec.act_mask(x.double()), r"act_mask: x must be float32, float16 or bfloat16"),
        (lambda: torch.ops.mixprec.act_mask(torch.randn(10, 20)[:, ::2]), r"act_mask: x must be dense in memory"),
        (lambda: op(c, s, a, b, m, 96, 8, 32, 0, f32), r"act_unpack_norm_relu: inner must be >= 1"),
        (lambda: op(c, s, a, b, m, 96, 8, 48, 16, f32), r"act_unpack_norm_relu: block must be a power of two"),
        (lambda: op(c, s, a, b, m, 96, 5, 32, 16, f32), r"act_unpack_norm_relu: bits must be 8 or 4"),
        (lambda: op(c, s, a, b, m, 95, 8, 32, 16, f32), r"act_unpack_norm_relu: codes must be a contiguous \[95\]"),
        (lambda: op(c, s[:2], a, b, m, 96, 8, 32, 16, f32), r"act_unpack_norm_relu: scales must be a contiguous \[3\]"),
        (lambda: op(c, s, a.double(), b, m, 96, 8, 32, 16, f32), r"act_unpack_norm_relu: a must be a float32"),
        (lambda: op(c, s, a, b[:2], m, 96, 8, 32, 16, f32), r"act_unpack_norm_relu: b must be a contiguous 1-D tensor of 3"),
        (lambda: op(c, s, torch.ones(0), b, m, 96, 8, 32, 16, f32), r"act_unpack_norm_relu: a must be a 1-D tensor of at least one"),
        (lambda: op(c, s, a, b, m[:3], 96, 8, 32, 16, f32), r"act_unpack_norm_relu: mask must be a contiguous uint8 \[12\]"),
        (lambda: op(c, s, a, b, m, 96, 8, 32, 16, torch.int32), r"act_unpack_norm_relu: dtype must be float32"),
        (lambda: op(c, s, a, b, m, -1, 8, 32, 16, f32), r"act_unpack_norm_relu: numel must be >= 0"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_cases())))
def test_bad_input(case):
    call, msg = _bad_cases()[case]
    with pytest.raises(RuntimeError, match=msg) as e:
        call()
    assert ".h:" not in str(e.value) and ".cpp:" not in str(e.value)


def test_meta_shapes():
    x = torch.randn(2, 3, 4, 4, device="meta", dtype=torch.bfloat16)
    m = torch.ops.mixprec.act_mask(x)
    c, s = torch.ops.mixprec.act_pack(x, 4, 32, 0)
    a = torch.ones(3, device="meta")
    y = torch.ops.mixprec.act_unpack_norm_relu(c, s, a, a, m, 96, 4, 32, 16, torch.bfloat16)
    assert m.shape == (12,) and y.shape == (96,) and y.dtype == torch.bfloat16


# ---- recompute_relu through the fused op: the same gradients as the torch path ----


def _model(gen):
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(inplace=True),
        torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 5),
    )


def _grads(model, x, y, **kw):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16), mm.compressed_activations(bits=8, seed=3, min_numel=256, **kw):
        loss = F.cross_entropy(model(x).float(), y)
    loss.backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("channels_last", [False, True])
def test_fused_recompute_matches_torch_path(gen, monkeypatch, channels_last):
    model = _model(gen)
    x = torch.randn(4, 3, 16, 16, generator=gen)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 5, (4,), generator=gen)
    calls = []
    real = torch.ops.mixprec.act_unpack_norm_relu.default

    def spy(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(_saved, "_FUSED", spy, raising=False)
    fused = _grads(model, x, y)
    assert calls, "the fused op was not used"
    monkeypatch.setattr(_saved._NormReLU, "_inner", lambda self: None)  # the torch path
    plain = _grads(model, x, y)
    for g1, g2 in zip(fused, plain):
        cos = F.cosine_similarity(g1.flatten().double(), g2.flatten().double(), dim=0)
        assert cos > 0.9999, cos


# ---- [note: huge pages for fresh outputs] (shim/act_pack.cpp) --------------------


def _thp_mode():
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return None


def _huge_kb(ptr: int) -> int:
    """AnonHugePages of the mapping of this process that holds address ptr."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= ptr < hi
            elif inside and line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    return 0


@pytest.mark.skipif(_thp_mode() not in ("madvise", "always"), reason="transparent huge pages off (or not Linux)")
@pytest.mark.parametrize("opt_in", [True, False])
def test_large_outputs_are_backed_by_huge_pages(opt_in):
    """In a fresh interpreter (in a long test process the allocator may hand
    out memory that 4 KB pages already back, where the hint changes nothing):
    with MIXPREC_HUGEPAGE=1 a 16 MB act_unpack output's mapping holds at least
    one 2 MB page; by default (off) none in THP's madvise mode."""
    import inspect
    import os
    import subprocess
    import sys

    code = inspect.getsource(_huge_kb) + (
        "import torch\n"
        "from mixprec import _act_pack\n"
        "x = torch.randn(1 << 23).to(torch.bfloat16)\n"
        "c, s = _act_pack.act_pack(x, 8, 256, 1)\n"
        "y = _act_pack.act_unpack(c, s, x.numel(), 8, 256, torch.bfloat16)\n"
        "print(_huge_kb(y.data_ptr() + y.numel()))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "MIXPREC_HUGEPAGE"}
    if opt_in:
        env["MIXPREC_HUGEPAGE"] = "1"
    elif _thp_mode() != "madvise":
        pytest.skip("THP 'always': 2 MB pages without the hint too")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    huge = int(out.stdout.strip().splitlines()[-1])
    assert (huge >= 2048) if opt_in else (huge == 0), out.stdout
