# mlaunch node program part (relay): the live view's CPU and memory samples of a node without
# GPUs, taken by the relay itself. templates/sampler.sh.j2 finds no GPU and asks for them with
# one REQUEST line on the node's output; from then on the relay, already awake for the output,
# reads /proc/stat and /proc/meminfo every period and writes the row view/nodeview.py reads: no
# process per sample, where a shell loop started two a second (a `sleep` process each).
# Standard library only.
import time

REQUEST = b"\x1emlaunch-cpu-every "   # then the period in ms: the sampler's one line
ROW = b"\x1emlaunch-cpu %d %d %d %d\n"   # busy and idle jiffies, MemTotal and MemAvailable kB


class CpuSampler:
    """The period asked for, and when the next sample is due."""

    def __init__(self, every_ms):
        self.every = max(0.05, every_ms / 1000.0)
        self.due = 0.0   # the first sample at once

    def tick(self, emit):
        """emit(row) of a sample that is due; the seconds until the next one is."""
        now = time.monotonic()
        if now >= self.due:
            emit(cpu_row())
            self.due = now + self.every
        return max(0.0, self.due - time.monotonic())


def asked(seen, request=REQUEST):
    """(the period in ms of a request among seen's lines or None, seen without it)."""
    every, kept = None, []
    for line in seen.split(b"\n")[:-1]:
        at = line.find(request)
        if at >= 0:
            try:
                every = float(line[at + len(request):])
            except ValueError:
                pass
        else:
            kept.append(line + b"\n")
    return every, b"".join(kept)


def cpu_row():
    """This node's sample row: the jiffies of /proc/stat's cpu line (busy: user, nice, system,
    irq, softirq, steal; idle: idle, iowait) and two lines of /proc/meminfo."""
    with open("/proc/stat", "rb") as fh:
        f = [int(x) for x in fh.readline().split()[1:9]] + [0] * 8
    with open("/proc/meminfo", "rb") as fh:
        mem = dict(line.split()[:2] for line in fh.read().split(b"\n") if line.count(b" "))
    return ROW % (f[0] + f[1] + f[2] + f[5] + f[6] + f[7], f[3] + f[4],
                  int(mem.get(b"MemTotal:", 0)), int(mem.get(b"MemAvailable:", 0)))
