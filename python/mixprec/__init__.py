"""mixprec: mixed-precision training kernels for PyTorch.

``import mixprec`` loads the compiled libraries into torch (``torch.ops.mixprec``)
and registers their fake kernels. The drop-in classes live in submodules:
``mixprec.amp.GradScaler``, ``mixprec.optim.AdamW``, ``mixprec.optim.SGD``.
``mixprec.parity`` and ``mixprec.lightning`` (which needs Lightning) are
imported on first use, so ``import mixprec`` stays light.
"""

from __future__ import annotations

from ._library import (
    capi_library_path,
    cuda_library_path,
    cuda_ops_loaded,
    library_path,
    load,
)

__version__ = "0.1.0"

load()

# Each family module registers its ops' fake kernels and autograd (needs the
# ops defined, so after load()).
from . import _amp, _cross_entropy, _efficient_nms, _nms, _optim, _softmax  # noqa: E402,F401
from . import _roi_align  # noqa: E402,F401
from . import _overflow  # noqa: E402,F401
from . import _act_pack  # noqa: E402,F401
from . import _distributed  # noqa: E402

_distributed.register_dtensor_handlers()
from . import amp  # noqa: E402
from . import ops  # noqa: E402
from . import optim  # noqa: E402
from . import nn  # noqa: E402
from . import guard  # noqa: E402
from . import memory  # noqa: E402

# Submodules imported on first attribute access (PEP 562).
_LAZY = ("parity", "lightning")


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module = importlib.import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "amp",
    "parity",
    "ops",
    "optim",
    "nn",
    "guard",
    "memory",
    "library_path",
    "cuda_library_path",
    "capi_library_path",
    "cuda_ops_loaded",
    "load",
    "__version__",
]
