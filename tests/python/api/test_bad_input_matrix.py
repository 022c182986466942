"""The bad-input matrix of the amp, nms, efficient_nms, roi_align, softmax and
cross_entropy ops (cross_entropy_soft included)
(issue 14, item 8): for every op, one bad argument at a time on an otherwise
valid call (fresh random data): a wrong dtype, a tensor on another device
(meta, the device every machine has, mixed with CPU tensors), a wrong shape,
a refused stride, arguments that share memory, zero-size tensors, NaN / inf /
out-of-range scalars, wrong list lengths. Each case must

- raise RuntimeError whose message names the op ("mixprec::<op>") and the
  argument, and carries no C++ source location;
- leave every input bitwise unchanged (the bytes of every storage, NaNs
  included, snapshotted before the call);
- leave the process working (a valid call afterwards gives its result).

The valid call of every op is checked too, so a case fails for its one bad
argument and nothing else. The optimizer ops (adamw_step_, sgd_step_) are not
in this file.
"""

from __future__ import annotations

import math

import pytest
import torch

import mixprec

F32, F16, BF16, F64 = torch.float32, torch.float16, torch.bfloat16, torch.float64
I32, I64 = torch.int32, torch.int64
INF, NAN = float("inf"), float("nan")


def rnd(gen, *shape, dtype=F32, scale=100.0):
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


def boxes_of(gen, n, dtype=F32):
    xy = torch.rand(n, 2, generator=gen) * 100
    wh = torch.rand(n, 2, generator=gen) * 30 + 1
    return torch.cat([xy, xy + wh], 1).to(dtype)


def meta_like(t):
    return torch.empty_like(t, device="meta")


# ---- the ops: a valid call's arguments, and how to call it ---------------------

OPS = {}


def op(name, label=None):
    def deco(fn):
        OPS[label or name] = (name, fn)
        return fn

    return deco


# Each builder returns (args, call): args an ordered dict of the op's
# arguments, call(args) runs the op on them.


def _grads(gen):
    return [rnd(gen, 50), rnd(gen, 7, 3, dtype=BF16), rnd(gen, 4, 2, dtype=F16)]


def _unscale_like(opname):
    def build(gen):
        a = dict(grads=_grads(gen), found_inf=torch.zeros(1), inv_scale=torch.tensor([0.5]))
        fn = getattr(torch.ops.mixprec, opname)
        return a, lambda a: fn(a["grads"], a["found_inf"], a["inv_scale"])

    return build


for _n in ("unscale_", "unscale_norm_", "grad_norm"):
    OPS[_n] = (_n, _unscale_like(_n))


@op("update_scale_")
def _update_scale(gen):
    a = dict(scale=torch.tensor(4.0), growth_tracker=torch.tensor(3, dtype=I32), found_inf=torch.tensor(1.0),
             growth_factor=2.0, backoff_factor=0.5, growth_interval=10)
    return a, lambda a: torch.ops.mixprec.update_scale_(*a.values())


@op("update_scale_ex_")
def _update_scale_ex(gen):
    a = dict(scale=torch.tensor(4.0), growth_tracker=torch.tensor(3, dtype=I32),
             hysteresis_tracker=torch.tensor(2, dtype=I32), skipped_steps=torch.tensor(5, dtype=I64),
             found_inf=torch.tensor(1.0), growth_factor=2.0, backoff_factor=0.5, growth_interval=10,
             hysteresis=2, min_scale=1.0, max_scale=1e9)
    return a, lambda a: torch.ops.mixprec.update_scale_ex_(*a.values())


@op("update_scale_", "ops.update_scale_")
def _public_update_scale(gen):
    a = dict(scale=torch.tensor(4.0), growth_tracker=torch.tensor(3, dtype=I32), found_inf=torch.tensor(1.0),
             hysteresis_tracker=torch.tensor(2, dtype=I32), hysteresis=2)

    def call(a):
        mixprec.ops.update_scale_(a["scale"], a["growth_tracker"], a["found_inf"], 2.0, 0.5, 10,
                                  hysteresis_tracker=a["hysteresis_tracker"], hysteresis=a["hysteresis"])

    return a, call


def _nms_args(gen, with_idxs):
    n = 40
    a = dict(boxes=boxes_of(gen, n), scores=torch.rand(n, generator=gen))
    if with_idxs:
        a["idxs"] = torch.randint(0, 3, (n,), generator=gen)
    a["iou_threshold"] = 0.5
    a["score_threshold"] = None
    a["max_output"] = -1
    return a


@op("nms")
def _nms(gen):
    return _nms_args(gen, False), lambda a: torch.ops.mixprec.nms(*a.values())


@op("batched_nms")
def _batched_nms(gen):
    return _nms_args(gen, True), lambda a: torch.ops.mixprec.batched_nms(*a.values())


@op("nms_padded")
def _nms_padded(gen):
    return _nms_args(gen, True), lambda a: torch.ops.mixprec.nms_padded(*a.values())


# The public functions check before .contiguous().
@op("nms", "ops.nms")
def _public_nms(gen):
    a = _nms_args(gen, False)
    return a, lambda a: mixprec.ops.nms(a["boxes"], a["scores"], a["iou_threshold"],
                                        score_threshold=a["score_threshold"])


@op("batched_nms", "ops.batched_nms")
def _public_batched_nms(gen):
    a = _nms_args(gen, True)
    return a, lambda a: mixprec.ops.batched_nms(a["boxes"], a["scores"], a["idxs"], a["iou_threshold"],
                                                score_threshold=a["score_threshold"])


@op("nms_padded", "ops.nms_padded")
def _public_nms_padded(gen):
    a = _nms_args(gen, True)
    return a, lambda a: mixprec.ops.nms_padded(a["boxes"], a["scores"], a["iou_threshold"], a["idxs"],
                                               score_threshold=a["score_threshold"])


def _detect_args(gen):
    xy = torch.rand(2, 20, 2, generator=gen) * 100
    boxes = torch.cat([xy, xy + torch.rand(2, 20, 2, generator=gen) * 30 + 1], -1)
    return dict(boxes=boxes, scores=torch.rand(2, 20, 3, generator=gen), iou_threshold=0.5, score_threshold=None,
                max_detections=10, pre_nms_top_k=-1, class_agnostic=False)


@op("efficient_nms")
def _efficient_nms(gen):
    return _detect_args(gen), lambda a: torch.ops.mixprec.efficient_nms(*a.values())


