"""CUDA ops: parity with the CPU ops, torch's current stream, CUDA graphs.
Skipped without a GPU; run by scripts/gpu_check.sh on the lent GPU machine."""

import pytest
import torch

import mixprec
from conftest import requires_cuda
from test_unscale import assert_same, rand_grads

pytestmark = [pytest.mark.cuda, requires_cuda]

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _mixed_list(gen):
    grads = []
    for i, n in enumerate([1, 7, 4097, 16383, 16384, 16385, 100003, 0, 3, 1 << 20]):
        grads += rand_grads(gen, DTYPES[i % 3], [n])
    grads[4][100] = float("inf")
    return grads


def test_cuda_matches_cpu(gen):
    cpu = _mixed_list(gen)
    gpu = [g.cuda() for g in cpu]
    fi_c, fi_g = torch.zeros(1), torch.zeros(1, device="cuda")
    per_c, tot_c = torch.ops.mixprec.unscale_norm_(cpu, fi_c, torch.tensor([1 / 1024]))
    per_g, tot_g = torch.ops.mixprec.unscale_norm_(gpu, fi_g, torch.tensor([1 / 1024], device="cuda"))
    for a, b in zip(cpu, gpu):
        assert_same(a, b.cpu())
    assert fi_c.item() == fi_g.item() == 1.0
    fin = torch.isfinite(per_c)
    torch.testing.assert_close(per_g.cpu()[fin], per_c[fin], rtol=1e-6, atol=0)
    assert torch.equal(torch.isinf(per_g.cpu()), torch.isinf(per_c))


@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_matches_torch_cuda(gen, dtype):
    grads = [g.cuda() for g in rand_grads(gen, dtype, [5, 4097, 300001])]
    ref = [g.clone() for g in grads]
    fi, fi_ref = torch.zeros(1, device="cuda"), torch.zeros(1, device="cuda")
    inv = torch.tensor([1 / 3.0], device="cuda")
    torch.ops.mixprec.unscale_(grads, fi, inv)
    if dtype is torch.bfloat16:
        # torch's CUDA op has no BF16: reference on an FP32 copy, rounded back.
        wide = [r.float() for r in ref]
        torch._amp_foreach_non_finite_check_and_unscale_(wide, fi_ref, inv)
        ref = [w.to(dtype) for w in wide]
    else:
        torch._amp_foreach_non_finite_check_and_unscale_(ref, fi_ref, inv)
    for a, b in zip(grads, ref):
        assert_same(a.cpu(), b.cpu())


def test_norm_deterministic(gen):
    base = _mixed_list(gen)
    outs = []
    for _ in range(3):
        g = [x.cuda() for x in base]
        outs.append(torch.ops.mixprec.unscale_norm_(g, torch.zeros(1, device="cuda"), torch.tensor([0.5], device="cuda")))
    for per, tot in outs[1:]:
        assert torch.equal(per, outs[0][0]) and torch.equal(tot, outs[0][1])


def test_runs_on_current_stream():
    n = 1 << 22
    g = [torch.ones(n, device="cuda")]
    fi, inv = torch.zeros(1, device="cuda"), torch.tensor([0.5], device="cuda")
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(int(2e9))  # ~1 s of GPU time queued on s
        torch.ops.mixprec.unscale_(g, fi, inv)
    # The default stream is not behind the sleep: if the op had been launched
    # there, it would already be done.
    early = g[0][:1].to("cpu", non_blocking=False)
    assert early.item() == 1.0
    s.synchronize()
    assert g[0][0].item() == 0.5 and g[0][-1].item() == 0.5


def test_update_scale_cuda_matches_cpu(gen):
    flags = (torch.rand(200, generator=gen) < 0.2).float()
    s_c, t_c, h_c, k_c = torch.tensor(2.0**16), torch.tensor(0, dtype=torch.int32), torch.tensor(2, dtype=torch.int32), torch.tensor(0)
    s_g, t_g, h_g, k_g = (x.cuda() for x in (s_c, t_c, h_c, k_c))
    for f in flags:
        torch.ops.mixprec.update_scale_ex_(s_c, t_c, h_c, k_c, f, 2.0, 0.5, 3, 2, 1.0, 2.0**20)
        torch.ops.mixprec.update_scale_ex_(s_g, t_g, h_g, k_g, f.cuda(), 2.0, 0.5, 3, 2, 1.0, 2.0**20)
    assert s_c.item() == s_g.item() and t_c.item() == t_g.item() and k_c.item() == k_g.item()


