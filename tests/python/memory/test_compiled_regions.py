"""compressed_activations around torch.compile'd regions (inductor, CPU):
what the compiled function saves is packed (its bytes against the same
compiled step without the block), gradients against that step, no
recompilation from one ``with`` block to the next, widths and layouts,
batch sizes (static and dynamic shapes), and the old behaviour (kept, with a warning) where torch
cannot inline the hooks."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mixprec.memory
from mixprec.memory import _compiled, compressed_activations

pytestmark = pytest.mark.skipif(not _compiled.INLINE, reason="this torch does not inline saved-tensor hooks")


class _Net(nn.Module):
    """conv -> BN -> ReLU -> max-pool -> conv -> GELU -> LayerNorm over a
    slice -> linear: a BatchNorm input, a pool's offsets, a GELU input, a
    LayerNorm input that is a non-contiguous slice, a linear input."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 32, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(32)
        self.c2 = nn.Conv2d(32, 32, 3, padding=1, bias=False)
        self.ln = nn.LayerNorm(32)
        self.fc = nn.Linear(32 * 32, 10)

    def forward(self, x):
        h = F.max_pool2d(torch.relu(self.bn(self.c1(x))), 2)
        h = F.gelu(self.c2(h))  # (N, 32, 16, 16)
        h = self.ln(h.flatten(2).transpose(1, 2)[:, :32])  # (N, 32 positions, 32 channels)
        return self.fc(h.flatten(1))


def _step(model, x, y, ctx=None, autocast=torch.bfloat16):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
        if ctx is None:
            loss = F.cross_entropy(model(x).float(), y)
        else:
            with ctx:
                loss = F.cross_entropy(model(x).float(), y)
    held = _compiled.compiled_saved_bytes(loss)
    loss.backward()
    return held, {n.removeprefix("_orig_mod."): p.grad.detach().double().clone() for n, p in model.named_parameters()}


def _cos(a, b):
    return float(F.cosine_similarity(a.reshape(1, -1), b.reshape(1, -1)))


@pytest.fixture
def net(gen):
    torch.manual_seed(int(torch.randint(0, 2**31, (), generator=gen)))
    torch._dynamo.reset()
    yield _Net().train()
    torch._dynamo.reset()


def _frames():
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("channels_last", [False, True])
def test_compiled_region_is_packed(net, gen, channels_last):
    x = torch.randn(16, 3, 32, 32, generator=gen)
    y = torch.randint(0, 10, (16,), generator=gen)
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    cm = torch.compile(net)
    plain, ref = _step(cm, x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "kept uncompressed" warning any more
        packed, got = _step(cm, x, y, compressed_activations(bits=8))
    # The float activations (BF16 here) at 1 byte + a scale per 256: the
    # pool's int8 offsets and the statistics are kept.
    assert packed < 0.6 * plain, (packed, plain)
    for name, g in ref.items():
        assert torch.isfinite(got[name]).all()
        # bn.*: inductor recomputes BN -> ReLU from the BN's packed input, so
        # the ReLU mask is not exact here (an element within a code step of
        # the threshold may flip; eager keeps it exact): its gradient is the
        # sum of the masked gradient, the least exact (0.997 seen).
        assert _cos(got[name], g) > (0.99 if name.startswith("bn.") else 0.999), (name, _cos(got[name], g))
    assert not torch.equal(got["c1.weight"], ref["c1.weight"])  # (its input was packed)


def test_no_recompile_between_blocks_and_seeds(net, gen):
    x = torch.randn(8, 3, 32, 32, generator=gen)
    y = torch.randint(0, 10, (8,), generator=gen)
    cm = torch.compile(net)
    _step(cm, x, y, compressed_activations(bits=8))
    frames = _frames()
    a = _step(cm, x, y, compressed_activations(bits=8))
    b = _step(cm, x, y, compressed_activations(bits=8, seed=12345))
    assert _frames() == frames
    # The rounding bits are fixed when the region is compiled: the same codes on every call.
    assert a[0] == b[0] and all(torch.equal(a[1][k], b[1][k]) for k in a[1])
    # Another configuration is another pair of hooks: compiled once more, and 4-bit codes are smaller.
    c = _step(cm, x, y, compressed_activations(bits=4, norm_bits=4, nonlinear_bits=4))
    assert _frames() == frames + 1
    assert c[0] < 0.8 * a[0]


def test_widths_follow_the_eager_policy(net, gen):
    """norm_bits / nonlinear_bits=16 keep what normalisation layers and GELU
    read: more bytes than with everything packed, and the same gradients as
    the uncompressed step for the LayerNorm (its input kept) within BF16."""
    x = torch.randn(8, 3, 32, 32, generator=gen)
    y = torch.randint(0, 10, (8,), generator=gen)
    cm = torch.compile(net)
    plain, _ = _step(cm, x, y)
    all8, _ = _step(cm, x, y, compressed_activations(bits=8))
    kept, _ = _step(cm, x, y, compressed_activations(bits=8, norm_bits=16, nonlinear_bits=16))
    assert all8 < kept < plain


def test_fp32_and_fp16(net, gen):
    x = torch.randn(8, 3, 32, 32, generator=gen)
    y = torch.randint(0, 10, (8,), generator=gen)
    cm = torch.compile(net)
    for autocast, ratio in ((None, 0.4), (torch.float16, 0.6)):
        plain, ref = _step(cm, x, y, autocast=autocast)
        packed, got = _step(cm, x, y, compressed_activations(bits=8), autocast=autocast)
        assert packed < ratio * plain, (autocast, packed, plain)
        for name, g in ref.items():
            assert _cos(got[name], g) > (0.99 if name.startswith("bn.") else 0.999), (autocast, name)


@pytest.mark.parametrize("dynamic", [False, True])
def test_batch_sizes(gen, dynamic):
    """dynamic=False: each batch size compiles its own graph, packed.
    dynamic=True: kept (the inlined unpack would fix the backward to the
    compiling call's sizes), with the gradients of the plain step on three
    sizes."""
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(256, 512, bias=False), nn.BatchNorm1d(512), nn.ReLU(), nn.Linear(512, 8))
    cm = torch.compile(model, dynamic=dynamic)
    for batch in (64, 96, 80):
        x = torch.randn(batch, 256, generator=gen)
        y = torch.randint(0, 8, (batch,), generator=gen)
        plain, ref = _step(cm, x, y, autocast=None)
        packed, got = _step(cm, x, y, compressed_activations(bits=8, min_numel=1024), autocast=None)
        if dynamic:
            assert packed == plain
        else:
            assert packed < 0.6 * plain  # (the input batch is the region's input: kept)
        for name, g in ref.items():
            assert got[name].shape == g.shape
            assert _cos(got[name], g) > (0.99 if name.startswith("1.") else 0.999), (batch, name)
    torch._dynamo.reset()


