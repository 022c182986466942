"""Playbook project 2: semantic segmentation, FP32 against BF16 autocast and
against BF16 autocast + 8-bit activations at twice the batch.

A segmentation_models_pytorch Unet (ResNet encoder, random init:
``encoder_weights=None``, nothing is downloaded) learns to label synthetic
scenes this script draws itself: discs, rectangles, triangles and rings
(classes 1-4, background 0) of random size, rotation and colour (colour says
nothing about the class), overlapping (the shape drawn last wins), each with
a stripe texture, on a textured background, plus pixel noise. Every scene is
a function of its seed: the runs are reproducible.

Recipes, compared on paired seeds (seed k: its own initial weights and its
own stream of training scenes, the same for every recipe; the 2x-batch
recipe sees the same scenes in the same order, two batches per step):

  fp32          FP32 forward and backward, torch.optim.AdamW
  bf16          torch.autocast(dtype=torch.bfloat16) around the forward and
                the loss, FP32 parameters, torch.optim.AdamW
  bf16+act8 2x  bf16 + mixprec.memory.compressed_activations(bits=8) around
                the forward (the activations saved for backward packed to
                8-bit codes), at twice the batch and half the steps (the same
                samples), learning rate --lr-2x (default: --lr * sqrt(2),
                the square-root scaling rule for Adam-type optimizers)

The loss is mixprec.ops.cross_entropy on the (N, C, H, W) logits (FP32
accumulation, read straight from the BF16 logits, no FP32 copy) against
(N, H, W) class indices, for every recipe. mIoU (torchmetrics'
MulticlassJaccardIndex, macro over the 5 classes) on held-out scenes, in
each recipe's own precision.

Printed: (a) the parity table: mean mIoU over the seeds, its difference to
FP32 in percentage points with each seed's difference, whether it is within
the playbook's 0.5 pp, non-finite losses, steps/s and samples/s; (b) the
memory table: the peak memory of one training step at the recipe's batch
(on the CPU mixprec.memory.LiveTracker: the tensors the step creates, plus
the parameters and AdamW state it starts from; on CUDA
torch.cuda.max_memory_allocated), and mixprec.memory.plan's largest batch
within what the bf16 recipe needs at batch 16.

Sizes. The issue asks for 512x512 scenes; on the 2-core CPU this was written
on (an AMD EPYC that shows AVX2 but no AVX-512) that does not fit in the 10
minutes a full run may take: one FP32 training step of this Unet at 512x512
takes ~8 s per image, and torch's oneDNN BF16 convolution needs AVX-512
(torch.ops.mkldnn._is_mkldnn_bf16_supported() is False there), so BF16
convolutions fall back to aten::_slow_conv2d, 4-6x FP32's time per image.
The default is therefore 64x64 (--size 64), batch 4, 24 steps, 2 seeds;
pass --size 512 on a GPU (--device cuda) or with time to spare. A run this
short (96 scenes per seed) is far from converged: its parity numbers compare
the recipes early in training, where seed-to-seed noise is large. It runs on
one CPU thread unless --threads says otherwise: on the shared 2-core machine
that is several times faster than torch's default of one thread per core
(OpenMP threads waiting on each other while other jobs hold a core).

Usage: python examples/segmentation.py [--quick] [--device cpu|cuda] [--seeds N] [--steps N]
           [--batch N] [--size N] [--lr LR] [--lr-2x LR] [--encoder resnet18|resnet34] [--threads N]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import mixprec  # noqa: E402
import mixprec.memory  # noqa: E402

CLASSES = ("background", "disc", "rectangle", "triangle", "ring")
RECIPES = ("fp32", "bf16", "bf16+act8 2x")
# The planner's recipe of the same name (mixprec.memory.RECIPES).
PLANNER = {"fp32": "fp32", "bf16": "amp-bf16", "bf16+act8 2x": "amp-bf16 + 8-bit act"}
PARITY_PP = 0.5


# ---- synthetic scenes --------------------------------------------------------


def draw_scene(size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One scene: (3, size, size) float32 image, normalised, and (size, size)
    int64 labels. A function of (size, seed) only."""
    g = torch.Generator().manual_seed(seed)

    def u(lo, hi, n=()):
        return lo + (hi - lo) * torch.rand(n, generator=g)

    ax = (torch.arange(size, dtype=torch.float32) + 0.5) / size
    yy, xx = torch.meshgrid(ax, ax, indexing="ij")
    # Background: a colour gradient and two low-frequency waves.
    img = u(0.2, 0.8, (3, 1, 1)) + u(-0.2, 0.2, (3, 1, 1)) * (xx - 0.5) + u(-0.2, 0.2, (3, 1, 1)) * (yy - 0.5)
    for _ in range(2):
        th, f, ph = u(0, math.pi), u(2, 6), u(0, 2 * math.pi)
        img = img + u(0.05, 0.15) * torch.sin(2 * math.pi * f * (xx * torch.cos(th) + yy * torch.sin(th)) + ph)
    label = torch.zeros(size, size, dtype=torch.int64)
    n_shapes = int(torch.randint(3, 8, (), generator=g))
    for _ in range(n_shapes):
        cls = int(torch.randint(1, len(CLASSES), (), generator=g))
        cx, cy, r, th = u(0.1, 0.9), u(0.1, 0.9), u(0.08, 0.2), u(0, 2 * math.pi)
        dx, dy = xx - cx, yy - cy
        # Coordinates in the shape's rotated frame.
        pu, pv = dx * torch.cos(th) + dy * torch.sin(th), -dx * torch.sin(th) + dy * torch.cos(th)
        if cls == 1:  # disc
            mask = dx * dx + dy * dy < r * r
        elif cls == 2:  # rectangle, rotated
            mask = (pu.abs() < r * u(0.5, 1.0)) & (pv.abs() < r * u(0.5, 1.0))
        elif cls == 3:  # triangle: three half-planes
            ang = th + torch.tensor([0.0, 2 * math.pi / 3, 4 * math.pi / 3]) + u(-0.3, 0.3, (3,))
            vx, vy = cx + r * 1.2 * torch.cos(ang), cy + r * 1.2 * torch.sin(ang)
            mask = torch.ones_like(xx, dtype=torch.bool)
            for i in range(3):
                j = (i + 1) % 3
                side = (vx[j] - vx[i]) * (yy - vy[i]) - (vy[j] - vy[i]) * (xx - vx[i])
                mask &= side > 0
        else:  # ring
            d2 = dx * dx + dy * dy
            mask = (d2 < r * r) & (d2 > (r * u(0.45, 0.7)) ** 2)
        # Random colour with a stripe texture: the class is in the shape only.
        stripes = torch.sin(2 * math.pi * u(4, 12) * pu / max(float(r), 1e-3) * 0.25 + u(0, 2 * math.pi))
        fill = u(0.0, 1.0, (3, 1, 1)) + u(0.05, 0.2) * stripes
        img = torch.where(mask, fill, img)
        label[mask] = cls
    img = img + 0.08 * torch.randn(img.shape, generator=g)
    return (img - 0.5) / 0.3, label


