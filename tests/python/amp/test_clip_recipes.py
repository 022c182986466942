"""Clipping with mixprec's GradScaler as users port torch's recipe to it
(issue 23, items 1, 5, 6, 10), side by side with torch's own recipe:

    scaler.scale(loss).backward(); scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(opt); scaler.update()

* ``scaler.clip_grad_norm_(model.parameters(), m)`` (torch's calling
  convention) gives torch's recipe bit for bit: the returned norm, the
  clipped gradients, the step after, the skipped step on an overflow;
* ``scaler.unscale_(opt)`` then ``scaler.clip_grad_norm_(opt, m)`` clips the
  unscaled gradients; after ``step()`` the call says so;
* ``backward_and_step`` checks its arguments before the backward and takes
  torch's GradScaler;
* ``named_parameters=`` says what it takes.
"""

import copy

import pytest
import torch

import mixprec
from mixprec.amp import GradScaler

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


def net(gen, dtype):
    torch.manual_seed(int(torch.randint(0, 2**30, (1,), generator=gen)))
    return torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.GELU(), torch.nn.Linear(24, 5)).to(dtype)


OPTIMIZERS = {
    "torch_sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "mixprec_adamw": lambda p: mixprec.optim.AdamW(p, lr=1e-2),
}


def batch(gen, dtype):
    return torch.randn(8, 12, generator=gen).to(dtype) * 3, torch.randint(0, 5, (8,), generator=gen)


def bits(t):
    return t.detach().contiguous().view(-1).view(torch.uint8)


def assert_same(xs, ys):
    for x, y in zip(xs, ys, strict=True):
        assert x.dtype == y.dtype and torch.equal(bits(x), bits(y))


def backward(model, opt, scaler, x, y, poison=False):
    opt.zero_grad(set_to_none=True)
    scaler.scale(torch.nn.functional.cross_entropy(model(x).float(), y)).backward()
    if poison:  # an overflow as a real run produces it, in one gradient
        model[0].weight.grad.view(-1)[5] = float("inf")


def torch_recipe(model, opt, scaler, max_norm):
    scaler.unscale_(opt)
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("params_as", ["generator", "list"])
def test_clip_with_parameters_is_torchs_recipe(gen, dtype, opt_name, params_as):
    """Item 1: at scale 2^16 the old call returned the scaled norm (~65536x)
    and clipped with it. Reference: torch's GradScaler with torch's
    optimizer; mixprec's optimizer gets mixprec's scaler on both sides (the
    reference then is the recipe written out: unscale_, torch's clip)."""
    ref_model = net(gen, dtype)
    our_model = copy.deepcopy(ref_model)
    ref_opt, our_opt = OPTIMIZERS[opt_name](ref_model.parameters()), OPTIMIZERS[opt_name](our_model.parameters())
    ref_sc = torch.amp.GradScaler("cpu") if opt_name == "torch_sgd" else GradScaler("cpu")
    our_sc = GradScaler("cpu")
    clipped = 0
    for it in range(5):
        x, y = batch(gen, dtype)
        poison = it == 2
        backward(ref_model, ref_opt, ref_sc, x, y, poison)
        backward(our_model, our_opt, our_sc, x, y, poison)
        want = torch_recipe(ref_model, ref_opt, ref_sc, 1.0)
        params = our_model.parameters() if params_as == "generator" else list(our_model.parameters())
        got = our_sc.clip_grad_norm_(params, 1.0)
        assert got.dtype == want.dtype and (torch.equal(got, want) or (poison and not torch.isfinite(got)))
        if not poison:
            clipped += bool(want > 1.0)
            assert_same([p.grad for p in our_model.parameters()], [p.grad for p in ref_model.parameters()])
        ref_sc.step(ref_opt)
        our_sc.step(our_opt)
        ref_sc.update()
        our_sc.update()
        assert our_sc.get_scale() == ref_sc.get_scale()
        assert_same(list(our_model.parameters()), list(ref_model.parameters()))
    assert our_sc.get_scale() == 2.0**15  # the poisoned step was skipped and backed off
    assert clipped >= 2, "the clip must be active for the comparison to mean anything"


def test_clip_with_parameters_twice_and_after_unscale(gen):
    """Gradients already unscaled (by an earlier call or by unscale_) are only
    clipped, as torch's clip on them would."""
    ref_model = net(gen, BF16)
    our_model = copy.deepcopy(ref_model)
    ref_opt, our_opt = (mixprec.optim.AdamW(m.parameters(), lr=1e-2) for m in (ref_model, our_model))
    ref_sc, our_sc = GradScaler("cpu"), GradScaler("cpu")
    for it in range(3):
        x, y = batch(gen, BF16)
        backward(ref_model, ref_opt, ref_sc, x, y)
        backward(our_model, our_opt, our_sc, x, y)
        want = [torch_recipe(ref_model, ref_opt, ref_sc, 1.0),
                torch.nn.utils.clip_grad_norm_(ref_model.parameters(), 0.3)]
        if it == 1:
            our_sc.unscale_(our_opt)
        got = [our_sc.clip_grad_norm_(our_model.parameters(), 1.0), our_sc.clip_grad_norm_(our_model.parameters(), 0.3)]
        assert_same(got, want)
        assert_same([p.grad for p in our_model.parameters()], [p.grad for p in ref_model.parameters()])
        for sc, opt in ((ref_sc, ref_opt), (our_sc, our_opt)):
            sc.step(opt)
            sc.update()
        assert_same(list(our_model.parameters()), list(ref_model.parameters()))


