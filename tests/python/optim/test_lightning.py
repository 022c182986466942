"""mixprec's optimizers under Lightning's Trainer with AMP and gradient
clipping (issue 23 item 13): through mixprec.lightning.MixedPrecision they
train as torch.optim.AdamW / SGD do under Lightning's own plugin, for
bf16-mixed and 16-mixed, norm and value clipping; Lightning's own plugins
train them too (issue 39; they still refuse torch's fused AdamW). A tiny
model, a few steps on the CPU."""

import warnings

import pytest
import torch

import mixprec

L = pytest.importorskip("lightning.pytorch")
from mixprec.lightning import MixedPrecision  # noqa: E402

STEPS = 6


class _Net(L.LightningModule):
    def __init__(self, make_opt, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.body = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
        with torch.no_grad():
            for p in self.body.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.7)
        self.make_opt = make_opt
        self.grad_norms = []

    def training_step(self, batch, _):
        x, y = batch
        # Large targets: the gradient norm is far above the clip value.
        return torch.nn.functional.mse_loss(self.body(x).float(), y)

    def on_before_optimizer_step(self, optimizer):
        self.grad_norms.append(torch.cat([p.grad.float().flatten() for p in self.parameters()]).norm().item())

    def configure_optimizers(self):
        return self.make_opt(self.parameters())


def _data(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(STEPS * 8, 12, generator=g)
    y = torch.randn(STEPS * 8, 3, generator=g) * 30
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)


def _fit(make_opt, clip_val, algorithm, **trainer_kw):
    net = _Net(make_opt, seed=5)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=STEPS, gradient_clip_val=clip_val,
        gradient_clip_algorithm=algorithm, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, **trainer_kw,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's hints about workers and the like
        trainer.fit(net, _data(6))
    return net


OPTS = {
    "adamw": (lambda ps: mixprec.optim.AdamW(ps, lr=1e-2), lambda ps: torch.optim.AdamW(ps, lr=1e-2)),
    "sgd": (lambda ps: mixprec.optim.SGD(ps, lr=1e-3, momentum=0.9),
            lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9)),
}


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
@pytest.mark.parametrize("algorithm", ["norm", "value"])
@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_clipping_trains_like_torch_optimizer(precision, algorithm, kind):
    ours, theirs = OPTS[kind]
    # A scale the FP16 backward does not overflow at (every step is taken).
    scaler = {} if precision == "bf16-mixed" else {"scaler": mixprec.amp.GradScaler("cpu", init_scale=256.0)}
    ref_scaler = {} if precision == "bf16-mixed" else {"scaler": torch.amp.GradScaler("cpu", init_scale=256.0)}
    a = _fit(ours, 1.0, algorithm, plugins=[MixedPrecision(precision, "cpu", **scaler)])
    b = _fit(theirs, 1.0, algorithm, plugins=[
        L.plugins.precision.MixedPrecision(precision, "cpu", **ref_scaler)])
    assert a.trainer.global_step == b.trainer.global_step == STEPS
    # The clip saw the unscaled grads, as with torch's optimizer: the norms
    # Lightning's hook sees before the clip are the true ones (far above 1).
    assert len(a.grad_norms) == STEPS
    torch.testing.assert_close(torch.tensor(a.grad_norms), torch.tensor(b.grad_norms), rtol=1e-4, atol=0)
    assert min(a.grad_norms) > 5
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)


