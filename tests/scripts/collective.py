"""The preflight all-reduce as a plain `trainer: script` job (args: --mb N --iters K --timeout S).

The program is launcher/nodeprog/collective.py, the one `mlaunch check` uploads to the
nodes; this file only runs it, so both paths run exactly the same text.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from launcher.nodeprog import source  # noqa: E402

exec(compile(source("collective"), "collective.py", "exec"), {"__name__": "__main__"})
