"""The node relay's settings (launcher/nodeprog/relay.py): which secrets it masks and which
lines it copies to the launcher beside the node log. Sent to the relay on its session's
stdin by the transports that start it (ssh.py, local.py), never on a command line."""
from __future__ import annotations

from ..logs.torchrun_out import ROOT_CAUSE, ROOT_CAUSE_LINES
from ..plan.launch_plan import MASK, LaunchPlan
from ..spec.secret_rules import mask_rules
from ..view import nodeview
from ..watch.health import MARKS as HEALTH_MARKS
from ..watch.milestones import MARKS as START_MARKS


def relay_config(plan: LaunchPlan) -> dict:
    """What nodeprog/relay.py masks and copies to the launcher, from the modules that read
    those lines (the same secrets as plan.mask, the health watch's, the start-up stages' and torchrun's
    marks)."""
    return {**mask_rules(plan.secrets, MASK), "marks": list(HEALTH_MARKS) + list(START_MARKS),
            "after": [[ROOT_CAUSE, ROOT_CAUSE_LINES]], "sample": nodeview.MARK}
