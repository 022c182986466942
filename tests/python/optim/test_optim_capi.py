"""mixprec_adamw_step / mixprec_sgd_step through the C API (ctypes), bit for bit
against torch.optim.AdamW(fused=True) / torch.optim.SGD(fused=True) on CPU.

The C kernels reproduce the roundings of torch's AVX2 build of its fused CPU
kernels (FusedAdamKernel.cpp / FusedSGDKernel.cpp as GCC compiles them, with
fused multiply-adds, and a scalar tail over each tensor's last numel % 8
elements that rounds differently from the vectorised body). Other torch CPU
capabilities (AVX-512: width 16; DEFAULT, NEON) round differently, so the
module runs only where torch runs its AVX2 kernels.

FP16/BF16 params: the FP32 master must equal torch's fused optimizer run on
FP32 copies of the params with the same (upcast) grads, and the param must be
the master rounded to nearest even.
"""

import ctypes

import pytest
import torch

import mixprec

from _reference import bits

STEPS = 50
SIZES = [1, 7, 15, 17, 4097, 100003]
F32, F16, BF16 = 0, 1, 2
MP_DTYPE = {torch.float32: F32, torch.float16: F16, torch.bfloat16: BF16}

pytestmark = [
    pytest.mark.skipif(mixprec.capi_library_path() is None, reason="libmixprec_capi.so not built"),
    # torch's AVX2 and AVX512 CPU kernels round alike (these 34 tests pass
    # bit for bit under both, checked on an AVX-512 EPYC, 2026-12-02).
    pytest.mark.skipif(
        torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"),
        reason="mixprec matches the roundings of torch's AVX2/AVX512 CPU kernels; torch runs "
        f"{torch.backends.cpu.get_cpu_capability()} here",
    ),
]


P, I, I64, U64, D = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_uint64, ctypes.c_double


def _fields(*runs):
    """A ctypes ``_fields_`` list from (type, "name name ...") runs, in the
    C struct's order."""
    return [(name, t) for t, names in runs for name in names.split()]


class OptTensor(ctypes.Structure):
    _fields_ = _fields(
        (P, "param grad master exp_avg exp_avg_sq max_exp_avg_sq step"), (I64, "numel"),
        (I, "param_dtype grad_dtype"),
        # The lean state (mixprec_state_dtype), zero: none.
        (P, "remainder"), (I, "exp_avg_dtype exp_avg_sq_dtype"), (P, "exp_avg_scale exp_avg_sq_scale"),
    )


class EmaParams(ctypes.Structure):
    """mixprec_ema_params (all zero: no EMA)."""

    _fields_ = _fields((P, "bufs"), (D, "decay min_decay"), (I, "use_warmup"), (D, "warmup_gamma warmup_power"),
                       (I64, "update_after_step update_every"))


# The scaler's device tensors, in both step structs.
_SCALER = (P, "lr_tensor grad_scale found_inf")


class AdamWParams(ctypes.Structure):
    _fields_ = _fields((D, "lr beta1 beta2 eps weight_decay"), (I, "amsgrad maximize"), _SCALER,
                       (U64, "sr_seed"), (I, "unscale_grads"), (EmaParams, "ema"))


class SGDParams(ctypes.Structure):
    _fields_ = _fields((D, "lr momentum dampening weight_decay"), (I, "nesterov maximize"), _SCALER,
                       (I, "first_step"), (U64, "sr_seed"), (I, "unscale_grads"), (EmaParams, "ema"))


@pytest.fixture(scope="module")
def lib():
    L = ctypes.CDLL(mixprec.capi_library_path())
    for name, prm in (("mixprec_adamw_step", AdamWParams), ("mixprec_sgd_step", SGDParams)):
        fn = getattr(L, name)
        fn.argtypes = [ctypes.POINTER(OptTensor), ctypes.c_int64, ctypes.POINTER(prm)]
        fn.restype = ctypes.c_int
    return L


def _ptr(t):
    return None if t is None else t.data_ptr()