@op("efficient_nms", "ops.efficient_nms")
def _public_efficient_nms(gen):
    return _detect_args(gen), lambda a: mixprec.ops.efficient_nms(
        a["boxes"], a["scores"], iou_threshold=a["iou_threshold"], score_threshold=a["score_threshold"],
        max_detections=a["max_detections"], pre_nms_top_k=a["pre_nms_top_k"], class_agnostic=a["class_agnostic"])


def _roi_args(gen):
    rois = torch.cat([torch.tensor([[0.0], [1.0], [1.0], [0.0]]), boxes_of(gen, 4) * 0.3], 1)
    return dict(input=rnd(gen, 2, 3, 24, 28, scale=1.0), rois=rois, spatial_scale=0.5, pooled_height=3,
                pooled_width=4, sampling_ratio=2, aligned=True)


@op("roi_align")
def _roi_align(gen):
    return _roi_args(gen), lambda a: torch.ops.mixprec.roi_align(*a.values())


@op("roi_align", "ops.roi_align")
def _public_roi_align(gen):
    return _roi_args(gen), lambda a: mixprec.ops.roi_align(
        a["input"], a["rois"], (a["pooled_height"], a["pooled_width"]), a["spatial_scale"], a["sampling_ratio"],
        a["aligned"])


@op("roi_align_backward")
def _roi_align_backward(gen):
    a = _roi_args(gen)
    b = dict(grad=rnd(gen, 4, 3, 3, 4, scale=1.0), rois=a["rois"], spatial_scale=0.5, pooled_height=3, pooled_width=4,
             batch_size=2, channels=3, height=24, width=28, sampling_ratio=2, aligned=True)
    return b, lambda b: torch.ops.mixprec.roi_align_backward(*b.values())


def _softmax_like(opname):
    def build(gen):
        a = dict(self=rnd(gen, 6, 9, dtype=BF16, scale=4.0), dim=1, dtype=None)
        fn = getattr(torch.ops.mixprec, opname)
        return a, lambda a: fn(*a.values())

    return build


def _softmax_backward_like(opname):
    def build(gen):
        y = torch.softmax(rnd(gen, 6, 9, scale=4.0), 1).to(F16)
        a = dict(grad_output=rnd(gen, 6, 9, dtype=F16, scale=1.0), output=y, dim=1, input_dtype=BF16)
        fn = getattr(torch.ops.mixprec, opname)
        return a, lambda a: fn(*a.values())

    return build


for _n in ("softmax", "log_softmax"):
    OPS[_n] = (_n, _softmax_like(_n))
for _n in ("softmax_backward", "log_softmax_backward"):
    OPS[_n] = (_n, _softmax_backward_like(_n))


def _ce_builders(name, inputs):
    """The raw op ``name`` and mixprec.ops.cross_entropy ("ops.<name>") on
    the same inputs; the public call takes the reduction as "mean" and an
    ignore_index (-100 where the raw op has none: soft targets)."""
    raw = getattr(torch.ops.mixprec, name)

    @op(name)
    def _raw(gen):
        return inputs(gen), lambda a: raw(*a.values())

    @op(name, "ops." + name)
    def _public(gen):
        a = inputs(gen)
        del a["reduction"]
        a.setdefault("ignore_index", -100)
        return a, lambda a: mixprec.ops.cross_entropy(a["self"], a["target"], a["weight"], a["ignore_index"],
                                                      "mean", a["label_smoothing"])


def _ce_inputs(gen):
    return dict(self=rnd(gen, 8, 5, 3, dtype=F16, scale=3.0), target=torch.randint(0, 5, (8, 3), generator=gen),
                weight=torch.rand(5, generator=gen) + 0.5, reduction=1, ignore_index=-100, label_smoothing=0.1)


_ce_builders("cross_entropy", _ce_inputs)


@op("cross_entropy_backward")
def _ce_backward(gen):
    f = _ce_inputs(gen)
    _loss, stats, wsum = torch.ops.mixprec.cross_entropy(*f.values())
    a = dict(grad_loss=torch.tensor(1.5), self=f["self"], target=f["target"], weight=f["weight"], stats=stats,
             weight_sum=wsum, reduction=1, ignore_index=-100, label_smoothing=0.1)
    return a, lambda a: torch.ops.mixprec.cross_entropy_backward(*a.values())


def _soft_inputs(gen):
    return dict(self=rnd(gen, 8, 5, 3, dtype=F16, scale=3.0),
                target=torch.softmax(torch.randn(8, 5, 3, generator=gen), 1),
                weight=torch.rand(5, generator=gen) + 0.5, reduction=1, label_smoothing=0.1)


_ce_builders("cross_entropy_soft", _soft_inputs)


@op("cross_entropy_soft_backward")
def _ce_soft_backward(gen):
    f = _soft_inputs(gen)
    _loss, stats = torch.ops.mixprec.cross_entropy_soft(*f.values())
    a = dict(grad_loss=torch.tensor(1.5), self=f["self"], target=f["target"], weight=f["weight"], stats=stats,
             reduction=1, label_smoothing=0.1, self_grad=True, target_grad=True)
    return a, lambda a: torch.ops.mixprec.cross_entropy_soft_backward(*a.values())


# ---- mutations -----------------------------------------------------------------


def _get(a, key):
    return a[key[0]][key[1]] if isinstance(key, tuple) else a[key]


def _set(a, key, v):
    if isinstance(key, tuple):
        a[key[0]][key[1]] = v
    else:
        a[key] = v


def _arg_name(key):
    return f"{key[0]}[{key[1]}]" if isinstance(key, tuple) else key


def put(key, make):
    """Replace one argument by make(old value, args, gen)."""
    def mutate(a, gen):
        _set(a, key, make(_get(a, key), a, gen))

    return mutate


CASES = []  # (op label, case id, mutate, words, absent)


def case(label, cid, mutate, *words, absent=()):
    name = OPS[label][0]
    CASES.append((label, cid, mutate, (f"mixprec::{name}",) + words, absent))


def tensor_cases(label, key, *, dtypes, meta=True, word=None):
    w = word or _arg_name(key)
    for dt in dtypes:
        case(label, f"{_arg_name(key)}-{str(dt).split('.')[-1]}", put(key, lambda t, a, g, dt=dt: t.to(dt)), w)
    if meta:
        case(label, f"{_arg_name(key)}-meta", put(key, lambda t, a, g: meta_like(t)), w, "meta")


def scalar_cases(label, key, bad_values, word=None):
    for v in bad_values:
        case(label, f"{key}={v!r}", put(key, lambda t, a, g, v=v: v), word or key)