def test_without_clipping_hooks_see_unscaled_grads_as_with_torch():
    """Lightning's order: unscale after the closure, then
    on_before_optimizer_step (which sees the true grads), then the step;
    the default scalers (2**16: the first steps overflow and are skipped by
    both alike, inf/NaN norms in the same places)."""
    a = _fit(OPTS["adamw"][0], None, None, plugins=[MixedPrecision("16-mixed", "cpu")])
    b = _fit(OPTS["adamw"][1], None, None,
             plugins=[L.plugins.precision.MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu"))])
    torch.testing.assert_close(torch.tensor(a.grad_norms), torch.tensor(b.grad_norms), rtol=1e-4, atol=0,
                               equal_nan=True)
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_lightning_own_plugin_still_refuses_clipping_torch_fused(precision):
    """Lightning's refusal stays for torch's fused AdamW (it unscales inside
    its step); mixprec's optimizers are not refused (below)."""
    # Lightning's plugin given as an object: precision="16-mixed" on the CPU
    # would quietly become bf16-mixed.
    scaler = torch.amp.GradScaler("cpu") if precision == "16-mixed" else None
    with pytest.raises(RuntimeError, match="does not allow for gradient clipping"):
        _fit(lambda ps: torch.optim.AdamW(ps, lr=1e-2, fused=True), 1.0, "norm",
             plugins=[L.plugins.precision.MixedPrecision(precision, "cpu", scaler)])


# ---- Lightning's own plugins (issue 39): what users write ------------------------


def _close(a, b, tol=1e-5):
    assert a.trainer.global_step == b.trainer.global_step == STEPS
    assert len(a.grad_norms) == STEPS and min(a.grad_norms) > 5  # the hook saw unscaled, unclipped grads
    torch.testing.assert_close(torch.tensor(a.grad_norms), torch.tensor(b.grad_norms), rtol=1e-5, atol=0)
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=tol)


@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_precision_bf16_mixed_with_clipping_trains_like_torch(algorithm):
    """``Trainer(precision="bf16-mixed", gradient_clip_val=1.0)`` with
    mixprec's AdamW in configure_optimizers: Lightning refused it ("does
    not allow for gradient clipping"), although bf16-mixed scales nothing.
    It trains as torch.optim.AdamW does there (within 1e-5)."""
    a = _fit(OPTS["adamw"][0], 1.0, algorithm, precision="bf16-mixed")
    b = _fit(OPTS["adamw"][1], 1.0, algorithm, precision="bf16-mixed")
    _close(a, b)


@pytest.mark.parametrize("kind,algorithm,scaler", [
    ("adamw", "norm", torch.amp.GradScaler), ("adamw", "value", torch.amp.GradScaler),
    ("sgd", "norm", torch.amp.GradScaler), ("adamw", "norm", mixprec.amp.GradScaler),
    ("adamw", "value", mixprec.amp.GradScaler),
])
def test_lightning_16_mixed_plugin_with_clipping_trains_like_torch(kind, algorithm, scaler):
    """Lightning's own 16-mixed plugin (with torch's or mixprec's scaler):
    the grads are unscaled before the hook and the clip, the step then only
    reads them; as torch's optimizer under the same plugin."""
    ours, theirs = OPTS[kind]
    a = _fit(ours, 1.0, algorithm, plugins=[
        L.plugins.precision.MixedPrecision("16-mixed", "cpu", scaler("cpu", init_scale=256.0))])
    b = _fit(theirs, 1.0, algorithm, plugins=[
        L.plugins.precision.MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu", init_scale=256.0))])
    _close(a, b)


def test_the_flag_still_reads_true_to_grad_scalers():
    """torch's and mixprec's GradScaler (and everyone but Lightning) still
    hand the loss scale to the fused step: see [note: lightning's reading
    of the flag] in mixprec/optim.py."""
    p = torch.nn.Parameter(torch.randn(4).half())
    opt = mixprec.optim.AdamW([p], lr=1e-2)
    assert opt._step_supports_amp_scaling is True and mixprec.optim.SGD._step_supports_amp_scaling is True
    from lightning.fabric.plugins.precision.amp import _optimizer_handles_unscaling

    assert _optimizer_handles_unscaling(opt) is False
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(torch.ones(()))  # the scale is made at the first scale()
    p.grad = torch.full((4,), 1024.0).half()  # FP16 grads: only the fused step takes them
    scaler.step(opt)
    scaler.update()
    assert torch.equal(p.grad, torch.ones(4).half())  # unscaled by the step, written back


@pytest.mark.parametrize("args,exc,msg", [
    (("bf16",), ValueError, "precision must be '16-mixed' or 'bf16-mixed', got 'bf16'"),
    ((16,), TypeError, "precision must be '16-mixed' or 'bf16-mixed', got int"),
    (("bf16-mixed", 3), TypeError, "device must be a device type"),
    (("16-mixed", "nodevice"), ValueError, "device must be a device type"),
    (("16-mixed", "cpu", "x"), TypeError, "scaler must be a GradScaler"),
    (("16-mixed", "cpu", torch.zeros(1)), TypeError, "scaler must be a GradScaler"),
    (("16-mixed", "cpu", torch.amp.GradScaler), TypeError, "scaler must be a GradScaler"),
    (("bf16-mixed", "cpu", torch.amp.GradScaler("cpu")), ValueError,
     "precision='bf16-mixed' scales nothing and takes no scaler"),
])
def test_plugin_refuses_bad_arguments(args, exc, msg):
    with pytest.raises(exc, match="mixprec.lightning.MixedPrecision: " + msg):
        MixedPrecision(*args)


def test_plugin_takes_a_device_with_an_index():
    assert MixedPrecision("bf16-mixed", "cpu").device == "cpu"
    assert MixedPrecision("bf16-mixed", torch.device("cuda", 1)).device == "cuda"


# ---- where Lightning reads the flag from -----------------------------------------


def _read_elsewhere(optimizer):
    """Lightning's _optimizer_handles_unscaling, as if moved out of
    Lightning's packages (a helper library, a refactor): the frame that
    reads the flag is not Lightning's."""
    return getattr(optimizer, "_step_supports_amp_scaling", False)


class _Recording(mixprec.optim.AdamW):
    """Records whether each step got the GradScaler's found_inf (the
    scaler read the flag as True: no host sync to skip)."""

    def step(self, closure=None):
        self.handed_over = getattr(self, "handed_over", []) + [getattr(self, "found_inf", None) is not None]
        return super().step(closure)


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_flag_reads_false_to_lightning_from_any_module(precision, algorithm, monkeypatch):
    """The flag reads False under Lightning wherever Lightning's check
    runs, not only in a frame of Lightning's own modules (which refused
    clipping again as soon as the read moved), and still True to the
    GradScaler Lightning calls: mixprec's AdamW trains as torch's does,
    within 1e-5, and every 16-mixed step gets found_inf."""
    import lightning.pytorch.plugins.precision.amp as lightning_amp

    monkeypatch.setattr(lightning_amp, "_optimizer_handles_unscaling", _read_elsewhere)

    def run(make_opt):
        if precision == "bf16-mixed":
            return _fit(make_opt, 1.0, algorithm, precision="bf16-mixed")
        return _fit(make_opt, 1.0, algorithm, plugins=[
            L.plugins.precision.MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu", init_scale=256.0))])

    a = run(lambda ps: _Recording(ps, lr=1e-2))
    b = run(OPTS["adamw"][1])
    _close(a, b)
    opt = a.trainer.optimizers[0]
    assert opt.handed_over == [precision == "16-mixed"] * STEPS
