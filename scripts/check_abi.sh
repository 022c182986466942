#!/usr/bin/env bash
# Fails if a torch library of mixprec needs an unstable torch symbol (C++
# symbols of c10/at/torch): only the C shim (aoti_torch_*, torch_*) is stable.
set -euo pipefail
dir="${1:-build}"
status=0
for lib in "$dir"/libmixprec.so "$dir"/libmixprec_cuda.so; do
  [ -f "$lib" ] || continue
  bad=$(nm -D --undefined-only "$lib" | grep -E '_ZN3c10|_ZN2at|_ZN5torch|_ZNK3c10|_ZNK2at|_ZNK5torch' || true)
  if [ -n "$bad" ]; then
    echo "$lib uses unstable torch symbols:"; echo "$bad"; status=1
  else
    echo "$lib: only stable torch symbols ($(nm -D --undefined-only "$lib" | grep -c -E ' (aoti_torch|torch_)') C shim calls)"
  fi
done
exit $status