@pytest.mark.parametrize("backend", ["aot_eager"])
def test_clip_with_parameters_under_compile(gen, backend):
    """The same, the training step under torch.compile (the scaler's methods
    run eagerly: a graph break each, the model and loss compiled)."""
    torch._dynamo.reset()
    ref_model = net(gen, BF16)
    our_model = copy.deepcopy(ref_model)
    ref_opt, our_opt = (torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (ref_model, our_model))
    ref_sc, our_sc = torch.amp.GradScaler("cpu"), GradScaler("cpu")

    def ref_step(x, y):
        ref_opt.zero_grad()
        ref_sc.scale(torch.nn.functional.cross_entropy(ref_model(x).float(), y)).backward()
        ref_sc.unscale_(ref_opt)
        n = torch.nn.utils.clip_grad_norm_(ref_model.parameters(), 1.0)
        ref_sc.step(ref_opt)
        ref_sc.update()
        return n

    def our_step(x, y):
        our_opt.zero_grad()
        our_sc.scale(torch.nn.functional.cross_entropy(our_model(x).float(), y)).backward()
        n = our_sc.clip_grad_norm_(our_model.parameters(), 1.0)
        our_sc.step(our_opt)
        our_sc.update()
        return n

    ref_c, our_c = torch.compile(ref_step, backend=backend), torch.compile(our_step, backend=backend)
    for _ in range(3):
        x, y = batch(gen, BF16)
        assert_same([our_c(x, y)], [ref_c(x, y)])
        assert_same(list(our_model.parameters()), list(ref_model.parameters()))


def test_clip_optimizer_after_unscale_is_torchs_recipe(gen):
    """Item 5: unscale_(opt) then clip_grad_norm_(opt, m) raised unscale_'s
    "already been called"; it clips the unscaled gradients (L2 and L1)."""
    ref_model = net(gen, BF16)
    our_model = copy.deepcopy(ref_model)
    ref_opt, our_opt = (mixprec.optim.AdamW(m.parameters(), lr=1e-2) for m in (ref_model, our_model))
    ref_sc, our_sc = GradScaler("cpu"), GradScaler("cpu")
    for it, norm_type in enumerate([2.0, 1.0, 2.0]):
        x, y = batch(gen, BF16)
        backward(ref_model, ref_opt, ref_sc, x, y)
        backward(our_model, our_opt, our_sc, x, y)
        ref_sc.unscale_(ref_opt)
        want = torch.nn.utils.clip_grad_norm_(ref_model.parameters(), 0.5, norm_type)
        our_sc.unscale_(our_opt)
        assert_same([our_sc.clip_grad_norm_(our_opt, 0.5, norm_type)], [want])
        assert_same([p.grad for p in our_model.parameters()], [p.grad for p in ref_model.parameters()])
        for sc, opt in ((ref_sc, ref_opt), (our_sc, our_opt)):
            sc.step(opt)
            sc.update()
        assert_same(list(our_model.parameters()), list(ref_model.parameters()))


@pytest.mark.parametrize("how", ["optimizer", "parameters"])
@pytest.mark.parametrize("norm_type", [2.0, 1.0])
def test_clip_after_step_says_so(gen, how, norm_type):
    model = net(gen, BF16)
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
    sc = GradScaler("cpu")
    backward(model, opt, sc, *batch(gen, BF16))
    sc.step(opt)
    before = [p.grad.clone() for p in model.parameters()] + [p.detach().clone() for p in model.parameters()]
    with pytest.raises(RuntimeError, match=r"clip_grad_norm_: scaler.step\(optimizer\) has already run") as info:
        sc.clip_grad_norm_(opt if how == "optimizer" else model.parameters(), 1.0, norm_type)
    assert "clip before step()" in str(info.value)
    assert_same([p.grad for p in model.parameters()] + list(model.parameters()), before)
    sc.update()


@pytest.mark.parametrize("how", ["optimizer", "parameters"])
def test_clip_after_folded_clip_refused(gen, how):
    """A folded clip leaves the gradients scaled: clipping them again (as if
    unscaled) would be silently wrong."""
    model = net(gen, BF16)
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
    sc = GradScaler("cpu")
    backward(model, opt, sc, *batch(gen, BF16))
    sc.clip_grad_norm_(opt, 1.0, fold=True)
    before = [p.grad.clone() for p in model.parameters()]
    with pytest.raises(RuntimeError, match="fold=True"):
        sc.clip_grad_norm_(opt if how == "optimizer" else model.parameters(), 1.0)
    assert_same([p.grad for p in model.parameters()], before)
    sc.step(opt)
    sc.update()