# unscale_ / unscale_norm_ / grad_norm
for label in ("unscale_", "unscale_norm_", "grad_norm"):
    for i in range(3):
        tensor_cases(label, ("grads", i), dtypes=(F64, I32, I64, torch.uint8, torch.complex64))
    # Non-dense grads (g[:, ::2]) are taken, as torch's op takes them
    # (tests/python/amp/test_unscale_strided.py). grad_norm only reads: like
    # torch._foreach_norm it takes a grad twice, overlapping or expanded views.
    if label != "grad_norm":
        case(label, "grads[2]-expanded", put(("grads", 2), lambda t, a, g: rnd(g, 2, dtype=F16).expand(4, 2)),
             "grads[2]")
        case(label, "grads-same-tensor-twice", put(("grads", 2), lambda t, a, g: a["grads"][0]), "grads[0]",
             "grads[2]", "share memory")
        case(label, "grads-overlapping-views",
             lambda a, g: a.update(grads=[a["grads"][0][:30], a["grads"][0][20:]]), "grads[0]", "grads[1]",
             "share memory")
    case(label, "grads[0]-sparse", put(("grads", 0), lambda t, a, g: t.to_sparse()), "grads[0]", "strided")
    case(label, "grads-empty-list", put("grads", lambda t, a, g: []), "grads", "non-empty")
    case(label, "found_inf-inside-grad", put("found_inf", lambda t, a, g: a["grads"][0][7:8]), "grads[0]",
         "found_inf", "share memory")
    case(label, "inv_scale-is-found_inf", put("inv_scale", lambda t, a, g: a["found_inf"]), "found_inf",
         "inv_scale", "share memory")
    if label != "grad_norm":  # grad_norm writes found_inf only: inv_scale may lie in a grad
        case(label, "inv_scale-inside-grad", put("inv_scale", lambda t, a, g: a["grads"][0][3:4]), "grads[0]",
             "inv_scale", "share memory")
    for key in ("found_inf", "inv_scale"):
        tensor_cases(label, key, dtypes=(F64, F16, BF16, I32))
        case(label, f"{key}-two-elements", put(key, lambda t, a, g: torch.zeros(2)), key, "exactly one element")
        case(label, f"{key}-zero-size", put(key, lambda t, a, g: torch.zeros(0)), key, "exactly one element")
        case(label, f"{key}-sparse", put(key, lambda t, a, g: t.to_sparse()), key, "strided")

# update_scale_ / update_scale_ex_
for label in ("update_scale_", "update_scale_ex_"):
    keys = [("scale", F32), ("growth_tracker", I32), ("found_inf", F32)]
    if label == "update_scale_ex_":
        keys[2:2] = [("hysteresis_tracker", I32), ("skipped_steps", I64)]
    for key, good in keys:
        tensor_cases(label, key, dtypes=[d for d in (F64, F32, I32, I64) if d != good])
        case(label, f"{key}-two-elements", put(key, lambda t, a, g: t.new_zeros(2)), key, "exactly one element")
        case(label, f"{key}-zero-size", put(key, lambda t, a, g: t.new_zeros(0)), key, "exactly one element")
    case(label, "found_inf-is-scale", put("found_inf", lambda t, a, g: a["scale"]), "scale", "found_inf",
         "share memory")
    # torch._amp_update_scale_ refuses it too (a leaf that requires grad written in place).
    case(label, "scale-requires-grad", put("scale", lambda t, a, g: t.clone().requires_grad_()), "scale",
         "requires grad")
    if label == "update_scale_ex_":
        case(label, "hysteresis_tracker-is-growth_tracker", put("hysteresis_tracker", lambda t, a, g: a["growth_tracker"]),
             "growth_tracker", "hysteresis_tracker", "share memory")
        case(label, "skipped_steps-viewed-as-trackers",
             lambda a, g: (lambda b: a.update(growth_tracker=b[0], hysteresis_tracker=b[1]))(
                 a["skipped_steps"].view(1).view(I32)),
             "growth_tracker", "skipped_steps", "share memory")
        scalar_cases(label, "hysteresis", [0, -1, 2**31, 2**32 + 2, 2**62])
        scalar_cases(label, "min_scale", [-1.0, NAN, 2e9])
        scalar_cases(label, "max_scale", [NAN, 0.5], word="min_scale")
    scalar_cases(label, "growth_factor", [NAN, INF, -INF, 0.0, -2.0])
    scalar_cases(label, "backoff_factor", [NAN, INF, 0.0, -0.5])
    scalar_cases(label, "growth_interval", [0, -3, 2**31, 2**40])

case("ops.update_scale_", "hysteresis=2**32+2", put("hysteresis", lambda t, a, g: 2**32 + 2), "hysteresis")
case("ops.update_scale_", "hysteresis_tracker-meta", put("hysteresis_tracker", lambda t, a, g: meta_like(t)),
     "hysteresis_tracker", "meta")
case("ops.update_scale_", "hysteresis_tracker-is-growth_tracker",
     put("hysteresis_tracker", lambda t, a, g: a["growth_tracker"]), "hysteresis_tracker", "share memory")

# nms / batched_nms / nms_padded, through torch.ops and the public functions
for label in ("nms", "batched_nms", "nms_padded", "ops.nms", "ops.batched_nms", "ops.nms_padded"):
    public = label.startswith("ops.")
    idx = "idxs" in OPS[label][1](torch.Generator().manual_seed(0))[0]
    tensor_cases(label, "boxes", dtypes=(F64, I32, I64))
    tensor_cases(label, "scores", dtypes=(F64, I64))
    case(label, "boxes-shape-N3", put("boxes", lambda t, a, g: t[:, :3].contiguous()), "boxes", "(N, 4)")
    case(label, "boxes-shape-1d", put("boxes", lambda t, a, g: t.reshape(-1)), "boxes", "(N, 4)")
    case(label, "boxes-shape-3d", put("boxes", lambda t, a, g: t.reshape(4, 10, 4)), "boxes", "(N, 4)")
    case(label, "boxes-zero-size-N0", put("boxes", lambda t, a, g: t[:0]), "scores")
    case(label, "scores-short", put("scores", lambda t, a, g: t[:-1].clone()), "scores")
    case(label, "scores-2d", put("scores", lambda t, a, g: t.reshape(40, 1)), "scores")
    case(label, "scores-zero-size", put("scores", lambda t, a, g: t[:0]), "scores")
    case(label, "boxes-sparse", put("boxes", lambda t, a, g: t.to_sparse()), "boxes", "strided")
    case(label, "scores-sparse", put("scores", lambda t, a, g: t.to_sparse()), "scores", "strided")
    # 2^40 elements that take 16 bytes: .contiguous() before the check would
    # try to allocate 4 TiB.
    case(label, "boxes-expanded-2^40",
         lambda a, g: a.update(boxes=a["boxes"][:1].expand(2**38, 4), scores=a["scores"][:1].expand(2**38),
                               **({"idxs": a["idxs"][:1].expand(2**38)} if "idxs" in a else {})),
         "boxes", "2^31" if public else "contiguous")
    if not public:
        case(label, "boxes-strided", put("boxes", lambda t, a, g: torch.cat([t, t], 1)[:, ::2]), "boxes",
             "contiguous")
        case(label, "scores-strided", put("scores", lambda t, a, g: torch.stack([t, t], 1)[:, 0]), "scores",
             "contiguous")
    if idx:
        tensor_cases(label, "idxs", dtypes=(F32, torch.int16, torch.uint8))
        case(label, "idxs-short", put("idxs", lambda t, a, g: t[:-1].clone()), "idxs")
        case(label, "idxs-2d", put("idxs", lambda t, a, g: t.reshape(40, 1)), "idxs")
        case(label, "idxs-sparse", put("idxs", lambda t, a, g: t.to_sparse()), "idxs", "strided")
    scalar_cases(label, "iou_threshold", [NAN, -0.1, -INF])
    scalar_cases(label, "score_threshold", [NAN])

