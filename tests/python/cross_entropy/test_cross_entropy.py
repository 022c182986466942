"""mixprec.ops.cross_entropy (forward and backward) against
torch.nn.functional.cross_entropy on the input upcast to FP32, on both CPU
paths; weight / ignore_index / label_smoothing / reductions, special rows,
all-ignored batches, one class, odd class counts; peak memory against the
upcast path; autocast; opcheck; bad inputs. Class-probability (soft) targets: against
torch on float64 inputs (every logits x target dtype pair, Dirichlet-like and
mixup two-hot targets), timm's Mixup/CutMix + SoftTargetCrossEntropy,
torchvision's v2 MixUp/CutMix, gradients of the target, eager / aot_eager /
inductor, opcheck, memory, bad inputs."""

import pytest
import torch
import torch.nn.functional as F

import mixprec

from _op_tester import OpTester
from _reference import DTYPES, EPS, TINY, ce_peaks, cpu_lib

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
    xm = x.clone().requires_grad_()
    loss = mixprec.ops.cross_entropy(xm, t, weight, ignore_index, reduction, label_smoothing)
    check_loss(x, t, loss, weight, ignore_index, reduction, label_smoothing)
    g = torch.rand(loss.shape, generator=gen) + 0.5
    (gx,) = torch.autograd.grad(loss, xm, g)
    check_grad(x, t, g, gx, weight, ignore_index, reduction, label_smoothing)
    return loss, gx


def _torch_loss(x, t, weight, ignore_index, reduction, label_smoothing):
    return F.cross_entropy(x, t, weight, ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing)


def check_loss(x, t, loss, weight, ignore_index, reduction, label_smoothing):
    """mixprec's loss vs torch's on the FP32 upcast input."""
    ref = _torch_loss(x.float(), t, weight, ignore_index, reduction, label_smoothing)
    assert loss.dtype == torch.float32 and loss.shape == ref.shape
    # Loss: FP32 rounding of a sum over classes and positions (both sides).
    n_terms = x.shape[0 if x.dim() == 1 else 1] + (t.numel() if reduction != "none" else 1)
    tol = 2.0**-23 * (8 + n_terms**0.5) * (ref.abs() + 1.0)
    assert torch.equal(torch.isnan(loss), torch.isnan(ref))
    ok = torch.isnan(ref) | (loss == ref) | ((loss - ref).abs() <= tol)
    assert ok.all(), f"loss err {(loss - ref).abs().max().item():.3g}"


def check_grad(x, t, g, gx, weight, ignore_index, reduction, label_smoothing):
    """mixprec's gradient gx (for the loss's gradient g) vs torch's autograd
    on the FP32 upcast input."""
    dtype = x.dtype
    xr = x.float().requires_grad_()
    (gr,) = torch.autograd.grad(_torch_loss(xr, t, weight, ignore_index, reduction, label_smoothing), xr, g)
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


def special_rows(dtype, C, gen, spread=None):
    """Four rows of C logits in dtype: near the largest finite value the
    dtype takes, near its negative, constant, and spread widely (by
    ``spread``, default an eighth of that value)."""
    big = {torch.float32: 1e30, torch.float16: 3e4, torch.bfloat16: 1e37}[dtype]
    rows = [
        torch.randn(C, generator=gen) * 3 + big,
        torch.randn(C, generator=gen) * 3 - big,
        torch.full((C,), 0.75),
        torch.randn(C, generator=gen) * (big / 8 if spread is None else spread),
    ]
    return torch.stack(rows).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("C", [1, 3, 1000])
def test_special_rows(isa, gen, dtype, C):
    x = special_rows(dtype, C, gen)
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


# One memory check per target kind: BF16 logits with int64 class indices
# (4x21x96x96, 20% ignored) and with FP32 (peak check) / BF16 (saved-tensor
# check) class probabilities (256x1000). Bound on mixprec's peak, in logits'
# bytes: class indices: the bf16 gradient (1x) + 8 bytes per position (0.19x
# at 21 classes) + scalars; soft: the gradient + 12 bytes per position. The
# upcast path holds FP32 copies of the logits and log-probabilities (2x each).
PEAK_CASES = {
    "class-index": ((4, 21, 96, 96), None, 1.5),
    "soft": ((256, 1000), torch.float32, 1.2),
}


def _ce_bf16_inputs(shape, soft_dtype, gen):
    """BF16 logits and a target: class indices (soft_dtype None) or class
    probabilities in soft_dtype."""
    if soft_dtype is None:
        x, t = make(shape, torch.bfloat16, gen)
    else:
        x, t = torch.randn(shape, generator=gen).bfloat16(), soft_target(shape, soft_dtype, gen)
    return x.requires_grad_(), t


