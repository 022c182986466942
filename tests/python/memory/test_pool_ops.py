"""torch.ops.mixprec.act_pool_encode / act_pool_decode ([note: pool codes] in
mixprec/act_pack.h): a 2-D max pool's int64 indices as window offsets, one
byte each, against a pure-torch reference of the offsets on torch's own
max_pool2d indices (contiguous and channels_last, strided, padded, dilated);
exact round trip; corrupted indices counted; opcheck, compile, bad input;
compressed_activations stores a pool's indices through them."""

import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

import mixprec.memory as mm
from mixprec.memory import _saved

from _reference import cpu_lib

GEOMS = [  # (kernel, stride, padding, dilation)
    ((3, 3), (2, 2), (1, 1), (1, 1)),
    ((2, 2), (2, 2), (0, 0), (1, 1)),
    ((3, 3), (1, 1), (1, 1), (2, 2)),
    ((5, 3), (3, 2), (2, 1), (1, 1)),
]


def _geom(W, k, s, p, d):
    return (W, k[0], k[1], s[0], s[1], p[0], p[1], d[0], d[1])


def _ref_codes(idx, geom):
    W, kH, kW, sH, sW, pH, pW, dH, dW = geom
    ho = torch.arange(idx.shape[-2]).view(-1, 1) * sH - pH
    wo = torch.arange(idx.shape[-1]) * sW - pW
    h, w = idx // W, idx % W
    return (((h - ho) // dH) * kW + (w - wo) // dW).to(torch.uint8)


@pytest.mark.parametrize("k,s,p,d", GEOMS)
@pytest.mark.parametrize("channels_last", [False, True])
def test_round_trip_matches_reference(gen, k, s, p, d, channels_last):
    x = torch.randn(3, 5, 29, 31, generator=gen)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    _, idx = F.max_pool2d_with_indices(x, k, s, p, d)
    geom = _geom(31, k, s, p, d)
    codes, inexact = torch.ops.mixprec.act_pool_encode(idx, *geom)
    assert int(inexact[0]) == 0
    codes = codes.as_strided(idx.shape, idx.stride())
    assert torch.equal(codes, _ref_codes(idx, geom))
    back = torch.ops.mixprec.act_pool_decode(
        _saved._flat(codes), idx.shape[-2], idx.shape[-1], idx.stride(-2), idx.stride(-1), *geom
    )
    assert torch.equal(back.as_strided(idx.shape, idx.stride()), idx)


def test_corrupted_indices_are_counted(gen):
    x = torch.randn(2, 4, 40, 40, generator=gen)
    _, idx = F.max_pool2d_with_indices(x, 3, 2, 1)
    bad = idx.clone()
    flat = bad.view(-1)
    pick = torch.randperm(flat.numel(), generator=gen)[:37]
    flat[pick[:20]] += 3  # three columns over: outside every window
    flat[pick[20:]] = -1
    before = bad.clone()
    codes, inexact = torch.ops.mixprec.act_pool_encode(bad, *_geom(40, (3, 3), (2, 2), (1, 1), (1, 1)))
    assert int(inexact[0]) == 37
    assert int((codes == 255).sum()) == 37
    assert torch.equal(bad, before)


def test_large_threads_agree(gen):
    x = torch.randn(4, 64, 112, 112, generator=gen).bfloat16()  # 200704 indices: above 2^17
    _, idx = F.max_pool2d_with_indices(x, 3, 2, 1)
    geom = _geom(112, (3, 3), (2, 2), (1, 1), (1, 1))
    lib = cpu_lib()
    out = []
    try:
        for t in (1, 2):
            lib.mixprec_set_num_threads(t)
            out.append(torch.ops.mixprec.act_pool_encode(idx, *geom)[0])
    finally:
        lib.mixprec_set_num_threads(0)
    assert torch.equal(out[0], out[1])
    assert torch.equal(out[0].view(idx.shape), _ref_codes(idx, geom))


def test_opcheck_and_compile(gen):
    x = torch.randn(2, 3, 16, 16, generator=gen)
    _, idx = F.max_pool2d_with_indices(x, 3, 2, 1)
    geom = _geom(16, (3, 3), (2, 2), (1, 1), (1, 1))
    opcheck(torch.ops.mixprec.act_pool_encode.default, (idx, *geom))
    codes, _ = torch.ops.mixprec.act_pool_encode(idx, *geom)
    opcheck(torch.ops.mixprec.act_pool_decode.default, (codes, 8, 8, 8, 1, *geom))

    def f(i):
        c, _ = torch.ops.mixprec.act_pool_encode(i, *geom)
        return torch.ops.mixprec.act_pool_decode(c, 8, 8, 8, 1, *geom)

    torch._dynamo.reset()
    assert torch.equal(torch.compile(f, fullgraph=True)(idx).view(idx.shape), idx)


def _bad_cases():
    idx = torch.zeros(2, 3, 8, 8, dtype=torch.int64)
    g = (16, 3, 3, 2, 2, 1, 1, 1, 1)
    c = torch.zeros(idx.numel(), dtype=torch.uint8)
    enc, dec = torch.ops.mixprec.act_pool_encode, torch.ops.mixprec.act_pool_decode
    return [
        (lambda: enc(idx.int(), *g), r"act_pool_encode: idx must be an int64 tensor"),
        (lambda: enc(idx[0, 0, 0], *g), r"act_pool_encode: idx must have at least 2 dimensions"),
        (lambda: enc(idx[..., ::2], *g), r"act_pool_encode: idx must be dense in memory"),
        (lambda: enc(idx, 0, 3, 3, 2, 2, 1, 1, 1, 1), r"act_pool_encode: W must be >= 1, got 0"),
        (lambda: enc(idx, 16, 3, 3, 2, 2, -1, 1, 1, 1), r"act_pool_encode: pH must be >= 0, got -1"),
        (lambda: enc(idx, 16, 3, 3, 2, 2, 1, 1, 0, 1), r"act_pool_encode: dH must be >= 1"),
        (lambda: enc(idx, 16, 16, 16, 2, 2, 1, 1, 1, 1), r"act_pool_encode: the window must have at most 255"),
        (lambda: dec(c.float(), 8, 8, 8, 1, *g), r"act_pool_decode: codes must be a contiguous 1-D uint8"),
        (lambda: dec(c, 8, 8, 0, 1, *g), r"act_pool_decode: HO, WO, s_ho and s_wo must be >= 1"),
        (lambda: dec(c, 8, 8, 8, 1, 16, 3, 0, 2, 2, 1, 1, 1, 1), r"act_pool_decode: kW must be >= 1"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_cases())))
def test_bad_input(case):
    call, msg = _bad_cases()[case]
    with pytest.raises(RuntimeError, match=msg) as e:
        call()
    assert ".h:" not in str(e.value) and ".cpp:" not in str(e.value)


@pytest.mark.parametrize("channels_last", [False, True])
def test_compressed_activations_store_pool_indices_through_the_ops(gen, monkeypatch, channels_last):
    calls = []
    real = _saved._PoolIndices.unpack

    def spy(self):
        calls.append(self)
        return real(self)

    monkeypatch.setattr(_saved._PoolIndices, "unpack", spy)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.MaxPool2d(3, 2, 1),
                                torch.nn.Conv2d(16, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
    x = torch.randn(4, 3, 64, 64, generator=gen)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    grads = []
    for compress in (False, True):
        model.zero_grad(set_to_none=True)
        ctx = mm.compressed_activations(bits=8, seed=1, min_numel=64) if compress else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
        with ctx:
            out = model(x)
        out.float().pow(2).sum().backward()
        grads.append(model[0].weight.grad.clone())
    # the first conv's gradient flows through the pool's indices: exact indices
    # make it differ from uncompressed only by the packing of the conv inputs
    assert len(calls) == 1 and calls[0].codes.dtype == torch.uint8
    cos = F.cosine_similarity(grads[0].flatten(), grads[1].flatten(), dim=0)
    assert cos > 0.999, cos
