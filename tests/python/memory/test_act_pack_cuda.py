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
