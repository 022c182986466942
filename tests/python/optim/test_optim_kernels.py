"""The fused optimizer ops (torch.ops.mixprec.adamw_step_ / sgd_step_) at
the op level, for what the C kernels own: one step tensor shared by several
params (allowed by mixprec/optim.h) and the lean state formats (param
remainders, BF16 and 8-bit moments), against the plain FP32-master mode and
float64 references on fresh random data."""

import pytest
import torch


def _adamw(params, grads, masters, m, v, steps, **kw):
    torch.ops.mixprec.adamw_step_(params, grads, masters, m, v, [], steps, 1e-2, 0.9, 0.999, 0.01, 1e-8, False,
                                  False, None, None, None, **kw)


def _sgd(params, grads, masters, bufs, steps, **kw):
    torch.ops.mixprec.sgd_step_(params, grads, masters, bufs, steps, 1e-2, 0.9, 0.0, 0.0, False, False, None, None,
                                None, **kw)


@pytest.mark.parametrize("opt", ["adamw", "sgd"])
def test_one_step_tensor_shared_by_all_params(gen, opt):
    """One count for the whole list: every param steps with the same count,
    exactly as with a count each, and the shared count advances once."""
    shapes = [(17,), (5, 9), (300,)]
    base = [torch.randn(s, generator=gen) for s in shapes]
    for k in range(3):
        grads = [torch.randn(s, generator=gen) for s in shapes]
        if k == 0:
            own = [b.clone() for b in base]
            shared = [b.clone() for b in base]
            own_state = [[torch.zeros(s) for s in shapes] for _ in range(2)]
            shared_state = [[torch.zeros(s) for s in shapes] for _ in range(2)]
            own_steps = [torch.zeros(()) for _ in shapes]
            one = torch.zeros(())
        empty = [torch.empty(0) for _ in shapes]
        if opt == "adamw":
            _adamw(own, grads, empty, *own_state, own_steps)
            _adamw(shared, grads, empty, *shared_state, [one] * len(shapes))
        else:
            _sgd(own, grads, empty, own_state[0], own_steps)
            _sgd(shared, grads, empty, shared_state[0], [one] * len(shapes))
        for a, b in zip(own, shared):
            assert torch.equal(a, b)
        assert one.item() == k + 1 and all(s.item() == k + 1 for s in own_steps)


