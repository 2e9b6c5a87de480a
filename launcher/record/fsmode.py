"""Files and directories only their owner can read: 0600 and 0700, set explicitly, and never
reached through a link or taken over from another user.

A run's logs, console, events and rendered files may quote a secret the ranks printed, so
their modes are set here, not left to the umask or to the mode of the directory they are
made in (an existing 0755 MLAUNCH_HOME or output_dir/logs). They often sit in directories
other users can write (a team's output_dir, /tmp), where a planted `logs/<id> -> /etc` or
`node0.log -> /etc/passwd` would make a run (root's, say) chmod or append to the link's
target: so the file or directory mlaunch makes is opened without following a link
(O_NOFOLLOW), checked on the open descriptor (fstat: this user's, a plain file or a
directory, one name) before anything is changed or written, and refused with one line
(UnsafePath, exit 2) otherwise. A link on the way to it is followed only when this user or
root made it (a user's own `/data -> /mnt/data`), as fs.protected_symlinks would in a
sticky directory."""
from __future__ import annotations

import errno
import fcntl
import os
import stat
from typing import TextIO

from ..errors import UserError

FILE_MODE = 0o600
DIR_MODE = 0o700


class UnsafePath(UserError):
    """A path mlaunch would write that is a link, another user's, or not what it must be."""

    def __init__(self, path: str, what: str):
        super().__init__(f"{path}: {what}; mlaunch writes nothing there: remove it (as its "
                         "owner), or choose a directory of your own")


def private_dir(path: str) -> str:
    """Create path 0700 (its missing parents as the umask makes them); an existing one must be
    this user's directory, not a link, and is made 0700 too. Returns path."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.exists(parent) and not os.path.isdir(parent):   # say what is wrong with path
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
    check_links(parent)
    os.makedirs(parent, exist_ok=True)
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        pass
    fd = _open_dir(path)
    try:
        _own(path, os.fstat(fd))
        os.fchmod(fd, DIR_MODE)
    finally:
        os.close(fd)
    return path


def team_dir(path: str) -> str:
    """A `.mlaunch` that every user of a shared workdir or shared_dir shares: created 1777 with
    the sticky bit (each user's own 0700 folder goes inside; the sticky bit keeps others from
    removing it); one that exists is used as it is, whoever made it, unless it is a link or
    not a directory. The launcher-side twin of templates/private_dirs.sh.j2's. Returns path."""
    parent = os.path.dirname(os.path.abspath(path))
    check_links(parent)
    os.makedirs(parent, exist_ok=True)   # the shared_dir itself, as the umask makes it
    try:
        os.mkdir(path, DIR_MODE)
        os.chmod(path, 0o1777)
    except FileExistsError:
        os.close(_open_dir(path))   # refuses a link; another user's directory is fine here
    return path


def user_dir(path: str, field: str = "cluster.shared_dir") -> str:
    """path (a user's folder inside a team_dir) made 0700 and this user's, its parent a
    team_dir. Returns path; a folder that cannot be made is one line naming field (UserError)."""
    try:
        team_dir(os.path.dirname(os.path.abspath(path)))
        return private_dir(path)
    except OSError as e:
        raise UserError(f"{field}: cannot create {e.filename or path}: {e.strerror}; give a "
                        "directory you can write, on storage every node mounts") from None


def check_links(path: str) -> None:
    """Refuse a link on the way to path (itself included) that neither this user nor root
    made: another user's link can point mlaunch's writes anywhere."""
    walked = "/"
    for part in os.path.abspath(path).split("/")[1:]:
        walked = os.path.join(walked, part)
        try:
            st = os.lstat(walked)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in (os.geteuid(), 0):
            raise UnsafePath(walked, f"a link to {_target(walked)} made by {_user(st.st_uid)}")


def private_fd(path: str, flags: int) -> int:
    """os.open(path, flags | O_CREAT) as a 0600 file, an existing file made 0600 as well; the
    last name is not followed, and an existing file must be this user's plain file with one
    name (O_TRUNC applies only after that check)."""
    try:
        fd = os.open(path, (flags & ~os.O_TRUNC) | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, FILE_MODE)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):   # a link, a FIFO, a directory
            _refuse_existing(path)
        raise
    try:
        _own_file(path, os.fstat(fd))
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        os.fchmod(fd, FILE_MODE)
        if flags & os.O_TRUNC:
            os.ftruncate(fd, 0)
    except BaseException:
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


def check_writable(path: str) -> None:
    """Refuse path, before anything is written, if it exists and private_fd would refuse it."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        _refuse_existing(path)
    _own_file(path, st)


def _own_file(path: str, st: os.stat_result) -> None:
    """Refuse anything but this user's plain file with one name."""
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePath(path, "not a plain file")
    _own(path, st)
    if st.st_nlink > 1:   # a hard link to another file (/etc/passwd) in this directory
        raise UnsafePath(path, f"a file with {st.st_nlink} names (a hard link)")


def _open_dir(path: str) -> int:
    """A descriptor of directory path itself, never of a link's target."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except NotADirectoryError:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            _refuse_existing(path)
        raise FileExistsError(errno.EEXIST, "exists and is not a directory", path) from None


def _own(path: str, st: os.stat_result) -> None:
    """Refuse what another user owns: its owner could read or replace what mlaunch puts there."""
    if st.st_uid != os.geteuid():
        raise UnsafePath(path, f"belongs to {_user(st.st_uid)}, not to {_user(os.geteuid())}")


def _refuse_existing(path: str) -> None:
    """Raise UnsafePath for an existing path that open refused (a link, a FIFO, a directory)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePath(path, f"a link (to {_target(path)}), not a file or directory of "
                                 f"{_user(os.geteuid())}'s")
    raise UnsafePath(path, "not a plain file")


def _target(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def _user(uid: int) -> str:
    """'name (uid N)', or 'uid N' for a uid without a name."""
    try:
        import pwd
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
