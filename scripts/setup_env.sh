#!/usr/bin/env bash
# Creates (or reuses) .venv with everything in scripts/requirements.txt, and
# installs GoogleTest from Debian when it is missing and we can (root).
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
if [ ! -f /usr/include/gtest/gtest.h ]; then
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libgtest-dev) >/dev/null
  else
    echo "setup_env: GoogleTest missing and not root: C tests will be skipped (apt-get install libgtest-dev)" >&2
  fi
fi
export PY="$_venv/bin/python"
