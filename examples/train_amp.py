"""The mixed-precision playbook, done for real, with mixprec.

Part 1, training. The same small CNN on scikit-learn's bundled 8x8
handwritten digits (1,797 real images, no download), from the same initial
weights, several ways:

  fp32     plain FP32 model, torch.optim.AdamW (the baseline)
  bf16     model.to(bfloat16): BF16 weights, activations and gradients;
           mixprec.optim.AdamW keeps FP32 master weights and state;
           mixprec.amp.GradScaler; FP32-accumulating cross-entropy read
           straight from the BF16 logits (mixprec.ops.cross_entropy)
  bf16-sr  the same without master weights: mixprec.optim.AdamW(
           master_weights=False) rounds BF16 updates stochastically (4 bytes
           per parameter less)
  fp16     as bf16 in float16, where the dynamic loss scale matters
  bf16-rem       bf16 with param_remainders=True: the FP32 master held as the
                 BF16 param + a 16-bit remainder (exact; 2 bytes per param less)
  bf16-rem-bf16  + BF16 moments (exp_avg_dtype = exp_avg_sq_dtype = bfloat16,
                 stochastically rounded): 10 bytes per param
  bf16-rem-8bit  + 8-bit blockwise moments (torch.uint8): ~8 bytes per param
  bf16-act8      bf16 with the activations saved for backward packed to 8-bit
                 codes (mixprec.memory.compressed_activations around the
                 forward): about half the activation bytes

Every run clips gradients to norm 1 (the mixed-precision runs take the norm
from the scaler's unscale pass: one read of the gradients). Each run is
trained from 5 seeds (each seed its own initial weights and data order,
shared by all runs: a paired comparison), because on a 360-image test set
one image is 0.28 percentage points and FP32 alone moves ~1 pp from seed to
seed: a single run cannot resolve the playbook's 0.5 pp. It prints the test
accuracy averaged over the seeds and its difference to FP32 (target: within
0.5 percentage points), each seed's difference, steps per second, memory
(parameters + gradients + optimizer state, and the activations saved for
backward of one batch), final loss, loss scale and skipped (overflowing)
steps, and writes a PNG of the mean loss curves.

Part 2, detection post-processing. Thousands of synthetic detections with
large coordinates and many classes, in FP16 and BF16. torchvision's
batched_nms offsets coordinates by class id in the boxes' own dtype (in FP16
that overflows to inf, and boxes that should suppress each other survive);
its CPU kernel refuses FP16/BF16 altogether. mixprec.ops.batched_nms computes
IoU in FP32 and never offsets coordinates. Compared with a float64 reference.
Then a batch of detector outputs (8 images x 5000 boxes x 80 classes)
post-processed by one mixprec.ops.efficient_nms call (TensorRT's EfficientNMS:
score filter, top-k, class-aware NMS, fixed-size outputs) beside the
per-image torchvision loop, time and peak memory; and torchvision's Faster
R-CNN (random weights, small images) run end to end in BF16 under
mixprec.ops.patch_torchvision() (torchvision's own CPU kernels refuse BF16),
beside the FP32 model.

Part 3, activation memory. mixprec.memory's planner on the demo CNN (batch
64) and on torchvision's ResNet-50 at 224x224 (not with --quick): bytes per
sample held after the forward and at the peak of forward + backward, the
training state, and the largest batch within what torch's AMP BF16 recipe
needs at batch 16 (64 for the demo CNN), per recipe: AMP BF16, + 8-bit or
4-bit activations, + mixprec's lean optimizer state.

Usage: python examples/train_amp.py [--epochs N] [--seeds N] [--quick] [--device cpu|cuda]
           [--runs fp32,bf16,bf16-sr,fp16] [--plot PATH] [--boxes N]
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
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import mixprec  # noqa: E402
import mixprec.memory  # noqa: E402

RUNS = ("fp32", "bf16", "bf16-sr", "fp16", "bf16-rem", "bf16-rem-bf16", "bf16-rem-8bit", "bf16-act8",
        "bf16-act8-1.5x")
DTYPES = {"fp32": None, "bf16": torch.bfloat16, "bf16-sr": torch.bfloat16, "fp16": torch.float16,
          "bf16-rem": torch.bfloat16, "bf16-rem-bf16": torch.bfloat16, "bf16-rem-8bit": torch.bfloat16,
          "bf16-act8": torch.bfloat16, "bf16-act8-1.5x": torch.bfloat16}
# The runs whose forward packs its saved activations (bits of the codes).
ACT_BITS = {"bf16-act8": 8, "bf16-act8-1.5x": 8}
# The playbook's project 1, "within 0.2% of FP32 with the batch 1.5x": what
# the memory freed by 8-bit activations and the lean state buys. The batch
# is 1.5x, the epochs the same (2/3 of the steps), AdamW's lr x sqrt(1.5).
BATCH_MULT = {"bf16-act8-1.5x": 1.5}
# The lean optimizer-state modes (mixprec.optim.AdamW keywords).
LEAN = {
    "bf16-sr": dict(master_weights=False),
    "bf16-rem": dict(param_remainders=True),
    "bf16-rem-bf16": dict(param_remainders=True, exp_avg_dtype=torch.bfloat16, exp_avg_sq_dtype=torch.bfloat16),
    "bf16-rem-8bit": dict(param_remainders=True, exp_avg_dtype=torch.uint8, exp_avg_sq_dtype=torch.uint8),
    "bf16-act8-1.5x": dict(param_remainders=True, exp_avg_dtype=torch.uint8, exp_avg_sq_dtype=torch.uint8),
}


def load_digits(device):
    from sklearn.datasets import load_digits as _load

    d = _load()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target, dtype=torch.int64)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[perm], y[perm]
    split = int(0.8 * len(x))
    mean, std = x[:split].mean(), x[:split].std()
    x = (x - mean) / std
    return (x[:split].to(device), y[:split].to(device)), (x[split:].to(device), y[split:].to(device))


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(1, 16, 3, padding=1)
        self.c2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = torch.nn.Linear(32 * 4 * 4, 64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.c1(x))
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class Progress:
    """A progress bar per run (tqdm) on a terminal; a few plain lines
    otherwise (logs, CI), where a redrawn bar is noise."""

    def __init__(self, name, total):
        self.name, self.total = name, total
        self.t0 = time.perf_counter()
        self.done, self.last_quarter, self.bar = 0, -1, None
        if sys.stdout.isatty():
            from tqdm import tqdm  # scripts/requirements.txt; only needed on a terminal

            self.bar = tqdm(total=total, desc=f"  {name:<16} ", unit="step", file=sys.stdout,
                            dynamic_ncols=True, leave=True,
                            bar_format="{desc}{percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]")

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
        print(f"  {self.name:<11}{100 * done // self.total:3d}%  step {done}/{self.total}  loss {loss:.4f}"
              f"  {time.perf_counter() - self.t0:5.1f}s", flush=True)


def tensor_bytes(tensors):
    seen, total = set(), 0
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.data_ptr() not in seen and t.numel() > 0:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def state_bytes(model, opt):
    """Parameters + gradients + every tensor of the optimizer state (master
    weights included): the memory the training state holds between steps.
    One-element tensors (step counts) are left out."""
    ts = list(model.parameters()) + [p.grad for p in model.parameters() if p.grad is not None]
    for st in opt.state.values():
        ts += [v for v in st.values() if isinstance(v, torch.Tensor) and v.numel() > 1]
    return tensor_bytes(ts)


def activation_bytes(model, x, loss_fn):
    """Bytes of the tensors autograd saves for backward in one training
    forward pass (the activation memory), counted with saved_tensors_hooks."""
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn(model(x))
    params = {p.data_ptr() for p in model.parameters()}
    n = tensor_bytes([t for t in saved if t.data_ptr() not in params])
    del loss
    return n


def train(mode, init_state, data, epochs, device, seed=0, batch=64, clip=1.0, lr=2e-3):
    (xtr, ytr), (xte, yte) = data
    mult = BATCH_MULT.get(mode, 1.0)
    batch, lr = round(batch * mult), lr * math.sqrt(mult)
    torch.manual_seed(1 + seed)
    amp_dtype = DTYPES[mode]
    model = SmallCNN().to(device)
    model.load_state_dict(init_state)
    if amp_dtype is None:
        opt = torch.optim.AdamW(model.parameters(), lr=lr)

        def loss_fn(logits, y=None):
            return F.cross_entropy(logits, y)
    else:
        model = model.to(amp_dtype)  # FP32 masters (if any) live in the optimizer
        opt = mixprec.optim.AdamW(model.parameters(), lr=lr, seed=0, **LEAN.get(mode, {}))

        def loss_fn(logits, y=None):
            # FP32 math from the half logits, no FP32 copy of them.
            return mixprec.ops.cross_entropy(logits, y)

    # named_parameters: overflow diagnostics and a health record (scale, skips,
    # grad norms) from the unscale pass itself.
    scaler = mixprec.amp.GradScaler(device.type, enabled=amp_dtype is not None,
                                    named_parameters=model.named_parameters() if amp_dtype is not None else None)
    fp32_norms = []
    bits = ACT_BITS.get(mode)

    def act_ctx(step):
        if bits is None:
            return contextlib.nullcontext()
        # A seed per run and step: each step rounds with new bits, and the run is reproducible.
        return mixprec.memory.compressed_activations(bits=bits, seed=seed * 2**32 + step)

    n_batches = (len(xtr) + batch - 1) // batch
    bar = Progress(f"{mode} s{seed}", epochs * n_batches)
    steps, losses = 0, []
    gen = torch.Generator().manual_seed(2 + 1000 * seed)
    t0 = time.perf_counter()
    for _ in range(epochs):
        perm = torch.randperm(len(xtr), generator=gen).to(device)
        for i in range(0, len(xtr), batch):
            idx = perm[i : i + batch]
            opt.zero_grad(set_to_none=True)
            with act_ctx(steps):
                logits = model(xtr[idx].to(amp_dtype or torch.float32))
                loss = loss_fn(logits, ytr[idx])
            scaler.scale(loss).backward()
            if amp_dtype is not None:
                scaler.clip_grad_norm_(opt, clip)  # norm from the unscale pass
            else:
                fp32_norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
            scaler.step(opt)
            scaler.update()
            losses.append(loss.detach().float())
            steps += 1
            if steps % 5 == 0 or steps == epochs * n_batches:
                bar.update(steps, float(losses[-1]))
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    # Steps with a non-finite loss or gradient, over the whole run (the
    # playbook's "no NaNs/Infs"): a skipped step is one whose gradients
    # overflowed; FP32's norms come from clip_grad_norm_.
    finite = torch.isfinite(torch.stack(losses)).cpu().tolist()
    if amp_dtype is not None:
        grads_bad = scaler.health().skipped
    else:
        grads_bad = [not f for f in torch.isfinite(torch.stack(fp32_norms)).cpu().tolist()]
    nonfinite = sum(1 for ok, bad in zip(finite, grads_bad) if not ok or bad)
    mem_state = state_bytes(model, opt)
    xb = xtr[:batch].to(amp_dtype or torch.float32)
    if bits is None:
        mem_act = activation_bytes(model, xb, lambda out: loss_fn(out, ytr[:batch]))
    else:
        with act_ctx(steps) as ctx:
            loss_fn(model(xb), ytr[:batch])
        mem_act = ctx.stats["packed_nbytes"] + ctx.stats["kept_bytes"]
    model.eval()
    with torch.no_grad():
        acc = (model(xte.to(amp_dtype or torch.float32)).argmax(1) == yte).float().mean().item()
    return {
        "mode": mode,
        "batch": batch,
        "nonfinite": nonfinite,
        "acc": acc,
        "steps_per_s": steps / elapsed,
        "losses": torch.stack(losses).cpu().tolist(),
        "final_loss": float(torch.stack(losses[-10:]).mean()),
        "scale": scaler.get_scale() if amp_dtype is not None else None,
        "skipped": scaler.get_skipped_steps() if amp_dtype is not None else 0,
        "health": scaler.health() if amp_dtype is not None else None,
        "grad_norms": scaler.health().grad_norm if amp_dtype is not None else torch.stack(fp32_norms).tolist(),
        "state_mb": mem_state / 2**20,
        "act_mb": mem_act / 2**20,
        "n_params": sum(p.numel() for p in model.parameters()),
    }


def aggregate(seeds, fp32_seeds):
    """One row of the table from a run's seeds: accuracy, loss curve, final
    loss and steps/s averaged over the seeds; the per-seed accuracy
    differences to FP32's run of the same seed; memory of the first seed
    (the same for all); the last seed's loss scale; skipped steps summed."""
    n = len(seeds)
    r = dict(seeds[0])
    r["accs"] = [x["acc"] for x in seeds]
    r["acc"] = sum(r["accs"]) / n
    r["acc_diffs"] = [x["acc"] - f["acc"] for x, f in zip(seeds, fp32_seeds)]
    r["losses"] = [sum(c) / n for c in zip(*(x["losses"] for x in seeds))]
    r["final_loss"] = sum(x["final_loss"] for x in seeds) / n
    r["steps_per_s"] = sum(x["steps_per_s"] for x in seeds) / n
    r["scale"] = seeds[-1]["scale"]
    r["skipped"] = sum(x["skipped"] for x in seeds)
    r["nonfinite"] = sum(x["nonfinite"] for x in seeds)
    # scale, grad-norm and health curves: the first seed's (r = seeds[0])
    return r


