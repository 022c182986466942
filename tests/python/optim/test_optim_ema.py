"""The EMA of the weights fused into mixprec.optim's step (``ema_decay=``).

Checked against a float64 EMA of the FP32 weights the optimizer writes (the
master, the FP32 param, or for master-free BF16 the FP32 value before its
stochastic rounding) with timm ModelEmaV3's decay schedule, against
torch.lerp on FP32 (the formula ModelEmaV3 runs) bit for bit, against timm's
ModelEmaV3 itself where timm is installed, and for what a user relies on:
EMA off/on leaves every other bit alone, a skipped step, the update
interval, swap/restore, checkpoints, the EMA-model helper, bad arguments,
opcheck, fake tensors and torch.compile.
"""

import copy
import io
import math

import pytest
import torch
from torch.library import opcheck

import mixprec
from mixprec.amp import GradScaler
from mixprec.optim import SGD, AdamW, ema_model

from _reference import bits

SHAPES = [(1,), (7,), (17,), (33, 5), (1000,)]
# param dtype, master_weights
MODES = [
    (torch.float32, True),
    (torch.bfloat16, True),
    (torch.float16, True),
    (torch.bfloat16, False),  # stochastic rounding, no master
]
MODE_IDS = ["f32", "bf16", "f16", "bf16-sr"]


def timm_decay(step, decay, min_decay=0.0, after=0, use_warmup=False, gamma=1.0, power=2 / 3):
    """timm ModelEmaV3.get_decay(step), written out."""
    s = max(0, step - after - 1)
    if s <= 0:
        return 0.0
    if use_warmup:
        d = 1 - (1 + s / gamma) ** -power
        return max(min(d, decay), min_decay)
    return decay


def _params(gen, dtype):
    return [torch.nn.Parameter((torch.randn(*s, generator=gen) * 0.5).to(dtype)) for s in SHAPES]


def _make(kind, params, master_weights=True, **ema):
    if kind == "adamw":
        return AdamW(params, lr=3e-2, weight_decay=1e-2, master_weights=master_weights, seed=11, **ema)
    return SGD(params, lr=3e-2, momentum=0.9, weight_decay=1e-3, master_weights=master_weights, seed=11, **ema)


def _fp32_weights(opt, params):
    """The FP32 values the last step wrote (the EMA's input)."""
    out = []
    for p in params:
        st = opt.state[p]
        out.append(st["master"] if "master" in st else p.detach())
    return [t.float().clone() for t in out]


def _set_grads(gen, params_lists, dtype):
    for ps in zip(*params_lists):
        g = torch.randn(ps[0].shape, generator=gen).to(dtype)
        for p in ps:
            p.grad = g.clone()


