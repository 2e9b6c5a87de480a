"""One run from start to end, across its attempts, whatever backend runs its nodes.

Holds attempts (the request a backend hands over: connect, preflight, the final plan
recorded, guard output_dir, run each attempt, restart from the latest complete checkpoint),
outputdir (checkpoint discovery and the run's lock on node 0), finished (whether a
checkpoint already ends the schedule), spares and shrink (the next attempt's hosts when a
node is lost), universal (a checkpoint converted for another world).

The backend is passed in (launcher/backends/base.py's Backend): this layer calls its hooks
and imports none of them. May import every layer below it: errors, render, nodeprog, spec,
plan, record, view, logs, watch, transport, session, preflight.
"""
