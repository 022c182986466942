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


def _eager_compile():
    torch.compile = lambda fn=None, **kw: fn if fn is not None else (lambda f: f)


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
    rows = []
    for mode in ("master", "rem", "rem+bf16", "rem+8bit", "sr+bf16"):
        w, s = T._ours(mode, init, seq)
        loss = T._train_small_model(mode)[0]
        rows.append((f"mixprec {mode}", T._errors(w, s, init, ref_ps, ref_opt), loss))
    if ao is not None:
        for name, cls in (("torchao AdamW8bit", ao.AdamW8bit), ("torchao AdamW4bit", ao.AdamW4bit)):
            w, s = T._torchao_run(cls, init, seq)
            # FP32 params for the peers (their weights' format plays no part).
            loss = T._small_model_run(lambda m, c=cls: c(m.parameters(), **T.SMALL_HP), dtype=torch.float32)[2]
            rows.append((name, T._errors(w, s, init, ref_ps, ref_opt), loss))
    master_loss = rows[0][2]  # mixprec master's
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