def draw_scenes(size: int, seeds) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*(draw_scene(size, s) for s in seeds))
    return torch.stack(xs), torch.stack(ys)


# Scene seeds: each training seed's stream, the validation scenes and the
# memory measurements' batches come from disjoint ranges.
VAL_SCENES, MEMORY_SCENES, PLANNER_SCENES = 2**40, 2**41, 2**42


def train_stream_seed(seed: int, i: int) -> int:
    """Scene i of training seed `seed`'s stream."""
    return 1_000_003 * (seed + 1) + i


# ---- progress -----------------------------------------------------------------


class Progress:
    """A tqdm bar per run on a terminal; a few plain lines otherwise (logs, CI)."""

    def __init__(self, name, total):
        self.name, self.total = name, total
        self.t0 = time.perf_counter()
        self.done, self.last_quarter, self.bar = 0, -1, None
        if sys.stdout.isatty():
            from tqdm import tqdm  # scripts/requirements.txt; only needed on a terminal

            self.bar = tqdm(total=total, desc=f"  {name:<20}", unit="step", file=sys.stdout, dynamic_ncols=True)

    def update(self, done, loss):
        if self.bar is not None:
            self.bar.set_postfix_str(f"loss {loss:.4f}", refresh=False)
            self.bar.update(done - self.done)
            self.done = done
            if done >= self.total:
                self.bar.close()
            return
        quarter = 4 * done // self.total
        if quarter == self.last_quarter and done != self.total:
            return
        self.last_quarter = quarter
        print(f"  {self.name:<20}{100 * done // self.total:3d}%  step {done}/{self.total}  loss {loss:.4f}"
              f"  {time.perf_counter() - self.t0:6.1f}s", flush=True)


