"""compressed_activations packs a saved tensor once the forward has let go
of it, not at save time: a tensor the forward keeps using (an FPN's feature
maps kept for the heads, a feature list of a UNet's skips) never exists as
original and codes at once. What the user sees: a lower tracked peak, the
same codes whenever the packing happens, torch's in-place check kept, no
leak when a graph is dropped, exact values if backward runs before the
packing (inside the block)."""

import gc
import weakref

import pytest
import torch
from torch import nn

from mixprec.memory import LiveTracker, compressed_activations


class _Pyramid(nn.Module):
    """A backbone whose every stage output is kept (and saved by its head's
    conv) until the heads run at the end, like torchvision's FPN dict."""

    def __init__(self, c=16, stages=4):
        super().__init__()
        self.stages = nn.ModuleList(nn.Conv2d(c, c, 3, padding=1) for _ in range(stages))
        self.heads = nn.ModuleList(nn.Conv2d(c, 4, 1) for _ in range(stages))

    def forward(self, x):
        feats = []
        for conv in self.stages:
            x = torch.relu(conv(x))  # relu saves its output; the next stage's conv saves it too
            feats.append(x)
        return sum(h(f).sum() for h, f in zip(self.heads, feats))


def _forward_memory(model, x, ctx=None):
    with LiveTracker() as tracker:
        if ctx is None:
            loss = model(x)
        else:
            with ctx:
                loss = model(x)
        tracker.mark("after")
    return tracker.peak, tracker.marks["after"], loss


def test_kept_features_are_not_held_twice():
    torch.manual_seed(0)
    model = _Pyramid()
    x = torch.randn(4, 16, 64, 64)
    peak, after, _ = _forward_memory(model, x)
    peak8, after8, loss = _forward_memory(model, x, compressed_activations(bits=8, seed=1))
    feat = 4 * 16 * 64 * 64 * 4  # one stage's FP32 output
    # The forward holds its 4 feature maps to the end: packed at save time,
    # their codes would sit beside them (+1 MiB, a quarter of 4 maps); packed
    # once the forward lets go, the peak is the uncompressed forward's and
    # after it only the codes remain.
    assert peak8 == peak
    assert after == 4 * feat + 4
    assert after8 < 4 * feat * 0.26 + 4
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_codes_do_not_depend_on_when_they_are_packed():
    torch.manual_seed(0)
    model = _Pyramid()
    x = torch.randn(2, 16, 32, 32)

    def grads(hold):
        model.zero_grad(set_to_none=True)
        with compressed_activations(bits=8, seed=7):
            loss = model(x)
            held = [loss * 1] if hold else []  # an extra op: a sweep point
        loss.backward()
        del held
        return [p.grad.clone() for p in model.parameters()]

    a, b = grads(False), grads(True)
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    # ...and packing happened: the gradients differ from the exact ones.
    model.zero_grad(set_to_none=True)
    model(x).backward()
    assert not all(torch.equal(u, p.grad) for u, p in zip(a, model.parameters()))


def test_packed_when_dropped_and_at_the_end_of_the_block():
    x = torch.randn(64, 1024, requires_grad=True)
    with compressed_activations() as ctx:
        y = torch.tanh(x * 2)  # tanh saves its output
        (held,) = ctx._pending.waiting()
        assert held.codes is None  # y is the forward's: not packed yet
        z = torch.sigmoid(y)
        del y
        torch.exp(z)  # the next op packs y
        assert held.codes is not None and held.pending is None
        (last,) = ctx._pending.waiting()
        assert last.codes is None  # z still held by the forward (exp's output, dropped, took its graph along)
    assert last.codes is not None and last.pending is None  # the block's end packs it
    assert ctx.stats["packed"] == 3  # y, z and the dropped exp output (counted when saved)


def test_inplace_change_while_waiting_still_raises():
    for drop in (True, False):
        x = torch.randn(256, 256, requires_grad=True)
        with compressed_activations():
            y = torch.tanh(x * 2)
            y.add_(1)  # changed after tanh saved it, before it was packed
            z = y * 3
            if drop:
                del y
                z = z + 1  # a sweep: packing finds the change
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            z.sum().backward()


def test_backward_inside_the_block_before_packing_is_exact():
    x = torch.randn(128, 512, requires_grad=True)
    ref = torch.autograd.grad(torch.tanh(x * 2).sum(), x)[0]
    with compressed_activations():
        y = torch.tanh(x * 2)
        got = torch.autograd.grad(y.sum(), x)[0]  # y still held: unpacks the original
    assert torch.equal(got, ref)


def test_dropped_graph_leaves_nothing_behind():
    x = torch.randn(128, 512, requires_grad=True)
    with compressed_activations() as ctx:
        y = torch.tanh(x * 2)
        ref = weakref.ref(y)
        del y  # and the graph with it: nothing will unpack
        gc.collect()
        assert ref() is None
        assert ctx._pending.waiting() == []
        torch.exp(x)


def test_views_of_one_storage_wait_for_all():
    x = torch.randn(64, 1024, requires_grad=True)
    c = torch.randn(32, 1024, requires_grad=True)
    with compressed_activations(seed=3) as ctx:
        s = torch.sigmoid(x * 2)  # sigmoid saves s
        a, b = s.chunk(2)
        u, v = a * c, b * c  # each mul saves its view (and c, no history: kept)
        waiting = ctx._pending.waiting()
        assert len(waiting) == 3
        del s, a
        torch.exp(u)  # b still holds the storage: nothing packed
        assert all(p.codes is None for p in waiting)
        del b
        torch.exp(u)  # now only the block's aliases hold it: all three packed
        assert all(p.codes is not None for p in waiting)
        loss = (u * v).sum()
    gx, gc_ = torch.autograd.grad(loss, (x, c))
    s = torch.sigmoid(x * 2)
    a, b = s.chunk(2)
    rx, rc = torch.autograd.grad(((a * c) * (b * c)).sum(), (x, c))
    assert torch.nn.functional.cosine_similarity(gx.flatten(), rx.flatten(), 0) > 0.999
    assert torch.nn.functional.cosine_similarity(gc_.flatten(), rc.flatten(), 0) > 0.999


def test_without_use_counts_packs_at_save_time(monkeypatch):
    from mixprec.memory import _saved

    monkeypatch.setattr(_saved, "LAZY", False)
    x = torch.randn(64, 1024, requires_grad=True)
    with compressed_activations(seed=2) as ctx:
        y = torch.tanh(x * 2)
        assert not ctx._pending.items  # packed already
    got = torch.autograd.grad(y.sum(), x)[0]
    ref = torch.autograd.grad(torch.tanh(x * 2).sum(), x)[0]
    assert torch.nn.functional.cosine_similarity(got.flatten(), ref.flatten(), 0) > 0.999
    assert not torch.equal(got, ref)
