"""Log throughput and integrity: N hosts each print MB of numbered lines; and a rank's own
write rate while the launcher runs, is throttled, stopped and killed.

Compared in one run, interleaved: mlaunch's log path (SSH executor, one `ssh` session per
node under the node relay -> its spool -> the node log, the console following the logs)
against plain parallel `ssh host cmd > file`.
Every line is checked: no loss, no duplicate, no tear (sequence numbers + exact payload).
"""
from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from launcher.session.attempt import run_job
from launcher.transport.ssh import SSHExecutor
from launcher.logs.stream import Printer
from launcher.plan.launch_plan import build_plan
from launcher.spec import SSH, validate
from tests.helpers import script_job
from tests.hosts import make_hosts

LINE_BYTES = 100
PAYLOAD = "x" * (LINE_BYTES - 11)  # "%09d " + payload + "\n" == 100 bytes
GEN = ("import sys\nw = sys.stdout.write\np = '{p}'\n"
       "for i in range({n}):\n    w('%09d %s\\n' % (i, p))\n")
# --payload hex: each line's payload is hex digits of its number's SHA-256, which zlib packs
# only about 2x (the x payload: 35x; NCCL INFO and training logs fall between).
GEN_HEX = ("import hashlib, sys\nw = sys.stdout.write\n"
           "for i in range({n}):\n    h = hashlib.sha256(b'%d' % i).hexdigest()\n"
           "    w('%09d %s\\n' % (i, (h + h)[:89]))\n")
HEX = {"on": False}   # bench_logs(hex_payload=True) sets it for the run


def payload(seq: int) -> str:
    if not HEX["on"]:
        return PAYLOAD
    h = hashlib.sha256(b"%d" % seq).hexdigest()
    return (h + h)[:LINE_BYTES - 11]


def generator(lines: int) -> str:
    code = GEN_HEX.format(n=lines) if HEX["on"] else GEN.format(p=PAYLOAD, n=lines)
    return f"exec python3 -c {quote(code)}"


def quote(s: str) -> str:
    import shlex
    return shlex.quote(s)


def check(lines_by_node: dict[int, list[str]], expected: int) -> tuple[int, int, int]:
    """(lost, duplicated, torn) over all nodes."""
    lost = dup = torn = 0
    for lines in lines_by_node.values():
        seen = set()
        for line in lines:
            m = re.fullmatch(r"(\d{9}) ([0-9a-fx]+)", line)
            if not m or m.group(2) != payload(int(m.group(1))):
                torn += 1
                continue
            seq = int(m.group(1))
            dup += seq in seen
            seen.add(seq)
        lost += expected - len(seen)
    return lost, dup, torn


def flood_args(runs: int):
    """The flood benches' command line (--hosts, --mb per host, --runs): the parsed
    arguments and the lines each host prints."""
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--mb", type=float, default=20)
    ap.add_argument("--runs", type=int, default=runs)
    a = ap.parse_args()
    return a, int(a.mb * 1e6 / LINE_BYTES)


def cpu_s(who: int) -> float:
    """user + sys CPU seconds of this process (the launcher here) or of its waited children."""
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def via_mlaunch(hs, n: int, lines: int, tmp: str) -> tuple[float, tuple[int, int, int], float, float]:
    """Wall seconds, (lost, dup, torn), the launcher's CPU share (CPU s / wall s: run_job runs
    in this process, so its getrusage is the launcher's) and its `ssh` clients' share (all n
    together: transport/openssh.py's children, waited for by the time run_job returns)."""
    spec = script_job([h.ip for h in hs.hosts[:n]], 1, "allreduce.py", [], os.path.join(tmp, "out"), hs=hs)
    plan = build_plan(validate(spec))
    nodes = tuple(dataclasses.replace(nd, script=generator(lines)) for nd in plan.nodes)
    plan = dataclasses.replace(plan, nodes=nodes)
    out_path = os.path.join(tmp, "mlaunch.out")
    with open(out_path, "w") as out:
        t0, c0, k0 = time.perf_counter(), cpu_s(resource.RUSAGE_SELF), cpu_s(resource.RUSAGE_CHILDREN)
        result = run_job(plan, SSHExecutor([nd.login for nd in nodes], SSH(
            user="root", key_file=hs.key_file, known_hosts=hs.known_hosts, connect_timeout=60)), Printer(plan.mask, out))
        elapsed = time.perf_counter() - t0
        share = (cpu_s(resource.RUSAGE_SELF) - c0) / elapsed
        clients = (cpu_s(resource.RUSAGE_CHILDREN) - k0) / elapsed
    assert result.code == 0, result
    by_node: dict[int, list[str]] = {k: [] for k in range(n)}
    said = 0   # lines the console said it skipped or did not show (console.py): not lost
    in_mb = False   # the console said so in MB (a followed log, logs/console.py): no count
    with open(out_path) as fh:
        for line in fh:
            m = re.match(r"\[node(\d+) \S+\] (.*)$", line.rstrip("\n"))
            if m:
                by_node[int(m.group(1))].append(m.group(2))
            elif m := re.match(r"\[mlaunch\] console(?: behind)?: (?:skipped )?(\d+) lines?", line):
                said += int(m.group(1))
            elif re.match(r"\[mlaunch\] console(?: behind)?: (?:skipped )?[\d.]+ MB", line):
                in_mb = True
    lost, dup, torn = check(by_node, lines)
    if in_mb:
        said = lost
    logged = check({k: open(p).read().splitlines() for k, p in
                    enumerate(sorted(glob.glob(f"{plan.log_dir}/node*.log")))}, lines)
    # Lost: the node logs' losses, plus console lines gone without being announced.
    bad = (logged[0] + abs(lost - said), dup + logged[1], torn + logged[2])
    print(f"  console skipped {said} of {n * lines} lines, and said so", file=sys.stderr)
    return elapsed, bad, share, clients


