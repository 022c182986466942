"""The package's metadata and its environment report (`python -m mixprec`).

The wheel itself (py3-none tag, no RUNPATH, manylinux symbol versions,
installed into a fresh venv on torch 2.13.0) is checked by
scripts/check_package.sh, a step of scripts/test.sh.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mixprec

ROOT = Path(__file__).resolve().parents[3]
ISA = {1: "scalar", 2: "avx2", 3: "avx512"}


def _report(**env) -> str:
    e = dict(os.environ)
    e.update(env)
    r = subprocess.run([sys.executable, "-m", "mixprec"], capture_output=True, text=True, env=e, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _field(report: str, name: str) -> str:
    m = re.search(rf"^{re.escape(name)}:\s+(.*)$", report, re.M)
    assert m, f"no {name!r} line in:\n{report}"
    return m.group(1)


def _capi():
    lib = ctypes.CDLL(mixprec.library_path())  # the handle torch loaded
    for f in ("mixprec_version", "mixprec_get_cpu_isa", "mixprec_get_num_threads"):
        getattr(lib, f).restype = ctypes.c_int
    lib.mixprec_cpu_isa_supported.argtypes = [ctypes.c_int]
    return lib


def test_version_is_one_number_everywhere():
    pyproject = (ROOT / "pyproject.toml").read_text()
    v_py = re.search(r'^version\s*=\s*"([^"]+)"', pyproject, re.M).group(1)
    cmake = (ROOT / "CMakeLists.txt").read_text()
    v_cmake = re.search(r"project\(mixprec VERSION ([0-9.]+)", cmake).group(1)
    c = _capi().mixprec_version()
    v_c = f"{c // 10000}.{c // 100 % 100}.{c % 100}"
    assert mixprec.__version__ == v_py == v_cmake == v_c, (mixprec.__version__, v_py, v_cmake, v_c)


def test_report_fields():
    rep = _report()
    assert _field(rep, "mixprec").startswith(mixprec.__version__ + " ")
    assert _field(rep, "torch").startswith(torch.__version__ + " ")
    assert _field(rep, "libmixprec.so") == mixprec.library_path()
    cuda = _field(rep, "libmixprec_cuda.so")
    if mixprec.cuda_library_path() is None:
        assert cuda.startswith("not built")
    else:
        assert cuda.startswith(mixprec.cuda_library_path())
    # The libraries really mapped in the process: ours and torch's.
    mapped = rep[rep.index("libraries mapped:"):]
    assert os.path.realpath(mixprec.library_path()) in mapped or mixprec.library_path() in mapped
    assert "libtorch_cpu.so" in mapped
    lib = _capi()
    isa = _field(rep, "CPU ISA path")
    assert isa.split()[0] == ISA[lib.mixprec_get_cpu_isa()]
    supported = [n for i, n in ISA.items() if lib.mixprec_cpu_isa_supported(i)]
    assert _field(rep, "CPU ISA paths supported") == ", ".join(supported)
    if "MIXPREC_CPU_ISA" not in os.environ:
        assert "(the best this CPU and build support" in isa
        assert isa.split()[0] == supported[-1]
    assert int(_field(rep, "OpenMP threads (mixprec)").split()[0]) == lib.mixprec_get_num_threads()
    gpu = [line for line in rep.splitlines() if line.startswith("GPU")]
    if torch.cuda.is_available():
        assert len(gpu) == torch.cuda.device_count()
        major, minor = torch.cuda.get_device_capability(0)
        assert f"{torch.cuda.get_device_name(0)}, compute capability {major}.{minor}" in gpu[0]
    else:
        assert len(gpu) == 1 and gpu[0].startswith("GPU:") and "none" in gpu[0], gpu


def test_report_says_why_the_isa_path_was_chosen():
    rep = _report(MIXPREC_CPU_ISA="scalar", OMP_NUM_THREADS="1")
    assert _field(rep, "CPU ISA path").startswith("scalar (MIXPREC_CPU_ISA=scalar")
    assert _field(rep, "OpenMP threads (mixprec)") == "1 (OMP_NUM_THREADS=1)"
    rep = _report(MIXPREC_CPU_ISA="sse9")
    best = _field(rep, "CPU ISA paths supported").split(", ")[-1]
    isa = _field(rep, "CPU ISA path")
    assert isa.startswith(f"{best} (MIXPREC_CPU_ISA='sse9' is not one of scalar, avx2, avx512"), isa
    lib = _capi()
    if not lib.mixprec_cpu_isa_supported(3):
        isa = _field(_report(MIXPREC_CPU_ISA="avx512"), "CPU ISA path")
        assert "MIXPREC_CPU_ISA=avx512 asked, but this CPU or build cannot run it" in isa, isa


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf (binutils) not installed")
def test_libraries_carry_no_runpath():
    """torch's libraries are found because torch is loaded first; a RUNPATH
    would be the builder's absolute path."""
    for path in (mixprec.library_path(), mixprec.cuda_library_path()):
        if path is None:
            continue
        dyn = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
        assert "RUNPATH" not in dyn and "RPATH" not in dyn, dyn
        assert "libtorch_cpu.so" in dyn and "libpython" not in dyn, dyn


def test_documented_submodules_after_import_mixprec():
    """The README's ``mixprec.parity.parity(...)`` and ``mixprec.lightning``
    work after a bare ``import mixprec`` (they raised AttributeError), the
    heavy ones are imported only when used, and an unknown name still raises
    AttributeError."""
    code = (
        "import sys, mixprec\n"
        "assert 'mixprec.parity' not in sys.modules and 'mixprec.lightning' not in sys.modules\n"
        "for name in mixprec.__all__: getattr(mixprec, name)\n"
        "assert callable(mixprec.parity.parity) and 'parity' in dir(mixprec)\n"
        "try:\n"
        "    import lightning\n"
        "except ImportError:\n"
        "    pass\n"
        "else:\n"
        "    assert mixprec.lightning.MixedPrecision is not None\n"
        "try:\n"
        "    mixprec.no_such_module\n"
        "except AttributeError as e:\n"
        "    assert 'no_such_module' in str(e)\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n"
        "print('ok')\n"
    )
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python")] + [p for p in e.get("PYTHONPATH", "").split(os.pathsep) if p])
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
