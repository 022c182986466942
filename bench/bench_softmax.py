"""Benchmark: mixprec's FP32-accumulating softmax / cross-entropy vs torch,
on the CPU (or CUDA), FP16 and BF16 inputs.

For each shape and dtype, in one process, on the same inputs, interleaved,
median of several runs, forward ("fwd") and forward+backward ("fwd+bwd"):
  upcast    what mixed-precision code does today: torch's op on x.float()
            (softmax: torch.softmax(x.float(), -1); CE: F.cross_entropy(x.float(), t))
  half      torch's op on the half tensor directly (softmax output in the
            half dtype; CE loss in the half dtype)
  (soft CE, "cross_entropy soft": the same with an FP32 class-probability
            target of the logits' shape, as timm's / torchvision's Mixup and
            CutMix make: F.cross_entropy(x.float(), t) vs mixprec.ops.cross_entropy(x, t))
  mixprec   mixprec.ops.softmax(x, -1, torch.float32) (the drop-in for the
            upcast path: FP32 output) / mixprec.ops.cross_entropy(x, t);
            "mixprec half-out": softmax with half output (mixprec.ops.softmax(x, -1)),
            the same bytes as torch's half path; "vs half" compares those two
            (for CE both columns are the same op: the loss is FP32 either way)
  copy      the copy bandwidth of this machine measured in the same run
            (torch clone of a float32 buffer of the same byte size as the
            op's minimum traffic / 2): the limit for a memory-bound op
"vs upcast" / "vs half" are medians over the rounds of the ratio within a
round (same inputs, the calls back to back).
Minimum traffic per element: softmax fwd 2 (read) + 4 (FP32 write) bytes,
fwd+bwd adds 4 (grad) + 4 (saved output) + 2 (half grad write); CE fwd reads
2, fwd+bwd 2 + 2 (second read in backward) + 2 (gradient write); soft CE
with an FP32 target fwd 2 + 4, fwd+bwd 6 + 2 + 4 (both read again) + 2.

Also the peak memory of CE forward+backward on the segmentation logits:
upcast+torch vs mixprec (CPU: torch profiler's allocation events; CUDA:
torch.cuda.max_memory_allocated).

Usage: python bench/bench_softmax.py [--device cpu|cuda] [--quick] [--reps N] [--threads N] [--kinds sm,ce,ces]
       [--out FILE]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import mixprec  # noqa: E402
from _common import Table, add_threads_option, apply_threads, cpu_isa, device_of, parser, utc_now, machine, sync, timed, timed_with_output  # noqa: E402,F401

# (kind, shape): "sm" = softmax over the last dim, "ce" = cross-entropy over dim 1,
# "ces" = cross-entropy with class-probability targets (Mixup/CutMix).
CONFIGS = [
    ("sm", (4096, 1000)),
    ("sm", (65536, 512)),
    ("sm", (4096, 32000)),
    ("ce", (4096, 1000)),
    ("ce", (4096, 32000)),
    ("ce", (8, 21, 512, 512)),
    ("ces", (4096, 1000)),
    ("ces", (1024, 21843)),
    ("ces", (8, 21, 256, 256)),
]
QUICK_CONFIGS = [("sm", (1024, 1000)), ("sm", (8192, 512)), ("sm", (256, 32000)), ("ce", (1024, 1000)),
                 ("ce", (2, 21, 256, 256)), ("ces", (1024, 1000)), ("ces", (2, 21, 64, 64))]
KIND_NAMES = {"sm": "softmax", "ce": "cross_entropy", "ces": "cross_entropy soft"}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def bench_config(kind, shape, dtype, device, reps):
    gen = torch.Generator().manual_seed(hash((kind, shape)) & 0xFFFF)
    x = (torch.randn(shape, generator=gen) * 3).to(dtype).to(device)
    n = x.numel()
    if kind == "sm":
        g32 = torch.randn(shape, generator=gen).to(device)
        g16 = g32.to(dtype)
        moved = {"fwd": 6 * n, "fwd+bwd": 16 * n}
    elif kind == "ce":
        C = shape[1]
        tshape = (shape[0], *shape[2:])
        t = torch.randint(0, C, tshape, generator=gen).to(device)
        moved = {"fwd": 2 * n, "fwd+bwd": 6 * n}
    else:
        t = torch.softmax(torch.randn(shape, generator=gen) * 3, 1).to(device)
        moved = {"fwd": 6 * n, "fwd+bwd": 14 * n}
    xg = x.clone().requires_grad_()
    flat = torch.empty(max(moved.values()) // 8, dtype=torch.float32, device=device).normal_()

    if kind == "sm":
        fns = {
            ("fwd", "upcast"): lambda: torch.softmax(x.float(), -1),
            ("fwd", "half"): lambda: torch.softmax(x, -1),
            ("fwd", "mixprec"): lambda: mixprec.ops.softmax(x, -1, torch.float32),
            ("fwd", "mixprec_half"): lambda: mixprec.ops.softmax(x, -1),
            ("fwd+bwd", "upcast"): lambda: torch.autograd.grad(torch.softmax(xg.float(), -1), xg, g32),
            ("fwd+bwd", "half"): lambda: torch.autograd.grad(torch.softmax(xg, -1), xg, g16),
            ("fwd+bwd", "mixprec"): lambda: torch.autograd.grad(mixprec.ops.softmax(xg, -1, torch.float32), xg, g32),
            ("fwd+bwd", "mixprec_half"): lambda: torch.autograd.grad(mixprec.ops.softmax(xg, -1), xg, g16),
        }
    else:
        fns = {  # t: class indices ("ce") or probabilities ("ces"); mixprec decides by shape, as torch
            ("fwd", "upcast"): lambda: F.cross_entropy(x.float(), t),
            ("fwd", "half"): lambda: F.cross_entropy(x, t),
            ("fwd", "mixprec"): lambda: mixprec.ops.cross_entropy(x, t),
            ("fwd+bwd", "upcast"): lambda: torch.autograd.grad(F.cross_entropy(xg.float(), t), xg),
            ("fwd+bwd", "half"): lambda: torch.autograd.grad(F.cross_entropy(xg, t), xg),
            ("fwd+bwd", "mixprec"): lambda: torch.autograd.grad(mixprec.ops.cross_entropy(xg, t), xg),
        }
    for phase in moved:
        size = moved[phase] // 8
        fns[(phase, "copy")] = (lambda s: lambda: flat[:s].clone())(size)
    times = {k: [] for k in fns}
    for fn in fns.values():  # warm-up
        fn()
    for _ in range(reps):
        for k, fn in fns.items():
            times[k].append(timed(fn, device))
    med = {k: statistics.median(v) for k, v in times.items()}
    out = []
    for phase in moved:
        up, half, ours, copy = (med[(phase, w)] for w in ("upcast", "half", "mixprec", "copy"))
        gbs = moved[phase] / ours / 1e9
        copy_gbs = moved[phase] / copy / 1e9
        # Same output dtype as torch's half path (softmax only; a CE loss is
        # one number either way).
        ours_half = med.get((phase, "mixprec_half"), ours)
        # Ratios: the median over rounds of the ratio within each round (the
        # calls of one round run back to back), steadier than a ratio of
        # medians on a machine others are using.
        def ratio(a, b):
            return statistics.median(x / y for x, y in zip(times[(phase, a)], times[(phase, b)]))

        ours_half_key = "mixprec_half" if (phase, "mixprec_half") in times else "mixprec"
        out.append(dict(phase=phase, up=up * 1e3, half=half * 1e3, ours=ours * 1e3, ours_half=ours_half * 1e3,
                        vs_up=ratio("upcast", "mixprec"),
                        vs_half=ratio("half", ours_half_key), gbs=gbs, copy_gbs=copy_gbs, frac=gbs / copy_gbs))
    return out


def _peak_cpu(fn):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    ev = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    cur = peak = 0
    for _, b in ev:
        cur += b
        peak = max(peak, cur)
    return peak


def _peak_cuda(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def peak_memory(shape, device, soft=False):
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(shape, generator=gen).bfloat16().to(device).requires_grad_()
    if soft:
        t = torch.softmax(torch.randn(shape, generator=gen), 1).to(device)
    else:
        t = torch.randint(0, shape[1], (shape[0], *shape[2:]), generator=gen).to(device)

    def upcast():
        F.cross_entropy(x.float(), t).backward()
        x.grad = None

    def ours():
        mixprec.ops.cross_entropy(x, t).backward()
        x.grad = None

    peak = _peak_cuda if device.type == "cuda" else _peak_cpu
    upcast(), ours()
    return x.numel() * 2, peak(upcast), peak(ours)


def main():
    ap = parser(__doc__, "write the tables as Markdown here")
    ap.add_argument("--kinds", default="sm,ce,ces", help="which rows: sm (softmax), ce, ces (soft-target CE)")
    add_threads_option(ap)
    args = ap.parse_args()
    apply_threads(args)
    device = device_of(args)
    kinds = set(args.kinds.split(","))
    configs = [c for c in (QUICK_CONFIGS if args.quick else CONFIGS) if c[0] in kinds]
    reps = args.reps or (3 if args.quick else 5)
    isa = cpu_isa(device)
    table = Table("| op | shape | dtype | pass | upcast ms | torch-half ms | mixprec ms | mixprec half-out ms | "
                  "vs upcast | vs half | mixprec GB/s | copy GB/s | % of copy |")
    for kind, shape in configs:
        for name, dtype in DTYPES.items():
            for r in bench_config(kind, shape, dtype, device, reps):
                table.add(f"| {KIND_NAMES[kind]} | {'x'.join(map(str, shape))} | {name} | "
                       f"{r['phase']} | {r['up']:.2f} | {r['half']:.2f} | {r['ours']:.2f} | "
                       f"{r['ours_half']:.2f} | {r['vs_up']:.2f}x | "
                          f"{r['vs_half']:.2f}x | {r['gbs']:.1f} | {r['copy_gbs']:.1f} | {100 * r['frac']:.0f}% |")
    seg = (2, 21, 256, 256) if args.quick else (8, 21, 512, 512)
    logits, up, ours = peak_memory(seg, device)
    mem = (f"Peak memory of CE forward+backward on BF16 logits {'x'.join(map(str, seg))} "
           f"({logits / 2**20:.0f} MiB): upcast+torch {up / 2**20:.0f} MiB, mixprec {ours / 2**20:.0f} MiB "
           f"({up / max(ours, 1):.1f}x less).")
    if "ces" in kinds:
        sshape = (1024, 1000) if args.quick else (4096, 21843)
        logits, up, ours = peak_memory(sshape, device, soft=True)
        mem += (f"\nPeak memory of soft-target CE forward+backward on BF16 logits {'x'.join(map(str, sshape))} "
                f"({logits / 2**20:.0f} MiB) with an FP32 target ({2 * logits / 2**20:.0f} MiB, not counted): "
                f"upcast+torch {up / 2**20:.0f} MiB, mixprec {ours / 2**20:.0f} MiB ({up / max(ours, 1):.1f}x less).")
    print(mem)
    when = utc_now()
    info = f"{machine(device)}; CPU path {isa}" if isa else machine(device)
    print(f"\nmachine: {info}; date: {when}; median of {reps} interleaved runs")
    table.write(args.out, f"softmax / cross-entropy benchmark ({device.type})",
                f"Machine: {info}. Date: {when}. Median of {reps} interleaved runs, one process.",
                f"python bench/bench_softmax.py --device {args.device}{' --quick' if args.quick else ''}"
                f"{f' --kinds {args.kinds}' if args.kinds != 'sm,ce,ces' else ''}"
                f"{f' --threads {args.threads}' if args.threads else ''}", mem)


if __name__ == "__main__":
    main()
