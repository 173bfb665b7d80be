#!/usr/bin/env python3
"""The module import graph of src/, for the layout rules in src/lib.rs ("Dependencies point
downward"): prints every pair of files that import each other, and the arrows between top-level
modules. It reads the text (`crate::` and `super::` paths outside comments and outside the
`#[cfg(test)] mod tests` block), not the compiler's resolution, so a path built by a macro or a
glob re-export is not seen.

    python3 scripts/imports.py [SRC_DIR]
"""
import os, re, sys, collections
root = sys.argv[1] if len(sys.argv) > 1 else "src"
def modpath(f):
    p = os.path.relpath(f, root)[:-3].split(os.sep)
    if p[-1] in ("mod", "lib"): p = p[:-1]
    return p
files = {}
for d, _, fs in os.walk(root):
    for f in fs:
        if f.endswith(".rs"): files[tuple(modpath(os.path.join(d, f)))] = os.path.join(d, f)
def resolve(path):
    # longest prefix that is a file-module
    for n in range(len(path), 0, -1):
        if tuple(path[:n]) in files: return tuple(path[:n])
    return None
edges = collections.defaultdict(set)
pat = re.compile(r"crate::([a-z_][a-z0-9_]*(?:::[a-z_][a-z0-9_]*)*)")
for m, f in files.items():
    src = open(f).read()
    src = re.sub(r"//[^\n]*", "", src)
    # drop #[cfg(test)] mod tests blocks crudely: ignore lines after "mod tests {"
    cut = src.find("#[cfg(test)]\nmod tests {")
    if cut >= 0: src = src[:cut]
    for u in re.finditer(r"use\s+crate::\{([^;]*)\};", src, re.S):
        inner = u.group(1)
        # flatten one level of braces: a::{b, c} -> a::b, a::c
        for part in re.split(r",(?![^{]*\})", inner):
            part = part.strip()
            mm = re.match(r"([a-z_:0-9]+)::\{(.*)\}", part, re.S)
            if mm:
                for q in mm.group(2).split(","):
                    q = q.strip().split(" as ")[0]
                    t = resolve((mm.group(1) + "::" + q).split("::"))
                    if t and t != m: edges[m].add(t)
            else:
                t = resolve(part.split(" as ")[0].split("::"))
                if t and t != m: edges[m].add(t)
    # super:: paths relative to this module's parent
    base = list(m[:-1]) if not files[m].endswith("mod.rs") else list(m[:-1])
    for u in re.finditer(r"super::([a-z_][a-z0-9_]*(?:::[a-z_][a-z0-9_]*)*)", src):
        t = resolve(base + u.group(1).split("::"))
        if t and t != m: edges[m].add(t)
    for u in re.finditer(r"use\s+super::\{([^;]*)\};", src, re.S):
        for q in re.split(r",(?![^{]*\})", u.group(1)):
            q=q.strip().split(" as ")[0].split("::{")[0]
            t = resolve(base + q.split("::"))
            if t and t != m: edges[m].add(t)
    for u in pat.finditer(src):
        t = resolve(u.group(1).split("::"))
        if t and t != m: edges[m].add(t)
n = lambda t: "::".join(t) or "crate"
mutual = sorted({tuple(sorted((a, b))) for a in edges for b in edges[a] if a in edges.get(b, ()) and not (a == b[:len(a)] or b == a[:len(b)])})
print("mutual imports (file pairs):")
for a, b in mutual: print("  ", n(a), "<->", n(b))
top = collections.defaultdict(set)
for a in edges:
    for b in edges[a]:
        if a and b and a[0] != b[0]: top[a[0]].add(b[0])
print("top-level module arrows:")
for a in sorted(top): print("  ", a, "->", ", ".join(sorted(top[a])))
