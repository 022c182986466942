"""Cost of mixprec.guard.ForwardGuard: one autocast training step (forward,
backward, mixprec GradScaler with diagnostics, mixprec AdamW) with the guard
on vs off, on a ResNet-style and a ViT-style model, on the CPU.

BF16 autocast: the CPU has fast BF16 kernels but none for FP16 (an FP16
ResNet-18 step is ~25x the BF16 one here), and a slower step would only
hide the guard's cost, which does not depend on the dtype (one read of each
module's output, per-module Python hooks).

Three copies of the model from the same weights, one guarded; rounds
alternate between them (off, off again, on, ...) in one process; the figure
is the median over rounds of (on / off) of each round's median step time,
next to (off again / off): the noise floor of the machine at that time.

    PYTHONPATH=python:bench python bench/bench_guard.py [--rounds 7] [--steps 3]

(about 1.5 minutes for both models on a quiet 2-core machine: 2 warm-up +
rounds x steps steps of each of the three copies).

    PYTHONPATH=python:bench python bench/bench_guard.py --callgrind --dtype float32 --steps 1

counts instructions instead (valgrind's callgrind, one process per model:
deterministic, usable on a loaded machine; minutes per model), see [note:
guard instruction counts].
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import statistics
import time

import torch
import torch.nn.functional as F
import torchvision

import mixprec
from mixprec.guard import ForwardGuard
from _common import machine


class Attention(torch.nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        out = ((q @ k.transpose(-2, -1)) * self.scale).softmax(-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class Block(torch.nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.norm1, self.attn = torch.nn.LayerNorm(dim), Attention(dim, heads)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(torch.nn.Module):
    """ViT-Tiny shapes (dim 192, 3 heads, depth 12) on 64 patches of 16x16x3."""

    def __init__(self, dim=192, depth=12, heads=3, classes=100):
        super().__init__()
        self.embed = torch.nn.Conv2d(3, dim, 16, 16)
        self.pos = torch.nn.Parameter(torch.zeros(1, 64, dim))
        self.blocks = torch.nn.Sequential(*[Block(dim, heads) for _ in range(depth)])
        self.norm, self.head = torch.nn.LayerNorm(dim), torch.nn.Linear(dim, classes)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2) + self.pos
        return self.head(self.norm(self.blocks(x)).mean(1))


def _setup(model):
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = mixprec.amp.GradScaler("cpu", diagnostics=True)
    return opt, scaler


AUTOCAST = [True]  # --dtype float32 turns autocast off (CPUs without native BF16 kernels)


def _step(model, opt, scaler, x, y):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=AUTOCAST[0]):
        loss = F.cross_entropy(model(x).float(), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)


def bench(name, make, x, y, rounds, steps):
    torch.manual_seed(0)
    off = make()
    copies = {"off": off, "off again": copy.deepcopy(off), "on": copy.deepcopy(off)}
    runs = {k: (m, *_setup(m)) for k, m in copies.items()}
    guard = ForwardGuard(copies["on"]).attach(runs["on"][2])
    for _ in range(2):  # warm-up
        for m, opt, sc in runs.values():
            _step(m, opt, sc, x, y)
    t = {k: [] for k in runs}
    for _ in range(rounds):
        for k, (m, opt, sc) in runs.items():
            ts = []
            for _ in range(steps):
                t0 = time.perf_counter()
                _step(m, opt, sc, x, y)
                ts.append(time.perf_counter() - t0)
            t[k].append(statistics.median(ts))
    assert guard.report() is None  # healthy run: nothing to report
    ratios = [b / a for a, b in zip(t["off"], t["on"])]
    floor = [b / a for a, b in zip(t["off"], t["off again"])]
    checked = len(guard._order)  # modules whose outputs a forward reads
    return (name, f"{checked} of {len(list(off.modules()))}", statistics.median(t["off"]) * 1e3,
            statistics.median(t["on"]) * 1e3, statistics.median(ratios), min(ratios), max(ratios),
            statistics.median(floor))


def _models(g):
    """name -> (label, make, x, y): the two models, their inputs from one generator."""
    return {
        "resnet": ("ResNet-18 (torchvision), batch 8, 32x32", lambda: torchvision.models.resnet18(num_classes=100),
                   torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 100, (8,), generator=g)),
        "vit": ("ViT-Tiny shapes (12 blocks, dim 192, 3 heads), batch 8, 128x128 (64 tokens)", ViT,
                torch.randn(8, 3, 128, 128, generator=g), torch.randint(0, 100, (8,), generator=g)),
    }


# ---- instruction counts (--callgrind) -------------------------------------------------
# [note: guard instruction counts] Wall-clock ratios on a shared machine swing
# by more than the 3% to resolve; instructions retired do not. One process per
# model runs under valgrind --tool=callgrind with instrumentation off (fast)
# through the set-up and the warm-up steps of two copies of the model (same
# weights, same batch), then counts the instructions (Ir, every thread; one
# thread used) of N steps of the unguarded copy and of N steps of the guarded
# one, each dumped by a client request (a 4-line C helper built with cc).
# Instructions are not time (a scan's loads cost more than its compares), but
# the guard's cost is mostly Python and dispatcher work plus one streaming
# read, so the ratio is a close, repeatable proxy.

_CG_HELPER = r"""
#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; }
void cg_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; }
void cg_dump(const char *s) { CALLGRIND_DUMP_STATS_AT(s); }
"""


def _profiled_checks(model, x):
    """Calls of mixprec::overflow_check_ in one forward (launches on CUDA)."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        model(x)
    return sum(e.count for e in prof.key_averages() if e.key == "mixprec::overflow_check_")