# efficient_nms (batched detection post-processing), torch.ops and the public function
for label in ("efficient_nms", "ops.efficient_nms"):
    tensor_cases(label, "boxes", dtypes=(F64, I32, I64))
    tensor_cases(label, "scores", dtypes=(F64, I64))
    case(label, "boxes-shape-BN3", put("boxes", lambda t, a, g: t[..., :3].contiguous()), "boxes", "(B, N, 4)")
    case(label, "boxes-shape-2d", put("boxes", lambda t, a, g: t.reshape(40, 4)), "boxes", "(B, N, 4)")
    case(label, "boxes-batch-mismatch", put("boxes", lambda t, a, g: t[:1].clone()), "boxes", "scores")
    case(label, "boxes-N-mismatch", put("boxes", lambda t, a, g: t[:, :19].clone()), "boxes", "scores")
    case(label, "class-boxes-C-mismatch", put("boxes", lambda t, a, g: t[:, :, None].expand(2, 20, 4, 4).contiguous()),
         "boxes", "scores")
    case(label, "scores-2d", put("scores", lambda t, a, g: t[0].clone()), "scores", "(B, N, C)")
    case(label, "scores-zero-size-N0", put("scores", lambda t, a, g: t[:, :0].clone()), "boxes", "scores")
    case(label, "boxes-sparse", put("boxes", lambda t, a, g: t.to_sparse()), "boxes", "strided")
    case(label, "scores-sparse", put("scores", lambda t, a, g: t.to_sparse()), "scores", "strided")
    # Strided boxes and scores are valid input (read in place; tests/python/efficient_nms/test_efficient_nms_layouts.py).
    scalar_cases(label, "iou_threshold", [NAN, -0.1, -INF])
    scalar_cases(label, "score_threshold", [NAN])
    scalar_cases(label, "max_detections", [0, -1, 2**31])
    scalar_cases(label, "pre_nms_top_k", [0])

# roi_align (torch.ops and public) and its backward
for label in ("roi_align", "ops.roi_align", "roi_align_backward"):
    bwd = label == "roi_align_backward"
    feat = "grad" if bwd else "input"
    tensor_cases(label, feat, dtypes=(F64, I32, I64))
    tensor_cases(label, "rois", dtypes=(F64, I32, I64))
    case(label, "rois-shape-K4", put("rois", lambda t, a, g: t[:, :4].contiguous()), "rois", "(K, 5)")
    case(label, "rois-shape-1d", put("rois", lambda t, a, g: t.reshape(-1)), "rois", "(K, 5)")
    case(label, "rois-shape-3d", put("rois", lambda t, a, g: t.reshape(2, 2, 5)), "rois", "(K, 5)")
    case(label, f"{feat}-sparse", put(feat, lambda t, a, g: t.to_sparse()), feat, "strided")
    case(label, "rois-sparse", put("rois", lambda t, a, g: t.to_sparse()), "rois", "strided")
    for v in (2.0, -1.0, NAN, 1e9):
        case(label, f"rois-batch-index={v!r}",
             put("rois", lambda t, a, g, v=v: torch.cat([t[:2], torch.tensor([[v, 1.0, 1.0, 9.0, 9.0]]), t[3:]])),
             "rois[2, 0]", "batch index")
    scalar_cases(label, "pooled_height", [-1, 2**31], word="output_size")
    scalar_cases(label, "pooled_width", [-3], word="output_size")
    scalar_cases(label, "sampling_ratio", [2**31, 2**40])
    scalar_cases(label, "spatial_scale", [NAN, INF, -INF, 1e300])
    if bwd:
        case(label, "grad-shape", put("grad", lambda t, a, g: t[:, :, :2].contiguous()), "grad", "shape")
        case(label, "grad-3d", put("grad", lambda t, a, g: t[0]), "grad", "shape")
        scalar_cases(label, "batch_size", [-1])
        scalar_cases(label, "height", [-2], word="height")
        case(label, "empty-map", lambda a, g: a.update(height=0), "empty feature map")
    else:
        case(label, "input-3d", put("input", lambda t, a, g: t[0]), "input", "(N, C, H, W)")
        case(label, "input-empty-map", put("input", lambda t, a, g: t[:, :, :0]), "empty feature map", "height")
        case(label, "input-batch-0", put("input", lambda t, a, g: t[:0]), "rois[0, 0]", "batch index")

# softmax / log_softmax and their backward
for label in ("softmax", "log_softmax"):
    tensor_cases(label, "self", dtypes=(F64, I32, I64, torch.complex64), meta=False)
    case(label, "self-sparse", put("self", lambda t, a, g: t.float().to_sparse()), "self")
    scalar_cases(label, "dim", [2, -3, 100])
    scalar_cases(label, "dtype", [F64, I32, I64])
    case(label, "self-0dim-dim1", lambda a, g: a.update(self=a["self"][0, 0], dim=1), "dim")
for label in ("softmax_backward", "log_softmax_backward"):
    tensor_cases(label, "grad_output", dtypes=(F64, F32, BF16, I32))
    tensor_cases(label, "output", dtypes=(F64, I32))
    case(label, "grad_output-shape", put("grad_output", lambda t, a, g: t[:, :8].contiguous()), "grad_output")
    case(label, "grad_output-transposed-shape", put("grad_output", lambda t, a, g: t.t().contiguous()), "grad_output")
    case(label, "grad_output-zero-size", put("grad_output", lambda t, a, g: t[:0]), "grad_output")
    scalar_cases(label, "dim", [2, -3])
    scalar_cases(label, "input_dtype", [F64, I32])