def test_cuda_graph_capture_unscale_and_update(gen):
    static = [torch.zeros(n, device="cuda", dtype=dt) for n, dt in ((1000, torch.bfloat16), (70000, torch.float16), (33, torch.float32))]
    scale = torch.tensor(1024.0, device="cuda")
    tracker = torch.tensor(0, dtype=torch.int32, device="cuda")
    hyst = torch.tensor(1, dtype=torch.int32, device="cuda")
    skipped = torch.tensor(0, device="cuda")
    found_inf = torch.zeros(1, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside the graph
        torch.ops.mixprec.unscale_norm_(static, found_inf, torch.ones(1, device="cuda"))
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        found_inf.zero_()
        inv = scale.double().reciprocal().float()
        per, total = torch.ops.mixprec.unscale_norm_(static, found_inf, inv)
        torch.ops.mixprec.update_scale_ex_(scale, tracker, hyst, skipped, found_inf, 2.0, 0.5, 2, 1, 0.0, float("inf"))
    ref_scale = 1024.0
    for step in range(6):
        data = rand_grads(gen, torch.float32, [1000, 70000, 33])
        if step == 3:
            data[1][5] = float("nan")
        for st, d in zip(static, data):
            st.copy_(d.to(st.dtype))
        want = [st.cpu().clone() for st in static]
        graph.replay()
        torch.cuda.synchronize()
        fi_ref = torch.zeros(1)
        per_ref, _ = torch.ops.mixprec.unscale_norm_(want, fi_ref, torch.tensor([1.0 / ref_scale]))
        for a, b in zip(static, want):
            assert_same(a.cpu(), b)
        assert found_inf.item() == fi_ref.item()
        ref_scale = ref_scale * 0.5 if fi_ref.item() else (ref_scale * 2 if step in (1, 5) else ref_scale)
        assert scale.item() == ref_scale, step
    assert skipped.item() == 1


def test_grad_scaler_cuda_bf16_fp16(gen):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).cuda()
    for dtype in (torch.bfloat16, torch.float16):
        m = model.to(dtype)
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        s = mixprec.amp.GradScaler("cuda", init_scale=256.0)
        x = torch.randn(8, 16, generator=gen).to("cuda", dtype)
        s.scale(m(x).float().sum()).backward()
        scaled = [p.grad.clone() for p in m.parameters()]
        norm = s.unscale_(opt, return_norm=True)
        for p, g in zip(m.parameters(), scaled):
            assert torch.equal(p.grad, (g.float() * (1 / 256.0)).to(dtype))
        want = torch.sqrt(sum(p.grad.double().square().sum() for p in m.parameters()))
        torch.testing.assert_close(norm.double(), want, rtol=1e-6, atol=0)
        s.step(opt)
        s.update()


def test_bad_inputs_cuda(gen):
    g = [torch.randn(10, device="cuda"), torch.randn(10)]
    fi = torch.zeros(1, device="cuda")
    before = [x.clone() for x in g]
    with pytest.raises(RuntimeError, match=r"grads\[1\]"):
        torch.ops.mixprec.unscale_(g, fi, torch.tensor([0.5], device="cuda"))
    assert all(torch.equal(a, b) for a, b in zip(g, before))
    with pytest.raises(RuntimeError, match="inv_scale"):
        torch.ops.mixprec.unscale_(g[:1], fi, torch.tensor([0.5]))
    assert fi.item() == 0.0


