"""Helpers of the optimizer's CUDA tests (test_optim_cuda.py,
test_optim_ema_cuda.py): CPU/GPU twins stepped on the same gradients, and a
step captured in a CUDA graph with a GradScaler's device tensors."""

import torch


def on_cuda(params):
    """CUDA twins of CPU params (same values)."""
    return [torch.nn.Parameter(p.detach().cuda()) for p in params]


def step_both(gen, oc, og, cpu, gpu, steps, dtype=torch.bfloat16):
    """``steps`` steps of the CPU optimizer ``oc`` and the CUDA one ``og``
    on the same random grads (drawn on the CPU from ``gen``, in ``dtype``)."""
    for _ in range(steps):
        for p, q in zip(cpu, gpu):
            g = torch.randn(p.shape, generator=gen).to(dtype)
            p.grad, q.grad = g, g.cuda()
        oc.step()
        og.step()


def capture_step(opt, found_inf, grad_scale):
    """``opt.step()`` with ``found_inf`` / ``grad_scale`` handed over as a
    GradScaler does, captured in a CUDA graph (on a side stream, as torch
    requires) and returned; the state must exist already."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        opt.found_inf, opt.grad_scale = found_inf, grad_scale
        with torch.cuda.graph(graph, stream=s):
            opt.step()
        del opt.found_inf, opt.grad_scale
    torch.cuda.current_stream().wait_stream(s)
    return graph
