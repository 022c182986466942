"""Benchmark: lean optimizer state (issue 24), mixprec's modes against torch's
and torchao's (and bitsandbytes') AdamW, in one process, interleaved, medians.

Rows (AdamW, lr 1e-3, the same random params and gradients in each):
  torch fused FP32      torch.optim.AdamW(fused=True), FP32 params and state
  torch foreach BF16    torch.optim.AdamW(foreach=True) on BF16 params (BF16
                        state: torch keeps state in the param's dtype)
  mixprec master        BF16 params + FP32 master + FP32 moments
  mixprec SR            master_weights=False (stochastic rounding)
  mixprec rem           param_remainders=True
  mixprec rem+bf16      + exp_avg_dtype = exp_avg_sq_dtype = torch.bfloat16
  mixprec rem+8bit      + torch.uint8 (8-bit blockwise) moments
  mixprec SR+bf16       master_weights=False + BF16 moments (torchao _AdamW's
                        bf16_stochastic_round mode, 8 B/param)
  mixprec SR+8bit       master_weights=False + 8-bit moments (torchao's and
                        bitsandbytes' AdamW8bit on BF16 params: 6 B/param)
  torchao _AdamW SR     torchao.optim._AdamW(bf16_stochastic_round=True) on
                        BF16 params (BF16 moments)
  torchao AdamW8bit / AdamW4bit on BF16 params
  bnb AdamW8bit         bitsandbytes.optim.AdamW8bit on BF16 params (when it
                        imports and runs on this device)

Columns: median ms per step; training-state bytes per param (param + grad +
every tensor the optimizer holds, counted from the objects themselves, so the
peers' formats are counted as they are); the bytes a step must move per param
(read each state and the grad, write each state) over the measured stream
bandwidth (stream_bandwidth: the best of copy_, add_ and addcmul_ on 256 MB
operands, in the same process), as a fraction; and the ratio to torch fused FP32 from the same rounds.

At 25M params every row is alive at once and the rounds interleave all of
them; at 100M (``--big``) each row runs in its own pair with torch fused FP32
(the ratio column comes from that pair), so only two are in memory at once.
The peers are slow on the CPU: their rows get fewer rounds (``--peer-reps``).

Usage: python bench/bench_optim_lean.py [--reps 7] [--peer-reps 3] [--sizes 25 100] [--no-peers] [--out FILE]
       python bench/bench_optim_lean.py --quick [--peers] [--out FILE]
``--quick``: 3 rounds (1 for the peers), sizes 25 and 100, torch's and
mixprec's rows only unless ``--peers`` is given (a few minutes on 2 cores;
with the peers, whose 100M steps take seconds each, well under 10).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import mixprec  # noqa: E402
from _common import machine, sync  # noqa: E402

TENSOR = 1 << 20  # elements per param tensor (1,048,576: a multiple of every peer's block)

# name -> (param dtype, bytes one step moves per param: reads + writes)
ROWS = {
    "torch fused FP32": (torch.float32, 28),
    "torch foreach BF16": (torch.bfloat16, 14),
    "mixprec master": (torch.bfloat16, 28),
    "mixprec SR": (torch.bfloat16, 22),
    "mixprec rem": (torch.bfloat16, 26),
    "mixprec rem+bf16": (torch.bfloat16, 18),
    "mixprec rem+8bit": (torch.bfloat16, 14 + 16 / 256),
    "mixprec SR+bf16": (torch.bfloat16, 14),
    "mixprec SR+8bit": (torch.bfloat16, 10 + 16 / 256),
    "torchao _AdamW SR": (torch.bfloat16, 14),
    "torchao AdamW8bit": (torch.bfloat16, 10 + 16 / 256),
    "torchao AdamW4bit": (torch.bfloat16, 8 + 16 / 128),
    "bnb AdamW8bit": (torch.bfloat16, 10 + 16 / 256),
}
PEERS = ("torchao _AdamW SR", "torchao AdamW8bit", "torchao AdamW4bit", "bnb AdamW8bit")


def make_params(n_tensors: int, dtype: torch.dtype, seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    ps = []
    for _ in range(n_tensors):
        p = torch.nn.Parameter((torch.randn(TENSOR, generator=g) * 0.1).to(dtype))
        p.grad = (torch.randn(TENSOR, generator=g) * 1e-2).to(dtype)
        ps.append(p)
    return ps


def make_optimizer(name: str, params):
    """The row's optimizer, or None when its library is missing."""
    kw = dict(lr=1e-3)
    if name == "torch fused FP32":
        return torch.optim.AdamW(params, fused=True, **kw)
    if name == "torch foreach BF16":
        return torch.optim.AdamW(params, foreach=True, **kw)
    if name.startswith("mixprec"):
        lean = {
            "mixprec master": {},
            "mixprec SR": dict(master_weights=False, seed=0),
            "mixprec rem": dict(param_remainders=True),
            "mixprec rem+bf16": dict(param_remainders=True, exp_avg_dtype=torch.bfloat16,
                                     exp_avg_sq_dtype=torch.bfloat16, seed=0),
            "mixprec rem+8bit": dict(param_remainders=True, exp_avg_dtype=torch.uint8, exp_avg_sq_dtype=torch.uint8),
            "mixprec SR+bf16": dict(master_weights=False, exp_avg_dtype=torch.bfloat16,
                                    exp_avg_sq_dtype=torch.bfloat16, seed=0),
            # torchao's / bitsandbytes' AdamW8bit on BF16 params: the same 6 B/param.
            "mixprec SR+8bit": dict(master_weights=False, exp_avg_dtype=torch.uint8,
                                    exp_avg_sq_dtype=torch.uint8, seed=0),
        }[name]
        return mixprec.optim.AdamW(params, **kw, **lean)
    if name.startswith("torchao"):
        try:
            from torchao import optim as ao
        except ImportError:
            return None
        if name == "torchao _AdamW SR":
            return ao._AdamW(params, bf16_stochastic_round=True, **kw)
        return (ao.AdamW8bit if name.endswith("8bit") else ao.AdamW4bit)(params, **kw)
    if name == "bnb AdamW8bit":
        try:
            import bitsandbytes as bnb
        except ImportError:
            return None
        return bnb.optim.AdamW8bit(params, min_8bit_size=0, **kw)
    raise KeyError(name)


