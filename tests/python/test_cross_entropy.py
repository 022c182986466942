"""mixprec.ops.cross_entropy (forward and backward) against
torch.nn.functional.cross_entropy on the input upcast to FP32, on both CPU
paths; weight / ignore_index / label_smoothing / reductions, special rows,
all-ignored batches, one class, odd class counts; peak memory against the
upcast path; autocast; opcheck; bad inputs."""

import pytest
import torch
import torch.nn.functional as F

import mixprec

from _reference import DTYPES, EPS, TINY, cpu_lib

def make(shape, dtype, gen, ignore_frac=0.2, scale=4.0):
    x = (torch.randn(shape, generator=gen) * scale).to(dtype)
    C = shape[0] if len(shape) == 1 else shape[1]
    tshape = () if len(shape) == 1 else (shape[0], *shape[2:])
    t = torch.randint(0, C, tshape, generator=gen)
    if ignore_frac and t.dim():
        t[torch.rand(tshape, generator=gen) < ignore_frac] = -100
    return x, t


def compare(x, t, gen, *, weight=None, reduction="mean", label_smoothing=0.0, ignore_index=-100):
    """Loss and gradient of mixprec vs torch on the FP32 upcast input."""
    dtype = x.dtype
    xm = x.clone().requires_grad_()
    loss = mixprec.ops.cross_entropy(xm, t, weight, ignore_index, reduction, label_smoothing)
    xr = x.float().requires_grad_()
    ref = F.cross_entropy(xr, t, weight, ignore_index=ignore_index, reduction=reduction,
                          label_smoothing=label_smoothing)
    assert loss.dtype == torch.float32 and loss.shape == ref.shape
    # Loss: FP32 rounding of a sum over classes and positions (both sides).
    n_terms = x.shape[0 if x.dim() == 1 else 1] + (t.numel() if reduction != "none" else 1)
    tol = 2.0**-23 * (8 + n_terms**0.5) * (ref.abs() + 1.0)
    assert torch.equal(torch.isnan(loss), torch.isnan(ref))
    ok = torch.isnan(ref) | (loss == ref) | ((loss - ref).abs() <= tol)
    assert ok.all(), f"loss err {(loss - ref).abs().max().item():.3g}"
    g = torch.rand(ref.shape, generator=gen) + 0.5
    (gx,) = torch.autograd.grad(loss, xm, g)
    (gr,) = torch.autograd.grad(ref, xr, g)
    assert gx.dtype == dtype and gx.shape == x.shape
    cdim = 0 if x.dim() == 1 else 1
    C = x.shape[cdim]
    gr64 = gr.double()
    # Size of the terms each gradient element is made of: the position's
    # coefficient g * ((1 - ls) * w_t + ls / C * (W + max w)); p_t - 1 may
    # cancel to far below it in either implementation.
    w64 = torch.ones(C, dtype=torch.float64) if weight is None else weight.double()
    keep = t != ignore_index
    wt = torch.where(keep, w64[t.clamp(0, C - 1)], 0.0)
    gpos = g.double()
    if reduction == "mean":
        gpos = gpos / wt.sum()
    coef = gpos.abs() * ((1 - label_smoothing) * wt + label_smoothing / C * (w64.sum() + w64.max()) * keep)
    coef = torch.nan_to_num(coef, nan=0.0).unsqueeze(cdim)  # all ignored: 0 * (g / 0)
    tol = EPS[dtype] * gr64.abs() + 2.0**-24 * (16 + C**0.5) * coef + TINY[dtype]
    err = (gx.double() - gr64).abs()
    if err.numel():
        nan_ok = torch.isnan(gr64)
        assert torch.equal(torch.isnan(gx.double()), nan_ok)
        ratio = torch.where(nan_ok, 0.0, err / tol)
        assert ratio.max() <= 1, f"grad err {err.max().item():.3g}"
    return loss, gx


