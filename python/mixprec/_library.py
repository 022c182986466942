"""Finding and loading mixprec's compiled libraries.

``libmixprec.so`` holds the C kernels and the CPU registrations and loads on
any torch >= 2.10; ``libmixprec_cuda.so`` holds the CUDA kernels and is loaded
only when torch has CUDA. Plain ``torch.ops.load_library(library_path())``
gives working eager ops without importing anything else from mixprec.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

_PKG_DIR = Path(__file__).resolve().parent
_REPO_BUILD = _PKG_DIR.parent.parent / "build"

_loaded: dict[str, bool] = {}

#: The dtypes every mixprec kernel takes (gradients, parameters, logits, boxes).
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _search_dirs() -> list[Path]:
    dirs = []
    env = os.environ.get("MIXPREC_LIBRARY_DIR")
    if env:
        dirs.append(Path(env))
    dirs += [_PKG_DIR, _REPO_BUILD]
    return dirs


def _find(name: str) -> Path | None:
    for d in _search_dirs():
        p = d / name
        if p.is_file():
            return p
    return None


def library_path() -> str:
    """Path of ``libmixprec.so`` (C kernels + CPU ops).

    Searched in ``$MIXPREC_LIBRARY_DIR``, the installed package, then the
    source tree's ``build/`` directory.
    """
    p = _find("libmixprec.so")
    if p is None:
        raise RuntimeError(
            "mixprec: libmixprec.so not found in "
            + ", ".join(str(d) for d in _search_dirs())
            + "; build it (cmake -S . -B build && cmake --build build) or "
            "pip install --no-build-isolation ./python"
        )
    return str(p)


def cuda_library_path() -> str | None:
    """Path of ``libmixprec_cuda.so`` (CUDA ops), or None if it was not built."""
    p = _find("libmixprec_cuda.so")
    return None if p is None else str(p)


def capi_library_path() -> str | None:
    """Path of ``libmixprec_capi.so``: the C API without torch (for ctypes)."""
    p = _find("libmixprec_capi.so")
    return None if p is None else str(p)


def load() -> None:
    """Loads the libraries into torch once: the CPU one always, the CUDA one
    when torch has CUDA and it was built."""
    if not _loaded.get("cpu"):
        torch.ops.load_library(library_path())
        _loaded["cpu"] = True
    if not _loaded.get("cuda") and torch.cuda.is_available():
        path = cuda_library_path()
        if path is not None:
            torch.ops.load_library(path)
            _loaded["cuda"] = True


def cuda_ops_loaded() -> bool:
    """True when mixprec's CUDA kernels are registered with torch."""
    return bool(_loaded.get("cuda"))


def handles(device: torch.device) -> bool:
    """True when mixprec's kernels run on ``device`` (the CPU always, CUDA
    when its library is loaded)."""
    if device.type == "cpu":
        return True
    return device.type == "cuda" and cuda_ops_loaded()
