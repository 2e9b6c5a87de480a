"""What bench/gpu_proof.py watches during a run: peak GPU memory and when each step landed."""
from __future__ import annotations

import json
import os
import subprocess
import threading
import time


class Observer:
    """Peak GPU memory (nvidia-smi every 200 ms) and when each logged step landed."""

    def __init__(self, cpu: bool, out_dir: str | None):
        self.cpu, self.log = cpu, os.path.join(out_dir, "trainer_log.jsonl") if out_dir else None
        self.steps: list[tuple[float, int]] = []
        self.peak: dict[int, int] = {}
        self.trace: list[tuple[float, int, int]] = []   # (s since start, gpu, MiB): when the peak came
        self._stop = threading.Event()
        self.t0 = time.monotonic()

    def __enter__(self):
        self.smi = None if self.cpu else subprocess.Popen(
            ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits",
             "-lms", "200"], stdout=subprocess.PIPE, text=True)
        self.threads = [threading.Thread(target=f, daemon=True) for f in (self._clock, self._mem)]
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self.smi:
            self.smi.terminate()
        for t in self.threads:
            t.join(5)

    def _mem(self):
        for line in (self.smi.stdout if self.smi else []):
            idx, used = (int(x) for x in line.split(","))
            self.peak[idx] = max(self.peak.get(idx, 0), used)
            self.trace.append((round(time.monotonic() - self.t0, 2), idx, used))

    def _clock(self):
        seen = 0
        while not self._stop.wait(0.02) and self.log:
            try:
                lines = open(self.log).read().splitlines()
            except OSError:
                continue
            for line in lines[seen:]:
                try:
                    self.steps.append((time.monotonic(), json.loads(line)["current_steps"]))
                except (ValueError, KeyError):
                    break
                seen += 1

    def steady(self, global_batch: int) -> float | None:
        """samples/s between the second logged step and the last: no start-up, no save."""
        if len(self.steps) < 3:
            return None
        (t0, s0), (t1, s1) = self.steps[1], self.steps[-1]
        return round((s1 - s0) * global_batch / (t1 - t0), 2)
