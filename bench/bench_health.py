"""Cost of GradScaler's overflow diagnostics (issue 15.3): one training
iteration's scaler work (scale, clip_grad_norm_ with the norm from the unscale
pass, step of mixprec's AdamW, update) with ``diagnostics=True`` vs off, on
BF16 parameters, in interleaved rounds in one process (the ratio is what
matters; the absolute times include torch's dispatch and the optimizer).

    PYTHONPATH=python python bench/bench_health.py [--device cpu|cuda] [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics

import torch

import mixprec
from _common import machine, timed

CONFIGS = [(1000, 100), (200, 10_000), (20, 1_000_000)]  # (tensors, elements each)


def setup(device, diagnostics, n, size, gen):
    params = [torch.nn.Parameter(torch.randn(size, generator=gen).to(device, torch.bfloat16)) for _ in range(n)]
    grads = [torch.randn(size, generator=gen).to(device, torch.bfloat16) for _ in range(n)]
    opt = mixprec.optim.AdamW(params, lr=1e-4)
    scaler = mixprec.amp.GradScaler(device.type, diagnostics=diagnostics)
    return params, grads, opt, scaler


def iteration(params, grads, opt, scaler):
    scaler.scale(torch.ones((), device=params[0].device))  # initialises the scale
    for p, g in zip(params, grads):
        p.grad = g.clone()
    scaler.clip_grad_norm_(opt, 1.0)
    scaler.step(opt)
    scaler.update()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    print(f"# GradScaler diagnostics overhead, {machine(device)}")
    print("| tensors x elements | off (ms/iter) | diagnostics on (ms/iter) | on / off |")
    print("|---|---|---|---|")
    for n, size in CONFIGS:
        envs = {d: setup(device, d, n, size, gen) for d in (False, True)}
        for d in envs:
            for _ in range(3):
                iteration(*envs[d])
        times = {False: [], True: []}
        ratios = []
        for _ in range(args.rounds):
            t = {}
            for d in (False, True):
                t[d] = timed(lambda: [iteration(*envs[d]) for _ in range(args.iters)], device) / args.iters
                times[d].append(t[d])
            ratios.append(t[True] / t[False])
        off, on = statistics.median(times[False]), statistics.median(times[True])
        print(f"| {n} x {size} | {1e3 * off:.3f} | {1e3 * on:.3f} | {statistics.median(ratios):.3f} |")


if __name__ == "__main__":
    main()
