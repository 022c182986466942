"""Every output of every CPU op, hashed: for "same bits before and after" checks
of a refactor (issue 22). Prints one line per case, `name sha256`, on fresh
but seeded random data with odd sizes, NaN/inf and huge values, for every
dtype; run it with two builds and each CPU path and diff the output:

    for isa in scalar avx2 avx512; do
      MIXPREC_CPU_ISA=$isa MIXPREC_LIBRARY_DIR=/work/base/build \\
        PYTHONPATH=/work/base/python python scripts/hash_outputs.py > /tmp/a_$isa
      MIXPREC_CPU_ISA=$isa MIXPREC_LIBRARY_DIR=build \\
        PYTHONPATH=python python scripts/hash_outputs.py > /tmp/b_$isa
      diff /tmp/a_$isa /tmp/b_$isa && echo "$isa: same bits"
    done

Only the public API is called (mixprec.ops, mixprec.optim, torch.ops.mixprec
for the overflow check), so any tree since the optimizer modes landed runs it.
"""

from __future__ import annotations

import hashlib
import sys

import torch

import mixprec
from mixprec import ops, optim

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SIZES = (1, 7, 33, 1000, 65537 + 3)


def digest(*tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        if isinstance(t, (list, tuple)):
            h.update(digest(*t).encode())
            continue
        if not isinstance(t, torch.Tensor):
            h.update(repr(t).encode())
            continue
        t = t.detach().contiguous().cpu().reshape(-1)
        h.update(str(t.dtype).encode() + str(t.numel()).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def spiked(n, dtype, g, scale=3.0):
    x = torch.randn(n, generator=g) * scale
    if n > 8:
        x[0], x[n // 2], x[-1] = float("nan"), float("inf"), -1e30
        x[3] = 1e-40  # subnormal in FP32, zero in FP16/BF16
    return x.to(dtype)


def amp_cases(g, out):
    for dt in DTYPES:
        for finite in (True, False):
            grads = [torch.randn(n, generator=g).to(dt) * 1000 for n in SIZES]
            if not finite:
                grads[2][5] = float("nan")
            found = torch.zeros(1)
            inv = torch.tensor(1 / 1024.0)
            norm = ops.unscale_(grads, found, inv, return_norm=True)
            out(f"unscale_norm {dt} {finite}", grads, found, norm)
            found = torch.zeros(1)
            out(f"grad_norm {dt} {finite}", ops.grad_norm(grads, found, inv), found)


def softmax_cases(g, out):
    for dt in DTYPES:
        for shape, dim in (((5, 37), -1), ((3, 1031), 1), ((4, 6, 9), 1), ((2, 4099), -1)):
            x = (torch.randn(shape, generator=g) * 20).to(dt)
            x.view(-1)[7] = float("-inf")
            for name in ("softmax", "log_softmax"):
                xr = x.clone().requires_grad_(True)
                y = getattr(ops, name)(xr, dim)
                gy = torch.randn(y.shape, generator=g).to(y.dtype)
                y.backward(gy)
                out(f"{name} {dt} {shape} {dim}", y, xr.grad)


def cross_entropy_cases(g, out):
    for dt in DTYPES:
        for (n, c), red, ls in (((64, 10), "mean", 0.0), ((37, 1001), "sum", 0.1), ((9, 33), "none", 0.0)):
            x = (torch.randn(n, c, generator=g) * 8).to(dt)
            t = torch.randint(0, c, (n,), generator=g)
            t[1] = -100
            w = torch.rand(c, generator=g) + 0.5
            xr = x.clone().requires_grad_(True)
            loss = ops.cross_entropy(xr, t, weight=w, reduction=red, label_smoothing=ls)
            loss.backward(torch.ones_like(loss))
            out(f"ce {dt} {n}x{c} {red} {ls}", loss, xr.grad)
            p = torch.softmax(torch.randn(n, c, generator=g), 1).to(dt)
            xr = x.clone().requires_grad_(True)
            loss = ops.cross_entropy(xr, p, reduction=red, label_smoothing=ls)
            loss.backward(torch.ones_like(loss))
            out(f"ce soft {dt} {n}x{c} {red} {ls}", loss, xr.grad)


def boxes(n, g, dt, spread=100.0):
    xy = torch.rand(n, 2, generator=g) * spread
    wh = torch.rand(n, 2, generator=g) * spread / 4 + 1
    return torch.cat([xy, xy + wh], 1).to(dt)


def nms_cases(g, out):
    for dt in DTYPES:
        for n in (1, 9, 300, 3001):
            b = boxes(n, g, dt)
            s = torch.rand(n, generator=g).to(dt)
            idx = torch.randint(0, 5, (n,), generator=g)
            for thr in (0.3, 0.7):
                out(f"nms {dt} {n} {thr}", ops.nms(b, s, thr))
                out(f"batched_nms {dt} {n} {thr}", ops.batched_nms(b, s, idx, thr))
                out(f"nms_padded {dt} {n} {thr}", ops.nms_padded(b, s, thr, idx, max_output=50))


def efficient_nms_cases(g, out):
    for dt in DTYPES:
        for batch, n, classes in ((1, 50, 3), (2, 700, 20), (3, 2100, 80)):
            b = torch.stack([boxes(n, g, dt, 300.0) for _ in range(batch)])
            s = torch.rand(batch, n, classes, generator=g).to(dt)
            for agn, thr, coding in ((False, 0.5, "corner"), (True, 0.45, "corner"), (False, 0.6, "center")):
                d = ops.efficient_nms(b, s, iou_threshold=thr, score_threshold=0.2, max_detections=100,
                                      class_agnostic=agn, box_coding=coding)
                out(f"efficient_nms {dt} {batch}x{n}x{classes} {agn} {thr} {coding}", tuple(d))


def roi_align_cases(g, out):
    for dt in DTYPES:
        x = torch.randn(2, 5, 23, 31, generator=g).to(dt)
        k = 40
        r = torch.cat([torch.randint(0, 2, (k, 1), generator=g).float(), boxes(k, g, torch.float32, 25.0)], 1)
        for size, sr, aligned in (((7, 7), -1, True), ((3, 5), 2, False), ((14, 14), 0, True)):
            xr = x.clone().requires_grad_(True)
            y = ops.roi_align(xr, r.to(dt), size, 0.7, sr, aligned)
            y.backward(torch.randn(y.shape, generator=g).to(dt))
            out(f"roi_align {dt} {size} {sr} {aligned}", y, xr.grad)


def overflow_cases(g, out):
    for dt in DTYPES:
        outs = [spiked(n, dt, g, 1e4) for n in SIZES]
        ins = [torch.randn(n, generator=g).to(dt) for n in SIZES[:2]]
        rec = torch.zeros(4, 8)
        torch.ops.mixprec.overflow_check_(outs, ins, rec, 1)
        out(f"overflow_check {dt}", rec)


OPTIM_MODES = {
    "AdamW master": dict(),
    "AdamW amsgrad maximize": dict(amsgrad=True, maximize=True),
    "AdamW sr": dict(master_weights=False, seed=3),
    "AdamW rem": dict(param_remainders=True),
    "AdamW rem+bf16": dict(param_remainders=True, exp_avg_dtype=torch.bfloat16,
                           exp_avg_sq_dtype=torch.bfloat16, seed=5),
    "AdamW rem+8bit": dict(param_remainders=True, exp_avg_dtype=torch.uint8, exp_avg_sq_dtype=torch.uint8),
    "AdamW sr+bf16": dict(master_weights=False, exp_avg_dtype=torch.bfloat16,
                          exp_avg_sq_dtype=torch.bfloat16, seed=7),
    "AdamW sr+8bit": dict(master_weights=False, exp_avg_dtype=torch.uint8, exp_avg_sq_dtype=torch.uint8, seed=11),
    "AdamW master ema": dict(ema_decay=0.9),
    "SGD momentum nesterov": dict(momentum=0.9, nesterov=True, weight_decay=1e-2),
    "SGD plain": dict(),
    "SGD rem+8bit": dict(momentum=0.9, param_remainders=True, momentum_dtype=torch.uint8),
    "SGD sr+bf16": dict(momentum=0.9, master_weights=False, momentum_dtype=torch.bfloat16, seed=9),
}


def optim_cases(g, out):
    for name, kw in OPTIM_MODES.items():
        cls = optim.SGD if name.startswith("SGD") else optim.AdamW
        for dt in (torch.bfloat16, torch.float16, torch.float32):
            lean = kw.get("param_remainders") or kw.get("master_weights") is False
            if lean and dt != torch.bfloat16:
                continue
            params = [torch.nn.Parameter(torch.randn(n, generator=g).to(dt)) for n in SIZES]
            try:
                opt = cls(params, lr=1e-2, **kw)
            except (RuntimeError, ValueError, TypeError) as e:
                out(f"optim {name} {dt}", f"refused: {type(e).__name__}")
                continue
            for step in range(3):
                for p in params:
                    p.grad = torch.randn(p.shape, generator=g).to(dt)
                opt.step()
            state = [sorted((k, v) for k, v in opt.state[p].items() if isinstance(v, torch.Tensor)) for p in params]
            out(f"optim {name} {dt}", params, [[v for _, v in s] for s in state])


def main() -> int:
    torch.manual_seed(0)
    torch.set_num_threads(2)
    lines = []

    def out(name, *tensors):
        lines.append(f"{name} {digest(*tensors)}")

    families = (amp_cases, softmax_cases, cross_entropy_cases, nms_cases, efficient_nms_cases,
                roi_align_cases, overflow_cases, optim_cases)
    for seed, fam in enumerate(families):
        fam(torch.Generator().manual_seed(seed), out)
    print(f"# mixprec {mixprec.__file__}", file=sys.stderr)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
