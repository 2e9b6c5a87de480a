"""A session's spool (launcher/transport/spool.py): the `ssh` client's stdout is a file, so the
client never waits for the launcher, and what was taken is punched out of it."""
from __future__ import annotations

import hashlib
import os
import subprocess

import pytest

from launcher.errors import UserError
from launcher.transport.spool import PUNCH_EVERY, Spool

from .helpers import limit

WRITER = ("import hashlib, sys\n"
          "for i in range(400000):\n"
          "    sys.stdout.write('%09d %s\\n' % (i, hashlib.sha256(b'%d' % i).hexdigest()[:40]))\n")


def test_a_writer_with_no_reader_ends_by_itself_and_every_byte_reads_back_once(tmp_path):
    """20 MB written while nobody reads (a pipe would hold 1 MB and stop the writer): the
    writer ends on its own; read back, the bytes are the writer's, in order, each once."""
    spool = Spool(str(tmp_path))
    assert os.listdir(tmp_path) == []   # unlinked at once: nothing to leave behind
    proc = subprocess.Popen(["python3", "-c", WRITER], stdout=spool.fd)
    assert proc.wait(limit(120)) == 0
    got = hashlib.sha256()
    size = 0
    while chunk := spool.read(proc):
        got.update(chunk)
        size += len(chunk)
    want = subprocess.run(["python3", "-c", WRITER], capture_output=True, check=True).stdout
    assert size == len(want) and got.hexdigest() == hashlib.sha256(want).hexdigest()


def test_what_was_taken_is_punched_out_and_a_line_given_back_is_read_again(tmp_path):
    spool = Spool(str(tmp_path))
    block = b"x" * 99 + b"\n"
    total = 3 * PUNCH_EVERY
    for _ in range(total // len(block)):
        os.write(spool.fd, block)
    taken = len(spool.take(4000))   # 40 lines
    spool.give_back(100)
    assert spool.take(100) == block   # the 40th line again
    while spool.take():
        pass
    held = os.fstat(spool.fd).st_blocks * 512
    assert taken == 4000 and os.fstat(spool.fd).st_size >= total - len(block)
    assert held < PUNCH_EVERY + 2**20, held   # at most the last unpunched stretch stays on disk


def test_where_sendfile_is_refused_the_move_copies_and_nothing_is_lost(tmp_path, monkeypatch):
    """A file system pair sendfile(2) refuses (EINVAL): the mover copies through a read and
    a write instead, from where it was, and the log gets every byte once."""
    import errno as err
    spool = Spool(str(tmp_path))
    data = b"".join(b"%09d line\n" % i for i in range(300000))
    os.write(spool.fd, data)
    out = os.open(tmp_path / "node0.log", os.O_WRONLY | os.O_CREAT, 0o600)
    assert spool.move_to(out) > 0   # sendfile, as on this machine

    def refused(*_):
        raise OSError(err.EINVAL, "Invalid argument")
    monkeypatch.setattr(os, "sendfile", refused)
    while spool.move_to(out):
        pass
    os.close(out)
    assert (tmp_path / "node0.log").read_bytes() == data


def test_a_spool_that_cannot_be_made_is_one_line_with_the_fix(tmp_path):
    with pytest.raises(UserError) as e:
        Spool(str(tmp_path / "gone"))
    assert str(e.value) == (f"cannot make a node's output spool in {tmp_path / 'gone'}: No such file or "
                            "directory; free space there or set TMPDIR to a directory with room")
