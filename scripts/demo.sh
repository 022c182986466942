#!/usr/bin/env bash
# The main job: builds mixprec (installing what it needs: the venv of
# scripts/setup_env.sh; no system packages, cmake and a C compiler must be
# there) and runs the mixed-precision training demo. Extra arguments go to the demo, e.g.
#   bash scripts/demo.sh --quick        bash scripts/demo.sh --device cuda
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
# The libraries only (no tests); the CUDA one only where it can run (nvcc
# and a GPU: MIXPREC_CUDA=AUTO), so a CPU-only machine compiles no CUDA.
cmake -S . -B build -DPython3_EXECUTABLE="$PY" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "${MAX_JOBS:-$(nproc)}" --target mixprec_libs >/dev/null
exec "$PY" examples/train_amp.py "$@"
