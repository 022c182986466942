"""mixprec.memory's planner and live-tensor tracker: what a step holds per
recipe, its extrapolation against a measured larger batch, and the CLI."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import mixprec.memory as mm

ROOT = Path(__file__).resolve().parents[3]


def _cnn():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Sequential(nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU()),
        nn.Sequential(nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU()),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )


def test_tracker_counts_storages_once_until_freed():
    with mm.LiveTracker() as tr:
        a = torch.randn(1000, 1000)
        v = a.view(-1)  # no new storage
        b = a * 2
        assert tr.current == 8_000_000
        del a, v
        assert tr.current == 4_000_000 and tr.peak == 8_000_000
    assert b.numel() == 10**6


def test_tracker_peak_excluding_tensors_still_alive():
    with mm.LiveTracker() as t:
        a = torch.empty(1000)  # 4000 B, alive to the end (a "gradient")
        b = torch.empty(2000)  # 8000 B
        del b
        c = torch.empty(500)  # 2000 B, reuses nothing of a's key
    assert t.peak == 12000
    assert t.peak_excluding([a]) == 8000  # b alone, before c
    assert t.peak_excluding([]) == 12000
    assert t.peak_excluding([torch.empty(3)]) == 12000  # not tracked: nothing taken out
    del a, c


def test_plan_recipes_and_extrapolation():
    model = _cnn()
    names = ["amp-bf16", "amp-bf16 + 8-bit act", "amp-bf16 + 4-bit act", "amp-bf16 + 8-bit act + lean state"]
    recipes = [r for r in mm.RECIPES if r.name in names]
    rows = {r.recipe.name: r for r in mm.plan(model, (3, 48, 48), batches=(2, 4), recipes=recipes)}
    amp, b8, b4, lean = (rows[n] for n in names)
    # Packed activations: 8-bit codes hold about half of BF16's bytes, 4-bit a quarter-ish.
    assert b8.saved_per_sample < 0.6 * amp.saved_per_sample
    # (<=: this net saves only BatchNorm inputs, at 8 bits under bits=4 too, and
    # ReLU masks - recompute_relu - so its 4-bit bytes are its 8-bit ones)
    assert b4.saved_per_sample <= b8.saved_per_sample
    assert b8.peak_per_sample < amp.peak_per_sample
    n_params = sum(p.numel() for p in model.parameters())
    assert amp.state == 16 * n_params and lean.state == 8 * n_params
    # The default budget is amp-bf16 at batch 16: that recipe fits 16, the others more.
    assert amp.largest_batch in (15, 16)
    assert b8.largest_batch > amp.largest_batch and b4.largest_batch >= b8.largest_batch
    # The extrapolation against a measured batch of 12.
    _saved, peak12, _t = mm._planner._measure(model, amp.recipe, lambda n: ((torch.randn(n, 3, 48, 48),), {}), 12,
                                              mm._planner._default_loss)
    predicted = amp.peak_fixed + amp.peak_per_sample * 12
    assert abs(peak12 - predicted) <= 0.15 * peak12


def test_checkpoint_blocks_restores_the_model():
    model = _cnn()
    x = torch.randn(2, 3, 16, 16)
    ref = model(x)
    with mm.checkpoint_blocks(model):
        assert "forward" in vars(model[3])  # the outermost Sequential's children
        out = model(x)
    assert "forward" not in vars(model[3])
    torch.testing.assert_close(out, ref)


def test_cli_prints_the_table():
    pytest.importorskip("torchvision")
    env_path = str(ROOT / "python")
    r = subprocess.run(
        [sys.executable, "-m", "mixprec.memory", "torchvision.models:resnet18", "--input", "3x32x32",
         "--kwargs", "num_classes=10", "--recipes", "amp-bf16,amp-bf16 + 8-bit act", "--batches", "2,3"],
        capture_output=True, text=True, timeout=600, env={**__import__("os").environ, "PYTHONPATH": env_path},
    )
    assert r.returncode == 0, r.stderr
    assert "| amp-bf16 + 8-bit act |" in r.stdout and "budget:" in r.stdout


@pytest.mark.parametrize(
    "args,msg",
    [
        (["nosuchmodule:f", "--input", "3x8x8"], "cannot load"),
        (["torchvision.models:resnet18", "--input", "3xx8"], "not a shape"),
        (["torchvision.models:resnet18", "--input", "3x8x8", "--budget", "lots"], "not a size"),
        (["torchvision.models:resnet18", "--input", "3x8x8", "--recipes", "fp8"], "unknown recipes"),
        (["torchvision.models:resnet18", "--input", "3x8x8", "--norm-bits", "12"], "--norm-bits"),
    ],
)
def test_cli_bad_arguments(args, msg):
    pytest.importorskip("torchvision")
    r = subprocess.run([sys.executable, "-m", "mixprec.memory", *args], capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "PYTHONPATH": str(ROOT / "python")})
    assert r.returncode == 2 and msg in r.stderr


def test_cli_norm_bits():
    """--norm-bits reaches compressed_activations: with the BatchNorm inputs
    kept (16) the 8-bit recipe saves more per sample than with them at 8
    bits, and the recipe's name says so."""
    pytest.importorskip("torchvision")

    def saved(*extra):
        r = subprocess.run(
            [sys.executable, "-m", "mixprec.memory", "torchvision.models:resnet18", "--input", "3x32x32",
             "--kwargs", "num_classes=10", "--recipes", "amp-bf16 + 8-bit act", "--batches", "2,3", *extra],
            capture_output=True, text=True, timeout=600, env={**__import__("os").environ, "PYTHONPATH": str(ROOT / "python")},
        )
        assert r.returncode == 0, r.stderr
        row = [line for line in r.stdout.splitlines() if line.startswith("| amp-bf16 + 8-bit act")]
        assert len(row) == 1, r.stdout
        return row[0], float(row[0].split("|")[2])

    row8, s8 = saved()
    row16, s16 = saved("--norm-bits", "16")
    assert "norm 16-bit" in row16 and "norm" not in row8
    assert s16 > 1.05 * s8, (row8, row16)  # 0.211 -> 0.228 MB at 32x32, where many tensors are too small to pack


def test_tracker_counts_allocations_not_views_of_older_storages():
    x = torch.randn(1024, 1024)  # made before the tracker: not the step's
    with mm.LiveTracker() as t:
        v = x.detach().view(-1)[:10]
        x.mul_(1.0)
        y = x * 2  # 4 MiB, new
        w = y.t()
        t.mark("end")
    assert t.marks["end"] == t.peak == 4 * 1024 * 1024
    del v, w
