#!/usr/bin/env bash
# The package as a user gets it (a step of scripts/test.sh; runs alone too):
# `python -m build --no-isolation` makes the sdist and, from it, ONE wheel;
# the wheel must be py3-none (no Python linked: every CPython >= 3.10), its
# libraries without RUNPATH (torch's libraries come from `import torch`) and
# with manylinux symbol versions (auditwheel, which also retags it
# manylinux_2_X without grafting torch's or OpenMP's libraries: those are
# torch's, loaded first). The retagged wheel is installed into a fresh venv
# with torch 2.13.0 (.venv-wheel, cached like .venv-compat) and smoke-tested
# there, and into <dist>/pip-target for this venv's torch.
# Usage: bash scripts/check_package.sh [LIB...]   LIB: more built libraries
# (e.g. build/libmixprec_cuda.so) to hold to the same RUNPATH/Python rules.
# MIXPREC_DIST_DIR: where the sdist, wheels and logs go (default build/dist).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
[ -n "${PY:-}" ] || source scripts/setup_env.sh
DIST="$(realpath -m "${MIXPREC_DIST_DIR:-$ROOT/build/dist}")"
fail() { echo "check_package: $*" >&2; exit 1; }

# Parallel jobs of the CMake build (default: CMake's, which for Ninja is cores + 2).
export CMAKE_BUILD_PARALLEL_LEVEL="${MAX_JOBS:-$(nproc)}"
rm -rf "$DIST" && mkdir -p "$DIST"
"$PY" -m build --no-isolation --outdir "$DIST" . >"$DIST/build.log" 2>&1 ||
  { tail -40 "$DIST/build.log"; fail "python -m build failed (log: $DIST/build.log)"; }
shopt -s nullglob
sdists=("$DIST"/*.tar.gz) wheels=("$DIST"/*.whl)
[ ${#sdists[@]} = 1 ] && [ ${#wheels[@]} = 1 ] || fail "expected one sdist and one wheel, got: ${sdists[*]} ${wheels[*]}"
whl="${wheels[0]}"
[[ "$(basename "$whl")" == mixprec-*-py3-none-linux_*.whl ]] || fail "wheel tag is not py3-none-linux_*: $whl"
echo "built $(basename "${sdists[0]}") and $(basename "$whl")"

# RUNPATH empty, no libpython, no Python C-API symbols, and the OpenMP
# symbol versions needed are in torch's own libgomp (the copy that runs).
mkdir -p "$DIST/unpacked" && (cd "$DIST/unpacked" && "$PY" -m zipfile -e "$whl" .)
libs=("$DIST"/unpacked/mixprec/*.so "$@")
[ -f "$DIST/unpacked/mixprec/libmixprec.so" ] || fail "libmixprec.so is not in the wheel"
torch_gomp="$("$PY" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp.so.1"))')"
for lib in "${libs[@]}"; do
  [ -f "$lib" ] || continue
  ! readelf -d "$lib" | grep -E '\((RPATH|RUNPATH)\)' || fail "$lib has an RPATH/RUNPATH"
  ! readelf -d "$lib" | grep -E 'NEEDED.*libpython' || fail "$lib links libpython"
  ! nm -D --undefined-only "$lib" | grep -E ' _?Py[A-Z_]' || fail "$lib uses Python C-API symbols"
  if [ -f "$torch_gomp" ]; then
    have="$(readelf -V "$torch_gomp" | grep -oE 'Name: G?OMP_[0-9.]+' | awk '{print $2}' | sort -u)"
    for v in $(readelf -V "$lib" | awk '/File: libgomp/{f=1; next} /File:/{f=0} f && /Name:/{print $3}'); do
      grep -qx "$v" <<<"$have" || fail "$lib needs $v, which torch's libgomp.so.1 lacks"
    done
  fi
done
echo "libraries: no RUNPATH, no Python, OpenMP versions in torch's libgomp: ${libs[*]##*/}"

