"""Lean optimizer state (issue 24) through mixprec.optim's AdamW / SGD: the
options and their refusals, the remainder encoding (exhaustive over the BF16
words), the 8-bit map, the state each mode holds and its memory report
(hand-counted), bit-identity of the remainder mode with the FP32-master mode
(EMA, GradScaler skip, unscale write-back, folded clip, compile, swap_ema,
outside writes), and checkpoints: the compact form saved and resumed bit for
bit, torch's FP32 state loaded (quantised), the recipe back to torch's
optimizer (dequantised). Accuracy against float64 and torchao is in
test_optim_lean_accuracy.py, distributed runs in
test_optim_lean_distributed.py."""

import copy
import math

import pytest
import torch

from mixprec import _optim_lean as lean
from mixprec.amp import GradScaler
from mixprec.optim import SGD, AdamW

from _reference import assert_same, bits

U8, BF16, F32 = torch.uint8, torch.bfloat16, torch.float32

# mode name -> AdamW keywords (SGD: momentum_dtype from exp_avg_dtype)
MODES = {
    "master": {},
    "rem": dict(param_remainders=True),
    "rem+bf16": dict(param_remainders=True, exp_avg_dtype=BF16, exp_avg_sq_dtype=BF16),
    "rem+8bit": dict(param_remainders=True, exp_avg_dtype=U8, exp_avg_sq_dtype=U8),
    "sr+bf16": dict(master_weights=False, exp_avg_dtype=BF16, exp_avg_sq_dtype=BF16),
    "master+8bit": dict(exp_avg_dtype=U8, exp_avg_sq_dtype=BF16),
}
LEAN_MODES = [m for m in MODES if m != "master"]
SHAPES = [(1,), (7, 3), (257,), (64, 65), (4099,)]


def kwargs(kind, mode):
    kw = dict(MODES[mode])
    if kind == "sgd":
        kw.pop("exp_avg_sq_dtype", None)
        if "exp_avg_dtype" in kw:
            kw["momentum_dtype"] = kw.pop("exp_avg_dtype")
    return kw


def make(kind, params, mode, **extra):
    kw = {**kwargs(kind, mode), **extra}
    if kind == "adamw":
        return AdamW(params, lr=1e-2, weight_decay=0.1, **{"seed": 11, **kw})
    return SGD(params, lr=1e-2, momentum=0.9, weight_decay=1e-3, **{"seed": 11, **kw})


def bf16_params(gen, shapes=SHAPES, scale=0.5):
    return [torch.nn.Parameter((torch.randn(*s, generator=gen) * scale).bfloat16()) for s in shapes]


def grads_for(params, gen, scale=1.0):
    return [(torch.randn(p.shape, generator=gen) * scale).bfloat16() for p in params]


def fp32_master(opt, p):
    return opt.fp32_state(p)["master"]


# ---- the options -------------------------------------------------------------------


@pytest.mark.parametrize("cls, kw, exc, name", [
    (AdamW, dict(exp_avg_dtype=torch.float16), ValueError, "exp_avg_dtype"),
    (AdamW, dict(exp_avg_sq_dtype="bfloat16"), TypeError, "exp_avg_sq_dtype"),  # a name, not a dtype
    (AdamW, dict(exp_avg_sq_dtype=torch.int8), ValueError, "exp_avg_sq_dtype"),
    (SGD, dict(momentum_dtype=torch.float64, momentum=0.9), ValueError, "momentum_dtype"),
    (AdamW, dict(param_remainders=1), TypeError, "param_remainders"),  # not a bool
    (AdamW, dict(param_remainders=True, master_weights=False), ValueError, "param_remainders"),
    (SGD, dict(param_remainders="yes"), TypeError, "param_remainders"),
])
def test_bad_options_raise_naming_the_argument(gen, cls, kw, exc, name):
    """TypeError for a value of the wrong kind, ValueError for a bad value,
    naming the class and the option (issue 39)."""
    with pytest.raises(exc, match=f"mixprec.optim.{cls.__name__}: {name}"):
        cls(bf16_params(gen), **kw)


@pytest.mark.parametrize("cls", [AdamW, SGD])
def test_remainders_refuse_float16_params_and_bad_group_values(gen, cls):
    ps = [torch.nn.Parameter(torch.randn(5, generator=gen).half())]
    with pytest.raises(ValueError, match="param_remainders"):
        cls(ps, param_remainders=True)
    opt = cls(bf16_params(gen, [(4,)]))
    with pytest.raises(ValueError, match="param_remainders"):
        opt.add_param_group({"params": ps, "param_remainders": True})
    opt_name = "exp_avg_dtype" if cls is AdamW else "momentum_dtype"
    with pytest.raises(ValueError, match=opt_name):
        opt.add_param_group({"params": bf16_params(gen, [(3,)]), opt_name: torch.int32})
    # FP32 params have no master to shrink: accepted, stepped as before.
    cls([torch.nn.Parameter(torch.randn(3, generator=gen))], param_remainders=True)


