"""Benchmark: one mixprec.ops.efficient_nms call on a raw YOLO head vs
ultralytics' own non_max_suppression, side by side in one process.

The head is what a YOLOv8-style detector emits, (B, 4 + 80, 8400)
channels-first with centre-coded boxes (cx, cy, w, h) and sigmoid class
scores: clusters of boxes around objects, each object one dominant class,
background logits N(-10, 1.5). Box values are multiples of 1/8 pixel so that
ultralytics' class-offset trick (x + 7680 * class in the head's dtype) rounds
nothing and both NMS see the same IoUs. Two settings, as ultralytics runs
them: predict (conf 0.25, IoU 0.7, max_det 300, best class per box,
multi_label=False) and val (conf 0.001, IoU 0.7, max_det 300,
multi_label=True). mixprec keeps every (box, class) pair above conf
(EfficientNMS's rule, = multi_label=True), so at predict settings it is also
compared with ultralytics' multi_label=True. Detections are compared as
(box index, class) lists per image; FP16 heads against ultralytics on the
same FP16 values upcast to FP32 (ultralytics' FP16 class offset overflows:
79 * 7680 > 65504), its own FP16 result reported too. ultralytics' time
limit (it returns the images done after 2 + 0.05 * B s) is lifted so that a
loaded machine does not change its detections.

Usage: python bench/bench_efficient_nms_yolo.py [--quick] [--reps R] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import mixprec  # noqa: E402
from _common import machine, timed_with_output  # noqa: E402

C, N = 80, 8400
SETTINGS = {"predict": dict(conf=0.25, iou=0.7, max_det=300), "val": dict(conf=0.001, iou=0.7, max_det=300)}


def head(b, seed):
    gen = torch.Generator().manual_seed(seed)
    k = 40
    centres = torch.rand(b, k, 2, generator=gen) * 600 + 20
    size = 20 + torch.rand(b, k, 2, generator=gen) * 180
    cls = torch.randint(0, C, (b, k), generator=gen)
    pick = torch.randint(0, k, (b, N), generator=gen)
    obj = torch.rand(b, N, generator=gen) < 0.15  # anchors on an object
    xy = torch.gather(centres, 1, pick[..., None].expand(b, N, 2)) + torch.randn(b, N, 2, generator=gen) * 6
    wh = torch.gather(size, 1, pick[..., None].expand(b, N, 2)) * (1 + 0.1 * torch.randn(b, N, 2, generator=gen))
    box = torch.where(obj[..., None], torch.cat((xy, wh), -1), torch.cat((torch.rand(b, N, 2, generator=gen) * 640, 5 + torch.rand(b, N, 2, generator=gen) * 60), -1))
    box = (box.clamp(min=1) * 8).round() / 8
    logits = torch.randn(b, N, C, generator=gen) * 1.5 - 10
    hit = torch.gather(cls, 1, pick)
    strength = torch.randn(b, N, generator=gen) * 2 + 1
    logits.scatter_(2, hit[..., None], torch.where(obj, strength, logits.gather(2, hit[..., None])[..., 0])[..., None])
    return torch.cat((box, torch.sigmoid(logits)), -1).transpose(1, 2).contiguous()


def ours(h, s):
    return mixprec.ops.efficient_nms(h, iou_threshold=s["iou"], score_threshold=s["conf"], max_detections=s["max_det"],
                                     pre_nms_top_k=30000, box_coding="center")


def theirs(nms, h, s, multi_label):
    # max_time_img: ultralytics stops after 2 + 0.05 * B seconds and returns
    # the images done so far; a loaded machine must not make that the difference.
    return nms(h, s["conf"], s["iou"], multi_label=multi_label, max_det=s["max_det"], return_idxs=True, max_time_img=10.0)


def as_lists(det):
    return [list(zip(det.indices[b, : int(det.counts[b])].tolist(), det.classes[b, : int(det.counts[b])].tolist()))
            for b in range(det.counts.shape[0])]


def theirs_lists(out):
    rows, idxs = out
    return [list(zip(i.long().tolist(), r[:, 5].long().tolist())) for r, i in zip(rows, idxs)]


def differences(a, b):
    """Images whose (index, class) lists differ, and detections in total."""
    return sum(x != y for x, y in zip(a, b)), sum(len(x) for x in a)


def bench(nms, b, dtype, setting, reps):
    s = SETTINGS[setting]
    h32 = head(b, seed=b * 7 + (setting == "val"))
    h = h32.to(dtype)
    ml = setting == "val"
    fns = {"mixprec": lambda: ours(h, s), "ultralytics": lambda: theirs(nms, h, s, ml)}
    if setting == "predict":
        fns["ultralytics_ml"] = lambda: theirs(nms, h, s, True)
    outs = {k: timed_with_output(f, torch.device("cpu"))[1] for k, f in fns.items()}
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            times[k].append(timed_with_output(f, torch.device("cpu"))[0])
    ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    ratio = {k: statistics.median(t / e for t, e in zip(times[k], times["mixprec"])) for k in fns if k != "mixprec"}
    mine = as_lists(outs["mixprec"])
    # ultralytics on the same values upcast to float32: the reference for a
    # 16-bit head (its own float16 arithmetic overflows in the class offset).
    ref32 = theirs(nms, h.float(), s, True) if dtype != torch.float32 else outs["ultralytics_ml" if setting == "predict" else "ultralytics"]
    same_ml = differences(mine, theirs_lists(ref32))
    same_own = differences(mine, theirs_lists(outs["ultralytics"]))
    return ms, ratio, same_ml, same_own


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--out", default=None, help="put the table into this Markdown file, as its YOLO section")
    args = ap.parse_args()
    try:
        from ultralytics.utils.nms import non_max_suppression as nms
        import ultralytics
        import torchvision  # noqa: F401  (ultralytics uses torchvision.ops.nms when imported)
    except ImportError as e:
        sys.exit(f"needs ultralytics (pip install --no-deps ultralytics==8.4.190 opencv-python-headless): {e}")
    reps = args.reps or (3 if args.quick else 9)
    batches = [8] if args.quick else [8, 16]
    load = os.getloadavg()
    header = ("| setting | dtype | B | mixprec ms | ultralytics ms | ultralytics / mixprec | "
              "same as multi_label=True (images differing / detections) | same as ultralytics' own call |")
    rows = [header, "|" + "---|" * 8]
    print(header, flush=True)
    for setting in ("predict", "val"):
        for dtype in (torch.float32, torch.float16):
            for b in batches:
                ms, ratio, (d_ml, n_ml), (d_own, n_own) = bench(nms, b, dtype, setting, reps)
                extra = f" (multi_label=True: {ms['ultralytics_ml']:.1f} ms, {ratio['ultralytics_ml']:.1f}x)" if "ultralytics_ml" in ms else ""
                row = (f"| {setting} | {str(dtype)[6:]} | {b} | {ms['mixprec']:.2f} | {ms['ultralytics']:.1f}{extra} | "
                       f"{ratio['ultralytics']:.1f}x | {d_ml} / {n_ml} | {d_own} images differ |")
                rows.append(row)
                print(row, flush=True)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    info = (f"{machine(torch.device('cpu'))}; ultralytics {ultralytics.__version__}; "
            f"load average at start {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}")
    print(f"\n{info}; {when}; median of {reps} interleaved runs")
    if args.out:
        text = Path(args.out).read_text() if Path(args.out).exists() else ""
        section = (
            "## YOLO head (B, 84, 8400) vs ultralytics' non_max_suppression\n\n"
            f"Machine: {info}. Date: {when}. One `efficient_nms(head, box_coding=\"center\")` call vs "
            "`ultralytics.utils.nms.non_max_suppression(head, ...)` on the same head, interleaved in one process, "
            f"median of {reps} runs; ratio = median of per-round ratios. See bench/bench_efficient_nms_yolo.py's "
            "docstring for the head and the comparison rules.\n"
            f"Command: `python bench/bench_efficient_nms_yolo.py{' --quick' if args.quick else ''} --reps {reps} --out {args.out}`\n\n"
            + "\n".join(rows) + "\n"
        )
        text = re.sub(r"## YOLO head.*?(?=\n## |\Z)", "", text, flags=re.S).rstrip() + "\n\n"
        Path(args.out).write_text(text + section)


if __name__ == "__main__":
    main()