@pytest.mark.parametrize("kind", list(PEAK_CASES))
def test_peak_memory_below_upcast_path(gen, kind):
    shape, soft_dtype, per_logit = PEAK_CASES[kind]
    x, t = _ce_bf16_inputs(shape, soft_dtype, gen)
    up, mp = ce_peaks(x, t, _peak_cpu_bytes)
    logits = x.numel() * x.element_size()
    print(f"\npeak forward+backward, bf16 logits {tuple(x.shape)} ({logits / 2**20:.2f} MiB), {kind} target: "
          f"upcast+torch {up / 2**20:.2f} MiB, mixprec {mp / 2**20:.2f} MiB")
    assert mp < 0.5 * up
    assert mp <= logits * per_logit


@pytest.mark.parametrize("soft_dtype", [None, torch.bfloat16], ids=["class-index", "soft"])
def test_saved_tensors_hold_no_fp32_copy(gen, soft_dtype):
    """Autograd saves no FP32 copy of the logits: every logits-sized saved
    tensor is BF16 and is the logits (or the soft target) themselves."""
    x, t = _ce_bf16_inputs((4, 21, 32, 32), soft_dtype, gen)
    saved = []

    def pack(tensor):
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda v: v):
        loss = mixprec.ops.cross_entropy(x, t)
    big = [s for s in saved if s is not None and s.numel() == x.numel()]
    assert big and all(s.dtype == torch.bfloat16 and s.data_ptr() in (x.data_ptr(), t.data_ptr()) for s in big)
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


def test_bad_reduction_string(gen):
    x, t = make((8, 5), torch.bfloat16, gen)
    with pytest.raises(ValueError, match="reduction"):
        mixprec.ops.cross_entropy(x, t, reduction="avg")


# ---- class-probability (soft) targets ----------------------------------------------


def soft_target(shape, dtype, gen, kind="dirichlet"):
    """Class probabilities of ``shape`` (classes on dim 1, or dim 0 unbatched):
    Dirichlet-like (softmax of a random vector, peaked or flat), or mixup's
    two-hot lam * onehot(a) + (1 - lam) * onehot(b)."""
    cdim = 0 if len(shape) == 1 else 1
    C = shape[cdim]
    if kind == "dirichlet":
        t = torch.softmax(torch.randn(shape, generator=gen) * 3, cdim)
    else:
        moved = (*shape[:cdim], *shape[cdim + 1:])
        a = torch.randint(0, C, moved, generator=gen)
        b = torch.randint(0, C, moved, generator=gen)
        lam = torch.rand((), generator=gen).item()
        oa = F.one_hot(a, C).movedim(-1, cdim).float()
        ob = F.one_hot(b, C).movedim(-1, cdim).float()
        t = lam * oa + (1 - lam) * ob
    return t.to(dtype)


def _soft_ref(x, t, weight, reduction, label_smoothing, target_grad):
    """torch's loss on the float64 upcast inputs (leaves taking gradients)
    and what the bounds are made of: (xr, tr, ref, wv, tp, logp)."""
    cdim = 0 if x.dim() == 1 else 1
    C = x.shape[cdim]
    xr = x.detach().double().requires_grad_()
    tr = t.detach().double().requires_grad_(target_grad)
    w64 = None if weight is None else weight.double()
    ref = F.cross_entropy(xr, tr, w64, reduction=reduction, label_smoothing=label_smoothing)
    with torch.no_grad():
        wv = torch.ones(C, dtype=torch.float64) if w64 is None else w64
        wv = wv.view([C] + [1] * (x.dim() - 1 - cdim))
        tp = tr * (1 - label_smoothing) + label_smoothing / C
        logp = torch.log_softmax(xr, cdim)
    return xr, tr, ref, wv, tp, logp


def check_soft_loss(x, t, loss, weight, reduction, label_smoothing):
    """mixprec's loss vs torch on the float64 upcast inputs (exact for the
    rounded inputs), within a bound from the sizes of the terms it is made of."""
    cdim = 0 if x.dim() == 1 else 1
    C = x.shape[cdim]
    _, _, ref, wv, tp, logp = _soft_ref(x, t, weight, reduction, label_smoothing, False)
    assert loss.dtype == torch.float32 and loss.shape == ref.shape
    # Size of the terms: sum_c |w t' log p| per position (reduced like the
    # loss), plus sum_c |w t'| for the log-sum's absolute error (an ulp of a
    # sum near 1 when the loss is small; torch's FP32 log_softmax has it too).
    terms = ((wv * tp * logp).abs().nan_to_num(0.0) + (wv * tp).abs()).sum(cdim)
    if reduction == "sum":
        terms = terms.sum()
    elif reduction == "mean":
        terms = terms.mean() if terms.numel() else terms.sum()
    tol = 2.0**-21 * (16 + C**0.5) * terms + 1e-30
    assert torch.equal(torch.isnan(loss), torch.isnan(ref))
    err = (loss.double() - ref.detach()).abs()
    assert (torch.isnan(ref) | (err <= tol)).all(), f"loss err {err.max().item():.3g} tol {tol.min().item():.3g}"