EMA_CONFIGS = [
    dict(ema_decay=0.95),
    dict(ema_decay=0.99, ema_update_every=3, ema_update_after_step=4),
    dict(ema_decay=0.999, ema_use_warmup=True, ema_warmup_power=3 / 4, ema_min_decay=0.1),
]


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("cfg", range(len(EMA_CONFIGS)))
def test_ema_equals_float64_ema_of_the_fp32_weights(gen, kind, mode, cfg):
    dtype, mw = mode
    ema_kw = EMA_CONFIGS[cfg]
    steps = 120
    ours_p = _params(gen, dtype)
    # The weights the EMA sees, from a twin: without an EMA for FP32/master
    # params; with ema_decay=0 (the EMA is then the FP32 value itself) for
    # master-free BF16, whose pre-rounding value is not stored anywhere.
    twin_p = [torch.nn.Parameter(p.detach().clone()) for p in ours_p]
    ours = _make(kind, ours_p, mw, **ema_kw)
    twin = _make(kind, twin_p, mw, **({"ema_decay": 0.0} if not mw else {}))
    e64 = [p.detach().double() for p in ours_p]
    e32 = [p.detach().float().clone() for p in ours_p]
    decay_kw = dict(
        decay=ema_kw["ema_decay"], min_decay=ema_kw.get("ema_min_decay", 0.0),
        after=ema_kw.get("ema_update_after_step", 0), use_warmup=ema_kw.get("ema_use_warmup", False),
        power=ema_kw.get("ema_warmup_power", 2 / 3),
    )
    every = ema_kw.get("ema_update_every", 1)
    grad_dtype = dtype
    for t in range(1, steps + 1):
        _set_grads(gen, [ours_p, twin_p], grad_dtype)
        ours.step()
        twin.step()
        w = [twin.state[p]["ema"].clone() for p in twin_p] if not mw else _fp32_weights(twin, twin_p)
        if t % every == 0:
            d = timm_decay(t, **decay_kw)
            for i in range(len(w)):
                e64[i] += (1.0 - d) * (w[i].double() - e64[i])
                e32[i].lerp_(w[i], 1.0 - d)
    for i, p in enumerate(ours_p):
        got = ours.state[p]["ema"]
        assert got.dtype is torch.float32 and got.shape == p.shape
        # The params and everything else are the twin's bit for bit (the
        # EMA changes no other bit).
        assert torch.equal(bits(p.detach()), bits(twin_p[i].detach()))
        # float64: within the FP32 rounding of ~steps lerps.
        scale = float(e64[i].abs().max()) + 1e-3
        torch.testing.assert_close(got.double(), e64[i], rtol=0, atol=scale * 2e-6)
        # torch.lerp on FP32 (what timm's ModelEmaV3 runs on an FP32 EMA):
        # the same formula, bit for bit.
        assert torch.equal(bits(got), bits(e32[i])), f"tensor {i}: differs from torch.lerp_"


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_ema_changes_no_other_bit(gen, kind, mode):
    dtype, mw = mode
    a_p = _params(gen, dtype)
    b_p = [torch.nn.Parameter(p.detach().clone()) for p in a_p]
    extra = dict(amsgrad=True, maximize=True) if kind == "adamw" else dict(nesterov=True, maximize=True)
    opt_cls = AdamW if kind == "adamw" else SGD
    kw = dict(lr=1e-2, weight_decay=0.02, master_weights=mw, seed=5, **extra)
    if kind == "sgd":
        kw["momentum"] = 0.9
    a = opt_cls(a_p, ema_decay=0.9, ema_update_every=2, **kw)
    b = opt_cls(b_p, **kw)
    sa, sb = GradScaler("cpu", init_scale=256.0), GradScaler("cpu", init_scale=256.0)
    sa.scale(torch.zeros(()))  # the scale tensors exist from the first scale() on
    sb.scale(torch.zeros(()))
    for _ in range(9):
        _set_grads(gen, [a_p, b_p], dtype)
        for p, q in zip(a_p, b_p):
            p.grad.mul_(256.0)
            q.grad.mul_(256.0)
        sa.step(a)
        sb.step(b)
        sa.update()
        sb.update()
    for p, q in zip(a_p, b_p):
        assert torch.equal(bits(p.detach()), bits(q.detach()))
        assert torch.equal(bits(p.grad), bits(q.grad))  # the unscaled grads written back
        sta, stb = a.state[p], b.state[q]
        assert set(sta) - set(stb) == {"ema"}
        for k, v in stb.items():
            assert torch.equal(bits(sta[k].reshape(-1)), bits(v.reshape(-1))), k


def test_bf16_ema_stalls_ours_tracks(gen):
    """The issue's point: an EMA kept in BF16 with decay 0.9998 cannot move
    ((1 - decay) * (w - ema) is below half a BF16 ulp), ours follows the
    master as a float64 EMA does."""
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64).bfloat16()
    with torch.no_grad():
        model.weight.add_(1.0)  # weights ~1: a BF16 ulp of 2^-7
    opt = AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, ema_decay=0.9998)
    bf16_ema = model.weight.detach().clone()  # what an EMA of the BF16 model holds
    e64 = model.weight.detach().double()
    w0 = e64.clone()
    x = torch.randn(256, 64, generator=gen).bfloat16()
    for t in range(1, 1501):
        model.zero_grad()
        (model(x).float() - 3.0).pow(2).mean().backward()
        opt.step()
        d = timm_decay(t, 0.9998)
        bf16_ema.lerp_(model.weight.detach(), 1.0 - d)
        e64 += (1.0 - d) * (opt.state[model.weight]["master"].double() - e64)
    ours = opt.state[model.weight]["ema"].double()
    moved64 = (e64 - w0).abs()
    assert float(moved64.mean()) > 4 * 2.0**-9  # the true EMA moved by several BF16 half-ulps
    # The BF16 EMA did not move at all after its first update (a copy).
    assert torch.equal(bf16_ema.double(), w0)
    # Ours did, as the float64 EMA.
    torch.testing.assert_close(ours, e64, rtol=0, atol=1e-5)


