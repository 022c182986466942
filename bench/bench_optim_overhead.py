"""Host-side cost of the optimizer's bookkeeping per step: the check that
makes FP32 masters follow outside writes to their params (one version-counter
compare per param, issue 12.2), timed against the same step with the check
bypassed, interleaved in one process, median of per-round ratios. Many small
params is where host overhead shows; at 1M+ elements per param the step is
memory-bound and the check is lost in the noise.

Usage: python bench/bench_optim_overhead.py [--reps 41] [--threads N]
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
import mixprec  # noqa: E402
from _common import machine  # noqa: E402


def make(n_tensors, numel, gen):
    ps = [torch.nn.Parameter((torch.randn(numel, generator=gen) * 0.1).bfloat16()) for _ in range(n_tensors)]
    for p in ps:
        p.grad = (torch.randn(numel, generator=gen) * 0.01).bfloat16()
    return ps


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=41)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for n_tensors, numel in ((1000, 100), (100, 10_000), (10, 1_000_000)):
        opts = {}
        for name in ("checked", "bypassed"):
            opt = mixprec.optim.AdamW(make(n_tensors, numel, gen), lr=1e-4)
            if name == "bypassed":
                opt._follow_outside_writes = lambda *args: None
            opt.step()  # state created
            opts[name] = opt
        times = {k: [] for k in opts}
        ratios = []
        for _ in range(args.reps):
            t = {}
            for name, opt in opts.items():
                t0 = time.perf_counter()
                opt.step()
                t[name] = time.perf_counter() - t0
                times[name].append(t[name])
            ratios.append(t["checked"] / t["bypassed"])
        rows.append((f"{n_tensors}x{numel:,}", statistics.median(times["bypassed"]) * 1e3,
                     statistics.median(times["checked"]) * 1e3, statistics.median(ratios)))
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"Machine: {machine(torch.device('cpu'))}. Date: {now}. Median of {args.reps} interleaved rounds.")
    print("Command: `python bench/bench_optim_overhead.py`\n")
    print("| AdamW BF16+master, params | step without the check ms | step with the check ms | median per-round ratio |")
    print("|---|---|---|---|")
    for name, a, b, r in rows:
        print(f"| {name} | {a:.3f} | {b:.3f} | {r:.3f}x |")


if __name__ == "__main__":
    main()
