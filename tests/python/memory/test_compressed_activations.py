"""mixprec.memory.compressed_activations in users' loops: gradients against
the same step without it (torchvision models, BF16/FP16 autocast, FP32,
channels_last, checkpointing), what is packed and what is kept, memory freed
in the forward, torch's checks kept, and bad arguments."""

import gc
import math
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mixprec
import mixprec.memory
from mixprec.memory import compressed_activations

tv = pytest.importorskip("torchvision")


def _grads(model, x, y, ctx=None, autocast=None, loss_fn=F.cross_entropy):
    model.zero_grad(set_to_none=True)
    ac = torch.autocast("cpu", dtype=autocast) if autocast else torch.autocast("cpu", enabled=False)
    with ac:
        if ctx is not None:
            with ctx:
                out = model(x)
                loss = loss_fn(out.float(), y)
        else:
            out = model(x)
            loss = loss_fn(out.float(), y)
    loss.backward()
    return {n: p.grad.detach().double().clone() for n, p in model.named_parameters() if p.grad is not None}


def _cos(a, b):
    return float(torch.nn.functional.cosine_similarity(a.reshape(1, -1), b.reshape(1, -1)))


def _model(name, seed=0, **kw):
    torch.manual_seed(seed)
    return getattr(tv.models, name)(weights=None, **kw)


@pytest.fixture(scope="module")
def resnet18_data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(4, 3, 64, 64, generator=g), torch.randint(0, 10, (4,), generator=g)


# 8-bit meets the activation-memory issue's per-layer bar (0.999), 4-bit its
# 0.99 (0.994 here on 3 seeds, BF16 and FP32: what BatchNorm saves stays at
# 8 bits). Everything at 4 bits (norm_bits=4, nonlinear_bits=4) is measured
# at 0.974-0.979 on its worst layers (BatchNorm weights, whose gradient is a
# sum that cancels): held at 0.97 so a regression still fails.
ALL4 = {"norm_bits": 4, "nonlinear_bits": 4}


@pytest.mark.parametrize("nbits,kw,bar", [(8, {}, 0.999), (4, {}, 0.99), (4, ALL4, 0.97)], ids=["8", "4", "4-all"])
@pytest.mark.parametrize("autocast", [torch.bfloat16, None], ids=["bf16", "fp32"])
def test_resnet18_gradients_match_uncompressed(resnet18_data, nbits, kw, bar, autocast):
    x, y = resnet18_data
    model = _model("resnet18", num_classes=10)
    ref = _grads(model, x, y, autocast=autocast)
    ctx = compressed_activations(bits=nbits, **kw)
    got = _grads(model, x, y, ctx=ctx, autocast=autocast)
    assert ref.keys() == got.keys()
    worst = min((_cos(ref[k], got[k]), k) for k in ref if ref[k].norm() > 0)
    assert worst[0] >= bar, worst
    # The step saved fewer bytes: at least 40% of the saved activations packed
    # (and packed to about a half / a quarter of their bytes or less).
    st = ctx.stats
    assert st["packed"] > 20
    ratio = st["packed_nbytes"] / st["packed_bytes"]
    base = 1 if autocast else 2  # BF16 -> 1 B per element; FP32 -> 4 B: 8-bit codes are a quarter
    # codes + one float per block: 8-bit (1 + 4/256) = 0.508 of BF16's 2
    # bytes, 0.254 of FP32's 4; 4-bit (0.5 + 4/32) = 0.3125 / 0.156; plus the
    # max-pool indices, int64 narrowed to int16 (0.25). 4-bit with BatchNorm's
    # inputs at 8 bits: 0.368 / 0.198 here.
    bound = {(8, 1): 0.52, (4, 1): 0.32, (8, 2): 0.26, (4, 2): 0.17}[nbits, base]
    if nbits == 4 and not kw:
        bound = {1: 0.38, 2: 0.21}[base]
    assert ratio <= bound


def test_relu_output_saved_twice_is_packed_once():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1))
    x = torch.randn(2, 3, 32, 32)
    calls = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: calls.append(t) or t, lambda t: t):
        model(x)
    relu_out = [t for t in calls if t.grad_fn is not None and type(t.grad_fn).__name__ == "ReluBackward0"]
    assert len(relu_out) == 2  # relu's result and the second conv's input
    ctx = compressed_activations()
    with ctx:
        model(x).sum().backward()
    # Packed: the ReLU output, once (the first conv's input has no history,
    # the weights are parameters).
    assert ctx.stats["packed"] == 1
    assert ctx.stats["packed_bytes"] == 2 * 16 * 32 * 32 * 4


