"""GradScaler overflow diagnostics (issue 15.3): which parameters overflowed,
every gradient's norm and the training-health record, from the unscale pass,
against references computed from the gradients themselves (float64 norms of
the unscaled values) and torch's own GradScaler on the same overflow
pattern."""

import copy
import datetime
import os
import pickle
import tempfile

import pytest
import torch

import mixprec
from _reference import free_port, requires_cuda, spawn

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _model(dtype, seed=0):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(
        torch.nn.Linear(12, 24), torch.nn.ReLU(), torch.nn.Linear(24, 24), torch.nn.ReLU(), torch.nn.Linear(24, 5)
    )
    return m.to(dtype)


def _batches(gen, n, dtype):
    return [(torch.randn(6, 12, generator=gen).to(dtype), torch.randint(0, 5, (6,), generator=gen)) for _ in range(n)]


def _unscaled_norm64(g, scale, dtype):
    """What the fused pass measures: the unscaled values as stored."""
    return torch.linalg.vector_norm((g.float() * (1.0 / scale)).to(dtype).double()).item()


def _poison(model, step, plan):
    """plan: step -> [(param index, value)]; writes into the grads."""
    params = list(model.parameters())
    for i, v in plan.get(step, []):
        params[i].grad.view(-1)[step % params[i].numel()] = v


PATHS = ["unscale", "clip", "clip_folded", "step_only", "torch_optimizer"]


def _run(path, dtype, gen, steps=8, plan=None, diagnostics=True, named=True, scaler_kw=None):
    plan = plan or {}
    model = _model(dtype)
    if path == "torch_optimizer":
        model = model.float()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    else:
        opt = mixprec.optim.AdamW(model.parameters(), lr=1e-3)
    kw = dict(scaler_kw or {})
    if diagnostics:
        kw["named_parameters" if named else "diagnostics"] = model.named_parameters() if named else True
    scaler = mixprec.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3, **kw)
    record = []
    for step, (x, y) in enumerate(_batches(gen, steps, next(model.parameters()).dtype)):
        loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        scaler.scale(loss).backward()
        _poison(model, step, plan)
        scale = scaler.get_scale()
        grads = [p.grad.clone() for p in model.parameters()]
        total = None
        if path == "unscale":
            total = scaler.unscale_(opt, return_norm=True)
        elif path == "clip":
            total = scaler.clip_grad_norm_(opt, 0.5)
        elif path == "clip_folded":
            total = scaler.clip_grad_norm_(opt, 0.5, fold=True)
        seen = (scaler.last_overflow(), scaler.last_grad_norms()) if diagnostics and total is not None else None
        scaler.step(opt)
        if diagnostics:
            seen = seen or (scaler.last_overflow(), scaler.last_grad_norms())
        scaler.update()
        opt.zero_grad()
        record.append(dict(scale=scale, grads=grads, total=None if total is None else total.item(), seen=seen))
    return model, scaler, record


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_grad_norms_equal_float64_norms_of_the_unscaled_grads(path, dtype, gen):
    if path == "torch_optimizer" and dtype is not torch.float32:
        pytest.skip("torch's SGD takes FP32 params here")
    model, scaler, record = _run(path, dtype, gen)
    names = [n for n, _ in model.named_parameters()]
    pdtype = next(model.parameters()).dtype
    for r in record:
        overflow, norms = r["seen"]
        assert overflow == []
        assert list(norms) == names
        for n, g in zip(names, r["grads"]):
            ref = _unscaled_norm64(g, r["scale"], pdtype)
            assert norms[n] == pytest.approx(ref, rel=2e-6, abs=1e-30), (n, r["scale"])
    h = scaler.health()
    assert h.steps == len(record) and h.skipped_steps == 0
    assert h.scale == [r["scale"] for r in record]
    for r, total in zip(record, h.grad_norm):
        ref = torch.linalg.vector_norm(
            torch.tensor([_unscaled_norm64(g, r["scale"], pdtype) for g in r["grads"]], dtype=torch.float64)
        ).item()
        assert total == pytest.approx(ref, rel=2e-6)
        if r["total"] is not None:  # the norm the scaler returned from the same pass
            assert total == pytest.approx(r["total"], rel=2e-6)


