"""mixprec::roi_align / roi_align_backward: the OpTester checks (TestRoIAlign:
forward and backward equal to torchvision on the float32-upcast input rounded
once, bit for bit, every option and dtype; compile, opcheck, empty,
layouts, bad inputs), then what is RoIAlign's own: list boxes, float32 boxes
with half features, the adjoint / finite-difference / gradcheck checks, NaN
boxes, the direct op's checks, expanded rois, patch_torchvision's routing of
roi_align / RoIAlign / MultiScaleRoIAlign."""

import pytest
import torch
from torch.library import opcheck

import mixprec
from mixprec.ops import RoIAlign, patch_torchvision, roi_align

from _op_tester import OpTester
from _reference import assert_same

tv = pytest.importorskip("torchvision")

# (output_size, spatial_scale, sampling_ratio, aligned)
OPTIONS = [
    ((7, 7), 0.25, 2, False),
    ((7, 7), 0.25, -1, False),
    ((14, 14), 0.125, 0, True),
    ((5, 3), 1.0, 3, True),
    (2, 0.5, -1, True),
    ((1, 1), 1.0, 1, False),
]


def make(gen, n=2, c=19, h=29, w=37, k=40, scale=1.0, dtype=torch.float32):
    """Features and rois: boxes partly outside the map, tiny ones, inverted
    ones, on every image."""
    x = torch.randn(n, c, h, w, generator=gen)
    xy = (torch.rand(k, 2, generator=gen) * 0.9 - 0.1) * torch.tensor([w, h]) / scale
    wh = torch.rand(k, 2, generator=gen) * torch.tensor([w, h]) / scale * 0.5
    wh[::7] = 0.3
    wh[5::11, 0] = -2.0
    b = torch.randint(0, n, (k, 1), generator=gen).float()
    rois = torch.cat([b, xy, xy + wh], 1)
    return x.to(dtype), rois.to(dtype)


def _tv_forward_backward(x, rois, opts, go):
    x = x.detach().clone().requires_grad_()
    out = tv.ops.roi_align(x, rois, *opts)
    out.backward(go)
    return out.detach(), x.grad


def _mp_forward_backward(x, rois, opts, go):
    x = x.detach().clone().requires_grad_()
    out = roi_align(x, rois, *opts)
    out.backward(go)
    return out.detach(), x.grad


@pytest.mark.parametrize("opts", OPTIONS[:3])
def test_list_boxes_like_torchvision(gen, opts):
    x, rois = make(gen, n=3, scale=opts[1])
    boxes = [rois[rois[:, 0] == i, 1:] for i in range(3)]
    assert_same(roi_align(x, boxes, *opts), tv.ops.roi_align(x, boxes, *opts))
    assert_same(RoIAlign(*opts)(x, boxes), tv.ops.RoIAlign(*opts)(x, boxes))


def test_float32_boxes_with_half_features(gen):
    """torchvision requires the features' dtype for the boxes; mixprec takes
    float32 boxes with bfloat16 features (exact coordinates)."""
    x, rois = make(gen)
    xb = x.bfloat16()
    ref = tv.ops.roi_align(xb.float(), rois, (7, 7), 0.5, 2, True).bfloat16()
    assert_same(roi_align(xb, rois, (7, 7), 0.5, 2, True), ref)


@pytest.mark.parametrize("opts", OPTIONS[:4])
def test_adjoint_and_finite_differences(gen, opts):
    """roi_align is linear in its input, so <g, f(v)> == <f^T(g), v> up to
    rounding (the dot-product test of the backward), and central finite
    differences in float32 give the gradient."""
    x, rois = make(gen, n=2, c=3, h=17, w=19, k=12, scale=opts[1])
    out = roi_align(x, rois, *opts)
    g = torch.randn(out.shape, generator=gen)
    v = torch.randn(x.shape, generator=gen)
    xg = x.clone().requires_grad_()
    roi_align(xg, rois, *opts).backward(g)
    lhs = (g.double() * roi_align(v, rois, *opts).double()).sum()
    rhs = (xg.grad.double() * v.double()).sum()
    assert torch.isclose(lhs, rhs, rtol=1e-5, atol=1e-5), (lhs, rhs)
    # finite differences along a few random directions
    for _ in range(3):
        d = torch.randn(x.shape, generator=gen)
        eps = 1e-2
        fd = ((roi_align(x + eps * d, rois, *opts) - roi_align(x - eps * d, rois, *opts)) * g).sum() / (2 * eps)
        an = (xg.grad * d).sum()
        assert torch.isclose(fd, an, rtol=1e-3, atol=1e-3), (fd, an)


