"""Cost of writing the unscaled gradient back (unscale_grads=True) in
mixprec's fused AdamW step, against the read-only step (unscale_grads=False).

torch.ops.mixprec.adamw_step_ on BF16 params with FP32 masters and state and
BF16 grads, grad_scale given: the read-only step moves 28 B/param (grad 2,
master 8, m 8, v 8, param 2); writing the grad back adds 2 B/param (its lines
are already read, so only the write-back: 30 B/param, +7%).

Both variants step the SAME buffers (same placement in memory), interleaved
A B B A in each round so that drift cancels; reported: the median time of
each and the median of the per-round ratios. The grad scale is 1.0 so the
written grads keep their values step after step (a scale > 1 would shrink
them towards subnormals, whose arithmetic is slow on x86 and would time
something else); the kernel divides and stores exactly as with any scale.

Usage: python bench/bench_optim_grads.py [--tensors 100] [--numel 1000000]
           [--reps 15] [--threads N] [--sgd]
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import mixprec  # noqa: E402,F401  (loads the ops)
from _common import machine  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tensors", type=int, default=100)
    ap.add_argument("--numel", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--sgd", action="store_true", help="SGD with momentum (20 B/param read-only) instead")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    n, k = args.tensors, args.numel
    x = [torch.randn(k, generator=gen) * 0.1 for _ in range(n)]
    params = [t.bfloat16() for t in x]
    masters = x
    grads = [(torch.randn(k, generator=gen) * 0.01).bfloat16() for _ in range(n)]
    m = [torch.zeros(k) for _ in range(n)]
    v = [torch.zeros(k) for _ in range(n)]
    steps = [torch.zeros(()) for _ in range(n)]
    scale, found = torch.tensor(1.0), torch.tensor(0.0)

    def step(unscale):
        if args.sgd:
            torch.ops.mixprec.sgd_step_(params, grads, masters, m, steps, 1e-3, 0.9, 0.0, 0.0, False, False,
                                        None, scale, found, 0, unscale)
        else:
            torch.ops.mixprec.adamw_step_(params, grads, masters, m, v, [], steps, 1e-3, 0.9, 0.999, 1e-2,
                                          1e-8, False, False, None, scale, found, 0, unscale)

    def t(unscale):
        t0 = time.perf_counter()
        step(unscale)
        return time.perf_counter() - t0

    step(False)
    step(True)
    ro, wb, ratio = [], [], []
    for _ in range(args.reps):
        a1, b1, b2, a2 = t(False), t(True), t(True), t(False)
        ro += [a1, a2]
        wb += [b1, b2]
        ratio.append((b1 + b2) / (a1 + a2))
    name = "SGD (momentum 0.9)" if args.sgd else "AdamW"
    bytes_ro = 20 if args.sgd else 28
    ms_ro, ms_wb = statistics.median(ro) * 1e3, statistics.median(wb) * 1e3
    total = n * k
    print(f"{name}, {n} x {k:,} params (BF16 + FP32 master, BF16 grads), {torch.get_num_threads()} threads, "
          f"{args.reps} rounds (A B B A)")
    print(f"machine: {machine(torch.device('cpu'))}; {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print("| variant | B/param | median ms | GB/s (B/param moved) |")
    print("|---|---|---|---|")
    print(f"| read-only grads (unscale_grads=False) | {bytes_ro} | {ms_ro:.2f} | {total * bytes_ro / ms_ro / 1e6:.1f} |")
    print(f"| grads written back (unscale_grads=True) | {bytes_ro + 2} | {ms_wb:.2f} | "
          f"{total * (bytes_ro + 2) / ms_wb / 1e6:.1f} |")
    print(f"median per-round ratio written/read-only: {statistics.median(ratio):.3f}x "
          f"(min {min(ratio):.3f}, max {max(ratio):.3f}); bytes ratio {(bytes_ro + 2) / bytes_ro:.3f}x")


if __name__ == "__main__":
    main()
