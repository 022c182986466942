"""Paired timing of one optimizer step: torch.optim.AdamW(fused=True) on FP32
params against mixprec.optim.AdamW on BF16 params with FP32 masters (and its
master-free SR mode), the three stepped back to back in each round; reports
the median of the per-round ratios torch / mixprec, which cancels most of a
shared machine's drift in memory bandwidth (bench_optim.py takes the ratio of
separate medians).

Usage: python bench/bench_optim_paired.py [--tensors 100] [--numel 1000000]
           [--threads 2] [--reps 31]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import mixprec  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tensors", type=int, default=100)
    ap.add_argument("--numel", type=int, default=1_000_000)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--reps", type=int, default=31)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)

    def make(dt):
        ps = [torch.nn.Parameter((torch.randn(args.numel, generator=gen) * 0.1).to(dt)) for _ in range(args.tensors)]
        for p in ps:
            p.grad = (torch.randn(args.numel, generator=gen) * 0.01).to(dt)
        return ps

    opts = {
        "torch fused FP32": torch.optim.AdamW(make(torch.float32), lr=1e-3, fused=True),
        "mixprec BF16+master": mixprec.optim.AdamW(make(torch.bfloat16), lr=1e-3),
        "mixprec BF16 SR": mixprec.optim.AdamW(make(torch.bfloat16), lr=1e-3, master_weights=False, seed=0),
    }
    times = {k: [] for k in opts}
    for o in opts.values():
        o.step()
    for _ in range(args.reps):
        for k, o in opts.items():
            t0 = time.perf_counter()
            o.step()
            times[k].append(time.perf_counter() - t0)
    base = times["torch fused FP32"]
    print(f"AdamW, {args.tensors} x {args.numel:,} params, {torch.get_num_threads()} threads, {args.reps} rounds")
    for k, v in times.items():
        ratio = statistics.median(a / b for a, b in zip(base, v))
        print(f"  {k:<20} median {statistics.median(v) * 1e3:8.2f} ms   paired torch/this {ratio:.3f}x")


if __name__ == "__main__":
    main()
