"""mixprec.guard.ForwardGuard on real FP16 forward overflow (a ViT-style
block whose attention logits exceed 65504): plain torch AMP skips every step
and the scale collapses; the guard names the module at the first overflow,
the fallback restores training and tracks the FP32 run; a healthy run is
bit-identical with the guard on; checkpoints pin the fallback set."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

import mixprec
from mixprec.guard import ForwardGuard

from _models import amp_steps, batches, blow_up_attention, vit

STEPS = 10



def _train_fp32(model, data, lr=1e-3):
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for x, y in data:
        loss = F.cross_entropy(model(x), y)
        losses.append(loss.item())
        loss.backward()
        opt.step()
        opt.zero_grad()
    return losses


def _train_amp(model, data, guard=None, lr=1e-3, scaler=None, opt=None, hook=None):
    opt = opt or torch.optim.AdamW(model.parameters(), lr=lr)
    scaler = scaler or mixprec.amp.GradScaler("cpu", diagnostics=True)
    if guard is not None:
        guard.attach(scaler)
    losses, skipped = amp_steps(model, opt, scaler, data, hook=hook)
    return losses, skipped, scaler


def _train_half(model, opt, guard, data):
    """A .half() model (no autocast) with the guard attached to a scaler."""
    scaler = mixprec.amp.GradScaler("cpu", diagnostics=True)
    guard.attach(scaler)
    return amp_steps(lambda x: model(x.half()), opt, scaler, data, autocast=None)[0]


def test_plain_torch_amp_skips_every_step_and_the_scale_collapses():
    model, data = vit(), batches(STEPS)
    with torch.no_grad():
        assert torch.isfinite(model(data[0][0])).all()  # FP32 is fine
    start = copy.deepcopy(model.state_dict())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    losses, skipped = amp_steps(model, opt, scaler, data)
    assert not any(math.isfinite(v) for v in losses) and all(skipped)
    assert scaler.get_scale() == 65536.0 * 0.5**STEPS
    for k, v in model.state_dict().items():
        assert torch.equal(v, start[k]), k  # not one step was taken


def test_guard_names_the_module_at_the_first_overflow():
    model, data = vit(overflow=False), batches(6)
    guard = ForwardGuard(model)
    losses, skipped, scaler = _train_amp(model, data, guard, hook=lambda i: i == 3 and blow_up_attention(model))
    assert skipped == [False, False, False, True, True, True]
    rep = guard.report()
    assert guard.reports()[0].step == 3 and rep.kind == "forward"
    assert rep.module == "blocks.1.attn" and rep.module_type == "Attention" and rep.dtype == "float16"
    assert 0 < rep.amax <= 65504
    text = str(rep)
    assert "forward overflow in blocks.1.attn (Attention)" in text and "float16" in text
    health = str(scaler.health())
    assert "forward guard: 3 overflowing steps" in health and "blocks.1.attn" in health
    assert guard.fallback_set == {} and guard.events == []


def test_fallback_restores_training_and_tracks_fp32():
    data = batches(STEPS + 1)
    ref = vit()
    fp32 = _train_fp32(ref, data[1:])  # the AMP run skips step 0 (the overflow), then takes these updates
    model = vit()
    guard = ForwardGuard(model, fallback=True, after=1)
    losses, skipped, _ = _train_amp(model, data, guard)
    assert skipped == [True] + [False] * STEPS
    assert guard.fallback_set == {"blocks.1.attn": torch.float32}
    assert [(e.module, e.step, e.dtype) for e in guard.events] == [("blocks.1.attn", 0, "float32")]
    gaps = [abs(a - b) / abs(b) for a, b in zip(losses[1:], fp32)]
    assert max(gaps) < 5e-3, gaps  # FP16 autocast elsewhere: within 0.5% of FP32 at every step
    assert all(math.isfinite(v) for v in losses[1:])


def test_fallback_after_k_overflows_and_bf16_fallback():
    model, data = vit(), batches(5)
    guard = ForwardGuard(model, fallback=True, after=3, fallback_dtype=torch.bfloat16)
    _, skipped, _ = _train_amp(model, data, guard)
    assert skipped[:4] == [True, True, True, False]
    assert guard.fallback_set == {"blocks.1.attn": torch.bfloat16}
    assert guard.events[0].step == 2 and "3 step(s)" in guard.events[0].why
    # Later skips (BF16 logits of ~1e5 give large gradients) are the
    # scaler's business, and the guard says so.
    assert [r.kind for r in guard.reports()] == ["forward"] * 3 + ["gradient"] * (sum(skipped) - 3)


def test_half_model_moves_params_and_optimizer_state_to_fp32():
    data = batches(STEPS + 1)
    ref = vit()
    fp32 = _train_fp32(ref, data[1:])
    model = vit().half()
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-3)
    guard = ForwardGuard(model, fallback=True, optimizer=opt)
    losses = _train_half(model, opt, guard, data)
    attn = model.blocks[1].attn
    assert guard.fallback_set == {"blocks.1.attn": torch.float32}
    for p in attn.parameters():
        assert p.dtype == torch.float32 and "master" not in opt.state[p]
    for p in model.blocks[0].parameters():
        assert p.dtype == torch.float16 and opt.state[p]["master"].dtype == torch.float32
    assert not math.isfinite(losses[0]) and all(math.isfinite(v) for v in losses[1:])
    gaps = [abs(a - b) / abs(b) for a, b in zip(losses[1:], fp32)]
    assert max(gaps) < 2e-2, gaps  # a whole-FP16 model (FP16 LayerNorm, GELU) elsewhere


def test_half_model_without_moving_params_runs_on_upcast_copies():
    # move_params=False (the default under DDP / FSDP2): the params and the
    # optimizer state stay FP16 + FP32 masters; the module computes in FP32.
    data = batches(STEPS + 1)
    fp32 = _train_fp32(vit(), data[1:])
    model = vit().half()
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-3)
    guard = ForwardGuard(model, fallback=True, optimizer=opt, move_params=False)
    losses = _train_half(model, opt, guard, data)
    assert guard.fallback_set == {"blocks.1.attn": torch.float32}
    for p in model.parameters():
        assert isinstance(p, torch.nn.Parameter) and p.dtype == torch.float16
        assert torch.equal(p.detach(), opt.state[p]["master"].half())
    assert not math.isfinite(losses[0]) and all(math.isfinite(v) for v in losses[1:])
    gaps = [abs(a - b) / abs(b) for a, b in zip(losses[1:], fp32)]
    assert max(gaps) < 2e-2, gaps


def test_master_becomes_the_param_exactly():
    model = vit(overflow=False).half()
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = batches(1)[0]
    F.cross_entropy(model(x.half()).float(), y).backward()
    opt.step()  # masters now differ from the rounded params
    opt.zero_grad()
    p = model.blocks[0].attn.qkv.weight
    master = opt.state[p]["master"].clone()
    exp_avg = opt.state[p]["exp_avg"].clone()
    guard = ForwardGuard(model, optimizer=opt)
    guard.fallback("blocks.0.attn")
    assert p.dtype == torch.float32 and torch.equal(p.detach(), master)
    assert torch.equal(opt.state[p]["exp_avg"], exp_avg)


@pytest.mark.parametrize("lean", [dict(param_remainders=True), dict(param_remainders=True, exp_avg_dtype=torch.bfloat16),
                                  dict(param_remainders=True, exp_avg_dtype=torch.uint8)], ids=["rem", "rem-bf16", "rem-8bit"])
def test_remainders_optimizer_master_becomes_the_param_exactly(lean):
    # param_remainders: no FP32 master tensor; the master is the BF16 param
    # joined with its int16 remainder. The fallback must move that exact
    # master into the param (not the rounded BF16 value) and drop the
    # remainder, and training must go on as torch's FP32 AdamW from there.
    model = vit(overflow=False).bfloat16()
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2, **lean)
    data = batches(5)
    for x, y in data[:2]:
        F.cross_entropy(model(x.bfloat16()).float(), y).backward()
        opt.step()
        opt.zero_grad()
    attn = model.blocks[0].attn
    moved = list(attn.parameters())
    assert all("master" not in opt.state[p] and "remainder" in opt.state[p] for p in moved)
    before = {p: opt.fp32_state(p) for p in moved}
    assert any(not torch.equal(before[p]["master"], p.detach().float()) for p in moved)  # sub-BF16 bits exist
    moments = {p: {k: v.clone() for k, v in opt.state[p].items() if k.startswith("exp_avg")} for p in moved}
    guard = ForwardGuard(model, optimizer=opt)
    guard.fallback("blocks.0.attn")
    for p in moved:
        st = opt.state[p]
        assert p.dtype == torch.float32 and torch.equal(p.detach(), before[p]["master"])
        assert "remainder" not in st and "master" not in st
        for k, v in moments[p].items():  # the group's moment formats, untouched
            assert st[k].dtype == v.dtype and torch.equal(st[k], v)
    for p in model.blocks[1].parameters():
        assert p.dtype == torch.bfloat16 and "remainder" in opt.state[p]
    # Reference for the moved params: torch's FP32 AdamW from the same FP32
    # state, fed the same gradients.
    ref = [torch.nn.Parameter(before[p]["master"].clone()) for p in moved]
    ref_opt = torch.optim.AdamW(ref, lr=1e-2)
    for r, p in zip(ref, moved):
        ref_opt.state[r] = {k: before[p][k].clone() for k in ("step", "exp_avg", "exp_avg_sq")}
    for x, y in data[2:]:
        loss = F.cross_entropy(model(x.bfloat16()).float(), y)
        assert math.isfinite(loss.item())
        loss.backward()
        for r, p in zip(ref, moved):
            r.grad = p.grad.detach().clone()
        opt.step()
        ref_opt.step()
        opt.zero_grad()
    # FP32 AdamW on both sides. BF16 / 8-bit first moments are rounded when
    # the kernel writes them: each update (|update| <= ~lr) then differs by
    # about that rounding (2^-8 relative for BF16, up to ~20% for the 8-bit
    # code of a small moment in a block with a large one).
    atol = {None: 1e-7, torch.bfloat16: 3 * 1e-2 * 2**-6, torch.uint8: 3 * 1e-2 * 0.2}[lean.get("exp_avg_dtype")]
    for r, p in zip(ref, moved):
        assert p.dtype == torch.float32 and "remainder" not in opt.state[p]
        torch.testing.assert_close(p.detach(), r.detach(), rtol=1e-6, atol=atol)
        assert (p.detach() - before[p]["master"]).abs().max() > 2 * atol  # it did train


def test_healthy_run_is_bit_identical_and_reports_nothing():
    data = batches(6)
    a, b = vit(overflow=False), vit(overflow=False)
    guard = ForwardGuard(b, fallback=True)
    la, sa, _ = _train_amp(a, data)
    lb, sb, scaler = _train_amp(b, data, guard)
    assert la == lb and sa == sb
    for (k, v), w in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(v, w), k
    assert guard.report() is None and guard.events == [] and not any(guard.counts)
    assert guard.steps == 6 and "forward guard" not in str(scaler.health())


@pytest.mark.parametrize("backward", [False, True])
def test_gradient_overflow_is_told_apart(backward):
    model, data = vit(overflow=False), batches(1)
    guard = ForwardGuard(model, backward=backward, fallback=True)
    scaler = mixprec.amp.GradScaler("cpu", init_scale=2.0**60, diagnostics=True,
                                    named_parameters=model.named_parameters())  # the grads overflow FP16
    _, skipped, _ = _train_amp(model, data, guard, scaler=scaler)
    assert skipped == [True]
    rep = guard.report()
    assert rep.kind == "gradient" and "no forward overflow; gradient overflow" in str(rep)
    assert guard.fallback_set == {}
    if backward:  # the module whose output gradient went non-finite first
        assert rep.module == "head" and rep.dtype == "float16"
    else:  # the parameters, from the scaler's diagnostics
        assert rep.module is None and "head.weight" in rep.also
        assert "parameters whose gradients overflowed: embed.weight" in str(rep)


def test_step_with_loss_and_unknown_origin():
    model = vit(overflow=False)
    guard = ForwardGuard(model)
    x, _ = batches(1)[0]
    model(x)
    assert guard.step(loss=torch.tensor(1.0)) is None
    rep = guard.step(loss=torch.tensor(float("nan")))
    assert rep.kind == "unknown" and "outside modules" in str(rep)
    with pytest.raises(TypeError, match="pass found_inf"):
        guard.step()


def test_state_dict_pins_the_fallback_set():
    model, data = vit(), batches(3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guard = ForwardGuard(model, fallback=True)
    _train_amp(model, data, guard, opt=opt)
    sd, msd, osd = guard.state_dict(), copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    assert sd["fallback"] == {"blocks.1.attn": "float32"} and sd["steps"] == 3
    model2 = vit(seed=5)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-3)
    guard2 = ForwardGuard(model2, fallback=True)
    guard2.load_state_dict(sd)
    model2.load_state_dict(msd)
    opt2.load_state_dict(osd)
    assert guard2.fallback_set == guard.fallback_set and guard2.events == guard.events
    x = data[0][0]
    with torch.autocast("cpu", dtype=torch.float16):
        assert torch.equal(model(x), model2(x))
    with pytest.raises(KeyError, match="no modules named"):
        ForwardGuard(vit()).load_state_dict({"fallback": {"nope": "float32"}})
    with pytest.raises(ValueError, match="no modules named"):  # the argument checks' error type too
        ForwardGuard(vit()).load_state_dict({"fallback": {"nope": "float32"}})


def test_attach_needs_a_diagnostics_scaler():
    guard = ForwardGuard(vit())
    with pytest.raises(RuntimeError, match="diagnostics=True"):
        guard.attach(mixprec.amp.GradScaler("cpu"))
    with pytest.raises(ValueError, match="after must be >= 1"):
        ForwardGuard(vit(), after=0)


def test_torch_compile_with_hooks():
    """The hooks and the op trace into one graph (fullgraph: no break); the
    fallback swaps the module's forward, which recompiles once."""
    data = batches(3)
    model = vit()
    guard = ForwardGuard(model, fallback=True)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = mixprec.amp.GradScaler("cpu", diagnostics=True)
    guard.attach(scaler)
    _, skipped = amp_steps(compiled, opt, scaler, data)
    assert skipped == [True, False, False]
    assert guard.reports()[0].module == "blocks.1.attn"
    assert guard.fallback_set == {"blocks.1.attn": torch.float32}


