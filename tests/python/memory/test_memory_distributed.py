"""compressed_activations under DDP and FSDP2 on 2 gloo processes: the
replicas stay bit-identical (DDP all-reduces the gradients, and the packing
is the same bits on every rank for the same data) and each rank's gradients
match the uncompressed step's (cosine >= 0.999 at 8 bits)."""

import datetime
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import mixprec
import mixprec.memory

from _reference import free_port, spawn

WORLD = 2


def _net():
    # Convolutions before BatchNorm without a bias, as CV nets have them: such
    # a bias's gradient is zero up to rounding, and its cosine meaningless.
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )


def _grads(model, x, y, compressed):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        if compressed:
            with mixprec.memory.compressed_activations(bits=8):
                loss = F.cross_entropy(model(x).float(), y)
        else:
            loss = F.cross_entropy(model(x).float(), y)
    loss.backward()
    out = []
    for p in model.parameters():
        g = p.grad
        g = g.full_tensor() if hasattr(g, "full_tensor") else g
        out.append(g.detach().double().reshape(-1).clone())
    return out


def _worker(rank, port, mode, result_dir):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    try:
        model = _net()
        if mode == "ddp":
            wrapped = nn.parallel.DistributedDataParallel(model)
        else:
            from torch.distributed.fsdp import fully_shard

            for m in (model[0], model[3]):
                fully_shard(m)
            wrapped = fully_shard(model)
        g = torch.Generator().manual_seed(100 + rank)
        x = torch.randn(4, 3, 32, 32, generator=g)
        y = torch.randint(0, 10, (4,), generator=g)
        ref = _grads(wrapped, x, y, compressed=False)
        got = _grads(wrapped, x, y, compressed=True)
        cos = min(float(F.cosine_similarity(a.view(1, -1), b.view(1, -1))) for a, b in zip(ref, got))
        flat = torch.cat(got)
        all_flat = [torch.empty_like(flat) for _ in range(WORLD)]
        dist.all_gather(all_flat, flat)
        if rank == 0:
            torch.save({"cos": cos, "same": bool(torch.equal(all_flat[0], all_flat[1]))},
                       os.path.join(result_dir, "result.pt"))
    finally:
        dist.destroy_process_group()
    os._exit(0)


@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_compressed_activations_distributed(mode):
    with tempfile.TemporaryDirectory() as d:
        spawn(_worker, (free_port(), mode, d), WORLD)
        r = torch.load(os.path.join(d, "result.pt"))
    assert r["cos"] >= 0.999, r
    assert r["same"], "the ranks' gradients differ"