def check_soft_grads(x, t, g, grads, weight, reduction, label_smoothing):
    """mixprec's gradients (of the logits, and of the target when ``grads``
    has two) for the loss's gradient g vs torch's autograd on the float64
    upcast inputs, within bounds from the sizes of the terms each is made of."""
    cdim = 0 if x.dim() == 1 else 1
    C = x.shape[cdim]
    target_grad = len(grads) == 2
    xr, tr, ref, wv, tp, logp = _soft_ref(x, t, weight, reduction, label_smoothing, target_grad)
    gr = torch.autograd.grad(ref, (xr, tr) if target_grad else (xr,), g.double())
    assert grads[0].dtype == x.dtype and grads[0].shape == x.shape
    with torch.no_grad():
        gpos = g.double()
        if reduction == "mean":
            gpos = gpos / max(1, (x.numel() // C if x.dim() > 1 else 1))
        gpos = (gpos.unsqueeze(cdim) if reduction == "none" else gpos).abs()
        p = logp.exp()
        T = (wv * tp).sum(cdim, keepdim=True).abs()
        lp = logp.abs().nan_to_num(0.0, posinf=0.0)
        # dx = g (T p - w t'): rounding of each part, exp's error growing with |log p|.
        coef = gpos * (T * p * (4 + lp) + (wv * tp).abs())
        tol_x = EPS[x.dtype] * gr[0].abs() + 2.0**-21 * (16 + C**0.5) * coef + TINY[x.dtype]
        ex = (grads[0].double() - gr[0]).abs()
        assert (torch.isnan(gr[0]) | (ex <= tol_x)).all(), f"grad x err {ex.max().item():.3g}"
        if target_grad:
            assert grads[1].dtype == t.dtype and grads[1].shape == t.shape
            xmax = xr.amax(cdim, keepdim=True)
            lse = torch.logsumexp(xr, cdim, keepdim=True)
            # log p = (x - max) - log-sum: the rounding of each part, and the
            # log-sum's own error (a float sum of C exponentials).
            coef_t = gpos * (1 - label_smoothing) * wv.abs()
            err_lp = 2.0**-22 * ((xr - xmax).abs() + (lse - xmax).abs() + 16 + C**0.5)
            tol_t = EPS[t.dtype] * gr[1].abs() + coef_t * err_lp + TINY[t.dtype]
            et = (grads[1].double() - gr[1]).abs()
            assert (torch.isnan(gr[1]) | (et <= tol_t)).all(), f"grad target err {et.max().item():.3g}"


def compare_soft(x, t, gen, *, weight=None, reduction="mean", label_smoothing=0.0, target_grad=True):
    """Loss and gradients of mixprec vs torch on the float64 upcast inputs
    (check_soft_loss, check_soft_grads); returns (loss, gradients)."""
    xm = x.clone().requires_grad_()
    tm = t.clone().requires_grad_(target_grad)
    loss = mixprec.ops.cross_entropy(xm, tm, weight, reduction=reduction, label_smoothing=label_smoothing)
    check_soft_loss(x, t, loss, weight, reduction, label_smoothing)
    g = torch.rand(loss.shape, generator=gen) + 0.5
    gm = torch.autograd.grad(loss, (xm, tm) if target_grad else (xm,), g)
    check_soft_grads(x, t, g, gm, weight, reduction, label_smoothing)
    return loss, gm


SOFT_CASES = [
    # shape, reduction, label_smoothing, weighted, kind
    ((64, 1000), "mean", 0.0, False, "dirichlet"),
    ((64, 1000), "mean", 0.1, False, "twohot"),
    ((32, 1000), "sum", 0.1, True, "dirichlet"),
    ((3, 50257), "none", 0.0, False, "dirichlet"),
    ((3, 50257), "mean", 0.2, True, "twohot"),
    ((4, 21, 9, 11), "mean", 0.0, True, "dirichlet"),  # segmentation, inner = 99
    ((4, 21, 9, 11), "none", 0.1, False, "twohot"),
    ((2, 5, 3, 40), "sum", 0.0, False, "dirichlet"),
    ((7,), "mean", 0.3, True, "dirichlet"),  # unbatched
    ((9, 3), "none", 0.5, True, "twohot"),
    ((6, 1), "mean", 0.1, False, "dirichlet"),  # one class
    ((5, 13, 7), "none", 0.0, True, "dirichlet"),
]


# Logits dtype x target dtype x case as a Latin square, not the full grid:
# case i with logits DTYPES[d] takes target DTYPES[(i + d) % 3]
# (soft_target_dtype). Every pair of the three still meets (each case in each
# logits dtype and with each target dtype; each of the 9 dtype pairs on 4
# cases), on every CPU path; the full 12 x 3 x 3 grid was 324 tests, 44% of
# this folder's time, for combinations no pair of which is new (the target is
# read through its own dtype's load, independently of the logits' dtype).
# TestSoftCrossEntropy runs them (forward and both gradients against torch on
# float64 inputs).


def soft_target_dtype(case, dtype):
    """The target dtype of a SOFT_CASES case with logits of ``dtype`` (the
    Latin square above); float32 for a case outside the list."""
    if case not in SOFT_CASES:
        return torch.float32
    return DTYPES[(SOFT_CASES.index(case) + DTYPES.index(dtype)) % len(DTYPES)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("C", [1, 3, 1000])
def test_soft_special_rows(isa, gen, dtype, C):
    x = special_rows(dtype, C, gen, spread=40)
    t = soft_target((4, C), torch.float32, gen)
    for red in ("none", "mean", "sum"):
        compare_soft(x, t, gen, reduction=red)
        compare_soft(x, t, gen, reduction=red, label_smoothing=0.1, weight=torch.rand(C, generator=gen) + 0.5)


def test_soft_nan_and_unnormalised_targets_like_torch(isa, gen):
    x = torch.randn(6, 17, generator=gen).bfloat16()
    t = soft_target((6, 17), torch.float32, gen)
    t[2, 5] = float("nan")
    x[4, 3] = float("nan")
    loss = mixprec.ops.cross_entropy(x, t, reduction="none")
    ref = F.cross_entropy(x.float(), t, reduction="none")
    assert torch.equal(torch.isnan(loss), torch.isnan(ref)) and torch.isnan(loss).sum() == 2
    # torch checks neither the sum nor the sign of the probabilities.
    compare_soft(x[:2].clone(), (t[:2] * 3 - 0.1).contiguous(), gen, reduction="sum")


def test_soft_timm_mixup_cutmix_and_loss(gen):
    timm_data = pytest.importorskip("timm.data")
    timm_loss = pytest.importorskip("timm.loss")
    torch.manual_seed(zlib_seed(gen))
    mix = timm_data.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=100)
    imgs = torch.randn(16, 3, 8, 8, generator=gen)
    labels = torch.randint(0, 100, (16,), generator=gen)
    for _ in range(3):  # mixup or cutmix, chosen at random inside
        _, target = mix(imgs.clone(), labels)
        assert target.shape == (16, 100) and target.dtype == torch.float32
        for dtype in DTYPES:
            x = (torch.randn(16, 100, generator=gen) * 3).to(dtype)
            compare_soft(x, target, gen)
            xm = x.clone().requires_grad_()
            ours = mixprec.nn.CrossEntropyLoss()(xm, target)
            xr = x.float().requires_grad_()
            theirs = timm_loss.SoftTargetCrossEntropy()(xr, target)
            torch.testing.assert_close(ours, theirs, rtol=2e-6, atol=1e-6)
            ours.backward()
            theirs.backward()
            torch.testing.assert_close(xm.grad.float(), xr.grad, rtol=EPS[dtype], atol=1e-6)


def zlib_seed(gen):
    return int(torch.randint(0, 2**31, (), generator=gen))


def test_soft_torchvision_mixup_cutmix(gen):
    v2 = pytest.importorskip("torchvision.transforms.v2")
    torch.manual_seed(zlib_seed(gen))
    imgs = torch.randn(8, 3, 16, 16, generator=gen)
    labels = torch.randint(0, 10, (8,), generator=gen)
    for tf in (v2.MixUp(num_classes=10), v2.CutMix(num_classes=10)):
        _, target = tf(imgs, labels)
        assert target.shape == (8, 10) and target.is_floating_point()
        x = torch.randn(8, 10, generator=gen).bfloat16()
        compare_soft(x, target, gen, label_smoothing=0.1)


def test_soft_only_target_requires_grad(gen):
    """Distillation with a learned target: only the target asks for a
    gradient."""
    x = torch.randn(8, 30, generator=gen).half()
    t = soft_target((8, 30), torch.float32, gen).requires_grad_()
    loss = mixprec.ops.cross_entropy(x, t, label_smoothing=0.1)
    loss.backward()
    tr = t.detach().clone().requires_grad_()
    F.cross_entropy(x.float(), tr, label_smoothing=0.1).backward()
    torch.testing.assert_close(t.grad, tr.grad, rtol=1e-5, atol=1e-7)


def test_soft_threads_do_not_change_results(gen):
    lib = cpu_lib()
    x = torch.randn(4, 21, 40, 41, generator=gen).bfloat16()
    t = soft_target((4, 21, 40, 41), torch.bfloat16, gen)
    outs = []
    for n in (1, 2):
        lib.mixprec_set_num_threads(n)
        xm, tm = x.clone().requires_grad_(), t.clone().requires_grad_()
        loss = mixprec.ops.cross_entropy(xm, tm, label_smoothing=0.1)
        loss.backward()
        outs.append((loss.detach(), xm.grad, tm.grad))
    lib.mixprec_set_num_threads(0)
    assert all(torch.equal(a, b) for a, b in zip(*outs))


def test_soft_nn_module_and_autocast(gen):
    lin = torch.nn.Linear(16, 10)
    inp = torch.randn(32, 16, generator=gen)
    t = soft_target((32, 10), torch.float32, gen)
    w = torch.rand(10, generator=gen) + 0.5
    m = mixprec.nn.CrossEntropyLoss(weight=w, reduction="sum", label_smoothing=0.05)
    r = torch.nn.CrossEntropyLoss(weight=w, reduction="sum", label_smoothing=0.05)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = lin(inp)
        assert logits.dtype == torch.bfloat16
        loss = m(logits, t)
        ref = r(logits.float(), t)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    loss.backward()
    assert lin.weight.grad is not None


def test_soft_float64_target_taken_as_float32(gen):
    x = torch.randn(8, 12, generator=gen).half()
    t = soft_target((8, 12), torch.float64, gen)
    loss = mixprec.ops.cross_entropy(x, t)
    torch.testing.assert_close(loss, F.cross_entropy(x.float(), t.float()), rtol=1e-6, atol=1e-6)


def test_soft_non_contiguous_inputs(gen):
    x = torch.randn(4, 6, 5, 7, generator=gen).bfloat16().to(memory_format=torch.channels_last)
    t = soft_target((4, 6, 5, 7), torch.float32, gen).to(memory_format=torch.channels_last)
    compare_soft(x, t, gen, label_smoothing=0.1)
    x2 = torch.randn(12, 10, generator=gen).half().t()
    t2 = soft_target((12, 10), torch.float32, gen, "twohot").t()
    compare_soft(x2, t2, gen)


def test_soft_torch_compile_forward_and_backward(gen):
    """Through inductor, as a training step compiles it (aot_eager: the
    OpTester's compile check, TestSoftCrossEntropy)."""
    x = torch.randn(4, 7, 5, 3, generator=gen).bfloat16()
    t = soft_target((4, 7, 5, 3), torch.float32, gen, "twohot")
    w = torch.rand(7, generator=gen) + 0.5

    def f(v, tt):
        return mixprec.ops.cross_entropy(v, tt, w, label_smoothing=0.1)

    xa, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    la = f(xa, t)
    la.backward()
    lc = torch.compile(f, fullgraph=True)(xc, t)
    lc.backward()
    assert torch.equal(la.detach(), lc.detach()) and torch.equal(xa.grad, xc.grad)


@pytest.mark.parametrize("shape", [(16, 100), (4, 7, 50), (2, 3, 5, 11)])
def test_soft_target_cross_entropy_module_is_timms(gen, shape):
    """mixprec.nn.SoftTargetCrossEntropy against timm's (classes on the last
    dimension), loss and gradient, half logits."""
    timm_loss = pytest.importorskip("timm.loss")
    x = (torch.randn(shape, generator=gen) * 3).bfloat16()
    t = torch.softmax(torch.randn(shape, generator=gen) * 2, -1)
    xm = x.clone().requires_grad_()
    ours = mixprec.nn.SoftTargetCrossEntropy()(xm, t)
    xr = x.float().requires_grad_()
    theirs = timm_loss.SoftTargetCrossEntropy()(xr, t)
    assert ours.dtype == torch.float32 and ours.shape == ()
    torch.testing.assert_close(ours, theirs, rtol=2e-6, atol=1e-6)
    ours.backward()
    theirs.backward()
    torch.testing.assert_close(xm.grad.float(), xr.grad, rtol=2**-7, atol=1e-7)


@pytest.mark.parametrize("ignore_index", [-100, -1, -7, -(2**40), 0, 2, 4, 5, 10**9])
def test_soft_ignore_index_accepted_and_refused_as_torch(gen, ignore_index):
    # torch refuses ignore_index >= 0 with probability targets and takes any
    # negative value (it then changes nothing); mixprec.ops and mixprec.nn alike.
    x = (torch.randn(8, 5, 3, generator=gen) * 3).bfloat16()
    t = soft_target((8, 5, 3), torch.float32, gen)
    w = torch.rand(5, generator=gen) + 0.5
    kwargs = dict(weight=w, ignore_index=ignore_index, label_smoothing=0.1)
    try:
        ref = F.cross_entropy(x.double(), t.double(), w.double(), ignore_index=ignore_index, label_smoothing=0.1)
    except RuntimeError as e:
        assert "ignore_index is not supported for floating point target" in str(e)
        msg = rf"mixprec::cross_entropy_soft: ignore_index \({ignore_index}\) is not supported"
        xs, ts = x.clone(), t.clone()
        with pytest.raises(RuntimeError, match=msg):
            mixprec.ops.cross_entropy(x, t, **kwargs)
        with pytest.raises(RuntimeError, match=msg):
            mixprec.nn.CrossEntropyLoss(**kwargs)(x, t)
        assert torch.equal(x, xs) and torch.equal(t, ts)
        assert ignore_index >= 0
        return
    assert ignore_index < 0
    losses = [mixprec.ops.cross_entropy(x, t, **kwargs), mixprec.nn.CrossEntropyLoss(**kwargs)(x, t)]
    # Same bits as the default ignore_index: a negative value is unused.
    base = mixprec.ops.cross_entropy(x, t, w, label_smoothing=0.1)
    for loss in losses:
        assert loss.dtype == torch.float32 and torch.equal(loss, base)
        assert abs(loss.item() - ref.item()) <= 1e-5 * (abs(ref.item()) + 1)


# ---- the OpTester checks -------------------------------------------------------

_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


class TestCrossEntropy(OpTester):
    """Class-index targets; a case is (shape, reduction, label_smoothing,
    weighted); call is mixprec.ops.cross_entropy."""

    cases = CASES
    isas = ["scalar", "avx2", "avx512"]
    grad_argnums = (0,)
    layout_case = ((4, 7, 5, 3), "mean", 0.1, True)

    @staticmethod
    def case_id(case):
        shape, red, ls, weighted = case
        return "x".join(map(str, shape)) + f"-{red}-ls{ls}" + ("-w" if weighted else "")

    def make_inputs(self, gen, dtype, device, case):
        shape, reduction, ls, weighted = case
        x, t = make(shape, dtype, gen)
        C = shape[0] if len(shape) == 1 else shape[1]
        w = torch.rand(C, generator=gen) + 0.1 if weighted else None
        return x.to(device), t.to(device), None if w is None else w.to(device), -100, reduction, ls

    def call(self, x, t, w, ignore_index, reduction, ls):
        return mixprec.ops.cross_entropy(x, t, w, ignore_index, reduction, ls)

    @staticmethod
    def _cpu(args):
        return [a.cpu() if isinstance(a, torch.Tensor) else a for a in args]

    def check_forward(self, args, loss, case):
        x, t, w, ignore_index, reduction, ls = self._cpu(args)
        check_loss(x, t, loss.cpu(), w, ignore_index, reduction, ls)

    def grad_output(self, gen, loss):
        return (torch.rand(loss.shape, generator=gen) + 0.5).to(loss.device)

    def check_backward(self, args, loss, g, grads, case):
        x, t, w, ignore_index, reduction, ls = self._cpu(args)
        check_grad(x, t, g.cpu(), grads[0].cpu(), w, ignore_index, reduction, ls)

    def opcheck_cases(self, gen, dtype):
        x, t = make((6, 9, 5), dtype, gen)
        x.requires_grad_()
        w = torch.rand(9, generator=gen)
        op, bop = torch.ops.mixprec.cross_entropy, torch.ops.mixprec.cross_entropy_backward
        loss, stats, wsum = op(x.detach(), t, w, 1, -100, 0.1)
        assert stats.shape == (2, 6, 5)
        return [(op, (x, t, None, 1, -100, 0.0)), (op, (x, t.clamp(min=0), w, 0, 2, 0.1)), (op, (x, t, w, 2, -100, 0.0)),
                (bop, (torch.ones(()), x.detach(), t, w, stats, wsum, 1, -100, 0.1))]

    def empty_inputs(self, dtype, device):
        x = torch.zeros(0, 5, dtype=dtype, device=device)
        t = torch.zeros(0, dtype=torch.int64, device=device)
        return [(x, t, None, -100, red, 0.0) for red in _REDUCTIONS]

    def check_empty(self, args, loss):
        check_empty_loss(loss, args[4])

    def noncontiguous(self, args):
        x, *rest = args
        return [(x.to(memory_format=torch.channels_last), *rest), (x.transpose(2, 3).contiguous().transpose(2, 3), *rest),
                (x.transpose(1, 3).contiguous().transpose(1, 3), *rest)]  # the classes innermost

    @classmethod
    def bad_cases(cls):
        op = torch.ops.mixprec.cross_entropy
        ce = mixprec.ops.cross_entropy

        def small(a):
            """(8, 5) bfloat16 logits and int64 targets in range, from the case's."""
            return a[0][:8, :5].bfloat16(), a[1][:8].clamp(0, 4)

        def case(name, fn, msg):
            return (name, lambda a: lambda: fn(*small(a)), "mixprec::cross_entropy: " + msg)

        return [
            case("target int32", lambda x, t: op(x, t.int(), None, 1, -100, 0.0), "target must be int64 class indices, got int32"),
            # A float target of the class-index shape (8,): not int64, and not of
            # self's shape either (torch.rand(8, 5) would be valid probabilities).
            case("target float (N,)", lambda x, t: ce(x, torch.rand(8)), "target must be int64 .*must have self's shape"),
            case("target length", lambda x, t: ce(x, t[:7]), r"target has shape \[7\]"),
            case("target 2-D", lambda x, t: ce(x, t[:, None]), r"target has shape \[8, 1\]"),
            case("target shape 3-D", lambda x, t: ce(torch.randn(2, 3, 4).half(), torch.zeros(2, 3, dtype=torch.int64)),
                 r"target has shape \[2, 3\] but self .* needs a target of shape \[2, 4\]"),
            case("self float64", lambda x, t: op(x.double(), t, None, 1, -100, 0.0), "self must be float32, float16 or bfloat16, got float64"),
            case("self 0-dim", lambda x, t: op(torch.tensor(1.0), torch.tensor(0), None, 1, -100, 0.0), "self must have shape"),
            case("weight shape", lambda x, t: op(x, t, torch.ones(4), 1, -100, 0.0), r"weight must have shape \[5\]"),
            case("weight float64", lambda x, t: op(x, t, torch.ones(5, dtype=torch.float64), 1, -100, 0.0), "weight must be a float32 tensor"),
            case("reduction 3", lambda x, t: op(x, t, None, 3, -100, 0.0), "reduction must be"),
            case("label_smoothing 1.5", lambda x, t: op(x, t, None, 1, -100, 1.5), r"label_smoothing must be in \[0, 1\]"),
            case("label_smoothing nan", lambda x, t: op(x, t, None, 1, -100, float("nan")), r"label_smoothing must be in \[0, 1\]"),
            case("0 classes", lambda x, t: op(torch.zeros(3, 0), torch.zeros(3, dtype=torch.int64), None, 1, -100, 0.0), "self has 0 classes"),
        ]


def check_empty_loss(loss, reduction):
    """The loss of an empty batch, as torch gives it: FP32; NaN for mean
    (0 / 0), 0 for sum, an empty tensor for none."""
    assert loss.dtype == torch.float32
    if reduction == "mean":
        assert torch.isnan(loss)  # 0 / 0, as torch
    elif reduction == "sum":
        assert loss.item() == 0
    else:
        assert loss.shape == (0,)


class TestSoftCrossEntropy(OpTester):
    """Class-probability targets; a case is (shape, reduction,
    label_smoothing, weighted, target kind) of SOFT_CASES, its target dtype
    soft_target_dtype's; call is mixprec.ops.cross_entropy; gradients of
    the logits and of the target, against torch on float64 inputs."""

    cases = SOFT_CASES
    isas = ["scalar", "avx2", "avx512"]
    grad_argnums = (0, 1)
    layout_case = ((4, 7, 5, 3), "mean", 0.1, True, "twohot")

    @staticmethod
    def case_id(case):
        shape, red, ls, weighted, kind = case
        return "x".join(map(str, shape)) + f"-{red}-ls{ls}" + ("-w" if weighted else "") + f"-{kind}"

    def make_inputs(self, gen, dtype, device, case):
        shape, reduction, ls, weighted, kind = case
        x = (torch.randn(shape, generator=gen) * 4).to(dtype)
        t = soft_target(shape, soft_target_dtype(case, dtype), gen, kind)
        C = shape[0] if len(shape) == 1 else shape[1]
        w = torch.rand(C, generator=gen) + 0.1 if weighted else None
        return x.to(device), t.to(device), None if w is None else w.to(device), reduction, ls

    def call(self, x, t, w, reduction, ls):
        return mixprec.ops.cross_entropy(x, t, w, reduction=reduction, label_smoothing=ls)

    @staticmethod
    def _cpu(args):
        return [a.cpu() if isinstance(a, torch.Tensor) else a for a in args]

    def check_forward(self, args, loss, case):
        x, t, w, reduction, ls = self._cpu(args)
        check_soft_loss(x, t, loss.cpu(), w, reduction, ls)

    def grad_output(self, gen, loss):
        return (torch.rand(loss.shape, generator=gen) + 0.5).to(loss.device)

    def check_backward(self, args, loss, g, grads, case):
        x, t, w, reduction, ls = self._cpu(args)
        check_soft_grads(x, t, g.cpu(), [gr.cpu() for gr in grads], w, reduction, ls)

    def opcheck_cases(self, gen, dtype):
        x = torch.randn(6, 9, 5, generator=gen).to(dtype).requires_grad_()
        t = soft_target((6, 9, 5), torch.bfloat16, gen).requires_grad_()
        w = torch.rand(9, generator=gen)
        op, bop = torch.ops.mixprec.cross_entropy_soft, torch.ops.mixprec.cross_entropy_soft_backward
        x1 = torch.randn(33, generator=gen).to(dtype).requires_grad_()
        cases = [(op, args) for args in ((x, t, None, 1, 0.0), (x, t.detach().float(), w, 0, 0.1), (x, t, w, 2, 0.0),
                                         (x1, soft_target((33,), torch.float16, gen), torch.ones(33), 1, 0.2))]
        for red, gl in ((1, torch.ones(())), (0, torch.rand(6, 5, generator=gen))):
            _, stats = op(x.detach(), t.detach(), w, red, 0.1)
            assert stats.shape == (3, 6, 5)
            for sg, tg in ((True, True), (True, False), (False, True)):
                cases.append((bop, (gl, x.detach(), t.detach(), w, stats, red, 0.1, sg, tg)))
        return cases

    def empty_inputs(self, dtype, device):
        x = torch.zeros(0, 5, dtype=dtype, device=device)
        t = torch.zeros(0, 5, device=device)
        return [(x, t, None, red, 0.0) for red in _REDUCTIONS]

    def check_empty(self, args, loss):
        x, t, _, reduction, _ = self._cpu(args)
        check_empty_loss(loss, reduction)
        ref = F.cross_entropy(x.float(), t, reduction=reduction)
        assert loss.shape == ref.shape and torch.equal(torch.isnan(loss.cpu()), torch.isnan(ref))

    def noncontiguous(self, args):
        x, t, *rest = args
        cl = torch.channels_last
        return [(x.to(memory_format=cl), t.to(memory_format=cl), *rest), (x.to(memory_format=cl), t, *rest),
                (x.transpose(1, 3).contiguous().transpose(1, 3), t.transpose(2, 3).contiguous().transpose(2, 3), *rest)]

    @classmethod
    def bad_cases(cls):
        op = torch.ops.mixprec.cross_entropy_soft
        bop = torch.ops.mixprec.cross_entropy_soft_backward
        ce = mixprec.ops.cross_entropy

        def small(a):
            """(8, 5) float32 logits and class probabilities: views of the case's."""
            return a[0][:8, :5], a[1][:8, :5]

        def case(name, fn, msg, soft=True):
            prefix = "mixprec::cross_entropy_soft" if soft else "mixprec::cross_entropy"
            return (name, lambda a: lambda: fn(*small(a)), prefix + msg)

        def backward(name, fn, msg):
            def make(a):
                x, t = small(a)
                _, stats = op(x, t, None, 1, 0.0)
                return lambda: fn(x, t, stats)

            return (name, make, "mixprec::cross_entropy_soft_backward: " + msg)

        return [
            case("target int64", lambda x, t: ce(x, torch.zeros(8, 5, dtype=torch.int64)),
                 ": target holds class probabilities and must be float32, float16 or bfloat16, got int64"),
            case("target float64", lambda x, t: op(x, t.double(), None, 1, 0.0), ": target .* got float64"),
            case("target shape", lambda x, t: op(x, torch.rand(8, 6), None, 1, 0.0),
                 r": target has shape \[8, 6\] but class probabilities must have self's shape \[8, 5\]"),
            # Through the function a float target of another shape is a class-index
            # target of the wrong dtype, and the message says what shape it needs.
            case("public target shape", lambda x, t: ce(x, torch.rand(8, 6)),
                 r": target must be int64 class indices, got torch.float32 \(a class-probability target must have "
                 "self's shape", soft=False),
            case("ignore_index 3", lambda x, t: ce(x, t, ignore_index=3), r": ignore_index \(3\) is not supported"),
            case("label_smoothing nan", lambda x, t: op(x, t, None, 1, float("nan")), r": label_smoothing must be in \[0, 1\]"),
            case("reduction 5", lambda x, t: op(x, t, None, 5, 0.0), ": reduction must be"),
            case("weight shape", lambda x, t: op(x, t, torch.ones(4), 1, 0.0), r": weight must have shape \[5\]"),
            case("self float64", lambda x, t: op(x.double(), t, None, 1, 0.0), ": self must be float32, float16 or bfloat16"),
            case("meta target", lambda x, t: op(x, t.to("meta"), None, 1, 0.0), ": target is on meta but self is on cpu"),
            case("meta weight", lambda x, t: op(x, t, torch.ones(5, device="meta"), 1, 0.0),
                 ": weight is on meta but self is on cpu"),
            backward("stats shape", lambda x, t, st: bop(torch.ones(()), x, t, None, st[:2], 1, 0.0, True, True), "stats must be"),
            backward("grad_loss shape", lambda x, t, st: bop(torch.ones(7), x, t, None, st, 0, 0.0, True, True),
                     "grad_loss has shape"),
            backward("grad_loss float64",
                     lambda x, t, st: bop(torch.ones((), dtype=torch.float64), x, t, None, st, 1, 0.0, True, True),
                     "grad_loss must be a float32"),
        ]