def tensor_bytes(t) -> int:
    """Bytes a tensor holds, a tensor subclass (torchao's quantised state)
    counted through its inner tensors."""
    if not isinstance(t, torch.Tensor):
        return 0
    if hasattr(t, "__tensor_flatten__") and type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()


def state_bytes_per_param(opt, params) -> float:
    """(param + grad + every tensor in the optimizer's state) / numel. A map
    shared by every state (bitsandbytes' qmap, torchao's) is counted each
    time it is held, as it is allocated."""
    n = sum(p.numel() for p in params)
    total = sum(tensor_bytes(p) + tensor_bytes(p.grad) for p in params)
    total += sum(tensor_bytes(v) for st in opt.state.values() for v in st.values())
    return total / n


def stream_bandwidth() -> tuple[float, str]:
    """The machine's streaming bandwidth as the step sees it: the best GB/s of
    15 rounds of each of three 256 MB (per operand) kernels on every thread,
    counting the bytes each must move: copy_ (read + write), add_ in place
    (2 reads + 1 write) and addcmul_ in place (3 reads + 1 write, the
    optimizer step's mix of several read streams and written ones). A copy
    alone understates what several streams get on some CPUs (on the 2-core
    AVX-512 EPYC, 2026-12-02: copy 39 GB/s while torch's fused AdamW moved
    its 28 B/param at ~90 GB/s), so the reference is the best of the three
    and the table says which."""
    n = 64 << 20
    a, b, c = torch.ones(n), torch.full((n,), 2.0), torch.full((n,), 3.0)
    dst = torch.empty_like(a)
    kernels = {
        "copy": (lambda: dst.copy_(a), 2),
        "add_": (lambda: a.add_(b, alpha=1e-30), 3),
        "addcmul_": (lambda: a.addcmul_(b, c, value=1e-30), 4),
    }
    best = {}
    for name, (fn, streams) in kernels.items():
        ts = []
        for _ in range(15):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        best[name] = streams * n * 4 / min(ts)
    name = max(best, key=best.get)
    detail = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in best.items())
    return best[name], f"best of {detail} GB/s: {name}"


def _timed(step) -> float:
    sync(torch.device("cpu"))
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


def interleaved(steps: dict, reps: dict) -> dict[str, list[float]]:
    """Per row the seconds of each round: one step of every row per round
    (rows with fewer reps drop out of the later rounds), after two warm-up
    steps each (the peers compile on their first)."""
    for step in steps.values():
        step()
        step()
    times = {k: [] for k in steps}
    for r in range(max(reps.values())):
        for k, step in steps.items():
            if r < reps[k]:
                times[k].append(_timed(step))
    return times


