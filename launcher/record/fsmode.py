"""Files and directories only their owner can read: 0600 and 0700, set explicitly.

A run's logs, console, events and rendered files may quote a secret the ranks printed, so
their modes are set here, not left to the umask or to the mode of the directory they are
made in (an existing 0755 MLAUNCH_HOME or output_dir/logs)."""
from __future__ import annotations

import errno
import os
from typing import TextIO

FILE_MODE = 0o600
DIR_MODE = 0o700


def private_dir(path: str) -> str:
    """Create path 0700 (its missing parents as the umask makes them); an existing one is
    made 0700 too. Returns path."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.exists(parent) and not os.path.isdir(parent):   # say what is wrong with path
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
    os.makedirs(parent, exist_ok=True)
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        if not os.path.isdir(path):
            raise
    os.chmod(path, DIR_MODE)
    return path


def private_fd(path: str, flags: int) -> int:
    """os.open(path, flags | O_CREAT) as a 0600 file, an existing file made 0600 as well."""
    fd = os.open(path, flags | os.O_CREAT, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    except OSError:
        os.close(fd)
        raise
    return fd


def open_private(path: str, mode: str = "a", buffering: int = -1) -> TextIO:
    """A text file opened for append ("a") or rewrite ("w"), 0600 whatever existed before."""
    flags = os.O_WRONLY | (os.O_APPEND if mode == "a" else os.O_TRUNC)
    return os.fdopen(private_fd(path, flags), mode, encoding="utf-8", buffering=buffering)


def write_private(path: str, text: str) -> str:
    """Write text to path as a 0600 file; returns path."""
    with open_private(path, "w") as fh:
        fh.write(text)
    return path
