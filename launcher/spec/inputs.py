"""Reading the files mlaunch reads itself (the spec, a hostfile, deepspeed.config, a model's
config.json), each bounded: only a regular file, only up to a size cap, YAML aliases limited.

Without these bounds `validate /dev/zero` grew without end, a FIFO given as the spec hung,
a 100 MB YAML took minutes to say "unknown key", and a "billion laughs" alias bomb under a
passthrough key passed validate and then blew up in the dry run. Each refusal is one line
naming the file (SpecError), before anything big is read or built."""
from __future__ import annotations

import errno
import os
import re
import stat

import yaml

from ..errors import SpecError

MIB = 1024 * 1024
SPEC_CAP = MIB          # a job spec or hostfile is a few KiB; 1 MiB is ~30,000 hostfile lines
CONFIG_CAP = 4 * MIB    # a ds_config.json or a model's config.json
# Nodes that YAML aliases may repeat beyond the document's own: anchors for shared settings
# repeat a few hundred; a billion-laughs bomb repeats 10^9 from a few hundred bytes.
ALIAS_NODES_CAP = 100_000

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class Unreadable(SpecError):
    """The file could not be opened or read at all (strerror: the system's words)."""

    def __init__(self, path: str, what: str, strerror: str):
        fix = ("give the path of a readable YAML file" if what == "spec" else
               "give the path of a readable file (a relative one is taken from the spec's folder)"
               if what in ("hostfile", "deepspeed.config") else "give the path of a readable file")
        super().__init__(f"{path}: cannot read the {what}: {strerror}; {fix}")
        self.strerror = strerror


def read_input(path: str, what: str, cap: int = SPEC_CAP) -> bytes:
    """The bytes of the regular file at path, at most cap of them, or a one-line SpecError.

    Opened with O_NONBLOCK so a FIFO never blocks the open; its type checked (stat before,
    fstat after the open, so a swap in between is caught) and its size checked before
    reading, and the read itself stops one byte past the cap (a file that grows meanwhile)."""
    try:
        _check_kind(path, what, os.stat(path))
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise Unreadable(path, what, e.strerror) from None
    with os.fdopen(fd, "rb") as fh:
        try:
            st = os.fstat(fd)
            _check_kind(path, what, st)
        except OSError as e:
            raise Unreadable(path, what, e.strerror) from None
        _check_size(path, what, st.st_size, cap)
        data = _read_upto(fh, path, what, cap + 1)
    _check_size(path, what, len(data), cap)
    return data


def read_stream(stream, what: str, cap: int = SPEC_CAP, name: str = "<stdin>") -> bytes:
    """Up to cap bytes of an open binary stream (standard input), or a one-line SpecError."""
    data = _read_upto(stream, name, what, cap + 1)
    _check_size(name, what, len(data), cap, exact=False)
    return data


def _read_upto(fh, path: str, what: str, n: int) -> bytes:
    """At most n bytes of fh (n = cap + 1: one more tells an oversized input)."""
    try:
        return fh.read(n) or b""
    except OSError as e:
        raise Unreadable(path, what, e.strerror) from None


def _check_kind(path: str, what: str, st: os.stat_result) -> None:
    """Refuse anything but a regular file (a directory: as the OSError open would give)."""
    if stat.S_ISREG(st.st_mode):
        return
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
    kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a file")
    raise SpecError(f"{path}: the {what} is {kind}, not a regular file; mlaunch reads the "
                    f"{what} only from a regular file: give its path")


def _check_size(path: str, what: str, size: int, cap: int, exact: bool = True) -> None:
    """Refuse size past cap (exact: size is the file's own; else a stream ran past it)."""
    if size <= cap:
        return
    amount = f"is {size:,} bytes, over" if exact else "runs past"
    raise SpecError(f"{path}: the {what} {amount} mlaunch's cap of {cap:,} bytes "
                    f"({cap // MIB} MiB) for a {what}; is this the right file?")


class BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses a document whose aliases repeat more than ALIAS_NODES_CAP nodes
    in all, or whose alias refers to a node that holds it (a cycle), before constructing it.

    PyYAML builds an alias as a shared reference, so the Python object stays small; it is
    every walk after (validation, the rendered files, the dry run's JSON) that expands it.
    Aliases are bounded rather than refused: anchors for settings shared between sections
    are ordinary YAML, and the cap never touches such use."""

    def construct_document(self, node):
        _alias_budget(node, ALIAS_NODES_CAP)
        return super().construct_document(node)


class WrittenInt(int):
    """A YAML 1.1 integer not written in plain decimal (010 is 8, 0x10 16, 1:30 90, 1_000
    1000), with its text: where a number passes on as text (script.args), the text as
    written, not the number PyYAML read from it. Everywhere else an int."""

    text: str


class WrittenFloat(float):
    """A YAML float whose text is not Python's for it (1.0e3 reads as 1000.0, 1.50 as 1.5),
    with its text, as WrittenInt."""

    text: str


_DECIMAL = re.compile(r"-?(0|[1-9][0-9]*)")


def _construct_int(loader, node):
    value = yaml.SafeLoader.construct_yaml_int(loader, node)
    return value if _DECIMAL.fullmatch(node.value) else _written(WrittenInt, value, node.value)


def _construct_float(loader, node):
    value = yaml.SafeLoader.construct_yaml_float(loader, node)
    return value if repr(value) == node.value else _written(WrittenFloat, value, node.value)


def _written(kind, value, text: str):
    out = kind(value)
    out.text = text
    return out


BoundedLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
BoundedLoader.add_constructor("tag:yaml.org,2002:float", _construct_float)
# dumped (override notes) as written: the same number when read again
for _kind, _tag in ((WrittenInt, "tag:yaml.org,2002:int"), (WrittenFloat, "tag:yaml.org,2002:float")):
    yaml.SafeDumper.add_representer(_kind, lambda d, v, tag=_tag: d.represent_scalar(tag, v.text))


class AliasBomb(yaml.YAMLError):
    """Raised by BoundedLoader; its message is the whole one-line problem."""


def _alias_budget(root, cap: int) -> None:
    """Count, without expanding, how many nodes the document is once every alias is expanded
    (each node's expanded size once, memoized) and refuse past cap beyond the distinct ones."""
    size: dict[int, int] = {}
    busy: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            busy.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in _children(node))
            if size[key] - len(size) > cap:
                break
            continue
        if key in size:
            continue
        if key in busy:
            raise AliasBomb(f"an alias at line {node.start_mark.line + 1} refers to a node that "
                            "contains it (a cycle); a job spec is a tree: write the value out")
        busy.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in size)
    repeated = size.get(id(root), 0) - len(size)
    if repeated > cap or id(root) not in size:
        raise AliasBomb(f"YAML aliases (*name) repeat over {cap:,} nodes; a job spec needs "
                        "far fewer: write the repeated values out or anchor smaller pieces")


def _children(node) -> list:
    """A composed node's child nodes (a mapping's keys and values)."""
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []
