#!/usr/bin/env python3
"""Runs a mutant's test executable; passes only if it fails (non-zero exit,
abort included) with output matching REGEX. Usage: expect_fail.py REGEX CMD..."""
import re
import subprocess
import sys

regex, cmd = sys.argv[1], sys.argv[2:]
p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
lines = [l for l in p.stdout.splitlines() if re.search(regex, l)]
if p.returncode != 0 and lines:
    print("mutant caught (exit %d): %s" % (p.returncode, lines[0]))
    sys.exit(0)
print(p.stdout[-4000:])
print("mutant NOT caught: exit %d, %d line(s) matching %r" % (p.returncode, len(lines), regex))
sys.exit(1)