def test_matches_timm_model_ema_v3_on_fp32(gen):
    timm_ema = pytest.importorskip("timm.utils.model_ema")
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(13, 17), torch.nn.Tanh(), torch.nn.Linear(17, 3))
    ref_model = copy.deepcopy(model)
    cfg = dict(decay=0.999, min_decay=0.05, use_warmup=True, warmup_gamma=2.0, warmup_power=0.75,
               update_after_step=3)
    ours = AdamW(model.parameters(), lr=1e-2, **{f"ema_{k}": v for k, v in cfg.items()})
    ref = torch.optim.AdamW(ref_model.parameters(), lr=1e-2, fused=True)
    ema = timm_ema.ModelEmaV3(ref_model, exclude_buffers=True, **cfg)
    x = torch.randn(32, 13, generator=gen)
    for t in range(1, 60):
        for m in (model, ref_model):
            m.zero_grad()
            m(x).pow(2).sum().backward()
        ours.step()
        ref.step()
        ema.update(ref_model, step=t)  # timm's train loop: num_updates after the step
    for p, q, e in zip(model.parameters(), ref_model.parameters(), ema.module.parameters()):
        if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
            assert torch.equal(bits(p.detach()), bits(q.detach()))
        torch.testing.assert_close(ours.state[p]["ema"], e.detach(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_skipped_step_leaves_ema_and_count(gen, kind):
    a_p = _params(gen, torch.bfloat16)
    b_p = [torch.nn.Parameter(p.detach().clone()) for p in a_p]
    a = _make(kind, a_p, ema_decay=0.9, ema_use_warmup=True)
    b = _make(kind, b_p, ema_decay=0.9, ema_use_warmup=True)
    scaler = GradScaler("cpu", init_scale=8.0)
    scaler.scale(torch.zeros(()))
    for t in range(6):
        _set_grads(gen, [a_p, b_p], torch.bfloat16)
        if t == 3:  # an inf in a's grads: a skips, b never sees that step
            before = [a.state[p]["ema"].clone() for p in a_p]
            steps = [a.state[p]["step"].clone() for p in a_p]
            a_p[2].grad[0] = float("inf")
            scaler.step(a)
            scaler.update()
            for p, e, s in zip(a_p, before, steps):
                assert torch.equal(bits(a.state[p]["ema"]), bits(e))
                assert torch.equal(a.state[p]["step"], s)
            continue
        for p in a_p:
            p.grad.mul_(scaler.get_scale())
        scaler.step(a)
        scaler.update()
        b.step()
    # Same count, same decays, same values: the skipped step did not count.
    for p, q in zip(a_p, b_p):
        assert torch.equal(bits(a.state[p]["ema"]), bits(b.state[q]["ema"]))


def test_op_skip_on_found_inf_writes_no_ema(gen):
    p = torch.randn(100, generator=gen).bfloat16()
    g = torch.randn(100, generator=gen).bfloat16()
    m = p.float()
    st = [torch.zeros(100), torch.zeros(100)]
    ema = torch.randn(100, generator=gen)
    step = torch.tensor(3.0)
    snap = [t.clone() for t in (p, m, ema, step)]
    torch.ops.mixprec.adamw_step_([p], [g], [m], [st[0]], [st[1]], [], [step], 1e-3, 0.9, 0.999, 0.0, 1e-8,
                                  False, False, None, None, torch.tensor(1.0), emas=[ema], ema_decay=0.5)
    for a, b in zip((p, m, ema, step), snap):
        assert torch.equal(bits(a), bits(b))


def test_update_every_leaves_buffer_between_updates(gen):
    ps = _params(gen, torch.bfloat16)
    opt = _make("adamw", ps, ema_decay=0.5, ema_update_every=4)
    last = None
    for t in range(1, 13):
        _set_grads(gen, [ps], torch.bfloat16)
        opt.step()
        e = opt.state[ps[4]]["ema"].clone()
        if last is not None:
            assert torch.equal(e, last) == (t % 4 != 0), t
        last = e


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_swap_ema_and_restore(gen, mode):
    dtype, mw = mode
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(9, 11), torch.nn.BatchNorm1d(11), torch.nn.Linear(11, 2)).to(dtype)
    twin = copy.deepcopy(model)
    opt = AdamW(model.parameters(), lr=1e-2, master_weights=mw, seed=1, ema_decay=0.8)
    topt = AdamW(twin.parameters(), lr=1e-2, master_weights=mw, seed=1, ema_decay=0.8)
    x = torch.randn(16, 9, generator=gen).to(dtype)

    def train(m, o):
        m.zero_grad()
        m(x).float().pow(2).sum().backward()
        o.step()

    for _ in range(4):
        train(model, opt)
        train(twin, topt)
    before = [bits(p.detach()).clone() for p in model.parameters()]
    buffers = [b.clone() for b in model.buffers()]
    with opt.swap_ema():
        for p in model.parameters():
            assert torch.equal(bits(p.detach()), bits(opt.state[p]["ema"].to(dtype)))
        for b, b0 in zip(model.buffers(), buffers):
            assert torch.equal(b, b0)  # buffers stay the model's
    for p, b in zip(model.parameters(), before):
        assert torch.equal(bits(p.detach()), b)
    with pytest.raises(ZeroDivisionError):
        with opt.swap_ema():
            1 / 0
    for p, b in zip(model.parameters(), before):
        assert torch.equal(bits(p.detach()), b)
    # The restore is not an outside write: training goes on as the twin's.
    for _ in range(3):
        train(model, opt)
        train(twin, topt)
    for p, q in zip(model.parameters(), twin.parameters()):
        assert torch.equal(bits(p.detach()), bits(q.detach()))
        assert torch.equal(bits(opt.state[p]["ema"]), bits(topt.state[q]["ema"]))


def test_swap_ema_before_any_step_changes_nothing(gen):
    ps = _params(gen, torch.bfloat16)
    opt = _make("adamw", ps, ema_decay=0.9)
    before = [p.detach().clone() for p in ps]
    with opt.swap_ema():
        for p, b in zip(ps, before):
            assert torch.equal(p.detach(), b)


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_checkpoint_round_trip(gen, kind):
    a_p = _params(gen, torch.bfloat16)
    b_p = [torch.nn.Parameter(p.detach().clone()) for p in a_p]
    kw = dict(ema_decay=0.97, ema_use_warmup=True)
    a = _make(kind, a_p, **kw)
    for _ in range(5):
        _set_grads(gen, [a_p, b_p], torch.bfloat16)
        a.step()
    with torch.no_grad():
        for p, q in zip(a_p, b_p):
            q.copy_(p)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    sd = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    for st in sd["state"].values():
        assert st["ema"].dtype is torch.float32
    b = _make(kind, b_p, **kw)
    b.load_state_dict(sd)
    for p, q in zip(a_p, b_p):
        assert b.state[q]["ema"].dtype is torch.float32
        assert torch.equal(bits(a.state[p]["ema"]), bits(b.state[q]["ema"]))
    for _ in range(4):
        _set_grads(gen, [a_p, b_p], torch.bfloat16)
        a.step()
        b.step()
    for p, q in zip(a_p, b_p):
        assert torch.equal(bits(a.state[p]["ema"]), bits(b.state[q]["ema"]))
        assert torch.equal(bits(p.detach()), bits(q.detach()))


def test_ema_model_helper(gen):
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.BatchNorm1d(6)).bfloat16()
    opt = AdamW(model.parameters(), lr=1e-2, ema_decay=0.7)
    for _ in range(3):
        model.zero_grad()
        model(torch.randn(8, 5, generator=gen).bfloat16()).float().sum().backward()
        opt.step()
    before = [p.detach().clone() for p in model.parameters()]
    m = ema_model(model, opt)
    assert m is not model and not m.training and model.training
    for p, q in zip(model.parameters(), m.parameters()):
        assert q.dtype is torch.bfloat16
        assert torch.equal(bits(q.detach()), bits(opt.state[p]["ema"].bfloat16()))
    for b, c in zip(model.buffers(), m.buffers()):
        assert torch.equal(b, c) and b.data_ptr() != c.data_ptr()
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p.detach(), b)
    m32 = ema_model(model, opt, dtype=torch.float32)
    for p, q in zip(model.parameters(), m32.parameters()):
        assert torch.equal(bits(q.detach()), bits(opt.state[p]["ema"]))
    assert m32[1].running_mean.dtype is torch.float32