CASES = [
    # shape, reduction, label_smoothing, weighted
    ((64, 1000), "mean", 0.0, False),
    ((64, 1000), "sum", 0.1, True),
    ((3, 50257), "none", 0.0, False),
    ((3, 50257), "mean", 0.2, True),
    ((4, 21, 9, 11), "mean", 0.0, True),  # segmentation, inner = 99
    ((4, 21, 9, 11), "none", 0.1, False),
    ((2, 5, 3, 40), "sum", 0.0, False),
    ((7,), "mean", 0.3, True),  # unbatched
    ((9, 3), "none", 0.5, True),
    ((6, 1), "mean", 0.1, False),  # one class
    ((5, 1, 7), "none", 0.0, True),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,reduction,ls,weighted", CASES)
def test_matches_torch_fp32(isa, gen, dtype, shape, reduction, ls, weighted):
    x, t = make(shape, dtype, gen)
    C = shape[0] if len(shape) == 1 else shape[1]
    w = torch.rand(C, generator=gen) + 0.1 if weighted else None
    compare(x, t, gen, weight=w, reduction=reduction, label_smoothing=ls)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("C", [1, 3, 1000])
def test_special_rows(isa, gen, dtype, C):
    big = {torch.float32: 1e30, torch.float16: 3e4, torch.bfloat16: 1e37}[dtype]
    rows = [
        torch.randn(C, generator=gen) * 3 + big,
        torch.randn(C, generator=gen) * 3 - big,
        torch.full((C,), 0.75),
        torch.randn(C, generator=gen) * big / 8,
    ]
    x = torch.stack(rows).to(dtype)
    t = torch.randint(0, C, (4,), generator=gen)
    for red in ("none", "mean", "sum"):
        compare(x, t, gen, reduction=red)
        compare(x, t, gen, reduction=red, label_smoothing=0.1, weight=torch.rand(C, generator=gen) + 0.5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_minus_inf_masked_logits(isa, gen, dtype):
    x = torch.randn(16, 40, generator=gen).to(dtype)
    t = torch.randint(0, 40, (16,), generator=gen)
    mask = torch.rand(16, 40, generator=gen) < 0.5
    mask[torch.arange(16), t] = False
    x[mask] = float("-inf")
    loss, gx = compare(x, t, gen)
    assert (gx[mask] == 0).all()
    # With label smoothing the -inf logits make the loss inf, as in torch.
    compare(x, t, gen, label_smoothing=0.1, reduction="none")


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_all_targets_ignored(isa, gen, reduction):
    x = torch.randn(5, 7, 3, generator=gen).bfloat16()
    t = torch.full((5, 3), 3)
    loss, gx = compare(x, t, gen, reduction=reduction, ignore_index=3, weight=torch.rand(7, generator=gen))
    if reduction == "mean":
        assert torch.isnan(loss)  # 0 / 0, as torch
    else:
        assert (loss == 0).all()
        assert (gx == 0).all()


def test_ignore_index_inside_class_range(isa, gen):
    x, t = make((32, 10), torch.float16, gen, ignore_frac=0)
    compare(x, t, gen, ignore_index=4, label_smoothing=0.1, weight=torch.rand(10, generator=gen) + 0.1)


def test_threads_do_not_change_results(gen):
    lib = cpu_lib()
    x, t = make((4, 21, 40, 41), torch.bfloat16, gen)
    outs = []
    for n in (1, 2):
        lib.mixprec_set_num_threads(n)
        xm = x.clone().requires_grad_()
        loss = mixprec.ops.cross_entropy(xm, t, label_smoothing=0.1)
        loss.backward()
        outs.append((loss.detach(), xm.grad))
    lib.mixprec_set_num_threads(0)
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def _peak_cpu_bytes(fn):
    """Peak of bytes allocated minus freed by torch's CPU allocator while fn
    runs (from the profiler's memory events, in time order)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
    )
    cur = peak = 0
    for _, b in events:
        cur += b
        peak = max(peak, cur)
    return peak


def test_peak_memory_below_upcast_path(gen):
    x, t = make((4, 21, 96, 96), torch.bfloat16, gen)
    x.requires_grad_()

    def upcast():
        F.cross_entropy(x.float(), t).backward()
        x.grad = None

    def ours():
        mixprec.ops.cross_entropy(x, t).backward()
        x.grad = None

    up, mp = _peak_cpu_bytes(upcast), _peak_cpu_bytes(ours)
    logits = x.numel() * x.element_size()
    print(f"\npeak forward+backward, bf16 logits {tuple(x.shape)} ({logits / 2**20:.2f} MiB): "
          f"upcast+torch {up / 2**20:.2f} MiB, mixprec {mp / 2**20:.2f} MiB")
    # mixprec: the bf16 gradient (1x logits) + 8 bytes per position (0.19x
    # at 21 classes) + scalars; the upcast path holds FP32 copies (2x each).
    assert mp < 0.5 * up
    assert mp <= logits * 1.5


def test_saved_tensors_hold_no_fp32_copy(gen):
    x, t = make((4, 21, 32, 32), torch.bfloat16, gen)
    x.requires_grad_()
    saved = []

    def pack(tensor):
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda v: v):
        loss = mixprec.ops.cross_entropy(x, t)
    big = [s for s in saved if s is not None and s.numel() == x.numel()]
    assert all(s.dtype == torch.bfloat16 and s.data_ptr() == x.data_ptr() for s in big)
    loss.backward()


def test_autocast_keeps_half_logits_and_fp32_loss(gen):
    lin = torch.nn.Linear(16, 10)
    inp = torch.randn(32, 16, generator=gen)
    t = torch.randint(0, 10, (32,), generator=gen)
    seen = []

    def pack(tensor):
        seen.append(tensor)
        return tensor

    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = lin(inp)
        assert logits.dtype == torch.bfloat16
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda v: v):
            loss = mixprec.ops.cross_entropy(logits, t)
        ref = F.cross_entropy(logits.float(), t)
    assert loss.dtype == torch.float32
    # What mixprec saved: the bf16 logits themselves, no FP32 copy of them.
    assert not [v for v in seen if v is not None and v.numel() == logits.numel() and v.dtype == torch.float32]
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    loss.backward()
    assert lin.weight.grad is not None


def test_nn_module(gen):
    x, t = make((8, 5, 6), torch.float16, gen, ignore_frac=0)
    w = torch.rand(5, generator=gen)
    m = mixprec.nn.CrossEntropyLoss(weight=w, ignore_index=2, reduction="sum", label_smoothing=0.05)
    r = torch.nn.CrossEntropyLoss(weight=w, ignore_index=2, reduction="sum", label_smoothing=0.05)
    torch.testing.assert_close(m(x, t), r(x.float(), t), rtol=1e-5, atol=1e-5)
    assert "weight" in dict(m.named_buffers())


@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck(gen, dtype):
    x, t = make((6, 9, 5), dtype, gen)
    x.requires_grad_()
    w = torch.rand(9, generator=gen)
    for args in ((x, t, None, 1, -100, 0.0), (x, t.clamp(min=0), w, 0, 2, 0.1), (x, t, w, 2, -100, 0.0)):
        torch.library.opcheck(torch.ops.mixprec.cross_entropy, args)
    loss, stats, wsum = torch.ops.mixprec.cross_entropy(x.detach(), t, w, 1, -100, 0.1)
    assert stats.shape == (2, 6, 5)
    torch.library.opcheck(
        torch.ops.mixprec.cross_entropy_backward, (torch.ones(()), x.detach(), t, w, stats, wsum, 1, -100, 0.1)
    )


# ---- bad inputs ------------------------------------------------------------------


def test_target_out_of_range_is_a_clear_error(isa, gen):
    x, t = make((8, 5), torch.bfloat16, gen, ignore_frac=0)
    before = x.clone()
    for bad in (5, -1, 1000):
        tb = t.clone()
        tb[3] = bad
        with pytest.raises(RuntimeError, match=r"mixprec::cross_entropy: target holds a class index out of range \[0, 5\)"):
            mixprec.ops.cross_entropy(x, tb)
    assert torch.equal(x, before)
    xs, ts = make((2, 5, 3, 3), torch.float16, gen, ignore_frac=0)
    ts[1, 2, 2] = 7
    with pytest.raises(RuntimeError, match="out of range"):
        mixprec.ops.cross_entropy(xs, ts)


def test_bad_target_dtype_and_shape(gen):
    x, t = make((8, 5), torch.bfloat16, gen)
    with pytest.raises(RuntimeError, match="mixprec::cross_entropy: target must be int64 class indices, got int32"):
        torch.ops.mixprec.cross_entropy(x, t.int(), None, 1, -100, 0.0)
    with pytest.raises(RuntimeError, match="mixprec::cross_entropy: target must be int64"):
        mixprec.ops.cross_entropy(x, torch.rand(8, 5))
    with pytest.raises(RuntimeError, match=r"mixprec::cross_entropy: target has shape \[7\]"):
        mixprec.ops.cross_entropy(x, t[:7])
    with pytest.raises(RuntimeError, match=r"mixprec::cross_entropy: target has shape \[8, 1\]"):
        mixprec.ops.cross_entropy(x, t[:, None])
    xs = torch.randn(2, 3, 4).half()
    with pytest.raises(RuntimeError, match=r"needs a target of shape \[2, 4\]"):
        mixprec.ops.cross_entropy(xs, torch.zeros(2, 3, dtype=torch.int64))


def test_bad_other_arguments(gen):
    x, t = make((8, 5), torch.bfloat16, gen)
    op = torch.ops.mixprec.cross_entropy
    with pytest.raises(RuntimeError, match="mixprec::cross_entropy: self must be float32, float16 or bfloat16, got float64"):
        op(x.double(), t, None, 1, -100, 0.0)
    with pytest.raises(RuntimeError, match="mixprec::cross_entropy: self must have shape"):
        op(torch.tensor(1.0), torch.tensor(0), None, 1, -100, 0.0)
    with pytest.raises(RuntimeError, match=r"mixprec::cross_entropy: weight must have shape \[5\]"):
        op(x, t, torch.ones(4), 1, -100, 0.0)
    with pytest.raises(RuntimeError, match="mixprec::cross_entropy: weight must be a float32 tensor"):
        op(x, t, torch.ones(5, dtype=torch.float64), 1, -100, 0.0)
    with pytest.raises(RuntimeError, match="mixprec::cross_entropy: reduction must be"):
        op(x, t, None, 3, -100, 0.0)
    with pytest.raises(RuntimeError, match=r"mixprec::cross_entropy: label_smoothing must be in \[0, 1\]"):
        op(x, t, None, 1, -100, 1.5)
    with pytest.raises(RuntimeError, match=r"mixprec::cross_entropy: label_smoothing must be in \[0, 1\]"):
        op(x, t, None, 1, -100, float("nan"))
    with pytest.raises(RuntimeError, match="mixprec::cross_entropy: self has 0 classes"):
        op(torch.zeros(3, 0), torch.zeros(3, dtype=torch.int64), None, 1, -100, 0.0)
    with pytest.raises(ValueError, match="reduction"):
        mixprec.ops.cross_entropy(x, t, reduction="avg")


def test_empty_batch_like_torch():
    x = torch.zeros(0, 5, dtype=torch.bfloat16)
    t = torch.zeros(0, dtype=torch.int64)
    assert torch.isnan(mixprec.ops.cross_entropy(x, t))
    assert mixprec.ops.cross_entropy(x, t, reduction="sum").item() == 0
    assert mixprec.ops.cross_entropy(x, t, reduction="none").shape == (0,)


def test_non_contiguous_logits(gen):
    x, t = make((4, 6, 5, 7), torch.bfloat16, gen)
    compare(x.to(memory_format=torch.channels_last), t, gen, label_smoothing=0.1)
    x2, t2 = make((10, 12), torch.float16, gen)
    compare(x2.t().contiguous().t(), t2, gen)


def test_torch_compile_forward_and_backward(gen):
    x, t = make((4, 7, 5, 3), torch.bfloat16, gen)
    w = torch.rand(7, generator=gen) + 0.5

    def f(v):
        return mixprec.ops.cross_entropy(v, t, w, label_smoothing=0.1)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    la, lb = f(xa), compiled(xb)
    la.backward()
    lb.backward()
    assert torch.equal(la.detach(), lb.detach())
    assert torch.equal(xa.grad, xb.grad)