def via_ssh(hs, n: int, lines: int, tmp: str) -> tuple[float, tuple[int, int, int], float]:
    """Wall seconds, (lost, dup, torn), and the ssh clients' CPU share (all n together)."""
    files = [open(os.path.join(tmp, f"ssh{k}.out"), "w") for k in range(n)]
    t0, c0 = time.perf_counter(), cpu_s(resource.RUSAGE_CHILDREN)
    # A minute to connect, as mlaunch's side gets: 64 handshakes at once on a loaded 2-core
    # machine outlast ssh_argv's 10 s.
    procs = [subprocess.Popen(hs.ssh_argv(h, connect_timeout=60) + [generator(lines)], stdout=f)
             for h, f in zip(hs.hosts[:n], files)]
    codes = [p.wait() for p in procs]
    elapsed = time.perf_counter() - t0
    share = (cpu_s(resource.RUSAGE_CHILDREN) - c0) / elapsed
    for f in files:
        f.close()
    assert codes == [0] * n, codes
    by_node = {k: open(f.name).read().splitlines() for k, f in enumerate(files)}
    return elapsed, check(by_node, lines), share


def unpaced(hs, n: int, lines: int) -> tuple[float, float]:
    """via_mlaunch with the console's pace lifted (logs/console.py RATE_BYTES_S, as before
    it): (wall s, launcher CPU share)."""
    from launcher.logs import console
    paced, console.RATE_BYTES_S = console.RATE_BYTES_S, 1e18
    try:
        with tempfile.TemporaryDirectory() as tmp:
            t, bad, cpu, _ = via_mlaunch(hs, n, lines, tmp)
    finally:
        console.RATE_BYTES_S = paced
    print(f"unpaced: {t:.2f}s cpu share {cpu:.2f} lost/dup/torn={bad} load {os.getloadavg()[0]:.1f}",
          file=sys.stderr)
    assert bad == (0, 0, 0), bad
    return t, cpu


def bench_logs(runs: int, mb: int, n: int = 8, hex_payload: bool = False,
               with_unpaced: bool = False) -> None:
    """mlaunch (node streams through `ssh` children) against raw parallel ssh, interleaved;
    with_unpaced: mlaunch without the console's pace too."""
    HEX["on"] = hex_payload
    lines = mb * 1_000_000 // LINE_BYTES
    ours, theirs, share, ssh_share, clients, up = [], [], [], [], [], []
    with make_hosts(n, isolated_home=True) as hs:
        for _ in range(runs):
            if with_unpaced:
                up.append(unpaced(hs, n, lines))
            with tempfile.TemporaryDirectory() as tmp:
                t, bad, cpu, kids = via_mlaunch(hs, n, lines, tmp)
                ours.append(t), share.append(cpu), clients.append(kids)
                print(f"mlaunch: {t:.2f}s cpu share {cpu:.2f} (its ssh clients {kids:.2f}) "
                      f"lost/dup/torn={bad} load {os.getloadavg()[0]:.1f}", file=sys.stderr)
                assert bad == (0, 0, 0), bad
            with tempfile.TemporaryDirectory() as tmp:
                t, bad, cpu = via_ssh(hs, n, lines, tmp)
                theirs.append(t), ssh_share.append(cpu)
                print(f"ssh:     {t:.2f}s cpu share {cpu:.2f} lost/dup/torn={bad} "
                      f"load {os.getloadavg()[0]:.1f}", file=sys.stderr)
                assert bad == (0, 0, 0), bad
    total = n * mb
    m, s = statistics.median(ours), statistics.median(theirs)
    ratios = [b / a for a, b in zip(ours, theirs)]   # each run's pair, measured side by side
    print(f"per-run ratios (ssh s / mlaunch s): {', '.join(f'{r:.2f}' for r in ratios)}; "
          f"launcher CPU shares: {', '.join(f'{c:.2f}' for c in share)}")
    print(f"{n} hosts x {mb} MB: mlaunch {total / m:.1f} MB/s (median {m:.2f}s), "
          f"parallel ssh {total / s:.1f} MB/s (median {s:.2f}s); throughput ratio {s / m:.2f}; "
          f"launcher CPU share {statistics.median(share):.2f} of a core (median; its {n} ssh "
          f"clients {statistics.median(clients):.2f}; raw ssh's {n} clients together "
          f"{statistics.median(ssh_share):.2f}); 0 lost, duplicated or torn lines")
    if up:
        u = statistics.median(t for t, _ in up)
        print(f"console unpaced, same runs: median {u:.2f}s, ratio to raw ssh {s / u:.2f}, launcher "
              f"CPU share {statistics.median(c for _, c in up):.2f}")


