"""The launcher's import graph from the source (ast, no imports run): module-level and
function-level imports between launcher modules, the cycles among them, and the imports
that run from a lower layer up. `python tools/import_graph.py [--edges]`; exit 1 on either.

Layers, lowest first; a module may import its own layer and the ones below it only.
"""
from __future__ import annotations

import ast
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "launcher")
# Lowest first. A package not named here is its own top layer (reported as unknown).
LAYERS = ["errors", "pyparse", "render", "nodeprog", "spec", "plan", "record", "view", "logs", "watch", "transport", "session",
          "preflight", "runs", "backends", "cli"]


def modules() -> dict[str, str]:
    """Dotted module name -> file path, for every .py under launcher/."""
    out = {}
    for d, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                p = os.path.join(d, f)
                rel = os.path.relpath(p, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                out[rel.removesuffix(".__init__")] = p
    return out


def imports_of(name: str, path: str, known: set[str]) -> set[str]:
    """The launcher modules that module `name` imports (anywhere in its body)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    pkg = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for a in node.names:
                full = f"{base}.{a.name}"
                found.add(full if full in known else base)
    return {m for m in found if m in known and m != name}


def layer(mod: str) -> int:
    """Index of the module's layer (its first component under launcher)."""
    part = mod.split(".")[1] if "." in mod else "launcher"
    return LAYERS.index(part) if part in LAYERS else -1


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]; n[0] += 1; stack.append(v); on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def main(argv: list[str]) -> int:
    mods = modules()
    graph = {m: imports_of(m, p, set(mods)) for m, p in mods.items()}
    # A package's __init__ importing its own submodules is not a cycle of design.
    circ = [c for c in cycles(graph)]
    up = [(a, b) for a, bs in graph.items() for b in bs
          if layer(a) >= 0 and layer(b) > layer(a)]
    unknown = sorted({m.split(".")[1] for m in mods if "." in m and layer(m) < 0})
    if "--edges" in argv:
        for a in sorted(graph):
            print(a, "->", ", ".join(sorted(graph[a])))
    print(f"{len(mods)} modules, {sum(map(len, graph.values()))} imports")
    print(f"cycles: {len(circ)}")
    for c in circ:
        print("  " + " <-> ".join(c))
    print(f"upward imports: {len(up)}")
    for a, b in sorted(up):
        print(f"  {a} -> {b}")
    if unknown:
        print("outside the layers:", ", ".join(unknown))
    return 1 if circ or up else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
