"""mixprec.guard under DDP and FSDP2 (fully_shard), 2 gloo processes: the
overflow happens on rank 0's data only; the gradient all-reduce (DDP) or
reduce-scatter (FSDP2, then the scaler's found_inf reduction) makes both
ranks skip the step, both read the guard's flags reduced over the ranks and
move the same module to FP32 in the same step; DDP replicas stay
bit-identical, FSDP2's full parameters equal one process training on both
ranks' data."""

import datetime
import math
import os
import tempfile

import torch
import torch.distributed as dist

import mixprec
from mixprec.guard import ForwardGuard

from _models import amp_steps, batches, vit
from _reference import free_port, spawn

WORLD = 2


def _run_ranks(worker):
    """Runs worker(rank, port, result_dir) on WORLD gloo ranks; each rank's saved result."""
    with tempfile.TemporaryDirectory() as d:
        spawn(worker, (free_port(), d), WORLD)
        return [torch.load(os.path.join(d, f"rank{r}.pt"), weights_only=False) for r in range(WORLD)]


def _init(rank, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=60))


def _worker(rank, port, result_dir):
    _init(rank, port)
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
        data = [(torch.randn(8, 16, generator=g) * (5000.0 if rank == 0 else 1.0),
                 torch.randint(0, 5, (8,), generator=g)) for _ in range(4)]
        _, skipped = amp_steps(ddp, opt, scaler, data)
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


def _fsdp_net():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 5))
    with torch.no_grad():
        model[0].weight.mul_(40.0)  # FP16 overflows for inputs of a few thousand
    return model


def _fsdp_batches(rank, steps=4):
    g = torch.Generator().manual_seed(rank)
    out = []
    for _ in range(steps):
        x = torch.randn(8, 16, generator=g) * (5000.0 if rank == 0 else 1.0)
        out.append((x, torch.randint(0, 5, (8,), generator=g)))
    return out


