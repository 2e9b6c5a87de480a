"""CPU of one OpenSSH login by key exchange, on a namespace test host (tests/hosts.py): the
client's CPU (its reaped rusage) and the wall time of `ssh host true`, 3 logins each, with the
client's default KexAlgorithms and with one named. Both mlaunch and pdsh pay the default's cost
once per host; ssh_config's KexAlgorithms chooses it (mlaunch's `ssh` children read that file).

  python bench/ssh_kex.py
"""
from __future__ import annotations

import os
import resource
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.hosts import make_hosts  # noqa: E402

KEX = ("default", "sntrup761x25519-sha512@openssh.com", "curve25519-sha256")


def login(argv: list[str]) -> tuple[float, float, int]:
    """(wall s, client CPU s, exit code) of one login."""
    import time
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.monotonic()
    code = subprocess.run(argv, stderr=subprocess.DEVNULL).returncode
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.monotonic() - t, r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime, code


def main() -> None:
    print(subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip())
    with make_hosts(1, isolated_home=True) as hs:
        h = hs.hosts[0]
        base = ["ssh", "-T", "-oBatchMode=yes", "-oStrictHostKeyChecking=yes", "-oGlobalKnownHostsFile=/dev/null",
                f"-oUserKnownHostsFile={hs.known_hosts}", "-i", hs.key_file, "-l", "root"]
        for kex in KEX:
            opt = [] if kex == "default" else [f"-oKexAlgorithms={kex}"]
            got = [login(base + opt + [h.ip, "true"]) for _ in range(3)]
            print(f"{kex:36s} " + "  ".join(f"wall {w:.3f} s client CPU {c:.3f} s exit {e}" for w, c, e in got))


if __name__ == "__main__":
    main()
