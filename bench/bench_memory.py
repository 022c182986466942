"""Activation memory (mixprec.memory) on the CPU, side by side with what a
user would pick instead, in one process. Sections (``--only``):

speed  torch.ops.mixprec.act_pack / act_unpack on 64 MB BF16 and FP32
       tensors (8 and 4 bits, the default blocks 256 / 32), 1 and 2 threads:
       median ms of interleaved rounds, GB/s of the bytes each must move
       (pack: read the input + write codes + scales; unpack: read codes +
       scales + write the output), that as a fraction of the stream bandwidth
       measured in the same process at the same thread count (dst.copy_(src)
       of the same input: (read + write bytes) / time), and the time ratio to
       the cast a user has instead: x.to(float8_e4m3fn) and back for BF16,
       x.to(bfloat16) and back for FP32. Then the same in a child process with
       THP_MEM_ALLOC_ENABLE=1: every output here is a fresh allocation, and
       with 4 KB pages its page faults can cost more than the kernel.
bytes  mixprec.memory.plan per recipe (amp-bf16, + 8-bit act, + 4-bit act,
       + checkpoint): saved bytes / sample (held after the forward), peak
       bytes / sample (forward + backward, gradients excluded), both as a
       ratio to amp-bf16's, and the largest batch within amp-bf16's batch-16
       total; resnet50 and vit_b_16 at 224 (and the planner's line checked
       against a measurement at batch 16), deeplabv3_resnet50 at 512,
       maskrcnn_resnet50_fpn at 800x800 in train mode on synthetic targets.
step   forward + backward of resnet18 / resnet50 at batch 16 and 224 per
       recipe (checkpoint: mixprec.memory.checkpoint_blocks), interleaved
       rounds, as ratios to amp-bf16; and the same four with FP32 compute
       (no autocast), what a CPU user trains with.
grad   per-parameter gradient cosine (8-bit / 4-bit against the same BF16
       autocast step uncompressed, same batch and weights): the worst
       parameter and the median; resnet18 / resnet50 at batch 16 and 224,
       vit_b_16 at batch 8 and 224. For scale, FP32 (no autocast) against
       the same BF16 step.

BF16 on a CPU without AVX-512 BF16: torch's BF16 GEMMs and convolutions fall
to a slow path there (a 1024^3 matmul ~40x slower than FP32; a resnet18 step
at batch 16 and 224 over a minute), so the bytes, step and grad sections run
under ``FP32Kernels`` (below): a dispatch mode that computes BF16 mm / addmm /
bmm / baddbmm / convolution (+ backward) / CPU flash attention on FP32 copies
of the BF16 operands and rounds the results to the dtypes torch's BF16 op
returns, what a BF16 kernel with FP32 accumulation does. It sits below the
planner's tracker, so each op's outputs (dtype, shape, bytes) are torch's
own; the bytes section checks this on resnet18 at 64x64 (torch's kernels
against the emulation, every recipe) and says if any figure differs.
``--native-bf16`` turns it off everywhere; ``--native-step-res N`` adds step
rows on torch's own BF16 kernels at N x N.

Usage: python bench/bench_memory.py [--only speed,bytes,step,grad] [--reps N] [--out FILE]
       python bench/bench_memory.py --quick    (tiny sizes: a smoke run, ~2 min)
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import mixprec  # noqa: E402
import mixprec.memory as mm  # noqa: E402
import mixprec.ops  # noqa: E402,F401
from _common import cpu_isa, utc_now  # noqa: E402

import torchvision  # noqa: E402

_LIB = ctypes.CDLL(mixprec.library_path())
RECIPE_NAMES = ("amp-bf16", "amp-bf16 + 8-bit act", "amp-bf16 + 4-bit act", "amp-bf16 + checkpoint")
RECIPES = [r for name in RECIPE_NAMES for r in mm.RECIPES if r.name == name]
SHORT = {"amp-bf16": "amp-bf16", "amp-bf16 + 8-bit act": "+ 8-bit act", "amp-bf16 + 4-bit act": "+ 4-bit act",
         "amp-bf16 + checkpoint": "+ checkpoint"}
# mixprec's recipe: the activations of the 8- / 4-bit rows with the lean optimizer state (8 B/param:
# BF16 params + grads, 16-bit remainders, 8-bit moments) instead of torch AdamW's 16 B/param.
LEAN = {"amp-bf16 + 8-bit act": "+ 8-bit act + lean state", "amp-bf16 + 4-bit act": "+ 4-bit act + lean state"}
# Detectors: the same with torchvision's nms / roi_align through mixprec.ops.patch_torchvision() (RoIAlign
# reads the BF16 pyramid as it is; torchvision's autocast copies each level to float32 for it).
VISION = [mm.Recipe("amp-bf16 + 8-bit act + vision ops", torch.bfloat16, bits=8, vision_ops=True),
          mm.Recipe("amp-bf16 + 4-bit act + vision ops", torch.bfloat16, bits=4, vision_ops=True)]
SHORT.update({"amp-bf16 + 8-bit act + vision ops": "+ 8-bit act, mixprec roi_align",
              "amp-bf16 + 4-bit act + vision ops": "+ 4-bit act, mixprec roi_align"})
LEAN.update({"amp-bf16 + 8-bit act + vision ops": "+ 8-bit act, mixprec roi_align + lean state",
             "amp-bf16 + 4-bit act + vision ops": "+ 4-bit act, mixprec roi_align + lean state"})
# Segmenters: the same with mixprec.ops.cross_entropy on the (N, C, H, W) logits (reads the BF16 logits as
# they are and saves them, where F.cross_entropy under autocast makes float32 logits and log-probabilities).
# The recipe is the same; the loss differs (_ce_loss(mixprec_ce=True)).
SEG = [mm.Recipe("amp-bf16 + 8-bit act + mixprec CE", torch.bfloat16, bits=8),
       mm.Recipe("amp-bf16 + 4-bit act + mixprec CE", torch.bfloat16, bits=4)]
SHORT.update({"amp-bf16 + 8-bit act + mixprec CE": "+ 8-bit act, mixprec cross_entropy",
              "amp-bf16 + 4-bit act + mixprec CE": "+ 4-bit act, mixprec cross_entropy"})
LEAN.update({"amp-bf16 + 8-bit act + mixprec CE": "+ 8-bit act, mixprec cross_entropy + lean state",
             "amp-bf16 + 4-bit act + mixprec CE": "+ 4-bit act, mixprec cross_entropy + lean state"})
LEAN_STATE_BYTES = 8


def set_threads(n: int) -> None:
    torch.set_num_threads(n)
    _LIB.mixprec_set_num_threads(ctypes.c_int(n))


def machine_line() -> str:
    model, cores = "?", os.cpu_count()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    flags = set()
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    avx512 = sorted(f for f in flags if f.startswith("avx512"))
    isa = ("AVX-512 (" + ", ".join(avx512) + ")") if avx512 else "no AVX-512 (AVX2" + (" + F16C" if "f16c" in flags else "") + ")"
    load = os.getloadavg()
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        head = "?"
    built = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(os.path.getmtime(mixprec.library_path())))
    return (f"machine: {model}, {cores} cores, {isa}; mixprec at {head} (libmixprec.so built {built}), "
            f"CPU path {cpu_isa(torch.device('cpu'))}; "
            f"torch {torch.__version__}, torchvision {torchvision.__version__}; {utc_now()}; "
            f"load average at start {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1/5/15 min)")


# ---- BF16 kernels at FP32 speed ------------------------------------------------

_aten = torch.ops.aten
_GEMM_OPS = {
    _aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default,
    _aten.convolution.default, _aten.convolution_backward.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
    _aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
}


class FP32Kernels(TorchDispatchMode):
    """BF16 GEMMs / convolutions / CPU flash attention computed on FP32 copies
    of their BF16 operands (exact) and rounded to the dtypes torch's BF16 op
    returns (found by running the op on meta tensors). Enter it outside any
    tracker: the FP32 copies are made below the tracker and not counted."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _GEMM_OPS and any(
            isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 for t in tree_flatten((args, kwargs))[0]
        ):
            self.calls += 1
            meta = func(*tree_map(_to_meta, args), **tree_map(_to_meta, kwargs))
            out = func(*tree_map(_to_fp32, args), **tree_map(_to_fp32, kwargs))
            leaves, spec = tree_flatten(out)
            meta_leaves, _ = tree_flatten(meta)
            leaves = [o.to(m.dtype) if isinstance(o, torch.Tensor) and o.dtype != m.dtype else o
                      for o, m in zip(leaves, meta_leaves)]
            return tree_unflatten(leaves, spec)
        return func(*args, **kwargs)


