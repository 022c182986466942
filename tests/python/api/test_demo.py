"""The README's main command: the demo (examples/train_amp.py), in its quick
mode: training parity, the loss-curve PNG, the memory columns, and the
detection part (mixprec's NMS equals the float64 reference in FP16/BF16
where torchvision's algorithm in those dtypes keeps wrong boxes)."""

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
import train_amp  # noqa: E402

from _op_tester import SECOND_TORCH  # noqa: E402


def test_demo_quick_mode(capsys, tmp_path):
    plot = tmp_path / "curves.png"
    out_dict = train_amp.main(["--quick", "--plot", str(plot)])
    out = capsys.readouterr().out
    results = out_dict["train"]
    assert [r["mode"] for r in results] == ["fp32", "bf16", "bf16-sr", "fp16", "bf16-rem", "bf16-rem-bf16",
                                           "bf16-rem-8bit", "bf16-act8", "bf16-act8-1.5x"]
    base = results[0]["acc"]
    assert base > 0.85, out
    for r in results[1:]:
        # Two epochs are noisy; the full run's parity is what the README shows.
        assert abs(r["acc"] - base) < 0.03, out
        assert r["scale"] is not None and r["scale"] > 0
        # The 1.5x-batch run sees the same epochs in 2/3 of the steps (96 of the 1437 images a step).
        steps = len(results[0]["losses"]) if r["batch"] == 64 else 2 * ((1437 + 95) // 96)
        assert len(r["losses"]) == steps, (r["mode"], r["batch"])
        # Non-finite steps: FP16's overflowing (skipped) steps only; every loss finite.
        assert r["nonfinite"] == r["skipped"] and (r["skipped"] == 0 or r["mode"] == "fp16"), out
        # Half activations: well below FP32's.
        assert r["act_mb"] < 0.75 * results[0]["act_mb"], out
    by = {r["mode"]: r for r in results}
    assert results[0]["nonfinite"] == 0 and by["bf16-act8-1.5x"]["batch"] == 96
    assert "non-fin." in out and "bf16-act8-1.5x (batch 96: 8-bit activations + lean state" in out, out
    # Same bytes with FP32 masters; a quarter less without them.
    assert abs(by["bf16"]["state_mb"] - by["fp32"]["state_mb"]) < 1e-6
    assert abs(by["bf16-sr"]["state_mb"] / by["fp32"]["state_mb"] - 0.75) < 1e-3
    # The lean optimizer-state modes, per parameter: 14, 10 and ~8 bytes of
    # FP32's 16 (the 8-bit moments' block scales add 8 bytes per 256).
    assert abs(by["bf16-rem"]["state_mb"] / by["fp32"]["state_mb"] - 14 / 16) < 1e-3
    assert abs(by["bf16-rem-bf16"]["state_mb"] / by["fp32"]["state_mb"] - 10 / 16) < 1e-3
    assert 8 / 16 <= by["bf16-rem-8bit"]["state_mb"] / by["fp32"]["state_mb"] < 8.1 / 16
    # 8-bit activations: the packed ones take about half of BF16's bytes.
    assert by["bf16-act8"]["act_mb"] < 0.7 * by["bf16"]["act_mb"], out
    # Part 3: the planner's table for the demo CNN: 8-bit activations hold less
    # after the forward, the lean state fits a larger batch in AMP BF16's
    # batch-64 budget. (The CNN is 3 layers: its backward's per-layer buffers,
    # not what it saved, make its peak; ResNet-50's table, full mode, shows the
    # peak falling too.)
    cnn = {r.recipe.name: r for r in out_dict["memory"]["cnn"]}
    assert cnn["amp-bf16 + 8-bit act"].saved_per_sample < 0.6 * cnn["amp-bf16"].saved_per_sample, out
    assert cnn["amp-bf16 + 8-bit act + lean state"].largest_batch > cnn["amp-bf16"].largest_batch, out
    assert "Part 3: activation memory" in out and "| amp-bf16 + 4-bit act |" in out
    # The FP16 run's health record (GradScaler(named_parameters=...)): one entry
    # per step, its skips the scaler's count; printed as a summary.
    h = by["fp16"]["health"]
    assert h.steps == len(by["fp16"]["losses"]) and h.skipped_steps == by["fp16"]["skipped"]
    assert h.scale[0] == 65536.0 and all(n > 0 for n, sk in zip(h.grad_norm, h.skipped) if not sk)
    assert "fp16 (seed 0)" in out and "training health over" in out
    assert len(by["fp32"]["grad_norms"]) == len(by["fp32"]["losses"])
    assert "vs fp32" in out and "parity" in out
    # A valid PNG, of a sensible size.
    data = plot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert str(plot.resolve()) in out
    # Part 1b: an FP16 forward overflow stalls plain AMP (every step skipped);
    # the guard names the layer, falls back to FP32 and tracks the FP32 run.
    plain, guarded = out_dict["overflow"]["plain"], out_dict["overflow"]["guard"]
    assert len(plain.recipe.skipped) == len(plain.recipe.losses), out
    assert guarded.fallbacks and "attn" in guarded.fallbacks[0], out
    assert len(guarded.recipe.skipped) <= 2 and guarded.final_rel_gap < 0.02, out
    assert "Forward overflow, with mixprec.guard" in out
    # Detection: mixprec exact, torchvision's algorithm in FP16 wrong.
    rows = {(d, m): (kept, extra, missed) for d, m, kept, extra, missed, _, _ in out_dict["detection"]}
    for dt in ("fp16", "bf16"):
        assert rows[(dt, "mixprec")][1:] == (0, 0), out
    assert rows[("fp16", "torchvision-style")][1] > 0, out
    # Batched post-processing: one efficient_nms call, the loop's detections;
    # the BF16 Faster R-CNN forward runs end to end under the patch.
    batched = out_dict["detection_batched"]
    assert batched["same"] in (True, None) and min(batched["counts"]) > 0, out
    if out_dict["detector"] is not None:
        assert out_dict["detector"]["detections"] and "torchvision + mixprec patch" in out, out


# Minutes of training on the kernels the first run tested; the second torch's
# run (the same binary) keeps the quick mode above, which loads and runs all
# of the same ops end to end.
@pytest.mark.skipif(SECOND_TORCH, reason="the same binary's parity was checked on the first torch (scripts/test.sh)")
def test_demo_full_mode_parity(capsys, tmp_path):
    """What the README's command reports: the playbook's BF16 and FP16 runs
    (FP32 master weights, loss scaling, FP32 cross-entropy), accuracy
    averaged over the default seeds, within 0.5 percentage points of FP32's
    (the seeds' target). About a minute on 2 cores."""
    runs = "fp32,bf16,fp16,bf16-rem,bf16-rem-bf16,bf16-rem-8bit,bf16-act8,bf16-act8-1.5x"
    out_dict = train_amp.main(["--runs", runs, "--plot", str(tmp_path / "c.png"), "--boxes", "500", "--no-resnet50"])
    out = capsys.readouterr().out
    results = out_dict["train"]
    assert [len(r["accs"]) for r in results] == [5] * 8
    base = results[0]["acc"]
    assert base > 0.95, out
    for r in results[1:]:
        # The playbook's runs, the lean optimizer-state ones and 8-bit activations alike.
        assert abs(r["acc"] - base) <= 0.005 + 1e-9, out
    for r in results[1:3]:
        # No seed more than two test images (0.56 pp) away from FP32's run.
        assert max(abs(d) for d in r["acc_diffs"]) < 0.006, out
    assert out_dict["parity_pp"] <= 0.5 + 1e-6 and "target 0.5 pp: met" in out, out


def test_demo_options_are_checked():
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="no CUDA device"):
            train_amp.main(["--device", "cuda", "--quick"])
    with pytest.raises(SystemExit, match="--runs"):
        train_amp.main(["--runs", "bf16,fp32", "--quick"])
    with pytest.raises(SystemExit, match="--seeds"):
        train_amp.main(["--seeds", "0", "--quick"])
