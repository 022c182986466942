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


def _editable_dir() -> Path | None:
    """Where ``pip install -e .`` of this source tree put the libraries.

    An editable install imports the Python files from ``python/mixprec``
    (this directory) and installs the libraries into site-packages/mixprec;
    its ``direct_url.json`` names the source tree it was made from, so a
    different checkout on ``PYTHONPATH`` never takes another tree's build.
    """
    if (_PKG_DIR / "libmixprec.so").is_file():
        return None  # an installed package, or libraries copied next to it
    try:
        import json
        from importlib import metadata

        dist = metadata.distribution("mixprec")
        info = json.loads(dist.read_text("direct_url.json") or "{}")
    except Exception:  # not installed, or no metadata: no editable install
        return None
    if not info.get("dir_info", {}).get("editable"):
        return None
    url = info.get("url", "")
    if not url.startswith("file://"):
        return None
    from urllib.parse import unquote, urlparse

    if Path(unquote(urlparse(url).path)).resolve() != _PKG_DIR.parent.parent:
        return None
    lib = Path(dist.locate_file("mixprec/libmixprec.so"))
    return lib.parent if lib.is_file() else None


def _search_dirs() -> list[Path]:
    dirs = []
    env = os.environ.get("MIXPREC_LIBRARY_DIR")
    if env:
        dirs.append(Path(env))
    dirs.append(_PKG_DIR)
    editable = _editable_dir()
    if editable is not None:
        dirs.append(editable)
    dirs.append(_REPO_BUILD)
    return dirs


def _find(name: str) -> Path | None:
    for d in _search_dirs():
        p = d / name
        if p.is_file():
            return p
    return None


def library_path() -> str:
    """Path of ``libmixprec.so`` (C kernels + CPU ops).

    Searched in ``$MIXPREC_LIBRARY_DIR``, the installed package, the
    libraries of an editable install (``pip install -e .``) of this source
    tree, then the source tree's ``build/`` directory.
    """
    p = _find("libmixprec.so")
    if p is None:
        raise RuntimeError(
            "mixprec: libmixprec.so not found in "
            + ", ".join(str(d) for d in _search_dirs())
            + "; build it (cmake -S . -B build && cmake --build build) or "
            "pip install ."
        )
    return str(p)


def _beside_cpu_library(name: str) -> str | None:
    # Only the directory libmixprec.so came from: a CUDA library of another
    # build (say build/ while MIXPREC_LIBRARY_DIR names a CPU-only build)
    # could define the ops differently.
    p = _find("libmixprec.so")
    if p is None:
        return None
    q = p.parent / name
    return str(q) if q.is_file() else None


def cuda_library_path() -> str | None:
    """Path of ``libmixprec_cuda.so`` (CUDA ops) beside ``library_path()``,
    or None if it was not built."""
    return _beside_cpu_library("libmixprec_cuda.so")


def capi_library_path() -> str | None:
    """Path of ``libmixprec_capi.so`` beside ``library_path()``: the C API
    without torch (for ctypes)."""
    return _beside_cpu_library("libmixprec_capi.so")


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