class _Boost(torch.nn.Module):
    """An in-place module that overflows FP16 (returns its input)."""

    def forward(self, x):
        return x.mul_(1e6)


def test_sequential_containers_are_not_read_again_unless_a_module_works_in_place():
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 8))
    guard = ForwardGuard(plain)
    x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.float16):
        plain(x)
    checked = {guard._names[i] for i in guard._order}
    assert checked == {"0", "2"}  # not the Sequential ("<model>"), not the GELU
    # In place: the module's own check sees its input already inf, so only
    # a container can be named; Sequentials are checked again.
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Sequential(_Boost(), torch.nn.Linear(8, 8)))
    guard = ForwardGuard(model)
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(torch.full((4, 8), 10.0))
    assert not torch.isfinite(out).all()
    rep = guard.step(found_inf=1.0)
    # "1"'s input is the tensor _Boost wrote in place (inf by then): the
    # outer Sequential, whose input stayed finite, is the one named.
    assert rep.kind == "forward" and rep.module == "<model>", rep


def test_dropout_passthroughs_are_not_checked_nor_taken_for_in_place():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.1), torch.nn.Linear(8, 8),
                                torch.nn.Dropout(0.0))
    guard = ForwardGuard(model)
    x = torch.randn(4, 8)
    model.eval()  # both dropouts return their input tensor
    with torch.autocast("cpu", dtype=torch.float16):
        model(x)
    assert {guard._names[i] for i in guard._order} == {"0", "2"} and not guard._inplace_seen
    model.train()  # Dropout(0.1) scales by 1 / 0.9: checked; Dropout(0.0) still a passthrough
    with torch.autocast("cpu", dtype=torch.float16):
        model(x)
    assert {guard._names[i] for i in guard._order} == {"0", "1", "2"} and not guard._inplace_seen