def test_eager_parts_still_packed_and_counted(gen):
    """A model whose middle is compiled: the eager layers around it are
    packed and counted in stats as before."""
    torch._dynamo.reset()
    inner = torch.compile(nn.Sequential(nn.Linear(256, 256), nn.ReLU()))
    x = torch.randn(128, 256, generator=gen, requires_grad=True)
    w = torch.randn(256, 256, generator=gen, requires_grad=True)
    with compressed_activations() as ctx:
        h = torch.tanh(x @ w)  # eager: tanh's output and x @ w's inputs
        loss = inner(h).square().sum()
    loss.backward()
    assert ctx.stats["packed"] >= 1 and torch.isfinite(w.grad).all()
    torch._dynamo.reset()


def test_without_inlining_kept_with_a_warning(monkeypatch, gen):
    """Where torch cannot inline the hooks (torch 2.10), the compiled
    region's saved tensors are kept, with the warning, as before."""
    monkeypatch.setattr(_compiled, "INLINE", False)
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))
    x = torch.randn(128, 256, generator=gen)
    ref = torch.autograd.grad(model(x).square().sum(), model[0].weight)[0]
    cm = torch.compile(model)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with compressed_activations() as ctx:
            loss = cm(x).square().sum()
    # torch 2.14 hands the compiled function's saved tensors to the hook at
    # run time (kept, and said so); 2.13 does not call it for them.
    if torch.__version__ >= "2.14":
        assert any("kept uncompressed" in str(w.message) for w in seen)
    got = torch.autograd.grad(loss, model[0].weight)[0]
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    assert ctx.stats["packed"] == 0
    torch._dynamo.reset()


def test_hooks_are_one_pair_per_configuration():
    a = compressed_activations(bits=8)
    b = compressed_activations(bits=8, seed=7)
    c = compressed_activations(bits=4)
    assert a._hooks is b._hooks and a._hooks is not c._hooks
    assert all(isinstance(h, torch.fx.GraphModule) for h in a._hooks)
    # Nested blocks of one configuration: the inner one's eager state is used, then the outer one's again.
    with a:
        with b:
            assert _compiled._Hook._contexts(a._hooks[0])[-1] is b
        assert _compiled._Hook._contexts(a._hooks[0])[-1] is a
    assert _compiled._Hook._contexts(a._hooks[0]) == []
    assert mixprec.memory.compressed_activations is compressed_activations
