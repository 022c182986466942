"""The amp ops on the arguments torch's own ops take (issue 23 items 8, 9):
non-dense gradients in unscale_ / unscale_norm_ / grad_norm (against
torch._amp_foreach_non_finite_check_and_unscale_, bit for bit, eager and
under torch.compile), one gradient listed twice in the read-only grad_norm
(against torch._foreach_norm), and update_scale_ refusing a scale that
requires grad as torch._amp_update_scale_ does."""

import pytest
import torch

import mixprec  # noqa: F401  (registers the Python kernels)

from _reference import DTYPES, assert_same, norm64

# (base shape, view): each view is not dense, so the kernel cannot walk it flat.
LAYOUTS = [
    ((37, 24), lambda b: b[:, :5]),
    ((37, 24), lambda b: b[::2]),
    ((37, 24), lambda b: b[:, 1::3]),
    ((6, 9, 40), lambda b: b.permute(2, 0, 1)[3:30, :, 1:8]),
    ((5, 4, 7, 9), lambda b: b[:, 1:3].transpose(1, 3)),
    ((300,), lambda b: b[7::5]),
]


def views(gen, dtype):
    """Fresh bases, their non-dense views, and dense grads between them."""
    bases = [(torch.randn(shape, generator=gen) * 300).to(dtype) for shape, _ in LAYOUTS]
    grads = []
    for k, (base, (_, view)) in enumerate(zip(bases, LAYOUTS)):
        v = view(base)
        assert not v.is_contiguous() and v.numel() > 0
        grads.append(v)
        grads.append((torch.randn(k + 3, 5, generator=gen) * 300).to(dtype))  # dense neighbour
    return bases, grads


def torch_unscale_(grads, inv):
    fi = torch.zeros(1)
    torch._amp_foreach_non_finite_check_and_unscale_(grads, fi, torch.tensor([inv]))
    return fi