def _to_meta(x):
    return x.to("meta") if isinstance(x, torch.Tensor) else x


def _to_fp32(x):
    return x.float() if isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16 else x


def kernels(native: bool):
    return contextlib.nullcontext() if native else FP32Kernels()


# ---- timing --------------------------------------------------------------------

def interleaved(fns: dict, reps: int, warmup: int = 2) -> dict[str, list[float]]:
    """Seconds of each of `reps` rounds per entry, one call of every entry per round."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return times


def med(xs):
    return statistics.median(xs)


# ---- 1. pack / unpack speed ----------------------------------------------------

def section_speed(args) -> list[str]:
    mb = 4 if args.quick else 64
    reps = args.reps or (3 if args.quick else 9)
    block = {8: 256, 4: 32}
    out = []
    g = torch.Generator().manual_seed(0)
    for dtype, alt_dtype, alt_name in ((torch.bfloat16, torch.float8_e4m3fn, "fp8 e4m3"),
                                       (torch.float32, torch.bfloat16, "bf16")):
        n = (mb << 20) // torch.tensor([], dtype=dtype).element_size()
        x = torch.randn(n, generator=g).to(dtype)
        dst = torch.empty_like(x)
        packed = {b: torch.ops.mixprec.act_pack(x, b, block[b], 1) for b in (8, 4)}
        alt = x.to(alt_dtype)
        in_bytes = x.numel() * x.element_size()
        for threads in (1, 2):
            set_threads(threads)
            fns = {"copy": lambda: dst.copy_(x), "clone": lambda: x.clone(),
                   "alt pack": lambda: x.to(alt_dtype), "alt unpack": lambda: alt.to(dtype)}
            for b in (8, 4):
                c, s = packed[b]
                fns[f"pack {b}"] = lambda b=b: torch.ops.mixprec.act_pack(x, b, block[b], 7)
                fns[f"unpack {b}"] = lambda b=b, c=c, s=s: torch.ops.mixprec.act_unpack(c, s, n, b, block[b], dtype)
            t = {k: med(v) for k, v in interleaved(fns, reps).items()}
            bw = 2 * in_bytes / t["copy"]
            out.append((dtype, threads, bw, 2 * in_bytes / t["clone"], t, packed, in_bytes, alt_name,
                        in_bytes + alt.numel() * alt.element_size()))
        del x, dst, packed, alt
        gc.collect()
    set_threads(2)
    name = {torch.bfloat16: "BF16", torch.float32: "FP32"}
    lines = [f"{mb} MB input ({', '.join(f'{name[d]} {(mb << 20) // (2 if d == torch.bfloat16 else 4):,} elements' for d in name)}), "
             f"blocks 256 (8-bit) / 32 (4-bit), median of {reps} interleaved rounds. Stream bandwidth = "
             "dst.copy_(x) into an existing tensor of the input's size, (read + write) / time, same thread count; "
             "'clone' is the same copy into a fresh allocation (page faults included, as every pack / unpack / cast "
             "output here pays).", ""]
    tab = ["| input | threads | stream GB/s (copy_ / clone) | op | bits | MB moved | mixprec ms | GB/s | of stream "
           "| user's alternative | alt ms | alt GB/s | mixprec / alt time |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for dtype, threads, bw, bw_clone, t, packed, in_bytes, alt_name, alt_bytes in out:
        for op in ("pack", "unpack"):
            for b in (8, 4):
                c, s = packed[b]
                moved = in_bytes + c.numel() + 4 * s.numel()
                tm, ta = t[f"{op} {b}"], t[f"alt {op}"]
                alt_desc = f"x.to({alt_name})" if op == "pack" else f"{alt_name}.to({name[dtype].lower()})"
                tab.append(f"| {name[dtype]} | {threads} | {bw / 1e9:.1f} / {bw_clone / 1e9:.1f} | {op} | {b} | {moved / 1e6:.1f} "
                           f"| {tm * 1e3:.2f} | {moved / tm / 1e9:.1f} | {moved / tm / bw:.2f} | {alt_desc} "
                           f"| {ta * 1e3:.2f} | {alt_bytes / ta / 1e9:.1f} | {tm / ta:.2f} |")
    print("\n".join(tab), flush=True)
    if args.speed_child:
        return tab
    lines += tab
    # The same in a child process whose torch backs allocations >= 2 MB with 2 MB pages: the outputs'
    # page faults (4 KB each here, ~3 us apiece in this VM) no longer dominate a fresh 64 MB tensor.
    cmd = [sys.executable, __file__, "--only", "speed", "--speed-child"] + (["--quick"] if args.quick else []) \
        + (["--reps", str(args.reps)] if args.reps else [])
    print("\nthe same with THP_MEM_ALLOC_ENABLE=1:", flush=True)
    child = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "THP_MEM_ALLOC_ENABLE": "1"})
    child_tab = [ln for ln in child.stdout.splitlines() if ln.startswith("|")]
    print("\n".join(child_tab) or child.stderr[-2000:], flush=True)
    lines += ["", "The same in a child process run with THP_MEM_ALLOC_ENABLE=1 (torch's CPU allocator asks for "
              "2 MB transparent huge pages for allocations of 2 MB and more; THP is 'madvise' here), so that "
              "the page faults of each fresh output stop dominating:", ""]
    lines += child_tab or [f"(child failed: {child.stderr.strip().splitlines()[-1] if child.stderr.strip() else child.returncode})"]
    return lines


# ---- 2. bytes per sample (the planner) -----------------------------------------

def _maskrcnn_batch(size: int):
    """make_batch(n) for Mask R-CNN in train mode: n random images with 4
    boxes and box-shaped masks each. The same n gives the same batch, and
    torch's RNG is reseeded too: the RPN's and the box head's sampling of
    proposals (and so how many RoIs reach the mask head) is then the same in
    every recipe, instead of a few MB of noise per measurement."""

    def make(n):
        g = torch.Generator().manual_seed(n)
        torch.manual_seed(n)
        images, targets = [], []
        for _ in range(n):
            images.append(torch.rand(3, size, size, generator=g))
            k = 4
            xy = torch.rand(k, 2, generator=g) * size * 0.6
            wh = size * 0.05 + torch.rand(k, 2, generator=g) * size * 0.3
            boxes = torch.cat([xy, (xy + wh).clamp(max=size - 1)], 1)
            masks = torch.zeros(k, size, size, dtype=torch.uint8)
            for i, (x0, y0, x1, y1) in enumerate(boxes.round().long().tolist()):
                masks[i, y0:y1, x0:x1] = 1
            targets.append({"boxes": boxes, "labels": torch.randint(1, 91, (k,), generator=g), "masks": masks})
        return (images, targets), {}

    return make


def _sum_losses(d):
    return sum(d.values())


def _ce_loss(mixprec_ce: bool = False):
    """Cross-entropy on random class labels (drawn inside the loss, from a
    fixed generator): a classifier's loss on (N, C) logits and a segmenter's
    on DeepLab's (N, C, H, W) "out". The labels are counted as the step's.
    ``mixprec_ce``: mixprec.ops.cross_entropy instead of F.cross_entropy."""
    g = torch.Generator().manual_seed(1)
    ce = mixprec.ops.cross_entropy if mixprec_ce else F.cross_entropy

    def loss(out):
        o = out["out"] if isinstance(out, dict) else out
        y = torch.randint(0, o.shape[1], (o.shape[0],) + tuple(o.shape[2:]), generator=g)
        return ce(o, y)

    return loss


def bytes_cases(quick: bool, deeplab_res: int):
    """(label, factory, plan kwargs, resolution note)."""
    tvm = torchvision.models
    if quick:
        return [
            ("resnet50", lambda: tvm.resnet50(weights=None), dict(input_shape=(3, 32, 32), batches=(2, 3)), "32x32"),
            ("vit_b_16", lambda: tvm.vit_b_16(weights=None, image_size=32), dict(input_shape=(3, 32, 32), batches=(2, 3)),
             "32x32"),
            ("deeplabv3_resnet50", lambda: tvm.segmentation.deeplabv3_resnet50(weights=None, weights_backbone=None),
             dict(input_shape=(3, 32, 32), batches=(2, 3)), "32x32"),
            ("maskrcnn_resnet50_fpn (train)",
             lambda: tvm.detection.maskrcnn_resnet50_fpn(weights=None, weights_backbone=None, min_size=128, max_size=128),
             dict(make_batch=_maskrcnn_batch(128), loss_fn=_sum_losses, batches=(1, 2)), "128x128"),
        ]
    dl = deeplab_res
    return [
        ("resnet50", lambda: tvm.resnet50(weights=None), dict(input_shape=(3, 224, 224), batches=(2, 4),
                                                               loss_fn=_ce_loss()), "224x224"),
        ("vit_b_16", lambda: tvm.vit_b_16(weights=None), dict(input_shape=(3, 224, 224), batches=(2, 4),
                                                              loss_fn=_ce_loss()), "224x224"),
        # BatchNorm after ASPP's global pooling needs 2 samples: batches (2, 3).
        ("deeplabv3_resnet50", lambda: tvm.segmentation.deeplabv3_resnet50(weights=None, weights_backbone=None),
         dict(input_shape=(3, dl, dl), batches=(2, 3), loss_fn=_ce_loss()),
         f"{dl}x{dl}" + (" (512: too slow here)" if dl < 512 else "")),
        ("maskrcnn_resnet50_fpn (train)",
         lambda: tvm.detection.maskrcnn_resnet50_fpn(weights=None, weights_backbone=None),
         dict(make_batch=_maskrcnn_batch(800), loss_fn=_sum_losses, batches=(1, 2)), "800x800"),
    ]


def _plan(factory, native: bool, check_batch: int = 0, recipes=RECIPES, seg_loss=None, **kw):
    """plan() one recipe at a time (a recipe that fails leaves the others'
    rows), amp-bf16 first: the others get its total at batch 16 as budget.
    With check_batch, also the planner's own measurement (_planner._measure,
    as tests/python/memory/test_planner.py uses it) at that batch, to set the
    line's prediction against. Returns ({recipe name: row or the exception},
    {recipe name: (held after forward, peak - grads) at check_batch}, params)."""
    torch.manual_seed(0)
    model = factory()
    rows, checks, budget = {}, {}, None
    with kernels(native):
        for r in recipes:
            try:
                rows[r.name] = mm.plan(model, recipes=[r], batch=16, budget=budget, **kw)[0]
                if check_batch:
                    shape = kw["input_shape"]
                    held, peak, _ = mm._planner._measure(
                        model, r, lambda n: ((torch.randn((n,) + tuple(shape)),), {}), check_batch,
                        mm._planner._default_loss)
                    checks[r.name] = (held, peak)
            except Exception as e:  # noqa: BLE001 - reported in the table
                rows[r.name] = e
            if r.name == "amp-bf16" and not isinstance(rows[r.name], Exception):
                budget = rows[r.name].total
        for r in (SEG if seg_loss is not None else []):  # the same recipes with another loss
            try:
                rows[r.name] = mm.plan(model, recipes=[r], batch=16, budget=budget, **{**kw, "loss_fn": seg_loss})[0]
            except Exception as e:  # noqa: BLE001 - reported in the table
                rows[r.name] = e
    n = sum(p.numel() for p in model.parameters())
    return rows, checks, n


def _check_cell(row, measured, batch) -> str:
    """The line's peak (grads excluded) at the check batch against the planner's measurement there."""
    if not measured:
        return "-"
    return f"{(row.peak_fixed + batch * row.peak_per_sample) / 1e6:.0f} / {measured[1] / 1e6:.0f} (at {batch})"


def section_bytes(args) -> list[str]:
    lines = []
    # The emulation check: every figure of resnet18 at 64x64, torch's BF16 kernels against FP32Kernels.
    if not args.native_bf16 and not args.quick:
        t0 = time.perf_counter()
        kw = dict(input_shape=(3, 64, 64), batches=(1, 2))
        nat, _, _ = _plan(lambda: torchvision.models.resnet18(weights=None), True, **kw)
        emu, _, _ = _plan(lambda: torchvision.models.resnet18(weights=None), False, **kw)
        diffs = []
        for name in RECIPE_NAMES:
            a, b = nat[name], emu[name]
            if isinstance(a, Exception) or isinstance(b, Exception):
                diffs.append(f"{name} failed: {a!r} / {b!r}")
                continue
            for f in ("saved_per_sample", "peak_per_sample", "peak_fixed"):
                if getattr(a, f) != getattr(b, f):
                    diffs.append(f"{name} {f} {getattr(a, f):.0f} vs {getattr(b, f):.0f}")
        check = (f"Emulation check (resnet18 at 64x64, batches 1 and 2, the four recipes, torch's BF16 kernels "
                 f"against FP32Kernels, {time.perf_counter() - t0:.0f} s): "
                 + ("saved / sample, peak / sample and the peak's intercept identical in every recipe."
                    if not diffs else "DIFFERENT: " + "; ".join(diffs) + "."))
        print(check, flush=True)
        lines += [check, ""]
    lines += ["Per sample, from two measured batches (a line through them), under mixprec.memory.LiveTracker, "
              "one plan() call per recipe. 'x amp' = the recipe's figure / amp-bf16's. Training state (16 B/param: "
              "FP32 params + grads + AdamW) is the same in every recipe here; the budget is amp-bf16's total at "
              "batch 16 (state + peak intercept + 16 x peak / sample). '!' marks a peak / sample below the saved / "
              "sample: the peak at the measured batches is not where the activations are (see the notes).", ""]
    tab = ["| model | input | recipe | saved MB / sample | x amp | peak MB / sample | x amp | peak intercept MB "
           "| largest batch at budget | peak at check batch: line / measured MB | planner s (larger batch) |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(tab), flush=True)
    notes = []
    lean_rows = {}
    for label, factory, kw, res in bytes_cases(args.quick, args.deeplab_res):
        if args.models and not any(label.startswith(m) for m in args.models.split(",")):
            continue
        t0 = time.perf_counter()
        check = args.check_batch if "input_shape" in kw and label in ("resnet50", "vit_b_16") else 0
        recipes = RECIPES + (VISION if label.startswith("maskrcnn") else [])
        seg = label.startswith("deeplab")
        rows, checks, n = _plan(factory, args.native_bf16, check, recipes=recipes,
                                seg_loss=_ce_loss(mixprec_ce=True) if seg else None, **kw)
        recipes = recipes + (SEG if seg else [])
        wall = time.perf_counter() - t0
        ref = rows["amp-bf16"]
        b1, b2 = kw["batches"]
        desc = f"{label} ({n / 1e6:.1f}M params; batches {b1}, {b2})"
        for name in [r.name for r in recipes]:
            r = rows[name]
            if isinstance(r, Exception):
                row = f"| {desc} | {res} | {SHORT[name]} | failed: {type(r).__name__}: {str(r).splitlines()[0][:160]} | | | | | | | |"
            else:
                ok = not isinstance(ref, Exception)
                flag = " !" if r.peak_per_sample < r.saved_per_sample else ""
                row = (f"| {desc} | {res} | {SHORT[name]} | {r.saved_per_sample / 1e6:.1f} "
                       f"| {r.saved_per_sample / ref.saved_per_sample if ok else float('nan'):.2f} "
                       f"| {r.peak_per_sample / 1e6:.1f}{flag} "
                       f"| {r.peak_per_sample / ref.peak_per_sample if ok else float('nan'):.2f} "
                       f"| {r.peak_fixed / 1e6:.0f} | {r.largest_batch} | {_check_cell(r, checks.get(name), check)} "
                       f"| {r.step_seconds:.1f} |")
            tab.append(row)
            print(row, flush=True)
            if name in LEAN and not isinstance(r, Exception) and not isinstance(ref, Exception):
                state = n * LEAN_STATE_BYTES
                largest = int((ref.total - state - r.peak_fixed) // r.peak_per_sample)
                lean_rows[(label, name)] = largest
                row = (f"| {desc} | {res} | {LEAN[name]} | same | | same | | {r.peak_fixed / 1e6:.0f} | **{largest}** "
                       f"({largest / 16:.2f}x) | state {state / 1e6:.0f} MB instead of {r.state / 1e6:.0f} | |")
                tab.append(row)
                print(row, flush=True)
        budget = f"budget {ref.total / 2**30:.2f} GiB" if not isinstance(ref, Exception) else "no budget (amp-bf16 failed)"
        notes.append(f"- {label} at {res}: {budget}; {wall:.0f} s to plan")
        print(notes[-1], flush=True)
        del rows
        gc.collect()
    args._lean_rows = lean_rows
    return lines + notes + [""] + tab


# ---- 2b. the largest batch, confirmed by real training steps ---------------------

def _train_step_bytes(model, x, loss_fn, opt, bits, native) -> tuple[int, int, int]:
    """A training step as from the second one on: a first step on 2 samples
    makes the optimizer's state (untracked), then one step (forward under
    BF16 autocast, backward, optimizer step) under LiveTracker. Returns
    (tracked peak, parameter bytes, optimizer-state bytes): the parameters
    and the state exist before the tracker starts; gradients, activations and
    temporaries are tracked."""
    ca = (lambda: mm.compressed_activations(bits=bits)) if bits else contextlib.nullcontext

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16), ca():
            loss = loss_fn(model(xb))
        loss.backward()
        del loss
        opt.step()
        model.zero_grad(set_to_none=True)

    with kernels(native):
        xb = x[:2]
        step()
        gc.collect()
        params = sum(p.untyped_storage().nbytes() for p in model.parameters())
        seen = {}
        for st in opt.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor):
                    seen[v.untyped_storage().data_ptr()] = v.untyped_storage().nbytes()
        xb = x
        with mm.LiveTracker() as tr:
            step()
    return tr.peak, params, sum(seen.values())


def section_confirm(args) -> list[str]:
    set_threads(2)
    tvm = torchvision.models
    dl = 64 if args.quick else args.deeplab_res
    res = 32 if args.quick else 224
    cases = [("resnet50", lambda: tvm.resnet50(weights=None), res),
             ("deeplabv3_resnet50", lambda: tvm.segmentation.deeplabv3_resnet50(weights=None, weights_backbone=None), dl)]
    planned = dict(getattr(args, "_lean_rows", {}))
    for item in filter(None, args.confirm_batches.split(";")):  # "resnet50=41,66;..."
        model_name, b = item.split("=")
        b8, b4 = (int(v) for v in b.split(","))
        planned[(model_name, "amp-bf16 + 8-bit act")], planned[(model_name, "amp-bf16 + 4-bit act")] = b8, b4
    if args.models:
        cases = [c for c in cases if any(c[0].startswith(m) for m in args.models.split(","))]
    lines = ["One real training step per row (forward under BF16 autocast, backward, optimizer step; random inputs, "
             "cross-entropy on random labels) under mixprec.memory.LiveTracker, after a first step on 2 samples "
             "that made the optimizer's state; 'total' = parameter bytes + optimizer-state bytes + the tracked peak "
             "(gradients, activations, temporaries). The budget row "
             "is torch's recipe at batch 16: FP32 parameters, BF16 autocast, torch.optim.AdamW. mixprec's rows: "
             "the model in BF16, `mixprec.optim.AdamW(param_remainders=True, exp_avg_dtype=exp_avg_sq_dtype="
             "torch.uint8)` (8 B/param) and `compressed_activations(bits)`, at the largest batch the planner gave "
             "(the bytes section's lean rows; else 2x and 3x of 16).", "",
             "| model | input | recipe | batch | x 16 | params MB | optimizer state MB | tracked peak MB | total MB "
             "| of the budget |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines[-2:]), flush=True)
    def measure(label, r, recipe, model, opt, x, loss_fn, bits, budget=None):
        """One row: the step's bytes at x's batch; budget None = this row is the budget."""
        t0 = time.perf_counter()
        peak, params, state = _train_step_bytes(model, x, loss_fn, opt, bits, args.native_bf16)
        total = params + state + peak
        batch = x.shape[0]
        row = (f"| {label} | {r}x{r} | {recipe} | {batch} | {batch / 16:.2f} | {params / 1e6:.0f} "
               f"| {state / 1e6:.0f} | {peak / 1e6:.0f} | {total / 1e6:.0f} | {total / (budget or total):.2f} |")
        lines.append(row)
        print(row, f"({time.perf_counter() - t0:.0f} s)", flush=True)
        gc.collect()
        return peak, params, state, total

    def lean_opt(model):
        return mixprec.optim.AdamW(model.parameters(), lr=1e-4, param_remainders=True,
                                   exp_avg_dtype=torch.uint8, exp_avg_sq_dtype=torch.uint8)

    for label, factory, r in cases:
        torch.manual_seed(0)
        ref_model = factory()
        ref_model.train()
        loss_fn = _ce_loss()
        budget = measure(label, r, "amp-bf16 + torch AdamW (the budget)", ref_model,
                         torch.optim.AdamW(ref_model.parameters(), lr=1e-4), torch.randn(16, 3, r, r), loss_fn, None)[3]
        model = ref_model.to(torch.bfloat16)
        for bits, name in ((8, "amp-bf16 + 8-bit act"), (4, "amp-bf16 + 4-bit act")):
            batch = planned.get((label, name)) or (32 if bits == 8 else 48)
            if args.quick:
                batch = min(batch, 8)
            peak, params, state, total = measure(label, r, LEAN[name], model, lean_opt(model),
                                                 torch.randn(batch, 3, r, r, dtype=torch.bfloat16), loss_fn, bits, budget)
            if total > budget and not args.quick:
                # Over the budget: the batch the step's own bytes say fits (the tracked peak taken as
                # proportional to the batch, which errs small), run again to show it.
                fit = int(batch * (budget - params - state) / peak)
                measure(label, r, f"{LEAN[name]}, the batch that fits", model, lean_opt(model),
                        torch.randn(fit, 3, r, r, dtype=torch.bfloat16), loss_fn, bits, budget)
        del model, ref_model
        gc.collect()
    return lines


# ---- 3. step time ---------------------------------------------------------------

FP32_RECIPES = [mm.Recipe("fp32"), mm.Recipe("fp32 + 8-bit act", bits=8), mm.Recipe("fp32 + 4-bit act", bits=4),
                mm.Recipe("fp32 + checkpoint", checkpoint=True)]


def _step_fns(model, x, y, recipes):
    def step(recipe):
        def run():
            model.zero_grad(set_to_none=True)
            ck = mm.checkpoint_blocks(model) if recipe.checkpoint else contextlib.nullcontext()
            ca = mm.compressed_activations(bits=recipe.bits) if recipe.bits else contextlib.nullcontext()
            ac = torch.autocast("cpu", dtype=recipe.autocast or torch.bfloat16, enabled=recipe.autocast is not None)
            with ck:
                with ac, ca:
                    loss = F.cross_entropy(model(x).float(), y)
                loss.backward()
        return run
    return {r.name: step(r) for r in recipes}


def section_step(args) -> list[str]:
    set_threads(2)
    reps = args.reps or (2 if args.quick else 3)
    res = 32 if args.quick else 224
    # (label, native BF16 kernels, resolution, recipes)
    configs = [("amp-bf16 on FP32Kernels", False, res, RECIPES), ("FP32, no autocast", True, res, FP32_RECIPES)]
    if args.native_step_res or args.native_bf16:
        configs.insert(0, ("amp-bf16 on torch's BF16 kernels", True, args.native_step_res or res, RECIPES))
    if args.native_bf16:
        configs = [c for c in configs if c[1]]
    lines = [f"Batch 16, 2 threads, {reps} interleaved rounds after 1 warm-up round (the four recipes of a row group "
             "take turns); loss: cross-entropy on random labels. 'x base' = the median of the per-round ratios to "
             "the group's first recipe (amp-bf16 / fp32); 'min s' = the fastest round (this host is shared: "
             "the minimum is the least disturbed).", ""]
    tab = ["| model | baseline | input | recipe | median s / step | min s | x base |", "|---|---|---|---|---|---|---|"]
    print("\n".join(tab), flush=True)
    for model_name in ("resnet18", "resnet50"):
        for label, native, r, recipes in configs:
            torch.manual_seed(0)
            model = getattr(torchvision.models, model_name)(weights=None)
            g = torch.Generator().manual_seed(1)
            x = torch.randn(16, 3, r, r, generator=g)
            y = torch.randint(0, 1000, (16,), generator=g)
            with kernels(native):
                times = interleaved(_step_fns(model, x, y, recipes), reps, warmup=1)
            base = times[recipes[0].name]
            for name, ts in times.items():
                ratio = med([a / b for a, b in zip(ts, base)])
                row = (f"| {model_name} | {label} | {r}x{r} | {SHORT.get(name, name)} | {med(ts):.2f} "
                       f"| {min(ts):.2f} | {ratio:.2f} |")
                tab.append(row)
                print(row, flush=True)
            del model
            gc.collect()
    return lines + tab


# ---- 4. gradient fidelity -------------------------------------------------------

def _grads(model, x, y, bits=None, autocast=True, stats=None, **kw):
    """The step's gradients; with ``stats`` (a list), the bytes it saved for
    backward appended to it: packed + kept with ``bits``, else the distinct
    storages autograd saved (parameters excluded, autocast's weight copies
    counted, as ``kept_bytes`` counts them)."""
    model.zero_grad(set_to_none=True)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def count(t):
        if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in params:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    if bits:
        ca = mm.compressed_activations(bits=bits, **kw)
    elif stats is not None:
        ca = torch.autograd.graph.saved_tensors_hooks(count, lambda t: t)
    else:
        ca = contextlib.nullcontext()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), ca:
        loss = F.cross_entropy(model(x).float(), y)
    loss.backward()
    if stats is not None:
        stats.append(ca.stats["packed_nbytes"] + ca.stats["kept_bytes"] if bits else sum(seen.values()))
    return {n: p.grad.detach().double().clone() for n, p in model.named_parameters() if p.grad is not None}


def _cos(a, b):
    return float(F.cosine_similarity(a.reshape(1, -1), b.reshape(1, -1)))


def _one_ulp(t):
    """``t`` with every non-zero element moved one BF16 unit in the last place
    up or down at random (a float32 tensor: rounded to BF16 first)."""
    b = t.detach().to(torch.bfloat16)
    step = (torch.randint(0, 2, b.shape, dtype=torch.int16) * 2 - 1) * (b != 0).to(torch.int16)
    return (b.view(torch.int16) + step).view(torch.bfloat16).to(t.dtype)


@contextlib.contextmanager
def _norm_inputs_one_ulp(model):
    """While active, what BatchNorm / LayerNorm modules save for backward
    comes back one BF16 ulp off (nothing else is changed, nothing packed):
    the gradient error of a format exactly as fine as BF16 itself."""
    norms = (torch.nn.BatchNorm2d, torch.nn.LayerNorm, torch.nn.GroupNorm)
    handles = []

    def pre(mod, inp):
        mod._ulp_hook = torch.autograd.graph.saved_tensors_hooks(
            lambda t: t if t.numel() < 16384 or t.grad_fn is None or not t.is_floating_point() else _one_ulp(t),
            lambda t: t)
        mod._ulp_hook.__enter__()

    def post(mod, inp, out):
        mod._ulp_hook.__exit__(None, None, None)
        del mod._ulp_hook

    for m in model.modules():
        if isinstance(m, norms):
            handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _vit_head(model):
    """torchvision's ViT starts with a zero head, which makes every gradient
    but the head's zero: give it trunc_normal(std 0.02) weights instead."""
    torch.nn.init.trunc_normal_(model.heads.head.weight, std=0.02)
    return model


