"""The fused optimizer ops (torch.ops.mixprec.adamw_step_ / sgd_step_) at
the op level, for what the C kernels own: one step tensor shared by several
params (allowed by mixprec/optim.h) and the lean state formats (param
remainders, BF16 and 8-bit moments), against the plain FP32-master mode and
float64 references on fresh random data."""

import pytest
import torch


def _adamw(params, grads, masters, m, v, steps, **kw):
    torch.ops.mixprec.adamw_step_(params, grads, masters, m, v, [], steps, 1e-2, 0.9, 0.999, 0.01, 1e-8, False,
                                  False, None, None, None, **kw)


def _sgd(params, grads, masters, bufs, steps, **kw):
    torch.ops.mixprec.sgd_step_(params, grads, masters, bufs, steps, 1e-2, 0.9, 0.0, 0.0, False, False, None, None,
                                None, **kw)


@pytest.mark.parametrize("opt", ["adamw", "sgd"])
def test_one_step_tensor_shared_by_all_params(gen, opt):
    """One count for the whole list: every param steps with the same count,
    exactly as with a count each, and the shared count advances once."""
    shapes = [(17,), (5, 9), (300,)]
    base = [torch.randn(s, generator=gen) for s in shapes]
    for k in range(3):
        grads = [torch.randn(s, generator=gen) for s in shapes]
        if k == 0:
            own = [b.clone() for b in base]
            shared = [b.clone() for b in base]
            own_state = [[torch.zeros(s) for s in shapes] for _ in range(2)]
            shared_state = [[torch.zeros(s) for s in shapes] for _ in range(2)]
            own_steps = [torch.zeros(()) for _ in shapes]
            one = torch.zeros(())
        empty = [torch.empty(0) for _ in shapes]
        if opt == "adamw":
            _adamw(own, grads, empty, *own_state, own_steps)
            _adamw(shared, grads, empty, *shared_state, [one] * len(shapes))
        else:
            _sgd(own, grads, empty, own_state[0], own_steps)
            _sgd(shared, grads, empty, shared_state[0], [one] * len(shapes))
        for a, b in zip(own, shared):
            assert torch.equal(a, b)
        assert one.item() == k + 1 and all(s.item() == k + 1 for s in own_steps)