# cross_entropy (torch.ops and public) and its backward
for label in ("cross_entropy", "ops.cross_entropy", "cross_entropy_backward"):
    tensor_cases(label, "self", dtypes=(F64, I32, I64), meta=label != "ops.cross_entropy")
    tensor_cases(label, "target", dtypes=(I32, torch.uint8, torch.int16), meta=True)
    # A probability target of self's shape is valid for the public function
    # (it goes to cross_entropy_soft); of another shape it is refused.
    for dt in (F32, F16):
        shape = (8, 5, 3) if label != "ops.cross_entropy" else (8, 4, 3)
        case(label, f"target-{dt}-probabilities", put("target", lambda t, a, g, dt=dt, shape=shape: torch.softmax(
            torch.randn(*shape, generator=g), 1).to(dt)), "target", "class-probability")
    case(label, "target-shape", put("target", lambda t, a, g: t[:, :2].contiguous()), "target", "shape")
    case(label, "target-zero-size", put("target", lambda t, a, g: t[:0]), "target", "shape")
    case(label, "target-out-of-range", put("target", lambda t, a, g: t.clone().index_fill_(1, torch.tensor([1]), 5)),
         "target", "out of range")
    case(label, "self-0dim", put("self", lambda t, a, g: t[0, 0, 0]), "self")
    case(label, "self-zero-classes", lambda a, g: a.update(self=a["self"][:, :0], weight=a["weight"][:0]),
         "self", "0 classes")
    if label != "ops.cross_entropy":  # the public function converts weight to float32
        tensor_cases(label, "weight", dtypes=(F64, F16, I64))
    else:
        case(label, "weight-meta", put("weight", lambda t, a, g: meta_like(t)), "weight", "meta")
    case(label, "weight-shape", put("weight", lambda t, a, g: t[:4].contiguous()), "weight", "shape")
    case(label, "weight-2d", put("weight", lambda t, a, g: t.reshape(1, 5)), "weight", "shape")
    scalar_cases(label, "label_smoothing", [NAN, INF, -0.1, 1.5])
    if label != "ops.cross_entropy":
        scalar_cases(label, "reduction", [3, -1])
for cid, key, make, words in [
    ("grad_loss-float64", "grad_loss", lambda t, a, g: t.double(), ("grad_loss",)),
    ("grad_loss-float16", "grad_loss", lambda t, a, g: t.half(), ("grad_loss",)),
    ("grad_loss-meta", "grad_loss", lambda t, a, g: meta_like(t), ("grad_loss", "meta")),
    ("grad_loss-two-elements", "grad_loss", lambda t, a, g: t.repeat(2), ("grad_loss",)),
    ("stats-meta", "stats", lambda t, a, g: meta_like(t), ("stats", "meta")),
    ("stats-shape", "stats", lambda t, a, g: t[:, :4].contiguous(), ("stats",)),
    ("stats-float16", "stats", lambda t, a, g: t.half(), ("stats",)),
    ("weight_sum-meta", "weight_sum", lambda t, a, g: meta_like(t), ("weight_sum", "meta")),
    ("weight_sum-two-elements", "weight_sum", lambda t, a, g: t.repeat(2), ("weight_sum",)),
    ("weight_sum-zero-size", "weight_sum", lambda t, a, g: t.reshape(1)[:0], ("weight_sum",)),
    ("weight_sum-int64", "weight_sum", lambda t, a, g: t.long(), ("weight_sum",)),
]:
    case("cross_entropy_backward", cid, put(key, make), *words)
case("ops.cross_entropy", "target-int32-not-class-probabilities", put("target", lambda t, a, g: t.int()),
     "target", "int32", absent=("class-probability",))
case("cross_entropy", "target-int32-not-class-probabilities", put("target", lambda t, a, g: t.int()),
     "target", "int32", absent=("class-probability",))

# cross_entropy_soft (torch.ops and the public function) and its backward
for label in ("cross_entropy_soft", "ops.cross_entropy_soft", "cross_entropy_soft_backward"):
    public = label.startswith("ops.")
    tensor_cases(label, "self", dtypes=(F64, I32, I64), meta=not public)
    # The public function takes a float64 target as float32.
    tensor_cases(label, "target", dtypes=(I64, I32, torch.uint8) + (() if public else (F64,)), meta=True)
    case(label, "target-int64-names-class-indices", put("target", lambda t, a, g: t.long()), "target",
         "class probabilities", "int64")
    case(label, "target-sparse", put("target", lambda t, a, g: t.to_sparse()), "target", "strided")
    if not public:  # another shape is a class-index target to the public function
        case(label, "target-shape", put("target", lambda t, a, g: t[:, :4].contiguous()), "target", "shape")
        case(label, "target-zero-size", put("target", lambda t, a, g: t[:0]), "target", "shape")
        case(label, "self-0dim", lambda a, g: a.update(self=a["self"][0, 0, 0], target=a["target"][0, 0, 0]),
             "self")
        tensor_cases(label, "weight", dtypes=(F64, F16, I64))
        scalar_cases(label, "reduction", [3, -1])
    else:
        case(label, "weight-meta", put("weight", lambda t, a, g: meta_like(t)), "weight", "meta")
        scalar_cases(label, "ignore_index", [0, 3])  # any negative value is accepted, as torch
    case(label, "self-zero-classes", lambda a, g: a.update(self=a["self"][:, :0], target=a["target"][:, :0],
                                                           weight=a["weight"][:0]), "self", "0 classes")
    case(label, "weight-shape", put("weight", lambda t, a, g: t[:4].contiguous()), "weight", "shape")
    case(label, "weight-2d", put("weight", lambda t, a, g: t.reshape(1, 5)), "weight", "shape")
    scalar_cases(label, "label_smoothing", [NAN, INF, -0.1, 1.5])
