"""Cost of mixprec.guard.ForwardGuard: one autocast training step (forward,
backward, mixprec GradScaler with diagnostics, mixprec AdamW) with the guard
on vs off, on a ResNet-style and a ViT-style model, on the CPU.

BF16 autocast: the CPU has fast BF16 kernels but none for FP16 (an FP16
ResNet-18 step is ~25x the BF16 one here), and a slower step would only
hide the guard's cost, which does not depend on the dtype (one read of each
module's output, per-module Python hooks).

Three copies of the model from the same weights, one guarded; rounds
alternate between them (off, off again, on, ...) in one process; the figure
is the median over rounds of (on / off) of each round's median step time,
next to (off again / off): the noise floor of the machine at that time.

    PYTHONPATH=python:bench python bench/bench_guard.py [--rounds 7] [--steps 3]

(about 1.5 minutes for both models on a quiet 2-core machine: 2 warm-up +
rounds x steps steps of each of the three copies).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import statistics
import time

import torch
import torch.nn.functional as F
import torchvision

import mixprec
from mixprec.guard import ForwardGuard
from _common import machine


class Attention(torch.nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        out = ((q @ k.transpose(-2, -1)) * self.scale).softmax(-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class Block(torch.nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.norm1, self.attn = torch.nn.LayerNorm(dim), Attention(dim, heads)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(torch.nn.Module):
    """ViT-Tiny shapes (dim 192, 3 heads, depth 12) on 64 patches of 16x16x3."""

    def __init__(self, dim=192, depth=12, heads=3, classes=100):
        super().__init__()
        self.embed = torch.nn.Conv2d(3, dim, 16, 16)
        self.pos = torch.nn.Parameter(torch.zeros(1, 64, dim))
        self.blocks = torch.nn.Sequential(*[Block(dim, heads) for _ in range(depth)])
        self.norm, self.head = torch.nn.LayerNorm(dim), torch.nn.Linear(dim, classes)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2) + self.pos
        return self.head(self.norm(self.blocks(x)).mean(1))


def _setup(model):
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = mixprec.amp.GradScaler("cpu", diagnostics=True)
    return opt, scaler


AUTOCAST = [True]  # --dtype float32 turns autocast off (CPUs without native BF16 kernels)


def _step(model, opt, scaler, x, y):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=AUTOCAST[0]):
        loss = F.cross_entropy(model(x).float(), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)


def bench(name, make, x, y, rounds, steps):
    torch.manual_seed(0)
    off = make()
    copies = {"off": off, "off again": copy.deepcopy(off), "on": copy.deepcopy(off)}
    runs = {k: (m, *_setup(m)) for k, m in copies.items()}
    guard = ForwardGuard(copies["on"]).attach(runs["on"][2])
    for _ in range(2):  # warm-up
        for m, opt, sc in runs.values():
            _step(m, opt, sc, x, y)
    t = {k: [] for k in runs}
    for _ in range(rounds):
        for k, (m, opt, sc) in runs.items():
            ts = []
            for _ in range(steps):
                t0 = time.perf_counter()
                _step(m, opt, sc, x, y)
                ts.append(time.perf_counter() - t0)
            t[k].append(statistics.median(ts))
    assert guard.report() is None  # healthy run: nothing to report
    ratios = [b / a for a, b in zip(t["off"], t["on"])]
    floor = [b / a for a, b in zip(t["off"], t["off again"])]
    checked = len(guard._order)  # modules whose outputs a forward reads
    return (name, f"{checked} of {len(list(off.modules()))}", statistics.median(t["off"]) * 1e3,
            statistics.median(t["on"]) * 1e3, statistics.median(ratios), min(ratios), max(ratios),
            statistics.median(floor))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16",
                    help="bfloat16: BF16 autocast; float32: no autocast, for CPUs whose BF16 convolutions and "
                         "matmuls are emulated (AVX2 without AVX-512-BF16/AMX: a step is then ~10x slower and "
                         "would hide the guard's cost)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    AUTOCAST[0] = a.dtype == "bfloat16"
    torch.set_num_threads(a.threads)
    load = os.getloadavg()
    t_start = time.perf_counter()
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    g = torch.Generator().manual_seed(0)
    rows = [
        bench("ResNet-18 (torchvision), batch 8, 32x32", lambda: torchvision.models.resnet18(num_classes=100),
              torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 100, (8,), generator=g), a.rounds, a.steps),
        bench("ViT-Tiny shapes (12 blocks, dim 192, 3 heads), batch 8, 128x128 (64 tokens)", ViT,
              torch.randn(8, 3, 128, 128, generator=g), torch.randint(0, 100, (8,), generator=g), a.rounds, a.steps),
    ]
    lines = [
        "# mixprec.guard.ForwardGuard: cost per training step (CPU)",
        "",
        f"`PYTHONPATH=python:bench python bench/bench_guard.py --dtype {a.dtype}` — one "
        f"{'BF16-autocast' if AUTOCAST[0] else 'FP32 (no autocast)'} training step (forward, "
        "backward, mixprec GradScaler with diagnostics, mixprec AdamW), guard on (defaults: every module but "
        "the range-safe ones and nn.Sequential containers checked, forward checks, attached to the scaler) vs off, three copies of one model "
        "(off, off again, on), "
        f"interleaved rounds in one process, medians of {a.rounds} rounds x {a.steps} steps, "
        f"{a.threads} thread(s). BF16 rather than FP16 because the CPU has no fast FP16 kernels (see the "
        "script's docstring); FP32 where the CPU's BF16 kernels are emulated too.",
        "",
        f"{machine(torch.device('cpu'))}; started {started}, load average at start "
        f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1/5/15 min).",
        "",
        "| model | modules checked | off (ms/step) | on (ms/step) | on / off (median) | min | max | off again / off |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, n, toff, ton, r, lo, hi, fl in rows:
        lines.append(f"| {name} | {n} | {toff:.1f} | {ton:.1f} | {r:.3f} | {lo:.3f} | {hi:.3f} | {fl:.3f} |")
    lines += ["", f"{time.perf_counter() - t_start:.0f} s in all."]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
