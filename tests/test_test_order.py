"""The suite's own scheduling (tests/conftest.py): the heaviest xdist groups are handed out
first, each group's tests keep their order, and a file the cost table does not know is
guessed from its marks."""
from __future__ import annotations

import json

import pytest

from . import conftest


class Item:
    """What heaviest_groups_first reads of a pytest item: its id and its marks."""

    def __init__(self, nodeid: str, group: str, *marks: str):
        self.nodeid = nodeid
        self.marks = {"xdist_group": pytest.mark.xdist_group(group).mark, **{m: getattr(pytest.mark, m).mark for m in marks}}

    def get_closest_marker(self, name: str):
        return self.marks.get(name)


def test_heaviest_group_first_and_each_group_in_its_own_order(tmp_path, monkeypatch):
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"files": {"tests/test_a.py": [2.0, 2], "tests/test_b.py": [300.0, 2],
                                           "tests/test_c.py": [40.0, 1]}}))
    monkeypatch.setattr(conftest, "COSTS", str(costs))
    items = [Item("tests/test_a.py::one", "tests/test_a.py"), Item("tests/test_a.py::two", "tests/test_a.py"),
             Item("tests/test_b.py::one", "tests/test_b.py"), Item("tests/test_c.py::one", "slurm"),
             Item("tests/test_b.py::two", "tests/test_b.py"), Item("tests/test_new.py::one", "tests/test_new.py", "training"),
             Item("tests/test_a.py::three", "slurm")]
    conftest.heaviest_groups_first(items)
    assert [i.nodeid for i in items] == [
        "tests/test_b.py::one", "tests/test_b.py::two",        # 300 s
        "tests/test_c.py::one", "tests/test_a.py::three",      # slurm: 40 + 1 s
        "tests/test_new.py::one",                              # unknown, training: guessed 30 s
        "tests/test_a.py::one", "tests/test_a.py::two"]        # 2 s


def test_without_a_table_the_marks_decide(tmp_path, monkeypatch):
    monkeypatch.setattr(conftest, "COSTS", str(tmp_path / "missing.json"))
    items = [Item("tests/test_u.py::x", "tests/test_u.py"), Item("tests/test_h.py::x", "tests/test_h.py", "multihost"),
             Item("tests/test_t.py::x", "tests/test_t.py", "training")]
    conftest.heaviest_groups_first(items)
    assert [i.nodeid for i in items] == ["tests/test_t.py::x", "tests/test_h.py::x", "tests/test_u.py::x"]