def test_clip_parameters_fp16_grads_refused_at_step_by_a_torch_optimizer(gen):
    """clip_grad_norm_(parameters) takes float16 gradients (it cannot know
    their optimizer); a torch optimizer's step then refuses them as torch's
    unscale_ does, before stepping."""
    model = net(gen, F16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sc = GradScaler("cpu")
    backward(model, opt, sc, *batch(gen, F16))
    sc.clip_grad_norm_(model.parameters(), 1.0)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        sc.step(opt)
    assert_same(list(model.parameters()), before)


# ---- backward_and_step ------------------------------------------------------------


def test_backward_and_step_with_torchs_scaler(gen):
    """Item 6: torch's GradScaler is taken (torch's recipe), as the recipe
    written out by hand."""
    ref_model = net(gen, F32)
    our_model = copy.deepcopy(ref_model)
    ref_opt, our_opt = (torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (ref_model, our_model))
    ref_sc, our_sc = torch.amp.GradScaler("cpu"), torch.amp.GradScaler("cpu")
    for _ in range(3):
        x, y = batch(gen, F32)
        backward(ref_model, ref_opt, ref_sc, x, y)
        want = torch_recipe(ref_model, ref_opt, ref_sc, 0.5)
        ref_sc.step(ref_opt)
        ref_sc.update()
        ref_opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(our_model(x).float(), y)
        got = mixprec.amp.backward_and_step(loss, our_opt, our_sc, max_norm=0.5)
        assert_same([got], [want])
        assert_same(list(our_model.parameters()), list(ref_model.parameters()))
        assert all(p.grad is None for p in our_model.parameters())


@pytest.mark.parametrize(
    "what,value,exc,word",
    [
        ("scaler", "GradScaler", TypeError, "scaler"),
        ("scaler", None, TypeError, "scaler"),
        ("scaler", torch.optim.SGD, TypeError, "scaler"),
        ("optimizer", None, TypeError, "optimizer"),
        ("loss", 1.0, TypeError, "loss"),
        ("max_norm", float("nan"), ValueError, "max_norm"),
        ("max_norm", "1.0", TypeError, "max_norm"),
        ("set_to_none", "no", TypeError, "set_to_none"),
    ],
)
def test_backward_and_step_checks_before_the_backward(gen, what, value, exc, word):
    model = net(gen, BF16)
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
    for p in model.parameters():  # what the backward would add into
        p.grad = torch.randn(p.shape, generator=gen).to(p.dtype)
    x, y = batch(gen, BF16)
    loss = torch.nn.functional.cross_entropy(model(x).float(), y)
    args = dict(loss=loss, optimizer=opt, scaler=GradScaler("cpu"), max_norm=1.0)
    args[what] = value
    before = [p.grad.clone() for p in model.parameters()] + [p.detach().clone() for p in model.parameters()]
    with pytest.raises(exc, match=word) as info:
        mixprec.amp.backward_and_step(args.pop("loss"), args.pop("optimizer"), args.pop("scaler"), **args)
    assert "mixprec.amp.backward_and_step" in str(info.value)
    assert_same([p.grad for p in model.parameters()] + list(model.parameters()), before)
    loss.backward()  # the graph was not consumed


# ---- named_parameters ---------------------------------------------------------------


def test_named_parameters_dict_is_taken(gen):
    """Item 10: a dict of name -> parameter names the reports like
    named_parameters() does."""
    model = net(gen, BF16)
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
    by_pairs = GradScaler("cpu", named_parameters=model.named_parameters())
    by_dict = GradScaler("cpu", named_parameters=dict(model.named_parameters()))
    x, y = batch(gen, BF16)
    norms = []
    for sc in (by_pairs, by_dict):
        backward(model, opt, sc, x, y)
        sc.unscale_(opt)
        norms.append(sc.last_grad_norms())
        sc.update()
    assert list(norms[0]) == list(norms[1]) == [n for n, _ in model.named_parameters()]
    assert norms[0] == norms[1]


@pytest.mark.parametrize(
    "make,word",
    [
        (lambda m: m.parameters(), "model.parameters() has no names"),
        (lambda m: list(m.parameters()), "item 0 is a tensor"),
        (lambda m: torch.randn(2, 3), "got a tensor"),
        (lambda m: [(0, p) for p in m.parameters()], "(int, Parameter)"),
        (lambda m: [("a", 1.0)], "(str, float)"),
        (lambda m: [("a",)], "item 0 is tuple"),
        (lambda m: 3, "got int"),
        (lambda m: "weight", "got str"),
    ],
)
def test_named_parameters_refused_with_what_it_takes(gen, make, word):
    model = net(gen, F32)
    with pytest.raises(TypeError) as info:
        GradScaler("cpu", named_parameters=make(model))
    msg = str(info.value)
    assert "named_parameters takes (name, parameter) pairs" in msg and word in msg, msg
