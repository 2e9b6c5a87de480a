"""Where the launcher's CPU goes while it streams a log flood: a py-spy raw profile
(`py-spy record --gil -f raw -o FILE -- python bench/fanout.py logs --runs 1`) summed over the
stream's threads (each node's reader, _Session._pump, and the console's, Console._print_loop).

  python bench/flood_profile.py FILE
"""
from __future__ import annotations

import collections
import re
import sys

THREADS = {"_pump": "node readers", "_print_loop": "console"}


def summarize(path: str) -> str:
    """Inclusive and own samples per function, over the stream threads only."""
    own, incl, by_thread = collections.Counter(), collections.Counter(), collections.Counter()
    for line in open(path):
        stack, _, n = line.rstrip().rpartition(" ")
        frames = [re.sub(r" \(.*", "", f) for f in stack.split(";")]
        thread = next((name for key, name in THREADS.items() if any(key in f for f in frames)), None)
        if thread is None or not n.isdigit():
            continue
        by_thread[thread] += int(n)
        own[frames[-1]] += int(n)
        for f in set(frames):
            incl[f] += int(n)
    total = sum(by_thread.values()) or 1
    out = [f"samples holding the GIL in the stream's threads: {total} "
           f"({', '.join(f'{k} {v}' for k, v in by_thread.items())})", "inclusive:"]
    out += [f"  {100 * v / total:5.1f}%  {k}" for k, v in incl.most_common(24) if "Thread" not in k]
    out += ["own:"] + [f"  {100 * v / total:5.1f}%  {k}" for k, v in own.most_common(14)]
    return "\n".join(out)


if __name__ == "__main__":
    print(summarize(sys.argv[1]))
