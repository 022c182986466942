"""Benchmark: batched detection post-processing, mixprec.ops.efficient_nms
(one call per batch) vs the per-image Python loops a user writes instead.

For B in {1, 8, 32} images, N in {1000, 5000, 20000} boxes, C = 80 classes,
detector-like float32 outputs (boxes clustered around objects, scores =
sigmoid of mostly negative logits, so a few percent pass the threshold);
score threshold 0.05, pre-NMS top-k 1000 per image, IoU 0.5, 100 detections
(torchvision's detection defaults, YOLO-style top-k). In one process, same
inputs, interleaved, median of several runs:
  loop+tv    per image: score filter, topk, torchvision.ops.batched_nms
  loop+mp    the same loop with mixprec.ops.batched_nms
  efficient  mixprec.ops.efficient_nms on the whole batch (float32 inputs),
             and on bfloat16 inputs (bf16 column)
with whether the loop's and the op's detections (box indices and classes)
are identical.

Usage: python bench/bench_efficient_nms.py [--device cpu|cuda] [--quick] [--out FILE]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import mixprec  # noqa: E402
from _common import Table, add_threads_option, apply_threads, device_of, parser, utc_now, machine, timed_with_output  # noqa: E402

C = 80
THR, TOP_K, IOU, K = 0.05, 1000, 0.5, 100


def make(b, n, seed, device):
    gen = torch.Generator().manual_seed(seed)
    k = max(1, n // 50)
    centres = torch.rand(b, k, 2, generator=gen) * 1000
    pick = torch.randint(0, k, (b, n), generator=gen)
    xy = torch.gather(centres, 1, pick[..., None].expand(b, n, 2)) + torch.randn(b, n, 2, generator=gen) * 8
    wh = 40 + torch.rand(b, n, 2, generator=gen) * 40
    boxes = torch.cat([xy - wh / 2, xy + wh / 2], -1)
    scores = torch.sigmoid(torch.randn(b, n, C, generator=gen) * 1.5 - 5.0)
    return boxes.to(device), scores.to(device)


def per_image_loop(boxes, scores, nms_fn):
    """What a user writes without a batched op; returns per-image (n, c)."""
    out = []
    for b in range(boxes.shape[0]):
        s = scores[b].flatten()
        cand = (s > THR).nonzero().squeeze(1)
        sc, order = s[cand].topk(min(TOP_K, cand.numel()))
        cand = cand[order]
        n, c = cand // C, cand % C
        keep = nms_fn(boxes[b][n], sc, c, IOU)[:K]
        out.append((n[keep], c[keep]))
    return out


def same(loop_out, det):
    for b, (n, c) in enumerate(loop_out):
        m = int(det.counts[b])
        if m != len(n) or not torch.equal(det.indices[b, :m].cpu(), n.cpu()) or not torch.equal(det.classes[b, :m].cpu(), c.cpu()):
            return False
    return True


def bench_one(tv, b, n, device, reps):
    boxes, scores = make(b, n, seed=b * 1000 + n, device=device)
    bb, sb = boxes.bfloat16(), scores.bfloat16()
    fns = {
        "tv": lambda: per_image_loop(boxes, scores, tv.ops.batched_nms),
        "mp": lambda: per_image_loop(boxes, scores, mixprec.ops.batched_nms),
        "eff": lambda: mixprec.ops.efficient_nms(boxes, scores, iou_threshold=IOU, score_threshold=THR, max_detections=K, pre_nms_top_k=TOP_K),
        "bf16": lambda: mixprec.ops.efficient_nms(bb, sb, iou_threshold=IOU, score_threshold=THR, max_detections=K, pre_nms_top_k=TOP_K),
    }
    outs = {k: timed_with_output(f, device)[1] for k, f in fns.items()}  # warm-up + results
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            times[k].append(timed_with_output(f, device)[0])
    ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    ratios_tv = statistics.median(t / e for t, e in zip(times["tv"], times["eff"]))
    ratios_mp = statistics.median(t / e for t, e in zip(times["mp"], times["eff"]))
    return ms, ratios_tv, ratios_mp, same(outs["tv"], outs["eff"]), same(outs["mp"], outs["eff"]), outs["eff"].counts.float().mean().item()


def main():
    ap = parser(__doc__)
    add_threads_option(ap)
    args = ap.parse_args()
    apply_threads(args)
    device = device_of(args)
    try:
        import torchvision as tv
    except ImportError:
        sys.exit("torchvision is needed for the comparison")
    batches, sizes = ([1, 8], [1000, 5000]) if args.quick else ([1, 8, 32], [1000, 5000, 20000])
    reps = args.reps or (3 if args.quick else 7)
    table = Table(
        "| B | N | loop+torchvision ms | loop+mixprec ms | efficient_nms ms | bf16 ms | "
        "vs loop+tv | vs loop+mp | per image ms | mean dets | identical tv / mp |"
    )
    for b in batches:
        for n in sizes:
            ms, rt, rm, s_tv, s_mp, dets = bench_one(tv, b, n, device, reps)
            table.add(
                f"| {b} | {n:,} | {ms['tv']:.2f} | {ms['mp']:.2f} | {ms['eff']:.2f} | {ms['bf16']:.2f} | "
                f"{rt:.1f}x | {rm:.1f}x | {ms['eff'] / b:.3f} | {dets:.0f} | "
                f"{'yes' if s_tv else 'NO'} / {'yes' if s_mp else 'NO'} |"
            )
    when = utc_now()
    info = f"{machine(device)}; torchvision {tv.__version__}"
    print(f"\nmachine: {info}; date: {when}; median of {reps} interleaved runs; ratios = median of per-round ratios")
    table.write(args.out, f"Batched detection post-processing benchmark ({device.type})",
                f"Machine: {info}. Date: {when}. Median of {reps} interleaved runs in one process; "
                "the ratio columns are medians of the per-round ratios (loop time / efficient_nms time). "
                f"C = {C}, score threshold {THR}, pre-NMS top-k {TOP_K}, IoU {IOU}, {K} detections per image; "
                "float32 inputs (bf16: the same values cast to bfloat16).",
                f"python bench/bench_efficient_nms.py --device {args.device}{' --quick' if args.quick else ''}"
                f"{f' --threads {args.threads}' if args.threads else ''} --reps {reps}")


if __name__ == "__main__":
    main()
