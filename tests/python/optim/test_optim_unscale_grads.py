"""unscale_grads=True on torch.ops.mixprec.adamw_step_ / sgd_step_: the grads
are overwritten with grad / grad_scale in their dtype in the same fused pass
(what torch's fused optimizers leave in p.grad after GradScaler.step()), and
params, masters and state are bit for bit those of the same call with
unscale_grads=False. No grad is written without a grad_scale or on a skipped
step (found_inf nonzero), nor with unscale_grads=False.
"""

import pytest
import torch
from torch.library import opcheck

import mixprec  # noqa: F401  (loads the ops and their fakes)

from _reference import bits

SIZES = [1, 7, 8, 17, 4097, 70001]
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
# (param dtype, grad dtype, master): "sr" is a master-free bfloat16 param.
COMBOS = [
    ("f32", "f32", True), ("f32", "bf16", True), ("f16", "f16", True), ("f16", "f32", True),
    ("bf16", "bf16", True), ("bf16", "f16", True), ("bf16", "bf16", False), ("bf16", "f32", False),
]


def _problem(gen, pd, gd, master, scale, specials=True):
    """Args of one step: params, scaled grads (with inf/NaN/zeros), masters,
    state, steps (after a few steps' worth of count)."""
    pdt, gdt = DTYPES[pd], DTYPES[gd]
    ps, gs, ms, st = [], [], [], []
    for n in SIZES:
        x = torch.randn(n, generator=gen)
        ps.append(x.to(pdt))
        ms.append(x.clone() if pdt != torch.float32 and master else torch.empty(0))
        g = torch.randn(n, generator=gen) * scale
        if specials and n >= 8:
            g[: 6] = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 1e-30]) * 1
            g[-1] = float("nan")
        gs.append(g.to(gdt))
        st.append([torch.randn(n, generator=gen).abs() * 1e-3 for _ in range(3)])
    steps = [torch.full((), 3.0) for _ in SIZES]
    return ps, gs, ms, st, steps


def _call(kind, ps, gs, ms, st, steps, scale_t, found_t, unscale, maximize):
    if kind == "adamw":
        torch.ops.mixprec.adamw_step_(
            ps, gs, ms, [s[0] for s in st], [s[1] for s in st], [s[2] for s in st], steps,
            1e-2, 0.9, 0.999, 1e-2, 1e-8, True, maximize, None, scale_t, found_t, 5, unscale)
    else:
        torch.ops.mixprec.sgd_step_(
            ps, gs, ms, [s[0] for s in st], steps, 1e-2, 0.9, 0.0, 1e-3, False, maximize, None,
            scale_t, found_t, 5, unscale)


def _clone(x):
    if isinstance(x, list):
        return [_clone(y) for y in x]
    return x.clone()