def test_originals_are_freed_during_the_forward():
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU()) for _ in range(4)])
    refs = []
    for m in model:
        m.register_forward_hook(lambda mod, inp, out: refs.append(weakref.ref(out)))
    x = torch.randn(2, 8, 64, 64, requires_grad=True)
    with compressed_activations():
        out = model(x)
    gc.collect()
    # Every block's output but the last (still held as `out`) is gone: the
    # graph holds only their packed copies.
    assert [r() is None for r in refs[:-1]] == [True] * 3
    out.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_exact_where_backward_needs_it():
    torch.manual_seed(0)
    lin = nn.Linear(64, 32)
    x = torch.randn(512, 64, requires_grad=True)
    w = torch.randn(512, 32)
    # Linear saves x (no history: kept) and the weight (a parameter: kept);
    # the product with w saves only w: both gradients are exactly the
    # uncompressed ones.
    ref_x, ref_w = torch.autograd.grad((lin(x) * w).sum(), (x, lin.weight))
    with compressed_activations() as ctx:
        loss = (lin(x) * w).sum()
    got_x, got_w = torch.autograd.grad(loss, (x, lin.weight))
    assert torch.equal(got_x, ref_x) and torch.equal(got_w, ref_w)
    assert ctx.stats["packed"] == 0 and ctx.stats["kept"] >= 2
    # ...and under BF16 autocast, the weight's cast copy is kept too.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = torch.autograd.grad((lin(x).float() * w).sum(), x)[0]
        with compressed_activations() as c2:
            loss = (lin(x).float() * w).sum()
    assert torch.equal(torch.autograd.grad(loss, x)[0], ref)
    assert c2.stats["packed"] == 0


def test_log_softmax_output_is_kept():
    torch.manual_seed(0)
    lin = nn.Linear(32, 1000)
    x = torch.randn(64, 32)
    h = torch.randn(64, 32, requires_grad=True)
    y = torch.randint(0, 1000, (64,))
    ref = torch.autograd.grad(F.cross_entropy(lin(x + h), y), h)[0]
    with compressed_activations() as ctx:
        loss = F.cross_entropy(lin(x + h), y)
    assert torch.equal(torch.autograd.grad(loss, h)[0], ref)
    assert ctx.stats["packed"] == 0


def test_mixprec_cross_entropy_logits_are_kept():
    torch.manual_seed(0)
    logits = torch.randn(64, 1000, requires_grad=True)
    y = torch.randint(0, 1000, (64,))
    z = logits * 1.0  # a tensor with history, as a model's logits
    ref = torch.autograd.grad(mixprec.ops.cross_entropy(z, y), logits)[0]
    with compressed_activations() as ctx:
        z = logits * 1.0
        loss = mixprec.ops.cross_entropy(z, y)
    assert torch.equal(torch.autograd.grad(loss, logits)[0], ref)
    assert ctx.stats["packed"] == 0


def test_nonfinite_forward_gives_nonfinite_grads():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 4))
    x = torch.randn(128, 64)
    x[3, 5] = float("inf")
    with compressed_activations():
        loss = model(x).sum()
    loss.backward()
    assert not torch.isfinite(model[0].weight.grad).all()


def test_inplace_change_after_save_raises():
    x = torch.randn(256, 256, requires_grad=True)
    with compressed_activations():
        y = (x * 2).relu()
        z = y.exp()  # relu saved y; exp saves its own result
    y.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.sum().backward()
    # A kept (small) tensor too: torch's own check, which the hook bypasses.
    a = torch.randn(8, requires_grad=True)
    with compressed_activations():
        b = a * 3
        c = b * b
    b.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        c.sum().backward()


def test_double_backward_is_refused():
    x = torch.randn(256, 256, requires_grad=True)
    with compressed_activations():
        y = torch.tanh(x * 2)
        loss = (y * y).sum()
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(loss, x, create_graph=True)


