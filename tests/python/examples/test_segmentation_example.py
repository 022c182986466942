"""examples/segmentation.py (playbook project 2) in its --quick mode: every
recipe trains and is evaluated, the metrics are finite and in range, the
2x-batch recipe runs at twice the batch and half the steps, and the memory
table has a row per recipe. The full run's numbers are in the README."""

import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("segmentation_models_pytorch")
pytest.importorskip("torchmetrics")
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
import segmentation  # noqa: E402


def test_segmentation_quick_mode(capsys):
    # One thread: a few times faster than two when other jobs share the CPU
    # (main() puts torch's thread count back afterwards).
    out = segmentation.main(["--quick", "--threads", "1"])
    text = capsys.readouterr().out
    rows = {r["recipe"]: r for r in out["parity"]}
    assert list(rows) == ["fp32", "bf16", "bf16+act8 2x"], text
    for r in rows.values():
        assert 0.0 <= r["miou"] <= 1.0, text
        assert r["nonfinite"] == 0, text
        assert math.isfinite(r["final_loss"]) and r["final_loss"] > 0, text
        assert r["steps_per_s"] > 0 and math.isfinite(r["diff_pp"]), text
    assert rows["fp32"]["diff_pp"] == 0.0
    assert 0.0 < out["trivial_miou"] < 1.0
    assert rows["bf16"]["batch"] == rows["fp32"]["batch"] and rows["bf16"]["steps"] == rows["fp32"]["steps"]
    two = rows["bf16+act8 2x"]
    assert two["batch"] == 2 * rows["fp32"]["batch"] and two["steps"] == rows["fp32"]["steps"] // 2
    assert two["lr"] == pytest.approx(rows["fp32"]["lr"] * math.sqrt(2))
    mem = {m["recipe"]: m for m in out["memory"]}
    assert list(mem) == list(rows), text
    for m in mem.values():
        assert 0 < m["fwd_bwd_peak"] <= m["step_peak"], text
        assert m["planner_peak_per_sample"] > 0, text
    assert "(a) parity" in text and "(b) memory" in text and "| bf16+act8 2x |" in text


@pytest.mark.parametrize("argv", [["--steps", "3"], ["--size", "48"], ["--seeds", "0"], ["--lr", "-1"],
                                  ["--device", "tpu"]])
def test_segmentation_bad_flags(argv, capsys):
    with pytest.raises(SystemExit) as e:
        segmentation.parse_args(argv)
    assert e.value.code == 2
    assert "error:" in capsys.readouterr().err