def assert_bitwise(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape
    bad = (bits(got) != bits(want)).nonzero().flatten()
    assert bad.numel() == 0, (
        f"{what}: {bad.numel()}/{got.numel()} elements differ, first at {bad[:5].tolist()}: "
        f"{got[bad[:5]].tolist()} vs torch {want[bad[:5]].tolist()}"
    )


class MixprecParam:
    """One parameter as the C API sees it, with its own state buffers."""

    def __init__(self, init32, dtype, n_state):
        self.dtype = dtype
        if dtype == torch.float32:
            self.param, self.master = init32.clone(), None
        else:
            self.param, self.master = init32.to(dtype), init32.clone()
        n = init32.numel()
        # Poisoned where the optimizer must write before it reads (SGD's
        # first step); zeros where torch starts from zeros.
        self.state = [torch.zeros(n) for _ in range(n_state)]
        self.step = torch.zeros(())

    def desc(self, grad, amsgrad=False, sgd=False):
        st = self.state
        return OptTensor(
            _ptr(self.param), _ptr(grad), _ptr(self.master),
            _ptr(st[0]) if st else None,
            None if sgd else _ptr(st[1]),
            _ptr(st[2]) if amsgrad else None,
            _ptr(self.step), self.param.numel(), MP_DTYPE[self.dtype], MP_DTYPE[grad.dtype],
        )

    @property
    def p32(self):
        return self.param if self.master is None else self.master


def _init(gen, dtype):
    """Initial values, already representable in dtype, as FP32."""
    return [torch.randn(n, generator=gen).to(dtype).float() for n in SIZES]


def _grads(gen, dtype, mult=1.0):
    return [(torch.randn(n, generator=gen) * mult).to(dtype) for n in SIZES]


def _scaled_state(scale, step, skip_step):
    """(grad_scale, found_inf) for the mixprec call and torch's optimizer."""
    if scale is None:
        return None, None
    found = torch.tensor(1.0 if step == skip_step else 0.0)
    return torch.tensor(scale), found


ADAMW_CASES = {
    "defaults": dict(),
    "lr1e-2_wd0.05": dict(lr=1e-2, weight_decay=0.05),
    "amsgrad": dict(lr=1e-2, amsgrad=True),
    "maximize": dict(lr=1e-2, maximize=True),
    "wd0": dict(lr=1e-2, weight_decay=0.0),
    "beta1_0.3": dict(lr=1e-2, betas=(0.3, 0.99)),  # lerp weight >= 0.5: the other branch
    "amsgrad_maximize_wd0": dict(lr=3e-3, amsgrad=True, maximize=True, weight_decay=0.0),
    "grad_scale": dict(lr=1e-2, _scale=3000.0),
}


def _check_grads(grads, ref, unscale, what):
    """With unscale_grads, mixprec's grads hold what torch's fused kernel
    wrote back (its FP32 grad / scale, rounded to the grad's dtype)."""
    if unscale:
        for g, r in zip(grads, ref):
            assert_bitwise(g, r.grad.to(g.dtype), what + " grad written back")


def _run_steps(gen, dtype, scale, skip_step, unscale, ref, opt, mine, prm, step_fn, **desc):
    """STEPS steps of torch's fused optimizer ``opt`` on ``ref`` and of the C
    entry point ``step_fn`` on ``mine`` with the same gradients (scaled by
    ``scale``, step ``skip_step`` skipped as an inf one); ``desc``: the
    descriptor's keywords (amsgrad= / sgd=True)."""
    for s in range(STEPS):
        grads = _grads(gen, dtype, scale or 1.0)
        for r, g in zip(ref, grads):
            # A copy: torch's kernel writes the unscaled grad back into it.
            r.grad = g.float().clone()
        gs, found = _scaled_state(scale, s, skip_step)
        if scale:
            opt.grad_scale, opt.found_inf = gs.clone(), found.clone()
        opt.step()
        prm.grad_scale, prm.found_inf = _ptr(gs), _ptr(found)
        arr = (OptTensor * len(mine))(*[q.desc(g, **desc) for q, g in zip(mine, grads)])
        assert step_fn(arr, len(mine), ctypes.byref(prm)) == 0
        _check_grads(grads, ref, unscale, f"step {s}")


def _run_adamw(lib, gen, cfg, dtype, unscale=False):
    cfg = dict(cfg)
    scale = cfg.pop("_scale", None)
    h = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, maximize=False)
    h.update(cfg)
    init = _init(gen, dtype)
    ref = [torch.nn.Parameter(x.clone()) for x in init]
    opt = torch.optim.AdamW(ref, fused=True, **h)
    mine = [MixprecParam(x, dtype, 3) for x in init]
    prm = AdamWParams(h["lr"], h["betas"][0], h["betas"][1], h["eps"], h["weight_decay"],
                      int(h["amsgrad"]), int(h["maximize"]), None, None, None, 0, int(unscale))
    skip_step = 10 if scale else None
    _run_steps(gen, dtype, scale, skip_step, unscale, ref, opt, mine, prm, lib.mixprec_adamw_step,
               amsgrad=h["amsgrad"])
    n_taken = STEPS - (1 if scale else 0)
    for n, q, r in zip(SIZES, mine, ref):
        st = opt.state[r]
        what = f"n={n}"
        assert q.step.item() == st["step"].item() == n_taken
        assert_bitwise(q.p32, r.detach(), what + " param/master")
        assert_bitwise(q.state[0], st["exp_avg"], what + " exp_avg")
        assert_bitwise(q.state[1], st["exp_avg_sq"], what + " exp_avg_sq")
        if h["amsgrad"]:
            assert_bitwise(q.state[2], st["max_exp_avg_sq"], what + " max_exp_avg_sq")
        if dtype != torch.float32:
            assert_bitwise(q.param, q.master.to(dtype), what + " param == master rounded")


