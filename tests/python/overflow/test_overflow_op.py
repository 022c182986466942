"""mixprec::overflow_check_ on the CPU against a torch reference (isfinite,
abs().max() on the finite elements): flags, largest finite magnitude, inputs
read only when an output is not finite, accumulation; opcheck; bad inputs."""

import pytest
import torch
from torch.library import opcheck

import mixprec
from mixprec import _overflow as ov


def _ref(outs):
    vals = torch.cat([t.detach().reshape(-1).float() for t in outs]) if outs else torch.zeros(0)
    fin = torch.isfinite(vals)
    amax = vals[fin].abs().max().item() if bool(fin.any()) else 0.0
    return bool((~fin).any()), amax


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_record_matches_reference(gen, dtype):
    for n in (1, 31, 5000, 300_000):  # the last runs on threads
        outs = [(torch.randn(n, generator=gen) * 1000).to(dtype), torch.randn(3, 7, generator=gen).bfloat16()]
        ins = [torch.randn(n, generator=gen).to(dtype)]
        ins[0][n // 2] = float("inf")  # never read: the outputs are finite
        rec = ov.new_record(4)
        keep = [t.clone() for t in outs + ins]
        ov.overflow_check_(outs, ins, rec, 2)
        for t, k in zip(outs + ins, keep):
            assert torch.equal(t, k)  # read-only
        bad, amax = _ref(outs)
        assert not bad
        assert rec[2, ov.AMAX].item() == amax
        assert rec[2, [ov.NONFINITE, ov.INPUT_NONFINITE, ov.FROM_FINITE]].tolist() == [0, 0, 0]
        assert torch.count_nonzero(rec[[0, 1, 3]]) == 0 and torch.count_nonzero(rec[2, 4:]) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_nonfinite_from_finite_and_propagated(gen, dtype):
    n = 4097
    for at in (0, n // 2, n - 1):
        for bad in (float("inf"), float("-inf"), float("nan")):
            out = (torch.randn(n, generator=gen) * 50).to(dtype)
            out[at] = bad
            x = torch.randn(n, generator=gen).to(dtype)
            rec = ov.new_record(1)
            ov.overflow_check_([out], [x], rec, 0)
            assert rec[0, :4].tolist() == [1.0, _ref([out])[1], 0.0, 1.0]
            x[(at * 7) % n] = float("nan")
            rec2 = ov.new_record(1)
            ov.overflow_check_([out], [x.t()], rec2, 0)
            assert rec2[0, :4].tolist() == [1.0, _ref([out])[1], 1.0, 0.0]


def test_overflow_from_a_real_fp16_matmul(gen):
    a = torch.randn(16, 64, generator=gen) * 100
    b = torch.randn(64, 16, generator=gen) * 100
    out = a.half() @ b.half()  # |logits| well above 65504 for some entries
    assert not torch.isfinite(out).all() and torch.isfinite(a @ b).all()
    rec = ov.new_record(1)
    ov.overflow_check_([out], [a.half(), b.half()], rec, 0)
    assert rec[0, ov.FROM_FINITE].item() == 1.0
    assert rec[0, ov.AMAX].item() == _ref([out])[1] <= 65504


def test_accumulates_strided_and_aliasing(gen):
    rec = ov.new_record(2)
    x = torch.randn(40, 30, generator=gen) * 3
    ov.overflow_check_([x[:, ::3]], [x], rec, 1)  # not dense: read through a copy
    assert rec[1, ov.AMAX].item() == x[:, ::3].abs().max().item()
    y = (torch.randn(100, generator=gen) * 9000).half()
    ov.overflow_check_([y], [y], rec, 1)  # an in-place module: input is output
    assert rec[1, ov.AMAX].item() == max(x[:, ::3].abs().max().item(), y.float().abs().max().item())
    y[5] = float("inf")
    ov.overflow_check_([y], [y], rec, 1)
    assert rec[1, :4].tolist()[0] == 1.0 and rec[1, ov.INPUT_NONFINITE] == 1.0
    ov.overflow_check_([], [], rec, 0)
    assert torch.count_nonzero(rec[0]) == 0


def test_opcheck_and_compile(gen):
    outs = [torch.randn(5, 6, generator=gen).half(), torch.randn(7, generator=gen)]
    ins = [torch.randn(3, generator=gen).bfloat16()]
    opcheck(torch.ops.mixprec.overflow_check_.default, (outs, ins, ov.new_record(3), 1))

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(x, rec):
        y = x * 1e5
        ov.overflow_check_([y], [x], rec, 0)
        return y

    x = torch.randn(64, generator=gen).half()
    rec = ov.new_record(1)
    y = f(x, rec)
    ref = ov.new_record(1)
    ov.overflow_check_([y], [x], ref, 0)
    assert torch.equal(rec, ref) and rec[0, ov.FROM_FINITE] == 1.0


def test_bad_inputs_name_op_and_argument_and_write_nothing(gen):
    out = torch.randn(10, generator=gen).half()
    out[2] = float("inf")
    rec = torch.full((3, 8), 0.5)
    op = torch.ops.mixprec.overflow_check_.default
    cases = [
        (([out.double()], [], rec, 0), r"outputs\[0\] must be float32, float16 or bfloat16"),
        (([out], [out, out.int()], rec, 0), r"inputs\[1\] must be float32"),
        (([out], [], rec.double(), 0), "record must be float32"),
        (([out], [], rec[:, :4], 0), r"record must have shape \[n_slots, 8\]"),
        (([out], [], rec.t().contiguous().t(), 0), "record must be contiguous"),
        (([out], [], rec, 3), r"slot must be in \[0, 3\), got 3"),
        (([out], [], rec, -1), r"slot must be in \[0, 3\), got -1"),
        (([rec[0]], [], rec, 0), r"outputs\[0\] and record share memory"),
        (([out], [out.to("meta")], rec, 0), r"inputs\[0\] is on meta"),
        (([out.to_sparse()], [], rec, 0), r"outputs\[0\] must be a strided tensor"),
    ]
    for args, msg in cases:
        with pytest.raises(RuntimeError, match="mixprec::overflow_check_: " + msg):
            op(*args)
        assert torch.equal(rec, torch.full((3, 8), 0.5))
