"""Mixed-precision training with mixprec's GradScaler, next to an FP32 baseline.

Trains the same small CNN on scikit-learn's bundled 8x8 handwritten digits
(1,797 real images, no download) three ways, from the same initial weights:

  fp32  plain FP32 model, torch.optim.AdamW (the baseline)
  bf16  model.to(bfloat16): BF16 weights, activations and gradients, with
        mixprec.optim.AdamW keeping FP32 master weights and state,
        mixprec.amp.GradScaler, and the loss computed in FP32
  fp16  the same in float16, where the dynamic loss scale matters

Every run clips gradients to norm 1; the mixed-precision runs take the norm
from the scaler's unscale pass (one read of the gradients).

and prints test accuracy, its difference to FP32, steps per second, the loss
scale and the number of skipped (overflowing) steps of each run.

Usage: python examples/train_amp.py [--epochs N] [--quick] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import mixprec  # noqa: E402


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
        self.c1 = torch.nn.Conv2d(1, 32, 3, padding=1)
        self.c2 = torch.nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = torch.nn.Linear(64 * 4 * 4, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.c1(x))
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def train(mode, init_state, data, epochs, device, batch=64, clip=1.0):
    (xtr, ytr), (xte, yte) = data
    torch.manual_seed(1)
    amp_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[mode]
    model = SmallCNN().to(device)
    model.load_state_dict(init_state)
    if amp_dtype is None:
        opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    else:
        model = model.to(amp_dtype)  # the FP32 masters live in the optimizer
        opt = mixprec.optim.AdamW(model.parameters(), lr=2e-3)
    scaler = mixprec.amp.GradScaler(device.type, enabled=amp_dtype is not None)
    steps, losses = 0, []
    gen = torch.Generator().manual_seed(2)
    t0 = time.perf_counter()
    for _ in range(epochs):
        perm = torch.randperm(len(xtr), generator=gen).to(device)
        for i in range(0, len(xtr), batch):
            idx = perm[i : i + batch]
            opt.zero_grad(set_to_none=True)
            logits = model(xtr[idx].to(amp_dtype or torch.float32))
            loss = F.cross_entropy(logits.float(), ytr[idx])  # loss in FP32, as the playbook asks
            scaler.scale(loss).backward()
            if amp_dtype is not None:
                scaler.clip_grad_norm_(opt, clip)  # norm from the unscale pass
            else:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            scaler.step(opt)
            scaler.update()
            losses.append(loss.detach())
            steps += 1
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    model.eval()
    with torch.no_grad():
        acc = (model(xte.to(amp_dtype or torch.float32)).argmax(1) == yte).float().mean().item()
    return {
        "mode": mode,
        "acc": acc,
        "steps_per_s": steps / elapsed,
        "final_loss": float(torch.stack(losses[-10:]).mean()),
        "scale": scaler.get_scale() if amp_dtype is not None else None,
        "skipped": scaler.get_skipped_steps() if amp_dtype is not None else 0,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="2 epochs (smoke test)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("train_amp: --device cuda asked for, but torch sees no CUDA device")
    epochs = 2 if args.quick else args.epochs
    data = load_digits(device)
    torch.manual_seed(0)
    init_state = SmallCNN().state_dict()
    print(f"digits: {len(data[0][0])} train / {len(data[1][0])} test images, {epochs} epochs, device {device}")
    results = []
    for mode in ("fp32", "bf16", "fp16"):
        r = train(mode, init_state, data, epochs, device)
        results.append(r)
        print(f"  {mode}: done, test accuracy {100 * r['acc']:.2f}%", flush=True)
    base = results[0]["acc"]
    print()
    print(f"{'run':<6}{'accuracy':>10}{'vs fp32':>10}{'steps/s':>10}{'loss':>9}{'scale':>10}{'skipped':>9}")
    for r in results:
        scale = "-" if r["scale"] is None else f"{r['scale']:.0f}"
        print(
            f"{r['mode']:<6}{100 * r['acc']:>9.2f}%{100 * (r['acc'] - base):>+9.2f}pp"
            f"{r['steps_per_s']:>10.1f}{r['final_loss']:>9.4f}{scale:>10}{r['skipped']:>9}"
        )
    if device.type == "cpu":
        print(
            "\nOn a CPU without native BF16/FP16 arithmetic torch's half-precision convolutions are\n"
            "slower than FP32, so steps/s here measure torch's forward and backward kernels, not\n"
            "mixprec's loss scaling and optimizer step. Speed-ups show on GPUs."
        )
    return results


if __name__ == "__main__":
    main()