def _rate_samples(path: str) -> list[tuple[float, int]]:
    with open(path) as fh:
        return [(float(t), int(n)) for t, n in (line.split() for line in fh if line.count(" ") == 1)]


def _rate(path: str, start: float, end: float) -> float:
    """The rank's lines/s between two wall-clock times, from its own samples."""
    samples = _rate_samples(path)
    before = [s for s in samples if s[0] < start][-1:]  # the anchor: a phase shorter than a sample still counts
    inside = before + [s for s in samples if start <= s[0] <= end]
    if len(inside) < 2:
        return float("nan")
    (t0, n0), (t1, n1) = inside[0], inside[-1]
    return (n1 - n0) / (t1 - t0)


def bench_rank_rate(window: float = 4.0, hs=None) -> dict:
    """A one-rank job writing as fast as it can, on this machine (or on a namespace host of
    HostSet hs, over SSH: its node log spliced): its lines/s with the launcher running,
    throttled (SIGSTOP/SIGCONT, 50 ms each), stopped (SIGSTOP held) and killed (SIGKILL;
    the rank then lives until the node's hang-up guard ends it)."""
    import signal
    from tests.helpers import ROOT, write_spec
    from tests.procs import job_pids
    tmp = tempfile.mkdtemp(prefix="mlaunch-rate-")
    rate_file = os.path.join(tmp, "rate")
    spec = script_job([hs.hosts[0].ip] if hs else ["localhost"], 1, "allreduce.py", [],
                      os.path.join(tmp, "out"), hs=hs, env={"RATE_FILE": rate_file}, hangup_after_s=60)
    spec["script"]["path"] = os.path.join(ROOT, "bench", "rank_writer.py")
    spec["name"] = name = f"rate{os.getpid()}"
    proc = subprocess.Popen([sys.executable, "-m", "launcher.cli", "submit", write_spec(tmp, spec)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    while not os.path.exists(rate_file) or len(_rate_samples(rate_file)) < 5:
        assert proc.poll() is None, "the job ended before it wrote"
        time.sleep(0.05)
    phases = {}
    t = time.time(); time.sleep(window); phases["running"] = (t, time.time())
    t = time.time()
    while time.time() - t < window:
        proc.send_signal(signal.SIGSTOP); time.sleep(0.05)
        proc.send_signal(signal.SIGCONT); time.sleep(0.05)
    phases["throttled"] = (t, time.time())
    t = time.time(); proc.send_signal(signal.SIGSTOP); time.sleep(window)
    phases["stopped"] = (t, time.time()); proc.send_signal(signal.SIGCONT)
    time.sleep(1.0)  # back to draining before the kill
    t = time.time(); proc.kill(); proc.wait()
    while job_pids(name + "-"):
        time.sleep(0.02)
    phases["killed"] = (t, time.time())
    rates = {k: _rate(rate_file, *v) for k, v in phases.items() if k != "killed"}
    base = rates["running"]
    res = {k: {"lines_per_s": round(v), "ratio": round(v / base, 2)} for k, v in rates.items()}
    # Killed: the rank is not held by the dead launcher; the hang-up guard ends it.
    killed, gone = phases["killed"]
    after = [s for s in _rate_samples(rate_file) if s[0] >= killed]
    last_before = [s for s in _rate_samples(rate_file) if s[0] < killed][-1]
    res["killed"] = {"rank_wrote_for_s": round(after[-1][0] - killed, 2) if after else 0.0,
                     "lines_per_s": round(_rate(rate_file, killed, gone)) if after else None,
                     "lines_after_kill": after[-1][1] - last_before[1] if after else 0,
                     "all_job_processes_gone_s": round(gone - killed, 2)}
    return res