@pytest.mark.parametrize("cls,kw", [(mixprec.optim.AdamW, dict(lr=1e-2, amsgrad=True)),
                                    (mixprec.optim.SGD, dict(lr=1e-2, momentum=0.9, nesterov=True))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_optimizer_cuda_matches_cpu(gen, cls, kw, dtype):
    shapes = [(1,), (7,), (33, 5), (4097,), (100003,)]
    cpu = [torch.nn.Parameter(torch.randn(*s, generator=gen).to(dtype)) for s in shapes]
    gpu = [torch.nn.Parameter(p.detach().cuda()) for p in cpu]
    oc, og = cls(cpu, **kw), cls(gpu, **kw)
    for step in range(10):
        for p, q in zip(cpu, gpu):
            g = torch.randn(p.shape, generator=gen).to(dtype)
            p.grad, q.grad = g, g.cuda()
        oc.step()
        og.step()
    for p, q in zip(cpu, gpu):
        assert_same(p.detach(), q.detach().cpu())
        for k, v in oc.state[p].items():
            torch.testing.assert_close(og.state[q][k].cpu(), v, rtol=2e-7, atol=0)


def test_optimizer_step_in_cuda_graph_with_scaler(gen):
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).cuda().bfloat16()
    ref = [p.detach().clone() for p in model.parameters()]
    opt = mixprec.optim.AdamW(model.parameters(), lr=torch.tensor(1e-3, device="cuda"))
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()  # creates state outside the graph
    ref_params = [torch.nn.Parameter(r) for r in ref]
    ref_opt = mixprec.optim.AdamW(ref_params, lr=torch.tensor(1e-3, device="cuda"))
    for p in ref_params:
        p.grad = torch.zeros_like(p)
    ref_opt.step()
    found_inf = torch.zeros((), device="cuda")
    grad_scale = torch.tensor(256.0, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        opt.found_inf, opt.grad_scale = found_inf, grad_scale
        with torch.cuda.graph(graph, stream=s):
            opt.step()
        del opt.found_inf, opt.grad_scale
    torch.cuda.current_stream().wait_stream(s)
    for step in range(5):
        grads = [torch.randn(p.shape, generator=gen).to("cuda", torch.bfloat16) for p in model.parameters()]
        for p, q, g in zip(model.parameters(), ref_params, grads):
            p.grad.copy_(g * 256)
            q.grad = (g * 256).clone()
        found_inf.fill_(1.0 if step == 2 else 0.0)
        graph.replay()
        ref_opt.found_inf, ref_opt.grad_scale = found_inf.clone(), grad_scale
        ref_opt.step()
        del ref_opt.found_inf, ref_opt.grad_scale
    torch.cuda.synchronize()
    for p, q in zip(model.parameters(), ref_params):
        assert torch.equal(p, q)


def test_grad_norm_cuda_is_read_only_and_matches_unscale_norm(gen):
    cpu = rand_grads(gen, torch.bfloat16, [5000]) + rand_grads(gen, torch.float16, [210]) + rand_grads(gen, torch.float32, [65537])
    grads = [g.cuda() for g in cpu]
    keep = [g.clone() for g in grads]
    inv = torch.tensor([1.0 / 1024], device="cuda")
    fa, fb = torch.zeros(1, device="cuda"), torch.zeros(1, device="cuda")
    na, ta = torch.ops.mixprec.grad_norm(grads, fa, inv)
    for g, k in zip(grads, keep):
        assert torch.equal(g, k)
    nb, tb = torch.ops.mixprec.unscale_norm_(grads, fb, inv)
    assert torch.equal(na, nb) and torch.equal(ta, tb) and torch.equal(fa, fb)
    # CPU twin: norms equal to float rounding (the summation orders differ).
    cpu = [k.cpu() for k in keep]
    nc, tc = torch.ops.mixprec.grad_norm(cpu, torch.zeros(1), inv.cpu())
    torch.testing.assert_close(na.cpu(), nc, rtol=2e-6, atol=0)


def test_folded_clip_on_cuda_matches_cpu(gen):
    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).bfloat16()
    nets = {"cpu": net, "cuda": __import__("copy").deepcopy(net).cuda()}
    opts = {k: mixprec.optim.AdamW(m.parameters(), lr=1e-2) for k, m in nets.items()}
    scalers = {k: mixprec.amp.GradScaler(k, init_scale=1024.0) for k in nets}
    for _ in range(3):
        x = torch.randn(16, 64, generator=gen).bfloat16()
        y = torch.randint(0, 10, (16,), generator=gen)
        norms = {}
        for k, m in nets.items():
            loss = torch.nn.functional.cross_entropy(m(x.to(k)).float(), y.to(k))
            norms[k] = mixprec.amp.backward_and_step(loss, opts[k], scalers[k], max_norm=0.1)
        torch.testing.assert_close(norms["cuda"].cpu(), norms["cpu"], rtol=1e-5, atol=0)
    for p, q in zip(nets["cpu"].parameters(), nets["cuda"].parameters()):
        torch.testing.assert_close(opts["cuda"].state[q]["master"].cpu(), opts["cpu"].state[p]["master"], rtol=1e-4, atol=1e-5)
