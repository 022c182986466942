#!/usr/bin/env bash
# Prepares, on the CPU machine, what the GPU check needs but the GPU machine
# lacks (it has no network): GoogleTest (headers + static libraries) and the
# libraries built here against this machine's torch, to prove they load on
# the GPU machine's torch. Everything goes to .gpu-carry/ (git-ignored); name
# it in the device run's `carry`, then run:
#   bash scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu-carry && mkdir -p .gpu-carry/gtest/lib .gpu-carry/gtest/include .gpu-carry/prebuilt
cp -r /usr/include/gtest .gpu-carry/gtest/include/
cp /usr/lib/x86_64-linux-gnu/libgtest.a /usr/lib/x86_64-linux-gnu/libgtest_main.a .gpu-carry/gtest/lib/
# build/ must hold the CUDA library: MIXPREC_CUDA's default (AUTO) builds it
# only where a GPU is, so configure it with -DMIXPREC_CUDA=ON here (as
# scripts/test.sh does); without it the prebuilt check would test nothing.
if [ ! -f build/libmixprec_cuda.so ]; then
  echo "gpu_prepare: build/libmixprec_cuda.so missing: cmake -S . -B build -DMIXPREC_CUDA=ON && cmake --build build" >&2
  exit 1
fi
for lib in build/libmixprec.so build/libmixprec_cuda.so build/libmixprec_capi.so; do
  [ -f "$lib" ] && cp "$lib" .gpu-carry/prebuilt/
done
du -sh .gpu-carry