# ---- constructor arguments: checked first, named --------------------------------


@pytest.mark.parametrize(
    "kw,exc,msg",
    [
        (dict(after=float("nan")), ValueError, "after must be an integer, got nan"),
        (dict(after=1.5), TypeError, "after must be an integer, got the non-integral 1.5"),
        (dict(after=0), ValueError, "after must be >= 1, got 0"),
        (dict(after="2"), TypeError, "after must be an integer"),
        (dict(fallback="yes"), TypeError, "fallback must be a bool"),
        (dict(backward=1), TypeError, "backward must be a bool"),
        (dict(move_params="no"), TypeError, "move_params must be a bool or None"),
        (dict(fallback_dtype="float32"), TypeError, "fallback_dtype must be a torch.dtype"),
        (dict(fallback_dtype=torch.float16), ValueError, "fallback_dtype must be torch.float32 or torch.bfloat16"),
        (dict(optimizer="adamw"), TypeError, "optimizer must be a torch.optim.Optimizer, a list of them or None"),
        (dict(optimizer="MODEL"), TypeError, "optimizer must be a torch.optim.Optimizer, a list of them or None"),
        (dict(optimizer=["MODEL"]), TypeError, r"optimizer\[0\] must be a torch.optim.Optimizer, got Linear"),
    ],
)
def test_constructor_refuses_bad_arguments(kw, exc, msg):
    model = torch.nn.Linear(4, 4)
    kw = {k: (model if v == "MODEL" else [model] if v == ["MODEL"] else v) for k, v in kw.items()}
    with pytest.raises(exc, match="mixprec.guard.ForwardGuard: " + msg):
        ForwardGuard(model, **kw)


