"""One tester base for the op families, after torchvision's ``RoIOpTester``
(torchvision/test/test_ops.py): a family's test class fills in a few hooks and
inherits the checks every op owes, written once here.

Hooks (see each one's docstring): ``make_inputs`` (fresh random call
arguments for a dtype, a device and a case), ``call`` (the public function),
``check_forward`` (the output against a reference on upcast / float64
inputs), ``check_backward`` (gradients against a reference; default: float64
autograd of ``reference``), ``opcheck_cases``, ``empty_inputs`` /
``check_empty``, ``noncontiguous`` and ``bad_cases``. Class attributes:
``dtypes``, ``devices``, ``cases`` (forward) and ``grad_cases`` (backward,
default the same), ``isas`` (the CPU paths the forward and backward run on),
``grad_argnums`` (the arguments that take a gradient; empty: no backward),
``compile_dtype`` and ``layout_case`` (the compile and non-contiguous checks'),
and ``skip_reason`` (a case left out on a CPU path, for time).

The checks: forward and backward on fresh random data for each dtype, case,
device and CPU path; ``torch.compile(fullgraph=True)`` equals eager bit for
bit (gradients too); ``torch.library.opcheck``; empty input; non-contiguous
input equals the contiguous result bit for bit; each bad input raises a
RuntimeError naming the op and the argument (the case's pattern), without a
C++ source location, leaves every input bitwise unchanged, and a valid call
works afterwards. The parametrisation from the class attributes is made by
``generate_tests`` (called from conftest.py's ``pytest_generate_tests``).
"""

from __future__ import annotations

import inspect
import os

import pytest
import torch
from torch.library import opcheck

from _reference import DTYPES, assert_near, requires_cuda

# Every check opcheck runs by default (its test_utils argument's default).
OPCHECK_UTILS = tuple(inspect.signature(opcheck).parameters["test_utils"].default)
DEVICES = ["cpu", pytest.param("cuda", marks=[requires_cuda, pytest.mark.cuda])]


# scripts/test.sh's second pytest run: the same binary on another torch
# (2.13.0), which trims what that torch cannot change (isa_params, and
# tests/python/api/test_demo.py's full-mode parity).
SECOND_TORCH = os.environ.get("MIXPREC_TEST_SECOND_TORCH") == "1"


def isa_params(isas):
    """The CPU paths a test runs on: ``isas``, or only the library's own
    choice ("auto") in the SECOND_TORCH run (the same binary on torch
    2.13.0, scripts/test.sh): the CPU paths
    are torch-free C, the same machine code whichever torch loads the
    library, and the first run tested each of them; what the second run
    tests is the binary's registration, ABI and dispatch on another torch,
    which one path exercises as well as three."""
    return ["auto"] if SECOND_TORCH else list(isas)


def _id(v):
    if isinstance(v, torch.dtype):
        return str(v)[6:]
    return None


def generate_tests(metafunc):
    """Parametrise an OpTester method's dtype / device / case / grad_case /
    bad_case / op_isa arguments from its class's attributes."""
    cls = metafunc.cls
    if cls is None or not issubclass(cls, OpTester):
        return
    names = metafunc.fixturenames
    if "dtype" in names:
        metafunc.parametrize("dtype", cls.dtypes, ids=_id)
    if "device" in names:
        metafunc.parametrize("device", cls.devices)
    if "case" in names:
        metafunc.parametrize("case", cls.cases, ids=[cls.case_id(c) for c in cls.cases])
    if "grad_case" in names:
        grad_cases = [] if not cls.grad_argnums else cls.cases if cls.grad_cases is None else cls.grad_cases
        metafunc.parametrize("grad_case", grad_cases, ids=[cls.case_id(c) for c in grad_cases])
    if "bad_case" in names:
        cases = cls.bad_cases()
        metafunc.parametrize("bad_case", cases, ids=[c[0] for c in cases])
    if "op_isa" in names:
        metafunc.parametrize("op_isa", isa_params(cls.isas), indirect=True)


