"""Each running node's output, as the session (execute/job.py) takes it in: read, split into
lines, logged, shown and watched here (the reader); or, where the node's session runs under the
node relay, moved into the node log unread and only the relay's lines taken in (spliced)."""
from __future__ import annotations

from ..plan.launch_plan import NodePlan
from ..view import nodeview
from .base import LOST, Exit, Running
from .spliced import SplicedPump
from .stream import LineSplitter, NodeLog, text_of
from .torchrun_out import SignalTracebacks, TorchrunRootCause


class NodeStreams:
    """The session's per-node output threads (a mixin of job._Session, whose state they use:
    plan, outcomes, events, view, watch, console, _teardown, _health_stop)."""

    def _pump_spliced(self, node: NodePlan, running: Running) -> None:
        # Only the relay's lines come here; the output itself goes into the node log unread.
        cause = TorchrunRootCause()
        pump = SplicedPump(running, node.log_path, lambda text: self._seen(node, cause, text),
                           lambda: self.view.lines_seen(node.rank),
                           lambda text: self.console.offer(node.rank, node.host, text))
        try:
            outcome = _with_cause(pump.run(), cause)
        except Exception as e:  # reading must never kill the launcher: it is a lost node
            outcome = Exit(LOST, lost=True, detail=f"stream error: {e}")
        finally:
            self.outcomes[node.rank].tail = pump.tail()
        self.events.put((node.rank, outcome))

    def _seen(self, node: NodePlan, cause: TorchrunRootCause, text: str) -> None:
        # The relay's lines (masked on the node): samples, the root cause, the health watch.
        text, samples = nodeview.split_text(self.plan.mask(text))
        if samples:
            self.view.output(node.rank, samples)
        if text:
            cause.see_text(text)
            if (verdict := self.watch.text(node.rank, node.host, text)) is not None:
                self._health_stop(verdict)

    def _pump(self, node: NodePlan, running: Running, log: NodeLog) -> None:
        splitter, cause = LineSplitter(), TorchrunRootCause()
        noise = SignalTracebacks(lambda: self._teardown is not None)
        try:
            while chunk := running.read():
                self._emit(node, log, cause, splitter.feed_text(chunk), noise)
            self._emit(node, log, cause, splitter.flush_text(), noise)
            if held := noise.flush():
                self.console.offer(node.rank, node.host, self.plan.mask(text_of(held)))
            outcome = _with_cause(running.wait(), cause)
        except Exception as e:  # reading must never kill the launcher: it is a lost node
            outcome = Exit(LOST, lost=True, detail=f"stream error: {e}")
        finally:
            self.outcomes[node.rank].tail = list(log.tail)
            log.close()
        self.events.put((node.rank, outcome))

    def _emit(self, node: NodePlan, log: NodeLog, cause: TorchrunRootCause,
              text: str, noise: SignalTracebacks) -> None:
        # A text of whole lines throughout: each step scans it once, none makes a per-line
        # object unless its marker is there (bench/results/logpath-*: the flood's profile).
        text, samples = nodeview.split_text(text)
        if samples:
            self.view.output(node.rank, samples)
        if text:
            self.view.lines_seen(node.rank)
            cause.see_text(text)
            masked = self.plan.mask(text)   # once, for the node log and the console alike
            log.write_masked(masked)
            if shown := noise.filter_text(masked):  # after the node log: never blocks
                self.console.offer(node.rank, node.host, shown)
            verdict = self.watch.text(node.rank, node.host, text)
            if verdict is not None:
                self._health_stop(verdict)


def _with_cause(outcome: Exit, cause: TorchrunRootCause) -> Exit:
    """torchrun exits 1 whatever its worker returned: the worker's code from its report."""
    if outcome.code == 1 and cause.code not in (None, 0, 1):
        return Exit(cause.code, detail=f"torchrun: a worker exited {cause.code}")
    return outcome
