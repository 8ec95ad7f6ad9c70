"""Import circles between the modules of a crate (issue #65): each source file is a module;
`crate::a::b` paths in its code (its `mod tests` excluded) are edges to the longest module path
that exists. Prints every strongly connected group of more than one module with its edges, and
exits 1 when there is one. Usage: python3 scripts/import-circles.py CRATE/src"""
import os, re, sys
root = sys.argv[1]
mods = {}
for d, _, fs in os.walk(root):
    for f in fs:
        if f.endswith('.rs'):
            p = os.path.join(d, f)
            rel = os.path.relpath(p, root)[:-3].split(os.sep)
            if rel[-1] in ('mod', 'lib'):
                rel = rel[:-1]
            mods['::'.join(rel)] = p
def target(path):
    parts = path.split('::')
    for n in range(len(parts), 0, -1):
        m = '::'.join(parts[:n])
        if m in mods:
            return m
    return None
def paths_at(src, i, prefix):
    """The module paths a `use`-like path starting at `src[i]` names: `a::b::c`, or with
    `{...}` groups (nested too), every path in them, each prefixed with `prefix`."""
    out = []
    m = re.match(r'((?:[a-z_0-9]+::)*)([a-z_0-9]*)', src[i:])
    head = prefix + m.group(1) + m.group(2)
    j = i + m.end()
    if m.group(2) == '' and src.startswith('{', j):
        depth, start, k = 0, j + 1, j
        items = []
        while k < len(src):
            ch = src[k]
            if ch == '{':
                depth += 1
            elif ch == '}':
                depth -= 1
                if depth == 0:
                    items.append((start, k))
                    break
            elif ch == ',' and depth == 1:
                items.append((start, k))
                start = k + 1
            k += 1
        for a, _ in items:
            while a < len(src) and src[a] in ' \n\t':
                a += 1
            out += paths_at(src, a, head)
        return out
    return [head.rstrip(':')] if head else []


edges = {m: set() for m in mods}
for m, p in mods.items():
    src = open(p).read()
    src = re.split(r'#\[cfg\(test\)\]\s*mod tests', src)[0]
    src = re.sub(r'//[^\n]*', '', src)
    at = 0
    while (i := src.find('crate::', at)) >= 0:
        at = i + len('crate::')
        if i > 0 and (src[i - 1].isalnum() or src[i - 1] in '_$'):
            continue  # `gstore_crate::`, not this crate
        for q in paths_at(src, at, ''):
            t = target(q)
            if t and t != m:
                edges[m].add(t)
# tarjan
index = {}; low = {}; st = []; on = set(); out = []; c = [0]
sys.setrecursionlimit(10000)
def sc(v):
    index[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
    for w in edges[v]:
        if w not in index:
            sc(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = st.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: out.append(sorted(comp))
for v in edges:
    if v not in index: sc(v)
for comp in out:
    print(len(comp), comp)
    for a in comp:
        print('   ', a, '->', sorted(e for e in edges[a] if e in comp))
print(f"{len(out)} import circles among {len(mods)} modules of {root}")
sys.exit(1 if out else 0)