def test_checkpoint_inside_and_channels_last(resnet18_data):
    x, y = resnet18_data
    model = _model("resnet18", num_classes=10).to(memory_format=torch.channels_last)
    xc = x.to(memory_format=torch.channels_last)
    ref = _grads(model, xc, y, autocast=torch.bfloat16)

    def fwd(inp):
        h = model.maxpool(model.relu(model.bn1(model.conv1(inp))))
        h = torch.utils.checkpoint.checkpoint(model.layer1, h, use_reentrant=False)
        h = torch.utils.checkpoint.checkpoint(
            lambda t: torch.utils.checkpoint.checkpoint(model.layer2, t, use_reentrant=False), h, use_reentrant=False
        )
        h = model.layer4(model.layer3(h))
        return model.fc(torch.flatten(model.avgpool(h), 1))

    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16), compressed_activations() as ctx:
        loss = F.cross_entropy(fwd(xc).float(), y)
    loss.backward()
    got = {n: p.grad.double() for n, p in model.named_parameters()}
    assert min(_cos(ref[k], got[k]) for k in ref) >= 0.999
    assert ctx.stats["packed"] > 5


def test_half_model_with_grad_scaler():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 32 * 32, 10))
    ref_model = nn.Sequential(*[m for m in model])  # same modules
    model = model.to(torch.bfloat16)
    scaler = mixprec.amp.GradScaler("cpu", init_scale=2.0**8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 3, 32, 32, dtype=torch.bfloat16)
    y = torch.randint(0, 10, (8,))
    for _ in range(2):
        opt.zero_grad()
        with compressed_activations():
            loss = F.cross_entropy(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert ref_model is not None


# ---- bad arguments: named, nothing changed --------------------------------------


@pytest.mark.parametrize(
    "kwargs,exc,msg",
    [
        ({"bits": 3}, ValueError, "bits must be 8 or 4, got 3"),
        ({"bits": 16}, ValueError, "bits must be 8 or 4, got 16"),
        ({"bits": math.nan}, ValueError, "bits must be an integer"),
        ({"bits": True}, TypeError, "bits must be an integer"),
        ({"bits": "8"}, TypeError, "bits must be an integer"),
        ({"bits": 8.5}, TypeError, "bits must be an integer"),
        ({"block": 100}, ValueError, r"block must be a power of two in \[32, 4096\], got 100"),
        ({"block": 0}, ValueError, "block must be a power of two"),
        ({"block": 8192}, ValueError, "block must be a power of two"),
        ({"min_numel": -1}, ValueError, "min_numel must be >= 0"),
        ({"seed": 2.5}, TypeError, "seed must be an integer"),
        ({"norm_bits": 32}, ValueError, "norm_bits must be 4, 8, 16"),
        ({"norm_bits": "8"}, TypeError, "norm_bits must be an integer"),
    ],
)
def test_bad_arguments(kwargs, exc, msg):
    with pytest.raises(exc, match="mixprec.memory.compressed_activations: " + msg):
        compressed_activations(**kwargs)
    # Nothing was installed: a forward afterwards saves its tensors as usual.
    calls = []
    x = torch.randn(10, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: calls.append(1) or t, lambda t: t):
        (x.exp()).sum().backward()
    assert calls


def test_maxpool_indices_narrowed_losslessly():
    x = torch.randn(4, 16, 64, 64, requires_grad=True)
    ref = torch.autograd.grad(F.max_pool2d(x * 1.0, 3, 2, 1, return_indices=False).square().sum(), x)[0]
    with compressed_activations() as ctx:
        h = x * 1.0
        y = F.max_pool2d(h, 3, 2, 1)
        loss = (y * 1.5).sum()  # saves nothing of y
    got = torch.autograd.grad(loss, x)[0]
    # max-pool's backward reads only its indices (int64 -> one byte each): exact.
    assert torch.equal(got, torch.autograd.grad(F.max_pool2d(x * 1.0, 3, 2, 1).sum() * 1.5, x)[0])
    assert ctx.stats["packed"] == 2  # h (codes) and the indices (uint8)
    idx_bytes = 4 * 16 * 32 * 32
    assert ctx.stats["packed_bytes"] == 4 * 16 * 64 * 64 * 4 + idx_bytes * 8
    assert ref is not None


# ---- lossless forms: max-pool indices in one byte, masks in one bit --------------

_POOLS = [
    # (kernel, stride, padding, dilation, ceil_mode, H, W, channels_last, functional)
    (3, 2, 1, 1, False, 56, 56, False, False),  # ResNet's stem
    (3, 2, 1, 1, True, 57, 43, False, True),
    (2, 2, 0, 1, False, 32, 48, True, False),
    ((3, 2), (2, 1), (1, 0), (2, 1), True, 33, 40, False, True),
    (1, 2, 0, 1, False, 64, 64, False, True),  # FPN's LastLevelMaxPool
    (16, 16, 0, 1, False, 128, 128, False, False),  # a 256-element window: still one byte
]


@pytest.mark.parametrize("k,s,p,d,ceil,H,W,cl,functional", _POOLS)
def test_maxpool_indices_in_one_byte(k, s, p, d, ceil, H, W, cl, functional):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 8, H, W, generator=g)
    if cl:
        x = x.to(memory_format=torch.channels_last)
    x.requires_grad_()
    pool = (lambda t: F.max_pool2d(t, k, s, p, d, ceil_mode=ceil)) if functional else nn.MaxPool2d(k, s, p, d, ceil_mode=ceil)
    w = torch.randn(pool(x).shape, generator=g)
    ref = torch.autograd.grad((pool(x) * w).sum(), x)[0]
    with compressed_activations(min_numel=1) as ctx:
        y = pool(x)  # saves x (a leaf: kept) and its indices
        loss = (y * w).sum()  # saves w (no history, not two-valued: kept)
    got = torch.autograd.grad(loss, x)[0]
    assert torch.equal(got, ref)  # the indices came back exact
    assert ctx.stats["packed"] == 1 and ctx.stats["kept"] == 1
    assert ctx.stats["packed_bytes"] == 8 * y.numel() and ctx.stats["packed_nbytes"] == y.numel()


