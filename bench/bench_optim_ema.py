"""The EMA of the weights fused into mixprec's AdamW step (``ema_decay=``)
against what a user would run instead, through the optimizer classes:

  A  mixprec AdamW, BF16 params + FP32 masters, no EMA       28 B/param
  B  A with the fused FP32 EMA of the masters (ema_decay)      36 B/param
  C  A + a separate EMA pass over the masters (torch._foreach_lerp_ on FP32
     EMAs: reads the master again)                             40 B/param
  D  torch.optim.AdamW(fused=True) on FP32 params + timm ModelEmaV3.update
     (exclude_buffers; FP32 EMA of the FP32 params)            40 B/param
  E  torch.optim.AdamW(fused=True) on the BF16 params + ModelEmaV3 on the
     BF16 model (BF16 state and EMA: the EMA stalls)           20 B/param

Bytes per param are the minimum each must move (BF16 grad 2, FP32 master r/w
8, m 8, v 8, BF16 param write 2; an FP32 EMA r/w 8, a re-read of the master
4; D: FP32 grad 4, param 8, m 8, v 8, EMA pass 4 + 8). With timm not
installed, D and E use torch._foreach_lerp_ over the parameters, which is
what ModelEmaV3.update(exclude_buffers=True) runs (and say so).

Every variant is timed in each round, in the order A B C D E E D C B A so
that drift cancels; reported: each variant's median, the median of the
per-round ratios, and GB/s from the bytes above against this machine's copy
bandwidth measured in the same process (the best of 15 256 MB FP32 copy_,
2 x bytes).

Usage: python bench/bench_optim_ema.py [--tensors 10] [--numel 1000000]
           [--reps 15] [--threads N] [--device cpu|cuda] [--out FILE.md]
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

DECAY = 0.9998  # timm's --model-ema-decay default


class _Params(torch.nn.Module):
    def __init__(self, params):
        super().__init__()
        self.ps = torch.nn.ParameterList(params)


def _ema_update_fn(params, module_for_timm):
    """ModelEmaV3(exclude_buffers=True).update, or its foreach lerp."""
    try:
        from timm.utils.model_ema import ModelEmaV3
    except ImportError:
        emas = [p.detach().clone() for p in params]

        def update(step):
            torch._foreach_lerp_(emas, [p.detach() for p in params], 1.0 - DECAY)

        return update, "torch._foreach_lerp_ (timm not installed)"
    ema = ModelEmaV3(module_for_timm, decay=DECAY, exclude_buffers=True)

    def update(step):
        ema.update(module_for_timm, step=step)

    return update, "timm ModelEmaV3"


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def copy_bandwidth(dev) -> float:
    src = torch.ones(64 << 20, device=dev)
    dst = torch.empty_like(src)
    ts = []
    for _ in range(15):
        _sync(dev)
        t0 = time.perf_counter()
        dst.copy_(src)
        _sync(dev)
        ts.append(time.perf_counter() - t0)
    # The best of 15: on a shared machine the median mostly measures the
    # other jobs.
    return 2 * src.numel() * 4 / min(ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tensors", type=int, default=10)
    ap.add_argument("--numel", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=None, help="also write the report (markdown) to this file")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    n, k = args.tensors, args.numel
    init = [(torch.randn(k, generator=gen) * 0.1).to(dev) for _ in range(n)]
    grads = [(torch.randn(k, generator=gen) * 0.01).to(dev) for _ in range(n)]

    def bf16_params():
        ps = [torch.nn.Parameter(t.bfloat16()) for t in init]
        for p, g in zip(ps, grads):
            p.grad = g.bfloat16()
        return ps

    pa, pb, pc = bf16_params(), bf16_params(), bf16_params()
    oa = mixprec.optim.AdamW(pa, lr=1e-4)
    ob = mixprec.optim.AdamW(pb, lr=1e-4, ema_decay=DECAY)
    oc = mixprec.optim.AdamW(pc, lr=1e-4)
    oc.step()
    c_masters = [oc.state[p]["master"] for p in pc]
    c_emas = [m.clone() for m in c_masters]
    pd = [torch.nn.Parameter(t.clone()) for t in init]
    for p, g in zip(pd, grads):
        p.grad = g.clone()
    od = torch.optim.AdamW(pd, lr=1e-4, fused=True)
    d_update, d_name = _ema_update_fn(pd, _Params(pd))
    pe = bf16_params()
    oe = torch.optim.AdamW(pe, lr=1e-4, fused=True)
    e_update, _ = _ema_update_fn(pe, _Params(pe))
    counters = {"d": 0, "e": 0}

    def run_c():
        oc.step()
        torch._foreach_lerp_(c_emas, c_masters, 1.0 - DECAY)

    def run_d():
        od.step()
        counters["d"] += 1
        d_update(counters["d"])

    def run_e():
        oe.step()
        counters["e"] += 1
        e_update(counters["e"])

    variants = {"A": oa.step, "B": ob.step, "C": run_c, "D": run_d, "E": run_e}
    for f in variants.values():  # warm up (state creation)
        f()
        f()

    def timed(f):
        _sync(dev)
        t0 = time.perf_counter()
        f()
        _sync(dev)
        return time.perf_counter() - t0

    times = {v: [] for v in variants}
    ratios = {r: [] for r in ("B/A", "C/A", "B/C", "D/A", "B/D", "E/A")}
    order = list(variants) + list(reversed(variants))
    for _ in range(args.reps):
        got = {v: 0.0 for v in variants}
        for v in order:
            t = timed(variants[v])
            got[v] += t
            times[v].append(t)
        for r in ratios:
            x, y = r.split("/")
            ratios[r].append(got[x] / got[y])
    bw = copy_bandwidth(dev)
    bpp = {"A": 28, "B": 36, "C": 40, "D": 40, "E": 20}
    label = {
        "A": "mixprec AdamW (BF16 + FP32 master), no EMA",
        "B": "mixprec AdamW, fused FP32 EMA (ema_decay)",
        "C": "mixprec AdamW + separate _foreach_lerp_ EMA of the masters",
        "D": f"torch AdamW fused, FP32 params + {d_name}",
        "E": "torch AdamW fused, BF16 params + BF16 EMA (stalls)",
    }
    total = n * k
    lines = []
    print = lines.append  # noqa: A001  (the report goes to stdout and --out)
    print(f"{n} x {k:,} params, {dev}, {torch.get_num_threads()} threads, {args.reps} rounds "
          f"(A B C D E E D C B A), EMA decay {DECAY}")
    print(f"machine: {machine(dev)}; torch {torch.__version__}; "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; copy bandwidth {bw / 1e9:.1f} GB/s")
    print("| variant | B/param | median ms | GB/s | fraction of copy bandwidth |")
    print("|---|---|---|---|---|")
    for v in variants:
        ms = statistics.median(times[v]) * 1e3
        gbs = total * bpp[v] / (ms * 1e-3) / 1e9
        print(f"| {v}: {label[v]} | {bpp[v]} | {ms:.2f} | {gbs:.1f} | {gbs * 1e9 / bw:.2f} |")
    print("| ratio | per-round median | min | max | bytes ratio |")
    print("|---|---|---|---|---|")
    for r, vals in ratios.items():
        x, y = r.split("/")
        print(f"| {r} | {statistics.median(vals):.3f}x | {min(vals):.3f} | {max(vals):.3f} | "
              f"{bpp[x] / bpp[y]:.3f}x |")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
