"""compressed_activations(recompute_relu=True), the default: the output of a
ReLU applied to a BatchNorm's output is not stored. Backward recomputes it
from the BatchNorm's saved input (packed or kept) and the BatchNorm's
per-channel affine, with the exact set of non-zeros kept at one bit per
element. What the user sees: fewer saved bytes, the ReLU's mask exact, the
values as close as the BatchNorm input's form, gradients as good as packing
the output, and everything else (in-place check, double backward refusal,
eval-mode BN, channels_last, functional calls) as before."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mixprec.memory import compressed_activations
from mixprec.memory._saved import _NormReLU


class _ConvBNReLU(nn.Module):
    def __init__(self, c=16, affine=True, inplace=True):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c, affine=affine)
        self.relu = nn.ReLU(inplace=inplace)
        self.conv2 = nn.Conv2d(c, 8, 3, padding=1)

    def forward(self, x):
        return self.conv2(self.relu(self.bn(self.conv1(x))))


@pytest.fixture
def made(monkeypatch):
    """The _NormReLU objects made while the test runs."""
    made = []
    orig = _NormReLU.__init__

    def spy(self, *a, **k):
        made.append(self)
        orig(self, *a, **k)

    monkeypatch.setattr(_NormReLU, "__init__", spy)
    return made


def _grads(model, x, ctx=None, autocast=True):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        if ctx is None:
            out = model(x)
        else:
            with ctx:
                out = model(x)
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(out.shape, generator=gen)
    (out.float() * w).sum().backward()
    return {n: p.grad.detach().double().clone() for n, p in model.named_parameters()}


def _cos(a, b):
    return F.cosine_similarity(a.flatten(), b.flatten(), dim=0).item()


def test_relu_after_bn_is_recomputed_with_exact_mask():
    torch.manual_seed(0)
    conv, bn = nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 2.0)
        bn.bias.uniform_(-0.5, 0.5)
    x = torch.randn(4, 8, 24, 24)
    with torch.no_grad():
        h = conv(x)
        a = bn.weight / torch.sqrt(h.var(dim=(0, 2, 3), unbiased=False) + bn.eps)
    for norm_bits in (8, 16):
        with compressed_activations(seed=3, norm_bits=norm_bits) as ca:
            r = torch.relu(bn(conv(x)))
        with torch.no_grad():
            got = r.grad_fn._saved_result
        ref = r.detach()
        assert torch.equal(got > 0, ref > 0)  # the mask, exactly
        assert torch.all(got >= 0)
        err = (got - ref).abs().max().item()
        if norm_bits == 8:
            # a * (x' - x), x' within a step of x's 8-bit block: (max - min) / 254 at most
            bound = a.max().item() * (h.max() - h.min()).item() / 254 * 1.01
            assert 0 < err < bound
        else:  # from the exact input: FP32 rounding only
            assert err <= 2.0**-20 * ref.abs().max().item()
        # the BN input's codes and scales (or nothing: kept) and a mask, not a second set of codes
        n = r.numel()
        assert ca.stats["packed_nbytes"] == (n + 4 * n // 256 if norm_bits == 8 else 0) + n // 8


def test_saves_bytes_and_matches_packing_gradients():
    torch.manual_seed(0)
    model = _ConvBNReLU().train()
    x = torch.randn(8, 16, 32, 32)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ref = _grads(model, x)
    results = {}
    for rec in (False, True):
        for nb in (8, 16):
            model.load_state_dict(state)
            ca = compressed_activations(seed=11, norm_bits=nb, recompute_relu=rec)
            g = _grads(model, x, ca)
            results[rec, nb] = (min(_cos(g[n], ref[n]) for n in ref), ca.stats["packed_nbytes"] + ca.stats["kept_bytes"])
    relu_bytes = 8 * 16 * 32 * 32 * 2  # the ReLU output in BF16
    # The ReLU output's codes (half its BF16 bytes) become a mask (1/16).
    for nb in (8, 16):
        saved_off, saved_on = results[False, nb][1], results[True, nb][1]
        assert saved_off - saved_on == pytest.approx(relu_bytes / 2 - relu_bytes / 16, rel=0.02)
    assert results[True, 8][0] >= 0.999
    assert results[True, 8][0] >= results[False, 8][0] - 2e-4
    assert results[True, 16][0] >= 0.99999  # exact BN input: the recomputed ReLU output is the forward's


@pytest.mark.parametrize("case", ["eval", "no_affine", "functional", "channels_last", "fp32", "odd"])
def test_forms_of_batch_norm(case, made):
    torch.manual_seed(1)
    model = _ConvBNReLU(affine=case != "no_affine", inplace=case != "functional")
    shape = (4, 16, 7, 5) if case == "odd" else (4, 16, 20, 20)
    x = torch.randn(shape)
    if case == "eval":
        model.train()
        with torch.no_grad():
            for _ in range(3):
                model(torch.randn(shape) * 2 + 1)
        model.eval()
    if case == "channels_last":
        model = model.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)
    if case == "functional":
        bn = model.bn

        def fwd(inp):
            h = model.conv1(inp)
            h = F.batch_norm(h, bn.running_mean, bn.running_var, bn.weight, bn.bias, True, 0.1, bn.eps)
            return model.conv2(F.relu(h))

        model.forward = fwd
    autocast = case != "fp32"
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ref = _grads(model, x, autocast=autocast)
    model.load_state_dict(state)
    g = _grads(model, x, compressed_activations(seed=2, norm_bits=16, min_numel=64), autocast=autocast)
    assert len(made) == 1
    for n in ref:
        assert _cos(g[n], ref[n]) > 0.99999, n


def test_not_after_batch_norm_is_packed_as_before():
    torch.manual_seed(0)
    bn, conv = nn.BatchNorm2d(16), nn.Conv2d(16, 4, 1)
    x = torch.randn(4, 16, 32, 32, requires_grad=True)
    for between in (lambda h: h * 2, lambda h: h + 1):
        with compressed_activations(seed=1) as ca:
            r = torch.relu(between(bn(x)))
            conv(r).sum()
        with torch.no_grad():
            assert not isinstance(r.grad_fn._saved_result, _NormReLU)
        # codes of the ReLU output, not a mask: at least a byte per element
        assert ca.stats["packed_nbytes"] >= r.numel()


def test_inplace_change_and_double_backward_still_refused():
    torch.manual_seed(0)
    model = _ConvBNReLU(inplace=False)
    x = torch.randn(2, 16, 16, 16)
    with compressed_activations(seed=1, min_numel=64):
        h = model.bn(model.conv1(x))
        r = torch.relu(h)
        out = model.conv2(r)
    with torch.no_grad():
        assert isinstance(r.grad_fn._saved_result, torch.Tensor)
    r.add_(1)  # after save: torch's error at backward
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()
    with compressed_activations(seed=1, min_numel=64):
        out = model(x)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(out.sum(), model.conv2.weight, create_graph=True)


def test_backward_inside_block_and_option_is_checked():
    torch.manual_seed(0)
    model = _ConvBNReLU()
    x = torch.randn(2, 16, 16, 16)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ref = _grads(model, x, autocast=False)
    model.load_state_dict(state)
    model.zero_grad(set_to_none=True)
    gen = torch.Generator().manual_seed(5)
    with compressed_activations(seed=1, min_numel=64, norm_bits=16):
        out = model(x)
        (out * torch.randn(out.shape, generator=gen)).sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad.double(), ref[n], rtol=1e-4, atol=1e-5)
    for bad in (1, "yes", None):
        with pytest.raises(TypeError, match=r"compressed_activations: recompute_relu must be a bool"):
            compressed_activations(recompute_relu=bad)


def test_checkpointed_blocks_inside_are_left_to_checkpoint(made):
    """Inside a torch.utils.checkpoint region the checkpoint's own hooks
    save the tensors: no statistics are read there (that would unpack
    through the checkpoint during the forward), and the gradients match."""
    import torch.utils.checkpoint as cp

    torch.manual_seed(0)
    inner, outer = _ConvBNReLU(), _ConvBNReLU(c=8)
    x = torch.randn(2, 16, 16, 16)

    def model(inp):
        return outer(cp.checkpoint(inner, inp, use_reentrant=False))

    mods = nn.ModuleList([inner, outer])
    state = {k: v.clone() for k, v in mods.state_dict().items()}

    def grads(ctx):
        mods.load_state_dict(state)
        mods.zero_grad(set_to_none=True)
        if ctx is None:
            out = model(x)
        else:
            with ctx:
                out = model(x)
        out.square().sum().backward()
        return {n: p.grad.clone() for n, p in mods.named_parameters()}

    ref = grads(None)
    got = grads(compressed_activations(seed=1, min_numel=64, norm_bits=16))
    assert len(made) == 1  # the outer block's ReLU; the inner one is the checkpoint's
    for n in ref:  # (the outer conv1's input, the inner block's output, is packed at 8 bits)
        assert _cos(got[n].double(), ref[n].double()) > 0.999, n


def test_recomputed_once_per_backward_and_released(made, monkeypatch):
    """The ReLU and the next conv both save the output: backward recomputes
    it once, hands it to both, and lets it go after the second."""
    torch.manual_seed(0)
    model = _ConvBNReLU()
    x = torch.randn(2, 16, 16, 16)
    calls = []
    orig_rec = _NormReLU._recompute

    def rec(self):
        calls.append(self)
        return orig_rec(self)

    monkeypatch.setattr(_NormReLU, "_recompute", rec)
    with compressed_activations(seed=1, min_numel=64):
        out = model(x)
    (d,) = made
    assert d.uses == 2
    out.sum().backward(retain_graph=True)
    assert len(calls) == 1 and d._last is None and d._left == 0
    out.sum().backward()  # a second backward recomputes again
    assert len(calls) == 2 and d._last is None


def test_statistics_checked_once_per_layer_and_kind(monkeypatch, made):
    """The BatchNorm statistics are checked against the output on the first
    call of a layer and again when its input's shape / layout / dtype or the
    mode changes; a layer whose check fails is packed as usual."""
    import mixprec.memory as mm

    calls = []
    orig = mm._affine_matches
    monkeypatch.setattr(mm, "_affine_matches", lambda *a: calls.append(1) or orig(*a))
    model = _ConvBNReLU()
    x = torch.randn(4, 16, 24, 24)
    for _ in range(3):
        _grads(model, x, compressed_activations())
    assert len(calls) == 1 and len(made) == 3
    _grads(model, torch.randn(2, 16, 24, 24), compressed_activations())  # another shape
    model.eval()
    _grads(model, x, compressed_activations())  # another mode
    assert len(calls) == 3 and len(made) == 5
    other = _ConvBNReLU()
    monkeypatch.setattr(mm, "_affine_matches", lambda *a: calls.append(1) or False)
    _grads(other, x, compressed_activations())
    assert len(calls) == 4 and len(made) == 5  # not recomputed: packed
