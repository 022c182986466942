"""Benchmark: mixprec's fused master-weight AdamW / SGD vs torch's optimizers.

In one process, same sizes, interleaved, median of several runs:
  torch fused   torch.optim.AdamW(fused=True) on FP32 params (what a torch user
                runs for master weights: FP32 model, 16 B/param moved... plus
                the separate cast to the low-precision copy is not counted)
  torch foreach torch.optim.AdamW(foreach=True) on FP32 params
  torch bf16    torch.optim.AdamW(fused=True) directly on BF16 params (no
                master weights: loses small updates)
  mixprec       mixprec.optim.AdamW on BF16 params with FP32 master + state:
                28 B/param (grad 2, master 8, m 8, v 8, param 2)
  no-master     mixprec.optim.AdamW(master_weights=False) on BF16 params:
                stochastic rounding, 22 B/param (param 4, grad 2, m 8, v 8);
                SGD 14 B/param
and the RMW limit: in-place read-modify-write bandwidth measured in the same
run on a buffer of the same byte count. Same for SGD with momentum (20 B/param).

500M params (10 x 50M) are timed one comparator at a time when the memory
allows it (see PHASED_CONFIGS).

Usage: python bench/bench_optim.py [--device cpu|cuda] [--quick] [--only-phased] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import mixprec  # noqa: E402
from _common import machine, timed  # noqa: E402

# (number of tensors, elements each)
CONFIGS = [(100, 10_000), (10, 1_000_000), (100, 1_000_000)]
QUICK = [(100, 10_000), (10, 100_000)]


# kind -> ((mixprec class, torch class), hyper-parameters, bytes moved per param)
KINDS = {
    "adamw": ((mixprec.optim.AdamW, torch.optim.AdamW), dict(lr=1e-3), 28),
    "sgd": ((mixprec.optim.SGD, torch.optim.SGD), dict(lr=1e-3, momentum=0.9), 20),
}


def make(n, numel, dtype, gen, device):
    ps = [torch.nn.Parameter((torch.randn(numel, generator=gen) * 0.1).to(device, dtype)) for _ in range(n)]
    for p in ps:
        p.grad = (torch.randn(numel, generator=gen) * 0.01).to(device, dtype)
    return ps


def bench(kind, n, numel, reps, device=torch.device("cpu")):
    gen = torch.Generator().manual_seed(n + numel)
    opt_cls, kw, bytes_per = KINDS[kind]
    runs = {
        "torch_fused_fp32": opt_cls[1](make(n, numel, torch.float32, gen, device), fused=True, **kw),
        "torch_foreach_fp32": opt_cls[1](make(n, numel, torch.float32, gen, device), foreach=True, **kw),
        "torch_fused_bf16": opt_cls[1](make(n, numel, torch.bfloat16, gen, device), fused=True, **kw),
        "mixprec_bf16_master": opt_cls[0](make(n, numel, torch.bfloat16, gen, device), **kw),
        "mixprec_bf16_sr": opt_cls[0](make(n, numel, torch.bfloat16, gen, device), master_weights=False, seed=0, **kw),
    }
    nbytes = bytes_per * n * numel
    fns = {k: o.step for k, o in runs.items()}
    fns["limit"] = rmw_limit(nbytes // 8, device)  # RMW of nbytes/2 reads + nbytes/2 writes
    return interleaved(fns, reps, device), nbytes


def rmw_limit(n_floats, device):
    """An in-place read-modify-write of n_floats (x2, x0.5, ...): the
    bandwidth reference."""
    flat = torch.empty(n_floats, device=device).normal_()
    two, half = torch.tensor(2.0, device=device), torch.tensor(0.5, device=device)
    flip = {"k": 0}

    def limit():
        flip["k"] ^= 1
        flat.mul_(two if flip["k"] else half)

    return limit


def interleaved(fns, reps, device):
    """Median seconds of each fn over reps rounds, one call of each per
    round (after one warm-up call each)."""
    times = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    for _ in range(reps):
        for k, fn in fns.items():
            times[k].append(timed(fn, device))
    return {k: statistics.median(v) for k, v in times.items()}


# 500M params do not fit in 24 GiB with every comparator alive at once
# (~34 GB): they are timed in three groups, each interleaved within itself
# and with the RMW limit: torch fused FP32 with mixprec BF16+master, torch
# fused FP32 with mixprec SR, torch fused BF16 alone. foreach is left out (its
# temporaries alone would not fit). Run when the machine has ~18 GB free.
PHASED_CONFIGS = [(10, 50_000_000)]


def bench_phased(kind, n, numel, reps, device):
    opt_cls, kw, bytes_per = KINDS[kind]
    nbytes = bytes_per * n * numel
    gen = torch.Generator().manual_seed(n + numel)
    ps = lambda dt: make(n, numel, dt, gen, device)  # noqa: E731
    out = {"torch_foreach_fp32": float("nan")}
    # The RMW limit on a 2 GB buffer in each group (its GB/s scaled to
    # nbytes): this machine's bandwidth drifts between the groups.
    limit_floats = 1 << 28
    limit = rmw_limit(limit_floats, device)
    scale = nbytes / (2 * 4 * limit_floats)
    for group in ("main", "sr", "bf16"):
        if group == "main":
            fns = {"torch_fused_fp32": opt_cls[1](ps(torch.float32), fused=True, **kw).step,
                   "mixprec_bf16_master": opt_cls[0](ps(torch.bfloat16), **kw).step}
        elif group == "sr":
            fns = {"torch_fused_fp32_sr": opt_cls[1](ps(torch.float32), fused=True, **kw).step,
                   "mixprec_bf16_sr": opt_cls[0](ps(torch.bfloat16), master_weights=False, seed=0, **kw).step}
        else:
            fns = {"torch_fused_bf16": opt_cls[1](ps(torch.bfloat16), fused=True, **kw).step}
        fns["limit"] = limit
        med = interleaved(fns, reps, device)
        med[{"main": "limit", "sr": "limit_sr", "bf16": "limit_bf16"}[group]] = med.pop("limit") * scale
        out.update(med)
        del fns
    return out, nbytes


def available_bytes(device):
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


SR_BYTES = {"adamw": 22, "sgd": 14}
SEQ_CONFIGS = [(10, 1_000_000), (100, 1_000_000)]


def bench_sequence(n, numel, reps, device):
    """The whole update a user runs with clipping: torch = GradScaler.unscale_
    + clip_grad_norm_ + step(fused AdamW, FP32 params) + update; mixprec =
    GradScaler.clip_grad_norm_ (norm from the unscale pass) + step(master-
    weight AdamW on BF16 params) + update; folded = the same with
    clip_grad_norm_(fold=True) (a read-only norm pass, unscale and clip
    divided out inside the step). init_scale 1 keeps the grads' values
    stable from one repetition to the next."""
    gen = torch.Generator().manual_seed(n * 3 + numel)
    tp = make(n, numel, torch.float32, gen, device)
    mp = make(n, numel, torch.bfloat16, gen, device)
    topt = torch.optim.AdamW(tp, lr=1e-3, fused=True)
    fp = make(n, numel, torch.bfloat16, gen, device)
    mopt = mixprec.optim.AdamW(mp, lr=1e-3)
    fopt = mixprec.optim.AdamW(fp, lr=1e-3)
    tsc = torch.amp.GradScaler(device.type, init_scale=1.0, growth_interval=10**9)
    msc = mixprec.amp.GradScaler(device.type, init_scale=1.0, growth_interval=10**9)
    fsc = mixprec.amp.GradScaler(device.type, init_scale=1.0, growth_interval=10**9)
    one = torch.ones((), device=device)

    def torch_seq():
        tsc.scale(one)
        tsc.unscale_(topt)
        torch.nn.utils.clip_grad_norm_(tp, 1.0)
        tsc.step(topt)
        tsc.update()

    def mixprec_seq():
        msc.scale(one)
        msc.clip_grad_norm_(mopt, 1.0)
        msc.step(mopt)
        msc.update()

    def folded_seq():
        fsc.scale(one)
        fsc.clip_grad_norm_(fopt, 1.0, fold=True)
        fsc.step(fopt)
        fsc.update()

    return interleaved({"torch": torch_seq, "mixprec": mixprec_seq, "folded": folded_seq}, reps, device)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-sequence", action="store_true", help="skip the whole-step table")
    ap.add_argument("--only-phased", action="store_true", help="only the 500M-param rows")
    ap.add_argument("--no-phased", action="store_true", help="without the 500M-param rows")
    args = ap.parse_args()
    reps = args.reps or (3 if args.quick else 7)
    device = torch.device(args.device)
    if device.type == "cuda" and not mixprec.cuda_ops_loaded():
        sys.exit("mixprec CUDA ops not loaded (no GPU, or libmixprec_cuda.so not built)")
    header = ("| optimizer | params | torch fused FP32 ms | torch foreach FP32 ms | torch fused BF16 ms | "
              "mixprec BF16+master ms | vs fused FP32 | mixprec GB/s | RMW limit GB/s | % of limit | "
              "no-master (SR) ms | SR vs fused FP32 | SR % of limit |")
    rows = [header, "|" + "---|" * 13]
    print(header)
    phased = [] if args.quick or args.no_phased else [c for c in PHASED_CONFIGS if available_bytes(device) > 36 * c[0] * c[1]]
    for kind in ("adamw", "sgd"):
        for n, numel in ([] if args.only_phased else (QUICK if args.quick else CONFIGS)) + phased:
            if (n, numel) in phased:
                t, nbytes = bench_phased(kind, n, numel, max(3, reps // 2), device)
            else:
                t, nbytes = bench(kind, n, numel, reps, device)
            ours = t["mixprec_bf16_master"]
            row = (
                f"| {kind} | {n}x{numel:,} | {t['torch_fused_fp32'] * 1e3:.2f} | {t['torch_foreach_fp32'] * 1e3:.2f} | "
                f"{t['torch_fused_bf16'] * 1e3:.2f} | {ours * 1e3:.2f} | {t['torch_fused_fp32'] / ours:.2f}x | "
                f"{nbytes / ours / 1e9:.1f} | {nbytes / t['limit'] / 1e9:.1f} | {100 * t['limit'] / ours:.0f}% | "
                f"{t['mixprec_bf16_sr'] * 1e3:.2f} | {t.get('torch_fused_fp32_sr', t['torch_fused_fp32']) / t['mixprec_bf16_sr']:.2f}x | "
                f"{100 * (SR_BYTES[kind] * n * numel / t['mixprec_bf16_sr']) / (nbytes / t.get('limit_sr', t['limit'])):.0f}% |"
            )
            if (n, numel) in phased:
                row = row.replace(f"| {n}x{numel:,} |", f"| {n}x{numel:,} (3 groups) |").replace("| nan |", "| - |")
            rows.append(row)
            print(row, flush=True)
    seq_header = ("| whole step (unscale + clip + AdamW + update) | params | torch FP32 ms | mixprec BF16+master ms | "
                  "speedup | folded (fold=True) ms | folded speedup |")
    rows += ["", seq_header, "|---|---|---|---|---|---|---|"]
    print("\n" + seq_header)
    for n, numel in [] if args.no_sequence or args.only_phased else QUICK if args.quick else SEQ_CONFIGS:
        t = bench_sequence(n, numel, reps, device)
        row = (f"| adamw | {n}x{numel:,} | {t['torch'] * 1e3:.2f} | {t['mixprec'] * 1e3:.2f} | "
               f"{t['torch'] / t['mixprec']:.2f}x | {t['folded'] * 1e3:.2f} | {t['torch'] / t['folded']:.2f}x |")
        rows.append(row)
        print(row, flush=True)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    info = machine(device)
    print(f"\nmachine: {info}; date: {when}; median of {reps} interleaved runs")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as f:
            f.write(f"# optimizer benchmark ({device.type})\n\nMachine: {info}. Date: {when}. Median of {reps} interleaved runs.\n")
            f.write(f"Command: `python bench/bench_optim.py --device {args.device}{' --quick' if args.quick else ''}`\n\n")
            f.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
