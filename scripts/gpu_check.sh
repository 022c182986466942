#!/usr/bin/env bash
# The one GPU check, for the lent GPU machine (torch with CUDA, nvcc, CMake,
# no network). Builds the CUDA library against the machine's torch, checks
# stable-ABI symbols, runs the C tests (GoogleTest, if installed there), the
# CUDA pytest tests, loads a library built elsewhere (prebuilt/, if carried)
# on this torch, runs the GPU benchmarks, and prints a short table last.
# Full logs go under $OUT (default ./gpu-out).
#   run: bash scripts/gpu_check.sh        (timeout ~8 min)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
PY="${PY:-python3}"
declare -A result
step() {  # step NAME CMD...: runs CMD, logs to $OUT/NAME.log, records PASS/FAIL
  local name=$1; shift
  local t0=$SECONDS
  if "$@" >"$OUT/$name.log" 2>&1; then result[$name]="PASS ($((SECONDS - t0)) s)"; else result[$name]="FAIL ($((SECONDS - t0)) s, see $name.log)"; fi
  echo "$name: ${result[$name]}"
}
{ nvidia-smi; "$PY" -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"; nvcc --version; lscpu; } >"$OUT/machine.log" 2>&1

step build bash -c "cmake -S . -B build-gpu -DPython3_EXECUTABLE=$PY -DMIXPREC_CUDA=ON -DCMAKE_BUILD_TYPE=Release && cmake --build build-gpu -j 16"
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
if [ -f prebuilt/libmixprec.so ]; then
  # A library built on the CPU machine against another torch: must load here.
  step prebuilt_load env MIXPREC_LIBRARY_DIR="$PWD/prebuilt" "$PY" -m pytest tests/python -q -p no:cacheprovider -x -k "cuda or fresh_process"
fi
step bench_unscale "$PY" bench/bench_unscale.py --device cuda --out "$OUT/bench_unscale_cuda.md"
step bench_unscale_cpu "$PY" bench/bench_unscale.py --device cpu --out "$OUT/bench_unscale_cpu.md"

echo
echo "== summary (logs in $OUT)"
for k in "${!result[@]}"; do printf '%-22s %s\n' "$k" "${result[$k]}"; done | sort
for f in "$OUT"/bench_unscale_cuda.md; do [ -f "$f" ] && tail -n +5 "$f"; done
