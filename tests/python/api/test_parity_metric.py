"""mixprec.parity beyond the loss curve: the task metric of each trained model
against FP32's (evaluate=, targets=), paired seeds, several recipes in one
call, the +<k>x batch and +act<bits> recipes, the per-step gradient norm and
non-finite counts, the CLI's new flags, and every new argument refused
before anything trains."""

import math

import pytest
import torch
from torch import nn

import mixprec.memory
from mixprec.parity import MetricDiff, ParityReport, ParityResult, Recipe, main, parity


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: one thread is faster than two on a shared machine, and
    the FP32 runs compared exactly below are deterministic on one thread."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class Net(nn.Module):
    """A small classifier that remembers the rows it trained on."""

    def __init__(self, d=8, classes=3):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d, 16), nn.ReLU(), nn.Linear(16, classes))
        self.seen = []

    def forward(self, x):
        if self.training:
            self.seen.append(x.detach().float().clone())
        return self.body(x)


def make_data(n=4, batch=8, d=8, classes=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(d, classes, generator=g)
    out = []
    for _ in range(n):
        x = torch.randn(batch, d, generator=g)
        out.append((x, (x @ w).argmax(1)))
    return out


VAL = make_data(1, batch=64, seed=7)[0]


def accuracy(model):
    x, y = VAL
    return {"accuracy": (model(x).argmax(1) == y).float().mean()}


def seeded_net():
    torch.manual_seed(0)
    return Net()


# ---- the metric ------------------------------------------------------------------------


def test_evaluate_hook_matches_a_hand_computed_reference():
    data = make_data(6)
    seen = []

    def evaluate(model):
        seen.append((model, model.training, torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"),
                     next(model.parameters()).dtype))
        return accuracy(model)

    res = parity(seeded_net, data, recipe=["bf16", "bf16-params"], evaluate=evaluate,
                 optimizer=lambda ps: mixprec.optim.AdamW(ps, lr=1e-2))
    assert isinstance(res, ParityReport) and [r.recipe_name for r in res] == ["bf16", "bf16-params"]
    # untrained FP32 first (the check), then FP32, bf16, bf16-params trained
    assert len(seen) == 4 and all(not tr and not grad for _, tr, grad, _, _ in seen)
    assert [s[3] for s in seen] == [False, False, True, False]  # autocast only for the autocast recipe
    assert [s[4] for s in seen] == [torch.float32] * 3 + [torch.bfloat16]
    x, y = VAL
    with torch.no_grad():
        untrained_model, fp32_model, bf16_model, params_model = (s[0] for s in seen)
        assert untrained_model is fp32_model  # the FP32 run trains the model evaluate checked
        fp32_acc = (fp32_model(x).argmax(1) == y).float().mean().item()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16_acc = (bf16_model(x).argmax(1) == y).float().mean().item()
        params_acc = (params_model(x.bfloat16()).float().argmax(1) == y).float().mean().item()
    assert res.baselines[0].metrics == {"accuracy": fp32_acc}
    assert res["bf16"].recipe.metrics == {"accuracy": bf16_acc}
    assert res["bf16-params"].recipe.metrics == {"accuracy": params_acc}
    m = res["bf16"].metrics["accuracy"]
    assert m.fp32 == [fp32_acc] and m.mean_diff == bf16_acc - fp32_acc and m.std_diff == 0.0 and m.met is None
    # the models trained: the FP32 accuracy is the hand-trained reference's
    ref = seeded_net()
    opt = mixprec.optim.AdamW(ref.parameters(), lr=1e-2)
    losses = []
    for xb, yb in data:
        loss = nn.functional.cross_entropy(ref(xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    ref.eval()
    with torch.no_grad():
        assert (ref(x).argmax(1) == y).float().mean().item() == fp32_acc
    assert res.baselines[0].losses == losses
    with torch.no_grad():
        untrained = (seeded_net().eval()(x).argmax(1) == y).float().mean().item()
    assert res.untrained == {"accuracy": untrained} and untrained != fp32_acc
    text = str(res)
    assert "accuracy diff" in text and "bf16-params" in text and "untrained FP32: accuracy" in text


def test_targets_and_directions():
    m = MetricDiff("acc", [0.90, 0.92], [0.89, 0.90], 0.012)
    assert math.isclose(m.mean_diff, -0.015) and math.isclose(m.min_diff, -0.02) and math.isclose(m.max_diff, -0.01)
    assert math.isclose(m.std_diff, 0.0070710678118654) and m.met is False
    assert MetricDiff("acc", [0.9], [0.89], 0.02).met is True
    assert MetricDiff("acc", [0.9], [0.95], 0.02).met is False  # |diff| both ways by default
    assert MetricDiff("acc", [0.9], [0.95], 0.02, "higher").met is True
    assert MetricDiff("acc", [0.9], [0.85], 0.02, "higher").met is False
    assert MetricDiff("loss", [0.5], [0.45], 0.02, "lower").met is True
    assert MetricDiff("loss", [0.5], [math.nan], 1.0).met is False
    data = make_data(4)
    res = parity(seeded_net, data, recipe="bf16", evaluate=accuracy, targets={"accuracy": (1.0, "higher")})
    assert isinstance(res, ParityResult) and res.met is True and res.metrics["accuracy"].direction == "higher"
    assert "target diff >= -1: met" in str(res)
    assert parity(seeded_net, data, recipe="bf16").met is None


# ---- seeds ---------------------------------------------------------------------------------


def test_paired_seeds():
    data = make_data(4)
    built = []

    def make():  # unseeded: the init comes from parity's torch.manual_seed(seed)
        m = Net()
        built.append(m)
        return m

    state = torch.get_rng_state()
    a = parity(make, data, recipe="bf16", seeds=2, evaluate=accuracy)
    assert torch.equal(torch.get_rng_state(), state)  # the caller's random state is left as it was
    assert a.seeds == [0, 1] and len(a.baselines) == 2 and len(a.runs) == 2
    assert len(a.metrics["accuracy"].fp32) == 2
    # built: seed 0 FP32, seed 0 bf16, seed 1 FP32, seed 1 bf16
    for i, seed in enumerate([0, 0, 1, 1]):
        torch.manual_seed(seed)
        ref = Net()
        m = built[i]
        # each run saw its seed's batches: the first input is batch perm[0] of that seed
        perm = torch.randperm(4, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(m.seen[0], data[perm[0]][0])
        assert sorted(int(j) for j in perm) == [0, 1, 2, 3]
        if i % 2 == 0:  # FP32's first step was taken from the seed's init
            assert math.isclose(a.baselines[i // 2].losses[0],
                                nn.functional.cross_entropy(ref(data[perm[0]][0]), data[perm[0]][1]).item(),
                                rel_tol=1e-6)
    assert a.baselines[0].losses != a.baselines[1].losses
    # the recipe of a seed sees the FP32 run's batches in the same order
    assert all(torch.equal(p, q) for p, q in zip(built[0].seen, built[1].seen))
    assert not torch.equal(built[0].seen[0], built[2].seen[0]) or not torch.equal(built[0].seen[1], built[2].seen[1])
    built.clear()
    b = parity(make, data, recipe="bf16", seeds=2, evaluate=accuracy)
    assert [r.losses for r in b.baselines] == [r.losses for r in a.baselines]  # same seed, same FP32 run
    assert [r.losses for r in b.runs] == [r.losses for r in a.runs]
    c = parity(make, data, recipe="bf16", seeds=[1])
    assert c.baseline.losses == a.baselines[1].losses and c.seeds == [1]
    assert "seeds 0, 1" in str(a)


# ---- recipes ------------------------------------------------------------------------------


def test_several_recipes_and_the_table(tmp_path):
    pytest.importorskip("matplotlib")
    data = make_data(4)
    png = tmp_path / "curves.png"
    rep = parity(seeded_net, data, recipe=["fp16", "bf16", Recipe("mine", torch.bfloat16, params_cast=True)],
                 optimizer=lambda ps: mixprec.optim.AdamW(ps, lr=1e-3), evaluate=accuracy, seeds=2,
                 targets={"accuracy": 0.5}, png=str(png))
    assert [r.recipe_name for r in rep] == ["fp16", "bf16", "mine"] and len(rep) == 3
    assert all(r.baselines == rep.baselines for r in rep)  # one FP32 run per seed, shared
    assert all(r.max_rel_gap < 5e-2 for r in rep) and rep.met is True
    assert rep["fp16"].runs[0].skipped == [] and rep["mine"].spec.params_cast
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and rep.png == str(png)
    text = str(rep)
    for s in ("recipe", "FP32", "fp16", "bf16", "mine", "grad norm med/max", "steps/s", "met", "seeds 0, 1",
              str(png)):
        assert s in text, (s, text)
    with pytest.raises(KeyError):
        rep["fp8"]
    single = parity(seeded_net, data, recipe="fp16")
    assert isinstance(single, ParityResult) and single.recipe_name == "fp16"
    assert "parity of fp16 with FP32 over 4 steps" in str(single)


def test_batch_multiplier_sees_the_same_samples_in_half_the_steps():
    data = make_data(4)
    built, opts = [], []

    def make():
        m = seeded_net()
        built.append(m)
        return m

    def sgd(ps):
        opts.append(torch.optim.SGD(ps, lr=0.1))
        return opts[-1]

    rep = parity(make, data, recipe=["fp32+2x", Recipe("bf16-2x", torch.bfloat16, batch_multiplier=2,
                                                       lr_scale=lambda lr, k: lr * k ** 0.5)],
                 optimizer=sgd, steps=8, lr_scale=3.0)
    fp32, two = built[0], built[1]
    assert len(fp32.seen) == 8 and len(two.seen) == 4
    assert all(s.shape[0] == 16 for s in two.seen)
    assert torch.equal(torch.cat(fp32.seen), torch.cat(two.seen))  # the same samples, in the same order
    assert len(rep["fp32+2x"].recipe.losses) == 4 and rep["fp32+2x"].recipe.batch_multiplier == 2
    # lr: FP32 unchanged; parity's lr_scale for the named 2x; the Recipe's own rule wins over it (opts[0]:
    # the optimizer built on a copy of the model to check the rules before training)
    assert len(opts) == 4 and opts[0].param_groups[0]["lr"] == 0.1
    assert [o.param_groups[0]["lr"] for o in opts[1:]] == [0.1, pytest.approx(0.3), pytest.approx(0.1 * 2 ** 0.5)]
    # the first 2x step: the initial model on both batches at once
    with torch.no_grad():
        first = nn.functional.cross_entropy(seeded_net()(torch.cat([data[0][0], data[1][0]])),
                                            torch.cat([data[0][1], data[1][1]])).item()
    b, r = rep.baselines[0].losses, rep["fp32+2x"].recipe.losses
    assert math.isclose(r[0], first, rel_tol=1e-6)
    # the gap: each 2x step against the mean of FP32's losses on the same two batches
    ref = [(b[2 * j] + b[2 * j + 1]) / 2 for j in range(4)]
    assert math.isclose(rep["fp32+2x"].max_rel_gap, max(abs(r[j] - ref[j]) / ref[j] for j in range(4)), rel_tol=1e-9)
    assert "samples/s vs FP32" in str(rep)


def test_compressed_activation_recipe(monkeypatch):
    entered = []
    real = mixprec.memory.compressed_activations

    class Spy(real):
        def __enter__(self):
            entered.append(self.bits)
            return super().__enter__()

    monkeypatch.setattr(mixprec.memory, "compressed_activations", Spy)
    res = parity(seeded_net, make_data(3), recipe=["bf16+act8", "fp32+act4"], evaluate=accuracy)
    assert entered == [8] * 3 + [4] * 3  # every training step, not the evaluation
    assert res["bf16+act8"].spec == Recipe("bf16+act8", torch.bfloat16, act_bits=8)
    assert res["fp32+act4"].max_rel_gap < 1e-2


# ---- per-step diagnostics ------------------------------------------------------------------


class Overflow(nn.Module):
    """Its FP16 forward overflows (x * 1e3 through a linear layer with large weights)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(8, 3)
        with torch.no_grad():
            self.lin.weight.mul_(300.0)

    def forward(self, x):
        return self.lin(x * 1e3)


def test_grad_norm_and_non_finite_counts():
    data = make_data(3)
    res = parity(seeded_net, data, recipe="fp16")
    ref = seeded_net()
    nn.functional.cross_entropy(ref(data[0][0]), data[0][1]).backward()
    hand = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in ref.parameters()])).item()
    assert math.isclose(res.baseline.grad_norms[0], hand, rel_tol=1e-6)
    # FP16 with the GradScaler: the norm is unscaled (the scale is 65536 here)
    assert math.isclose(res.recipe.grad_norms[0], hand, rel_tol=2e-2)
    assert res.recipe.nonfinite_grads == 0 and res.recipe.nonfinite_losses == 0
    assert res.recipe.grad_norm_max >= res.recipe.grad_norm_median > 0
    bad = parity(Overflow, data, recipe="fp16")
    assert bad.recipe.nonfinite_losses == 3 and bad.recipe.nonfinite_grads == 3 and bad.recipe.skipped == [0, 1, 2]
    assert bad.baseline.nonfinite_losses == 0 and math.isnan(bad.recipe.grad_norm_median)
    assert "non-finite steps: loss FP32 0, fp16 3; gradient FP32 0, fp16 3" in str(bad)


# ---- the CLI -------------------------------------------------------------------------------


def cli_setup():
    def evaluate(model):
        return {**accuracy(model), "param_bits": torch.finfo(next(model.parameters()).dtype).bits}

    return {"make_model": seeded_net, "batches": make_data(4), "evaluate": evaluate}


def test_cli_new_flags(capsys):
    assert main(["test_parity_metric:cli_setup", "--recipe", "bf16,fp16", "--recipe", "fp32+2x", "--seeds", "2",
                 "--target", "accuracy=1.0:higher", "--target", "param_bits=0", "--steps", "4"]) == 0
    out = capsys.readouterr().out
    assert "parity with FP32 of 3 recipe(s), seeds 0, 1" in out and "fp32+2x" in out
    assert "accuracy: target diff >= -1: met" in out and "param_bits: target |diff| <= 0: met" in out
    # a target missed: exit status 1; --batch-multiplier doubles every named recipe's batch
    assert main(["test_parity_metric:cli_setup", "--recipe", "bf16-params", "--target", "param_bits=1",
                 "--batch-multiplier", "2", "--lr-scale", "2", "--steps", "4"]) == 1
    out = capsys.readouterr().out
    assert "parity of bf16-params+2x with FP32 over 4 steps" in out and "NOT met" in out
    with pytest.raises(SystemExit):
        main(["test_parity_metric:cli_setup", "--target", "accuracy"])


@pytest.mark.parametrize("flag,value", [("--batch-multiplier", "0"), ("--batch-multiplier", "-2"),
                                        ("--batch-multiplier", "1.5"), ("--steps", "0"), ("--seeds", "0")])
def test_cli_bad_counts_are_usage_errors(flag, value, capsys):
    """A count below 1 is argparse's usage error naming the option (exit
    status 2), as a malformed --target is; --batch-multiplier 0 was a
    ValueError traceback, --steps / --seeds 0 parity's, after setup ran."""
    with pytest.raises(SystemExit) as info:
        main(["no_such_module_for_the_test:setup", flag, value])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: must be an integer >= 1, got '{value}'" in err, err


# ---- arguments: refused before anything trains, errors name the argument -----------------


def _unchecked(**fields):
    """A Recipe holding bad ``fields`` past its constructor's check (which
    refuses them itself: test_bad_input_faces_parity.py), for parity's own."""
    r = Recipe("x", torch.bfloat16)
    for key, value in fields.items():
        object.__setattr__(r, key, value)
    return r


def _refused_before_building(tmp_path):
    data = make_data(2)
    return [
        (dict(recipe="fp8"), ValueError, "recipe must be one of"),
        (dict(recipe="bf16+act5"), ValueError, "recipe must be one of .* got 'bf16\\+act5'"),
        (dict(recipe=["bf16", "nope"]), ValueError, "got 'nope'"),
        (dict(recipe=[]), ValueError, "recipe is an empty list"),
        (dict(recipe=["bf16", "bf16"]), ValueError, "recipe names must differ"),
        (dict(recipe=[3]), TypeError, r"recipe\[0\]: recipe must be a str"),
        (dict(recipe=_unchecked(dtype=torch.float64)), ValueError, "recipe.dtype must be None"),
        (dict(recipe=_unchecked(dtype=None, params_cast=True)), ValueError, "recipe.params_cast"),
        (dict(recipe=[_unchecked(act_bits=6)]), ValueError, r"recipe\[0\].act_bits must be"),
        (dict(recipe=_unchecked(batch_multiplier=0)), ValueError, "recipe.batch_multiplier must be >= 1"),
        (dict(recipe=_unchecked(batch_multiplier=2, lr_scale=-1.0)), ValueError, "recipe.lr_scale must be > 0"),
        (dict(recipe="bf16+2x", steps=3), ValueError, "steps \\(3\\) must be a multiple"),
        (dict(recipe="bf16+2x", batches=[data[0], (torch.zeros(8, 5), data[1][1])]), ValueError,
         r"batch_multiplier 2, which concatenates .* batches\[1\] differs"),
        (dict(recipe="bf16+2x", batches=[(torch.zeros(()), torch.zeros(()))] * 2), ValueError, "0-dim tensor"),
        (dict(make_model=5), TypeError, "make_model must be a function"),
        (dict(batches=[]), ValueError, "batches is empty"),
        (dict(batches=[(1, 2)]), TypeError, r"batches\[0\]\[0\] must be a tensor .*\(input, target\) pair\), got int"),
        (dict(batches=[data[0], (data[1][0], "cat")]), TypeError, r"batches\[1\]\[1\] must be a tensor"),
        (dict(batches=[({"x": data[0][0], "m": None}, data[0][1])]), TypeError,
         r"batches\[0\]\[0\]\['m'\] must be a tensor .* got NoneType"),
        (dict(steps=0), ValueError, "steps must be >= 1, got 0"),
        (dict(seeds=0), ValueError, "seeds must be >= 1, got 0"),
        (dict(seeds=-2), ValueError, "seeds must be >= 1"),
        (dict(seeds=1.5), TypeError, "seeds must be an integer"),
        (dict(seeds=[]), ValueError, "seeds is an empty list"),
        (dict(seeds=[1, 1]), ValueError, "seeds must differ"),
        (dict(seeds=[0, -1]), ValueError, r"seeds\[1\] must be >= 0"),
        (dict(evaluate="accuracy"), TypeError, "evaluate must be a function"),
        (dict(targets={"accuracy": 0.01}), ValueError, "targets .* need evaluate="),
        (dict(evaluate=accuracy, targets={"accuracy": math.nan}), ValueError, r"targets\['accuracy'\] must be finite"),
        (dict(evaluate=accuracy, targets={"accuracy": math.inf}), ValueError, r"targets\['accuracy'\] must be finite"),
        (dict(evaluate=accuracy, targets={"accuracy": -0.1}), ValueError, r"targets\['accuracy'\] must be >= 0"),
        (dict(evaluate=accuracy, targets={"accuracy": (0.1, "up")}), ValueError, "direction one of"),
        (dict(evaluate=accuracy, targets=[0.1]), TypeError, "targets must be a dict"),
        (dict(lr_scale=0), ValueError, "lr_scale must be > 0"),
        (dict(lr_scale=math.nan), ValueError, "lr_scale must be finite"),
        (dict(png=str(tmp_path / "missing" / "curves.png")), ValueError, "png's directory .* does not exist"),
    ]


def _refused_after_building_once():
    return [
        (dict(evaluate=lambda m: None), TypeError, "evaluate must return a dict .* got NoneType"),
        (dict(evaluate=lambda m: {}), ValueError, "evaluate must return a dict .* got an empty dict"),
        (dict(evaluate=lambda m: {"accuracy": "high"}), TypeError, "evaluate must return .* 'accuracy': str"),
        (dict(evaluate=lambda m: {"accuracy": torch.zeros(3)}), TypeError, "evaluate must return .* Tensor"),
        (dict(evaluate=lambda m: 0.9), TypeError, "evaluate must return a dict"),
        (dict(evaluate=accuracy, targets={"miou": 0.01}), ValueError, r"targets \['miou'\] are not among"),
        (dict(recipe="bf16+2x", lr_scale=lambda lr, k: -lr), ValueError, "lr_scale gives the lr -0.001"),
        (dict(make_model=lambda: 5), TypeError, "make_model must return a torch.nn.Module, got int"),
    ]


def test_bad_arguments_are_refused_before_training(tmp_path):
    built, losses = [], []

    def factory():
        built.append(1)
        return seeded_net()

    def loss_fn(out, y):
        losses.append(1)
        return nn.functional.cross_entropy(out, y)

    state = torch.get_rng_state()
    for cases, builds in ((_refused_before_building(tmp_path), 0), (_refused_after_building_once(), 1)):
        for kw, exc, msg in cases:
            args = dict(make_model=factory, batches=make_data(2), loss_fn=loss_fn, seeds=2)
            args.update(kw)
            make_model, data = args.pop("make_model"), args.pop("batches")
            built.clear()
            with pytest.raises(exc, match=r"mixprec\.parity\.parity: .*" + msg):
                parity(make_model, data, **args)
            assert losses == [], kw  # no step ran
            assert len(built) == (builds if make_model is factory else 0), kw
            assert torch.equal(torch.get_rng_state(), state), kw  # the random state as it was


def test_seeded_runs_share_the_dropout_stream():
    class Drop(Net):
        def __init__(self):
            super().__init__()
            self.body.insert(1, nn.Dropout(0.5))

    data = make_data(4)
    # unseeded make_model: the init, the batch order and the dropout masks all come from the seed
    res = parity(Drop, data, recipe=["fp32"], seeds=2, evaluate=accuracy)
    for r in res:
        assert [x.losses for x in r.runs] == [b.losses for b in res.baselines]
        assert r.metrics["accuracy"].diffs == [0.0, 0.0]
    assert res.baselines[0].losses != res.baselines[1].losses
