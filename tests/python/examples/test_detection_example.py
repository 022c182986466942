"""examples/detection.py (playbook project 3) in its --quick mode: every
recipe trains and is evaluated, the metrics are finite and in [0, 1], and
mixprec's NMS on the quick run's own detections keeps exactly what
torchvision's FP32 batched_nms keeps (an independent reference), at the
training resolution and on the 4096-px canvas. The full run's numbers are
in the README."""

import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchvision")
pytest.importorskip("torchmetrics")
pytest.importorskip("pycocotools")  # MeanAveragePrecision's backend
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
import detection  # noqa: E402


def test_detection_quick_mode(capsys):
    import torchvision

    import mixprec

    # One thread: a few times faster than two when other jobs share the CPU
    # (main() puts torch's thread count back afterwards).
    out = detection.main(["--quick", "--threads", "1"])
    text = capsys.readouterr().out
    rows = {r["recipe"]: r for r in out["parity"]}
    assert list(rows) == ["fp32", "bf16", "fp16"], text
    for r in rows.values():
        for k in ("map50", "map", "recall", "precision_t", "recall_t"):
            assert math.isfinite(r[k]) and 0.0 <= r[k] <= 1.0, (k, text)
        assert r["nonfinite"] == 0, text
        assert r["steps_per_s"] > 0 and math.isfinite(r["final_loss"]), text
    assert rows["fp32"]["map50_pp"] == [0.0] and rows["fp32"]["box_dtype"] == "float32"
    assert rows["bf16"]["box_dtype"] == "bfloat16" and rows["fp16"]["box_dtype"] == "float16"

    # Post-processing table: mixprec's rows equal the reference's kept sets.
    assert [label for label, _ in out["post"]] == ["64 px, per image", "4096 px canvas, per image", "64 px, one call",
                                                 "4096 px canvas, one call"]
    for _, prow in out["post"]:
        assert [r["how"] for r in prow] == list(detection.POST_ROWS)
        for r in prow:
            for k in ("map50", "map", "recall", "precision_t", "recall_t"):
                assert 0.0 <= r[k] <= 1.0, (k, text)
        rows_by = {r["how"]: r for r in prow}
        assert rows_by["torchvision FP32"]["duplicates"] == 0
        mp = rows_by["mixprec FP32 boxes"]
        assert mp["identical"] and mp["diff"] == 0 and mp["duplicates"] == 0 and mp["map50_pp"] == 0.0
        assert rows_by["mixprec FP16 boxes"]["duplicates"] == 0
    # On the 4096-px canvas FP16 areas overflow: the naive FP16 NMS suppresses nothing and keeps duplicates.
    naive = {r["how"]: r for r in out["post"][1][1]}["naive FP16"]
    assert naive["duplicates"] > 0 and not naive["identical"], text
    # One call on the canvas: the class offsets pass 65504, FP16 coordinates are inf, nothing is suppressed.
    tv16 = {r["how"]: r for r in out["post"][3][1]}["torchvision FP16"]
    assert tv16["duplicates"] > 0 and not tv16["identical"], text

    # Independently: mixprec.ops.batched_nms on the run's detections, FP32
    # boxes, against torchvision.ops.batched_nms, image by image.
    dets = out["dets"]
    assert sum(len(d["boxes"]) for d in dets) > 0
    for d in dets:
        for scale in (1.0, 4096 / 64):
            b, s, lab = d["boxes"].float() * scale, d["scores"].float(), d["labels"]
            ref = torchvision.ops.batched_nms(b, s, lab, detection.NMS_IOU)
            got = mixprec.ops.batched_nms(b, s, lab, detection.NMS_IOU)
            assert torch.equal(got, ref)
    assert "(a) parity" in text and "(b) post-processing" in text and "| fp16 |" in text


@pytest.mark.parametrize("argv", [["--size", "48"], ["--size", "32"], ["--seeds", "0"], ["--lr", "-1"],
                                  ["--device", "tpu"], ["--pretrain", "-1"], ["--score-thresh", "2"],
                                  ["--steps", "x"]])
def test_detection_bad_flags(argv, capsys):
    with pytest.raises(SystemExit) as e:
        detection.parse_args(argv)
    assert e.value.code == 2
    assert "error:" in capsys.readouterr().err