def section_grad(args) -> list[str]:
    set_threads(2)
    tvm = torchvision.models
    if args.quick:
        cases = [("resnet18", lambda: tvm.resnet18(weights=None), 4, 32),
                 ("resnet50", lambda: tvm.resnet50(weights=None), 4, 32),
                 ("vit_b_16", lambda: _vit_head(tvm.vit_b_16(weights=None, image_size=32)), 2, 32)]
    else:
        cases = [("resnet18", lambda: tvm.resnet18(weights=None), 16, args.grad_res),
                 ("resnet50", lambda: tvm.resnet50(weights=None), 16, args.grad_res),
                 ("vit_b_16", lambda: _vit_head(tvm.vit_b_16(weights=None)), 8, 224)]
    lines = ["Per parameter tensor with a non-zero reference gradient (weights, biases, BN / LayerNorm affine, "
             "ViT's class token and position embedding): cosine of the flattened gradient against the "
             "uncompressed BF16-autocast step on the same batch and weights (cross-entropy on random labels, "
             "train mode; vit_b_16's zero-initialised head is given trunc_normal(0.02) weights, or nothing below "
             "it would get a gradient). 'worst weight' = the worst conv / linear weight (a '.weight' of 2-D and up). "
             "'FP32 vs BF16' = the uncompressed FP32 step against the same BF16 step: how far autocast itself "
             "moves the gradients. '4-bit' = compressed_activations(bits=4) as it ships: 4-bit codes for "
             "conv / linear inputs and ReLU outputs, 8-bit for what normalisation layers (norm_bits=8), "
             "attention and smooth nonlinearities such as GELU (nonlinear_bits=8) save. 'norm_bits' / "
             "'nonlinear_bits' = those code widths set by hand (16: kept as they are); '4-bit, all 4-bit' "
             "is what bits=4 did before (norm_bits=4, nonlinear_bits=4). 'saved MB' = the step's saved "
             "bytes (packed codes and scales + what is kept, autocast's BF16 weight copies included); "
             "'x BF16' = that over the uncompressed step's saved bytes (the same "
             "count, distinct storages). 'BF16 +-1 ulp on norm inputs' = nothing "
             "packed, but every non-zero element the BatchNorm / LayerNorm modules save comes back one BF16 "
             "unit in the last place up or down (random): the error of a format exactly as fine as BF16, the "
             "floor below which a per-layer bar on these tensors cannot be told from BF16's own rounding.", ""]
    tab = ["| model | batch x input | compared | saved MB (packed + kept) | x BF16 | params "
           "| worst cosine (parameter) | worst weight (parameter) | median |",
           "|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(tab), flush=True)
    for name, factory, batch, res in cases:
        torch.manual_seed(0)
        model = factory()
        model.train()
        g = torch.Generator().manual_seed(2)
        x = torch.randn(batch, 3, res, res, generator=g)
        y = torch.randint(0, 1000, (batch,), generator=g)
        t0 = time.perf_counter()
        with kernels(args.native_bf16):
            st = []
            ref = _grads(model, x, y, stats=st)
            ref_bytes = st[0]
            nb = {}
            got = {}
            for label, kw in (("8-bit", dict(bits=8)), ("4-bit", dict(bits=4)),
                              ("4-bit, all 4-bit (norm_bits=4, nonlinear_bits=4)",
                               dict(bits=4, norm_bits=4, nonlinear_bits=4)),
                              ("4-bit, norm_bits=8, nonlinear_bits=4", dict(bits=4, norm_bits=8, nonlinear_bits=4)),
                              ("8-bit, norm_bits=16", dict(bits=8, norm_bits=16))):
                st = []
                got[label] = _grads(model, x, y, stats=st, **kw)
                nb[label] = st[0]
            torch.manual_seed(3)
            with _norm_inputs_one_ulp(model):
                got["BF16 +-1 ulp on norm inputs"] = _grads(model, x, y)
        got["FP32 vs BF16"] = _grads(model, x, y, autocast=False)
        keys = [k for k in ref if ref[k].norm() > 0]
        for label, gr in got.items():
            cos = {k: _cos(ref[k], gr[k]) for k in keys}
            worst = min(keys, key=cos.get)
            weights = [k for k in keys if k.endswith("weight") and ref[k].dim() >= 2]
            worst_w = min(weights, key=cos.get)
            saved = f"{nb[label] / 1e6:.0f} | {nb[label] / ref_bytes:.2f}" if label in nb else "- | -"
            row = (f"| {name} | {batch} x {res}x{res} | {label} | {saved} | {len(keys)} | {cos[worst]:.4f} ({worst}) "
                   f"| {cos[worst_w]:.4f} ({worst_w}) | {med(list(cos.values())):.4f} |")
            tab.append(row)
            print(row, flush=True)
        print(f"  ({name}: {time.perf_counter() - t0:.0f} s)", flush=True)
        del model, ref, got
        gc.collect()
    return lines + tab


# ---- 5. torch.compile's activation_memory_budget, side by side ----------------------

def _saved_bytes(model, x, y, *, bits=None, autocast=False, compiled=False) -> int:
    """Bytes of the distinct storages saved for backward in one step (what
    the packed forms hold, for mixprec), parameters excluded: under
    torch.compile, what AOTAutograd's compiled function saves."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            k = t.untyped_storage().data_ptr()
            if k not in params:
                seen[k] = t.untyped_storage().nbytes()
        return t

    model.zero_grad(set_to_none=True)
    ac = torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)
    if compiled:
        # What the compiled function saved (its packed forms, when the block
        # is on: torch.compile inlines the block's hooks, no Python hook runs).
        ctx = mm.compressed_activations(bits=bits) if bits else contextlib.nullcontext()
        with ac, ctx:
            loss = F.cross_entropy(model(x).float(), y)
        held = mm._compiled.compiled_saved_bytes(loss, params)
    elif bits:
        ca = mm.compressed_activations(bits=bits)
        with ac, ca:
            loss = F.cross_entropy(model(x).float(), y)
        held = ca.stats["packed_nbytes"] + ca.stats["kept_bytes"]
    else:
        with ac, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = F.cross_entropy(model(x).float(), y)
        held = sum(seen.values())
    loss.backward()
    return held


def section_compile(args) -> list[str]:
    """Saved bytes per sample (slope between two batches) and step time of
    resnet18 / resnet50 under torch.compile (inductor, CPU) at
    activation_memory_budget 1.0 / 0.5 / 0.2 and with mixprec's 8-bit /
    4-bit compressed activations around the compiled model (inlined by
    AOTAutograd), against the eager step and eager 8-bit; FP32, or BF16
    autocast with --native-bf16 (where torch's BF16 kernels are native)."""
    import torch._functorch.config as fconf
    import torch._dynamo

    set_threads(2)
    tvm = torchvision.models
    res, (b1, b2) = (32, (2, 3)) if args.quick else (args.compile_res, (2, 4))
    reps = 2 if args.quick else 3
    bf16 = args.native_bf16
    lines = [f"{'BF16 autocast (native kernels)' if bf16 else 'FP32 (no autocast)'}, {res}x{res}, cross-entropy on "
             f"random labels. Saved MB / sample = the slope of the "
             f"bytes saved for backward (distinct storages, parameters excluded; for mixprec its codes + what it "
             f"keeps; compiled: what the compiled functions saved, read from the autograd graph) between batches "
             f"{b1} and {b2}; step = forward + backward at batch {b2}, median of {reps} after "
             "a warm-up (compiled: after compiling). torch.compile's budget is "
             "torch._functorch.config.activation_memory_budget (1.0: save what the partitioner would; lower: "
             "recompute more). 'x eager' = against the eager step without compression.", ""]
    tab = ["| model | recipe | saved MB / sample | x eager | step s | x eager | compile s |", "|---|---|---|---|---|---|---|"]
    print("\n".join(tab), flush=True)
    for name in ("resnet18", "resnet50"):
        torch.manual_seed(0)
        model = getattr(tvm, name)(weights=None).train()
        g = torch.Generator().manual_seed(3)
        data = {b: (torch.randn(b, 3, res, res, generator=g), torch.randint(0, 1000, (b,), generator=g))
                for b in (b1, b2)}
        rows = []

        def measure(label, fn_model, bits=None, compiled=False):
            kw = dict(bits=bits, autocast=bf16, compiled=compiled)
            t0 = time.perf_counter()
            sv = [_saved_bytes(fn_model, *data[b], **kw) for b in (b1, b2)]  # compiles here
            comp = time.perf_counter() - t0
            times = []
            for _ in range(reps):
                t1 = time.perf_counter()
                _saved_bytes(fn_model, *data[b2], **kw)
                times.append(time.perf_counter() - t1)
            rows.append((label, (sv[1] - sv[0]) / (b2 - b1), med(times), comp))

        measure("eager", model)
        measure("eager + mixprec 8-bit", model, bits=8)
        cases = [(budget, None) for budget in (1.0, 0.5, 0.2)] + [(1.0, 8), (1.0, 4)]
        for budget, bits in cases:
            torch._dynamo.reset()
            label = f"torch.compile, budget {budget}" + (f" + mixprec {bits}-bit" if bits else "")
            with fconf.patch(activation_memory_budget=budget):
                # (mixprec: a graph per batch size; a region compiled for
                # dynamic shapes keeps its tensors, see mixprec.memory)
                cm = torch.compile(model, dynamic=False if bits else None)
                try:
                    measure(label, cm, bits=bits, compiled=True)
                except Exception as e:  # noqa: BLE001 - reported in the table
                    rows.append((f"{label}: failed {type(e).__name__}: {str(e)[:80]}",
                                 float("nan"), float("nan"), float("nan")))
        torch._dynamo.reset()
        base_b, base_t = rows[0][1], rows[0][2]
        for label, per, st, comp in rows:
            row = (f"| {name} | {label} | {per / 1e6:.2f} | {per / base_b:.2f} | {st:.2f} | {st / base_t:.2f} "
                   f"| {'-' if label.startswith('eager') else f'{comp:.0f}'} |")
            tab.append(row)
            print(row, flush=True)
        del model
        gc.collect()
    return lines + tab


# ---- main -----------------------------------------------------------------------

SECTIONS = {
    "speed": ("Pack / unpack speed", section_speed),
    "bytes": ("Bytes per sample (mixprec.memory.plan)", section_bytes),
    "confirm": ("The largest batch, confirmed by a training step", section_confirm),
    "step": ("Step time", section_step),
    "grad": ("Gradient fidelity", section_grad),
    "compile": ("torch.compile's activation_memory_budget, side by side", section_compile),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, few rounds (smoke run)")
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections: speed,bytes,confirm,step,grad,compile")
    ap.add_argument("--reps", type=int, default=None, help="rounds (speed: 9, step: 3; quick: 3 / 2)")
    ap.add_argument("--native-bf16", action="store_true",
                    help="torch's own BF16 kernels everywhere (no FP32Kernels; slow without AVX-512 BF16)")
    ap.add_argument("--native-step-res", type=int, default=0,
                    help="also time the steps on torch's own BF16 kernels at this resolution (default: not)")
    ap.add_argument("--check-batch", type=int, default=16,
                    help="resnet50 / vit_b_16: also measure the peak at this batch against the planner's line (0: not)")
    ap.add_argument("--deeplab-res", type=int, default=512,
                    help="deeplabv3_resnet50's resolution in the bytes table (default 512)")
    ap.add_argument("--confirm-batches", default="",
                    help="confirm section: batches for 8- and 4-bit, e.g. 'resnet50=41,66' (default: the planner's)")
    ap.add_argument("--compile-res", type=int, default=224, help="compile section: resolution (default 224)")
    ap.add_argument("--models", default="", help="bytes / confirm sections: only these models (comma-separated prefixes)")
    ap.add_argument("--grad-res", type=int, default=224, help="resnet18 / resnet50 resolution in the grad table")
    ap.add_argument("--speed-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help="write the Markdown results here")
    args = ap.parse_args()
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        ap.error(f"unknown sections {unknown}; known: {list(SECTIONS)}")
    set_threads(2)
    if args.speed_child:
        section_speed(args)
        return
    t_start = time.perf_counter()
    head = machine_line()
    print(head, flush=True)
    parts = []

    def write(done: bool) -> None:
        """The results so far (after every section, so a run cut short keeps what it measured)."""
        if not args.out:
            return
        load = os.getloadavg()
        total = time.perf_counter() - t_start
        state = (f"total {total:.0f} s, load average at the end {load[0]:.1f}" if done
                 else f"INCOMPLETE: {len(parts)} of {len(only)} sections after {total:.0f} s")
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as f:
            f.write("# Activation memory on the CPU (mixprec.memory)\n\n")
            f.write(head + f"; {state}.\n")
            f.write(f"Command: `python bench/bench_memory.py {' '.join(sys.argv[1:])}`\n\n")
            f.write("\n".join(parts))

    for key in only:
        title, fn = SECTIONS[key]
        print(f"\n## {title}", flush=True)
        t0 = time.perf_counter()
        body = fn(args)
        wall = time.perf_counter() - t0
        print(f"({key}: {wall:.0f} s)", flush=True)
        parts.append(f"## {title} ({wall:.0f} s)\n\n" + "\n".join(body) + "\n")
        write(done=False)
    write(done=True)
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s; load average at the end {os.getloadavg()[0]:.1f}", flush=True)

if __name__ == "__main__":
    main()
