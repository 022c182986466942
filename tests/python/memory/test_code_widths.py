"""compressed_activations(bits=4)'s policy: which saved tensors get 4-bit
codes and which 8 (what normalisation layers, attention and smooth
nonlinearities save), the arguments that change it, and the gradient
accuracy it is there for."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mixprec.memory
from mixprec.memory import _saved, compressed_activations

tv = pytest.importorskip("torchvision")


@pytest.fixture
def widths(monkeypatch):
    """(numel, bits, block) of every tensor packed into codes, in order."""
    got = []
    init = _saved._Packed.__init__

    def record(self, t, bits, block, seed, **kw):
        got.append((t.numel(), bits, block))
        init(self, t, bits, block, seed, **kw)

    monkeypatch.setattr(_saved._Packed, "__init__", record)
    return got


def _mlp(act):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), act, nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 16))


@pytest.mark.parametrize(
    "act,saves_input",
    [(nn.GELU(), True), (nn.SiLU(), True), (nn.Mish(), True), (nn.Tanh(), False), (nn.Sigmoid(), False)],
    ids=lambda a: type(a).__name__ if isinstance(a, nn.Module) else "",
)
def test_bits_4_smooth_activation_at_8_bits(widths, act, saves_input):
    model, n = _mlp(act), 512
    with compressed_activations(bits=4, min_numel=1024):
        model(torch.randn(n, 32)).sum()
    # What the activation saves at 8 bits (block 256); the ReLU output (the
    # last linear's input too) at 4 (block 32), and so the next linear's
    # input where the activation saved its input. Tanh / Sigmoid save their
    # output, the next linear's input: packed once, at 8.
    mid = [(n * 64, 4, 32)] if saves_input else []
    assert widths == [(n * 64, 8, 256), *mid, (n * 96, 4, 32)]


def test_nonlinear_bits_4_and_16(widths):
    n = 512
    with compressed_activations(bits=4, nonlinear_bits=4, min_numel=1024):
        _mlp(nn.GELU())(torch.randn(n, 32)).sum()
    assert widths == [(n * 64, 4, 32), (n * 64, 4, 32), (n * 96, 4, 32)]
    widths.clear()
    with compressed_activations(bits=4, nonlinear_bits=16, min_numel=1024) as ctx:
        _mlp(nn.GELU())(torch.randn(n, 32)).sum()
    assert widths == [(n * 64, 4, 32), (n * 96, 4, 32)]  # GELU's input kept as it is
    assert ctx.stats["kept_bytes"] >= n * 64 * 4


def test_bits_8_everything_at_8(widths):
    n = 512
    with compressed_activations(bits=8, min_numel=1024):
        _mlp(nn.GELU())(torch.randn(n, 32)).sum()
    assert widths == [(n * 64, 8, 256)] * 2 + [(n * 96, 8, 256)]


def _encoder_block():
    torch.manual_seed(1)
    return tv.models.vision_transformer.EncoderBlock(num_heads=2, hidden_dim=64, mlp_dim=128, dropout=0.0,
                                                     attention_dropout=0.0)


@pytest.mark.parametrize("autocast", [torch.bfloat16, None], ids=["bf16", "fp32"])
def test_bits_4_transformer_block(widths, autocast):
    """ViT's encoder block: LayerNorm inputs and everything
    nn.MultiheadAttention and GELU save at 8 bits; the two MLP linears'
    inputs (LayerNorm's and GELU's outputs) at 4."""
    block, tokens = _encoder_block(), 4 * 64
    x = torch.randn(4, 64, 64, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast is not None):
        with compressed_activations(bits=4, min_numel=1024):
            block(x * 1.0).float().sum()
    four = [w for w in widths if w[1] == 4]
    assert sorted(four) == [(tokens * 64, 4, 32), (tokens * 128, 4, 32)]
    eight = [w for w in widths if w[1] == 8]
    # block 256, but 64 for the LayerNorm inputs (a block within a 64-wide row)
    assert sorted(b for _, _, b in eight) == [64, 64] + [256] * (len(eight) - 2)
    # 2 LayerNorm inputs, GELU's input, and at least q, k, v and attention's output
    assert len(eight) >= 7 and (tokens * 128, 8, 256) in eight
    widths.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast is not None):
        with compressed_activations(bits=4, norm_bits=4, nonlinear_bits=4, min_numel=1024):
            block(x * 1.0).float().sum()
    assert {b for _, b, _ in widths} == {4} and len(widths) == len(four) + len(eight)


def test_scaled_dot_product_attention_saves_at_8_bits(widths):
    torch.manual_seed(2)
    proj = nn.Linear(64, 3 * 64)
    x = torch.randn(4, 128, 64)
    with compressed_activations(bits=4, min_numel=1024):
        q, k, v = proj(x).view(4, 128, 3, 2, 32).permute(2, 0, 3, 1, 4)
        F.scaled_dot_product_attention(q, k, v).sum()
    assert widths and all(w[1] == 8 for w in widths)


def test_block_given_applies_to_every_width(widths):
    n = 512
    with compressed_activations(bits=4, block=64, min_numel=1024):
        _mlp(nn.GELU())(torch.randn(n, 32)).sum()
    assert widths == [(n * 64, 8, 64), (n * 64, 4, 64), (n * 96, 4, 64)]


@pytest.mark.parametrize(
    "kwargs,exc,msg",
    [
        ({"nonlinear_bits": 2}, ValueError, "nonlinear_bits must be 4, 8, 16 .kept as they are. or None, got 2"),
        ({"nonlinear_bits": 8.5}, TypeError, "nonlinear_bits must be an integer"),
        ({"nonlinear_bits": True}, TypeError, "nonlinear_bits must be an integer"),
        ({"norm_bits": 12}, ValueError, "norm_bits must be 4, 8, 16"),
    ],
)
def test_bad_width_arguments(kwargs, exc, msg):
    with pytest.raises(exc, match="mixprec.memory.compressed_activations: " + msg):
        compressed_activations(bits=4, **kwargs)


def test_defaults_are_8_for_norm_and_nonlinear():
    for bits in (4, 8):
        ca = compressed_activations(bits=bits)
        assert (ca.norm_bits, ca.nonlinear_bits) == (8, 8)
    ca = compressed_activations(bits=4, norm_bits=16, nonlinear_bits=4)
    assert (ca.norm_bits, ca.nonlinear_bits) == (16, 4)


# ---- what the policy is for: the per-parameter gradient bar ---------------------------


def _cos(a, b):
    return float(F.cosine_similarity(a.reshape(1, -1).double(), b.reshape(1, -1).double()))


def _worst(model, x, y, bits=4, **kw):
    def grads(ctx):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16), ctx:
            loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    ref = grads(torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t))
    got = grads(compressed_activations(bits=bits, seed=5, min_numel=1024, **kw))
    return min(_cos(ref[k], got[k]) for k in ref if ref[k].norm() > 0)


def test_small_vit_gradients():
    """A 2-block ViT (hidden 64, MLP 128) at 32x32, batch 8. 4 bits with the
    shipped policy: every parameter's gradient at cosine >= 0.99 (0.992-0.993
    over rounding seeds 5-7; the worst is an MLP's first linear, fed 4-bit
    codes of a LayerNorm output), against 0.972-0.976 with everything at 4
    bits (the first block's in-projection / LayerNorm). 8 bits: 0.9999;
    before LayerNorm's rows got their own blocks, a 256-element block held
    four 64-element rows and the class token's row (far smaller than the
    patches') came back as noise (ln_1.weight at 0.956 on a 4-block one)."""
    torch.manual_seed(3)
    model = tv.models.vision_transformer.VisionTransformer(32, 4, 2, 4, 64, 128, num_classes=10)
    nn.init.trunc_normal_(model.heads.head.weight, std=0.02)
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g)
    policy = _worst(model, x, y)
    all4 = _worst(model, x, y, norm_bits=4, nonlinear_bits=4)
    assert policy >= 0.99 and all4 < 0.98, (policy, all4)
    assert _worst(model, x, y, bits=8) >= 0.999


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("row,block", [(768, 256), (384, 128), (64, 64), (96, 32), (100, 256)])
def test_layer_norm_input_blocks_within_rows(widths, bits, row, block):
    """A LayerNorm input's block divides the row it normalises (down to 32;
    a row no power of two >= 32 divides keeps the default)."""
    torch.manual_seed(6)
    ln = nn.LayerNorm(row)
    x = torch.randn(8, 2048 // row + 16, row, requires_grad=True)
    with compressed_activations(bits=bits, min_numel=1024):
        ln(x * 1.0).sum()
    want = min(block, 256) if block != 256 or row % 256 == 0 else 256
    assert widths[0][1:] == (8, want)  # norm_bits: 8 under either bits
    widths.clear()
    with compressed_activations(bits=bits, norm_bits=4, min_numel=1024):
        ln(x * 1.0).sum()
    assert widths[0][1:] == (4, 32)
