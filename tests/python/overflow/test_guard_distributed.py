"""mixprec.guard under DDP, 2 gloo processes: the overflow happens on rank 0's
data only; DDP's all-reduce makes both ranks skip the step, both read the
guard's flags reduced over the ranks and move the same module to FP32 in the
same step; the replicas stay bit-identical."""

import datetime
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F

import mixprec
from mixprec.guard import ForwardGuard

from _reference import free_port, spawn

WORLD = 2


def _worker(rank, port, result_dir):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 5))
        with torch.no_grad():
            model[0].weight.mul_(40.0)  # FP16 overflows for inputs of a few thousand
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scaler = mixprec.amp.GradScaler("cpu", diagnostics=True)
        guard = ForwardGuard(model, fallback=True).attach(scaler)
        g = torch.Generator().manual_seed(rank)
        skipped = []
        for step in range(4):
            x = torch.randn(8, 16, generator=g) * (5000.0 if rank == 0 else 1.0)
            y = torch.randint(0, 5, (8,), generator=g)
            before = scaler.get_skipped_steps()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = F.cross_entropy(ddp(x).float(), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            skipped.append(scaler.get_skipped_steps() > before)
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        every = [torch.empty_like(flat) for _ in range(WORLD)]
        dist.all_gather(every, flat)
        rep = guard.report()
        torch.save(
            {"skipped": skipped, "fallback": sorted(guard.fallback_set), "events": guard.events,
             "module": rep.module if rep else None, "differ": int((every[0] != every[1]).sum())},
            os.path.join(result_dir, f"rank{rank}.pt"),
        )
    finally:
        dist.destroy_process_group()
    os._exit(0)  # see tests/python/distributed/test_ddp.py: DDP teardown may hang on 2.13


def test_ranks_agree_on_the_fallback():
    with tempfile.TemporaryDirectory() as d:
        spawn(_worker, (free_port(), d), WORLD)
        r0, r1 = (torch.load(os.path.join(d, f"rank{r}.pt"), weights_only=False) for r in range(WORLD))
    assert r0["skipped"] == r1["skipped"] == [True, False, False, False]
    assert r0["fallback"] == r1["fallback"] == ["0"]
    assert r0["module"] == r1["module"] == "0"  # rank 1 saw no overflow itself, and names it too
    assert [tuple(e) for e in r0["events"]] == [tuple(e) for e in r1["events"]]
    assert r0["differ"] == 0