# ---- model and training -------------------------------------------------------


_TEMPLATES: dict = {}


def make_model(encoder: str, device, init_state=None):
    """A Unet with `init_state`'s weights (or a fresh random init from torch's
    global generator). Built once per encoder and copied: building it again
    would draw a random init only to overwrite it (seconds on a CPU)."""
    import segmentation_models_pytorch as smp

    if init_state is None or encoder not in _TEMPLATES:
        model = smp.Unet(encoder, encoder_weights=None, in_channels=3, classes=len(CLASSES))
        _TEMPLATES[encoder] = model
    model = copy.deepcopy(_TEMPLATES[encoder])
    if init_state is not None:
        model.load_state_dict(init_state)
    # channels_last: torch's CPU convolutions (FP32 and BF16) are faster in it.
    return model.to(device, memory_format=torch.channels_last)


def recipe_contexts(recipe: str, device, sr_seed: int):
    """The autocast and activation-packing contexts of a recipe's forward.
    `sr_seed`: the stochastic rounding's seed of this step (an int seed
    rounds a block's k-th packed tensor with the same bits every time, so
    each step gets its own)."""
    ac = (torch.autocast(device.type, dtype=torch.bfloat16) if recipe != "fp32" else contextlib.nullcontext())
    ca = (mixprec.memory.compressed_activations(bits=8, seed=sr_seed) if recipe == "bf16+act8 2x"
          else contextlib.nullcontext())
    return ac, ca


def loss_fn(logits, y):
    # FP32-accumulating cross-entropy straight from the (BF16) logits.
    return mixprec.ops.cross_entropy(logits, y)


def train_step(model, opt, recipe, x, y, device, sr_seed):
    opt.zero_grad(set_to_none=True)
    ac, ca = recipe_contexts(recipe, device, sr_seed)
    with ac, ca:
        loss = loss_fn(model(x), y)
    finite = bool(torch.isfinite(loss))
    if finite:
        loss.backward()
        opt.step()
    return loss.detach(), finite


@torch.no_grad()
def evaluate(model, recipe, val, device, chunk=16):
    from torchmetrics.classification import MulticlassJaccardIndex

    metric = MulticlassJaccardIndex(num_classes=len(CLASSES), average="macro").to(device)
    model.eval()
    xv, yv = val
    for i in range(0, len(xv), chunk):
        x = xv[i : i + chunk].to(device, memory_format=torch.channels_last)
        ac, _ = recipe_contexts(recipe, device, 0)
        with ac:
            pred = model(x).argmax(1)
        metric.update(pred, yv[i : i + chunk].to(device))
    model.train()
    return float(metric.compute())


def train(recipe, init_state, stream, val, args, device, seed):
    batch = args.batch * (2 if recipe == "bf16+act8 2x" else 1)
    steps = args.steps // (2 if recipe == "bf16+act8 2x" else 1)
    lr = args.lr_2x if recipe == "bf16+act8 2x" else args.lr
    model = make_model(args.encoder, device, init_state)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    xs, ys = stream
    bar = Progress(f"{recipe} s{seed}", steps)
    losses, nonfinite = [], 0
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for step in range(steps):
        x = xs[step * batch : (step + 1) * batch].to(device, memory_format=torch.channels_last)
        y = ys[step * batch : (step + 1) * batch].to(device)
        loss, finite = train_step(model, opt, recipe, x, y, device, seed * 2**32 + step)
        nonfinite += not finite
        losses.append(float(loss))
        bar.update(step + 1, losses[-1])
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    miou = evaluate(model, recipe, val, device)
    return {"recipe": recipe, "seed": seed, "batch": batch, "steps": steps, "lr": lr, "miou": miou,
            "nonfinite": nonfinite, "steps_per_s": steps / elapsed, "samples_per_s": steps * batch / elapsed,
            "final_loss": sum(losses[-3:]) / len(losses[-3:])}