def _assert_bitwise(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape, what
    assert torch.equal(bits(got), bits(want)), what


@pytest.mark.parametrize("maximize", [False, True], ids=["min", "max"])
@pytest.mark.parametrize("kind", ["adamw", "sgd"])
@pytest.mark.parametrize("pd,gd,master", COMBOS, ids=[f"{p}-{g}{'' if m else '-sr'}" for p, g, m in COMBOS])
def test_op_writes_unscaled_grads_update_unchanged(gen, kind, pd, gd, master, maximize):
    scale = 3000.0  # not a power of two: the quotient rounds
    ps, gs, ms, st, steps = _problem(gen, pd, gd, master, scale)
    given = _clone(gs)
    b = _clone([ps, gs, ms, st, steps])
    scale_t, found_t = torch.tensor(scale), torch.tensor(0.0)
    _call(kind, ps, gs, ms, st, steps, scale_t, found_t, True, maximize)
    _call(kind, *b, scale_t, found_t, False, maximize)
    for i, (g, g0, gb) in enumerate(zip(gs, given, b[1])):
        want = (g0.float() / scale).to(g0.dtype)
        # NaN stays NaN (its payload is the hardware's): compare the rest bitwise.
        assert torch.equal(g.isnan(), want.isnan()), f"grads[{i}] NaNs"
        ok = ~want.isnan()
        _assert_bitwise(g[ok], want[ok], f"grads[{i}] written back")
        _assert_bitwise(gb, g0, f"grads[{i}] untouched with unscale_grads=False")
    for name, x, y in (("params", ps, b[0]), ("masters", ms, b[2]), ("steps", steps, b[4])):
        for i, (u, v) in enumerate(zip(x, y)):
            _assert_bitwise(u, v, f"{name}[{i}]")
    n_state = 3 if kind == "adamw" else 1
    for i, (u, v) in enumerate(zip(st, b[3])):
        for k in range(n_state):
            _assert_bitwise(u[k], v[k], f"state {k} of tensor {i}")


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
@pytest.mark.parametrize("case", ["skipped", "found_inf_2", "no_scale"])
def test_op_writes_no_grad(gen, kind, case):
    """A skipped step writes nothing (grads stay scaled, as torch's); without
    a grad_scale there is nothing to unscale."""
    ps, gs, ms, st, steps = _problem(gen, "bf16", "bf16", True, 1024.0)
    before = _clone([ps, gs, ms, st, steps])
    scale_t = None if case == "no_scale" else torch.tensor(1024.0)
    found_t = torch.tensor({"skipped": 1.0, "found_inf_2": 2.0, "no_scale": 0.0}[case])
    _call(kind, ps, gs, ms, st, steps, scale_t, found_t, True, False)
    for i, (g, g0) in enumerate(zip(gs, before[1])):
        _assert_bitwise(g, g0, f"grads[{i}]")
    if case != "no_scale":
        for i, (p, p0) in enumerate(zip(ps, before[0])):
            _assert_bitwise(p, p0, f"params[{i}]")


@pytest.mark.parametrize("found", [0.0, 1.0], ids=["taken", "skipped"])
@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_grads_match_torch_fused(gen, kind, found):
    """torch.optim.AdamW/SGD(fused=True) given grad_scale write the unscaled
    grad back too (and leave it scaled on a skipped step): on FP32 params the
    grads after the step are the same."""
    scale = 3000.0
    ps, gs, ms, st, steps = _problem(gen, "f32", "f32", True, scale, specials=False)
    for s in st:
        for t in s:
            t.zero_()
    for t in steps:
        t.zero_()
    ref = [torch.nn.Parameter(p.clone()) for p in ps]
    for r, g in zip(ref, gs):
        r.grad = g.clone()
    if kind == "adamw":
        opt = torch.optim.AdamW(ref, lr=1e-2, weight_decay=1e-2, amsgrad=True, fused=True)
    else:
        opt = torch.optim.SGD(ref, lr=1e-2, momentum=0.9, weight_decay=1e-3, fused=True)
    opt.grad_scale, opt.found_inf = torch.tensor(scale), torch.tensor(found)
    opt.step()
    _call(kind, ps, gs, ms, st, steps, torch.tensor(scale), torch.tensor(found), True, False)
    for i, (g, r) in enumerate(zip(gs, ref)):
        _assert_bitwise(g, r.grad, f"grads[{i}] vs torch fused")
    if found:
        for i, (g, r) in enumerate(zip(gs, ref)):
            _assert_bitwise(r.grad, g, f"grads[{i}] still scaled")


def test_opcheck_unscale_grads(gen):
    ps, gs, ms, st, steps = _problem(gen, "bf16", "f32", True, 64.0, specials=False)
    ps, gs, ms, st, steps = ps[:3], gs[:3], ms[:3], st[:3], steps[:3]
    opcheck(torch.ops.mixprec.adamw_step_.default,
            (ps, gs, ms, [s[0] for s in st], [s[1] for s in st], [s[2] for s in st], steps,
             1e-3, 0.9, 0.999, 0.01, 1e-8, True, False, None, torch.tensor(64.0), torch.tensor(0.0), 0, True))
    opcheck(torch.ops.mixprec.sgd_step_.default,
            (ps, gs, ms, [s[0] for s in st], steps, 1e-2, 0.9, 0.0, 0.0, False, False, None,
             torch.tensor(64.0), None),
            {"unscale_grads": True})


def test_schema_marks_grads_mutable_and_defaults_false():
    for op in (torch.ops.mixprec.adamw_step_.default, torch.ops.mixprec.sgd_step_.default):
        args = {a.name: a for a in op._schema.arguments}
        assert args["grads"].alias_info is not None and args["grads"].alias_info.is_write
        assert args["unscale_grads"].default_value is False
        # Appended after sr_seed; only defaulted arguments (the EMA's) follow it.
        names = [a.name for a in op._schema.arguments]
        assert names[names.index("sr_seed") + 1] == "unscale_grads"
        assert all(a.has_default_value() for a in op._schema.arguments[names.index("unscale_grads"):])