for cid, key, make, words in [
    ("grad_loss-float64", "grad_loss", lambda t, a, g: t.double(), ("grad_loss",)),
    ("grad_loss-bfloat16", "grad_loss", lambda t, a, g: t.bfloat16(), ("grad_loss",)),
    ("grad_loss-meta", "grad_loss", lambda t, a, g: meta_like(t), ("grad_loss", "meta")),
    ("grad_loss-two-elements", "grad_loss", lambda t, a, g: t.repeat(2), ("grad_loss",)),
    ("stats-meta", "stats", lambda t, a, g: meta_like(t), ("stats", "meta")),
    ("stats-shape", "stats", lambda t, a, g: t[:2].contiguous(), ("stats",)),
    ("stats-float16", "stats", lambda t, a, g: t.half(), ("stats",)),
    ("stats-of-class-index-op", "stats", lambda t, a, g: t[:2].contiguous(), ("stats", "cross_entropy_soft")),
]:
    case("cross_entropy_soft_backward", cid, put(key, make), *words)


# ---- the checks ------------------------------------------------------------------


def _tensors(a):
    for v in a.values():
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from (t for t in v if isinstance(t, torch.Tensor))


def _storage_bytes(t):
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage()).clone()


def _snapshot(a):
    """(tensor, bytes of its whole storage) for every non-meta input: the
    comparison covers views, expanded tensors (their small base) and NaNs."""
    snap = []
    for t in _tensors(a):
        if t.device.type == "meta":
            continue
        parts = [t._indices(), t._values()] if t.is_sparse else [t]
        snap += [(p, _storage_bytes(p)) for p in parts]
    return snap


def _assert_unchanged(snap):
    for t, before in snap:
        assert torch.equal(_storage_bytes(t), before), "an input was modified by a call that raised"


def _valid_result(gen):
    """A valid unscale_ + update_scale_ + softmax + nms after the bad calls."""
    g = [torch.tensor([2.0, -4.0]), torch.tensor([8.0], dtype=BF16)]
    fi = torch.zeros(1)
    torch.ops.mixprec.unscale_(g, fi, torch.tensor([0.25]))
    assert g[0].tolist() == [0.5, -1.0] and g[1].item() == 2.0 and fi.item() == 0.0
    s, tr = torch.tensor(8.0), torch.tensor(0, dtype=I32)
    torch.ops.mixprec.update_scale_(s, tr, torch.tensor(1.0), 2.0, 0.5, 10)
    assert s.item() == 4.0
    x = rnd(gen, 3, 5, scale=3.0)
    torch.testing.assert_close(mixprec.ops.softmax(x, 1), torch.softmax(x, 1))
    b = torch.tensor([[0.0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60]])
    assert mixprec.ops.nms(b, torch.tensor([0.9, 0.8, 0.7]), 0.5).tolist() == [0, 2]


def test_case_count():
    """The matrix's size, for the report (and so a refactor cannot drop most
    of it silently)."""
    assert len(CASES) >= 400, len(CASES)


@pytest.mark.parametrize("label", sorted(OPS))
def test_valid_call_of_every_op(label, gen):
    """The base call of each op is valid, so every case below fails only for
    its one bad argument; the same call with every tensor on meta (what
    torch.compile's FakeTensor tracing relies on) works too."""
    a, call = OPS[label][1](gen)
    call(a)
    if label.startswith("ops.") or label in ("cross_entropy_backward", "nms", "batched_nms"):
        return  # public wrappers / data-dependent output sizes: covered by test_compile.py
    m = {k: ([meta_like(t) for t in v] if isinstance(v, list) else meta_like(v) if isinstance(v, torch.Tensor) else v)
         for k, v in a.items()}
    call(m)


@pytest.mark.parametrize(
    "label,mutate,words,absent",
    [pytest.param(label, mutate, words, absent, id=f"{label}-{cid}") for label, cid, mutate, words, absent in CASES],
)
def test_bad_input(label, mutate, words, absent, gen):
    a, call = OPS[label][1](gen)
    mutate(a, gen)
    snap = _snapshot(a)
    with pytest.raises(RuntimeError) as info:
        call(a)
    msg = str(info.value)
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    for w in absent:
        assert w not in msg, f"{w!r} in {msg!r}"
    # No C++ location (STD_TORCH_CHECK's "func, /path/file.h:123, ").
    for w in (".h:", ".cpp:", ".cc:", ".cu:", "shim/", "c_ops/"):
        assert w not in msg, f"{w!r} in {msg!r}"
    _assert_unchanged(snap)
    _valid_result(gen)


def test_in_place_ops_bump_version_counters(gen):
    """What an in-place op writes gets a new version, as with torch's own
    in-place ops, called directly through torch.ops."""
    g = _grads(gen)
    fi, inv = torch.zeros(1), torch.tensor([0.5])
    for fn in (torch.ops.mixprec.unscale_, torch.ops.mixprec.unscale_norm_, torch.ops.mixprec.grad_norm):
        before = [t._version for t in g] + [fi._version, inv._version]
        fn(g, fi, inv)
        after = [t._version for t in g] + [fi._version, inv._version]
        grads_written = fn is not torch.ops.mixprec.grad_norm
        want = [v + grads_written for v in before[:3]] + [before[3] + 1, before[4]]
        assert after == want, (fn, before, after)
    s, tr, hy, sk = (torch.tensor(4.0), torch.tensor(0, dtype=I32), torch.tensor(1, dtype=I32),
                     torch.tensor(0, dtype=I64))
    torch.ops.mixprec.update_scale_(s, tr, fi, 2.0, 0.5, 10)
    assert (s._version, tr._version, fi._version) == (1, 1, 3)
    torch.ops.mixprec.update_scale_ex_(s, tr, hy, sk, fi, 2.0, 0.5, 10, 1, 0.0, INF)
    assert (s._version, tr._version, hy._version, sk._version, fi._version) == (2, 2, 1, 1, 3)


def test_version_bump_is_seen_by_autograd(gen):
    """A tensor saved for backward and then unscaled in place: backward
    refuses, as it would after torch's own in-place op."""
    w = torch.randn(4, generator=gen, requires_grad=True)
    g = torch.randn(4, generator=gen)
    y = (w * g).sum()  # saves g
    torch.ops.mixprec.unscale_([g], torch.zeros(1), torch.tensor([0.5]))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_version_bump_under_compile(backend, gen):
    torch._dynamo.reset()

    @torch.compile(backend=backend, fullgraph=True)
    def step(g, fi, inv, s, tr):
        torch.ops.mixprec.unscale_(g, fi, inv)
        torch.ops.mixprec.update_scale_(s, tr, fi, 2.0, 0.5, 10)

    g = _grads(gen)
    ref = [t.clone() for t in g]
    fi, inv, s, tr = torch.zeros(1), torch.tensor([0.5]), torch.tensor(4.0), torch.tensor(0, dtype=I32)
    step(g, fi, inv, s, tr)
    for t in g + [fi, s, tr]:
        assert t._version >= 1
    for r, t in zip(ref, g):
        assert torch.equal(t, (r.float() * 0.5).to(r.dtype))
    assert tr.item() == 1


