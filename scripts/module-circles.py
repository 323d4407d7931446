#!/usr/bin/env python3
"""Fails when a crate's modules depend on each other in a circle.

An edge runs from module A to its sibling B (same parent) when code in A
(or below it) names `crate::…::B` or reaches B through `super::`;
comments, `tests` modules and test kits are left out, and a module
reaching its own ancestor is not an edge. Every strongly connected set of
two or more siblings is printed with its edges and exits 1.

    scripts/module-circles.py          # check the workspace
    scripts/module-circles.py --why    # also name what each edge uses
"""
import os, re, sys
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
why = '--why' in sys.argv[1:]
found = 0
crates = ['core','scheduler-svc','sim','fmsim','node-agent','estimator','estimator-svc','fmctl','fake-trainer','runtime','proto']
def modpath(src, f):
    rel = os.path.relpath(f, src)[:-3].split(os.sep)
    if rel[-1] in ('mod','lib','main'): rel = rel[:-1]
    return rel
def is_test(path):
    parts = path
    return any(p in ('tests','testkit') for p in parts) or (parts and parts[-1].endswith('tests'))
for c in crates:
    src = os.path.join(root, c, 'src')
    if not os.path.isdir(src): continue
    mods = {}
    for d, _, fs in os.walk(src):
        for f in fs:
            if f.endswith('.rs'):
                p = os.path.join(d, f); mods[tuple(modpath(src, p))] = p
    edges = set(); syms = {}
    for m, p in mods.items():
        if is_test(m): continue
        text = open(p).read()
        # strip #[cfg(test)] mod tests { ... } crudely: cut at '#[cfg(test)]\nmod tests'
        i = text.find('#[cfg(test)]\nmod tests {')
        if i >= 0: text = text[:i]
        text = re.sub(r'//[^\n]*', '', text)
        targets = []
        for t in re.findall(r'crate::((?:[a-z_][a-z0-9_]*::)*[A-Za-z_][A-Za-z0-9_]*)', text):
            targets.append(tuple(t.split('::')))
        for t in re.findall(r'use crate::((?:[a-z_][a-z0-9_]*::)*)\{([^}]*)\}', text):
            for name in re.split(r'[,\s]+', t[1]):
                if name: targets.append(tuple(t[0].strip(':').split('::') + [name.split('::')[0]]))
        for t in re.findall(r'\b((?:super::)+)([a-z_][a-z0-9_]*)', text):
            ups = t[0].count('super::')
            base = list(m)
            # a file module's super is its parent
            base = base[:len(base)-ups]
            targets.append(tuple(base + [t[1]]))
        for t in targets:
            # find the longest known module prefix of t
            for k in range(len(t), 0, -1):
                if t[:k] in mods: tgt = t[:k]; break
            else: continue
            # sibling edge: first differing component under common parent
            common = 0
            while common < min(len(m), len(tgt)) and m[common] == tgt[common]: common += 1
            if common >= len(m) or common >= len(tgt): continue  # ancestor/descendant
            a = m[:common+1]; b = tgt[:common+1]
            if is_test(a) or is_test(b): continue
            edges.add((a, b))
            syms.setdefault((a, b), set()).add('::'.join(t) + ' @' + '::'.join(m))
    # find cycles via SCC
    nodes = sorted({x for e in edges for x in e})
    adj = {n: [b for a, b in edges if a == n] for n in nodes}
    index = {}; low = {}; stack = []; on = set(); sccs = []; i = [0]
    sys.setrecursionlimit(10000)
    def sc(v):
        index[v] = low[v] = i[0]; i[0] += 1; stack.append(v); on.add(v)
        for w in adj[v]:
            if w not in index: sc(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: sccs.append(comp)
    for n in nodes:
        if n not in index: sc(n)
    for comp in sccs:
        names = ['::'.join(x) for x in comp]
        inner = [(('::'.join(a)), ('::'.join(b))) for a, b in edges if a in comp and b in comp]
        found += 1
        print(c, 'CIRCLE', sorted(names))
        for a, b in sorted(inner):
            print('    ', a, '->', b)
            ea = tuple(a.split('::')); eb = tuple(b.split('::'))
            if why:
                for x in sorted(syms[(ea, eb)])[:8]: print('          ', x)
if found:
    print(f'{found} module circle(s); see scripts/module-circles.py --why', file=sys.stderr)
    sys.exit(1)
print('no module circles')