def test_maxpool_indices_of_large_windows_are_narrowed():
    x = torch.randn(2, 4, 40, 40, requires_grad=True)
    with compressed_activations(min_numel=1) as ctx:
        y = F.max_pool2d(x, 17, 1)  # 289-element windows: not one byte; in-plane positions fit int16
        loss = y.sum()
    assert ctx.stats["packed_nbytes"] == 2 * y.numel()
    assert torch.equal(torch.autograd.grad(loss, x)[0], torch.autograd.grad(F.max_pool2d(x, 17, 1).sum(), x)[0])


def test_maxpool_indices_are_still_checked_for_inplace_changes():
    x = torch.randn(2, 4, 16, 16, requires_grad=True)
    with compressed_activations(min_numel=1):
        y, idx = F.max_pool2d(x, 2, return_indices=True)
        loss = y.sum()
    idx.add_(0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.filterwarnings("error")  # torch warns if the mask comes back as uint8
@pytest.mark.parametrize("shape,cl", [((5, 7, 9, 11), False), ((4, 16, 8, 8), True), ((3,) * 8, False)])
def test_bool_masks_in_one_bit(shape, cl):
    g = torch.Generator().manual_seed(6)
    x = torch.randn(shape, generator=g)
    mask = torch.rand(shape, generator=g) < 0.4
    if cl:
        x, mask = x.to(memory_format=torch.channels_last), mask.to(memory_format=torch.channels_last)
    x.requires_grad_()
    w = torch.randn(shape, generator=g)
    ref = torch.autograd.grad((torch.where(mask, x, 0.0) * w).sum(), x)[0]
    with compressed_activations(min_numel=1) as ctx:
        loss = (torch.where(mask, x, 0.0) * w).sum()  # where saves the mask
    got = torch.autograd.grad(loss, x)[0]
    assert torch.equal(got, ref)
    assert ctx.stats["packed"] == 1 and ctx.stats["packed_nbytes"] == math.ceil(mask.numel() / 8)
    back = mixprec.memory._Bits(mask).unpack()
    assert back.dtype == torch.bool and back.stride() == mask.stride() and torch.equal(back, mask)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_dropout_mask_in_one_bit(dtype):
    x = torch.randn(32, 3000, dtype=dtype, requires_grad=True)
    torch.manual_seed(7)
    ref = torch.autograd.grad(F.dropout(x, 0.3, training=True).sum(), x)[0]
    torch.manual_seed(7)
    with compressed_activations(min_numel=1) as ctx:
        loss = F.dropout(x, 0.3, training=True).sum()  # saves x (a leaf: kept) and the mask x is multiplied by
    got = torch.autograd.grad(loss, x)[0]
    assert torch.equal(got, ref)
    assert 0.2 < float((ref == 0).float().mean()) < 0.4
    assert ctx.stats["packed"] == 1 and ctx.stats["packed_nbytes"] == math.ceil(x.numel() / 8)


@pytest.mark.parametrize("value", [float("inf"), float("nan"), -2.0])
def test_zero_or_nonfinite_masks_are_kept(value):
    mask = torch.zeros(64, 300)
    mask[::3] = value
    x = torch.randn(64, 300, requires_grad=True)
    with compressed_activations(min_numel=1) as ctx:
        loss = (x * mask).sum()
    assert ctx.stats["packed"] == 0 and ctx.stats["kept"] == 1
    torch.testing.assert_close(torch.autograd.grad(loss, x)[0], mask, rtol=0, atol=0, equal_nan=True)


def test_tensors_without_history_that_are_not_masks_are_kept():
    x = torch.randn(64, 300)  # an input batch: no history, many values
    w = torch.randn(300, 10, requires_grad=True)
    with compressed_activations(min_numel=1) as ctx:
        loss = (x @ w).sum()
    assert ctx.stats["packed"] == 0 and ctx.stats["kept"] == 1
    torch.testing.assert_close(torch.autograd.grad(loss, w)[0], x.sum(0, keepdim=True).T.expand(300, 10))


# ---- norm_bits: what normalisation layers save ---------------------------------


def _conv_bn_relu():
    torch.manual_seed(8)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 4, 1))


