"""act_pack / act_unpack and compressed_activations on CUDA: codes, scales
and unpacked values equal the CPU's bit for bit; a CUDA model's gradients
under 8-bit activations match the uncompressed step's; the bytes held after
the forward (torch.cuda.memory_allocated) fall as the saved bytes do.
Skipped without a GPU; run by scripts/gpu_check.sh on the lent GPU machine."""

import pytest
import torch
import torch.nn.functional as F

from mixprec import _act_pack
from mixprec.memory import compressed_activations

from _reference import DTYPES, bits, requires_cuda

pytestmark = [pytest.mark.cuda, requires_cuda]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("nbits,block", [(8, 256), (8, 32), (4, 32), (4, 4096)])
def test_same_bits_as_cpu(gen, dtype, nbits, block):
    n = 5 * block + 77
    x = (torch.randn(n, generator=gen) * 3).to(dtype)
    x[torch.rand(n, generator=gen) < 0.1] = 0
    x[: block // 2] = x[: block // 2].abs()  # a non-negative first block... partly
    x[3 * block + 5] = float("nan")
    c_cpu, s_cpu = _act_pack.act_pack(x, nbits, block, 12345)
    c_gpu, s_gpu = _act_pack.act_pack(x.cuda(), nbits, block, 12345)
    assert torch.equal(c_gpu.cpu(), c_cpu)
    assert torch.equal(s_gpu.cpu().view(torch.int32), s_cpu.view(torch.int32))
    y_cpu = _act_pack.act_unpack(c_cpu, s_cpu, n, nbits, block, dtype)
    y_gpu = _act_pack.act_unpack(c_gpu, s_gpu, n, nbits, block, dtype)
    assert torch.equal(bits(y_gpu.cpu()), bits(y_cpu))


def test_resnet_gradients_and_memory_on_cuda():
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = tv.models.resnet50(weights=None, num_classes=10).cuda()
    x = torch.randn(16, 3, 224, 224, device="cuda")
    y = torch.randint(0, 10, (16,), device="cuda")

    def step(ctx):
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        with torch.autocast("cuda", dtype=torch.bfloat16), ctx:
            loss = F.cross_entropy(model(x).float(), y)
        held = torch.cuda.memory_allocated() - base
        loss.backward()
        return held, {n: p.grad.double() for n, p in model.named_parameters()}

    import contextlib

    held_ref, ref = step(contextlib.nullcontext())
    held8, got = step(compressed_activations(bits=8))
    cos = min(float(F.cosine_similarity(ref[k].view(1, -1), got[k].view(1, -1))) for k in ref if ref[k].norm() > 0)
    assert cos >= 0.999
    assert held8 <= 0.6 * held_ref, (held8, held_ref)


def test_lossless_forms_on_cuda():
    """Max-pool indices in one byte and dropout's bool mask in one bit, with
    no host sync: gradients equal the uncompressed step's exactly."""
    import math

    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(4, 16, 57, 43, device="cuda", generator=g).requires_grad_()
    w = torch.randn(4, 16, 29, 22, device="cuda", generator=g)
    pool = torch.nn.MaxPool2d(3, 2, 1, ceil_mode=True)
    ref = torch.autograd.grad((pool(x) * w).sum(), x)[0]
    with compressed_activations(min_numel=1) as ctx:
        loss = (pool(x) * w).sum()
    assert torch.equal(torch.autograd.grad(loss, x)[0], ref)
    assert ctx.stats["packed"] == 1 and ctx.stats["packed_nbytes"] == w.numel()

    torch.manual_seed(4)
    ref = torch.autograd.grad(F.dropout(x, 0.3, training=True).sum(), x)[0]
    torch.manual_seed(4)
    with compressed_activations(min_numel=1) as ctx:
        loss = F.dropout(x, 0.3, training=True).sum()
    assert torch.equal(torch.autograd.grad(loss, x)[0], ref)
    assert ctx.stats["packed"] == 1 and ctx.stats["packed_nbytes"] == math.ceil(x.numel() / 8)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("channels_last", [False, True])
def test_mask_and_norm_relu_same_bits_as_cpu(gen, dtype, channels_last):
    x = (torch.randn(4, 16, 23, 29, generator=gen) * 2 + 0.2).to(dtype)
    x[0, 0, 0, :3] = torch.tensor([0.0, -0.0, float("nan")])
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    inner = 1 if channels_last else 23 * 29
    a, b = torch.randn(16, generator=gen), torch.randn(16, generator=gen)
    for nbits, block in ((8, 256), (4, 32)):
        m_cpu = _act_pack.act_mask(x)
        m_gpu = _act_pack.act_mask(x.cuda())
        assert torch.equal(m_gpu.cpu(), m_cpu)
        c, s = _act_pack.act_pack(x, nbits, block, 3)
        y_cpu = _act_pack.act_unpack_norm_relu(c, s, a, b, m_cpu, x.numel(), nbits, block, inner, dtype)
        y_gpu = _act_pack.act_unpack_norm_relu(c.cuda(), s.cuda(), a.cuda(), b.cuda(), m_gpu, x.numel(), nbits, block,
                                               inner, dtype)
        assert torch.equal(bits(y_gpu.cpu()), bits(y_cpu))


@pytest.mark.parametrize("channels_last", [False, True])
def test_pool_codes_same_as_cpu(gen, channels_last):
    x = torch.randn(4, 8, 57, 61, generator=gen)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    _, idx = F.max_pool2d_with_indices(x, 3, 2, 1)
    geom = (61, 3, 3, 2, 2, 1, 1, 1, 1)
    c_cpu, bad_cpu = torch.ops.mixprec.act_pool_encode(idx, *geom)
    c_gpu, bad_gpu = torch.ops.mixprec.act_pool_encode(idx.cuda(), *geom)
    assert torch.equal(c_gpu.cpu(), c_cpu) and int(bad_gpu.cpu()[0]) == int(bad_cpu[0]) == 0
    args = (idx.shape[-2], idx.shape[-1], idx.stride(-2), idx.stride(-1), *geom)
    back = torch.ops.mixprec.act_pool_decode(c_gpu, *args)
    assert torch.equal(back.cpu(), torch.ops.mixprec.act_pool_decode(c_cpu, *args))
    assert torch.equal(back.cpu().as_strided(idx.shape, idx.stride()), idx)
