"""mixprec::unscale_ / unscale_norm_ / update_scale_ex_ on CUDA: parity with the
CPU ops and torch's CUDA op, determinism, torch's current stream, a CUDA
graph of unscale + update, device errors. Skipped without a GPU; run by
scripts/gpu_check.sh on the lent GPU machine."""

import pytest
import torch

from _reference import DTYPES, assert_same, rand_grads, requires_cuda

pytestmark = [pytest.mark.cuda, requires_cuda]


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
