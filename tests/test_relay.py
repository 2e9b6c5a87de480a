"""The spliced log path's parts (issue 28): the node relay (nodeprog/relay.py) masks exactly as
the launcher does and copies what the launcher must see; the console shows a node log at the
console's pace and says what it skipped. The path end to end over SSH: test_fanout.py and
test_secrets.py (every OpenSSH session runs under the relay)."""
from __future__ import annotations

import glob
import io
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from launcher import nodeprog, render
from launcher.session import nodeoutput as spliced
from launcher.logs.console import Console
from launcher.nodeprog.relay import Relay
from launcher.watch.health import MARKS, may_matter
from launcher.watch.world_lines import TEE_PREFIX, whole_line
from launcher.logs.stream import Printer
from launcher.logs.torchrun_out import ROOT_CAUSE, TorchrunRootCause
from launcher.plan.launch_plan import MASK
from launcher.spec.secret_rules import mask_rules, mask_text
from launcher.view.nodeview import split_text

from .helpers import mlaunch, script_job, write_spec
from .loadfactor import limit

SECRETS = ("hf_" + "a1b2c3d4e5f6", "tok-9", "ab")
# The bootstrap's way of reading a framed script (templates/bootstrap.sh.j2), nothing else.
READ_SCRIPT = 'read -r n || exit 97; s=$(head -c "$n"; echo .); eval "${s%.}"'


def relay(script: str, secrets=SECRETS) -> subprocess.CompletedProcess:
    """Run script under the relay as a node runs it: its config frame, then the script's."""
    config = {**mask_rules(secrets, MASK), "marks": list(MARKS), "after": [[ROOT_CAUSE, 12]],
              "sample": "\x1emlaunch-"}
    stdin = render.relay_frame(config) + render.framed(script)
    return subprocess.run([sys.executable, "-c", nodeprog.source("relay"), "/bin/sh", "-c", READ_SCRIPT],
                          input=stdin, capture_output=True, timeout=60)


TEXT = ("plain hf_a1b2c3d4e5f6 and tok-9 and ab alone but not tab or abc\n"
        "url https://user:pw-7@host/x and ftp://u:p@h and no creds http://h/x\n"
        "{'loss': 1.5, 'epoch': 0.1} world_size=4\n"
        "  3%|#  | 3/100 [00:01<00:30]\n"
        "Saving model checkpoint to /out/checkpoint-5\n")


