"""The node programs as they are shipped: one self-contained text each (launcher/nodeprog
parts inlined), run here with `python -` exactly as a node runs it."""
import ast
import json
import os
import socket
import subprocess
import sys

import pytest

from launcher import nodeprog

from .loadfactor import limit

PROGRAMS = ("facts", "mesh", "collective", "checkpoints", "outdir", "relay")
PARTS = {"facts": ("inputs", "ports", "meshnet"), "mesh": ("ports", "meshnet"), "checkpoints": ("ckpt_checks",), "relay": ("wrapped",)}


def ship(program: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run node program `program`'s shipped text on stdin, with argv args."""
    return subprocess.run([sys.executable, "-", *args], input=nodeprog.source(program),
                          capture_output=True, text=True, timeout=limit(120), cwd="/", env=env)


@pytest.mark.parametrize("program", PROGRAMS)
def test_shipped_text_is_one_program(program):
    """No import of a sibling is left, and every part's code stands in the text."""
    text = nodeprog.source(program)
    tree = ast.parse(text)
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level]
    for part in PARTS.get(program, ()):
        defs = [n.name for n in ast.parse(nodeprog._read(part)).body if isinstance(n, ast.FunctionDef)]
        assert defs and all(f"\ndef {d}(" in text for d in defs), part
    # the parts share one namespace: a name two of them bind would change the other's code
    bound = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    bound += [t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)]
    assert sorted({b for b in bound if bound.count(b) > 1}) == [], program


def facts_params(**over) -> str:
    p = {"rank": 0, "nonce": "n1", "bindir": None, "workdir": None, "trainer_pkg": None,
         "tracker": None, "out_dir": "/tmp", "shared_file": None,
         "inputs": [], "model_config": None, "budget": 20.0, "import_torch": False,
         "marker": "MLAUNCH-TEST"}
    return json.dumps({**p, **over})


def facts(env: dict | None = None, **over) -> dict:
    out = ship("facts", facts_params(**over), "0", env=env)
    assert out.returncode == 0, out.stderr
    line = [x for x in out.stdout.splitlines() if x.startswith("MLAUNCH-TEST ")][-1]
    return json.loads(line.split(" ", 1)[1])


def test_facts_reads_inputs_and_finds_a_mesh_port(tmp_path):
    got = facts(inputs=[{"kind": "file", "path": str(tmp_path / "nope")}])
    assert got["inputs"][0]["ok"] is False
    assert got["inputs"][0]["error"] == f"{tmp_path / 'nope'}: no such file"
    assert isinstance(got["mesh_port"]["port"], int) and got["mesh_port"]["port"] > 0
    assert "port" not in got   # master_port's test is the mesh's master listener (network.port_fact)


def dist_info(site, name: str, version: str) -> None:
    """A NAME-VERSION.dist-info folder as pip writes it, with its METADATA."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_facts_read_versions_from_dist_info_folders_as_importlib_metadata_finds_them(tmp_path):
    """The trainer's and transformers' versions come from the dist-info folders' names, the
    first along sys.path, which is the one importlib.metadata answers (checked against it);
    a package with no folder is reported missing."""
    first, second = tmp_path / "first", tmp_path / "second"
    dist_info(first, "Fake_Trainer", "1.2.3")
    dist_info(second, "fake_trainer", "9.9.9")
    dist_info(second, "transformers", "4.99.0")
    env = {**os.environ, "PYTHONPATH": f"{first}:{second}"}
    got = facts(env=env, trainer_pkg="fake-trainer")["trainer"]
    assert got == {"name": "fake-trainer", "version": "1.2.3", "transformers": "4.99.0"}, got
    said = subprocess.run([sys.executable, "-c", "from importlib.metadata import version as v; "
                           "print(v('fake-trainer'), v('transformers'))"],
                          env=env, capture_output=True, text=True, check=True).stdout.split()
    assert said == ["1.2.3", "4.99.0"]
    got = facts(env=env, trainer_pkg="not-installed-here")["trainer"]
    assert got == {"name": "not-installed-here", "version": None, "error": "not-installed-here is not installed"}


def test_facts_read_the_nccl_wheel_of_torchs_cuda_beside_torch(tmp_path):
    """A CUDA torch's NCCL version is its nvidia-nccl-cu* wheel's, from the folder beside
    torch; of two wheels, the one of torch's CUDA major; torch is not imported."""
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "version.py").write_text("__version__ = '2.11.0+cu130'\ncuda = '13.0'\n")
    (site / "torch" / "__init__.py").write_text("raise ImportError('fake torch: not to be imported')\n")
    dist_info(site, "nvidia_nccl_cu12", "2.21.5")
    dist_info(site, "nvidia_nccl_cu13", "2.28.9")
    got = facts(env={**os.environ, "PYTHONPATH": str(site)})["torch"]
    assert (got["version"], got["cuda"], got["nccl"], got["nccl_from"]) == (
        "2.11.0+cu130", "13.0", "2.28.9", "nvidia-nccl-cu13"), got


