#!/usr/bin/env bash
# The test command's setup (scripts/test.sh): the venv (scripts/setup_env.sh),
# plus GoogleTest, and clang + libomp for the fuzzers, installed from Debian
# when they are missing and we can (root). Defines _fuzz_probe (true when
# clang builds a libFuzzer + OpenMP harness).
# Usage: source scripts/setup_test_env.sh   -> exports PY (the venv's python)
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/setup_env.sh"
if [ ! -f /usr/include/gtest/gtest.h ]; then
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libgtest-dev) >/dev/null
  else
    echo "setup_test_env: GoogleTest missing and not root: C tests will be skipped (apt-get install libgtest-dev)" >&2
  fi
fi
# clang with libFuzzer and OpenMP, for the fuzzers (scripts/fuzz.sh).
_fuzz_probe() {
  local d
  d="$(mktemp -d)" || return 1
  printf '#include <omp.h>\nint LLVMFuzzerTestOneInput(const unsigned char *p, unsigned long n) { (void)p; return (int)n * omp_get_max_threads() * 0; }\n' >"$d/p.c"
  clang -fsanitize=fuzzer,address,undefined -fopenmp "$d/p.c" -o "$d/p" >/dev/null 2>&1
  local rc=$?
  rm -rf "$d"
  return $rc
}
if ! _fuzz_probe; then
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang libomp-dev) >/dev/null
  else
    echo "setup_test_env: clang with libFuzzer/OpenMP missing and not root: fuzzing will be skipped (apt-get install clang libomp-dev)" >&2
  fi
fi
