"""bench/README.md is made from bench/results/ (issue 56): never typed by hand, never stale."""
from __future__ import annotations

import os
import subprocess
import sys

from .helpers import ROOT


def test_bench_readme_is_what_make_readme_writes_from_the_results():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "make_readme.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, "bench/README.md is stale: run python bench/make_readme.py"


def test_every_result_has_an_entry():
    with open(os.path.join(ROOT, "bench", "README.md"), encoding="utf-8") as fh:
        page = fh.read()
    for name in os.listdir(os.path.join(ROOT, "bench", "results")):
        assert f"### [{name}]" in page, name
