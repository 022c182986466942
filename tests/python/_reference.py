"""What the Python tests share: the dtypes, their spacings, bitwise and
tolerance comparisons, random gradients, pure-torch references, the CPU
library handle and the CUDA skip condition. Shared pytest fixtures (gen, isa)
are in conftest.py."""

import ctypes

import pytest
import torch

import mixprec

# ---- dtypes ----------------------------------------------------------------------

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Relative spacing of each dtype (1 ulp at most this times |value|).
EPS = {torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}
# The smallest magnitudes each dtype resolves (an absolute tolerance floor).
TINY = {torch.float32: 1e-30, torch.float16: 2.0**-24, torch.bfloat16: 1e-38}


# ---- devices ---------------------------------------------------------------------

requires_cuda = pytest.mark.skipif(
    not (torch.cuda.is_available() and mixprec.cuda_ops_loaded()),
    reason="needs a CUDA device and libmixprec_cuda.so",
)


def cpu_lib():
    """libmixprec.so through ctypes: its CPU ISA and thread controls."""
    return ctypes.CDLL(mixprec.library_path())


# ---- comparisons -----------------------------------------------------------------


def bits(t):
    """The tensor's bits, as a same-width integer view."""
    return t.view({torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}[t.dtype])


def assert_same(a, b):
    """Bitwise equal, except that any NaN equals any NaN (torch's own paths
    differ in NaN payloads)."""
    assert a.dtype == b.dtype and a.shape == b.shape
    nan = torch.isnan(a)
    assert torch.equal(nan, torch.isnan(b))
    assert torch.equal(bits(a)[~nan], bits(b)[~nan])


def assert_near(out, ref, dtype, rtol=3e-5, atol=1e-6):
    """out (any device) within rtol + 2 ulps of dtype (+ atol) of ref, with
    the same NaNs and the same infinities."""
    ref = ref.double().cpu()
    out = out.double().cpu()
    assert torch.equal(torch.isnan(out), torch.isnan(ref))
    fin = torch.isfinite(ref)
    assert torch.equal(out[~fin & ~torch.isnan(ref)], ref[~fin & ~torch.isnan(ref)])
    tol = (rtol + 2 * EPS[dtype]) * ref.abs() + atol
    err = (out - ref).abs()
    assert (err[fin] <= tol[fin]).all(), f"max err {err[fin].max().item():.3g}"


# ---- data and references ---------------------------------------------------------


def rand_grads(gen, dtype, sizes, scale=1000.0):
    """One 1-D gradient of `dtype` per size, drawn from `gen`."""
    out = []
    for n in sizes:
        x = torch.randn(n, generator=gen) * scale
        # A third of each tensor tiny, to exercise subnormal results.
        x[: n // 3] *= 1e-9
        out.append(x.to(dtype))
    return out


def torch_unscale(grads, inv):
    """torch's own unscale (CPU) on copies of grads: (unscaled, found_inf)."""
    ref = [g.clone() for g in grads]
    fi = torch.zeros(1)
    torch._amp_foreach_non_finite_check_and_unscale_(ref, fi, torch.tensor([inv]))
    return ref, fi


def norm64(tensors):
    """The 2-norm of all the tensors together, in float64."""
    return torch.sqrt(sum(t.double().square().sum() for t in tensors))


# ---- multi-process tests ------------------------------------------------------------


def train_plain(model, opt, batches):
    """Steps without a scaler: the cross-entropy of model(x) in FP32 for each
    (x, y), backward, opt.step(), opt.zero_grad()."""
    for x, y in batches:
        torch.nn.functional.cross_entropy(model(x).float(), y).backward()
        opt.step()
        opt.zero_grad()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(fn, args, nprocs: int, timeout: float = 180.0) -> None:
    """torch.multiprocessing.spawn(fn, args, nprocs) that fails instead of
    hanging: a rank stuck in a collective (a peer died, a port was taken)
    is killed after ``timeout`` seconds and the test fails."""
    import time

    import torch.multiprocessing as mp

    ctx = mp.spawn(fn, args=args, nprocs=nprocs, join=False)
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            raise TimeoutError(f"{nprocs} processes did not finish in {timeout:.0f} s")


# ---- cross-entropy peak memory ------------------------------------------------------


def ce_peaks(x, t, peak, warm=False):
    """(peak bytes of torch's cross_entropy forward+backward on the FP32
    upcast of logits x, the same for mixprec.ops.cross_entropy on x), each
    measured by ``peak(fn)``; ``warm``: run both once first (the CUDA caching
    allocator's bookkeeping)."""
    import torch.nn.functional as F

    tf = t.float() if t.is_floating_point() else t

    def upcast():
        F.cross_entropy(x.float(), tf).backward()
        x.grad = None

    def ours():
        mixprec.ops.cross_entropy(x, t).backward()
        x.grad = None

    if warm:
        upcast(), ours()
    return peak(upcast), peak(ours)
