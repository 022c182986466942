#!/usr/bin/env bash
# The one GPU check, for the lent GPU machine (torch with CUDA, nvcc, CMake,
# no network). Builds the CUDA library against the machine's torch, checks
# stable-ABI symbols, runs the C tests (GoogleTest, if installed there), the
# CUDA pytest tests, loads a library built elsewhere (prebuilt/, if carried)
# on this torch, runs the GPU benchmarks, and prints a short table last.
# Full logs go under $OUT (default ./gpu-out).
# Prepare on the CPU machine first: bash scripts/gpu_prepare.sh (fills
# .gpu-carry/: GoogleTest, and the libraries built there), then on the device:
#   run(command="bash scripts/gpu_check.sh", carry=[".gpu-carry"], timeout_s=540)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
PY="${PY:-$(command -v python3)}"
export PYTHONUNBUFFERED=1
GTEST_ARGS=()
[ -d .gpu-carry/gtest ] && GTEST_ARGS=(-DGTEST_ROOT="$PWD/.gpu-carry/gtest" -DGTEST_INCLUDE_DIR="$PWD/.gpu-carry/gtest/include" -DGTEST_LIBRARY="$PWD/.gpu-carry/gtest/lib/libgtest.a" -DGTEST_MAIN_LIBRARY="$PWD/.gpu-carry/gtest/lib/libgtest_main.a")
declare -A result
step() {  # step NAME CMD...: runs CMD, logs to $OUT/NAME.log, records PASS/FAIL
  local name=$1; shift
  local t0=$SECONDS
  if "$@" >"$OUT/$name.log" 2>&1; then result[$name]="PASS ($((SECONDS - t0)) s)"; else result[$name]="FAIL ($((SECONDS - t0)) s, see $name.log)"; fi
  echo "$name: ${result[$name]}"
}
{ nvidia-smi; "$PY" -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"; nvcc --version; lscpu; } >"$OUT/machine.log" 2>&1

step build bash -c "cmake -S . -B build-gpu -DPython3_EXECUTABLE=$PY -DMIXPREC_CUDA=ON -DCMAKE_BUILD_TYPE=Release ${GTEST_ARGS[*]} && cmake --build build-gpu -j 16"
step abi bash scripts/check_abi.sh build-gpu
if [ -x build-gpu/mixprec_c_tests ]; then
  step ctest ./build-gpu/mixprec_c_tests
  for isa in scalar avx2 avx512; do
    step "ctest_isa_$isa" env MIXPREC_CPU_ISA=$isa ./build-gpu/mixprec_c_tests --gtest_filter='*Unscale*'
  done
else
  result[ctest]="SKIP (no GoogleTest on this machine)"
fi
export MIXPREC_LIBRARY_DIR="$PWD/build-gpu"
step pytest "$PY" -m pytest tests/python -q -p no:cacheprovider -x
if [ -f .gpu-carry/prebuilt/libmixprec.so ]; then
  # Libraries built on the CPU machine against torch 2.14.1: must load and
  # pass here on this machine's torch.
  step prebuilt_load env MIXPREC_LIBRARY_DIR="$PWD/.gpu-carry/prebuilt" "$PY" -m pytest tests/python -q -p no:cacheprovider -x
fi
step bench_unscale "$PY" bench/bench_unscale.py --device cuda --out "$OUT/bench_unscale_cuda.md"
step bench_optim "$PY" bench/bench_optim.py --device cuda --out "$OUT/bench_optim_cuda.md"
step bench_nms "$PY" bench/bench_nms.py --device cuda --out "$OUT/bench_nms_cuda.md"
step bench_softmax "$PY" bench/bench_softmax.py --device cuda --out "$OUT/bench_softmax_cuda.md"
step bench_unscale_cpu "$PY" bench/bench_unscale.py --device cpu --out "$OUT/bench_unscale_cpu.md"

echo
echo "== summary (logs in $OUT)"
for k in "${!result[@]}"; do printf '%-22s %s\n' "$k" "${result[$k]}"; done | sort
for f in "$OUT"/bench_unscale_cuda.md "$OUT"/bench_optim_cuda.md "$OUT"/bench_nms_cuda.md "$OUT"/bench_softmax_cuda.md; do [ -f "$f" ] && tail -n +5 "$f"; done