def _tensors(args):
    """Every tensor among args (lists and tuples opened)."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(_tensors(a))
    return out


def _snapshot(args):
    return [(t, t.detach().cpu().clone()) for t in _tensors(args) if t.device.type != "meta"]


def _assert_unchanged(snap):
    for t, before in snap:
        after = t.detach().cpu()
        assert after.dtype == before.dtype and after.shape == before.shape
        if before.is_floating_point():
            width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[before.element_size()]
            assert torch.equal(after.view(width), before.view(width)), "an input changed"
        else:
            assert torch.equal(after, before), "an input changed"


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def assert_same_outputs(a, b):
    """Bitwise equal (NaN equals NaN), tensors or tuples of them."""
    if isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_outputs(x, y)
        return
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    if a.is_floating_point():
        nan = torch.isnan(a)
        assert torch.equal(nan, torch.isnan(b))
        assert torch.equal(a[~nan], b[~nan])
    else:
        assert torch.equal(a, b)


class OpTester:
    """Base of the per-family op testers; subclasses are ``Test*`` classes."""

    dtypes = DTYPES
    devices = DEVICES
    cases = [None]
    grad_cases = None
    isas = ["auto"]
    grad_argnums: tuple = ()
    compile_dtype = torch.bfloat16
    layout_case = None  # the case of the compile and non-contiguous checks (None: cases[0])

    # ---- hooks -------------------------------------------------------------------

    @staticmethod
    def case_id(case):
        return str(case)

    def skip_reason(self, case, isa, backward):
        """A reason to skip this case on this CPU path (the time budget), or None."""
        return None

    def _layout_case(self):
        return self.cases[0] if self.layout_case is None else self.layout_case

    def make_inputs(self, gen, dtype, device, case):
        """The positional arguments of ``call``, drawn from ``gen``."""
        raise NotImplementedError

    def call(self, *args):
        """The public function under test."""
        raise NotImplementedError

    def reference(self, *args):
        """The op on the given (upcast) inputs in plain torch / torchvision."""
        raise NotImplementedError

    def check_forward(self, args, out, case):
        """Default: ``out`` within ``assert_near`` of ``reference`` on the
        inputs upcast to float64, in the inputs' dtype."""
        dtype = _tensors(args)[0].dtype
        ref = self.reference(*self.upcast(args))
        for o, r in zip(out if isinstance(out, tuple) else (out,), ref if isinstance(ref, tuple) else (ref,)):
            assert_near(o, r, dtype)

    def upcast(self, args, dtype=torch.float64):
        """args on the CPU, floating tensors converted to ``dtype`` (leaves of
        their own, taking a gradient where the argument does)."""
        out = []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                a = a.detach().cpu()
                if a.is_floating_point():
                    a = a.to(dtype).requires_grad_(i in self.grad_argnums)
            out.append(a)
        return out

    def grad_output(self, gen, out):
        o = _first(out)
        return torch.randn(o.shape, generator=gen).to(o.dtype).to(o.device)

    def check_backward(self, args, out, g, grads, case):
        """Default: the gradients within ``assert_near`` of float64 autograd
        through ``reference``."""
        ref_args = self.upcast(args)
        ref = _first(self.reference(*ref_args))
        want = torch.autograd.grad(ref, [ref_args[i] for i in self.grad_argnums], g.double().cpu())
        for got, w, i in zip(grads, want, self.grad_argnums):
            assert got.dtype == args[i].dtype and got.shape == args[i].shape
            assert_near(got, w, args[i].dtype)

    def opcheck_cases(self, gen, dtype):
        """(op overload, args) pairs for ``torch.library.opcheck``."""
        return []

    def empty_inputs(self, dtype, device):
        """Arguments of ``call`` with zero-size tensors (a list of them)."""
        return []

    def check_empty(self, args, out):
        """What the empty call must give."""
        raise NotImplementedError

    def noncontiguous(self, args):
        """Variants of args with non-contiguous tensors (same values)."""
        return []

    @classmethod
    def bad_cases(cls):
        """(id, make(args) -> callable, pattern): make gets valid float32
        CPU arguments and returns a call that must raise RuntimeError matching
        pattern (which names the op and the argument)."""
        return []

    # ---- the checks ----------------------------------------------------------------

    def test_forward(self, gen, dtype, device, case, op_isa):
        reason = self.skip_reason(case, op_isa, False)
        if reason:
            pytest.skip(reason)
        args = self.make_inputs(gen, dtype, device, case)
        snap = _snapshot(args)
        out = self.call(*args)
        self.check_forward(args, out, case)
        _assert_unchanged(snap)

    def test_backward(self, gen, dtype, device, grad_case, op_isa):
        reason = self.skip_reason(grad_case, op_isa, True)
        if reason:
            pytest.skip(reason)
        args = list(self.make_inputs(gen, dtype, device, grad_case))
        for i in self.grad_argnums:
            args[i] = args[i].detach().clone().requires_grad_()
        out = self.call(*args)
        g = self.grad_output(gen, out)
        grads = torch.autograd.grad(_first(out), [args[i] for i in self.grad_argnums], g)
        self.check_backward([a.detach() if isinstance(a, torch.Tensor) else a for a in args], out, g, grads, grad_case)

    def test_compile_equals_eager(self, gen, device):
        args = self.make_inputs(gen, self.compile_dtype, device, self._layout_case())
        compiled = torch.compile(self.call, fullgraph=True, backend="aot_eager")
        if not self.grad_argnums:
            assert_same_outputs(compiled(*args), self.call(*args))
            return
        runs = []
        for fn in (self.call, compiled):
            a = list(args)
            for i in self.grad_argnums:
                a[i] = a[i].detach().clone().requires_grad_()
            out = fn(*a)
            g = torch.ones_like(_first(out))
            grads = torch.autograd.grad(_first(out), [a[i] for i in self.grad_argnums], g)
            runs.append((tuple(o.detach() for o in out) if isinstance(out, tuple) else out.detach(), grads))
        assert_same_outputs(runs[1][0], runs[0][0])
        assert_same_outputs(runs[1][1], runs[0][1])

    def test_opcheck(self, gen, dtype):
        cases = self.opcheck_cases(gen, dtype)
        assert cases, "no opcheck case"
        # opcheck's make_fx trace (test_aot_dispatch_dynamic: graph checks,
        # blind to the dtype, and most of opcheck's time) on the compile
        # check's dtype only; the schema, the autograd registration and the
        # fake kernel's output dtypes on every dtype.
        trace_dtype = self.compile_dtype if self.compile_dtype in self.dtypes else self.dtypes[0]
        utils = [u for u in OPCHECK_UTILS if dtype == trace_dtype or u != "test_aot_dispatch_dynamic"]
        for op, args in cases:
            opcheck(op, args, test_utils=utils)

    def test_empty(self, dtype, device):
        cases = self.empty_inputs(dtype, device)
        assert cases, "no empty case"
        for args in cases:
            self.check_empty(args, self.call(*args))

    def test_noncontiguous(self, gen, dtype):
        args = self.make_inputs(gen, dtype, "cpu", self._layout_case())
        want = self.call(*args)
        variants = self.noncontiguous(args)
        assert variants, "no non-contiguous variant"
        for v in variants:
            assert any(isinstance(t, torch.Tensor) and not t.is_contiguous() for t in _tensors(v))
            assert_same_outputs(self.call(*v), want)

    def test_bad_input(self, gen, bad_case):
        _, make, pattern = bad_case
        args = self.make_inputs(gen, torch.float32, "cpu", self.cases[0])
        fn = make(args)
        snap = _snapshot(args)
        with pytest.raises(RuntimeError, match=pattern) as info:
            fn()
        msg = str(info.value)
        assert "mixprec::" in msg and ".cpp:" not in msg and ".h:" not in msg, msg
        _assert_unchanged(snap)
        self.call(*args)  # the process still works