# ---- memory --------------------------------------------------------------------


def state_bytes(model, opt):
    ts = list(model.parameters())
    for st in opt.state.values():
        ts += [v for v in st.values() if isinstance(v, torch.Tensor) and v.numel() > 1]
    return sum(t.numel() * t.element_size() for t in ts)


def step_peak(recipe, init_state, args, device, batch):
    """(forward + backward peak, whole-step peak) in bytes of one training
    step at `batch`, after a first step made the AdamW state. Both count the
    parameters and optimizer state the step starts from. On the CPU the rest
    is LiveTracker's peak of what the step creates (saved activations, packed
    codes, gradients, temporaries; the whole step adds AdamW's temporaries);
    on CUDA the allocator's peak."""
    model = make_model(args.encoder, device, init_state)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    x, y = draw_scenes(args.size, range(MEMORY_SCENES, MEMORY_SCENES + batch))
    x, y = x.to(device, memory_format=torch.channels_last), y.to(device)
    train_step(model, opt, recipe, x, y, device, 0)
    opt.zero_grad(set_to_none=True)
    ac, ca = recipe_contexts(recipe, device, 1)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        with ac, ca:
            loss = loss_fn(model(x), y)
        loss.backward()
        torch.cuda.synchronize()
        fwd_bwd = torch.cuda.max_memory_allocated()
        opt.step()
        torch.cuda.synchronize()
        return fwd_bwd, torch.cuda.max_memory_allocated()
    state = state_bytes(model, opt)
    with mixprec.memory.LiveTracker() as tr:
        with ac, ca:
            loss = loss_fn(model(x), y)
        loss.backward()
        fwd_bwd = tr.peak
        opt.step()
    return state + fwd_bwd, state + tr.peak


def planner_rows(init_state, args):
    """mixprec.memory.plan on the CPU for the three recipes: largest batch
    within what the bf16 recipe (planner: amp-bf16) needs at batch 16."""
    model = make_model(args.encoder, torch.device("cpu"), init_state)
    x, y = draw_scenes(args.size, range(PLANNER_SCENES, PLANNER_SCENES + 4))
    recipes = [r for r in mixprec.memory.RECIPES if r.name in PLANNER.values()]

    def make_batch(n):
        return (x[:n].contiguous(memory_format=torch.channels_last),), {}

    rows = mixprec.memory.plan(model, make_batch=make_batch, loss_fn=lambda out: loss_fn(out, y[: out.shape[0]]),
                               batches=(2, 4), batch=16, recipes=recipes)
    return {r.recipe.name: r for r in rows}


# ---- main ----------------------------------------------------------------------


def positive_int(s):
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}")
    return v


def positive_float(s):
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {s!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {s!r}")
    return v


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 32x32, batch 2, 2 steps, 1 seed, 4 validation scenes (< 30 s)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--seeds", type=positive_int, default=None, help="paired seeds (default 2, quick 1)")
    ap.add_argument("--steps", type=positive_int, default=None,
                    help="steps of the batch-N recipes, even: the 2x recipe takes half (default 24, quick 2)")
    ap.add_argument("--batch", type=positive_int, default=None, help="batch of fp32 and bf16 (default 4, quick 2)")
    ap.add_argument("--size", type=positive_int, default=None,
                    help="scene side in pixels, a multiple of 32 (default 64, quick 32; the issue's 512 on a GPU)")
    ap.add_argument("--val", type=positive_int, default=None, help="validation scenes (default 32, quick 4)")
    ap.add_argument("--lr", type=positive_float, default=3e-3, help="AdamW learning rate at --batch (default 3e-3)")
    ap.add_argument("--lr-2x", type=positive_float, default=None,
                    help="learning rate of the 2x-batch recipe (default --lr * sqrt(2))")
    ap.add_argument("--encoder", default="resnet18", choices=("resnet18", "resnet34"))
    ap.add_argument("--threads", type=positive_int, default=None,
                    help="torch CPU threads while it runs (default 1 on the CPU: on a 2-core machine shared with "
                         "other jobs it is several times faster than 2; try 2 on a quiet one)")
    args = ap.parse_args(argv)
    q = args.quick
    args.seeds = args.seeds or (1 if q else 2)
    args.steps = args.steps or (2 if q else 24)
    args.batch = args.batch or (2 if q else 4)
    args.size = args.size or (32 if q else 64)
    args.val = args.val or (4 if q else 32)
    if args.steps % 2:
        ap.error(f"--steps must be even (the 2x-batch recipe takes half as many), got {args.steps}")
    if args.size % 32:
        ap.error(f"--size must be a multiple of 32 (the Unet downsamples 5 times), got {args.size}")
    if args.threads is None and args.device == "cpu":
        args.threads = 1
    if args.lr_2x is None:
        args.lr_2x = args.lr * math.sqrt(2)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda asked for, but torch sees no CUDA device")
    if args.device == "cuda" and not mixprec.cuda_ops_loaded():
        ap.error("--device cuda asked for, but libmixprec_cuda.so is not loaded (build it with nvcc)")
    return args


def mb(n):
    return f"{n / 2**20:.1f}"


def main(argv=None):
    args = parse_args(argv)
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        return run(args)
    finally:
        torch.set_num_threads(threads)


def run(args):
    device = torch.device(args.device)
    t_start = time.perf_counter()
    print(f"Segmentation: smp Unet({args.encoder}, random init), {len(CLASSES)} classes, {args.size}x{args.size} "
          f"synthetic scenes, {args.seeds} paired seed{'s' if args.seeds > 1 else ''}, device {device}, "
          f"{torch.get_num_threads()} threads")
    print(f"fp32/bf16: batch {args.batch} x {args.steps} steps, lr {args.lr:g}; bf16+act8 2x: batch "
          f"{2 * args.batch} x {args.steps // 2} steps, lr {args.lr_2x:g}; {args.val} validation scenes")
    val = draw_scenes(args.size, range(VAL_SCENES, VAL_SCENES + args.val))
    per_seed = {r: [] for r in RECIPES}
    inits = []
    for seed in range(args.seeds):
        torch.manual_seed(seed)
        init_state = copy.deepcopy(make_model(args.encoder, "cpu").state_dict())
        inits.append(init_state)
        n = args.steps * args.batch
        stream = draw_scenes(args.size, (train_stream_seed(seed, i) for i in range(n)))
        for recipe in RECIPES:
            per_seed[recipe].append(train(recipe, init_state, stream, val, args, device, seed))

    fp32 = per_seed["fp32"]
    rows = []
    for recipe in RECIPES:
        runs = per_seed[recipe]
        diffs = [100 * (r["miou"] - f["miou"]) for r, f in zip(runs, fp32)]
        rows.append({
            "recipe": recipe, "batch": runs[0]["batch"], "steps": runs[0]["steps"], "lr": runs[0]["lr"],
            "miou": sum(r["miou"] for r in runs) / len(runs), "mious": [r["miou"] for r in runs],
            "diff_pp": sum(diffs) / len(diffs), "diffs_pp": diffs,
            "nonfinite": sum(r["nonfinite"] for r in runs),
            "steps_per_s": sum(r["steps_per_s"] for r in runs) / len(runs),
            "samples_per_s": sum(r["samples_per_s"] for r in runs) / len(runs),
            "final_loss": sum(r["final_loss"] for r in runs) / len(runs),
        })
    for r in rows:
        r["within"] = abs(r["diff_pp"]) <= PARITY_PP + 1e-9

    print(f"\n(a) parity: mIoU on {args.val} held-out scenes, mean over {args.seeds} paired seed(s)")
    print(f"| recipe | batch x steps | lr | mIoU | vs fp32 (pp) | per seed vs fp32 (pp) | within {PARITY_PP} pp "
          f"| non-finite losses | steps/s | samples/s | final loss |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        base = r["recipe"] == "fp32"
        per = "-" if base else " ".join(f"{d:+.2f}" for d in r["diffs_pp"])
        within = "-" if base else ("yes" if r["within"] else "NO")
        print(f"| {r['recipe']} | {r['batch']} x {r['steps']} | {r['lr']:.3g} | {100 * r['miou']:.2f}% "
              f"| {'-' if base else format(r['diff_pp'], '+.2f')} | {per} | {within} "
              f"| {r['nonfinite']} | {r['steps_per_s']:.2f} | {r['samples_per_s']:.2f} | {r['final_loss']:.4f} |")
    # What a model that has learned nothing but the class frequencies scores.
    from torchmetrics.classification import MulticlassJaccardIndex

    trivial = float(MulticlassJaccardIndex(num_classes=len(CLASSES), average="macro")(torch.zeros_like(val[1]), val[1]))
    print(f"labelling every pixel background scores {100 * trivial:.2f}% mIoU on these scenes "
          f"({100 * float((val[1] == 0).float().mean()):.1f}% of their pixels are background)")
    f_mious = rows[0]["mious"]
    if len(f_mious) > 1:
        print(f"FP32 alone, seed to seed: {', '.join(f'{100 * m:.2f}' for m in f_mious)} "
              f"(spread {100 * (max(f_mious) - min(f_mious)):.2f} pp)")

    # Memory: one step at each recipe's batch (seed 0's weights), and the planner.
    plan = planner_rows(inits[0], args)
    mem = []
    for r in rows:
        fwd_bwd, step = step_peak(r["recipe"], inits[0], args, device, r["batch"])
        pr = plan[PLANNER[r["recipe"]]]
        mem.append({"recipe": r["recipe"], "batch": r["batch"], "fwd_bwd_peak": fwd_bwd, "step_peak": step,
                    "planner_peak_per_sample": pr.peak_per_sample, "planner_total_16": pr.total,
                    "largest_batch": pr.largest_batch})
    how = ("torch.cuda.max_memory_allocated" if device.type == "cuda"
           else "mixprec.memory.LiveTracker, plus the parameters and AdamW state the step starts from")
    print(f"\n(b) memory of one training step at the recipe's batch, after a first step ({how});\n"
          f"planner (mixprec.memory.plan on the CPU at batches 2 and 4, extrapolated; no optimizer step, state\n"
          f"counted at 16 B/param): peak per sample, total at batch 16 and the largest batch within the bf16\n"
          f"recipe's total at batch 16 ({mb(plan['amp-bf16'].total)} MiB)")
    print("| recipe | batch | fwd+bwd peak MiB | step peak MiB (with AdamW) | planner peak MiB / sample "
          "| planner total MiB at 16 | largest batch |")
    print("|---|---|---|---|---|---|---|")
    for m in mem:
        lb = "-" if m["largest_batch"] is None else m["largest_batch"]
        print(f"| {m['recipe']} | {m['batch']} | {mb(m['fwd_bwd_peak'])} | {mb(m['step_peak'])} "
              f"| {m['planner_peak_per_sample'] / 2**20:.2f} | {mb(m['planner_total_16'])} | {lb} |")
    if device.type == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        print("CPU note: without AVX-512 torch runs BF16 convolutions in its slow reference path, so bf16 is\n"
              "slower than fp32 here; steps/s measure torch's kernels on a shared CPU (noisy), not mixprec.")
    print(f"total time {time.perf_counter() - t_start:.0f} s")
    return {"parity": rows, "memory": mem, "trivial_miou": trivial, "args": vars(args)}


if __name__ == "__main__":
    main()
