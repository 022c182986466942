"""One training run of mixprec.parity: the peak-memory probe, the steps, the evaluation."""

from __future__ import annotations

import collections.abc
import ctypes
import math
import numbers
import statistics
import time
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode


from ._parity_types import _W, LrScale, Recipe, RunResult

# ---- peak memory ------------------------------------------------------------------


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _heap_probe() -> Callable[[], int] | None:
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2

    def in_use() -> int:
        m = fn()
        return int(m.uordblks + m.hblkhd)

    return in_use


class _PeakHeap(TorchDispatchMode):
    def __init__(self, probe):
        super().__init__()
        self.probe = probe
        self.peak = probe()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.peak = max(self.peak, self.probe())
        return out


# ---- one run -------------------------------------------------------------------------


def _to(batch, device, dtype=None):
    if isinstance(batch, torch.Tensor):
        t = batch.to(device)
        return t.to(dtype) if dtype is not None and t.is_floating_point() else t
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to(b, device, dtype) for b in batch)
    if isinstance(batch, dict):
        return {k: _to(v, device, dtype) for k, v in batch.items()}
    return batch


def _cast(x, dtype):
    if isinstance(x, torch.Tensor):
        return x.to(dtype) if x.is_floating_point() else x
    if isinstance(x, (tuple, list)):
        return type(x)(_cast(v, dtype) for v in x)
    if isinstance(x, dict):
        return {k: _cast(v, dtype) for k, v in x.items()}
    return x


def _concat(items: list):
    """``k`` inputs (or targets) as one: see ``<k>x`` in the module docstring."""
    first = items[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(items)
    if isinstance(first, dict):
        return {key: _concat([it[key] for it in items]) for key in first}
    if isinstance(first, tuple):
        return tuple(_concat(list(z)) for z in zip(*items))
    return [e for it in items for e in it]


def _scaled_lr(rule: LrScale, lr: float, k: int) -> float:
    return lr * rule if isinstance(rule, float) else rule(lr, k)


def _apply_lr(opt, rule: LrScale | None, k: int) -> None:
    if rule is None:
        return
    for g in opt.param_groups:
        lr = g["lr"]
        new = _scaled_lr(rule, float(lr), k)
        g["lr"] = torch.as_tensor(new, dtype=lr.dtype, device=lr.device) if isinstance(lr, torch.Tensor) else new


def _grad_norm(opt) -> float:
    grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
    if not grads:
        return 0.0
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.detach().float()) for g in grads])))


