#!/usr/bin/env bash
# The main job: builds mixprec (installing what it needs) and runs the
# mixed-precision training demo. Extra arguments go to the demo, e.g.
#   bash scripts/demo.sh --quick        bash scripts/demo.sh --device cuda
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
cmake -S . -B build -DPython3_EXECUTABLE="$PY" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "${MAX_JOBS:-$(nproc)}" --target mixprec mixprec_capi $( [ -n "$(command -v nvcc)" ] && echo mixprec_cuda ) >/dev/null
exec "$PY" examples/train_amp.py "$@"
