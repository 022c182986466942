"""Bad arguments raise a RuntimeError naming the op and the argument, and
leave every input untouched."""

import subprocess
import sys

import pytest
import torch

import mixprec


def _snapshot(*tensors):
    return [t.clone() for t in tensors]


def _check_untouched(before, after):
    for a, b in zip(before, after):
        if a.is_sparse:
            a, b = a.to_dense(), b.to_dense()
        # Bytes, so NaNs compare equal to themselves.
        assert torch.equal(a.reshape(-1).contiguous().view(torch.uint8), b.reshape(-1).contiguous().view(torch.uint8))


def _good(gen):
    grads = [
        (torch.randn(50, generator=gen) * 100),
        (torch.randn(7, 3, generator=gen) * 100).to(torch.bfloat16),
    ]
    return grads, torch.zeros(1), torch.tensor([0.5])


def _expect_error(fn, tensors, *words):
    before = _snapshot(*tensors)
    with pytest.raises(RuntimeError) as info:
        fn()
    msg = str(info.value)
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    _check_untouched(before, tensors)


UNSCALE_OPS = [
    ("unscale_", torch.ops.mixprec.unscale_),
    ("unscale_norm_", torch.ops.mixprec.unscale_norm_),
]


@pytest.mark.parametrize("name,op", UNSCALE_OPS)
@pytest.mark.parametrize(
    "bad_dtype", [torch.float64, torch.int32, torch.int64, torch.uint8, torch.complex64]
)
def test_bad_grad_dtype_last(gen, name, op, bad_dtype):
    """A bad tensor at the END of the list: the good ones before it must not
    have been modified either."""
    grads, fi, inv = _good(gen)
    grads.append(torch.ones(4, dtype=bad_dtype))
    _expect_error(lambda: op(grads, fi, inv), grads + [fi], f"mixprec::{name}", "grads[2]")


@pytest.mark.parametrize("name,op", UNSCALE_OPS)
def test_non_contiguous_grad(gen, name, op):
    grads, fi, inv = _good(gen)
    grads.append(torch.randn(8, 8, generator=gen)[:, ::2])
    _expect_error(lambda: op(grads, fi, inv), grads + [fi], f"mixprec::{name}", "grads[2]", "contiguous")


@pytest.mark.parametrize("name,op", UNSCALE_OPS)
def test_overlapping_grad(gen, name, op):
    grads, fi, inv = _good(gen)
    grads.append(torch.randn(4, generator=gen).expand(3, 4))
    _expect_error(lambda: op(grads, fi, inv), grads[:2] + [fi], f"mixprec::{name}", "grads[2]")


@pytest.mark.parametrize("name,op", UNSCALE_OPS)
def test_empty_list(name, op):
    fi = torch.zeros(1)
    _expect_error(lambda: op([], fi, torch.tensor([0.5])), [fi], f"mixprec::{name}", "grads", "non-empty")


@pytest.mark.parametrize("name,op", UNSCALE_OPS)
@pytest.mark.parametrize(
    "bad_fi,why",
    [
        (torch.zeros(2), "exactly one element"),
        (torch.zeros(1, dtype=torch.float64), "float32"),
        (torch.zeros(1, dtype=torch.float16), "float32"),
        (torch.zeros(0), "exactly one element"),
    ],
)
def test_bad_found_inf(gen, name, op, bad_fi, why):
    grads, _, inv = _good(gen)
    _expect_error(lambda: op(grads, bad_fi, inv), grads + [bad_fi], f"mixprec::{name}", "found_inf", why)


@pytest.mark.parametrize("name,op", UNSCALE_OPS)
@pytest.mark.parametrize(
    "bad_inv,why",
    [(torch.tensor([0.5, 0.5]), "exactly one element"), (torch.tensor([0.5], dtype=torch.float64), "float32")],
)
def test_bad_inv_scale(gen, name, op, bad_inv, why):
    grads, fi, _ = _good(gen)
    _expect_error(lambda: op(grads, fi, bad_inv), grads + [fi], f"mixprec::{name}", "inv_scale", why)