def _run(name, model, data, loss_fn, make_opt, device, spec: Recipe | None, guard_on, lr_rule, seed):
    """Trains ``model`` on ``data`` (a list of groups of ``k`` batches) as
    ``spec`` says (None: the FP32 baseline); returns (RunResult, guard)."""
    from . import amp as _amp
    from .guard import ForwardGuard

    low, params_cast = (spec.dtype, spec.params_cast) if spec is not None else (None, False)
    bits = spec.act_bits if spec is not None else None
    k = spec.batch_multiplier if spec is not None else 1
    if params_cast:
        model = model.to(low)
    opt = make_opt(model.parameters())
    _apply_lr(opt, lr_rule, k)
    scaler = _amp.GradScaler(device.type, enabled=low == torch.float16, diagnostics=True)
    guard = None
    if low is not None and guard_on:
        guard = ForwardGuard(model, fallback=True, optimizer=opt)
        if scaler.is_enabled():
            guard.attach(scaler)
    if bits is not None:
        from .memory import compressed_activations
    cuda = device.type == "cuda"
    probe = None if cuda else _heap_probe()
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    if seed is not None:
        torch.manual_seed(seed)  # the same dropout stream for every recipe of this seed
    losses, skipped, times, norms = [], [], [], []
    peak = None
    n = len(data)
    for i, group in enumerate(data):
        if k == 1:
            x, y = group[0]
        else:
            x, y = _concat([b[0] for b in group]), _concat([b[1] for b in group])
        x, y = _to(x, device, low if params_cast else None), _to(y, device)
        mode = _PeakHeap(probe) if (probe is not None and i == n - 1) else None
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        if mode is not None:
            mode.__enter__()
        try:
            with torch.autocast(device.type, dtype=low, enabled=low is not None and not params_cast):
                if bits is not None:
                    # A rounding seed per run and step (one seed for every step would correlate their errors).
                    with compressed_activations(bits=bits, seed=(seed or 0) * 2**32 + i):
                        out = model(x)
                        loss = loss_fn(out.float() if isinstance(out, torch.Tensor) else out, y)
                else:
                    out = model(x)
                    loss = loss_fn(out.float() if isinstance(out, torch.Tensor) else out, y)
            before = scaler.get_skipped_steps() if scaler.is_enabled() else 0
            scaler.scale(loss).backward()
            t_norm = time.perf_counter()
            norm = _grad_norm(opt) / (scaler.get_scale() if scaler.is_enabled() else 1.0)
            t_norm = time.perf_counter() - t_norm
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            if guard is not None and not scaler.is_enabled():
                guard.step(loss=loss)
        finally:
            if mode is not None:
                mode.__exit__(None, None, None)
        if cuda:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0 - t_norm)
        losses.append(loss.item())
        norms.append(norm)
        if scaler.is_enabled():
            if scaler.get_skipped_steps() > before:
                skipped.append(i)
        elif not math.isfinite(losses[-1]):
            skipped.append(i)
        if mode is not None:
            peak = mode.peak
    timed = times[1:-1] if len(times) > 2 else times
    sps = 1.0 / statistics.median(timed)
    if cuda:
        peak, source = torch.cuda.max_memory_allocated(device), "torch.cuda.max_memory_allocated"
    else:
        source = "glibc mallinfo2 heap in use, sampled per aten op" if probe is not None else "unavailable"
    result = RunResult(name, losses, skipped, sps, peak, source, seed, k,
                       sum(not math.isfinite(v) for v in losses), sum(not math.isfinite(v) for v in norms), norms)
    if guard is not None:
        guard.remove()  # the evaluation is no training step; the fallbacks stay
    return result, guard, model


def _evaluate(evaluate, model, spec: Recipe | None, device) -> dict[str, float]:
    """``evaluate(model)`` as the recipe runs the model: see the module docstring."""
    low = spec.dtype if spec is not None else None
    modes = [(m, m.training) for m in model.modules()]
    handles = []
    if spec is not None and spec.params_cast:
        handles.append(model.register_forward_pre_hook(lambda m, a, kw: (_cast(a, low), _cast(kw, low)),
                                                       with_kwargs=True))
        handles.append(model.register_forward_hook(lambda m, a, out: _cast(out, torch.float32)))
    model.eval()
    try:
        with torch.no_grad(), torch.autocast(device.type, dtype=low, enabled=low is not None and not spec.params_cast):
            out = evaluate(model)
    finally:
        for h in handles:
            h.remove()
        for m, t in modes:
            m.training = t
    return _metrics(out)


def _metrics(out) -> dict[str, float]:
    what = "evaluate must return a dict of metric name -> number (e.g. {'accuracy': 0.91})"
    if not isinstance(out, collections.abc.Mapping):
        raise TypeError(f"{_W}: {what}, got {type(out).__name__}")
    if not out:
        raise ValueError(f"{_W}: {what}, got an empty dict")
    res = {}
    for key, v in out.items():
        if not isinstance(key, str):
            raise TypeError(f"{_W}: {what}, got the key {key!r}")
        if isinstance(v, torch.Tensor) and v.numel() == 1 and not v.is_complex() and v.dtype is not torch.bool:
            v = v.item()
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"{_W}: {what}, got {key!r}: {type(v).__name__} {v!r}")
        res[key] = float(v)
    return res