def _callgrind_child(name, steps, helper, out):
    import ctypes
    import json

    cg = ctypes.CDLL(helper)
    torch.manual_seed(0)
    label, make, x, y = _models(torch.Generator().manual_seed(0))[name]
    off = make()
    on = copy.deepcopy(off)
    runs = {"off": (off, *_setup(off)), "on": (on, *_setup(on))}
    guard = ForwardGuard(on).attach(runs["on"][2])
    for _ in range(2):
        for m, opt, sc in runs.values():
            _step(m, opt, sc, x, y)
    cg.cg_start()
    for k in ("off", "on"):
        m, opt, sc = runs[k]
        for _ in range(steps):
            _step(m, opt, sc, x, y)
        cg.cg_dump(k.encode())
    cg.cg_stop()
    assert guard.report() is None
    with open(out, "w") as f:
        json.dump({"label": label, "checked": len(guard._order), "modules": len(list(off.modules())),
                   "hooks": len(guard._handles), "calls": _profiled_checks(on, x)}, f)


def _callgrind(a):
    import glob
    import json
    import re
    import shutil
    import subprocess
    import sys
    import tempfile

    if shutil.which("valgrind") is None or not os.path.exists("/usr/include/valgrind/callgrind.h"):
        sys.exit("--callgrind needs valgrind and its headers (apt-get install valgrind)")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        helper = os.path.join(d, "cg.so")
        with open(os.path.join(d, "cg.c"), "w") as f:
            f.write(_CG_HELPER)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", os.path.join(d, "cg.c"), "-o", helper], check=True)
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
        for name in a.models:
            t0 = time.perf_counter()
            out = os.path.join(d, f"{name}.json")
            cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                   f"--callgrind-out-file={os.path.join(d, name)}.cg",
                   sys.executable, os.path.abspath(__file__), "--dtype", a.dtype,
                   "--callgrind-child", name, "--steps", str(a.steps), "--helper", helper, "--out", out]
            with open(os.path.join(d, f"{name}.log"), "w+") as log:
                if subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode:
                    log.seek(0)
                    sys.exit(f"the callgrind run of {name} failed:\n" + log.read()[-3000:])
            ir = {}
            for path in glob.glob(os.path.join(d, f"{name}.cg.*")):
                text = open(path).read()
                trig = re.search(r"^desc: Trigger: Client Request: (\w+)", text, re.M)
                if trig:
                    ir[trig.group(1)] = int(re.search(r"^summary: (\d+)", text, re.M).group(1))
            info = json.load(open(out))
            rows.append((info, ir["off"] / a.steps, ir["on"] / a.steps, time.perf_counter() - t0))
            print(f"{name}: {ir['on'] / ir['off']:.4f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    lines = [
        "| model | modules checked | overflow_check_ calls / forward | off (Ir/step) | on (Ir/step) | on / off |",
        "|---|---|---|---|---|---|",
    ]
    for info, off, on, _ in rows:
        lines.append(f"| {info['label']} | {info['checked']} of {info['modules']} | {info['calls']} | "
                     f"{off / 1e6:.1f} M | {on / 1e6:.1f} M | {on / off:.4f} |")
    text = "\n".join([
        "# mixprec.guard.ForwardGuard: instructions per training step (CPU, callgrind)", "",
        f"`PYTHONPATH=python:bench python bench/bench_guard.py --callgrind --dtype {a.dtype} --steps {a.steps}` — "
        f"instructions (callgrind Ir, {a.steps} step(s) each after 2 uninstrumented warm-up steps) of one "
        f"{'BF16-autocast' if AUTOCAST[0] else 'FP32 (no autocast)'} training step, guard on vs off, same "
        "weights and batch, 1 thread; see [note: guard instruction counts] in the script.", "",
        f"{machine(torch.device('cpu'))}; {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}.", "",
    ] + lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16",
                    help="bfloat16: BF16 autocast; float32: no autocast, for CPUs whose BF16 convolutions and "
                         "matmuls are emulated (AVX2 without AVX-512-BF16/AMX: a step is then ~10x slower and "
                         "would hide the guard's cost)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--models", nargs="+", choices=["resnet", "vit"], default=["resnet", "vit"])
    ap.add_argument("--callgrind", action="store_true",
                    help="count instructions under valgrind instead of timing: deterministic, for a loaded "
                         "machine (--steps steps of each; slow: ~50x, minutes per model)")
    ap.add_argument("--callgrind-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--helper", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    AUTOCAST[0] = a.dtype == "bfloat16"
    torch.set_num_threads(a.threads)
    if a.callgrind_child:
        return _callgrind_child(a.callgrind_child, a.steps, a.helper, a.out)
    if a.callgrind:
        return _callgrind(a)
    load = os.getloadavg()
    t_start = time.perf_counter()
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    g = torch.Generator().manual_seed(0)
    models = _models(g)
    rows = [bench(*models[k], a.rounds, a.steps) for k in a.models]
    lines = [
        "# mixprec.guard.ForwardGuard: cost per training step (CPU)",
        "",
        f"`PYTHONPATH=python:bench python bench/bench_guard.py --dtype {a.dtype}` — one "
        f"{'BF16-autocast' if AUTOCAST[0] else 'FP32 (no autocast)'} training step (forward, "
        "backward, mixprec GradScaler with diagnostics, mixprec AdamW), guard on (defaults: every module but "
        "the range-safe ones and nn.Sequential containers checked, forward checks, attached to the scaler) vs off, three copies of one model "
        "(off, off again, on), "
        f"interleaved rounds in one process, medians of {a.rounds} rounds x {a.steps} steps, "
        f"{a.threads} thread(s). BF16 rather than FP16 because the CPU has no fast FP16 kernels (see the "
        "script's docstring); FP32 where the CPU's BF16 kernels are emulated too.",
        "",
        f"{machine(torch.device('cpu'))}; started {started}, load average at start "
        f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1/5/15 min).",
        "",
        "| model | modules checked | off (ms/step) | on (ms/step) | on / off (median) | min | max | off again / off |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, n, toff, ton, r, lo, hi, fl in rows:
        lines.append(f"| {name} | {n} | {toff:.1f} | {ton:.1f} | {r:.3f} | {lo:.3f} | {hi:.3f} | {fl:.3f} |")
    lines += ["", f"{time.perf_counter() - t_start:.0f} s in all."]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
