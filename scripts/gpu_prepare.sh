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
for lib in build/libmixprec.so build/libmixprec_cuda.so build/libmixprec_capi.so; do
  [ -f "$lib" ] && cp "$lib" .gpu-carry/prebuilt/
done
du -sh .gpu-carry
