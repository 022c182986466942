"""Accuracy of the lean optimizer-state formats side by side with the peers'
(issue 24): why mixprec offers 8-bit moments and no 4-bit ones.

The problem of tests/python/optim/test_optim_lean_accuracy.py (BF16 gradients
with a persistent direction plus noise, three tensors at three scales, the
magnitudes within each tensor spread over 2 decades), run through each
optimizer and through torch's AdamW in float64 on the same gradients. Printed
per row: the weights' error relative to the distance they travelled and the
moments' errors relative to their size (norms over all tensors), and the final
loss of a small BF16 MLP trained 200 steps on a fixed task (its gradients also
drive the float64 AdamW; "vs master": the loss minus mixprec's FP32-master
mode's, >0 is worse).

    python bench/accuracy_optim_lean.py [--steps 100] [--out FILE]

torchao's optimizers run eagerly (their torch.compile'd step needs minutes of
C++ compilation on a CPU; the math is the same).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python", "optim"))

import test_optim_lean_accuracy as T  # noqa: E402  (the test's problem and reference)

from mixprec.optim import AdamW  # noqa: E402


def _eager_compile():
    torch.compile = lambda fn=None, **kw: fn if fn is not None else (lambda f: f)


def _peer_run(cls, init, seq):
    ps = [torch.nn.Parameter(w.float()) for w in init]
    opt = cls(ps, **T.HP)
    for grads in seq:
        for p, gr in zip(ps, grads):
            p.grad = gr.float()
        opt.step()
    states = [{k: opt.state[p][k].dequantize() for k in ("exp_avg", "exp_avg_sq")} for p in ps]
    return [p.detach() for p in ps], states


def _small_model(make_opt, bf16=True, steps=200):
    """T._train_small_model's task, with any optimizer: the final loss."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 16, generator=g)
    y = (x[:, :8] + 0.3 * torch.randn(256, 8, generator=g)).argmax(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
    dt = torch.bfloat16 if bf16 else torch.float32
    model = model.to(dt)
    opt = make_opt(model.parameters())
    for t in range(steps):
        idx = torch.arange(t * 32, t * 32 + 32) % 256
        torch.nn.functional.cross_entropy(model(x[idx].to(dt)).float(), y[idx]).backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(model(x.to(dt)).float(), y))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--out")
    args = ap.parse_args()
    _eager_compile()
    try:
        import torchao.optim as ao
    except ImportError:
        ao = None
    init, seq = T._init(7), T._sequence(7, steps=args.steps)
    ref_ps, ref_opt = T._reference(init, seq)
    hp = {**T.HP, "lr": 3e-3}
    rows = []
    master_loss = _small_model(lambda ps: AdamW(ps, **hp, seed=5))
    for mode in ("master", "rem", "rem+bf16", "rem+8bit", "sr+bf16"):
        w, s = T._ours(mode, init, seq)
        loss = _small_model(lambda ps, m=mode: AdamW(ps, **hp, seed=5, **T.MODES[m]))
        rows.append((f"mixprec {mode}", T._errors(w, s, init, ref_ps, ref_opt), loss))
    if ao is not None:
        for name, cls in (("torchao AdamW8bit", ao.AdamW8bit), ("torchao AdamW4bit", ao.AdamW4bit)):
            w, s = _peer_run(cls, init, seq)
            # FP32 params for the peers (their weights' format plays no part).
            loss = _small_model(lambda ps, c=cls: c(ps, **hp), bf16=False)
            rows.append((name, T._errors(w, s, init, ref_ps, ref_opt), loss))
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}; {now}; "
        f"{args.steps} steps of the accuracy test's problem against float64 AdamW; small MLP 200 steps",
        f"Command: `python bench/accuracy_optim_lean.py --steps {args.steps}`",
        "",
        "| optimizer | weights error | exp_avg error | exp_avg_sq error | MLP final loss | vs master |",
        "|---|---|---|---|---|---|",
    ]
    for name, (ew, em, ev), loss in rows:
        lines.append(f"| {name} | {ew:.3g} | {em:.3g} | {ev:.3g} | {loss:.4f} | {loss - master_loss:+.4f} |")
    if ao is None:
        lines.append("(torchao not installed: its rows are missing)")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