def test_facts_runs_the_meshs_first_round_in_its_own_process():
    """With a mesh plan the facts probe also listens and dials (meshnet inlined), so a node
    needs one process and one session for both: here it reaches its own listener."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    plan = {"rank": 0, "nonce": "n1", "window": 20.0, "shared": {},
            "listen": [{"key": "mesh", "port": port, "expect": 1}],
            "dials": [{"key": "node0", "addr": "127.0.0.1", "port": port}]}
    got = facts(mesh=plan)["mesh"]
    assert got["listen"]["mesh"] == {"ok": True, "got": [0]}
    assert got["dials"]["node0"]["peer"] == 0 and got["dials"]["node0"]["ip"] == "127.0.0.1"


def test_mesh_names_the_holder_of_the_master_port():
    """ports.bind and ports.holder, inlined in mesh: the master listener cannot bind a port this
    test listens on, and names this process as its holder (the port-free row's fix)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        p = {"rank": 0, "nonce": "n1", "window": 1.0, "shared": {}, "marker": "MLAUNCH-TEST",
             "listen": [{"key": "master", "port": port, "expect": 1}], "dials": []}
        out = ship("mesh", json.dumps(p))
    got = json.loads(out.stdout.split("MLAUNCH-TEST ", 1)[1])
    heard = got["listen"]["master"]
    assert heard["ok"] is False and heard["holder"]["pid"] == os.getpid(), heard


def test_mesh_dials_its_own_listener():
    """mesh with ports.bind inlined: listen on a free port and reach it over loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = {"rank": 0, "nonce": "n1", "window": 20.0, "shared": {}, "marker": "MLAUNCH-TEST",
         "listen": [{"key": "mesh", "port": port, "expect": 1}],
         "dials": [{"key": "node0", "addr": "127.0.0.1", "port": port}]}
    out = ship("mesh", json.dumps(p))
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.split("MLAUNCH-TEST ", 1)[1])
    assert got["listen"]["mesh"] == {"ok": True, "got": [0]}
    assert got["dials"]["node0"]["ok"] is True and got["dials"]["node0"]["peer"] == 0
    assert got["dials"]["node0"]["ip"] == "127.0.0.1"   # the address reached: settle_mesh compares it


def test_a_part_that_imports_a_part_is_refused(tmp_path, monkeypatch):
    (tmp_path / "prog.py").write_text("from .a import x\nx()\n")
    (tmp_path / "a.py").write_text("from .b import y\ndef x():\n    y()\n")
    monkeypatch.setattr(nodeprog, "HERE", str(tmp_path))
    with pytest.raises(ValueError, match="part a imports another part"):
        nodeprog.source("prog")


def test_outdir_lock_touch_unlock_through_the_shipped_text(tmp_path):
    """Only the run that holds output_dir's lock may refresh or remove it."""
    out, lock = str(tmp_path / "out"), tmp_path / "out" / ".mlaunch.lock"

    def op(*args):
        r = ship("outdir", *args)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    assert op("lock", out, "here", str(os.getpid()), "run-a")["ok"] is True
    os.utime(lock, (1000, 1000))
    assert op("touch", out, "run-b") == {"ok": False} and lock.stat().st_mtime == 1000
    assert op("unlock", out, "run-b") == {"ok": False} and lock.exists()
    assert op("touch", out, "run-a") == {"ok": True} and lock.stat().st_mtime > 1000
    assert op("unlock", out, "run-a") == {"ok": True} and not lock.exists()