def run_both(gen, dtype, poison=None):
    """Our grads (views of fresh bases, and dense ones) and torch's copies of them."""
    bases, grads = views(gen, dtype)
    if poison is not None:
        grads[2][3, 1] = poison  # inside the view grads[2] of bases[1]
    ref_bases = [b.clone() for b in bases]
    ref_grads = []
    for k, g in enumerate(grads):
        if k % 2 == 0:
            ref_grads.append(LAYOUTS[k // 2][1](ref_bases[k // 2]))
        else:
            ref_grads.append(g.clone())
    return bases, grads, ref_bases, ref_grads


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inv", [2.0**-16, 1.0 / 3.0, 37.5])
@pytest.mark.parametrize("poison", [None, float("inf"), float("nan")])
def test_unscale_non_dense_bitwise_equal_to_torch(gen, dtype, inv, poison):
    bases, grads, ref_bases, ref_grads = run_both(gen, dtype, poison)
    versions = [g._version for g in grads]
    fi = torch.zeros(1)
    torch.ops.mixprec.unscale_(grads, fi, torch.tensor([inv]))
    ref_fi = torch_unscale_(ref_grads, inv)
    assert fi.item() == ref_fi.item() == (0.0 if poison is None else 1.0)
    # The whole bases: the views' elements unscaled, the others untouched.
    for a, b in zip(bases, ref_bases):
        assert_same(a, b)
    for a, b in zip(grads, ref_grads):
        assert_same(a, b)
    # One version bump per listed grad, dense or not (a view shares its base's counter).
    assert [g._version for g in grads] == [v + 1 for v in versions]


@pytest.mark.parametrize("dtype", DTYPES)
def test_unscale_norm_and_grad_norm_non_dense(gen, dtype):
    bases, grads, ref_bases, ref_grads = run_both(gen, dtype)
    dense = [g.contiguous() for g in grads]
    fi_d = torch.zeros(1)
    norms_d, total_d = torch.ops.mixprec.grad_norm(dense, fi_d, torch.tensor([0.125]))
    fi_r = torch.zeros(1)
    norms_r, total_r = torch.ops.mixprec.grad_norm(grads, fi_r, torch.tensor([0.125]))
    assert torch.equal(norms_r, norms_d) and torch.equal(total_r, total_d) and fi_r.item() == 0.0
    for a, b in zip(bases, ref_bases):
        assert_same(a, b)  # grad_norm writes nothing
    fi_w = torch.zeros(1)
    norms_w, total_w = torch.ops.mixprec.unscale_norm_(grads, fi_w, torch.tensor([0.125]))
    torch_unscale_(ref_grads, 0.125)
    for a, b in zip(bases, ref_bases):
        assert_same(a, b)
    assert torch.equal(norms_w, norms_d) and torch.equal(total_w, total_d)
    ref_norms = torch.stack([norm64([g]) for g in ref_grads])
    assert torch.allclose(norms_w.double(), ref_norms, rtol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_unscale_non_dense_under_torch_compile(gen, dtype):
    def step(b0, b1, d, fi, inv):
        torch.ops.mixprec.unscale_([b0[:, :5], d, b1.permute(2, 0, 1)[3:30, :, 1:8]], fi, inv)

    b0 = (torch.randn(37, 24, generator=gen) * 100).to(dtype)
    b1 = (torch.randn(6, 9, 40, generator=gen) * 100).to(dtype)
    d = (torch.randn(11, generator=gen) * 100).to(dtype)
    inv = torch.tensor([1.0 / 3.0])
    eager = [t.clone() for t in (b0, b1, d)]
    ref = [b0.clone(), b1.clone(), d.clone()]
    fi_e, fi_c, fi_r = torch.zeros(1), torch.zeros(1), torch.zeros(1)
    step(*eager, fi_e, inv)
    torch._amp_foreach_non_finite_check_and_unscale_([ref[0][:, :5], ref[2], ref[1].permute(2, 0, 1)[3:30, :, 1:8]],
                                                     fi_r, inv)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    comp = [t.clone() for t in (b0, b1, d)]
    compiled(*comp, fi_c, inv)
    for a, b, c in zip(eager, comp, ref):
        assert_same(a, c)
        assert_same(b, c)
    assert fi_e.item() == fi_c.item() == fi_r.item() == 0.0


def test_unscale_refuses_what_torch_refuses(gen):
    # An expanded grad cannot be written in place (torch: "more than one
    # element of the written-to tensor refers to a single memory location").
    e = torch.randn(3, 1, generator=gen).expand(3, 4)
    with pytest.raises(RuntimeError):
        torch._amp_foreach_non_finite_check_and_unscale_([e], torch.zeros(1), torch.tensor([0.5]))
    base = e.clone()
    fi = torch.zeros(1)
    for op in (torch.ops.mixprec.unscale_, torch.ops.mixprec.unscale_norm_):
        with pytest.raises(RuntimeError, match=r"mixprec::unscale(_norm)?_: grads\[0\] has elements that share memory"):
            op([e], fi, torch.tensor([0.5]))
    assert torch.equal(e, base) and fi.item() == 0.0
    # A grad written twice is still refused (it would be unscaled twice).
    g = torch.randn(5, 7, generator=gen)
    with pytest.raises(RuntimeError, match=r"mixprec::unscale_: grads\[0\] and grads\[1\] share memory"):
        torch.ops.mixprec.unscale_([g, g], fi, torch.tensor([0.5]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_grad_norm_takes_a_grad_twice_as_foreach_norm(gen, dtype):
    g = (torch.randn(33, 17, generator=gen) * 50).to(dtype)
    h = (torch.randn(100, generator=gen) * 50).to(dtype)
    e = torch.randn(3, 1, generator=gen).to(dtype).expand(3, 4)  # read-only: expanded is fine
    lists = [[g, g], [g, h, g], [h, g[:, :4], g, h], [e, h, e]]
    for grads in lists:
        before = [t.clone() for t in grads]
        fi = torch.zeros(1)
        norms, total = torch.ops.mixprec.grad_norm(grads, fi, torch.tensor([1.0]))
        ref = torch._foreach_norm([t.float() for t in grads])  # ours is float32 whatever the dtype
        ref64 = torch.stack([norm64([t]) for t in grads])
        assert fi.item() == 0.0
        for t, b in zip(grads, before):
            assert_same(t, b)
        assert torch.allclose(norms.double(), torch.stack(ref).double(), rtol=2e-6)
        assert torch.allclose(norms.double(), ref64, rtol=1e-6)
        assert torch.allclose(total.double(), ref64.square().sum().sqrt(), rtol=1e-6)
        # The same tensor listed twice gives the same norm twice, bit for bit.
        firsts = {}
        for t, n in zip(grads, norms):
            key = (t.data_ptr(), t.shape, t.stride())
            assert firsts.setdefault(key, n.item()) == n.item()
    # Still refused: found_inf inside a grad, since it is written.
    gf = torch.randn(8, generator=gen)
    with pytest.raises(RuntimeError, match=r"mixprec::grad_norm: grads\[0\] and found_inf share memory"):
        torch.ops.mixprec.grad_norm([gf, gf], gf[2:3], torch.tensor([1.0]))


@pytest.mark.parametrize("op", ["update_scale_", "update_scale_ex_"])
def test_update_scale_refuses_scale_that_requires_grad(op):
    def args(scale):
        gt, fi = torch.zeros((), dtype=torch.int32), torch.ones(())
        if op == "update_scale_":
            return (scale, gt, fi, 2.0, 0.5, 2000)
        return (scale, gt, torch.zeros((), dtype=torch.int32), torch.zeros((), dtype=torch.int64), fi,
                2.0, 0.5, 2000, 1, 0.0, float("inf"))

    fn = getattr(torch.ops.mixprec, op)
    ref_scale = torch.tensor(65536.0, requires_grad=True)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        torch._amp_update_scale_(ref_scale, torch.zeros((), dtype=torch.int32), torch.ones(()), 2.0, 0.5, 2000)
    scale = torch.tensor(65536.0, requires_grad=True)
    a = args(scale)
    with pytest.raises(RuntimeError, match=rf"mixprec::{op}: scale is a leaf tensor that requires grad"):
        fn(*a)
    assert scale.item() == 65536.0 and a[1].item() == 0
    # Under no_grad both write it (torch's check is the in-place check of grad mode), same result.
    with torch.no_grad():
        torch._amp_update_scale_(ref_scale, torch.zeros((), dtype=torch.int32), torch.ones(()), 2.0, 0.5, 2000)
        fn(*args(scale))
    assert scale.item() == ref_scale.item() == 32768.0
    # A non-leaf scale is written, as torch writes it.
    s2 = torch.tensor(8.0, requires_grad=True) * 1.0
    fn(*args(s2))
    assert s2.item() == 4.0