@pytest.mark.parametrize("model", [None, torch.zeros(3), [torch.nn.Linear(2, 2)], torch.nn.Linear, lambda: 1])
def test_constructor_refuses_a_model_that_is_not_a_module(model):
    with pytest.raises(TypeError, match="mixprec.guard.ForwardGuard: model must be a torch.nn.Module"):
        ForwardGuard(model)


def test_constructor_takes_integral_floats_and_tuples_of_optimizers():
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = ForwardGuard(model, after=2.0, optimizer=(opt,))
    assert guard.after == 2 and isinstance(guard.after, int)


@pytest.mark.parametrize(
    "kw,exc,msg",
    [
        (dict(found_inf="1"), TypeError, "found_inf must be a one-element tensor or a number"),
        (dict(found_inf=[0.0]), TypeError, "found_inf must be a one-element tensor or a number"),
        (dict(found_inf=True), TypeError, "found_inf must be a one-element tensor or a number"),
        (dict(found_inf=torch.zeros(2)), ValueError, r"found_inf must be a one-element tensor \(the scaler's\)"),
        (dict(loss=1.0), TypeError, "loss must be a tensor, got float"),
        (dict(loss=[torch.tensor(1.0)]), TypeError, "loss must be a tensor, got list"),
    ],
)
def test_step_refuses_bad_arguments_and_changes_nothing(kw, exc, msg):
    model = torch.nn.Linear(4, 4)
    guard = ForwardGuard(model)
    with pytest.raises(exc, match="mixprec.guard.ForwardGuard.step: " + msg):
        guard.step(**kw)
    assert guard.steps == 0
    assert guard.step(found_inf=torch.zeros(1)) is None and guard.step(found_inf=0.0) is None
    assert guard.steps == 2