@pytest.mark.parametrize("name,op", UNSCALE_OPS)
def test_sparse_grad(gen, name, op):
    grads, fi, inv = _good(gen)
    grads.append(torch.randn(4, 4, generator=gen).to_sparse())
    before = _snapshot(*grads[:2], fi)
    with pytest.raises((RuntimeError, NotImplementedError)) as info:
        op(grads, fi, inv)
    assert "mixprec::" in str(info.value) or "Sparse" in str(info.value)
    _check_untouched(before, grads[:2] + [fi])


def test_nan_in_grads_is_not_an_error(gen):
    grads, fi, inv = _good(gen)
    grads[0][3] = float("nan")
    torch.ops.mixprec.unscale_(grads, fi, inv)
    assert fi.item() == 1.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs two device types")
def test_mismatched_devices(gen):
    grads, fi, inv = _good(gen)
    grads.append(torch.randn(5, device="cuda"))
    _expect_error(lambda: torch.ops.mixprec.unscale_(grads, fi, inv), grads[:2] + [fi], "grads[2]")


def test_mismatched_devices_meta(gen):
    """A grad on another device (meta stands in for one on a CPU machine)."""
    grads, fi, inv = _good(gen)
    grads.insert(0, torch.empty(5, device="meta"))
    before = _snapshot(*grads[1:], fi)
    with pytest.raises(RuntimeError, match=r"grads\[0\] is on meta"):
        torch.ops.mixprec.unscale_(grads, fi, inv)
    _check_untouched(before, grads[1:] + [fi])


@pytest.mark.parametrize(
    "kwargs,word",
    [
        (dict(growth_interval=0), "growth_interval"),
        (dict(growth_factor=float("nan")), "growth_factor"),
        (dict(backoff_factor=-0.5), "backoff_factor"),
        (dict(backoff_factor=float("inf")), "backoff_factor"),
    ],
)
def test_update_scale_bad_params(kwargs, word):
    scale, tracker, fi = torch.tensor(4.0), torch.tensor(3, dtype=torch.int32), torch.tensor(0.0)
    args = dict(growth_factor=2.0, backoff_factor=0.5, growth_interval=10)
    args.update(kwargs)
    _expect_error(
        lambda: torch.ops.mixprec.update_scale_(
            scale, tracker, fi, args["growth_factor"], args["backoff_factor"], args["growth_interval"]
        ),
        [scale, tracker, fi],
        "mixprec::update_scale_",
        word,
    )


@pytest.mark.parametrize(
    "which,bad,word",
    [
        ("scale", torch.tensor(4.0, dtype=torch.float64), "scale"),
        ("scale", torch.tensor([4.0, 4.0]), "scale"),
        ("tracker", torch.tensor(3, dtype=torch.int64), "growth_tracker"),
        ("tracker", torch.tensor(3.0), "growth_tracker"),
        ("found_inf", torch.tensor([0.0, 1.0]), "found_inf"),
        ("found_inf", torch.tensor(0, dtype=torch.int32), "found_inf"),
    ],
)
def test_update_scale_bad_tensors(which, bad, word):
    t = {"scale": torch.tensor(4.0), "tracker": torch.tensor(3, dtype=torch.int32), "found_inf": torch.tensor(1.0)}
    t[which] = bad
    _expect_error(
        lambda: torch.ops.mixprec.update_scale_(t["scale"], t["tracker"], t["found_inf"], 2.0, 0.5, 10),
        list(t.values()),
        "mixprec::update_scale_",
        word,
    )


