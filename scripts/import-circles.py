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
edges = {m: set() for m in mods}
for m, p in mods.items():
    src = open(p).read()
    src = re.split(r'#\[cfg\(test\)\]\s*mod tests', src)[0]
    src = re.sub(r'//[^\n]*', '', src)
    for mt in re.finditer(r'crate::((?:[a-z_0-9]+::)*[a-z_0-9]+)(?:::\{([^}]*)\})?', src):
        base = mt.group(1)
        paths = [base] + ([base + '::' + x.strip().split(' ')[0] for x in mt.group(2).split(',') if x.strip()] if mt.group(2) else [])
        for q in paths:
            t = target(q)
            if t and t != m and t != '':
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