def _lean_state(shapes, fmt):
    """exp_avgs, exp_avg_sqs and their scales in one of the formats."""
    dt = {"f32": torch.float32, "bf16": torch.bfloat16, "q8": torch.uint8}[fmt]
    m = [torch.zeros(s, dtype=dt) for s in shapes]
    v = [torch.zeros(s, dtype=dt) for s in shapes]
    sc = lambda: [torch.zeros((torch.Size(s).numel() + 255) // 256) for s in shapes] if fmt == "q8" else None  # noqa: E731
    return m, v, sc(), sc()


def test_remainders_give_the_master_modes_trajectory(gen):
    """BF16 params with int16 remainders follow the FP32-master mode bit for
    bit (the master they hold equals its master), and the param is the
    master rounded to nearest: equal to its nearest-even rounding except at
    exact ties."""
    shapes = [(33,), (7, 65), (1000,)]
    init = [torch.randn(s, generator=gen).bfloat16() for s in shapes]
    pa, pb = [p.clone() for p in init], [p.clone() for p in init]
    masters = [p.float() for p in init]
    rems = [torch.zeros(s, dtype=torch.int16) for s in shapes]
    sa = _lean_state(shapes, "f32")[:2]
    sb = _lean_state(shapes, "f32")[:2]
    steps_a, steps_b = [torch.zeros(()) for _ in shapes], [torch.zeros(()) for _ in shapes]
    empty = [torch.empty(0) for _ in shapes]
    for _ in range(10):
        grads = [torch.randn(s, generator=gen).bfloat16() for s in shapes]
        _adamw(pa, grads, masters, *sa, steps_a)
        _adamw(pb, grads, empty, *sb, steps_b, remainders=rems)
    for p, r, m, q in zip(pb, rems, masters, pa):
        held = ((p.view(torch.int16).int() << 16) | (r.int() & 0xFFFF))
        # Undo the rounding carry (mixprec/optim.h [note: remainders]) for finite values.
        carry = (r < 0) & ((p.view(torch.int16).int() & 0x7FFF) != 0)
        held = torch.where(carry, held - (1 << 16), held)
        assert torch.equal(held.view(torch.float32), m)
        lo = m.view(torch.int32) & 0xFFFF
        tie = (lo == 0x8000) & (((m.view(torch.int32) >> 16) & 1) == 0)
        assert torch.equal(p[~tie], q[~tie])


@pytest.mark.parametrize("fmt", ["bf16", "q8"])
def test_lean_moments_track_float64_adamw(gen, fmt):
    """BF16 (stochastically rounded) and 8-bit moments: 50 steps of AdamW
    stay close to float64 AdamW on the same gradients (the FP32-moment mode
    for scale)."""
    shapes = [(4096,), (300,)]
    init = [torch.randn(s, generator=gen) for s in shapes]
    params = {k: [p.clone() for p in init] for k in ("f32", fmt)}
    state = {k: _lean_state(shapes, k) for k in ("f32", fmt)}
    steps = {k: [torch.zeros(()) for _ in shapes] for k in ("f32", fmt)}
    ref = [p.double() for p in init]
    rm = [torch.zeros_like(p) for p in ref]
    rv = [torch.zeros_like(p) for p in ref]
    empty = [torch.empty(0) for _ in shapes]
    lr, b1, b2, wd, eps = 1e-2, 0.9, 0.999, 0.01, 1e-8
    for t in range(1, 51):
        grads = [torch.randn(s, generator=gen) * (1 + torch.rand(s, generator=gen) * 10) for s in shapes]
        for k in ("f32", fmt):
            m, v, ms, vs = state[k]
            kw = {"exp_avg_scales": ms, "exp_avg_sq_scales": vs} if ms is not None else {}
            _adamw(params[k], grads, empty, m, v, steps[k], **kw)
        for i, g in enumerate(grads):
            g = g.double()
            ref[i] *= 1 - lr * wd
            rm[i] = b1 * rm[i] + (1 - b1) * g
            rv[i] = b2 * rv[i] + (1 - b2) * g * g
            ref[i] -= lr / (1 - b1**t) * rm[i] / ((rv[i] / (1 - b2**t)).sqrt() + eps)
    err = {k: max((p.double() - r).abs().max().item() for p, r in zip(params[k], ref)) for k in ("f32", fmt)}
    assert err["f32"] < 1e-5
    # 50 steps of lr 1e-2 move a param by up to 0.5: the lean moments stay
    # within a small fraction of that (measured, 3 seeds: max |error| bf16
    # 1.6e-3 - 3.0e-3, q8 6.8e-3 - 8.3e-3, the FP32 moments 3.7e-6 - 4.6e-6).
    assert err[fmt] < {"bf16": 5e-3, "q8": 3e-2}[fmt], err


def test_lean_op_checks(gen):
    from torch.library import opcheck

    shapes = [(300,), (9,)]
    p = [torch.randn(s, generator=gen).bfloat16() for s in shapes]
    g = [torch.randn(s, generator=gen).bfloat16() for s in shapes]
    m, v, ms, vs = _lean_state(shapes, "q8")
    args = (p, g, [torch.empty(0)] * 2, m, v, [], [torch.zeros(()) for _ in shapes], 1e-2, 0.9, 0.999, 0.01, 1e-8,
            False, False, None, None, None)
    opcheck(torch.ops.mixprec.adamw_step_.default, args,
            {"remainders": [torch.zeros(s, dtype=torch.int16) for s in shapes], "exp_avg_scales": ms,
             "exp_avg_sq_scales": vs})
    bufs = [torch.zeros(s, dtype=torch.bfloat16) for s in shapes]
    opcheck(torch.ops.mixprec.sgd_step_.default,
            (p, g, [torch.empty(0)] * 2, bufs, [torch.zeros(()) for _ in shapes], 1e-2, 0.9, 0.0, 0.0, False, False,
             None, None, None), {"remainders": [torch.zeros(s, dtype=torch.int16) for s in shapes]})


@pytest.mark.parametrize(
    "case,words",
    [
        ("rem_f16", ("remainders[0]", "bfloat16 params only")),
        ("rem_master", ("remainders[0]", "beside masters[0]")),
        ("rem_dtype", ("remainders[0]", "int16")),
        ("q8_no_scales", ("exp_avgs[0]", "exp_avg_scales[0]", "missing")),
        ("q8_bad_scales", ("exp_avg_sq_scales[1]", "ceil(numel / 256) = 1")),
        ("scales_not_q8", ("exp_avg_scales[0]", "not uint8")),
        ("state_dtype", ("exp_avg_sqs[0]", "float32, bfloat16 or uint8")),
    ],
)
def test_lean_bad_arguments_name_the_argument_and_write_nothing(gen, case, words):
    shapes = [(300,), (9,)]
    p = [torch.randn(s, generator=gen).bfloat16() for s in shapes]
    g = [torch.randn(s, generator=gen).bfloat16() for s in shapes]
    masters = [torch.empty(0) for _ in shapes]
    rems = [torch.zeros(s, dtype=torch.int16) for s in shapes]
    m, v, ms, vs = _lean_state(shapes, "q8")
    kw = {"remainders": rems, "exp_avg_scales": ms, "exp_avg_sq_scales": vs}
    if case == "rem_f16":
        p[0] = p[0].half()
        masters[0] = p[0].float()
    elif case == "rem_master":
        masters[0] = p[0].float()
    elif case == "rem_dtype":
        rems[0] = torch.zeros(300, dtype=torch.int32)
    elif case == "q8_no_scales":
        kw["exp_avg_scales"] = None
    elif case == "q8_bad_scales":
        vs[1] = torch.zeros(2)
    elif case == "scales_not_q8":
        m[0] = torch.zeros(300)
    elif case == "state_dtype":
        v[0] = torch.zeros(300, dtype=torch.float16)
    steps = [torch.zeros(()) for _ in shapes]
    before = [t.clone() for t in (*p, *rems, *m, *v, *ms, *vs, *steps)]
    with pytest.raises(RuntimeError) as info:
        _adamw(p, g, masters, m, v, steps, **kw)
    for w in ("mixprec::adamw_step_", *words):
        assert w in str(info.value)
    for a, b in zip(before, (*p, *rems, *m, *v, *ms, *vs, *steps)):
        assert torch.equal(a, b)