def test_groups_with_and_without_ema(gen):
    a, b = _params(gen, torch.bfloat16)[:2]
    opt = AdamW([{"params": [a], "ema_decay": 0.9}, {"params": [b]}], lr=1e-2)
    for _ in range(2):
        a.grad = torch.randn(a.shape, generator=gen).bfloat16()
        b.grad = torch.randn(b.shape, generator=gen).bfloat16()
        opt.step()
    assert "ema" in opt.state[a] and "ema" not in opt.state[b]


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(ema_decay=1.5), "ema_decay"),
        (dict(ema_decay=-0.1), "ema_decay"),
        (dict(ema_decay=float("nan")), "ema_decay"),
        (dict(ema_decay=0.9, ema_min_decay=2.0), "ema_min_decay"),
        (dict(ema_decay=0.9, ema_use_warmup=True, ema_warmup_gamma=0.0), "ema_warmup_gamma"),
        (dict(ema_decay=0.9, ema_use_warmup=True, ema_warmup_power=float("inf")), "ema_warmup_power"),
        (dict(ema_decay=0.9, ema_update_every=0), "ema_update_every"),
        (dict(ema_decay=0.9, ema_update_after_step=-1), "ema_update_after_step"),
    ],
)
@pytest.mark.parametrize("cls", [AdamW, SGD])
def test_bad_ema_arguments_refused_by_the_classes(cls, kw, match):
    with pytest.raises(ValueError, match=f"mixprec.optim.{cls.__name__}: {match}"):
        cls([torch.nn.Parameter(torch.zeros(3))], lr=1e-2, **kw)


