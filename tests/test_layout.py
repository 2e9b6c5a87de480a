"""The package layout keeps its promise: no import cycle, no import from a lower stage to a
higher one, and a docstring in every package saying what it holds and may import."""
from __future__ import annotations

import ast
import glob
import os
import subprocess
import sys

from .helpers import ROOT


def test_no_import_cycle_and_no_upward_import():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "import_graph.py")],
                       capture_output=True, text=True)
    assert "cycles: 0" in r.stdout and "upward imports: 0" in r.stdout, r.stdout
    assert "outside the layers" not in r.stdout, r.stdout
    assert r.returncode == 0


def test_every_package_says_what_it_holds_and_may_import():
    for init in glob.glob(os.path.join(ROOT, "launcher", "*", "__init__.py")):
        doc = ast.get_docstring(ast.parse(open(init, encoding="utf-8").read())) or ""
        assert "May import" in doc or "may import" in doc, init


def test_the_top_floor_holds_only_the_base_modules():
    top = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "launcher", "*.py")))
    assert top == ["__init__.py", "errors.py", "pyparse.py", "render.py"]


# The rooms that may start a program: backends (and the transport they run on) on this
# machine, and nodeprog, which runs on the nodes.
PROCESS_ROOMS = ("backends", "transport", "nodeprog")


def test_only_backends_transport_and_node_programs_start_processes():
    """subprocess (and os.system/popen/exec*) appears only in PROCESS_ROOMS: a spec, plan,
    view or CLI module that ran git, ssh or a scheduler would bypass the backend's seam."""
    found = []
    for path in glob.glob(os.path.join(ROOT, "launcher", "**", "*.py"), recursive=True):
        room = os.path.relpath(path, os.path.join(ROOT, "launcher")).split(os.sep)[0]
        tree = ast.parse(open(path, encoding="utf-8").read())
        for node in ast.walk(tree):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            calls = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                node.value.id == "os" and node.attr in ("system", "popen", "execv", "execvp", "execvpe",
                                                          "spawnv", "posix_spawn")
            if (any(m.split(".")[0] == "subprocess" for m in mods) or calls) and room not in PROCESS_ROOMS:
                found.append(os.path.relpath(path, ROOT))
    assert found == [], found


def test_the_graph_tool_finds_a_planted_cycle_and_upward_import(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    try:
        import import_graph
    finally:
        sys.path.pop(0)
    graph = {"launcher.spec.a": {"launcher.spec.b"}, "launcher.spec.b": {"launcher.spec.a"},
             "launcher.plan.x": set()}
    assert import_graph.cycles(graph) == [["launcher.spec.a", "launcher.spec.b"]]
    assert import_graph.layer("launcher.spec.a") < import_graph.layer("launcher.cli.main")
