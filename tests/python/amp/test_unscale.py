"""mixprec::unscale_ / unscale_norm_ against torch._amp_foreach_non_finite_check_and_unscale_."""

import pytest
import torch
from torch.library import opcheck

import mixprec

from _reference import DTYPES, assert_same, rand_grads, torch_unscale

SIZES = [1, 7, 16, 17, 4097, 65537, 200003]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inv", [2.0**-16, 1.0 / 3.0, 1.0, 37.5])
def test_bitwise_equal_to_torch(gen, dtype, inv):
    grads = rand_grads(gen, dtype, SIZES)
    ref, ref_fi = torch_unscale(grads, inv)
    ours = [g.clone() for g in grads]
    fi = torch.zeros(1)
    torch.ops.mixprec.unscale_(ours, fi, torch.tensor([inv]))
    for a, b in zip(ours, ref):
        assert_same(a, b)
    assert fi.item() == ref_fi.item() == 0.0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_nonfinite_detected(gen, dtype, bad, where):
    grads = rand_grads(gen, dtype, [33, 4097, 70001])
    t = grads[1]
    idx = {"first": 0, "middle": t.numel() // 2, "last": t.numel() - 1}[where]
    t[idx] = bad
    ref, ref_fi = torch_unscale(grads, 0.25)
    fi = torch.zeros(1)
    torch.ops.mixprec.unscale_(grads, fi, torch.tensor([0.25]))
    assert fi.item() == ref_fi.item() == 1.0
    for a, b in zip(grads, ref):
        assert_same(a, b)


def test_found_inf_never_cleared(gen):
    grads = rand_grads(gen, torch.float32, [100])
    fi = torch.ones(1)
    torch.ops.mixprec.unscale_(grads, fi, torch.tensor([0.5]))
    assert fi.item() == 1.0


def test_mixed_dtypes_one_call(gen):
    grads = []
    for i, n in enumerate([5, 4097, 70001, 0, 3, 65536]):
        grads += rand_grads(gen, DTYPES[i % 3], [n])
    grads[2][7] = float("nan")
    ref = [g.clone() for g in grads]
    ref_fi = torch.zeros(1)
    for dt in DTYPES:
        group = [r for r in ref if r.dtype == dt]
        torch._amp_foreach_non_finite_check_and_unscale_(group, ref_fi, torch.tensor([1 / 1024]))
    fi = torch.zeros(1)
    torch.ops.mixprec.unscale_(grads, fi, torch.tensor([1 / 1024]))
    assert fi.item() == ref_fi.item() == 1.0
    for a, b in zip(grads, ref):
        assert_same(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_from_same_pass(gen, dtype):
    grads = rand_grads(gen, dtype, SIZES + [0])
    ref, _ = torch_unscale(grads, 1 / 512)
    fi = torch.zeros(1)
    per, total = torch.ops.mixprec.unscale_norm_(grads, fi, torch.tensor([1 / 512]))
    for a, b in zip(grads, ref):
        assert_same(a, b)
    want = torch.stack([torch.linalg.vector_norm(r.double()) for r in ref])
    assert per.dtype == torch.float32 and per.shape == (len(grads),)
    assert total.dtype == torch.float32 and total.shape == ()
    torch.testing.assert_close(per.double(), want, rtol=1e-6, atol=0)
    # The norm clip_grad_norm_ computes on the unscaled grads (in float64).
    clip_norm = torch.nn.utils.get_total_norm([r.double() for r in ref])
    torch.testing.assert_close(total.double(), clip_norm, rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_of_huge_finite_grads_is_finite(gen, dtype):
    """Squares of 1e20 overflow float; the norm (1e20 * sqrt(n)) does not."""
    grads = [(torch.randn(5000, generator=gen) * 1e20).to(dtype), (torch.randn(300, generator=gen) * 3e36).to(dtype)]
    ref = [g.double() for g in grads]
    fi = torch.zeros(1)
    per, total = torch.ops.mixprec.unscale_norm_(grads, fi, torch.tensor([1.0]))
    assert fi.item() == 0.0
    torch.testing.assert_close(per.double(), torch.stack([torch.linalg.vector_norm(r) for r in ref]), rtol=1e-6, atol=0)
    torch.testing.assert_close(total.double(), torch.nn.utils.get_total_norm(ref), rtol=1e-6, atol=0)


def test_norm_nonfinite(gen):
    grads = rand_grads(gen, torch.bfloat16, [100, 100])
    grads[1][3] = float("inf")
    fi = torch.zeros(1)
    per, total = mixprec.ops.unscale_(grads, fi, torch.tensor([0.5]), return_norm=True)
    assert torch.isfinite(per[0]) and torch.isinf(per[1]) and torch.isinf(total)


def test_dense_non_contiguous_layouts(gen):
    """channels_last and transposed grads are dense: handled in place."""
    cl = torch.randn(4, 8, 5, 5, generator=gen).to(memory_format=torch.channels_last).to(torch.bfloat16)
    tr = torch.randn(9, 13, generator=gen).t()
    ref, _ = torch_unscale([cl, tr], 0.125)
    fi = torch.zeros(1)
    torch.ops.mixprec.unscale_([cl, tr], fi, torch.tensor([0.125]))
    assert_same(cl, ref[0])
    assert_same(tr, ref[1])
    assert cl.is_contiguous(memory_format=torch.channels_last)


def test_zero_dim_and_empty_tensors(gen):
    grads = [torch.tensor(3.0), torch.empty(0, dtype=torch.float16), torch.randn(0, 5, generator=gen)]
    fi = torch.zeros(1)
    per, total = torch.ops.mixprec.unscale_norm_(grads, fi, torch.tensor([0.5]))
    assert grads[0].item() == 1.5
    assert per.tolist() == [1.5, 0.0, 0.0] and total.item() == 1.5


def test_thread_count_does_not_change_results(gen):
    grads = rand_grads(gen, torch.bfloat16, [1_000_003, 300_001]) + rand_grads(gen, torch.float32, [500_000])
    results = []
    old = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            g = [x.clone() for x in grads]
            fi = torch.zeros(1)
            per, total = torch.ops.mixprec.unscale_norm_(g, fi, torch.tensor([0.3]))
            results.append((g, per, total))
    finally:
        torch.set_num_threads(old)
    (g1, p1, t1), (g2, p2, t2) = results
    for a, b in zip(g1, g2):
        assert_same(a, b)
    assert torch.equal(p1, p2) and torch.equal(t1, t2)


def _samples(gen):
    grads = rand_grads(gen, torch.float32, [10, 3]) + rand_grads(gen, torch.bfloat16, [5])
    return [
        (grads, torch.zeros(1), torch.tensor([0.5])),
        ([g.clone() for g in grads[:1]], torch.zeros(()), torch.tensor(0.25)),
    ]


def test_opcheck_unscale(gen):
    for grads, fi, inv in _samples(gen):
        opcheck(torch.ops.mixprec.unscale_.default, ([g.clone() for g in grads], fi.clone(), inv))


def test_opcheck_unscale_norm(gen):
    for grads, fi, inv in _samples(gen):
        opcheck(torch.ops.mixprec.unscale_norm_.default, ([g.clone() for g in grads], fi.clone(), inv))


def test_opcheck_update_scale():
    args = (torch.tensor(1024.0), torch.tensor(2, dtype=torch.int32), torch.tensor(0.0), 2.0, 0.5, 3)
    opcheck(torch.ops.mixprec.update_scale_.default, args)
    args_ex = (
        torch.tensor(1024.0),
        torch.tensor(2, dtype=torch.int32),
        torch.tensor(2, dtype=torch.int32),
        torch.tensor(0, dtype=torch.int64),
        torch.tensor(1.0),
        2.0,
        0.5,
        3,
        2,
        1.0,
        65536.0,
    )
    opcheck(torch.ops.mixprec.update_scale_ex_.default, args_ex)


def test_torch_compile_fullgraph(gen):
    grads = rand_grads(gen, torch.bfloat16, [1000, 37])
    grads[1][5] = float("nan")
    ref = [g.clone() for g in grads]

    def step(gs, scale, tracker):
        fi = torch.zeros((), dtype=torch.float32)
        inv = scale.double().reciprocal().float()
        per, total = torch.ops.mixprec.unscale_norm_(gs, fi, inv)
        torch.ops.mixprec.update_scale_(scale, tracker, fi, 2.0, 0.5, 2000)
        return total

    s1, t1 = torch.tensor(1024.0), torch.tensor(5, dtype=torch.int32)
    s2, t2 = s1.clone(), t1.clone()
    n1 = torch.compile(step, fullgraph=True, backend="aot_eager")(grads, s1, t1)
    n2 = step(ref, s2, t2)
    for a, b in zip(grads, ref):
        assert_same(a, b)
    assert s1.item() == s2.item() == 512.0 and t1.item() == t2.item() == 0
    assert torch.isnan(n1) and torch.isnan(n2)


def test_update_scale_matches_torch(gen):
    s1, g1 = torch.tensor(2.0**16), torch.tensor(0, dtype=torch.int32)
    s2, g2 = s1.clone(), g1.clone()
    flags = (torch.rand(300, generator=gen) < 0.15).float()
    flags[[10, 50]] = float("nan")
    for f in flags:
        torch._amp_update_scale_(s1, g1, f.reshape(1), 1.7, 0.9, 4)
        torch.ops.mixprec.update_scale_(s2, g2, f.reshape(1), 1.7, 0.9, 4)
        assert s1.item() == s2.item() and g1.item() == g2.item()


def test_update_scale_extras():
    scale = torch.tensor(8.0)
    growth = torch.tensor(0, dtype=torch.int32)
    hyst = torch.tensor(2, dtype=torch.int32)
    skipped = torch.tensor(0, dtype=torch.int64)

    def upd(found):
        mixprec.ops.update_scale_(
            scale, growth, torch.tensor(found), 2.0, 0.5, 2,
            hysteresis_tracker=hyst, skipped_steps=skipped, hysteresis=2, min_scale=2.0, max_scale=16.0,
        )
        return scale.item()

    assert upd(1.0) == 8.0  # first overflow absorbed by hysteresis
    assert upd(1.0) == 4.0  # second in a row backs off
    assert upd(1.0) == 2.0
    assert upd(1.0) == 2.0  # min_scale
    assert upd(0.0) == 2.0 and upd(0.0) == 4.0  # growth after 2 clean steps
    assert upd(1.0) == 4.0  # hysteresis was reset by the clean steps
    assert upd(0.0) == 4.0 and upd(0.0) == 8.0 and upd(0.0) == 8.0 and upd(0.0) == 16.0
    assert upd(0.0) == 16.0 and upd(0.0) == 16.0  # max_scale
    assert skipped.item() == 5


def test_torchscript(gen):
    @torch.jit.script
    def scripted(gs: list[torch.Tensor], fi: torch.Tensor, inv: torch.Tensor):
        torch.ops.mixprec.unscale_(gs, fi, inv)

    grads = rand_grads(gen, torch.float16, [100])
    ref, _ = torch_unscale(grads, 0.5)
    fi = torch.zeros(1)
    scripted(grads, fi, torch.tensor([0.5]))
    assert_same(grads[0], ref[0])