def test_defaults_are_todays_state(gen):
    for cls in (AdamW, SGD):
        g = cls(bf16_params(gen), momentum=0.9) if cls is SGD else cls(bf16_params(gen))
        group = g.param_groups[0]
        assert group["param_remainders"] is False
        for name in ("exp_avg_dtype", "exp_avg_sq_dtype") if cls is AdamW else ("momentum_dtype",):
            assert group[name] is torch.float32


# ---- [note: remainder encoding], exhaustively ---------------------------------------


def _all_masters(lows):
    hi = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32)
    lo = torch.tensor(lows, dtype=torch.int32)
    return ((hi[:, None] << 16) | lo[None, :]).reshape(-1).view(torch.float32)


def test_remainder_split_join_is_exact_on_every_bf16_word():
    lows = [0, 1, 0x3FFF, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xFFFE, 0xFFFF]
    m = _all_masters(lows)
    p, r = lean.split_master(m)
    assert p.dtype is BF16 and r.dtype is torch.int16
    assert torch.equal(lean.join_master(p, r).view(torch.int32), m.view(torch.int32))
    # The param is the master rounded to nearest (ties away from zero):
    # round-to-nearest-even's value except at exact ties with an even top.
    fin = torch.isfinite(m) & torch.isfinite(m.bfloat16())
    rne = m.bfloat16()
    lo = m.view(torch.int32) & 0xFFFF
    hi_even = ((m.view(torch.int32) >> 16) & 1) == 0
    tie = (lo == 0x8000) & hi_even
    same = bits(p) == bits(rne)
    assert bool(same[fin & ~tie].all())
    up = bits(p)[fin & tie].int() - bits(rne)[fin & tie].int()
    assert bool((up == 1).all())  # one BF16 ulp larger in magnitude (sign-magnitude words)


def test_zero_remainder_joins_to_the_param_itself(gen):
    p = torch.randn(1000, generator=gen).bfloat16()
    assert torch.equal(lean.join_master(p, torch.zeros(1000, dtype=torch.int16)), p.float())


# ---- the 8-bit map -------------------------------------------------------------------


@pytest.mark.parametrize("signed", [True, False])
def test_code_map_is_the_dynamic_tree_map(signed):
    m = lean.code_map(signed).double()
    assert m.numel() == 256 and float(m.max()) == 1.0 and (0.0 in m.tolist())
    assert (m >= 0).all() or signed
    # torchao's table: the same 256 values.
    # torchao's table: the same 256 values (torchao takes the midpoints in
    # FP32 first, so up to one FP32 ulp apart).
    ao = pytest.importorskip("torchao.optim.quant_utils")
    want = torch.tensor(ao.create_dynamic_map(signed=signed), dtype=torch.float64).sort().values
    torch.testing.assert_close(m.sort().values, want, rtol=2.0**-22, atol=0)


@pytest.mark.parametrize("signed", [True, False])
def test_quantize_gives_the_nearest_code_per_block(gen, signed):
    x = torch.randn(3 * 256 + 17, generator=gen) * torch.logspace(-6, 0, 3 * 256 + 17)
    if not signed:
        x = x.abs()
    x[256:512] = 0  # an all-zero block
    codes, scales = lean.quantize(x, signed)
    assert codes.dtype is U8 and scales.shape == (4,)
    y = lean.dequantize(codes, scales, signed)
    qmap = lean.code_map(signed).double()
    for b in range(4):
        blk = x[b * 256:(b + 1) * 256].double()
        s = blk.abs().max()
        assert float(scales[b]) == float(s)
        if s == 0:
            assert (y[b * 256:(b + 1) * 256] == 0).all()
            continue
        cand = (qmap[None, :] * s - blk[:, None]).abs()
        got = (y[b * 256:(b + 1) * 256].double() - blk).abs()
        # The nearest map value (within FP32 rounding of the normalisation).
        assert bool((got <= cand.min(1).values + 1e-6 * s).all())


# ---- the state each mode holds, and the memory report ----------------------------------


