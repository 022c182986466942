#!/usr/bin/env bash
# Builds the libFuzzer harnesses of tests/fuzz/ (build-fuzz/: clang, ASan +
# UBSan, coverage-instrumented C API) and runs each for a bounded time on its
# committed corpus tests/fuzz/corpus/<family>/ plus a scratch directory for
# what it finds (the repository does not grow). Prints the inputs run per
# harness. Exit status 1 if any harness found a crash, a sanitizer report, a
# leak, a hang or a contract violation; the input is kept in
# build-fuzz/artifacts/<family>/ (replay: build-fuzz/tests/fuzz/fuzz_<family> FILE).
# Usage: scripts/fuzz.sh [seconds per harness, default 20] [family ...]
#   families: unscale update_scale optim nms softmax efficient_nms roi_align overflow act_pack (default: all)
#   MIXPREC_FUZZ_MERGE=1: merge what the run found into the committed corpus
#   (libFuzzer -merge=1: only inputs that add coverage), then keep its
#   MIXPREC_FUZZ_CORPUS_MAX (100) largest inputs.
#   MIXPREC_FUZZ_KEEP=DIR: keep the new inputs in DIR/<family>/ instead.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS="${1:-20}"
[ $# -gt 0 ] && shift
FAMILIES=("$@")
[ ${#FAMILIES[@]} -gt 0 ] || FAMILIES=(unscale update_scale optim nms softmax efficient_nms roi_align overflow act_pack)
BUILD="${MIXPREC_FUZZ_BUILD:-build-fuzz}"

cmake -S . -B "$BUILD" -DMIXPREC_FUZZ=ON -DMIXPREC_TORCH=OFF -DMIXPREC_CUDA=OFF \
  -DMIXPREC_BUILD_TESTS=OFF -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
targets=()
for f in "${FAMILIES[@]}"; do targets+=("fuzz_$f"); done
cmake --build "$BUILD" -j "${MAX_JOBS:-$(nproc)}" --target "${targets[@]}" >/dev/null

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
failed=()
for f in "${FAMILIES[@]}"; do
  corpus="tests/fuzz/corpus/$f"
  if [ -n "${MIXPREC_FUZZ_KEEP:-}" ]; then
    scratch="$MIXPREC_FUZZ_KEEP/$f"
    mkdir -p "$scratch"
  else
    scratch="$(mktemp -d)"
  fi
  art="$BUILD/artifacts/$f"
  log="$BUILD/fuzz_$f.log"
  mkdir -p "$art" "$corpus"
  set +e
  "$BUILD/tests/fuzz/fuzz_$f" -max_total_time="$SECS" -timeout=30 -rss_limit_mb=4096 \
    -print_final_stats=1 -artifact_prefix="$art/" "$scratch" "$corpus" >"$log" 2>&1
  rc=$?
  set -e
  runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)"
  found="$(find "$scratch" -type f | wc -l)"
  if [ $rc -ne 0 ]; then
    echo "fuzz_$f: FAILED (exit $rc) after ${runs:-?} inputs; log $log, input in $art/:" >&2
    grep -E "contract violation|ERROR:|runtime error|SUMMARY" "$log" | head -5 >&2 || true
    failed+=("$f")
  else
    echo "fuzz_$f: ${runs:-?} inputs in ${SECS} s (${rate:-?}/s), $found new corpus inputs, no findings"
  fi
  if [ "${MIXPREC_FUZZ_MERGE:-0}" = 1 ] && [ $rc -eq 0 ]; then
    "$BUILD/tests/fuzz/fuzz_$f" -merge=1 "$corpus" "$scratch" >>"$log" 2>&1
    # Keep the committed seeds few: the largest inputs (which decide the most
    # of a call; the rest of a call comes from the PRNG) up to the cap.
    ls -S "$corpus" | tail -n +"$(( ${MIXPREC_FUZZ_CORPUS_MAX:-100} + 1 ))" |
      while read -r x; do rm -f "$corpus/$x"; done
    echo "fuzz_$f: corpus now $(find "$corpus" -type f | wc -l) inputs"
  fi
  [ -n "${MIXPREC_FUZZ_KEEP:-}" ] || rm -rf "$scratch"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzzing found problems in: ${failed[*]}" >&2
  exit 1
fi
