"""The README's main command: the training demo, in its quick mode."""

import sys
from pathlib import Path

import pytest

pytest.importorskip("sklearn")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import train_amp  # noqa: E402


def test_demo_quick_mode_parity(capsys):
    results = train_amp.main(["--quick"])
    out = capsys.readouterr().out
    assert [r["mode"] for r in results] == ["fp32", "bf16", "fp16"]
    base = results[0]["acc"]
    assert base > 0.85, out
    for r in results[1:]:
        # Two epochs are noisy; the full run's parity is what the README shows.
        assert abs(r["acc"] - base) < 0.03, out
        assert r["scale"] is not None and r["scale"] > 0
    assert "vs fp32" in out


def test_demo_refuses_cuda_without_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    with pytest.raises(SystemExit, match="no CUDA device"):
        train_amp.main(["--device", "cuda", "--quick"])