def test_gradcheck(gen):
    x, rois = make(gen, n=1, c=2, h=6, w=7, k=3, scale=1.0)
    rois[:, 0] = 0
    x = x.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda t: roi_align(t, rois, (2, 3), 1.0, 2, True), (x,), eps=1e-2, atol=2e-3, rtol=2e-3
    )


def test_expanded_grad(gen):
    x, rois = make(gen, k=9)
    a = x.clone().requires_grad_()
    b = x.clone().requires_grad_()
    roi_align(a, rois, 3, 1.0, 2).sum().backward()
    tv.ops.roi_align(b, rois, 3, 1.0, 2).sum().backward()
    assert_same(a.grad, b.grad)


def test_nan_box_gives_nan_rows_and_no_gradient(gen):
    x, rois = make(gen, k=5)
    rois[2, 3] = float("nan")
    rois[4, 1] = float("inf")
    xg = x.clone().requires_grad_()
    out = roi_align(xg, rois, (3, 3), 1.0, 2)
    assert torch.isnan(out[[2, 4]]).all() and not torch.isnan(out[[0, 1, 3]]).any()
    ok = [0, 1, 3]
    assert_same(out[ok].detach(), roi_align(x, rois[ok], (3, 3), 1.0, 2))
    go = torch.randn(out.shape, generator=gen)
    out.backward(go)
    xr = x.clone().requires_grad_()
    roi_align(xr, rois[ok], (3, 3), 1.0, 2).backward(go[ok])
    assert_same(xg.grad, xr.grad)


def test_bad_inputs_direct_op(gen):
    """The C++ kernel makes the checks on its own (torch.ops called directly,
    TorchScript)."""
    x, rois = make(gen, n=2, k=4)
    with pytest.raises(RuntimeError, match=r"mixprec::roi_align: rois\[0, 0\] \(the batch index\) is 5"):
        torch.ops.mixprec.roi_align(x, torch.tensor([[5.0, 0, 0, 3, 3]]), 1.0, 2, 2, -1, False)
    with pytest.raises(RuntimeError, match="mixprec::roi_align: spatial_scale must be finite"):
        torch.ops.mixprec.roi_align(x, rois, float("inf"), 2, 2, -1, False)
    with pytest.raises(RuntimeError, match="mixprec::roi_align_backward: grad must have shape"):
        torch.ops.mixprec.roi_align_backward(torch.zeros(3, 19, 2, 2), rois, 1.0, 2, 2, 2, 19, 29, 37, -1, False)
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        xg = x.clone().requires_grad_()
        out = roi_align(xg, rois, 2)
        go = torch.randn(out.shape, generator=gen).requires_grad_()
        (g,) = torch.autograd.grad(out, xg, go, create_graph=True)
        g.sum().backward()


def test_absurd_expanded_rois_never_copied(gen):
    """Issue 23 item 11: a broadcast rois of absurd size fails its shape
    check, or the output's allocation, before any copy of it is tried (a
    copy of these would be terabytes), through the function and the op."""
    import time

    x, rois = make(gen, n=2, k=4)
    wrong = rois[:1, None].expand(2**20, 2**20, 5)  # 2^40 rois of the wrong shape
    huge = rois[:1].expand(2**40, 5)  # the right shape: 22 TB as a copy
    for call in (lambda r: roi_align(x, r, (7, 7)), lambda r: torch.ops.mixprec.roi_align(x, r, 1.0, 7, 7, -1, False)):
        t0 = time.perf_counter()
        with pytest.raises(RuntimeError, match=r"mixprec::roi_align: rois must have shape \(K, 5\)"):
            call(wrong)
        with pytest.raises(RuntimeError):
            call(huge)
        assert time.perf_counter() - t0 < 5.0
    # A moderately expanded rois is read after its copy, like torchvision.
    rep = rois[:1].expand(6, 5)
    assert_same(roi_align(x, rep, (3, 3), 1.0, 2), tv.ops.roi_align(x, rep.contiguous(), (3, 3), 1.0, 2))