def test_mixed_meta_never_runs_as_valid():
    """The two symptoms of the issue: update_scale_ with a meta found_inf did
    not back off, cross_entropy with a meta target returned garbage."""
    s, tr = torch.tensor(4.0), torch.tensor(3, dtype=I32)
    with pytest.raises(RuntimeError, match=r"mixprec::update_scale_: found_inf is on meta"):
        torch.ops.mixprec.update_scale_(s, tr, torch.tensor(1.0, device="meta"), 2.0, 0.5, 10)
    assert s.item() == 4.0 and tr.item() == 3
    with pytest.raises(RuntimeError, match=r"mixprec::cross_entropy: target is on meta"):
        torch.ops.mixprec.cross_entropy(torch.randn(4, 3), torch.zeros(4, dtype=I64, device="meta"), None, 1,
                                        -100, 0.0)
    assert math.isfinite(mixprec.ops.cross_entropy(torch.randn(4, 3), torch.zeros(4, dtype=I64)).item())


# ---- argument conversion of the public Python API (issue 23) -------------------
#
# Every number argument of the public functions, classes and nn modules, one
# bad value at a time on an otherwise valid call: NaN, inf where it means
# nothing, a non-integral float or a string or a list for an integer, a bool
# for a number. Each must raise TypeError, ValueError or RuntimeError naming
# the argument (see [note: argument conversion] in mixprec/_args.py), leave
# every input bitwise unchanged, and the valid call must still work. The
# optimizers' own arguments are covered in tests/python/optim/.

INT_BAD = [NAN, INF, -INF, 2.5, True, "3", [3]]
FLOAT_BAD = [NAN, True, "0.5", [0.5]]
FINITE_BAD = FLOAT_BAD + [INF, -INF]
# An NMS iou_threshold of inf suppresses nothing, as torchvision's: valid.
IOU_BAD = FLOAT_BAD + [-INF]

API = {}  # label -> builder(gen) -> (arguments dict, call(arguments), tensors to snapshot)
API_CASES = []  # (label, argument, bad value, word expected in the message)


def api(label, *specs):
    """specs: (argument, bad values[, word the message must name])."""
    def deco(fn):
        API[label] = fn
        for spec in specs:
            arg, bad = spec[0], spec[1]
            for v in bad:
                API_CASES.append((label, arg, v, spec[2] if len(spec) > 2 else arg))
        return fn

    return deco


def _scaled_model(gen, dtype=BF16):
    torch.manual_seed(int(torch.randint(0, 2**30, (1,), generator=gen)))
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).to(dtype)
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = mixprec.amp.GradScaler("cpu", init_scale=2.0**8)
    x = torch.randn(5, 6, generator=gen).to(dtype)
    loss = torch.nn.functional.cross_entropy(model(x).float(), torch.randint(0, 3, (5,), generator=gen))
    return model, opt, scaler, loss


def _params_and_grads(model):
    return [p for p in model.parameters()] + [p.grad for p in model.parameters() if p.grad is not None]


@api("amp.GradScaler", ("init_scale", FINITE_BAD + [0.0, -1.0]), ("growth_factor", FINITE_BAD),
     ("backoff_factor", FINITE_BAD + [0.0]), ("growth_interval", INT_BAD + [0, 2**31]),
     ("hysteresis", INT_BAD + [0]), ("min_scale", FINITE_BAD + [-1.0]), ("max_scale", FLOAT_BAD))
def _api_scaler(gen):
    a = dict(init_scale=1024.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=3, hysteresis=2,
             min_scale=1.0, max_scale=2.0**20)

    def call(a):
        s = mixprec.amp.GradScaler("cpu", **a)
        model, opt, _, loss = _scaled_model(gen)
        s.scale(loss).backward()
        s.step(opt)
        s.update()
        assert s.get_scale() == 1024.0

    return a, call, []


@api("amp.GradScaler.update", ("new_scale", FINITE_BAD + [0.0, -2.0]))
def _api_scaler_update(gen):
    model, opt, scaler, loss = _scaled_model(gen)
    scaler.scale(loss).backward()
    scaler.step(opt)

    def call(a):
        scaler.update(a["new_scale"])
        assert scaler.get_scale() == 64.0

    return dict(new_scale=64.0), call, [scaler._scale, scaler._growth_tracker]


@api("amp.GradScaler.clip_grad_norm_", ("max_norm", FLOAT_BAD + [-1.0]), ("norm_type", [NAN, True, [2.0], "two"]))
def _api_clip(gen):
    model, opt, scaler, loss = _scaled_model(gen)
    scaler.scale(loss).backward()

    def call(a):
        norm = scaler.clip_grad_norm_(opt, a["max_norm"], a["norm_type"])
        assert torch.isfinite(norm)

    return dict(max_norm=0.5, norm_type=2.0), call, _params_and_grads(model)


@api("amp.GradScaler.clip_grad_norm_(parameters)", ("max_norm", FLOAT_BAD + [-1.0]),
     ("norm_type", [NAN, True, [2.0], "two"]))
def _api_clip_params(gen):
    model, opt, scaler, loss = _scaled_model(gen)
    scaler.scale(loss).backward()

    def call(a):
        norm = scaler.clip_grad_norm_(model.parameters(), a["max_norm"], a["norm_type"])
        assert torch.isfinite(norm)

    return dict(max_norm=0.5, norm_type=2.0), call, _params_and_grads(model)


@api("amp.backward_and_step", ("max_norm", FLOAT_BAD + [-1.0]), ("set_to_none", [1, "yes"]), ("fold", [0, None]))
def _api_backward_and_step(gen):
    model, opt, scaler, loss = _scaled_model(gen)
    for p in model.parameters():  # grads a backward would add into
        p.grad = torch.randn(p.shape, generator=gen).to(p.dtype)

    def call(a):
        mixprec.amp.backward_and_step(loss, opt, scaler, **a)

    return dict(max_norm=1.0, set_to_none=True, fold=True), call, _params_and_grads(model)


@api("ops.update_scale_", ("growth_factor", FINITE_BAD), ("backoff_factor", FINITE_BAD),
     ("growth_interval", INT_BAD), ("hysteresis", INT_BAD), ("min_scale", FINITE_BAD), ("max_scale", FLOAT_BAD))