@pytest.mark.parametrize(
    "args,exc,msg",
    [
        (("0", torch.float16), ValueError, "dtype must be torch.float32 or torch.bfloat16"),
        (("0", torch.int32), ValueError, "dtype must be torch.float32 or torch.bfloat16"),
        (("0", "float32"), TypeError, "dtype must be a torch.dtype or None"),
        ((0,), TypeError, "name must be a module's name"),
        (("nope",), KeyError, "no module named 'nope'"),
    ],
)
def test_fallback_refuses_bad_arguments_and_changes_nothing(args, exc, msg):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    guard = ForwardGuard(model)
    forward = model[0].forward
    with pytest.raises(exc, match="mixprec.guard.ForwardGuard.fallback: " + msg):
        guard.fallback(*args)
    assert guard.fallback_set == set() or not guard.fallback_set
    assert model[0].forward == forward


# ---- load_state_dict: checked whole before anything moves -------------------------


def _guarded_half_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)).half()
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    return model, opt, ForwardGuard(model, optimizer=opt)


@pytest.mark.parametrize(
    "state,exc,msg",
    [
        ({"fallback": {"0": "float16"}}, ValueError, r"state\['fallback'\]\['0'\] must be 'float32' or 'bfloat16'"),
        ({"fallback": {"0": torch.float16}}, ValueError, r"state\['fallback'\]\['0'\] must be 'float32' or 'bfloat16'"),
        ({"fallback": {"0": "int32"}}, ValueError, r"state\['fallback'\]\['0'\] must be 'float32' or 'bfloat16'"),
        ({"fallback": {"0": 3}}, TypeError, r"state\['fallback'\]\['0'\] must be a dtype name"),
        ({"fallback": ["0"]}, TypeError, r"state\['fallback'\] must be a dict"),
        # one good entry before the bad one, or a bad key after: nothing moves
        ({"fallback": {"0": "float32", "1": "float16"}}, ValueError, r"state\['fallback'\]\['1'\]"),
        ({"fallback": {"0": "float32", "nope": "float32"}}, KeyError, "no modules named"),
        ({"fallback": {"0": "float32"}, "counts": {"0": "x"}}, TypeError,
         r"state\['counts'\]\['0'\] must be an integer"),
        ({"fallback": {"0": "float32"}, "counts": {"0": -1}}, ValueError, r"state\['counts'\]\['0'\] must be >= 0"),
        ({"fallback": {"0": "float32"}, "counts": {"9": 1}}, KeyError, "no modules named"),
        ({"fallback": {"0": "float32"}, "steps": 1.5}, TypeError, r"state\['steps'\] must be an integer"),
        ({"fallback": {"0": "float32"}, "events": [("0", 1, "float32")]}, TypeError, r"state\['events'\]\[0\]"),
        ({"fallback": {"0": "float32"}, "events": [("0", 1, "float16", "x")]}, ValueError, r"state\['events'\]\[0\]"),
        ("MODEL_SD", ValueError, "unexpected keys"),
        (None, TypeError, "state must be a dict"),
        ([("fallback", {})], TypeError, "state must be a dict"),
    ],
)
def test_load_state_dict_refuses_bad_state_and_changes_nothing(state, exc, msg):
    model, opt, guard = _guarded_half_model()
    guard.step(found_inf=0.0)
    if state == "MODEL_SD":
        state = model.state_dict()
    given = copy.deepcopy(state)
    before = (guard.state_dict(), dict(guard.fallback_set), copy.deepcopy(opt.state_dict()))
    params = [(p.dtype, p.detach().clone()) for p in model.parameters()]
    with pytest.raises(exc, match="mixprec.guard.ForwardGuard.load_state_dict: " + msg):
        guard.load_state_dict(state)
    assert guard.state_dict() == before[0] and guard.fallback_set == before[1]
    assert all("forward" not in m.__dict__ for m in model)  # no module was put in fallback
    assert all(d == p.dtype and torch.equal(v, p.detach()) for (d, v), p in zip(params, model.parameters()))
    after = opt.state_dict()
    for i, st in before[2]["state"].items():
        assert all(torch.equal(v, after["state"][i][k]) for k, v in st.items())
    if state is not None and not isinstance(state, list):
        assert repr(state) == repr(given)  # the caller's dict is not touched