def _fsdp_train(model, guard_model, batches):
    """FP16 autocast steps with the guard's fallback; returns the skipped
    flags and the guard."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = mixprec.amp.GradScaler("cpu", diagnostics=True)
    guard = ForwardGuard(guard_model, fallback=True).attach(scaler)
    return amp_steps(model, opt, scaler, batches)[1], guard


def _fsdp_worker(rank, port, result_dir):
    _init(rank, port)
    try:
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import DTensor

        model = _fsdp_net()
        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
        assert all(isinstance(p, DTensor) for p in model.parameters())
        skipped, guard = _fsdp_train(model, model, _fsdp_batches(rank))
        half = _fsdp_net().half()
        fully_shard(half)
        refused = ""
        try:
            ForwardGuard(half, fallback=True, move_params=True)
        except ValueError as e:
            refused = str(e)
        default_move = ForwardGuard(half, fallback=True).move_params
        full = {n: p.full_tensor() for n, p in model.named_parameters()}
        rep = guard.report()
        torch.save(
            {"skipped": skipped, "fallback": sorted(guard.fallback_set), "events": guard.events,
             "module": rep.module if rep else None, "params": full, "refused": refused,
             "default_move": default_move},
            os.path.join(result_dir, f"rank{rank}.pt"),
        )
    finally:
        dist.destroy_process_group()
    os._exit(0)


def test_fsdp2_ranks_agree_on_the_fallback():
    r0, r1 = _run_ranks(_fsdp_worker)
    assert r0["skipped"] == r1["skipped"] == [True, False, False, False]
    assert r0["fallback"] == r1["fallback"] == ["0"]
    assert r0["module"] == r1["module"] == "0"  # rank 1 saw no overflow itself, and names it too
    assert [tuple(e) for e in r0["events"]] == [tuple(e) for e in r1["events"]]
    for n in r0["params"]:
        assert torch.equal(r0["params"][n], r1["params"][n]), n
    # A .half() model under FSDP2: its DTensor shards cannot change dtype.
    assert "move_params=True cannot move FSDP2's sharded (DTensor) parameters" in r0["refused"]
    assert r0["default_move"] is False
    # Reference: one process, both ranks' batches in one (the mean loss of
    # 16 samples is the mean of the ranks' means; FSDP2 averages gradients).
    ref = _fsdp_net()
    both = [(torch.cat([a[0], b[0]]), torch.cat([a[1], b[1]])) for a, b in zip(_fsdp_batches(0), _fsdp_batches(1))]
    skipped, guard = _fsdp_train(ref, ref, both)
    assert skipped == r0["skipped"] and sorted(guard.fallback_set) == r0["fallback"]
    for n, p in ref.named_parameters():
        torch.testing.assert_close(r0["params"][n], p.detach(), rtol=1e-4, atol=1e-5)
    assert not torch.equal(r0["params"]["0.weight"], _fsdp_net()[0].weight)  # it trained


def _half_ddp_worker(rank, port, result_dir):
    _init(rank, port)
    try:
        model = vit().half()  # an FP16 model (no autocast) whose block 1 attention logits pass 65504
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        opt = mixprec.optim.AdamW(model.parameters(), lr=1e-3)
        scaler = mixprec.amp.GradScaler("cpu", diagnostics=True)
        guard = ForwardGuard(model, fallback=True, optimizer=opt).attach(scaler)
        losses, skipped = amp_steps(lambda x: ddp(x.half()), opt, scaler, batches(5, seed=10 + rank), autocast=None)
        flat = torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])
        masters = torch.cat([opt.state[p]["master"].reshape(-1) for p in model.parameters()])
        both = torch.cat([flat, masters])
        every = [torch.empty_like(both) for _ in range(WORLD)]
        dist.all_gather(every, both)
        torch.save(
            {"skipped": skipped, "losses": losses, "fallback": sorted(guard.fallback_set),
             "move_params": guard.move_params, "dtypes": sorted({str(p.dtype) for p in model.parameters()}),
             "rounded": torch.equal(flat, masters.half().float()),
             "differ": int((every[0] != every[1]).sum())},
            os.path.join(result_dir, f"rank{rank}.pt"),
        )
    finally:
        dist.destroy_process_group()
    os._exit(0)


def test_half_model_under_ddp_runs_the_fallback_on_upcast_params():
    r0, r1 = _run_ranks(_half_ddp_worker)
    assert r0["move_params"] is False and r1["move_params"] is False  # the default with 2 ranks
    assert r0["skipped"] == r1["skipped"] == [True, False, False, False, False]
    assert r0["fallback"] == r1["fallback"] == ["blocks.1.attn"]
    assert r0["dtypes"] == r1["dtypes"] == ["torch.float16"]  # DDP's buckets still fit
    assert r0["differ"] == 0  # params and masters bit-identical across ranks
    assert r0["rounded"] and r1["rounded"]  # each param is its FP32 master rounded
    for r in (r0, r1):
        assert not math.isfinite(r["losses"][0]) and all(math.isfinite(v) for v in r["losses"][1:])


def test_ranks_agree_on_the_fallback():
    r0, r1 = _run_ranks(_worker)
    assert r0["skipped"] == r1["skipped"] == [True, False, False, False]
    assert r0["fallback"] == r1["fallback"] == ["0"]
    assert r0["module"] == r1["module"] == "0"  # rank 1 saw no overflow itself, and names it too
    assert [tuple(e) for e in r0["events"]] == [tuple(e) for e in r1["events"]]
    assert r0["differ"] == 0


def _fsdp_fp16_policy_worker(rank, port, result_dir):
    """FSDP2 with MixedPrecisionPolicy(param_dtype=float16), no autocast:
    FP32 sharded parameters, FP16 unsharded ones (and inputs) in the
    forward, where block 1's attention logits pass 65504."""
    _init(rank, port)
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        model = vit()
        policy = MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32)
        for block in model.blocks:
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        # FP16 gradients: a smaller first scale than 2**16 keeps them in range.
        scaler = mixprec.amp.GradScaler("cpu", init_scale=1024.0, diagnostics=True)
        guard = ForwardGuard(model, fallback=True).attach(scaler)
        out_dtypes = []

        def forward(x):
            out = model(x)
            out_dtypes.append(str(out.dtype))
            return out

        losses, skipped = amp_steps(forward, opt, scaler, batches(4, seed=10 + rank), autocast=None)
        rep = guard.reports()[0] if guard.reports() else None
        torch.save(
            {"skipped": skipped, "losses": losses, "out_dtypes": out_dtypes, "fallback": sorted(guard.fallback_set),
             "events": guard.events, "module": rep.module if rep else None, "dtype": rep.dtype if rep else None,
             "move_params": guard.move_params,
             "params": {n: p.full_tensor() for n, p in model.named_parameters()},
             "param_dtypes": sorted({str(p.dtype) for p in model.parameters()})},
            os.path.join(result_dir, f"rank{rank}.pt"),
        )
    finally:
        dist.destroy_process_group()
    os._exit(0)


def test_fsdp2_fp16_param_policy_ranks_agree_on_the_fallback():
    """The FP16 forward comes from FSDP2's mixed-precision policy, not from
    autocast: the fallback module runs on FP32 copies of the FP16 unsharded
    parameters, its output cast back to FP16 for the next layer (FSDP2's
    sharded FP32 parameters stay as they are)."""
    r0, r1 = _run_ranks(_fsdp_fp16_policy_worker)
    assert r0["move_params"] is False
    assert r0["skipped"] == r1["skipped"] == [True, False, False, False]
    assert r0["module"] == r1["module"] == "blocks.1.attn" and r0["dtype"] == "float16"
    assert r0["fallback"] == r1["fallback"] == ["blocks.1.attn"]
    assert [tuple(e) for e in r0["events"]] == [tuple(e) for e in r1["events"]]
    assert r0["param_dtypes"] == ["torch.float32"]  # the shards keep their dtype
    assert r0["out_dtypes"] == ["torch.float16"] * 4  # the rest of the model still runs in FP16
    for r in (r0, r1):
        assert not math.isfinite(r["losses"][0]) and all(math.isfinite(v) for v in r["losses"][1:])
    for n in r0["params"]:
        assert torch.equal(r0["params"][n], r1["params"][n]), n
        assert torch.isfinite(r0["params"][n]).all(), n
    assert not torch.equal(r0["params"]["embed.weight"], vit().embed.weight)  # it trained