def test_the_relay_masks_every_byte_as_the_launcher_masks_text():
    text = TEXT * 3 + "".join(f"line {k} tok-9{k} ab{k} ab\n" for k in range(200))
    r = relay(f"cat <<'EOF'\n{text}EOF\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode() == mask_text(text, SECRETS, MASK)
    assert b"a1b2c3" not in r.stdout + r.stderr and b"pw-7" not in r.stdout + r.stderr


def test_the_relay_copies_every_line_the_watch_reads_and_only_those():
    text = TEXT + "".join(f"filler {k}\n" for k in range(1000))
    r = relay(f"cat <<'EOF'\n{text}EOF\n")
    seen = r.stderr.decode()
    assert all(line.startswith("\x1f") for line in seen.splitlines())
    seen = seen.replace("\x1f", "")
    wanted = [line for line in mask_text(text, SECRETS, MASK).splitlines() if may_matter(line)]
    assert seen.splitlines() == wanted and len(wanted) == 3   # the dict, the bar, the save
    # What the relay copies is what the watch looks for: every mark is one may_matter() needs.
    assert all(may_matter(m) for m in MARKS)


def test_samples_leave_the_log_and_reach_the_launcher_and_progress_frames_are_lines():
    script = ("printf 'job line\\n\\036mlaunch-cpu 1 2 3 4\\nhead\\036mlaunch-gpu 0, 1, 2, 3\\n'; "
              "printf ' 10%%|#  | 1/10\\r 20%%|## | 2/10\\r'; sleep 0.2; printf ' 30%%|###| 3/10\\n'")
    r = relay(script)
    assert r.stdout == b"job line\nhead\n 10%|#  | 1/10\r 20%|## | 2/10\r 30%|###| 3/10\n"
    text, samples = split_text(r.stderr.decode().replace("\x1f", ""))
    assert samples == ["cpu 1 2 3 4", "gpu 0, 1, 2, 3"]
    # Each frame of the bar is a line of its own for the watch: the steps as they happen.
    assert text.splitlines() == ["head", " 10%|#  | 1/10", " 20%|## | 2/10", " 30%|###| 3/10"]


def test_a_node_without_gpus_gets_its_cpu_samples_from_the_relay_until_its_command_ends():
    """The sampler's one request line (templates/sampler.sh.j2 on a node without GPUs): the
    relay, not a shell loop, writes a CPU row at once and then every period, in the launcher's
    lines only; the request is in neither stream, and the rows end with the command."""
    # 3 s for at least 10 rows 0.1 s apart (a period of 0.3 s or less): a relay stalled for up
    # to 2 s on a busy machine still writes them (a row at once, then one every period).
    script = ("echo before; printf '\\036mlaunch-cpu-every 100\\n'; sleep 3; echo after")
    t0 = time.monotonic()
    r = relay(script)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"before\nafter\n"
    text, samples = split_text(r.stderr.decode().replace("\x1f", ""))
    assert text == "" and b"cpu-every" not in r.stderr
    rows = [s.split() for s in samples]
    # one at once, then one every 0.1 s while the command ran (fewer on a slow machine, never more)
    assert 10 <= len(rows) <= took / 0.1 + 1, (len(rows), took)
    assert all(row[0] == "cpu" and len(row) == 5 and all(x.isdigit() for x in row[1:]) for row in rows)
    busy, idle = [int(row[1]) for row in rows], [int(row[2]) for row in rows]
    assert busy == sorted(busy) and idle == sorted(idle) and int(rows[0][3]) > 0   # jiffies only grow


def test_a_process_the_command_left_holding_its_output_does_not_keep_the_relay():
    """The command starts a daemon that keeps its output open (as a cluster.setup line's
    `daemon &` does), prints, and exits 3: the relay ends with 3 soon after, every line the
    command printed relayed; the daemon, not the relay's to end, is still there."""
    script = "sleep 600 & echo $! > \"$DAEMON\"; echo last words; exit 3"
    pidfile = f"/tmp/mlaunch-relay-daemon-{os.getpid()}"
    os.environ["DAEMON"] = pidfile
    try:
        r = relay(script)
        with open(pidfile) as fh:
            daemon = int(fh.read())
        assert r.returncode == 3 and r.stdout == b"last words\n", r
        os.kill(daemon, 0)   # still running: it only no longer holds the session open
    finally:
        del os.environ["DAEMON"]
        if os.path.exists(pidfile):
            with open(pidfile) as fh:
                pid = fh.read().strip()
            if pid:
                os.kill(int(pid), signal.SIGKILL)
            os.remove(pidfile)


def test_what_the_command_wrote_before_its_end_is_relayed_however_slowly_it_drains(tmp_path):
    """The command writes 900 KB into its pipe (nobody reads the relay yet), says it is done,
    and exits; the reader then drains the relay at ~160 KB/s, far longer than AFTER_EXIT_S
    (a loaded node or a slow link; the relay used to stop AFTER_EXIT_S after the command's
    end and lose the rest): every line arrives, in order, and the relay ends with the
    command's code."""
    from launcher.nodeprog.relay import AFTER_EXIT_S
    done, lines = tmp_path / "done", 9_000
    script = (f"i=0; while [ $i -lt {lines} ]; do printf '%09d %s\\n' $i {'y' * 90}; i=$((i+1)); done;"
              f" touch {done}; exit 5")
    config = {"marks": list(MARKS), "sample": "\x1emlaunch-"}
    proc = subprocess.Popen([sys.executable, "-c", nodeprog.source("relay"), "/bin/sh", "-c", READ_SCRIPT],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    proc.stdin.write(render.relay_frame(config) + render.framed(script))
    proc.stdin.close()
    deadline = time.monotonic() + limit(60)
    while not done.exists():   # written whole into the pipes while nobody read
        assert time.monotonic() < deadline and proc.poll() is None, "the command never ended"
        time.sleep(0.05)
    got, started = [], time.monotonic()
    while chunk := os.read(proc.stdout.fileno(), 16384):
        got.append(chunk)
        time.sleep(0.1)
    assert proc.wait(limit(30)) == 5
    numbers = [int(line[:9]) for line in b"".join(got).splitlines()]
    assert numbers == list(range(lines))
    assert time.monotonic() - started > AFTER_EXIT_S   # the drain did outlast the grace


def test_torchruns_root_cause_reaches_the_launcher_with_its_exit_code():
    report = ("Root Cause (first observed failure):\n[0]:\n  time      : 2026-12-04_10:00:00\n"
              "  host      : n1\n  rank      : 1 (local_rank: 0)\n  exitcode  : 3 (pid: 42)\n")
    r = relay(f"echo noise; cat <<'EOF'\n{report}EOF\nexit 1")
    assert r.returncode == 1
    cause = TorchrunRootCause()
    cause.see_text(r.stderr.decode().replace("\x1f", ""))
    assert cause.code == 3


def test_the_relay_reads_its_config_frame_as_the_launcher_wrote_it():
    from launcher.nodeprog.relay import parse_frame
    config = {**mask_rules(SECRETS + ("multi\nline \u00e9 secret",), MASK), "marks": list(MARKS),
              "after": [[ROOT_CAUSE, 12]], "sample": "\x1emlaunch-"}
    head, body = render.relay_frame(config).split(b"\n", 1)
    assert int(head) == len(body)
    assert parse_frame(body.decode()) == config
    assert parse_frame(render.relay_frame({}).split(b"\n", 1)[1].decode()) == {}
    with pytest.raises(ValueError):
        render.relay_frame({"literal": [["a\0b", "***"]]})


def by_lines(blocks, marks, after, sample):
    """What the relay must copy, read line by line (a line ends at "\\n", "\\r\\n" or "\\r"):
    each line holding a mark or the sample, and the `after` lines past an `after` mark."""
    seen, follow = [], 0
    for block in blocks:
        lines = re.split(rb"\r\n|\r|\n", block)
        for line in lines[:-1] if not lines[-1] else lines:
            if follow or any(m in line for m in (*marks, *after, sample)):
                seen.append(b"\x1f" + line + b"\n")
            follow = max(follow - 1, 0)
            follow = next((n for m, n in after.items() if m in line), follow)
    return b"".join(seen)


def test_the_relay_copies_what_a_line_by_line_reading_copies_from_random_blocks():
    import random
    rng = random.Random(28)
    marks = [m.encode() for m in MARKS]
    after, sample = {ROOT_CAUSE.encode(): 3}, b"\x1emlaunch-"
    parts = marks + [*after, sample, b"\n", b"\r", b"\r\n", b"xy ", b"%", b"|", b"worl", b"\n\n"]
    config = {"marks": list(MARKS), "after": [[ROOT_CAUSE, 3]], "sample": sample.decode()}
    for _ in range(3000):
        blocks = [b"".join(rng.choice(parts) for _ in range(rng.randint(0, 30))) + b"\n"
                  for _ in range(3)]
        r = Relay(config)
        got = b"".join(r.split(block)[1] for block in blocks)
        assert got == by_lines(blocks, marks, after, sample), blocks


@pytest.mark.parametrize("spawner", ["posix_spawn", "subprocess"])
def test_the_wrapped_command_runs_in_a_session_of_its_own_with_sigpipe_default(spawner, monkeypatch):
    """nodeprog/wrapped.py's spawn: posix_spawn, or subprocess where the C library lacks
    POSIX_SPAWN_SETSID (posix_spawnp raises NotImplementedError): the same child either way."""
    from launcher.nodeprog import wrapped
    if spawner == "subprocess":
        def unsupported(*a, **k):
            raise NotImplementedError("setsid")
        monkeypatch.setattr(os, "posix_spawnp", unsupported)
    # The command reports its session and its ignored signals (Python ignores SIGPIPE).
    script = 'read -r _ _ _ _ _ sid _ < /proc/$$/stat; echo "$sid $$"; grep SigIgn /proc/$$/status; kill -TERM $$'
    child = wrapped.spawn(["/bin/sh", "-c", script])
    out = b""
    while chunk := os.read(child.fd, 4096):
        out += chunk
    (sid, pid), (_, ignored) = (line.split() for line in out.decode().splitlines())
    assert sid == pid                                  # a session of its own (teardown's group)
    assert int(ignored, 16) & (1 << (signal.SIGPIPE - 1)) == 0, out   # SIGPIPE is the default
    assert child.wait() == -15


def test_the_relay_ends_as_its_command_did_and_keeps_an_unended_last_line():
    r = relay("printf 'a\\nlast without end'; kill -TERM $$")
    assert r.returncode == -signal.SIGTERM
    assert r.stdout == b"a\nlast without end"


def test_a_line_longer_than_the_hold_goes_out_whole_and_unmasked_nowhere():
    long = "x" * (3 * 2**20) + "hf_a1b2c3d4e5f6"   # a secret where a cut at HOLD might fall
    r = relay(f"printf '%s\\n' {long}")
    assert r.stdout.count(b"x") == 3 * 2**20 and r.stdout.endswith(b"***\n")
    assert r.returncode == 0 and b"a1b2c3" not in r.stdout


def following(path, rank: int = 0, **console_kw):
    """(console, what it printed) with the console following node rank's log at path (an
    empty file made here), as a session sets it up for each node."""
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(b"")
    out = io.StringIO()
    console = Console(Printer(lambda s: s, out, color=False), {rank: str(path)}, **console_kw)
    console.follow(rank, f"h{rank}", str(path))
    return console, out


def test_the_console_shows_a_log_whole_at_the_end_of_a_quiet_run(tmp_path):
    path = tmp_path / "node0.log"
    console, out = following(path)
    with open(path, "ab") as fh:
        fh.write(b"".join(b"line %d\n" % k for k in range(1000)) + b"partial")
    console.close()
    shown = [line for line in out.getvalue().splitlines() if line.startswith("[node0 h0] ")]
    assert shown == [f"[node0 h0] line {k}" for k in range(1000)]
    assert "not shown" not in out.getvalue()


def test_the_console_skips_to_the_newest_and_says_so_in_megabytes(tmp_path):
    path = tmp_path / "node0.log"
    console, out = following(path, bound=2**20)
    with open(path, "ab") as fh:   # 8 MB at once: far past the bound
        fh.write(b"".join(b"%09d %s\n" % (k, b"y" * 90) for k in range(80_000)))
    console.close()
    text = out.getvalue()
    shown = [int(line.split()[2]) for line in text.splitlines() if line.startswith("[node0 h0] ")]
    assert shown and shown[-1] == 79_999 and shown == sorted(shown) and len(shown) < 80_000
    assert "console behind: skipped" in text and " MB to keep up" in text and str(path) in text


def test_after_a_teardown_what_the_console_never_read_is_one_line_with_the_path(tmp_path):
    path = tmp_path / "node3.log"
    console, out = following(path, rank=3)
    console.abandon()
    with open(path, "ab") as fh:
        fh.write((b"z" * 99 + b"\n") * 10_000)   # 1,000,000 bytes
    console.close()
    assert f"console: 1.0 MB of node output not shown here; every line is in {path}" in out.getvalue()
    assert "[node3" not in out.getvalue()


def test_a_log_removed_under_the_console_is_followed_again_at_its_path(tmp_path):
    path = tmp_path / "logs" / "node0.log"
    console, out = following(path)
    path.write_bytes(b"before\n")
    deadline = time.monotonic() + limit(30)
    while console._logs[0].pos < 7:   # until the console has read it
        assert time.monotonic() < deadline, "the console never read the log"
        time.sleep(0.02)
    os.remove(path)
    path.write_bytes(b"after\n")
    console.close()
    assert "[node0 h0] after" in out.getvalue()


# torchrun's --tee copies each rank's file with a header a line ("[default0]:"); under load it
# copies a line the rank is still writing in two, a second header inside it (what the watch
# reads whole: launcher/watch/world_lines.py's whole_line). That is torchrun's copy, before the
# relay; the rank's own file is whole.


def assert_numbered(data: bytes, lines: int, log: str) -> None:
    """data holds the lines "%09d y*90" for 0..lines-1, each once, in order (torchrun's
    headers aside); else where the first one is wrong, and the bytes around it."""
    body = [TEE_PREFIX.sub("", whole_line(line), count=1) for line in data.decode("utf-8", "replace").splitlines()]
    numbers = [int(m.group(1)) for m in map(re.compile(r"^(\d{9}) y{90}$").match, body) if m]
    if numbers != list(range(lines)):
        at = next((k for k, n in enumerate(numbers) if n != k), len(numbers))
        where = data.find(b"%09d" % max(0, at - 1))   # the last one right
        there = data[max(0, where - 300):where + 300] if where >= 0 else data[-600:]
        pytest.fail(f"{log}: {len(numbers)} numbered lines of {lines}; the first wrong at {at}; "
                    f"there: {there!r}")


@pytest.mark.multihost
def test_a_job_over_ssh_goes_through_the_relay_into_complete_masked_logs(hosts2, tmp_path):
    canary, lines = "hf_relay_" + "5e" * 12, 40_000   # 4 MB a node
    hs = hosts2
    spec = script_job([h.ip for h in hs.hosts], 1, "relay_job.py", [str(lines)],
                      str(tmp_path / "out"), hs=hs, env={"HF_TOKEN": canary})
    r = mlaunch("submit", write_spec(tmp_path, spec), timeout=limit(300))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    logs = sorted(glob.glob(str(tmp_path / "out" / "logs" / "*" / "node*.log")))
    assert len(logs) == 2
    for log in logs:
        with open(log, "rb") as fh:
            data = fh.read()
        assert_numbered(data, lines, log)
        assert canary.encode() not in data and b"token ***" in data
        assert b"frame one" in data and b"frame two" in data
    # torchrun's own copy of each rank's output (unmasked) is gone once the run ended well: every
    # line is in the node logs (tests/test_torchrun_logs.py: a failed run keeps it)
    run_id = os.path.basename(os.path.dirname(logs[0]))
    assert glob.glob(f"/tmp/mlaunch-*/.mlaunch/{run_id}/torchrun/node*/**/stdout.log", recursive=True) == []
    with open(glob.glob(str(tmp_path / "out" / "logs" / "*" / "events.jsonl"))[0]) as fh:
        starts = [e for e in map(json.loads, fh) if e["event"] == "node_start"]
    assert [e.get("log") for e in starts] == ["spliced", "spliced"]   # not read by the launcher
    assert canary not in out
    for k, host in enumerate(h.ip for h in hs.hosts):
        assert f"[node{k} {host} local0] {lines - 1:09d} " in out   # the newest shown at the end
    # The console shows at its pace (execute/follow.py): how much of 8 MB it reads before the
    # run ends depends on the machine's speed; what it did not show it says, naming the logs.
    said = [ln for ln in out.splitlines() if "not shown" in ln]
    assert all(ln.endswith(f"every line is in {', '.join(logs)}") or
               any(ln.endswith(f"every line is in {log}") for log in logs) for ln in said), said
