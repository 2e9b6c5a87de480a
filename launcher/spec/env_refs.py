"""`$NAME` / `${NAME}` inside cluster.env values: references to the node's own environment.

A value that is exactly `${NAME}` is taken from the launcher's shell when the spec is read
(secret_rules.resolve_env_refs). A reference inside a longer value, or `$NAME` alone, means
the node's own value (`LD_LIBRARY_PATH: /opt/x/lib:$LD_LIBRARY_PATH`): the node script
expands it there (render.NodeValue), the rest stays literal. `$$` is one literal `$`.
Secret-named values are never expanded: a `$` in a token or password is part of it.
"""
from __future__ import annotations

import re

from ..errors import Problem
from .explain import SECRET_NAME

REF = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*)|(\$))")
BAD_BRACE = re.compile(r"\$\{(?![A-Za-z_][A-Za-z0-9_]*\})[^}]*\}?")


class Ref(str):
    """A reference to the node's variable of this name."""


def parts(value: str) -> list[str]:
    """value split into literal text (str) and node references (Ref), in order."""
    out: list[str] = []
    pos = 0
    for m in REF.finditer(value):
        out.append(value[pos:m.start()] + ("$" if m[3] else ""))
        if not m[3]:
            out.append(Ref(m[1] or m[2]))
        pos = m.end()
    out.append(value[pos:])
    merged: list[str] = []
    for p in out:   # adjacent literals joined, empty ones dropped
        if merged and not isinstance(p, Ref) and not isinstance(merged[-1], Ref):
            merged[-1] += p
        elif p or isinstance(p, Ref):
            merged.append(p)
    return merged


def node_parts(name: str, value: str) -> list[str] | None:
    """The parts of an env entry the node expands; None for a literal one (no reference, or a
    secret's name)."""
    if SECRET_NAME.search(name) or "$" not in value:
        return None
    p = parts(value)
    return p if any(isinstance(x, Ref) for x in p) else None


def literal(name: str, value: str) -> str:
    """The value a literal entry reaches the ranks with (`$$` is one `$`; secrets as written)."""
    return value if SECRET_NAME.search(name) or "$" not in value else "".join(parts(value))


def literal_of(value: str) -> str:
    """A value taken literally (a launcher-shell `${NAME}`), written so no node expands it."""
    return value.replace("$", "$$")


def check_env_refs(env: dict[str, str]) -> list[Problem]:
    """Shell forms beyond `$NAME`/`${NAME}` (defaults, commands) are refused with the way out."""
    out = []
    for name, value in env.items():
        if not isinstance(value, str) or SECRET_NAME.search(name):
            continue
        bare = value.replace("$$", "")   # `$$(` is a literal `$(`, as the message says
        bad = BAD_BRACE.search(bare) or re.search(r"\$\(", bare)
        if bad:
            out.append(Problem(f"cluster.env.{name}", f"{bad[0]!r}: only $NAME and ${{NAME}} are "
                               "expanded (from each node's environment); write $$ for a literal $, "
                               "or compute it in cluster.setup (e.g. - export "
                               f"{name}=...)"))
    return out

