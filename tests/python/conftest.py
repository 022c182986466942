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


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device and libmixprec_cuda.so")


@pytest.fixture
def gen(request):
    """A generator seeded from the test's id: every test draws its own random
    data, and a failure reproduces."""
    return torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))


requires_cuda = pytest.mark.skipif(
    not (torch.cuda.is_available() and mixprec.cuda_ops_loaded()),
    reason="needs a CUDA device and libmixprec_cuda.so",
)
