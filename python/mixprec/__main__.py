"""``python -m mixprec``: the environment report to paste into a bug report.

Prints mixprec's and torch's versions, the libraries loaded (mixprec's and
the torch / OpenMP libraries they run on, as mapped in this process), the
CPU kernels' instruction-set path and why it was chosen, the OpenMP thread
count, whether the CUDA library is there and loaded, and the GPUs.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

_ISA_NAMES = {1: "scalar", 2: "avx2", 3: "avx512"}


def _mapped_libraries(fragments: tuple[str, ...]) -> list[str]:
    """Shared objects mapped into this process whose file name contains one
    of ``fragments`` (Linux: /proc/self/maps), in load order."""
    seen: list[str] = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) < 6:
                    continue
                path = parts[5].strip()
                name = os.path.basename(path)
                if ".so" in name and any(s in name for s in fragments) and path not in seen:
                    seen.append(path)
    except OSError:
        pass
    return seen


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_report(lib: ctypes.CDLL) -> list[tuple[str, str]]:
    """ISA path and threads, asked from the library torch runs the ops in
    (dlopen of the same path returns the same handle, so the same state)."""
    lib.mixprec_get_cpu_isa.restype = ctypes.c_int
    lib.mixprec_cpu_isa_supported.argtypes = [ctypes.c_int]
    lib.mixprec_cpu_isa_supported.restype = ctypes.c_int
    lib.mixprec_get_num_threads.restype = ctypes.c_int
    active = _ISA_NAMES.get(lib.mixprec_get_cpu_isa(), "unknown")
    supported = [n for i, n in sorted(_ISA_NAMES.items()) if lib.mixprec_cpu_isa_supported(i)]
    missing = [n for n in ("avx512", "avx2") if n not in supported]
    best = supported[-1]
    env = os.environ.get("MIXPREC_CPU_ISA")
    if env is None:
        why = "the best this CPU and build support (MIXPREC_CPU_ISA unset)"
    elif env not in _ISA_NAMES.values():
        why = f"MIXPREC_CPU_ISA={env!r} is not one of scalar, avx2, avx512: ignored, best supported taken"
    elif env not in supported:
        why = f"MIXPREC_CPU_ISA={env} asked, but this CPU or build cannot run it: best supported taken"
    elif env == active:
        why = f"MIXPREC_CPU_ISA={env}"
    else:
        why = f"set at run time (mixprec_set_cpu_isa); MIXPREC_CPU_ISA={env}"
    if env is None and active != best:
        why = "set at run time (mixprec_set_cpu_isa)"
    if missing and platform.machine() in ("x86_64", "AMD64", "i686"):
        why += f"; not available here: {', '.join(missing)}"
    threads = lib.mixprec_get_num_threads()
    omp = os.environ.get("OMP_NUM_THREADS")
    return [
        ("CPU", f"{_cpu_model()} ({os.cpu_count()} logical CPUs)"),
        ("CPU ISA path", f"{active} ({why})"),
        ("CPU ISA paths supported", ", ".join(supported)),
        ("OpenMP threads (mixprec)", f"{threads} (OMP_NUM_THREADS={omp if omp is not None else 'unset'})"),
    ]


def report() -> str:
    """The report as text (what ``python -m mixprec`` prints)."""
    rows: list[tuple[str, str]] = []
    rows.append(("Python", f"{platform.python_version()} ({sys.executable})"))
    rows.append(("platform", f"{platform.platform()}"))
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - the report must say why
        rows.append(("torch", f"NOT IMPORTABLE: {e!r}"))
        return _format(rows)
    rows.append(("torch", f"{torch.__version__} ({os.path.dirname(torch.__file__)})"))
    rows.append(("torch CUDA / cuDNN", f"{torch.version.cuda} / {torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}"))
    rows.append(("torch threads", f"{torch.get_num_threads()} intra-op, {torch.get_num_interop_threads()} inter-op"))
    try:
        import mixprec
        from mixprec import _library
    except Exception as e:  # noqa: BLE001
        rows.append(("mixprec", f"IMPORT FAILED: {e}"))
        return _format(rows)

    lib_path = _library.library_path()
    lib = ctypes.CDLL(lib_path)
    lib.mixprec_version.restype = ctypes.c_int
    v = lib.mixprec_version()
    rows.append(("mixprec", f"{mixprec.__version__} (C library {v // 10000}.{v // 100 % 100}.{v % 100}; package {os.path.dirname(mixprec.__file__)})"))
    env_dir = os.environ.get("MIXPREC_LIBRARY_DIR")
    rows.append(("MIXPREC_LIBRARY_DIR", env_dir if env_dir else "unset"))
    rows.append(("libmixprec.so", lib_path))
    cuda_path = _library.cuda_library_path()
    if cuda_path is None:
        cuda_state = "not built (no libmixprec_cuda.so found)"
    elif _library.cuda_ops_loaded():
        cuda_state = f"{cuda_path} (loaded)"
    else:
        cuda_state = f"{cuda_path} (present, not loaded: torch.cuda.is_available() is False)"
    rows.append(("libmixprec_cuda.so", cuda_state))
    capi = _library.capi_library_path()
    rows.append(("libmixprec_capi.so", capi if capi else "not found"))
    loaded = _mapped_libraries(("libmixprec", "libtorch_cpu", "libtorch_cuda.", "libc10.", "libgomp", "libiomp", "libomp", "libcudart"))
    rows.append(("libraries mapped", "\n".join(loaded) if loaded else "(unknown: no /proc/self/maps)"))
    omp_runtimes = [p for p in loaded if any(s in os.path.basename(p) for s in ("libgomp", "libiomp", "libomp"))]
    if len(omp_runtimes) > 1:
        rows.append(("WARNING", f"{len(omp_runtimes)} OpenMP runtimes in one process: {', '.join(omp_runtimes)}"))
    rows += _cpu_report(lib)

    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            rows.append((f"GPU {i}", f"{torch.cuda.get_device_name(i)}, compute capability {major}.{minor}"))
    else:
        rows.append(("GPU", "none (torch.cuda.is_available() is False)"))
    return _format(rows)


def _format(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows) + 1
    out = []
    for k, v in rows:
        lines = str(v).split("\n")
        out.append(f"{k + ':':<{width}} {lines[0]}")
        out += [f"{'':<{width}} {rest}" for rest in lines[1:]]
    return "\n".join(out)


def main() -> int:
    print(report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
