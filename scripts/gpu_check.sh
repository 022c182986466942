#!/usr/bin/env bash
# The one GPU check, for the lent GPU machine (torch with CUDA, nvcc, CMake,
# no network). Builds the CUDA library against the machine's torch, checks
# stable-ABI symbols, runs the CUDA tests (GoogleTest, if carried, and
# pytest -m cuda), the GPU benchmarks, loads the libraries built elsewhere
# (prebuilt/, if carried) on this torch, then, time permitting, the rest of
# the C and Python suites; prints a short table last.
# Steps run in order of importance and each is skipped once the budget
# (GPU_CHECK_BUDGET seconds, default 480) is spent, so the table always comes
# back inside the run's time limit. Full logs go under $OUT (default ./gpu-out).
# Prepare on the CPU machine first: bash scripts/gpu_prepare.sh (fills
# .gpu-carry/: GoogleTest, and the libraries built there), then on the device:
#   run(command="bash scripts/gpu_check.sh", carry=[".gpu-carry"], timeout_s=540)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
PY="${PY:-$(command -v python3)}"
export PYTHONUNBUFFERED=1
BUDGET="${GPU_CHECK_BUDGET:-480}"
GTEST_ARGS=()
[ -d .gpu-carry/gtest ] && GTEST_ARGS=(-DGTEST_ROOT="$PWD/.gpu-carry/gtest" -DGTEST_INCLUDE_DIR="$PWD/.gpu-carry/gtest/include" -DGTEST_LIBRARY="$PWD/.gpu-carry/gtest/lib/libgtest.a" -DGTEST_MAIN_LIBRARY="$PWD/.gpu-carry/gtest/lib/libgtest_main.a")
declare -A result
order=()
step() {  # step NAME MAX_SECONDS CMD...: runs CMD (killed after MAX_SECONDS or at the budget), logs to $OUT/NAME.log
  local name=$1 max=$2; shift 2
  order+=("$name")
  local left=$((BUDGET - SECONDS))
  if [ "$left" -le 5 ]; then result[$name]="SKIP (budget spent)"; echo "$name: ${result[$name]}"; return; fi
  [ "$max" -gt "$left" ] && max=$left
  local t0=$SECONDS rc
  timeout "$max" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then result[$name]="PASS ($((SECONDS - t0)) s)"
  elif [ $rc -eq 124 ]; then result[$name]="TIMEOUT after $max s (see $name.log)"
  else result[$name]="FAIL rc=$rc ($((SECONDS - t0)) s, see $name.log)"; fi
  echo "$name: ${result[$name]}"
}
{ nvidia-smi; "$PY" -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"; nvcc --version; lscpu; } >"$OUT/machine.log" 2>&1

step build 300 bash -c "cmake -S . -B build-gpu -DPython3_EXECUTABLE=$PY -DMIXPREC_CUDA=ON -DCMAKE_BUILD_TYPE=Release ${GTEST_ARGS[*]} && cmake --build build-gpu -j 16"
step abi 30 bash scripts/check_abi.sh build-gpu
export MIXPREC_LIBRARY_DIR="$PWD/build-gpu"
HAVE_CTEST=0
[ -x build-gpu/mixprec_c_tests ] && HAVE_CTEST=1
[ $HAVE_CTEST = 1 ] && step ctest_cuda 120 ./build-gpu/mixprec_c_tests --gtest_filter='*Cuda*:*CUDA*'
step pytest_cuda 150 "$PY" -m pytest tests/python -q -p no:cacheprovider -m cuda
# Activation memory (the first priority): a ResNet-50 step's peak and time with
# 8-bit / 4-bit activations and checkpointing against amp-bf16, pack / unpack
# against the copy bandwidth (bench/bench_memory_device.py; no torchvision needed).
step bench_memory 120 "$PY" bench/bench_memory_device.py --device cuda --reps 5 --out "$OUT/bench_memory_cuda.md"
step bench_unscale 60 "$PY" bench/bench_unscale.py --device cuda --out "$OUT/bench_unscale_cuda.md"
step bench_optim 90 "$PY" bench/bench_optim.py --device cuda --no-phased --out "$OUT/bench_optim_cuda.md"
step bench_nms 60 "$PY" bench/bench_nms.py --device cuda --out "$OUT/bench_nms_cuda.md"
step bench_efficient_nms 60 "$PY" bench/bench_efficient_nms.py --device cuda --reps 5 --out "$OUT/bench_efficient_nms_cuda.md"
step bench_roi_align 90 "$PY" bench/bench_roi_align.py --device cuda --reps 5 --out "$OUT/bench_roi_align_cuda.md"
step bench_softmax 90 "$PY" bench/bench_softmax.py --device cuda --kinds sm,ce --out "$OUT/bench_softmax_cuda.md"
step bench_ce_soft 60 "$PY" bench/bench_softmax.py --device cuda --kinds ces --out "$OUT/bench_ce_soft_cuda.md"
step bench_optim_500m 150 "$PY" bench/bench_optim.py --device cuda --only-phased --reps 5 --out "$OUT/bench_optim_500m_cuda.md"
step bench_optim_ema 60 "$PY" bench/bench_optim_ema.py --device cuda --tensors 20 --numel 5000000 --reps 9 --out "$OUT/bench_optim_ema_cuda.md"
if [ -f .gpu-carry/prebuilt/libmixprec.so ]; then
  # Libraries built on the CPU machine against torch 2.14.1: must load and
  # pass here, on this machine's torch.
  step prebuilt_cuda 120 env MIXPREC_LIBRARY_DIR="$PWD/.gpu-carry/prebuilt" "$PY" -m pytest tests/python -q -p no:cacheprovider -m cuda
fi
# The AVX-512 paths exist but have never run (no AVX-512 on the CPU machine).
[ $HAVE_CTEST = 1 ] && step ctest_avx512 60 env MIXPREC_CPU_ISA=avx512 ./build-gpu/mixprec_c_tests --gtest_filter='*Unscale*:*Optim*:*Nms*:*Softmax*:*CrossEntropy*'
[ $HAVE_CTEST = 1 ] && step ctest_rest 120 ./build-gpu/mixprec_c_tests --gtest_filter='-*Cuda*:*CUDA*'
step pytest_rest 200 "$PY" -m pytest tests/python -q -p no:cacheprovider -m "not cuda" -x
step bench_unscale_cpu 60 "$PY" bench/bench_unscale.py --device cpu --out "$OUT/bench_unscale_cpu.md"

echo
echo "== summary (logs in $OUT; budget ${BUDGET} s, used $SECONDS s)"
for k in "${order[@]}"; do printf '%-18s %s\n' "$k" "${result[$k]}"; done
for f in "$OUT"/bench_unscale_cuda.md "$OUT"/bench_optim_cuda.md "$OUT"/bench_nms_cuda.md "$OUT"/bench_roi_align_cuda.md "$OUT"/bench_softmax_cuda.md "$OUT"/bench_ce_soft_cuda.md "$OUT"/bench_optim_500m_cuda.md "$OUT"/bench_optim_ema_cuda.md; do [ -f "$f" ] && tail -n +5 "$f"; done
