"""mixprec.ops.softmax / log_softmax (and their backward): the OpTester
checks (TestSoftmax / TestLogSoftmax: forward and backward against torch on
the input upcast to FP32 (float64 references) on every CPU path, odd row
lengths, strided (inner > 1) layouts, compile, opcheck, empty, non-contiguous,
bad inputs), then what is softmax's own: special rows (huge logits,
all-equal, -inf masks), NaN rows, finite differences, threads, autocast, the
nn modules, double backward."""

import pytest
import torch

import mixprec

from _op_tester import OpTester
from _reference import DTYPES, EPS, TINY, cpu_lib

OPS = {
    "softmax": (mixprec.ops.softmax, torch.softmax),
    "log_softmax": (mixprec.ops.log_softmax, torch.log_softmax),
}


def randn(shape, dtype, gen, scale=4.0):
    return (torch.randn(shape, generator=gen) * scale).to(dtype)


def check_close(out, ref64, dtype_out, *, rtol=2e-5, atol=2e-6, mag=None):
    """FP32 outputs: within FP32 rounding of the float64 reference.
    FP16/BF16 outputs: within 1 ulp of that dtype (+ the FP32 error).
    ``mag``: a magnitude the FP32 computation rounds at besides the
    result's (see lse_magnitude): a few FP32 ulps of it are allowed too."""
    assert out.dtype == dtype_out
    ref = ref64.to(torch.float64)
    extra = 0.0 if mag is None else 4 * 2.0**-23 * mag.to(torch.float64)
    o = out.to(torch.float64)
    fin = torch.isfinite(ref)
    assert torch.equal(torch.isnan(o), torch.isnan(ref)), "NaN pattern differs"
    assert torch.equal(o[~fin & ~torch.isnan(ref)], ref[~fin & ~torch.isnan(ref)]), "inf differs"
    if dtype_out == torch.float32:
        tol = atol + rtol * ref.abs() + extra
    else:
        tol = (EPS[dtype_out] + rtol) * ref.abs() + extra + TINY[dtype_out] + atol
    err = (o - ref).abs()
    # A finite value beyond the half dtype's range rounds to inf, as the
    # reference rounded to that dtype does.
    overflow = fin & torch.isinf(ref.to(dtype_out).to(torch.float64))
    assert torch.equal(o[overflow], ref.to(dtype_out).to(torch.float64)[overflow])
    bad = fin & ~overflow & (err > tol)
    assert not bad.any(), f"max err {err[fin].max().item():.3g} at {bad.nonzero()[:3].tolist()}"


def assert_within(err, tol):
    ratio = err / tol
    worst = ratio.argmax()
    assert ratio.max() <= 1, f"err {err.view(-1)[worst].item():.3g} > tol {tol.view(-1)[worst].item():.3g}"


def lse_magnitude(name, x, ref64, dim):
    """|x - log_softmax(x)| = |max + log(sum(exp(x - max)))|: the strided
    path (torch's and mixprec's alike) computes x - lse in FP32, rounding at
    lse's magnitude, which dwarfs a result near 0 when the row sits far from
    0 (FP16 rows at 3e4: torch's own FP32 log_softmax is 2.8e-5 off, as
    mixprec is). None for softmax, whose rounding is relative to the
    result."""
    if name != "log_softmax":
        return None
    return torch.nan_to_num((x.to(torch.float64) - ref64).abs(), nan=0.0, posinf=0.0)


def reference(name, x, dim):
    """torch's op on the FP32 upcast input, in float64 to stand for the exact
    value of that op (torch's FP32 result is itself within FP32 rounding)."""
    return OPS[name][1](x.to(torch.float32).to(torch.float64), dim)


CASES = [
    ((7, 1), -1),
    ((5, 3), -1),
    ((33, 8), 1),
    ((16, 1000), 1),
    ((2, 50257), -1),
    ((4, 21, 9, 11), 1),  # segmentation layout: inner = 99
    ((2, 3, 4), 0),
    ((2, 3, 40), 1),
    ((6,), 0),
]


