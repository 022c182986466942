"""Two builds of mixprec side by side: the same calls timed with tree A and
tree B, in alternating worker processes (A B B A ...), medians per case.

Made for "behaviour and speed unchanged" checks of a refactor: e.g. the tree
before the one-source-of-truth work against main.

    python bench/bench_ab.py --a /work/base --b /work/main --rounds 6 --out bench/results/ab_cpu.md

Each tree is a checkout with its CPU library built in <tree>/build-cpu (or
--a-lib/--b-lib). A worker imports that tree's python/mixprec with that
library, times every case (median of --iters calls after a warm-up) and
prints JSON; the driver alternates the trees so that drift in the machine's
load hits both. Only the public API is used (mixprec.ops, mixprec.optim), so
the Python layer's cost is part of what is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def _cases():
    import torch
    import mixprec
    from mixprec import ops

    g = torch.Generator().manual_seed(0)
    cases = {}

    grads = [torch.randn(1 << 20, generator=g).to(torch.bfloat16) for _ in range(8)]
    found = torch.zeros(1)
    inv = torch.full((1,), 1.0 / 1024)
    cases["unscale_ bf16 8x1M"] = lambda: ops.unscale_(grads, found, inv)

    def optim_case(cls, **kw):
        params = [torch.randn(1 << 20, generator=g).to(torch.bfloat16).requires_grad_() for _ in range(8)]
        for p in params:
            p.grad = (torch.randn(1 << 20, generator=g) * 1e-2).to(torch.bfloat16)
        opt = cls(params, lr=1e-3, **kw)
        return opt.step

    cases["AdamW bf16 master 8x1M"] = optim_case(mixprec.optim.AdamW)
    cases["AdamW bf16 SR 8x1M"] = optim_case(mixprec.optim.AdamW, master_weights=False)
    cases["SGD bf16 momentum 8x1M"] = optim_case(mixprec.optim.SGD, momentum=0.9)

    x = torch.randn(4096, 1000, generator=g).to(torch.bfloat16)
    t = torch.randint(0, 1000, (4096,), generator=g)
    soft = torch.softmax(torch.randn(4096, 1000, generator=g), 1)
    cases["softmax bf16 4096x1000"] = lambda: ops.softmax(x, 1)
    cases["log_softmax bf16 4096x1000"] = lambda: ops.log_softmax(x, 1)
    cases["cross_entropy bf16 4096x1000"] = lambda: ops.cross_entropy(x, t)
    cases["cross_entropy soft bf16 4096x1000"] = lambda: ops.cross_entropy(x, soft)

    xy = torch.rand(4000, 2, generator=g) * 800
    wh = torch.rand(4000, 2, generator=g) * 120 + 4
    boxes = torch.cat([xy, xy + wh], 1)
    scores = torch.rand(4000, generator=g)
    cases["nms fp32 4000 boxes"] = lambda: ops.nms(boxes, scores, 0.5)

    feat = torch.randn(2, 256, 50, 68, generator=g)
    rb = torch.rand(512, 2, generator=g) * 700
    rois = torch.cat([torch.randint(0, 2, (512, 1), generator=g).float(), rb, rb + 60], 1)
    cases["roi_align fp32 512 rois 7x7"] = lambda: ops.roi_align(feat, rois, (7, 7), 1 / 16, 2, True)

    # A YOLO-like head: most of the 8400 x 80 scores small (about 4% above 0.5).
    dxy = torch.rand(2, 8400, 2, generator=g) * 600
    db = torch.cat([dxy, dxy + torch.rand(2, 8400, 2, generator=g) * 120 + 4], 2)
    ds = torch.rand(2, 8400, 80, generator=g) ** 16
    cases["efficient_nms fp32 2x8400x80"] = lambda: ops.efficient_nms(db, ds, score_threshold=0.5)
    return cases


def worker(iters: int) -> None:
    import torch

    torch.set_num_threads(int(os.environ.get("AB_THREADS", "2")))
    out = {}
    for name, fn in _cases().items():
        for _ in range(2):
            fn()
        ts = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        out[name] = statistics.median(ts)
    print("AB-JSON " + json.dumps(out))


def run_tree(tree: str, lib: str, iters: int, threads: int) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.join(tree, "python"), MIXPREC_LIBRARY_DIR=lib,
               AB_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    res = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", "--iters", str(iters)],
                         env=env, capture_output=True, text=True, check=True)
    line = [l for l in res.stdout.splitlines() if l.startswith("AB-JSON ")][-1]
    return json.loads(line[len("AB-JSON "):])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--a", help="tree A (the 'before')")
    ap.add_argument("--b", help="tree B (the 'after')")
    ap.add_argument("--a-lib")
    ap.add_argument("--b-lib")
    ap.add_argument("--rounds", type=int, default=6, help="worker runs per tree, alternating")
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.worker:
        worker(args.iters)
        return
    from _common import machine
    import torch

    trees = {"A": (args.a, args.a_lib or os.path.join(args.a, "build-cpu")),
             "B": (args.b, args.b_lib or os.path.join(args.b, "build-cpu"))}
    load0 = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    runs = {"A": [], "B": []}
    order = []
    for r in range(args.rounds):
        order += ["A", "B"] if r % 2 == 0 else ["B", "A"]
    for k in order:
        runs[k].append(run_tree(*trees[k], args.iters, args.threads))
        print(f"  {k} done ({len(runs[k])}/{args.rounds})", file=sys.stderr)
    names = list(runs["A"][0])
    lines = [
        f"# Before / after: `{args.a}` (A) vs `{args.b}` (B)",
        "",
        f"`python bench/bench_ab.py --a {args.a} --b {args.b} --rounds {args.rounds} --iters {args.iters}"
        f" --threads {args.threads}`: the same public calls in alternating worker processes"
        f" ({' '.join(order)}), each case the median of {args.iters} calls per worker, then the median over"
        f" the {args.rounds} workers per tree. {machine(torch.device('cpu'))}, {args.threads} thread(s);"
        f" started {started}, load average {load0[0]:.2f} / {load0[1]:.2f} / {load0[2]:.2f} at start,"
        f" {os.getloadavg()[0]:.2f} at the end.",
        "",
        "| case | A (ms) | B (ms) | B / A | B / A spread (min..max of paired rounds) |",
        "|---|---|---|---|---|",
    ]
    for n in names:
        a = statistics.median(r[n] for r in runs["A"]) * 1e3
        b = statistics.median(r[n] for r in runs["B"]) * 1e3
        pairs = [rb[n] / ra[n] for ra, rb in zip(runs["A"], runs["B"])]
        lines.append(f"| {n} | {a:.3f} | {b:.3f} | {b / a:.3f} | {min(pairs):.3f}..{max(pairs):.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