@pytest.mark.parametrize("cls", [AdamW, SGD])
def test_non_integral_ema_update_every_is_a_type_error(cls):
    """A non-integral float for an integer is the wrong kind, as
    [note: argument conversion] in mixprec/_args.py says (was a ValueError)."""
    with pytest.raises(TypeError, match=f"mixprec.optim.{cls.__name__}: ema_update_every must be an integer"):
        cls([torch.nn.Parameter(torch.zeros(3))], lr=1e-2, ema_decay=0.9, ema_update_every=1.5)


def _op_problem(gen, n=3):
    ps = [torch.randn(10 + i, generator=gen).bfloat16() for i in range(n)]
    gs = [torch.randn(p.shape, generator=gen).bfloat16() for p in ps]
    ms = [p.float() for p in ps]
    m1 = [torch.randn(p.shape, generator=gen) for p in ps]
    m2 = [torch.rand(p.shape, generator=gen) for p in ps]
    steps = [torch.tensor(2.0) for _ in ps]
    emas = [torch.randn(p.shape, generator=gen) for p in ps]
    return ps, gs, ms, m1, m2, steps, emas


def _adamw(ps, gs, ms, m1, m2, steps, **kw):
    torch.ops.mixprec.adamw_step_(ps, gs, ms, m1, m2, [], steps, 1e-3, 0.9, 0.999, 0.01, 1e-8, False, False,
                                  None, None, None, **kw)


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda e, ps: e.__setitem__(1, e[1].double()), r"emas\[1\] must be float32"),
        (lambda e, ps: e.__setitem__(0, e[0][:5]), r"emas\[0\]"),
        (lambda e, ps: e.pop(), "emas has 2 tensors but params has 3"),
        (lambda e, ps: e.__setitem__(2, e[2].to("meta")), r"emas\[2\]"),
        (lambda e, ps: e.__setitem__(1, e[0]), "emas"),  # two params' EMAs in one buffer
        (lambda e, ps: e.__setitem__(0, torch.randn(20)[::2]), r"emas\[0\]"),
    ],
)
def test_bad_emas_refused_by_the_op_and_nothing_written(gen, mutate, match):
    ps, gs, ms, m1, m2, steps, emas = _op_problem(gen)
    mutate(emas, ps)
    snap = [t.clone() for t in (*ps, *ms, *m1, *m2, *steps, *(e for e in emas if e.device.type == "cpu"))]
    with pytest.raises(RuntimeError, match=match) as ei:
        _adamw(ps, gs, ms, m1, m2, steps, emas=emas, ema_decay=0.9)
    assert "adamw_step_" in str(ei.value) and ".cpp" not in str(ei.value)
    now = [t for t in (*ps, *ms, *m1, *m2, *steps, *(e for e in emas if e.device.type == "cpu"))]
    assert all(torch.equal(a, b) for a, b in zip(snap, now))


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(ema_decay=1.01), "ema_decay must be in"),
        (dict(ema_decay=float("nan")), "ema_decay must be in"),
        (dict(ema_min_decay=-1.0), "ema_min_decay must be in"),
        (dict(ema_use_warmup=True, ema_warmup_gamma=float("nan")), "ema_warmup_gamma must be"),
        (dict(ema_use_warmup=True, ema_warmup_power=0.0), "ema_warmup_power must be"),
        (dict(ema_update_every=0), "ema_update_every must be >= 1"),
        (dict(ema_update_after_step=-3), "ema_update_after_step must be >= 0"),
    ],
)
@pytest.mark.parametrize("op", ["adamw", "sgd"])
def test_bad_ema_hyper_parameters_refused_by_the_op(gen, op, kw, match):
    ps, gs, ms, m1, m2, steps, emas = _op_problem(gen)
    snap = [bits(t).clone() for t in (*ps, *ms, *emas, *steps)]
    name = "adamw_step_" if op == "adamw" else "sgd_step_"
    with pytest.raises(RuntimeError, match=match) as ei:
        if op == "adamw":
            _adamw(ps, gs, ms, m1, m2, steps, emas=emas, **kw)
        else:
            torch.ops.mixprec.sgd_step_(ps, gs, ms, m1, steps, 1e-2, 0.9, 0.0, 0.0, False, False, None, None,
                                        None, emas=emas, **kw)
    assert name in str(ei.value)
    assert all(torch.equal(a, bits(b)) for a, b in zip(snap, (*ps, *ms, *emas, *steps)))
    # The same under FakeTensorMode (the fake kernel makes the same checks).
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = [[mode.from_tensor(t) for t in lst] for lst in (ps, gs, ms, m1, m2, steps, emas)]
        with pytest.raises(RuntimeError, match=match):
            if op == "adamw":
                _adamw(*fake[:6], emas=fake[6], **kw)
            else:
                torch.ops.mixprec.sgd_step_(fake[0], fake[1], fake[2], fake[3], fake[5], 1e-2, 0.9, 0.0, 0.0,
                                            False, False, None, None, None, emas=fake[6], **kw)


