import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """The guard and parity tests train tiny models: one thread is faster
    than two on a shared machine (the C tests cover 1 and 2 threads)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