def run_size(n_tensors: int, names, reps: int, peer_reps: int, paired: bool):
    """{row: (median s, bytes/param, ratio to torch fused FP32)}."""
    out = {}
    base = "torch fused FP32"

    def build(name):
        ps = make_params(n_tensors, ROWS[name][0], seed=n_tensors)
        try:
            opt = make_optimizer(name, ps)
        except (TypeError, ValueError, RuntimeError) as e:  # a mode this build does not have yet
            print(f"  {name}: skipped ({type(e).__name__}: {e})", flush=True)
            return None
        if opt is None:
            print(f"  {name}: skipped (library not installed)", flush=True)
            return None
        try:
            opt.step()
        except Exception as e:  # noqa: BLE001 - a peer that does not run on this device
            print(f"  {name}: skipped (step failed: {type(e).__name__}: {str(e)[:200]})", flush=True)
            return None
        return ps, opt

    def nreps(name):
        return peer_reps if name in PEERS else reps

    if not paired:
        built = {k: b for k in names if (b := build(k)) is not None}
        times = interleaved({k: o.step for k, (_, o) in built.items()}, {k: nreps(k) for k in built})
        for k, (ps, opt) in built.items():
            ratios = [a / b for a, b in zip(times[base], times[k])]
            out[k] = (statistics.median(times[k]), state_bytes_per_param(opt, ps), statistics.median(ratios))
        return out
    for k in names:
        if k == base:
            continue
        pair = {base: build(base), k: build(k)}
        if pair[k] is None:
            continue
        times = interleaved({n: o.step for n, (_, o) in pair.items()}, {base: nreps(k), k: nreps(k)})
        ratios = [a / b for a, b in zip(times[base], times[k])]
        out[k] = (statistics.median(times[k]), state_bytes_per_param(pair[k][1], pair[k][0]), statistics.median(ratios))
        out.setdefault(base, (statistics.median(times[base]), state_bytes_per_param(pair[base][1], pair[base][0]), 1.0))
        del pair
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="3 rounds (1 for the peers), sizes 25 and 100, no peers unless --peers")
    ap.add_argument("--reps", type=int, default=None, help="rounds per row (7; 3 with --quick)")
    ap.add_argument("--peer-reps", type=int, default=None, help="rounds per peer row (3; 1 with --quick)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[25, 100], help="millions of params (x 2^20)")
    ap.add_argument("--peers", action=argparse.BooleanOptionalAction, default=None,
                    help="the torchao / bitsandbytes rows (default: with them, without under --quick)")
    ap.add_argument("--rows", nargs="+", default=list(ROWS), help="row names (default all)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch.set_num_threads (default: torch's, the core count); mixprec's OpenMP follows it")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.reps is None:
        args.reps = 3 if args.quick else 7
    if args.peer_reps is None:
        args.peer_reps = 1 if args.quick else 3
    peers = (not args.quick) if args.peers is None else args.peers
    rows = [r for r in ROWS if r in args.rows and (peers or r not in PEERS)]
    load = os.getloadavg()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    bw, bw_how = stream_bandwidth()
    head = (f"machine: {machine(torch.device('cpu'))}; {when}; load average at start {load[0]:.1f} / {load[1]:.1f} "
            f"/ {load[2]:.1f} (1/5/15 min); stream bandwidth {bw / 1e9:.1f} GB/s ({bw_how}; 15 rounds of 256 MB per operand)")
    print(head, flush=True)
    lines = []
    for size in args.sizes:
        paired = size > 25
        t0 = time.perf_counter()
        res = run_size(size, rows, args.reps, args.peer_reps, paired)
        title = (f"### {size} x 2^20 params ({size} tensors of 1,048,576), "
                 + ("each row paired with torch fused FP32" if paired else "every row interleaved")
                 + f", {time.perf_counter() - t0:.0f} s")
        table = [title, "", "| AdamW | ms/step | vs torch fused FP32 | training-state B/param | B moved/param | "
                 "fraction of stream bandwidth |", "|---|---|---|---|---|---|"]
        for k, (t, bpp, ratio) in res.items():
            moved = ROWS[k][1]
            frac = moved * size * TENSOR / t / bw
            table.append(f"| {k} | {t * 1e3:.1f} | {ratio:.2f}x | {bpp:.2f} | {moved:.2f} | {frac:.2f} |")
        print("\n".join(table) + "\n", flush=True)
        lines += table + [""]
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as f:
            f.write("# Lean optimizer state on the CPU (issue 24)\n\n")
            f.write(head + f". Median of {args.reps} interleaved rounds"
                    + (f" ({args.peer_reps} for the peers' rows).\n" if peers else "; the peers' rows not run.\n"))
            f.write(f"Command: `python bench/bench_optim_lean.py {' '.join(sys.argv[1:])}`\n\n")
            f.write("\n".join(lines))


if __name__ == "__main__":
    main()