def test_ema_arguments_unchecked_without_emas(gen):
    """Without emas the EMA keywords are ignored (as the C API ignores them
    with bufs NULL): old callers keep working whatever they pass."""
    ps, gs, ms, m1, m2, steps, _ = _op_problem(gen)
    _adamw(ps, gs, ms, m1, m2, steps, ema_decay=5.0)


def test_op_bumps_ema_versions(gen):
    ps, gs, ms, m1, m2, steps, emas = _op_problem(gen)
    v = [e._version for e in emas]
    _adamw(ps, gs, ms, m1, m2, steps, emas=emas, ema_decay=0.9)
    assert all(e._version > w for e, w in zip(emas, v))


def test_opcheck_with_emas(gen):
    ps, gs, ms, m1, m2, steps, emas = _op_problem(gen)
    opcheck(torch.ops.mixprec.adamw_step_.default,
            (ps, gs, ms, m1, m2, [], steps, 1e-3, 0.9, 0.999, 0.01, 1e-8, False, False, None, None, None),
            {"emas": emas, "ema_decay": 0.9, "ema_use_warmup": True})
    ps, gs, ms, m1, m2, steps, emas = _op_problem(gen)
    opcheck(torch.ops.mixprec.sgd_step_.default,
            (ps, gs, ms, m1, steps, 1e-2, 0.9, 0.0, 0.0, False, False, None, torch.tensor(4.0), None),
            {"emas": emas, "ema_decay": 0.5, "ema_update_every": 2, "unscale_grads": True})


def test_fake_kernel_traces_with_emas(gen):
    from torch._subclasses.fake_tensor import FakeTensorMode

    ps, gs, ms, m1, m2, steps, emas = _op_problem(gen)
    with FakeTensorMode() as mode:
        fake = [[mode.from_tensor(t) for t in lst] for lst in (ps, gs, ms, m1, m2, steps, emas)]
        _adamw(*fake[:6], emas=fake[6], ema_decay=0.9)
        bad = list(fake[6])
        bad[1] = mode.from_tensor(torch.zeros(3))
        with pytest.raises(RuntimeError, match=r"emas\[1\] must have the shape"):
            _adamw(*fake[:6], emas=bad, ema_decay=0.9)


def test_compiled_training_step_with_ema(gen):
    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).bfloat16()
    opt = AdamW(model.parameters(), lr=1e-2, ema_decay=0.9, ema_use_warmup=True)
    x = torch.randn(8, 12, generator=gen).bfloat16()

    @torch.compile(backend="aot_eager", fullgraph=False)
    def train_step(x):
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    e64 = [p.detach().double() for p in model.parameters()]
    for t in range(1, 7):
        train_step(x)
        d = timm_decay(t, 0.9, use_warmup=True)
        for i, p in enumerate(model.parameters()):
            e64[i] += (1.0 - d) * (opt.state[p]["master"].double() - e64[i])
    for i, p in enumerate(model.parameters()):
        torch.testing.assert_close(opt.state[p]["ema"].double(), e64[i], rtol=0, atol=1e-6)
    assert float(opt.state[model[0].weight]["step"]) == 6.0