def write_plot(results, path, n_train):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax_scale, ax_norm) = plt.subplots(1, 3, figsize=(16, 4.2), dpi=100)
    def per_epoch(r):  # steps per epoch of a run (its own batch)
        return (n_train + r["batch"] - 1) // r["batch"]

    k = max(1, per_epoch(results[0]) // 4)
    for r in results:
        steps_per_epoch = per_epoch(r)
        ls = torch.tensor(r["losses"])
        smooth = torch.nn.functional.avg_pool1d(ls[None, None], k, stride=1).flatten() if len(ls) >= k else ls
        x = torch.arange(len(smooth)) + (k - 1)
        ax.plot((x / steps_per_epoch).tolist(), smooth.tolist(), label=f"{r['mode']} ({100 * r['acc']:.2f}%)", lw=1.4)
    ax.set_yscale("log")
    ax.set_xlabel("epoch")
    n_seeds = len(results[0].get("accs", [0]))
    seeds = f"mean of {n_seeds} seeds, " if n_seeds > 1 else ""
    ax.set_ylabel(f"training loss ({seeds}moving average of {k} steps)", fontsize=8)
    ax.set_title("Digits CNN: FP32 vs mixed precision with mixprec")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    # Beside it, from GradScaler.health() (first seed): the loss scale (skipped
    # steps marked) and the global gradient norm before clipping.
    for i, r in enumerate(results):
        color = f"C{i}"
        x = (torch.arange(len(r["grad_norms"])) / per_epoch(r)).tolist()
        ax_norm.plot(x, r["grad_norms"], color=color, lw=0.8, alpha=0.8, label=r["mode"])
        h = r.get("health")
        if h is not None and h.steps:
            ax_scale.step(x[: h.steps], h.scale, where="post", color=color, lw=1.2, label=r["mode"])
            skipped = [(xi, s) for xi, s, sk in zip(x, h.scale, h.skipped) if sk]
            if skipped:
                ax_scale.plot(*zip(*skipped), "x", color=color, ms=5)
    ax_scale.set_yscale("log", base=2)
    ax_scale.set_xlabel("epoch")
    ax_scale.set_ylabel("loss scale (x = skipped step)", fontsize=8)
    ax_scale.set_title("GradScaler: loss scale")
    ax_scale.grid(True, which="both", alpha=0.3)
    if ax_scale.has_data():
        ax_scale.legend()
    ax_norm.set_yscale("log")
    ax_norm.set_xlabel("epoch")
    ax_norm.set_ylabel("global grad norm before clipping", fontsize=8)
    ax_norm.set_title("gradient norm (from the unscale pass)")
    ax_norm.grid(True, which="both", alpha=0.3)
    ax_norm.legend()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path.resolve()


# ---------------------------------------------------------------- detection --


def synthetic_detections(n, n_classes, gen, coord=60000.0):
    """Clusters of overlapping boxes (several detections of each object)
    with large coordinates, scores in (0, 1), class ids in [0, n_classes)."""
    n_obj = max(1, n // 8)
    centre = torch.rand(n_obj, 2, generator=gen) * coord * 0.9 + coord * 0.05
    size = torch.rand(n_obj, 2, generator=gen) * 300 + 40
    obj = torch.randint(0, n_obj, (n,), generator=gen)
    jitter = torch.randn(n, 4, generator=gen) * 0.08
    c, s = centre[obj], size[obj]
    x1y1 = c - s / 2 + jitter[:, :2] * s
    x2y2 = c + s / 2 + jitter[:, 2:] * s
    boxes = torch.cat([x1y1, x2y2], 1).double()
    scores = torch.rand(n, generator=gen).double()
    # Same object -> mostly the same class, with some confusion.
    labels = torch.where(torch.rand(n, generator=gen) < 0.8, obj % n_classes, torch.randint(0, n_classes, (n,), generator=gen))
    return boxes, scores, labels


def greedy_nms_reference(boxes, scores, labels, iou_threshold, offset_dtype=None):
    """Greedy class-aware NMS in plain torch, float64 unless told otherwise.
    offset_dtype: torchvision's batched_nms trick (coordinates shifted by
    class id * (max coordinate + 1)) in that dtype, IoU in that dtype too:
    what an FP16 detection head's post-processing computes with
    torchvision's algorithm."""
    if offset_dtype is not None:
        b = boxes.to(offset_dtype)
        offsets = labels.to(offset_dtype) * (b.max() + 1)
        b = b + offsets[:, None]
        same_class = torch.ones(len(b), len(b), dtype=torch.bool)
    else:
        b = boxes
        same_class = labels[:, None] == labels[None, :]
    order = torch.sort(scores, descending=True, stable=True).indices
    b, same_class = b[order], same_class[order][:, order]
    area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    lt = torch.maximum(b[:, None, :2], b[None, :, :2])
    rb = torch.minimum(b[:, None, 2:], b[None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    iou = inter / (area[:, None] + area[None, :] - inter)
    over = ((iou > iou_threshold) & same_class).numpy()
    removed = over[0] & False
    keep = []
    for i in range(len(b)):
        if removed[i]:
            continue
        keep.append(i)
        removed |= over[i]
    return order[torch.tensor(keep, dtype=torch.long)]


def median_time(fn, reps=5):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[reps // 2]


def detection_demo(n_boxes, n_classes, iou=0.5, seed=3):
    gen = torch.Generator().manual_seed(seed)
    boxes64, scores64, labels = synthetic_detections(n_boxes, n_classes, gen)
    print(f"\nDetection post-processing: {n_boxes} boxes, {n_classes} classes, coordinates up to "
          f"{float(boxes64.max()):.0f}, IoU threshold {iou}")
    try:
        import torchvision
    except Exception:  # torchvision does not import beside every torch build
        torchvision = None
    rows = []
    for name, dt in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        b = boxes64.to(dt)
        s = scores64.to(dt)
        # The float64 reference on the boxes as the detector emitted them.
        ref = greedy_nms_reference(b.double(), s.double(), labels, iou)
        ref_set = set(ref.tolist())
        ours = mixprec.ops.batched_nms(b, s, labels, iou)
        t_ours = median_time(lambda: mixprec.ops.batched_nms(b, s, labels, iou))
        tv_style = greedy_nms_reference(b.float(), s.float(), labels, iou, offset_dtype=dt)
        for label, keep, t in (("torchvision-style", tv_style, None), ("mixprec", ours, t_ours)):
            ks = set(keep.tolist())
            rows.append((name, label, len(ks), len(ks - ref_set), len(ref_set - ks), t, len(ref)))
    if torchvision is not None:
        b32, s32 = boxes64.float(), scores64.float()
        same = torch.equal(torchvision.ops.batched_nms(b32, s32, labels, iou), mixprec.ops.batched_nms(b32, s32, labels, iou))
        tv_t = median_time(lambda: torchvision.ops.batched_nms(b32, s32, labels, iou))
        mp_t = median_time(lambda: mixprec.ops.batched_nms(b32, s32, labels, iou))
    print(f"{'dtype':<6}{'method':<19}{'kept':>6}{'wrong kept':>12}{'missed':>8}{'time ms':>9}   (float64 reference keeps)")
    for name, label, kept, extra, missed, t, n_ref in rows:
        tm = "-" if t is None else f"{1e3 * t:.2f}"
        print(f"{name:<6}{label:<19}{kept:>6}{extra:>12}{missed:>8}{tm:>9}   ({n_ref})")
    if torchvision is not None:
        print(f"fp32: torchvision.ops.batched_nms {1e3 * tv_t:.2f} ms, mixprec {1e3 * mp_t:.2f} ms "
              f"({tv_t / mp_t:.1f}x), same indices: {same}")
    else:
        print("(torchvision is not importable here: no FP32 timing against it)")
    print("torchvision-style = torchvision's batched_nms algorithm (class offset, IoU) in the boxes' dtype,\n"
          "run in torch ops: torchvision's own CPU kernel refuses FP16/BF16 boxes.")
    return rows


def peak_memory(fn, device):
    """(extra peak memory of fn() in bytes, fn's result): on CUDA torch's
    allocator peak; on the CPU the growth of the process's peak resident set
    (VmHWM, reset through /proc/self/clear_refs after returning freed heap to
    the OS), so C scratch counts as well as tensors."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        out = fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base, out
    import ctypes

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1]) * 1024
        return 0

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None, fn()
    base = status("VmRSS:")
    out = fn()
    return status("VmHWM:") - base, out


def timed(fn, device, reps):
    ts, out = [], None
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[reps // 2], out


def mb(nbytes):
    return "-" if nbytes is None else f"{nbytes / 2**20:.1f}"


def batched_detection_demo(device, batch, n_boxes, n_classes=80, seed=5):
    """A batch of detector outputs post-processed in one mixprec call vs the
    per-image torchvision loop (score filter, top-k, batched_nms)."""
    gen = torch.Generator().manual_seed(seed)
    k = n_boxes // 50
    centres = torch.rand(batch, k, 2, generator=gen) * 1000
    pick = torch.randint(0, k, (batch, n_boxes), generator=gen)
    xy = torch.gather(centres, 1, pick[..., None].expand(batch, n_boxes, 2)) + torch.randn(batch, n_boxes, 2, generator=gen) * 8
    wh = 40 + torch.rand(batch, n_boxes, 2, generator=gen) * 40
    boxes = torch.cat([xy - wh / 2, xy + wh / 2], -1).to(device)
    scores = torch.sigmoid(torch.randn(batch, n_boxes, n_classes, generator=gen) * 1.5 - 5.0).to(device)
    thr, top_k, iou, k_out = 0.05, 1000, 0.5, 100
    print(f"\nBatched post-processing: {batch} images x {n_boxes} boxes x {n_classes} classes, score > {thr}, "
          f"top-{top_k}, IoU {iou}, {k_out} detections per image")
    try:
        import torchvision
    except Exception:
        torchvision = None

    def loop(nms_fn, b, s):
        out = []
        for i in range(batch):
            flat = s[i].flatten()
            cand = (flat > thr).nonzero().squeeze(1)
            sc, order = flat[cand].topk(min(top_k, cand.numel()))
            cand = cand[order]
            keep = nms_fn(b[i][cand // n_classes], sc, cand % n_classes, iou)[:k_out]
            out.append(cand[keep])
        return out

    def ours(b, s):
        return mixprec.ops.efficient_nms(b, s, iou_threshold=iou, score_threshold=thr, max_detections=k_out,
                                         pre_nms_top_k=top_k)

    rows = []
    b16, s16 = boxes.bfloat16(), scores.bfloat16()
    if torchvision is not None:
        fn = lambda: loop(torchvision.ops.batched_nms, boxes, scores)  # noqa: E731
        mem, ref = peak_memory(fn, device)
        t, _ = timed(fn, device, 3)
        rows.append(("torchvision, per-image loop", "fp32", t, mem))
    for name, b, s in (("fp32", boxes, scores), ("bf16", b16, s16)):
        fn = lambda b=b, s=s: ours(b, s)  # noqa: E731
        mem, det = peak_memory(fn, device)
        t, _ = timed(fn, device, 3)
        rows.append(("mixprec.ops.efficient_nms", name, t, mem))
        if name == "fp32":
            det32 = det
    print(f"{'method':<30}{'dtype':<7}{'time ms':>9}{'peak MB':>9}")
    for m, d, t, mem in rows:
        print(f"{m:<30}{d:<7}{1e3 * t:>9.2f}{mb(mem):>9}")
    same = None
    if torchvision is not None:
        flat_idx = det32.indices * n_classes + det32.classes
        same = all(torch.equal(flat_idx[i, : int(det32.counts[i])].cpu(), ref[i].cpu()) for i in range(batch))
        print(f"one call for the batch: {rows[0][2] / rows[1][2]:.1f}x the loop's speed; same detections as the "
              f"loop: {same}")
    else:
        print("(torchvision is not importable here: no per-image loop to compare with)")
    return {"rows": rows, "same": same, "counts": det32.counts.tolist()}


def bf16_detector_demo(device, size):
    """torchvision's Faster R-CNN (random weights) in BF16 end to end: its
    CPU NMS and RoIAlign kernels refuse BF16; with
    mixprec.ops.patch_torchvision() (FP32-safe NMS and RoIAlign) the forward
    pass runs, beside the FP32 model in plain torchvision."""
    try:
        from torchvision.models.detection import fasterrcnn_resnet50_fpn
    except Exception:
        print("\n(torchvision is not importable here: no detector forward pass)")
        return None
    torch.manual_seed(0)
    model = fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=91, min_size=size,
                                    max_size=size, rpn_pre_nms_top_n_test=300, rpn_post_nms_top_n_test=100)
    model = model.eval().to(device)
    images = [torch.rand(3, size, size, generator=torch.Generator().manual_seed(i)).to(device) for i in range(2)]
    print(f"\nFaster R-CNN (ResNet-50 FPN, random weights) forward on 2 images of {size}x{size}, device {device}")
    def once(fn):  # one call each: a forward pass takes seconds on a CPU
        t0 = time.perf_counter()
        mem, out = peak_memory(fn, device)
        return time.perf_counter() - t0, mem, out

    rows = []
    with torch.no_grad():
        model_bf16 = copy.deepcopy(model).to(torch.bfloat16)
        images_bf16 = [im.bfloat16() for im in images]
        plain_error = None
        try:
            model_bf16(images_bf16)
        except Exception as e:  # torchvision's kernels refuse BF16 (on the CPU)
            plain_error = str(e).strip().splitlines()[-1].split(", ")[-1][:120]
        rows.append(("fp32", "torchvision", *once(lambda: model(images))))
        with mixprec.ops.patch_torchvision():
            rows.append(("bf16", "torchvision + mixprec patch", *once(lambda: model_bf16(images_bf16))))
    print(f"{'dtype':<6}{'ops':<29}{'time s':>8}{'peak MB':>9}  detections per image (dtype)")
    for d, ops, t, mem, out in rows:
        dets = ", ".join(f"{len(o['boxes'])}" for o in out)
        print(f"{d:<6}{ops:<29}{t:>8.2f}{mb(mem):>9}  {dets} ({out[0]['boxes'].dtype})")
    print("bf16 without the patch: " + (f"fails: {plain_error}" if plain_error else "runs"))
    return {"rows": [r[:4] for r in rows], "plain_bf16_error": plain_error,
            "detections": [len(o["boxes"]) for o in rows[-1][4]]}


def forward_overflow_demo(device, png, steps=12):
    """Part 1b: an FP16 forward that overflows (attention logits near 1e5,
    finite in FP32 only), trained with plain AMP (GradScaler only) and with
    mixprec.guard's FP32 fallback, each against FP32 from the same weights on
    the same batches (mixprec.parity)."""
    import mixprec.parity

    class Attn(torch.nn.Module):
        def __init__(self, d=32):
            super().__init__()
            self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)

        def forward(self, x):
            q, k, v = self.qkv(x).chunk(3, -1)
            return self.proj(((q @ k.transpose(-2, -1)) / 32**0.5).softmax(-1) @ v)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.norm, self.attn = torch.nn.Linear(64, 32), torch.nn.LayerNorm(32), Attn()
            self.head = torch.nn.Linear(32, 10)

        def forward(self, x):  # x: (batch, 8 tokens, 64)
            h = self.embed(x)
            return self.head((h + self.attn(self.norm(h))).mean(1))

    def make():
        torch.manual_seed(0)
        m = Net()
        with torch.no_grad():
            m.attn.qkv.weight[:64].mul_(300.0)  # large q, k: logits ~1e5
        return m

    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(16, 8, 64, generator=g), torch.randint(0, 10, (16,), generator=g)) for _ in range(steps)]
    out = {}
    for guard in (False, True):
        r = mixprec.parity.parity(make, batches, recipe="fp16", guard=guard, device=device,
                                  png=png if guard else None)
        print(f"\nForward overflow, {'with mixprec.guard (fallback on)' if guard else 'plain AMP (GradScaler only)'}:\n{r}")
        out["guard" if guard else "plain"] = r
    return out


def activation_memory_demo(quick):
    """Part 3: the memory planner's table for the demo CNN and ResNet-50."""
    names = ("amp-bf16", "amp-bf16 + 8-bit act", "amp-bf16 + 4-bit act", "amp-bf16 + 8-bit act + lean state")
    recipes = [r for r in mixprec.memory.RECIPES if r.name in names]
    print("\nPart 3: activation memory (mixprec.memory.plan: bytes per sample held after the forward and at the\n"
          "peak of forward + backward, measured on the CPU at two batches and extrapolated; state = params + grads\n"
          "+ optimizer state; largest batch within what torch's AMP BF16 recipe needs at the reference batch)")
    torch.manual_seed(0)
    out = {}
    rows = mixprec.memory.plan(SmallCNN(), (1, 8, 8), batches=(64, 128), batch=64, recipes=recipes)
    print("demo CNN, 8x8 digits, reference batch 64:")
    print(mixprec.memory.format_plan(rows))
    out["cnn"] = rows
    if not quick:
        try:
            import torchvision
        except ImportError:
            print("ResNet-50: torchvision is not installed, skipped")
            return out
        torch.manual_seed(0)
        rows = mixprec.memory.plan(torchvision.models.resnet50(weights=None), (3, 224, 224), batches=(1, 2),
                                   batch=16, recipes=recipes)
        print("torchvision ResNet-50, 224x224, reference batch 16:")
        print(mixprec.memory.format_plan(rows))
        out["resnet50"] = rows
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="2 epochs, 1 seed, fewer boxes (smoke test)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated subset of {','.join(RUNS)}")
    ap.add_argument("--plot", default="mixprec_demo_loss.png", help="where to write the loss-curve PNG")
    ap.add_argument("--boxes", type=int, default=None, help="detections in part 2 (default 3000, quick 1000)")
    ap.add_argument("--classes", type=int, default=80)
    ap.add_argument("--seeds", type=int, default=None,
                    help="training seeds per run, accuracy averaged over them (default 5, quick 1)")
    ap.add_argument("--no-resnet50", action="store_true", help="part 3 without ResNet-50 (a few CPU minutes)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("train_amp: --device cuda asked for, but torch sees no CUDA device")
    if device.type == "cuda" and not mixprec.cuda_ops_loaded():
        sys.exit("train_amp: --device cuda asked for, but libmixprec_cuda.so is not loaded (build it with nvcc)")
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    bad = [r for r in runs if r not in RUNS]
    if bad or not runs or runs[0] != "fp32":
        sys.exit(f"train_amp: --runs must start with fp32 and name runs from {RUNS}, got {args.runs!r}")
    epochs = 2 if args.quick else args.epochs
    n_seeds = args.seeds if args.seeds is not None else (1 if args.quick else 5)
    if n_seeds < 1:
        sys.exit("train_amp: --seeds must be at least 1")
    data = load_digits(device)
    print(f"Part 1: digits, {len(data[0][0])} train / {len(data[1][0])} test images, {epochs} epochs, "
          f"{n_seeds} seed{'s' if n_seeds > 1 else ''} per run, device {device}")
    per_seed = {mode: [] for mode in runs}
    for seed in range(n_seeds):
        # Seed k: its own initial weights and data order, the same for every run.
        torch.manual_seed(seed)
        init_state = SmallCNN().state_dict()
        for mode in runs:
            per_seed[mode].append(train(mode, init_state, data, epochs, device, seed=seed))
    results = [aggregate(per_seed[mode], per_seed[runs[0]]) for mode in runs]
    base = results[0]["acc"]
    print()
    print(f"{'run':<15}{'batch':>6}{'accuracy':>9}{'vs fp32':>10}{'per seed vs fp32 (pp)':>33}{'steps/s':>9}"
          f"{'state MB':>10}{'activ. MB':>10}{'loss':>8}{'scale':>8}{'skipped':>8}{'non-fin.':>9}")
    for r in results:
        scale = "-" if r["scale"] is None else f"{r['scale']:.0f}"
        diffs = " ".join(f"{100 * d:+.2f}" for d in r["acc_diffs"]) if r is not results[0] else "-"
        print(
            f"{r['mode']:<15}{r['batch']:>6}{100 * r['acc']:>8.2f}%{100 * (r['acc'] - base):>+8.2f}pp{diffs:>33}"
            f"{r['steps_per_s']:>9.1f}{r['state_mb']:>10.2f}{r['act_mb']:>10.2f}{r['final_loss']:>8.4f}{scale:>8}"
            f"{r['skipped']:>8}{r['nonfinite']:>9}"
        )
    one_image = 100 / len(data[1][0])
    fp32_accs = results[0]["accs"]
    if n_seeds > 1:
        print(f"accuracy = mean over {n_seeds} seeds (each seed: its own initial weights and data order, shared by "
              f"all runs);\nFP32 alone varies {100 * (max(fp32_accs) - min(fp32_accs)):.2f} pp from seed to seed "
              f"({', '.join(f'{100 * a:.2f}' for a in fp32_accs)}); one test image is {one_image:.2f} pp.")
    recipe = [r for r in results[1:] if r["mode"] in ("bf16", "fp16")]
    parity_pp = None
    if recipe:
        worst = max(abs(r["acc"] - base) for r in recipe)
        parity_pp = 100 * worst
        print(f"parity of the playbook's runs ({', '.join(r['mode'] for r in recipe)}, FP32 master weights): "
              f"largest |mean accuracy - FP32's| {100 * worst:.2f} pp, target 0.5 pp: "
              f"{'met' if worst <= 0.005 + 1e-9 else 'NOT met'}")
    for r in results[1:]:
        if r["mode"] in LEAN and r["mode"] not in BATCH_MULT:
            print(f"{r['mode']} (lean optimizer state): {100 * (r['acc'] - base):+.2f} pp vs FP32 "
                  f"with {100 * (1 - r['state_mb'] / results[0]['state_mb']):.0f}% less training-state memory")
    for r in results[1:]:
        if r["mode"] in BATCH_MULT:
            worst = max(abs(d) for d in r["acc_diffs"])
            print(f"{r['mode']} (batch {r['batch']}: 8-bit activations + lean state, the same epochs, lr x "
                  f"sqrt({BATCH_MULT[r['mode']]:g})): {100 * (r['acc'] - base):+.2f} pp vs FP32 (the playbook's "
                  f"target 0.2 pp: {'met' if abs(r['acc'] - base) <= 0.002 + 1e-9 else 'NOT met'}; worst seed "
                  f"{100 * worst:.2f} pp)")
    print("state MB = parameters + gradients + optimizer state (FP32 masters included); activ. MB = tensors\n"
          "saved for backward by one batch. Loss scale starts at 65536; skipped = overflowing steps; non-fin. =\n"
          "steps with a non-finite loss or gradient, all steps of all seeds.")
    for r in results:
        if r["mode"] == "fp16" and r["health"] is not None:
            print(f"fp16 (seed 0), GradScaler(named_parameters=...).health():\n{r['health']}")
    if device.type == "cpu":
        print("On a CPU without native BF16/FP16 arithmetic torch's half-precision convolutions are slower\n"
              "than FP32: steps/s here measure torch's kernels, not mixprec's. Speed-ups show on GPUs.")
    plot = write_plot(results, args.plot, len(data[0][0]))
    print(f"loss curves: {plot}")
    overflow = forward_overflow_demo(device, str(Path(plot).with_name(Path(plot).stem + "_overflow.png")))
    n_boxes = args.boxes or (1000 if args.quick else 3000)
    det = detection_demo(n_boxes, args.classes)
    batched = batched_detection_demo(device, 4 if args.quick else 8, 2000 if args.quick else 5000, args.classes)
    detector = bf16_detector_demo(device, 128 if args.quick else 160)
    memory = activation_memory_demo(args.quick or args.no_resnet50)
    return {"train": results, "plot": str(plot), "detection": det, "parity_pp": parity_pp,
            "detection_batched": batched, "detector": detector, "overflow": overflow, "memory": memory}


if __name__ == "__main__":
    main()