def _api_update_scale(gen):
    t = dict(scale=torch.tensor(4.0), growth_tracker=torch.tensor(3, dtype=I32), found_inf=torch.tensor(1.0),
             hysteresis_tracker=torch.tensor(1, dtype=I32))
    a = dict(growth_factor=2.0, backoff_factor=0.5, growth_interval=10, hysteresis=1, min_scale=1.0, max_scale=1e9)

    def call(a):
        mixprec.ops.update_scale_(t["scale"], t["growth_tracker"], t["found_inf"], a["growth_factor"],
                                  a["backoff_factor"], a["growth_interval"], hysteresis_tracker=t["hysteresis_tracker"],
                                  hysteresis=a["hysteresis"], min_scale=a["min_scale"], max_scale=a["max_scale"])

    return a, call, list(t.values())


def _nms_api(name, with_idxs):
    def build(gen):
        n = 30
        t = dict(boxes=boxes_of(gen, n), scores=torch.rand(n, generator=gen), idxs=torch.randint(0, 3, (n,), generator=gen))
        fn = getattr(mixprec.ops, name)

        def call(a):
            if name == "nms":
                fn(t["boxes"], t["scores"], a["iou_threshold"], score_threshold=a["score_threshold"],
                   max_output=a["max_output"])
            elif name == "batched_nms":
                fn(t["boxes"], t["scores"], t["idxs"], a["iou_threshold"], score_threshold=a["score_threshold"],
                   max_output=a["max_output"])
            else:
                fn(t["boxes"], t["scores"], a["iou_threshold"], t["idxs"], score_threshold=a["score_threshold"],
                   max_output=a["max_output"])

        return dict(iou_threshold=0.5, score_threshold=0.1, max_output=5), call, list(t.values())

    return build


for _n in ("nms", "batched_nms", "nms_padded"):
    api(f"ops.{_n}", ("iou_threshold", IOU_BAD), ("score_threshold", FLOAT_BAD), ("max_output", INT_BAD))(
        _nms_api(_n, _n != "nms"))


@api("ops.efficient_nms", ("iou_threshold", IOU_BAD), ("score_threshold", FLOAT_BAD),
     ("max_detections", INT_BAD), ("pre_nms_top_k", INT_BAD))
def _api_efficient_nms(gen):
    t = _detect_args(gen)

    def call(a):
        mixprec.ops.efficient_nms(t["boxes"], t["scores"], **a)

    return (dict(iou_threshold=0.5, score_threshold=0.1, max_detections=10, pre_nms_top_k=15), call,
            [t["boxes"], t["scores"]])


def _roi_api(module):
    def build(gen):
        t = _roi_args(gen)

        def call(a):
            if module:
                m = mixprec.ops.RoIAlign(a["output_size"], a["spatial_scale"], a["sampling_ratio"])
                m(t["input"], t["rois"])
            else:
                mixprec.ops.roi_align(t["input"], t["rois"], a["output_size"], a["spatial_scale"], a["sampling_ratio"])

        return dict(output_size=(3, 4), spatial_scale=0.5, sampling_ratio=2), call, [t["input"], t["rois"]]

    return build


for _label, _module in (("ops.roi_align", False), ("ops.RoIAlign", True)):
    # output_size takes a pair too: a list is not a bad value there.
    api(_label, ("output_size", [v for v in INT_BAD if not isinstance(v, list)] + [(3, 2.5), (NAN, 4), (3, True)]),
        ("spatial_scale", FINITE_BAD),
        ("sampling_ratio", INT_BAD))(_roi_api(_module))


def _softmax_api(name, module):
    def build(gen):
        x = rnd(gen, 4, 7, dtype=BF16, scale=3.0)

        def call(a):
            if module:
                getattr(mixprec.nn, name)(a["dim"])(x)
            else:
                getattr(mixprec.ops, {"Softmax": "softmax", "LogSoftmax": "log_softmax"}[name])(x, a["dim"])

        return dict(dim=1), call, [x]

    return build


for _n, _f in (("Softmax", "softmax"), ("LogSoftmax", "log_softmax")):
    api(f"ops.{_f}", ("dim", INT_BAD))(_softmax_api(_n, False))
    api(f"nn.{_n}", ("dim", INT_BAD))(_softmax_api(_n, True))


def _ce_api(module):
    def build(gen):
        t = dict(input=rnd(gen, 6, 5, dtype=F16, scale=3.0), target=torch.randint(0, 5, (6,), generator=gen))

        def call(a):
            if module:
                mixprec.nn.CrossEntropyLoss(**a)(t["input"], t["target"])
            else:
                mixprec.ops.cross_entropy(t["input"], t["target"], **a)

        return dict(ignore_index=-100, label_smoothing=0.1), call, list(t.values())

    return build


for _label, _module in (("ops.cross_entropy", False), ("nn.CrossEntropyLoss", True)):
    api(_label, ("ignore_index", INT_BAD), ("label_smoothing", FINITE_BAD))(_ce_api(_module))


_BOOL_ARGS = {"fold", "set_to_none", "error_if_nonfinite", "foreach", "aligned", "class_agnostic"}


def _conversion_error(v, arg=None):
    """[note: argument conversion]: TypeError for a value of the wrong kind
    (a bool, a str, a list, a non-integral float for an integer, anything but
    a bool for a flag), ValueError for a number out of range (NaN, inf, below
    a bound)."""
    if arg in _BOOL_ARGS:
        return TypeError
    if isinstance(v, (tuple, list)) and any(_conversion_error(x) is TypeError for x in v):
        return TypeError
    if isinstance(v, (bool, str, list)) or v == 2.5:
        return TypeError
    return ValueError


def _api_param(label, arg, v, word):
    return pytest.param(label, arg, v, word, id=f"{label}-{arg}={v!r}")


@pytest.mark.parametrize("label", sorted(API))
def test_api_valid_call(label, gen):
    a, call, _ = API[label](gen)
    call(a)


@pytest.mark.parametrize(
    "label,arg,value,word",
    [_api_param(label, arg, v, word) for label, arg, v, word in API_CASES],
)
def test_api_argument_conversion(label, arg, value, word, gen):
    a, call, tensors = API[label](gen)
    a[arg] = value
    snap = [(t, _storage_bytes(t)) for t in tensors]
    with pytest.raises((TypeError, ValueError, RuntimeError)) as info:
        call(a)
    assert word in str(info.value), f"{word!r} not in {info.value!r}"
    if not isinstance(info.value, RuntimeError):  # the op's own check may answer first (NaN left to it)
        assert type(info.value) is _conversion_error(value, arg), f"{value!r}: {info.value!r}"
    _assert_unchanged(snap)
    _valid_result(gen)


def test_api_case_count():
    assert len(API_CASES) >= 250, len(API_CASES)