# ---- patch_torchvision ------------------------------------------------------------


def test_patch_routes_roi_align_and_modules(gen):
    """Under the patch, torchvision's roi_align, RoIAlign and
    MultiScaleRoIAlign take bfloat16 CPU features (torchvision's own kernel
    has no bfloat16) and give mixprec's results; undo restores
    torchvision."""
    x, rois = make(gen, n=2, c=4, h=32, w=32, k=10)
    xb, rb = x.bfloat16(), rois.bfloat16()
    with pytest.raises(RuntimeError, match="BFloat16"):
        tv.ops.roi_align(xb, rb, (7, 7))
    boxes = [rb[rb[:, 0] == i, 1:] for i in range(2)]
    feats = {"0": torch.randn(2, 4, 32, 32, generator=gen).bfloat16(), "1": torch.randn(2, 4, 16, 16, generator=gen).bfloat16()}
    pooler = tv.ops.MultiScaleRoIAlign(["0", "1"], 7, 2)
    with patch_torchvision():
        assert_same(tv.ops.roi_align(xb, rb, (7, 7)), roi_align(xb, rb, (7, 7)))
        assert_same(tv.ops.RoIAlign((7, 7), 0.5, 2, True)(xb, boxes), roi_align(xb, boxes, (7, 7), 0.5, 2, True))
        pooled = pooler(feats, [b.abs() * 4 for b in boxes], [(128, 128), (128, 128)])
        ref = tv.ops.MultiScaleRoIAlign(["0", "1"], 7, 2)(
            {k: v.float() for k, v in feats.items()}, [b.abs().float() * 4 for b in boxes], [(128, 128), (128, 128)]
        )
        assert pooled.dtype == torch.bfloat16
        assert_same(pooled, ref.bfloat16())
        # float64 still goes to torchvision
        assert tv.ops.roi_align(x.double(), rois.double(), 3).dtype == torch.float64
    with pytest.raises(RuntimeError, match="BFloat16"):
        tv.ops.roi_align(xb, rb, (7, 7))
    assert tv.ops.poolers.roi_align is tv.ops.roi_align


def test_patch_functions_script(gen):
    """The patched functions compile with TorchScript and call mixprec."""
    x, rois = make(gen, n=2, c=3, h=16, w=16, k=5)
    with patch_torchvision():
        fn = torch.jit.script(tv.ops.roi_align)
        assert "mixprec::roi_align" in str(fn.graph)
        assert_same(fn(x.bfloat16(), rois.bfloat16(), [3, 3], 1.0, 2, False), roi_align(x.bfloat16(), rois.bfloat16(), 3, 1.0, 2))
        nms = torch.jit.script(tv.ops.nms)
        assert "mixprec::nms" in str(nms.graph)
    assert "mixprec" not in str(torch.jit.script(tv.ops.roi_align).graph)


# ---- the OpTester checks -------------------------------------------------------