def test_load_state_dict_refuses_a_fallback_in_another_dtype():
    model, opt, guard = _guarded_half_model()
    guard.fallback("0", torch.float32)
    forward = model[0].forward
    with pytest.raises(ValueError, match=r"load_state_dict: state\['fallback'\]\['0'\] is bfloat16 but the module "
                                         "already runs in float32"):
        guard.load_state_dict({"fallback": {"0": "bfloat16", "1": "float32"}})
    assert guard.fallback_set == {"0": torch.float32} and model[0].forward is forward
    assert model[1].weight.dtype is torch.float16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_load_state_dict_round_trips(dtype):
    model, opt, guard = _guarded_half_model()
    guard.fallback("1", dtype, why="pinned")
    for v in (0.0, 1.0, 0.0):
        guard.step(found_inf=v)
    sd = guard.state_dict()
    assert sd["fallback"] == {"1": str(dtype).removeprefix("torch.")}
    model2, opt2, guard2 = _guarded_half_model()
    guard2.load_state_dict(copy.deepcopy(sd))
    assert guard2.state_dict() == sd
    assert guard2.fallback_set == {"1": dtype} and model2[1].weight.dtype is dtype
    guard2.load_state_dict(sd)  # again: the module already in that fallback stays
    assert guard2.state_dict() == sd
    x = torch.randn(2, 4).half()
    assert torch.equal(model(x), model2(x))
