"""Benchmark: compressed activations on a device (CUDA; the CPU for a smoke
test): what one training step holds at its peak and how long it takes, for
a ResNet-50 at batch 16, 224x224, BF16 autocast + torch.optim.AdamW:

  amp-bf16         the user's step without mixprec (the baseline)
  + 8-bit act      with mixprec.memory.compressed_activations(bits=8)
  + 4-bit act      with compressed_activations(bits=4)
  + checkpoint     torch.utils.checkpoint of every residual block (what a user
                   would pick instead to save activation memory)

Peaks = torch.cuda.max_memory_allocated() over the forward + backward and
over the whole step (the optimizer's temporaries included), minus what was
allocated before it (parameters and AdamW state from a first step); on the
CPU, mixprec.memory.LiveTracker's peaks of the same. The largest batch
within the baseline's step peak at batch 16 is extrapolated from the
forward + backward peaks at two batches (the slope per sample). Step time: median of --reps interleaved rounds, the device
synchronised. Then pack / unpack of a 256 MB BF16 tensor against a copy of
the same bytes (the device's measured bandwidth).

The ResNet-50 is built here (the same layers as torchvision's resnet50, no
weights): the GPU machine has torch but no torchvision. torchvision's own
is used when it imports.

Usage: python bench/bench_memory_device.py [--device cuda|cpu] [--quick] [--reps N] [--out FILE]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import mixprec  # noqa: E402
import mixprec.memory as mm  # noqa: E402
from mixprec import _act_pack  # noqa: E402
from _common import Table, device_of, machine, parser, sync, utc_now  # noqa: E402


# ---- a ResNet-50 without torchvision --------------------------------------------


class _Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, width, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, width * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(width * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        idt = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + idt)


class _ResNet50(nn.Module):
    def __init__(self, classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin, layers = 64, []
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            down = nn.Sequential(nn.Conv2d(cin, width * 4, 1, stride, bias=False), nn.BatchNorm2d(width * 4))
            seq = [_Bottleneck(cin, width, stride, down)]
            cin = width * 4
            seq += [_Bottleneck(cin, width) for _ in range(blocks - 1)]
            layers.append(nn.Sequential(*seq))
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.fc = nn.Linear(2048, classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def resnet50() -> tuple[nn.Module, str]:
    try:
        import torchvision

        return torchvision.models.resnet50(weights=None), "torchvision resnet50"
    except Exception:  # noqa: BLE001 - no torchvision on the GPU machine
        return _ResNet50(), "ResNet-50 built by this script (torchvision's layers)"


# ---- one training step ---------------------------------------------------------------


RECIPES = ("amp-bf16", "+ 8-bit act", "+ 4-bit act", "+ checkpoint")


def _fwd_bwd(model, opt, x, y, recipe):
    opt.zero_grad(set_to_none=True)
    ac = torch.autocast(x.device.type, dtype=torch.bfloat16)
    ca = {"+ 8-bit act": lambda: mm.compressed_activations(bits=8),
          "+ 4-bit act": lambda: mm.compressed_activations(bits=4)}.get(recipe)
    ck = mm.checkpoint_blocks(model) if recipe == "+ checkpoint" else None
    with ac:
        if ck is not None:
            with ck:
                out = model(x)
        elif ca is not None:
            with ca():
                out = model(x)
        else:
            out = model(x)
        loss = F.cross_entropy(out.float(), y)
    loss.backward()


def _step(model, opt, x, y, recipe):
    _fwd_bwd(model, opt, x, y, recipe)
    opt.step()


def _peak(model, opt, x, y, recipe) -> tuple[int, int]:
    """(forward + backward, whole step) bytes at their peaks over what the
    step starts from (parameters and AdamW state)."""
    dev = x.device
    if dev.type == "cuda":
        sync(dev)
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        _fwd_bwd(model, opt, x, y, recipe)
        sync(dev)
        fb = torch.cuda.max_memory_allocated(dev) - base
        opt.step()
        sync(dev)
        return fb, torch.cuda.max_memory_allocated(dev) - base
    with mm.LiveTracker() as tr:
        _fwd_bwd(model, opt, x, y, recipe)
        fb = tr.peak
        opt.step()
    return fb, tr.peak


def section_step(device, batch, res, reps, table, notes):
    torch.manual_seed(0)
    model, what = resnet50()
    model = model.to(device, memory_format=torch.channels_last).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    small = max(2, batch // 2)
    data = {b: (torch.randn(b, 3, res, res, generator=g).to(device, memory_format=torch.channels_last),
                torch.randint(0, 1000, (b,), generator=g).to(device)) for b in (small, batch)}
    notes.append(f"model: {what}; batch {batch} (and {small} for the slope), {res}x{res}, channels_last, "
                 "BF16 autocast, torch.optim.AdamW.")
    for r in RECIPES:  # warm-up: kernels, allocator, AdamW state
        _step(model, opt, *data[batch], r)
    peaks = {r: {b: _peak(model, opt, *data[b], r) for b in (small, batch)} for r in RECIPES}
    times = {r: [] for r in RECIPES}
    for _ in range(reps):
        for r in RECIPES:
            sync(device)
            t0 = time.perf_counter()
            _step(model, opt, *data[batch], r)
            sync(device)
            times[r].append(time.perf_counter() - t0)
    base_fb, base_step = peaks["amp-bf16"][batch]
    base_t = statistics.median(times["amp-bf16"])
    for r in RECIPES:
        (fb_s, step_s), (fb, step) = peaks[r][small], peaks[r][batch]
        per = (fb - fb_s) / (batch - small)  # activations grow with the batch, AdamW's temporaries do not
        fixed = step - per * batch
        largest = f"{int((base_step - fixed) // per)} ({(base_step - fixed) / per / batch:.2f}x)" if per > 0 else "-"
        t = statistics.median(times[r])
        table.add(f"| {r} | {fb / 2**20:.0f} | {fb / base_fb:.2f} | {step / 2**20:.0f} | {per / 2**20:.1f} "
                  f"| {largest} | {t * 1e3:.1f} | {t / base_t:.2f} |")


def section_speed(device, mbytes, reps, notes):
    n = mbytes * 2**20 // 2
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(n, generator=g) * 3).to(torch.bfloat16).to(device)
    dst = torch.empty_like(x)

    def med(fn):
        ts = []
        for _ in range(reps):
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    copy = med(lambda: dst.copy_(x))
    bw = 2 * x.numel() * 2 / copy
    codes, scales = _act_pack.act_pack(x, 8, 256, 1)
    rows = ["| op | ms | GB/s | of copy bandwidth |", "|---|---|---|---|"]
    for name, fn, moved in (
        ("pack 8-bit", lambda: _act_pack.act_pack(x, 8, 256, 1), n * 3 + scales.numel() * 4),
        ("unpack 8-bit", lambda: _act_pack.act_unpack(codes, scales, n, 8, 256, torch.bfloat16), n * 3 + scales.numel() * 4),
    ):
        t = med(fn)
        rows.append(f"| {name} | {t * 1e3:.2f} | {moved / t / 1e9:.0f} | {moved / t / bw:.2f} |")
    notes.append(f"pack / unpack of {mbytes} MB of BF16 ({n} elements), median of {reps}; copy bandwidth "
                 f"(dst.copy_(x), read + write) {bw / 1e9:.0f} GB/s")
    return rows


def main():
    ap = parser(__doc__)
    args = ap.parse_args()
    device = device_of(args)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    quick = args.quick or device.type == "cpu"
    batch, res = (4, 64) if quick else (16, 224)
    reps = args.reps or (2 if quick else 10)
    notes = [f"machine: {machine(device)}; mixprec {mixprec.__version__ if hasattr(mixprec, '__version__') else ''}; "
             f"{utc_now()}"]
    table = Table("| recipe | fwd+bwd peak MiB | x amp | step peak MiB | MiB / sample | largest batch at amp's step peak "
                  "| step ms | x amp |")
    t0 = time.perf_counter()
    section_step(device, batch, res, reps, table, notes)
    speed = section_speed(device, 16 if quick else 256, reps, notes)
    print("\n".join(speed))
    about = ("Compressed activations on the device: one training step's peak memory over what it starts from "
             "(torch.cuda.max_memory_allocated; CPU: LiveTracker), the per-sample slope and the largest batch "
             "within the amp-bf16 step's peak at the same batch, and the step time, interleaved rounds.\n\n"
             + "\n".join(notes) + f"\ntotal {time.perf_counter() - t0:.0f} s\n")
    table.write(args.out, "Activation memory on a device (mixprec.memory)", about,
                "python " + " ".join(sys.argv), tail="\n".join(speed))


if __name__ == "__main__":
    main()