def _hand_count(kind, mode, params, ema=False):
    """Bytes by kind, counted by hand from the mode's definition."""
    kw = kwargs(kind, mode)
    n = sum(p.numel() for p in params)
    per = {"params": 2 * n, "grads": 2 * n, "masters": 0, "remainders": 0, "moments": 0, "ema": 4 * n if ema else 0}
    if kw.get("param_remainders"):
        per["remainders"] = 2 * n
    elif kw.get("master_weights", True):
        per["masters"] = 4 * n
    names = ["exp_avg_dtype", "exp_avg_sq_dtype"] if kind == "adamw" else ["momentum_dtype"]
    for name in names:
        dt = kw.get(name, F32)
        per["moments"] += {F32: 4, BF16: 2, U8: 1}[dt] * n
        if dt == U8:
            per["moments"] += sum(4 * -(-p.numel() // 256) for p in params)
    per["moments"] += 4 * len(params)  # the step counts
    return n, per


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
@pytest.mark.parametrize("mode", list(MODES))
def test_state_layout_and_memory_report(gen, kind, mode):
    params = bf16_params(gen)
    opt = make(kind, params, mode, ema_decay=0.99)
    for p, g in zip(params, grads_for(params, gen)):
        p.grad = g
    before = opt.memory_report()
    assert before.moments == before.masters == before.remainders == 0
    opt.step()
    kw = kwargs(kind, mode)
    for p in params:
        st = opt.state[p]
        assert ("remainder" in st) == bool(kw.get("param_remainders"))
        assert ("master" in st) == (not kw.get("param_remainders") and kw.get("master_weights", True))
        if "remainder" in st:
            assert st["remainder"].dtype is torch.int16 and st["remainder"].shape == p.shape
        keys = {"exp_avg": "exp_avg_dtype", "exp_avg_sq": "exp_avg_sq_dtype"} if kind == "adamw" else {
            "momentum_buffer": "momentum_dtype"}
        for key, name in keys.items():
            dt = kw.get(name, F32)
            assert st[key].dtype is dt and st[key].shape == p.shape
            assert (key + "_scale" in st) == (dt == U8)
            if dt == U8:
                assert st[key + "_scale"].dtype is F32 and st[key + "_scale"].shape == (-(-p.numel() // 256),)
    rep = opt.memory_report()
    n, want = _hand_count(kind, mode, params, ema=True)
    assert rep.numel == n
    for k, v in want.items():
        assert getattr(rep, k) == v, k
    assert rep.total == sum(want.values())
    assert rep.per_param()["total"] == pytest.approx(sum(want.values()) / n)
    assert "B/param" in str(rep)


def test_memory_report_counts_each_param_once_and_fp32_params(gen):
    w = torch.nn.Parameter(torch.randn(300, generator=gen))
    b = torch.nn.Parameter(torch.randn(20, generator=gen).bfloat16())
    opt = AdamW([{"params": [w]}, {"params": [b], "param_remainders": True, "exp_avg_dtype": U8}])
    w.grad, b.grad = torch.randn_like(w), torch.randn_like(b)
    opt.step()
    rep = opt.memory_report()
    assert rep.numel == 320
    assert rep.params == 300 * 4 + 20 * 2 and rep.grads == 300 * 4 + 20 * 2
    assert rep.masters == 0 and rep.remainders == 40
    assert rep.moments == 300 * 8 + 20 * (1 + 4) + 4 + 4 + 4


# ---- bit-identity of the remainder mode ----------------------------------------------------


def _run(kind, mode, params, grads_seq, scaler=None, inf_at=(), fold=False, **extra):
    """``mode``'s optimizer over ``params`` through the gradient sequence
    (``extra`` overrides the mode's keywords)."""
    opt = make(kind, params, mode, **extra)
    for t, grads in enumerate(grads_seq):
        for p, g in zip(params, grads):
            p.grad = g.clone()
        if t in inf_at:
            params[0].grad.view(-1)[0] = float("inf")
        if scaler is None:
            opt.step()
            continue
        scale = scaler.scale(torch.ones(()))  # what scaler.scale(loss).backward() multiplies by
        for p in params:
            p.grad.mul_(scale)
        if fold:
            scaler.clip_grad_norm_(opt, 0.5, fold=True)
        scaler.step(opt)
        scaler.update()
    return opt


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
@pytest.mark.parametrize("moments", ["rem", "rem+bf16", "rem+8bit"])
@pytest.mark.parametrize("setup", ["plain", "ema+amsgrad", "scaler+skip", "folded clip"])
def test_remainders_follow_the_fp32_master_bit_for_bit(gen, kind, moments, setup):
    """Remainders change how the master is held, nothing else: against the
    FP32-master mode with the same moment format, the master (joined) and
    the EMA are the same bits at every step, the params differ only at exact
    ties (one ulp), and grads written back are the same."""
    base = bf16_params(gen)
    seq = [grads_for(base, gen) for _ in range(6)]
    extra = {}
    if setup == "ema+amsgrad":
        extra = dict(ema_decay=0.9, **({"amsgrad": True} if kind == "adamw" else {"nesterov": True}))
    mk_scaler = (lambda: GradScaler("cpu", init_scale=2.0**10, growth_interval=2)) if "clip" in setup or "scaler" in setup else (lambda: None)
    inf_at = (2,) if setup == "scaler+skip" else ()
    fold = setup == "folded clip"
    pa = [torch.nn.Parameter(p.detach().clone()) for p in base]
    pb = [torch.nn.Parameter(p.detach().clone()) for p in base]
    oa = _run(kind, moments, pa, seq, mk_scaler(), inf_at, fold, **extra)
    ob = _run(kind, moments, pb, seq, mk_scaler(), inf_at, fold, param_remainders=False, **extra)
    for a, b in zip(pa, pb):
        sa, sb = oa.state[a], ob.state[b]
        assert_same(lean.join_master(a.detach(), sa["remainder"]), sb["master"])
        rne = sb["master"].bfloat16()
        diff = bits(a.detach()) != bits(rne)
        if diff.any():
            lo = sb["master"].view(torch.int32)[diff] & 0xFFFF
            assert bool((lo == 0x8000).all())
        for key in set(sa) & {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "ema", "step",
                              "exp_avg_scale", "exp_avg_sq_scale", "momentum_buffer_scale"}:
            assert torch.equal(sa[key], sb[key]), key
        assert torch.equal(a.grad, b.grad)


@pytest.mark.parametrize("mode", LEAN_MODES)
def test_skipped_step_touches_nothing(gen, mode):
    params = bf16_params(gen)
    opt = make("adamw", params, mode)
    for p, g in zip(params, grads_for(params, gen)):
        p.grad = g
    opt.step()
    snap = ([p.detach().clone() for p in params], copy.deepcopy(opt.state_dict()["state"]))
    scaler = GradScaler("cpu", init_scale=4.0)
    scaler.scale(torch.ones(()))
    for p, g in zip(params, grads_for(params, gen)):
        p.grad = g
    params[-1].grad.view(-1)[3] = float("nan")
    scaler.step(opt)
    scaler.update()
    for p, s in zip(params, snap[0]):
        assert torch.equal(bits(p.detach()), bits(s))
    for i, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                w = snap[1][i][k]  # remainder_bits are bits in a BF16 tensor: compare bits, NaN patterns too
                assert torch.equal(*(bits(x) if x.dtype in (torch.bfloat16, torch.float32) else x for x in (v, w))), (i, k)


@pytest.mark.parametrize("mode", ["rem", "rem+8bit"])
def test_outside_write_resets_the_remainder(gen, mode):
    """A param written from outside is its master from then on: the same
    trajectory as the FP32-master mode with its master set to the written
    values (where the FP32-master mode's own rule keeps the old FP32 bits of
    elements the write left equal to the rounded master, the remainder mode
    takes the BF16 value: see [note: remainder encoding])."""
    base = bf16_params(gen)
    seq = [grads_for(base, gen) for _ in range(4)]
    new = [torch.randn(p.shape, generator=gen).bfloat16() for p in base]
    runs = []
    for remainders in (True, False):
        ps = [torch.nn.Parameter(p.detach().clone()) for p in base]
        opt = make("adamw", ps, mode, param_remainders=remainders)
        for t, grads in enumerate(seq):
            if t == 2:
                with torch.no_grad():
                    for p, v in zip(ps, new):
                        p.copy_(v)
                        if not remainders:
                            opt.state[p]["master"].copy_(v.float())
            for p, g in zip(ps, grads):
                p.grad = g.clone()
            opt.step()
        runs.append((ps, opt))
    (pa, oa), (pb, ob) = runs
    for a, b in zip(pa, pb):
        assert_same(fp32_master(oa, a), ob.state[b]["master"])


def test_zeroed_param_does_not_become_nan(gen):
    ps = bf16_params(gen)
    opt = make("adamw", ps, "rem")
    for _ in range(3):
        for p, g in zip(ps, grads_for(ps, gen)):
            p.grad = g
        opt.step()
    with torch.no_grad():
        for p in ps:
            p.zero_()
    for p, g in zip(ps, grads_for(ps, gen)):
        p.grad = g
    opt.step()
    for p in ps:
        assert torch.isfinite(fp32_master(opt, p)).all()


@pytest.mark.parametrize("mode", ["rem", "rem+8bit"])
def test_swap_ema_restores_params_and_remainders(gen, mode):
    base = bf16_params(gen)
    seq = [grads_for(base, gen) for _ in range(5)]
    out = []
    for swap in (False, True):
        ps = [torch.nn.Parameter(p.detach().clone()) for p in base]
        opt = make("adamw", ps, mode, ema_decay=0.8)
        for t, grads in enumerate(seq):
            for p, g in zip(ps, grads):
                p.grad = g.clone()
            opt.step()
            if swap and t == 2:
                with opt.swap_ema():
                    for p in ps:
                        assert torch.equal(p.detach(), opt.state[p]["ema"].bfloat16())
        out.append((ps, opt))
    for a, b in zip(out[0][0], out[1][0]):
        assert torch.equal(bits(a.detach()), bits(b.detach()))
        assert torch.equal(out[0][1].state[a]["remainder"], out[1][1].state[b]["remainder"])


@pytest.mark.parametrize("mode", ["rem+bf16", "rem+8bit"])
def test_compiled_step_equals_eager(gen, mode):
    torch.manual_seed(5)
    base = torch.nn.Sequential(torch.nn.Linear(12, 300), torch.nn.GELU(), torch.nn.Linear(300, 4)).bfloat16()
    x = torch.randn(8, 12, generator=gen).bfloat16()
    results = []
    for compiled in (False, True):
        model = copy.deepcopy(base)
        opt = make("adamw", list(model.parameters()), mode)

        def train_step(x):
            loss = model(x).float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        fn = torch.compile(train_step, backend="aot_eager") if compiled else train_step
        for _ in range(4):
            fn(x)
        results.append((model, opt))
    (ma, oa), (mb, ob) = results
    for a, b in zip(ma.parameters(), mb.parameters()):
        assert torch.equal(bits(a.detach()), bits(b.detach()))
        for k in oa.state[a]:
            assert torch.equal(oa.state[a][k], ob.state[b][k]), k


# ---- checkpoints ----------------------------------------------------------------------------


# Rows of whole 256-blocks (the 8-bit row form) and shapes whose 8-bit
# moments are saved in FP32 ([note: checkpoint format]).
CKPT_SHAPES = [*SHAPES, (3, 256), (5, 2, 128), (2, 1024)]


def row_form(shape):
    return len(shape) >= 2 and (math.prod(shape) // shape[0]) % 256 == 0


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
@pytest.mark.parametrize("mode", LEAN_MODES)
def test_state_dict_is_compact_and_resumes_bit_for_bit(gen, kind, mode, tmp_path):
    base = bf16_params(gen, CKPT_SHAPES)
    seq = [grads_for(base, gen) for _ in range(6)]
    pa = [torch.nn.Parameter(p.detach().clone()) for p in base]
    oa = make(kind, pa, mode)
    pb = [torch.nn.Parameter(p.detach().clone()) for p in base]
    ob = make(kind, pb, mode)
    for t, grads in enumerate(seq):
        for p, g in zip(pa, grads):
            p.grad = g.clone()
        oa.step()
        for p, g in zip(pb, grads):
            p.grad = g.clone()
        ob.step()
        if t == 2:  # save and restore b through a file, into a fresh optimizer
            torch.save({"opt": ob.state_dict(), "params": [p.detach() for p in pb]}, tmp_path / "ck.pt")
            ck = torch.load(tmp_path / "ck.pt")
            pb = [torch.nn.Parameter(v.clone()) for v in ck["params"]]
            ob = make(kind, pb, mode)
            ob.load_state_dict(ck["opt"])
            kw = kwargs(kind, mode)
            key = "exp_avg" if kind == "adamw" else "momentum_buffer"
            dt = kw.get("exp_avg_dtype", kw.get("momentum_dtype", F32))
            for i, shape in enumerate(CKPT_SHAPES):
                saved = ck["opt"]["state"][i]
                if kw.get("param_remainders"):
                    assert saved["remainder_bits"].dtype is torch.bfloat16 and "remainder" not in saved and "master" not in saved
                assert key + "_scale" not in saved
                if dt == U8 and row_form(shape):  # codes + a scale per row's 256-run
                    assert key not in saved and saved[key + "_q8"].dtype is U8
                    rows = saved[key + "_q8_scale"]
                    assert rows.dtype is F32 and rows.shape == (shape[0], math.prod(shape[1:]) // 256)
                    assert_same(lean.dequantize(saved[key + "_q8"], rows, key != "exp_avg_sq"),
                                oa.fp32_state(pa[i])[key])
                else:  # 8-bit moments of other shapes: dequantised to FP32
                    assert saved[key].dtype is (F32 if dt == U8 else dt) and key + "_q8" not in saved
    for a, b in zip(pa, pb):
        assert torch.equal(bits(a.detach()), bits(b.detach()))
        for k, v in oa.state[a].items():
            assert torch.equal(v, ob.state[b][k]), k


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_checkpoint_bytes_drop(gen, kind, tmp_path):
    """torch.save of state_dict() for a model of whole-256-block rows: the
    compact form's bytes per parameter against the FP32 form's
    (fp32_state_dict(), what 8-bit checkpoints held before)."""
    shapes = [(256, 1024), (512, 512), (16, 1024)]
    n = sum(math.prod(s) for s in shapes)
    sizes = {}
    for mode in ("master", "rem", "rem+bf16", "rem+8bit", "sr+bf16"):
        ps = bf16_params(gen, shapes)
        opt = make(kind, ps, mode)
        for p, g in zip(ps, grads_for(ps, gen)):
            p.grad = g
        opt.step()
        torch.save(opt.state_dict(), tmp_path / f"{mode}.pt")
        sizes[mode] = (tmp_path / f"{mode}.pt").stat().st_size / n
        if mode == "rem+8bit":
            torch.save(opt.fp32_state_dict(), tmp_path / "fp32.pt")
            sizes["fp32"] = (tmp_path / "fp32.pt").stat().st_size / n
    moments = 2 if kind == "adamw" else 1
    # Hand-counted state bytes per param (+ < 0.05 of pickling and headers).
    want = {"master": 4 + 4 * moments, "rem": 2 + 4 * moments, "rem+bf16": 2 + 2 * moments,
            "rem+8bit": 2 + (1 + 4 / 256) * moments, "sr+bf16": 2 * moments, "fp32": 4 + 4 * moments}
    for mode, b in want.items():
        assert b <= sizes[mode] <= b + 0.05, (mode, sizes[mode], b)


# mode -> (edit of the saved state of a (3, 256) param, what the error names)
BAD_SAVED = {
    "rem+8bit": [
        (lambda st: st.pop("exp_avg_q8_scale"), "exp_avg_q8_scale"),
        (lambda st: st.update(exp_avg_q8=st["exp_avg_q8"][:2]), "exp_avg_q8"),
        (lambda st: st.update(exp_avg_sq_q8_scale=st["exp_avg_sq_q8_scale"].reshape(-1)), "exp_avg_sq_q8_scale"),
        (lambda st: st.update(exp_avg_q8=st["exp_avg_q8"].float()), "uint8"),
    ],
    "rem": [
        (lambda st: st.update(remainder_bits=st["remainder_bits"].float()), "remainder_bits.*bfloat16"),
        (lambda st: st.update(remainder_bits=st["remainder_bits"][:2]), "remainder_bits.*shape"),
        (lambda st: st.update(remainder_bits=1), "remainder_bits"),
    ],
}


@pytest.mark.parametrize("mode", list(BAD_SAVED))
def test_bad_saved_state_raises_and_changes_nothing(gen, mode):
    """Saved 8-bit moments or remainders that do not fit their param."""
    ps = bf16_params(gen, [(3, 256)])
    opt = make("adamw", ps, mode)
    ps[0].grad = grads_for(ps, gen)[0]
    opt.step()
    good = opt.state_dict()
    before = copy.deepcopy(opt.state[ps[0]])
    for edit, match in BAD_SAVED[mode]:
        sd = copy.deepcopy(good)
        edit(sd["state"][0])
        with pytest.raises(RuntimeError, match=match):
            opt.load_state_dict(sd)
        for k, v in before.items():
            assert torch.equal(v, opt.state[ps[0]][k]), k


@pytest.mark.parametrize("saved_as", ["remainder_bits", "remainder int16"])
def test_saved_remainders_load_in_either_form(gen, saved_as):
    """state_dict() saves the remainder's bits as BF16 ([note: remainders
    saved as bits]); the int16 "remainder" of earlier checkpoints (and
    Transformer Engine's dtype) loads too; both resume bit for bit."""
    pa = bf16_params(gen, [(5, 7), (300,)])
    pb = [torch.nn.Parameter(p.detach().clone()) for p in pa]
    oa, ob = make("adamw", pa, "rem"), make("adamw", pb, "rem")
    for t in range(4):
        for a, b, g in zip(pa, pb, grads_for(pa, gen)):
            a.grad, b.grad = g.clone(), g.clone()
        oa.step()
        ob.step()
        if t == 1:
            sd = copy.deepcopy(ob.state_dict())
            for st in sd["state"].values():
                assert st["remainder_bits"].dtype is torch.bfloat16 and "remainder" not in st
                if saved_as != "remainder_bits":
                    st["remainder"] = st.pop("remainder_bits").view(torch.int16)
            ob = make("adamw", pb, "rem")
            ob.load_state_dict(sd)
            assert all(ob.state[p]["remainder"].dtype is torch.int16 and "remainder_bits" not in ob.state[p]
                       for p in pb)
    for a, b in zip(pa, pb):
        assert torch.equal(bits(a.detach()), bits(b.detach()))
        assert torch.equal(oa.state[a]["remainder"], ob.state[b]["remainder"])


@pytest.mark.parametrize("mode", ["rem", "rem+bf16", "rem+8bit", "sr+bf16"])
def test_torch_fp32_state_loads_quantised(gen, mode):
    """torch's AdamW state (FP32 params) loads into every mode: moments in
    the mode's format within its rounding, the master split into param and
    remainder exactly; training goes on."""
    shapes = [(300,), (33, 40)]
    tp = [torch.nn.Parameter(torch.randn(*s, generator=gen)) for s in shapes]
    topt = torch.optim.AdamW(tp, lr=1e-2)
    for _ in range(3):
        for p in tp:
            p.grad = torch.randn(p.shape, generator=gen)
        topt.step()
    ours = [torch.nn.Parameter(p.detach().bfloat16()) for p in tp]
    opt = make("adamw", ours, mode)
    sd = copy.deepcopy(topt.state_dict())
    for i, p in enumerate(tp):
        sd["state"][i]["master"] = p.detach().clone()  # a mixprec FP32-master checkpoint has one
    opt.load_state_dict(sd)
    kw = kwargs("adamw", mode)
    for p, q in zip(tp, ours):
        st, ref = opt.state[q], topt.state[p]
        got = opt.fp32_state(q)
        for key in ("exp_avg", "exp_avg_sq"):
            dt = kw.get(key + "_dtype", F32)
            assert st[key].dtype is dt
            err = (got[key] - ref[key]).abs().max() / ref[key].abs().max()
            assert float(err) <= {F32: 0.0, BF16: 2.0**-8, U8: 0.07}[dt], key
        if kw.get("param_remainders"):
            assert_same(got["master"], p.detach())
    for q in ours:
        q.grad = torch.randn(q.shape, generator=gen).bfloat16()
    opt.step()
    for q in ours:
        assert torch.isfinite(opt.fp32_state(q)["master"]).all()


@pytest.mark.parametrize("mode", ["rem", "rem+bf16", "rem+8bit"])
def test_recipe_back_to_torch_adamw(gen, mode):
    """fp32_state_dict() + the masters into an FP32 model: torch's AdamW
    takes over where ours stopped (its next step equals ours in FP32
    within the moments' rounding)."""
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(8, 300), torch.nn.Tanh(), torch.nn.Linear(300, 3)).bfloat16()
    opt = make("adamw", list(model.parameters()), mode)
    x = torch.randn(16, 8, generator=gen)
    for _ in range(3):
        model(x.bfloat16()).float().square().mean().backward()
        opt.step()
        opt.zero_grad()
    sd = opt.fp32_state_dict()
    fp32 = copy.deepcopy(model).float()
    params = [p for g in opt.param_groups for p in g["params"]]
    with torch.no_grad():
        for i, p in enumerate(fp32.parameters()):
            p.copy_(sd["state"][i]["master"])
    topt = torch.optim.AdamW(fp32.parameters(), lr=1e-2, weight_decay=0.1)
    topt.load_state_dict(sd)
    for i, p in enumerate(fp32.parameters()):
        assert topt.state[p]["exp_avg"].dtype is F32
        torch.testing.assert_close(topt.state[p]["exp_avg"], opt.fp32_state(params[i])["exp_avg"])
    model(x.bfloat16()).float().square().mean().backward()
    grads = [p.grad.float() for p in model.parameters()]
    opt.step()
    for p, g in zip(fp32.parameters(), grads):
        p.grad = g
    topt.step()
    for p, q in zip(fp32.parameters(), params):
        torch.testing.assert_close(p.detach(), opt.fp32_state(q)["master"], rtol=1e-5, atol=1e-6)


def test_fp32_state_is_a_copy(gen):
    ps = bf16_params(gen)
    opt = make("adamw", ps, "rem+8bit")
    for p, g in zip(ps, grads_for(ps, gen)):
        p.grad = g
    opt.step()
    before = copy.deepcopy(opt.state[ps[0]])
    got = opt.fp32_state(ps[0])
    for v in got.values():
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            v.add_(1.0)
    for k, v in before.items():
        assert torch.equal(v, opt.state[ps[0]][k])


def test_mode_change_between_steps_converts_state(gen):
    """An option changed on a live group converts the held state at the
    next step (master -> remainder; FP32 -> 8-bit moments), values kept
    within the new format's rounding."""
    ps = bf16_params(gen)
    opt = make("adamw", ps, "master")
    for p, g in zip(ps, grads_for(ps, gen)):
        p.grad = g
    opt.step()
    masters = [opt.state[p]["master"].clone() for p in ps]
    m = [opt.state[p]["exp_avg"].clone() for p in ps]
    opt.param_groups[0].update(param_remainders=True, exp_avg_dtype=U8)
    opt._lean_prepare(opt.param_groups[0], ps)
    for p, mm, e in zip(ps, masters, m):
        st = opt.state[p]
        assert "master" not in st and st["exp_avg"].dtype is U8
        assert_same(lean.join_master(p.detach(), st["remainder"]), mm)
        assert float((opt.fp32_state(p)["exp_avg"] - e).abs().max()) <= 0.07 * float(e.abs().max())


@pytest.mark.parametrize("cls", [AdamW, SGD])
def test_state_formats_saved_by_name_and_loaded_either_way(cls):
    """[note: formats saved by name]: state_dict() names the groups' state
    formats (a torch.dtype breaks DCP's full_state_dict gather);
    load_state_dict takes the names and the older torch dtypes alike, and
    the reloaded optimizer steps exactly like the saved one."""
    kw = (dict(exp_avg_dtype=torch.bfloat16, exp_avg_sq_dtype=torch.uint8) if cls is AdamW
          else dict(momentum=0.9, momentum_dtype=torch.uint8))
    fmt = {k: v for k, v in kw.items() if k.endswith("_dtype")}
    g = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.randn(512, generator=g).bfloat16())
    opt = cls([p], lr=1e-2, seed=5, **kw)
    grads = [torch.randn(512, generator=g).bfloat16() for _ in range(2)]
    p.grad = grads[0]
    opt.step()
    sd = copy.deepcopy(opt.state_dict())  # torch's holds the live state tensors
    assert {k: sd["param_groups"][0][k] for k in fmt} == {k: str(v).removeprefix("torch.") for k, v in fmt.items()}
    first = p.detach().clone()
    p.grad = grads[1]
    opt.step()
    for form in ("name", "dtype"):
        saved = copy.deepcopy(sd)
        if form == "dtype":  # a checkpoint from before the names
            saved["param_groups"][0].update(fmt)
        before = copy.deepcopy(saved["param_groups"])
        q = torch.nn.Parameter(first.clone())
        o2 = cls([q], lr=1e-2, seed=5, **kw)
        o2.load_state_dict(saved)
        assert saved["param_groups"] == before  # the caller's dict untouched
        assert all(o2.param_groups[0][k] is v for k, v in fmt.items())
        q.grad = grads[1]
        o2.step()
        assert torch.equal(q.view(torch.int16), p.view(torch.int16)), form


def test_fp32_state_of_a_tensor_the_optimizer_does_not_hold_raises():
    model = torch.nn.Linear(8, 8).to(torch.bfloat16)
    opt = AdamW(model.parameters(), lr=1e-3, param_remainders=True)
    other = torch.nn.Parameter(torch.zeros(8, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"mixprec.optim.AdamW.fp32_state: p \(a tensor of shape \(8, 8\)\) is not one"):
        opt.fp32_state(other)
    with pytest.raises(TypeError, match="mixprec.optim.AdamW.fp32_state: p must be a parameter"):
        opt.fp32_state("weight")
    st = opt.fp32_state(model.weight)  # held, before the first step: the master only
    assert set(st) == {"master"} and torch.equal(st["master"], model.weight.float())


@pytest.mark.parametrize(
    "extra,exc",
    [
        (dict(exp_avg_dtype=torch.int8), (ValueError, TypeError)),
        (dict(param_remainders=True, dtype=torch.float16), (ValueError, RuntimeError, TypeError)),
    ],
)
def test_refused_param_group_is_not_kept(extra, exc):
    model = torch.nn.Linear(8, 8).to(torch.bfloat16)
    opt = AdamW(model.parameters(), lr=1e-3)
    dtype = extra.pop("dtype", torch.bfloat16)
    p = torch.nn.Parameter(torch.randn(8, 8).to(dtype))
    with pytest.raises(exc):
        opt.add_param_group(dict(params=[p], **extra))
    assert len(opt.param_groups) == 1
    # the optimizer still steps, and the param can go into a valid group
    model.weight.grad = torch.randn_like(model.weight)
    model.bias.grad = torch.randn_like(model.bias)
    opt.step()
    opt.add_param_group(dict(params=[p.detach().to(torch.bfloat16).requires_grad_()]))
    assert len(opt.param_groups) == 2
