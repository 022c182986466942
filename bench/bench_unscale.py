"""Benchmark: mixprec's fused unscale vs torch's, on the CPU (or CUDA).

For each list shape and dtype, in one process, on the same buffers,
interleaved, median of several runs:
  torch   torch._amp_foreach_non_finite_check_and_unscale_ (one call per dtype
          group, as GradScaler does)
  mixprec torch.ops.mixprec.unscale_
  limit   the in-place read-modify-write bandwidth of this machine measured in
          the same run on a buffer of the same byte size (torch mul_ on a flat
          float32 buffer) — unscale moves exactly read+write of every byte
and the whole clipping sequence a user runs:
  torch   unscale + torch.nn.utils.clip_grad_norm_ (reads the grads again)
  mixprec unscale_norm_ (norm from the same pass) + the same clip multiply

Usage: python bench/bench_unscale.py [--device cpu|cuda] [--quick] [--out FILE]
Prints a table; --out writes it as Markdown with machine and date.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import mixprec  # noqa: E402
from _common import Table, cpu_isa, device_of, parser, utc_now, machine, sync, timed, timed_with_output  # noqa: E402,F401

CONFIGS = [(1, 100_000_000), (100, 1_000_000), (2000, 10_000)]
QUICK_CONFIGS = [(1, 10_000_000), (100, 100_000), (2000, 1_000)]
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def bench_config(n_tensors, numel, dtype, device, reps):
    gen = torch.Generator(device="cpu").manual_seed(n_tensors * 7 + numel)
    grads = [(torch.randn(numel, generator=gen) * 4).to(dtype).to(device) for _ in range(n_tensors)]
    nbytes = sum(g.numel() * g.element_size() for g in grads)
    flat = torch.randn(nbytes // 4, generator=gen).to(device)
    found_inf = torch.zeros(1, device=device)
    # Alternate x2 and x0.5: exact, values never drift, no op can shortcut 1.0.
    scales = [torch.tensor([2.0], device=device), torch.tensor([0.5], device=device)]
    # Parameters only carry the grads for clip_grad_norm_; expand() gives the
    # right shape without allocating.
    params = [torch.nn.Parameter(torch.zeros((), device=device, dtype=dtype).expand(numel)) for _ in grads]
    for p, g in zip(params, grads):
        p.grad = g

    state = {"k": 0}

    def next_scale():
        state["k"] ^= 1
        return scales[state["k"]]

    def torch_unscale():
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, next_scale())

    def ours_unscale():
        torch.ops.mixprec.unscale_(grads, found_inf, next_scale())

    def limit_rmw():
        flat.mul_(next_scale())

    def torch_clip():
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, next_scale())
        torch.nn.utils.clip_grad_norm_(params, max_norm=1e30)

    def ours_clip():
        _, total = torch.ops.mixprec.unscale_norm_(grads, found_inf, next_scale())
        coef = torch.clamp(1e30 / (total + 1e-6), max=1.0)
        torch._foreach_mul_(grads, coef)

    fns = {"torch": torch_unscale, "mixprec": ours_unscale, "limit": limit_rmw,
           "torch_clip": torch_clip, "mixprec_clip": ours_clip}
    times = {k: [] for k in fns}
    for fn in fns.values():  # warm-up (allocator, thread pool, page faults)
        fn()
    for _ in range(reps):
        for k, fn in fns.items():
            times[k].append(timed(fn, device))
    med = {k: statistics.median(v) for k, v in times.items()}
    moved = 2 * nbytes  # read + write of every gradient byte
    return {
        "nbytes": nbytes,
        "torch_ms": med["torch"] * 1e3,
        "mixprec_ms": med["mixprec"] * 1e3,
        "speedup": med["torch"] / med["mixprec"],
        "limit_gbs": moved / med["limit"] / 1e9,
        "mixprec_gbs": moved / med["mixprec"] / 1e9,
        "frac_limit": med["limit"] / med["mixprec"],
        "torch_clip_ms": med["torch_clip"] * 1e3,
        "mixprec_clip_ms": med["mixprec_clip"] * 1e3,
        "clip_speedup": med["torch_clip"] / med["mixprec_clip"],
    }


def main():
    args = parser(__doc__).parse_args()
    device = device_of(args)
    configs = QUICK_CONFIGS if args.quick else CONFIGS
    reps = args.reps or (3 if args.quick else 7)
    isa = cpu_isa(device)
    table = Table(
        "| list | dtype | MB | torch ms | mixprec ms | speedup | mixprec GB/s | RMW limit GB/s | "
        "% of limit | unscale+clip torch ms | mixprec ms | speedup |"
    )
    for n, numel in configs:
        for name, dtype in DTYPES.items():
            r = bench_config(n, numel, dtype, device, reps)
            table.add(
                f"| {n}x{numel:,} | {name} | {r['nbytes'] / 1e6:.0f} | {r['torch_ms']:.2f} | "
                f"{r['mixprec_ms']:.2f} | {r['speedup']:.2f}x | {r['mixprec_gbs']:.1f} | "
                f"{r['limit_gbs']:.1f} | {100 * r['frac_limit']:.0f}% | {r['torch_clip_ms']:.2f} | "
                f"{r['mixprec_clip_ms']:.2f} | {r['clip_speedup']:.2f}x |"
            )
    when = utc_now()
    info = f"{machine(device)}; CPU path {isa}" if isa else machine(device)
    print(f"\nmachine: {info}; date: {when}; median of {reps} interleaved runs")
    table.write(args.out, f"unscale benchmark ({device.type})",
                f"Machine: {info}. Date: {when}. Median of {reps} interleaved runs, one process.",
                f"python bench/bench_unscale.py --device {args.device}{' --quick' if args.quick else ''}")


if __name__ == "__main__":
    main()
