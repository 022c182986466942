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

import argparse
import datetime
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import mixprec  # noqa: E402
from _common import machine, sync, timed, timed_with_output  # noqa: E402,F401

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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--quick", action="store_true", help="small sizes, few runs (smoke test)")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--out", default=None, help="write the table as Markdown here")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not mixprec.cuda_ops_loaded():
        sys.exit("mixprec CUDA ops not loaded (no GPU, or libmixprec_cuda.so not built)")
    try:
        import torchvision as tv
    except ImportError:
        sys.exit("torchvision is needed for the comparison")
    sizes = QUICK_SIZES if args.quick else SIZES
    reps = args.reps or (3 if args.quick else 7)
    isa = ""
    capi = mixprec.capi_library_path()
    if capi and device.type == "cpu":
        import ctypes

        lib = ctypes.CDLL(capi)
        isa = {1: "scalar", 2: "avx2", 3: "avx512"}.get(lib.mixprec_get_cpu_isa(), "?")
    header = (
        "| boxes | overlap | classes | torchvision ms | mixprec ms | speedup | mixprec fp16 ms | "
        "kept torchvision | kept mixprec | kept fp16 | identical |"
    )
    rows = [header, "|" + "---|" * 11]
    print(header)
    for overlap in ("dense", "sparse"):
        for n_classes in CLASSES:
            for n in sizes:
                r = bench_one(tv, n, overlap, n_classes, device, reps)
                row = (
                    f"| {n:,} | {overlap} | {n_classes} | {r['tv_ms']:.2f} | {r['mp_ms']:.2f} | "
                    f"{r['tv_ms'] / r['mp_ms']:.1f}x | {r['mp16_ms']:.2f} | {r['kept_tv']} | "
                    f"{r['kept_mp']} | {r['kept_16']} | {'yes' if r['same'] else 'NO'} |"
                )
                rows.append(row)
                print(row, flush=True)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    info = f"{machine(device)}; torchvision {tv.__version__}"
    if isa:
        info += f"; CPU path {isa}"
    print(f"\nmachine: {info}; date: {when}; median of {reps} interleaved runs (3 when a call takes > 2 s)")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as f:
            f.write(f"# NMS benchmark ({device.type})\n\n")
            f.write(
                f"Machine: {info}. Date: {when}. Median of {reps} interleaved runs "
                "(3 when one call takes over 2 s), one process, float32 inputs; "
                "IoU threshold 0.5.\n"
            )
            f.write(f"Command: `python bench/bench_nms.py --device {args.device}"
                    f"{' --quick' if args.quick else ''}`\n\n")
            f.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
