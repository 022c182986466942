#!/usr/bin/env python3
"""Plants one bug in a copy of a kernel source, for the mutation check of
tests/cuda_emu/CMakeLists.txt: replaces the first OLD after the first
CONTEXT (both exact, one line each) with NEW. Fails if either is missing,
so a mutant whose target moved is noticed, not silently unmutated.
Usage: mutate.py SRC OUT CONTEXT OLD NEW"""
import sys

src, out, context, old, new = sys.argv[1:6]
text = open(src).read()
at = text.find(context)
if at < 0:
    sys.exit("mutate.py: %s has no %r" % (src, context))
hit = text.find(old, at)
if hit < 0:
    sys.exit("mutate.py: %s has no %r after %r" % (src, old, context))
open(out, "w").write(text[:hit] + new + text[hit + len(old):])