def special_rows(dtype, n, gen):
    big = {torch.float32: 1e30, torch.float16: 6e4, torch.bfloat16: 1e37}[dtype]
    rows = [
        torch.randn(n, generator=gen) * 3 + big / 2,  # huge positive
        torch.randn(n, generator=gen) * 3 - big / 2,  # huge negative
        torch.full((n,), 1.5),  # all equal
        torch.where(torch.rand(n, generator=gen) < 0.5, float("-inf"), torch.randn(n, generator=gen)),
        torch.randn(n, generator=gen) * big / 4,  # spread over the whole range
    ]
    x = torch.stack(rows).to(dtype)
    x[3, 0] = 0.25  # at least one finite entry in the masked row
    return x


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 3, 1000, 50257])
def test_special_rows(isa, gen, name, dtype, n):
    if n > 1000 and isa == "scalar":
        return  # the scalar path's long rows are covered by the forward test (time budget)
    x = special_rows(dtype, n, gen)
    ref = reference(name, x, -1)
    mag = lse_magnitude(name, x, ref, -1)
    check_close(OPS[name][0](x, -1, torch.float32), ref, torch.float32, mag=mag)
    check_close(OPS[name][0](x, -1), ref, dtype, mag=mag)
    if n > 1000:
        return
    # The same rows as columns (strided path, inner = 5).
    xt = x.t().contiguous()
    ref_t = reference(name, xt, 0)
    check_close(OPS[name][0](xt, 0, torch.float32), ref_t, torch.float32, mag=lse_magnitude(name, xt, ref_t, 0))


@pytest.mark.parametrize("name", list(OPS))
def test_masked_entries_are_exactly_zero(isa, gen, name):
    x = torch.randn(9, 300, generator=gen).to(torch.bfloat16)
    mask = torch.rand(9, 300, generator=gen) < 0.7
    mask[:, 0] = False
    x[mask] = float("-inf")
    y = OPS[name][0](x, 1, torch.float32)
    expect = 0.0 if name == "softmax" else float("-inf")
    assert (y[mask] == expect).all()


@pytest.mark.parametrize("name", list(OPS))
def test_all_minus_inf_and_nan_rows_are_nan_like_torch(isa, name):
    x = torch.tensor([[float("-inf")] * 5, [0.0, float("nan"), 1.0, 2.0, 3.0], [1.0, float("inf"), 0.0, 0.0, 0.0]])
    for dtype in DTYPES:
        y = OPS[name][0](x.to(dtype), 1, torch.float32)
        r = OPS[name][1](x, 1)
        assert torch.equal(torch.isnan(y), torch.isnan(r))


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("shape,dim", [((3, 7), 1), ((2, 5, 3), 1), ((4, 1), 0)])
def test_gradcheck_float64_reference_semantics(name, shape, dim, gen):
    """gradcheck needs float64, which the kernels do not take: check the
    backward ops against numerical derivatives of the forward op in float32
    with a tolerance suited to float32 (the analytic formula is exact)."""
    x = torch.randn(shape, generator=gen, dtype=torch.float32)
    y = OPS[name][0](x, dim)
    g = torch.randn(shape, generator=gen)
    bwd = torch.ops.mixprec.softmax_backward if name == "softmax" else torch.ops.mixprec.log_softmax_backward
    gx = bwd(g, y, dim, torch.float32).double()
    x64 = x.double()
    h = 1e-3
    num = torch.zeros_like(x64)
    flat = num.view(-1)
    for i in range(x.numel()):
        xp = x64.clone().view(-1)
        xm = x64.clone().view(-1)
        xp[i] += h
        xm[i] -= h
        fp = (OPS[name][1](xp.view(shape), dim) * g).sum()
        fm = (OPS[name][1](xm.view(shape), dim) * g).sum()
        flat[i] = (fp - fm) / (2 * h)
    torch.testing.assert_close(gx, num, rtol=1e-4, atol=1e-5)


def test_threads_do_not_change_results(gen):
    x = randn((64, 4099), torch.bfloat16, gen)
    xs = randn((4, 21, 40, 41), torch.float16, gen)
    prev = torch.get_num_threads()
    lib = cpu_lib()
    outs = []
    for n in (1, 2):
        lib.mixprec_set_num_threads(n)
        outs.append((mixprec.ops.softmax(x, 1, torch.float32), mixprec.ops.log_softmax(xs, 1, torch.float32)))
    lib.mixprec_set_num_threads(0)
    torch.set_num_threads(prev)
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def test_zero_dim(gen):
    x = torch.tensor(3.0)
    assert mixprec.ops.softmax(x, 0).item() == 1.0
    assert mixprec.ops.log_softmax(x, -1).item() == 0.0