def test_a_part_imported_twice_stands_once_at_its_first_import(tmp_path, monkeypatch):
    (tmp_path / "prog.py").write_text("from .a import x\nx()\nfrom .a import x\nprint('ok')\n")
    (tmp_path / "a.py").write_text("def x():\n    print('x')\n")
    monkeypatch.setattr(nodeprog, "HERE", str(tmp_path))
    text = nodeprog.source("prog")
    assert text == "def x():\n    print('x')\nx()\nprint('ok')"
    assert subprocess.run([sys.executable, "-c", text], capture_output=True, text=True).stdout == "x\nok\n"


def test_a_parenthesised_part_import_is_replaced_whole_and_the_parts_future_line_dropped(tmp_path, monkeypatch):
    (tmp_path / "paren.py").write_text("from __future__ import annotations\n\nfrom .b import (one,\n    two)\n"
                                      "print(one() + two())\n")
    (tmp_path / "b.py").write_text("from __future__ import annotations\n\ndef one():\n    return 1\n"
                                   "def two():\n    return 2\n")
    monkeypatch.setattr(nodeprog, "HERE", str(tmp_path))
    text = nodeprog.source("paren")   # a name of its own: source() is cached per name
    assert text == ("from __future__ import annotations\n\n\ndef one():\n    return 1\ndef two():\n"
                    "    return 2\nprint(one() + two())")
    assert subprocess.run([sys.executable, "-c", text], capture_output=True, text=True).stdout == "3\n"
    (tmp_path / "nofuture.py").write_text("from .b import one\nprint(one())\n")   # the program lacks it
    with pytest.raises(ValueError, match="has `from __future__ import annotations`; the program needs it too"):
        nodeprog.source("nofuture")


def test_mesh_reads_each_shared_marker_until_it_is_seen_then_never_again(tmp_path, monkeypatch):
    """The shared_dir markers: one already there is read once; a late one (written by another
    node's probe meanwhile) is looked for again until it appears, then the look ends."""
    from launcher.nodeprog import meshnet
    early, late = tmp_path / "m0", tmp_path / "m1"
    early.write_text("n1 0\n")
    opened: list[str] = []
    real_open = open

    def watching(path, *a, **kw):
        opened.append(str(path))
        if str(path) == str(late) and opened.count(str(late)) == 2:
            late.write_text("n1 1\n")   # the other node's probe writes its marker now
        return real_open(path, *a, **kw)

    monkeypatch.setattr(meshnet, "open", watching, raising=False)
    p = {"rank": 0, "nonce": "n1", "window": 20.0, "listen": [], "dials": [],
         "shared": {"0": str(early), "1": str(late)}}
    got = meshnet.run_mesh(p, None, None)
    assert got["shared"] == {"0": "ok", "1": "ok"}
    assert opened.count(str(early)) == 1
    assert opened.count(str(late)) == 2   # missing; written just before the second look, seen


def test_the_shared_dir_marker_is_never_written_through_a_planted_link(tmp_path):
    """Its name is on the probe's argv: another user of shared_dir may plant a link there
    first. The marker is created new (O_EXCL, O_NOFOLLOW): the check fails, the target is kept."""
    victim = tmp_path / "victim"
    victim.write_text("keep")
    marker = tmp_path / ".mlaunch-preflight-n1-node0"
    marker.symlink_to(victim)
    got = facts(shared_file=str(marker))
    assert got["shared"]["ok"] is False and victim.read_text() == "keep"
    marker.unlink()
    assert facts(shared_file=str(marker))["shared"]["ok"] is True
    assert marker.read_text() == "n1 0\n" and not marker.is_symlink()
