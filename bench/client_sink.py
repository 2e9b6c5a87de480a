"""What an `ssh` client's stdout costs it: N namespace hosts each print MB of lines through
mlaunch's client arguments (transport/openssh.py), the clients' stdout being a regular file, a
1 MiB pipe drained by splice(2) (a thread per host; "gather": waiting 5 ms after a small
move, as the mover did), or a spool file moved into the log by a thread per host with
sendfile(2) (transport/spool.py). Reported: the clients' CPU seconds (all N together, this
process's reaped children) and the wall time, per variant, interleaved.

  python3 bench/client_sink.py --hosts 64 --mb 20 --runs 2     # (as root: namespace hosts)
"""
from __future__ import annotations

import fcntl
import os
import resource
import select
import subprocess
import tempfile
import threading
import time

from bench.logflood import LINE_BYTES, cpu_s, flood_args, generator
from launcher.transport.openssh import OpenSSHStreams
from launcher.transport.spool import Spool
from launcher.spec import SSH
from launcher.spec.hosts import HostAddr
from tests.hosts import make_hosts


def drain_pipe(proc: subprocess.Popen, log, gather: bool) -> None:
    fd = proc.stdout.fileno()
    fcntl.fcntl(fd, 1031, 2**20)   # F_SETPIPE_SZ, as openssh.py set it
    ready = select.poll()
    ready.register(fd, select.POLLIN)
    while True:
        ready.poll()
        moved = os.splice(fd, log.fileno(), 2**20)
        if not moved:
            return
        if gather and moved < 2**16:
            time.sleep(0.005)


def drain_spool(proc: subprocess.Popen, spool: Spool, log) -> None:
    while True:
        ended = proc.poll() is not None
        moved = spool.move_to(log.fileno())
        if not moved and ended:
            return
        if moved < 2**18:
            spool.pause(moved > 0)


def once(argvs: list[list[str]], cmd: str, sink: str, tmp: str, expect: int) -> tuple[float, float]:
    logs = [tempfile.TemporaryFile(dir=tmp) for _ in argvs]
    c0, t0 = cpu_s(resource.RUSAGE_CHILDREN), time.perf_counter()
    threads = []
    if sink == "file":
        procs = [subprocess.Popen(a + [cmd], stdout=f, stdin=subprocess.DEVNULL) for a, f in zip(argvs, logs)]
    elif sink == "spool":
        spools = [Spool(tmp) for _ in argvs]
        procs = [subprocess.Popen(a + [cmd], stdout=s.fd, stdin=subprocess.DEVNULL) for a, s in zip(argvs, spools)]
        threads = [threading.Thread(target=drain_spool, args=(p, s, f)) for p, s, f in zip(procs, spools, logs)]
    else:
        procs = [subprocess.Popen(a + [cmd], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL) for a in argvs]
        threads = [threading.Thread(target=drain_pipe, args=(p, f, sink == "pipe+gather")) for p, f in zip(procs, logs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = [p.wait() for p in procs]
    wall, cpu = time.perf_counter() - t0, cpu_s(resource.RUSAGE_CHILDREN) - c0
    assert codes == [0] * len(procs), codes
    assert all(os.fstat(f.fileno()).st_size == expect for f in logs), sink
    return cpu, wall


def main() -> None:
    a, lines = flood_args(runs=2)
    with make_hosts(a.hosts, isolated_home=True) as hs, tempfile.TemporaryDirectory() as tmp:
        streams = OpenSSHStreams(SSH(user="root", key_file=hs.key_file, known_hosts=hs.known_hosts))
        for h in hs.hosts:
            streams.add(h.ip, HostAddr(h.ip), None, [hs.known_hosts], None)
        argvs = [streams._argv[h.ip] for h in hs.hosts]
        print(f"{a.hosts} hosts x {a.mb:g} MB, mlaunch's client arguments, {a.runs} rounds interleaved")
        for _ in range(a.runs):
            for sink in ("file", "pipe", "pipe+gather", "spool"):
                cpu, wall = once(argvs, generator(lines), sink, tmp, lines * LINE_BYTES)
                print(f"  {sink:12s} clients' CPU {cpu:5.2f} s  wall {wall:5.2f} s", flush=True)
        streams.close()


if __name__ == "__main__":
    main()
