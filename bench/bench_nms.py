"""Benchmark: mixprec's NMS vs torchvision's, on the CPU (or CUDA).

For each box count (1k .. 50k), overlap pattern and class count, in one
process, on the same float32 inputs, interleaved, median of several runs:
  torchvision  torchvision.ops.nms (1 class) / torchvision.ops.batched_nms
  mixprec      torch.ops.mixprec.nms / batched_nms (same inputs), and the
               same op on the boxes and scores cast to float16 (which
               torchvision's CPU kernel refuses)
with the kept counts of both and whether the kept indices are identical.
Overlap: "dense" = boxes jittered around n/50 centres (most are suppressed);
"sparse" = small boxes spread over an area growing with n (few overlaps).
Scores are a random permutation (no ties), so torchvision's unstable GPU sort
and its batched_nms cannot legitimately disagree with mixprec's order.

Usage: python bench/bench_nms.py [--device cpu|cuda] [--quick] [--out FILE]
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import mixprec  # noqa: E402
from _common import Table, cpu_isa, device_of, parser, utc_now, machine, sync, timed, timed_with_output  # noqa: E402,F401

SIZES = [1000, 5000, 10000, 20000, 50000]
QUICK_SIZES = [1000, 5000]
CLASSES = [1, 80, 1000]


def make(n, overlap, n_classes, seed):
    gen = torch.Generator().manual_seed(seed)
    if overlap == "dense":
        k = max(1, n // 50)
        centres = torch.rand(k, 2, generator=gen) * 1000
        xy = centres[torch.randint(0, k, (n,), generator=gen)] + torch.randn(n, 2, generator=gen) * 8
        wh = 60 + torch.randn(n, 2, generator=gen) * 6
    else:
        side = 1000 * math.sqrt(n / 1000)
        xy = torch.rand(n, 2, generator=gen) * side
        wh = 10 + torch.rand(n, 2, generator=gen) * 30
    boxes = torch.cat([xy, xy + wh], 1)
    scores = torch.randperm(n, generator=gen).float() / n
    idxs = torch.randint(0, n_classes, (n,), generator=gen)
    return boxes, scores, idxs


def bench_one(tv, n, overlap, n_classes, device, reps, thr=0.5):
    boxes, scores, idxs = make(n, overlap, n_classes, seed=n * 31 + n_classes)
    b, s, i = boxes.to(device), scores.to(device), idxs.to(device)
    b16, s16 = b.half(), s.half()
    if n_classes == 1:
        f_tv = lambda: tv.ops.nms(b, s, thr)  # noqa: E731
        f_mp = lambda: torch.ops.mixprec.nms(b, s, thr)  # noqa: E731
        f_16 = lambda: torch.ops.mixprec.nms(b16, s16, thr)  # noqa: E731
    else:
        f_tv = lambda: tv.ops.batched_nms(b, s, i, thr)  # noqa: E731
        f_mp = lambda: torch.ops.mixprec.batched_nms(b, s, i, thr)  # noqa: E731
        f_16 = lambda: torch.ops.mixprec.batched_nms(b16, s16, i, thr)  # noqa: E731
    # Warm-up, results, and a first timing that sets the repetitions for
    # slow cases (torchvision's CPU kernel takes seconds at 50k).
    t_first, k_tv = timed_with_output(f_tv, device)
    _, k_mp = timed_with_output(f_mp, device)
    _, k_16 = timed_with_output(f_16, device)
    if t_first > 2.0:
        reps = min(reps, 3)
    t_tv, t_mp, t_16 = [], [], []
    for _ in range(reps):
        t_tv.append(timed_with_output(f_tv, device)[0])
        t_mp.append(timed_with_output(f_mp, device)[0])
        t_16.append(timed_with_output(f_16, device)[0])
    return {
        "tv_ms": 1e3 * statistics.median(t_tv),
        "mp_ms": 1e3 * statistics.median(t_mp),
        "mp16_ms": 1e3 * statistics.median(t_16),
        "kept_tv": len(k_tv),
        "kept_mp": len(k_mp),
        "kept_16": len(k_16),
        "same": torch.equal(k_tv.cpu(), k_mp.cpu()),
        "reps": reps,
    }


def main():
    args = parser(__doc__).parse_args()
    device = device_of(args)
    try:
        import torchvision as tv
    except ImportError:
        sys.exit("torchvision is needed for the comparison")
    sizes = QUICK_SIZES if args.quick else SIZES
    reps = args.reps or (3 if args.quick else 7)
    isa = cpu_isa(device)
    table = Table(
        "| boxes | overlap | classes | torchvision ms | mixprec ms | speedup | mixprec fp16 ms | "
        "kept torchvision | kept mixprec | kept fp16 | identical |"
    )
    for overlap in ("dense", "sparse"):
        for n_classes in CLASSES:
            for n in sizes:
                r = bench_one(tv, n, overlap, n_classes, device, reps)
                table.add(
                    f"| {n:,} | {overlap} | {n_classes} | {r['tv_ms']:.2f} | {r['mp_ms']:.2f} | "
                    f"{r['tv_ms'] / r['mp_ms']:.1f}x | {r['mp16_ms']:.2f} | {r['kept_tv']} | "
                    f"{r['kept_mp']} | {r['kept_16']} | {'yes' if r['same'] else 'NO'} |"
                )
    when = utc_now()
    info = f"{machine(device)}; torchvision {tv.__version__}"
    if isa:
        info += f"; CPU path {isa}"
    print(f"\nmachine: {info}; date: {when}; median of {reps} interleaved runs (3 when a call takes > 2 s)")
    table.write(args.out, f"NMS benchmark ({device.type})",
                f"Machine: {info}. Date: {when}. Median of {reps} interleaved runs (3 when one call takes over 2 s), "
                "one process, float32 inputs; IoU threshold 0.5.",
                f"python bench/bench_nms.py --device {args.device}{' --quick' if args.quick else ''}")


if __name__ == "__main__":
    main()