@pytest.mark.parametrize("case", list(ADAMW_CASES))
def test_adamw_fp32_bitwise(lib, gen, case):
    _run_adamw(lib, gen, ADAMW_CASES[case], torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("case", ["defaults", "amsgrad", "grad_scale"])
def test_adamw_master_bitwise(lib, gen, case, dtype):
    _run_adamw(lib, gen, ADAMW_CASES[case], dtype)


SGD_CASES = {
    "plain": dict(),
    "momentum": dict(momentum=0.9),
    "dampening": dict(momentum=0.9, dampening=0.3),
    "nesterov": dict(momentum=0.9, nesterov=True),
    "weight_decay": dict(weight_decay=1e-3),
    "momentum_wd": dict(momentum=0.8, weight_decay=1e-2),
    "nesterov_wd_maximize": dict(momentum=0.9, nesterov=True, weight_decay=1e-3, maximize=True),
    "maximize": dict(maximize=True),
    "grad_scale": dict(momentum=0.9, dampening=0.1, weight_decay=1e-3, _scale=3000.0),
}


def _run_sgd(lib, gen, cfg, dtype, unscale=False):
    cfg = dict(cfg)
    scale = cfg.pop("_scale", None)
    h = dict(lr=1e-2, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False)
    h.update(cfg)
    init = _init(gen, dtype)
    ref = [torch.nn.Parameter(x.clone()) for x in init]
    opt = torch.optim.SGD(ref, fused=True, **h)
    mine = [MixprecParam(x, dtype, 1) for x in init]
    for q in mine:
        q.state[0].fill_(123.0)  # garbage: the first step must overwrite it
    prm = SGDParams(h["lr"], h["momentum"], h["dampening"], h["weight_decay"], int(h["nesterov"]),
                    int(h["maximize"]), None, None, None, 0, 0, int(unscale))
    # A skipped step, not the first: after a skipped first step torch's fused
    # SGD takes its torch.empty_like momentum buffers as initialised.
    skip_step = 5 if scale else None
    _run_steps(gen, dtype, scale, skip_step, unscale, ref, opt, mine, prm, lib.mixprec_sgd_step, sgd=True)
    for n, q, r in zip(SIZES, mine, ref):
        what = f"n={n}"
        assert_bitwise(q.p32, r.detach(), what + " param/master")
        if h["momentum"]:
            assert_bitwise(q.state[0], opt.state[r]["momentum_buffer"], what + " momentum_buffer")
        if dtype != torch.float32:
            assert_bitwise(q.param, q.master.to(dtype), what + " param == master rounded")


@pytest.mark.parametrize("case", list(SGD_CASES))
def test_sgd_fp32_bitwise(lib, gen, case):
    _run_sgd(lib, gen, SGD_CASES[case], torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("case", ["nesterov_wd_maximize", "grad_scale"])
def test_sgd_master_bitwise(lib, gen, case, dtype):
    _run_sgd(lib, gen, SGD_CASES[case], dtype)


_DTYPES3 = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", _DTYPES3, ids=["f32", "f16", "bf16"])
def test_adamw_unscale_grads_bitwise(lib, gen, dtype):
    """unscale_grads: the grads end as torch's fused AdamW leaves them (also
    on the skipped step: still scaled), and the update is unchanged."""
    _run_adamw(lib, gen, dict(ADAMW_CASES["grad_scale"], maximize=True), dtype, unscale=True)


@pytest.mark.parametrize("dtype", _DTYPES3, ids=["f32", "f16", "bf16"])
def test_sgd_unscale_grads_bitwise(lib, gen, dtype):
    _run_sgd(lib, gen, dict(SGD_CASES["grad_scale"], maximize=True), dtype, unscale=True)


def test_sgd_plain_matches_foreach_and_for_loop(lib, gen):
    """With momentum 0, torch's default paths (p.add_(g, alpha=-lr)) fuse the
    multiply-add too, so mixprec equals them as well."""
    for foreach in (True, False):
        init = _init(gen, torch.float32)
        ref = [torch.nn.Parameter(x.clone()) for x in init]
        opt = torch.optim.SGD(ref, lr=1e-2, foreach=foreach)
        mine = [MixprecParam(x, torch.float32, 0) for x in init]
        prm = SGDParams(1e-2, 0.0, 0.0, 0.0, 0, 0, None, None, None, 0)
        for _ in range(5):
            grads = _grads(gen, torch.float32)
            for r, g in zip(ref, grads):
                r.grad = g.clone()
            opt.step()
            arr = (OptTensor * len(mine))(*[q.desc(g, sgd=True) for q, g in zip(mine, grads)])
            assert lib.mixprec_sgd_step(arr, len(mine), ctypes.byref(prm)) == 0
        for n, q, r in zip(SIZES, mine, ref):
            assert_bitwise(q.param, r.detach(), f"foreach={foreach} n={n}")
