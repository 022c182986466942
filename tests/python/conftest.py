import sys
import zlib
from pathlib import Path

import pytest
import torch

try:
    import mixprec  # noqa: F401  (installed package)
except ImportError:
    # Source tree: python/ on the path, libraries from build/.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
    import mixprec  # noqa: F401

from _op_tester import generate_tests, isa_params
from _reference import cpu_lib
from _reference import requires_cuda  # noqa: F401  (its home is _reference; kept importable from here)


def pytest_generate_tests(metafunc):
    generate_tests(metafunc)  # the OpTester classes' dtypes, devices, cases, bad cases, CPU paths


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device and libmixprec_cuda.so")


@pytest.fixture
def gen(request):
    """A generator seeded from the test's id: every test draws its own random
    data, and a failure reproduces."""
    return torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))


def _on_isa(request, name):
    if name == "auto":
        yield name
        return
    lib = cpu_lib()
    code = {"scalar": 1, "avx2": 2, "avx512": 3}[name]
    if not lib.mixprec_cpu_isa_supported(code):
        pytest.skip(f"this CPU has no {name} path")
    assert lib.mixprec_set_cpu_isa(code) == 0
    yield name
    lib.mixprec_set_cpu_isa(0)


@pytest.fixture(params=isa_params(["scalar", "avx2", "avx512"]))
def isa(request):
    """Runs the test once on each CPU path of libmixprec.so (skipped where the
    CPU lacks it), then puts the library back on its own choice (only on
    that choice in the second torch's run: see isa_params)."""
    yield from _on_isa(request, request.param)


@pytest.fixture
def op_isa(request):
    """An OpTester's CPU path, from its class's ``isas`` ("auto": the
    library's own choice, nothing set)."""
    yield from _on_isa(request, request.param)
