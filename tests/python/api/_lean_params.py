"""Parameters and a step for the lean-option argument tests
(test_bad_input_faces.py, test_property_args.py)."""

import torch


def make_params(dtype=torch.bfloat16, seed=1):
    """A 4x3 weight and a 3-element bias of ``dtype``, from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(4, 3, generator=g).to(dtype)),
            torch.nn.Parameter(torch.randn(3, generator=g).to(dtype))]


def step(opt, params, seed=2):
    """Gives every parameter a gradient from ``seed`` and steps ``opt``."""
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g).to(p.dtype)
    opt.step()
