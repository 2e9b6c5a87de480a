"""`mlaunch render`: write a plan's files and per-node scripts to a local directory."""
from __future__ import annotations

import os
import posixpath

from .errors import UserError
from .plan import LaunchPlan


def write_rendered(plan: LaunchPlan, out: str) -> list[str]:
    """Write each rendered file under its base name and node<k>.sh per node; return the paths.

    Secrets stay masked: these files are for reading and review, not for running by hand.
    """
    written = []
    try:
        os.makedirs(out, exist_ok=True)
        for f in plan.files:
            written.append(_write(os.path.join(out, posixpath.basename(f.path)), plan.mask(f.content)))
        for node in plan.nodes:
            written.append(_write(os.path.join(out, f"node{node.rank}.sh"), "#!/bin/sh\n" + node.display))
    except OSError as e:
        raise UserError(f"--out {out}: cannot write {e.filename or out}: {e.strerror}; "
                        "give a directory you can write") from None
    return written


def _write(path: str, text: str) -> str:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    return path
