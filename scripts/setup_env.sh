#!/usr/bin/env bash
# Creates (or reuses) the venv with everything in scripts/requirements.txt:
# all that the demo (scripts/demo.sh) and the package check need. The test
# command's system packages (GoogleTest, clang + libomp for the fuzzers) are
# scripts/setup_test_env.sh's, which sources this first.
# MIXPREC_VENV: the venv's directory (default .venv at the root), e.g. an
# existing one to reuse.
# Usage: source scripts/setup_env.sh   -> exports PY (the venv's python)
set -euo pipefail
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_venv="${MIXPREC_VENV:-$_root/.venv}"
if [ ! -x "$_venv/bin/python" ]; then
  python3 -m venv "$_venv"
fi
_stamp="$_venv/.mixprec-requirements"
if ! cmp -s "$_root/scripts/requirements.txt" "$_stamp" 2>/dev/null; then
  "$_venv/bin/python" -m pip install -q --disable-pip-version-check -r "$_root/scripts/requirements.txt"
  cp "$_root/scripts/requirements.txt" "$_stamp"
fi
export PY="$_venv/bin/python"
