#!/usr/bin/env python3
"""Line-preserving rewrite of a CUDA source (kernels/*.cu, *.cuh) into C++
for mixprec's CUDA emulator (tests/cuda_emu/README.md):

  k<T><<<g, b, smem, s>>>(args)     ::emu::launch(__FILE__, __LINE__, k<T>).cfg(g, b, smem, s)(args)
  __shared__ T x[N];                x bound to this block's shared memory (emu::shared_var)
  extern __shared__ T x[];          T *x = the block's dynamic shared memory
  const __grid_constant__ T a       const T &a (one copy of the argument per launch)
  __launch_bounds__(N) ... {        ... { ::emu::launch_bounds(N, ...);  (checked at entry)

Every replacement keeps the newlines it replaces, and the output starts with
`#line 1 "<source>"`, so file:line in compiler errors and in the emulator's
messages are the original file's. Comments and string literals are left
alone. Usage: rewrite.py SRC OUT
"""
import re
import sys


def mask(text):
    """text with comments and string/char literals blanked (same offsets)."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j += 1
        else:
            i += 1
            continue
        for k in range(i, min(j, n)):
            if out[k] != "\n":
                out[k] = " "
        i = j
    return "".join(out)


def keep_newlines(old, new):
    return new + "\n" * old.count("\n")


def match_close(s, i, open_c, close_c):
    """index of the bracket closing the one at s[i]"""
    depth = 0
    for j in range(i, len(s)):
        if s[j] == open_c:
            depth += 1
        elif s[j] == close_c:
            depth -= 1
            if depth == 0:
                return j
    raise ValueError("unbalanced %s at offset %d" % (open_c, i))


def split_top(s):
    parts, depth, start = [], 0, 0
    for j, c in enumerate(s):
        if c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(s[start:j])
            start = j + 1
    parts.append(s[start:])
    return parts


def rewrite(text, path):
    m = mask(text)
    edits = []  # (start, end, replacement)

    # kernel launches
    for hit in re.finditer(r"<<<", m):
        lt = hit.start()
        gt = m.find(">>>", lt)
        paren = gt + 3
        while m[paren].isspace():
            paren += 1
        if gt < 0 or m[paren] != "(":
            raise SystemExit("%s: a <<< without >>>( at offset %d" % (path, lt))
        j = lt
        while m[j - 1].isspace():
            j -= 1
        if m[j - 1] in ">)":  # template arguments, or a call returning the kernel
            o, c = ("<", ">") if m[j - 1] == ">" else ("(", ")")
            depth = 0
            while True:
                j -= 1
                if m[j] == c:
                    depth += 1
                elif m[j] == o:
                    depth -= 1
                    if depth == 0:
                        break
        while re.match(r"[\w:]", m[j - 1]):
            j -= 1
        name = text[j:lt].rstrip()
        cfg = text[lt + 3:gt]
        new = "::emu::launch(__FILE__, __LINE__, %s).cfg(%s)(" % (name, cfg)
        new += "\n" * (text[j:paren + 1].count("\n") - new.count("\n"))
        edits.append((j, paren + 1, new))

    # shared memory
    for hit in re.finditer(r"\bextern\s+__shared__\s+([^;]+?)\s+(\w+)\s*\[\s*\]\s*;", m):
        t, name = hit.group(1), hit.group(2)
        old = text[hit.start():hit.end()]
        edits.append((hit.start(), hit.end(), keep_newlines(
            old, "%s *%s = (%s *)::emu::dynamic_shared();" % (t, name, t))))
    for hit in re.finditer(r"(?<!extern )\b__shared__\s+([^;=]+?)\s+(\w+)\s*((?:\[[^\]]*\]\s*)*);", m):
        if re.search(r"\bextern\s+$", m[max(0, hit.start() - 20):hit.start()]):
            continue
        t, name, dims = hit.group(1), hit.group(2), text[hit.start(3):hit.end(3)].strip()
        old = text[hit.start():hit.end()]
        ty = "emu_sh_%s_t" % name
        edits.append((hit.start(), hit.end(), keep_newlines(old, (
            "typedef %s %s%s; static char emu_sh_%s_k; %s &%s = *(%s *)::emu::shared_var("
            "&emu_sh_%s_k, sizeof(%s), alignof(%s));") % (t, ty, dims, name, ty, name, ty, name, ty, ty))))

    # __grid_constant__ parameters
    for hit in re.finditer(r"\b__grid_constant__\s+([\w:<>, ]+?)\s+(\w+)\s*(?=[,)])", m):
        edits.append((hit.start(), hit.end(), "%s &%s" % (hit.group(1), hit.group(2))))

    # __launch_bounds__ -> a check at the kernel's entry
    for hit in re.finditer(r"\b__launch_bounds__\s*\(", m):
        close = match_close(m, hit.end() - 1, "(", ")")
        expr = split_top(text[hit.end():close])[0].strip()
        depth, k = 0, close + 1
        while True:
            c = m[k]
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
            elif c == ";" and depth == 0:
                k = -1  # a declaration: nothing to check
                break
            elif c == "{" and depth == 0:
                break
            k += 1
        edits.append((hit.start(), close + 1, keep_newlines(text[hit.start():close + 1], "")))
        if k >= 0:
            edits.append((k, k + 1, "{ ::emu::launch_bounds((%s), EMU_SITE);" % expr))

    edits.sort()
    for a, b in zip(edits, edits[1:]):
        if a[1] > b[0]:
            raise SystemExit("%s: overlapping rewrites at offsets %d and %d" % (path, a[0], b[0]))
    out = []
    pos = 0
    for s, e, r in edits:
        out.append(text[pos:s])
        out.append(r)
        pos = e
    out.append(text[pos:])
    return '#include "emu.h"\n#line 1 "%s"\n' % path + "".join(out)


def main():
    src, dst = sys.argv[1], sys.argv[2]
    with open(src) as f:
        text = f.read()
    res = rewrite(text, src)
    assert res.count("\n") == text.count("\n") + 2, "line count changed"
    with open(dst, "w") as f:
        f.write(res)


if __name__ == "__main__":
    main()
