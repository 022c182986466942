"""RoIAlign: mixprec.ops.roi_align against what a user would run instead, in
one process, same inputs, interleaved, median of --reps runs.

- float32 features: torchvision.ops.roi_align (its CPU kernel is single
  threaded, so mixprec is also timed on 1 thread: the per-thread ratio);
- float16 / bfloat16 features: the upcast path, torchvision on
  x.float() and rois.float() with the result cast back (torchvision's CPU
  kernel has no bfloat16 at all), against mixprec on the half tensors.
Forward and forward+backward. Memory: the bytes the call allocates, measured
with torch.profiler(profile_memory=True) on the CPU (max_memory_allocated
above the inputs on CUDA). RoIAlign is a gather, not a stream: its speed is
reported as time and ratio (and bilinear taps per second), not as a fraction
of memory bandwidth.

    python bench/bench_roi_align.py --device cpu --out bench/results/roi_align_cpu.md
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import os
import statistics

import torch
import torchvision

import mixprec
from mixprec.ops import roi_align

from _common import machine, sync, timed

# (name, N, C, H, W, spatial_scale, rois per image, output, sampling_ratio, box size range in image px)
CASES = [
    ("box pool, FPN P2", 2, 256, 200, 336, 0.25, 512, 7, 2, (16, 200)),
    ("mask pool, FPN P2", 2, 256, 200, 336, 0.25, 64, 14, 2, (16, 200)),
    ("box pool, FPN P4, adaptive", 2, 256, 50, 84, 0.0625, 512, 7, -1, (100, 600)),
]


def make(case, dtype, device, gen):
    _, n, c, h, w, scale, per, out, sr, (lo, hi) = case
    x = torch.randn(n, c, h, w, generator=gen)
    k = n * per
    wh = lo + torch.rand(k, 2, generator=gen) * (hi - lo)
    xy = torch.rand(k, 2, generator=gen) * (torch.tensor([w, h]) / scale - wh).clamp(min=1)
    b = torch.arange(n).repeat_interleave(per)[:, None].float()
    rois = torch.cat([b, xy, xy + wh], 1)
    return x.to(dtype).to(device), rois.to(dtype).to(device), (out, out), scale, sr


def cpu_threads(n):
    lib = ctypes.CDLL(mixprec.library_path())
    lib.mixprec_set_num_threads(ctypes.c_int(n))


def allocated(fn, device):
    """Bytes fn allocates (CPU: profiler; CUDA: peak above the start)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    with torch.profiler.profile(profile_memory=True, activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    # self allocations only: an op's total includes its children's
    return sum(e.self_cpu_memory_usage for e in prof.events() if e.self_cpu_memory_usage > 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    load_at_start = os.getloadavg()[0]
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for case in CASES:
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            x, rois, size, scale, sr = make(case, dtype, device, gen)
            go = torch.randn(rois.shape[0], x.shape[1], *size, generator=gen).to(dtype).to(device)

            def theirs_fwd():
                if dtype == torch.float32:
                    return torchvision.ops.roi_align(x, rois, size, scale, sr)
                return torchvision.ops.roi_align(x.float(), rois.float(), size, scale, sr).to(dtype)

            def ours_fwd():
                return roi_align(x, rois, size, scale, sr)

            def theirs_fb():
                xx = (x if dtype == torch.float32 else x.float()).detach().requires_grad_()
                o = torchvision.ops.roi_align(xx, rois if dtype == torch.float32 else rois.float(), size, scale, sr)
                o.backward(go if dtype == torch.float32 else go.float())
                return xx.grad if dtype == torch.float32 else xx.grad.to(dtype)

            def ours_fb():
                xx = x.detach().requires_grad_()
                roi_align(xx, rois, size, scale, sr).backward(go)
                return xx.grad

            # identical results (torchvision float32 / upcast rounded once)
            same_f = torch.equal(theirs_fwd(), ours_fwd())
            same_b = torch.equal(theirs_fb(), ours_fb())
            t = {k: [] for k in ("tf", "of", "of1", "tb", "ob", "ob1")}
            for _ in range(args.reps):
                t["tf"].append(timed(theirs_fwd, device))
                t["of"].append(timed(ours_fwd, device))
                t["tb"].append(timed(theirs_fb, device))
                t["ob"].append(timed(ours_fb, device))
                if device.type == "cpu":
                    cpu_threads(1)
                    t["of1"].append(timed(ours_fwd, device))
                    t["ob1"].append(timed(ours_fb, device))
                    cpu_threads(0)
            med = {k: statistics.median(v) if v else float("nan") for k, v in t.items()}
            mem_t, mem_o = allocated(theirs_fb, device), allocated(ours_fb, device)
            samples = sr * sr if sr > 0 else None
            taps = rois.shape[0] * x.shape[1] * size[0] * size[1] * (samples or 0) * 4
            rows.append((case[0], str(dtype).split(".")[-1], rois.shape[0], med, mem_t, mem_o, same_f, same_b, taps))
            print(rows[-1][:3], {k: round(v * 1e3, 2) for k, v in med.items()}, mem_t >> 20, mem_o >> 20, same_f, same_b, flush=True)
    lines = [
        f"# RoIAlign benchmark ({device.type})",
        "",
        f"Machine: {machine(device)}; torchvision {torchvision.__version__}. "
        f"Date: {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC. Load average when it started: "
        f"{load_at_start:.2f} (a loaded machine inflates the absolute times; the ratios, interleaved in "
        f"one process, less so). Median of {args.reps} interleaved runs, one process. "
        "'theirs' = torchvision.ops.roi_align on float32; for bfloat16/float16 the upcast path "
        "(torchvision on x.float(), rois.float(), result cast back). ms; ratio = theirs / mixprec. "
        "'1 thr' = mixprec limited to one thread (torchvision's CPU kernel is single threaded). "
        "alloc = bytes the forward+backward call allocates (profiler, self allocations of every op; "
        "the input gradient itself is 4 B/element for float32 and 2 B for the half dtypes). identical = bitwise equal outputs "
        "and input gradients.",
        f"Command: `python bench/bench_roi_align.py --device {device.type}`",
        "",
        "| case | dtype | rois | fwd theirs | fwd mixprec | ratio | fwd mixprec 1 thr | ratio 1 thr "
        "| fwd+bwd theirs | fwd+bwd mixprec | ratio | fwd+bwd 1 thr | alloc theirs MiB | alloc mixprec MiB | identical | Gtaps/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, dt, k, m, mt, mo, sf, sb, taps in rows:
        lines.append(
            f"| {name} | {dt} | {k} | {m['tf']*1e3:.1f} | {m['of']*1e3:.1f} | {m['tf']/m['of']:.2f}x | "
            f"{m['of1']*1e3:.1f} | {m['tf']/m['of1']:.2f}x | {m['tb']*1e3:.1f} | {m['ob']*1e3:.1f} | {m['tb']/m['ob']:.2f}x | "
            f"{m['ob1']*1e3:.1f} | {mt/2**20:.1f} | {mo/2**20:.1f} | {'yes' if sf and sb else 'NO'} | "
            f"{(taps / m['of'] / 1e9) if taps else float('nan'):.2f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        open(args.out, "w").write(text)


if __name__ == "__main__":
    main()