PATH="$(dirname "$PY"):$PATH" "$PY" -m auditwheel repair -w "$DIST/wheelhouse" \
  --exclude libtorch_cpu.so --exclude libtorch_cuda.so --exclude libc10.so --exclude libc10_cuda.so \
  --exclude libgomp.so.1 "$whl" >"$DIST/auditwheel.log" 2>&1 || { cat "$DIST/auditwheel.log"; fail "auditwheel repair failed"; }
repaired=("$DIST"/wheelhouse/*.whl)
[ ${#repaired[@]} = 1 ] && [[ "$(basename "${repaired[0]}")" == mixprec-*-py3-none-manylinux_*.whl ]] ||
  { cat "$DIST/auditwheel.log"; fail "auditwheel did not give one py3-none-manylinux wheel"; }
! "$PY" -m zipfile -l "${repaired[0]}" | grep -E '\.libs/' || fail "auditwheel grafted libraries into the wheel"
whl="${repaired[0]}"
echo "auditwheel: $(basename "$whl")"

# A fresh venv with torch 2.13.0 (not the torch it was built against).
VENV="${MIXPREC_WHEEL_VENV:-$ROOT/.venv-wheel}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -c "import torch, numpy; assert torch.__version__.split('+')[0] == '2.13.0'" 2>/dev/null ||
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check torch==2.13.0 numpy
"$VENV/bin/python" -m pip uninstall -q -y mixprec 2>/dev/null || true
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps "$whl"
(cd /tmp && env -u MIXPREC_LIBRARY_DIR -u PYTHONPATH "$VENV/bin/python" - "$VENV" <<'EOF'
import ctypes, os, subprocess, sys
venv = os.path.realpath(sys.argv[1])
import importlib.util
pkg = os.path.dirname(importlib.util.find_spec("mixprec").origin)
assert os.path.realpath(pkg).startswith(venv), pkg
# Without torch loaded the library cannot resolve libtorch_cpu.so: no
# RUNPATH leads anywhere (the builder's disk included).
try:
    ctypes.CDLL(os.path.join(pkg, "libmixprec.so"))
    raise AssertionError("libmixprec.so loaded without torch: a RUNPATH points at some torch")
except OSError as e:
    assert "libtorch_cpu.so" in str(e), e
import torch, mixprec
assert torch.__version__.split("+")[0] == "2.13.0", torch.__version__
assert os.path.realpath(mixprec.library_path()).startswith(venv), mixprec.library_path()
g = torch.randn(1000).to(torch.bfloat16)
g[7] = float("inf")
ref = g.float() * 0.25
fi = torch.zeros(1)
torch.ops.mixprec.unscale_([g], fi, torch.tensor([0.25]))
assert fi.item() == 1.0 and torch.equal(g.float(), ref.to(torch.bfloat16).float())
x = torch.randn(64, 33).to(torch.float16)
out = mixprec.ops.softmax(x, -1)
torch.testing.assert_close(out.float(), torch.softmax(x.double(), -1).float(), atol=1e-3, rtol=1e-2)
rep = subprocess.run([sys.executable, "-m", "mixprec"], capture_output=True, text=True, check=True).stdout
for field in ("mixprec:", "torch:", "libmixprec.so:", "CPU ISA path:", "OpenMP threads", "libmixprec_cuda.so:", "GPU"):
    assert field in rep, (field, rep)
print(f"wheel in a fresh venv OK: torch {torch.__version__}, mixprec {mixprec.__version__}, {mixprec.library_path()}")
EOF
)

# The same wheel in a --target directory for this venv's torch.
"$PY" -m pip install -q --disable-pip-version-check --no-deps --target "$DIST/pip-target" "$whl"
(cd /tmp && env -u MIXPREC_LIBRARY_DIR PYTHONPATH="$DIST/pip-target" "$PY" -c "
import torch, mixprec
assert mixprec.library_path().startswith('$DIST/pip-target'), mixprec.library_path()
g = [torch.tensor([4.0, float('nan')], dtype=torch.bfloat16)]; fi = torch.zeros(1)
torch.ops.mixprec.unscale_(g, fi, torch.tensor([0.5]))
assert fi.item() == 1.0 and g[0][0].item() == 2.0
print('wheel in pip-target OK: torch', torch.__version__, mixprec.library_path())
")
