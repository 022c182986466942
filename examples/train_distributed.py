"""The demo's CNN trained data-parallel with mixprec: DDP or FSDP2 by flag.

Run on this CPU machine (gloo) or on GPUs (NCCL, one per process):

    torchrun --nproc-per-node 2 examples/train_distributed.py --mode ddp
    torchrun --nproc-per-node 2 examples/train_distributed.py --mode fsdp2 --dtype bf16
    torchrun --nproc-per-node 2 examples/train_distributed.py --mode fsdp2 --dtype fp32-policy

Each rank trains on its own half of every batch of the digits data set.
``--dtype bf16`` / ``fp16``: the model is cast to that dtype and
mixprec.optim.AdamW keeps FP32 master weights (per local shard under FSDP2);
``fp32-policy`` (FSDP2 only): an FP32 model under
MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32), the plain
FP32 fused step. mixprec.amp.GradScaler reduces found_inf over the ranks that
share a gradient's shards and clips with the global norm, so every rank skips
and clips alike. At the end the ranks' parameters are compared (DDP: bitwise
equal) and ``--checkpoint DIR`` writes a torch.distributed.checkpoint that
loads on any number of ranks.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import mixprec  # noqa: E402
from train_amp import SmallCNN, load_digits  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32-policy": torch.float32}


def build(mode: str, dtype: str, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank
    model = SmallCNN().to(device)
    if mode == "ddp":
        model = model.to(DTYPES[dtype])
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kw = {}
    if dtype == "fp32-policy":
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        model = model.to(DTYPES[dtype])
    for layer in (model.c1, model.c2, model.fc1, model.fc2):
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    return model


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("ddp", "fsdp2"), default="ddp")
    ap.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64, help="global batch (split over the ranks)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--checkpoint", default=None, help="write a DCP checkpoint here at the end")
    args = ap.parse_args(argv)
    if args.mode == "ddp" and args.dtype == "fp32-policy":
        ap.error("--dtype fp32-policy is an FSDP2 MixedPrecisionPolicy; use --mode fsdp2")

    use_cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if not use_cuda:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))

    (xtr, ytr), (xte, yte) = load_digits(device)
    model = build(args.mode, args.dtype, device)
    in_dtype = DTYPES[args.dtype]
    opt = mixprec.optim.AdamW(model.parameters(), lr=args.lr)
    scaler = mixprec.amp.GradScaler(device.type)
    per_rank = args.batch // world
    gen = torch.Generator().manual_seed(1)  # the same data order on every rank
    t0, steps = time.perf_counter(), 0
    for epoch in range(args.epochs):
        perm = torch.randperm(len(xtr), generator=gen).to(device)
        total, count = torch.zeros((), device=device), 0
        for i in range(0, len(xtr) - args.batch + 1, args.batch):
            idx = perm[i + rank * per_rank : i + (rank + 1) * per_rank]
            logits = model(xtr[idx].to(in_dtype))
            loss = mixprec.ops.cross_entropy(logits, ytr[idx])
            scaler.scale(loss).backward()
            scaler.clip_grad_norm_(opt, args.clip)  # the global norm
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            total += loss.detach()
            count += 1
            steps += 1
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch + 1}: mean loss {total.item() / (count * world):.4f}, scale {scaler.get_scale():.0f}, "
                  f"skipped {scaler.get_skipped_steps()}", flush=True)
    elapsed = time.perf_counter() - t0

    with torch.no_grad():
        correct = (model(xte.to(in_dtype)).argmax(1) == yte).float().mean()
    flat = torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().float().reshape(-1)
                      for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    same = all(torch.equal(gathered[0], g) for g in gathered[1:])
    if args.checkpoint:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=args.checkpoint)
    if rank == 0:
        print(f"{args.mode} {args.dtype} on {world} ranks ({'nccl' if use_cuda else 'gloo'}): "
              f"test accuracy {correct.item():.2%}, {steps / elapsed:.1f} steps/s, "
              f"params identical on every rank: {same}"
              + (f", checkpoint in {args.checkpoint}" if args.checkpoint else ""), flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    # torch 2.14's FSDP2 on gloo aborts in about 1 exit of 3 during interpreter
    # teardown ("terminate called without an active exception"; plain torch,
    # without mixprec, does the same): everything is done, so leave now.
    os._exit(0 if same else 1)


if __name__ == "__main__":
    main()
