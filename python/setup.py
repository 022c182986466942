"""Builds mixprec's C/C++/CUDA libraries with CMake (the top-level
CMakeLists.txt) and ships them inside the ``mixprec`` package.

Environment: MIXPREC_CMAKE_ARGS (extra configure arguments, e.g.
-DMIXPREC_CUDA=OFF), MIXPREC_BUILD_DIR (CMake build directory; default
<repo>/build/pip), MAX_JOBS (parallel build jobs).
"""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LIBS = ("libmixprec.so", "libmixprec_cuda.so", "libmixprec_capi.so")


class CMakeBuildPy(build_py):
    def run(self):
        super().run()
        build_dir = Path(os.environ.get("MIXPREC_BUILD_DIR", REPO / "build" / "pip"))
        build_dir.mkdir(parents=True, exist_ok=True)
        configure = [
            "cmake", "-S", str(REPO), "-B", str(build_dir),
            f"-DPython3_EXECUTABLE={sys.executable}",
            "-DMIXPREC_TORCH=ON", "-DMIXPREC_BUILD_TESTS=OFF",
            "-DCMAKE_BUILD_TYPE=Release",
        ] + shlex.split(os.environ.get("MIXPREC_CMAKE_ARGS", ""))
        subprocess.check_call(configure)
        jobs = os.environ.get("MAX_JOBS", str(os.cpu_count() or 1))
        subprocess.check_call(["cmake", "--build", str(build_dir), "-j", jobs])
        dest = Path(self.build_lib) / "mixprec"
        dest.mkdir(parents=True, exist_ok=True)
        for name in LIBS:
            src = build_dir / name
            if src.exists():
                shutil.copy2(src, dest / name)


setup(cmdclass={"build_py": CMakeBuildPy})