class TestRoIAlign(OpTester):
    """Forward and backward equal torchvision on the float32-upcast input,
    rounded once to the dtype (float32: bit-identical to torchvision), for
    each option set."""

    cases = OPTIONS
    grad_argnums = (0,)
    compile_dtype = torch.float32

    @staticmethod
    def case_id(opts):
        return "-".join(str(o) for o in opts).replace(" ", "")

    def make_inputs(self, gen, dtype, device, opts):
        x, rois = make(gen, scale=opts[1], dtype=dtype)
        return (x.to(device), rois.to(device), *opts)

    def call(self, x, rois, *opts):
        return roi_align(x, rois, *opts)

    def reference(self, x, rois, *opts):
        return tv.ops.roi_align(x, rois, *opts)

    def check_forward(self, args, out, opts):
        x = args[0]
        ref32 = self.reference(*self.upcast(args, torch.float32)).detach()
        assert out.dtype == x.dtype
        assert_same(out.cpu(), ref32.to(x.dtype))
        # the error against the float32 result is the one rounding: half an ulp
        ulp = {torch.float32: 0.0, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}[x.dtype]
        assert ((out.cpu().float() - ref32).abs() <= ref32.abs() * ulp / 2 + 2.0**-24).all()
        assert (out != 0).float().mean() > 0.5

    def check_backward(self, args, out, g, grads, opts):
        a = self.upcast(args, torch.float32)
        (want,) = torch.autograd.grad(self.reference(*a), a[0], g.float().cpu())
        assert grads[0].dtype == args[0].dtype
        assert_same(grads[0].cpu(), want.to(args[0].dtype))
        assert (grads[0] != 0).float().mean() > 0.02

    def opcheck_cases(self, gen, dtype):
        x, rois = make(gen, n=2, c=3, h=11, w=13, k=7, dtype=dtype)
        g = torch.randn(7, 3, 3, 4, generator=gen).to(dtype)
        return [
            (torch.ops.mixprec.roi_align, (x, rois, 0.5, 3, 4, 2, True)),
            (torch.ops.mixprec.roi_align, (x.requires_grad_(), rois, 1.0, 2, 2, -1, False)),
            (torch.ops.mixprec.roi_align_backward, (g, rois, 0.5, 3, 4, 2, 3, 11, 13, 2, True)),
        ]

    def empty_inputs(self, dtype, device):
        x = torch.randn(2, 19, 29, 37).to(dtype).to(device)
        return [(x, torch.zeros(0, 5, dtype=dtype, device=device), (7, 7)),
                (x, [torch.zeros(0, 4, dtype=dtype, device=device)] * 2, (7, 7)),
                (x, torch.tensor([[0.0, 1, 1, 5, 5]], dtype=dtype, device=device), (0, 3))]

    def check_empty(self, args, out):
        x, rois, size = args
        k = rois.shape[0] if isinstance(rois, torch.Tensor) else 0
        assert out.shape == (k, x.shape[1], *size) and out.dtype == x.dtype
        if isinstance(rois, torch.Tensor) and k == 0:
            assert out.shape == tv.ops.roi_align(x.float().cpu(), rois.float().cpu(), size).shape
        xg = x.clone().requires_grad_()
        roi_align(xg, rois, size).sum().backward()
        assert torch.equal(xg.grad, torch.zeros_like(x))

    def noncontiguous(self, args):
        x, rois, *opts = args
        xt = x.transpose(2, 3).contiguous().transpose(2, 3)
        return [(x.to(memory_format=torch.channels_last), rois, *opts), (xt, rois.t().contiguous().t(), *opts)]

    @classmethod
    def bad_cases(cls):
        def bad(args_fn):
            return lambda a: lambda: roi_align(*args_fn(a[0], a[1][:4]))

        cases = [
            ("batch index", lambda x, r: (x, torch.cat([r[:1], torch.tensor([[2.0, 0, 0, 4, 4]])]), 3), "rois\\[1, 0\\] \\(the batch index\\) is 2"),
            ("negative index", lambda x, r: (x, torch.tensor([[-1.0, 0, 0, 4, 4]]), 3), "rois\\[0, 0\\]"),
            ("NaN index", lambda x, r: (x, torch.tensor([[float("nan"), 0, 0, 4, 4]]), 3), "rois\\[0, 0\\] \\(the batch index\\) is nan"),
            ("rois shape", lambda x, r: (x, r[:, :4], 3), "rois must have shape \\(K, 5\\)"),
            ("boxes list shape", lambda x, r: (x, [r[:, :3]], 3), "boxes\\[0\\] must be a Tensor\\[L, 4\\]"),
            ("input dims", lambda x, r: (x[0], r, 3), "input must have shape \\(N, C, H, W\\)"),
            ("float64", lambda x, r: (x.double(), r.double(), 3), "input must be float32, float16 or bfloat16, got torch.float64"),
            ("int rois", lambda x, r: (x, r.long(), 3), "rois must be float32, float16 or bfloat16"),
            ("output size", lambda x, r: (x, r, (-1, 3)), "output_size must be >= 0"),
            ("meta rois", lambda x, r: (x, r.to("meta"), 3), "rois is on meta but input is on cpu"),
            ("meta input", lambda x, r: (x.to("meta"), r, 3), "rois is on cpu but input is on meta"),
            ("empty map", lambda x, r: (x[:, :, :0], r, 3), "cannot sample rois from an empty feature map"),
        ]
        return [(name, bad(fn), "mixprec::roi_align: " + msg) for name, fn, msg in cases]