def test_update_scale_ex_bad_bounds():
    ts = [torch.tensor(4.0), torch.tensor(0, dtype=torch.int32), torch.tensor(1, dtype=torch.int32),
          torch.tensor(0, dtype=torch.int64), torch.tensor(1.0)]
    _expect_error(
        lambda: torch.ops.mixprec.update_scale_ex_(*ts, 2.0, 0.5, 10, 1, 8.0, 4.0), ts,
        "mixprec::update_scale_ex_", "min_scale",
    )
    _expect_error(
        lambda: torch.ops.mixprec.update_scale_ex_(*ts, 2.0, 0.5, 10, 0, 0.0, 4.0), ts,
        "mixprec::update_scale_ex_", "hysteresis",
    )
    # Above INT32_MAX, refused rather than truncated (2^32 + 2 acted as 2).
    for h in (2**31, 2**32 + 2):
        _expect_error(
            lambda: torch.ops.mixprec.update_scale_ex_(*ts, 2.0, 0.5, 10, h, 0.0, 4.0), ts,
            "mixprec::update_scale_ex_", "hysteresis", str(h),
        )
    bad_skip = [ts[0], ts[1], ts[2], torch.tensor(0, dtype=torch.int32), ts[4]]
    _expect_error(
        lambda: torch.ops.mixprec.update_scale_ex_(*bad_skip, 2.0, 0.5, 10, 1, 0.0, 4.0), bad_skip,
        "mixprec::update_scale_ex_", "skipped_steps",
    )


def test_fresh_process_load_library_only():
    """torch.ops.load_library alone, nothing else from mixprec imported, gives
    working eager ops (the stable-ABI registration needs no Python)."""
    code = f"""
import sys, torch
torch.ops.load_library({mixprec.library_path()!r})
assert not any(m == "mixprec" or m.startswith("mixprec.") for m in sys.modules)
g = [torch.tensor([2.0, float("inf")]), torch.tensor([4.0], dtype=torch.float16)]
fi = torch.zeros(1)
torch.ops.mixprec.unscale_(g, fi, torch.tensor([0.5]))
assert fi.item() == 1.0 and g[0][0].item() == 1.0 and g[1].item() == 2.0, (g, fi)
s, t = torch.tensor(8.0), torch.tensor(0, dtype=torch.int32)
torch.ops.mixprec.update_scale_(s, t, fi, 2.0, 0.5, 100)
assert s.item() == 4.0
try:
    torch.ops.mixprec.unscale_([torch.ones(2, dtype=torch.float64)], fi, torch.tensor([0.5]))
    raise SystemExit("no error")
except RuntimeError as e:
    # The message starts with the op: no C++ function, source path or line.
    assert "grads[0]" in str(e) and str(e).startswith("mixprec::unscale_: "), str(e)
print("OK")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("OK")


# ---- GradScaler's arguments (issue 23) -------------------------------------------


def _one_scaled_step(gen, scaler):
    model = torch.nn.Linear(4, 3).to(torch.bfloat16)
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(5, 4, generator=gen).to(torch.bfloat16)
    scaler.scale(model(x).float().square().mean()).backward()
    return model, opt


@pytest.mark.parametrize("method", ["unscale_", "step", "clip_grad_norm_"])
@pytest.mark.parametrize("bad", [None, "opt", 3])
def test_scaler_methods_name_a_bad_optimizer(gen, method, bad):
    s = mixprec.amp.GradScaler("cpu")
    model, _ = _one_scaled_step(gen, s)
    before = [p.grad.clone() for p in model.parameters()]
    args = (bad, 1.0) if method == "clip_grad_norm_" else (bad,)
    with pytest.raises(TypeError) as info:
        getattr(s, method)(*args)
    msg = str(info.value)
    assert f"mixprec.amp.GradScaler.{method}" in msg and ("optimizer" in msg or "parameters" in msg), msg
    _check_untouched(before, [p.grad for p in model.parameters()])


def test_scaler_update_takes_an_int_scale(gen):
    """torch's update() takes a float or a tensor (an int failed on
    ``.device``); an integral number is a scale too."""
    s = mixprec.amp.GradScaler("cpu")
    _, opt = _one_scaled_step(gen, s)
    s.step(opt)
    s.update(1024)
    assert s.get_scale() == 1024.0 and s._scale.dtype == torch.float32


def test_disabled_scaler_checks_nothing_like_torch():
    """torch checks the factors only when enabled; so does mixprec (a
    disabled scaler never reads them)."""
    for cls in (torch.amp.GradScaler, mixprec.amp.GradScaler):
        s = cls("cpu", growth_factor=0.5, growth_interval=float("nan"), enabled=False)
        assert not s.is_enabled()
