"""Small models whose FP16 forward really overflows, shared by the guard and
parity tests (and bench/bench_guard.py builds the same shapes larger)."""

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        logits = (q @ k.transpose(-2, -1)) * self.scale  # beyond 65504 in FP16 when q, k are large
        out = logits.softmax(-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyViT(nn.Module):
    def __init__(self, in_dim=24, dim=32, heads=2, depth=2, classes=5):
        super().__init__()
        self.embed = nn.Linear(in_dim, dim)
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        return self.head(self.norm(self.blocks(self.embed(x))).mean(1))


def blow_up_attention(model, block=1, factor=300.0):
    """Scales block `block`'s query and key weights so that its attention
    logits exceed the FP16 range (they stay ~1e5-1e6, finite in FP32)."""
    with torch.no_grad():
        w = model.blocks[block].attn.qkv.weight
        d = w.shape[1]
        w[: 2 * d].mul_(factor)


def vit(seed=0, overflow=True, **kw):
    torch.manual_seed(seed)
    m = TinyViT(**kw)
    if overflow:
        blow_up_attention(m)
    return m


def batches(n, seed=1, batch=8, tokens=6, in_dim=24, classes=5):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, tokens, in_dim, generator=g), torch.randint(0, classes, (batch,), generator=g))
            for _ in range(n)]


def setup():
    """For ``python -m mixprec.parity _models:setup`` (the CLI test)."""
    data = batches(4)
    return {"make_model": vit, "batches": data}


def amp_steps(forward, opt, scaler, data, autocast=torch.float16, device="cpu", hook=None):
    """The guard tests' training loop: for each (x, y) of data, hook(i) if
    given, the cross-entropy of forward(x) (under autocast to that dtype;
    None: without autocast), then scaler.scale(loss).backward(),
    scaler.step(opt), scaler.update(), opt.zero_grad(). Returns (losses,
    skipped): skipped[i] says step i was skipped (its scale was backed off,
    which any GradScaler does on a skip and never otherwise)."""
    losses, skipped = [], []
    for i, (x, y) in enumerate(data):
        if hook is not None:
            hook(i)
        before = scaler.get_scale()
        with torch.autocast(device, dtype=autocast or torch.float16, enabled=autocast is not None):
            loss = F.cross_entropy(forward(x).float(), y)
        losses.append(loss.item())
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        skipped.append(scaler.get_scale() < before)
    return losses, skipped
