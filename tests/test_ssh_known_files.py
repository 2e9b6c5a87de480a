"""Which known_hosts files each host's `ssh` client checks, and that fabric and paramiko are
imported only where an ssh_config names UserKnownHostsFile (or a login failed): importing them
costs ~0.13 s of CPU before the first login could begin (transport/ssh.py)."""
from __future__ import annotations

import os
import subprocess
import sys

from launcher.spec import SSH
from launcher.transport.ssh import SSHExecutor, names_known_hosts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _argv_known(ex: SSHExecutor, login: str) -> str:
    ex._add_stream(login)
    return next(a for a in ex._streams._argv[login] if a.startswith("-oUserKnownHostsFile="))


def test_an_ssh_config_naming_known_hosts_files_is_read_per_host(tmp_path):
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host special\n  UserKnownHostsFile /k/special\nHost *\n  ServerAliveInterval 5\n")
    ssh = SSH(config_file=str(cfg))
    assert names_known_hosts(ssh)
    ex = SSHExecutor(["special", "other"], ssh)
    try:
        assert _argv_known(ex, "special") == "-oUserKnownHostsFile=/k/special"
        assert _argv_known(ex, "other") == "-oUserKnownHostsFile=" + os.path.expanduser("~/.ssh/known_hosts")
    finally:
        ex.close()


def test_cluster_known_hosts_wins_over_the_ssh_config(tmp_path):
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host *\n  UserKnownHostsFile /k/from-config\n")
    ex = SSHExecutor(["a"], SSH(config_file=str(cfg), known_hosts="/k/mine", strict_host_keys=True))
    try:
        assert _argv_known(ex, "a") == "-oUserKnownHostsFile=/k/mine"
    finally:
        ex.close()


def test_a_commented_setting_names_nothing_and_either_form_of_a_setting_counts(tmp_path):
    """Debian's stock /etc/ssh/ssh_config holds `#   UserKnownHostsFile ~/.ssh/known_hosts.d/%k`:
    read as a setting, it made every submit import fabric before its first login."""
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host *\n#   UserKnownHostsFile ~/.ssh/known_hosts.d/%k\n  SendEnv LANG\n"
                   "  # userknownhostsfile /k/x\n  UserKnownHostsFiles /k/not-a-keyword\n")
    assert not names_known_hosts(SSH(config_file=str(cfg)))
    # as paramiko reads them: any case, "=", a no-break space, a Kelvin sign for K, CR line ends
    for text in ("Host *\nUserKnownHostsFile /k/a\n", "Host *\n  userknownhostsfile=/k/a\n",
                 "Host *\n\tUSERKNOWNHOSTSFILE\t/k/a\n", "Host *\n\u00a0UserKnownHostsFile\u00a0/k/a\n",
                 "Host *\nUser\u212anownHostsFile /k/a\n", "Host *\rUserKnownHostsFile /k/a\r"):
        cfg.write_bytes(text.encode())
        assert names_known_hosts(SSH(config_file=str(cfg))), text


def test_a_missing_config_file_is_left_to_fabric_to_refuse(tmp_path):
    assert names_known_hosts(SSH(config_file=str(tmp_path / "none")))


def test_without_such_a_config_no_host_needs_fabric_or_paramiko(tmp_path):
    """The default files, and neither module imported (in a fresh interpreter)."""
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host *\n  ServerAliveInterval 5\n  User train\n#   UserKnownHostsFile ~/.ssh/known_hosts.d/%k\n")
    code = ("import sys; from launcher.spec import SSH; from launcher.transport.ssh import SSHExecutor\n"
            f"ex = SSHExecutor(['a', 'b'], SSH(config_file={str(cfg)!r}, strict_host_keys=True))\n"
            "[ex._add_stream(h) for h in ('a', 'b')]\n"
            "print(sorted(m for m in ('fabric', 'paramiko') if m in sys.modules))\n"
            "print(next(a for a in ex._streams._argv['b'] if a.startswith('-oUserKnownHostsFile=')))\n"
            "ex.close()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["[]", "-oUserKnownHostsFile=" + os.path.expanduser("~/.ssh/known_hosts")]