@pytest.mark.parametrize("path", PATHS)
def test_overflow_reports_exactly_the_poisoned_params(path, gen):
    dtype = torch.float32 if path == "torch_optimizer" else torch.bfloat16
    # step 7: a finite gradient whose squares overflow float is not an overflow
    plan = {1: [(2, float("inf"))], 2: [(2, float("nan")), (5, float("-inf"))], 5: [(0, float("nan"))],
            6: [(2, float("inf"))], 7: [(4, 3e38)]}
    model, scaler, record = _run(path, dtype, gen, plan=plan)
    names = [n for n, _ in model.named_parameters()]
    for step, r in enumerate(record):
        overflow, norms = r["seen"]
        bad = sorted({i for i, v in plan.get(step, []) if v != 3e38})
        assert [o.index for o in overflow] == bad, step
        assert [o.name for o in overflow] == [names[i] for i in bad]
        for o in overflow:
            assert not torch.isfinite(torch.tensor(o.grad_norm))
            assert not torch.isfinite(torch.tensor(norms[o.name]))
        assert all(torch.isfinite(torch.tensor(norms[n])) for i, n in enumerate(names) if i not in bad)
    assert record[7]["seen"][1][names[4]] > 1e30
    h = scaler.health()
    assert h.skipped == [s in (1, 2, 5, 6) for s in range(len(record))]
    assert h.skipped_steps == scaler.get_skipped_steps() == 4
    assert h.overflow_counts[names[2]] == 3 and h.overflow_counts[names[5]] == 1 and h.overflow_counts[names[0]] == 1
    assert h.most_overflowed(1) == [(names[2], 3)]
    assert list(h.overflow_counts)[0] == names[2]
    # The scale history is torch's GradScaler's on the same overflow pattern.
    ref_model = _model(torch.float32)
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.0)
    ref = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
    ref_scales = []
    for step, (x, y) in enumerate(_batches(torch.Generator().manual_seed(1), len(record), torch.float32)):
        ref.scale(torch.nn.functional.cross_entropy(ref_model(x), y)).backward()
        _poison(ref_model, step, plan)
        ref_scales.append(ref.get_scale())
        ref.step(ref_opt)
        ref.update()
        ref_opt.zero_grad()
    assert h.scale == ref_scales
    assert all(not torch.isfinite(torch.tensor(n)) for n, s in zip(h.grad_norm, h.skipped) if s)
    text = str(h)
    assert "4 skipped" in text and f"{names[2]} (3x)" in text


def test_unnamed_params_are_reported_by_index(gen):
    model, scaler, record = _run("unscale", torch.float16, gen, steps=3, plan={1: [(3, float("inf"))]}, named=False)
    overflow, norms = record[1]["seen"]
    assert overflow and overflow[0].index == 3 and overflow[0].name == "3"
    assert list(norms) == [str(i) for i in range(len(list(model.parameters())))]


def test_diagnostics_change_no_bit_of_training(gen):
    plan = {2: [(1, float("inf"))]}
    seed = gen.initial_seed()
    runs = {}
    for diag in (False, True):
        for path in ("clip", "clip_folded", "step_only"):
            model, scaler, _ = _run(path, torch.bfloat16, torch.Generator().manual_seed(seed), plan=plan, diagnostics=diag)
            runs[(diag, path)] = ([p.detach().clone() for p in model.parameters()], scaler.get_scale())
    for path in ("clip", "clip_folded", "step_only"):
        (a, sa), (b, sb) = runs[(False, path)], runs[(True, path)]
        assert sa == sb
        for x, y in zip(a, b):
            assert torch.equal(x.view(torch.int16), y.view(torch.int16))


def test_diagnostics_off_is_a_clear_error():
    scaler = mixprec.amp.GradScaler("cpu")
    for name in ("last_overflow", "last_grad_norms", "health"):
        with pytest.raises(RuntimeError, match=rf"GradScaler\.{name}: diagnostics are off"):
            getattr(scaler, name)()


def test_step_listener_sees_every_update_and_adds_to_health(gen):
    class Listener:
        def __init__(self):
            self.seen = []

        def on_scaler_step(self, found_inf):
            self.seen.append(float(found_inf))

        def health_summary(self):
            return f"listener: {len(self.seen)} steps"

    plan = {2: [(0, float("inf"))], 5: [(2, float("nan"))]}
    model = _model(torch.float32)
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = mixprec.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3, diagnostics=True)
    listener = Listener()
    scaler.add_step_listener(listener)
    scaler.add_step_listener(listener)  # once only
    g = torch.Generator().manual_seed(3)
    for step, (x, y) in enumerate(_batches(g, 8, torch.float32)):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        _poison(model, step, plan)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    skipped = scaler.health().skipped
    assert skipped == [s in plan for s in range(8)]
    assert [v != 0 for v in listener.seen] == skipped
    assert "listener: 8 steps" in str(scaler.health())
    with pytest.raises(TypeError, match=r"add_step_listener: listener must have a callable on_scaler_step"):
        scaler.add_step_listener(object())
    with pytest.raises(RuntimeError, match=r"GradScaler\.add_step_listener: diagnostics are off"):
        mixprec.amp.GradScaler("cpu").add_step_listener(listener)


def test_before_any_step_and_pickling(gen):
    model = _model(torch.bfloat16)
    scaler = mixprec.amp.GradScaler("cpu", named_parameters=model.named_parameters())
    assert scaler.last_overflow() == [] and scaler.last_grad_norms() == {}
    assert scaler.health().steps == 0 and "no steps" in str(scaler.health())
    _, scaler, _ = _run("clip", torch.bfloat16, gen, steps=2)
    again = pickle.loads(pickle.dumps(scaler))  # the record starts afresh (params matched by identity)
    assert again.health().steps == 0 and again.get_scale() == scaler.get_scale()
    assert copy.deepcopy(again).health().steps == 0


