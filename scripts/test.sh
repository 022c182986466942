#!/usr/bin/env bash
# Runs every test of mixprec from a fresh checkout: installs what it needs,
# builds the libraries (CUDA too when nvcc is present), runs GoogleTest
# (ctest) on a normal and on an ASan+UBSan build of the C API, checks the
# torch libraries use no unstable torch symbols, installs the Python package
# with pip, and runs pytest. Exit status: 0 only if everything passed.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
JOBS="${MAX_JOBS:-$(nproc)}"
ROOT="$PWD"

echo "== build (build/)"
cmake -S . -B build -DPython3_EXECUTABLE="$PY" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$JOBS"

echo "== stable-ABI check"
bash scripts/check_abi.sh build

if [ -x build/mixprec_c_tests ]; then
  echo "== GoogleTest (release)"
  ctest --test-dir build --output-on-failure -j "$JOBS"
  echo "== GoogleTest (ASan + UBSan)"
  cmake -S . -B build-asan -DMIXPREC_SANITIZE=ON -DMIXPREC_TORCH=OFF -DMIXPREC_CUDA=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build build-asan -j "$JOBS" --target mixprec_c_tests
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ./build-asan/mixprec_c_tests --gtest_brief=1
else
  echo "== GoogleTest not available: C tests skipped" >&2
  [ "${CI:-}" = true ] && { echo "CI needs the C tests" >&2; exit 1; }
fi

echo "== pip install of python/ (no build isolation)"
rm -rf build/pip-target
MIXPREC_BUILD_DIR="$PWD/build/pip" "$PY" -m pip install -q --disable-pip-version-check \
  --no-build-isolation --no-deps --target build/pip-target ./python
(cd /tmp && PYTHONPATH="$ROOT/build/pip-target" "$PY" -c "
import torch, mixprec
assert mixprec.library_path().startswith('$ROOT/build/pip-target'), mixprec.library_path()
g = [torch.tensor([4.0, float('nan')], dtype=torch.bfloat16)]; fi = torch.zeros(1)
torch.ops.mixprec.unscale_(g, fi, torch.tensor([0.5]))
assert fi.item() == 1.0 and g[0][0].item() == 2.0
print('installed package OK:', mixprec.library_path())
")

run_pytest() {  # run_pytest PYTHON ARGS...: pytest, with exit code 5 (no tests) an error
  local py=$1; shift
  set +e
  PYTHONPATH=python "$py" -m pytest tests/python -q -p no:cacheprovider "$@"
  local rc=$?
  set -e
  if [ $rc -eq 5 ]; then echo "pytest collected no tests: that is a failure here" >&2; return 1; fi
  return $rc
}

echo "== pytest (torch $("$PY" -c 'import torch; print(torch.__version__)'))"
run_pytest "$PY" "$@"

# One binary for every torch >= 2.10: the library just built against the
# torch above must load and pass on another release (2.13.0, CPU build).
echo "== pytest on torch 2.13.0 with the same binary"
COMPAT="${MIXPREC_COMPAT_VENV:-$ROOT/.venv-compat}"
[ -x "$COMPAT/bin/python" ] || python3 -m venv "$COMPAT"
"$COMPAT/bin/python" -c "import torch, pytest, numpy" 2>/dev/null ||
  "$COMPAT/bin/python" -m pip install -q --disable-pip-version-check torch==2.13.0 numpy pytest
MIXPREC_LIBRARY_DIR="$ROOT/build" run_pytest "$COMPAT/bin/python" "$@"