def test_autocast_reads_half_and_returns_fp32(gen):
    x = randn((8, 100), torch.bfloat16, gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = mixprec.ops.softmax(x, -1)
        z = torch.ops.mixprec.log_softmax(x, -1, None)
    assert y.dtype == torch.float32  # autocast's float32 policy, as torch.softmax
    assert z.dtype == torch.bfloat16  # the raw op is left alone by autocast
    check_close(y, reference("softmax", x, -1), torch.float32)


def test_nn_modules(gen):
    x = randn((4, 10, 3), torch.bfloat16, gen)
    check_close(mixprec.nn.Softmax(1)(x), reference("softmax", x, 1), torch.bfloat16)
    check_close(mixprec.nn.LogSoftmax(dim=-1)(x), reference("log_softmax", x, -1), torch.bfloat16)


# ---- double backward ----------------------------------------------------------


def test_double_backward_is_refused(gen):
    x = randn((3, 5), torch.float32, gen).requires_grad_()
    y = mixprec.ops.softmax(x, 1)
    (g,) = torch.autograd.grad(y, x, torch.randn(3, 5, generator=gen), create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(g.sum(), x)


# ---- the OpTester checks -------------------------------------------------------

BACKWARD_CASES = [
    (shape, dim, out_dtype)
    for shape, dim in [((8, 1000), 1), ((2, 50257), 1), ((4, 21, 9, 11), 1), ((5, 1), 1)]
    for out_dtype in (None, torch.float32)
]


class _SoftmaxTester(OpTester):
    """A case is (shape, dim[, out_dtype]); call is the public function."""

    name = "softmax"
    cases = CASES
    grad_cases = BACKWARD_CASES
    isas = ["scalar", "avx2", "avx512"]
    grad_argnums = (0,)
    layout_case = ((4, 6, 9, 11), 1, torch.float32)

    @staticmethod
    def case_id(case):
        return "x".join(map(str, case[0])) + f"-dim{case[1]}" + ("-f32" if len(case) > 2 and case[2] else "")

    def skip_reason(self, case, isa, backward):
        if backward and case[0][case[1]] > 1000 and isa == "scalar" and case[2] is None:
            return "time budget: the scalar path's long rows run with out_dtype=float32"
        return None

    def make_inputs(self, gen, dtype, device, case):
        return randn(case[0], dtype, gen).to(device), case[1], case[2] if len(case) > 2 else None

    def call(self, x, dim, out_dtype):
        return OPS[self.name][0](x, dim, out_dtype)

    def check_forward(self, args, out, case):
        x, dim, out_dtype = args
        ref = reference(self.name, x.cpu(), dim)
        check_close(out.cpu(), ref, out_dtype or x.dtype)
        if out_dtype is None:
            check_close(self.call(x, dim, torch.float32).cpu(), ref, torch.float32)

    def check_backward(self, args, y, g, grads, case):
        x, dim, out_dtype = args
        (gx,) = grads
        shape, dtype = x.shape, x.dtype
        assert gx.dtype == dtype and gx.shape == x.shape
        # Reference: the backward formula in float64 on the output mixprec saved
        # (the rounded output when out_dtype is the half dtype). Tolerance: a few
        # FP32 roundings of the terms (the subtraction may cancel), then 1 ulp of
        # the gradient's dtype.
        y64 = y.detach().to(torch.float64)
        g64 = g.to(torch.float64)
        if self.name == "softmax":
            dot = (g64 * y64).sum(dim, keepdim=True)
            ref = y64 * (g64 - dot)
            size = y64.abs() * (g64.abs() + (g64 * y64).abs().sum(dim, keepdim=True))
        else:
            tot = g64.sum(dim, keepdim=True)
            ref = g64 - y64.exp() * tot
            size = g64.abs() + y64.exp() * g64.abs().sum(dim, keepdim=True)
        # A float sum of n terms is within about sqrt(n) roundings (either side's).
        size = size * (8 + shape[dim] ** 0.5)
        err = (gx.to(torch.float64) - ref).abs()
        assert_within(err, 2.0**-24 * size + EPS[dtype] * ref.abs() + TINY[dtype])
        if out_dtype is torch.float32 or dtype == torch.float32:
            # The whole chain equals torch's autograd on the FP32 upcast input.
            xr = x.detach().float().requires_grad_()
            (gr,) = torch.autograd.grad(OPS[self.name][1](xr, dim), xr, g.float())
            err = (gx.double() - gr.double()).abs()
            assert_within(err, 2 * 2.0**-24 * size + EPS[dtype] * gr.double().abs() + TINY[dtype])

    def opcheck_cases(self, gen, dtype):
        op = getattr(torch.ops.mixprec, self.name)
        bwd = getattr(torch.ops.mixprec, self.name + "_backward")
        x = randn((6, 33), dtype, gen).requires_grad_()
        xs = randn((2, 5, 3, 4), dtype, gen).requires_grad_()
        y = torch.softmax(x.detach().float(), 1).to(dtype)
        g = torch.randn(y.shape, generator=gen).to(dtype)
        return [(op, (x, 1, None)), (op, (xs, 1, torch.float32)),
                (bwd, (g, y if self.name == "softmax" else y.log(), 1, dtype))]

    def empty_inputs(self, dtype, device):
        return [(torch.empty(0, 5, dtype=dtype, device=device), 1, None),
                (torch.empty(3, 0, 4, dtype=dtype, device=device), 1, torch.float32)]

    def check_empty(self, args, out):
        x, _, out_dtype = args
        assert out.shape == x.shape and out.dtype == (out_dtype or x.dtype)

    def noncontiguous(self, args):
        x, dim, out_dtype = args
        return [(x.to(memory_format=torch.channels_last), dim, out_dtype),
                (x.transpose(2, 3).contiguous().transpose(2, 3), dim, out_dtype),
                (x.transpose(1, 3).contiguous().transpose(1, 3), dim, out_dtype)]  # the reduced dim innermost

    @classmethod
    def bad_cases(cls):
        op = getattr(torch.ops.mixprec, cls.name)
        name = cls.name
        return [
            ("dim 2", lambda a: lambda: op(a[0], 2, None), f"mixprec::{name}: dim 2 is out of range"),
            ("dim -3", lambda a: lambda: op(a[0], -3, None), f"mixprec::{name}: dim -3 is out of range"),
            ("float64", lambda a: lambda: op(a[0].double(), 1, None),
             f"mixprec::{name}: self must be float32, float16 or bfloat16, got float64"),
            ("int64", lambda a: lambda: op(torch.ones(3, 4, dtype=torch.int64), 1, None),
             f"mixprec::{name}: self must be float32, float16 or bfloat16, got int64"),
            ("dtype float64", lambda a: lambda: op(a[0], 1, torch.float64),
             f"mixprec::{name}: dtype must be float32, float16 or bfloat16"),
        ]


class TestSoftmax(_SoftmaxTester):
    name = "softmax"

    @classmethod
    def bad_cases(cls):
        bwd = torch.ops.mixprec.softmax_backward
        return super().bad_cases() + [
            ("backward grad dtype", lambda a: lambda: bwd(a[0].half(), a[0], 1, torch.float32),
             "mixprec::softmax_backward: grad_output must have output's dtype"),
            ("backward dim", lambda a: lambda: bwd(a[0], a[0], 5, torch.float32),
             "mixprec::softmax_backward: dim 5 is out of range"),
            ("backward input_dtype", lambda a: lambda: bwd(a[0], a[0], 1, torch.int32),
             "mixprec::softmax_backward: input_dtype must be"),
        ]


class TestLogSoftmax(_SoftmaxTester):
    name = "log_softmax"

    @classmethod
    def bad_cases(cls):
        bwd = torch.ops.mixprec.log_softmax_backward
        return super().bad_cases() + [
            ("backward grad shape", lambda a: lambda: bwd(a[0][:2], a[0], 1, torch.float32),
             "mixprec::log_softmax_backward: grad_output has shape"),
        ]