def test_compiled_training_step_records(gen):
    model = _model(torch.bfloat16)
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = mixprec.amp.GradScaler("cpu", named_parameters=model.named_parameters())
    fwd = torch.compile(lambda x, y: torch.nn.functional.cross_entropy(model(x).float(), y), backend="aot_eager")
    names = [n for n, _ in model.named_parameters()]
    for step, (x, y) in enumerate(_batches(gen, 3, torch.bfloat16)):
        scaler.scale(fwd(x, y)).backward()
        if step == 1:
            model[4].bias.grad[0] = float("nan")
        scale = scaler.get_scale()
        grads = [p.grad.clone() for p in model.parameters()]
        scaler.clip_grad_norm_(opt, 1.0)
        scaler.step(opt)
        assert [o.name for o in scaler.last_overflow()] == (["4.bias"] if step == 1 else [])
        if step != 1:
            norms = scaler.last_grad_norms()
            for n, g in zip(names, grads):
                assert norms[n] == pytest.approx(_unscaled_norm64(g, scale, torch.bfloat16), rel=2e-6)
        scaler.update()
        opt.zero_grad()
    assert scaler.health().skipped == [False, True, False]


# ---- 2 gloo processes: FSDP2 shards ---------------------------------------------


def _fsdp_worker(rank, port, out_dir):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    try:
        model = _model(torch.bfloat16)
        for layer in (model[0], model[2], model[4]):
            fully_shard(layer)
        fully_shard(model)
        opt = mixprec.optim.AdamW(model.parameters(), lr=1e-3)
        scaler = mixprec.amp.GradScaler("cpu", named_parameters=model.named_parameters())
        gen = torch.Generator().manual_seed(10 + rank)
        rows = []
        for step, (x, y) in enumerate(_batches(gen, 3, torch.bfloat16)):
            scaler.scale(torch.nn.functional.cross_entropy(model(x).float(), y)).backward()
            if step == 1 and rank == 1:  # rank 1's shard of one parameter only
                model[2].weight.grad._local_tensor.view(-1)[0] = float("inf")
            scale = scaler.get_scale()
            full = {n: _unscaled_norm64(p.grad.full_tensor(), scale, torch.bfloat16) for n, p in model.named_parameters()}
            scaler.clip_grad_norm_(opt, 1.0)
            rows.append(dict(overflow=[o.name for o in scaler.last_overflow()], norms=scaler.last_grad_norms(), full=full))
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        torch.save(dict(rows=rows, skipped=scaler.health().skipped), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
    os._exit(0)


def test_fsdp2_two_ranks_report_whole_tensor_norms_and_the_same_overflow():
    pytest.importorskip("torch.distributed.fsdp")
    with tempfile.TemporaryDirectory() as d:
        spawn(_fsdp_worker, (free_port(), d), 2)
        res = [torch.load(os.path.join(d, f"rank{r}.pt")) for r in range(2)]
    for r in res:
        assert r["skipped"] == [False, True, False]
        for step, row in enumerate(r["rows"]):
            assert row["overflow"] == (["2.weight"] if step == 1 else [])
            for n, ref in row["full"].items():
                if step == 1 and n == "2.weight":
                    continue
                assert row["norms"][n] == pytest.approx(ref, rel=2e-6), (step, n)
    assert res[0]["rows"][0]["norms"] == res[1]["rows"][0]["norms"]


# ---- CUDA: no host sync until asked ------------------------------------------------


@requires_cuda
@pytest.mark.cuda
def test_cuda_diagnostics_do_not_sync(gen):
    model = _model(torch.bfloat16).cuda()
    opt = mixprec.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = mixprec.amp.GradScaler("cuda", named_parameters=model.named_parameters())
    names = [n for n, _ in model.named_parameters()]
    for step, (x, y) in enumerate(_batches(gen, 3, torch.bfloat16)):
        x, y = x.cuda(), y.cuda()
        loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        scaler.scale(loss).backward()
        if step == 1:
            model[2].bias.grad[0] = float("inf")
        scale = scaler._scale.item()
        grads = [p.grad.clone() for p in model.parameters()]
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            scaler.clip_grad_norm_(opt, 1.0, fold=True)
            scaler.step(opt)
            scaler.update()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        opt.zero_grad()
        norms = scaler.last_grad_norms()
        if step != 1:
            for n, g in zip(names, grads):
                assert norms[n] == pytest.approx(_unscaled_norm64(g.cpu(), scale, torch.bfloat16), rel=2e-6)
        assert [o.name for o in scaler.last_overflow()] == (["2.bias"] if step == 1 else [])
    assert scaler.health().skipped == [False, True, False]