def test_norm_inputs_kept_exactly_with_norm_bits_16():
    model = _conv_bn_relu()
    g = torch.Generator().manual_seed(9)
    x, w = torch.randn(4, 3, 32, 32, generator=g), torch.randn(4, 4, 32, 32, generator=g)

    def grads(ctx):
        model.zero_grad(set_to_none=True)
        with ctx:
            loss = (model(x) * w).sum()
        loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    ref = grads(torch.autocast("cpu", enabled=False))
    # BN's input kept, ReLU's output packed (its mask is exact; the last conv's weight gradient is not)
    got = grads(compressed_activations(bits=8, norm_bits=16, min_numel=1))
    for r, g_ in list(zip(ref, got))[:4]:  # conv1 and BN: exact
        assert torch.equal(r, g_)
    lossy = grads(compressed_activations(bits=8, min_numel=1))
    assert not all(torch.equal(r, g_) for r, g_ in list(zip(ref, lossy))[:4])


@pytest.mark.parametrize("norm", ["batch", "group", "layer"])
def test_norm_bits_8_under_bits_4(norm):
    torch.manual_seed(10)
    layer = {"batch": nn.BatchNorm2d(16), "group": nn.GroupNorm(4, 16), "layer": nn.LayerNorm([16, 16, 16])}[norm]
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), layer, nn.ReLU())
    x = torch.randn(4, 3, 16, 16)
    n = 4 * 16 * 16 * 16
    with compressed_activations(bits=4, norm_bits=8, min_numel=1024) as ctx:  # not the statistics
        model(x).sum()
    # the norm's input at 8 bits (block 256), the ReLU output at 4 (block 32);
    # after a BatchNorm the ReLU output is a mask (recompute_relu)
    assert ctx.stats["packed"] == 2
    relu = n // 8 if norm == "batch" else n // 2 + 4 * n // 32
    assert ctx.stats["packed_nbytes"] == (n + 4 * n // 256) + relu


def test_maxpool_index_coding_temporaries_do_not_grow_with_the_batch():
    """The index arithmetic runs in slices: its int64 temporaries are a
    constant, not bytes per sample (the planner's slope would count them)."""
    transient = []
    for n in (64, 512):
        x = torch.randn(n, 32, 8, 8, requires_grad=True)
        with mixprec.memory.LiveTracker() as t:
            with compressed_activations(min_numel=1):
                y = F.max_pool2d(x, 2)
            held = t.current
        transient.append(t.peak - held - 8 * y.numel())  # less the op's own int64 indices
        del y
    assert abs(transient[1] - transient[0]) < 64 * 1024, transient  # 8x the batch, about the same


def test_seeding_int_per_block_none_fresh_and_rng_untouched(resnet18_data):
    """An int seed gives the same codes each time a fresh block runs the same
    step (a process-wide counter made the second run round differently);
    seed=None rounds each block with new bits and leaves torch's random
    stream alone (dropout masks are the same with and without the block)."""
    x, y = resnet18_data
    model = _model("resnet18", num_classes=10)

    def run(**kw):
        return _grads(model, x, y, ctx=compressed_activations(bits=4, **kw), autocast=torch.bfloat16)

    def same(a, b):
        return all(torch.equal(a[k], b[k]) for k in a)

    assert same(run(seed=7), run(seed=7))
    assert not same(run(seed=7), run(seed=8))
    torch.manual_seed(3)
    assert not same(run(), run())  # new bits per block, even with torch's RNG state unchanged
    torch.manual_seed(3)
    with compressed_activations():
        pass
    after_block = torch.rand(4)
    torch.manual_seed(3)
    assert torch.equal(after_block, torch.rand(4))
